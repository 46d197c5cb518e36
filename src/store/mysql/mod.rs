//! The MySQL / MariaDB store, on [`sqlx`].
//!
//! [`MySqlStore`] keeps one row per `(namespace, id)` in one InnoDB table and makes
//! every change of the [`ProcessedStore`](crate::store::ProcessedStore) contract in a single statement, so it is
//! atomic across every process sharing the database. It is tested on MariaDB 10.11
//! and written for MySQL 8 as well (see [Compatibility](MySqlStore#compatibility)).
//!
//! ```no_run
//! use webhook_guard::store::MySqlStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MySqlStore::connect("mysql://app@db.internal/app").await?;
//! store.migrate().await?; // CREATE TABLE IF NOT EXISTS …
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;

use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlDatabaseError, MySqlPool, MySqlSslMode};

/// The driver, re-exported so that a host uses the same version as this crate.
pub use sqlx;

mod batch;
mod inbox;
mod ordering;
mod processed;
mod statements;

use self::statements::Stmt;
use super::sql::impls::sql_store_impls;
use super::sql::{self as shared, Columns, Common, TableName};
use super::StoreError;

/// The schema for the default table name; [`MySqlStore::schema_sql`] renames it.
const SCHEMA: &str = include_str!("schema.sql");

/// Purge statements of 1,000 rows, each followed by a rest six times as long as it
/// took: a purge of a large backlog takes at most a seventh of the server's time,
/// and so of its redo log and buffer pool, and claims meanwhile keep most of their
/// latency. InnoDB pays a fixed cost of a few milliseconds per statement (and the
/// claims meet one commit per statement), so fewer, larger statements purge faster
/// and disturb claims less than many small ones: on MariaDB, at a rest of four
/// times, statements of 100 rows took over twice as long as statements of 1,000
/// and left the claims a higher p99. A longer rest protects claims more and purges
/// more slowly (`benches/README.md` has the measured trade-off).
const PURGE_PACE: shared::PurgePace = shared::PurgePace {
    rows: 1_000,
    rest: 6.0,
};

/// How often a statement is run again after InnoDB chose it as a deadlock victim
/// (the statement was rolled back whole, so running it again is safe).
const DEADLOCK_RETRIES: usize = 5;

/// How often a claim or delete starts over when the record it just saw vanished
/// (purged or deleted by another process) before it could be read back, or (a
/// claim) changed into one it may take over or replace (its holder failed).
const VANISHED_RETRIES: usize = 3;

/// The claim's outcome codes, set with `LAST_INSERT_ID(code)` by the duplicate-key
/// branch and returned in the OK packet. A plain insert leaves it at 0.
const CODE_UNCHANGED: u64 = 1;
const CODE_FRESH: u64 = 2;
const CODE_TAKEOVER: u64 = 3;

/// A table name that [`MySqlStore::with_table`] refused: the error all SQL stores
/// share. Table names are written into SQL text, so only
/// `[A-Za-z_][A-Za-z0-9_]{0,62}` is accepted (no quoting, no schema prefix: choose
/// the database in the URL).
pub use super::sql::InvalidTableName;

