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
//!   the server's (`now()` is not used anywhere), so replicas and tests agree.
//! - The fencing token is a random 64-bit value kept bit for bit in a `BIGINT`; the
//!   fingerprint is the 32-byte SHA-256 of the body; the failure history is JSON text
//!   (empty for records that never failed).
//! - The primary key `(namespace, id)` is what makes the claim atomic: it is one
//!   `INSERT … ON CONFLICT (namespace, id) DO UPDATE … WHERE … RETURNING` statement.
//!   The key columns use the `"C"` collation, which compares bytes: ids are opaque,
//!   and byte comparison keeps the primary-key B-tree cheap at tens of millions of
//!   rows.
//! - `expires_at` is indexed so that [`purge_expired`](ProcessedStore::purge_expired)
//!   reads only the rows that are due, in batches of at most 1,000 rows taken with
//!   `FOR UPDATE SKIP LOCKED`: it never waits on a row a claim holds, and it holds
//!   its own row locks for one short statement.
//! - The partial index on `lease_until WHERE state = 'in_progress'` covers only the
//!   records whose handler is running (a handful, whatever the table's size), so
//!   [`stuck`](ProcessedStore::stuck) stays instant at 10 million rows and the index
//!   costs nearly nothing to maintain.
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
//!   UPDATE … WHERE excluded.newest >= o.newest RETURNING newest`; a refused event
//!   reads the stored newest. `failed_objects` reads the `…_objects_status` index.
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

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::Row;

use sqlx::PgConnection;

use super::sql::{
    self, count, fence, history_text, map_error, millis, purge_in_batches, vanished, Dialect,
    InvalidTableName, RawEvent, RawObject, RawRecord, Statements, TableName, DEFAULT_TABLE,
};
use super::{
    Claim, ClaimRequest, Deleted, Fence, FencingToken, Fingerprint, Finish, Key, ProcessedStore,
    Record, Recorded, StoreError,
};
use crate::inbox::{Enqueued, InboxEvent, InboxStore, NewEvent, Settle};
use crate::ordering::{Freshness, ObjectKey, ObjectRecord, ObjectStatus, OrderingStore};

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
#[derive(Debug, Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct PostgresStore {
    pool: PgPool,
    sql: Arc<Statements>,
}

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

fn record(row: &PgRow, key: Key<'_>) -> Result<Record, StoreError> {
    RawRecord::read(row, 0).map_err(err)?.into_record(key)
}

impl PostgresStore {
    /// A store on `pool`, in the table `webhook_guard_records`.
    pub fn new(pool: PgPool) -> Self {
        Self::build(pool, TableName::new(DEFAULT_TABLE).expect("valid default"))
    }

    /// A store on `pool`, in the table `table`.
    ///
    /// # Errors
    /// [`InvalidTableName`] unless `table` matches `[A-Za-z_][A-Za-z0-9_]{0,62}`. The
    /// name is quoted in SQL, so it is case-sensitive and may be a reserved word.
    pub fn with_table(pool: PgPool, table: &str) -> Result<Self, InvalidTableName> {
        Ok(Self::build(pool, TableName::new(table)?))
    }

