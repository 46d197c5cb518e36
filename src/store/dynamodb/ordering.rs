//! The ordering ledger of a [`DynamoDbStore`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{
    checked_key, codec, millis, n, push_part, s, time, DynamoDbStore, Expr, Item, Write, PAGE,
};
use crate::ordering::{
    FailedMark, FailedPage, Freshness, ObjectKey, ObjectMark, ObjectRecord, ObjectStatus,
    Observation, OrderingStore,
};
use crate::store::StoreError;

/// The `pk` of the ordering record of `key`.
fn object_pk(key: ObjectKey<'_>) -> Result<String, StoreError> {
    let mut pk = String::from("o/");
    push_part(&mut pk, key.namespace);
    pk.push('/');
    push_part(&mut pk, key.object);
    pk.push('/');
    pk.push_str(key.family);
    checked_key(pk)
}

/// The `due` partition of `namespace`'s failed objects.
fn failed_pk(namespace: &str) -> String {
    format!("o/failed/{namespace}")
}

/// `SET #status = :status, #updated_at = :now` plus the index entry of the new
/// status: filed while `Failed`, out of the index otherwise.
fn set_status(e: &mut Expr, key: ObjectKey<'_>, status: ObjectStatus, now: i64) -> String {
    let mut update = format!(
        "SET {}, {}",
        e.eq("status", "status", s(status.as_str())),
        e.eq("updated_at", "now", n(now)),
    );
    if status == ObjectStatus::Failed {
        update.push_str(&format!(
            ", {}, {}",
            e.eq("due_pk", "due_pk", s(failed_pk(key.namespace))),
            e.eq("due_at", "now", n(now)),
        ));
    } else {
        update.push_str(&format!(" REMOVE {}, {}", e.n("due_pk"), e.n("due_at")));
    }
    update
}

/// `#status <op> :pending`.
fn status_vs_pending(e: &mut Expr, op: &str) -> String {
    let pending = e.v("pending", s(ObjectStatus::Pending.as_str()));
    format!("{} {op} {pending}", e.n("status"))
}

impl DynamoDbStore {
    /// Sets the status of `key` if its newest is `created_at` and `extra` (a
    /// condition on the stored record, may be empty) holds: whether it was set, and
    /// the stored item when it was not (if DynamoDB sent it).
    async fn set_object_status(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        status: ObjectStatus,
        now: DateTime<Utc>,
        extra: &(dyn Fn(&mut Expr) -> String + Sync),
    ) -> Result<Write<Item>, StoreError> {
        let pk = object_pk(key)?;
        let mut e = Expr::default();
        let update = set_status(&mut e, key, status, millis(now));
        let mut condition = e.eq("newest", "created", n(millis(created_at)));
        let extra = extra(&mut e);
        if !extra.is_empty() {
            condition = format!("{condition} AND {extra}");
        }
        self.update_if(&pk, &update, &condition, e).await
    }
}

#[async_trait]
impl OrderingStore for DynamoDbStore {
    async fn observe(&self, event: &Observation<'_>) -> Result<Freshness, StoreError> {
        let (key, created_at, now) = (event.key, event.created_at, event.now);
        let pk = object_pk(key)?;
        let created = millis(created_at);
        let now = millis(now);
        for _ in 0..16 {
            // A known object: one conditional update (the common case: providers
            // send several events per object).
            let mut e = Expr::default();
            let update = format!(
                "SET {}, {}, {} REMOVE {}, {}",
                e.eq("newest", "created", n(created)),
                e.eq("status", "status", s(ObjectStatus::Pending.as_str())),
                e.eq("updated_at", "now", n(now)),
                e.n("due_pk"),
                e.n("due_at"),
            );
            let condition = format!(
                "attribute_exists({}) AND {} < {}",
                e.n("pk"),
                e.n("newest"),
                e.v("created", n(created)),
            );
            let sent = match self.update_if(&pk, &update, &condition, e).await? {
                Write::Done(_) => return Ok(Freshness::Fresh),
                Write::Refused(sent) => sent,
            };
            let found = match sent {
                Some(item) if !item.is_empty() => Some(item),
                _ => self.get_item(&pk).await?,
            };
            if let Some(item) = found {
                let newest = codec::int(&item, "newest")?;
                if newest < created {
                    continue; // changed since: decide again
                }
                // Equal: a retry, or another event created at the same time (the
                // first settled wins).
                return Ok(if newest == created {
                    Freshness::Fresh
                } else {
                    Freshness::Stale {
                        newest: time(newest),
                    }
                });
            }
            // A new object: one conditional put of the whole record (never an
            // update creating it, which would be visible half made on a server
            // that does not apply it as one step).
            let record = ObjectRecord::new(key, time(created), ObjectStatus::Pending, time(now));
            let item = codec::object_item(&record, &pk);
            let mut e = Expr::default();
            let condition = format!("attribute_not_exists({})", e.n("pk"));
            if let Write::Done(()) = self.put_if(item, &condition, e).await? {
                return Ok(Freshness::Fresh);
            }
            // Created meanwhile by another observation: decide on it.
        }
        Err(StoreError::unavailable(std::io::Error::other(
            "webhook-guard: the DynamoDB ordering record kept changing under the observation",
        )))
    }