/// A [`ProcessedStore`](crate::store::ProcessedStore) in a MySQL 8 or MariaDB (10.5 and later; 10.6 for the
/// inbox) table.
///
/// Cheap to clone: clones share the pool. Create the table once with
/// [`MySqlStore::migrate`] (idempotent) or apply [`MySqlStore::schema_sql`] with
/// your own migration tool. The schema for the default table name:
///
/// ```sql
#[doc = include_str!("schema.sql")]
/// ```
///
/// - `namespace` and `id` are `VARBINARY`, compared byte for byte. (`utf8mb4_bin`
///   would not do: it is a `PAD SPACE` collation on both MariaDB and MySQL, so
///   `"evt_1"` and `"evt_1 "` would be the same key.) The guard accepts namespaces
///   of at most 64 bytes and ids of at most 255 bytes, which fit, and the primary
///   key stays at 319 bytes, far below InnoDB's 3072-byte limit.
/// - Times are `BIGINT` milliseconds since the Unix epoch, always the caller's
///   (`now` of each request), never the server's clock; the end of a lease and an
///   expiry are rounded up to the millisecond, never down. The fencing token is the
///   `BIGINT` of [`FencingToken::as_i64`](crate::store::FencingToken::as_i64) (all 64 bits kept).
/// - `by_expiry` keeps [`purge_expired`](crate::store::ProcessedStore::purge_expired) a range scan
///   and `by_lease` keeps [`stuck`](crate::store::ProcessedStore::stuck) one, at any table size.
/// - `by_listing` (on the records and on the inbox) serves the operators' listing
///   ([`ListingStore`](crate::store::ListingStore),
///   [`InboxListing`](crate::inbox::InboxListing)): one backward range scan per
///   state, newest first, stopping at the page's limit. An id prefix is checked on
///   the index entries of that walk (a rare prefix walks the whole state's range).
///   [`MySqlStore::migrate`] adds the index to a table made before it existed
///   (`ALTER TABLE … ADD INDEX`, an online operation on InnoDB).
///   A purge deletes at most 1,000 rows per statement, oldest first, under `READ
///   COMMITTED` (it locks only the rows it deletes, no gaps; unlike PostgreSQL's, it
///   waits for a row another transaction holds, such as a `record_in` taking an
///   expired row over inside a host's transaction), and rests after each
///   statement six times as long as it took, so that a large backlog leaves the
///   server free most of the time and claims keep their latency (1,000,000 rows
///   took 87–121 s on two test hosts, 8,000–11,500 rows/s: far faster than
///   webhooks arrive).
///
/// # How a claim works
///
/// One `INSERT … ON DUPLICATE KEY UPDATE` on the primary key, which InnoDB runs under
/// the row's exclusive lock, so two claims of one key are serialized by the
/// database:
///
/// - a new key is inserted (`InProgress`, attempts 1) and the claim is
///   [`Acquired`](crate::store::Claim::Acquired) without reading anything back: one round trip;
/// - on a duplicate key, the first assignment computes the decision **once**, from
///   the row as it was, and stores it with `LAST_INSERT_ID(code)`: 2 when the
///   record expired (it is overwritten with fresh values, again one round trip),
///   3 when a `Failed` record or an `InProgress` record whose lease ran out has a
///   matching fingerprint (taken over: attempts + 1, failures + 1 for a lost
///   lease, expiry raised, a known fingerprint kept), 1 otherwise (nothing
///   changes). Every later assignment reads the code back with `LAST_INSERT_ID()`
///   instead of re-reading columns that the same statement may already have
///   changed, so the result is the same whether the server evaluates assignments
///   left to right (the default) or simultaneously (MariaDB's
///   `SIMULTANEOUS_ASSIGNMENT` mode). The one column read again, `fingerprint` in
///   its own assignment, is changed by no assignment before it: keep it so;
/// - the code comes back in the OK packet. For 1 and 3 the store reads the row back
///   (a second round trip) and answers `Acquired` exactly when the row carries the
///   request's token and was changed at the request's time (a process forked
///   mid-sequence may repeat a token), else [`Existing`](crate::store::Claim::Existing).
///
/// The full statement is shown by [`MySqlStore::claim_sql`].
///
/// # Claims in batches
///
/// Claims of concurrent deliveries share one statement and one commit. A claim's
/// first try queues, and one of at most two runner tasks of the store takes
/// whatever has queued (up to 64 claims of distinct keys, in byte order; a claim
/// alone is a batch of one, sent at once). A batch inserts all its claims as new
/// records with one `INSERT IGNORE … VALUES (…), (…)` (a key already stored is
/// left as it is; `IGNORE` can only skip a duplicate key here, as a batch takes
/// only keys that fit their columns). When every row went in, each claim is
/// `Acquired`; otherwise one read of the batch's records tells which rows carry
/// their claim's token and time, a known id is answered with the record read
/// (`Existing`: a duplicate costs the insert and the read), and only a claim that
/// may take its record over or replace it, or whose row is gone (deleted
/// meanwhile), goes on alone with the statement above.
/// The batch waits at most 1 s for a row lock (`innodb_lock_wait_timeout`): on
/// MariaDB the insert sets it for itself alone (`SET STATEMENT … FOR`), so a new
/// id costs one round trip, as the single statement does; on MySQL, whose
/// `SET_VAR` hint does not take InnoDB's variables, the batch sets it on its
/// connection and sets it back after (a connection that cannot be set back is
/// closed), two round trips more. `VERSION()`, read once on the store's first
/// batch, tells the servers apart. So a key held elsewhere (an open
/// [`record_in`](MySqlStore::record_in) transaction) holds up only its own
/// claim. A claim still queued after the pool's acquire timeout is withdrawn
/// (never made) and answers `Unavailable`. When the batch fails, each caller
/// answers `Unavailable` if the server could not be reached, and otherwise claims
/// alone.
///
/// Fenced changes (`finish`, `renew`) are `UPDATE … WHERE namespace = ? AND id = ?
/// AND state = 'in_progress' AND token = ?`: one affected row means applied. sqlx
/// always connects with `CLIENT_FOUND_ROWS`, so a matched row counts even when the
/// update leaves its values as they were (a repeated renew).
///
/// A statement that InnoDB rolls back as a deadlock victim (error 1213) is run
/// again, up to 5 times.
///
/// # Inbox, ordering guard and transactional mode
///
/// The same store is an [`InboxStore`](crate::inbox::InboxStore) in `<table>_inbox` and an [`OrderingStore`](crate::ordering::OrderingStore)
/// in `<table>_objects` ([`MySqlStore::inbox_table`], [`MySqlStore::objects_table`]),
/// created by [`MySqlStore::migrate`] with the schema above:
///
/// - `enqueue` is one `INSERT … ON DUPLICATE KEY UPDATE` whose first assignment
///   decides once, with `LAST_INSERT_ID(code)`, whether the stored event is settled
///   and expired (replaced) or not (unchanged, then read back as `Existing`). The
///   statement carries the body twice (for the insert and for the replacement), so
///   a body must stay under half the server's `max_allowed_packet` (16 MiB by
///   default on MariaDB 10.11, 64 MiB on MySQL 8): mind it when raising
///   `max_body` above 8 MiB.
/// - `due_at` is `next_attempt_at` for a pending event, `lease_until` for a running
///   one and `NULL` once settled, so `by_due (namespace, due_at)` is a range scan over
///   the events still to run, however many settled rows the table holds. A lease is
///   one short `READ COMMITTED` transaction: `SELECT id … WHERE namespace = ? AND
///   due_at <= ? ORDER BY due_at LIMIT ? FOR UPDATE SKIP LOCKED` (MariaDB 10.6+,
///   MySQL 8.0+), then an `UPDATE` of those ids and a read of the leased rows;
///   concurrent workers skip each other's rows.
/// - `settle_event` and `renew_event` are `UPDATE`s fenced by `state = 'running' AND
///   token = ?`; `purge_settled` deletes through `by_settled (due_at, expires_at)` in
///   batches of 500.
/// - `observe` is the same decide-once upsert on `(namespace, object, family)`:
///   stored when `created_at` is after the stored newest, fresh and unchanged when it
///   equals it, else read back as `Stale`. Objects and families are `VARBINARY(255)`.
/// - [`MySqlStore::record_in`] records an id inside the caller's transaction, so that
///   a handler's effect in this database and its dedup record commit together.
///
/// # Errors
///
/// Connection failures (I/O, TLS, pool timed out or closed, and the server errors
/// 1040 "too many connections", 1203 and 1226 (the user's connection or hourly
/// limits), 1053 "server shutdown", 1927 "connection killed", 3032 "offline mode",
/// 4031 "disconnected by the server"), a read-only server (1290, 1836: a replica
/// after a fail-over) and protocol errors are [`StoreError::Unavailable`]; anything
/// else the server answers is [`StoreError::Backend`]. Both keep the
/// [`sqlx::Error`] as their source. The pool checks a connection before lending it
/// and opens new ones as needed, so the store recovers by itself when the server
/// comes back.
///
/// # Compatibility
///
/// - MariaDB 10.5+ and MySQL 8.0+ (InnoDB); the inbox's lease needs MariaDB 10.6+
///   (`SKIP LOCKED`). Statements use `?` binds only, no
///   `VALUES()` function (deprecated in MySQL 8.0.20) and no row alias (which
///   MariaDB lacks), so one text serves both.
/// - The claim relies on `LAST_INSERT_ID(expr)`, which both servers document for
///   exactly this use in `ON DUPLICATE KEY UPDATE`; it is tested on MariaDB in both
///   assignment modes.
/// - Statement-based binary logging marks `INSERT … ON DUPLICATE KEY UPDATE` as
///   unsafe; use row-based logging (the default of both servers) on replicated
///   setups.
#[derive(Clone, derive_more::Debug)]
pub struct MySqlStore {
    pool: MySqlPool,
    table: Arc<str>,
    #[debug(skip)]
    sql: Arc<Sql>,
    #[debug(skip)]
    batcher: Arc<super::sql::claim_batch::ClaimBatcher>,
    /// How the server lets a claim batch bound its lock wait, once known.
    #[debug(skip)]
    lock_wait: Arc<std::sync::OnceLock<batch::LockWait>>,
}

