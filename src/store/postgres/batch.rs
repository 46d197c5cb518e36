//! The PostgreSQL claim batch: the claim upsert for many keys at once, its values
//! passed as arrays (`INSERT … SELECT … FROM unnest(…) ON CONFLICT … RETURNING`).
//! See [`claim_batch`](crate::store::sql::claim_batch) for how batches are gathered.
//!
//! The statement answers the rows it claimed and, in the same statement, the stored
//! records of the keys it did not claim, as its snapshot has them (each row says
//! whether it was claimed): a refused claim decides on that record without reading
//! it again, so a duplicate costs one round trip, and claims again only when the
//! record read may be taken over or replaced (changed since the snapshot). A key it
//! answered no row for was refused by a record stored after its snapshot began (by
//! a concurrent transaction), and its caller goes on as a refused single claim does
//! (reads the record, and decides). A batch waits at most 250 ms for a row lock
//! (`lock_timeout`, for its own transaction): a key held elsewhere, by an open
//! [`record_in`](PostgresStore::record_in) transaction say, would otherwise hold up
//! the claims of every other key of the batch, or, in a batch of its own, hold a
//! runner and so every claim queued behind it. When the statement fails, every
//! caller of the batch is answered `Unavailable` if the server could not be
//! reached, and is otherwise told to claim alone, with the single statement, so
//! that one row the server refuses (a NUL in an id a host passed straight to the
//! store) fails only its own claim, and a lock waited out fails none.

use super::PostgresStore;
use crate::store::sql::claim_batch::{
    answer_upserted, failed_driver, pooled_claim_batch, ClaimBatch, Waiting,
};
use crate::store::Fingerprint;

impl ClaimBatch for PostgresStore {
    pooled_claim_batch!();

    async fn run(&self, batch: Vec<Waiting>) {
        claim_batch(self, batch).await;
    }
}

/// The batch's values, one array per column of the single claim.
#[derive(Default)]
struct Columns {
    namespace: Vec<String>,
    id: Vec<String>,
    fingerprint: Vec<[u8; 32]>,
    token: Vec<i64>,
    lease_until: Vec<i64>,
    expires_at: Vec<i64>,
    now: Vec<i64>,
}

/// Runs the batched claim for `batch` and answers each of its callers.
async fn claim_batch(store: &PostgresStore, batch: Vec<Waiting>) {
    let statement = store
        .sql
        .claim_batch
        .as_deref()
        .expect("PostgreSQL statements have a batched claim");
    let mut columns = Columns::default();
    let mut answers = Vec::with_capacity(batch.len());
    for w in batch {
        answers.push(w.answer);
        columns.namespace.push(w.namespace);
        columns.id.push(w.id);
        columns.fingerprint.push(w.fingerprint.0);
        columns.token.push(w.token);
        columns.lease_until.push(w.lease_until);
        columns.expires_at.push(w.expires_at);
        columns.now.push(w.now);
    }
    let rows = sqlx::query(statement)
        .bind(&columns.namespace)
        .bind(&columns.id)
        .bind(&columns.fingerprint)
        .bind(&columns.token)
        .bind(&columns.lease_until)
        .bind(&columns.expires_at)
        .bind(&columns.now)
        .bind(&Fingerprint::UNKNOWN.0[..])
        .fetch_all(&store.pool)
        .await;
    match rows {
        Ok(rows) => {
            let keys: Vec<_> = columns.namespace.into_iter().zip(columns.id).collect();
            answer_upserted(&keys, answers, &rows, super::err);
        }
        Err(e) => failed_driver(answers, e, super::err),
    }
}
