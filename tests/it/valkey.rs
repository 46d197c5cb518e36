//! The Redis store on Valkey 9 (`WEBHOOK_GUARD_VALKEY_URL`, started by
//! `scripts/services.sh`), whose `SET … IFEQ` the store uses for fenced finishes:
//! the conformance suites on the native path and on the script path, and the cases
//! where a finish cannot rely on the record its claim stored.

use crate::support;

use chrono::{TimeDelta, Utc};
use webhook_guard::conformance;
use webhook_guard::store::redis::redis;
use webhook_guard::store::{
    Claim, ClaimRequest, Fence, FencingToken, Fingerprint, Finish, Holder, Key, ProcessedStore,
    RecordState, RedisStore, Renew,
};

const URL_VAR: &str = "WEBHOOK_GUARD_VALKEY_URL";

fn url() -> Option<String> {
    support::server_url(URL_VAR)
}

fn random_prefix(test: &str) -> String {
    format!("wg-test-{test}-{:016x}", FencingToken::random().0)
}

async fn store(url: &str, prefix: &str, native: bool) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .native_compare_and_set(native)
        .connect(url)
        .await
        .expect("connect to Valkey")
}

/// Removes every key of `prefix`, answering how many there were.
async fn cleanup(url: &str, prefix: &str) -> usize {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{prefix}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("UNLINK")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    keys.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_path_passes_the_conformance_suites() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("valkey-native");
    let store = store(&url, &prefix, true).await;
    assert!(
        store.uses_native_compare_and_set(),
        "Valkey 9 takes SET IFEQ: the store must use it"
    );
    conformance::run_all(&store).await;
    conformance::inbox::run_all(&store).await;
    conformance::ordering::run_all(&store).await;
    conformance::listing::run_all(&store).await;
    conformance::listing::run_inbox(&store).await;
    assert!(
        cleanup(&url, &prefix).await > 0,
        "the suites wrote under the prefix"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_path_on_valkey_passes_the_conformance_suite() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("valkey-script");
    let store = store(&url, &prefix, false).await;
    assert!(!store.uses_native_compare_and_set());
    conformance::run_all(&store).await;
    assert!(
        cleanup(&url, &prefix).await > 0,
        "the suite wrote under the prefix"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_built_on_a_host_connection_runs_scripts() {
    let Some(url) = url() else { return };
    let client = redis::Client::open(url.as_str()).unwrap();
    let manager = client.get_connection_manager().await.unwrap();
    let store = RedisStore::builder().build(manager).unwrap();
    assert!(
        !store.uses_native_compare_and_set(),
        "build asks the server nothing"
    );
}

fn request(id: &str, now: chrono::DateTime<Utc>) -> ClaimRequest<'_> {
    ClaimRequest {
        key: Key::new("valkey", id),
        fingerprint: Fingerprint::of(b"{}"),
        token: FencingToken::random(),
        now,
        lease_until: now + TimeDelta::seconds(30),
        expires_at: now + TimeDelta::hours(1),
    }
}

fn done(now: chrono::DateTime<Utc>) -> Finish<'static> {
    Finish {
        state: RecordState::Completed,
        failures: 0,
        history: &[],
        now,
        expires_at: now + TimeDelta::hours(2),
    }
}

/// The one record key of `prefix`.
async fn record_key(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> String {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{prefix}:*}}:r:*"))
        .query_async(conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "one record under the prefix");
    keys.into_iter().next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_finish_reads_the_record_when_it_changed_since_the_claim() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("valkey-changed");
    let store = store(&url, &prefix, true).await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let now = Utc::now();

    // The record changes under the holder, fence intact (another process renews
    // it, say): the finish's expected value is stale, it reads the record again
    // and applies, keeping the changed fields.
    let req = request("changed", now);
    let Claim::Acquired(claimed) = store.claim(&req).await.unwrap() else {
        panic!("a new id is acquired")
    };
    let key = record_key(&mut conn, &prefix).await;
    let stored: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut fields: Vec<&str> = stored.split('|').collect();
    let lease = (claimed.lease_until + TimeDelta::seconds(60))
        .timestamp_millis()
        .to_string();
    fields[4] = &lease;
    let changed = fields.join("|");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&changed)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        store.finish(req.holder(), &done(now)).await.unwrap(),
        Fence::Applied
    );
    let rec = store.get(req.key).await.unwrap().expect("the record");
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(
        rec.lease_until.timestamp_millis().to_string(),
        lease,
        "the finish keeps the stored lease_until"
    );
    // Run again (a lost reply's retry): the record is finished, the fence fails.
    assert_eq!(
        store.finish(req.holder(), &done(now)).await.unwrap(),
        Fence::LeaseLost
    );

    // The record now carries another token: the holder's finish is refused, and
    // the record is left as it is.
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let req = request("changed", now);
    let Claim::Acquired(_) = store.claim(&req).await.unwrap() else {
        panic!("a new id is acquired")
    };
    let stored: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let other = stored.replacen(&format!("|{}|", req.token.0), "|7|", 1);
    assert_ne!(other, stored);
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&other)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        store.finish(req.holder(), &done(now)).await.unwrap(),
        Fence::LeaseLost
    );
    let after: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(after, other, "a refused finish changes nothing");

    // A record whose fields after the fence do not read is corrupt, not overwritten.
    let req = request("corrupt", now);
    let Claim::Acquired(_) = store.claim(&req).await.unwrap() else {
        panic!("a new id is acquired")
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{prefix}:*}}:r:*corrupt"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let bad = format!("in_progress|{}|ff|1|soon|", req.token.0);
    let _: () = redis::cmd("SET")
        .arg(&keys[0])
        .arg(&bad)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(store.finish(req.holder(), &done(now)).await.is_err());
    cleanup(&url, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_finish_by_another_process_reads_the_record() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("valkey-other");
    let claimer = store(&url, &prefix, true).await;
    let finisher = store(&url, &prefix, true).await;
    let now = Utc::now();
    let req = request("other", now);
    let Claim::Acquired(_) = claimer.claim(&req).await.unwrap() else {
        panic!("a new id is acquired")
    };
    let stale = FencingToken(req.token.0.wrapping_add(1));
    assert_eq!(
        finisher
            .finish(Holder::new(req.key, stale), &done(now))
            .await
            .unwrap(),
        Fence::LeaseLost,
        "a token that is not the record's is refused"
    );
    assert_eq!(
        finisher.finish(req.holder(), &done(now)).await.unwrap(),
        Fence::Applied
    );
    // The claimer still remembers the claimed record: its expected value is stale
    // now, and its finish reads the record and finds it finished.
    assert_eq!(
        claimer.finish(req.holder(), &done(now)).await.unwrap(),
        Fence::LeaseLost
    );
    assert_eq!(
        claimer.get(req.key).await.unwrap().map(|r| r.state),
        Some(RecordState::Completed)
    );
    cleanup(&url, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_lease_is_finished_natively() {
    let Some(url) = url() else { return };
    let prefix = random_prefix("valkey-renew");
    let store = store(&url, &prefix, true).await;
    let now = Utc::now();
    let req = request("renewed", now);
    let Claim::Acquired(_) = store.claim(&req).await.unwrap() else {
        panic!("a new id is acquired")
    };
    let lease = now + TimeDelta::seconds(90);
    assert_eq!(
        store
            .renew(
                req.holder(),
                &Renew {
                    lease_until: lease,
                    expires_at: now + TimeDelta::hours(1)
                }
            )
            .await
            .unwrap(),
        Fence::Applied
    );
    assert_eq!(
        store.finish(req.holder(), &done(now)).await.unwrap(),
        Fence::Applied
    );
    let rec = store.get(req.key).await.unwrap().expect("the record");
    assert_eq!(rec.state, RecordState::Completed);
    let moved = (rec.lease_until - lease).num_microseconds().unwrap();
    assert!(
        (0..1000).contains(&moved),
        "the finish keeps the renewed lease_until (rounded up to the ms): {moved} µs"
    );
    cleanup(&url, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_before_8_4_keeps_the_script_path() {
    let Some(url) = support::server_url("WEBHOOK_GUARD_REDIS_URL") else {
        return;
    };
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    };
    let store = store(&url, &random_prefix("redis-script"), true).await;
    match (field("valkey_version"), field("redis_version")) {
        (None, Some(v)) if v.starts_with("7.") || v.starts_with("6.") => assert!(
            !store.uses_native_compare_and_set(),
            "Redis {v} has no SET IFEQ"
        ),
        (valkey, redis) => eprintln!(
            "SKIPPED: WEBHOOK_GUARD_REDIS_URL is not a Redis before 8.4 (valkey {valkey:?}, redis {redis:?})"
        ),
    }
}
