//! The [`ProcessedStore`] trait, its records, and the built-in stores.
//!
//! A store knows nothing of signatures, HTTP or providers: it keeps one
//! [`Record`] per `(namespace, id)` and changes it atomically.

mod memory;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
pub mod open;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

use std::cell::Cell;
use std::error::Error as StdError;
use std::fmt;
use std::hash::{BuildHasher, Hasher};

#[doc(no_inline)]
pub use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::RedisStore;
pub use memory::MemoryStore;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use mysql::MySqlStore;
pub use open::{open, Backend, Migration, OpenError, OpenedStore, StoreUrl};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::PostgresStore;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use sql::{InvalidTableName, DEFAULT_TABLE};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;

/// A boxed error that crosses thread boundaries, kept as a [`StoreError`]'s source.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A type-erased store, as the guard holds it.
pub type DynProcessedStore = dyn ProcessedStore;

/// Where a record lives: a namespace (one per provider or endpoint) and the event id.
///
/// A namespace must not hold a NUL: the built-in stores join namespace and id with
/// one (the guard's builder refuses such a namespace; a direct caller of a store
/// must not make one either).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key<'a> {
    /// The namespace, such as `"stripe"`.
    pub namespace: &'a str,
    /// The provider's event id, stable across retries.
    pub id: &'a str,
}

impl<'a> Key<'a> {
    /// A key for `id` in `namespace`.
    pub fn new(namespace: &'a str, id: &'a str) -> Self {
        Self { namespace, id }
    }

    /// The length of the key as [`Key::push_joined`] spells it.
    pub(crate) fn joined_len(&self) -> usize {
        self.namespace.len() + 1 + self.id.len()
    }

    /// Appends `namespace`, a NUL, then `id`: how the memory and Redis stores spell
    /// a key (hence no NUL in a namespace).
    pub(crate) fn push_joined(&self, out: &mut String) {
        out.push_str(self.namespace);
        out.push('\0');
        out.push_str(self.id);
    }

    /// The key that [`Key::push_joined`] spelled as `joined`.
    pub(crate) fn split_joined(joined: &'a str) -> Self {
        let (namespace, id) = joined.split_once('\0').unwrap_or(("", joined));
        Self { namespace, id }
    }
}

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.id)
    }
}

/// The SHA-256 of a delivery's body, stored at claim to tell a retry (same body)
/// from a different event reusing the id (a conflict).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// What a guard that detects no conflicts stores: all zeros, never compared.
    pub const UNKNOWN: Self = Self([0; 32]);

    /// The fingerprint of `body`.
    pub fn of(body: &[u8]) -> Self {
        Self(Sha256::digest(body).into())
    }

    /// Whether two fingerprints may be of the same body: equal, or either one
    /// [`Fingerprint::UNKNOWN`] (never compared). This is the test of the
    /// [`ProcessedStore`] contract.
    pub fn matches(&self, other: &Self) -> bool {
        self == other || *self == Self::UNKNOWN || *other == Self::UNKNOWN
    }

    /// Lowercase hex, as the SQL and Redis stores keep it.
    pub fn to_hex(&self) -> String {
        let mut text = String::with_capacity(64);
        self.push_hex(&mut text);
        text
    }

    /// Appends [`Fingerprint::to_hex`] to `out`, for a store that writes it into a
    /// longer value.
    pub(crate) fn push_hex(&self, out: &mut String) {
        let mut digits = [0u8; 64];
        // 64 digits for 32 bytes: the lengths always agree.
        if hex::encode_to_slice(self.0, &mut digits).is_ok() {
            out.push_str(std::str::from_utf8(&digits).unwrap_or_default());
        }
    }

    /// Parses the form written by [`Fingerprint::to_hex`].
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out).ok()?;
        Some(Self(out))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..12])
    }
}

