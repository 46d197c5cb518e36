//! A record and what the store contract's calls take and answer: [`Record`] and its
//! state, the claim request and its decision, and the fenced answers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::ProcessedStore;
use super::{FencingToken, Fingerprint, Key, StoreError};

/// The state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, derive_more::Display)]
#[display("{}", self.as_str())]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RecordState {
    /// A delivery holds the lease and its handler is running (or crashed: see
    /// [`Record::lease_until`]).
    InProgress,
    /// The last attempt failed with a retryable error; the next delivery may claim it.
    Failed,
    /// The handler succeeded. Terminal.
    Completed,
    /// The id failed too often and was escalated to the host. Terminal.
    Escalated,
    /// The handler reported a permanent failure. Terminal.
    PermanentFailure,
}

impl RecordState {
    /// Whether no further delivery of the id will run the handler.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Escalated | Self::PermanentFailure
        )
    }

    /// The name stores write, such as `"in_progress"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Failed => "failed",
            Self::Completed => "completed",
            Self::Escalated => "escalated",
            Self::PermanentFailure => "permanent_failure",
        }
    }

    /// Parses the name written by [`RecordState::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "in_progress" => Self::InProgress,
            "failed" => Self::Failed,
            "completed" => Self::Completed,
            "escalated" => Self::Escalated,
            "permanent_failure" => Self::PermanentFailure,
            _ => return None,
        })
    }
}

/// One failed attempt, as kept in a record's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureNote {
    /// When the attempt failed.
    pub at: DateTime<Utc>,
    /// What the handler said (never a secret: handler errors are the host's text).
    pub error: String,
}

/// How many failure notes a record keeps (the count in [`Record::failures`] goes on).
pub const HISTORY_LIMIT: usize = 8;

/// Encodes a history for stores that keep it as text (JSON).
pub fn encode_history(history: &[FailureNote]) -> String {
    serde_json::to_string(history).unwrap_or_else(|_| "[]".to_owned())
}

/// Decodes a history written by [`encode_history`].
///
/// # Errors
/// [`StoreError::Corrupt`] when the text is not such a history.
pub fn decode_history(text: &str) -> Result<Vec<FailureNote>, StoreError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("history: {e}")))
}

/// Everything a store keeps about one event id.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Record {
    /// The namespace of the key.
    pub namespace: String,
    /// The event id.
    pub id: String,
    /// Where the record stands.
    pub state: RecordState,
    /// The fingerprint of the body that first claimed the id.
    pub fingerprint: Fingerprint,
    /// The token of the latest claim.
    pub token: FencingToken,
    /// How many claims have been granted for the id: handler runs started, and
    /// claims that ended before their handler ran (released unrun, answered stale,
    /// escalated at the claim).
    pub attempts: u32,
    /// How many attempts failed: retryable and permanent failures, and expired
    /// leases.
    pub failures: u32,
    /// Until when the latest claim's lease holds. Meaningful in `InProgress` only.
    pub lease_until: DateTime<Utc>,
    /// When the record may be purged.
    pub expires_at: DateTime<Utc>,
    /// When the id was first claimed.
    pub created_at: DateTime<Utc>,
    /// When the record last changed.
    pub updated_at: DateTime<Utc>,
    /// The latest failures, oldest first, at most [`HISTORY_LIMIT`].
    pub history: Vec<FailureNote>,
}

impl Record {
    /// The record a claim stores for a key without a live record
    /// ([`Decision::Replace`]): `InProgress` with the request's token, fingerprint,
    /// lease and expiry, `attempts = 1`, `failures = 0`, empty history,
    /// `created_at = updated_at = now`.
    pub fn claimed(request: &ClaimRequest<'_>) -> Self {
        Self {
            namespace: request.key.namespace.to_owned(),
            id: request.key.id.to_owned(),
            state: RecordState::InProgress,
            fingerprint: request.fingerprint,
            token: request.token,
            attempts: 1,
            failures: 0,
            lease_until: request.lease_until,
            expires_at: request.expires_at,
            created_at: request.now,
            updated_at: request.now,
            history: Vec::new(),
        }
    }