    fn build(pool: PgPool, table: TableName) -> Self {
        Self {
            pool,
            sql: Arc::new(Statements::new(table, Dialect::Postgres)),
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
    /// # Errors
    /// [`StoreError::Unavailable`] when the server cannot be reached,
    /// [`StoreError::Backend`] for a malformed URL or a refused login.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(err)?;
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

    /// The SQL that creates this store's table and indexes, for teams that apply
    /// schema changes with their own tooling. Shown for the default table in the
    /// [module docs](self).
    pub fn schema_sql(&self) -> String {
        self.sql.schema.clone()
    }

    /// The table name.
    pub fn table(&self) -> &str {
        self.sql.table.as_str()
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

#[async_trait]
impl ProcessedStore for PostgresStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let key = request.key;
        // Winning path: one statement. Losing path: the claim changed nothing, so
        // read the record; if it vanished in between (purged or deleted), claim again.
        for _ in 0..3 {
            let row = sqlx::query(&self.sql.claim)
                .bind(key.namespace)
                .bind(key.id)
                .bind(&request.fingerprint.0[..])
                .bind(request.token.as_i64())
                .bind(millis(request.lease_until))
                .bind(millis(request.expires_at))
                .bind(millis(request.now))
                .fetch_optional(&self.pool)
                .await
                .map_err(err)?;
            if let Some(row) = row {
                return Ok(Claim::Acquired(record(&row, key)?));
            }
            if let Some(existing) = self.get(key).await? {
                return Ok(Claim::Existing(existing));
            }
        }
        Err(vanished(key))
    }

    async fn finish(
        &self,
        key: Key<'_>,
        token: FencingToken,
        finish: &Finish<'_>,
    ) -> Result<Fence, StoreError> {
        let done = sqlx::query(&self.sql.finish)
            .bind(key.namespace)
            .bind(key.id)
            .bind(token.as_i64())
            .bind(finish.state.as_str())
            .bind(count(finish.failures))
            .bind(history_text(finish.history))
            .bind(millis(finish.now))
            .bind(millis(finish.expires_at))
            .execute(&self.pool)
            .await
            .map_err(err)?;
        Ok(fence(done.rows_affected()))
    }

    async fn renew(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        let done = sqlx::query(&self.sql.renew)
            .bind(key.namespace)
            .bind(key.id)
            .bind(token.as_i64())
            .bind(millis(lease_until))
            .bind(millis(expires_at))
            .execute(&self.pool)
            .await
            .map_err(err)?;
        Ok(fence(done.rows_affected()))
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(&self.sql.get)
            .bind(key.namespace)
            .bind(key.id)
            .fetch_optional(&self.pool)
            .await
            .map_err(err)?;
        row.map(|row| record(&row, key)).transpose()
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        for _ in 0..3 {
            let done = sqlx::query(&self.sql.delete)
                .bind(key.namespace)
                .bind(key.id)
                .bind(millis(now))
                .execute(&self.pool)
                .await
                .map_err(err)?;
            if done.rows_affected() > 0 {
                return Ok(Deleted::Removed);
            }
            match self.get(key).await? {
                None => return Ok(Deleted::NotFound),
                Some(r) if r.state == super::RecordState::InProgress && r.lease_until > now => {
                    return Ok(Deleted::LeaseHeld)
                }
                Some(_) => {} // changed in between: try again
            }
        }
        Err(vanished(key))
    }

    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        purge_in_batches(limit, |n| async move {
            sqlx::query(&self.sql.purge)
                .bind(millis(now))
                .bind(sql::limit(n))
                .execute(&self.pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(err)
        })
        .await
    }

    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(&self.sql.stuck)
            .bind(millis(now))
            .bind(sql::limit(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        rows.iter()
            .map(|row| {
                let namespace: String = row.try_get(0).map_err(err)?;
                let id: String = row.try_get(1).map_err(err)?;
                RawRecord::read(row, 2)
                    .map_err(err)?
                    .into_record(Key::new(&namespace, &id))
            })
            .collect()
    }
}

fn event(row: &PgRow) -> Result<InboxEvent, StoreError> {
    RawEvent::read(row).map_err(err)?.into_event()
}

fn object(row: &PgRow) -> Result<ObjectRecord, StoreError> {
    RawObject::read(row).map_err(err)?.into_record()
}

impl PostgresStore {
    /// Records `key` as processed inside the caller's transaction: the
    /// **transactional mode**, for handlers whose effect lives in this same database.
    ///
    /// Inserts a `completed` record into the dedup table through `conn` (pass
    /// `&mut *tx` of an open [`sqlx::Transaction`]) and answers:
    /// - [`Recorded::First`]: this transaction recorded the id. Apply the effect in
    ///   the same transaction, then commit: the effect and the record commit together
    ///   or not at all.
    /// - [`Recorded::Duplicate`]: another transaction recorded it (same body
    ///   fingerprint): skip the effect.
    /// - [`Recorded::Conflict`]: the id is recorded with a different fingerprint.
    ///
    /// An expired record is replaced, and a record that failed or whose holder's lease
    /// ran out (same fingerprint) is taken over, as a claim would. A concurrent
    /// transaction recording the same key waits on the primary key until this one
    /// ends: after a commit it answers `Duplicate`, after a rollback `First`. So
    /// whatever instruction the process dies at, the effect is applied exactly once.
    /// Run it under `READ COMMITTED` (the default); under `REPEATABLE READ` or
    /// `SERIALIZABLE` the waiting transaction fails with a serialization error
    /// instead, to be run again.
    ///
    /// Do not drop the transaction's futures half-way (a `select!`, a timeout, an
    /// aborted task): sqlx 0.8's `begin` is not cancellation-safe, and a future
    /// dropped while `BEGIN` is in flight returns its connection to the pool inside a
    /// transaction that nothing ends (launchbadge/sqlx#2054), so later statements on
    /// that connection never commit. Where a handler may be cancelled, run the
    /// transaction in a spawned task.
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
    pub async fn record_in(
        &self,
        conn: &mut PgConnection,
        key: Key<'_>,
        fingerprint: Fingerprint,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<Recorded, StoreError> {
        let q = &self.sql.queue;
        let inserted = sqlx::query(&q.record)
            .bind(key.namespace)
            .bind(key.id)
            .bind(&fingerprint.0[..])
            .bind(FencingToken::random().as_i64())
            .bind(millis(now))
            .bind(millis(expires_at))
            .fetch_optional(&mut *conn)
            .await
            .map_err(err)?;
        if inserted.is_some() {
            return Ok(Recorded::First);
        }
        let stored: Option<Vec<u8>> = sqlx::query_scalar(&q.recorded)
            .bind(key.namespace)
            .bind(key.id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(err)?;
        let stored = stored.ok_or_else(|| vanished(key))?;
        Ok(if sql::fingerprint(&stored, &key)? == fingerprint {
            Recorded::Duplicate
        } else {
            Recorded::Conflict
        })
    }
}

#[async_trait]
impl InboxStore for PostgresStore {
    async fn enqueue(&self, event: &NewEvent<'_>) -> Result<Enqueued, StoreError> {
        let q = &self.sql.queue;
        let key = event.key;
        for _ in 0..3 {
            let inserted = sqlx::query(&q.enqueue)
                .bind(key.namespace)
                .bind(key.id)
                .bind(&event.fingerprint.0[..])
                .bind(event.meta.event_type.as_deref())
                .bind(event.meta.created_at.map(millis))
                .bind(event.meta.object.as_deref())
                .bind(event.meta.family.as_deref())
                .bind(event.payload)
                .bind(millis(event.now))
                .bind(millis(event.expires_at))
                .fetch_optional(&self.pool)
                .await
                .map_err(err)?;
            if inserted.is_some() {
                return Ok(Enqueued::Inserted);
            }
            let row = sqlx::query(&q.existing)
                .bind(key.namespace)
                .bind(key.id)
                .fetch_optional(&self.pool)
                .await
                .map_err(err)?;
            if let Some(row) = row {
                let fingerprint: Vec<u8> = row.try_get(0).map_err(err)?;
                let state: String = row.try_get(1).map_err(err)?;
                return Ok(Enqueued::Existing {
                    fingerprint: sql::fingerprint(&fingerprint, &key)?,
                    state: sql::inbox_state(&state, &key)?,
                });
            }
            // Purged in between: enqueue again.
        }
        Err(vanished(key))
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
        let rows = sqlx::query(&self.sql.queue.lease)
            .bind(namespace)
            .bind(millis(now))
            .bind(FencingToken::random().as_i64())
            .bind(millis(lease_until))
            .bind(sql::limit(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        let mut events = rows.iter().map(event).collect::<Result<Vec<_>, _>>()?;
        events.sort_by_key(|e| e.next_attempt_at);
        Ok(events)
    }

    async fn settle_event(
        &self,
        key: Key<'_>,
        token: FencingToken,
        settle: &Settle<'_>,
    ) -> Result<Fence, StoreError> {
        let done = sqlx::query(&self.sql.queue.settle)
            .bind(key.namespace)
            .bind(key.id)
            .bind(token.as_i64())
            .bind(settle.state.as_str())
            .bind(millis(settle.next_attempt_at))
            .bind(settle.error)
            .bind(millis(settle.now))
            .bind(millis(settle.expires_at))
            .execute(&self.pool)
            .await
            .map_err(err)?;
        Ok(fence(done.rows_affected()))
    }

    async fn renew_event(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        let done = sqlx::query(&self.sql.queue.renew)
            .bind(key.namespace)
            .bind(key.id)
            .bind(token.as_i64())
            .bind(millis(lease_until))
            .execute(&self.pool)
            .await
            .map_err(err)?;
        Ok(fence(done.rows_affected()))
    }

    async fn get_event(&self, key: Key<'_>) -> Result<Option<InboxEvent>, StoreError> {
        let row = sqlx::query(&self.sql.queue.get)
            .bind(key.namespace)
            .bind(key.id)
            .fetch_optional(&self.pool)
            .await
            .map_err(err)?;
        row.as_ref().map(event).transpose()
    }

    async fn purge_settled(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        purge_in_batches(limit, |n| async move {
            sqlx::query(&self.sql.queue.purge)
                .bind(millis(now))
                .bind(sql::limit(n))
                .execute(&self.pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(err)
        })
        .await
    }
}

#[async_trait]
impl OrderingStore for PostgresStore {
    async fn observe(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Freshness, StoreError> {
        let q = &self.sql.queue;
        let fresh = sqlx::query(&q.observe)
            .bind(key.namespace)
            .bind(key.object)
            .bind(key.family)
            .bind(millis(created_at))
            .bind(millis(now))
            .fetch_optional(&self.pool)
            .await
            .map_err(err)?;
        if fresh.is_some() {
            return Ok(Freshness::Fresh);
        }
        // Refused: a newer event is stored (records are never deleted, and the
        // newest only grows), so this read finds it.
        let newest: i64 = sqlx::query_scalar(&q.newest)
            .bind(key.namespace)
            .bind(key.object)
            .bind(key.family)
            .fetch_one(&self.pool)
            .await
            .map_err(err)?;
        Ok(Freshness::Stale {
            newest: sql::time(newest),
        })
    }

    async fn settle_object(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        status: ObjectStatus,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.sql.queue.settle_object)
            .bind(key.namespace)
            .bind(key.object)
            .bind(key.family)
            .bind(millis(created_at))
            .bind(status.as_str())
            .bind(millis(now))
            .execute(&self.pool)
            .await
            .map_err(err)?;
        Ok(())
    }

    async fn get_object(&self, key: ObjectKey<'_>) -> Result<Option<ObjectRecord>, StoreError> {
        let row = sqlx::query(&self.sql.queue.get_object)
            .bind(key.namespace)
            .bind(key.object)
            .bind(key.family)
            .fetch_optional(&self.pool)
            .await
            .map_err(err)?;
        row.as_ref().map(object).transpose()
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
        let rows = sqlx::query(&self.sql.queue.failed)
            .bind(namespace)
            .bind(millis(before))
            .bind(sql::limit(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        rows.iter().map(object).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_docs_show_the_default_schema() {
        let docs: String = include_str!("postgres.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! "))
            .collect::<Vec<_>>()
            .join("\n");
        let schema =
            Statements::new(TableName::new(DEFAULT_TABLE).unwrap(), Dialect::Postgres).schema;
        assert!(
            docs.contains(schema.trim_end()),
            "update the module docs:\n{schema}"
        );
    }
}
