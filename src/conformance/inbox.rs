//! The conformance suite for [`InboxStore`] implementations.

use std::future::Future;

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::future::join_all;

use super::fence_is;
use crate::inbox::{Enqueued, InboxState, InboxStore, LeaseRequest, NewEvent, RenewLease, Settle};
use crate::meta::EventMeta;
use crate::store::{Fence, FencingToken, Fingerprint, Holder, Key, StoreError};

/// Runs every inbox check, one after another.
pub async fn run_all(store: &dyn InboxStore) {
    enqueue_is_idempotent(store).await;
    lease_is_exclusive_and_fenced(store).await;
    retries_wait_until_due(store).await;
    an_attempt_may_be_given_back(store).await;
    dead_workers_lose_their_lease(store).await;
    a_lease_is_held_to_its_end(store).await;
    renew_is_fenced_and_moves_the_lease(store).await;
    the_longest_due_is_leased_first(store).await;
    settled_events_are_purged(store).await;
}

/// The rule of a settle without the lease.
const SETTLE_LOST: &str = "settle without the lease is refused";

/// Awaits a settle by the lease holding the event, which must apply.
async fn settle_applies(settle: impl Future<Output = Result<Fence, StoreError>>) {
    let rule = "settle by the lease holding the event applies";
    fence_is(settle, Fence::Applied, rule).await;
}

/// Awaits a renewal by the lease holding the event, which must apply.
async fn renew_applies(renew: impl Future<Output = Result<Fence, StoreError>>) {
    let rule = "renew by the lease holding the event applies";
    fence_is(renew, Fence::Applied, rule).await;
}

struct Fixture {
    namespace: String,
    now: DateTime<Utc>,
}

impl Fixture {
    fn new() -> Self {
        let now = DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).expect("in range");
        Self::at_time(now)
    }

    /// At `now`: the purge check works in 2001, so that its purges remove
    /// nothing but events of that year (the store may hold other data).
    fn at_time(now: DateTime<Utc>) -> Self {
        Self {
            namespace: format!("conformance-inbox-{:016x}", FencingToken::random().0),
            now,
        }
    }

    fn at(&self, secs: i64) -> DateTime<Utc> {
        self.now + TimeDelta::seconds(secs)
    }

    async fn enqueue(&self, store: &dyn InboxStore, id: &str, payload: &[u8], at: i64) -> Enqueued {
        let meta = EventMeta::new(
            Some("charge.succeeded".into()),
            Some(self.at(-10)),
            Some(format!("obj-{id}")),
        );
        let event = NewEvent {
            key: Key::new(&self.namespace, id),
            fingerprint: Fingerprint::of(payload),
            meta: &meta,
            payload,
            now: self.at(at),
            expires_at: self.at(at + 3600),
        };
        store.enqueue(&event).await.expect("enqueue failed")
    }

    /// The event `id` of this namespace, if stored.
    async fn get(&self, store: &dyn InboxStore, id: &str) -> Option<crate::inbox::InboxEvent> {
        let key = Key::new(&self.namespace, id);
        store.get_event(key).await.expect("get_event failed")
    }

    /// Enqueues `id` (payload `p`) at `now` and leases it for 60 s, which must
    /// take it.
    async fn leased(&self, store: &dyn InboxStore, id: &str) -> crate::inbox::InboxEvent {
        self.enqueue(store, id, b"p", 0).await;
        self.lease_one(store, 0, 60, "due").await
    }

    /// What a lease of this namespace at `at`, until `until`, takes (up to 10).
    async fn lease(
        &self,
        store: &dyn InboxStore,
        at: i64,
        until: i64,
    ) -> Vec<crate::inbox::InboxEvent> {
        self.lease_within(store, self.at(at), self.at(until), 10)
            .await
    }

    /// How many events a lease of this namespace at `now`, until `until`, takes (up
    /// to 100).
    async fn count_due(
        &self,
        store: &dyn InboxStore,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> usize {
        self.lease_within(store, now, until, 100).await.len()
    }

    /// What a lease of this namespace at `now`, until `until`, takes (up to `max`).
    async fn lease_within(
        &self,
        store: &dyn InboxStore,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        max: usize,
    ) -> Vec<crate::inbox::InboxEvent> {
        store
            .lease(&LeaseRequest {
                namespace: &self.namespace,
                now,
                lease_until: until,
                limit: max,
            })
            .await
            .expect("lease failed")
    }

    /// The event a lease of this namespace at `at`, until `until`, takes
    /// (there must be one: `why`).
    async fn lease_one(
        &self,
        store: &dyn InboxStore,
        at: i64,
        until: i64,
        why: &str,
    ) -> crate::inbox::InboxEvent {
        let mut leased = self.lease(store, at, until).await;
        leased
            .pop()
            .unwrap_or_else(|| panic!("nothing leased: {why}"))
    }

    fn settle<'a>(&self, holder: Holder<'a>, state: InboxState, at: i64, next: i64) -> Settle<'a> {
        Settle {
            holder,
            state,
            next_attempt_at: self.at(next),
            error: Some("boom"),
            now: self.at(at),
            expires_at: self.at(at + 3600),
            attempt_counts: true,
        }
    }

    fn renew<'a>(&self, holder: Holder<'a>, until: i64) -> RenewLease<'a> {
        RenewLease {
            holder,
            lease_until: self.at(until),
        }
    }
}

