//! The public conformance suite for [`ProcessedStore`] implementations.
//!
//! Every built-in store runs it against a real server, and a custom store can run
//! the same checks from its own tests (feature `conformance`):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = webhook_guard::MemoryStore::new();
//! webhook_guard::conformance::run_all(&store).await;
//! # }
//! ```
//!
//! Each check panics (like `assert!`) with a message naming the broken rule. The
//! checks use a fresh random namespace, so they can share a store with other data;
//! the purge checks only remove records and inbox events that expired before the
//! year 2002. Run one suite at a time per store: a purge check counts what it
//! removes and what it leaves, and another suite's purge would remove its records
//! first. The concurrency check runs its
//! claims on one task: a store whose calls never wait (like
//! [`MemoryStore`](crate::MemoryStore)) needs a test of its own that races claims
//! on threads.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use futures_util::future::join_all;

use crate::store::{
    Claim, ClaimRequest, Deleted, FailureNote, Fence, FencingToken, Fingerprint, Finish, Key,
    ProcessedStore, Record, RecordState,
};

/// Runs every check in this module, one after another.
pub async fn run_all(store: &dyn ProcessedStore) {
    fresh_claim_then_existing(store).await;
    concurrent_claims_have_one_winner(store).await;
    concurrent_takeovers_have_one_winner(store).await;
    finish_is_fenced(store).await;
    failed_record_is_reclaimed(store).await;
    expired_lease_is_taken_over(store).await;
    lease_is_live_to_its_end(store).await;
    record_is_kept_to_its_expiry(store).await;
    different_body_is_not_taken_over(store).await;
    unknown_fingerprint_matches_any(store).await;
    expired_record_is_claimed_afresh(store).await;
    renew_is_fenced(store).await;
    record_round_trips(store).await;
    a_live_lease_outlives_the_expiry(store).await;
    delete_spares_live_leases(store).await;
    stuck_lists_expired_leases(store).await;
    purge_removes_only_expired(store).await;
    a_repeated_token_is_not_the_claims_own(store).await;
}

struct Fixture {
    namespace: String,
    now: DateTime<Utc>,
}

impl Fixture {
    fn new() -> Self {
        Self::at(Utc::now())
    }

    fn at(now: DateTime<Utc>) -> Self {
        // Millisecond precision: what every built-in store keeps.
        let now = DateTime::from_timestamp_millis(now.timestamp_millis()).expect("in range");
        Self {
            namespace: format!("conformance-{:016x}", FencingToken::random().0),
            now,
        }
    }

    fn key<'a>(&'a self, id: &'a str) -> Key<'a> {
        Key::new(&self.namespace, id)
    }

    fn at_secs(&self, secs: i64) -> DateTime<Utc> {
        self.now + TimeDelta::seconds(secs)
    }

    /// A claim at `now + at` with a 60 s lease and a 1 h retention.
    fn request<'a>(&'a self, id: &'a str, body: &[u8], at: i64) -> ClaimRequest<'a> {
        ClaimRequest {
            key: self.key(id),
            fingerprint: Fingerprint::of(body),
            token: FencingToken::random(),
            now: self.at_secs(at),
            lease_until: self.at_secs(at + 60),
            expires_at: self.at_secs(at + 3600),
        }
    }

    fn finish<'a>(
        &self,
        state: RecordState,
        failures: u32,
        history: &'a [FailureNote],
        at: i64,
    ) -> Finish<'a> {
        Finish {
            state,
            failures,
            history,
            now: self.at_secs(at),
            expires_at: self.at_secs(at + 3600),
        }
    }
}

async fn claim(store: &dyn ProcessedStore, request: &ClaimRequest<'_>) -> Claim {
    store.claim(request).await.expect("claim failed")
}

fn acquired(claim: Claim, rule: &str) -> Record {
    match claim {
        Claim::Acquired(r) => r,
        Claim::Existing(r) => panic!("{rule}: expected Acquired, got Existing({r:?})"),
    }
}

fn existing(claim: Claim, rule: &str) -> Record {
    match claim {
        Claim::Existing(r) => r,
        Claim::Acquired(r) => panic!("{rule}: expected Existing, got Acquired({r:?})"),
    }
}

/// A claim that carries the token of the stored record at another time (a process
/// forked mid-sequence draws its parent's tokens) is a duplicate like any other: a
/// held id and a completed one are answered `Existing`, never as this claim's own.
pub async fn a_repeated_token_is_not_the_claims_own(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let rule = "a claim repeating the stored record's token";
    for state in [RecordState::InProgress, RecordState::Completed] {
        let id = format!("evt_{state:?}");
        let first = f.request(&id, b"body", 0);
        let token = acquired(claim(store, &first).await, "fresh claim").token;
        if state == RecordState::Completed {
            let done = f.finish(state, 0, &[], 1);
            let fence = store.finish(f.key(&id), token, &done).await;
            assert_eq!(fence.expect("finish failed"), Fence::Applied, "finish");
        }
        let again = ClaimRequest {
            token,
            ..f.request(&id, b"body", 2)
        };
        let rec = existing(claim(store, &again).await, rule);
        assert_eq!(rec.state, state, "{rule}: the stored record");
    }
}

