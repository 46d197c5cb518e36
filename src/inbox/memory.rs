//! The in-memory inbox and ordering ledger, kept by [`MemoryStore`].

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{Enqueued, InboxEvent, InboxState, InboxStore, NewEvent, Settle};
use crate::ordering::{Freshness, ObjectKey, ObjectRecord, ObjectStatus, OrderingStore};
use crate::store::{Fence, FencingToken, Key, MemoryStore, StoreError};

type EventKey = (String, String);

/// The inbox of a [`MemoryStore`]: events by key, plus an index of unsettled events
/// by due time so leasing does not scan settled ones.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    events: HashMap<EventKey, InboxEvent>,
    /// (due ms, namespace, id) for every `Pending` or `Running` event.
    due: BTreeSet<(i64, String, String)>,
}

/// The ordering ledger of a [`MemoryStore`].
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    objects: HashMap<(String, String, String), ObjectRecord>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn due_at(e: &InboxEvent) -> Option<i64> {
    match e.state {
        InboxState::Pending => Some(e.next_attempt_at.timestamp_millis()),
        // Rounded up: a lease is never due before it ends.
        InboxState::Running => Some(crate::store::ceil_millis(e.lease_until)),
        _ => None,
    }
}

impl Queue {
    fn unindex(&mut self, e: &InboxEvent) {
        if let Some(at) = due_at(e) {
            self.due.remove(&(at, e.namespace.clone(), e.id.clone()));
        }
    }

    fn index(&mut self, e: &InboxEvent) {
        if let Some(at) = due_at(e) {
            self.due.insert((at, e.namespace.clone(), e.id.clone()));
        }
    }

    /// Applies `change` to the event under `key` if it is `Running` with `token`,
    /// keeping the due index in step.
    fn fenced(
        &mut self,
        key: Key<'_>,
        token: FencingToken,
        change: impl FnOnce(&mut InboxEvent),
    ) -> Fence {
        let k = (key.namespace.to_owned(), key.id.to_owned());
        let Some(mut e) = self.events.remove(&k) else {
            return Fence::LeaseLost;
        };
        let fence = if e.state == InboxState::Running && e.token == token {
            self.unindex(&e);
            change(&mut e);
            self.index(&e);
            Fence::Applied
        } else {
            Fence::LeaseLost
        };
        self.events.insert(k, e);
        fence
    }
}

#[async_trait]
impl InboxStore for MemoryStore {
    async fn enqueue(&self, event: &NewEvent<'_>) -> Result<Enqueued, StoreError> {
        let mut q = lock(self.queue());
        let k = (event.key.namespace.to_owned(), event.key.id.to_owned());
        if let Some(old) = q.events.get(&k) {
            if !(old.state.is_settled() && old.expires_at <= event.now) {
                return Ok(Enqueued::Existing {
                    fingerprint: old.fingerprint,
                    state: old.state,
                });
            }
        }
        let fresh = InboxEvent::accepted(event);
        q.index(&fresh);
        q.events.insert(k, fresh);
        Ok(Enqueued::Inserted)
    }

