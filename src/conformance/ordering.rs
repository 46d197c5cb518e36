//! The conformance suite for [`OrderingStore`] implementations.

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::future::join_all;

use crate::ordering::{
    FailedMark, FailedPage, Freshness, ObjectKey, ObjectMark, ObjectRecord, ObjectStatus,
    Observation, OrderingStore,
};
use crate::store::FencingToken;

/// Runs every ordering check.
pub async fn run_all(store: &dyn OrderingStore) {
    newest_wins(store).await;
    settle_applies_to_the_newest_only(store).await;
    events_created_at_the_same_time_settle_once(store).await;
    concurrent_observations_keep_the_newest(store).await;
    failed_objects_are_listed_oldest_first(store).await;
    a_failure_is_marked_only_while_it_stands(store).await;
}

/// `mark_object_if_failed` sets an object's status only while its newest event is
/// still the one given, still failed, and failed no later than the time given;
/// any other object it leaves as it is.
pub async fn a_failure_is_marked_only_while_it_stands(store: &dyn OrderingStore) {
    let (ns, now) = base();
    let at = |s| now + TimeDelta::seconds(s);
    let key = |object| ObjectKey {
        namespace: &ns,
        object,
        family: "charge",
    };
    let status = |object| async move {
        let record = store.get_object(key(object)).await.unwrap();
        record.map(|r| (r.status, r.updated_at))
    };
    // Each object's newest event is created at 1; failed at 10, except "pending".
    for object in ["cleared", "failed_later", "pending", "newer", "applied"] {
        let _ = store
            .observe(&Observation {
                key: key(object),
                created_at: at(1),
                now: at(2),
            })
            .await
            .unwrap();
        if object != "pending" {
            let ended = ObjectStatus::Failed;
            assert!(
                store
                    .settle_object(&ObjectMark {
                        key: key(object),
                        created_at: at(1),
                        status: ended,
                        now: at(10)
                    })
                    .await
                    .unwrap(),
                "settle_object of the object's newest event applies"
            );
        }
    }
    // Failed again at 20 (another event created at the same time).
    let again = store
        .settle_object(&ObjectMark {
            key: key("failed_later"),
            created_at: at(1),
            status: ObjectStatus::Failed,
            now: at(20),
        })
        .await
        .unwrap();
    assert!(!again, "settled before: answers false, records the failure");
    // A newer event, failed early enough: only its time tells it apart.
    let _ = store
        .observe(&Observation {
            key: key("newer"),
            created_at: at(5),
            now: at(11),
        })
        .await
        .unwrap();
    let mark = ObjectMark {
        key: key("newer"),
        created_at: at(5),
        status: ObjectStatus::Failed,
        now: at(12),
    };
    let newer_failed = store.settle_object(&mark);
    let rule = "settle_object of the object's newest event applies";
    assert!(newer_failed.await.unwrap(), "{rule}");
    // Applied early enough: only its status tells it apart.
    assert!(
        store
            .mark_object(&ObjectMark {
                key: key("applied"),
                created_at: at(1),
                status: ObjectStatus::Applied,
                now: at(12)
            })
            .await
            .unwrap(),
        "mark_object of the object's newest event applies"
    );

    // Marks `object` (its event created at 1) with `status` at `now` if it failed
    // at or before `since`.
    let mark_if_failed = |object, status, now, since| {
        let mark = FailedMark {
            key: key(object),
            created_at: at(1),
            failed_since: at(since),
            status,
            now: at(now),
        };
        async move { store.mark_object_if_failed(&mark).await }
    };
    let clear = |object, since| mark_if_failed(object, ObjectStatus::Applied, 30, since);
    assert!(
        clear("cleared", 10).await.unwrap(),
        "failed at the time given"
    );
    assert_eq!(
        status("cleared").await,
        Some((ObjectStatus::Applied, at(30))),
        "a failure cleared meanwhile is left as it is"
    );
    for (object, before) in [
        ("failed_later", (ObjectStatus::Failed, at(20))),
        ("pending", (ObjectStatus::Pending, at(2))),
        ("newer", (ObjectStatus::Failed, at(12))),
        ("applied", (ObjectStatus::Applied, at(12))),
    ] {
        assert!(!clear(object, 15).await.unwrap(), "{object}: not cleared");
        assert_eq!(status(object).await, Some(before), "{object}: unchanged");
    }
    assert!(!clear("unknown", 15).await.unwrap(), "no record");
    let rule = "mark_object_if_failed makes no record";
    assert_eq!(status("unknown").await, None, "{rule}");
    let listed = list_failed(store, &ns, at(100), 10).await;
    let listed: Vec<_> = listed.iter().map(|r| r.object.as_str()).collect();
    assert_eq!(
        listed,
        ["newer", "failed_later"],
        "a cleared failure is no longer listed"
    );

    // Failed again, to the back of the list, while still the failure listed.
    let requeue = |object, since| mark_if_failed(object, ObjectStatus::Failed, 40, since);
    let rule = "a failure that still stands is marked";
    assert!(requeue("failed_later", 20).await.unwrap(), "{rule}");
    assert_eq!(
        status("failed_later").await,
        Some((ObjectStatus::Failed, at(40))),
        "{rule}: status and time"
    );
    assert!(!requeue("cleared", 30).await.unwrap(), "cleared meanwhile");
    assert_eq!(
        status("cleared").await,
        Some((ObjectStatus::Applied, at(30))),
        "a failure cleared meanwhile is left as it is"
    );
    let listed = list_failed(store, &ns, at(30), 10).await;
    let listed: Vec<_> = listed.iter().map(|r| r.object.as_str()).collect();
    assert_eq!(listed, ["newer"], "requeued at its new time");
}

