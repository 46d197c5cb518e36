//! The SQLite store, on [sqlx](https://docs.rs/sqlx) with a bundled libsqlite3
//! (feature `sqlite`): the embedded durable store — one file, no server.
//!
//! [`SqliteStore::open`] creates the file and the table if needed, in WAL mode
//! (readers never block the writer), with `synchronous = FULL` (a completed record
//! survives a power cut) and a 5 s busy timeout. SQLite runs one write at a time per
//! database file: claims and finishes from every connection, and from every process
//! sharing the file, take turns. That is plenty for a webhook receiver (thousands of
//! deliveries per second on a local disk), but several *hosts* cannot share one file
//! (no network file systems): use PostgreSQL when replicas run on different machines.
//!
//! # Schema
//!
//! [`SqliteStore::migrate`] applies it (idempotent); [`SqliteStore::schema_sql`]
//! returns it for teams that manage their schema themselves. For the default table:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "webhook_guard_records" (
//!     namespace   TEXT    NOT NULL,
//!     id          TEXT    NOT NULL,
//!     state       TEXT    NOT NULL,
//!     fingerprint BLOB    NOT NULL,
//!     token       INTEGER NOT NULL,
//!     attempts    INTEGER NOT NULL,
//!     failures    INTEGER NOT NULL,
//!     lease_until INTEGER NOT NULL,
//!     expires_at  INTEGER NOT NULL,
//!     created_at  INTEGER NOT NULL,
//!     updated_at  INTEGER NOT NULL,
//!     history     TEXT    NOT NULL DEFAULT '',
//!     PRIMARY KEY (namespace, id)
//! );
//! CREATE INDEX IF NOT EXISTS "webhook_guard_records_expires_at"
//!     ON "webhook_guard_records" (expires_at);
//! CREATE INDEX IF NOT EXISTS "webhook_guard_records_stuck"
//!     ON "webhook_guard_records" (lease_until) WHERE state = 'in_progress';
//! CREATE INDEX IF NOT EXISTS "webhook_guard_records_listing"
//!     ON "webhook_guard_records" (namespace, state, updated_at, id);
//! CREATE TABLE IF NOT EXISTS "webhook_guard_records_inbox" (
//!     namespace       TEXT    NOT NULL,
//!     id              TEXT    NOT NULL,
//!     fingerprint     BLOB    NOT NULL,
//!     event_type      TEXT,
//!     created_at      INTEGER,
//!     object          TEXT,
//!     family          TEXT,
//!     payload         BLOB    NOT NULL,
//!     state           TEXT    NOT NULL,
//!     attempts        INTEGER NOT NULL,
//!     token           INTEGER NOT NULL,
//!     lease_until     INTEGER NOT NULL,
//!     next_attempt_at INTEGER NOT NULL,
//!     due_at          INTEGER,
//!     last_error      TEXT,
//!     received_at     INTEGER NOT NULL,
//!     updated_at      INTEGER NOT NULL,
//!     expires_at      INTEGER NOT NULL,
//!     PRIMARY KEY (namespace, id)
//! );
//! CREATE INDEX IF NOT EXISTS "webhook_guard_records_inbox_due"
//!     ON "webhook_guard_records_inbox" (namespace, due_at) WHERE due_at IS NOT NULL;
//! CREATE INDEX IF NOT EXISTS "webhook_guard_records_inbox_settled"
//!     ON "webhook_guard_records_inbox" (expires_at) WHERE due_at IS NULL;
//! CREATE INDEX IF NOT EXISTS "webhook_guard_records_inbox_listing"
//!     ON "webhook_guard_records_inbox" (namespace, state, updated_at, id);
//! CREATE TABLE IF NOT EXISTS "webhook_guard_records_objects" (
//!     namespace  TEXT    NOT NULL,
//!     object     TEXT    NOT NULL,
//!     family     TEXT    NOT NULL,
//!     newest     INTEGER NOT NULL,
//!     status     TEXT    NOT NULL,
//!     updated_at INTEGER NOT NULL,
//!     PRIMARY KEY (namespace, object, family)
//! );
//! CREATE INDEX IF NOT EXISTS "webhook_guard_records_objects_status"
//!     ON "webhook_guard_records_objects" (namespace, status, updated_at);
//! ```
//!
//! Times are milliseconds since the Unix epoch from the caller's clock (the end of a
//! lease and an expiry rounded up to the millisecond, never down); the token is
//! the 64-bit fencing token bit for bit; the fingerprint is the 32-byte SHA-256 of
//! the body. The claim is one `INSERT … ON CONFLICT (namespace, id) DO UPDATE … WHERE
//! … RETURNING` statement on the primary key. The `expires_at` index lets a purge
//! read only the rows that are due, at most 100 per statement, so the write lock is
//! held for well under a millisecond at a time, and the purge rests after each
//! statement as long as it took, so claims find the writer free; the partial index
//! on running claims keeps [`stuck`] instant at any table size. The `…_listing`
//! indexes on `(namespace, state, updated_at, id)` (records and inbox) serve the
//! operators' listing ([`ListingStore`](crate::store::ListingStore)): one backward
//! index walk per state, newest first, stopping at the page's limit.
//!
//! # Claims in batches
//!
//! Claims of concurrent deliveries share one statement and one commit (the
//! commit's fsync is what a write costs on SQLite): a claim's first try queues, and
//! one runner task of the store takes whatever has queued (up to 64 claims of
//! distinct keys, in byte order) and runs the claim upsert for all of them, one
//! `VALUES` row each. A claim alone is sent at once; under load one commit serves
//! a whole batch. A claim the statement did not answer goes on as a refused claim
//! does (it reads the record and decides). When the statement fails, each caller
//! answers `Unavailable` if the file could not serve it, and otherwise claims alone
//! with the one-row statement. A claim still queued after as long as a write waits
//! at the write gate (5 s) is withdrawn and answers `Unavailable`; a claim whose
//! caller stopped waiting before its batch was taken is not made. Finishes and
//! everything else run one statement each.
//!
//! # Inbox, ordering guard and transactional mode
//!
//! The same store is an [`InboxStore`] (in `<table>_inbox`) and an [`OrderingStore`]
//! (in `<table>_objects`), both created by [`SqliteStore::migrate`]. `enqueue` is one
//! `INSERT … ON CONFLICT (namespace, id) DO UPDATE … WHERE <settled and expired>
//! RETURNING`; a lease is one `UPDATE … WHERE rowid IN (SELECT rowid … ORDER BY
//! due_at LIMIT ?) RETURNING …` (SQLite runs one writer at a time, so two leases never
//! share an event); `due_at` is `NULL` once an event is settled, so the partial index
//! `…_inbox_due` holds only the events still to run. `observe` is `INSERT … ON
//! CONFLICT DO UPDATE … WHERE excluded.newest > o.newest RETURNING newest` (a tie
//! with the stored newest is fresh).
//! [`SqliteStore::record_in`] records an id inside the caller's transaction, so that
//! a handler's effect in this database file and its dedup record commit together.
//!
//! # Errors
//!
//! A database that is locked beyond the busy timeout, cannot be opened, or fails with
//! an I/O error or a full disk answers [`StoreError::Unavailable`] (the guard answers
//! 503 and the provider retries); any other error is [`StoreError::Backend`]. Both
//! keep the sqlx error as their source.
//!
//! [`ProcessedStore`]: super::ProcessedStore
//! [`InboxStore`]: crate::inbox::InboxStore
//! [`OrderingStore`]: crate::ordering::OrderingStore
//! [`stuck`]: super::ProcessedStore::stuck

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection};
use tokio::sync::{Mutex, MutexGuard};