    /// This record as `request` takes it over ([`Decision::TakeOver`]):
    /// `InProgress` with the request's token and lease, the later of the two
    /// expiries, `attempts + 1`, `updated_at = now`, the request's fingerprint if
    /// this one is [`Fingerprint::UNKNOWN`], and `failures + 1` if this record's
    /// lease ran out (an abandoned holder's attempt counts as failed).
    pub fn taken_over(&self, request: &ClaimRequest<'_>) -> Self {
        let fingerprint = if self.fingerprint == Fingerprint::UNKNOWN {
            request.fingerprint
        } else {
            self.fingerprint
        };
        let abandoned = self.state == RecordState::InProgress;
        Self {
            state: RecordState::InProgress,
            fingerprint,
            token: request.token,
            attempts: self.attempts.saturating_add(1),
            failures: self.failures.saturating_add(u32::from(abandoned)),
            lease_until: request.lease_until,
            expires_at: self.expires_at.max(request.expires_at),
            updated_at: request.now,
            ..self.clone()
        }
    }

    /// Builds a record from all its parts, for a store that reads one back from
    /// its storage.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        key: Key<'_>,
        state: RecordState,
        fingerprint: Fingerprint,
        token: FencingToken,
        attempts: u32,
        failures: u32,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
        created_at: DateTime<Utc>,
        updated_at: DateTime<Utc>,
        history: Vec<FailureNote>,
    ) -> Self {
        Self {
            namespace: key.namespace.to_owned(),
            id: key.id.to_owned(),
            state,
            fingerprint,
            token,
            attempts,
            failures,
            lease_until,
            expires_at,
            created_at,
            updated_at,
            history,
        }
    }

    /// Whether the claim holding `token` may change this record: it is
    /// `InProgress` and carries `token` (the fence of [`ProcessedStore::finish`]
    /// and [`ProcessedStore::renew`]).
    pub fn is_held_by(&self, token: FencingToken) -> bool {
        self.state == RecordState::InProgress && self.token == token
    }

    /// [`ProcessedStore::finish`] on this record: if the claim holding `token`
    /// holds it ([`Record::is_held_by`]), sets state, failures, history, expiry and
    /// `updated_at` from `finish` and answers [`Fence::Applied`]; otherwise changes
    /// nothing and answers [`Fence::LeaseLost`].
    pub fn apply_finish(&mut self, token: FencingToken, finish: &Finish<'_>) -> Fence {
        if !self.is_held_by(token) {
            return Fence::LeaseLost;
        }
        self.state = finish.state;
        self.failures = finish.failures;
        self.history = finish.history.to_vec();
        self.expires_at = finish.expires_at;
        self.updated_at = finish.now;
        Fence::Applied
    }

    /// [`ProcessedStore::renew`] on this record: if the claim holding `token` holds
    /// it, the lease ends at `renew.lease_until`, the expiry becomes the later of its
    /// value and `renew.expires_at`, and the answer is [`Fence::Applied`]; otherwise
    /// nothing changes and the answer is [`Fence::LeaseLost`].
    pub fn apply_renew(&mut self, token: FencingToken, renew: &Renew) -> Fence {
        if !self.is_held_by(token) {
            return Fence::LeaseLost;
        }
        self.lease_until = renew.lease_until;
        self.expires_at = self.expires_at.max(renew.expires_at);
        Fence::Applied
    }

    /// Whether the record is `InProgress` with a lease still live at `now`: a
    /// delete leaves it alone, and a purge too, even past its expiry.
    pub fn lease_live(&self, now: DateTime<Utc>) -> bool {
        self.state == RecordState::InProgress && self.lease_until > now
    }

    /// Whether a purge at `now` may remove the record: expired, and no live lease.
    pub fn purgeable(&self, now: DateTime<Utc>) -> bool {
        self.expires_at <= now && !self.lease_live(now)
    }

    /// The record's key.
    pub fn key(&self) -> Key<'_> {
        Key::new(&self.namespace, &self.id)
    }

    /// Whether the record is `InProgress` with a lease that has run out at `now`.
    pub fn lease_expired(&self, now: DateTime<Utc>) -> bool {
        self.state == RecordState::InProgress && self.lease_until <= now
    }
}

