//! `MySqlStore` on a live MySQL / MariaDB server.
//!
//! The URL comes from `WEBHOOK_GUARD_MYSQL_URL` (locally
//! `mysql://root@127.0.0.1:3306/test`). Every test works in a fresh table with a
//! random name and drops it at the end.

use crate::support;
use crate::support::inbox as inbox_support;

use std::collections::BTreeMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use webhook_guard::inbox::InboxEvent;
use webhook_guard::store::mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use webhook_guard::store::mysql::sqlx::{self, Executor, Row};
use webhook_guard::store::{
    Claim, ClaimRequest, Fence, FencingToken, Fingerprint, Finish, Holder, Key, MySqlStore,
    ProcessedStore, RecordState, Recorded, Renew, StoreError,
};
use webhook_guard::verify::NoVerification;
use webhook_guard::{conformance, EventId, HandlerError, Outcome, WebhookGuard};

const URL_VAR: &str = "WEBHOOK_GUARD_MYSQL_URL";

fn url() -> Option<String> {
    support::server_url(URL_VAR)
}

fn random_table() -> String {
    format!("wg_test_{:016x}", FencingToken::random().0)
}

async fn pool(url: &str, max: u32) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .expect("connect to the test server")
}

/// A migrated store in a fresh table on its own pool.
async fn fresh_store(url: &str, max: u32) -> MySqlStore {
    let store = MySqlStore::new(pool(url, max).await)
        .with_table(&random_table())
        .unwrap();
    store.migrate().await.expect("migrate");
    store
}

async fn drop_table(store: &MySqlStore) {
    let sql = format!(
        "DROP TABLE IF EXISTS `{t}`, `{t}_effects`, `{}`, `{}`",
        store.inbox_table(),
        store.objects_table(),
        t = store.table()
    );
    store
        .pool()
        .execute(sql.as_str())
        .await
        .expect("drop table");
}

/// Millisecond-precision "now", as the store keeps it.
fn now() -> DateTime<Utc> {
    DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap()
}

fn request<'a>(key: Key<'a>, body: &[u8], now: DateTime<Utc>, lease_s: i64) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        fingerprint: Fingerprint::of(body),
        token: FencingToken::random(),
        now,
        lease_until: now + TimeDelta::seconds(lease_s),
        expires_at: now + TimeDelta::hours(1),
    }
}

async fn timed<T>(name: &str, f: impl Future<Output = T>) -> T {
    let start = Instant::now();
    let out = f.await;
    eprintln!("{name}: {:?}", start.elapsed());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_store_passes_the_conformance_suite() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 8).await;
    store.migrate().await.expect("migrate is idempotent");
    timed("conformance", conformance::run_all(&store)).await;
    // Again on the same table, now holding the first run's records.
    timed("conformance again", conformance::run_all(&store)).await;
    timed("listing", conformance::listing::run_all(&store)).await;
    timed("inbox listing", conformance::listing::run_inbox(&store)).await;
    drop_table(&store).await;
}

/// A table named by a reserved word works: every statement quotes its names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_word_is_a_table_name_like_any_other() {
    let Some(url) = url() else { return };
    let store = MySqlStore::new(pool(&url, 4).await)
        .with_table("order")
        .unwrap();
    drop_table(&store).await; // what a crashed earlier run may have left
    store.migrate().await.expect("migrate");
    assert!(store
        .schema_sql()
        .contains("CREATE TABLE IF NOT EXISTS `order` ("));
    conformance::run_all(&store).await;
    conformance::inbox::run_all(&store).await;
    conformance::ordering::run_all(&store).await;
    drop_table(&store).await;
}

/// The claim must not depend on the order in which the server evaluates the
/// assignments of `ON DUPLICATE KEY UPDATE`: MariaDB's `SIMULTANEOUS_ASSIGNMENT`
/// mode makes every assignment see the old row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_holds_with_simultaneous_assignment() {
    let Some(url) = url() else { return };
    let probe = pool(&url, 1).await;
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&probe)
        .await
        .unwrap();
    if !version.contains("MariaDB") {
        eprintln!("SKIPPED: SIMULTANEOUS_ASSIGNMENT is MariaDB's ({version})");
        return;
    }
    let pool = MySqlPoolOptions::new()
        .max_connections(4)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(
                    "SET SESSION sql_mode = CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')",
                )
                .await?;
                Ok(())
            })
        })
        .connect(&url)
        .await
        .unwrap();
    let mode: String = sqlx::query_scalar("SELECT @@SESSION.sql_mode")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(mode.contains("SIMULTANEOUS_ASSIGNMENT"), "{mode}");
    let store = MySqlStore::new(pool).with_table(&random_table()).unwrap();
    store.migrate().await.unwrap();
    conformance::run_all(&store).await;
    conformance::inbox::run_all(&store).await;
    conformance::ordering::run_all(&store).await;
    drop_table(&store).await;
}