    async fn settle_object(&self, mark: &ObjectMark<'_>) -> Result<bool, StoreError> {
        let pending = |e: &mut Expr| status_vs_pending(e, "=");
        // The first settle of this time sets it.
        let first = self
            .set_object_status(mark.key, mark.created_at, mark.status, mark.now, &pending)
            .await?;
        if matches!(first, Write::Done(_)) {
            return Ok(true);
        }
        // A later one sets only a failure, so that a failure is never hidden.
        if mark.status == ObjectStatus::Failed {
            let settled = |e: &mut Expr| status_vs_pending(e, "<>");
            let again = self
                .set_object_status(mark.key, mark.created_at, mark.status, mark.now, &settled)
                .await?;
            if let Write::Refused(_) = again {
                // Pending again between the two writes (a mark by the host): this
                // settle is then the first after all.
                let won = self
                    .set_object_status(mark.key, mark.created_at, mark.status, mark.now, &pending)
                    .await?;
                return Ok(matches!(won, Write::Done(_)));
            }
        }
        Ok(false)
    }

    async fn mark_object(&self, mark: &ObjectMark<'_>) -> Result<bool, StoreError> {
        let set = self
            .set_object_status(mark.key, mark.created_at, mark.status, mark.now, &|_| {
                String::new()
            })
            .await?;
        Ok(matches!(set, Write::Done(_)))
    }

    async fn mark_object_if_failed(&self, mark: &FailedMark<'_>) -> Result<bool, StoreError> {
        let still_failed = |e: &mut Expr| {
            format!(
                "{} AND {} <= {}",
                e.eq("status", "failed", s(ObjectStatus::Failed.as_str())),
                e.n("updated_at"),
                e.v("since", n(millis(mark.failed_since))),
            )
        };
        let set = self
            .set_object_status(
                mark.key,
                mark.created_at,
                mark.status,
                mark.now,
                &still_failed,
            )
            .await?;
        Ok(matches!(set, Write::Done(_)))
    }

    async fn get_object(&self, key: ObjectKey<'_>) -> Result<Option<ObjectRecord>, StoreError> {
        let pk = object_pk(key)?;
        let item = self.get_item(&pk).await?;
        item.map(|item| codec::object(&item)).transpose()
    }

    async fn failed_objects(&self, page: &FailedPage<'_>) -> Result<Vec<ObjectRecord>, StoreError> {
        let (namespace, before, limit) = (page.namespace, page.before, page.limit);
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let due_pk = failed_pk(namespace);
        let mut start = None;
        while out.len() < limit {
            let (pks, next) = self
                .due_page(
                    &due_pk,
                    millis(before),
                    (limit - out.len()).min(PAGE),
                    start,
                )
                .await?;
            let mut page: Vec<ObjectRecord> = Vec::with_capacity(pks.len());
            for item in self.get_many(&pks).await? {
                let record = codec::object(&item)?;
                if record.status == ObjectStatus::Failed && record.updated_at <= before {
                    page.push(record);
                }
            }
            page.sort_by_key(|r| r.updated_at);
            out.extend(page.into_iter().take(limit - out.len()));
            match next {
                Some(next) => start = Some(next),
                None => break,
            }
        }
        Ok(out)
    }
}