use super::sql::returning::returning_ops;
use super::sql::{map_error, Dialect, Statements, TableName};
use super::StoreError;

pub use sqlx;

/// How long a statement waits for another connection's write before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A durable [`ProcessedStore`] in an SQLite file.
///
/// Cheap to clone (the pool and the prepared SQL are shared). See the
/// [module docs](self) for the schema and the settings.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use webhook_guard::store::SqliteStore;
///
/// let store = SqliteStore::open("/var/lib/my-service/webhooks.db").await?;
/// # Ok(()) }
/// ```
///
/// [`ProcessedStore`]: super::ProcessedStore
#[derive(Debug, Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub struct SqliteStore {
    pool: SqlitePool,
    sql: Arc<Statements>,
    /// Writes from this store wait here, in arrival order, rather than in SQLite's
    /// busy handler, which sleeps and retries and can starve a claim behind a purge.
    writes: Arc<Mutex<()>>,
    batcher: Arc<super::sql::claim_batch::ClaimBatcher>,
}

mod batch;

/// Result codes that mean the file cannot serve us now: busy or locked past the
/// timeout, cannot be opened, I/O error, disk full.
fn sqlite_unavailable(db: &dyn sqlx::error::DatabaseError) -> bool {
    const BUSY: i32 = 5;
    const LOCKED: i32 = 6;
    const IOERR: i32 = 10;
    const FULL: i32 = 13;
    const CANTOPEN: i32 = 14;
    db.code()
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| matches!(code & 0xff, BUSY | LOCKED | IOERR | FULL | CANTOPEN))
}

pub(super) fn err(e: sqlx::Error) -> StoreError {
    map_error(e, sqlite_unavailable)
}

/// Creates the database file of `options` if it is missing, readable and writable
/// by its owner only (0600 on Unix; SQLite gives its `-wal` and `-shm` files the
/// same mode): the file holds event ids, failure texts and, for an inbox, whole
/// bodies. An existing file is left as it is; an in-memory database has none.
pub(super) fn create_private(options: &SqliteConnectOptions) -> Result<(), StoreError> {
    let path = options.get_filename();
    if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" {
        return Ok(());
    }
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    match open.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::unavailable(e)),
    }
}