/// `failed_objects` lists its namespace's failed objects, the oldest change
/// first, up to the limit; an object failed again is listed at its new time.
pub async fn failed_objects_are_listed_oldest_first(store: &dyn OrderingStore) {
    let (ns, now) = base();
    let (other, _) = base();
    let at = |s| now + TimeDelta::seconds(s);
    let key = |namespace, object| ObjectKey {
        namespace,
        object,
        family: "charge",
    };
    // Failed at 22, 21 and 23 (in that order), and one in another namespace.
    for (namespace, object, failed_at) in [
        (ns.as_str(), "trx-b", 22),
        (ns.as_str(), "trx-a", 21),
        (ns.as_str(), "trx-c", 23),
        (other.as_str(), "trx-x", 20),
    ] {
        let k = key(namespace, object);
        let _ = store
            .observe(&Observation {
                key: k,
                created_at: at(1),
                now: at(2),
            })
            .await
            .unwrap();
        assert!(
            store
                .settle_object(&ObjectMark {
                    key: k,
                    created_at: at(1),
                    status: ObjectStatus::Failed,
                    now: at(failed_at)
                })
                .await
                .unwrap(),
            "settle_object of the object's newest event applies"
        );
    }
    let objects = |list: Vec<crate::ordering::ObjectRecord>| {
        list.into_iter().map(|r| r.object).collect::<Vec<_>>()
    };
    let all = list_failed(store, &ns, at(100), 10).await;
    assert_eq!(
        objects(all),
        ["trx-a", "trx-b", "trx-c"],
        "oldest first, own namespace"
    );
    let first = list_failed(store, &ns, at(100), 1).await;
    assert_eq!(objects(first), ["trx-a"], "the limit is kept");
    let early = list_failed(store, &ns, at(22), 10).await;
    assert_eq!(objects(early), ["trx-a", "trx-b"], "changed at or before");
    // Marked failed again later (a reconcile that failed): to the back.
    assert!(
        store
            .mark_object(&ObjectMark {
                key: key(&ns, "trx-a"),
                created_at: at(1),
                status: ObjectStatus::Failed,
                now: at(30)
            })
            .await
            .unwrap(),
        "mark_object of the object's newest event applies"
    );
    let requeued = list_failed(store, &ns, at(100), 10).await;
    let rule = "an object marked failed again goes to the back";
    assert_eq!(objects(requeued), ["trx-b", "trx-c", "trx-a"], "{rule}");
    // Reconciled: no longer listed.
    assert!(
        store
            .mark_object(&ObjectMark {
                key: key(&ns, "trx-b"),
                created_at: at(1),
                status: ObjectStatus::Applied,
                now: at(31)
            })
            .await
            .unwrap(),
        "mark_object of the object's newest event applies"
    );
    let left = list_failed(store, &ns, at(100), 10).await;
    let rule = "a reconciled object is no longer listed";
    assert_eq!(objects(left), ["trx-c", "trx-a"], "{rule}");
    let all = list_failed(store, &ns, at(100), usize::MAX).await;
    assert_eq!(objects(all), ["trx-c", "trx-a"], "any limit is taken");
}

/// The failed objects `store` lists of `namespace`, last changed at or before
/// `before`, up to `limit`.
async fn list_failed(
    store: &dyn OrderingStore,
    namespace: &str,
    before: DateTime<Utc>,
    limit: usize,
) -> Vec<ObjectRecord> {
    let page = FailedPage {
        namespace,
        before,
        limit,
    };
    store.failed_objects(&page).await.unwrap()
}

fn base() -> (String, DateTime<Utc>) {
    let now = DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).expect("in range");
    (
        format!("conformance-order-{:016x}", FencingToken::random().0),
        now,
    )
}

