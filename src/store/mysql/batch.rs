//! The MySQL / MariaDB claim batch: the claims of concurrent deliveries inserted as
//! new records in one statement and one commit. See
//! [`claim_batch`](crate::store::sql::claim_batch) for how batches are gathered.
//!
//! Most claims are of ids the store has never seen. A batch inserts them all with
//! one `INSERT IGNORE … VALUES (…), (…)`: a key already stored is left as it is
//! (`IGNORE` turns only its duplicate-key error into a warning: every value fits
//! its column, the keys having been checked against their columns' widths before
//! they queued). When the server inserted every row, each claim has its new
//! record. Otherwise one read of the batch's records tells which rows are this
//! batch's (its token, made at its time): those claims have their records; the
//! others decide on the record read (a known id is answered with it), and go on
//! alone, with the single claim statement, only when they may take it over or
//! replace it (expired, failed or abandoned) or when their row is gone (deleted
//! meanwhile). On MariaDB a new id claimed alone
//! costs one round trip, the insert, and a known id two, the insert and the read;
//! on MySQL each two more (see below).
//!
//! A batch waits at most 1 s for a row lock (`innodb_lock_wait_timeout`): on
//! MariaDB the insert sets it for itself alone (`SET STATEMENT … FOR`); on MySQL,
//! whose `SET_VAR` hint does not take InnoDB's variables, it is set on the
//! connection before the insert and set back to what it was after, two round trips
//! more. Which server it is, `VERSION()` tells once, on the store's first batch.
//! A key held elsewhere, by
//! an open [`record_in`](MySqlStore::record_in) transaction say, would otherwise
//! hold up the claims of every other key of the batch, or, in a batch of its own,
//! a runner and every claim queued behind it, for the server's lock wait (50 s by
//! default). A claim still queued after the pool's acquire timeout is withdrawn
//! (never made) and answers `Unavailable`. When the statement fails, every caller of the batch is
//! answered `Unavailable` if the server could not be reached, and otherwise claims
//! alone, so a lock waited out or a row the server refuses fails none of the others.

use sqlx::mysql::{MySql, MySqlConnection};
use sqlx::pool::PoolConnection;
use sqlx::Row as _;

use super::{map_err, server_error_number, MySqlStore, DEADLOCK_RETRIES};
use crate::store::sql::claim_batch::{
    failed_driver, pooled_claim_batch, Batched, ClaimBatch, Waiting,
};
use crate::store::sql::keyed_record;

/// The widest key a batch takes: the columns' widths (`VARBINARY(64)`,
/// `VARBINARY(255)`, which hold the longest namespace and id the guard accepts), so
/// that `IGNORE` never truncates one.
pub(super) fn fits(namespace: &str, id: &str) -> bool {
    namespace.len() <= 64 && id.len() <= 255
}

impl ClaimBatch for MySqlStore {
    pooled_claim_batch!();

    async fn run(&self, batch: Vec<Waiting>) {
        let inserted = match self.pool.acquire().await {
            Ok(mut conn) => in_batch(self, &mut conn, &batch).await,
            Err(e) => Err(e),
        };
        let answers: Vec<_> = batch.into_iter().map(|w| w.answer).collect();
        match inserted {
            Ok(batched) => {
                for (answer, batched) in answers.into_iter().zip(batched) {
                    let _ = answer.send(batched);
                }
            }
            Err(e) => failed_driver(answers, e, map_err),
        }
    }
}

/// How a batch bounds its wait for a row lock to 1 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LockWait {
    /// For the insert alone, `SET STATEMENT innodb_lock_wait_timeout = 1 FOR`
    /// (MariaDB): no round trip of its own.
    InStatement,
    /// On the connection's session, set before the insert and set back after
    /// (MySQL, whose `SET_VAR` hint does not take InnoDB's variables): two round
    /// trips more.
    OnSession,
}

