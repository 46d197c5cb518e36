//! The [`ProcessedStore`] trait, its records, and the built-in stores.
//!
//! A store knows nothing of signatures, HTTP or providers: it keeps one
//! [`Record`] per `(namespace, id)` and changes it atomically.

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub mod dynamodb;
pub mod escalation;
pub mod listing;
mod memory;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
pub mod open;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
mod record;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "redis")))
)]
pub mod tls;

use std::cell::Cell;
use std::error::Error as StdError;
use std::fmt;
use std::hash::{BuildHasher, Hasher};

#[doc(no_inline)]
pub use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::RedisStore;
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub use dynamodb::DynamoDbStore;
pub use listing::ListingStore;
pub use memory::MemoryStore;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use mysql::MySqlStore;
pub use open::{open, Backend, Migration, OpenError, OpenedStore, StoreUrl};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::PostgresStore;
pub(crate) use record::made_at;
pub use record::{
    decode_history, encode_history, Claim, ClaimRequest, Decision, Deleted, FailureNote, Fence,
    Finish, Holder, Record, RecordState, Recorded, Renew, HISTORY_LIMIT,
};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use sql::{InvalidTableName, DEFAULT_TABLE};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
pub use tls::{TlsError, TlsFailure};

/// A boxed error that crosses thread boundaries, kept as a [`StoreError`]'s source.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A type-erased store, as the guard holds it.
pub type DynProcessedStore = dyn ProcessedStore;

/// Where a record lives: a namespace (one per provider or endpoint) and the event id.
///
/// A namespace must not hold a NUL: the memory and Redis stores join namespace and
/// id with one (the guard's builder refuses such a namespace; a direct caller of a
/// store must not make one either). The DynamoDB store prefixes the namespace with
/// its length instead.
///
/// Besides its own namespace, a guard keeps short-lived follow-up markers (the
/// announcement an escalation or a permanent failure still owes) in a namespace
/// of its own, `"\u{1}followup:"` and 16 hex digits of a hash of its namespace,
/// under the event's id. They show in [`ProcessedStore::stuck`] when a process died
/// owing one, until the guard's sweeper or the id's next delivery pays it. A guard
/// whose verifier does not sign its event id (GitHub, Shopify, Linear, Jamm) keeps
/// the content keys of its deliveries in `"\u{1}content:"` and 16 hex digits of a
/// hash of its namespace, under 64 hex digits
/// ([`WebhookGuardBuilder::content_keys`](crate::WebhookGuardBuilder::content_keys)),
/// for the guard's retention; one whose process died holding it shows in `stuck`
/// from the end of its lease until a redelivery takes it over or the retention
/// ends.
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
    /// The request never reached the store: no connection could be had (refused,
    /// or none free in the pool before its timeout), so nothing was applied. The
    /// guard answers 503, as for [`StoreError::Unavailable`], and looks for no claim.
    #[error("store unavailable (nothing sent): {source}")]
    NotSent {
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

    /// A [`StoreError::NotSent`] wrapping `source`: only for a request that
    /// provably never left (a refused connection, a pool that had none to give).
    pub fn not_sent(source: impl Into<BoxError>) -> Self {
        Self::NotSent {
            source: source.into(),
        }
    }

    /// A [`StoreError::Backend`] wrapping `source`.
    pub fn backend(source: impl Into<BoxError>) -> Self {
        Self::Backend {
            source: source.into(),
        }
    }

    /// Whether the store was unreachable (as opposed to answering with an error):
    /// [`StoreError::Unavailable`] or [`StoreError::NotSent`].
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::NotSent { .. })
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
/// - **finish**: if the record under the [`Holder`]'s key exists, is `InProgress`
///   and carries the holder's token, set its state, failures, history, expiry and
///   `updated_at` from the [`Finish`] and answer [`Fence::Applied`]; otherwise
///   change nothing and answer [`Fence::LeaseLost`]. A lease that ran out but was
///   not taken over may still be finished.
/// - **renew**: the same fence; sets `lease_until`, and `expires_at` to the later of
///   its value and the one given (both from the [`Renew`]).
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
///     async_trait, Claim, ClaimRequest, Decision, Deleted, Fence, Finish, Holder, Key,
///     ProcessedStore, Record, Renew, StoreError,
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
///     async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError> {
///         let Holder { key, token } = holder;
///         let mut records = self.0.lock().unwrap();
///         let record = records.get_mut(&(key.namespace.to_owned(), key.id.to_owned()));
///         Ok(record.map_or(Fence::LeaseLost, |r| r.apply_finish(token, finish)))
///     }
///
///     // `renew` as `finish`, with `Record::apply_renew`; `get`, `delete`,
///     // `purge_expired` and `stuck` as the contract says (see the example).
/// #   async fn renew(&self, _: Holder<'_>, _: &Renew) -> Result<Fence, StoreError> {
/// #       unimplemented!()
/// #   }
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
#[auto_impl::auto_impl(Arc, Box)]
pub trait ProcessedStore: fmt::Debug + Send + Sync + 'static {
    /// Claims `request.key` if it is free, expired, failed or abandoned.
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError>;

    /// Ends the claim of `holder` with the state in `finish`.
    async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError>;

    /// Extends the lease of the claim of `holder` as `renew` says.
    async fn renew(&self, holder: Holder<'_>, renew: &Renew) -> Result<Fence, StoreError>;

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

    /// The store's listing of records for operators, if it has one (every
    /// built-in store does). A store that does not list answers `None`, the
    /// default: see [`listing`] for why this is a capability apart.
    fn record_listing(&self) -> Option<&dyn ListingStore> {
        None
    }
}

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
