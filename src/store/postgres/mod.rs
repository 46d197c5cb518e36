//! The PostgreSQL store, on [sqlx](https://docs.rs/sqlx) (feature `postgres`).
//!
//! # Schema
//!
//! [`PostgresStore::migrate`] applies it (idempotent, safe to run from every replica
//! at start-up); teams that manage their schema themselves apply
//! [`PostgresStore::schema_sql`] instead, which for the default table reads:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "webhook_guard_records" (
//!     namespace   TEXT COLLATE "C" NOT NULL,
//!     id          TEXT COLLATE "C" NOT NULL,
//!     state       TEXT    NOT NULL,
//!     fingerprint BYTEA   NOT NULL,
//!     token       BIGINT  NOT NULL,
//!     attempts    INTEGER NOT NULL,
//!     failures    INTEGER NOT NULL,
//!     lease_until BIGINT  NOT NULL,
//!     expires_at  BIGINT  NOT NULL,
//!     created_at  BIGINT  NOT NULL,
//!     updated_at  BIGINT  NOT NULL,
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
//!     namespace       TEXT COLLATE "C" NOT NULL,
//!     id              TEXT COLLATE "C" NOT NULL,
//!     fingerprint     BYTEA   NOT NULL,
//!     event_type      TEXT,
//!     created_at      BIGINT,
//!     object          TEXT,
//!     family          TEXT,
//!     payload         BYTEA   NOT NULL,
//!     state           TEXT    NOT NULL,
//!     attempts        INTEGER NOT NULL,
//!     token           BIGINT  NOT NULL,
//!     lease_until     BIGINT  NOT NULL,
//!     next_attempt_at BIGINT  NOT NULL,
//!     due_at          BIGINT,
//!     last_error      TEXT,
//!     received_at     BIGINT  NOT NULL,
//!     updated_at      BIGINT  NOT NULL,
//!     expires_at      BIGINT  NOT NULL,
//!     PRIMARY KEY (namespace, id)
//! );
//! CREATE INDEX IF NOT EXISTS "webhook_guard_records_inbox_due"
//!     ON "webhook_guard_records_inbox" (namespace, due_at) WHERE due_at IS NOT NULL;
//! CREATE INDEX IF NOT EXISTS "webhook_guard_records_inbox_settled"
//!     ON "webhook_guard_records_inbox" (expires_at) WHERE due_at IS NULL;
//! CREATE INDEX IF NOT EXISTS "webhook_guard_records_inbox_listing"
//!     ON "webhook_guard_records_inbox" (namespace, state, updated_at, id);
//! CREATE TABLE IF NOT EXISTS "webhook_guard_records_objects" (
//!     namespace  TEXT COLLATE "C" NOT NULL,
//!     object     TEXT COLLATE "C" NOT NULL,
//!     family     TEXT COLLATE "C" NOT NULL,
//!     newest     BIGINT  NOT NULL,
//!     status     TEXT    NOT NULL,
//!     updated_at BIGINT  NOT NULL,
//!     PRIMARY KEY (namespace, object, family)
//! );
//! CREATE INDEX IF NOT EXISTS "webhook_guard_records_objects_status"
//!     ON "webhook_guard_records_objects" (namespace, status, updated_at);
//! ```
//!
//! - Times are milliseconds since the Unix epoch, always the caller's clock, never
//!   the server's (`now()` is not used anywhere), so replicas and tests agree. The
//!   end of a lease and an expiry are rounded up to the millisecond, never down.
//! - The fencing token is a random 64-bit value kept bit for bit in a `BIGINT`; the
//!   fingerprint is the 32-byte SHA-256 of the body; the failure history is JSON text
//!   (empty for records that never failed).
//! - The primary key `(namespace, id)` is what makes the claim atomic: it is one
//!   `INSERT … ON CONFLICT (namespace, id) DO UPDATE … WHERE … RETURNING` statement
//!   (shared by the claims of concurrent deliveries: see
//!   [claims in batches](self#claims-in-batches)).
//!   The key columns use the `"C"` collation, which compares bytes: ids are opaque,
//!   and byte comparison keeps the primary-key B-tree cheap at tens of millions of
//!   rows.
//! - `expires_at` is indexed so that [`purge_expired`] reads only the rows that are
//!   due, oldest first. It deletes them in statements of at most 250 rows, each
//!   picking its rows with `FOR UPDATE SKIP LOCKED` (it never waits on a row a claim
//!   holds) and deleting them by `ctid`, and each committing without waiting for a
//!   WAL flush (`synchronous_commit` off for that statement only: a purge lost in a
//!   crash is simply redone). After each statement it rests as long as the
//!   statement took, so a large backlog leaves the server free about half of the
//!   time and claims keep their latency.
//! - The partial index on `lease_until WHERE state = 'in_progress'` covers only the
//!   records whose handler is running (a handful, whatever the table's size), so
//!   [`stuck`] stays instant at 10 million rows and the index costs nearly nothing
//!   to maintain.
//! - `…_listing` on `(namespace, state, updated_at, id)`, on the records and on the
//!   inbox, serves the operators' listing ([`ListingStore`](crate::store::ListingStore),
//!   [`InboxListing`](crate::inbox::InboxListing)): one backward index scan per
//!   state, newest first from the cursor, stopping at the page's limit (a state
//!   filter is the index's prefix; several states are merged). An id prefix is
//!   checked on the rows of that walk, so a rare prefix walks the state's whole
//!   range. `migrate` on a table made before this index builds it with a plain
//!   `CREATE INDEX`, which blocks writes to the table while it builds: on a large
//!   table, run `CREATE INDEX CONCURRENTLY` with the same name first.
//!
//! # Claims in batches
//!
//! Claims of concurrent deliveries share one statement and one commit: a claim's
//! first try queues, and one of at most two runner tasks of the store takes
//! whatever has queued (up to 64 claims of distinct keys) and runs the same upsert
//! for all of them, its values passed as arrays (`INSERT … SELECT … FROM unnest(…)
//! ON CONFLICT … RETURNING`). A claim alone is sent at once; under load a commit,
//! which waits for one WAL flush whatever it holds, serves a whole batch. A batch
//! inserts its keys in byte order, so two batches take their row locks in the same
//! order and cannot deadlock; a key queued twice waits for the next batch. A batch
//! waits at most 250 ms for a row lock (`lock_timeout`, set for its own transaction
//! only), then each of its claims goes on alone: a key locked elsewhere (an open
//! [`record_in`](PostgresStore::record_in) transaction) holds up only its own
//! claim, not its batch's nor the claims queued behind it. A claim still queued
//! after the pool's acquire timeout is withdrawn (never made) and answers
//! `Unavailable`, as a claim waiting for a connection would (the bound on row locks
//! does not cover a table lock, taken by DDL or `LOCK TABLE`, which the statement
//! waits for from its start: the claims queued behind such a batch are withdrawn
//! so). The statement also answers, for each key it did not claim, the stored
//! record as its snapshot has it (a `LATERAL` primary-key lookup per key), so a
//! duplicate is decided on that record and costs one round trip; a claim whose
//! record the snapshot does not hold (stored meanwhile by a concurrent
//! transaction), or whose record read may be taken over or replaced, goes on as a
//! refused claim does (it reads the record, or claims again, and decides). When the
//! statement fails, each caller answers `Unavailable` if the server could not be
//! reached, and otherwise claims alone with the one-row statement, so a row the
//! server refuses fails only its own claim. A claim whose caller stopped waiting
//! before its batch was taken is not made. Finishes, renewals and everything else
//! run one statement each.
//!
//! # Inbox, ordering guard and transactional mode
//!
//! The same store is an [`InboxStore`] (in `<table>_inbox`) and an [`OrderingStore`]
//! (in `<table>_objects`), both created by [`PostgresStore::migrate`]:
//!
//! - `enqueue` is one `INSERT … ON CONFLICT (namespace, id) DO UPDATE … WHERE <settled
//!   and expired> RETURNING`; no row back means the id is known, and one read tells
//!   its fingerprint and state.
//! - `due_at` is `next_attempt_at` for a pending event, `lease_until` for a running
//!   one and `NULL` once settled, so the partial index `…_inbox_due` holds only the
//!   events a worker may still lease: leasing stays an index range scan with
//!   millions of settled rows. A lease is one `UPDATE … WHERE (namespace, id) IN
//!   (SELECT … ORDER BY due_at LIMIT $n FOR UPDATE SKIP LOCKED) RETURNING …`:
//!   concurrent workers skip each other's rows instead of waiting or sharing them.
//! - `settle_event` and `renew_event` are `UPDATE`s fenced by `state = 'running' AND
//!   token = $token`; settled events are purged in batches of at most 1,000 through
//!   the partial index `…_inbox_settled`.
//! - `observe` is a compare-and-set on the primary key: `INSERT … ON CONFLICT DO
//!   UPDATE … WHERE excluded.newest > o.newest RETURNING newest`; a refused event
//!   reads the stored newest (a tie with it is fresh). `settle_object` updates only
//!   a `pending` status, except that `failed` is written over a settled one. `failed_objects` reads the `…_objects_status` index.
//! - [`PostgresStore::record_in`] records an id inside the caller's transaction, so
//!   that a handler's effect in this database and its dedup record commit together.
//!
//! # Connections and errors
//!
//! The store uses an sqlx [`PgPool`]. The pool discards broken connections and opens
//! new ones, so the store recovers by itself when the server comes back. While it is
//! unreachable, calls fail with [`StoreError::Unavailable`] (I/O and TLS errors, an
//! exhausted or closed pool, a connection terminated by the server, SQLSTATE classes
//! `08` and `57P0x`, `53300` too many connections, `25006` a read-only standby after a
//! fail-over); the guard answers 503 and the provider retries. Any other error is
//! [`StoreError::Backend`]. Both keep the sqlx error as their source.
//!
//! [`ProcessedStore`]: super::ProcessedStore
//! [`InboxStore`]: crate::inbox::InboxStore
//! [`OrderingStore`]: crate::ordering::OrderingStore
//! [`purge_expired`]: super::ProcessedStore::purge_expired
//! [`stuck`]: super::ProcessedStore::stuck

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use sqlx::{PgConnection, Postgres};

