//! The conformance suite for listing: [`ListingStore`] (reached through
//! [`ProcessedStore::record_listing`]), the escalation markers, and
//! [`InboxListing`] (through [`InboxStore::inbox_listing`]).
//!
//! A store that does not list (`record_listing` answers `None`) fails these
//! checks: run them only on a store that lists. The core suite
//! ([`run_all`](super::run_all)) does not call them.

use chrono::{DateTime, TimeDelta, Utc};

use super::{acquired, Fixture};
use crate::inbox::{InboxListing, InboxState, InboxStore, LeaseRequest, NewEvent, Settle};
use crate::meta::EventMeta;
use crate::store::escalation::{self, EscalationError, EscalationStatus};
use crate::store::listing::{Cursor, EventQuery, ListState, ListingStore, RecordQuery};
use crate::store::{Fence, Fingerprint, Holder, Key, ProcessedStore, RecordState};

/// Runs every record listing check and the escalation check, one after another.
pub async fn run_all(store: &dyn ProcessedStore) {
    lists_each_state_newest_first(store).await;
    pages_are_stable(store).await;
    time_range_and_prefix_filter(store).await;
    escalations_are_acknowledged_then_resolved(store).await;
}

/// Runs every inbox listing check, one after another.
pub async fn run_inbox(store: &dyn InboxStore) {
    dead_letters_are_listed_requeued_and_purged(store).await;
}

fn listing(store: &dyn ProcessedStore) -> &dyn ListingStore {
    store
        .record_listing()
        .expect("the store lists records (record_listing answers Some)")
}

/// Claims `id` at `at` and, unless `state` is `None`, finishes it in `state` at
/// `done`.
async fn made(
    store: &dyn ProcessedStore,
    f: &Fixture,
    id: &str,
    at: i64,
    end: Option<(RecordState, i64)>,
) {
    let request = f.request(id, id.as_bytes(), at);
    acquired(store, &request, "fresh claim").await;
    if let Some((state, done)) = end {
        let finish = f.finish(state, 0, &[], done);
        let fence = store.finish(request.holder(), &finish).await;
        assert_eq!(
            fence.expect("finish failed"),
            Fence::Applied,
            "finish applies"
        );
    }
}

/// The ids of every page of `query`, read page by page.
async fn all_pages(store: &dyn ListingStore, mut query: RecordQuery) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..1000 {
        let page = store
            .list_records(&query)
            .await
            .expect("list_records failed");
        assert!(
            page.items.len() <= query.page_size(),
            "a page holds at most its limit"
        );
        ids.extend(page.items.iter().map(|r| r.id.clone()));
        match page.next {
            Some(next) => query.after = Some(next),
            None => return ids,
        }
    }
    panic!("a listing must end (its cursor must move)");
}

/// Each state lists its records only, newest first by `updated_at`; with no
/// state every record is listed; a live lease is in progress and an expired one
/// stuck; counts agree with the pages.
pub async fn lists_each_state_newest_first(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let list = listing(store);
    made(store, &f, "done-1", 0, Some((RecordState::Completed, 1))).await;
    made(store, &f, "fail-1", 0, Some((RecordState::Failed, 2))).await;
    made(store, &f, "done-2", 0, Some((RecordState::Completed, 3))).await;
    made(store, &f, "esc-1", 0, Some((RecordState::Escalated, 4))).await;
    made(
        store,
        &f,
        "perm-1",
        0,
        Some((RecordState::PermanentFailure, 5)),
    )
    .await;
    made(store, &f, "stuck-1", -120, None).await;
    made(store, &f, "live-1", 6, None).await;
    let now = f.at_secs(10);
    let cases: [(ListState, &[&str]); 6] = [
        (ListState::Completed, &["done-2", "done-1"]),
        (ListState::Failed, &["fail-1"]),
        (ListState::Escalated, &["esc-1"]),
        (ListState::PermanentFailure, &["perm-1"]),
        (ListState::Stuck, &["stuck-1"]),
        (ListState::InProgress, &["live-1"]),
    ];
    for (state, expected) in cases {
        let query = RecordQuery::new(&f.namespace, now).states([state]);
        let ids = all_pages(list, query.clone()).await;
        assert_eq!(
            ids, expected,
            "listing by state {state}: its records, newest first"
        );
        let n = list.count_records(&query).await.expect("count failed");
        assert_eq!(n, expected.len() as u64, "count of state {state}");
    }
    let every = RecordQuery::new(&f.namespace, now);
    let ids = all_pages(list, every.clone()).await;
    let expected = [
        "live-1", "perm-1", "esc-1", "done-2", "fail-1", "done-1", "stuck-1",
    ];
    assert_eq!(ids, expected, "no state given: every record, newest first");
    assert_eq!(list.count_records(&every).await.expect("count failed"), 7);
    let two = every.states([ListState::Failed, ListState::Completed]);
    let ids = all_pages(list, two.limit(1)).await;
    assert_eq!(
        ids,
        ["done-2", "fail-1", "done-1"],
        "two states merged, one a page"
    );
    let page = list
        .list_records(&RecordQuery::new(format!("{}-other", f.namespace), now))
        .await
        .expect("list failed");
    assert!(
        page.items.is_empty() && page.next.is_none(),
        "another namespace lists nothing"
    );
}