/// 1,000 deliveries of 10 ids through two guards on two pools: 10 handler runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_guards_run_each_event_once() {
    let Some(url) = url() else { return };
    let first = fresh_store(&url, 8).await;
    let second = MySqlStore::new(pool(&url, 8).await)
        .with_table(first.table())
        .unwrap();
    support::two_replicas_run_each_handler_exactly_once(first.clone(), second).await;
    for i in 0..10 {
        let rec = first
            .get(Key::new("test", &format!("evt_{i}")))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(rec.attempts, 1);
    }
    drop_table(&first).await;
}

/// After the lease runs out the record is taken over (by exactly one of many
/// claims), and the old holder's token is refused for finish and renew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_takeover_fences_the_stale_holder() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 8).await;
    let t0 = now();
    let key = Key::new("takeover", "evt_crash");
    let first = request(key, b"body", t0, 30);
    assert!(matches!(
        store.claim(&first).await.unwrap(),
        Claim::Acquired(_)
    ));

    let early = request(key, b"body", t0 + TimeDelta::seconds(29), 30);
    let Claim::Existing(rec) = store.claim(&early).await.unwrap() else {
        panic!("a live lease must hold");
    };
    assert_eq!(rec.token, first.token);

    // 16 deliveries arrive when the lease has run out: one takes over.
    let at = t0 + TimeDelta::seconds(30);
    let late: Vec<_> = (0..16).map(|_| request(key, b"body", at, 30)).collect();
    let answers = futures_util::future::join_all(late.iter().map(|r| store.claim(r))).await;
    let winners: Vec<_> = answers
        .into_iter()
        .filter_map(|a| match a.unwrap() {
            Claim::Acquired(r) => Some(r),
            Claim::Existing(_) => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "exactly one takeover");
    let winner = &winners[0];
    assert_eq!((winner.attempts, winner.failures), (2, 1));
    assert_eq!(winner.created_at, t0, "created_at kept");
    assert_eq!(winner.lease_until, at + TimeDelta::seconds(30));

    let done = Finish {
        state: RecordState::Completed,
        failures: 1,
        history: &[],
        now: at + TimeDelta::seconds(1),
        expires_at: at + TimeDelta::hours(2),
    };
    let stale = first.token;
    assert_eq!(
        store
            .renew(
                Holder::new(key, stale),
                &Renew {
                    lease_until: at + TimeDelta::seconds(90),
                    expires_at: at + TimeDelta::hours(3)
                }
            )
            .await
            .unwrap(),
        Fence::LeaseLost,
        "the stale holder cannot renew"
    );
    assert_eq!(
        store.finish(Holder::new(key, stale), &done).await.unwrap(),
        Fence::LeaseLost,
        "the stale holder cannot finish"
    );
    assert_eq!(
        store.get(key).await.unwrap().unwrap().state,
        RecordState::InProgress
    );
    assert_eq!(
        store
            .finish(Holder::new(key, winner.token), &done)
            .await
            .unwrap(),
        Fence::Applied
    );
    let rec = store.get(key).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.token, winner.token);
    drop_table(&store).await;
}

/// MySQL counts changed rows by default; a fence must count matched rows, or a
/// renew that changes nothing would look like a lost lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_counts_matched_rows_not_changed_rows() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 2).await;
    let t0 = now();
    let key = Key::new("fence", "evt_1");
    let req = request(key, b"b", t0, 60);
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Acquired(_)
    ));
    let lease = t0 + TimeDelta::seconds(120);
    for _ in 0..3 {
        assert_eq!(
            store
                .renew(
                    Holder::new(key, req.token),
                    &Renew {
                        lease_until: lease,
                        expires_at: req.expires_at
                    }
                )
                .await
                .unwrap(),
            Fence::Applied,
            "a renew to the same values is applied"
        );
    }
    drop_table(&store).await;
}

/// Keys compare byte for byte (no PAD SPACE, no case folding) and the longest
/// keys the guard accepts fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_compare_exactly_and_long_keys_fit() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 2).await;
    let t0 = now();
    for id in ["evt_1", "evt_1 ", "EVT_1", "évt_1", "e\u{301}vt_1"] {
        let req = request(Key::new("exact", id), b"b", t0, 60);
        assert!(
            matches!(store.claim(&req).await.unwrap(), Claim::Acquired(_)),
            "{id:?} is its own key"
        );
    }
    let namespace = "n".repeat(64);
    let id = format!("{}x", "é".repeat(127)); // 255 bytes
    assert_eq!(id.len(), 255);
    let key = Key::new(&namespace, &id);
    let req = request(key, b"b", t0, 60);
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Acquired(_)
    ));
    let rec = store.get(key).await.unwrap().unwrap();
    assert_eq!(
        (rec.namespace.as_str(), rec.id.as_str()),
        (namespace.as_str(), id.as_str())
    );
    let stuck = store.stuck(t0 + TimeDelta::seconds(61), 100).await.unwrap();
    assert!(stuck.iter().any(|r| r.id == id), "stuck decodes the key");
    drop_table(&store).await;
}

