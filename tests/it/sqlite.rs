//! `SqliteStore` on temporary database files (no server, no environment variable).
//!
//! Every test uses a fresh file under the system's temporary directory with a random
//! name and a random table name, and removes the file (and its WAL) at the end.

use crate::support;
use crate::support::inbox as inbox_support;
use support::backends::unique;
use support::ms;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use tokio::task::JoinSet;
use webhook_guard::inbox::InboxEvent;
use webhook_guard::store::sqlite::sqlx::sqlite::{
    SqliteConnectOptions, SqlitePool, SqlitePoolOptions,
};
use webhook_guard::store::sqlite::sqlx::{self, Connection, Row};
use webhook_guard::store::{
    Claim, ClaimRequest, FencingToken, Fingerprint, Key, ProcessedStore, Recorded, SqliteStore,
};
use webhook_guard::{conformance, HandlerError, StoreError};

/// A temporary database file and a table name; the files go when this is dropped.
struct Db {
    path: PathBuf,
    table: String,
}

impl Db {
    fn new() -> Self {
        Self {
            path: std::env::temp_dir().join(format!("{}.db", unique("webhook-guard-test"))),
            table: unique("wg_test"),
        }
    }

    /// A separate pool on the file (one "replica").
    async fn pool(&self, max: u32) -> SqlitePool {
        self.pool_with(max, SqliteStore::connect_options(&self.path))
            .await
    }

    async fn pool_with(&self, max: u32, options: SqliteConnectOptions) -> SqlitePool {
        SqlitePoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .expect("open the database file")
    }

    async fn store(&self, max: u32) -> SqliteStore {
        SqliteStore::with_table(self.pool(max).await, &self.table).expect("valid table name")
    }

    /// A connection of "another process" holding the file's write lock (an open
    /// `BEGIN IMMEDIATE`), until it commits.
    async fn hold_write_lock(&self) -> sqlx::sqlite::SqliteConnection {
        let mut other =
            sqlx::sqlite::SqliteConnection::connect_with(&SqliteStore::connect_options(&self.path))
                .await
                .unwrap();
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut other)
            .await
            .unwrap();
        other
    }

    /// A store on a pool of its own, with `options` changed from the store's own.
    async fn store_with(
        &self,
        max: u32,
        options: impl FnOnce(SqliteConnectOptions) -> SqliteConnectOptions,
    ) -> SqliteStore {
        let pool = self
            .pool_with(max, options(SqliteStore::connect_options(&self.path)))
            .await;
        SqliteStore::with_table(pool, &self.table).expect("valid table name")
    }

    async fn count(&self, pool: &SqlitePool, filter: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM \"{}\" WHERE {filter}", self.table);
        sqlx::query(&sql)
            .fetch_one(pool)
            .await
            .expect("count")
            .get(0)
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