/// Pages of any size read the same records as one page, once each, ties on
/// `updated_at` ordered by id; a cursor made from a record starts strictly after it.
pub async fn pages_are_stable(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let list = listing(store);
    // Three finished in the same millisecond, four apart.
    for (id, done) in [
        ("a", 5),
        ("b", 5),
        ("c", 5),
        ("d", 1),
        ("e", 2),
        ("f", 7),
        ("g", 9),
    ] {
        made(store, &f, id, 0, Some((RecordState::Failed, done))).await;
    }
    let query = RecordQuery::new(&f.namespace, f.at_secs(20)).states([ListState::Failed]);
    let whole = all_pages(list, query.clone().limit(100)).await;
    assert_eq!(
        whole,
        ["g", "f", "c", "b", "a", "e", "d"],
        "newest first, ties by id descending"
    );
    for size in [1, 2, 3, 6, 7] {
        let paged = all_pages(list, query.clone().limit(size)).await;
        assert_eq!(
            paged, whole,
            "pages of {size} read each record once, in order"
        );
    }
    let from_b = query.clone().after(Some(Cursor::new(f.at_secs(5), "b")));
    assert_eq!(
        all_pages(list, from_b).await,
        ["a", "e", "d"],
        "a cursor starts strictly after its position"
    );
    // A record that changes while pages are read moves to the top, not into a later page.
    let first = list
        .list_records(&query.clone().limit(2))
        .await
        .expect("list failed");
    made(store, &f, "h", 30, Some((RecordState::Failed, 31))).await;
    let rest = all_pages(list, query.clone().after(first.next)).await;
    assert_eq!(
        rest,
        ["c", "b", "a", "e", "d"],
        "the next page goes on where the last ended"
    );
}

/// `since` is inclusive and `until` exclusive on `updated_at`; an id prefix is
/// matched byte for byte (`%` and `_` are no wildcards).
pub async fn time_range_and_prefix_filter(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let list = listing(store);
    for (id, done) in [
        ("pay_1", 1),
        ("pay_2", 2),
        ("PAY_3", 3),
        ("p%_4", 4),
        ("pa_5", 5),
    ] {
        made(store, &f, id, 0, Some((RecordState::Completed, done))).await;
    }
    let q = RecordQuery::new(&f.namespace, f.at_secs(20));
    let ranged = q.clone().since(f.at_secs(2)).until(f.at_secs(4));
    assert_eq!(
        all_pages(list, ranged.clone()).await,
        ["PAY_3", "pay_2"],
        "since <= updated_at < until"
    );
    assert_eq!(list.count_records(&ranged).await.expect("count failed"), 2);
    let pay = q.clone().id_prefix("pay_");
    assert_eq!(
        all_pages(list, pay.clone()).await,
        ["pay_2", "pay_1"],
        "prefix, case-sensitive"
    );
    assert_eq!(list.count_records(&pay).await.expect("count failed"), 2);
    assert_eq!(
        all_pages(list, q.clone().id_prefix("p%")).await,
        ["p%_4"],
        "% matches itself only"
    );
    assert_eq!(
        all_pages(list, q.clone().id_prefix("pa_")).await,
        ["pa_5"],
        "_ matches itself only"
    );
    let none = q.clone().id_prefix("pay_").since(f.at_secs(3));
    assert!(all_pages(list, none).await.is_empty(), "filters combine");
    let empty = q.clone().since(f.at_secs(5)).until(f.at_secs(5));
    assert!(
        all_pages(list, empty).await.is_empty(),
        "an empty range lists nothing"
    );
}