/// 100,000 expired records are purged in batches while fresh claims go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purge_of_100k_expired_records_while_claims_continue() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 8).await;
    let t = now();
    let old = t - TimeDelta::days(10);
    let (t_ms, old_ms) = (t.timestamp_millis(), old.timestamp_millis());
    // 100,000 completed records that expired before `t` (digits cross-joined, which
    // works on MySQL 8 too, whose recursive CTEs stop at 1,000 rows by default),
    // and 10 expired records whose lease is still live.
    let digits = "(SELECT 0 n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let insert = format!(
        "INSERT INTO {table} (namespace, id, state, fingerprint, token, attempts, failures, \
         lease_until, expires_at, created_at, updated_at, history) \
         SELECT 'purge', CONCAT('old-', s.n), 'completed', UNHEX(REPEAT('00', 32)), s.n, 1, 0, \
         {old_ms}, {old_ms} + s.n, {old_ms}, {old_ms}, '' FROM \
         (SELECT a.n + 10 * b.n + 100 * c.n + 1000 * d.n + 10000 * e.n AS n \
          FROM {digits} a, {digits} b, {digits} c, {digits} d, {digits} e) s",
        table = store.table()
    );
    let live_leases = format!(
        "INSERT INTO {table} (namespace, id, state, fingerprint, token, attempts, failures, \
         lease_until, expires_at, created_at, updated_at, history) \
         SELECT 'purge', CONCAT('leased-', n), 'in_progress', UNHEX(REPEAT('00', 32)), n, 1, 0, \
         {live}, {old_ms}, {old_ms}, {old_ms}, '' FROM {digits} d",
        table = store.table(),
        live = t_ms + 600_000,
    );
    let inserted = timed("bulk insert of 100,000 rows", async {
        store.pool().execute(insert.as_str()).await.unwrap()
    })
    .await;
    assert_eq!(inserted.rows_affected(), 100_000);
    store.pool().execute(live_leases.as_str()).await.unwrap();

    let purging = Arc::new(AtomicBool::new(true));
    let claimers: Vec<JoinHandle<(usize, Duration)>> = (0..4)
        .map(|w| {
            let store = store.clone();
            let purging = purging.clone();
            tokio::spawn(async move {
                let (mut n, mut slowest) = (0usize, Duration::ZERO);
                while purging.load(Ordering::SeqCst) || n < 50 {
                    let id = format!("live-{w}-{n}");
                    let req = request(Key::new("purge", &id), b"b", t, 60);
                    let start = Instant::now();
                    let claim = store.claim(&req).await.expect("claim during purge");
                    slowest = slowest.max(start.elapsed());
                    assert!(matches!(claim, Claim::Acquired(_)), "{id} acquired");
                    n += 1;
                }
                (n, slowest)
            })
        })
        .collect();
    let start = Instant::now();
    let (mut purged, mut calls) = (0u64, 0);
    loop {
        let n = store.purge_expired(t, 10_000).await.expect("purge");
        calls += 1;
        purged += n;
        if n == 0 {
            break;
        }
    }
    let purge_time = start.elapsed();
    purging.store(false, Ordering::SeqCst);
    let mut claimed = 0;
    let mut slowest = Duration::ZERO;
    for c in claimers {
        let (n, s) = c.await.unwrap();
        claimed += n;
        slowest = slowest.max(s);
    }
    eprintln!(
        "purged {purged} in {purge_time:?} ({calls} calls); {claimed} claims meanwhile, slowest {slowest:?}"
    );
    assert_eq!(purged, 100_000);
    let count = |pattern: &'static str| {
        let sql = format!(
            "SELECT COUNT(*) FROM {} WHERE namespace = 'purge' AND id LIKE ?",
            store.table()
        );
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(&sql)
                .bind(pattern)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(count("old-%").await, 0, "every expired record is gone");
    assert_eq!(count("leased-%").await, 10, "live leases are never purged");
    assert_eq!(
        count("live-%").await,
        claimed as i64,
        "no fresh claim was purged"
    );
    drop_table(&store).await;
}

/// Unknown tables and bad names are errors of their own kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_classified() {
    let Some(url) = url() else { return };
    let pool = pool(&url, 2).await;
    let err = MySqlStore::new(pool.clone())
        .with_table("bad-name; DROP TABLE x")
        .unwrap_err();
    assert_eq!(err.name(), "bad-name; DROP TABLE x");
    let missing = MySqlStore::new(pool).with_table(&random_table()).unwrap();
    let err = missing
        .get(Key::new("n", "evt"))
        .await
        .expect_err("no such table");
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    let source = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .expect("the driver's error is kept");
    assert!(matches!(source, sqlx::Error::Database(_)), "{source:?}");

    let unreachable = MySqlPoolOptions::new()
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy_with(
            MySqlConnectOptions::from_str(&url)
                .unwrap()
                .host("127.0.0.1")
                .port(closed_port().await),
        );
    let err = MySqlStore::new(unreachable)
        .get(Key::new("n", "evt"))
        .await
        .expect_err("nothing listens");
    assert!(err.is_unavailable(), "{err:?}");
}