/// A fresh key is acquired with the request's fields; a second claim sees it.
pub async fn fresh_claim_then_existing(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let req = f.request("evt_1", b"body", 0);
    let rec = acquired(claim(store, &req).await, "fresh claim");
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
    assert_eq!(
        (rec.attempts, rec.failures),
        (1, 0),
        "fresh claim counts one attempt"
    );
    assert_eq!(
        rec.lease_until, req.lease_until,
        "fresh claim keeps the lease"
    );
    assert_eq!(
        rec.expires_at, req.expires_at,
        "fresh claim keeps the expiry"
    );
    assert_eq!(rec.created_at, req.now, "fresh claim sets created_at");
    assert_eq!(rec.updated_at, req.now, "fresh claim sets updated_at");
    assert_eq!(
        (rec.namespace.as_str(), rec.id.as_str()),
        (f.namespace.as_str(), "evt_1")
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
    let rec = acquired(claim(store, &odd).await, "fresh claim between milliseconds");
    assert_eq!(
        Some(rec),
        store.get(f.key("evt_odd")).await.unwrap(),
        "fresh claim between milliseconds answers the record as stored"
    );

    let before = store.get(f.key("evt_1")).await.unwrap();
    let again = existing(
        claim(store, &f.request("evt_1", b"body", 1)).await,
        "claim under a live lease",
    );
    assert_eq!(again.token, req.token, "a refused claim leaves the token");
    assert_eq!(again.attempts, 1, "a refused claim counts nothing");
    assert_eq!(
        store.get(f.key("evt_1")).await.unwrap(),
        before,
        "a refused claim changes nothing"
    );

    let done = f.finish(RecordState::Completed, 0, &[], 2);
    assert_eq!(
        store
            .finish(f.key("evt_1"), req.token, &done)
            .await
            .unwrap(),
        Fence::Applied
    );
    let before = store.get(f.key("evt_1")).await.unwrap();
    let dup = existing(
        claim(store, &f.request("evt_1", b"body", 3)).await,
        "claim of a completed id",
    );
    assert_eq!(dup.state, RecordState::Completed);
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
    let _ = store.finish(other_ns, req2.token, &done).await.unwrap();
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
        let first = f.request(id, b"same", 0);
        acquired(claim(store, &first).await, "fresh claim");
        let at = if failed {
            let fail = f.finish(RecordState::Failed, 1, &[], 1);
            assert_eq!(
                store.finish(f.key(id), first.token, &fail).await.unwrap(),
                Fence::Applied
            );
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
        assert_eq!((stored.token, stored.attempts), (winners[0].token, 2));
    }
}

/// Finish applies only with the current token and only to an `InProgress` record.
pub async fn finish_is_fenced(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let req = f.request("fence", b"b", 0);
    acquired(claim(store, &req).await, "fresh claim");
    let done = f.finish(RecordState::Completed, 0, &[], 1);
    let wrong = FencingToken(req.token.0 ^ 1);
    assert_eq!(
        store.finish(f.key("fence"), wrong, &done).await.unwrap(),
        Fence::LeaseLost,
        "a wrong token is refused"
    );
    assert_eq!(
        store.get(f.key("fence")).await.unwrap().unwrap().state,
        RecordState::InProgress,
        "a refused finish changes nothing"
    );
    assert_eq!(
        store
            .finish(f.key("fence"), req.token, &done)
            .await
            .unwrap(),
        Fence::Applied
    );
    assert_eq!(
        store
            .finish(f.key("fence"), req.token, &done)
            .await
            .unwrap(),
        Fence::LeaseLost,
        "a finished record cannot be finished again"
    );
    assert_eq!(
        store
            .finish(f.key("absent"), req.token, &done)
            .await
            .unwrap(),
        Fence::LeaseLost,
        "a missing record cannot be finished"
    );
    let rec = store.get(f.key("fence")).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.updated_at, f.at_secs(1), "finish sets updated_at");
    assert_eq!(rec.expires_at, f.at_secs(3601), "finish sets expires_at");

    // A lease that ran out but was not taken over may still be finished.
    let late = f.request("late", b"b", 0);
    acquired(claim(store, &late).await, "fresh claim");
    let done = f.finish(RecordState::Completed, 0, &[], 90);
    assert_eq!(
        store
            .finish(f.key("late"), late.token, &done)
            .await
            .unwrap(),
        Fence::Applied,
        "a finish after the lease ran out, not taken over, applies"
    );
    assert_eq!(
        store.get(f.key("late")).await.unwrap().unwrap().state,
        RecordState::Completed
    );
}

/// A `Failed` record with the same body is taken over: attempts counted, failures kept.
pub async fn failed_record_is_reclaimed(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let first = f.request("retry", b"b", 0);
    acquired(claim(store, &first).await, "fresh claim");
    let note = [FailureNote {
        at: f.at_secs(1),
        error: "db down".into(),
    }];
    let fail = f.finish(RecordState::Failed, 1, &note, 1);
    assert_eq!(
        store
            .finish(f.key("retry"), first.token, &fail)
            .await
            .unwrap(),
        Fence::Applied
    );
    let second = f.request("retry", b"b", 2);
    let rec = acquired(claim(store, &second).await, "claim of a failed id");
    assert_eq!(rec.state, RecordState::InProgress);
    assert_eq!(rec.token, second.token, "the new claim's token");
    assert_eq!(
        (rec.attempts, rec.failures),
        (2, 1),
        "attempts + 1, failures kept"
    );
    assert_eq!(rec.history, note, "history kept");
    assert_eq!(rec.lease_until, second.lease_until);
    assert_eq!(rec.created_at, f.now, "created_at kept");
    assert_eq!(
        rec.expires_at, second.expires_at,
        "takeover keeps the later of the two expiries (here the claim's)"
    );
    let done = f.finish(RecordState::Completed, 1, &note, 3);
    assert_eq!(
        store
            .finish(f.key("retry"), first.token, &done)
            .await
            .unwrap(),
        Fence::LeaseLost,
        "the old token is stale"
    );
}

