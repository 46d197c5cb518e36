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
use sqlx::mysql::{
    MySql, MySqlArguments, MySqlConnection, MySqlDatabaseError, MySqlPool, MySqlQueryResult,
    MySqlRow,
};
use sqlx::query::Query;
use sqlx::{Connection, Row};

/// The driver, re-exported so that a host uses the same version as this crate.
pub use sqlx;

use super::sql::{
    self as shared, ceil_millis, millis, time, RawEvent, RawObject, TableName, EVENT_COLUMNS,
    OBJECT_COLUMNS,
};
use super::{
    decode_history, encode_history, Claim, ClaimRequest, Decision, Deleted, Fence, FencingToken,
    Fingerprint, Finish, Key, ProcessedStore, Record, RecordState, Recorded, StoreError,
};
use crate::inbox::{Enqueued, InboxEvent, InboxStore, NewEvent, Settle};
use crate::ordering::{Freshness, ObjectKey, ObjectRecord, ObjectStatus, OrderingStore};

/// The schema for the default table name; [`MySqlStore::schema_sql`] renames it.
const SCHEMA: &str = include_str!("schema.sql");

/// How many rows one statement of `purge_settled` removes at most, so that it
/// holds its row locks for a few milliseconds only.
const PURGE_BATCH: usize = 500;

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

/// The columns every read selects, in this order (see `record_from_row`).
const COLUMNS: &str = "namespace, id, state, fingerprint, token, attempts, failures, \
                       lease_until, expires_at, created_at, updated_at, history";

/// A table name that [`MySqlStore::with_table`] refused: the error all SQL stores
/// share. Table names are written into SQL text, so only
/// `[A-Za-z_][A-Za-z0-9_]{0,62}` is accepted (no quoting, no schema prefix: choose
/// the database in the URL).
pub use super::sql::InvalidTableName;

/// A [`ProcessedStore`] in a MySQL 8 or MariaDB (10.5 and later; 10.6 for the
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
///   `BIGINT` of [`FencingToken::as_i64`] (all 64 bits kept).
/// - `by_expiry` keeps [`purge_expired`](ProcessedStore::purge_expired) a range scan
///   and `by_lease` keeps [`stuck`](ProcessedStore::stuck) one, at any table size.
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
///   [`Acquired`](Claim::Acquired) without reading anything back: one round trip;
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
///   mid-sequence may repeat a token), else [`Existing`](Claim::Existing).
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
/// The same store is an [`InboxStore`] in `<table>_inbox` and an [`OrderingStore`]
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
#[derive(Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    table: Arc<str>,
    sql: Arc<Sql>,
    batcher: Arc<super::sql::claim_batch::ClaimBatcher>,
    /// How the server lets a claim batch bound its lock wait, once known.
    lock_wait: Arc<std::sync::OnceLock<batch::LockWait>>,
}

mod batch;

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
    EventType,
    CreatedAt,
    Object,
    Family,
    Payload,
    /// [`Fingerprint::UNKNOWN`], never compared.
    Unknown,
}

/// The values a statement compiled by [`compile`] may bind, by [`Param`].
#[derive(Debug, Default, Clone, Copy)]
struct Values<'a> {
    ns: &'a str,
    id: &'a str,
    fp: &'a [u8],
    token: i64,
    now: i64,
    lease: i64,
    exp: i64,
    event_type: Option<&'a str>,
    created: Option<i64>,
    object: Option<&'a str>,
    family: Option<&'a str>,
    payload: &'a [u8],
}

/// `sql` with `values` bound in the order of `params`.
fn bind<'q>(sql: &'q str, params: &[Param], v: Values<'q>) -> Query<'q, MySql, MySqlArguments> {
    let mut query = sqlx::query(sql);
    for param in params {
        query = match param {
            Param::Namespace => query.bind(v.ns),
            Param::Id => query.bind(v.id),
            Param::Fingerprint => query.bind(v.fp),
            Param::Token => query.bind(v.token),
            Param::Now => query.bind(v.now),
            Param::LeaseUntil => query.bind(v.lease),
            Param::ExpiresAt => query.bind(v.exp),
            Param::EventType => query.bind(v.event_type),
            Param::CreatedAt => query.bind(v.created),
            Param::Object => query.bind(v.object),
            Param::Family => query.bind(v.family),
            Param::Payload => query.bind(v.payload),
            Param::Unknown => query.bind(&Fingerprint::UNKNOWN.0[..]),
        };
    }
    query
}

/// Every statement, built once per table name.
#[derive(Debug)]
struct Sql {
    /// The table's name, quoted.
    table: String,
    claim: String,
    claim_params: Vec<Param>,
    get: String,
    finish: String,
    renew: String,
    delete: String,
    probe: String,
    purge: String,
    stuck: String,
    queue: QueueSql,
}