/// A port on which nothing listens (bound, then released).
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// The server kills the store's connections: the next call opens new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovers_when_its_connections_are_killed() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 3).await;
    let admin = pool(&url, 1).await;
    let ids = connection_ids(store.pool(), 3).await;
    let t0 = now();
    let key = Key::new("kill", "evt_1");
    assert!(matches!(
        store.claim(&request(key, b"b", t0, 60)).await.unwrap(),
        Claim::Acquired(_)
    ));
    for id in &ids {
        sqlx::query(&format!("KILL CONNECTION {id}"))
            .execute(&admin)
            .await
            .unwrap();
    }
    let rec = store
        .get(key)
        .await
        .expect("the pool replaced killed connections");
    assert!(rec.is_some());
    let after = connection_ids(store.pool(), 3).await;
    assert!(
        after.iter().all(|id| !ids.contains(id)),
        "{ids:?} -> {after:?}"
    );
    drop_table(&store).await;
}

/// The ids of `n` connections of `pool`, all held at once.
async fn connection_ids(pool: &MySqlPool, n: usize) -> Vec<u64> {
    let mut held = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..n {
        let mut conn = pool.acquire().await.unwrap();
        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        ids.push(id);
        held.push(conn);
    }
    ids
}

/// A TCP proxy in front of the server, which the test closes and reopens on the
/// same port: the store answers `Unavailable` while it is closed and recovers by
/// itself once it is open again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_while_the_server_is_unreachable_then_recovers() {
    let Some(url) = url() else { return };
    let options = MySqlConnectOptions::from_str(&url).unwrap();
    let target = format!("{}:{}", options.get_host(), options.get_port());
    let mut proxy = Proxy::start(0, target.clone()).await;
    let port = proxy.port;
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(options.clone().host("127.0.0.1").port(port))
        .await
        .unwrap();
    let store = MySqlStore::new(pool).with_table(&random_table()).unwrap();
    store.migrate().await.unwrap();
    let key = Key::new("proxy", "evt_1");
    let t0 = now();
    assert!(matches!(
        store.claim(&request(key, b"b", t0, 60)).await.unwrap(),
        Claim::Acquired(_)
    ));

    proxy.stop();
    let start = Instant::now();
    let err = store
        .claim(&request(Key::new("proxy", "evt_2"), b"b", t0, 60))
        .await
        .expect_err("the server is unreachable");
    eprintln!("unavailable after {:?}: {err}", start.elapsed());
    assert!(err.is_unavailable(), "{err:?}");
    assert!(std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .is_some());

    let _proxy = Proxy::start(port, target).await;
    let rec = store.get(key).await.expect("recovered").expect("kept");
    assert_eq!(rec.state, RecordState::InProgress);
    assert!(matches!(
        store
            .claim(&request(Key::new("proxy", "evt_2"), b"b", t0, 60))
            .await
            .unwrap(),
        Claim::Acquired(_)
    ));
    drop_table(&store).await;
}

