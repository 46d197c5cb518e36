//! The [`OrderingStore`] of a [`MySqlStore`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use super::statements::{Arg, Stmt};
use super::{map_err, retry_deadlocks, MySqlStore, CODE_FRESH, CODE_TAKEOVER, CODE_UNCHANGED};
use crate::ordering::{Freshness, ObjectKey, ObjectRecord, ObjectStatus, OrderingStore};
use crate::store::sql::{millis, time, RawObject};
use crate::store::StoreError;

fn object(row: &MySqlRow) -> Result<ObjectRecord, StoreError> {
    RawObject::read(row).map_err(map_err)?.into_record()
}

impl MySqlStore {
    /// Runs `stmt`, an `UPDATE` of the status of an object whose newest is
    /// `created_at`, binding `failed_since` too (`$7`) when given: whether it
    /// changed a row.
    async fn object_update(
        &self,
        stmt: &Stmt,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        status: ObjectStatus,
        now: DateTime<Utc>,
        failed_since: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError> {
        let args = [
            Arg::Text(key.namespace),
            Arg::Text(key.object),
            Arg::Text(key.family),
            Arg::Int(millis(created_at)),
            Arg::Text(status.as_str()),
            Arg::Int(millis(now)),
            Arg::Int(failed_since.map_or(0, millis)),
        ];
        let done = retry_deadlocks(|| stmt.bind(&args).execute(&self.pool)).await?;
        Ok(done.rows_affected() == 1)
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
        let args = [
            Arg::Text(key.namespace),
            Arg::Text(key.object),
            Arg::Text(key.family),
            Arg::Int(millis(created_at)),
            Arg::Int(millis(now)),
        ];
        let done = retry_deadlocks(|| q.observe.bind(&args).execute(&self.pool)).await?;
        match done.last_insert_id() {
            // 3: a retry, or another event created at the same time.
            0 | CODE_FRESH | CODE_TAKEOVER => return Ok(Freshness::Fresh),
            CODE_UNCHANGED => {}
            code => return Err(StoreError::Corrupt(format!("observe answered code {code}"))),
        }
        // Refused: a newer event is stored (records are never deleted, and the
        // newest only grows), so this read finds it.
        let row = retry_deadlocks(|| {
            self.sql
                .common
                .newest
                .bind(&args[..3])
                .fetch_one(&self.pool)
        })
        .await?;
        let newest: i64 = row.try_get(0).map_err(map_err)?;
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
        let stmt = &self.sql.common.settle_object;
        if self
            .object_update(stmt, key, created_at, status, now, None)
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
        let stmt = &self.sql.common.mark_object;
        self.object_update(stmt, key, created_at, status, now, None)
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
        let stmt = &self.sql.common.mark_if_failed;
        self.object_update(stmt, key, created_at, status, now, Some(failed_since))
            .await
    }

    async fn get_object(&self, key: ObjectKey<'_>) -> Result<Option<ObjectRecord>, StoreError> {
        let args = [
            Arg::Text(key.namespace),
            Arg::Text(key.object),
            Arg::Text(key.family),
        ];
        let stmt = &self.sql.common.get_object;
        let row = retry_deadlocks(|| stmt.bind(&args).fetch_optional(&self.pool)).await?;
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
        let args = [
            Arg::Text(namespace),
            Arg::Int(millis(before)),
            Arg::Limit(limit as u64),
        ];
        let stmt = &self.sql.common.failed;
        let rows = retry_deadlocks(|| stmt.bind(&args).fetch_all(&self.pool)).await?;
        rows.iter().map(object).collect()
    }
}
