//! Checks of the fenced changes ([`ProcessedStore::finish`], [`ProcessedStore::renew`])
//! and of reading, deleting, listing and purging records.

use chrono::{TimeDelta, TimeZone, Utc};

use super::{
    acquired, existing, fence_is, finish_applies, finish_refused, renew_is, stored, Fixture,
};
use crate::store::{
    Deleted, FailureNote, Fence, FencingToken, Fingerprint, Holder, ProcessedStore, Record,
    RecordState, Renew,
};

/// Finish applies only with the current token and only to an `InProgress` record.
pub async fn finish_is_fenced(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let req = f.claimed(store, "fence", b"b").await;
    let done = f.finish(RecordState::Completed, 0, &[], 1);
    let wrong = FencingToken(req.token.0 ^ 1);
    let rule = "a wrong token is refused";
    finish_refused(
        store.finish(Holder::new(f.key("fence"), wrong), &done),
        rule,
    )
    .await;
    assert_eq!(
        store.get(f.key("fence")).await.unwrap().unwrap().state,
        RecordState::InProgress,
        "a refused finish changes nothing"
    );
    finish_applies(store.finish(Holder::new(f.key("fence"), req.token), &done)).await;
    let rule = "a finished record cannot be finished again";
    finish_refused(
        store.finish(Holder::new(f.key("fence"), req.token), &done),
        rule,
    )
    .await;
    let rule = "a missing record cannot be finished";
    finish_refused(
        store.finish(Holder::new(f.key("absent"), req.token), &done),
        rule,
    )
    .await;
    let rec = stored(store, f.key("fence"), "a finished record").await;
    assert_eq!(rec.state, RecordState::Completed, "finish sets the state");
    assert_eq!(rec.updated_at, f.at_secs(1), "finish sets updated_at");
    assert_eq!(rec.expires_at, f.at_secs(3601), "finish sets expires_at");

    // A lease that ran out but was not taken over may still be finished.
    let late = f.claimed(store, "late", b"b").await;
    let done = f.finish(RecordState::Completed, 0, &[], 90);
    fence_is(
        store.finish(Holder::new(f.key("late"), late.token), &done),
        Fence::Applied,
        "a finish after the lease ran out, not taken over, applies",
    )
    .await;
    assert_eq!(
        stored(store, f.key("late"), "a finished record")
            .await
            .state,
        RecordState::Completed,
        "a finish after the lease ran out sets the state"
    );
}

/// Renew extends the lease only for the current holder.
pub async fn renew_is_fenced(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let req = f.claimed(store, "long", b"b").await;
    let k = f.key("long");
    let (wrong, to_200) = (
        FencingToken(req.token.0 ^ 1),
        (f.at_secs(200), f.at_secs(7200)),
    );
    let refused = "renew with another claim's token is refused";
    renew_is(store, k, wrong, to_200, Fence::LeaseLost, refused).await;
    let held = "renew by the claim holding the lease applies";
    renew_is(store, k, req.token, to_200, Fence::Applied, held).await;
    let case = "a renewed lease holds";
    existing(store, &f.request("long", b"b", 100), case).await;
    let rec = stored(store, k, "a renewed record").await;
    assert_eq!(rec.lease_until, f.at_secs(200), "renew sets the lease");
    assert_eq!(rec.expires_at, f.at_secs(7200), "renew raises the expiry");
    let lower = (f.at_secs(210), f.at_secs(10));
    renew_is(store, k, req.token, lower, Fence::Applied, held).await;
    let rec = stored(store, k, "a renewed record").await;
    assert_eq!(rec.lease_until, f.at_secs(210), "renew moves the lease");
    assert_eq!(
        rec.expires_at,
        f.at_secs(7200),
        "renew never lowers the expiry"
    );
    let missing = f.key("never-claimed");
    let rule = "a missing record cannot be renewed";
    renew_is(store, missing, req.token, to_200, Fence::LeaseLost, rule).await;
    let done = f.finish(RecordState::Completed, 0, &[], 1);
    let _ = store
        .finish(Holder::new(k, req.token), &done)
        .await
        .unwrap();
    let rule = "a finished record cannot be renewed";
    let to_300 = (f.at_secs(300), f.at_secs(7200));
    renew_is(store, k, req.token, to_300, Fence::LeaseLost, rule).await;
}

