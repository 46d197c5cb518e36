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
//! first.
//!
//! Most checks run their concurrent calls on one task, where a store whose calls
//! never wait (like [`MemoryStore`](crate::MemoryStore)) answers them one after
//! another; [`claims_racing_on_threads_have_one_winner`] races claims on OS
//! threads too, which catches a claim that reads, then writes, with no await point
//! between.
//!
//! **Not covered by semver**: checks are added and tightened in any release, as
//! the contract is understood better; a store that passed may fail a later
//! version's suite. The entry points (`run_all` of each suite) keep their names.

use std::future::Future;

use chrono::{DateTime, TimeDelta, Utc};

use crate::store::{
    Claim, ClaimRequest, FailureNote, Fence, FencingToken, Fingerprint, Finish, Holder, Key,
    ProcessedStore, Record, RecordState, Renew, StoreError,
};

mod claims;
pub mod inbox;
pub mod listing;
pub mod ordering;
mod race;
mod records;

pub use claims::{
    a_repeated_token_is_not_the_claims_own, concurrent_claims_have_one_winner,
    concurrent_takeovers_have_one_winner, different_body_is_not_taken_over,
    expired_lease_is_taken_over, expired_record_is_claimed_afresh, failed_record_is_reclaimed,
    fresh_claim_then_existing, lease_is_live_to_its_end, record_is_kept_to_its_expiry,
    unknown_fingerprint_matches_any,
};
pub use race::claims_racing_on_threads_have_one_winner;
pub use records::{
    a_live_lease_outlives_the_expiry, delete_spares_live_leases, finish_is_fenced,
    purge_removes_only_expired, record_round_trips, renew_is_fenced, stuck_lists_expired_leases,
};

/// Runs every check in this module, one after another.
pub async fn run_all(store: &dyn ProcessedStore) {
    fresh_claim_then_existing(store).await;
    concurrent_claims_have_one_winner(store).await;
    concurrent_takeovers_have_one_winner(store).await;
    claims_racing_on_threads_have_one_winner(store).await;
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

    /// Claims `id` afresh at `now`, which must be acquired; the claim's request.
    async fn claimed<'a>(
        &'a self,
        store: &dyn ProcessedStore,
        id: &'a str,
        body: &[u8],
    ) -> ClaimRequest<'a> {
        let request = self.request(id, body, 0);
        acquired(store, &request, "fresh claim").await;
        request
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

/// Claims with `request`, which must be acquired.
async fn acquired(store: &dyn ProcessedStore, request: &ClaimRequest<'_>, rule: &str) -> Record {
    match store.claim(request).await.expect("claim failed") {
        Claim::Acquired(r) => r,
        Claim::Existing(r) => panic!("{rule}: expected Acquired, got Existing({r:?})"),
    }
}

/// Claims with `request`, which must be answered `Existing`.
async fn existing(store: &dyn ProcessedStore, request: &ClaimRequest<'_>, rule: &str) -> Record {
    match store.claim(request).await.expect("claim failed") {
        Claim::Existing(r) => r,
        Claim::Acquired(r) => panic!("{rule}: expected Existing, got Acquired({r:?})"),
    }
}

/// Checks a record's `(attempts, failures)`.
fn counts(record: &Record, expected: (u32, u32), rule: &str) {
    assert_eq!((record.attempts, record.failures), expected, "{rule}");
}

/// Checks a record's `[lease_until, expires_at, created_at, updated_at]`.
fn times(record: &Record, expected: [DateTime<Utc>; 4], rule: &str) {
    let got = [
        record.lease_until,
        record.expires_at,
        record.created_at,
        record.updated_at,
    ];
    assert_eq!(
        got, expected,
        "{rule}: lease, expiry, created_at, updated_at"
    );
}

/// Checks that a record keeps the fingerprint of `body`.
fn body_is(record: &Record, body: &[u8], rule: &str) {
    assert_eq!(record.fingerprint, Fingerprint::of(body), "{rule}");
}

/// The record under `key`, which the check knows is there.
async fn stored(store: &dyn ProcessedStore, key: Key<'_>, rule: &str) -> Record {
    let record = store.get(key).await.expect("get failed");
    record.unwrap_or_else(|| panic!("{rule}: no record under {key}"))
}

/// Awaits a fenced change (a finish, a renewal, an inbox settle or renewal) and
/// checks that its answer is `expected`.
async fn fence_is(
    change: impl Future<Output = Result<Fence, StoreError>>,
    expected: Fence,
    rule: &str,
) {
    assert_eq!(change.await.expect("the store failed"), expected, "{rule}");
}

/// Renews the lease on `key` with `token` to `(lease_until, expires_at)` and checks
/// that the answer is `expected`.
async fn renew_is(
    store: &dyn ProcessedStore,
    key: Key<'_>,
    token: FencingToken,
    (lease_until, expires_at): (DateTime<Utc>, DateTime<Utc>),
    expected: Fence,
    rule: &str,
) {
    fence_is(
        store.renew(
            Holder::new(key, token),
            &Renew {
                lease_until,
                expires_at,
            },
        ),
        expected,
        rule,
    )
    .await;
}

/// Awaits a finish by a claim that does not hold the lease, which must be
/// refused.
async fn finish_refused(finish: impl Future<Output = Result<Fence, StoreError>>, rule: &str) {
    fence_is(finish, Fence::LeaseLost, rule).await;
}

/// Awaits a finish by the claim holding the lease, which must apply.
async fn finish_applies(finish: impl Future<Output = Result<Fence, StoreError>>) {
    let rule = "finish by the claim holding the lease applies";
    fence_is(finish, Fence::Applied, rule).await;
}