/// An `InProgress` record whose lease ran out is taken over and the lost attempt
/// counted as a failure; the old holder's token is then refused.
pub async fn expired_lease_is_taken_over(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let first = f.request("crash", b"b", 0);
    acquired(claim(store, &first).await, "fresh claim");
    existing(
        claim(store, &f.request("crash", b"b", 59)).await,
        "claim 1 s before the lease runs out",
    );
    // A shorter retention than the first claim's: a takeover keeps the later expiry.
    let mut late = f.request("crash", b"b", 60);
    late.expires_at = f.at_secs(600);
    let rec = acquired(claim(store, &late).await, "claim when the lease ran out");
    assert_eq!(
        (rec.attempts, rec.failures),
        (2, 1),
        "takeover counts the lost attempt"
    );
    assert_eq!(rec.token, late.token);
    assert_eq!(
        rec.lease_until, late.lease_until,
        "takeover sets the new lease"
    );
    assert_eq!(
        rec.expires_at, first.expires_at,
        "takeover keeps the later of the two expiries"
    );
    assert_eq!(rec.updated_at, late.now, "takeover sets updated_at");
    assert_eq!(rec.created_at, first.now, "takeover keeps created_at");
    let stored = store.get(f.key("crash")).await.unwrap().expect("record");
    assert_eq!(
        (stored.lease_until, stored.expires_at, stored.updated_at),
        (rec.lease_until, rec.expires_at, rec.updated_at),
        "the takeover's answer is what the store holds"
    );
    let done = f.finish(RecordState::Completed, 0, &[], 61);
    assert_eq!(
        store
            .finish(f.key("crash"), first.token, &done)
            .await
            .unwrap(),
        Fence::LeaseLost,
        "the crashed holder is fenced off"
    );
    assert_eq!(
        store
            .finish(f.key("crash"), late.token, &done)
            .await
            .unwrap(),
        Fence::Applied
    );
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
    acquired(claim(store, &claim_at(0, at(700))).await, "fresh claim");
    existing(
        claim(store, &claim_at(300, at(60_000_000))).await,
        "a claim 0.4 ms before the lease ends (in its last millisecond)",
    );
    acquired(
        claim(store, &claim_at(1_000, at(60_000_000))).await,
        "a claim 0.3 ms after the lease ended",
    );
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
    acquired(claim(store, &first).await, "fresh claim");
    let done = Finish {
        state: RecordState::Completed,
        failures: 0,
        history: &[],
        now: at(100),
        // 10 s on: a store may also let the record go by a TTL from `now`, which
        // must not run out while this test runs.
        expires_at: at(10_000_700),
    };
    assert_eq!(
        store
            .finish(f.key("kept"), first.token, &done)
            .await
            .unwrap(),
        Fence::Applied
    );
    existing(
        claim(store, &claim_at(10_000_300)).await,
        "a claim 0.4 ms before the record expires (in its last millisecond)",
    );
    let fresh = acquired(
        claim(store, &claim_at(10_001_000)).await,
        "a claim 0.3 ms after the record expired",
    );
    assert_eq!(fresh.attempts, 1, "an expired record is replaced");
}

/// A different body under a known id is never taken over.
pub async fn different_body_is_not_taken_over(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let first = f.request("conflict", b"one", 0);
    acquired(claim(store, &first).await, "fresh claim");
    let other = existing(
        claim(store, &f.request("conflict", b"two", 1)).await,
        "other body, live lease",
    );
    assert_eq!(
        other.fingerprint,
        Fingerprint::of(b"one"),
        "the stored fingerprint is returned"
    );
    existing(
        claim(store, &f.request("conflict", b"two", 120)).await,
        "other body, expired lease",
    );
    let fail = f.finish(RecordState::Failed, 1, &[], 1);
    let _ = store
        .finish(f.key("conflict"), first.token, &fail)
        .await
        .unwrap();
    let _ = existing(
        claim(store, &f.request("conflict", b"two", 2)).await,
        "other body, failed record",
    );
    acquired(
        claim(store, &f.request("conflict", b"one", 3)).await,
        "same body, failed record",
    );
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
    let first = f.request("known", b"one", 0);
    acquired(claim(store, &first).await, "fresh claim");
    existing(
        claim(store, &unknown("known", 1)).await,
        "an unknown fingerprint, live lease",
    );
    let fail = f.finish(RecordState::Failed, 1, &[], 1);
    assert_eq!(
        store
            .finish(f.key("known"), first.token, &fail)
            .await
            .unwrap(),
        Fence::Applied
    );
    let rec = acquired(
        claim(store, &unknown("known", 2)).await,
        "an unknown fingerprint, failed record",
    );
    assert_eq!(
        rec.fingerprint,
        Fingerprint::of(b"one"),
        "a record taken over keeps its known fingerprint"
    );
    assert_eq!((rec.attempts, rec.failures), (2, 1));
    existing(
        claim(store, &f.request("known", b"two", 63)).await,
        "another body is still refused after the unknown holder's lease ran out",
    );
    acquired(
        claim(store, &f.request("known", b"one", 64)).await,
        "the known body takes over the unknown holder's run-out lease",
    );

    let first = unknown("unknown", 0);
    acquired(
        claim(store, &first).await,
        "fresh claim, unknown fingerprint",
    );
    existing(
        claim(store, &f.request("unknown", b"two", 1)).await,
        "a known fingerprint, live lease",
    );
    let late = f.request("unknown", b"two", 60);
    let rec = acquired(
        claim(store, &late).await,
        "a known fingerprint, the unknown holder's lease ran out",
    );
    assert_eq!(
        rec.fingerprint,
        Fingerprint::of(b"two"),
        "a record taken over takes the known fingerprint"
    );
    assert_eq!((rec.attempts, rec.failures), (2, 1));
    let done = f.finish(RecordState::Completed, 1, &[], 61);
    assert_eq!(
        store
            .finish(f.key("unknown"), late.token, &done)
            .await
            .unwrap(),
        Fence::Applied
    );
    let rec = existing(
        claim(store, &unknown("unknown", 62)).await,
        "an unknown fingerprint, completed record",
    );
    assert_eq!(rec.fingerprint, Fingerprint::of(b"two"));
}

/// A record past its expiry is claimed as if new.
pub async fn expired_record_is_claimed_afresh(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let first = f.request("old", b"one", 0);
    acquired(claim(store, &first).await, "fresh claim");
    let done = f.finish(RecordState::Completed, 0, &[], 1);
    let _ = store
        .finish(f.key("old"), first.token, &done)
        .await
        .unwrap();
    existing(
        claim(store, &f.request("old", b"one", 3600)).await,
        "claim before expiry",
    );
    let later = f.request("old", b"two", 3601);
    let rec = acquired(claim(store, &later).await, "claim at expiry");
    assert_eq!(
        (rec.attempts, rec.failures),
        (1, 0),
        "an expired record starts over"
    );
    assert_eq!(rec.fingerprint, Fingerprint::of(b"two"));
    assert_eq!(rec.created_at, later.now);
}

