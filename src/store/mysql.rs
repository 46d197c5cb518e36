//! The MySQL / MariaDB store, on [`sqlx`].
//!
//! [`MySqlStore`] keeps one row per `(namespace, id)` in one InnoDB table and makes
//! every change of the [`ProcessedStore`] contract in a single statement, so it is
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

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlDatabaseError, MySqlPool, MySqlQueryResult, MySqlRow};
use sqlx::Row;

/// The driver, re-exported so that a host uses the same version as this crate.
pub use sqlx;

use super::{
    decode_history, encode_history, Claim, ClaimRequest, Deleted, Fence, FencingToken, Fingerprint,
    Finish, Key, ProcessedStore, Record, RecordState, StoreError,
};

/// The schema for the default table name; [`MySqlStore::schema_sql`] renames it.
const SCHEMA: &str = include_str!("mysql.sql");

/// How many rows one purge statement removes at most, so that it holds its row
/// locks for a few milliseconds only.
const PURGE_BATCH: usize = 500;

/// How often a statement is run again after InnoDB chose it as a deadlock victim
/// (the statement was rolled back whole, so running it again is safe).
const DEADLOCK_RETRIES: usize = 5;

/// How often a claim or delete starts over when the record it just saw vanished
/// (purged or deleted by another process) before it could be read back.
const VANISHED_RETRIES: usize = 3;

/// The claim's outcome codes, set with `LAST_INSERT_ID(code)` by the duplicate-key
/// branch and returned in the OK packet. A plain insert leaves it at 0.
const CODE_UNCHANGED: u64 = 1;
const CODE_FRESH: u64 = 2;
const CODE_TAKEOVER: u64 = 3;

/// The columns every read selects, in this order (see `record_from_row`).
const COLUMNS: &str = "namespace, id, state, fingerprint, token, attempts, failures, \
                       lease_until, expires_at, created_at, updated_at, history";

/// A table name that [`MySqlStore::with_table`] refused.
///
/// Table names are written into SQL text, so only `[A-Za-z_][A-Za-z0-9_]{0,62}`
/// is accepted (no quoting, no schema prefix: choose the database in the URL).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid table name {0:?}: use 1 to 63 ASCII letters, digits or underscores, not starting with a digit")]
pub struct InvalidTableName(pub String);