struct Proxy {
    port: u16,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(port: u16, target: String) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let tasks = Arc::new(Mutex::new(Vec::new()));
        let pipes = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let pipe = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                pipes.lock().unwrap().push(pipe);
            }
        });
        tasks.lock().unwrap().push(accept);
        Self { port, tasks }
    }

    /// Stops listening and cuts every open connection.
    fn stop(&mut self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Not a correctness test: prints guard cycles/s against raw single-statement
/// upserts/s at 16 tasks on a pool of 16. Run with `--ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "throughput measurement"]
async fn throughput_against_raw_upserts() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 16).await;
    let secs = Duration::from_secs(5);
    let raw_sql = format!(
        "INSERT INTO {} (namespace, id, state, fingerprint, token, attempts, failures, \
         lease_until, expires_at, created_at, updated_at, history) \
         VALUES ('raw', ?, 'in_progress', ?, ?, 1, 0, ?, ?, ?, ?, '') \
         ON DUPLICATE KEY UPDATE attempts = attempts + 1",
        store.table()
    );
    let counter = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + secs;
    let tasks: Vec<_> = (0..16)
        .map(|w| {
            let pool = store.pool().clone();
            let sql = raw_sql.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let t = Utc::now().timestamp_millis();
                    sqlx::query(&sql)
                        .bind(format!("{w}-{i}"))
                        .bind(&[0u8; 32][..])
                        .bind(i as i64)
                        .bind(t)
                        .bind(t)
                        .bind(t)
                        .bind(t)
                        .execute(&pool)
                        .await
                        .unwrap();
                    counter.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let raw = counter.load(Ordering::Relaxed) as f64 / secs.as_secs_f64();

    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .namespace("bench")
        .build()
        .unwrap();
    let counter = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + secs;
    let rt = tokio::runtime::Handle::current();
    let tasks: Vec<_> = (0..16)
        .map(|w| {
            let guard = guard.clone();
            let counter = counter.clone();
            let rt = rt.clone();
            // Each worker drives its own sequential loop on a blocking thread.
            tokio::task::spawn_blocking(move || {
                rt.block_on(async move {
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let id = format!("{w}-{i}");
                        let headers = [("x-id", id.as_str())];
                        let outcome = guard.handle(&headers, b"{}", |_| async { Ok(()) }).await;
                        assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
                        counter.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                })
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let cycles = counter.load(Ordering::Relaxed) as f64 / secs.as_secs_f64();
    eprintln!(
        "raw upserts/s {raw:.0}, guard cycles/s {cycles:.0}, ratio {:.2}",
        cycles / raw
    );
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_inbox_and_ordering_conformance_suites() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 8).await;
    store.migrate().await.expect("migrate is idempotent");
    timed("inbox suite", conformance::inbox::run_all(&store)).await;
    timed("ordering suite", conformance::ordering::run_all(&store)).await;
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_and_its_worker_process_events_end_to_end() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 8).await;
    timed(
        "end to end",
        inbox_support::guard_and_worker_end_to_end(store.clone()),
    )
    .await;
    drop_table(&store).await;
}

/// Creates `<table>_effects (namespace, id)` with no unique key: an effect applied
/// twice shows as two rows.
async fn effects_table(store: &MySqlStore) -> String {
    let name = format!("{}_effects", store.table());
    let sql = format!(
        "CREATE TABLE {name} (namespace VARBINARY(64) NOT NULL, id VARBINARY(255) NOT NULL) \
         ENGINE=InnoDB"
    );
    store.pool().execute(sql.as_str()).await.unwrap();
    name
}

/// Effect rows per id in `namespace`.
async fn effects(store: &MySqlStore, namespace: &str) -> BTreeMap<String, i64> {
    let sql = format!(
        "SELECT id, count(*) FROM {}_effects WHERE namespace = ? GROUP BY id",
        store.table()
    );
    sqlx::query_as::<_, (Vec<u8>, i64)>(&sql)
        .bind(namespace)
        .fetch_all(store.pool())
        .await
        .unwrap()
        .into_iter()
        .map(|(id, n)| (String::from_utf8(id).unwrap(), n))
        .collect()
}

/// Whether `e` is InnoDB's deadlock victim error (the transaction was rolled back).
fn is_deadlock(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(e) = source {
        if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>() {
            return db.code().as_deref() == Some("40001");
        }
        source = e.source();
    }
    false
}

/// Applies an effect row for `key` in one transaction with its dedup record, running
/// the transaction again when InnoDB picked it as a deadlock victim.
async fn apply_once(
    store: &MySqlStore,
    effects: &str,
    key: Key<'_>,
    fingerprint: Fingerprint,
) -> Result<(Recorded, usize), HandlerError> {
    let mut deadlocks = 0;
    loop {
        let attempt = async {
            let now = inbox_support::now_ms();
            let mut tx = store.pool().begin().await.map_err(StoreError::backend)?;
            let recorded = store
                .record_in(&mut tx, key, fingerprint, now, now + TimeDelta::hours(72))
                .await?;
            if recorded == Recorded::First {
                sqlx::query(&format!(
                    "INSERT INTO {effects} (namespace, id) VALUES (?, ?)"
                ))
                .bind(key.namespace)
                .bind(key.id)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::backend)?;
            }
            tx.commit().await.map_err(StoreError::backend)?;
            Ok::<_, StoreError>(recorded)
        };
        match attempt.await {
            Ok(recorded) => return Ok((recorded, deadlocks)),
            Err(e) if deadlocks < 20 && is_deadlock(&e) => deadlocks += 1,
            Err(e) => return Err(HandlerError::retryable(e)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_transactional_mode_applies_a_database_effect_exactly_once_under_1000_concurrent_duplicates(
) {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 20).await;
    let effects_name = effects_table(&store).await;
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000usize {
        let (store, effects_name) = (store.clone(), effects_name.clone());
        tasks.spawn(async move {
            let id = format!("tx_{}", i % 10);
            let key = Key::new("txn", &id);
            apply_once(&store, &effects_name, key, Fingerprint::of(id.as_bytes()))
                .await
                .expect("transaction")
        });
    }
    let (mut first, mut deadlocks) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        let (recorded, retried) = r.expect("task");
        deadlocks += retried;
        match recorded {
            Recorded::First => first += 1,
            Recorded::Duplicate => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    eprintln!(
        "1,000 concurrent transactions over 10 ids: {:?} ({deadlocks} deadlock victims run again)",
        start.elapsed()
    );
    assert_eq!(first, 10);
    let applied = effects(&store, "txn").await;
    assert_eq!(applied.len(), 10);
    assert!(applied.values().all(|n| *n == 1), "{applied:?}");

    // A rolled-back recording leaves nothing; a different body is a conflict.
    let key = Key::new("txn", "rolled_back");
    let fp = Fingerprint::of(b"a");
    let now = inbox_support::now_ms();
    let mut tx = store.pool().begin().await.unwrap();
    assert_eq!(
        store
            .record_in(&mut tx, key, fp, now, now + TimeDelta::hours(1))
            .await
            .unwrap(),
        Recorded::First
    );
    tx.rollback().await.unwrap();
    let once = |fp| apply_once(&store, &effects_name, key, fp);
    assert_eq!(once(fp).await.unwrap().0, Recorded::First);
    assert_eq!(once(fp).await.unwrap().0, Recorded::Duplicate);
    assert_eq!(
        once(Fingerprint::of(b"b")).await.unwrap().0,
        Recorded::Conflict
    );
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_worker_at_every_step_never_loses_or_double_applies_an_event() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 16).await;
    let effects_name = effects_table(&store).await;
    let handler = {
        let store = store.clone();
        move |e: InboxEvent| {
            let (store, effects_name) = (store.clone(), effects_name.clone());
            // The transaction runs in its own task so that killing the worker
            // (dropping its futures) never cancels a `BEGIN` in flight: sqlx 0.8 would
            // return that connection to the pool inside an open transaction
            // (launchbadge/sqlx#2054). A real crash closes the connection instead.
            let key = (e.namespace.clone(), e.id.clone());
            let applied = tokio::spawn(async move {
                let key = Key::new(&key.0, &key.1);
                apply_once(&store, &effects_name, key, e.fingerprint).await
            });
            async move {
                applied.await.map_err(HandlerError::retryable)??;
                Ok(())
            }
        }
    };
    let start = Instant::now();
    let points = inbox_support::kill_at_every_step(store.clone(), handler, async |ns: &str| {
        effects(&store, ns).await
    })
    .await;
    eprintln!(
        "killed at each of {points} store calls, then recovered: {:?}",
        start.elapsed()
    );
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_in_leaves_a_live_claim_alone_and_takes_over_an_abandoned_one() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 4).await;
    support::record_in_leaves_a_live_claim_alone_and_takes_over_an_abandoned_one(
        &store,
        support::record_in_committed!(store),
    )
    .await;
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_purge_statement_leaves_no_isolation_level_behind_in_the_pool() {
    let Some(url) = url() else { return };
    // One connection, and a store whose table does not exist: its purge sets the
    // next transaction's isolation level, then fails.
    let pooled = pool(&url, 1).await;
    let store = MySqlStore::new(pooled.clone())
        .with_table(&random_table())
        .unwrap();
    assert!(store.purge_expired(Utc::now(), 10).await.is_err());

    // The next transaction on that pool runs at the server's default, repeatable
    // read: a row another session changes after the first read keeps its value.
    let other = pool(&url, 1).await;
    let table = random_table();
    other
        .execute(format!("CREATE TABLE {table} (k INT PRIMARY KEY, v INT) ENGINE=InnoDB").as_str())
        .await
        .unwrap();
    other
        .execute(format!("INSERT INTO {table} VALUES (1, 1)").as_str())
        .await
        .unwrap();
    let read = format!("SELECT v FROM {table} WHERE k = 1");
    let mut tx = pooled.begin().await.unwrap();
    let first: i32 = sqlx::query_scalar(&read).fetch_one(&mut *tx).await.unwrap();
    other
        .execute(format!("UPDATE {table} SET v = 2 WHERE k = 1").as_str())
        .await
        .unwrap();
    let second: i32 = sqlx::query_scalar(&read).fetch_one(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    other
        .execute(format!("DROP TABLE {table}").as_str())
        .await
        .unwrap();
    assert_eq!(
        (first, second),
        (1, 1),
        "the transaction ran at read committed"
    );
}

/// Turns the server's `read_only` off again when dropped, even if the test fails.
struct ReadOnly(String);

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let url = self.0.clone();
        // Dropped inside the test's runtime: finish on a thread with its own (and
        // its own connection: a pool's belong to the runtime that opened them).
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    pool(&url, 1)
                        .await
                        .execute("SET GLOBAL read_only = OFF")
                        .await
                        .expect("read_only off again");
                });
        })
        .join()
        .unwrap();
    }
}