/// An escalation is open, then acknowledged, then resolved, each step kept in the
/// store with its note; a record that is not escalated is refused.
pub async fn escalations_are_acknowledged_then_resolved(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    made(store, &f, "esc", 0, Some((RecordState::Escalated, 1))).await;
    made(store, &f, "ok", 0, Some((RecordState::Completed, 1))).await;
    let key = f.key("esc");
    let record = store.get(key).await.expect("get failed").expect("stored");
    let open = escalation::status(store, &record)
        .await
        .expect("status failed");
    assert_eq!(
        open.status,
        EscalationStatus::Open,
        "an escalation starts open"
    );
    let ack = EscalationStatus::Acknowledged;
    let marked = escalation::mark(store, key, ack, "alice: looking", f.at_secs(2)).await;
    assert_eq!(marked.expect("acknowledge failed").status, ack);
    let now = escalation::status(store, &record)
        .await
        .expect("status failed");
    assert_eq!(now.status, ack, "the acknowledgement is kept in the store");
    let resolved = EscalationStatus::Resolved;
    let done = escalation::mark(store, key, resolved, "bob: refunded", f.at_secs(3)).await;
    let done = done.expect("resolve failed");
    assert_eq!(done.status, resolved);
    let now = escalation::status(store, &record)
        .await
        .expect("status failed");
    assert_eq!(now.status, resolved, "the resolution is kept in the store");
    assert_eq!(now.notes.len(), 2, "both steps keep their note");
    assert!(
        now.notes[1].error.contains("bob: refunded"),
        "{:?}",
        now.notes
    );
    let back = escalation::mark(store, key, ack, "", f.at_secs(4)).await;
    assert!(
        matches!(back, Err(EscalationError::AlreadyResolved)),
        "{back:?}"
    );
    let other = escalation::mark(store, f.key("ok"), resolved, "", f.at_secs(4)).await;
    assert!(
        matches!(
            other,
            Err(EscalationError::NotEscalated(RecordState::Completed))
        ),
        "{other:?}"
    );
    // The escalated record itself is unchanged: deliveries stay answered.
    let after = store.get(key).await.expect("get failed").expect("stored");
    assert_eq!(
        after, record,
        "marking leaves the escalated record as it was"
    );
}

fn inbox_listing(store: &dyn InboxStore) -> &dyn InboxListing {
    store
        .inbox_listing()
        .expect("the inbox lists events (inbox_listing answers Some)")
}

async fn event_ids(list: &dyn InboxListing, query: &EventQuery) -> Vec<String> {
    let page = list.list_events(query).await.expect("list_events failed");
    page.items.iter().map(|e| e.id.clone()).collect()
}