/// A request to claim a key: see the contract on [`ProcessedStore::claim`].
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The key to claim.
    pub key: Key<'a>,
    /// The fingerprint of this delivery's body.
    pub fingerprint: Fingerprint,
    /// The token this claim will carry if granted.
    pub token: FencingToken,
    /// The current time.
    pub now: DateTime<Utc>,
    /// Until when the lease holds if granted.
    pub lease_until: DateTime<Utc>,
    /// The record's new expiry if granted (never before `lease_until`).
    pub expires_at: DateTime<Utc>,
}

/// What a claim does, given the record it finds under its key: the decision of
/// the contract on [`ProcessedStore::claim`], made by [`ClaimRequest::decide`].
///
/// A store that decides in its own code reads the record, decides, and writes
/// within one atomic step (one lock, one transaction, one script): see
/// [`ProcessedStore`] for a whole `claim` built on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No record, or one that expired (and no live lease holds it): store
    /// [`Record::claimed`] and answer [`Claim::Acquired`].
    Replace,
    /// `Failed`, or `InProgress` with a lease that ran out, with a matching
    /// fingerprint: store [`Record::taken_over`] and answer [`Claim::Acquired`].
    TakeOver,
    /// Anything else (a terminal state, a live lease, a different known body):
    /// change nothing and answer [`Claim::Existing`] with the record.
    Keep,
}

/// Whether `record` was changed by the claim with `token` made at `now`: its token,
/// and its `updated_at` within the millisecond (a claim made elsewhere with the same
/// token, by a forked process that goes on with its parent's token sequence, is
/// told apart by its time).
pub(crate) fn made_at(record: &Record, token: FencingToken, now: DateTime<Utc>) -> bool {
    record.token == token && (record.updated_at - now).abs() < chrono::TimeDelta::milliseconds(1)
}

impl<'a> ClaimRequest<'a> {
    /// The key with this claim's token: what finishes or renews the claim once it
    /// is won.
    pub fn holder(&self) -> Holder<'a> {
        Holder::new(self.key, self.token)
    }
}

#[cfg(test)]
impl<'a> ClaimRequest<'a> {
    /// A fresh claim of `key` at `now`, for tests: a new token, a lease of 60 s, kept
    /// for an hour.
    pub(crate) fn fresh(key: Key<'a>, now: DateTime<Utc>) -> Self {
        Self {
            key,
            fingerprint: Fingerprint::of(b"body"),
            token: FencingToken::random(),
            now,
            lease_until: now + chrono::TimeDelta::seconds(60),
            expires_at: now + chrono::TimeDelta::hours(1),
        }
    }
}

impl ClaimRequest<'_> {
    /// Whether `record` is the one this very claim made (met again by a driver's
    /// resend): `InProgress` with this claim's token, changed at this claim's time
    /// to the millisecond. The time tells it from a claim made elsewhere with the
    /// same token (a forked process that goes on with its parent's token sequence).
    pub(crate) fn made(&self, record: &Record) -> bool {
        record.state == RecordState::InProgress && made_at(record, self.token, self.now)
    }

    /// The contract's decision on `existing`, the record found under the key
    /// (`None` when there is none): see [`Decision`].
    ///
    /// ```
    /// use chrono::{TimeDelta, Utc};
    /// use webhook_guard::store::{ClaimRequest, Decision, FencingToken, Fingerprint, Key, Record};
    ///
    /// let now = Utc::now();
    /// let request = |now| ClaimRequest {
    ///     key: Key::new("stripe", "evt_1"),
    ///     fingerprint: Fingerprint::of(b"{}"),
    ///     token: FencingToken::random(),
    ///     now,
    ///     lease_until: now + TimeDelta::seconds(30),
    ///     expires_at: now + TimeDelta::days(3),
    /// };
    /// let first = request(now);
    /// assert_eq!(first.decide(None), Decision::Replace);
    /// let held = Record::claimed(&first);
    /// // A live lease holds the id; once it has run out, a retry takes it over.
    /// assert_eq!(request(now).decide(Some(&held)), Decision::Keep);
    /// let later = request(now + TimeDelta::seconds(31));
    /// assert_eq!(later.decide(Some(&held)), Decision::TakeOver);
    /// assert_eq!(held.taken_over(&later).failures, 1);
    /// ```
    pub fn decide(&self, existing: Option<&Record>) -> Decision {
        existing.map_or(Decision::Replace, |r| {
            self.decide_parts(r.state, r.fingerprint, r.lease_until, r.expires_at)
        })
    }

    /// [`ClaimRequest::decide`] on the parts of a record in `state`, with
    /// `fingerprint`, whose lease ends at `lease_until` and which expires at
    /// `expires_at`.
    pub(crate) fn decide_parts(
        &self,
        state: RecordState,
        fingerprint: Fingerprint,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Decision {
        let live = state == RecordState::InProgress && lease_until > self.now;
        if expires_at <= self.now && !live {
            Decision::Replace
        } else if fingerprint.matches(&self.fingerprint)
            && (state == RecordState::Failed || (state == RecordState::InProgress && !live))
        {
            Decision::TakeOver
        } else {
            Decision::Keep
        }
    }

    /// [`ClaimRequest::decide`] on `record`.
    #[cfg(any(
        feature = "mysql",
        feature = "postgres",
        feature = "sqlite",
        feature = "redis"
    ))]
    pub(crate) fn decide_on(&self, record: &Record) -> Decision {
        self.decide(Some(record))
    }
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This claim won: the record as it now stands, `InProgress` with the request's token.
    Acquired(Record),
    /// Someone else holds or finished the id, or the body differs: the record,
    /// unchanged. (Or this very claim, met again by a driver's resend: `InProgress`
    /// with the request's token; see [`ProcessedStore`]'s contract.)
    Existing(Record),
}