/// A user `name` (password `wg`, created with `options`) with the rights a store
/// needs on `test`, not root's; the server's URL as that user.
async fn test_user(admin: &MySqlPool, url: &str, name: &str, options: &str) -> String {
    for sql in [
        format!("CREATE USER IF NOT EXISTS '{name}'@'%' IDENTIFIED BY 'wg' {options}"),
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, INDEX ON test.* TO '{name}'@'%'"
        ),
    ] {
        admin.execute(sql.as_str()).await.expect("a test user");
    }
    let user_url = url.replacen("mysql://root@", &format!("mysql://{name}:wg@"), 1);
    assert_ne!(user_url, url, "the URL names root@: {url}");
    user_url
}

/// A server in `read_only` mode (a replica after a fail-over) is a store that cannot
/// be written: `Unavailable`, as for a server that is down. The store runs as a user
/// without the privilege that passes `read_only` (root has it).
#[tokio::test]
async fn a_read_only_server_is_unavailable() {
    let Some(url) = url() else { return };
    let admin = pool(&url, 2).await;
    let user_url = test_user(&admin, &url, "wg_read_only", "").await;
    let store = fresh_store(&user_url, 2).await;
    let now = Utc::now();
    let request = move |id| support::fresh_request(id, now);
    assert!(matches!(
        store.claim(&request("evt_before")).await.unwrap(),
        Claim::Acquired(_)
    ));
    admin
        .execute("SET GLOBAL read_only = ON")
        .await
        .expect("read_only on");
    let read_only = ReadOnly(url.clone());
    let err = store
        .claim(&request("evt_during"))
        .await
        .expect_err("a read-only server refuses the claim");
    assert!(err.is_unavailable(), "read-only is Unavailable: {err}");
    drop(read_only);
    assert!(matches!(
        store.claim(&request("evt_after")).await.unwrap(),
        Claim::Acquired(_)
    ));
    drop_table(&store).await;
}

