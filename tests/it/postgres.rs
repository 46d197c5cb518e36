//! `PostgresStore` on a live server: `WEBHOOK_GUARD_POSTGRES_URL`, for example
//! `postgres://postgres@127.0.0.1:5432/test`.
//!
//! Every test works in a fresh table with a random name and drops it at the end. No
//! test stops the server: recovery is shown by terminating the store's own
//! connections and by closing a local TCP proxy.

use crate::support;
use crate::support::inbox as inbox_support;
use support::backends::unique;
use support::ms;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use webhook_guard::inbox::InboxEvent;
use webhook_guard::store::postgres::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use webhook_guard::store::postgres::sqlx::{self, Row};
use webhook_guard::store::{
    Claim, ClaimRequest, FencingToken, Fingerprint, Key, PostgresStore, ProcessedStore, Recorded,
};
use webhook_guard::{conformance, HandlerError, StoreError};

const URL_VAR: &str = "WEBHOOK_GUARD_POSTGRES_URL";

/// A fresh table on the test server, dropped by [`Db::drop_table`].
struct Db {
    options: PgConnectOptions,
    admin: PgPool,
    table: String,
}

async fn db() -> Option<Db> {
    let url = support::server_url(URL_VAR)?;
    let options = PgConnectOptions::from_str(&url).expect("a valid PostgreSQL URL");
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.clone())
        .await
        .expect("connect to the test server");
    Some(Db {
        options,
        admin,
        table: unique("wg_test"),
    })
}

impl Db {
    /// A separate pool (one "replica"), its connections tagged `application_name`.
    async fn pool(&self, application_name: &str, max: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(self.options.clone().application_name(application_name))
            .await
            .expect("connect to the test server")
    }

    async fn store(&self, max: u32) -> PostgresStore {
        let pool = self.pool(&unique("wg"), max).await;
        PostgresStore::with_table(pool, &self.table).expect("valid table name")
    }

