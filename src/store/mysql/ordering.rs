//! What the MySQL dialect writes its own way of the
//! [`OrderingStore`](crate::ordering::OrderingStore) contract of a [`MySqlStore`]:
//! the decide-once upsert of `observe` (the rest is shared: see `sql_store_impls!`).

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{map_err, retry_deadlocks, MySqlStore, CODE_FRESH, CODE_TAKEOVER, CODE_UNCHANGED};
use crate::ordering::{Freshness, ObjectKey};
use crate::store::sql::{args, time, Statement};
use crate::store::StoreError;

impl MySqlStore {
    /// The ordering upsert: its code tells fresh from stale, and a stale event
    /// reads the newest stored.
    pub(super) async fn observe_object(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Freshness, StoreError> {
        let q = &self.sql.queue;
        let args = args::observe(key, created_at, now);
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
}