/// Renew extends the lease only for the current holder.
pub async fn renew_is_fenced(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let req = f.request("long", b"b", 0);
    acquired(claim(store, &req).await, "fresh claim");
    let k = f.key("long");
    assert_eq!(
        store
            .renew(
                k,
                FencingToken(req.token.0 ^ 1),
                f.at_secs(200),
                f.at_secs(7200)
            )
            .await
            .unwrap(),
        Fence::LeaseLost
    );
    assert_eq!(
        store
            .renew(k, req.token, f.at_secs(200), f.at_secs(7200))
            .await
            .unwrap(),
        Fence::Applied
    );
    existing(
        claim(store, &f.request("long", b"b", 100)).await,
        "a renewed lease holds",
    );
    let rec = store.get(k).await.unwrap().unwrap();
    assert_eq!(rec.lease_until, f.at_secs(200));
    assert_eq!(rec.expires_at, f.at_secs(7200), "renew raises the expiry");
    assert_eq!(
        store
            .renew(k, req.token, f.at_secs(210), f.at_secs(10))
            .await
            .unwrap(),
        Fence::Applied
    );
    let rec = store.get(k).await.unwrap().unwrap();
    assert_eq!(rec.lease_until, f.at_secs(210), "renew moves the lease");
    assert_eq!(
        rec.expires_at,
        f.at_secs(7200),
        "renew never lowers the expiry"
    );
    assert_eq!(
        store
            .renew(
                f.key("never-claimed"),
                req.token,
                f.at_secs(200),
                f.at_secs(7200)
            )
            .await
            .unwrap(),
        Fence::LeaseLost,
        "a missing record cannot be renewed"
    );
    let done = f.finish(RecordState::Completed, 0, &[], 1);
    let _ = store.finish(k, req.token, &done).await.unwrap();
    assert_eq!(
        store
            .renew(k, req.token, f.at_secs(300), f.at_secs(7200))
            .await
            .unwrap(),
        Fence::LeaseLost,
        "a finished record cannot be renewed"
    );
}

/// Every field, ids with unusual characters and the history survive a round trip.
pub async fn record_round_trips(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let id = "evt:ü/{tag}*\"'; DROP TABLE x;--";
    let req = f.request(id, b"payload", 0);
    acquired(claim(store, &req).await, "fresh claim");
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
    assert_eq!(
        store.finish(f.key(id), req.token, &perm).await.unwrap(),
        Fence::Applied
    );
    let rec = store.get(f.key(id)).await.unwrap().expect("record exists");
    assert_eq!(rec.id, id);
    assert_eq!(rec.state, RecordState::PermanentFailure);
    assert_eq!(rec.failures, 2);
    assert_eq!(rec.history, history);
    assert_eq!(rec.fingerprint, Fingerprint::of(b"payload"));
    assert_eq!(rec.token, req.token);
    assert_eq!(rec.attempts, 1);
    assert_eq!(
        rec.lease_until, req.lease_until,
        "the lease survives a finish"
    );
    assert_eq!(rec.expires_at, perm.expires_at);
    assert_eq!(rec.created_at, req.now);
    assert_eq!(rec.updated_at, perm.now);
    assert!(store.get(f.key("never-seen")).await.unwrap().is_none());
    let big = f.request("big-token", b"x", 0);
    let mut big = big;
    big.token = FencingToken(u64::MAX - 7);
    let rec = acquired(claim(store, &big).await, "fresh claim");
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
    let req = f.request("outlives", b"b", 0);
    acquired(claim(store, &req).await, "fresh claim");
    let k = f.key("outlives");
    assert_eq!(
        store
            .renew(k, req.token, f.at_secs(10_000), f.at_secs(3601))
            .await
            .unwrap(),
        Fence::Applied
    );
    let held = existing(
        claim(store, &f.request("outlives", b"b", 5000)).await,
        "a claim after the expiry, the lease still live",
    );
    assert_eq!(held.token, req.token);
    assert_eq!(
        store.delete(k, f.at_secs(5000)).await.unwrap(),
        Deleted::LeaseHeld,
        "a live lease is not deleted, expired or not"
    );
    let fresh = acquired(
        claim(store, &f.request("outlives", b"b", 10_000)).await,
        "a claim once the lease ended (and the record expired)",
    );
    assert_eq!(fresh.attempts, 1, "an expired record is replaced");
}

/// Delete refuses a live lease and removes anything else.
pub async fn delete_spares_live_leases(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let req = f.request("forget", b"b", 0);
    acquired(claim(store, &req).await, "fresh claim");
    assert_eq!(
        store.delete(f.key("forget"), f.at_secs(1)).await.unwrap(),
        Deleted::LeaseHeld
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
        Deleted::NotFound
    );
    acquired(
        claim(store, &f.request("forget", b"b", 63)).await,
        "a deleted id is claimed afresh",
    );
}