    async fn count(&self, filter: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM \"{}\" WHERE {filter}", self.table);
        sqlx::query(&sql)
            .fetch_one(&self.admin)
            .await
            .expect("count")
            .get(0)
    }

    async fn drop_table(self) {
        for suffix in ["", "_inbox", "_objects", "_effects"] {
            let sql = format!("DROP TABLE IF EXISTS \"{}{suffix}\"", self.table);
            sqlx::query(&sql)
                .execute(&self.admin)
                .await
                .expect("drop table");
        }
    }

    /// A table of effects, `<table>_effects (namespace, id)`, with no unique key: an
    /// effect applied twice shows as two rows.
    async fn effects_table(&self) -> String {
        let name = format!("{}_effects", self.table);
        let sql = format!("CREATE TABLE \"{name}\" (namespace TEXT NOT NULL, id TEXT NOT NULL)");
        sqlx::query(&sql).execute(&self.admin).await.unwrap();
        name
    }

    /// Effect rows per id in `namespace`.
    async fn effects(&self, namespace: &str) -> BTreeMap<String, i64> {
        let sql = format!(
            "SELECT id, count(*) FROM \"{}_effects\" WHERE namespace = $1 GROUP BY id",
            self.table
        );
        sqlx::query(&sql)
            .bind(namespace)
            .fetch_all(&self.admin)
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite() {
    let Some(db) = db().await else { return };
    let store = db.store(8).await;
    store.migrate().await.expect("migrate");
    store.migrate().await.expect("migrate is idempotent");
    let started = Instant::now();
    conformance::run_all(&store).await;
    conformance::listing::run_all(&store).await;
    eprintln!("conformance suite: {:?}", started.elapsed());
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_and_the_schema() {
    let Some(db) = db().await else { return };
    let (a, b) = (db.store(2).await, db.store(2).await);
    let (ra, rb) = tokio::join!(a.migrate(), b.migrate());
    ra.expect("migrate a");
    rb.expect("migrate b");
    let schema = a.schema_sql();
    assert!(schema.contains(&format!("CREATE TABLE IF NOT EXISTS \"{}\"", db.table)));
    assert!(schema.contains("PRIMARY KEY (namespace, id)"));
    assert!(schema.contains("WHERE state = 'in_progress'"));
    assert_eq!(a.table(), db.table);
    for bad in ["", "1abc", "a-b", "x\"; DROP TABLE y; --", &"a".repeat(64)] {
        let err = PostgresStore::with_table(a.pool().clone(), bad).unwrap_err();
        assert_eq!(err.name(), bad);
    }
    let indexes: Vec<String> =
        sqlx::query("SELECT indexdef FROM pg_indexes WHERE tablename = $1 ORDER BY indexname")
            .bind(&db.table)
            .fetch_all(&db.admin)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
    assert_eq!(
        indexes.len(),
        4,
        "primary key, expires_at, stuck, listing: {indexes:?}"
    );
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_a_backend_error_not_unavailable() {
    let Some(db) = db().await else { return };
    let store = db.store(2).await; // never migrated
    let err = store
        .get(Key::new("ns", "id"))
        .await
        .expect_err("no such table");
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "keeps the source"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_run_each_handler_exactly_once() {
    let Some(db) = db().await else { return };
    let (a, b) = (db.store(16).await, db.store(16).await);
    a.migrate().await.expect("migrate");
    support::two_replicas_run_each_handler_exactly_once(a, b).await;
    assert_eq!(db.count("state = 'completed'").await, 10);
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_taken_over_and_the_stale_token_refused() {
    let Some(db) = db().await else { return };
    let store = db.store(4).await;
    store.migrate().await.expect("migrate");
    support::an_expired_lease_is_taken_over_and_the_stale_token_refused(&store).await;
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purges_100k_expired_records_while_claims_continue() {
    let Some(db) = db().await else { return };
    let store = db.store(8).await;
    store.migrate().await.expect("migrate");
    let now = ms(Utc::now());
    let past = (now - TimeDelta::days(1)).timestamp_millis();
    let future = (now + TimeDelta::days(1)).timestamp_millis();
    let insert = |prefix: &str, n: i64, state: &str, lease: i64, expires: i64| {
        format!(
            "INSERT INTO \"{t}\" (namespace, id, state, fingerprint, token, attempts, failures, \
                 lease_until, expires_at, created_at, updated_at, history) \
             SELECT 'purge', '{prefix}' || g, '{state}', decode(repeat('00', 32), 'hex'), g, 1, 0, \
                 {lease}, {expires}, {past}, {past}, '' FROM generate_series(1, {n}) g",
            t = db.table
        )
    };
    let started = Instant::now();
    for sql in [
        insert("old-", 100_000, "completed", past, past),
        insert("keep-", 1_000, "completed", past, future),
        // Expired, but a handler still holds a live lease: never purged.
        insert("leased-", 100, "in_progress", future, past),
    ] {
        sqlx::query(&sql)
            .execute(&db.admin)
            .await
            .expect("bulk insert");
    }
    sqlx::query(&format!("ANALYZE \"{}\"", db.table))
        .execute(&db.admin)
        .await
        .unwrap();
    eprintln!("bulk insert of 101,100 rows: {:?}", started.elapsed());

    let (purged, _) = support::purge_beside_claims(store.clone(), now, 8).await;
    assert_eq!(purged, 100_000);
    assert_eq!(db.count("id LIKE 'old-%'").await, 0, "all expired gone");
    assert_eq!(db.count("id LIKE 'keep-%'").await, 1_000, "unexpired kept");
    assert_eq!(
        db.count("id LIKE 'leased-%'").await,
        100,
        "live leases kept"
    );
    assert_eq!(db.count("id LIKE 'live-%'").await, 2_000, "claims kept");
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovers_after_the_server_terminates_its_connections() {
    let Some(db) = db().await else { return };
    let name = unique("wg_kill");
    let store = PostgresStore::with_table(db.pool(&name, 4).await, &db.table).unwrap();
    store.migrate().await.expect("migrate");
    let key = Key::new("recover", "evt");
    assert!(store.get(key).await.unwrap().is_none());
    let killed: Vec<bool> = sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&name)
    .fetch_all(&db.admin)
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert!(
        !killed.is_empty() && killed.iter().all(|k| *k),
        "terminated {killed:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The pool notices the dead connections and opens new ones.
    assert!(store.get(key).await.expect("recovered").is_none());
    let now = ms(Utc::now());
    let request = ClaimRequest {
        key,
        fingerprint: Fingerprint::of(b"x"),
        token: FencingToken::random(),
        now,
        lease_until: now + TimeDelta::minutes(1),
        expires_at: now + TimeDelta::hours(1),
    };
    assert!(matches!(
        store.claim(&request).await.unwrap(),
        Claim::Acquired(_)
    ));
    db.drop_table().await;
}

/// A TCP proxy on `listener` to `upstream`; aborting the task drops every connection.
fn proxy(listener: TcpListener, upstream: SocketAddr) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        while let Ok((mut inbound, _)) = listener.accept().await {
            connections.spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_is_unavailable_and_recovers_when_the_server_returns() {
    let Some(db) = db().await else { return };
    let host = db.options.get_host().to_owned();
    let upstream = tokio::net::lookup_host((host.as_str(), db.options.get_port()))
        .await
        .expect("resolve the server")
        .next()
        .expect("an address");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut running = proxy(listener, upstream);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(db.options.clone().host("127.0.0.1").port(port))
        .await
        .expect("connect through the proxy");
    let store = PostgresStore::with_table(pool, &db.table).unwrap();
    store.migrate().await.expect("migrate");
    let key = Key::new("proxy", "evt");
    assert!(store.get(key).await.unwrap().is_none());

    // The "server" goes away: connections drop, new ones are refused.
    running.abort();
    let _ = running.await;
    let started = Instant::now();
    let err = store.get(key).await.expect_err("the server is gone");
    assert!(err.is_unavailable(), "{err:?}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "keeps the source"
    );
    eprintln!("unreachable answered {err} in {:?}", started.elapsed());
    let now = ms(Utc::now());
    let request = ClaimRequest {
        key,
        fingerprint: Fingerprint::of(b"x"),
        token: FencingToken::random(),
        now,
        lease_until: now + TimeDelta::minutes(1),
        expires_at: now + TimeDelta::hours(1),
    };
    let err = store.claim(&request).await.expect_err("still gone");
    assert!(err.is_unavailable(), "{err:?}");

    // It comes back on the same address: the next call succeeds.
    running = proxy(
        TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("rebind"),
        upstream,
    );
    assert!(matches!(
        store.claim(&request).await.expect("recovered"),
        Claim::Acquired(_)
    ));
    running.abort();
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_inbox_and_ordering_conformance_suites() {
    let Some(db) = db().await else { return };
    let store = db.store(8).await;
    store.migrate().await.expect("migrate");
    let started = Instant::now();
    conformance::inbox::run_all(&store).await;
    conformance::ordering::run_all(&store).await;
    conformance::listing::run_inbox(&store).await;
    eprintln!("inbox and ordering suites: {:?}", started.elapsed());
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_and_its_worker_process_events_end_to_end() {
    let Some(db) = db().await else { return };
    let store = db.store(8).await;
    store.migrate().await.expect("migrate");
    let started = Instant::now();
    inbox_support::guard_and_worker_end_to_end(store).await;
    eprintln!("end to end: {:?}", started.elapsed());
    db.drop_table().await;
}

/// Applies `<table>_effects` for `key` in one transaction with its dedup record.
async fn apply_once(
    store: &PostgresStore,
    effects: &str,
    key: Key<'_>,
    fingerprint: Fingerprint,
) -> Result<Recorded, HandlerError> {
    let now = inbox_support::now_ms();
    let mut tx = store
        .pool()
        .begin()
        .await
        .map_err(HandlerError::retryable)?;
    let recorded = store
        .record_in(&mut tx, key, fingerprint, now, now + TimeDelta::hours(72))
        .await
        .map_err(HandlerError::retryable)?;
    if recorded == Recorded::First {
        sqlx::query(&format!(
            "INSERT INTO \"{effects}\" (namespace, id) VALUES ($1, $2)"
        ))
        .bind(key.namespace)
        .bind(key.id)
        .execute(&mut *tx)
        .await
        .map_err(HandlerError::retryable)?;
    }
    tx.commit().await.map_err(HandlerError::retryable)?;
    Ok(recorded)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_transactional_mode_applies_a_database_effect_exactly_once_under_1000_concurrent_duplicates(
) {
    let Some(db) = db().await else { return };
    let store = db.store(20).await;
    store.migrate().await.expect("migrate");
    let effects = db.effects_table().await;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for i in 0..1000usize {
        let (store, effects) = (store.clone(), effects.clone());
        tasks.spawn(async move {
            let id = format!("tx_{}", i % 10);
            let key = Key::new("txn", &id);
            apply_once(&store, &effects, key, Fingerprint::of(id.as_bytes()))
                .await
                .expect("transaction")
        });
    }
    let mut first = 0;
    while let Some(r) = tasks.join_next().await {
        match r.expect("task") {
            Recorded::First => first += 1,
            Recorded::Duplicate => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    eprintln!(
        "1,000 concurrent transactions over 10 ids: {:?}",
        started.elapsed()
    );
    assert_eq!(first, 10);
    let applied = db.effects("txn").await;
    assert_eq!(applied.len(), 10);
    assert!(applied.values().all(|n| *n == 1), "{applied:?}");
    assert_eq!(db.count("state = 'completed'").await, 10);

    // A rolled-back recording leaves nothing: the next one is first. A different body
    // under a recorded id is a conflict.
    let key = Key::new("txn", "rolled_back");
    let fp = Fingerprint::of(b"a");
    let now = inbox_support::now_ms();
    let later = now + TimeDelta::hours(1);
    let mut tx = store.pool().begin().await.unwrap();
    assert_eq!(
        store.record_in(&mut tx, key, fp, now, later).await.unwrap(),
        Recorded::First
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        apply_once(&store, &effects, key, fp).await.unwrap(),
        Recorded::First
    );
    assert_eq!(
        apply_once(&store, &effects, key, fp).await.unwrap(),
        Recorded::Duplicate
    );
    assert_eq!(
        apply_once(&store, &effects, key, Fingerprint::of(b"b"))
            .await
            .unwrap(),
        Recorded::Conflict
    );
    // An expired record is replaced.
    let mut tx = store.pool().begin().await.unwrap();
    let much_later = later + TimeDelta::hours(100);
    assert_eq!(
        store
            .record_in(
                &mut tx,
                key,
                fp,
                much_later,
                much_later + TimeDelta::hours(1)
            )
            .await
            .unwrap(),
        Recorded::First
    );
    tx.commit().await.unwrap();
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_worker_at_every_step_never_loses_or_double_applies_an_event() {
    let Some(db) = db().await else { return };
    let store = db.store(16).await;
    store.migrate().await.expect("migrate");
    let effects = db.effects_table().await;
    let handler = {
        let store = store.clone();
        move |e: InboxEvent| {
            let (store, effects) = (store.clone(), effects.clone());
            // The transaction runs in its own task so that killing the worker
            // (dropping its futures) never cancels a `BEGIN` in flight: sqlx 0.8 would
            // return that connection to the pool inside an open transaction
            // (launchbadge/sqlx#2054). A real crash closes the connection instead.
            let key = (e.namespace.clone(), e.id.clone());
            let applied = tokio::spawn(async move {
                let key = Key::new(&key.0, &key.1);
                apply_once(&store, &effects, key, e.fingerprint).await
            });
            async move {
                applied.await.map_err(HandlerError::retryable)??;
                Ok(())
            }
        }
    };
    let started = Instant::now();
    let points =
        inbox_support::kill_at_every_step(store, handler, async |ns: &str| db.effects(ns).await)
            .await;
    eprintln!(
        "killed at each of {points} store calls, then recovered: {:?}",
        started.elapsed()
    );
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_in_leaves_a_live_claim_alone_and_takes_over_an_abandoned_one() {
    let Some(db) = db().await else { return };
    let store = db.store(4).await;
    store.migrate().await.expect("migrate");
    support::record_in_leaves_a_live_claim_alone_and_takes_over_an_abandoned_one(
        &store,
        support::record_in_committed!(store),
    )
    .await;
    store.pool().close().await;
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_share_commits_and_each_id_is_claimed_once() {
    let Some(db) = db().await else { return };
    let store = db.store(16).await;
    store.migrate().await.expect("migrate");
    let ids: Vec<String> = (0..16).map(|i| format!("evt_{i}")).collect();
    let answers = support::claim_at_once(&store, ids, 4).await;
    assert_eq!(answers.len(), 16);
    support::each_id_claimed_once(&answers);
    // Rows inserted by one statement share its transaction id: the 16 claims that
    // won were made by fewer statements than claims.
    let statements: i64 = sqlx::query(&format!(
        "SELECT count(DISTINCT xmin::text) FROM \"{}\"",
        db.table
    ))
    .fetch_one(&db.admin)
    .await
    .unwrap()
    .get(0);
    assert!(statements < 16, "{statements} transactions for 16 claims");
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_server_refuses_fails_alone_in_its_batch() {
    let Some(db) = db().await else { return };
    let store = db.store(16).await;
    store.migrate().await.expect("migrate");
    // PostgreSQL's text cannot hold a NUL (the guard refuses such an id before it
    // reaches a store; a host calling the store itself may not).
    let mut ids: Vec<String> = (0..31).map(|i| format!("evt_{i}")).collect();
    ids.insert(15, "evt_\0".into());
    let answers = support::claim_at_once(&store, ids, 1).await;
    for (id, claims) in &answers {
        match (&claims[..], id.contains('\0')) {
            ([Err(StoreError::Backend { .. })], true) => {}
            ([Ok(Claim::Acquired(r))], false) => assert_eq!(r.key().id, *id),
            _ => panic!("{id:?}: {claims:?}"),
        }
    }
    assert_eq!(db.count("state = 'in_progress'").await, 31);
    db.drop_table().await;
}

/// A transaction holding `batch`/`evt_held`: it recorded the id with `record_in`.
async fn hold(store: &PostgresStore) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let now = Utc::now();
    let mut tx = store.pool().begin().await.unwrap();
    let key = Key::new("batch", "evt_held");
    let recorded = store
        .record_in(
            &mut tx,
            key,
            Fingerprint::of(b"{}"),
            now,
            now + TimeDelta::hours(1),
        )
        .await
        .unwrap();
    assert_eq!(recorded, Recorded::First);
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_locked_by_an_open_transaction_does_not_hold_up_its_batch() {
    let Some(db) = db().await else { return };
    let store = db.store(16).await;
    store.migrate().await.expect("migrate");
    let release =
        |tx: sqlx::Transaction<'static, sqlx::Postgres>| async { tx.rollback().await.unwrap() };
    support::a_held_key_holds_up_no_other_claim(&store, false, hold(&store), release).await;
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_key_in_a_batch_of_its_own_does_not_hold_up_the_queue() {
    let Some(db) = db().await else { return };
    let store = db.store(16).await;
    store.migrate().await.expect("migrate");
    let release =
        |tx: sqlx::Transaction<'static, sqlx::Postgres>| async { tx.rollback().await.unwrap() };
    support::a_held_key_holds_up_no_other_claim(&store, true, hold(&store), release).await;
    db.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_queued_behind_hung_batches_are_withdrawn_never_made() {
    let Some(db) = db().await else { return };
    // The store's patience is its pool's acquire timeout: 1 s here.
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(db.options.clone())
        .await
        .expect("connect to the test server");
    let store = PostgresStore::with_table(pool, &db.table).unwrap();
    store.migrate().await.expect("migrate");
    let lock = async {
        let mut tx = db.admin.begin().await.unwrap();
        let sql = format!("LOCK TABLE \"{}\" IN ACCESS EXCLUSIVE MODE", db.table);
        sqlx::query(&sql).execute(&mut *tx).await.unwrap();
        tx
    };
    let unlock =
        |tx: sqlx::Transaction<'static, sqlx::Postgres>| async { tx.rollback().await.unwrap() };
    let blocked = || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::text::regclass",
        )
        .bind(format!("\"{}\"", db.table))
        .fetch_one(&db.admin)
        .await
        .unwrap();
        usize::try_from(waiting).unwrap()
    };
    support::claims_queued_behind_hung_batches_are_withdrawn(&store, lock, unlock, blocked).await;
    db.drop_table().await;
}

/// A duplicate is answered by the batch's one statement, which reads the stored
/// record of a key it did not claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_claim_is_one_statement() {
    let Some(db) = db().await else { return };
    let store = db.store(4).await;
    store.migrate().await.expect("migrate");
    support::a_duplicate_claim_costs(&store, &db.table, 1).await;
    db.drop_table().await;
}

/// A page of the listing is a backward walk of the `…_listing` index, with no
/// sort and no scan of the table, on 20,000 records of four states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_walks_its_index() {
    let Some(db) = db().await else { return };
    let store = db.store(2).await;
    store.migrate().await.expect("migrate");
    let fill = format!(
        "INSERT INTO \"{}\" SELECT 'ns', 'evt_' || n, \
         (ARRAY['completed','failed','escalated','permanent_failure'])[1 + n % 4], \
         '\\x00'::bytea, 0, 1, 0, n, 9000000000000, n, n, '' \
         FROM generate_series(1, 20000) AS n",
        db.table
    );
    sqlx::query(&fill).execute(&db.admin).await.expect("fill");
    sqlx::query(&format!("ANALYZE \"{}\"", db.table))
        .execute(&db.admin)
        .await
        .expect("analyze");
    let explain = format!("EXPLAIN {}", store.list_sql());
    let plan: Vec<String> = sqlx::query_scalar(&explain)
        .bind("ns")
        .bind("failed")
        .bind(i64::MIN)
        .bind(i64::MAX)
        .bind(None::<&str>)
        .bind(i64::MIN)
        .bind(i64::MAX)
        .bind(100i64)
        .fetch_all(&db.admin)
        .await
        .expect("explain");
    let plan = plan.join("\n");
    eprintln!("{plan}");
    let index = format!("{}_listing", db.table);
    assert!(
        plan.contains("Index Scan Backward") && plan.contains(&index),
        "{plan}"
    );
    assert!(
        !plan.contains("Seq Scan") && !plan.contains("Sort"),
        "{plan}"
    );
    db.drop_table().await;
}