/// Every field, ids with unusual characters and the history survive a round trip.
pub async fn record_round_trips(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let id = "evt:ü/{tag}*\"'; DROP TABLE x;--";
    let req = f.claimed(store, id, b"payload").await;
    let history = vec![
        FailureNote {
            at: f.at_secs(1),
            error: "first: \"quoted\" ✓".into(),
        },
        FailureNote {
            at: f.at_secs(2),
            error: "second".into(),
        },
    ];
    let perm = f.finish(RecordState::PermanentFailure, 2, &history, 2);
    finish_applies(store.finish(Holder::new(f.key(id), req.token), &perm)).await;
    let rule = "a record reads back as written";
    let rec = stored(store, f.key(id), rule).await;
    assert_eq!(rec.id, id, "{rule}: id");
    assert_eq!(rec.state, RecordState::PermanentFailure, "{rule}: state");
    assert_eq!(rec.failures, 2, "{rule}: failures");
    assert_eq!(rec.history, history, "{rule}: history");
    let fingerprint = Fingerprint::of(b"payload");
    assert_eq!(rec.fingerprint, fingerprint, "{rule}: fingerprint");
    assert_eq!(rec.token, req.token, "{rule}: token");
    assert_eq!(rec.attempts, 1, "{rule}: attempts");
    assert_eq!(
        rec.lease_until, req.lease_until,
        "the lease survives a finish"
    );
    assert_eq!(rec.expires_at, perm.expires_at, "{rule}: expires_at");
    assert_eq!(rec.created_at, req.now, "{rule}: created_at");
    assert_eq!(rec.updated_at, perm.now, "{rule}: updated_at");
    let never = store.get(f.key("never-seen")).await.unwrap();
    assert!(never.is_none(), "get of a key never claimed answers None");
    let big = f.request("big-token", b"x", 0);
    let mut big = big;
    big.token = FencingToken(u64::MAX - 7);
    let rec = acquired(store, &big, "fresh claim").await;
    assert_eq!(
        rec.token,
        FencingToken(u64::MAX - 7),
        "tokens keep all 64 bits"
    );
}

/// A live lease outlives the record's expiry: an `InProgress` record whose lease
/// was renewed past `expires_at` is neither replaced by a claim nor deleted until
/// the lease ends; then it is claimed afresh.
pub async fn a_live_lease_outlives_the_expiry(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let req = f.claimed(store, "outlives", b"b").await;
    let k = f.key("outlives");
    let to_10_000 = (f.at_secs(10_000), f.at_secs(3601));
    let rule = "renew by the claim holding the lease applies";
    renew_is(store, k, req.token, to_10_000, Fence::Applied, rule).await;
    let case = "a claim after the expiry, the lease still live";
    let held = existing(store, &f.request("outlives", b"b", 5000), case).await;
    assert_eq!(
        held.token, req.token,
        "a live lease keeps its holder's token"
    );
    assert_eq!(
        store.delete(k, f.at_secs(5000)).await.unwrap(),
        Deleted::LeaseHeld,
        "a live lease is not deleted, expired or not"
    );
    let case = "a claim once the lease ended (and the record expired)";
    let fresh = acquired(store, &f.request("outlives", b"b", 10_000), case).await;
    assert_eq!(fresh.attempts, 1, "an expired record is replaced");
}

/// Delete refuses a live lease and removes anything else.
pub async fn delete_spares_live_leases(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    f.claimed(store, "forget", b"b").await;
    assert_eq!(
        store.delete(f.key("forget"), f.at_secs(1)).await.unwrap(),
        Deleted::LeaseHeld,
        "a live lease is not deleted"
    );
    assert_eq!(
        store
            .delete(f.key("forget"), f.at_secs(60) - TimeDelta::milliseconds(1))
            .await
            .unwrap(),
        Deleted::LeaseHeld,
        "a lease is live until its last millisecond"
    );
    assert_eq!(
        store.delete(f.key("forget"), f.at_secs(60)).await.unwrap(),
        Deleted::Removed,
        "a lease ends at its `lease_until`: it may then be deleted"
    );
    assert_eq!(
        store.delete(f.key("forget"), f.at_secs(62)).await.unwrap(),
        Deleted::NotFound,
        "delete of a missing record answers NotFound"
    );
    let case = "a deleted id is claimed afresh";
    acquired(store, &f.request("forget", b"b", 63), case).await;
}