fn valid_table_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// A [`ProcessedStore`] in a MySQL 8 or MariaDB (10.5 and later) table.
///
/// Cheap to clone: clones share the pool. Create the table once with
/// [`MySqlStore::migrate`] (idempotent) or apply [`MySqlStore::schema_sql`] with
/// your own migration tool. The schema for the default table name:
///
/// ```sql
#[doc = include_str!("mysql.sql")]
/// ```
///
/// - `namespace` and `id` are `VARBINARY`, compared byte for byte. (`utf8mb4_bin`
///   would not do: it is a `PAD SPACE` collation on both MariaDB and MySQL, so
///   `"evt_1"` and `"evt_1 "` would be the same key.) The guard accepts namespaces
///   of at most 64 bytes and ids of at most 255 bytes, which fit, and the primary
///   key stays at 319 bytes, far below InnoDB's 3072-byte limit.
/// - Times are `BIGINT` milliseconds since the Unix epoch, always the caller's
///   (`now` of each request), never the server's clock. The fencing token is the
///   `BIGINT` of [`FencingToken::as_i64`] (all 64 bits kept).
/// - `by_expiry` keeps [`purge_expired`](ProcessedStore::purge_expired) a range scan
///   and `by_lease` keeps [`stuck`](ProcessedStore::stuck) one, at any table size.
///
/// # How a claim works
///
/// One `INSERT … ON DUPLICATE KEY UPDATE` on the primary key, which InnoDB runs under
/// the row's exclusive lock, so two claims of one key are serialized by the
/// database:
///
/// - a new key is inserted (`InProgress`, attempts 1) and the claim is
///   [`Acquired`](Claim::Acquired) without reading anything back: one round trip;
/// - on a duplicate key, the first assignment computes the decision **once**, from
///   the row as it was, and stores it with `LAST_INSERT_ID(code)`: 2 when the
///   record expired (it is overwritten with fresh values, again one round trip),
///   3 when a `Failed` record or an `InProgress` record whose lease ran out has the
///   same fingerprint (taken over: attempts + 1, failures + 1 for a lost lease,
///   expiry raised), 1 otherwise (nothing changes). Every later assignment reads
///   the code back with `LAST_INSERT_ID()` instead of re-reading columns that the
///   same statement may already have changed, so the result is the same whether
///   the server evaluates assignments left to right (the default) or
///   simultaneously (MariaDB's `SIMULTANEOUS_ASSIGNMENT` mode);
/// - the code comes back in the OK packet. For 1 and 3 the store reads the row back
///   (a second round trip) and answers `Acquired` exactly when the row carries the
///   request's token (tokens are random 64-bit values, unique per claim), else
///   [`Existing`](Claim::Existing).
///
/// The full statement is shown by [`MySqlStore::claim_sql`].
///
/// Fenced changes (`finish`, `renew`) are `UPDATE … WHERE namespace = ? AND id = ?
/// AND state = 'in_progress' AND token = ?`: one affected row means applied. sqlx
/// always connects with `CLIENT_FOUND_ROWS`, so a matched row counts even when the
/// update leaves its values as they were (a repeated renew).
///
/// A statement that InnoDB rolls back as a deadlock victim (error 1213) is run
/// again, up to 5 times.
///
/// # Errors
///
/// Connection failures (I/O, TLS, pool timed out or closed, and the server errors
/// 1040 "too many connections", 1053 "server shutdown", 1927 "connection killed",
/// 4031 "disconnected by the server") are [`StoreError::Unavailable`]; anything
/// else the server answers is [`StoreError::Backend`]. Both keep the
/// [`sqlx::Error`] as their source. The pool checks a connection before lending it
/// and opens new ones as needed, so the store recovers by itself when the server
/// comes back.
///
/// # Compatibility
///
/// - MariaDB 10.5+ and MySQL 8.0+ (InnoDB). Statements use `?` binds only, no
///   `VALUES()` function (deprecated in MySQL 8.0.20) and no row alias (which
///   MariaDB lacks), so one text serves both.
/// - The claim relies on `LAST_INSERT_ID(expr)`, which both servers document for
///   exactly this use in `ON DUPLICATE KEY UPDATE`; it is tested on MariaDB in both
///   assignment modes.
/// - Statement-based binary logging marks `INSERT … ON DUPLICATE KEY UPDATE` as
///   unsafe; use row-based logging (the default of both servers) on replicated
///   setups.
#[derive(Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    table: Arc<str>,
    sql: Arc<Sql>,
}

impl fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore")
            .field("table", &self.table)
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

/// A named value bound into the claim statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Param {
    Namespace,
    Id,
    Fingerprint,
    Token,
    Now,
    LeaseUntil,
    ExpiresAt,
}

/// Every statement, built once per table name.
#[derive(Debug)]
struct Sql {
    claim: String,
    claim_params: Vec<Param>,
    get: String,
    finish: String,
    renew: String,
    delete: String,
    probe: String,
    purge: String,
    stuck: String,
}

/// The claim, with `:name` placeholders that [`compile`] turns into `?` binds.
/// `{fresh}` and `{take}` read the row as it was; they are used in the first
/// assignment only, which stores the decision with `LAST_INSERT_ID(code)`.
const CLAIM_TEMPLATE: &str = "INSERT INTO {table} \
(namespace, id, state, fingerprint, token, attempts, failures, \
lease_until, expires_at, created_at, updated_at, history) \
VALUES (:ns, :id, 'in_progress', :fp, :token, 1, 0, :lease, :exp, :now, :now, '') \
ON DUPLICATE KEY UPDATE \
token = IF(LAST_INSERT_ID(IF({fresh}, 2, IF({take}, 3, 1))) = 1, token, :token), \
attempts = IF(LAST_INSERT_ID() = 2, 1, \
IF(LAST_INSERT_ID() = 3, LEAST(attempts, 4294967294) + 1, attempts)), \
failures = IF(LAST_INSERT_ID() = 2, 0, \
IF(LAST_INSERT_ID() = 3 AND state = 'in_progress', LEAST(failures, 4294967294) + 1, failures)), \
history = IF(LAST_INSERT_ID() = 2, '', history), \
created_at = IF(LAST_INSERT_ID() = 2, :now, created_at), \
updated_at = IF(LAST_INSERT_ID() = 1, updated_at, :now), \
expires_at = IF(LAST_INSERT_ID() = 2, :exp, \
IF(LAST_INSERT_ID() = 3, GREATEST(expires_at, :exp), expires_at)), \
lease_until = IF(LAST_INSERT_ID() = 1, lease_until, :lease), \
fingerprint = IF(LAST_INSERT_ID() = 1, fingerprint, :fp), \
state = IF(LAST_INSERT_ID() = 1, state, 'in_progress')";