/// The inbox, ordering and transactional statements.
#[derive(Debug)]
struct QueueSql {
    inbox: String,
    objects: String,
    enqueue: (String, Vec<Param>),
    existing: String,
    pick: String,
    take: String,
    taken: String,
    settle: String,
    renew: String,
    get: String,
    purge: String,
    observe: (String, Vec<Param>),
    newest: String,
    settle_object: String,
    mark_object: String,
    mark_if_failed: String,
    get_object: String,
    failed: String,
    record: (String, Vec<Param>),
    recorded: String,
}

/// Stores a new event; on a known id, the first assignment decides once whether the
/// stored event is settled and expired (2: replaced by the new one) or not (1:
/// nothing changes), as the claim does.
const ENQUEUE_TEMPLATE: &str = "INSERT INTO {inbox} \
(namespace, id, fingerprint, event_type, created_at, object, family, payload, state, attempts, \
token, lease_until, next_attempt_at, due_at, last_error, received_at, updated_at, expires_at) \
VALUES (:ns, :id, :fp, :type, :created, :object, :family, :payload, 'pending', 0, 0, \
:now, :now, :now, NULL, :now, :now, :exp) \
ON DUPLICATE KEY UPDATE \
state = IF(LAST_INSERT_ID(IF(due_at IS NULL AND expires_at <= :now, 2, 1)) = 2, 'pending', state), \
fingerprint = IF(LAST_INSERT_ID() = 2, :fp, fingerprint), \
event_type = IF(LAST_INSERT_ID() = 2, :type, event_type), \
created_at = IF(LAST_INSERT_ID() = 2, :created, created_at), \
object = IF(LAST_INSERT_ID() = 2, :object, object), \
family = IF(LAST_INSERT_ID() = 2, :family, family), \
payload = IF(LAST_INSERT_ID() = 2, :payload, payload), \
attempts = IF(LAST_INSERT_ID() = 2, 0, attempts), \
token = IF(LAST_INSERT_ID() = 2, 0, token), \
lease_until = IF(LAST_INSERT_ID() = 2, :now, lease_until), \
next_attempt_at = IF(LAST_INSERT_ID() = 2, :now, next_attempt_at), \
last_error = IF(LAST_INSERT_ID() = 2, NULL, last_error), \
received_at = IF(LAST_INSERT_ID() = 2, :now, received_at), \
updated_at = IF(LAST_INSERT_ID() = 2, :now, updated_at), \
expires_at = IF(LAST_INSERT_ID() = 2, :exp, expires_at), \
due_at = IF(LAST_INSERT_ID() = 2, :now, due_at)";

/// Records the newest `created_at` of an object: 2 when it is after the stored one
/// (stored), 3 when it equals it (a tie: nothing changes, fresh), 1 otherwise
/// (nothing changes, stale).
const OBSERVE_TEMPLATE: &str = "INSERT INTO {objects} \
(namespace, object, family, newest, status, updated_at) \
VALUES (:ns, :object, :family, :created, 'pending', :now) \
ON DUPLICATE KEY UPDATE \
newest = IF(LAST_INSERT_ID(IF(:created > newest, 2, IF(:created = newest, 3, 1))) = 2, \
:created, newest), \
status = IF(LAST_INSERT_ID() = 2, 'pending', status), \
updated_at = IF(LAST_INSERT_ID() = 2, :now, updated_at)";

/// The transactional mode's record: a `completed` row, replacing an expired record
/// (2) or taking over a failed one or one whose lease ran out, matching fingerprint (3);
/// otherwise nothing changes (1).
const RECORD_TEMPLATE: &str = "INSERT INTO {table} \
(namespace, id, state, fingerprint, token, attempts, failures, \
lease_until, expires_at, created_at, updated_at, history) \
VALUES (:ns, :id, 'completed', :fp, :token, 1, 0, :now, :exp, :now, :now, '') \
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
lease_until = IF(LAST_INSERT_ID() = 1, lease_until, :now), \
fingerprint = IF(LAST_INSERT_ID() = 1 OR (LAST_INSERT_ID() = 3 AND fingerprint <> :unknown), \
fingerprint, :fp), \
state = IF(LAST_INSERT_ID() = 1, state, 'completed')";