/// Stuck lists `InProgress` records whose lease ran out, and nothing else of ours.
pub async fn stuck_lists_expired_leases(store: &dyn ProcessedStore) {
    let f = Fixture::new();
    let a = f.request("stuck-a", b"b", 0);
    acquired(claim(store, &a).await, "fresh claim");
    let b = f.request("stuck-b", b"b", 0);
    acquired(claim(store, &b).await, "fresh claim");
    let _ = store
        .finish(
            f.key("stuck-b"),
            b.token,
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
        acquired(claim(store, &f.request(id, b"b", at)).await, "fresh claim");
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
        let req = f.request(&id, b"b", 0);
        acquired(claim(store, &req).await, "fresh claim");
        tokens.push(req.token);
    }
    // p0..p7 completed (expire at +3601 s); p8 stays InProgress with a lease renewed
    // past the purge time; p9 completed with a long expiry.
    for (i, token) in tokens.iter().enumerate().take(8) {
        let id = format!("p{i}");
        let _ = store
            .finish(
                f.key(&id),
                *token,
                &f.finish(RecordState::Completed, 0, &[], 1),
            )
            .await
            .unwrap();
    }
    let _ = store
        .renew(f.key("p8"), tokens[8], f.at_secs(100_000), f.at_secs(3601))
        .await
        .unwrap();
    let mut long = f.finish(RecordState::Completed, 0, &[], 1);
    long.expires_at = f.at_secs(200_000);
    let _ = store.finish(f.key("p9"), tokens[9], &long).await.unwrap();

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
    acquired(claim(store, &edge).await, "fresh claim");
    let done = f.finish(RecordState::Completed, 0, &[], 10_001);
    let _ = store
        .finish(f.key("edge"), edge.token, &done)
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

/// The conformance suite for [`InboxStore`](crate::inbox::InboxStore) implementations.
pub mod inbox {
    use chrono::{DateTime, TimeDelta, Utc};
    use futures_util::future::join_all;

    use crate::inbox::{Enqueued, InboxState, InboxStore, NewEvent, Settle};
    use crate::meta::EventMeta;
    use crate::store::{Fence, FencingToken, Fingerprint, Key};

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

    struct Fixture {
        namespace: String,
        now: DateTime<Utc>,
    }

    impl Fixture {
        fn new() -> Self {
            let now =
                DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).expect("in range");
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

        async fn enqueue(
            &self,
            store: &dyn InboxStore,
            id: &str,
            payload: &[u8],
            at: i64,
        ) -> Enqueued {
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

        /// What a lease of this namespace at `at`, until `until`, takes (up to 10).
        async fn lease(
            &self,
            store: &dyn InboxStore,
            at: i64,
            until: i64,
        ) -> Vec<crate::inbox::InboxEvent> {
            store
                .lease(&self.namespace, self.at(at), self.at(until), 10)
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

        fn settle(&self, state: InboxState, at: i64, next: i64) -> Settle<'static> {
            Settle {
                state,
                next_attempt_at: self.at(next),
                error: Some("boom"),
                now: self.at(at),
                expires_at: self.at(at + 3600),
                attempt_counts: true,
            }
        }
    }

    /// An id is stored once; its payload, fingerprint and metadata round-trip.
    pub async fn enqueue_is_idempotent(store: &dyn InboxStore) {
        let f = Fixture::new();
        let payload = b"{\"id\":\"e1\",\"x\":\"\xc3\xbc\"}";
        assert_eq!(f.enqueue(store, "e1", payload, 0).await, Enqueued::Inserted);
        let again = f.enqueue(store, "e1", b"other", 1).await;
        assert_eq!(
            again,
            Enqueued::Existing {
                fingerprint: Fingerprint::of(payload),
                state: InboxState::Pending
            },
            "a known id is not stored again"
        );
        let e = store
            .get_event(Key::new(&f.namespace, "e1"))
            .await
            .unwrap()
            .expect("stored");
        assert_eq!(e.payload, payload);
        assert_eq!(e.state, InboxState::Pending);
        assert_eq!(e.attempts, 0);
        assert_eq!(e.received_at, f.now);
        assert_eq!(e.meta.object.as_deref(), Some("obj-e1"));
        assert_eq!(e.meta.event_type.as_deref(), Some("charge.succeeded"));
        assert_eq!(e.meta.family.as_deref(), Some("charge"));
        assert_eq!(e.meta.created_at, Some(f.at(-10)));
        assert!(store
            .get_event(Key::new(&f.namespace, "nope"))
            .await
            .unwrap()
            .is_none());
    }

    /// Concurrent leases never hand out one event twice; settle is fenced by token.
    pub async fn lease_is_exclusive_and_fenced(store: &dyn InboxStore) {
        let f = Fixture::new();
        for i in 0..20 {
            f.enqueue(store, &format!("x{i}"), b"p", 0).await;
        }
        let leases =
            join_all((0..8).map(|_| store.lease(&f.namespace, f.at(1), f.at(61), 5))).await;
        let mut ids: Vec<String> = leases
            .into_iter()
            .flat_map(|l| l.expect("lease failed"))
            .map(|e| {
                assert_eq!(e.state, InboxState::Running);
                assert_eq!(e.attempts, 1);
                assert_eq!(e.lease_until, f.at(61));
                assert_eq!(e.updated_at, f.at(1), "a lease sets updated_at");
                e.id
            })
            .collect();
        ids.sort();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "no event is leased twice");
        assert_eq!(n, 20, "all due events are leased");
        assert!(
            store
                .lease(&f.namespace, f.at(2), f.at(62), 100)
                .await
                .unwrap()
                .is_empty(),
            "running events are not due"
        );
        let e = store
            .get_event(Key::new(&f.namespace, "x0"))
            .await
            .unwrap()
            .unwrap();
        let done = f.settle(InboxState::Done, 3, 3);
        let wrong = FencingToken(e.token.0 ^ 1);
        assert_eq!(
            store.settle_event(e.key(), wrong, &done).await.unwrap(),
            Fence::LeaseLost
        );
        assert_eq!(
            store
                .renew_event(e.key(), e.token, f.at(120))
                .await
                .unwrap(),
            Fence::Applied
        );
        assert_eq!(
            store.settle_event(e.key(), e.token, &done).await.unwrap(),
            Fence::Applied
        );
        assert_eq!(
            store.settle_event(e.key(), e.token, &done).await.unwrap(),
            Fence::Applied,
            "the same settle made again (a resend) finds its own change"
        );
        let later = f.settle(InboxState::Pending, 4, 4);
        assert_eq!(
            store.settle_event(e.key(), e.token, &later).await.unwrap(),
            Fence::LeaseLost,
            "settled once"
        );
        assert_eq!(
            store
                .renew_event(e.key(), e.token, f.at(130))
                .await
                .unwrap(),
            Fence::LeaseLost,
            "a settled event's lease cannot be renewed, even with its token"
        );
        let e = store.get_event(e.key()).await.unwrap().unwrap();
        assert_eq!(e.state, InboxState::Done);
        assert_eq!(e.last_error.as_deref(), Some("boom"));
        assert_eq!(e.updated_at, f.at(3));

        // A settle without an error keeps the last one.
        let x1 = store
            .get_event(Key::new(&f.namespace, "x1"))
            .await
            .unwrap()
            .unwrap();
        let retry = f.settle(InboxState::Pending, 3, 5);
        assert_eq!(
            store
                .settle_event(x1.key(), x1.token, &retry)
                .await
                .unwrap(),
            Fence::Applied
        );
        let again = store
            .lease(&f.namespace, f.at(5), f.at(65), 100)
            .await
            .unwrap();
        let x1 = again
            .into_iter()
            .find(|e| e.id == "x1")
            .expect("x1 is due again");
        let ok = Settle {
            error: None,
            ..f.settle(InboxState::Done, 6, 6)
        };
        assert_eq!(
            store.settle_event(x1.key(), x1.token, &ok).await.unwrap(),
            Fence::Applied
        );
        let x1 = store.get_event(x1.key()).await.unwrap().unwrap();
        assert_eq!(
            (x1.state, x1.last_error.as_deref()),
            (InboxState::Done, Some("boom")),
            "a settle without an error keeps the last one"
        );
        let other = Fixture::new();
        assert!(
            store
                .lease(&other.namespace, f.at(1000), f.at(1060), 100)
                .await
                .unwrap()
                .is_empty(),
            "namespaces are separate"
        );
    }

    /// A retried event is leased again only once due, with its attempts counted.
    pub async fn retries_wait_until_due(store: &dyn InboxStore) {
        let f = Fixture::new();
        f.enqueue(store, "r", b"p", 0).await;
        let e = f.lease_one(store, 0, 60, "due").await;
        let retry = f.settle(InboxState::Pending, 1, 30);
        assert_eq!(
            store.settle_event(e.key(), e.token, &retry).await.unwrap(),
            Fence::Applied
        );
        assert!(f.lease(store, 29, 89).await.is_empty(), "not due yet");
        let again = f.lease(store, 30, 90).await;
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].attempts, 2);
        assert_ne!(again[0].token, e.token, "a new lease gets a new token");
        assert_eq!(again[0].last_error.as_deref(), Some("boom"));
        assert_eq!(again[0].payload, b"p");

        // A retry due between two milliseconds is not due in the one before: a
        // store that keeps milliseconds rounds the time up, never down.
        let ms = |us: i64| f.now + TimeDelta::microseconds(us);
        let e = &again[0];
        let retry = Settle {
            next_attempt_at: ms(91_001_500),
            ..f.settle(InboxState::Pending, 91, 91)
        };
        assert_eq!(
            store.settle_event(e.key(), e.token, &retry).await.unwrap(),
            Fence::Applied
        );
        let early = store
            .lease(&f.namespace, ms(91_001_200), ms(151_000_000), 10)
            .await
            .unwrap();
        assert!(early.is_empty(), "not due 0.3 ms before its time");
        let due = store
            .lease(&f.namespace, ms(91_002_000), ms(151_000_000), 10)
            .await
            .unwrap();
        assert_eq!(due.len(), 1, "due once its time has come");

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
        assert_eq!(store.enqueue(&fresh).await.unwrap(), Enqueued::Inserted);
        let leased = store
            .lease(&f.namespace, at, at + TimeDelta::seconds(60), 10)
            .await
            .unwrap();
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
        let lease = |at: i64| store.lease(&f.namespace, f.at(at), f.at(at + 60), 10);
        let first = lease(0).await.unwrap().pop().expect("due");
        let counted = f.settle(InboxState::Pending, 1, 2);
        assert_eq!(
            store
                .settle_event(first.key(), first.token, &counted)
                .await
                .unwrap(),
            Fence::Applied
        );
        let second = lease(2).await.unwrap().pop().expect("due again");
        assert_eq!(second.attempts, 2);
        let uncounted = Settle {
            attempt_counts: false,
            ..f.settle(InboxState::Pending, 3, 4)
        };
        for _ in 0..2 {
            assert_eq!(
                store
                    .settle_event(second.key(), second.token, &uncounted)
                    .await
                    .unwrap(),
                Fence::Applied
            );
        }
        let stored = store.get_event(second.key()).await.unwrap().unwrap();
        assert_eq!(
            stored.attempts, 1,
            "the second attempt was given back, once"
        );
        assert_eq!(stored.state, InboxState::Pending);
        let third = lease(4).await.unwrap().pop().expect("due again");
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
        let leased = store.lease(&f.namespace, us(0), us(700), 10).await.unwrap();
        assert_eq!(leased.len(), 1, "due");
        assert!(
            store
                .lease(&f.namespace, us(300), us(60_000_000), 10)
                .await
                .unwrap()
                .is_empty(),
            "0.4 ms before the lease ends, in its last millisecond"
        );
        assert_eq!(
            store
                .lease(&f.namespace, us(1_000), us(60_000_000), 10)
                .await
                .unwrap()
                .len(),
            1,
            "0.3 ms after the lease ended"
        );
    }

    /// A renewal needs the lease's token, and moves the lease's end.
    pub async fn renew_is_fenced_and_moves_the_lease(store: &dyn InboxStore) {
        let f = Fixture::new();
        f.enqueue(store, "long", b"p", 0).await;
        let e = f.lease_one(store, 0, 60, "due").await;
        let stale = FencingToken(e.token.0.wrapping_add(1));
        assert_eq!(
            store.renew_event(e.key(), stale, f.at(120)).await.unwrap(),
            Fence::LeaseLost,
            "another token renews nothing"
        );
        assert_eq!(
            store
                .renew_event(e.key(), e.token, f.at(120))
                .await
                .unwrap(),
            Fence::Applied
        );
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
            let leased = store
                .lease(&f.namespace, f.at(5), f.at(65), 1)
                .await
                .unwrap();
            assert_eq!(leased.len(), 1, "one at a time");
            assert_eq!(leased[0].namespace, f.namespace, "its own namespace only");
            order.push(leased[0].id.clone());
        }
        assert_eq!(order, ["first", "second", "third"]);
        assert!(f.lease(store, 5, 65).await.is_empty());
        let theirs = store.lease(&other.namespace, other.at(5), other.at(65), 10);
        assert_eq!(
            theirs.await.unwrap().len(),
            1,
            "the other namespace's is left"
        );
    }

    /// A `Running` event whose lease ran out is leased again; the old token is stale.
    pub async fn dead_workers_lose_their_lease(store: &dyn InboxStore) {
        let f = Fixture::new();
        f.enqueue(store, "d", b"p", 0).await;
        let first = f.lease_one(store, 0, 60, "due").await;
        assert!(f.lease(store, 59, 119).await.is_empty());
        let second = f.lease_one(store, 60, 120, "lease ran out").await;
        assert_eq!(second.attempts, 2);
        let done = f.settle(InboxState::Done, 61, 61);
        assert_eq!(
            store
                .settle_event(first.key(), first.token, &done)
                .await
                .unwrap(),
            Fence::LeaseLost
        );
        assert_eq!(
            store
                .settle_event(second.key(), second.token, &done)
                .await
                .unwrap(),
            Fence::Applied
        );
    }

    /// Settled events past their expiry are purged; unsettled ones never are; a purged
    /// id can be enqueued again. Works in 2001: its purges remove only events that
    /// expired that year.
    pub async fn settled_events_are_purged(store: &dyn InboxStore) {
        let base = DateTime::from_timestamp(978_307_200, 0).expect("2001-01-01");
        let f = Fixture::at_time(base);
        f.enqueue(store, "old", b"p", 0).await;
        f.enqueue(store, "waiting", b"p", 0).await;
        let mut one = store.lease(&f.namespace, f.at(0), f.at(60), 1).await;
        let e = one.as_mut().expect("lease failed").pop().expect("due");
        let done = f.settle(InboxState::Done, 1, 1);
        let _ = store.settle_event(e.key(), e.token, &done).await.unwrap();
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
        assert!(purged >= 1);
        assert!(
            store.get_event(e.key()).await.unwrap().is_none(),
            "the settled event is gone"
        );
        let other = if e.id == "old" { "waiting" } else { "old" };
        assert!(
            store
                .get_event(Key::new(&f.namespace, other))
                .await
                .unwrap()
                .is_some(),
            "a pending event is never purged"
        );
        assert_eq!(
            f.enqueue(store, &e.id, b"p", 7201).await,
            Enqueued::Inserted
        );
        // An event not settled is never replaced, however old: pending, then running.
        assert!(
            matches!(
                f.enqueue(store, other, b"p2", 7201).await,
                Enqueued::Existing {
                    state: InboxState::Pending,
                    ..
                }
            ),
            "a pending event past its expiry is not replaced"
        );
        let running = store
            .lease(&f.namespace, f.at(7202), f.at(7262), 10)
            .await
            .unwrap();
        assert!(running.iter().any(|r| r.id == other), "{other} is due");
        assert!(
            matches!(
                f.enqueue(store, other, b"p2", 7203).await,
                Enqueued::Existing {
                    state: InboxState::Running,
                    ..
                }
            ),
            "a running event past its expiry is not replaced"
        );

        // An expired event that no purge removed yet is replaced by a new delivery.
        let g = Fixture::at_time(base);
        g.enqueue(store, "late", b"p", 0).await;
        let late = g.lease_one(store, 0, 60, "due").await;
        let done = g.settle(InboxState::Done, 1, 1);
        let _ = store
            .settle_event(late.key(), late.token, &done)
            .await
            .unwrap();
        assert_eq!(
            g.enqueue(store, "late", b"new", 3601).await,
            Enqueued::Inserted,
            "an expired event is replaced"
        );
        let fresh = store.get_event(late.key()).await.unwrap().expect("stored");
        assert_eq!(
            (fresh.state, fresh.payload.as_slice()),
            (InboxState::Pending, &b"new"[..])
        );
    }
}

