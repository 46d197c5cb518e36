//! The conformance suite for [`OrderingStore`] implementations.

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::future::join_all;

use crate::ordering::ObjectStatus::{Applied, Failed, Pending};
use crate::ordering::{
    FailedMark, FailedPage, Freshness, ObjectKey, ObjectMark, ObjectRecord, ObjectStatus,
    Observation, OrderingStore,
};
use crate::store::FencingToken;

/// The rule of a settle of an object's newest event.
const SETTLE_APPLIES: &str = "settle_object of the object's newest event applies";
/// The rule of a mark of an object's newest event.
const MARK_APPLIES: &str = "mark_object of the object's newest event applies";

/// Runs every ordering check.
pub async fn run_all(store: &dyn OrderingStore) {
    newest_wins(store).await;
    settle_applies_to_the_newest_only(store).await;
    events_created_at_the_same_time_settle_once(store).await;
    concurrent_observations_keep_the_newest(store).await;
    failed_objects_are_listed_oldest_first(store).await;
    a_failure_is_marked_only_while_it_stands(store).await;
}

/// One object in the store, the times of its calls given in seconds after `start`.
#[derive(Clone, Copy)]
struct Object<'s> {
    store: &'s dyn OrderingStore,
    key: ObjectKey<'s>,
    start: DateTime<Utc>,
}

impl<'s> Object<'s> {
    fn new(store: &'s dyn OrderingStore, key: ObjectKey<'s>, start: DateTime<Utc>) -> Self {
        Self { store, key, start }
    }

    /// The same store and start, another key.
    fn of(self, key: ObjectKey<'s>) -> Self {
        Self { key, ..self }
    }

    fn at(self, seconds: i64) -> DateTime<Utc> {
        self.start + TimeDelta::seconds(seconds)
    }

    async fn observe(self, created: i64, now: i64) -> Freshness {
        let (created_at, now) = (self.at(created), self.at(now));
        let observation = Observation {
            key: self.key,
            created_at,
            now,
        };
        self.store.observe(&observation).await.unwrap()
    }

    /// The mark of its event created at `created` as `status`, at `now`.
    fn mark_of(self, created: i64, status: ObjectStatus, now: i64) -> ObjectMark<'s> {
        ObjectMark {
            key: self.key,
            created_at: self.at(created),
            status,
            now: self.at(now),
        }
    }

    async fn settle(self, created: i64, status: ObjectStatus, now: i64) -> bool {
        let mark = self.mark_of(created, status, now);
        self.store.settle_object(&mark).await.unwrap()
    }

    async fn mark(self, created: i64, status: ObjectStatus, now: i64) -> bool {
        let mark = self.mark_of(created, status, now);
        self.store.mark_object(&mark).await.unwrap()
    }

    async fn mark_if_failed(
        self,
        created: i64,
        since: i64,
        status: ObjectStatus,
        now: i64,
    ) -> bool {
        let mark = FailedMark {
            key: self.key,
            created_at: self.at(created),
            failed_since: self.at(since),
            status,
            now: self.at(now),
        };
        self.store.mark_object_if_failed(&mark).await.unwrap()
    }

    async fn get(self) -> Option<ObjectRecord> {
        self.store.get_object(self.key).await.unwrap()
    }

    /// Its status and when it last changed, if it is recorded.
    async fn state(self) -> Option<(ObjectStatus, DateTime<Utc>)> {
        self.get().await.map(|r| (r.status, r.updated_at))
    }
}

/// The objects `failed_objects` lists, in its order.
async fn failed_ids(
    store: &dyn OrderingStore,
    namespace: &str,
    before: DateTime<Utc>,
    limit: usize,
) -> Vec<String> {
    let page = FailedPage {
        namespace,
        before,
        limit,
    };
    let listed = store.failed_objects(&page).await.unwrap();
    listed.into_iter().map(|r| r.object).collect()
}