/// A user at its `max_user_connections` (1203) cannot reach the store for now:
/// `Unavailable`, as for a server at its `max_connections` (1040).
#[tokio::test]
async fn a_user_at_its_connection_limit_is_unavailable() {
    let Some(url) = url() else { return };
    let admin = pool(&url, 2).await;
    let user_url = test_user(&admin, &url, "wg_one_conn", "WITH MAX_USER_CONNECTIONS 1").await;
    // The user's one connection is taken elsewhere.
    let held = pool(&user_url, 1).await;
    let store = MySqlStore::new(
        MySqlPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy(&user_url)
            .unwrap(),
    );
    let err = store
        .claim(&support::fresh_request("evt_limited", Utc::now()))
        .await
        .expect_err("no connection to be had");
    assert!(
        err.is_unavailable(),
        "a user at its limit is Unavailable: {err:?}"
    );
    held.close().await;
}

/// Logs each row inserted into the store's table with the connection and the
/// start of the statement that inserted it (the pair is one statement's).
async fn log_insert_statements(store: &MySqlStore) -> String {
    let log = format!("{}_inserts", store.table());
    for sql in [
        format!("CREATE TABLE `{log}` (conn BIGINT NOT NULL, started DATETIME(6) NOT NULL)"),
        format!(
            "CREATE TRIGGER `{log}_t` AFTER INSERT ON `{}` FOR EACH ROW \
             INSERT INTO `{log}` VALUES (CONNECTION_ID(), NOW(6))",
            store.table()
        ),
    ] {
        store
            .pool()
            .execute(sql.as_str())
            .await
            .expect("log inserts");
    }
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_share_commits_and_each_id_is_claimed_once() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 16).await;
    let log = log_insert_statements(&store).await;
    // Half of the ids are known: their claims meet a stored record.
    for i in (0..16).step_by(2) {
        let id = format!("evt_{i}");
        let known = request(Key::new("batch", &id), b"{}", now(), 30);
        let claim = store.claim(&known).await.expect("claim");
        assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
    }
    let ids: Vec<String> = (0..16).map(|i| format!("evt_{i}")).collect();
    let answers = support::claim_at_once(&store, ids, 4).await;
    assert_eq!(answers.len(), 16);
    for (id, claims) in &answers {
        let known = id.trim_start_matches("evt_").parse::<u32>().unwrap() % 2 == 0;
        let acquired: Vec<_> = claims
            .iter()
            .filter_map(|c| match c {
                Ok(Claim::Acquired(r)) => Some(r.token),
                _ => None,
            })
            .collect();
        assert_eq!(acquired.len(), usize::from(!known), "{id}: {claims:?}");
        for claim in claims {
            match claim {
                Ok(Claim::Acquired(_)) => {}
                Ok(Claim::Existing(r)) if known => assert_eq!(r.state, RecordState::InProgress),
                Ok(Claim::Existing(r)) => assert_eq!(r.token, acquired[0], "{id}"),
                Err(e) => panic!("{id}: {e}"),
            }
        }
    }
    // The 8 new ids were inserted by fewer statements than ids.
    let sql = format!("SELECT COUNT(*) FROM (SELECT DISTINCT conn, started FROM `{log}`) AS s");
    let statements: i64 = sqlx::query_scalar(&sql)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(
        statements < 16,
        "{statements} statements for 16 inserted records"
    );
    let inserted: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM `{log}`"))
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(inserted, 16, "8 known, 8 new");
    store
        .pool()
        .execute(format!("DROP TABLE `{log}`").as_str())
        .await
        .unwrap();
    drop_table(&store).await;
}

/// A transaction holding `batch`/`evt_held`: it recorded the id with `record_in`.
async fn hold(store: &MySqlStore) -> sqlx::Transaction<'static, sqlx::MySql> {
    let at = now();
    let mut tx = store.pool().begin().await.unwrap();
    let key = Key::new("batch", "evt_held");
    let recorded = store
        .record_in(
            &mut tx,
            key,
            Fingerprint::of(b"{}"),
            at,
            at + TimeDelta::hours(1),
        )
        .await
        .unwrap();
    assert_eq!(recorded, Recorded::First);
    tx
}

