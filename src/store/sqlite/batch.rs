//! The SQLite claim batch: the claim upsert for many keys at once, one `VALUES`
//! row each, in one statement and one commit (the commit's fsync is what a write
//! costs here). See [`claim_batch`](crate::store::sql::claim_batch) for how batches are
//! gathered; one runs at a time, since the store's writes take turns at its write
//! gate anyway.
//!
//! The statement answers the rows it claimed; a key it did not answer was refused
//! by its stored record, and its caller goes on as a refused single claim does.
//! When the statement fails, every caller of the batch is answered `Unavailable` if
//! the file could not serve it (busy or locked past the timeout, full, unreadable),
//! and is otherwise told to claim alone, with the single statement, so one row
//! that fails fails only its own claim. A claim still queued after as long as a
//! write waits at the write gate (5 s) is withdrawn, never made, and answers
//! `Unavailable`, as a write queued at the gate does.

use super::SqliteStore;
use crate::store::sql::claim_batch::{
    answer_upserted, failed, failed_driver, ClaimBatch, ClaimBatcher, Waiting,
};
use crate::store::Fingerprint;

impl ClaimBatch for SqliteStore {
    const RUNNERS: usize = 1;

    fn batcher(&self) -> &ClaimBatcher {
        &self.batcher
    }

    /// The write gate's wait: a claim queued behind a batch that waits out a lock
    /// held elsewhere is withdrawn after it, as a write queued at the gate gives up.
    fn patience(&self) -> std::time::Duration {
        super::BUSY_TIMEOUT
    }

    async fn run(&self, batch: Vec<Waiting>) {
        let statement = self.sql.claim_values(batch.len());
        let rows = {
            let mut query = sqlx::query(&statement);
            for w in &batch {
                query = w.bind_row(query);
            }
            let query = query.bind(&Fingerprint::UNKNOWN.0[..]);
            match self.write_gate().await {
                // Read to the end: SQLite commits an autocommit `INSERT …
                // RETURNING` only then (see the single claim).
                Ok(_gate) => Ok(query.fetch_all(&self.pool).await),
                Err(e) => Err(e),
            }
        };
        let (keys, answers): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .map(|w| ((w.namespace, w.id), w.answer))
            .unzip();
        match rows {
            Ok(Ok(rows)) => answer_upserted(&keys, answers, &rows, super::err),
            Ok(Err(e)) => failed_driver(answers, e, super::err),
            Err(e) => failed(answers, e),
        }
    }
}