/// `mark_object_if_failed` sets an object's status only while its newest event is
/// still the one given, still failed, and failed no later than the time given;
/// any other object it leaves as it is.
pub async fn a_failure_is_marked_only_while_it_stands(store: &dyn OrderingStore) {
    let base = Base::new();
    let (ns, at) = (&base.ns, |s| base.at(s));
    let obj = |object| base.object(store, object, "charge");
    // Each object's newest event is created at 1; failed at 10, except "pending".
    for object in ["cleared", "failed_later", "pending", "newer", "applied"] {
        let _ = obj(object).observe(1, 2).await;
        if object != "pending" {
            assert!(obj(object).settle(1, Failed, 10).await, "{SETTLE_APPLIES}");
        }
    }
    // Failed again at 20 (another event created at the same time).
    let again = obj("failed_later").settle(1, Failed, 20).await;
    assert!(!again, "settled before: answers false, records the failure");
    // A newer event, failed early enough: only its time tells it apart.
    let _ = obj("newer").observe(5, 11).await;
    assert!(obj("newer").settle(5, Failed, 12).await, "{SETTLE_APPLIES}");
    // Applied early enough: only its status tells it apart.
    assert!(obj("applied").mark(1, Applied, 12).await, "{MARK_APPLIES}");

    let clear = |object, since| obj(object).mark_if_failed(1, since, Applied, 30);
    assert!(clear("cleared", 10).await, "failed at the time given");
    let rule = "a failure cleared meanwhile is left as it is";
    assert_eq!(
        obj("cleared").state().await,
        Some((Applied, at(30))),
        "{rule}"
    );
    for (object, before) in [
        ("failed_later", (Failed, at(20))),
        ("pending", (Pending, at(2))),
        ("newer", (Failed, at(12))),
        ("applied", (Applied, at(12))),
    ] {
        assert!(!clear(object, 15).await, "{object}: not cleared");
        let state = obj(object).state().await;
        assert_eq!(state, Some(before), "{object}: unchanged");
    }
    assert!(!clear("unknown", 15).await, "no record");
    let rule = "mark_object_if_failed makes no record";
    assert_eq!(obj("unknown").state().await, None, "{rule}");
    let listed = failed_ids(store, ns, at(100), 10).await;
    let rule = "a cleared failure is no longer listed";
    assert_eq!(listed, ["newer", "failed_later"], "{rule}");

    // Failed again, to the back of the list, while still the failure listed.
    let requeue = |object, since| obj(object).mark_if_failed(1, since, Failed, 40);
    let rule = "a failure that still stands is marked";
    assert!(requeue("failed_later", 20).await, "{rule}");
    let state = obj("failed_later").state().await;
    assert_eq!(state, Some((Failed, at(40))), "{rule}: status and time");
    assert!(!requeue("cleared", 30).await, "cleared meanwhile");
    let rule = "a failure cleared meanwhile is left as it is";
    assert_eq!(
        obj("cleared").state().await,
        Some((Applied, at(30))),
        "{rule}"
    );
    let listed = failed_ids(store, ns, at(30), 10).await;
    assert_eq!(listed, ["newer"], "requeued at its new time");
}

/// `failed_objects` lists its namespace's failed objects, the oldest change
/// first, up to the limit; an object failed again is listed at its new time.
pub async fn failed_objects_are_listed_oldest_first(store: &dyn OrderingStore) {
    let base = Base::new();
    let (ns, now, at) = (&base.ns, base.now, |s| base.at(s));
    let other = Base::new().ns;
    let obj = |namespace, object| {
        let key = ObjectKey {
            namespace,
            object,
            family: "charge",
        };
        Object::new(store, key, now)
    };
    // Failed at 22, 21 and 23 (in that order), and one in another namespace.
    for (namespace, object, failed_at) in [
        (ns.as_str(), "trx-b", 22),
        (ns.as_str(), "trx-a", 21),
        (ns.as_str(), "trx-c", 23),
        (other.as_str(), "trx-x", 20),
    ] {
        let o = obj(namespace, object);
        let _ = o.observe(1, 2).await;
        assert!(o.settle(1, Failed, failed_at).await, "{SETTLE_APPLIES}");
    }
    let failed = |before, limit| failed_ids(store, ns, at(before), limit);
    let all = failed(100, 10).await;
    let rule = "oldest first, own namespace";
    assert_eq!(all, ["trx-a", "trx-b", "trx-c"], "{rule}");
    assert_eq!(failed(100, 1).await, ["trx-a"], "the limit is kept");
    let early = failed(22, 10).await;
    assert_eq!(early, ["trx-a", "trx-b"], "changed at or before");
    // Marked failed again later (a reconcile that failed): to the back.
    assert!(obj(ns, "trx-a").mark(1, Failed, 30).await, "{MARK_APPLIES}");
    let requeued = failed(100, 10).await;
    let rule = "an object marked failed again goes to the back";
    assert_eq!(requeued, ["trx-b", "trx-c", "trx-a"], "{rule}");
    // Reconciled: no longer listed.
    assert!(
        obj(ns, "trx-b").mark(1, Applied, 31).await,
        "{MARK_APPLIES}"
    );
    let left = failed(100, 10).await;
    let rule = "a reconciled object is no longer listed";
    assert_eq!(left, ["trx-c", "trx-a"], "{rule}");
    let all = failed(100, usize::MAX).await;
    assert_eq!(all, ["trx-c", "trx-a"], "any limit is taken");
}

