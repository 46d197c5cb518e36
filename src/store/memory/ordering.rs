//! The in-memory ordering ledger, kept by [`MemoryStore`].

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::lock;
use crate::ordering::{
    FailedMark, FailedPage, Freshness, ObjectKey, ObjectMark, ObjectRecord, ObjectStatus,
    Observation, OrderingStore,
};
use crate::store::{MemoryStore, StoreError};

type ObjectKeyOwned = (String, String, String);

/// The ledger's key of `key`: (namespace, object, family).
fn owned(key: ObjectKey<'_>) -> ObjectKeyOwned {
    (
        key.namespace.to_owned(),
        key.object.to_owned(),
        key.family.to_owned(),
    )
}

/// The ordering ledger of a [`MemoryStore`], with an index of failed objects per
/// namespace by when they last changed (what `failed_objects` reads).
#[derive(Debug, Default)]
pub(super) struct Ledger {
    objects: HashMap<ObjectKeyOwned, ObjectRecord>,
    /// (namespace, updated_at, object, family) for every `Failed` object.
    failed: BTreeSet<(String, DateTime<Utc>, String, String)>,
}

impl Ledger {
    fn failed_entry(r: &ObjectRecord) -> (String, DateTime<Utc>, String, String) {
        (
            r.namespace.clone(),
            r.updated_at,
            r.object.clone(),
            r.family.clone(),
        )
    }

    /// Applies `change` to the record under `k`, keeping the failed index in step.
    fn change<T>(
        &mut self,
        k: &ObjectKeyOwned,
        change: impl FnOnce(&mut ObjectRecord) -> T,
    ) -> Option<T> {
        let r = self.objects.get_mut(k)?;
        if r.status == ObjectStatus::Failed {
            self.failed.remove(&Self::failed_entry(r));
        }
        let answer = change(r);
        if r.status == ObjectStatus::Failed {
            self.failed.insert(Self::failed_entry(r));
        }
        Some(answer)
    }
}

impl MemoryStore {
    /// Sets the status of the object under `key` if its newest is `created_at` and
    /// `decide(current record)` says to (`.0`); answers `decide`'s `.1`, or `false`
    /// without such a record.
    fn set_object_status(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        decide: impl FnOnce(&ObjectRecord) -> (bool, bool),
        status: ObjectStatus,
        now: DateTime<Utc>,
    ) -> bool {
        let mut ledger = lock(self.ledger());
        let k = owned(key);
        ledger
            .change(&k, |r| {
                if r.newest != created_at {
                    return false;
                }
                let (set, answer) = decide(r);
                if set {
                    r.status = status;
                    r.updated_at = now;
                }
                answer
            })
            .unwrap_or(false)
    }
}

#[async_trait]
impl OrderingStore for MemoryStore {
    async fn observe(&self, event: &Observation<'_>) -> Result<Freshness, StoreError> {
        let (key, created_at, now) = (event.key, event.created_at, event.now);
        let mut ledger = lock(self.ledger());
        let k = owned(key);
        let seen = ledger.change(&k, |r| {
            if created_at < r.newest {
                return Freshness::Stale { newest: r.newest };
            }
            // Equal: a retry, or another event created at the same time (the first
            // settled wins).
            if created_at > r.newest {
                r.newest = created_at;
                r.status = ObjectStatus::Pending;
                r.updated_at = now;
            }
            Freshness::Fresh
        });
        Ok(seen.unwrap_or_else(|| {
            let record = ObjectRecord::new(key, created_at, ObjectStatus::Pending, now);
            ledger.objects.insert(k, record);
            Freshness::Fresh
        }))
    }

    async fn settle_object(&self, mark: &ObjectMark<'_>) -> Result<bool, StoreError> {
        Ok(self.set_object_status(
            mark.key,
            mark.created_at,
            |current| {
                // The first settle of this time sets it; a later one only a failure.
                let first = current.status == ObjectStatus::Pending;
                (first || mark.status == ObjectStatus::Failed, first)
            },
            mark.status,
            mark.now,
        ))
    }

    async fn mark_object(&self, mark: &ObjectMark<'_>) -> Result<bool, StoreError> {
        Ok(self.set_object_status(
            mark.key,
            mark.created_at,
            |_| (true, true),
            mark.status,
            mark.now,
        ))
    }

    async fn mark_object_if_failed(&self, mark: &FailedMark<'_>) -> Result<bool, StoreError> {
        let still_failed = |current: &ObjectRecord| {
            let yes =
                current.status == ObjectStatus::Failed && current.updated_at <= mark.failed_since;
            (yes, yes)
        };
        let (key, created_at) = (mark.key, mark.created_at);
        Ok(self.set_object_status(key, created_at, still_failed, mark.status, mark.now))
    }

    async fn get_object(&self, key: ObjectKey<'_>) -> Result<Option<ObjectRecord>, StoreError> {
        let k = owned(key);
        Ok(lock(self.ledger()).objects.get(&k).cloned())
    }

    async fn failed_objects(&self, page: &FailedPage<'_>) -> Result<Vec<ObjectRecord>, StoreError> {
        let (namespace, before, limit) = (page.namespace, page.before, page.limit);
        let ledger = lock(self.ledger());
        let from = (
            namespace.to_owned(),
            DateTime::<Utc>::MIN_UTC,
            String::new(),
            String::new(),
        );
        let failed = (ledger.failed.range(from..))
            .take_while(|(ns, at, _, _)| ns == namespace && *at <= before)
            .take(limit)
            .filter_map(|(ns, _, object, family)| {
                let k = (ns.clone(), object.clone(), family.clone());
                ledger.objects.get(&k).cloned()
            })
            .collect();
        Ok(failed)
    }
}