/// An id is stored once; its payload, fingerprint and metadata round-trip.
pub async fn enqueue_is_idempotent(store: &dyn InboxStore) {
    let f = Fixture::new();
    let payload = b"{\"id\":\"e1\",\"x\":\"\xc3\xbc\"}";
    let first = f.enqueue(store, "e1", payload, 0).await;
    assert_eq!(first, Enqueued::Inserted, "a new id is stored");
    let again = f.enqueue(store, "e1", b"other", 1).await;
    assert_eq!(
        again,
        Enqueued::Existing {
            fingerprint: Fingerprint::of(payload),
            state: InboxState::Pending
        },
        "a known id is not stored again"
    );
    let e = f.get(store, "e1").await.expect("stored");
    let rule = "an accepted event reads back as enqueued";
    assert_eq!(e.payload, payload, "{rule}: payload");
    assert_eq!(e.state, InboxState::Pending, "{rule}: Pending");
    assert_eq!(e.attempts, 0, "{rule}: no attempt yet");
    assert_eq!(e.received_at, f.now, "{rule}: received_at");
    let meta = &e.meta;
    assert_eq!(meta.object.as_deref(), Some("obj-e1"), "{rule}: object");
    let event_type = meta.event_type.as_deref();
    assert_eq!(event_type, Some("charge.succeeded"), "{rule}: event type");
    assert_eq!(meta.family.as_deref(), Some("charge"), "{rule}: family");
    assert_eq!(meta.created_at, Some(f.at(-10)), "{rule}: created_at");
    let nope = store.get_event(Key::new(&f.namespace, "nope")).await;
    let rule = "get_event of an id never enqueued answers None";
    assert!(nope.unwrap().is_none(), "{rule}");
}

