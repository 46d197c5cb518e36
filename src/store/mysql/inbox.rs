//! The [`InboxStore`] of a [`MySqlStore`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{Connection, Row};

use super::statements::Arg;
use super::{
    map_err, retry_deadlocks, server_error_number, MySqlStore, CODE_FRESH, CODE_UNCHANGED,
    DEADLOCK_RETRIES, SETTLED_PURGE, VANISHED_RETRIES,
};
use crate::inbox::{Enqueued, InboxEvent, InboxStore, NewEvent, Settle};
use crate::store::sql::{self as shared, ceil_millis, fence, millis, purge_in_batches, RawEvent};
use crate::store::{Fence, FencingToken, Key, StoreError};

fn event(row: &MySqlRow) -> Result<InboxEvent, StoreError> {
    RawEvent::read(row).map_err(map_err)?.into_event()
}

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

#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
#[async_trait]
impl InboxStore for MySqlStore {
    async fn enqueue(&self, event: &NewEvent<'_>) -> Result<Enqueued, StoreError> {
        let q = &self.sql.queue;
        let key = event.key;
        let args = [
            Arg::Text(key.namespace),
            Arg::Text(key.id),
            Arg::Bytes(&event.fingerprint.0),
            Arg::OptText(event.meta.event_type.as_deref()),
            Arg::OptInt(event.meta.created_at.map(millis)),
            Arg::OptText(event.meta.object.as_deref()),
            Arg::OptText(event.meta.family.as_deref()),
            Arg::Bytes(event.payload),
            Arg::Int(millis(event.now)),
            Arg::Int(ceil_millis(event.expires_at)),
        ];
        for _ in 0..VANISHED_RETRIES {
            let done = retry_deadlocks(|| q.enqueue.bind(&args).execute(&self.pool)).await?;
            match done.last_insert_id() {
                0 | CODE_FRESH => return Ok(Enqueued::Inserted),
                CODE_UNCHANGED => {}
                code => return Err(StoreError::Corrupt(format!("enqueue answered code {code}"))),
            }
            let row = retry_deadlocks(|| {
                self.sql
                    .common
                    .existing
                    .bind(&args[..2])
                    .fetch_optional(&self.pool)
            })
            .await?;
            if let Some(row) = row {
                let fingerprint: Vec<u8> = row.try_get(0).map_err(map_err)?;
                let state: Vec<u8> = row.try_get(1).map_err(map_err)?;
                let state = String::from_utf8(state)
                    .map_err(|_| StoreError::Corrupt("state is not UTF-8".into()))?;
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
        let args = [
            Arg::Text(key.namespace),
            Arg::Text(key.id),
            Arg::Int(token.as_i64()),
            Arg::Text(settle.state.as_str()),
            Arg::Int(ceil_millis(settle.next_attempt_at)),
            Arg::OptText(settle.error),
            Arg::Int(millis(settle.now)),
            Arg::Int(ceil_millis(settle.expires_at)),
            Arg::Count(u32::from(!settle.attempt_counts)),
        ];
        let done =
            retry_deadlocks(|| self.sql.common.settle.bind(&args).execute(&self.pool)).await?;
        if done.rows_affected() == 0 {
            // The same settle made again (its answer was lost)?
            let event = self.get_event(key).await?;
            if event.is_some_and(|e| crate::inbox::settled_already(&e, token, settle)) {
                return Ok(Fence::Applied);
            }
        }
        Ok(fence(done.rows_affected()))
    }

    async fn renew_event(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        let args = [
            Arg::Text(key.namespace),
            Arg::Text(key.id),
            Arg::Int(token.as_i64()),
            Arg::Int(ceil_millis(lease_until)),
        ];
        let done =
            retry_deadlocks(|| self.sql.common.renew_event.bind(&args).execute(&self.pool)).await?;
        Ok(fence(done.rows_affected()))
    }

    async fn get_event(&self, key: Key<'_>) -> Result<Option<InboxEvent>, StoreError> {
        let args = [Arg::Text(key.namespace), Arg::Text(key.id)];
        let row = retry_deadlocks(|| {
            self.sql
                .common
                .get_event
                .bind(&args)
                .fetch_optional(&self.pool)
        })
        .await?;
        row.as_ref().map(event).transpose()
    }

    async fn purge_settled(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let now = millis(now);
        purge_in_batches(limit, SETTLED_PURGE, |n| async move {
            let args = [Arg::Int(now), Arg::Limit(n as u64)];
            retry_deadlocks(|| self.sql.queue.purge.bind(&args).execute(&self.pool))
                .await
                .map(|done| done.rows_affected())
        })
        .await
    }
}
