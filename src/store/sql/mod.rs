//! What the sqlx-backed stores share: table names, row decoding, error mapping, and
//! the inbox and ordering statements of the PostgreSQL and SQLite stores.
// The MySQL store uses the table names and the inbox and ordering rows only.
#![cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]

use std::fmt;

use chrono::{DateTime, Utc};

pub(crate) mod claim_batch;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) mod impls;

use crate::inbox::{InboxEvent, InboxState};
use crate::meta::EventMeta;
use crate::ordering::{ObjectRecord, ObjectStatus};
use crate::store::{
    decode_history, encode_history, FailureNote, FencingToken, Fingerprint, Key, Record,
};
use crate::store::{RecordState, Recorded, StoreError};

/// The table the SQL stores use unless told otherwise.
pub const DEFAULT_TABLE: &str = "webhook_guard_records";

/// How a store purges expired rows: how many rows one statement removes at most,
/// and how long the purge rests after each full statement, so that claims running
/// meanwhile find the database (its write lock, its log, its CPU) free about half of
/// the time or more, and wait for at most one statement. The rest follows the
/// last full statement of a call too: the sweeper calls again right away.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PurgePace {
    /// Rows per statement (each statement is its own short transaction).
    pub(crate) rows: usize,
    /// The rest after a full statement, as a multiple of the time it took.
    pub(crate) rest: f64,
}