impl QueueSql {
    fn new(table: &str) -> Self {
        let name = TableName::new(table).expect("validated by MySqlStore::with_table");
        let inbox = name.derived("inbox").as_str().to_owned();
        let objects = name.derived("objects").as_str().to_owned();
        let i = &quote(&inbox);
        let o = &quote(&objects);
        let table = &quote(table);
        let fence = "WHERE namespace = ? AND id = ? AND state = 'running' AND token = ?";
        let object_key = "namespace = ? AND object = ? AND family = ?";
        Self {
            enqueue: compile(&ENQUEUE_TEMPLATE.replace("{inbox}", i)),
            existing: format!("SELECT fingerprint, state FROM {i} WHERE namespace = ? AND id = ?"),
            pick: format!(
                "SELECT id FROM {i} WHERE namespace = ? AND due_at <= ? \
                 ORDER BY due_at LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            take: format!(
                "UPDATE {i} SET state = 'running', token = ?, attempts = attempts + 1, \
                 lease_until = ?, due_at = ?, updated_at = ? WHERE namespace = ? AND id IN"
            ),
            taken: format!("SELECT {EVENT_COLUMNS} FROM {i} WHERE namespace = ? AND id IN"),
            settle: format!(
                "UPDATE {i} SET state = ?, next_attempt_at = ?, \
                 due_at = CASE ? WHEN 'pending' THEN ? WHEN 'running' THEN lease_until END, \
                 last_error = COALESCE(?, last_error), updated_at = ?, expires_at = ?, \
                 attempts = attempts - IF(attempts > 0, ?, 0) {fence}"
            ),
            renew: format!("UPDATE {i} SET lease_until = ?, due_at = ? {fence}"),
            get: format!("SELECT {EVENT_COLUMNS} FROM {i} WHERE namespace = ? AND id = ?"),
            purge: format!(
                "DELETE FROM {i} WHERE due_at IS NULL AND expires_at <= ? \
                 ORDER BY due_at, expires_at LIMIT ?"
            ),
            observe: compile(&OBSERVE_TEMPLATE.replace("{objects}", o)),
            newest: format!("SELECT newest FROM {o} WHERE {object_key}"),
            settle_object: format!(
                "UPDATE {o} SET status = ?, updated_at = ? \
                 WHERE {object_key} AND newest = ? AND status = 'pending'"
            ),
            mark_object: format!(
                "UPDATE {o} SET status = ?, updated_at = ? WHERE {object_key} AND newest = ?"
            ),
            mark_if_failed: format!(
                "UPDATE {o} SET status = ?, updated_at = ? WHERE {object_key} AND newest = ? \
                 AND status = 'failed' AND updated_at <= ?"
            ),
            get_object: format!("SELECT {OBJECT_COLUMNS} FROM {o} WHERE {object_key}"),
            failed: format!(
                "SELECT {OBJECT_COLUMNS} FROM {o} \
                 WHERE namespace = ? AND status = 'failed' AND updated_at <= ? \
                 ORDER BY updated_at LIMIT ?"
            ),
            record: compile(
                &RECORD_TEMPLATE
                    .replace("{fresh}", FRESH)
                    .replace("{take}", TAKE)
                    .replace("{table}", table),
            ),
            recorded: format!(
                "SELECT fingerprint, state FROM {table} WHERE namespace = ? AND id = ? FOR UPDATE"
            ),
            inbox,
            objects,
        }
    }
}

impl Sql {
    /// The insert of `n` new `in_progress` records, each bound as namespace, id,
    /// fingerprint, token, lease_until, expires_at, created_at, updated_at; a key
    /// already stored is left as it is. `prefix` goes before the `INSERT` (MariaDB's
    /// `SET STATEMENT … FOR`, or nothing).
    fn claim_batch(&self, n: usize, prefix: &str) -> String {
        let row = "(?, ?, 'in_progress', ?, ?, 1, 0, ?, ?, ?, ?, '')";
        format!(
            "{prefix}INSERT IGNORE INTO {} (namespace, id, state, fingerprint, token, attempts, \
             failures, lease_until, expires_at, created_at, updated_at, history) VALUES {}",
            self.table,
            vec![row; n].join(", ")
        )
    }