impl MySqlStore {
    /// The table name used unless [`MySqlStore::with_table`] chooses another.
    pub const DEFAULT_TABLE: &'static str = "webhook_guard_records";

    /// A store on `pool`, in the table [`MySqlStore::DEFAULT_TABLE`].
    pub fn new(pool: MySqlPool) -> Self {
        Self::build(pool, Self::DEFAULT_TABLE)
    }

    /// Connects a pool of up to 16 connections to `url`
    /// (`mysql://user:password@host:3306/database`), waiting at most 5 s for a free
    /// connection so that an unreachable server answers 503 quickly, and returns a
    /// store on it with the default table. Does not create the table: see
    /// [`MySqlStore::migrate`].
    ///
    /// For other pool settings, build the [`MySqlPool`] yourself and use
    /// [`MySqlStore::new`].
    ///
    /// TLS (feature `tls`) follows the URL's `ssl-mode`, as the MySQL client does:
    /// `VERIFY_IDENTITY` checks the certificate and that it names the host,
    /// `VERIFY_CA` the certificate (and, with sqlx 0.8, the host too: see
    /// [`tls`](super::tls)), against `ssl-ca=PATH` or else the system's
    /// trusted roots; `REQUIRED` encrypts without checking, unless `ssl-ca` is given,
    /// which it then checks as `VERIFY_CA` does; the default `PREFERRED` uses TLS
    /// when the server offers it, unchecked, and plain text otherwise.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the server cannot be reached or the TLS
    /// handshake fails, [`StoreError::Backend`] for a bad URL or refused
    /// credentials. A TLS failure has a [`TlsError`](super::TlsError) in its chain.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = MySqlConnectOptions::from_str(url).map_err(map_err)?;
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_with(given_ca_checked(options))
            .await
            .map_err(|e| super::tls::tls_cause(map_err(e)))?;
        Ok(Self::new(pool))
    }

    /// The same store in the table `table`.
    ///
    /// The store also uses `<table>_inbox` and `<table>_objects` (and indexes named
    /// after `table`): stores sharing a database need names that none of these
    /// repeat (`t` and `t_inbox` would meet).
    ///
    /// # Errors
    /// [`InvalidTableName`] unless `table` matches `[A-Za-z_][A-Za-z0-9_]{0,62}`.
    pub fn with_table(self, table: &str) -> Result<Self, InvalidTableName> {
        let table = TableName::new(table)?;
        Ok(Self::build(self.pool, table.as_str()))
    }

    fn build(pool: MySqlPool, table: &str) -> Self {
        Self {
            pool,
            table: table.into(),
            sql: Arc::new(Sql::new(table)),
            batcher: Arc::default(),
            lock_wait: Arc::default(),
        }
    }

    /// The table the records live in.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The pool the store runs its statements on.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The `CREATE TABLE IF NOT EXISTS` statement for this store's table, as
    /// [`MySqlStore::migrate`] runs it (see the schema on [`MySqlStore`]).
    pub fn schema_sql(&self) -> String {
        schema_for(&self.table)
    }

    /// The claim statement, with `?` for its binds (for review and for `EXPLAIN`).
    pub fn claim_sql(&self) -> &str {
        &self.sql.claim.sql
    }

    /// The statement of one state's page of the record listing, with `?` for its
    /// binds (for review and for `EXPLAIN`).
    pub fn list_sql(&self) -> &str {
        &self.sql.common.list_records.sql
    }

    /// Creates the table and its indexes unless they exist. Safe to run at every
    /// start, from every replica.
    ///
    /// # Errors
    /// [`StoreError`] when the statement fails, for instance for lack of the
    /// `CREATE` privilege.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let schema = self.schema_sql();
        sqlx::raw_sql(&schema)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        // Tables made before the listing index: add it (MySQL has no `ADD INDEX
        // IF NOT EXISTS`; a replica adding it at the same time makes the other's
        // fail with a duplicate key name, 1061, which is what we want anyway).
        for table in [&*self.table, self.inbox_table()] {
            let present: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.statistics \
                 WHERE table_schema = DATABASE() AND table_name = ? AND index_name = 'by_listing'",
            )
            .bind(table)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
            if present == 0 {
                let add = format!(
                    "ALTER TABLE {} ADD INDEX by_listing (namespace, state, updated_at, id)",
                    quote(table)
                );
                match sqlx::raw_sql(&add).execute(&self.pool).await {
                    Ok(_) => {}
                    Err(sqlx::Error::Database(e))
                        if e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                            .is_some_and(|e| e.number() == 1061) => {}
                    Err(e) => return Err(map_err(e)),
                }
            }
        }
        Ok(())
    }

    /// The inbox table (`<table>_inbox`, shortened with a hash past 63 bytes).
    pub fn inbox_table(&self) -> &str {
        &self.sql.queue.inbox
    }

    /// The ordering table (`<table>_objects`, shortened with a hash past 63 bytes).
    pub fn objects_table(&self) -> &str {
        &self.sql.queue.objects
    }
}

