//! Listing a [`MemoryStore`]: a scan of every record (or event) per page.
//!
//! The memory store keeps no ordered index beside its hash tables (an index would
//! cost every claim and finish): a page walks every shard under its lock, one
//! shard at a time, and keeps the `limit` newest matches in a small buffer. At a
//! million records that is a walk of about 160 MB of slab per page — tens of
//! milliseconds — which suits an operator's page, not a hot path.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{lock, MemoryStore};
use crate::inbox::{InboxEvent, InboxListing, InboxState};
use crate::store::listing::{page_of_scan, EventQuery, ListingStore, Page, RecordQuery};
use crate::store::{Key, Record, StoreError};

impl MemoryStore {
    /// Calls `each` with every record of `namespace` whose `(updated_at, id)` and
    /// state `keep` admits, built only then.
    fn scan(&self, namespace: &str, keep: impl Fn(&Record) -> bool, mut each: impl FnMut(Record)) {
        for shard in self.inner.shards.iter() {
            let shard = lock(shard);
            for &i in &shard.table {
                let node = &shard.nodes[i as usize];
                let key = Key::split_joined(node.key.as_str());
                if key.namespace != namespace {
                    continue;
                }
                // The fields that decide first, the history only for a match.
                let bare = node.core.record(key, &[]);
                if keep(&bare) {
                    let history = shard.history_of(key, &node.core);
                    each(node.core.record(key, history));
                }
            }
        }
    }
}

#[async_trait]
impl ListingStore for MemoryStore {
    async fn list_records(&self, query: &RecordQuery) -> Result<Page<Record>, StoreError> {
        let mut found = Vec::new();
        self.scan(&query.namespace, |r| query.matches(r), |r| found.push(r));
        Ok(page_of_scan(found.into_iter(), query.page_size()))
    }

    async fn count_records(&self, query: &RecordQuery) -> Result<u64, StoreError> {
        let mut all = query.clone();
        all.after = None;
        let mut n = 0u64;
        self.scan(&all.namespace, |r| all.matches(r), |_| n += 1);
        Ok(n)
    }
}

#[async_trait]
impl InboxListing for MemoryStore {
    async fn list_events(&self, query: &EventQuery) -> Result<Page<InboxEvent>, StoreError> {
        let q = lock(self.queue());
        let matching = q.events.values().filter(|e| query.matches(e)).cloned();
        Ok(page_of_scan(matching, query.page_size()))
    }

    async fn count_events(&self, query: &EventQuery) -> Result<u64, StoreError> {
        let mut all = query.clone();
        all.after = None;
        let q = lock(self.queue());
        Ok(q.events.values().filter(|e| all.matches(e)).count() as u64)
    }

    async fn requeue_dead(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let mut q = lock(self.queue());
        Ok(q.change_dead(key, |e| {
            e.state = InboxState::Pending;
            e.next_attempt_at = now;
            e.attempts = 0;
            e.updated_at = now;
        }))
    }

    async fn purge_dead(&self, key: Key<'_>) -> Result<bool, StoreError> {
        let mut q = lock(self.queue());
        let k = (key.namespace.to_owned(), key.id.to_owned());
        if !q
            .events
            .get(&k)
            .is_some_and(|e| e.state == InboxState::Dead)
        {
            return Ok(false);
        }
        if let Some(e) = q.events.remove(&k) {
            q.unindex(&e);
        }
        Ok(true)
    }
}