/// Older events are stale, equal or newer ones fresh; families and objects are separate.
pub async fn newest_wins(store: &dyn OrderingStore) {
    let (ns, now) = base();
    let at = |s| now + TimeDelta::seconds(s);
    let key = ObjectKey {
        namespace: &ns,
        object: "trx-1",
        family: "charge",
    };
    assert_eq!(
        store
            .observe(&Observation {
                key,
                created_at: at(10),
                now: at(100)
            })
            .await
            .unwrap(),
        Freshness::Fresh,
        "the first event of an object is fresh"
    );
    assert_eq!(
        store
            .observe(&Observation {
                key,
                created_at: at(5),
                now: at(101)
            })
            .await
            .unwrap(),
        Freshness::Stale { newest: at(10) },
        "an older event is stale, naming the newest"
    );
    assert_eq!(
        store
            .observe(&Observation {
                key,
                created_at: at(10),
                now: at(102)
            })
            .await
            .unwrap(),
        Freshness::Fresh,
        "a retry of the newest is fresh"
    );
    assert_eq!(
        store
            .observe(&Observation {
                key,
                created_at: at(20),
                now: at(103)
            })
            .await
            .unwrap(),
        Freshness::Fresh,
        "a newer event is fresh"
    );
    let refund = ObjectKey {
        family: "refund",
        ..key
    };
    assert_eq!(
        store
            .observe(&Observation {
                key: refund,
                created_at: at(1),
                now: at(104)
            })
            .await
            .unwrap(),
        Freshness::Fresh,
        "families are separate"
    );
    let other = ObjectKey {
        object: "trx-2",
        ..key
    };
    assert_eq!(
        store
            .observe(&Observation {
                key: other,
                created_at: at(1),
                now: at(105)
            })
            .await
            .unwrap(),
        Freshness::Fresh,
        "objects are separate"
    );
    let r = store.get_object(key).await.unwrap().expect("recorded");
    assert_eq!(
        (r.newest, r.status, r.updated_at),
        (at(20), ObjectStatus::Pending, at(103)),
        "the newest event wins: its time, Pending, updated_at"
    );
    let never = ObjectKey {
        object: "nope",
        ..key
    };
    let rule = "get_object of an object never observed answers None";
    assert!(store.get_object(never).await.unwrap().is_none(), "{rule}");
    assert!(
        !store
            .mark_object(&ObjectMark {
                key: never,
                created_at: at(1),
                status: ObjectStatus::Applied,
                now: at(106)
            })
            .await
            .unwrap(),
        "an object never observed is not marked"
    );
    assert!(
        store.get_object(never).await.unwrap().is_none(),
        "nor stored by the mark"
    );
}

/// Settling an older event does not change the status of a newer one; failures
/// are listed for reconciliation.
pub async fn settle_applies_to_the_newest_only(store: &dyn OrderingStore) {
    let (ns, now) = base();
    let at = |s| now + TimeDelta::seconds(s);
    let key = ObjectKey {
        namespace: &ns,
        object: "cus-1",
        family: "customer",
    };
    for created_at in [at(10), at(20)] {
        let event = Observation {
            key,
            created_at,
            now: created_at,
        };
        let _ = store.observe(&event).await.unwrap();
    }
    assert!(
        !store
            .settle_object(&ObjectMark {
                key,
                created_at: at(10),
                status: ObjectStatus::Failed,
                now: at(21)
            })
            .await
            .unwrap(),
        "settling an older event answers false"
    );
    assert_eq!(
        store.get_object(key).await.unwrap().unwrap().status,
        ObjectStatus::Pending,
        "a settle of an older event changes nothing"
    );
    assert!(
        store
            .settle_object(&ObjectMark {
                key,
                created_at: at(20),
                status: ObjectStatus::Failed,
                now: at(22)
            })
            .await
            .unwrap(),
        "settling the newest event answers true"
    );
    assert_eq!(
        store.get_object(key).await.unwrap().unwrap().status,
        ObjectStatus::Failed,
        "a settle of the newest event sets its status"
    );
    assert!(
        list_failed(store, &ns, at(21), 10).await.is_empty(),
        "not failed before 22"
    );
    let failed = list_failed(store, &ns, at(22), 10).await;
    let rule = "failed_objects lists the object whose newest event failed";
    assert_eq!(failed.len(), 1, "{rule}");
    assert_eq!(
        (failed[0].object.as_str(), failed[0].family.as_str()),
        ("cus-1", "customer"),
        "{rule}: its object and family"
    );
    assert!(
        store
            .mark_object(&ObjectMark {
                key,
                created_at: at(20),
                status: ObjectStatus::Applied,
                now: at(23)
            })
            .await
            .unwrap(),
        "a reconciled object is marked applied"
    );
    assert!(
        !store
            .mark_object(&ObjectMark {
                key,
                created_at: at(10),
                status: ObjectStatus::Applied,
                now: at(23)
            })
            .await
            .unwrap(),
        "marking an older event answers false"
    );
    let unknown = ObjectKey {
        object: "cus-never-seen",
        ..key
    };
    assert!(
        !store
            .settle_object(&ObjectMark {
                key: unknown,
                created_at: at(20),
                status: ObjectStatus::Applied,
                now: at(23)
            })
            .await
            .unwrap(),
        "settling an object never observed answers false"
    );
    let failed = list_failed(store, &ns, at(100), 10).await;
    let rule = "no object is listed failed whose newest event did not fail";
    assert!(failed.is_empty(), "{rule}");
}