    async fn lease(
        &self,
        namespace: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<InboxEvent>, StoreError> {
        let mut q = lock(self.queue());
        let now_ms = now.timestamp_millis();
        let picked: Vec<(i64, String, String)> = q
            .due
            .iter()
            .take_while(|(at, _, _)| *at <= now_ms)
            .filter(|(_, ns, _)| ns == namespace)
            .take(limit)
            .cloned()
            .collect();
        let mut out = Vec::with_capacity(picked.len());
        for entry in picked {
            q.due.remove(&entry);
            let (_, ns, id) = entry;
            let Some(e) = q.events.get_mut(&(ns, id)) else {
                continue;
            };
            e.state = InboxState::Running;
            e.token = FencingToken::random();
            e.attempts = e.attempts.saturating_add(1);
            e.lease_until = lease_until;
            e.updated_at = now;
            let leased = e.clone();
            q.index(&leased);
            out.push(leased);
        }
        Ok(out)
    }

    async fn settle_event(
        &self,
        key: Key<'_>,
        token: FencingToken,
        settle: &Settle<'_>,
    ) -> Result<Fence, StoreError> {
        let mut queue = lock(self.queue());
        let fence = queue.fenced(key, token, |e| {
            e.state = settle.state;
            e.next_attempt_at = settle.next_attempt_at;
            if let Some(error) = settle.error {
                e.last_error = Some(error.to_owned());
            }
            e.updated_at = settle.now;
            e.expires_at = settle.expires_at;
            if !settle.attempt_counts {
                e.attempts = e.attempts.saturating_sub(1);
            }
        });
        if fence == Fence::LeaseLost {
            // The same settle made again (its answer was lost) finds its own change.
            let k = (key.namespace.to_owned(), key.id.to_owned());
            if queue
                .events
                .get(&k)
                .is_some_and(|e| super::settled_already(e, token, settle))
            {
                return Ok(Fence::Applied);
            }
        }
        Ok(fence)
    }

    async fn renew_event(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        Ok(lock(self.queue()).fenced(key, token, |e| e.lease_until = lease_until))
    }

    async fn get_event(&self, key: Key<'_>) -> Result<Option<InboxEvent>, StoreError> {
        let k = (key.namespace.to_owned(), key.id.to_owned());
        Ok(lock(self.queue()).events.get(&k).cloned())
    }

    async fn purge_settled(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let mut q = lock(self.queue());
        let gone: Vec<EventKey> = q
            .events
            .iter()
            .filter(|(_, e)| e.state.is_settled() && e.expires_at <= now)
            .map(|(k, _)| k.clone())
            .take(limit)
            .collect();
        for k in &gone {
            q.events.remove(k);
        }
        Ok(gone.len() as u64)
    }
}

impl MemoryStore {
    /// Sets the status of the object under `key` if its newest is `created_at` and
    /// `decide(current status)` says to (`.0`); answers `decide`'s `.1`, or `false`
    /// without such a record.
    fn set_object_status(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        decide: impl FnOnce(ObjectStatus) -> (bool, bool),
        status: ObjectStatus,
        now: DateTime<Utc>,
    ) -> bool {
        let mut ledger = lock(self.ledger());
        let k = (
            key.namespace.to_owned(),
            key.object.to_owned(),
            key.family.to_owned(),
        );
        let Some(r) = ledger
            .objects
            .get_mut(&k)
            .filter(|r| r.newest == created_at)
        else {
            return false;
        };
        let (set, answer) = decide(r.status);
        if set {
            r.status = status;
            r.updated_at = now;
        }
        answer
    }
}

#[async_trait]
impl OrderingStore for MemoryStore {
    async fn observe(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Freshness, StoreError> {
        let mut ledger = lock(self.ledger());
        let k = (
            key.namespace.to_owned(),
            key.object.to_owned(),
            key.family.to_owned(),
        );
        match ledger.objects.get_mut(&k) {
            Some(r) if created_at < r.newest => Ok(Freshness::Stale { newest: r.newest }),
            // A retry, or another event created at the same time: settled first wins.
            Some(r) if created_at == r.newest => Ok(Freshness::Fresh),
            Some(r) => {
                r.newest = created_at;
                r.status = ObjectStatus::Pending;
                r.updated_at = now;
                Ok(Freshness::Fresh)
            }
            None => {
                let record = ObjectRecord::new(key, created_at, ObjectStatus::Pending, now);
                ledger.objects.insert(k, record);
                Ok(Freshness::Fresh)
            }
        }
    }

    async fn settle_object(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        status: ObjectStatus,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        Ok(self.set_object_status(
            key,
            created_at,
            |current| {
                // The first settle of this time sets it; a later one only a failure.
                let first = current == ObjectStatus::Pending;
                (first || status == ObjectStatus::Failed, first)
            },
            status,
            now,
        ))
    }

    async fn mark_object(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        status: ObjectStatus,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        Ok(self.set_object_status(key, created_at, |_| (true, true), status, now))
    }

    async fn get_object(&self, key: ObjectKey<'_>) -> Result<Option<ObjectRecord>, StoreError> {
        let k = (
            key.namespace.to_owned(),
            key.object.to_owned(),
            key.family.to_owned(),
        );
        Ok(lock(self.ledger()).objects.get(&k).cloned())
    }

    async fn failed_objects(
        &self,
        namespace: &str,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<ObjectRecord>, StoreError> {
        let mut failed: Vec<ObjectRecord> = lock(self.ledger())
            .objects
            .values()
            .filter(|r| {
                r.namespace == namespace
                    && r.status == ObjectStatus::Failed
                    && r.updated_at <= before
            })
            .cloned()
            .collect();
        failed.sort_by_key(|r| r.updated_at);
        failed.truncate(limit);
        Ok(failed)
    }
}