/// Concurrent leases never hand out one event twice; settle is fenced by token.
pub async fn lease_is_exclusive_and_fenced(store: &dyn InboxStore) {
    let f = Fixture::new();
    for i in 0..20 {
        f.enqueue(store, &format!("x{i}"), b"p", 0).await;
    }
    let request = LeaseRequest {
        namespace: &f.namespace,
        now: f.at(1),
        lease_until: f.at(61),
        limit: 5,
    };
    let leases = join_all((0..8).map(|_| store.lease(&request))).await;
    let mut ids: Vec<String> = leases
        .into_iter()
        .flat_map(|l| l.expect("lease failed"))
        .map(|e| {
            assert_eq!(e.state, InboxState::Running, "a lease sets Running");
            assert_eq!(e.attempts, 1, "a lease counts an attempt");
            assert_eq!(e.lease_until, f.at(61), "a lease sets lease_until");
            assert_eq!(e.updated_at, f.at(1), "a lease sets updated_at");
            e.id
        })
        .collect();
    ids.sort();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "no event is leased twice");
    assert_eq!(n, 20, "all due events are leased");
    let due = f.count_due(store, f.at(2), f.at(62)).await;
    assert_eq!(due, 0, "running events are not due");
    let e = f.get(store, "x0").await.unwrap();
    let done = f.settle(e.holder(), InboxState::Done, 3, 3);
    let wrong = Settle {
        holder: Holder::new(e.key(), FencingToken(e.token.0 ^ 1)),
        ..done
    };
    fence_is(store.settle_event(&wrong), Fence::LeaseLost, SETTLE_LOST).await;
    renew_applies(store.renew_event(&f.renew(e.holder(), 120))).await;
    settle_applies(store.settle_event(&done)).await;
    fence_is(
        store.settle_event(&done),
        Fence::Applied,
        "the same settle made again (a resend) finds its own change",
    )
    .await;
    let later = f.settle(e.holder(), InboxState::Pending, 4, 4);
    fence_is(store.settle_event(&later), Fence::LeaseLost, "settled once").await;
    fence_is(
        store.renew_event(&f.renew(e.holder(), 130)),
        Fence::LeaseLost,
        "a settled event's lease cannot be renewed, even with its token",
    )
    .await;
    let e = store.get_event(e.key()).await.unwrap().unwrap();
    assert_eq!(e.state, InboxState::Done, "a settle sets the state");
    let error = e.last_error.as_deref();
    assert_eq!(error, Some("boom"), "a settle sets last_error");
    assert_eq!(e.updated_at, f.at(3), "a settle sets updated_at");

    // A settle without an error keeps the last one.
    let x1 = f.get(store, "x1").await.unwrap();
    let retry = f.settle(x1.holder(), InboxState::Pending, 3, 5);
    settle_applies(store.settle_event(&retry)).await;
    let again = f.lease_within(store, f.at(5), f.at(65), 100).await;
    let x1 = again
        .into_iter()
        .find(|e| e.id == "x1")
        .expect("x1 is due again");
    let ok = Settle {
        error: None,
        ..f.settle(x1.holder(), InboxState::Done, 6, 6)
    };
    settle_applies(store.settle_event(&ok)).await;
    let x1 = store.get_event(x1.key()).await.unwrap().unwrap();
    assert_eq!(
        (x1.state, x1.last_error.as_deref()),
        (InboxState::Done, Some("boom")),
        "a settle without an error keeps the last one"
    );
    let other = Fixture::new();
    let due = other.count_due(store, f.at(1000), f.at(1060)).await;
    assert_eq!(due, 0, "namespaces are separate");
}

/// A retried event is leased again only once due, with its attempts counted.
pub async fn retries_wait_until_due(store: &dyn InboxStore) {
    let f = Fixture::new();
    let e = f.leased(store, "r").await;
    let retry = f.settle(e.holder(), InboxState::Pending, 1, 30);
    settle_applies(store.settle_event(&retry)).await;
    assert!(f.lease(store, 29, 89).await.is_empty(), "not due yet");
    let again = f.lease(store, 30, 90).await;
    assert_eq!(again.len(), 1, "a retry is leased once due");
    assert_eq!(again[0].attempts, 2, "a retry's lease counts an attempt");
    assert_ne!(again[0].token, e.token, "a new lease gets a new token");
    let error = again[0].last_error.as_deref();
    assert_eq!(error, Some("boom"), "a retry keeps its last error");
    assert_eq!(again[0].payload, b"p", "a retry keeps its payload");

    // A retry due between two milliseconds is not due in the one before: a
    // store that keeps milliseconds rounds the time up, never down.
    let ms = |us: i64| f.now + TimeDelta::microseconds(us);
    let e = &again[0];
    let retry = Settle {
        next_attempt_at: ms(91_001_500),
        ..f.settle(e.holder(), InboxState::Pending, 91, 91)
    };
    settle_applies(store.settle_event(&retry)).await;
    for (at, due, rule) in [
        (91_001_200, 0, "not due 0.3 ms before its time"),
        (91_002_000, 1, "due once its time has come"),
    ] {
        let taken = f.count_due(store, ms(at), ms(151_000_000)).await;
        assert_eq!(taken, due, "{rule}");
    }

    // A fresh event is due in the very instant it was accepted, even one between
    // two milliseconds.
    let meta = EventMeta::default();
    let at = ms(200_000_500);
    let fresh = NewEvent {
        key: Key::new(&f.namespace, "fresh"),
        fingerprint: Fingerprint::of(b"p"),
        meta: &meta,
        payload: b"p",
        now: at,
        expires_at: at + TimeDelta::hours(1),
    };
    let inserted = store.enqueue(&fresh).await.unwrap();
    assert_eq!(inserted, Enqueued::Inserted, "a new id is stored");
    let leased = f
        .lease_within(store, at, at + TimeDelta::seconds(60), 10)
        .await;
    assert!(
        leased.iter().any(|e| e.id == "fresh"),
        "a fresh event is due at once"
    );
}