/// The conformance suite for [`OrderingStore`](crate::ordering::OrderingStore) implementations.
pub mod ordering {
    use chrono::{DateTime, TimeDelta, Utc};
    use futures_util::future::join_all;

    use crate::ordering::{Freshness, ObjectKey, ObjectStatus, OrderingStore};
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
            let _ = store.observe(key(object), at(1), at(2)).await.unwrap();
            if object != "pending" {
                let ended = ObjectStatus::Failed;
                assert!(store
                    .settle_object(key(object), at(1), ended, at(10))
                    .await
                    .unwrap());
            }
        }
        // Failed again at 20 (another event created at the same time).
        let again = store
            .settle_object(key("failed_later"), at(1), ObjectStatus::Failed, at(20))
            .await
            .unwrap();
        assert!(!again, "settled before: answers false, records the failure");
        // A newer event, failed early enough: only its time tells it apart.
        let _ = store.observe(key("newer"), at(5), at(11)).await.unwrap();
        let newer_failed = store.settle_object(key("newer"), at(5), ObjectStatus::Failed, at(12));
        assert!(newer_failed.await.unwrap());
        // Applied early enough: only its status tells it apart.
        assert!(store
            .mark_object(key("applied"), at(1), ObjectStatus::Applied, at(12))
            .await
            .unwrap());

        let clear = |object, since| {
            let applied = ObjectStatus::Applied;
            store.mark_object_if_failed(key(object), at(1), at(since), applied, at(30))
        };
        assert!(
            clear("cleared", 10).await.unwrap(),
            "failed at the time given"
        );
        assert_eq!(
            status("cleared").await,
            Some((ObjectStatus::Applied, at(30)))
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
        assert_eq!(status("unknown").await, None);
        let listed = store.failed_objects(&ns, at(100), 10).await.unwrap();
        let listed: Vec<_> = listed.iter().map(|r| r.object.as_str()).collect();
        assert_eq!(
            listed,
            ["newer", "failed_later"],
            "a cleared failure is no longer listed"
        );

        // Failed again, to the back of the list, while still the failure listed.
        let requeue = |object, since| {
            let failed = ObjectStatus::Failed;
            store.mark_object_if_failed(key(object), at(1), at(since), failed, at(40))
        };
        assert!(requeue("failed_later", 20).await.unwrap());
        assert_eq!(
            status("failed_later").await,
            Some((ObjectStatus::Failed, at(40)))
        );
        assert!(!requeue("cleared", 30).await.unwrap(), "cleared meanwhile");
        assert_eq!(
            status("cleared").await,
            Some((ObjectStatus::Applied, at(30)))
        );
        let listed = store.failed_objects(&ns, at(30), 10).await.unwrap();
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
            let _ = store.observe(k, at(1), at(2)).await.unwrap();
            assert!(store
                .settle_object(k, at(1), ObjectStatus::Failed, at(failed_at))
                .await
                .unwrap());
        }
        let objects = |list: Vec<crate::ordering::ObjectRecord>| {
            list.into_iter().map(|r| r.object).collect::<Vec<_>>()
        };
        let all = store.failed_objects(&ns, at(100), 10).await.unwrap();
        assert_eq!(
            objects(all),
            ["trx-a", "trx-b", "trx-c"],
            "oldest first, own namespace"
        );
        let first = store.failed_objects(&ns, at(100), 1).await.unwrap();
        assert_eq!(objects(first), ["trx-a"], "the limit is kept");
        let early = store.failed_objects(&ns, at(22), 10).await.unwrap();
        assert_eq!(objects(early), ["trx-a", "trx-b"], "changed at or before");
        // Marked failed again later (a reconcile that failed): to the back.
        assert!(store
            .mark_object(key(&ns, "trx-a"), at(1), ObjectStatus::Failed, at(30))
            .await
            .unwrap());
        let requeued = store.failed_objects(&ns, at(100), 10).await.unwrap();
        assert_eq!(objects(requeued), ["trx-b", "trx-c", "trx-a"]);
        // Reconciled: no longer listed.
        assert!(store
            .mark_object(key(&ns, "trx-b"), at(1), ObjectStatus::Applied, at(31))
            .await
            .unwrap());
        let left = store.failed_objects(&ns, at(100), 10).await.unwrap();
        assert_eq!(objects(left), ["trx-c", "trx-a"]);
        let all = store
            .failed_objects(&ns, at(100), usize::MAX)
            .await
            .unwrap();
        assert_eq!(objects(all), ["trx-c", "trx-a"], "any limit is taken");
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
            store.observe(key, at(10), at(100)).await.unwrap(),
            Freshness::Fresh
        );
        assert_eq!(
            store.observe(key, at(5), at(101)).await.unwrap(),
            Freshness::Stale { newest: at(10) }
        );
        assert_eq!(
            store.observe(key, at(10), at(102)).await.unwrap(),
            Freshness::Fresh,
            "a retry of the newest is fresh"
        );
        assert_eq!(
            store.observe(key, at(20), at(103)).await.unwrap(),
            Freshness::Fresh
        );
        let refund = ObjectKey {
            family: "refund",
            ..key
        };
        assert_eq!(
            store.observe(refund, at(1), at(104)).await.unwrap(),
            Freshness::Fresh,
            "families are separate"
        );
        let other = ObjectKey {
            object: "trx-2",
            ..key
        };
        assert_eq!(
            store.observe(other, at(1), at(105)).await.unwrap(),
            Freshness::Fresh,
            "objects are separate"
        );
        let r = store.get_object(key).await.unwrap().expect("recorded");
        assert_eq!(
            (r.newest, r.status, r.updated_at),
            (at(20), ObjectStatus::Pending, at(103))
        );
        let never = ObjectKey {
            object: "nope",
            ..key
        };
        assert!(store.get_object(never).await.unwrap().is_none());
        assert!(
            !store
                .mark_object(never, at(1), ObjectStatus::Applied, at(106))
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
        let _ = store.observe(key, at(10), at(10)).await.unwrap();
        let _ = store.observe(key, at(20), at(20)).await.unwrap();
        assert!(
            !store
                .settle_object(key, at(10), ObjectStatus::Failed, at(21))
                .await
                .unwrap(),
            "settling an older event answers false"
        );
        assert_eq!(
            store.get_object(key).await.unwrap().unwrap().status,
            ObjectStatus::Pending
        );
        assert!(
            store
                .settle_object(key, at(20), ObjectStatus::Failed, at(22))
                .await
                .unwrap(),
            "settling the newest event answers true"
        );
        assert_eq!(
            store.get_object(key).await.unwrap().unwrap().status,
            ObjectStatus::Failed
        );
        assert!(
            store
                .failed_objects(&ns, at(21), 10)
                .await
                .unwrap()
                .is_empty(),
            "not failed before 22"
        );
        let failed = store.failed_objects(&ns, at(22), 10).await.unwrap();
        assert_eq!(failed.len(), 1);
        assert_eq!(
            (failed[0].object.as_str(), failed[0].family.as_str()),
            ("cus-1", "customer")
        );
        assert!(
            store
                .mark_object(key, at(20), ObjectStatus::Applied, at(23))
                .await
                .unwrap(),
            "a reconciled object is marked applied"
        );
        assert!(
            !store
                .mark_object(key, at(10), ObjectStatus::Applied, at(23))
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
                .settle_object(unknown, at(20), ObjectStatus::Applied, at(23))
                .await
                .unwrap(),
            "settling an object never observed answers false"
        );
        assert!(store
            .failed_objects(&ns, at(100), 10)
            .await
            .unwrap()
            .is_empty());
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
                store.observe(key, at(0), at(seen)).await.unwrap(),
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
        assert!(store
            .settle_object(key, at(0), ObjectStatus::Applied, at(3))
            .await
            .unwrap());
        assert!(
            !store
                .settle_object(key, at(0), ObjectStatus::Applied, at(4))
                .await
                .unwrap(),
            "the second event of the same time to settle answers false"
        );
        let r = store.get_object(key).await.unwrap().unwrap();
        assert_eq!((r.status, r.updated_at), (ObjectStatus::Applied, at(3)));
        assert_eq!(
            store.observe(key, at(0), at(5)).await.unwrap(),
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
                .settle_object(key, at(0), ObjectStatus::Failed, at(6))
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
        assert_eq!(store.failed_objects(&ns, at(6), 10).await.unwrap().len(), 1);
        assert!(store
            .mark_object(key, at(0), ObjectStatus::Applied, at(7))
            .await
            .unwrap());
        assert_eq!(
            store.observe(key, at(1), at(8)).await.unwrap(),
            Freshness::Fresh
        );
        assert!(
            store
                .settle_object(key, at(1), ObjectStatus::Applied, at(9))
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
        let times: Vec<_> = (0..32)
            .map(|i| now + TimeDelta::seconds((i * 7919) % 32))
            .collect();
        let answers = join_all(times.iter().map(|t| store.observe(key, *t, now))).await;
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
            now + TimeDelta::seconds(31)
        );
    }
}
