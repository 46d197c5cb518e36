//! Checks of [`ProcessedStore::claim`]: fresh claims, takeovers, races, and the
//! edges of leases and expiries.

use chrono::TimeDelta;
use futures_util::future::join_all;

use super::{acquired, body_is, counts, existing, finish_applies, finish_refused, times, Fixture};
use crate::store::{
    Claim, ClaimRequest, Deleted, FailureNote, Fence, Fingerprint, Finish, Holder, Key,
    ProcessedStore, Record, RecordState,
};

/// A claim that carries the token of the stored record at another time (a process
/// forked mid-sequence draws its parent's tokens) is a duplicate like any other: a
/// held id and a completed one are answered `Existing`, never as this claim's own.
pub async fn a_repeated_token_is_not_the_claims_own(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let rule = "a claim repeating the stored record's token";
    for state in [RecordState::InProgress, RecordState::Completed] {
        let id = format!("evt_{state:?}");
        let first = f.request(&id, b"body", 0);
        let token = acquired(store, &first, "fresh claim").await.token;
        if state == RecordState::Completed {
            let done = f.finish(state, 0, &[], 1);
            let fence = store.finish(Holder::new(f.key(&id), token), &done).await;
            assert_eq!(fence.expect("finish failed"), Fence::Applied, "finish");
        }
        let again = ClaimRequest {
            token,
            ..f.request(&id, b"body", 2)
        };
        let rec = existing(store, &again, rule).await;
        assert_eq!(rec.state, state, "{rule}: the stored record");
    }
}

/// A fresh key is acquired with the request's fields; a second claim sees it.
pub async fn fresh_claim_then_existing(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let req = f.request("evt_1", b"body", 0);
    let rec = acquired(store, &req, "fresh claim").await;
    assert_eq!(
        rec.state,
        RecordState::InProgress,
        "fresh claim is InProgress"
    );
    assert_eq!(
        rec.token, req.token,
        "fresh claim carries the request's token"
    );
    assert_eq!(
        rec.fingerprint, req.fingerprint,
        "fresh claim keeps the fingerprint"
    );
    counts(&rec, (1, 0), "fresh claim counts one attempt");
    let rule = "fresh claim keeps the lease and the expiry, and sets created_at and updated_at";
    times(
        &rec,
        [req.lease_until, req.expires_at, req.now, req.now],
        rule,
    );
    assert_eq!(
        (rec.namespace.as_str(), rec.id.as_str()),
        (f.namespace.as_str(), "evt_1"),
        "fresh claim answers the request's key"
    );
    assert!(rec.history.is_empty(), "fresh claim has no history");
    assert_eq!(
        Some(rec),
        store.get(f.key("evt_1")).await.unwrap(),
        "fresh claim answers the record as stored"
    );
    // Times between two milliseconds: a store that keeps fewer digits answers the
    // record as it keeps it.
    let mut odd = f.request("evt_odd", b"body", 0);
    let by = TimeDelta::microseconds(400);
    (odd.now, odd.lease_until, odd.expires_at) =
        (odd.now + by, odd.lease_until + by, odd.expires_at + by);
    let rec = acquired(store, &odd, "fresh claim between milliseconds").await;
    assert_eq!(
        Some(rec),
        store.get(f.key("evt_odd")).await.unwrap(),
        "fresh claim between milliseconds answers the record as stored"
    );

    let before = store.get(f.key("evt_1")).await.unwrap();
    let case = "claim under a live lease";
    let again = existing(store, &f.request("evt_1", b"body", 1), case).await;
    assert_eq!(again.token, req.token, "a refused claim leaves the token");
    assert_eq!(again.attempts, 1, "a refused claim counts nothing");
    assert_eq!(
        store.get(f.key("evt_1")).await.unwrap(),
        before,
        "a refused claim changes nothing"
    );

    let done = f.finish(RecordState::Completed, 0, &[], 2);
    finish_applies(store.finish(Holder::new(f.key("evt_1"), req.token), &done)).await;
    let before = store.get(f.key("evt_1")).await.unwrap();
    let case = "claim of a completed id";
    let dup = existing(store, &f.request("evt_1", b"body", 3), case).await;
    assert_eq!(
        dup.state,
        RecordState::Completed,
        "a claim of a completed id answers the completed record"
    );
    assert_eq!(
        store.get(f.key("evt_1")).await.unwrap(),
        before,
        "a claim of a completed id changes nothing"
    );
    let other = format!("{}-other", f.namespace);
    let other_ns = Key::new(&other, "evt_1");
    let mut req2 = f.request("evt_1", b"body", 0);
    req2.key = other_ns;
    let rec2 = store.claim(&req2).await.unwrap();
    assert!(
        matches!(rec2, Claim::Acquired(_)),
        "namespaces are separate"
    );
    let _ = store
        .finish(Holder::new(other_ns, req2.token), &done)
        .await
        .unwrap();
    // Completed, its lease's end still ahead: only an `InProgress` lease is spared.
    assert_eq!(
        store.delete(other_ns, f.at_secs(10)).await.unwrap(),
        Deleted::Removed,
        "a finished record is deleted whatever its lease's end"
    );
}