/// Events created at the same time are all fresh, but only the first to settle
/// settles the object: the others answer false (their order is unknown), and a
/// failure among them is kept.
pub async fn events_created_at_the_same_time_settle_once(store: &dyn OrderingStore) {
    let (ns, now) = base();
    let at = |s| now + TimeDelta::seconds(s);
    let key = ObjectKey {
        namespace: &ns,
        object: "in_1",
        family: "invoice",
    };
    for (event, seen) in [("finalized", 1), ("paid", 2)] {
        assert_eq!(
            store
                .observe(&Observation {
                    key,
                    created_at: at(0),
                    now: at(seen)
                })
                .await
                .unwrap(),
            Freshness::Fresh,
            "{event}: a tie is fresh"
        );
    }
    let r = store.get_object(key).await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.updated_at),
        (ObjectStatus::Pending, at(1)),
        "a tie changes nothing"
    );
    assert!(
        store
            .settle_object(&ObjectMark {
                key,
                created_at: at(0),
                status: ObjectStatus::Applied,
                now: at(3)
            })
            .await
            .unwrap(),
        "settle_object of the object's newest event applies"
    );
    assert!(
        !store
            .settle_object(&ObjectMark {
                key,
                created_at: at(0),
                status: ObjectStatus::Applied,
                now: at(4)
            })
            .await
            .unwrap(),
        "the second event of the same time to settle answers false"
    );
    let r = store.get_object(key).await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.updated_at),
        (ObjectStatus::Applied, at(3)),
        "one settle of events created at the same time applies"
    );
    assert_eq!(
        store
            .observe(&Observation {
                key,
                created_at: at(0),
                now: at(5)
            })
            .await
            .unwrap(),
        Freshness::Fresh,
        "a retry after a settle is fresh"
    );
    assert_eq!(
        store.get_object(key).await.unwrap().unwrap().status,
        ObjectStatus::Applied,
        "and leaves the settled status"
    );
    assert!(
        !store
            .settle_object(&ObjectMark {
                key,
                created_at: at(0),
                status: ObjectStatus::Failed,
                now: at(6)
            })
            .await
            .unwrap(),
        "a later failure of the same time answers false"
    );
    let r = store.get_object(key).await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.updated_at),
        (ObjectStatus::Failed, at(6)),
        "but is kept"
    );
    let failed = list_failed(store, &ns, at(6), 10).await;
    assert_eq!(failed.len(), 1, "the failed object is listed");
    assert!(
        store
            .mark_object(&ObjectMark {
                key,
                created_at: at(0),
                status: ObjectStatus::Applied,
                now: at(7)
            })
            .await
            .unwrap(),
        "mark_object of the object's newest event applies"
    );
    assert_eq!(
        store
            .observe(&Observation {
                key,
                created_at: at(1),
                now: at(8)
            })
            .await
            .unwrap(),
        Freshness::Fresh,
        "a newer event after a settle is fresh"
    );
    assert!(
        store
            .settle_object(&ObjectMark {
                key,
                created_at: at(1),
                status: ObjectStatus::Applied,
                now: at(9)
            })
            .await
            .unwrap(),
        "a newer event settles afresh"
    );
}

/// Concurrent observations of one object end with the newest recorded.
pub async fn concurrent_observations_keep_the_newest(store: &dyn OrderingStore) {
    let (ns, now) = base();
    let key = ObjectKey {
        namespace: &ns,
        object: "trx-race",
        family: "charge",
    };
    let events: Vec<_> = (0..32)
        .map(|i| now + TimeDelta::seconds((i * 7919) % 32))
        .map(|created_at| Observation {
            key,
            created_at,
            now,
        })
        .collect();
    let answers = join_all(events.iter().map(|event| store.observe(event))).await;
    let times = events.iter().map(|event| &event.created_at);
    for (t, answer) in times.zip(answers) {
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