use super::sql::returning::returning_ops;
use super::sql::{self, map_error, Dialect, Statements, TableName};
use super::StoreError;

pub use sqlx;

/// A durable [`ProcessedStore`] in a PostgreSQL table, shared by every replica.
///
/// Cheap to clone (the pool and the prepared SQL are shared). See the
/// [module docs](self) for the schema, the indexes and how errors are told apart.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use webhook_guard::store::PostgresStore;
///
/// let store = PostgresStore::connect("postgres://app@db/app").await?;
/// store.migrate().await?;
/// # Ok(()) }
/// ```
///
/// [`ProcessedStore`]: super::ProcessedStore
#[derive(Debug, Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct PostgresStore {
    pool: PgPool,
    sql: Arc<Statements>,
    batcher: Arc<super::sql::claim_batch::ClaimBatcher>,
}

mod batch;

/// SQLSTATEs that mean the server cannot serve us now, rather than a bad request.
fn pg_unavailable(db: &dyn sqlx::error::DatabaseError) -> bool {
    db.code().is_some_and(|code| {
        code.starts_with("08") // connection exception
            || code.starts_with("57P") // admin/crash shutdown, cannot connect now
            || code == "53300" // too many connections
            || code == "25006" // read-only transaction: a standby after a fail-over
    })
}