/// Sends `requests` at once; the records of those acquired.
async fn race(store: &dyn ProcessedStore, requests: &[ClaimRequest<'_>]) -> Vec<Record> {
    join_all(requests.iter().map(|r| store.claim(r)))
        .await
        .into_iter()
        .map(|a| a.expect("claim failed"))
        .filter_map(|a| match a {
            Claim::Acquired(r) => Some(r),
            Claim::Existing(_) => None,
        })
        .collect()
}

/// Of many concurrent claims of one key, exactly one is acquired.
pub async fn concurrent_claims_have_one_winner(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    for id in ["race_a", "race_b", "race_c"] {
        let requests: Vec<_> = (0..32).map(|_| f.request(id, b"same", 0)).collect();
        let winners = race(store, &requests).await;
        assert_eq!(winners.len(), 1, "exactly one of 32 concurrent claims wins");
        let stored = store.get(f.key(id)).await.unwrap().expect("record exists");
        assert_eq!(
            stored.token, winners[0].token,
            "the stored token is the winner's"
        );
    }
}

/// Of many concurrent claims of a record that may be taken over (failed, or its
/// lease run out), exactly one is acquired.
pub async fn concurrent_takeovers_have_one_winner(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    for (id, failed) in [("retake_failed", true), ("retake_expired", false)] {
        let first = f.claimed(store, id, b"same").await;
        let at = if failed {
            let fail = f.finish(RecordState::Failed, 1, &[], 1);
            finish_applies(store.finish(Holder::new(f.key(id), first.token), &fail)).await;
            2
        } else {
            60 // the lease has run out
        };
        let requests: Vec<_> = (0..32).map(|_| f.request(id, b"same", at)).collect();
        let winners = race(store, &requests).await;
        assert_eq!(
            winners.len(),
            1,
            "exactly one of 32 concurrent takeovers of {id} wins"
        );
        assert_eq!(winners[0].attempts, 2, "one takeover counted");
        let stored = store.get(f.key(id)).await.unwrap().expect("record exists");
        assert_eq!(
            (stored.token, stored.attempts),
            (winners[0].token, 2),
            "the store holds the one takeover that won"
        );
    }
}

/// A `Failed` record with the same body is taken over: attempts counted, failures kept.
pub async fn failed_record_is_reclaimed(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let first = f.claimed(store, "retry", b"b").await;
    let note = [FailureNote {
        at: f.at_secs(1),
        error: "db down".into(),
    }];
    let fail = f.finish(RecordState::Failed, 1, &note, 1);
    finish_applies(store.finish(Holder::new(f.key("retry"), first.token), &fail)).await;
    let second = f.request("retry", b"b", 2);
    let rec = acquired(store, &second, "claim of a failed id").await;
    assert_eq!(
        rec.state,
        RecordState::InProgress,
        "a failed id taken over is InProgress"
    );
    assert_eq!(rec.token, second.token, "the new claim's token");
    counts(&rec, (2, 1), "attempts + 1, failures kept");
    assert_eq!(rec.history, note, "history kept");
    assert_eq!(
        rec.lease_until, second.lease_until,
        "takeover sets the new lease"
    );
    assert_eq!(rec.created_at, f.now, "created_at kept");
    assert_eq!(
        rec.expires_at, second.expires_at,
        "takeover keeps the later of the two expiries (here the claim's)"
    );
    let done = f.finish(RecordState::Completed, 1, &note, 3);
    let rule = "the old token is stale";
    finish_refused(
        store.finish(Holder::new(f.key("retry"), first.token), &done),
        rule,
    )
    .await;
}

/// An `InProgress` record whose lease ran out is taken over and the lost attempt
/// counted as a failure; the old holder's token is then refused.
pub async fn expired_lease_is_taken_over(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let first = f.claimed(store, "crash", b"b").await;
    let case = "claim 1 s before the lease runs out";
    existing(store, &f.request("crash", b"b", 59), case).await;
    // A shorter retention than the first claim's: a takeover keeps the later expiry.
    let mut late = f.request("crash", b"b", 60);
    late.expires_at = f.at_secs(600);
    let rec = acquired(store, &late, "claim when the lease ran out").await;
    counts(&rec, (2, 1), "takeover counts the lost attempt");
    assert_eq!(rec.token, late.token, "takeover sets the new token");
    let rule = "takeover sets the new lease, keeps the later of the two expiries and \
                created_at, and sets updated_at";
    let expected = [late.lease_until, first.expires_at, first.now, late.now];
    times(&rec, expected, rule);
    let stored = store.get(f.key("crash")).await.unwrap().expect("record");
    assert_eq!(
        (stored.lease_until, stored.expires_at, stored.updated_at),
        (rec.lease_until, rec.expires_at, rec.updated_at),
        "the takeover's answer is what the store holds"
    );
    let done = f.finish(RecordState::Completed, 0, &[], 61);
    let rule = "the crashed holder is fenced off";
    finish_refused(
        store.finish(Holder::new(f.key("crash"), first.token), &done),
        rule,
    )
    .await;
    finish_applies(store.finish(Holder::new(f.key("crash"), late.token), &done)).await;
}

/// A lease is live to its very end, even one that ends between two milliseconds:
/// a store that keeps times in milliseconds rounds the end of a lease up, never
/// down, so that no claim takes it over early.
pub async fn lease_is_live_to_its_end(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let at = |us: i64| f.now + TimeDelta::microseconds(us);
    let claim_at = |us: i64, lease_until| ClaimRequest {
        now: at(us),
        lease_until,
        ..f.request("edge", b"b", 0)
    };
    acquired(store, &claim_at(0, at(700)), "fresh claim").await;
    let case = "a claim 0.4 ms before the lease ends (in its last millisecond)";
    existing(store, &claim_at(300, at(60_000_000)), case).await;
    let case = "a claim 0.3 ms after the lease ended";
    acquired(store, &claim_at(1_000, at(60_000_000)), case).await;
}

/// A record is kept to its very expiry, even one that ends between two
/// milliseconds: a store that keeps times in milliseconds rounds the expiry up,
/// never down, so that no claim replaces the record early.
pub async fn record_is_kept_to_its_expiry(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let at = |us: i64| f.now + TimeDelta::microseconds(us);
    let claim_at = |us: i64| ClaimRequest {
        now: at(us),
        lease_until: at(us + 100),
        expires_at: at(us + 60_000_000),
        ..f.request("kept", b"b", 0)
    };
    let first = claim_at(0);
    acquired(store, &first, "fresh claim").await;
    let done = Finish {
        state: RecordState::Completed,
        failures: 0,
        history: &[],
        now: at(100),
        // 10 s on: a store may also let the record go by a TTL from `now`, which
        // must not run out while this test runs.
        expires_at: at(10_000_700),
    };
    finish_applies(store.finish(Holder::new(f.key("kept"), first.token), &done)).await;
    let case = "a claim 0.4 ms before the record expires (in its last millisecond)";
    existing(store, &claim_at(10_000_300), case).await;
    let case = "a claim 0.3 ms after the record expired";
    let fresh = acquired(store, &claim_at(10_001_000), case).await;
    assert_eq!(fresh.attempts, 1, "an expired record is replaced");
}

/// A different body under a known id is never taken over.
pub async fn different_body_is_not_taken_over(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let first = f.claimed(store, "conflict", b"one").await;
    let case = "other body, live lease";
    let other = existing(store, &f.request("conflict", b"two", 1), case).await;
    body_is(&other, b"one", "the stored fingerprint is returned");
    let case = "other body, expired lease";
    existing(store, &f.request("conflict", b"two", 120), case).await;
    let fail = f.finish(RecordState::Failed, 1, &[], 1);
    let _ = store
        .finish(Holder::new(f.key("conflict"), first.token), &fail)
        .await
        .unwrap();
    let case = "other body, failed record";
    let _ = existing(store, &f.request("conflict", b"two", 2), case).await;
    let case = "same body, failed record";
    acquired(store, &f.request("conflict", b"one", 3), case).await;
}

/// [`Fingerprint::UNKNOWN`] (kept by a guard that detects no conflicts) is never
/// compared: a failed or abandoned record is taken over whichever side's
/// fingerprint is unknown, and keeps the known one.
pub async fn unknown_fingerprint_matches_any(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let unknown = |id: &'static str, at| ClaimRequest {
        fingerprint: Fingerprint::UNKNOWN,
        ..f.request(id, b"", at)
    };
    let first = f.claimed(store, "known", b"one").await;
    let case = "an unknown fingerprint, live lease";
    existing(store, &unknown("known", 1), case).await;
    let fail = f.finish(RecordState::Failed, 1, &[], 1);
    finish_applies(store.finish(Holder::new(f.key("known"), first.token), &fail)).await;
    let case = "an unknown fingerprint, failed record";
    let rec = acquired(store, &unknown("known", 2), case).await;
    body_is(
        &rec,
        b"one",
        "a record taken over keeps its known fingerprint",
    );
    counts(
        &rec,
        (2, 1),
        "a failed record taken over: attempts + 1, failures kept",
    );
    let case = "another body is still refused after the unknown holder's lease ran out";
    existing(store, &f.request("known", b"two", 63), case).await;
    let case = "the known body takes over the unknown holder's run-out lease";
    acquired(store, &f.request("known", b"one", 64), case).await;

    let first = unknown("unknown", 0);
    acquired(store, &first, "fresh claim, unknown fingerprint").await;
    let case = "a known fingerprint, live lease";
    existing(store, &f.request("unknown", b"two", 1), case).await;
    let late = f.request("unknown", b"two", 60);
    let case = "a known fingerprint, the unknown holder's lease ran out";
    let rec = acquired(store, &late, case).await;
    body_is(
        &rec,
        b"two",
        "a record taken over takes the known fingerprint",
    );
    counts(
        &rec,
        (2, 1),
        "a run-out lease taken over counts the lost attempt",
    );
    let done = f.finish(RecordState::Completed, 1, &[], 61);
    finish_applies(store.finish(Holder::new(f.key("unknown"), late.token), &done)).await;
    let case = "an unknown fingerprint, completed record";
    let rec = existing(store, &unknown("unknown", 62), case).await;
    body_is(
        &rec,
        b"two",
        "a completed record keeps its known fingerprint",
    );
}

/// A record past its expiry is claimed as if new.
pub async fn expired_record_is_claimed_afresh(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let first = f.claimed(store, "old", b"one").await;
    let done = f.finish(RecordState::Completed, 0, &[], 1);
    let _ = store
        .finish(Holder::new(f.key("old"), first.token), &done)
        .await
        .unwrap();
    let case = "claim before expiry";
    existing(store, &f.request("old", b"one", 3600), case).await;
    let later = f.request("old", b"two", 3601);
    let rec = acquired(store, &later, "claim at expiry").await;
    counts(&rec, (1, 0), "an expired record starts over");
    body_is(
        &rec,
        b"two",
        "an expired record starts over with the new body",
    );
    assert_eq!(
        rec.created_at, later.now,
        "an expired record starts over: created_at is the claim's"
    );
}