impl PurgePace {
    /// Rests after a full statement that took `took` (every SQL store runs on tokio,
    /// as sqlx does here).
    pub(crate) async fn rest_after(self, took: std::time::Duration) {
        let pause = took.mul_f64(self.rest);
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

/// A table name refused by a SQL store: it must match `[A-Za-z_][A-Za-z0-9_]{0,62}`.
///
/// Table names are written into the SQL the store prepares, so only plain identifiers
/// are accepted; nothing else is ever interpolated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid table name {name:?}: expected 1 to 63 ASCII letters, digits or '_', not starting with a digit")]
pub struct InvalidTableName {
    name: String,
}

impl InvalidTableName {
    /// The refused name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A validated table name.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct TableName(String);

impl TableName {
    pub(crate) fn new(name: &str) -> Result<Self, InvalidTableName> {
        let bytes = name.as_bytes();
        let ok = !bytes.is_empty()
            && bytes.len() <= 63
            && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'_');
        if ok {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidTableName {
                name: name.to_owned(),
            })
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The table name quoted, so that reserved words work too.
    pub(crate) fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// A quoted index name derived from the table name that fits in 63 bytes
    /// (PostgreSQL silently truncates longer identifiers, which could make two
    /// indexes collide): long table names are shortened and tagged with a hash.
    pub(crate) fn index(&self, suffix: &str) -> String {
        self.derived(suffix).quoted()
    }

    /// The name `<table>_<suffix>` for a companion table or an index, shortened and
    /// tagged with a hash of the whole name when it would not fit in 63 bytes.
    pub(crate) fn derived(&self, suffix: &str) -> Self {
        let plain = format!("{}_{suffix}", self.0);
        if plain.len() <= 63 {
            return Self(plain);
        }
        let keep = 63 - 1 - suffix.len() - 9;
        Self(format!(
            "{}_{:08x}_{suffix}",
            &self.0[..keep],
            fnv1a(&self.0)
        ))
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Milliseconds since the epoch, as the SQL stores keep times.
pub(crate) fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub(crate) use super::ceil_millis;

pub(crate) fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A count as an SQL `INTEGER` (saturating).
pub(crate) fn count(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A limit as an SQL `BIGINT` (saturating).
pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The history as stored: empty text for no failures (most records), else JSON.
pub(crate) fn history_text(history: &[FailureNote]) -> String {
    if history.is_empty() {
        String::new()
    } else {
        encode_history(history)
    }
}

/// The columns every query returns, in this order, after the key.
pub(crate) const COLUMNS: &str = "state, fingerprint, token, attempts, failures, \
     lease_until, expires_at, created_at, updated_at, history";

/// One row as read from the database, before checking.
pub(crate) struct RawRecord {
    pub(crate) state: String,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) token: i64,
    pub(crate) attempts: i64,
    pub(crate) failures: i64,
    pub(crate) lease_until: i64,
    pub(crate) expires_at: i64,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) history: String,
}

impl RawRecord {
    pub(crate) fn into_record(self, key: Key<'_>) -> Result<Record, StoreError> {
        let state = RecordState::parse(&self.state)
            .ok_or_else(|| StoreError::Corrupt(format!("{key}: unknown state {:?}", self.state)))?;
        let fingerprint = <[u8; 32]>::try_from(self.fingerprint.as_slice())
            .map(Fingerprint)
            .map_err(|_| {
                StoreError::Corrupt(format!(
                    "{key}: fingerprint of {} bytes",
                    self.fingerprint.len()
                ))
            })?;
        let counter = |name: &str, v: i64| {
            u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{key}: {name} = {v}")))
        };
        Ok(Record::new(
            key,
            state,
            fingerprint,
            FencingToken::from_i64(self.token),
            counter("attempts", self.attempts)?,
            counter("failures", self.failures)?,
            time(self.lease_until),
            time(self.expires_at),
            time(self.created_at),
            time(self.updated_at),
            decode_history(&self.history)?,
        ))
    }
}

/// A row of the PostgreSQL or SQLite stores, read by column position with the
/// column types the schema gives it.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) trait SqlRow {
    fn text(&self, at: usize) -> Result<String, sqlx::Error>;
    fn optional_text(&self, at: usize) -> Result<Option<String>, sqlx::Error>;
    fn bytes(&self, at: usize) -> Result<Vec<u8>, sqlx::Error>;
    /// A 64-bit integer column: times and tokens.
    fn bigint(&self, at: usize) -> Result<i64, sqlx::Error>;
    fn optional_bigint(&self, at: usize) -> Result<Option<i64>, sqlx::Error>;
    /// An `INTEGER` column: attempts and failures.
    fn integer(&self, at: usize) -> Result<i64, sqlx::Error>;
}

/// How a database decodes an `INTEGER` column.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) trait IntegerColumn: sqlx::Database {
    /// `INT4` on PostgreSQL; SQLite keeps every integer in 64 bits.
    type Integer: Into<i64> + for<'r> sqlx::Decode<'r, Self> + sqlx::Type<Self>;
}

#[cfg(feature = "postgres")]
impl IntegerColumn for sqlx::Postgres {
    type Integer = i32;
}

#[cfg(feature = "sqlite")]
impl IntegerColumn for sqlx::Sqlite {
    type Integer = i64;
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<R> SqlRow for R
where
    R: sqlx::Row,
    R::Database: IntegerColumn,
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn text(&self, at: usize) -> Result<String, sqlx::Error> {
        self.try_get(at)
    }

    fn optional_text(&self, at: usize) -> Result<Option<String>, sqlx::Error> {
        self.try_get(at)
    }

    fn bytes(&self, at: usize) -> Result<Vec<u8>, sqlx::Error> {
        self.try_get(at)
    }

    fn bigint(&self, at: usize) -> Result<i64, sqlx::Error> {
        self.try_get(at)
    }

    fn optional_bigint(&self, at: usize) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(at)
    }

    fn integer(&self, at: usize) -> Result<i64, sqlx::Error> {
        self.try_get::<<R::Database as IntegerColumn>::Integer, _>(at)
            .map(Into::into)
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl RawRecord {
    /// Reads the [`COLUMNS`] starting at column `at`.
    pub(crate) fn read(row: &impl SqlRow, at: usize) -> Result<Self, sqlx::Error> {
        Ok(Self {
            state: row.text(at)?,
            fingerprint: row.bytes(at + 1)?,
            token: row.bigint(at + 2)?,
            attempts: row.integer(at + 3)?,
            failures: row.integer(at + 4)?,
            lease_until: row.bigint(at + 5)?,
            expires_at: row.bigint(at + 6)?,
            created_at: row.bigint(at + 7)?,
            updated_at: row.bigint(at + 8)?,
            history: row.text(at + 9)?,
        })
    }
}

/// A fenced update's outcome: it applied when it changed the one row it names.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn fence(rows_affected: u64) -> super::Fence {
    if rows_affected == 1 {
        super::Fence::Applied
    } else {
        super::Fence::LeaseLost
    }
}

/// What a store whose database orders concurrent writes itself holds while it
/// writes: nothing.
#[cfg(feature = "postgres")]
pub(crate) struct Ungated;

/// Maps a driver error: unreachable (I/O, TLS, pool exhausted or closed, broken
/// protocol stream, or a database code that `db_unavailable` recognises) becomes
/// [`StoreError::Unavailable`], anything else [`StoreError::Backend`]. The driver's
/// error is kept as the source either way.
pub(crate) fn map_error(
    error: sqlx::Error,
    db_unavailable: fn(&dyn sqlx::error::DatabaseError) -> bool,
) -> StoreError {
    let unavailable = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db_unavailable(db.as_ref()),
        _ => false,
    };
    if unavailable {
        StoreError::unavailable(error)
    } else {
        StoreError::backend(error)
    }
}

/// The contract's fingerprint test ([`Fingerprint::matches`]) in SQL, of the stored
/// row `r` and the inserted one, with `unknown` the parameter holding
/// [`Fingerprint::UNKNOWN`].
fn matches(unknown: &str) -> String {
    format!(
        "(r.fingerprint = excluded.fingerprint OR r.fingerprint = {unknown} \
         OR excluded.fingerprint = {unknown})"
    )
}

/// The answer of a transactional record refused by the stored record with
/// `stored` fingerprint in `state`: a refused record is either finished or held by
/// a live lease (an expired, failed or abandoned one is taken over).
pub(crate) fn recorded(
    stored: &[u8],
    state: &[u8],
    fp: Fingerprint,
    key: Key<'_>,
) -> Result<Recorded, StoreError> {
    Ok(if !fingerprint(stored, &key)?.matches(&fp) {
        Recorded::Conflict
    } else if state == RecordState::InProgress.as_str().as_bytes() {
        Recorded::InProgress
    } else {
        Recorded::Duplicate
    })
}

/// A record that vanished or changed between a refused claim and the read that
/// follows it, three times in a row (a purge, delete or finish racing with the
/// claim).
pub(crate) fn vanished(key: Key<'_>) -> StoreError {
    StoreError::backend(format!(
        "{key}: the record changed under three claim attempts in a row"
    ))
}

/// How the inbox purges its settled events: statements of up to 1,000 rows, back
/// to back.
pub(crate) const SETTLED_PURGE: PurgePace = PurgePace {
    rows: 1000,
    rest: 0.0,
};

/// Runs `batch(n)` with `n <= pace.rows` until `limit` rows are gone or a batch
/// comes back short. Every batch is its own short statement (autocommit); after
/// each full one the purge rests (see [`PurgePace`]).
pub(crate) async fn purge_in_batches<F, Fut>(
    limit: usize,
    pace: PurgePace,
    mut batch: F,
) -> Result<u64, StoreError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<u64, StoreError>>,
{
    let mut removed = 0u64;
    let mut left = limit;
    while left > 0 {
        let n = left.min(pace.rows.max(1));
        let started = std::time::Instant::now();
        let done = match batch(n).await {
            Ok(done) => done,
            // What earlier statements removed is gone: say so (the next call goes
            // on from there); with nothing removed yet, the error.
            Err(e) if removed > 0 => {
                tracing::warn!(error = %e, removed, "a purge statement failed; answering what the earlier ones removed");
                break;
            }
            Err(e) => return Err(e),
        };
        removed += done;
        left -= usize::try_from(done).unwrap_or(n).min(n);
        if done < n as u64 {
            break;
        }
        pace.rest_after(started.elapsed()).await;
    }
    Ok(removed)
}

/// The inbox columns every inbox read returns, in this order.
pub(crate) const EVENT_COLUMNS: &str = "namespace, id, fingerprint, event_type, created_at, \
     object, family, payload, state, attempts, token, lease_until, next_attempt_at, last_error, \
     received_at, updated_at, expires_at";

/// One inbox row as read from the database ([`EVENT_COLUMNS`]), before checking.
pub(crate) struct RawEvent {
    pub(crate) namespace: String,
    pub(crate) id: String,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) event_type: Option<String>,
    pub(crate) created_at: Option<i64>,
    pub(crate) object: Option<String>,
    pub(crate) family: Option<String>,
    pub(crate) payload: Vec<u8>,
    pub(crate) state: String,
    pub(crate) attempts: i64,
    pub(crate) token: i64,
    pub(crate) lease_until: i64,
    pub(crate) next_attempt_at: i64,
    pub(crate) last_error: Option<String>,
    pub(crate) received_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) expires_at: i64,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl RawEvent {
    /// Reads the [`EVENT_COLUMNS`].
    pub(crate) fn read(row: &impl SqlRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            namespace: row.text(0)?,
            id: row.text(1)?,
            fingerprint: row.bytes(2)?,
            event_type: row.optional_text(3)?,
            created_at: row.optional_bigint(4)?,
            object: row.optional_text(5)?,
            family: row.optional_text(6)?,
            payload: row.bytes(7)?,
            state: row.text(8)?,
            attempts: row.integer(9)?,
            token: row.bigint(10)?,
            lease_until: row.bigint(11)?,
            next_attempt_at: row.bigint(12)?,
            last_error: row.optional_text(13)?,
            received_at: row.bigint(14)?,
            updated_at: row.bigint(15)?,
            expires_at: row.bigint(16)?,
        })
    }
}