/// Sets, or reads back, the lock wait of every connection of the store's pool.
async fn lock_waits(store: &MySqlStore, set: Option<u64>) -> Vec<u64> {
    let mut connections = Vec::new();
    for _ in 0..16 {
        connections.push(store.pool().acquire().await.unwrap());
    }
    let mut waits = Vec::new();
    for conn in &mut connections {
        if let Some(wait) = set {
            let sql = format!("SET SESSION innodb_lock_wait_timeout = {wait}");
            sqlx::query(&sql).execute(&mut **conn).await.unwrap();
        }
        let wait: u64 = sqlx::query_scalar("SELECT @@SESSION.innodb_lock_wait_timeout")
            .fetch_one(&mut **conn)
            .await
            .unwrap();
        waits.push(wait);
    }
    waits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_locked_by_an_open_transaction_does_not_hold_up_its_batch() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 16).await;
    // Every connection has a lock wait of the host's own (7 s), which a batch's
    // 1 s wait must not outlive.
    lock_waits(&store, Some(7)).await;
    let release =
        |tx: sqlx::Transaction<'static, sqlx::MySql>| async { tx.rollback().await.unwrap() };
    support::a_held_key_holds_up_no_other_claim(&store, false, hold(&store), release).await;
    assert_eq!(lock_waits(&store, None).await, vec![7; 16]);
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_key_in_a_batch_of_its_own_does_not_hold_up_the_queue() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 16).await;
    let release =
        |tx: sqlx::Transaction<'static, sqlx::MySql>| async { tx.rollback().await.unwrap() };
    support::a_held_key_holds_up_no_other_claim(&store, true, hold(&store), release).await;
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_queued_behind_hung_batches_are_withdrawn_never_made() {
    let Some(url) = url() else { return };
    // The store's patience is its pool's acquire timeout: 1 s here.
    let pool = MySqlPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(1))
        .connect(&url)
        .await
        .expect("connect to the test server");
    let store = MySqlStore::new(pool).with_table(&random_table()).unwrap();
    store.migrate().await.expect("migrate");
    let locker = self::pool(&url, 2).await;
    let lock = async {
        let mut conn = locker.acquire().await.unwrap();
        let sql = format!("LOCK TABLES `{}` WRITE", store.table());
        conn.execute(sql.as_str()).await.unwrap();
        conn
    };
    let unlock = |mut conn: sqlx::pool::PoolConnection<sqlx::MySql>| async move {
        conn.execute("UNLOCK TABLES").await.unwrap();
    };
    let blocked = || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.processlist \
             WHERE state LIKE 'Waiting for table%' AND info LIKE CONCAT('%', ?, '%')",
        )
        .bind(store.table())
        .fetch_one(&locker)
        .await
        .unwrap();
        usize::try_from(waiting).unwrap()
    };
    support::claims_queued_behind_hung_batches_are_withdrawn(&store, lock, unlock, blocked).await;
    drop_table(&store).await;
}

/// A duplicate is answered by its batch's insert and one read of the stored record.
/// (On MySQL the batch also sets the lock wait before and after: statements that
/// name no table, not counted here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_claim_is_two_statements() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 4).await;
    let table = store.table().to_owned();
    support::a_duplicate_claim_costs(&store, &table, 2).await;
    drop_table(&store).await;
}

/// A page of the listing walks the `by_listing` index, with no filesort, on
/// 10,000 records of four states (`EXPLAIN`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_walks_its_index() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, 2).await;
    let digits = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let fill = format!(
        "INSERT INTO `{t}` SELECT 'ns', CONCAT('evt_', n), \
         ELT(1 + n % 4, 'completed', 'failed', 'escalated', 'permanent_failure'), \
         UNHEX(REPEAT('00', 32)), 0, 1, 0, n, 9000000000000, n, n, '' \
         FROM (SELECT a.d * 1000 + b.d * 100 + c.d * 10 + e.d AS n \
               FROM {digits} a, {digits} b, {digits} c, {digits} e) AS s",
        t = store.table()
    );
    store.pool().execute(fill.as_str()).await.expect("fill");
    store
        .pool()
        .execute(format!("ANALYZE TABLE `{}`", store.table()).as_str())
        .await
        .expect("analyze");
    let explain = format!("EXPLAIN {}", store.list_sql());
    let rows = sqlx::query(&explain)
        .bind("ns")
        .bind("failed")
        .bind(i64::MIN)
        .bind(i64::MAX)
        .bind(i64::MAX)
        .bind(None::<&str>)
        .bind(None::<&str>)
        .bind(i64::MIN)
        .bind(i64::MAX)
        .bind(100u64)
        .fetch_all(store.pool())
        .await
        .expect("explain");
    let row = &rows[0];
    let key: Option<String> = row.try_get("key").expect("key column");
    let extra: Option<String> = row.try_get("Extra").expect("Extra column");
    assert_eq!(key.as_deref(), Some("by_listing"), "{extra:?}");
    assert!(!extra.unwrap_or_default().contains("filesort"));
    drop_table(&store).await;
}