impl LockWait {
    /// The form `conn`'s server takes: asked once per store, on its first batch.
    async fn of(store: &MySqlStore, conn: &mut MySqlConnection) -> Result<Self, sqlx::Error> {
        if let Some(known) = store.lock_wait.get() {
            return Ok(*known);
        }
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut *conn)
            .await?;
        let form = if version.contains("MariaDB") {
            Self::InStatement
        } else {
            Self::OnSession
        };
        Ok(*store.lock_wait.get_or_init(|| form))
    }
}

/// A batch on `conn`, waiting at most 1 s for a row lock (even a batch of one: a
/// runner held by a locked key would hold up every claim queued behind it): each
/// claim's answer (see [`inserted`]).
async fn in_batch(
    store: &MySqlStore,
    conn: &mut PoolConnection<MySql>,
    batch: &[Waiting],
) -> Result<Vec<Batched>, sqlx::Error> {
    match LockWait::of(store, conn).await? {
        LockWait::InStatement => {
            let prefix = "SET STATEMENT innodb_lock_wait_timeout = 1 FOR ";
            inserted(store, conn, batch, prefix).await
        }
        LockWait::OnSession => {
            sqlx::query(
                "SET @webhook_guard_lock_wait = @@SESSION.innodb_lock_wait_timeout, \
                 SESSION innodb_lock_wait_timeout = 1",
            )
            .execute(&mut **conn)
            .await?;
            let inserted = inserted(store, conn, batch, "").await;
            // The lock wait goes back to what it was (the server's, or the host's
            // own session setting) for whoever borrows the connection next; a
            // connection that cannot be set back is closed instead. (A runner
            // dropped between the two, as its runtime shuts down, leaves its
            // connection with the 1 s wait.)
            let reset =
                sqlx::query("SET SESSION innodb_lock_wait_timeout = @webhook_guard_lock_wait")
                    .execute(&mut **conn)
                    .await;
            if reset.is_err() {
                conn.close_on_drop();
            }
            inserted
        }
    }
}

/// Inserts the batch's new records with the insert `prefix`ed: each claim is
/// `Fresh` when the server inserted every row; otherwise one read of the batch's
/// keys tells them apart: `Fresh` for a row this batch inserted (its claim's token,
/// made at its time), `Existing` with the record for any other row, `Alone` for a
/// key with no row (deleted meanwhile).
async fn inserted(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    batch: &[Waiting],
    prefix: &str,
) -> Result<Vec<Batched>, sqlx::Error> {
    if insert(store, conn, batch, prefix).await? == batch.len() as u64 {
        return Ok(batch.iter().map(|_| Batched::Fresh).collect());
    }
    read_back(store, conn, batch).await
}

/// Inserts the batch's new records: how many rows the server inserted.
async fn insert(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    batch: &[Waiting],
    prefix: &str,
) -> Result<u64, sqlx::Error> {
    let statement = store.sql.claim_batch(batch.len(), prefix);
    let mut tries = 0;
    loop {
        let mut query = sqlx::query(&statement);
        for w in batch {
            // The row's `updated_at` takes `now` once more.
            query = w.bind_row(query).bind(w.now);
        }
        match query.execute(&mut *conn).await {
            Err(e) if tries < DEADLOCK_RETRIES && server_error_number(&e) == Some(1213) => {
                tries += 1;
            }
            done => return done.map(|done| done.rows_affected()),
        }
    }
}