/// The record expired and no live lease holds it: claimed as if new.
const FRESH: &str = "(expires_at <= :now AND NOT (state = 'in_progress' AND lease_until > :now))";

/// Same body, and the record failed or its holder's lease ran out: taken over.
const TAKE: &str = "(fingerprint = :fp AND (state = 'failed' \
OR (state = 'in_progress' AND lease_until <= :now)))";

/// Turns `:name` placeholders into `?` and lists the values to bind, in order.
fn compile(template: &str) -> (String, Vec<Param>) {
    const NAMES: [(&str, Param); 7] = [
        ("ns", Param::Namespace),
        ("id", Param::Id),
        ("fp", Param::Fingerprint),
        ("token", Param::Token),
        ("now", Param::Now),
        ("lease", Param::LeaseUntil),
        ("exp", Param::ExpiresAt),
    ];
    let mut sql = String::with_capacity(template.len());
    let mut params = Vec::new();
    let mut rest = template;
    while let Some(at) = rest.find(':') {
        sql.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..len];
        let param = NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| panic!("unknown placeholder :{name}"));
        sql.push('?');
        params.push(param);
        rest = &after[len..];
    }
    sql.push_str(rest);
    (sql, params)
}

impl Sql {
    fn new(table: &str) -> Self {
        let template = CLAIM_TEMPLATE
            .replace("{fresh}", FRESH)
            .replace("{take}", TAKE)
            .replace("{table}", table);
        let (claim, claim_params) = compile(&template);
        let fence = "WHERE namespace = ? AND id = ? AND state = 'in_progress' AND token = ?";
        let live = "(state = 'in_progress' AND lease_until > ?)";
        Self {
            claim,
            claim_params,
            get: format!("SELECT {COLUMNS} FROM {table} WHERE namespace = ? AND id = ?"),
            finish: format!(
                "UPDATE {table} SET state = ?, failures = ?, history = ?, updated_at = ?, \
                 expires_at = ? {fence}"
            ),
            renew: format!(
                "UPDATE {table} SET lease_until = ?, expires_at = GREATEST(expires_at, ?) {fence}"
            ),
            delete: format!("DELETE FROM {table} WHERE namespace = ? AND id = ? AND NOT {live}"),
            probe: format!(
                "SELECT CAST(state = 'in_progress' AND lease_until > ? AS SIGNED) FROM {table} \
                 WHERE namespace = ? AND id = ?"
            ),
            purge: format!(
                "DELETE FROM {table} WHERE expires_at <= ? AND NOT {live} \
                 ORDER BY expires_at LIMIT ?"
            ),
            stuck: format!(
                "SELECT {COLUMNS} FROM {table} WHERE state = 'in_progress' \
                 AND lease_until <= ? ORDER BY lease_until LIMIT ?"
            ),
        }
    }
}

impl MySqlStore {
    /// The table name used unless [`MySqlStore::with_table`] chooses another.
    pub const DEFAULT_TABLE: &'static str = "webhook_guard_records";

    /// A store on `pool`, in the table [`MySqlStore::DEFAULT_TABLE`].
    pub fn new(pool: MySqlPool) -> Self {
        Self::build(pool, Self::DEFAULT_TABLE)
    }

    /// Connects a pool with sqlx's defaults to `url`
    /// (`mysql://user:password@host:3306/database`) and returns a store on it.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the server cannot be reached,
    /// [`StoreError::Backend`] for a bad URL or refused credentials.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = MySqlPool::connect(url).await.map_err(map_err)?;
        Ok(Self::new(pool))
    }

    /// The same store in the table `table`.
    ///
    /// # Errors
    /// [`InvalidTableName`] unless `table` matches `[A-Za-z_][A-Za-z0-9_]{0,62}`.
    pub fn with_table(self, table: &str) -> Result<Self, InvalidTableName> {
        if !valid_table_name(table) {
            return Err(InvalidTableName(table.to_owned()));
        }
        Ok(Self::build(self.pool, table))
    }

    fn build(pool: MySqlPool, table: &str) -> Self {
        Self {
            pool,
            table: table.into(),
            sql: Arc::new(Sql::new(table)),
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
        &self.sql.claim
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
        Ok(())
    }

    async fn run_claim(&self, req: &ClaimRequest<'_>) -> Result<MySqlQueryResult, StoreError> {
        retry_deadlocks(|| {
            let mut query = sqlx::query(&self.sql.claim);
            for param in &self.sql.claim_params {
                query = match param {
                    Param::Namespace => query.bind(req.key.namespace),
                    Param::Id => query.bind(req.key.id),
                    Param::Fingerprint => query.bind(&req.fingerprint.0[..]),
                    Param::Token => query.bind(req.token.as_i64()),
                    Param::Now => query.bind(millis(req.now)),
                    Param::LeaseUntil => query.bind(millis(req.lease_until)),
                    Param::ExpiresAt => query.bind(millis(req.expires_at)),
                };
            }
            query.execute(&self.pool)
        })
        .await
    }

    async fn fetch(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        let row = retry_deadlocks(|| {
            sqlx::query(&self.sql.get)
                .bind(key.namespace)
                .bind(key.id)
                .fetch_optional(&self.pool)
        })
        .await?;
        row.map(|row| record_from_row(&row)).transpose()
    }
}