/// The schema with `table` (already validated) for the default table name, and its
/// inbox and ordering tables named after it.
fn schema_for(table: &str) -> String {
    let name = TableName::new(table).expect("validated by MySqlStore::with_table");
    let default = MySqlStore::DEFAULT_TABLE;
    SCHEMA
        .trim_end()
        .replace(&quote(&format!("{default}_inbox")), "{inbox}")
        .replace(&quote(&format!("{default}_objects")), "{objects}")
        .replacen(&quote(default), &quote(table), 1)
        .replace("{inbox}", &quote(name.derived("inbox").as_str()))
        .replace("{objects}", &quote(name.derived("objects").as_str()))
}

/// A table name in backticks, so that reserved words (`order`, `key`) work too. The
/// name is validated (letters, digits and `_`), so it holds no backtick.
fn quote(table: &str) -> String {
    format!("`{table}`")
}

/// Every statement, built once per table name.
#[derive(Debug)]
pub(super) struct Sql {
    /// The table's name, quoted.
    table: String,
    /// $1 namespace, $2 id, $3 fingerprint, $4 token, $5 lease_until, $6 expires_at,
    /// $7 now, $8 the unknown fingerprint.
    claim: Stmt,
    /// $1 namespace, $2 id, $3 now: whether a live lease holds the record (1) or not
    /// (0), no row for no record.
    probe: Stmt,
    /// $1 now, $2 limit.
    purge: Stmt,
    /// The statements every dialect writes alike.
    common: Common<Stmt>,
    queue: QueueSql,
}