/// A check's own namespace, and the time its calls count from.
struct Base {
    ns: String,
    now: DateTime<Utc>,
}

impl Base {
    fn new() -> Self {
        let now = DateTime::from_timestamp_millis(Utc::now().timestamp_millis());
        Self {
            ns: format!("conformance-order-{:016x}", FencingToken::random().0),
            now: now.expect("in range"),
        }
    }

    fn at(&self, seconds: i64) -> DateTime<Utc> {
        self.now + TimeDelta::seconds(seconds)
    }

    /// `object` of `family` in this check's namespace.
    fn object<'s>(
        &'s self,
        store: &'s dyn OrderingStore,
        object: &'s str,
        family: &'s str,
    ) -> Object<'s> {
        let key = ObjectKey {
            namespace: &self.ns,
            object,
            family,
        };
        Object::new(store, key, self.now)
    }
}

/// Older events are stale, equal or newer ones fresh; families and objects are separate.
pub async fn newest_wins(store: &dyn OrderingStore) {
    let base = Base::new();
    let at = |s| base.at(s);
    let trx = base.object(store, "trx-1", "charge");
    let key = trx.key;
    for (created, seen, answer, rule) in [
        (
            10,
            100,
            Freshness::Fresh,
            "the first event of an object is fresh",
        ),
        (
            5,
            101,
            Freshness::Stale { newest: at(10) },
            "an older event is stale, naming the newest",
        ),
        (10, 102, Freshness::Fresh, "a retry of the newest is fresh"),
        (20, 103, Freshness::Fresh, "a newer event is fresh"),
    ] {
        assert_eq!(trx.observe(created, seen).await, answer, "{rule}");
    }
    let refund = trx.of(ObjectKey {
        family: "refund",
        ..key
    });
    let answer = refund.observe(1, 104).await;
    assert_eq!(answer, Freshness::Fresh, "families are separate");
    let other = trx.of(ObjectKey {
        object: "trx-2",
        ..key
    });
    let answer = other.observe(1, 105).await;
    assert_eq!(answer, Freshness::Fresh, "objects are separate");
    let r = trx.get().await.expect("recorded");
    assert_eq!(
        (r.newest, r.status, r.updated_at),
        (at(20), Pending, at(103)),
        "the newest event wins: its time, Pending, updated_at"
    );
    let never = trx.of(ObjectKey {
        object: "nope",
        ..key
    });
    let rule = "get_object of an object never observed answers None";
    assert!(never.get().await.is_none(), "{rule}");
    let rule = "an object never observed is not marked";
    assert!(!never.mark(1, Applied, 106).await, "{rule}");
    assert!(never.get().await.is_none(), "nor stored by the mark");
}

