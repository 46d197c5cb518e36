//! The Redis store on live servers: the shared server from `WEBHOOK_GUARD_REDIS_URL`,
//! plus throwaway `redis-server` processes this file starts itself (a 3-node cluster
//! on ports 7101-7103 and single servers on 7195-7199), which need `redis-server`
//! (or the binary in `WEBHOOK_GUARD_REDIS_SERVER_BIN`, such as a `valkey-server`)
//! and `redis-cli` on the `PATH`.

use crate::support;

use support::fresh_request;
use support::ms;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::future::join_all;
use webhook_guard::inbox::{InboxEvent, InboxState, InboxStore, LeaseRequest};
use webhook_guard::meta::MetaExtractor;
use webhook_guard::ordering::{ObjectKey, ObjectStatus, OrderingStore};
use webhook_guard::outcome::OutcomeKind;
use webhook_guard::store::listing::{ListState, RecordQuery};
use webhook_guard::store::redis::{redis, RedisStoreError};
use webhook_guard::store::{
    Claim, ClaimRequest, Fence, FencingToken, Fingerprint, Finish, Holder, Key, ProcessedStore,
    RecordState, RedisStore, Renew,
};
use webhook_guard::verify::NoVerification;
use webhook_guard::{conformance, EventId, Outcome, WebhookGuard};

const URL_VAR: &str = "WEBHOOK_GUARD_REDIS_URL";

fn url() -> Option<String> {
    support::server_url(URL_VAR)
}

fn random_prefix(test: &str) -> String {
    format!("wg-test-{test}-{:016x}", FencingToken::random().0)
}

async fn store(url: &str, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .connect(url)
        .await
        .expect("connect to Redis")
}

/// Removes every key of `prefix` (SCAN + UNLINK), answering how many there were.
async fn cleanup(url: &str, prefix: &str) -> usize {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let pattern = format!("{{{prefix}:*");
    let mut cursor: u64 = 0;
    let mut removed = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        if !keys.is_empty() {
            removed += keys.len();
            let _: () = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        if next == 0 {
            return removed;
        }
        cursor = next;
    }
}

/// The record keys of `prefix`.
async fn record_keys(url: &str, prefix: &str) -> Vec<String> {
    keys_matching(url, &format!("{{{prefix}:*}}:r:*")).await
}

/// The listing index keys of `prefix`.
async fn listing_keys(url: &str, prefix: &str) -> Vec<String> {
    keys_matching(url, &format!("{{{prefix}:*}}:l:*")).await
}

/// Every key matching `pattern`, the whole `SCAN` walked.
async fn keys_matching(url: &str, pattern: &str) -> Vec<String> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut cursor: u64 = 0;
    let mut out = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        out.extend(keys);
        if next == 0 {
            return out;
        }
        cursor = next;
    }
}

async fn count_records(url: &str, prefix: &str) -> usize {
    record_keys(url, prefix).await.len()
}

// ---------------------------------------------------------------------------
// Throwaway servers

/// Redis servers this test started; shut down (and their directory removed) on
/// drop, so even a failing test leaves no process behind.
struct Servers {
    ports: Vec<u16>,
    dir: PathBuf,
}