/// A settle whose attempt does not count takes it back, and only once: a settle
/// made again (a resend) changes nothing.
pub async fn an_attempt_may_be_given_back(store: &dyn InboxStore) {
    let f = Fixture::new();
    f.enqueue(store, "g", b"p", 0).await;
    let first = f.lease(store, 0, 60).await.pop().expect("due");
    let counted = f.settle(first.holder(), InboxState::Pending, 1, 2);
    settle_applies(store.settle_event(&counted)).await;
    let second = f.lease(store, 2, 62).await.pop().expect("due again");
    assert_eq!(second.attempts, 2, "a counted attempt stays counted");
    let uncounted = Settle {
        attempt_counts: false,
        ..f.settle(second.holder(), InboxState::Pending, 3, 4)
    };
    for _ in 0..2 {
        settle_applies(store.settle_event(&uncounted)).await;
    }
    let stored = store.get_event(second.key()).await.unwrap().unwrap();
    assert_eq!(
        stored.attempts, 1,
        "the second attempt was given back, once"
    );
    assert_eq!(
        stored.state,
        InboxState::Pending,
        "an attempt given back leaves the event Pending"
    );
    let third = f.lease(store, 4, 64).await.pop().expect("due again");
    assert_eq!(
        third.attempts, 2,
        "counted again from the attempt given back"
    );
}

/// A lease is held to its very end, even one that ends between two
/// milliseconds: an inbox that keeps milliseconds rounds its end up.
pub async fn a_lease_is_held_to_its_end(store: &dyn InboxStore) {
    let f = Fixture::new();
    let us = |n: i64| f.now + TimeDelta::microseconds(n);
    f.enqueue(store, "edge", b"p", 0).await;
    for (at, until, due, rule) in [
        (0, 700, 1, "due"),
        (
            300,
            60_000_000,
            0,
            "0.4 ms before the lease ends, in its last millisecond",
        ),
        (1_000, 60_000_000, 1, "0.3 ms after the lease ended"),
    ] {
        assert_eq!(f.count_due(store, us(at), us(until)).await, due, "{rule}");
    }
}

/// A renewal needs the lease's token, and moves the lease's end.
pub async fn renew_is_fenced_and_moves_the_lease(store: &dyn InboxStore) {
    let f = Fixture::new();
    let e = f.leased(store, "long").await;
    let stale = FencingToken(e.token.0.wrapping_add(1));
    fence_is(
        store.renew_event(&f.renew(Holder::new(e.key(), stale), 120)),
        Fence::LeaseLost,
        "another token renews nothing",
    )
    .await;
    renew_applies(store.renew_event(&f.renew(e.holder(), 120))).await;
    assert!(
        f.lease(store, 119, 180).await.is_empty(),
        "held to the renewed end"
    );
    let again = f.lease(store, 120, 180).await;
    assert_eq!(
        again.len(),
        1,
        "leased again once the renewed lease ran out"
    );
}

/// Of the due events, a lease takes those due longest first, and only its own
/// namespace's.
pub async fn the_longest_due_is_leased_first(store: &dyn InboxStore) {
    let f = Fixture::new();
    let other = Fixture::new();
    other.enqueue(store, "elsewhere", b"p", -5).await;
    // Enqueued newest first, so that no store returns them in order by luck.
    for (id, at) in [("third", 2), ("second", 1), ("first", 0)] {
        f.enqueue(store, id, b"p", at).await;
    }
    let mut order = Vec::new();
    for _ in 0..3 {
        let leased = f.lease_within(store, f.at(5), f.at(65), 1).await;
        assert_eq!(leased.len(), 1, "one at a time");
        assert_eq!(leased[0].namespace, f.namespace, "its own namespace only");
        order.push(leased[0].id.clone());
    }
    assert_eq!(
        order,
        ["first", "second", "third"],
        "the longest due is leased first"
    );
    let rule = "a lease takes only its own namespace's events";
    assert!(f.lease(store, 5, 65).await.is_empty(), "{rule}");
    assert_eq!(
        other.lease(store, 5, 65).await.len(),
        1,
        "the other namespace's is left"
    );
}