/// A stored fingerprint, checked to be 32 bytes.
pub(crate) fn fingerprint(
    bytes: &[u8],
    what: &dyn fmt::Display,
) -> Result<Fingerprint, StoreError> {
    <[u8; 32]>::try_from(bytes)
        .map(Fingerprint)
        .map_err(|_| StoreError::Corrupt(format!("{what}: fingerprint of {} bytes", bytes.len())))
}

/// A stored inbox state name.
pub(crate) fn inbox_state(text: &str, what: &dyn fmt::Display) -> Result<InboxState, StoreError> {
    InboxState::parse(text)
        .ok_or_else(|| StoreError::Corrupt(format!("{what}: unknown inbox state {text:?}")))
}

impl RawEvent {
    pub(crate) fn into_event(self) -> Result<InboxEvent, StoreError> {
        let what = Key::new(&self.namespace, &self.id).to_string();
        let fingerprint = fingerprint(&self.fingerprint, &what)?;
        let state = inbox_state(&self.state, &what)?;
        let attempts = u32::try_from(self.attempts)
            .map_err(|_| StoreError::Corrupt(format!("{what}: attempts = {}", self.attempts)))?;
        Ok(InboxEvent {
            namespace: self.namespace,
            id: self.id,
            fingerprint,
            meta: EventMeta {
                event_type: self.event_type,
                created_at: self.created_at.map(time),
                object: self.object,
                family: self.family,
            },
            payload: self.payload,
            state,
            attempts,
            token: FencingToken::from_i64(self.token),
            lease_until: time(self.lease_until),
            next_attempt_at: time(self.next_attempt_at),
            last_error: self.last_error,
            received_at: time(self.received_at),
            updated_at: time(self.updated_at),
            expires_at: time(self.expires_at),
        })
    }
}

/// The ordering columns every object read returns, in this order.
pub(crate) const OBJECT_COLUMNS: &str = "namespace, object, family, newest, status, updated_at";

