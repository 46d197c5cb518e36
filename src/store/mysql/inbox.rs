//! What the MySQL dialect writes its own way of the
//! [`InboxStore`](crate::inbox::InboxStore) contract of a [`MySqlStore`]: the
//! decide-once enqueue and the lease transaction (the rest is shared: see
//! `sql_store_impls!`).

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{Connection, Row};

use super::{map_err, retry_deadlocks, MySqlStore, CODE_FRESH, CODE_UNCHANGED, VANISHED_RETRIES};
use crate::inbox::{Enqueued, NewEvent};
use crate::store::sql::{self as shared, args, ceil_millis, millis, Arg, SqlRow, Statement};
use crate::store::{FencingToken, StoreError};

/// `(?, ?, …)` with `n` marks, for an `IN` list of binds.
fn marks(n: usize) -> String {
    let mut list = "?, ".repeat(n);
    list.truncate(list.len().saturating_sub(2));
    format!("({list})")
}

impl MySqlStore {
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
        let picked = q
            .pick
            .bind(&[
                Arg::Text(namespace),
                Arg::Int(now),
                Arg::Limit(limit as u64),
            ])
            .fetch_all(&mut *tx)
            .await?;
        let ids = picked
            .iter()
            .map(|row| row.try_get::<Vec<u8>, _>(0))
            .collect::<Result<Vec<_>, _>>()?;
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

impl MySqlStore {
    /// The enqueue: one decide-once upsert, then a read of the stored event unless
    /// it was inserted or replaced.
    pub(super) async fn enqueue_event(&self, event: &NewEvent<'_>) -> Result<Enqueued, StoreError> {
        let q = &self.sql.queue;
        let key = event.key;
        let args = args::enqueue(event);
        for _ in 0..VANISHED_RETRIES {
            let done = retry_deadlocks(|| q.enqueue.bind(&args).execute(&self.pool)).await?;
            match done.last_insert_id() {
                0 | CODE_FRESH => return Ok(Enqueued::Inserted),
                CODE_UNCHANGED => {}
                code => return Err(StoreError::Corrupt(format!("enqueue answered code {code}"))),
            }
            let existing = &self.sql.common.existing;
            if let Some(row) = self.fetch_optional(existing, &args[..2]).await? {
                let fingerprint = row.bytes(0).map_err(map_err)?;
                let state = row.text(1).map_err(map_err)?;
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

    /// The lease: one transaction in a task of its own.
    pub(super) async fn lease_events(
        &self,
        namespace: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<MySqlRow>, StoreError> {
        let (now, until) = (millis(now), ceil_millis(lease_until));
        // The transaction runs in its own task, to completion even if the caller's
        // future is dropped: sqlx 0.8's `begin` is not cancellation-safe (a future
        // dropped while `BEGIN` is in flight returns its connection to the pool
        // inside a transaction that nothing ends, launchbadge/sqlx#2054). Events
        // leased for a caller that went away are leased again when their lease ends.
        let store = self.clone();
        let namespace = namespace.to_owned();
        tokio::spawn(async move {
            retry_deadlocks(|| store.lease_once(&namespace, now, until, limit)).await
        })
        .await
        .map_err(StoreError::backend)?
    }
}