/// The inbox, ordering and transactional statements.
#[derive(Debug)]
pub(super) struct QueueSql {
    inbox: String,
    objects: String,
    /// $1 namespace, $2 id, $3 fingerprint, $4 event_type, $5 created_at, $6 object,
    /// $7 family, $8 payload, $9 now, $10 expires_at.
    enqueue: Stmt,
    /// $1 namespace, $2 now, $3 limit: the ids of due events, locked.
    pick: Stmt,
    /// Binds token, lease_until, lease_until, now, namespace, then an `IN` list of ids.
    take: String,
    /// Binds namespace, then an `IN` list of ids.
    taken: String,
    /// $1 now, $2 limit.
    purge: Stmt,
    /// $1 namespace, $2 object, $3 family, $4 created_at, $5 now.
    observe: Stmt,
    /// $1 namespace, $2 id, $3 fingerprint, $4 token, $5 now, $6 expires_at, $7 the
    /// unknown fingerprint.
    record: Stmt,
    /// As [`Common::recorded`], locking the row.
    recorded: Stmt,
}

/// A text column that is not UTF-8. Text columns are read as bytes (sqlx takes any
/// `_bin` collation for a binary type) and checked here.
#[derive(Debug, thiserror::Error)]
#[error("column {0} is not UTF-8")]
struct NotUtf8(usize);