/// Identifies one claim. A store applies a fenced change only when the record still
/// carries the token of the claim making it, so a holder whose lease was taken over
/// cannot complete or release the record of the new holder.
///
/// Tokens are random 64-bit values chosen by the guard for every claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// A fresh random token: not cryptographic, but unique with overwhelming
    /// probability.
    pub fn random() -> Self {
        // A SplitMix64 sequence per thread, seeded from the process's random hash
        // keys, its id and the time: threads claiming at once share no cache line,
        // no two threads start at the same point, and each thread's sequence
        // repeats only after 2^64 tokens. (A process forked by a thread that had
        // drawn a token goes on with that thread's sequence there; threads it
        // starts afterwards, as a tokio runtime's are, start their own. A record
        // with this claim's token is taken as its own only if it was also made at
        // its time: `ClaimRequest::made`.)
        thread_local! {
            static STATE: Cell<u64> = Cell::new({
                let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
                seed.write_u32(std::process::id());
                let since_epoch = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                seed.write_u128(since_epoch.as_nanos());
                seed.finish()
            });
        }
        let mut z = STATE.with(|s| {
            let z = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
            s.set(z);
            z
        });
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self(z ^ (z >> 31))
    }

    /// The token as the signed 64-bit integer SQL columns hold (same bits).
    pub fn as_i64(self) -> i64 {
        self.0 as i64
    }

    /// The token from the signed 64-bit integer of [`FencingToken::as_i64`].
    pub fn from_i64(v: i64) -> Self {
        Self(v as u64)
    }
}

/// The state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