pub(super) fn err(e: sqlx::Error) -> StoreError {
    map_error(e, pg_unavailable)
}

/// `sslmode=require` with a CA given (`sslrootcert`, or `PGSSLROOTCERT`) checks the
/// server's certificate against it, as libpq does: `verify-ca`.
fn given_ca_checked(options: PgConnectOptions) -> PgConnectOptions {
    let require = matches!(options.get_ssl_mode(), PgSslMode::Require);
    let verify_ca = |o: PgConnectOptions| o.ssl_mode(PgSslMode::VerifyCa);
    super::sql::given_ca_checked(options, require, "sslrootcert", verify_ca)
}

impl PostgresStore {
    fn build(pool: PgPool, table: TableName) -> Self {
        Self {
            pool,
            sql: Arc::new(Statements::new(table, Dialect::Postgres)),
            batcher: Arc::default(),
        }
    }

    /// Connects a pool of up to 16 connections to `url` (waiting at most 5 s for a
    /// free connection, so that an unreachable server answers 503 quickly) and
    /// builds a store on it with the default table. Does not create the table: see
    /// [`PostgresStore::migrate`].
    ///
    /// For other pool settings, build the [`PgPool`] yourself and use
    /// [`PostgresStore::new`].
    ///
    /// TLS (feature `tls`) follows the URL's `sslmode`, as libpq does: `verify-full`
    /// checks the certificate and that it names the host, `verify-ca` the
    /// certificate (and, with sqlx 0.8, the host too: see [`tls`](super::tls)), against `sslrootcert=PATH` (or `PGSSLROOTCERT`) or else the
    /// system's trusted roots; `require` encrypts without checking, unless a CA is
    /// given, which it then checks as `verify-ca` does; the default `prefer` uses
    /// TLS when the server offers it, unchecked, and plain text otherwise.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the server cannot be reached or the TLS
    /// handshake fails, [`StoreError::Backend`] for a malformed URL or a refused
    /// login. A TLS failure has a [`TlsError`](super::TlsError) in its chain.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url).map_err(err)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(given_ca_checked(options))
            .await
            .map_err(|e| super::tls::tls_cause(err(e)))?;
        Ok(Self::new(pool))
    }

    /// Creates the table and its indexes if they do not exist (the SQL of
    /// [`PostgresStore::schema_sql`]). Idempotent; replicas may run it concurrently
    /// (a transaction-scoped advisory lock serialises them).
    ///
    /// # Errors
    /// [`StoreError`] when the server is unreachable or refuses the DDL (for example
    /// for lack of privileges).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // One simple-protocol query runs as one implicit transaction, so the
        // advisory lock is held until the DDL commits.
        let sql = format!(
            "SELECT pg_advisory_xact_lock(hashtext('webhook_guard:' || '{}'));\n{}",
            self.sql.table.as_str(),
            self.sql.schema
        );
        sqlx::raw_sql(&sql).execute(&self.pool).await.map_err(err)?;
        Ok(())
    }
}