/// The schema with `table` (already validated) for the default table name.
fn schema_for(table: &str) -> String {
    SCHEMA
        .trim_end()
        .replacen(MySqlStore::DEFAULT_TABLE, table, 1)
}

fn fresh_record(req: &ClaimRequest<'_>) -> Record {
    Record::new(
        req.key,
        RecordState::InProgress,
        req.fingerprint,
        req.token,
        1,
        0,
        req.lease_until,
        req.expires_at,
        req.now,
        req.now,
        Vec::new(),
    )
}

fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn text(bytes: Vec<u8>, column: &str) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|_| StoreError::Corrupt(format!("{column} is not UTF-8")))
}

fn record_from_row(row: &MySqlRow) -> Result<Record, StoreError> {
    let namespace = text(row.try_get(0).map_err(map_err)?, "namespace")?;
    let id = text(row.try_get(1).map_err(map_err)?, "id")?;
    // Read as bytes: sqlx takes any `_bin` collation for a binary type.
    let state = text(row.try_get(2).map_err(map_err)?, "state")?;
    let state = RecordState::parse(&state)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown state {state:?}")))?;
    let fingerprint: Vec<u8> = row.try_get(3).map_err(map_err)?;
    let fingerprint = <[u8; 32]>::try_from(fingerprint.as_slice())
        .map(Fingerprint)
        .map_err(|_| StoreError::Corrupt("fingerprint is not 32 bytes".into()))?;
    let history = text(row.try_get(11).map_err(map_err)?, "history")?;
    Ok(Record::new(
        Key::new(&namespace, &id),
        state,
        fingerprint,
        FencingToken::from_i64(row.try_get(4).map_err(map_err)?),
        row.try_get(5).map_err(map_err)?,
        row.try_get(6).map_err(map_err)?,
        time(row.try_get(7).map_err(map_err)?),
        time(row.try_get(8).map_err(map_err)?),
        time(row.try_get(9).map_err(map_err)?),
        time(row.try_get(10).map_err(map_err)?),
        decode_history(&history)?,
    ))
}

/// MySQL / MariaDB server errors that mean the connection, not the statement, failed.
const UNAVAILABLE_CODES: [u16; 4] = [
    1040, // ER_CON_COUNT_ERROR: too many connections
    1053, // ER_SERVER_SHUTDOWN
    1927, // ER_CONNECTION_KILLED (MariaDB)
    4031, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8.0.24+): disconnected by the server
];

