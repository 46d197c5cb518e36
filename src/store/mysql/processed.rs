//! The [`ProcessedStore`] of a [`MySqlStore`], and its transactional record.

use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlConnection, MySqlQueryResult};
use sqlx::Row;

use super::{
    batch, map_err, retry_deadlocks, MySqlStore, CODE_FRESH, CODE_TAKEOVER, CODE_UNCHANGED,
    PURGE_PACE, VANISHED_RETRIES,
};
use crate::store::sql::{self as shared, args, ceil_millis, millis, time, Arg, Statement};
use crate::store::{
    Claim, ClaimRequest, Decision, Deleted, Fingerprint, Key, ProcessedStore, Record, RecordState,
    Recorded, StoreError,
};

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

impl MySqlStore {
    async fn run_claim(&self, req: &ClaimRequest<'_>) -> Result<MySqlQueryResult, StoreError> {
        let args = args::claim(req);
        retry_deadlocks(|| self.sql.claim.bind(&args).execute(&self.pool)).await
    }

    /// Records `key` as processed inside the caller's transaction: the
    /// **transactional mode**, for handlers whose effect lives in this same database.
    ///
    #[doc = include_str!("../sql/record_in.md")]
    /// A concurrent transaction recording the same key waits on the row lock until this
    /// one ends: after a commit it answers `Duplicate`, after a rollback `First`. So
    /// whatever instruction the process dies at, the effect is applied exactly once.
    ///
    /// InnoDB may end a transaction as a deadlock victim (error 1213, a
    /// [`StoreError::Backend`] whose source is the [`sqlx::Error`]): it was rolled
    /// back whole, effect included, so run the whole transaction again.
    ///
    /// On a known id the statement sets the session's `LAST_INSERT_ID()` (to its
    /// decision code, 1 to 3; see [`MySqlStore::claim_sql`]): read an
    /// `AUTO_INCREMENT` id you need before calling this, not after.
    ///
    #[doc = include_str!("../sql/record_in_lock.md")]
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
        let args = args::record(key, &fingerprint, now, expires_at);
        let done = q
            .record
            .bind(&args)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        match done.last_insert_id() {
            0 | CODE_FRESH | CODE_TAKEOVER => return Ok(Recorded::First),
            CODE_UNCHANGED => {}
            code => return Err(StoreError::Corrupt(format!("record answered code {code}"))),
        }
        let stored = q
            .recorded
            .bind(&args[..2])
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_err)?;
        let row = stored.ok_or_else(|| {
            StoreError::backend(format!("the record of {key} vanished during record_in"))
        })?;
        let (stored, state): (Vec<u8>, Vec<u8>) = (
            row.try_get(0).map_err(map_err)?,
            row.try_get(1).map_err(map_err)?,
        );
        shared::recorded(&stored, &state, fingerprint, key)
    }

    /// One purge statement of up to `n` rows, under `READ COMMITTED`: InnoDB then
    /// locks only the rows it deletes, never the gaps of the `by_expiry` range it
    /// walks, so a claim inserting next to them never waits for the purge.
    async fn purge_once(&self, now: i64, n: usize) -> Result<u64, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        sqlx::Executor::execute(&mut *conn, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .await?;
        let done = self
            .sql
            .purge
            .bind(&[Arg::Int(now), Arg::Limit(n as u64)])
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
}

/// What the MySQL dialect writes its own way of the [`ProcessedStore`] contract (the
/// rest is shared: see `sql_store_impls!`).
impl MySqlStore {
    /// The claim: in a batch first, then alone with the decide-once upsert.
    pub(super) async fn claim_record(
        &self,
        request: &ClaimRequest<'_>,
    ) -> Result<Claim, StoreError> {
        if batch::fits(request.key.namespace, request.key.id) {
            use crate::store::sql::claim_batch::{Batched, ClaimBatcher};
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
            match self.get(request.key).await? {
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

    /// The delete, with a probe of the lease to tell why not.
    pub(super) async fn delete_record(
        &self,
        key: Key<'_>,
        now: DateTime<Utc>,
    ) -> Result<Deleted, StoreError> {
        let args = args::key_at(key, now);
        for _ in 0..VANISHED_RETRIES {
            if self.execute(&self.sql.common.delete, &args).await? > 0 {
                return Ok(Deleted::Removed);
            }
            let live = self.fetch_optional(&self.sql.probe, &args).await?;
            match live.map(|row| row.try_get::<i64, _>(0)).transpose() {
                Err(e) => return Err(map_err(e)),
                Ok(None) => return Ok(Deleted::NotFound),
                Ok(Some(0)) => continue, // its lease ended in between: try again
                Ok(Some(_)) => return Ok(Deleted::LeaseHeld),
            }
        }
        Err(StoreError::backend(format!(
            "the record of {key} changed {VANISHED_RETRIES} times during a delete"
        )))
    }

    /// The purge, in paced statements under `READ COMMITTED`.
    pub(super) async fn purge_records(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64, StoreError> {
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
}