impl SqliteStore {
    /// Opens (creating it if needed, readable by its owner only) the database file
    /// at `path` with
    /// [`SqliteStore::connect_options`], a pool of up to 4 connections, and creates
    /// the default table if it does not exist.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the file cannot be opened or created,
    /// [`StoreError::Backend`] when it is not an SQLite database.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let options = Self::connect_options(path);
        create_private(&options)?;
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(BUSY_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(err)?;
        let store = Self::new(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// The settings [`SqliteStore::open`] uses, for building a pool yourself (for
    /// another table or pool size): create the file if missing, WAL journal,
    /// `synchronous = FULL`, 5 s busy timeout.
    ///
    /// With WAL, `synchronous = NORMAL` trades the durability of the last few
    /// commits on power loss (never on a process crash) for fewer fsyncs; a lost
    /// `completed` record would let a retry run its handler again.
    pub fn connect_options(path: impl AsRef<Path>) -> SqliteConnectOptions {
        Self::tune(SqliteConnectOptions::new().filename(path)).create_if_missing(true)
    }

    /// `options` with the journal, durability and busy timeout of
    /// [`SqliteStore::connect_options`].
    pub(crate) fn tune(options: SqliteConnectOptions) -> SqliteConnectOptions {
        options
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
    }

    fn build(pool: SqlitePool, table: TableName) -> Self {
        Self {
            pool,
            sql: Arc::new(Statements::new(table, Dialect::Sqlite)),
            writes: Arc::new(Mutex::new(())),
            batcher: Arc::default(),
        }
    }

    /// Creates the table and its indexes if they do not exist (the SQL of
    /// [`SqliteStore::schema_sql`]). Idempotent.
    ///
    /// # Errors
    /// [`StoreError`] when the database cannot be written.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let _gate = self.writes.lock().await;
        sqlx::raw_sql(&self.sql.schema)
            .execute(&self.pool)
            .await
            .map_err(err)?;
        Ok(())
    }
}

impl SqliteStore {
    /// Taken around every write statement (per statement for purges, so claims
    /// waiting for it go first). Waited for at most 5 s (the busy timeout
    /// [`SqliteStore::open`] sets, whatever the pool's own): writes queued behind a
    /// lock held elsewhere (another process, a host transaction) would otherwise
    /// each wait out the busy timeout in turn, the k-th for k times as long, instead
    /// of answering `Unavailable`. A burst of the store's own writes slower than
    /// that (fsync-bound) answers `Unavailable` too, and the provider retries.
    async fn write_gate(&self) -> Result<MutexGuard<'_, ()>, StoreError> {
        tokio::time::timeout(BUSY_TIMEOUT, self.writes.lock())
            .await
            .map_err(|_| {
                StoreError::unavailable(
                    "the database is locked: this store's earlier writes held it past the busy timeout",
                )
            })
    }

    /// Purge statements of 100 rows (each holds the write gate and the file's write
    /// lock for well under a millisecond on a local disk), each followed by a rest
    /// as long as it took: a claim waits for at most one such statement, and the
    /// purge leaves the writer free about half of the time.
    const PURGE_PACE: super::sql::PurgePace = super::sql::PurgePace {
        rows: 100,
        rest: 1.0,
    };
}

returning_ops! {
    SqliteStore, Sqlite, SqliteConnection, "sqlite", err,
    record_in:
    /// Records `key` as processed inside the caller's transaction: the
    /// **transactional mode**, for handlers whose effect lives in this same database
    /// file.
    ///
    #[doc = include_str!("../sql/record_in.md")]
    /// SQLite runs one write transaction at a time: from this statement on, the
    /// transaction holds the file's write lock until it ends, and a concurrent one
    /// waits (up to the busy timeout) and then sees the committed record (`Duplicate`),
    /// or none after a rollback (`First`). So whatever instruction the process dies at,
    /// the effect is applied exactly once. Make `record_in` the transaction's first
    /// statement (or begin it with `BEGIN IMMEDIATE`): a transaction that read first
    /// and writes later can fail with `SQLITE_BUSY` at once instead of waiting.
    /// Whatever it answers, the write lock is held until the transaction ends: on
    /// anything but `First`, end it at once.
    ///
    /// ```no_run
    /// # async fn demo(store: webhook_guard::store::SqliteStore, body: &[u8])
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// use chrono::{TimeDelta, Utc};
    /// use webhook_guard::store::{Fingerprint, Key, Recorded};
    ///
    /// let pool = store.pool();
    /// let (key, fp) = (Key::new("stripe", "evt_1"), Fingerprint::of(body));
    /// let (now, exp) = (Utc::now(), Utc::now() + TimeDelta::days(3));
    /// let mut tx = pool.begin().await?;
    /// if store.record_in(&mut *tx, key, fp, now, exp).await? == Recorded::First {
    ///     sqlx::query("INSERT INTO orders (event_id) VALUES (?)")
    ///         .bind(key.id)
    ///         .execute(&mut *tx)
    ///         .await?;
    /// }
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StoreError`] when a statement fails ([`StoreError::Unavailable`] when the
    /// write lock was not granted within the busy timeout); the transaction should
    /// then be rolled back (dropping it does).
}