/// A `Running` event whose lease ran out is leased again; the old token is stale.
pub async fn dead_workers_lose_their_lease(store: &dyn InboxStore) {
    let f = Fixture::new();
    let first = f.leased(store, "d").await;
    let rule = "a running event is not leased again before its lease ends";
    assert!(f.lease(store, 59, 119).await.is_empty(), "{rule}");
    let second = f.lease_one(store, 60, 120, "lease ran out").await;
    let rule = "a dead worker's lease taken over counts an attempt";
    assert_eq!(second.attempts, 2, "{rule}");
    let done = f.settle(first.holder(), InboxState::Done, 61, 61);
    fence_is(store.settle_event(&done), Fence::LeaseLost, SETTLE_LOST).await;
    let done = Settle {
        holder: second.holder(),
        ..done
    };
    settle_applies(store.settle_event(&done)).await;
}

/// Settled events past their expiry are purged; unsettled ones never are; a purged
/// id can be enqueued again. Works in 2001: its purges remove only events that
/// expired that year.
pub async fn settled_events_are_purged(store: &dyn InboxStore) {
    let base = DateTime::from_timestamp(978_307_200, 0).expect("2001-01-01");
    let f = Fixture::at_time(base);
    f.enqueue(store, "old", b"p", 0).await;
    f.enqueue(store, "waiting", b"p", 0).await;
    let e = (f.lease_within(store, f.at(0), f.at(60), 1).await)
        .pop()
        .expect("due");
    let done = f.settle(e.holder(), InboxState::Done, 1, 1);
    settle_applies(store.settle_event(&done)).await;
    assert!(
        matches!(
            f.enqueue(store, &e.id, b"p", 3600).await,
            Enqueued::Existing { .. }
        ),
        "kept until expiry"
    );
    // A purge before the expiry leaves it.
    while store.purge_settled(f.at(3600), 1000).await.unwrap() > 0 {}
    assert!(
        store.get_event(e.key()).await.unwrap().is_some(),
        "not purged before its expiry"
    );
    let mut purged = 0;
    loop {
        let n = store.purge_settled(f.at(7200), 1000).await.unwrap();
        purged += n;
        if n == 0 {
            break;
        }
    }
    assert!(purged >= 1, "a purge answers how many it removed");
    assert!(
        store.get_event(e.key()).await.unwrap().is_none(),
        "the settled event is gone"
    );
    let other = if e.id == "old" { "waiting" } else { "old" };
    assert!(
        f.get(store, other).await.is_some(),
        "a pending event is never purged"
    );
    assert_eq!(
        f.enqueue(store, &e.id, b"p", 7201).await,
        Enqueued::Inserted,
        "a purged id is stored again"
    );
    // An event not settled is never replaced, however old: pending, then running.
    let f = &f;
    let kept_as = |at| async move {
        match f.enqueue(store, other, b"p2", at).await {
            Enqueued::Existing { state, .. } => Some(state),
            Enqueued::Inserted => None,
        }
    };
    let rule = "a pending event past its expiry is not replaced";
    assert_eq!(kept_as(7201).await, Some(InboxState::Pending), "{rule}");
    let running = f.lease_within(store, f.at(7202), f.at(7262), 10).await;
    assert!(running.iter().any(|r| r.id == other), "{other} is due");
    let rule = "a running event past its expiry is not replaced";
    assert_eq!(kept_as(7203).await, Some(InboxState::Running), "{rule}");

    // An expired event that no purge removed yet is replaced by a new delivery.
    let g = Fixture::at_time(base);
    let late = g.leased(store, "late").await;
    let done = g.settle(late.holder(), InboxState::Done, 1, 1);
    let _ = store.settle_event(&done).await.unwrap();
    assert_eq!(
        g.enqueue(store, "late", b"new", 3601).await,
        Enqueued::Inserted,
        "an expired event is replaced"
    );
    let fresh = store.get_event(late.key()).await.unwrap().expect("stored");
    assert_eq!(
        (fresh.state, fresh.payload.as_slice()),
        (InboxState::Pending, &b"new"[..]),
        "an expired event replaced is the new delivery, Pending"
    );
}