impl fmt::Display for RecordState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
    /// it, the lease ends at `lease_until`, the expiry becomes the later of its value
    /// and `expires_at`, and the answer is [`Fence::Applied`]; otherwise nothing
    /// changes and the answer is [`Fence::LeaseLost`].
    pub fn apply_renew(
        &mut self,
        token: FencingToken,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Fence {
        if !self.is_held_by(token) {
            return Fence::LeaseLost;
        }
        self.lease_until = lease_until;
        self.expires_at = self.expires_at.max(expires_at);
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

/// A store failure. Kept apart from verification failures: these are ours (5xx).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached (connection refused, reset, timed out, pool
    /// exhausted). The guard answers 503 and the provider retries, except where the
    /// handler already ran: a success is then answered 200 and recorded in the
    /// background ([`Outcome::Unrecorded`](crate::Outcome::Unrecorded)), as are a
    /// permanent failure and an escalation.
    #[error("store unavailable: {source}")]
    Unavailable {
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// The store answered with an error.
    #[error("store error: {source}")]
    Backend {
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// The store holds something this crate cannot read.
    #[error("store holds a corrupt record: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// An [`StoreError::Unavailable`] wrapping `source`.
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            source: source.into(),
        }
    }

    /// A [`StoreError::Backend`] wrapping `source`.
    pub fn backend(source: impl Into<BoxError>) -> Self {
        Self::Backend {
            source: source.into(),
        }
    }

    /// Whether the store was unreachable (as opposed to answering with an error).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }
}

/// Where the guard keeps what it knows about each event id.
///
/// # Contract
///
/// Every method is atomic with respect to every other call on the same key, across
/// all processes sharing the store. Times come from the caller (`now`), never from
/// the store's own clock, so that every replica and every test agrees on them.
///
/// - **claim** ([`ProcessedStore::claim`]): if there is no record for the key, or the
///   record has expired (`expires_at <= now`, and not `InProgress` with a live
///   lease, `lease_until > now`), insert a fresh one: `InProgress`,
///   the request's token, fingerprint, lease and expiry, `attempts = 1`,
///   `failures = 0`, empty history, `created_at = updated_at = now`, and answer
///   [`Claim::Acquired`]. Otherwise, if the record's fingerprint
///   [matches](Fingerprint::matches) the request's (equal, or either one
///   [`Fingerprint::UNKNOWN`]) and the record is either `Failed`, or `InProgress`
///   with `lease_until <= now` (a crashed or hung holder), take it over: set
///   `InProgress`, the new token and lease, the later of the two expiries,
///   `attempts + 1`, `updated_at = now`, the request's fingerprint if the record's was `UNKNOWN` (a known one is
///   kept), and when the old lease expired also `failures + 1`; answer `Acquired`.
///   In every other case (terminal state, live lease, different known fingerprint)
///   change nothing and answer [`Claim::Existing`] with the record. A claim
///   repeated with the same token (the guard never repeats one; a driver may send
///   a round trip again whose first run was applied) may be answered `Acquired`
///   with the record it made; the guard takes `Existing` with an `InProgress`
///   record carrying the request's token and changed at the request's `now` (to the
///   millisecond: keep `updated_at` at least that precisely) as granted too.
/// - **finish**: if the record exists, is `InProgress` and carries `token`, set its
///   state, failures, history, expiry and `updated_at` from the [`Finish`] and answer
///   [`Fence::Applied`]; otherwise change nothing and answer [`Fence::LeaseLost`]. A
///   lease that ran out but was not taken over may still be finished.
/// - **renew**: the same fence; sets `lease_until`, and `expires_at` to the later of
///   its value and the one given.
/// - **get**: the record, expired or not, or `None`.
/// - **delete**: removes the record unless it is `InProgress` with a live lease.
/// - **purge_expired**: removes up to `limit` records with `expires_at <= now`,
///   never an `InProgress` record whose lease is live, and answers how many it removed.
///   It must not block claims for long: work in small batches.
/// - **stuck**: up to `limit` `InProgress` records whose lease ran out (`lease_until <= now`).
///
/// Errors: a store that cannot be reached answers [`StoreError::Unavailable`], and
/// the guard then answers 503 before a handler ran (after one, see
/// [`StoreError::Unavailable`]). Implementations must recover by themselves when the
/// server comes back.
///
/// The public conformance suite (feature `conformance`, module
/// `conformance`) checks all of this against any store.
///
/// # Writing a store
///
/// The trait is declared with [`async_trait`](macro@async_trait) (re-exported here as
/// `webhook_guard::store::async_trait`): put `#[async_trait]` on the impl too (a
/// plain `async fn` in the impl fails with E0195). [`ClaimRequest::decide`] makes
/// the claim's decision, [`Record::claimed`] and [`Record::taken_over`] build the
/// record it stores, and [`Record::apply_finish`] and [`Record::apply_renew`] make
/// the fenced changes; the store's part is to read and write atomically. A sketch
/// over one lock (the complete store, which passes the conformance suite, is
/// `examples/custom_store.rs` in the crate's repository: `cargo run --example
/// custom_store --features conformance`):
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
///
/// use chrono::{DateTime, Utc};
/// use webhook_guard::store::{
///     async_trait, Claim, ClaimRequest, Decision, Deleted, Fence, FencingToken, Finish, Key,
///     ProcessedStore, Record, StoreError,
/// };
///
/// #[derive(Debug, Default)]
/// struct MyStore(Mutex<HashMap<(String, String), Record>>);
///
/// #[async_trait]
/// impl ProcessedStore for MyStore {
///     async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
///         let key = (request.key.namespace.to_owned(), request.key.id.to_owned());
///         // Read, decide and write in one atomic step: here, under one lock.
///         let mut records = self.0.lock().unwrap();
///         let existing = records.get(&key);
///         let next = match (request.decide(existing), existing) {
///             (Decision::Keep, Some(record)) => return Ok(Claim::Existing(record.clone())),
///             (Decision::TakeOver, Some(record)) => record.taken_over(request),
///             _ => Record::claimed(request),
///         };
///         records.insert(key, next.clone());
///         Ok(Claim::Acquired(next))
///     }
///
///     async fn finish(
///         &self,
///         key: Key<'_>,
///         token: FencingToken,
///         finish: &Finish<'_>,
///     ) -> Result<Fence, StoreError> {
///         let mut records = self.0.lock().unwrap();
///         let record = records.get_mut(&(key.namespace.to_owned(), key.id.to_owned()));
///         Ok(record.map_or(Fence::LeaseLost, |r| r.apply_finish(token, finish)))
///     }
///
///     // `renew` as `finish`, with `Record::apply_renew`; `get`, `delete`,
///     // `purge_expired` and `stuck` as the contract says (see the example).
/// #   async fn renew(&self, _: Key<'_>, _: FencingToken, _: DateTime<Utc>, _: DateTime<Utc>)
/// #       -> Result<Fence, StoreError> { unimplemented!() }
/// #   async fn get(&self, _: Key<'_>) -> Result<Option<Record>, StoreError> { unimplemented!() }
/// #   async fn delete(&self, _: Key<'_>, _: DateTime<Utc>) -> Result<Deleted, StoreError> {
/// #       unimplemented!()
/// #   }
/// #   async fn purge_expired(&self, _: DateTime<Utc>, _: usize) -> Result<u64, StoreError> {
/// #       unimplemented!()
/// #   }
/// #   async fn stuck(&self, _: DateTime<Utc>, _: usize) -> Result<Vec<Record>, StoreError> {
/// #       unimplemented!()
/// #   }
/// }
/// ```
///
/// # Why `purge_expired` and `stuck` are in this trait
///
/// They are required methods here, not a separate maintenance trait with default
/// methods (as tower-sessions' `ExpiredDeletion` is), because:
///
/// - Nothing else removes an expired record: a claim replaces one, but an id never
///   delivered again stays until a purge (or an operator's `delete`). A default
///   that does nothing would let a store that forgot the method grow without
///   bound and still compile; tower-sessions' stores can leave deletion out
///   because their backends expire entries by themselves.
/// - The sweeper, the operator tool's `purge` and `stuck`, and the conformance
///   suite all work on one `dyn ProcessedStore`; a second trait would need a second
///   object beside it everywhere, for two methods.
/// - Both are short to write (about fifteen lines in the example). A store whose
///   backend expires records by itself answers `Ok(0)` from `purge_expired`, and
///   still lists stuck leases: the sweeper reports them.
#[async_trait]
pub trait ProcessedStore: fmt::Debug + Send + Sync + 'static {
    /// Claims `request.key` if it is free, expired, failed or abandoned.
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError>;

    /// Ends the claim holding `token` with the state in `finish`.
    async fn finish(
        &self,
        key: Key<'_>,
        token: FencingToken,
        finish: &Finish<'_>,
    ) -> Result<Fence, StoreError>;

    /// Extends the lease of the claim holding `token`.
    async fn renew(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<Fence, StoreError>;

    /// The record under `key`, if any.
    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError>;

    /// Removes the record under `key` unless a live lease holds it.
    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError>;

    /// Removes up to `limit` records that expired at `now`.
    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError>;

    /// Up to `limit` `InProgress` records whose lease ran out at `now`, the
    /// longest-expired first: when more are stuck, the page holds the oldest leases
    /// (a sweeper reports how long ago the first one ran out).
    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError>;
}

/// Writes a [`forward!`](crate::forward::forward) impl of [`ProcessedStore`] for the
/// head given (see there), its methods listed here once.
macro_rules! forward_processed_store {
    ($($head:tt)*) => {
        crate::forward::forward!($($head)* {
            async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError>;
            async fn finish(&self, key: Key<'_>, token: FencingToken, finish: &Finish<'_>)
                -> Result<Fence, StoreError>;
            async fn renew(&self, key: Key<'_>, token: FencingToken, lease_until: DateTime<Utc>,
                expires_at: DateTime<Utc>) -> Result<Fence, StoreError>;
            async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError>;
            async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError>;
            async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError>;
            async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError>;
        });
    };
}

#[cfg_attr(not(feature = "metrics"), allow(unused_imports))]
pub(crate) use forward_processed_store;

forward_processed_store!(ProcessedStore);

/// The end of a lease or of a retention in whole milliseconds, rounded up, for
/// stores and indexes that keep times in milliseconds: an end kept to the
/// millisecond below could pass up to a millisecond early (the store compares it
/// with `now` in milliseconds too), a lease taken over or a record replaced before
/// its time; one rounded up never does.
pub(crate) fn ceil_millis(t: DateTime<Utc>) -> i64 {
    let ms = t.timestamp_millis();
    if t.timestamp_subsec_nanos().is_multiple_of(1_000_000) {
        ms
    } else {
        ms + 1
    }
}

#[cfg(test)]
mod tests {
    use super::{FencingToken, Fingerprint};
    use std::collections::HashSet;

    #[test]
    fn tokens_from_several_threads_are_all_distinct() {
        let per_thread = 50_000;
        let tokens: Vec<Vec<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(move || {
                        (0..per_thread)
                            .map(|_| FencingToken::random().0)
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let all: HashSet<u64> = tokens.iter().flatten().copied().collect();
        assert_eq!(all.len(), 4 * per_thread);
        // Consecutive tokens of one thread are not a counter.
        let t = &tokens[0];
        assert!(t.windows(2).all(|w| w[1].wrapping_sub(w[0]) != 1));
    }

    #[test]
    fn fingerprints_spell_lowercase_hex_and_read_it_back() {
        let fp = Fingerprint::of(b"body");
        let text = fp.to_hex();
        assert_eq!(
            text,
            "230d8358dc8e8890b4c58deeb62912ee2f20357ae92a5cc861b98e68fe31acb5"
        );
        assert_eq!(Fingerprint::from_hex(&text), Some(fp));
        let mut out = String::from("x|");
        Fingerprint([0xa5; 32]).push_hex(&mut out);
        assert_eq!(out, format!("x|{}", "a5".repeat(32)));
        assert_eq!(Fingerprint::from_hex(&text[..63]), None);
    }
}