/// One ordering row as read from the database ([`OBJECT_COLUMNS`]), before checking.
pub(crate) struct RawObject {
    pub(crate) namespace: String,
    pub(crate) object: String,
    pub(crate) family: String,
    pub(crate) newest: i64,
    pub(crate) status: String,
    pub(crate) updated_at: i64,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl RawObject {
    /// Reads the [`OBJECT_COLUMNS`].
    pub(crate) fn read(row: &impl SqlRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            namespace: row.text(0)?,
            object: row.text(1)?,
            family: row.text(2)?,
            newest: row.bigint(3)?,
            status: row.text(4)?,
            updated_at: row.bigint(5)?,
        })
    }
}

impl RawObject {
    pub(crate) fn into_record(self) -> Result<ObjectRecord, StoreError> {
        let status = ObjectStatus::parse(&self.status).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "{}/{}/{}: unknown object status {:?}",
                self.namespace, self.object, self.family, self.status
            ))
        })?;
        Ok(ObjectRecord {
            namespace: self.namespace,
            object: self.object,
            family: self.family,
            newest: time(self.newest),
            status,
            updated_at: time(self.updated_at),
        })
    }
}

/// The claim's upsert into table `t`: the new rows come from `rows` (`VALUES` or a
/// `SELECT`), `now` is the claim's time, `unknown` the bind of the unknown
/// fingerprint, and the answered row has `key` (empty, or the columns before the
/// record's: the key's, and SQLite's batch its "claimed" 1) and then the
/// [`COLUMNS`].
/// "Expired" frees the record whatever its body, except from a holder whose lease
/// is still live.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn claim_upsert(
    t: &str,
    greatest: &str,
    rows: &str,
    now: &str,
    unknown: &str,
    key: &str,
) -> String {
    let expired = format!(
        "(r.expires_at <= {now} AND NOT (r.state = 'in_progress' AND r.lease_until > {now}))"
    );
    format!(
        "INSERT INTO {t} AS r (namespace, id, state, fingerprint, token, attempts, failures, \
             lease_until, expires_at, created_at, updated_at, history) \
         {rows} \
         ON CONFLICT (namespace, id) DO UPDATE SET \
             state = 'in_progress', \
             fingerprint = CASE WHEN {expired} OR r.fingerprint = {unknown} \
                 THEN excluded.fingerprint ELSE r.fingerprint END, \
             token = excluded.token, \
             lease_until = excluded.lease_until, \
             updated_at = excluded.updated_at, \
             attempts = CASE WHEN {expired} THEN 1 ELSE r.attempts + 1 END, \
             failures = CASE WHEN {expired} THEN 0 \
                 WHEN r.state = 'in_progress' THEN r.failures + 1 ELSE r.failures END, \
             expires_at = CASE WHEN {expired} THEN excluded.expires_at \
                 ELSE {greatest}(r.expires_at, excluded.expires_at) END, \
             created_at = CASE WHEN {expired} THEN excluded.created_at ELSE r.created_at END, \
             history = CASE WHEN {expired} THEN '' ELSE r.history END \
         WHERE {expired} \
             OR ({matches} \
                 AND (r.state = 'failed' OR (r.state = 'in_progress' AND r.lease_until <= {now}))) \
         RETURNING {key}{COLUMNS}",
        matches = matches(unknown),
    )
}

/// Where a PostgreSQL and an SQLite statement differ.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[cfg_attr(not(all(feature = "postgres", feature = "sqlite")), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    Sqlite,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl Dialect {
    /// The column types: a key column, a byte string, a 64-bit integer.
    fn types(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Postgres => ("TEXT COLLATE \"C\" NOT NULL", "BYTEA", "BIGINT"),
            Self::Sqlite => ("TEXT    NOT NULL", "BLOB", "INTEGER"),
        }
    }

    /// The larger of two values.
    fn greatest(self) -> &'static str {
        match self {
            Self::Postgres => "GREATEST",
            Self::Sqlite => "MAX",
        }
    }

    /// How a bounded `UPDATE` or `DELETE` names the rows its sub-select picked: the
    /// row in the outer statement, the row in the sub-select, and the locking clause
    /// after its `LIMIT`. PostgreSQL skips rows a concurrent statement has locked,
    /// SQLite has one writer.
    fn pick(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Postgres => (
                "(namespace, id)",
                "namespace, id",
                " FOR UPDATE SKIP LOCKED",
            ),
            Self::Sqlite => ("rowid", "rowid", ""),
        }
    }

    /// A statement written with `$n` binds, as this dialect reads it (`?n` on SQLite).
    fn binds(self, statement: &mut String) {
        if self == Self::Sqlite {
            *statement = statement.replace('$', "?");
        }
    }
}