/// Events are listed by state newest first; a dead letter is requeued (pending,
/// due now, attempts from zero, leased again) or purged; other events are neither.
pub async fn dead_letters_are_listed_requeued_and_purged(store: &dyn InboxStore) {
    let f = Fixture::new();
    let list = inbox_listing(store);
    let t = |s: i64| f.now + TimeDelta::seconds(s);
    let meta = EventMeta::new(Some("charge.failed".into()), None, None);
    for id in ["e1", "e2", "e3", "e4"] {
        let event = NewEvent {
            key: Key::new(&f.namespace, id),
            fingerprint: Fingerprint::of(id.as_bytes()),
            meta: &meta,
            payload: id.as_bytes(),
            now: t(0),
            expires_at: t(3600),
        };
        store.enqueue(&event).await.expect("enqueue failed");
    }
    let leased = store
        .lease(&LeaseRequest {
            namespace: &f.namespace,
            now: t(10),
            lease_until: t(70),
            limit: 10,
        })
        .await
        .expect("lease failed");
    assert_eq!(leased.len(), 4, "the four events are leased");
    let token = |id: &str| leased.iter().find(|e| e.id == id).expect("leased").token;
    let settle = |holder, state, at: i64| Settle {
        holder,
        state,
        next_attempt_at: t(1000),
        error: Some("boom"),
        now: t(at),
        expires_at: t(at + 3600),
        attempt_counts: true,
    };
    for (id, state, at) in [
        ("e1", InboxState::Dead, 20),
        ("e2", InboxState::Done, 21),
        ("e3", InboxState::Pending, 22),
    ] {
        let holder = Holder::new(Key::new(&f.namespace, id), token(id));
        let fence = store.settle_event(&settle(holder, state, at)).await;
        assert_eq!(fence.expect("settle failed"), Fence::Applied);
    }
    let q = EventQuery::new(&f.namespace, t(25));
    let by = |s: InboxState| q.clone().states([s]);
    assert_eq!(
        event_ids(list, &by(InboxState::Dead)).await,
        ["e1"],
        "dead letters"
    );
    assert_eq!(
        event_ids(list, &by(InboxState::Running)).await,
        ["e4"],
        "leased events"
    );
    assert_eq!(
        event_ids(list, &by(InboxState::Pending)).await,
        ["e3"],
        "pending events"
    );
    assert_eq!(
        event_ids(list, &q).await,
        ["e3", "e2", "e1", "e4"],
        "every event, newest first"
    );
    assert_eq!(
        list.count_events(&by(InboxState::Dead))
            .await
            .expect("count failed"),
        1
    );
    let paged = list
        .list_events(&q.clone().limit(3))
        .await
        .expect("list failed");
    let rest = list
        .list_events(&q.clone().after(paged.next))
        .await
        .expect("list failed");
    let rest: Vec<_> = rest.items.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(rest, ["e4"], "the second page goes on after the first");
    assert_eq!(
        event_ids(list, &q.clone().id_prefix("e2")).await,
        ["e2"],
        "id prefix"
    );
    let key = |id| Key::new(&f.namespace, id);
    assert!(
        !list
            .requeue_dead(key("e2"), t(30))
            .await
            .expect("requeue failed"),
        "a done event is not requeued"
    );
    assert!(
        list.requeue_dead(key("e1"), t(30))
            .await
            .expect("requeue failed"),
        "a dead letter is requeued"
    );
    let e1 = store
        .get_event(key("e1"))
        .await
        .expect("get failed")
        .expect("kept");
    assert_eq!(
        (e1.state, e1.attempts, e1.next_attempt_at, e1.updated_at),
        (InboxState::Pending, 0, t(30), t(30)),
        "requeued: pending, due now, attempts from zero"
    );
    assert!(
        event_ids(list, &by(InboxState::Dead)).await.is_empty(),
        "no dead letter left"
    );
    let again = store
        .lease(&LeaseRequest {
            namespace: &f.namespace,
            now: t(31),
            lease_until: t(90),
            limit: 10,
        })
        .await
        .expect("lease failed");
    let ids: Vec<_> = again.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(
        ids,
        ["e1"],
        "the requeued event is leased again (e3 is not due)"
    );
    let holder = Holder::new(key("e1"), again[0].token);
    let fence = store
        .settle_event(&settle(holder, InboxState::Dead, 32))
        .await;
    assert_eq!(fence.expect("settle failed"), Fence::Applied);
    assert!(
        !list.purge_dead(key("e2")).await.expect("purge failed"),
        "a done event is not purged"
    );
    assert!(
        list.purge_dead(key("e1")).await.expect("purge failed"),
        "a dead letter is purged"
    );
    assert!(
        store
            .get_event(key("e1"))
            .await
            .expect("get failed")
            .is_none(),
        "purged"
    );
    assert!(
        !list
            .requeue_dead(key("e1"), t(40))
            .await
            .expect("requeue failed"),
        "nothing to requeue"
    );
    let _: DateTime<Utc> = t(0);
}
