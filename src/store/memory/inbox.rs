//! The in-memory inbox, kept by [`MemoryStore`].

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::lock;
use crate::inbox::{
    Enqueued, InboxEvent, InboxState, InboxStore, LeaseRequest, NewEvent, RenewLease, Settle,
};
use crate::store::{Fence, FencingToken, Holder, Key, MemoryStore, StoreError};

type EventKey = (String, String);

/// The inbox of a [`MemoryStore`]: events by key, plus an index of unsettled events
/// per namespace by due time, so that a lease reads only its own namespace's due
/// events, and one of settled events by expiry, so that a purge reads only expired
/// ones.
#[derive(Debug, Default)]
pub(super) struct Queue {
    pub(super) events: HashMap<EventKey, InboxEvent>,
    /// (namespace, due ms, id) for every `Pending` or `Running` event.
    due: BTreeSet<(String, i64, String)>,
    /// (expiry ms rounded up, namespace, id) for every settled event.
    settled: BTreeSet<(i64, String, String)>,
}

/// An event's place in the due index: exactly when it is due, in nanoseconds (a
/// lease takes it once that is at or before its `now`: never before its time, and
/// a fresh event in the very instant it was accepted).
fn due_at(e: &InboxEvent) -> Option<i64> {
    match e.state {
        InboxState::Pending => Some(nanos(e.next_attempt_at)),
        InboxState::Running => Some(nanos(e.lease_until)),
        _ => None,
    }
}

/// `t` in nanoseconds since the epoch, clamped to what an `i64` holds (1677 to
/// 2262; the worker's times stay within a century of now).
fn nanos(t: DateTime<Utc>) -> i64 {
    t.timestamp_nanos_opt().unwrap_or(if t.timestamp() > 0 {
        i64::MAX
    } else {
        i64::MIN
    })
}

/// A settled event's place in the settled index: its expiry, rounded up (a purge
/// at `now` takes it once `expires_at <= now`, never before).
fn expiry_at(e: &InboxEvent) -> Option<i64> {
    e.state
        .is_settled()
        .then(|| crate::store::ceil_millis(e.expires_at))
}

impl Queue {
    /// Applies `change` to the event under `key` if it is `Dead`, keeping the
    /// indexes in step: whether it did.
    pub(super) fn change_dead(
        &mut self,
        key: Key<'_>,
        change: impl FnOnce(&mut InboxEvent),
    ) -> bool {
        let k = (key.namespace.to_owned(), key.id.to_owned());
        let Some(mut e) = self.events.remove(&k) else {
            return false;
        };
        let dead = e.state == InboxState::Dead;
        if dead {
            self.unindex(&e);
            change(&mut e);
            self.index(&e);
        }
        self.events.insert(k, e);
        dead
    }

    pub(super) fn unindex(&mut self, e: &InboxEvent) {
        if let Some(at) = due_at(e) {
            self.due.remove(&(e.namespace.clone(), at, e.id.clone()));
        }
        if let Some(at) = expiry_at(e) {
            self.settled
                .remove(&(at, e.namespace.clone(), e.id.clone()));
        }
    }

    fn index(&mut self, e: &InboxEvent) {
        if let Some(at) = due_at(e) {
            self.due.insert((e.namespace.clone(), at, e.id.clone()));
        }
        if let Some(at) = expiry_at(e) {
            self.settled.insert((at, e.namespace.clone(), e.id.clone()));
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
        if let Some(old) = q.events.insert(k, fresh) {
            q.unindex(&old);
        }
        Ok(Enqueued::Inserted)
    }

    async fn lease(&self, request: &LeaseRequest<'_>) -> Result<Vec<InboxEvent>, StoreError> {
        let mut q = lock(self.queue());
        let now_ns = nanos(request.now);
        let from = (request.namespace.to_owned(), i64::MIN, String::new());
        let picked: Vec<(String, i64, String)> = q
            .due
            .range(from..)
            .take_while(|(ns, at, _)| ns == request.namespace && *at <= now_ns)
            .take(request.limit)
            .cloned()
            .collect();
        let mut out = Vec::with_capacity(picked.len());
        for entry in picked {
            q.due.remove(&entry);
            let (ns, _, id) = entry;
            let Some(e) = q.events.get_mut(&(ns, id)) else {
                continue;
            };
            e.state = InboxState::Running;
            e.token = FencingToken::random();
            e.attempts = e.attempts.saturating_add(1);
            e.lease_until = request.lease_until;
            e.updated_at = request.now;
            let leased = e.clone();
            q.index(&leased);
            out.push(leased);
        }
        Ok(out)
    }

    async fn settle_event(&self, settle: &Settle<'_>) -> Result<Fence, StoreError> {
        let Holder { key, token } = settle.holder;
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
            let stored = queue.events.get(&k);
            if stored.is_some_and(|e| crate::inbox::settled_already(e, settle)) {
                return Ok(Fence::Applied);
            }
        }
        Ok(fence)
    }

    async fn renew_event(&self, renew: &RenewLease<'_>) -> Result<Fence, StoreError> {
        let Holder { key, token } = renew.holder;
        Ok(lock(self.queue()).fenced(key, token, |e| e.lease_until = renew.lease_until))
    }

    async fn get_event(&self, key: Key<'_>) -> Result<Option<InboxEvent>, StoreError> {
        let k = (key.namespace.to_owned(), key.id.to_owned());
        Ok(lock(self.queue()).events.get(&k).cloned())
    }

    async fn purge_settled(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let mut q = lock(self.queue());
        let now_ms = now.timestamp_millis();
        let gone: Vec<(i64, String, String)> = (q.settled.iter())
            .take_while(|(at, _, _)| *at <= now_ms)
            .take(limit)
            .cloned()
            .collect();
        for entry in &gone {
            q.settled.remove(entry);
            let (_, ns, id) = entry;
            q.events.remove(&(ns.clone(), id.clone()));
        }
        Ok(gone.len() as u64)
    }

    fn inbox_listing(&self) -> Option<&dyn crate::inbox::InboxListing> {
        Some(self)
    }
}
