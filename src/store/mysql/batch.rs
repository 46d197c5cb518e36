//! The MySQL / MariaDB claim batch: the claims of concurrent deliveries inserted as
//! new records in one statement and one commit. See
//! [`claim_batch`](crate::store::claim_batch) for how batches are gathered.
//!
//! Most claims are of ids the store has never seen. A batch inserts them all with one `INSERT IGNORE … VALUES (…), (…)`: a key already
//! stored is left as it is (`IGNORE` turns only its duplicate-key error into a
//! warning: every value fits its column, the keys having been checked against
//! their columns' widths before they queued). When the server inserted every row,
//! each claim has its new record. Otherwise one read of the batch's keys tells which
//! rows are this batch's (its token, made at its time): those claims have their
//! records, and the others go on alone, with the single claim statement, which
//! decides on the stored record (a known id, expired, failed or held). A claim
//! alone is a batch of one: it costs three round trips instead of one (setting the
//! lock wait, the insert, setting it back), and a known id the single statement
//! after them.
//!
//! A batch waits at most 1 s for a row lock (`innodb_lock_wait_timeout`, set on
//! its connection for the statement and set back to what it was after): a key held elsewhere, by
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
use crate::store::claim_batch::{failed_driver, Batched, ClaimBatch, ClaimBatcher, Waiting};

/// The widest key a batch takes: the columns' widths (`VARBINARY(64)`,
/// `VARBINARY(255)`, the longest namespace and id the guard accepts), so that
/// `IGNORE` never truncates one.
pub(super) fn fits(namespace: &str, id: &str) -> bool {
    namespace.len() <= 64 && id.len() <= crate::MAX_ID_LEN
}

impl ClaimBatch for MySqlStore {
    const RUNNERS: usize = 2;

    fn batcher(&self) -> &ClaimBatcher {
        &self.batcher
    }

    /// As long as the claim would wait for a connection of the pool.
    fn patience(&self) -> std::time::Duration {
        self.pool.options().get_acquire_timeout()
    }

    async fn run(&self, batch: Vec<Waiting>) {
        let inserted = match self.pool.acquire().await {
            Ok(mut conn) => in_batch(self, &mut conn, &batch).await,
            Err(e) => Err(e),
        };
        let answers: Vec<_> = batch.into_iter().map(|w| w.answer).collect();
        match inserted {
            Ok(made) => {
                for (answer, made) in answers.into_iter().zip(made) {
                    let _ = answer.send(if made { Batched::Fresh } else { Batched::Alone });
                }
            }
            Err(e) => failed_driver(answers, e, map_err),
        }
    }
}

/// A batch on `conn`, waiting at most 1 s for a row lock (even a batch of one: a
/// runner held by a locked key would hold up every claim queued behind it): which
/// of its claims inserted their records.
async fn in_batch(
    store: &MySqlStore,
    conn: &mut PoolConnection<MySql>,
    batch: &[Waiting],
) -> Result<Vec<bool>, sqlx::Error> {
    sqlx::query(
        "SET @webhook_guard_lock_wait = @@SESSION.innodb_lock_wait_timeout, \
         SESSION innodb_lock_wait_timeout = 1",
    )
    .execute(&mut **conn)
    .await?;
    let inserted = match insert(store, conn, batch).await {
        Ok(n) if n == batch.len() as u64 => Ok(vec![true; batch.len()]),
        Ok(0) => Ok(vec![false; batch.len()]),
        Ok(_) => made(store, conn, batch).await,
        Err(e) => Err(e),
    };
    // The lock wait goes back to what it was (the server's, or the host's own
    // session setting) for whoever borrows the connection next; a connection that
    // cannot be set back is closed instead. (A runner dropped between the two, as
    // its runtime shuts down, leaves its connection with the 1 s wait.)
    let reset = sqlx::query("SET SESSION innodb_lock_wait_timeout = @webhook_guard_lock_wait")
        .execute(&mut **conn)
        .await;
    if reset.is_err() {
        conn.close_on_drop();
    }
    inserted
}

/// Inserts the batch's new records: how many rows the server inserted.
async fn insert(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    batch: &[Waiting],
) -> Result<u64, sqlx::Error> {
    let statement = store.sql.claim_batch(batch.len());
    let mut tries = 0;
    loop {
        let mut query = sqlx::query(&statement);
        for w in batch {
            query = query
                .bind(w.namespace.as_str())
                .bind(w.id.as_str())
                .bind(&w.fingerprint.0[..])
                .bind(w.token)
                .bind(w.lease_until)
                .bind(w.expires_at)
                .bind(w.now)
                .bind(w.now);
        }
        match query.execute(&mut *conn).await {
            Err(e) if tries < DEADLOCK_RETRIES && server_error_number(&e) == Some(1213) => {
                tries += 1;
            }
            done => return done.map(|done| done.rows_affected()),
        }
    }
}

/// Which of the batch's keys hold the record its claim inserted (its token, made
/// at its time), read back after an insert that left some keys as they were.
async fn made(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    batch: &[Waiting],
) -> Result<Vec<bool>, sqlx::Error> {
    let statement = store.sql.claim_batch_read(batch.len());
    let mut query = sqlx::query(&statement);
    for w in batch {
        query = query.bind(w.namespace.as_str()).bind(w.id.as_str());
    }
    let rows = query.fetch_all(&mut *conn).await?;
    let mut made = vec![false; batch.len()];
    for row in &rows {
        let (namespace, id): (&[u8], &[u8]) = (row.try_get(0)?, row.try_get(1)?);
        let (token, created_at): (i64, i64) = (row.try_get(2)?, row.try_get(3)?);
        if let Some(i) = batch
            .iter()
            .position(|w| w.namespace.as_bytes() == namespace && w.id.as_bytes() == id)
        {
            made[i] = batch[i].token == token && batch[i].now == created_at;
        }
    }
    Ok(made)
}