/// Stuck lists `InProgress` records whose lease ran out, and nothing else of ours.
pub async fn stuck_lists_expired_leases(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let a = f.claimed(store, "stuck-a", b"b").await;
    let b = f.claimed(store, "stuck-b", b"b").await;
    let _ = store
        .finish(
            Holder::new(f.key("stuck-b"), b.token),
            &f.finish(RecordState::Completed, 0, &[], 1),
        )
        .await
        .unwrap();
    let ours = |records: Vec<Record>| {
        records
            .into_iter()
            .filter(|r| r.namespace == f.namespace)
            .map(|r| r.id)
            .collect::<Vec<_>>()
    };
    assert!(
        ours(store.stuck(f.at_secs(30), 10_000).await.unwrap()).is_empty(),
        "a live lease is not stuck"
    );
    assert!(
        ours(
            store
                .stuck(f.at_secs(60) - TimeDelta::milliseconds(1), 10_000)
                .await
                .unwrap()
        )
        .is_empty(),
        "a lease is live until its last millisecond"
    );
    assert_eq!(
        ours(store.stuck(f.at_secs(60), 10_000).await.unwrap()),
        vec!["stuck-a".to_owned()],
        "a lease ends at its `lease_until`"
    );
    assert!(
        store.stuck(f.at_secs(61), 0).await.unwrap().is_empty(),
        "the limit is kept"
    );

    // The longest-expired first: four more leases, claimed later (claimed in the
    // reverse order of their ends, so no store lists them in claim order by luck).
    let later: Vec<String> = (1..=4).map(|i| format!("stuck-{i}")).collect();
    for (i, id) in later.iter().enumerate().rev() {
        let at = i64::try_from(i).expect("small") + 1;
        acquired(store, &f.request(id, b"b", at), "fresh claim").await;
    }
    let page = store.stuck(f.at_secs(100), 10_000).await.unwrap();
    assert!(
        page.windows(2)
            .all(|w| w[0].lease_until <= w[1].lease_until),
        "stuck lists the longest-expired leases first"
    );
    let mut expected = vec!["stuck-a".to_owned()];
    expected.extend(later);
    assert_eq!(
        ours(page),
        expected,
        "stuck lists the longest-expired first"
    );
    let first = store.stuck(f.at_secs(100), 1).await.unwrap();
    assert!(
        first.len() == 1 && first[0].lease_until <= a.lease_until,
        "a page of one holds the longest-expired lease"
    );
}

/// Purge removes expired records (up to the limit), never a live lease, never a
/// record not yet expired. Uses records dated 2001 so that it leaves other data alone.
pub async fn purge_removes_only_expired(store: &dyn ProcessedStore) {
    let base = Utc.with_ymd_and_hms(2001, 1, 1, 0, 0, 0).unwrap();
    let f = Fixture::at(base);
    let mut tokens = Vec::new();
    for i in 0..10 {
        let id = format!("p{i}");
        let req = f.claimed(store, &id, b"b").await;
        tokens.push(req.token);
    }
    // p0..p7 completed (expire at +3601 s); p8 stays InProgress with a lease renewed
    // past the purge time; p9 completed with a long expiry.
    for (i, token) in tokens.iter().enumerate().take(8) {
        let id = format!("p{i}");
        let _ = store
            .finish(
                Holder::new(f.key(&id), *token),
                &f.finish(RecordState::Completed, 0, &[], 1),
            )
            .await
            .unwrap();
    }
    let _ = store
        .renew(
            Holder::new(f.key("p8"), tokens[8]),
            &Renew {
                lease_until: f.at_secs(100_000),
                expires_at: f.at_secs(3601),
            },
        )
        .await
        .unwrap();
    let mut long = f.finish(RecordState::Completed, 0, &[], 1);
    long.expires_at = f.at_secs(200_000);
    let _ = store
        .finish(Holder::new(f.key("p9"), tokens[9]), &long)
        .await
        .unwrap();

    let at = f.at_secs(5000);
    let first = store.purge_expired(at, 3).await.unwrap();
    assert!(
        (1..=3).contains(&first),
        "purge keeps its limit (removed {first})"
    );
    let mut total = first;
    loop {
        let n = store.purge_expired(at, 3).await.unwrap();
        assert!(n <= 3, "purge keeps its limit");
        if n == 0 {
            break;
        }
        total += n;
    }
    assert!(
        total >= 8,
        "all 8 expired records were purged (removed {total})"
    );
    for i in 0..8 {
        assert!(
            store.get(f.key(&format!("p{i}"))).await.unwrap().is_none(),
            "p{i} expired and was purged"
        );
    }
    assert!(
        store.get(f.key("p8")).await.unwrap().is_some(),
        "a live lease is never purged"
    );
    assert!(
        store.get(f.key("p9")).await.unwrap().is_some(),
        "an unexpired record is never purged"
    );

    // An expiry is the first millisecond a record may be purged.
    let edge = f.request("edge", b"b", 10_000);
    acquired(store, &edge, "fresh claim").await;
    let done = f.finish(RecordState::Completed, 0, &[], 10_001);
    let _ = store
        .finish(Holder::new(f.key("edge"), edge.token), &done)
        .await
        .unwrap();
    let purge_all = |at| async move { while store.purge_expired(at, 1000).await.unwrap() > 0 {} };
    purge_all(done.expires_at - TimeDelta::milliseconds(1)).await;
    assert!(
        store.get(f.key("edge")).await.unwrap().is_some(),
        "a record is kept until its last millisecond"
    );
    purge_all(done.expires_at).await;
    assert!(
        store.get(f.key("edge")).await.unwrap().is_none(),
        "a record expires at its `expires_at`"
    );
}