/// Each claim's answer, from the stored records of the batch's keys, read back
/// after an insert that left some keys as they were.
async fn read_back(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    batch: &[Waiting],
) -> Result<Vec<Batched>, sqlx::Error> {
    let statement = store.sql.claim_batch_read(batch.len());
    let mut query = sqlx::query(&statement);
    for w in batch {
        query = query.bind(w.namespace.as_str()).bind(w.id.as_str());
    }
    let rows = query.fetch_all(&mut *conn).await?;
    let mut answers: Vec<Batched> = batch.iter().map(|_| Batched::Alone).collect();
    for row in &rows {
        let (namespace, id): (&[u8], &[u8]) = (row.try_get(0)?, row.try_get(1)?);
        let (token, created_at): (i64, i64) = (row.try_get(4)?, row.try_get(9)?);
        if let Some(i) = batch
            .iter()
            .position(|w| w.namespace.as_bytes() == namespace && w.id.as_bytes() == id)
        {
            answers[i] = if batch[i].token == token && batch[i].now == created_at {
                Batched::Fresh
            } else {
                match keyed_record(row, map_err) {
                    Ok(record) => Batched::Existing(record),
                    Err(e) => Batched::Failed(e),
                }
            };
        }
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ClaimRequest, FencingToken, Fingerprint, Key, Recorded};
    use chrono::Utc;
    use sqlx::mysql::MySqlPoolOptions;
    use sqlx::Connection as _;
    use std::time::Duration;

    fn waiting(id: &str) -> Waiting {
        let request = ClaimRequest::fresh(Key::new("batch", id), Utc::now());
        Waiting::new(&request, tokio::sync::oneshot::channel().0)
    }

    async fn session_wait(conn: &mut MySqlConnection) -> u64 {
        sqlx::query_scalar("SELECT @@SESSION.innodb_lock_wait_timeout")
            .fetch_one(conn)
            .await
            .unwrap()
    }

    /// Each form of the lock wait the test server takes (both on MariaDB, the
    /// session's on MySQL): a batch meeting a key locked by an open transaction
    /// gives up after 1 s, not the session's 30 s, inserts none of its rows and
    /// leaves the session's lock wait as it was; once the key is free, the same
    /// batch inserts both.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_waits_a_second_for_a_locked_key_and_leaves_the_session_wait_as_it_was() {
        let Some(url) = crate::test_server_url("WEBHOOK_GUARD_MYSQL_URL") else {
            return;
        };
        let mut conn = sqlx::MySqlConnection::connect(&url).await.unwrap();
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        let forms = if version.contains("MariaDB") {
            &[LockWait::InStatement, LockWait::OnSession][..]
        } else {
            &[LockWait::OnSession][..]
        };
        for &form in forms {
            let pool = MySqlPoolOptions::new()
                .max_connections(2)
                .connect(&url)
                .await
                .unwrap();
            let table = format!("wg_unit_{:016x}", FencingToken::random().0);
            let store = MySqlStore::new(pool).with_table(&table).unwrap();
            store.migrate().await.unwrap();
            store.lock_wait.set(form).unwrap();
            let now = Utc::now();
            let mut held = store.pool().begin().await.unwrap();
            let key = Key::new("batch", "evt_held");
            let recorded = store
                .record_in(&mut held, key, Fingerprint::of(b"{}"), now, now)
                .await
                .unwrap();
            assert_eq!(recorded, Recorded::First);
            let mut conn = store.pool().acquire().await.unwrap();
            sqlx::query("SET SESSION innodb_lock_wait_timeout = 30")
                .execute(&mut *conn)
                .await
                .unwrap();
            let batch = [waiting("evt_free"), waiting("evt_held")];

            let batched = in_batch(&store, &mut conn, &batch);
            let failed = tokio::time::timeout(Duration::from_secs(10), batched)
                .await
                .expect("the batch waited for the session's 30 s");
            let error = failed.expect_err("the held key's row is locked");
            assert_eq!(server_error_number(&error), Some(1205), "{form:?}: {error}");
            assert_eq!(session_wait(&mut conn).await, 30, "{form:?}");

            held.rollback().await.unwrap();
            let made = in_batch(&store, &mut conn, &batch).await.unwrap();
            assert!(
                made.iter().all(|m| matches!(m, Batched::Fresh)),
                "{form:?}: {made:?}"
            );
            assert_eq!(session_wait(&mut conn).await, 30, "{form:?}");
            sqlx::query(&format!(
                "DROP TABLE `{table}`, `{table}_inbox`, `{table}_objects`"
            ))
            .execute(&mut *conn)
            .await
            .unwrap();
        }
    }
}