fn request(key: Key<'_>, now: DateTime<Utc>) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        fingerprint: Fingerprint::of(key.id.as_bytes()),
        token: FencingToken::random(),
        now,
        lease_until: now + TimeDelta::minutes(5),
        expires_at: now + TimeDelta::hours(72),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite() {
    let db = Db::new();
    let store = SqliteStore::open(&db.path).await.expect("open");
    assert_eq!(store.table(), "webhook_guard_records");
    store.migrate().await.expect("migrate is idempotent");
    let started = Instant::now();
    conformance::run_all(&store).await;
    conformance::listing::run_all(&store).await;
    eprintln!("conformance suite: {:?}", started.elapsed());
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_creates_the_file_and_the_schema_is_shown() {
    let db = Db::new();
    assert!(!db.path.exists());
    let store = SqliteStore::open(&db.path).await.expect("open");
    assert!(db.path.exists(), "open creates the file");
    let mode: String = sqlx::query("PRAGMA journal_mode")
        .fetch_one(store.pool())
        .await
        .unwrap()
        .get(0);
    assert_eq!(mode, "wal");
    let schema = store.schema_sql();
    assert!(schema.contains("PRIMARY KEY (namespace, id)"));
    assert!(schema.contains("WHERE state = 'in_progress'"));
    let indexes: i64 = sqlx::query(
        "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'webhook_guard_records'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap()
    .get(0);
    assert_eq!(indexes, 4, "primary key, expires_at, stuck, listing");
    for bad in ["", "1abc", "a-b", "x\"; DROP TABLE y; --", &"a".repeat(64)] {
        let err = SqliteStore::with_table(store.pool().clone(), bad).unwrap_err();
        assert_eq!(err.name(), bad);
    }
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_told_apart() {
    // A file that cannot be created: unavailable.
    let missing_dir = std::env::temp_dir()
        .join(unique("no-such-dir"))
        .join("x.db");
    let err = SqliteStore::open(&missing_dir)
        .await
        .expect_err("no such directory");
    assert!(err.is_unavailable(), "{err:?}");
    // A table that does not exist: the database answered, so a backend error.
    let db = Db::new();
    let store = db.store(1).await;
    let err = store.get(Key::new("ns", "id")).await.expect_err("no table");
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "keeps the source"
    );
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_database_is_unavailable_until_the_lock_goes() {
    let db = Db::new();
    let store = db.store(2).await;
    store.migrate().await.unwrap();
    let impatient = db
        .store_with(1, |o| o.busy_timeout(Duration::from_millis(200)))
        .await;
    // Another process holds the write lock.
    let mut other = db.hold_write_lock().await;
    let now = ms(Utc::now());
    let key = Key::new("locked", "evt");
    let err = impatient
        .claim(&request(key, now))
        .await
        .expect_err("locked");
    assert!(err.is_unavailable(), "{err:?}");
    sqlx::raw_sql("COMMIT").execute(&mut other).await.unwrap();
    assert!(matches!(
        impatient
            .claim(&request(key, now))
            .await
            .expect("recovered"),
        Claim::Acquired(_)
    ));
    other.close().await.unwrap();
    impatient.pool().close().await;
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_run_each_handler_exactly_once() {
    let db = Db::new();
    let (a, b) = (db.store(4).await, db.store(4).await);
    a.migrate().await.expect("migrate");
    support::two_replicas_run_each_handler_exactly_once(a.clone(), b).await;
    assert_eq!(db.count(a.pool(), "state = 'completed'").await, 10);
    a.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_taken_over_and_the_stale_token_refused() {
    let db = Db::new();
    let store = db.store(2).await;
    store.migrate().await.expect("migrate");
    support::an_expired_lease_is_taken_over_and_the_stale_token_refused(&store).await;
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purges_100k_expired_records_while_claims_continue() {
    let db = Db::new();
    let store = db.store(4).await;
    store.migrate().await.expect("migrate");
    let now = ms(Utc::now());
    let past = (now - TimeDelta::days(1)).timestamp_millis();
    let future = (now + TimeDelta::days(1)).timestamp_millis();
    let insert = |prefix: &str, n: i64, state: &str, lease: i64, expires: i64| {
        format!(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {n}) \
             INSERT INTO \"{t}\" (namespace, id, state, fingerprint, token, attempts, failures, \
                 lease_until, expires_at, created_at, updated_at, history) \
             SELECT 'purge', '{prefix}' || n, '{state}', zeroblob(32), n, 1, 0, \
                 {lease}, {expires}, {past}, {past}, '' FROM g",
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
            .execute(store.pool())
            .await
            .expect("bulk insert");
    }
    eprintln!("bulk insert of 101,100 rows: {:?}", started.elapsed());

    let (purged, _) = support::purge_beside_claims(store.clone(), now, 4).await;
    assert_eq!(purged, 100_000);
    let pool = store.pool();
    assert_eq!(
        db.count(pool, "id LIKE 'old-%'").await,
        0,
        "all expired gone"
    );
    assert_eq!(
        db.count(pool, "id LIKE 'keep-%'").await,
        1_000,
        "unexpired kept"
    );
    assert_eq!(
        db.count(pool, "id LIKE 'leased-%'").await,
        100,
        "live leases kept"
    );
    assert_eq!(
        db.count(pool, "id LIKE 'live-%'").await,
        1_000,
        "claims kept"
    );
    pool.close().await;
}

/// Creates `effects (namespace, id)` with no unique key: an effect applied twice
/// shows as two rows.
async fn effects_table(pool: &SqlitePool) {
    sqlx::query("CREATE TABLE effects (namespace TEXT NOT NULL, id TEXT NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

/// Effect rows per id in `namespace`.
async fn effects(pool: &SqlitePool, namespace: &str) -> BTreeMap<String, i64> {
    sqlx::query("SELECT id, count(*) FROM effects WHERE namespace = ?1 GROUP BY id")
        .bind(namespace)
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Applies an effect row for `key` in one transaction with its dedup record.
async fn apply_once(
    store: &SqliteStore,
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
        sqlx::query("INSERT INTO effects (namespace, id) VALUES (?1, ?2)")
            .bind(key.namespace)
            .bind(key.id)
            .execute(&mut *tx)
            .await
            .map_err(HandlerError::retryable)?;
    }
    tx.commit().await.map_err(HandlerError::retryable)?;
    Ok(recorded)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_inbox_and_ordering_conformance_suites() {
    let db = Db::new();
    let store = db.store(4).await;
    store.migrate().await.expect("migrate");
    let started = Instant::now();
    conformance::inbox::run_all(&store).await;
    conformance::ordering::run_all(&store).await;
    conformance::listing::run_inbox(&store).await;
    eprintln!("inbox and ordering suites: {:?}", started.elapsed());
    let tables: i64 =
        sqlx::query("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN (?1, ?2)")
            .bind(format!("{}_inbox", db.table))
            .bind(format!("{}_objects", db.table))
            .fetch_one(store.pool())
            .await
            .unwrap()
            .get(0);
    assert_eq!(tables, 2, "the inbox and the ordering ledger");
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_and_its_worker_process_events_end_to_end() {
    let db = Db::new();
    let store = db.store(4).await;
    store.migrate().await.expect("migrate");
    let started = Instant::now();
    inbox_support::guard_and_worker_end_to_end(store.clone()).await;
    eprintln!("end to end: {:?}", started.elapsed());
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_transactional_mode_applies_a_database_effect_exactly_once_under_1000_concurrent_duplicates(
) {
    let db = Db::new();
    let store = db.store(4).await;
    store.migrate().await.expect("migrate");
    effects_table(store.pool()).await;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for i in 0..1000usize {
        let store = store.clone();
        tasks.spawn(async move {
            let id = format!("tx_{}", i % 10);
            let key = Key::new("txn", &id);
            apply_once(&store, key, Fingerprint::of(id.as_bytes()))
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
    let applied = effects(store.pool(), "txn").await;
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
    assert_eq!(apply_once(&store, key, fp).await.unwrap(), Recorded::First);
    assert_eq!(
        apply_once(&store, key, fp).await.unwrap(),
        Recorded::Duplicate
    );
    assert_eq!(
        apply_once(&store, key, Fingerprint::of(b"b"))
            .await
            .unwrap(),
        Recorded::Conflict
    );
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_worker_at_every_step_never_loses_or_double_applies_an_event() {
    let db = Db::new();
    let store = db.store(4).await;
    store.migrate().await.expect("migrate");
    effects_table(store.pool()).await;
    let handler = {
        let store = store.clone();
        move |e: InboxEvent| {
            let store = store.clone();
            async move {
                apply_once(&store, e.key(), e.fingerprint).await?;
                Ok(())
            }
        }
    };
    let started = Instant::now();
    let pool = store.pool().clone();
    let points = inbox_support::kill_at_every_step(store.clone(), handler, async |ns: &str| {
        effects(&pool, ns).await
    })
    .await;
    eprintln!(
        "killed at each of {points} store calls, then recovered: {:?}",
        started.elapsed()
    );
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_in_leaves_a_live_claim_alone_and_takes_over_an_abandoned_one() {
    let db = Db::new();
    let store = db.store(4).await;
    store.migrate().await.expect("migrate");
    support::record_in_leaves_a_live_claim_alone_and_takes_over_an_abandoned_one(
        &store,
        support::record_in_committed!(store),
    )
    .await;
    store.pool().close().await;
}

/// In rollback-journal mode (a pool a host built without WAL), a reader holding its
/// lock past the busy timeout makes the commit of a write fail. An `INSERT …
/// RETURNING` hands back its row before the commit: the store must read the
/// statement to its end, so that a failed commit is an error, not a claim (or an
/// accepted event, or an observation) answered as made and then rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_commit_fails_is_an_error_not_a_success() {
    use webhook_guard::inbox::{Enqueued, InboxStore, NewEvent};
    use webhook_guard::meta::EventMeta;
    use webhook_guard::ordering::{ObjectKey, Observation, OrderingStore};
    use webhook_guard::store::sqlite::sqlx::sqlite::SqliteJournalMode;
    let db = Db::new();
    let rollback_journal = |o: SqliteConnectOptions| {
        o.journal_mode(SqliteJournalMode::Delete)
            .busy_timeout(Duration::from_millis(200))
    };
    let store = db.store_with(1, rollback_journal).await;
    store.migrate().await.unwrap();
    let reader_options = rollback_journal(SqliteStore::connect_options(&db.path));
    let mut reader = sqlx::sqlite::SqliteConnection::connect_with(&reader_options)
        .await
        .unwrap();
    let now = ms(Utc::now());
    let key = Key::new("commit", "evt");
    let meta = EventMeta::default();
    let event = NewEvent {
        key,
        fingerprint: Fingerprint::of(b"p"),
        meta: &meta,
        payload: b"p",
        now,
        expires_at: now + TimeDelta::hours(1),
    };
    let object = ObjectKey {
        namespace: "commit",
        object: "trx-1",
        family: "charge",
    };
    // A reader holds a shared lock on the file throughout.
    let read = |table: String| format!("SELECT count(*) FROM \"{table}\"");
    sqlx::raw_sql("BEGIN").execute(&mut reader).await.unwrap();
    sqlx::query(&read(db.table.clone()))
        .fetch_one(&mut reader)
        .await
        .unwrap();
    let claim = store.claim(&request(key, now)).await;
    let enqueued = store.enqueue(&event).await;
    let observed = store
        .observe(&Observation {
            key: object,
            created_at: now,
            now,
        })
        .await;
    sqlx::raw_sql("COMMIT").execute(&mut reader).await.unwrap();
    match claim {
        Err(e) => assert!(e.is_unavailable(), "{e:?}"),
        Ok(Claim::Acquired(_)) => assert!(
            store.get(key).await.unwrap().is_some(),
            "a claim answered as made is stored"
        ),
        Ok(other) => panic!("{other:?}"),
    }
    match enqueued {
        Err(e) => assert!(e.is_unavailable(), "{e:?}"),
        Ok(Enqueued::Inserted) => assert!(
            store.get_event(key).await.unwrap().is_some(),
            "an event answered as stored is stored"
        ),
        Ok(other) => panic!("{other:?}"),
    }
    match observed {
        Err(e) => assert!(e.is_unavailable(), "{e:?}"),
        Ok(_) => assert!(
            store.get_object(object).await.unwrap().is_some(),
            "an observation answered as made is stored"
        ),
    }
    reader.close().await.unwrap();
    store.pool().close().await;
}

/// Writes queued behind the store's write gate (claims: behind the claim batch in
/// flight), behind a lock held elsewhere, each answer `Unavailable` after about
/// 5 s, not one after another, the k-th after k busy timeouts. The pool's own busy timeout here is longer (8 s), so the first
/// write, waiting on the file's lock, outlasts them and is made once the lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_wait_at_most_the_busy_timeout() {
    let db = Db::new();
    let store = db
        .store_with(4, |o| o.busy_timeout(Duration::from_secs(8)))
        .await;
    store.migrate().await.unwrap();
    let mut other = db.hold_write_lock().await;
    let now = ms(Utc::now());
    let mut claims = JoinSet::new();
    for id in ["a", "b", "c"] {
        let store = store.clone();
        claims.spawn(async move { store.claim(&request(Key::new("queued", id), now)).await });
        // "a" first, alone: its write waits on the lock; "b" and "c" queue behind it.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The first answer is a queued write giving up; a second later the lock goes.
    let mut answers = vec![claims.join_next().await.unwrap().unwrap()];
    tokio::time::sleep(Duration::from_secs(1)).await;
    sqlx::raw_sql("COMMIT").execute(&mut other).await.unwrap();
    while let Some(answer) = claims.join_next().await {
        answers.push(answer.unwrap());
    }
    let unavailable = answers
        .iter()
        .filter(|a| matches!(a, Err(e) if e.is_unavailable()))
        .count();
    let made = answers
        .iter()
        .filter(|a| matches!(a, Ok(Claim::Acquired(_))))
        .count();
    assert_eq!((unavailable, made), (2, 1), "{answers:?}");
    other.close().await.unwrap();
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_share_commits_and_each_id_is_claimed_once() {
    let run = support::statements_run();
    let db = Db::new();
    let store = db.store(4).await;
    store.migrate().await.unwrap();
    let ids: Vec<String> = (0..16).map(|i| format!("evt_{i}")).collect();
    let answers = support::claim_at_once(&store, ids, 4).await;
    assert_eq!(answers.len(), 16);
    support::each_id_claimed_once(&answers);
    // 64 claims, 16 of them made: by fewer claim statements than claims made.
    let insert = format!("INSERT INTO \"{}\" AS r", db.table);
    let statements = run
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.contains(&insert))
        .count();
    assert!(
        (1..16).contains(&statements),
        "{statements} claim statements for 64 claims of 16 ids"
    );
    store.pool().close().await;
}

/// A claim's runner is counted before its task is spawned: a runtime that drops
/// the task without ever polling it (it was shut down) must count it out, or the
/// store's one SQLite runner slot stays taken and every later claim waits out its
/// patience and answers `Unavailable`.
#[test]
fn a_runner_its_runtime_dropped_unpolled_leaves_no_claim_waiting() {
    use std::future::Future;
    use std::task::{Context, Waker};

    let db = Db::new();
    let served = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = served.block_on(async {
        let store = db.store(4).await;
        store.migrate().await.unwrap();
        store
    });
    let now = ms(Utc::now());
    let gone = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    gone.block_on(async {
        let request = request(Key::new("runtimes", "first"), now);
        let mut claim = std::pin::pin!(store.claim(&request));
        // Queued, a runner spawned on this runtime; its task is not polled before
        // `block_on` returns (nothing here yields to it).
        let pending = claim
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending();
        assert!(pending);
    });
    drop(gone);
    served.block_on(async {
        let request = request(Key::new("runtimes", "second"), now);
        let claim = tokio::time::timeout(Duration::from_secs(3), store.claim(&request))
            .await
            .expect("answered at once, not after the queue's 5 s patience")
            .expect("claim");
        assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
        store.pool().close().await;
    });
}

/// A page of the listing walks the `…_listing` index: no scan of the table, no
/// sort (`EXPLAIN QUERY PLAN`).
#[tokio::test]
async fn the_listing_walks_its_index() {
    let db = Db::new();
    let store = SqliteStore::open(&db.path).await.expect("open");
    let explain = format!("EXPLAIN QUERY PLAN {}", store.list_sql());
    let rows = sqlx::query(&explain)
        .bind("ns")
        .bind("failed")
        .bind(i64::MIN)
        .bind(i64::MAX)
        .bind(None::<&str>)
        .bind(i64::MIN)
        .bind(i64::MAX)
        .bind(100i64)
        .fetch_all(store.pool())
        .await
        .expect("explain");
    let plan: Vec<String> = rows.iter().map(|r| r.get::<String, _>(3)).collect();
    let plan = plan.join("\n");
    assert!(plan.contains("webhook_guard_records_listing"), "{plan}");
    assert!(
        !plan.contains("TEMP B-TREE") && !plan.contains("SCAN webhook_guard_records\n"),
        "{plan}"
    );
    store.pool().close().await;
}