/// A fenced change that ends a claim: see [`ProcessedStore::finish`].
#[derive(Debug, Clone, Copy)]
pub struct Finish<'a> {
    /// The new state; never `InProgress`.
    pub state: RecordState,
    /// The new failure count.
    pub failures: u32,
    /// The new failure history.
    pub history: &'a [FailureNote],
    /// The current time (becomes `updated_at`).
    pub now: DateTime<Utc>,
    /// The record's new expiry.
    pub expires_at: DateTime<Utc>,
}

/// Who may make a fenced change: the key and the token of the claim (or inbox
/// lease) holding it. A store makes the change only while the record (or event)
/// under the key still carries the token: see [`ProcessedStore::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holder<'a> {
    /// The key held.
    pub key: Key<'a>,
    /// The token of the claim or lease holding it.
    pub token: FencingToken,
}

impl<'a> Holder<'a> {
    /// The claim or lease of `key` that carries `token`.
    pub fn new(key: Key<'a>, token: FencingToken) -> Self {
        Self { key, token }
    }
}

/// A fenced change that extends a claim's lease: see [`ProcessedStore::renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renew {
    /// Until when the lease now holds.
    pub lease_until: DateTime<Utc>,
    /// The record's expiry at the earliest (a later one is kept).
    pub expires_at: DateTime<Utc>,
}

/// Whether a fenced change was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Fence {
    /// The record carried the token and was `InProgress`: the change is made.
    Applied,
    /// The record is gone, finished, or carries another token: nothing changed.
    LeaseLost,
}

/// The answer of a SQL store's transactional `record_in`: whether the host's own
/// transaction is the first to record the id (run the effect, then commit both), the
/// id was already recorded (skip the effect), or a delivery is processing it now
/// (skip the effect and answer a retry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recorded {
    /// This transaction recorded the id: apply the effect in the same transaction.
    First,
    /// The id is already recorded (committed by another transaction): skip the effect.
    Duplicate,
    /// The id is recorded with a different known fingerprint (see
    /// [`Fingerprint::matches`]): skip and alert.
    Conflict,
    /// A delivery holds the id under a live lease (the guard's claim, outside any
    /// transaction) and has not finished: skip the effect and answer a retry (409),
    /// as the guard does for [`Outcome::InProgress`](crate::Outcome::InProgress).
    InProgress,
}

/// The answer to [`ProcessedStore::delete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The record was removed; the next delivery of the id runs the handler.
    Removed,
    /// There was no record.
    NotFound,
    /// The record is `InProgress` under a live lease and was left alone.
    LeaseHeld,
}