    /// The records of `n` keys, each bound as namespace, id.
    fn claim_batch_read(&self, n: usize) -> String {
        format!(
            "SELECT {COLUMNS} FROM {} WHERE (namespace, id) IN ({})",
            self.table,
            vec!["(?, ?)"; n].join(", ")
        )
    }
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
fingerprint = IF(LAST_INSERT_ID() = 1 OR (LAST_INSERT_ID() = 3 AND fingerprint <> :unknown), \
fingerprint, :fp), \
state = IF(LAST_INSERT_ID() = 1, state, 'in_progress')";

/// The record expired and no live lease holds it: claimed as if new.
const FRESH: &str = "(expires_at <= :now AND NOT (state = 'in_progress' AND lease_until > :now))";

/// A matching fingerprint (equal, or either one unknown), and the record failed or
/// its holder's lease ran out: taken over.
const TAKE: &str = "((fingerprint = :fp OR fingerprint = :unknown OR :fp = :unknown) \
AND (state = 'failed' \
OR (state = 'in_progress' AND lease_until <= :now)))";

/// Turns `:name` placeholders into `?` and lists the values to bind, in order.
fn compile(template: &str) -> (String, Vec<Param>) {
    const NAMES: [(&str, Param); 13] = [
        ("ns", Param::Namespace),
        ("id", Param::Id),
        ("fp", Param::Fingerprint),
        ("token", Param::Token),
        ("now", Param::Now),
        ("lease", Param::LeaseUntil),
        ("exp", Param::ExpiresAt),
        ("type", Param::EventType),
        ("created", Param::CreatedAt),
        ("object", Param::Object),
        ("family", Param::Family),
        ("payload", Param::Payload),
        ("unknown", Param::Unknown),
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
    fn new(name: &str) -> Self {
        let table = &quote(name);
        let template = CLAIM_TEMPLATE
            .replace("{fresh}", FRESH)
            .replace("{take}", TAKE)
            .replace("{table}", table);
        let (claim, claim_params) = compile(&template);
        let fence = "WHERE namespace = ? AND id = ? AND state = 'in_progress' AND token = ?";
        let live = "(state = 'in_progress' AND lease_until > ?)";
        Self {
            table: table.clone(),
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
            queue: QueueSql::new(name),
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

    /// Connects a pool of up to 16 connections to `url`
    /// (`mysql://user:password@host:3306/database`), waiting at most 5 s for a free
    /// connection so that an unreachable server answers 503 quickly, and returns a
    /// store on it with the default table. Does not create the table: see
    /// [`MySqlStore::migrate`].
    ///
    /// For other pool settings, build the [`MySqlPool`] yourself and use
    /// [`MySqlStore::new`].
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the server cannot be reached,
    /// [`StoreError::Backend`] for a bad URL or refused credentials.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(map_err)?;
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
        let values = Values {
            ns: req.key.namespace,
            id: req.key.id,
            fp: &req.fingerprint.0,
            token: req.token.as_i64(),
            now: millis(req.now),
            lease: ceil_millis(req.lease_until),
            exp: ceil_millis(req.expires_at),
            ..Values::default()
        };
        retry_deadlocks(|| {
            bind(&self.sql.claim, &self.sql.claim_params, values).execute(&self.pool)
        })
        .await
    }

    /// Runs `sql`, an `UPDATE` of an object's status: whether it changed a row.
    async fn object_update(
        &self,
        sql: &str,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        status: ObjectStatus,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.object_update_since(sql, key, created_at, status, now, None)
            .await
    }

    /// [`Self::object_update`], binding `failed_since` last when given.
    async fn object_update_since(
        &self,
        sql: &str,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        status: ObjectStatus,
        now: DateTime<Utc>,
        failed_since: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError> {
        let done = retry_deadlocks(|| {
            let query = sqlx::query(sql)
                .bind(status.as_str())
                .bind(millis(now))
                .bind(key.namespace)
                .bind(key.object)
                .bind(key.family)
                .bind(millis(created_at));
            match failed_since {
                Some(since) => query.bind(millis(since)),
                None => query,
            }
            .execute(&self.pool)
        })
        .await?;
        Ok(done.rows_affected() == 1)
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

/// The record a fresh claim stored: times in whole milliseconds, as stored.
fn fresh_record(req: &ClaimRequest<'_>) -> Record {
    let now = time(millis(req.now));
    Record::new(
        req.key,
        RecordState::InProgress,
        req.fingerprint,
        req.token,
        1,
        0,
        time(ceil_millis(req.lease_until)),
        time(ceil_millis(req.expires_at)),
        now,
        now,
        Vec::new(),
    )
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

/// Sorts a driver error into unreachable (the guard answers 503) or not.
pub(super) fn map_err(error: sqlx::Error) -> StoreError {
    let unavailable = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
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
        if batch::fits(request.key.namespace, request.key.id) {
            use super::sql::claim_batch::{Batched, ClaimBatcher};
            match ClaimBatcher::claim(self, request).await {
                Batched::Fresh => return Ok(Claim::Acquired(fresh_record(request))),
                Batched::Existing(record) if request.decide_on(&record) == Decision::Keep => {
                    return Ok(Claim::Existing(record))
                }
                Batched::Failed(error) => return Err(error),
                Batched::Acquired(_) | Batched::Refused | Batched::Existing(_) | Batched::Alone => {
                }
            }
        }
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
                // Taken over by this claim, or made by it and met again by a resend.
                Some(record) if request.made(&record) => return Ok(Claim::Acquired(record)),
                // Its holder failed since, or it expired: claim again.
                Some(record) if request.decide_on(&record) != Decision::Keep => continue,
                Some(record) => return Ok(Claim::Existing(record)),
                None => continue, // purged or deleted since: claim again
            }
        }
        Err(StoreError::backend(format!(
            "the record of {} vanished or changed {VANISHED_RETRIES} times during a claim",
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
                .bind(ceil_millis(finish.expires_at))
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
                .bind(ceil_millis(lease_until))
                .bind(ceil_millis(expires_at))
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
        // Paced statements, a rest after each (see `PurgePace`). Each statement runs
        // in a task of its own, to completion even if the caller's future is dropped:
        // the one-shot isolation level set before it must not stay pending on a
        // pooled connection, for the next borrower's transaction (a host's
        // `record_in`, say) to run under it.
        shared::purge_in_batches(limit, PURGE_PACE, |n| {
            let store = self.clone();
            async move {
                tokio::spawn(async move { retry_deadlocks(|| store.purge_once(now, n)).await })
                    .await
                    .map_err(StoreError::backend)?
            }
        })
        .await
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

fn opt_text(row: &MySqlRow, at: usize, column: &str) -> Result<Option<String>, StoreError> {
    let bytes: Option<Vec<u8>> = row.try_get(at).map_err(map_err)?;
    bytes.map(|b| text(b, column)).transpose()
}

fn event_from_row(row: &MySqlRow) -> Result<InboxEvent, StoreError> {
    let get_text = |at: usize, column: &str| text(row.try_get(at).map_err(map_err)?, column);
    RawEvent {
        namespace: get_text(0, "namespace")?,
        id: get_text(1, "id")?,
        fingerprint: row.try_get(2).map_err(map_err)?,
        event_type: opt_text(row, 3, "event_type")?,
        created_at: row.try_get(4).map_err(map_err)?,
        object: opt_text(row, 5, "object")?,
        family: opt_text(row, 6, "family")?,
        payload: row.try_get(7).map_err(map_err)?,
        state: get_text(8, "state")?,
        attempts: row.try_get::<u32, _>(9).map_err(map_err)?.into(),
        token: row.try_get(10).map_err(map_err)?,
        lease_until: row.try_get(11).map_err(map_err)?,
        next_attempt_at: row.try_get(12).map_err(map_err)?,
        last_error: opt_text(row, 13, "last_error")?,
        received_at: row.try_get(14).map_err(map_err)?,
        updated_at: row.try_get(15).map_err(map_err)?,
        expires_at: row.try_get(16).map_err(map_err)?,
    }
    .into_event()
}

fn object_from_row(row: &MySqlRow) -> Result<ObjectRecord, StoreError> {
    let get_text = |at: usize, column: &str| text(row.try_get(at).map_err(map_err)?, column);
    RawObject {
        namespace: get_text(0, "namespace")?,
        object: get_text(1, "object")?,
        family: get_text(2, "family")?,
        newest: row.try_get(3).map_err(map_err)?,
        status: get_text(4, "status")?,
        updated_at: row.try_get(5).map_err(map_err)?,
    }
    .into_record()
}

/// `(?, ?, …)` with `n` marks, for an `IN` list of binds.
fn marks(n: usize) -> String {
    let mut list = "?, ".repeat(n);
    list.truncate(list.len().saturating_sub(2));
    format!("({list})")
}

impl MySqlStore {
    /// The inbox table (`<table>_inbox`, shortened with a hash past 63 bytes).
    pub fn inbox_table(&self) -> &str {
        &self.sql.queue.inbox
    }

    /// The ordering table (`<table>_objects`, shortened with a hash past 63 bytes).
    pub fn objects_table(&self) -> &str {
        &self.sql.queue.objects
    }

    /// Records `key` as processed inside the caller's transaction: the
    /// **transactional mode**, for handlers whose effect lives in this same database.
    ///
    /// Inserts a `completed` record into the dedup table through `conn` (pass
    /// `&mut *tx` of an open [`sqlx::Transaction`]) and answers:
    /// - [`Recorded::First`]: this transaction recorded the id. Apply the effect in
    ///   the same transaction, then commit: the effect and the record commit together
    ///   or not at all.
    /// - [`Recorded::Duplicate`]: another transaction recorded it (a
    ///   [matching](Fingerprint::matches) fingerprint): skip the effect.
    /// - [`Recorded::Conflict`]: the id is recorded with a different known fingerprint.
    /// - [`Recorded::InProgress`]: a delivery run by the guard holds the id under a
    ///   live lease and has not finished: skip the effect and answer a retry (409, as the guard does).
    ///
    /// An expired record is replaced, and a record that failed or whose holder's lease
    /// ran out (matching fingerprint) is taken over, as a claim would. A concurrent
    /// transaction recording the same key waits on the row lock until this one ends:
    /// after a commit it answers `Duplicate`, after a rollback `First`. So whatever
    /// instruction the process dies at, the effect is applied exactly once.
    ///
    /// Whatever it answers, the transaction now holds the record's row lock until it
    /// ends, even when it recorded nothing. On anything but `First`, end the
    /// transaction at once: meanwhile a delivery the guard runs for the same id
    /// cannot finish or renew its claim, and a retry of it waits instead of being
    /// answered.
    ///
    /// InnoDB may end a transaction as a deadlock victim (error 1213, a
    /// [`StoreError::Backend`] whose source is the [`sqlx::Error`]): it was rolled
    /// back whole, effect included, so run the whole transaction again.
    ///
    /// On a known id the statement sets the session's `LAST_INSERT_ID()` (to its
    /// decision code, 1 to 3; see [`MySqlStore::claim_sql`]): read an
    /// `AUTO_INCREMENT` id you need before calling this, not after.
    ///
    /// Do not drop the transaction's futures half-way (a `select!`, a timeout, an
    /// aborted task): sqlx 0.8's `begin` is not cancellation-safe, and a future
    /// dropped while `BEGIN` is in flight returns its connection to the pool inside a
    /// transaction that nothing ends (launchbadge/sqlx#2054), so later statements on
    /// that connection never commit. Where a handler may be cancelled, run the
    /// transaction in a spawned task.
    ///
    /// ```no_run
    /// # async fn demo(store: webhook_guard::store::MySqlStore, body: &[u8])
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
    /// [`StoreError`] when a statement fails; the transaction should then be rolled
    /// back (dropping it does).
    pub async fn record_in(
        &self,
        conn: &mut MySqlConnection,
        key: Key<'_>,
        fingerprint: Fingerprint,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<Recorded, StoreError> {
        let q = &self.sql.queue;
        let values = Values {
            ns: key.namespace,
            id: key.id,
            fp: &fingerprint.0,
            token: FencingToken::random().as_i64(),
            now: millis(now),
            exp: ceil_millis(expires_at),
            ..Values::default()
        };
        let done = bind(&q.record.0, &q.record.1, values)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        match done.last_insert_id() {
            0 | CODE_FRESH | CODE_TAKEOVER => return Ok(Recorded::First),
            CODE_UNCHANGED => {}
            code => return Err(StoreError::Corrupt(format!("record answered code {code}"))),
        }
        let stored: Option<(Vec<u8>, Vec<u8>)> = sqlx::query_as(&q.recorded)
            .bind(key.namespace)
            .bind(key.id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_err)?;
        let (stored, state) = stored.ok_or_else(|| {
            StoreError::backend(format!("the record of {key} vanished during record_in"))
        })?;
        shared::recorded(&stored, &state, fingerprint, key)
    }

    /// One purge statement of up to `n` rows, under `READ COMMITTED`: InnoDB then
    /// locks only the rows it deletes, never the gaps of the `by_expiry` range it
    /// walks, so a claim inserting next to them never waits for the purge.
    async fn purge_once(&self, now: i64, n: usize) -> Result<u64, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        sqlx::Executor::execute(&mut *conn, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .await?;
        let done = sqlx::query(&self.sql.purge)
            .bind(now)
            .bind(now)
            .bind(n as u64)
            .execute(&mut *conn)
            .await;
        match done {
            Ok(done) => Ok(done.rows_affected()),
            Err(e) => {
                // The level may still be pending for the connection's next
                // transaction: close it rather than return it to the pool.
                let _ = conn.close().await;
                Err(e)
            }
        }
    }

    /// One lease transaction, under `READ COMMITTED` (no gap locks): pick due rows
    /// with `FOR UPDATE SKIP LOCKED`, mark them running, read them back.
    async fn lease_once(
        &self,
        namespace: &str,
        now: i64,
        lease_until: i64,
        limit: usize,
    ) -> Result<Vec<MySqlRow>, sqlx::Error> {
        let q = &self.sql.queue;
        let mut conn = self.pool.acquire().await?;
        sqlx::Executor::execute(&mut *conn, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .await?;
        let mut tx = conn.begin().await?;
        let ids: Vec<Vec<u8>> = sqlx::query_scalar(&q.pick)
            .bind(namespace)
            .bind(now)
            .bind(limit as u64)
            .fetch_all(&mut *tx)
            .await?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let list = marks(ids.len());
        let take = format!("{} {list}", q.take);
        let mut update = sqlx::query(&take)
            .bind(FencingToken::random().as_i64())
            .bind(lease_until)
            .bind(lease_until)
            .bind(now)
            .bind(namespace);
        for id in &ids {
            update = update.bind(id.as_slice());
        }
        update.execute(&mut *tx).await?;
        let taken = format!("{} {list}", q.taken);
        let mut select = sqlx::query(&taken).bind(namespace);
        for id in &ids {
            select = select.bind(id.as_slice());
        }
        let rows = select.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
#[async_trait]
impl InboxStore for MySqlStore {
    async fn enqueue(&self, event: &NewEvent<'_>) -> Result<Enqueued, StoreError> {
        let q = &self.sql.queue;
        let key = event.key;
        let values = Values {
            ns: key.namespace,
            id: key.id,
            fp: &event.fingerprint.0,
            now: millis(event.now),
            exp: ceil_millis(event.expires_at),
            event_type: event.meta.event_type.as_deref(),
            created: event.meta.created_at.map(millis),
            object: event.meta.object.as_deref(),
            family: event.meta.family.as_deref(),
            payload: event.payload,
            ..Values::default()
        };
        for _ in 0..VANISHED_RETRIES {
            let done =
                retry_deadlocks(|| bind(&q.enqueue.0, &q.enqueue.1, values).execute(&self.pool))
                    .await?;
            match done.last_insert_id() {
                0 | CODE_FRESH => return Ok(Enqueued::Inserted),
                CODE_UNCHANGED => {}
                code => return Err(StoreError::Corrupt(format!("enqueue answered code {code}"))),
            }
            let row = retry_deadlocks(|| {
                sqlx::query(&q.existing)
                    .bind(key.namespace)
                    .bind(key.id)
                    .fetch_optional(&self.pool)
            })
            .await?;
            if let Some(row) = row {
                let fingerprint: Vec<u8> = row.try_get(0).map_err(map_err)?;
                let state = text(row.try_get(1).map_err(map_err)?, "state")?;
                return Ok(Enqueued::Existing {
                    fingerprint: shared::fingerprint(&fingerprint, &key)?,
                    state: shared::inbox_state(&state, &key)?,
                });
            }
            // Purged in between: enqueue again.
        }
        Err(StoreError::backend(format!(
            "the event {key} vanished {VANISHED_RETRIES} times during an enqueue"
        )))
    }

    async fn lease(
        &self,
        namespace: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<InboxEvent>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (now, until) = (millis(now), ceil_millis(lease_until));
        // The transaction runs in its own task, to completion even if the caller's
        // future is dropped: sqlx 0.8's `begin` is not cancellation-safe (a future
        // dropped while `BEGIN` is in flight returns its connection to the pool
        // inside a transaction that nothing ends, launchbadge/sqlx#2054). Events
        // leased for a caller that went away are leased again when their lease ends.
        let store = self.clone();
        let namespace = namespace.to_owned();
        let rows = tokio::spawn(async move {
            let mut tries = 0;
            loop {
                match store.lease_once(&namespace, now, until, limit).await {
                    Err(e) if tries < DEADLOCK_RETRIES && server_error_number(&e) == Some(1213) => {
                        tries += 1;
                    }
                    other => return other.map_err(map_err),
                }
            }
        })
        .await
        .map_err(StoreError::backend)??;
        let mut events = rows
            .iter()
            .map(event_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        events.sort_by_key(|e| e.next_attempt_at);
        Ok(events)
    }

    async fn settle_event(
        &self,
        key: Key<'_>,
        token: FencingToken,
        settle: &Settle<'_>,
    ) -> Result<Fence, StoreError> {
        let state = settle.state.as_str();
        let next = ceil_millis(settle.next_attempt_at);
        let done = retry_deadlocks(|| {
            sqlx::query(&self.sql.queue.settle)
                .bind(state)
                .bind(next)
                .bind(state)
                .bind(next)
                .bind(settle.error)
                .bind(millis(settle.now))
                .bind(ceil_millis(settle.expires_at))
                .bind(u32::from(!settle.attempt_counts))
                .bind(key.namespace)
                .bind(key.id)
                .bind(token.as_i64())
                .execute(&self.pool)
        })
        .await?;
        if done.rows_affected() == 0 {
            // The same settle made again (its answer was lost)?
            let event = self.get_event(key).await?;
            if event.is_some_and(|e| crate::inbox::settled_already(&e, token, settle)) {
                return Ok(Fence::Applied);
            }
        }
        Ok(fence(&done))
    }

    async fn renew_event(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        let until = ceil_millis(lease_until);
        let done = retry_deadlocks(|| {
            sqlx::query(&self.sql.queue.renew)
                .bind(until)
                .bind(until)
                .bind(key.namespace)
                .bind(key.id)
                .bind(token.as_i64())
                .execute(&self.pool)
        })
        .await?;
        Ok(fence(&done))
    }

    async fn get_event(&self, key: Key<'_>) -> Result<Option<InboxEvent>, StoreError> {
        let row = retry_deadlocks(|| {
            sqlx::query(&self.sql.queue.get)
                .bind(key.namespace)
                .bind(key.id)
                .fetch_optional(&self.pool)
        })
        .await?;
        row.as_ref().map(event_from_row).transpose()
    }

    async fn purge_settled(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let now = millis(now);
        let mut removed = 0u64;
        let mut left = limit;
        while left > 0 {
            let batch = left.min(PURGE_BATCH);
            let done = retry_deadlocks(|| {
                sqlx::query(&self.sql.queue.purge)
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
}

#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
#[async_trait]
impl OrderingStore for MySqlStore {
    async fn observe(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Freshness, StoreError> {
        let q = &self.sql.queue;
        let values = Values {
            ns: key.namespace,
            object: Some(key.object),
            family: Some(key.family),
            created: Some(millis(created_at)),
            now: millis(now),
            ..Values::default()
        };
        let done = retry_deadlocks(|| bind(&q.observe.0, &q.observe.1, values).execute(&self.pool))
            .await?;
        match done.last_insert_id() {
            // 3: a retry, or another event created at the same time.
            0 | CODE_FRESH | CODE_TAKEOVER => return Ok(Freshness::Fresh),
            CODE_UNCHANGED => {}
            code => return Err(StoreError::Corrupt(format!("observe answered code {code}"))),
        }
        // Refused: a newer event is stored (records are never deleted, and the
        // newest only grows), so this read finds it.
        let newest: i64 = retry_deadlocks(|| {
            sqlx::query_scalar(&q.newest)
                .bind(key.namespace)
                .bind(key.object)
                .bind(key.family)
                .fetch_one(&self.pool)
        })
        .await?;
        Ok(Freshness::Stale {
            newest: time(newest),
        })
    }

    async fn settle_object(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        status: ObjectStatus,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        if self
            .object_update(&self.sql.queue.settle_object, key, created_at, status, now)
            .await?
        {
            return Ok(true);
        }
        if status == ObjectStatus::Failed {
            // Settled first by another event created at the same time: a failure is
            // never hidden.
            self.mark_object(key, created_at, status, now).await?;
        }
        Ok(false)
    }

    async fn mark_object(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        status: ObjectStatus,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.object_update(&self.sql.queue.mark_object, key, created_at, status, now)
            .await
    }

    async fn mark_object_if_failed(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        failed_since: DateTime<Utc>,
        status: ObjectStatus,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let sql = &self.sql.queue.mark_if_failed;
        self.object_update_since(sql, key, created_at, status, now, Some(failed_since))
            .await
    }

    async fn get_object(&self, key: ObjectKey<'_>) -> Result<Option<ObjectRecord>, StoreError> {
        let row = retry_deadlocks(|| {
            sqlx::query(&self.sql.queue.get_object)
                .bind(key.namespace)
                .bind(key.object)
                .bind(key.family)
                .fetch_optional(&self.pool)
        })
        .await?;
        row.as_ref().map(object_from_row).transpose()
    }

    async fn failed_objects(
        &self,
        namespace: &str,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<ObjectRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = retry_deadlocks(|| {
            sqlx::query(&self.sql.queue.failed)
                .bind(namespace)
                .bind(millis(before))
                .bind(limit as u64)
                .fetch_all(&self.pool)
        })
        .await?;
        rows.iter().map(object_from_row).collect()
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
            assert!(TableName::new(ok).is_ok(), "{ok}");
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
            assert!(TableName::new(bad).is_err(), "{bad}");
        }
    }

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
    fn claim_statement_binds_every_placeholder() {
        let sql = Sql::new("t");
        assert_eq!(sql.claim.matches('?').count(), sql.claim_params.len());
        assert!(!sql.claim.contains(':'), "{}", sql.claim);
        assert!(!sql.claim.contains('{'), "{}", sql.claim);
        let q = &sql.queue;
        for (text, params) in [&q.enqueue, &q.observe, &q.record] {
            assert_eq!(text.matches('?').count(), params.len(), "{text}");
            assert!(!text.contains(':') && !text.contains('{'), "{text}");
        }
        assert!(q.enqueue.0.starts_with("INSERT INTO `t_inbox` "));
        assert!(q.observe.0.starts_with("INSERT INTO `t_objects` "));
        assert!(q.record.0.starts_with("INSERT INTO `t` "));
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