/// Every statement of the PostgreSQL and SQLite stores, built once from the
/// validated table name.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) table: TableName,
    /// The whole schema: the dedup table, the inbox and the ordering ledger.
    pub(crate) schema: String,
    pub(crate) claim: String,
    /// The claim of many ids in one statement (PostgreSQL; `None` on SQLite).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) claim_batch: Option<String>,
    pub(crate) get: String,
    pub(crate) finish: String,
    pub(crate) renew: String,
    pub(crate) delete: String,
    pub(crate) purge: String,
    pub(crate) stuck: String,
    pub(crate) queue: QueueSql,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl Statements {
    /// SQLite's claim of `n` ids at once: the claim upsert with one `VALUES` row per
    /// id, bound `?1` … `?{7n}` (namespace, id, fingerprint, token, lease_until,
    /// expires_at, now of each row in turn), then `?{7n + 1}` the unknown
    /// fingerprint; each answered row, all claimed, says so (1), then names its key
    /// before the record's columns.
    #[cfg(feature = "sqlite")]
    pub(crate) fn claim_values(&self, n: usize) -> String {
        let rows: Vec<String> = (0..n)
            .map(|i| {
                let a = 7 * i + 1;
                format!(
                    "(?{a}, ?{}, 'in_progress', ?{}, ?{}, 1, 0, ?{}, ?{}, ?{}, ?{}, '')",
                    a + 1,
                    a + 2,
                    a + 3,
                    a + 4,
                    a + 5,
                    a + 6,
                    a + 6
                )
            })
            .collect();
        claim_upsert(
            &self.table.quoted(),
            Dialect::Sqlite.greatest(),
            &format!("VALUES {}", rows.join(", ")),
            "excluded.updated_at",
            &format!("?{}", 7 * n + 1),
            "1, namespace, id, ",
        )
    }

    pub(crate) fn new(table: TableName, dialect: Dialect) -> Self {
        let t = table.quoted();
        let queue = QueueSql::new(&table, dialect);
        let (key, bytes, int) = dialect.types();
        let mut schema = format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n    \
                 namespace   {key},\n    \
                 id          {key},\n    \
                 state       TEXT    NOT NULL,\n    \
                 fingerprint {bytes:<7} NOT NULL,\n    \
                 token       {int:<7} NOT NULL,\n    \
                 attempts    INTEGER NOT NULL,\n    \
                 failures    INTEGER NOT NULL,\n    \
                 lease_until {int:<7} NOT NULL,\n    \
                 expires_at  {int:<7} NOT NULL,\n    \
                 created_at  {int:<7} NOT NULL,\n    \
                 updated_at  {int:<7} NOT NULL,\n    \
                 history     TEXT    NOT NULL DEFAULT '',\n    \
                 PRIMARY KEY (namespace, id)\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {exp}\n    ON {t} (expires_at);\n\
             CREATE INDEX IF NOT EXISTS {stuck}\n    ON {t} (lease_until) WHERE state = 'in_progress';\n",
            exp = table.index("expires_at"),
            stuck = table.index("stuck"),
        );
        schema.push_str(&queue.schema);
        let greatest = dialect.greatest();
        // $1 namespace, $2 id, $3 fingerprint, $4 token, $5 lease_until,
        // $6 expires_at, $7 now, $8 the unknown fingerprint.
        let claim = claim_upsert(
            &t,
            greatest,
            "VALUES ($1, $2, 'in_progress', $3, $4, 1, 0, $5, $6, $7, $7, '')",
            "$7",
            "$8",
            "",
        );
        // The same for many ids at once (PostgreSQL only): $1 … $7 are arrays of the
        // single claim's values, one element per id, `now` read from each inserted
        // row; the rows are inserted in the arrays' order. It waits at most 250 ms
        // for a row lock (`lock_timeout`, set for its own transaction only, before
        // its first row is inserted: the condition names no column, so it is
        // evaluated once, before the scan yields a row). It answers the rows it
        // claimed and, for the keys it did not, the stored rows as its snapshot has
        // them (the snapshot does not see its own changes, hence `NOT EXISTS`);
        // each row says first whether it was claimed (1) or not (0), then names
        // its key. The lookup unnests the keys again rather than sharing the
        // values with the insert through a CTE, whose materialization cost
        // processed claims a few per cent.
        let claim_batch = (dialect == Dialect::Postgres).then(|| {
            let upsert = claim_upsert(
                &t,
                greatest,
                "SELECT ns, id, 'in_progress', fp, tok, 1, 0, lu, ex, nw, nw, '' \
                 FROM unnest($1::text[], $2::text[], $3::bytea[], $4::int8[], $5::int8[], \
                     $6::int8[], $7::int8[]) WITH ORDINALITY AS v(ns, id, fp, tok, lu, ex, nw, n) \
                 WHERE (SELECT set_config('lock_timeout', '250ms', true)) IS NOT NULL \
                 ORDER BY n",
                "excluded.updated_at",
                "$8",
                "namespace, id, ",
            );
            format!(
                "WITH up AS ({upsert}) \
                 SELECT 1, * FROM up \
                 UNION ALL \
                 SELECT 0, r.* FROM unnest($1::text[], $2::text[]) AS k(ns, vid) \
                     CROSS JOIN LATERAL (SELECT namespace, id, {COLUMNS} \
                     FROM {t} WHERE namespace = k.ns AND id = k.vid) AS r \
                 WHERE NOT EXISTS (SELECT 1 FROM up WHERE up.namespace = k.ns AND up.id = k.vid)"
            )
        });
        let get = format!("SELECT {COLUMNS} FROM {t} WHERE namespace = $1 AND id = $2");
        let fence = "namespace = $1 AND id = $2 AND state = 'in_progress' AND token = $3";
        let finish = format!(
            "UPDATE {t} SET state = $4, failures = $5, history = $6, updated_at = $7, \
                 expires_at = $8 WHERE {fence}"
        );
        let renew = format!(
            "UPDATE {t} SET lease_until = $4, expires_at = {greatest}(expires_at, $5) WHERE {fence}"
        );
        let delete = format!(
            "DELETE FROM {t} WHERE namespace = $1 AND id = $2 \
                 AND NOT (state = 'in_progress' AND lease_until > $3)"
        );
        // Oldest first, through the `expires_at` index (the `ORDER BY` keeps the planner
        // on it even when most of the table is expired: a sequential scan would walk
        // the dead rows of earlier batches again and again).
        let due = "expires_at <= $1 AND NOT (state = 'in_progress' AND lease_until > $1)";
        let purge = match dialect {
            // The picked rows are locked (`SKIP LOCKED`: a row a claim holds is left
            // for the next purge), then deleted by their physical address, which a
            // locked row keeps until the statement ends: no second lookup through
            // the primary key. `set_config(…, true)` turns `synchronous_commit` off
            // for this statement's own transaction only: its commit does not wait
            // for a WAL flush. A purge lost in a crash is redone by the next one, and
            // every later synchronous commit (a claim's) flushes it anyway.
            Dialect::Postgres => format!(
                "DELETE FROM {t} WHERE ctid = ANY(ARRAY(\
                     SELECT ctid FROM {t} WHERE {due} \
                     ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)) \
                 AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL"
            ),
            // One writer at a time: nothing to lock.
            Dialect::Sqlite => format!(
                "DELETE FROM {t} WHERE rowid IN (\
                     SELECT rowid FROM {t} WHERE {due} ORDER BY expires_at LIMIT $2)"
            ),
        };
        let stuck = format!(
            "SELECT namespace, id, {COLUMNS} FROM {t} \
             WHERE state = 'in_progress' AND lease_until <= $1 \
             ORDER BY lease_until LIMIT $2"
        );
        let mut sql = Self {
            table,
            schema,
            claim,
            claim_batch,
            get,
            finish,
            renew,
            delete,
            purge,
            stuck,
            queue,
        };
        for s in [
            &mut sql.claim,
            &mut sql.get,
            &mut sql.finish,
            &mut sql.renew,
            &mut sql.delete,
            &mut sql.purge,
            &mut sql.stuck,
        ] {
            dialect.binds(s);
        }
        sql
    }
}