impl PostgresStore {
    /// PostgreSQL orders concurrent writes itself (row locks, `SKIP LOCKED`): a write
    /// waits for nothing here.
    async fn write_gate(&self) -> Result<sql::Ungated, StoreError> {
        Ok(sql::Ungated)
    }

    /// Purge statements of 250 rows, each followed by a rest as long as it took, so
    /// that a purge of a large backlog takes at most about half of the server's
    /// time and WAL flushes, and claims meanwhile keep their latency.
    const PURGE_PACE: sql::PurgePace = sql::PurgePace {
        rows: 250,
        rest: 1.0,
    };
}

returning_ops! {
    PostgresStore, Postgres, PgConnection, "postgres", err,
    with_table: "The name is quoted in SQL, so it is case-sensitive and may be a reserved word.",
    record_in:
    /// Records `key` as processed inside the caller's transaction: the
    /// **transactional mode**, for handlers whose effect lives in this same database.
    ///
    #[doc = include_str!("../sql/record_in.md")]
    /// A concurrent transaction recording the same key waits on the primary key until
    /// this one ends: after a commit it answers `Duplicate`, after a rollback `First`.
    /// So whatever instruction the process dies at, the effect is applied exactly once.
    /// Run it under `READ COMMITTED` (the default); under `REPEATABLE READ` or
    /// `SERIALIZABLE` the waiting transaction fails with a serialization error instead,
    /// to be run again.
    ///
    #[doc = include_str!("../sql/record_in_lock.md")]
    ///
    /// ```no_run
    /// # async fn demo(store: webhook_guard::store::PostgresStore, body: &[u8])
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// use chrono::{TimeDelta, Utc};
    /// use webhook_guard::store::{Fingerprint, Key, Recorded};
    ///
    /// let pool = store.pool();
    /// let (key, fp) = (Key::new("stripe", "evt_1"), Fingerprint::of(body));
    /// let (now, exp) = (Utc::now(), Utc::now() + TimeDelta::days(3));
    /// let mut tx = pool.begin().await?;
    /// if store.record_in(&mut *tx, key, fp, now, exp).await? == Recorded::First {
    ///     sqlx::query("INSERT INTO orders (event_id) VALUES ($1)")
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
}