fn server_error_number(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()
        .and_then(|e| e.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

/// Sorts a driver error into unreachable (the guard answers 503) or not.
pub(super) fn map_err(error: sqlx::Error) -> StoreError {
    let unavailable = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(_) => {
            server_error_number(&error).is_some_and(|n| UNAVAILABLE_CODES.contains(&n))
        }
        _ => false,
    };
    if unavailable {
        StoreError::unavailable(error)
    } else {
        StoreError::backend(error)
    }
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

#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
#[async_trait]
impl ProcessedStore for MySqlStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        for _ in 0..VANISHED_RETRIES {
            let done = self.run_claim(request).await?;
            match (done.last_insert_id(), done.rows_affected()) {
                (0, 1) | (CODE_FRESH, _) => return Ok(Claim::Acquired(fresh_record(request))),
                (CODE_UNCHANGED | CODE_TAKEOVER, _) => {}
                (code, rows) => {
                    return Err(StoreError::Corrupt(format!(
                        "claim answered code {code} with {rows} rows affected"
                    )))
                }
            }
            match self.fetch(request.key).await? {
                Some(record) if record.token == request.token => {
                    return Ok(Claim::Acquired(record))
                }
                Some(record) => return Ok(Claim::Existing(record)),
                None => continue, // purged or deleted since: claim again
            }
        }
        Err(StoreError::backend(format!(
            "the record of {} vanished {VANISHED_RETRIES} times during a claim",
            request.key
        )))
    }

    async fn finish(
        &self,
        key: Key<'_>,
        token: FencingToken,
        finish: &Finish<'_>,
    ) -> Result<Fence, StoreError> {
        let history = if finish.history.is_empty() {
            String::new()
        } else {
            encode_history(finish.history)
        };
        let done = retry_deadlocks(|| {
            sqlx::query(&self.sql.finish)
                .bind(finish.state.as_str())
                .bind(finish.failures)
                .bind(history.as_str())
                .bind(millis(finish.now))
                .bind(millis(finish.expires_at))
                .bind(key.namespace)
                .bind(key.id)
                .bind(token.as_i64())
                .execute(&self.pool)
        })
        .await?;
        Ok(fence(&done))
    }

    async fn renew(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        let done = retry_deadlocks(|| {
            sqlx::query(&self.sql.renew)
                .bind(millis(lease_until))
                .bind(millis(expires_at))
                .bind(key.namespace)
                .bind(key.id)
                .bind(token.as_i64())
                .execute(&self.pool)
        })
        .await?;
        Ok(fence(&done))
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        self.fetch(key).await
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        let now = millis(now);
        for _ in 0..VANISHED_RETRIES {
            let done = retry_deadlocks(|| {
                sqlx::query(&self.sql.delete)
                    .bind(key.namespace)
                    .bind(key.id)
                    .bind(now)
                    .execute(&self.pool)
            })
            .await?;
            if done.rows_affected() > 0 {
                return Ok(Deleted::Removed);
            }
            let live: Option<i64> = retry_deadlocks(|| {
                sqlx::query_scalar(&self.sql.probe)
                    .bind(now)
                    .bind(key.namespace)
                    .bind(key.id)
                    .fetch_optional(&self.pool)
            })
            .await?;
            match live {
                None => return Ok(Deleted::NotFound),
                Some(0) => continue, // its lease ended in between: try again
                Some(_) => return Ok(Deleted::LeaseHeld),
            }
        }
        Err(StoreError::backend(format!(
            "the record of {key} changed {VANISHED_RETRIES} times during a delete"
        )))
    }

    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let now = millis(now);
        let mut removed = 0u64;
        let mut left = limit;
        while left > 0 {
            let batch = left.min(PURGE_BATCH);
            let done = retry_deadlocks(|| {
                sqlx::query(&self.sql.purge)
                    .bind(now)
                    .bind(now)
                    .bind(batch as u64)
                    .execute(&self.pool)
            })
            .await?;
            let n = done.rows_affected();
            removed += n;
            left -= (n as usize).min(left);
            if n < batch as u64 {
                break;
            }
        }
        Ok(removed)
    }

    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = retry_deadlocks(|| {
            sqlx::query(&self.sql.stuck)
                .bind(millis(now))
                .bind(limit as u64)
                .fetch_all(&self.pool)
        })
        .await?;
        rows.iter().map(record_from_row).collect()
    }
}

fn fence(done: &MySqlQueryResult) -> Fence {
    if done.rows_affected() > 0 {
        Fence::Applied
    } else {
        Fence::LeaseLost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_validated() {
        for ok in ["t", "_x", "webhook_guard_records", "A1_b2", &"a".repeat(63)] {
            assert!(valid_table_name(ok), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "a;drop",
            "db.t",
            "`t`",
            "é",
            &"a".repeat(64),
        ] {
            assert!(!valid_table_name(bad), "{bad}");
        }
    }

    #[test]
    fn schema_names_the_table_once() {
        let sql = schema_for("my_records");
        assert!(sql.starts_with("CREATE TABLE IF NOT EXISTS my_records ("));
        assert!(!sql.contains(MySqlStore::DEFAULT_TABLE));
        assert!(sql.contains("PRIMARY KEY (namespace, id)"));
        assert!(sql.contains("KEY by_expiry (expires_at)"));
        assert!(sql.contains("KEY by_lease (state, lease_until)"));
    }

    #[test]
    fn claim_statement_binds_every_placeholder() {
        let sql = Sql::new("t");
        assert_eq!(sql.claim.matches('?').count(), sql.claim_params.len());
        assert!(!sql.claim.contains(':'), "{}", sql.claim);
        assert!(!sql.claim.contains('{'), "{}", sql.claim);
    }
}