impl Servers {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "webhook-guard-{name}-{}-{:08x}",
            std::process::id(),
            FencingToken::random().0 as u32
        ));
        std::fs::create_dir_all(&dir).expect("create a directory for redis-server");
        Self {
            ports: Vec::new(),
            dir,
        }
    }

    /// Starts `redis-server` on `port` (plus `extra` arguments) and waits for PING.
    fn start(&mut self, port: u16, extra: &[&str]) {
        assert!(
            !ping(port),
            "port {port} is already in use: a Redis from an earlier run? (redis-cli -p {port} shutdown nosave)"
        );
        // WEBHOOK_GUARD_REDIS_SERVER_BIN runs these on another build (valkey-server).
        let bin = std::env::var("WEBHOOK_GUARD_REDIS_SERVER_BIN")
            .unwrap_or_else(|_| "redis-server".to_owned());
        let status = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "yes"])
            .arg("--dir")
            .arg(&self.dir)
            .args(extra)
            .status()
            .expect("redis-server must be on the PATH for this test");
        assert!(
            status.success(),
            "redis-server on port {port} failed to start"
        );
        if !self.ports.contains(&port) {
            self.ports.push(port);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ping(port) {
            assert!(
                Instant::now() < deadline,
                "redis-server on {port} never answered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&self, port: u16) {
        let _ = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "shutdown", "nosave"])
            .output();
        let deadline = Instant::now() + Duration::from_secs(10);
        while ping(port) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for &port in &self.ports {
            self.stop(port);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A store on the throwaway server on `port`, answering within a second.
async fn throwaway_store(port: u16, name: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(random_prefix(name))
        .response_timeout(Duration::from_secs(1))
        .connect(format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap()
}

fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn ping(port: u16) -> bool {
    cli(port, &["ping"]).trim() == "PONG"
}

const CLUSTER_PORTS: [u16; 3] = [7101, 7102, 7103];

fn start_cluster() -> Servers {
    let mut servers = Servers::new("cluster");
    for port in CLUSTER_PORTS {
        let conf = format!("nodes-{port}.conf");
        servers.start(
            port,
            &["--cluster-enabled", "yes", "--cluster-config-file", &conf],
        );
    }
    let nodes: Vec<String> = CLUSTER_PORTS
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let out = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&nodes)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli must be on the PATH for this test");
    assert!(
        out.status.success(),
        "cluster create failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !CLUSTER_PORTS
        .iter()
        .all(|&p| cli(p, &["cluster", "info"]).contains("cluster_state:ok"))
    {
        assert!(Instant::now() < deadline, "the cluster never became ok");
        std::thread::sleep(Duration::from_millis(50));
    }
    servers
}

// ---------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_store_passes_the_conformance_suite() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("conformance");
    let store = store(&url, &prefix).await;
    let started = Instant::now();
    // One suite at a time per store: the suite's purge check removes every record
    // dated 2001 that has expired, so two suites at once would purge each other's.
    conformance::run_all(&store).await;
    conformance::listing::run_all(&store).await;
    eprintln!("standalone conformance: {:?}", started.elapsed());
    cleanup(&url, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_store_passes_the_inbox_and_ordering_suites() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("inbox-conformance");
    let store = store(&url, &prefix).await;
    let started = Instant::now();
    conformance::inbox::run_all(&store).await;
    conformance::ordering::run_all(&store).await;
    conformance::listing::run_inbox(&store).await;
    eprintln!(
        "standalone inbox and ordering conformance: {:?}",
        started.elapsed()
    );
    assert!(
        cleanup(&url, &prefix).await > 0,
        "the suites wrote under the prefix"
    );
}

/// Glob characters in a namespace or an id prefix are matched as themselves, not
/// as patterns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_matches_glob_characters_literally() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("listing-glob");
    let store = store(&url, &prefix).await;
    let now = Utc::now();
    for (namespace, id) in [
        ("n*", "a*1"),
        ("n*", "ab1"),
        ("n*", "[x]1"),
        ("n*", "x1"),
        ("n?", "q1"),
        ("nz", "z1"),
    ] {
        let request = ClaimRequest {
            key: Key::new(namespace, id),
            fingerprint: Fingerprint::of(id.as_bytes()),
            token: FencingToken::random(),
            now,
            lease_until: now + TimeDelta::minutes(5),
            expires_at: now + TimeDelta::hours(1),
        };
        let claim = store.claim(&request).await.expect("claim failed");
        assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
    }
    let list = store.record_listing().expect("the Redis store lists");
    let ids = |query: RecordQuery| async move {
        let page = list.list_records(&query).await.expect("list failed");
        let mut ids: Vec<String> = page.items.into_iter().map(|r| r.id).collect();
        ids.sort();
        ids
    };
    let q = RecordQuery::new("n*", now);
    assert_eq!(ids(q.clone()).await, ["[x]1", "a*1", "ab1", "x1"]);
    assert_eq!(ids(q.clone().id_prefix("a*")).await, ["a*1"]);
    assert_eq!(ids(q.clone().id_prefix("[x]")).await, ["[x]1"]);
    assert_eq!(ids(RecordQuery::new("n?", now)).await, ["q1"]);
    assert_eq!(
        list.count_records(&q.id_prefix("a")).await.expect("count"),
        2
    );
    assert!(cleanup(&url, &prefix).await > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_store_passes_the_conformance_suites() {
    // Gated like the other live tests: the cluster is started here, from the same
    // Redis installation that serves WEBHOOK_GUARD_REDIS_URL.
    let Some(_) = url() else { return };
    let started = Instant::now();
    let _cluster = start_cluster();
    eprintln!("cluster up in {:?}", started.elapsed());
    let nodes: Vec<String> = CLUSTER_PORTS
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    let store = RedisStore::builder()
        .prefix(random_prefix("cluster"))
        .connect_cluster(nodes)
        .await
        .expect("connect to the cluster");
    eprintln!(
        "cluster: native compare-and-set {}",
        store.uses_native_compare_and_set()
    );
    let started = Instant::now();
    conformance::run_all(&store).await;
    conformance::listing::run_all(&store).await;
    eprintln!("cluster conformance: {:?}", started.elapsed());
    let started = Instant::now();
    conformance::inbox::run_all(&store).await;
    conformance::ordering::run_all(&store).await;
    conformance::listing::run_inbox(&store).await;
    eprintln!(
        "cluster inbox and ordering conformance: {:?}",
        started.elapsed()
    );

    // The shards really are spread over the nodes.
    let mut per_node = Vec::new();
    for port in CLUSTER_PORTS {
        let n: usize = cli(port, &["dbsize"]).trim().parse().unwrap_or(0);
        per_node.push(n);
    }
    eprintln!("keys per cluster node: {per_node:?}");
    assert!(
        per_node.iter().filter(|&&n| n > 0).count() >= 2,
        "keys land on more than one node: {per_node:?}"
    );

    a_stopped_node_holds_up_only_its_own_shards(&store).await;
}

/// Resumes a stopped `redis-server` when dropped, even if the test fails.
struct Stopped(String);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
    }
}

/// With one cluster node stopped (as before its fail-over), claims bound for the
/// other nodes are answered while two batches for the stopped node wait: each
/// shard batches on its own.
async fn a_stopped_node_holds_up_only_its_own_shards(store: &RedisStore) {
    let now = ms(Utc::now());
    let request = move |id| fresh_request(id, now);
    const IDS: [&str; 12] = [
        "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11",
    ];
    for id in IDS {
        assert!(matches!(
            store.claim(&request(id)).await.unwrap(),
            Claim::Acquired(_)
        ));
    }
    // Which node holds each id's record.
    let node_of = |id: &str| {
        CLUSTER_PORTS.into_iter().find(|&port| {
            // `?` for the NUL between namespace and id.
            let pattern = format!("*:r:test?{id}");
            let found = Command::new("redis-cli")
                .args(["-p", &port.to_string(), "--scan", "--pattern", &pattern])
                .output()
                // (redis-cli prints the key only up to its NUL.)
                .map(|o| !String::from_utf8_lossy(&o.stdout).trim().is_empty())
                .unwrap_or(false);
            found
        })
    };
    let stopped_port = CLUSTER_PORTS[0];
    let on_stopped = IDS.into_iter().find(|id| node_of(id) == Some(stopped_port));
    let elsewhere = IDS
        .into_iter()
        .find(|id| node_of(id).is_some_and(|p| p != stopped_port));
    let (Some(on_stopped), Some(elsewhere)) = (on_stopped, elsewhere) else {
        panic!("12 ids over 3 nodes: none on {stopped_port}, or none elsewhere");
    };
    let pid = cli(stopped_port, &["info", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .expect("process_id")
        .trim()
        .to_owned();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let stopped = Stopped(pid);
    // Two claims for the stopped node, in two batches (a batch is sent at once).
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let (store, request) = (store.clone(), request(on_stopped));
        waiting.push(tokio::spawn(async move {
            store.claim(&request).await.map(|_| ())
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A claim for another node is answered meanwhile.
    let other = store.claim(&request(elsewhere)).await;
    assert!(matches!(other, Ok(Claim::Existing(_))), "{other:?}");
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "the stopped node's claims were still waiting"
    );
    drop(stopped);
    for w in waiting {
        let _ = w.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_guards_run_each_of_ten_ids_once_in_a_thousand_deliveries() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("guards");
    let build = |store: RedisStore| {
        WebhookGuard::builder()
            .store(store)
            .verifier(NoVerification)
            .event_id(EventId::header("x-id"))
            .namespace("test")
            .build()
            .unwrap()
    };
    // Two separately built stores: two connections, as two replicas would have.
    let guards = [
        build(store(&url, &prefix).await),
        build(store(&url, &prefix).await),
    ];
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    // `WebhookGuard::handle` futures are not `Send` (they hold a `&dyn Headers`),
    // so `tokio::spawn` cannot take them: 8 blocking threads of the multi-thread
    // runtime each drive 125 deliveries concurrently, all 1000 at once.
    let handle = tokio::runtime::Handle::current();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let guards = guards.clone();
            let runs = runs.clone();
            let handle = handle.clone();
            tokio::task::spawn_blocking(move || {
                let deliveries = (0..125).map(|j| {
                    let i = t * 125 + j;
                    let guard = guards[i % 2].clone();
                    let runs = runs.clone();
                    async move {
                        let id = format!("evt_{}", i % 10);
                        let headers = [("x-id", id.as_str())];
                        let body = format!("{{\"id\":\"{id}\"}}").into_bytes();
                        guard
                            .handle(&headers, &body, |_event| async move {
                                runs.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                Ok(())
                            })
                            .await
                            .kind()
                    }
                });
                handle.block_on(join_all(deliveries))
            })
        })
        .collect();
    let outcomes: Vec<OutcomeKind> = join_all(threads)
        .await
        .into_iter()
        .flat_map(|r| r.expect("thread panicked"))
        .collect();
    assert_eq!(outcomes.len(), 1000);
    let elapsed = started.elapsed();
    let processed = outcomes
        .iter()
        .filter(|k| **k == OutcomeKind::Processed)
        .count();
    let others: Vec<_> = outcomes
        .iter()
        .filter(|k| {
            !matches!(
                k,
                OutcomeKind::Processed | OutcomeKind::Duplicate | OutcomeKind::InProgress
            )
        })
        .collect();
    eprintln!("1000 deliveries through two guards: {elapsed:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        10,
        "each id's handler ran once"
    );
    assert_eq!(processed, 10, "ten deliveries were processed");
    assert!(others.is_empty(), "unexpected outcomes: {others:?}");
    for i in 0..10 {
        let rec = guards[0]
            .inspect(&format!("evt_{i}"))
            .await
            .unwrap()
            .expect("record");
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(rec.attempts, 1);
    }
    cleanup(&url, &prefix).await;
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_and_the_stale_token_refused() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("takeover");
    let store = store(&url, &prefix).await;
    let t0 = ms(Utc::now());
    let at = |s: i64| t0 + TimeDelta::seconds(s);
    let key = Key::new("stripe", "evt_takeover");
    let request = |now: i64| ClaimRequest {
        key,
        fingerprint: Fingerprint::of(b"body"),
        token: FencingToken::random(),
        now: at(now),
        lease_until: at(now + 30),
        expires_at: at(now + 3600),
    };

    let first = request(0);
    assert!(matches!(
        store.claim(&first).await.unwrap(),
        Claim::Acquired(_)
    ));
    let Claim::Existing(held) = store.claim(&request(29)).await.unwrap() else {
        panic!("a live lease holds");
    };
    assert_eq!(held.token, first.token);
    assert!(store.stuck(at(29), 100).await.unwrap().is_empty());
    let stuck = store.stuck(at(30), 100).await.unwrap();
    assert_eq!(stuck.len(), 1, "the expired lease is listed as stuck");
    assert_eq!(stuck[0].id, "evt_takeover");

    let second = request(30);
    let Claim::Acquired(rec) = store.claim(&second).await.unwrap() else {
        panic!("the expired lease is taken over");
    };
    assert_eq!((rec.attempts, rec.failures), (2, 1));
    assert_eq!(rec.token, second.token);
    assert_eq!(rec.created_at, at(0));
    assert!(store.stuck(at(31), 100).await.unwrap().is_empty());

    // A history with the store's field separator and a newline survives.
    let history = [webhook_guard::store::FailureNote {
        at: at(30),
        error: "lease ran out | holder gone\nsecond line".into(),
    }];
    let done = Finish {
        state: RecordState::Completed,
        failures: 1,
        history: &history,
        now: at(31),
        expires_at: at(3631),
    };
    assert_eq!(
        store
            .renew(
                Holder::new(key, first.token),
                &Renew {
                    lease_until: at(100),
                    expires_at: at(3700)
                }
            )
            .await
            .unwrap(),
        Fence::LeaseLost,
        "the stale holder cannot renew"
    );
    assert_eq!(
        store
            .finish(Holder::new(key, first.token), &done)
            .await
            .unwrap(),
        Fence::LeaseLost,
        "the stale holder cannot finish"
    );
    assert_eq!(
        store
            .finish(Holder::new(key, second.token), &done)
            .await
            .unwrap(),
        Fence::Applied
    );
    let rec = store.get(key).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.token, second.token);
    assert_eq!(rec.history, history);
    assert_eq!((rec.attempts, rec.failures), (2, 1));

    // Retention by TTL, measured from the caller's clock: about 3600 s left.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys = record_keys(&url, &prefix).await;
    assert_eq!(keys.len(), 1, "one record key: {keys:?}");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        (3_590_000..=3_600_000).contains(&pttl),
        "the TTL runs to expires_at (PTTL {pttl})"
    );
    cleanup(&url, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_100k_expired_records_keeps_claims_going_and_loses_no_live_record() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("purge");
    let store = Arc::new(store(&url, &prefix).await);
    let now = ms(Utc::now());
    const EXPIRED: usize = 100_000;
    const LIVE: usize = 1_000;

    // Setup: 100k records claimed two hours ago that expired an hour ago (by the
    // caller's clock; their Redis TTL, measured from that claim, still runs), and
    // 1k live ones. Claims are pipelined over the one multiplexed connection.
    let started = Instant::now();
    let old = now - TimeDelta::hours(2);
    let ids: Vec<String> = (0..EXPIRED).map(|i| format!("old_{i}")).collect();
    for chunk in ids.chunks(5_000) {
        let requests: Vec<_> = chunk
            .iter()
            .map(|id| ClaimRequest {
                key: Key::new("purge", id),
                fingerprint: Fingerprint::of(id.as_bytes()),
                token: FencingToken::random(),
                now: old,
                lease_until: old + TimeDelta::minutes(5),
                expires_at: now - TimeDelta::hours(1),
            })
            .collect();
        for answer in join_all(requests.iter().map(|r| store.claim(r))).await {
            assert!(matches!(answer.unwrap(), Claim::Acquired(_)));
        }
    }
    let live_ids: Vec<String> = (0..LIVE).map(|i| format!("live_{i}")).collect();
    let live_requests: Vec<_> = live_ids
        .iter()
        .map(|id| ClaimRequest {
            key: Key::new("purge", id),
            fingerprint: Fingerprint::of(id.as_bytes()),
            token: FencingToken::random(),
            now,
            lease_until: now + TimeDelta::minutes(5),
            expires_at: now + TimeDelta::hours(1),
        })
        .collect();
    for answer in join_all(live_requests.iter().map(|r| store.claim(r))).await {
        assert!(matches!(answer.unwrap(), Claim::Acquired(_)));
    }
    eprintln!(
        "setup: {} records in {:?}",
        EXPIRED + LIVE,
        started.elapsed()
    );
    assert_eq!(count_records(&url, &prefix).await, EXPIRED + LIVE);

    // Purge while claims continue.
    let purging = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let claimer = {
        let store = store.clone();
        let purging = purging.clone();
        tokio::spawn(async move {
            let mut n = 0usize;
            let mut worst = Duration::ZERO;
            while purging.load(Ordering::SeqCst) || n < 100 {
                let id = format!("fresh_{n}");
                let now = ms(Utc::now());
                let request = ClaimRequest {
                    key: Key::new("purge", &id),
                    fingerprint: Fingerprint::of(b"fresh"),
                    token: FencingToken::random(),
                    now,
                    lease_until: now + TimeDelta::minutes(5),
                    expires_at: now + TimeDelta::hours(1),
                };
                let t = Instant::now();
                let answer = store.claim(&request).await.expect("claim during purge");
                worst = worst.max(t.elapsed());
                assert!(matches!(answer, Claim::Acquired(_)), "fresh claims succeed");
                n += 1;
            }
            (n, worst)
        })
    };
    let started = Instant::now();
    let mut purged = 0u64;
    let mut calls = 0;
    loop {
        let n = store.purge_expired(ms(Utc::now()), 10_000).await.unwrap();
        calls += 1;
        assert!(n <= 10_000, "purge keeps its limit");
        if n == 0 {
            break;
        }
        purged += n;
    }
    let purge_time = started.elapsed();
    purging.store(false, Ordering::SeqCst);
    let (fresh, worst) = claimer.await.unwrap();
    eprintln!(
        "purged {purged} in {purge_time:?} ({calls} calls) while {fresh} claims ran (slowest {worst:?})"
    );
    assert_eq!(purged, EXPIRED as u64, "every expired record was purged");

    for id in ids.iter().step_by(997) {
        assert!(
            store.get(Key::new("purge", id)).await.unwrap().is_none(),
            "{id} expired and is gone"
        );
    }
    let live = join_all(live_ids.iter().map(|id| store.get(Key::new("purge", id)))).await;
    assert!(
        live.into_iter().all(|r| r.unwrap().is_some()),
        "no live record was lost"
    );
    for n in 0..fresh {
        let id = format!("fresh_{n}");
        assert!(store.get(Key::new("purge", &id)).await.unwrap().is_some());
    }
    assert_eq!(count_records(&url, &prefix).await, LIVE + fresh);
    cleanup(&url, &prefix).await;
}

/// A server that refuses writes (a replica after a fail-over) is a store that cannot
/// be reached for writing: a claim (whose transaction the server aborts) and a
/// finish answer `Unavailable`, as for a server that is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_unavailable() {
    let Some(_) = url() else { return };
    const PORT: u16 = 7195;
    let mut servers = Servers::new("read-only");
    servers.start(PORT, &[]);
    let store = throwaway_store(PORT, "read-only").await;
    let now = ms(Utc::now());
    let held = fresh_request("evt_held", now);
    assert!(matches!(
        store.claim(&held).await.unwrap(),
        Claim::Acquired(_)
    ));
    // A replica of a master that is not there: it refuses every write.
    assert_eq!(cli(PORT, &["replicaof", "127.0.0.1", "7194"]).trim(), "OK");
    let err = store
        .claim(&fresh_request("evt_refused", now))
        .await
        .expect_err("a replica refuses the claim");
    assert!(
        err.is_unavailable(),
        "a read-only server is Unavailable: {err}"
    );
    let finish = Finish {
        state: RecordState::Completed,
        failures: 0,
        history: &[],
        now,
        expires_at: now + TimeDelta::hours(1),
    };
    let err = store
        .finish(held.holder(), &finish)
        .await
        .expect_err("a replica refuses the finish");
    assert!(
        err.is_unavailable(),
        "a read-only server is Unavailable: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_and_the_store_recovers() {
    let Some(_) = url() else { return };
    const PORT: u16 = 7199;
    let mut servers = Servers::new("recovery");
    servers.start(PORT, &[]);
    let store = throwaway_store(PORT, "recovery").await;
    let key = Key::new("test", "evt_recovery");
    let request = |token| {
        let now = ms(Utc::now());
        ClaimRequest {
            key,
            fingerprint: Fingerprint::of(b"b"),
            token,
            now,
            lease_until: now + TimeDelta::seconds(30),
            expires_at: now + TimeDelta::hours(1),
        }
    };
    let first = request(FencingToken::random());
    assert!(matches!(
        store.claim(&first).await.unwrap(),
        Claim::Acquired(_)
    ));

    servers.stop(PORT);
    for _ in 0..3 {
        let err = store
            .claim(&request(FencingToken::random()))
            .await
            .expect_err("the server is down");
        assert!(err.is_unavailable(), "down means Unavailable: {err:?}");
        let source = std::error::Error::source(&err).expect("the driver's error is kept");
        assert!(source.downcast_ref::<redis::RedisError>().is_some());
    }

    // Same port, fresh (empty) server: the same store value works again.
    servers.start(PORT, &[]);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(15);
    let claim = loop {
        match store.claim(&request(FencingToken::random())).await {
            Ok(claim) => break claim,
            Err(e) => {
                assert!(
                    e.is_unavailable(),
                    "only Unavailable while reconnecting: {e:?}"
                );
                assert!(
                    Instant::now() < deadline,
                    "the store never recovered: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    eprintln!("recovered after {:?}", started.elapsed());
    assert!(
        matches!(claim, Claim::Acquired(_)),
        "the new server is empty"
    );
}

/// A guard in inbox mode with the ordering guard, everything on one Redis store.
fn inbox_guard(store: &RedisStore) -> WebhookGuard {
    WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .ordering(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .namespace("inbox")
        .build()
        .unwrap()
}

fn inbox_body(id: &str, ty: &str, object: &str, created: i64) -> Vec<u8> {
    format!(r#"{{"id":"{id}","type":"{ty}","object":"{object}","created":{created}}}"#).into_bytes()
}

async fn accept(guard: &WebhookGuard, body: &[u8]) {
    let outcome = guard
        .accept(&[("content-type", "application/json")], body)
        .await;
    assert!(
        matches!(outcome, Outcome::Accepted { new: true, .. }),
        "{outcome:?}"
    );
}

/// Waits until every event of `ids` in namespace `inbox` is settled.
async fn settled(store: &RedisStore, ids: &[&str], within: Duration) -> Vec<InboxEvent> {
    let deadline = Instant::now() + within;
    loop {
        let events = join_all(ids.iter().map(|id| store.get_event(Key::new("inbox", id)))).await;
        let events: Vec<InboxEvent> = events
            .into_iter()
            .map(|e| e.unwrap().expect("stored"))
            .collect();
        if events.iter().all(|e| e.state.is_settled()) {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "not settled in {within:?}: {:?}",
            events.iter().map(|e| (&e.id, e.state)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_and_ordering_on_redis_end_in_the_newest_state() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("inbox-e2e");
    let store = store(&url, &prefix).await;
    let guard = inbox_guard(&store);
    let applied: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let worker = {
        let applied = applied.clone();
        guard
            .worker(move |e: InboxEvent| {
                let applied = applied.clone();
                async move {
                    applied.lock().unwrap().push(e.meta.event_type.unwrap());
                    Ok(())
                }
            })
            .unwrap()
            // One at a time, in the order of arrival: the newer event first.
            .concurrency(1)
            .poll_interval(Duration::from_millis(10))
    };
    // Created pending(1000) → succeeded(2000); delivered succeeded, then pending.
    accept(
        &guard,
        &inbox_body("e_new", "charge.succeeded", "ch_1", 2000),
    )
    .await;
    accept(&guard, &inbox_body("e_old", "charge.pending", "ch_1", 1000)).await;
    let started = Instant::now();
    let running = worker.spawn();
    let events = settled(&store, &["e_new", "e_old"], Duration::from_secs(10)).await;
    eprintln!("two events processed in {:?}", started.elapsed());
    running.shutdown().await;
    assert_eq!(
        (events[0].state, events[1].state),
        (InboxState::Done, InboxState::Skipped),
        "the late, older event is skipped"
    );
    assert_eq!(*applied.lock().unwrap(), ["charge.succeeded"]);
    let object = store
        .get_object(ObjectKey {
            namespace: "inbox",
            object: "ch_1",
            family: "charge",
        })
        .await
        .unwrap()
        .expect("observed");
    assert_eq!(object.newest.timestamp(), 2000);
    assert_eq!(object.status, ObjectStatus::Applied);
    cleanup(&url, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_s_events_are_leased_again_and_all_end_done() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("inbox-killed");
    let store = store(&url, &prefix).await;
    let guard = inbox_guard(&store);
    let ids = ["k0", "k1", "k2", "k3", "k4"];
    for (n, id) in ids.iter().enumerate() {
        let object = format!("ch_{id}");
        accept(
            &guard,
            &inbox_body(id, "charge.succeeded", &object, n as i64),
        )
        .await;
    }
    // The doomed worker takes all five and hangs in the handler; then it is killed.
    let started = Arc::new(AtomicUsize::new(0));
    let doomed = {
        let started = started.clone();
        guard
            .worker(move |_e: InboxEvent| {
                started.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<Result<(), webhook_guard::HandlerError>>()
            })
            .unwrap()
            .concurrency(5)
            .lease(Duration::from_secs(1))
    };
    let task = tokio::spawn(async move { doomed.run_once().await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while started.load(Ordering::SeqCst) < 5 {
        assert!(Instant::now() < deadline, "the doomed worker never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed_at = Instant::now();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    for id in ids {
        let e = store
            .get_event(Key::new("inbox", id))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((e.state, e.attempts), (InboxState::Running, 1), "{id}");
    }

    let ran = Arc::new(AtomicUsize::new(0));
    let survivor = {
        let ran = ran.clone();
        guard
            .worker(move |_e: InboxEvent| {
                let ran = ran.clone();
                async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .unwrap()
            .concurrency(10)
    };
    assert_eq!(
        survivor.run_once().await.unwrap(),
        0,
        "nothing is due while the dead worker's lease holds"
    );
    let mut processed = 0;
    while processed < ids.len() {
        assert!(
            killed_at.elapsed() < Duration::from_secs(10),
            "the events were never leased again"
        );
        processed += survivor.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("leased again {:?} after the kill", killed_at.elapsed());
    assert_eq!(ran.load(Ordering::SeqCst), 5, "each event ran once more");
    for e in settled(&store, &ids, Duration::from_secs(1)).await {
        assert_eq!((e.state, e.attempts), (InboxState::Done, 2), "{}", e.id);
    }
    cleanup(&url, &prefix).await;
}

#[tokio::test]
async fn bad_prefixes_and_shard_counts_are_refused_before_connecting() {
    for prefix in ["", "has space", "{tag}", "a}b", "tab\t", &"x".repeat(65)] {
        let err = RedisStore::builder()
            .prefix(prefix)
            .connect("redis://127.0.0.1:1")
            .await
            .unwrap_err();
        assert!(
            matches!(err, RedisStoreError::InvalidPrefix { .. }),
            "{prefix:?}: {err}"
        );
    }
    for shards in [0, 1025] {
        let err = RedisStore::builder()
            .shards(shards)
            .connect("redis://127.0.0.1:1")
            .await
            .unwrap_err();
        assert!(matches!(err, RedisStoreError::InvalidShards(_)), "{err}");
    }
    let err = RedisStore::connect("redis://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "a refused connection: {err:?}");
}

// ---------------------------------------------------------------------------
// Measurement

/// CPU seconds (user + system) this process has used.
fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Fields 14 and 15 of the stat line (utime, stime), in clock ticks of 10 ms.
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds the server on `port` has used.
fn server_cpu(port: u16) -> f64 {
    cli(port, &["info", "cpu"])
        .lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| l.split_once(':')?.1.trim().parse::<f64>().ok())
        .sum()
}

/// Runs `op` in `TASKS` concurrent loops for `round`; answers operations per second,
/// client and server CPU µs per operation.
async fn measure<F, Fut>(port: u16, round: Duration, per_op: u64, op: F) -> (f64, f64, f64)
where
    F: Fn(usize, u64) -> Fut + Clone,
    Fut: std::future::Future<Output = ()>,
{
    const TASKS: usize = 64;
    let (client0, server0) = (process_cpu(), server_cpu(port));
    let started = Instant::now();
    let deadline = started + round;
    let tasks = (0..TASKS).map(|t| {
        let op = op.clone();
        async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                op(t, n).await;
                n += 1;
            }
            n
        }
    });
    let n: u64 = join_all(tasks).await.into_iter().sum::<u64>() * per_op;
    let secs = started.elapsed().as_secs_f64();
    let (client, server) = (process_cpu() - client0, server_cpu(port) - server0);
    (
        n as f64 / secs,
        client * 1e6 / n as f64,
        server * 1e6 / n as f64,
    )
}

/// How many round trips per second 64 tasks get on one multiplexed connection:
/// raw `SET k v NX PX` against the store's claim + finish cycle (two round trips),
/// in interleaved rounds on a private server (port 7198), with the CPU each side
/// spends per round trip. Run it in release:
///
/// ```text
/// WEBHOOK_GUARD_REDIS_URL=redis://127.0.0.1:6379 cargo test --release \
///   --features redis,conformance --test redis -- --ignored --nocapture speed
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check: run in release"]
async fn speed_of_claim_and_finish_against_raw_set_nx() {
    let Some(_) = url() else { return };
    const PORT: u16 = 7198;
    let rounds: usize = std::env::var("SPEED_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let round = Duration::from_millis(1500);
    let mut servers = Servers::new("speed");
    servers.start(PORT, &[]);
    let url = format!("redis://127.0.0.1:{PORT}");
    let store = store(&url, &random_prefix("speed")).await;
    let conn = match store.connection() {
        webhook_guard::store::redis::RedisConnection::Standalone(c) => c.clone(),
        _ => unreachable!("a standalone server"),
    };
    let raw = |r: usize| {
        let conn = conn.clone();
        move |t: usize, n: u64| {
            let mut conn = conn.clone();
            async move {
                let _: Option<String> = redis::cmd("SET")
                    .arg(format!("raw:{r}:{t}:{n}"))
                    .arg("in_progress|1234567890123456789|0123456789abcdef|1|1700000000000")
                    .arg("NX")
                    .arg("PX")
                    .arg(60_000)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
        }
    };
    let cycle = |r: usize| {
        let store = store.clone();
        move |t: usize, n: u64| {
            let store = store.clone();
            async move {
                let id = format!("evt_{r}_{t}_{n}");
                let now = Utc::now();
                let request = ClaimRequest {
                    key: Key::new("speed", &id),
                    fingerprint: Fingerprint::of(id.as_bytes()),
                    token: FencingToken::random(),
                    now,
                    lease_until: now + TimeDelta::seconds(30),
                    expires_at: now + TimeDelta::hours(1),
                };
                let Claim::Acquired(rec) = store.claim(&request).await.unwrap() else {
                    panic!("a fresh id is acquired");
                };
                let done = Finish {
                    state: RecordState::Completed,
                    failures: 0,
                    history: &[],
                    now: Utc::now(),
                    expires_at: request.expires_at,
                };
                let fence = store
                    .finish(Holder::new(request.key, rec.token), &done)
                    .await
                    .unwrap();
                assert_eq!(fence, Fence::Applied);
            }
        }
    };
    let claim_only = |r: usize| {
        let store = store.clone();
        move |t: usize, n: u64| {
            let store = store.clone();
            async move {
                let id = format!("only_{r}_{t}_{n}");
                let now = Utc::now();
                let request = ClaimRequest {
                    key: Key::new("speed", &id),
                    fingerprint: Fingerprint::of(id.as_bytes()),
                    token: FencingToken::random(),
                    now,
                    lease_until: now + TimeDelta::seconds(30),
                    expires_at: now + TimeDelta::hours(1),
                };
                let claim = store.claim(&request).await.unwrap();
                assert!(matches!(claim, Claim::Acquired(_)));
            }
        }
    };
    let mut sums = [0.0f64; 6];
    for r in 0..rounds {
        let (raw_rate, raw_client, raw_server) = measure(PORT, round, 1, raw(r)).await;
        let (claims, claim_client, claim_server) = measure(PORT, round, 1, claim_only(r)).await;
        eprintln!(
            "round {r}: claims alone {claims:>7.0}/s (client {claim_client:>5.1} µs, server {claim_server:>4.1} µs), {:.2} of SET NX",
            claims / raw_rate
        );
        let (trips, cycle_client, cycle_server) = measure(PORT, round, 2, cycle(r)).await;
        eprintln!(
            "round {r}: SET NX {raw_rate:>7.0}/s (client {raw_client:>5.1} µs, server {raw_server:>4.1} µs) | claim+finish {trips:>7.0} round trips/s = {:>6.0} cycles/s (client {cycle_client:>5.1} µs, server {cycle_server:>4.1} µs per trip) | ratio {:.2} round trips, {:.2} cycles",
            trips / 2.0,
            trips / raw_rate,
            trips / 2.0 / raw_rate
        );
        for (sum, v) in sums.iter_mut().zip([
            raw_rate,
            raw_client,
            raw_server,
            trips,
            cycle_client,
            cycle_server,
        ]) {
            *sum += v / rounds as f64;
        }
    }
    let [raw_rate, raw_client, raw_server, trips, cycle_client, cycle_server] = sums;
    eprintln!(
        "mean: SET NX {raw_rate:.0}/s ({raw_client:.1} + {raw_server:.1} µs) | claim+finish {trips:.0} round trips/s ({cycle_client:.1} + {cycle_server:.1} µs) | ratio {:.2} round trips, {:.2} cycles",
        trips / raw_rate,
        trips / 2.0 / raw_rate
    );
    eprintln!("{}", cli(PORT, &["info", "commandstats"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_sweeper_the_due_index_stays_bounded() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("bounded");
    let store = RedisStore::builder()
        .prefix(&prefix)
        .shards(1)
        .connect(url.as_str())
        .await
        .expect("connect to Redis");
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let due = format!("{{{prefix}:0}}:due");
    let done: Vec<webhook_guard::store::FailureNote> = Vec::new();
    // 6,000 ids claimed and completed with a 0.5 s retention, as a busy endpoint
    // would over days; nobody runs a sweeper.
    for i in 0..6_000u32 {
        let now = Utc::now();
        let id = format!("evt_{i}");
        let request = ClaimRequest {
            key: Key::new("bounded", &id),
            fingerprint: Fingerprint::of(b"{}"),
            token: FencingToken::random(),
            now,
            lease_until: now + TimeDelta::milliseconds(500),
            expires_at: now + TimeDelta::milliseconds(500),
        };
        let Claim::Acquired(_) = store.claim(&request).await.unwrap() else {
            panic!("a fresh id is acquired");
        };
        let finish = Finish {
            state: RecordState::Completed,
            failures: 0,
            history: &done,
            now,
            expires_at: now + TimeDelta::milliseconds(500),
        };
        assert_eq!(
            store.finish(request.holder(), &finish).await.unwrap(),
            Fence::Applied
        );
        if i % 1000 == 999 {
            tokio::time::sleep(Duration::from_millis(600)).await; // let TTLs run out
        }
    }
    let due_len: usize = redis::cmd("ZCARD")
        .arg(&due)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        due_len <= 2_000,
        "the due index is tidied by claims: {due_len} of 6,000"
    );
    cleanup(&url, &prefix).await;
}

/// Claims and finishes of concurrent deliveries travel to the server in shared
/// pipelines, yet each gets its own answer: one winner per id, a lost fence and a
/// corrupt record answered for their own entries only. A server that lost its
/// scripts gets them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_claims_and_finishes_each_get_their_own_answer() {
    let Some(_) = url() else { return };
    const PORT: u16 = 7197;
    let mut servers = Servers::new("batches");
    servers.start(PORT, &[]);
    let url = format!("redis://127.0.0.1:{PORT}");
    let prefix = random_prefix("batches");
    let store = store(&url, &prefix).await;
    let now = ms(Utc::now());
    let request = |id: &'static str| ClaimRequest {
        key: Key::new("test", id),
        fingerprint: Fingerprint::of(id.as_bytes()),
        token: FencingToken::random(),
        now,
        lease_until: now + TimeDelta::seconds(30),
        expires_at: now + TimeDelta::hours(1),
    };
    let ids: Vec<&'static str> = (0..200)
        .map(|i| &*Box::leak(format!("evt_{i}").into_boxed_str()))
        .collect();

    // Every id claimed twice at once: 400 claims in flight together.
    let requests: Vec<ClaimRequest<'_>> = ids.iter().chain(&ids).map(|id| request(id)).collect();
    let claims = join_all(requests.iter().map(|r| store.claim(r))).await;
    let mut winners = std::collections::HashMap::new();
    for (r, claim) in requests.iter().zip(claims) {
        match claim.unwrap() {
            Claim::Acquired(rec) => {
                assert_eq!(rec.token, r.token);
                assert!(
                    winners.insert(r.key.id, r.token).is_none(),
                    "two winners for {}",
                    r.key.id
                );
            }
            Claim::Existing(rec) => assert_eq!(rec.state, RecordState::InProgress),
        }
    }
    assert_eq!(winners.len(), ids.len(), "every id has one winner");

    // The server forgets its scripts; one record is corrupted behind the store's back.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let corrupt_key = record_keys(&url, &prefix)
        .await
        .into_iter()
        .find(|k| k.ends_with("\0evt_7"))
        .expect("the record of evt_7");
    let _: () = redis::cmd("SET")
        .arg(&corrupt_key)
        .arg(format!("in_progress|{}|not a record", winners["evt_7"].0))
        .query_async(&mut conn)
        .await
        .unwrap();
    // Another has the record's shape but not its numbers (written by something else).
    let odd_key = record_keys(&url, &prefix)
        .await
        .into_iter()
        .find(|k| k.ends_with("\0evt_9"))
        .expect("the record of evt_9");
    let _: () = redis::cmd("SET")
        .arg(&odd_key)
        .arg(format!(
            "in_progress|{}|{}|1|soon|0|0|later|0|",
            winners["evt_9"].0,
            Fingerprint::of(b"evt_9").to_hex()
        ))
        .query_async(&mut conn)
        .await
        .unwrap();
    // And one whose numbers Lua's `tonumber` reads but a sorted set refuses.
    let spaced_key = record_keys(&url, &prefix)
        .await
        .into_iter()
        .find(|k| k.ends_with("\0evt_11"))
        .expect("the record of evt_11");
    let _: () = redis::cmd("SET")
        .arg(&spaced_key)
        .arg(format!(
            "in_progress|{}|{}|1| 5|0|0| 9|0|",
            winners["evt_11"].0,
            Fingerprint::of(b"evt_11").to_hex()
        ))
        .query_async(&mut conn)
        .await
        .unwrap();

    // All finishes at once, evt_3's with a stale token.
    let done = Finish {
        state: RecordState::Completed,
        failures: 0,
        history: &[],
        now,
        expires_at: now + TimeDelta::hours(1),
    };
    let finishes = join_all(ids.iter().map(|id| {
        let token = if *id == "evt_3" {
            FencingToken(winners[id].0 ^ 1)
        } else {
            winners[id]
        };
        store.finish(Holder::new(Key::new("test", id), token), &done)
    }))
    .await;
    for (id, fence) in ids.iter().zip(finishes) {
        match *id {
            "evt_3" => assert_eq!(fence.unwrap(), Fence::LeaseLost),
            "evt_7" | "evt_9" | "evt_11" => {
                assert!(fence.is_err(), "a corrupt record is an error")
            }
            _ => assert_eq!(fence.unwrap(), Fence::Applied, "{id}"),
        }
    }
    for id in &ids {
        let rec = store.get(Key::new("test", id)).await;
        match *id {
            "evt_3" => assert_eq!(rec.unwrap().unwrap().state, RecordState::InProgress),
            "evt_7" | "evt_9" | "evt_11" => assert!(rec.is_err()),
            _ => assert_eq!(rec.unwrap().unwrap().state, RecordState::Completed),
        }
    }
    // Scans walk past both, and the purge removes them with the rest.
    let later = now + TimeDelta::hours(2);
    let stuck = store.stuck(later, 1_000).await.unwrap();
    let stuck: Vec<&str> = stuck.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(
        stuck,
        ["evt_3"],
        "the refused finish's claim, and no corrupt record"
    );
    let purged = store.purge_expired(later, 10_000).await.unwrap();
    assert_eq!(purged, ids.len() as u64);
    assert!(store.stuck(later, 1_000).await.unwrap().is_empty());
}

/// Claims `request` on a store whose connection belonged to a runtime that is
/// gone: requests may find it broken (unavailable) while it reconnects on this one.
async fn claim_once_reconnected(store: &RedisStore, request: &ClaimRequest<'_>) -> Claim {
    let mut claimed = store.claim(request).await;
    for _ in 0..50 {
        match &claimed {
            Err(e) if e.is_unavailable() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                claimed = store.claim(request).await;
            }
            _ => break,
        }
    }
    claimed.expect("the store reconnects")
}

/// A store outlives the runtime it was first used on (a store kept in a `static`
/// and shared by tests that each run their own runtime): the next runtime gets a
/// new batching task.
#[test]
fn a_store_works_on_after_the_runtime_it_started_on_shut_down() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("runtimes");
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let store = first.block_on(store(&url, &prefix));
    let now = ms(Utc::now());
    let request = move |id| fresh_request(id, now);
    let claimed = first.block_on(store.claim(&request("evt_1"))).unwrap();
    assert!(matches!(claimed, Claim::Acquired(_)));
    drop(first);

    let second = runtime();
    second.block_on(async {
        let claimed = claim_once_reconnected(&store, &request("evt_2")).await;
        assert!(matches!(claimed, Claim::Acquired(_)));
        let again = store.claim(&request("evt_1")).await.unwrap();
        assert!(matches!(again, Claim::Existing(_)));
        cleanup(&url, &prefix).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_caller_left_before_its_batch_was_sent_is_not_made() {
    let Some(_) = url() else { return };
    const PORT: u16 = 7196;
    let mut servers = Servers::new("left");
    servers.start(PORT, &[]);
    let url = format!("redis://127.0.0.1:{PORT}");
    let store = store(&url, &random_prefix("left")).await;
    let now = ms(Utc::now());
    let request = move |id| fresh_request(id, now);
    let claim = |id: &'static str| {
        let (store, request) = (store.clone(), request(id));
        tokio::spawn(async move { store.claim(&request).await })
    };
    // A first claim starts the batching task.
    assert!(matches!(
        claim("evt_warm").await.unwrap().unwrap(),
        Claim::Acquired(_)
    ));

    // The server holds writes back: two batches wait on the wire, and a third
    // claim queues behind them; its caller gives up before it is sent.
    cli(PORT, &["client", "pause", "5000", "write"]);
    let first = claim("evt_a");
    tokio::time::sleep(Duration::from_millis(150)).await;
    let second = claim("evt_b");
    tokio::time::sleep(Duration::from_millis(150)).await;
    let third = request("evt_c");
    let gave_up = tokio::time::timeout(Duration::from_millis(200), store.claim(&third));
    assert!(
        gave_up.await.is_err(),
        "the third claim waits behind two batches"
    );
    cli(PORT, &["client", "unpause"]);
    for waited in [first, second] {
        assert!(matches!(waited.await.unwrap().unwrap(), Claim::Acquired(_)));
    }

    // The abandoned claim was not made: the sender's retry gets the id at once.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let key = Key::new("test", "evt_c");
    assert_eq!(store.get(key).await.unwrap(), None, "no orphan claim");
    assert!(matches!(
        claim("evt_c").await.unwrap().unwrap(),
        Claim::Acquired(_)
    ));
}

#[test]
fn a_store_whose_first_runtime_is_not_driven_any_more_answers_in_bounded_time() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("undriven");
    let now = ms(Utc::now());
    let request = move |id| fresh_request(id, now);
    // The first claim starts the batching task on a current-thread runtime, which
    // runs its tasks only while something blocks on it, and then nothing does.
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = first.block_on(async {
        RedisStore::builder()
            .prefix(&prefix)
            .response_timeout(Duration::from_millis(300))
            .connect(url.as_str())
            .await
            .expect("connect to Redis")
    });
    let claimed = first.block_on(store.claim(&request("evt_1"))).unwrap();
    assert!(matches!(claimed, Claim::Acquired(_)));

    let second = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let claimed = tokio::time::timeout(Duration::from_secs(20), store.claim(&request("evt_2")))
            .await
            .expect("a claim must not wait forever");
        assert!(
            matches!(&claimed, Err(e) if e.is_unavailable()),
            "{claimed:?}"
        );
    });

    // Once the first runtime is gone, the store works on the second one.
    drop(first);
    second.block_on(async {
        let claimed = claim_once_reconnected(&store, &request("evt_2")).await;
        assert!(matches!(claimed, Claim::Acquired(_)));
        cleanup(&url, &prefix).await;
    });
}

#[tokio::test]
async fn a_claim_that_meets_its_own_write_again_is_granted() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("own");
    let store = store(&url, &prefix).await;
    let request = fresh_request("evt_own", ms(Utc::now()));
    // The same round trip run twice (as a cluster connection may, after a
    // redirect or a lost reply): the second run finds the first one's record.
    let Claim::Acquired(first) = store.claim(&request).await.unwrap() else {
        panic!("fresh claim")
    };
    match store.claim(&request).await.unwrap() {
        Claim::Acquired(again) => assert_eq!(again, first),
        other => panic!("a claim's own record answered {other:?}"),
    }
    // Another claim of the id still finds it taken.
    let other = ClaimRequest {
        token: FencingToken::random(),
        ..request
    };
    assert!(matches!(
        store.claim(&other).await.unwrap(),
        Claim::Existing(_)
    ));
    cleanup(&url, &prefix).await;
}

#[tokio::test]
async fn a_settle_that_meets_its_own_change_again_is_applied() {
    use webhook_guard::inbox::{Enqueued, NewEvent, Settle};
    let Some(url) = url() else { return };
    let prefix = random_prefix("settle-own");
    let store = store(&url, &prefix).await;
    let now = ms(Utc::now());
    let meta = webhook_guard::meta::EventMeta::default();
    let key = Key::new("ns", "evt_1");
    let new = NewEvent {
        key,
        fingerprint: Fingerprint::of(b"{}"),
        meta: &meta,
        payload: b"{}",
        now,
        expires_at: now + TimeDelta::hours(1),
    };
    assert_eq!(store.enqueue(&new).await.unwrap(), Enqueued::Inserted);
    let until = now + TimeDelta::minutes(5);
    let leased = store
        .lease(&LeaseRequest {
            namespace: "ns",
            now,
            lease_until: until,
            limit: 1,
        })
        .await
        .unwrap();
    let token = leased[0].token;
    let retry = Settle {
        holder: Holder::new(key, token),
        state: InboxState::Pending,
        next_attempt_at: now + TimeDelta::minutes(1),
        error: Some("timeout"),
        now: now + TimeDelta::seconds(1),
        expires_at: now + TimeDelta::hours(1),
        attempt_counts: true,
    };
    // The same script run twice (as a cluster connection may, after a lost
    // reply): the second run finds its own change.
    for run in ["first", "again"] {
        let fence = store.settle_event(&retry).await.unwrap();
        assert_eq!(fence, Fence::Applied, "{run}");
    }
    // Another holder's token, or a settle with other contents, is still refused.
    let other = Settle {
        holder: Holder::new(key, FencingToken::random()),
        ..retry
    };
    let other = store.settle_event(&other).await;
    assert_eq!(other.unwrap(), Fence::LeaseLost);
    let done = Settle {
        state: InboxState::Done,
        error: None,
        ..retry
    };
    assert_eq!(store.settle_event(&done).await.unwrap(), Fence::LeaseLost);
    let event = store.get_event(key).await.unwrap().unwrap();
    assert_eq!((event.state, event.attempts), (InboxState::Pending, 1));
    cleanup(&url, &prefix).await;
}

/// Inbox namespaces holding braces keep keys of their own: `a}:e:b` with id `c` and
/// `a` with id `b}:e:c` once spelled the same key (a `}` ended the hash tag).
#[tokio::test]
async fn inbox_namespaces_with_braces_do_not_share_keys() {
    use webhook_guard::inbox::{Enqueued, NewEvent};
    let Some(url) = url() else { return };
    let prefix = random_prefix("braces");
    let store = store(&url, &prefix).await;
    let now = ms(Utc::now());
    let meta = webhook_guard::meta::EventMeta::default();
    let keys = [Key::new("a}:e:b", "c"), Key::new("a", "b}:e:c")];
    for key in keys {
        let new = NewEvent {
            key,
            fingerprint: Fingerprint::of(key.namespace.as_bytes()),
            meta: &meta,
            payload: key.namespace.as_bytes(),
            now,
            expires_at: now + TimeDelta::hours(1),
        };
        assert_eq!(
            store.enqueue(&new).await.unwrap(),
            Enqueued::Inserted,
            "{key}"
        );
    }
    for key in keys {
        let event = store.get_event(key).await.unwrap().expect("stored");
        assert_eq!(event.payload, key.namespace.as_bytes(), "{key}");
        let request = LeaseRequest {
            namespace: key.namespace,
            now,
            lease_until: now + TimeDelta::minutes(1),
            limit: 10,
        };
        let leased = store.lease(&request);
        let leased = leased.await.unwrap();
        assert_eq!(leased.len(), 1, "{key}");
        assert_eq!(leased[0].id, key.id);
    }
    cleanup(&url, &prefix).await;
}

/// One record that does not read fails no scan: `stuck` lists the stuck records it
/// can read, and an inbox lease hands out the events it can read (the others of
/// its batch would otherwise wait out their lease with an attempt spent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_unreadable_record_fails_no_scan() {
    use webhook_guard::inbox::NewEvent;
    use webhook_guard::meta::EventMeta;
    let Some(url) = url() else { return };
    let prefix = random_prefix("unreadable");
    let store = RedisStore::builder()
        .prefix(&prefix)
        .shards(1)
        .connect(url.as_str())
        .await
        .unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let now = DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap();

    // Two claims whose leases run out; one of them then holds a token that is no
    // number (a record this crate did not write).
    for id in ["good", "odd"] {
        let request = ClaimRequest {
            key: Key::new("ns", id),
            fingerprint: Fingerprint::of(id.as_bytes()),
            token: FencingToken::random(),
            now,
            lease_until: now + TimeDelta::seconds(1),
            expires_at: now + TimeDelta::hours(1),
        };
        assert!(matches!(
            store.claim(&request).await.unwrap(),
            Claim::Acquired(_)
        ));
    }
    let odd = record_keys(&url, &prefix)
        .await
        .into_iter()
        .find(|k| k.ends_with("\0odd"))
        .expect("the record of odd");
    let value: String = redis::cmd("GET")
        .arg(&odd)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut fields: Vec<&str> = value.split('|').collect();
    fields[1] = "abc";
    let _: () = redis::cmd("SET")
        .arg(&odd)
        .arg(fields.join("|"))
        .arg("KEEPTTL")
        .query_async(&mut conn)
        .await
        .unwrap();
    let stuck = store.stuck(now + TimeDelta::seconds(5), 10).await.unwrap();
    let ids: Vec<&str> = stuck.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["good"]);

    // Two accepted events; one of them then holds a fingerprint that is no hex.
    let meta = EventMeta::default();
    for id in ["e_good", "e_odd"] {
        let event = NewEvent {
            key: Key::new("ns", id),
            fingerprint: Fingerprint::of(id.as_bytes()),
            meta: &meta,
            payload: b"p",
            now,
            expires_at: now + TimeDelta::hours(1),
        };
        store.enqueue(&event).await.unwrap();
    }
    let _: () = redis::cmd("HSET")
        .arg(format!("{{{prefix}:i:ns}}:e:e_odd"))
        .arg("f")
        .arg("zz")
        .query_async(&mut conn)
        .await
        .unwrap();
    let leased = store
        .lease(&LeaseRequest {
            namespace: "ns",
            now,
            lease_until: now + TimeDelta::seconds(60),
            limit: 10,
        })
        .await
        .unwrap();
    let ids: Vec<&str> = leased.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["e_good"]);
    cleanup(&url, &prefix).await;
}

/// The entries of every listing index of `prefix`, as `(state:namespace, member)`.
async fn listing_entries(url: &str, prefix: &str) -> Vec<(String, String)> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut out = Vec::new();
    for key in listing_keys(url, prefix).await {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        let index = key.split_once(":l:").unwrap().1.to_owned();
        out.extend(members.into_iter().map(|m| (index.clone(), m)));
    }
    out.sort();
    out
}

/// A listing repairs each stale entry it meets, atomically against the record:
/// a failed record's entry scored at another time (as a refused native finish
/// leaves it) is scored again at its `updated_at`, and an entry whose record is in
/// another state (a finished record the TTL dropped and stored again) or under
/// another claim is removed. None of them is listed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_repairs_the_stale_entries_it_meets() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("listing-repair");
    let store = store(&url, &prefix).await;
    let now = Utc::now();
    let at = now + TimeDelta::seconds(1);
    for (id, state) in [("a", RecordState::Failed), ("b", RecordState::Completed)] {
        let request = ClaimRequest {
            key: Key::new("ns", id),
            ..fresh_request(id, now)
        };
        assert!(matches!(
            store.claim(&request).await.unwrap(),
            Claim::Acquired(_)
        ));
        let finish = Finish {
            state,
            failures: 1,
            history: &[],
            now: at,
            expires_at: now + TimeDelta::hours(1),
        };
        let applied = store.finish(request.holder(), &finish);
        assert_eq!(applied.await.unwrap(), Fence::Applied);
    }
    // The three stale entries, each in its record's shard.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys = listing_keys(&url, &prefix).await;
    let index_of = |state: &str| {
        keys.iter()
            .find(|k| k.ends_with(&format!(":l:{state}:ns")))
            .unwrap()
            .clone()
    };
    let (failed, completed) = (index_of("failed"), index_of("completed"));
    let early = at.timestamp_millis() - 5000;
    let zadd = |key: String, score: i64, member: String| {
        let mut conn = conn.clone();
        async move {
            let _: i64 = redis::cmd("ZADD")
                .arg(key)
                .arg(score)
                .arg(member)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    };
    zadd(failed.clone(), early, "a".into()).await;
    zadd(
        completed.replace(":l:completed:", ":l:failed:"),
        early,
        "b".into(),
    )
    .await;
    let in_progress = failed.replace(":l:failed:", ":l:in_progress:");
    zadd(in_progress.clone(), early, "a\0999".into()).await;

    let list = store.record_listing().expect("the Redis store lists");
    let query = RecordQuery::new("ns", at).states([ListState::Failed, ListState::InProgress]);
    let page = list.list_records(&query).await.expect("list failed");
    assert!(
        page.items.is_empty(),
        "no stale entry is listed: {:?}",
        page.items
    );
    let score: Option<i64> = redis::cmd("ZSCORE")
        .arg(&failed)
        .arg("a")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        score,
        Some(at.timestamp_millis()),
        "a's entry scored at its updated_at"
    );
    let entries = listing_entries(&url, &prefix).await;
    let entry = |s: &str, id: &str| (format!("{s}:ns"), id.to_owned());
    assert_eq!(
        entries,
        [entry("completed", "b"), entry("failed", "a")],
        "b's failed entry and the unknown claim's entry removed"
    );
    let page = list.list_records(&query).await.expect("list failed");
    let ids: Vec<&str> = page.items.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["a"], "a is listed once repaired");
    cleanup(&url, &prefix).await;
}

/// Every write keeps the listing indexes: a claim files its entry in
/// `in_progress`, a finish moves it to the new state, a duplicate's entry goes
/// again, a take-over moves a failed record back, and delete and purge remove it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_keeps_the_listing_indexes() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("listing-index");
    let store = store(&url, &prefix).await;
    let now = Utc::now();
    let request = |id: &'static str, at: DateTime<Utc>| ClaimRequest {
        key: Key::new("ns", id),
        fingerprint: Fingerprint::of(id.as_bytes()),
        token: FencingToken::random(),
        now: at,
        lease_until: at + TimeDelta::minutes(5),
        expires_at: at + TimeDelta::hours(1),
    };
    let finish = |state, at| Finish {
        state,
        failures: 0,
        history: &[],
        now: at,
        expires_at: now + TimeDelta::hours(1),
    };
    let (a, b, c) = (request("a", now), request("b", now), request("c", now));
    for r in [&a, &b, &c] {
        assert!(matches!(store.claim(r).await.unwrap(), Claim::Acquired(_)));
    }
    let ip = |id: &str, t: FencingToken| ("in_progress:ns".to_owned(), format!("{id}\0{}", t.0));
    let entry = |s: &str, id: &str| (format!("{s}:ns"), id.to_owned());
    assert_eq!(
        listing_entries(&url, &prefix).await,
        [ip("a", a.token), ip("b", b.token), ip("c", c.token)]
    );
    let done = now + TimeDelta::seconds(1);
    let f = finish(RecordState::Completed, done);
    let applied = store.finish(a.holder(), &f).await;
    assert_eq!(applied.unwrap(), Fence::Applied);
    let f = finish(RecordState::Failed, done);
    let applied = store.finish(b.holder(), &f).await;
    assert_eq!(applied.unwrap(), Fence::Applied);
    // A duplicate of `a` files an entry in its transaction and drops it again.
    let dup = request("a", now + TimeDelta::seconds(2));
    assert!(matches!(
        store.claim(&dup).await.unwrap(),
        Claim::Existing(_)
    ));
    // A retry takes `b` over: back in progress, under its new token.
    let retry = request("b", now + TimeDelta::seconds(3));
    assert!(matches!(
        store.claim(&retry).await.unwrap(),
        Claim::Acquired(_)
    ));
    let expected = vec![
        entry("completed", "a"),
        ip("b", retry.token),
        ip("c", c.token),
    ];
    let mut got = Vec::new();
    for _ in 0..100 {
        // The duplicate's entry goes in a later batch.
        got = listing_entries(&url, &prefix).await;
        if got == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(got, expected);
    // A late finish by `b`'s old holder is refused and drops no live entry.
    let f = finish(RecordState::Completed, done);
    let stale = store.finish(b.holder(), &f).await;
    assert_eq!(stale.unwrap(), Fence::LeaseLost);
    assert_eq!(listing_entries(&url, &prefix).await, expected);
    let later = now + TimeDelta::seconds(4);
    let f = finish(RecordState::Escalated, later);
    let applied = store.finish(c.holder(), &f).await;
    assert_eq!(applied.unwrap(), Fence::Applied);
    store.delete(c.key, later).await.unwrap();
    assert_eq!(
        store
            .purge_expired(now + TimeDelta::days(1), 100)
            .await
            .unwrap(),
        2,
        "`a` and `b` expired a day later"
    );
    assert_eq!(listing_entries(&url, &prefix).await, []);
    cleanup(&url, &prefix).await;
}