impl Columns for MySql {
    type Integer = u32;
    type Text = Vec<u8>;
    fn text(read: Vec<u8>, at: usize) -> Result<String, sqlx::Error> {
        String::from_utf8(read).map_err(|_| sqlx::Error::Decode(Box::new(NotUtf8(at))))
    }
}

impl MySqlStore {
    /// How `purge_settled` removes settled events: statements of at most 500 rows,
    /// so that each holds its row locks for a few milliseconds only, back to back.
    const SETTLED_PURGE: shared::PurgePace = shared::PurgePace {
        rows: 500,
        rest: 0.0,
    };

    /// InnoDB orders concurrent writes itself (row locks, `SKIP LOCKED`): a write
    /// waits for nothing here.
    async fn write_gate(&self) -> Result<shared::Ungated, StoreError> {
        Ok(shared::Ungated)
    }
}

sql_store_impls!(MySqlStore, MySql, Stmt, "mysql", map_err, retry_deadlocks);

/// MySQL / MariaDB server errors that mean the connection, not the statement, failed.
const UNAVAILABLE_CODES: [u16; 9] = [
    1040, // ER_CON_COUNT_ERROR: too many connections
    1053, // ER_SERVER_SHUTDOWN
    1203, // ER_TOO_MANY_USER_CONNECTIONS: the user's `max_user_connections`
    1226, // ER_USER_LIMIT_REACHED: the user's hourly limits
    1290, // ER_OPTION_PREVENTS_STATEMENT: `read_only` (a replica after a fail-over)
    1836, // ER_READ_ONLY_MODE (MySQL)
    1927, // ER_CONNECTION_KILLED (MariaDB)
    4031, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8.0.24+): disconnected by the server
    3032, // ER_SERVER_OFFLINE_MODE (MySQL)
];

fn server_error_number(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()
        .and_then(|e| e.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

/// `ssl-mode=REQUIRED` with `ssl-ca` given checks the server's certificate against
/// that CA: `VERIFY_CA`.
fn given_ca_checked(options: MySqlConnectOptions) -> MySqlConnectOptions {
    let required = matches!(options.get_ssl_mode(), MySqlSslMode::Required);
    let verify_ca = |o: MySqlConnectOptions| o.ssl_mode(MySqlSslMode::VerifyCa);
    super::sql::given_ca_checked(options, required, "ssl-ca", verify_ca)
}

/// Sorts a driver error into unreachable (the guard answers 503) or not.
/// A text column that is not UTF-8 is [`StoreError::Corrupt`].
fn map_err(error: sqlx::Error) -> StoreError {
    if let sqlx::Error::Decode(e) = &error {
        if let Some(column) = e.downcast_ref::<NotUtf8>() {
            return StoreError::Corrupt(column.to_string());
        }
    }
    shared::map_error(error, |db| {
        db.try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| UNAVAILABLE_CODES.contains(&e.number()))
    })
}

/// Runs a single autocommit statement, again when InnoDB picked it as a deadlock
/// victim (error 1213: the statement was rolled back whole).
async fn retry_deadlocks<T, F, Fut>(mut run: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut tries = 0;
    loop {
        match run().await {
            Err(e) if tries < DEADLOCK_RETRIES && server_error_number(&e) == Some(1213) => {
                tries += 1;
            }
            other => return other.map_err(map_err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_the_table_once() {
        let sql = schema_for("my_records");
        assert!(sql.starts_with("CREATE TABLE IF NOT EXISTS `my_records` ("));
        assert!(!sql.contains(MySqlStore::DEFAULT_TABLE));
        assert!(sql.contains("PRIMARY KEY (namespace, id)"));
        assert!(sql.contains("KEY by_expiry (expires_at)"));
        assert!(sql.contains("KEY by_lease (state, lease_until)"));
    }

    #[test]
    fn schema_names_the_inbox_and_ordering_tables() {
        let sql = schema_for("my_records");
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS `my_records_inbox` ("));
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS `my_records_objects` ("));
        assert!(sql.contains("KEY by_due (namespace, due_at)"));
        assert!(sql.contains("KEY by_status (namespace, status, updated_at)"));
        let long = "a".repeat(63);
        let sql = schema_for(&long);
        assert!(!sql.contains(&format!("{long}_inbox")), "shortened to fit");
        assert_eq!(sql.matches("CREATE TABLE").count(), 3);
    }
}