/// The inbox, ordering and transactional statements of the PostgreSQL and SQLite
/// stores, written once with `$n` binds (SQLite reads them as `?n`).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Debug)]
pub(crate) struct QueueSql {
    /// `CREATE TABLE` and `CREATE INDEX` for the inbox and the ordering ledger.
    pub(crate) schema: String,
    pub(crate) enqueue: String,
    pub(crate) existing: String,
    pub(crate) lease: String,
    pub(crate) settle: String,
    pub(crate) renew: String,
    pub(crate) get: String,
    pub(crate) purge: String,
    pub(crate) observe: String,
    pub(crate) newest: String,
    pub(crate) settle_object: String,
    pub(crate) mark_object: String,
    pub(crate) mark_if_failed: String,
    pub(crate) get_object: String,
    pub(crate) failed: String,
    pub(crate) record: String,
    pub(crate) recorded: String,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl QueueSql {
    /// The statements for the dedup table `table`, its inbox `<table>_inbox` and its
    /// ordering ledger `<table>_objects`.
    pub(crate) fn new(table: &TableName, dialect: Dialect) -> Self {
        let (key, bytes, int) = dialect.types();
        let records = table.quoted();
        let inbox = table.derived("inbox");
        let objects = table.derived("objects");
        let (i, o) = (inbox.quoted(), objects.quoted());
        let schema = format!(
            "CREATE TABLE IF NOT EXISTS {i} (\n    \
                 namespace       {key},\n    \
                 id              {key},\n    \
                 fingerprint     {bytes:<7} NOT NULL,\n    \
                 event_type      TEXT,\n    \
                 created_at      {int},\n    \
                 object          TEXT,\n    \
                 family          TEXT,\n    \
                 payload         {bytes:<7} NOT NULL,\n    \
                 state           TEXT    NOT NULL,\n    \
                 attempts        INTEGER NOT NULL,\n    \
                 token           {int:<7} NOT NULL,\n    \
                 lease_until     {int:<7} NOT NULL,\n    \
                 next_attempt_at {int:<7} NOT NULL,\n    \
                 due_at          {int},\n    \
                 last_error      TEXT,\n    \
                 received_at     {int:<7} NOT NULL,\n    \
                 updated_at      {int:<7} NOT NULL,\n    \
                 expires_at      {int:<7} NOT NULL,\n    \
                 PRIMARY KEY (namespace, id)\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {due}\n    \
                 ON {i} (namespace, due_at) WHERE due_at IS NOT NULL;\n\
             CREATE INDEX IF NOT EXISTS {settled}\n    \
                 ON {i} (expires_at) WHERE due_at IS NULL;\n\
             CREATE TABLE IF NOT EXISTS {o} (\n    \
                 namespace  {key},\n    \
                 object     {key},\n    \
                 family     {key},\n    \
                 newest     {int:<7} NOT NULL,\n    \
                 status     TEXT    NOT NULL,\n    \
                 updated_at {int:<7} NOT NULL,\n    \
                 PRIMARY KEY (namespace, object, family)\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {failed}\n    \
                 ON {o} (namespace, status, updated_at);\n",
            due = inbox.index("due"),
            settled = inbox.index("settled"),
            failed = objects.index("status"),
        );
        // $1 namespace, $2 id, $3 fingerprint, $4 event_type, $5 created_at, $6 object,
        // $7 family, $8 payload, $9 now, $10 expires_at. A settled, expired event is
        // replaced; anything else stays and the statement returns no row.
        let enqueue = format!(
            "INSERT INTO {i} AS e (namespace, id, fingerprint, event_type, created_at, object, \
                 family, payload, state, attempts, token, lease_until, next_attempt_at, due_at, \
                 last_error, received_at, updated_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', 0, 0, $9, $9, $9, NULL, $9, $9, $10) \
             ON CONFLICT (namespace, id) DO UPDATE SET \
                 fingerprint = excluded.fingerprint, event_type = excluded.event_type, \
                 created_at = excluded.created_at, object = excluded.object, \
                 family = excluded.family, payload = excluded.payload, state = 'pending', \
                 attempts = 0, token = 0, lease_until = excluded.lease_until, \
                 next_attempt_at = excluded.next_attempt_at, due_at = excluded.due_at, \
                 last_error = NULL, received_at = excluded.received_at, \
                 updated_at = excluded.updated_at, expires_at = excluded.expires_at \
             WHERE e.due_at IS NULL AND e.expires_at <= $9 \
             RETURNING state"
        );
        let existing =
            format!("SELECT fingerprint, state FROM {i} WHERE namespace = $1 AND id = $2");
        // $1 namespace, $2 now, $3 token, $4 lease_until, $5 limit. Oldest due first;
        // PostgreSQL skips rows a concurrent lease has locked, SQLite has one writer.
        let (pick, picked, locking) = dialect.pick();
        let lease = format!(
            "UPDATE {i} SET state = 'running', token = $3, attempts = attempts + 1, \
                 lease_until = $4, due_at = $4, updated_at = $2 \
             WHERE {pick} IN (SELECT {picked} FROM {i} \
                 WHERE namespace = $1 AND due_at IS NOT NULL AND due_at <= $2 \
                 ORDER BY due_at LIMIT $5{locking}) \
             RETURNING {EVENT_COLUMNS}"
        );
        let fence = "namespace = $1 AND id = $2 AND state = 'running' AND token = $3";
        // $4 state, $5 next_attempt_at, $6 error, $7 now, $8 expires_at, $9 1 to give
        // the attempt back, else 0.
        let settle = format!(
            "UPDATE {i} SET state = $4, next_attempt_at = $5, \
                 due_at = CASE $4 WHEN 'pending' THEN $5 WHEN 'running' THEN lease_until END, \
                 last_error = COALESCE($6, last_error), updated_at = $7, expires_at = $8, \
                 attempts = attempts - CASE WHEN attempts > 0 THEN $9 ELSE 0 END \
             WHERE {fence}"
        );
        let renew = format!("UPDATE {i} SET lease_until = $4, due_at = $4 WHERE {fence}");
        let get = format!("SELECT {EVENT_COLUMNS} FROM {i} WHERE namespace = $1 AND id = $2");
        // Oldest first: the `ORDER BY` keeps the planner on the partial index
        // `…_settled` even when most of the table has expired (as for the dedup
        // table's purge).
        let purge = format!(
            "DELETE FROM {i} WHERE {pick} IN (SELECT {picked} FROM {i} \
                 WHERE due_at IS NULL AND expires_at <= $1 ORDER BY expires_at LIMIT $2{locking})"
        );
        // $1 namespace, $2 object, $3 family, $4 created_at, $5 now.
        let object_key = "namespace = $1 AND object = $2 AND family = $3";
        let observe = format!(
            "INSERT INTO {o} AS o (namespace, object, family, newest, status, updated_at) \
             VALUES ($1, $2, $3, $4, 'pending', $5) \
             ON CONFLICT (namespace, object, family) DO UPDATE SET \
                 newest = excluded.newest, status = 'pending', updated_at = excluded.updated_at \
             WHERE excluded.newest > o.newest \
             RETURNING newest"
        );
        let newest = format!("SELECT newest FROM {o} WHERE {object_key}");
        let mark_object = format!(
            "UPDATE {o} SET status = $5, updated_at = $6 WHERE {object_key} AND newest = $4"
        );
        let settle_object = format!("{mark_object} AND status = 'pending'");
        let mark_if_failed = format!("{mark_object} AND status = 'failed' AND updated_at <= $7");
        let get_object = format!("SELECT {OBJECT_COLUMNS} FROM {o} WHERE {object_key}");
        let failed = format!(
            "SELECT {OBJECT_COLUMNS} FROM {o} \
             WHERE namespace = $1 AND status = 'failed' AND updated_at <= $2 \
             ORDER BY updated_at LIMIT $3"
        );
        // $1 namespace, $2 id, $3 fingerprint, $4 token, $5 now, $6 expires_at, $7 the
        // unknown fingerprint. Inserts a `completed` record; replaces an expired one, or
        // takes over one that failed or whose holder's lease ran out (matching
        // fingerprint); otherwise returns no row.
        let expired =
            "(r.expires_at <= $5 AND NOT (r.state = 'in_progress' AND r.lease_until > $5))";
        let record = format!(
            "INSERT INTO {records} AS r (namespace, id, state, fingerprint, token, attempts, \
                 failures, lease_until, expires_at, created_at, updated_at, history) \
             VALUES ($1, $2, 'completed', $3, $4, 1, 0, $5, $6, $5, $5, '') \
             ON CONFLICT (namespace, id) DO UPDATE SET \
                 state = 'completed', token = excluded.token, \
                 fingerprint = CASE WHEN {expired} OR r.fingerprint = $7 \
                     THEN excluded.fingerprint ELSE r.fingerprint END, \
                 attempts = CASE WHEN {expired} THEN 1 ELSE r.attempts + 1 END, \
                 failures = CASE WHEN {expired} THEN 0 \
                     WHEN r.state = 'in_progress' THEN r.failures + 1 ELSE r.failures END, \
                 lease_until = excluded.lease_until, \
                 expires_at = CASE WHEN {expired} OR r.expires_at < excluded.expires_at \
                     THEN excluded.expires_at ELSE r.expires_at END, \
                 created_at = CASE WHEN {expired} THEN excluded.created_at ELSE r.created_at END, \
                 updated_at = excluded.updated_at, \
                 history = CASE WHEN {expired} THEN '' ELSE r.history END \
             WHERE {expired} \
                 OR ({matches} \
                     AND (r.state = 'failed' OR (r.state = 'in_progress' AND r.lease_until <= $5))) \
             RETURNING state",
            matches = matches("$7"),
        );
        let recorded =
            format!("SELECT fingerprint, state FROM {records} WHERE namespace = $1 AND id = $2");
        let mut sql = Self {
            schema,
            enqueue,
            existing,
            lease,
            settle,
            renew,
            get,
            purge,
            observe,
            newest,
            settle_object,
            mark_object,
            mark_if_failed,
            get_object,
            failed,
            record,
            recorded,
        };
        for s in sql.statements_mut() {
            dialect.binds(s);
        }
        sql
    }

    fn statements_mut(&mut self) -> [&mut String; 16] {
        [
            &mut self.enqueue,
            &mut self.existing,
            &mut self.lease,
            &mut self.settle,
            &mut self.renew,
            &mut self.get,
            &mut self.purge,
            &mut self.observe,
            &mut self.newest,
            &mut self.settle_object,
            &mut self.mark_object,
            &mut self.mark_if_failed,
            &mut self.get_object,
            &mut self.failed,
            &mut self.record,
            &mut self.recorded,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A purge whose later statement fails answers what the earlier ones removed
    /// (they are gone); one whose first statement fails answers the error.
    #[tokio::test]
    async fn a_purge_failing_part_way_answers_what_it_removed() {
        let pace = PurgePace {
            rows: 10,
            rest: 0.0,
        };
        let calls = std::cell::Cell::new(0);
        let batch = |n: usize| {
            calls.set(calls.get() + 1);
            let call = calls.get();
            async move {
                match call {
                    1 | 2 => Ok(n as u64),
                    _ => Err(StoreError::unavailable("connection reset")),
                }
            }
        };
        assert_eq!(purge_in_batches(100, pace, batch).await.unwrap(), 20);
        let failing = |_: usize| async { Err::<u64, _>(StoreError::unavailable("down")) };
        assert!(purge_in_batches(100, pace, failing).await.is_err());
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["t", "_t", "webhook_guard_records", "T9_x", &"a".repeat(63)] {
            assert!(TableName::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "9t",
            "a-b",
            "a b",
            "a\"b",
            "a;drop",
            "é",
            "s.t",
            &"a".repeat(64),
        ] {
            let err = TableName::new(bad).unwrap_err();
            assert_eq!(err.name(), bad);
        }
    }

    #[test]
    fn index_names_fit_and_differ() {
        let short = TableName::new("records").unwrap();
        assert_eq!(short.index("expires_at"), "\"records_expires_at\"");
        let a = TableName::new(&format!("{}a", "x".repeat(62))).unwrap();
        let b = TableName::new(&format!("{}b", "x".repeat(62))).unwrap();
        let (ia, ib) = (a.index("expires_at"), b.index("expires_at"));
        assert!(ia.len() <= 65 && ib.len() <= 65, "{ia}");
        assert_ne!(ia, ib);
        assert_ne!(a.index("expires_at"), a.index("stuck"));
    }

    #[cfg(all(feature = "postgres", feature = "sqlite"))]
    #[test]
    fn statements_use_the_table_name() {
        for dialect in [Dialect::Postgres, Dialect::Sqlite] {
            let s = Statements::new(TableName::new("my_hooks").unwrap(), dialect);
            for sql in [
                &s.claim, &s.get, &s.finish, &s.renew, &s.delete, &s.purge, &s.stuck,
            ] {
                assert!(sql.contains("\"my_hooks\""), "{sql}");
            }
            let q = &s.queue;
            for sql in [
                &q.enqueue,
                &q.existing,
                &q.lease,
                &q.settle,
                &q.renew,
                &q.get,
                &q.purge,
            ] {
                assert!(sql.contains("\"my_hooks_inbox\""), "{sql}");
            }
            for sql in [
                &q.observe,
                &q.newest,
                &q.settle_object,
                &q.mark_object,
                &q.mark_if_failed,
                &q.get_object,
                &q.failed,
            ] {
                assert!(sql.contains("\"my_hooks_objects\""), "{sql}");
            }
            for sql in [&q.record, &q.recorded] {
                assert!(sql.contains("\"my_hooks\""), "{sql}");
            }
        }
    }
}