/// Settling an older event does not change the status of a newer one; failures
/// are listed for reconciliation.
pub async fn settle_applies_to_the_newest_only(store: &dyn OrderingStore) {
    let base = Base::new();
    let at = |s| base.at(s);
    let cus = base.object(store, "cus-1", "customer");
    let (ns, key) = (&base.ns, cus.key);
    let status = || async { cus.get().await.expect("recorded").status };
    let _ = cus.observe(10, 10).await;
    let _ = cus.observe(20, 20).await;
    let rule = "settling an older event answers false";
    assert!(!cus.settle(10, Failed, 21).await, "{rule}");
    let rule = "a settle of an older event changes nothing";
    assert_eq!(status().await, Pending, "{rule}");
    let rule = "settling the newest event answers true";
    assert!(cus.settle(20, Failed, 22).await, "{rule}");
    let rule = "a settle of the newest event sets its status";
    assert_eq!(status().await, Failed, "{rule}");
    let early = failed_ids(store, ns, at(21), 10).await;
    assert!(early.is_empty(), "not failed before 22");
    let page = FailedPage {
        namespace: ns,
        before: at(22),
        limit: 10,
    };
    let failed = store.failed_objects(&page).await.unwrap();
    let rule = "failed_objects lists the object whose newest event failed";
    assert_eq!(failed.len(), 1, "{rule}");
    assert_eq!(
        (failed[0].object.as_str(), failed[0].family.as_str()),
        ("cus-1", "customer"),
        "{rule}: its object and family"
    );
    let rule = "a reconciled object is marked applied";
    assert!(cus.mark(20, Applied, 23).await, "{rule}");
    let rule = "marking an older event answers false";
    assert!(!cus.mark(10, Applied, 23).await, "{rule}");
    let unknown = cus.of(ObjectKey {
        object: "cus-never-seen",
        ..key
    });
    let rule = "settling an object never observed answers false";
    assert!(!unknown.settle(20, Applied, 23).await, "{rule}");
    let failed = failed_ids(store, ns, at(100), 10).await;
    let rule = "no object is listed failed whose newest event did not fail";
    assert!(failed.is_empty(), "{rule}");
}

/// Events created at the same time are all fresh, but only the first to settle
/// settles the object: the others answer false (their order is unknown), and a
/// failure among them is kept.
pub async fn events_created_at_the_same_time_settle_once(store: &dyn OrderingStore) {
    let base = Base::new();
    let at = |s| base.at(s);
    let inv = base.object(store, "in_1", "invoice");
    let ns = &base.ns;
    for (event, seen) in [("finalized", 1), ("paid", 2)] {
        let answer = inv.observe(0, seen).await;
        assert_eq!(answer, Freshness::Fresh, "{event}: a tie is fresh");
    }
    let rule = "a tie changes nothing";
    assert_eq!(inv.state().await, Some((Pending, at(1))), "{rule}");
    assert!(inv.settle(0, Applied, 3).await, "{SETTLE_APPLIES}");
    let rule = "the second event of the same time to settle answers false";
    assert!(!inv.settle(0, Applied, 4).await, "{rule}");
    let rule = "one settle of events created at the same time applies";
    assert_eq!(inv.state().await, Some((Applied, at(3))), "{rule}");
    let answer = inv.observe(0, 5).await;
    assert_eq!(answer, Freshness::Fresh, "a retry after a settle is fresh");
    let status = inv.get().await.expect("recorded").status;
    assert_eq!(status, Applied, "and leaves the settled status");
    let rule = "a later failure of the same time answers false";
    assert!(!inv.settle(0, Failed, 6).await, "{rule}");
    assert_eq!(inv.state().await, Some((Failed, at(6))), "but is kept");
    let failed = failed_ids(store, ns, at(6), 10).await;
    assert_eq!(failed.len(), 1, "the failed object is listed");
    assert!(inv.mark(0, Applied, 7).await, "{MARK_APPLIES}");
    let rule = "a newer event after a settle is fresh";
    assert_eq!(inv.observe(1, 8).await, Freshness::Fresh, "{rule}");
    let rule = "a newer event settles afresh";
    assert!(inv.settle(1, Applied, 9).await, "{rule}");
}

/// Concurrent observations of one object end with the newest recorded.
pub async fn concurrent_observations_keep_the_newest(store: &dyn OrderingStore) {
    let Base { ns, now } = Base::new();
    let key = ObjectKey {
        namespace: &ns,
        object: "trx-race",
        family: "charge",
    };
    let times: Vec<_> = (0..32)
        .map(|i| now + TimeDelta::seconds((i * 7919) % 32))
        .collect();
    let observations: Vec<_> = (times.iter())
        .map(|&created_at| Observation {
            key,
            created_at,
            now,
        })
        .collect();
    let answers = join_all(observations.iter().map(|o| store.observe(o))).await;
    for (t, answer) in times.iter().zip(answers) {
        match answer.expect("observe failed") {
            Freshness::Fresh => {}
            Freshness::Stale { newest } => assert!(
                newest > *t,
                "an observation is stale only against a newer one ({newest} <= {t})"
            ),
        }
    }
    assert_eq!(
        store.get_object(key).await.unwrap().unwrap().newest,
        now + TimeDelta::seconds(31),
        "concurrent observations keep the newest"
    );
}
