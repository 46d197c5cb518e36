//! The delivery flow: verify → extract the id → claim → run → record → answer.

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, TimeDelta, Utc};
use http::StatusCode;

use crate::clock::{Clock, SystemClock};
use crate::hooks::{DeliveryReport, Escalation, Hooks, NoHooks, PanicSafe};
use crate::inbox::{Enqueued, InboxStore, NewEvent};
use crate::meta::{EventMeta, MetaExtractor};
use crate::ordering::{Freshness, ObjectKey, ObjectStatus, OrderingStore};
use crate::outcome::{Answer, Outcome, OutcomeKind, Rejection, Unrecorded};
use crate::reconcile::{ReconcileReason, ReconcileRequest, Reconciler};
use crate::store::{
    Claim, ClaimRequest, Deleted, DynProcessedStore, FailureNote, Fence, FencingToken, Fingerprint,
    Finish, Key, ProcessedStore, Record, RecordState, StoreError, HISTORY_LIMIT,
};
use crate::verify::{Verified, Verifier};
use crate::Headers;
use tracing::Instrument as _;

/// The default lease: how long a claim holds before another delivery may take over.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(5 * 60);
/// The default retention: Stripe's 72-hour retry window (Jamm's schedule spans 54 h 38 min).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(72 * 3600);
/// The default number of failures after which an id is escalated (seed: about 5).
pub const DEFAULT_ESCALATE_AFTER: u32 = 5;
/// The default body size limit: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;
/// The longest event id accepted, in bytes.
pub const MAX_ID_LEN: usize = 255;

/// A function that finds the event id in a delivery's headers and body.
pub type IdExtractor = dyn Fn(&dyn Headers, &[u8]) -> Option<String> + Send + Sync;

/// Where the guard finds a delivery's event id.
#[derive(Clone)]
#[non_exhaustive]
pub enum EventId {
    /// The id the verifier found (provider presets know where their provider puts it).
    FromVerifier,
    /// A request header.
    Header(Cow<'static, str>),
    /// A field of the JSON body, given as a path of object keys, read without
    /// building the document.
    JsonField(Vec<String>),
    /// A function of the headers and body.
    Custom(Arc<IdExtractor>),
}

impl EventId {
    /// The id in header `name`.
    pub fn header(name: impl Into<Cow<'static, str>>) -> Self {
        Self::Header(name.into())
    }

    /// The id at `path` in the JSON body, such as `["id"]`.
    pub fn json_field<S: Into<String>>(path: impl IntoIterator<Item = S>) -> Self {
        Self::JsonField(path.into_iter().map(Into::into).collect())
    }

    fn extract(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        verified: Verified,
    ) -> Result<String, Rejection> {
        match self {
            Self::FromVerifier => verified.event_id.ok_or_else(|| {
                Rejection::MissingId("the verifier found no event id; configure EventId".into())
            }),
            Self::Header(name) => headers
                .get_str(name)
                .map(str::to_owned)
                .ok_or_else(|| Rejection::MissingId(format!("header `{name}` is missing"))),
            Self::JsonField(path) => {
                let path: Vec<&str> = path.iter().map(String::as_str).collect();
                crate::json::field(body, &path).map_err(|e| Rejection::MissingId(e.to_string()))
            }
            Self::Custom(f) => {
                f(headers, body).ok_or_else(|| Rejection::MissingId("custom extractor".into()))
            }
        }
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FromVerifier => f.write_str("FromVerifier"),
            Self::Header(h) => f.debug_tuple("Header").field(h).finish(),
            Self::JsonField(p) => f.debug_tuple("JsonField").field(p).finish(),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// The current span, or `None` when no tracing subscriber was ever set (so there
/// is no span to record on, and looking one up would cost a thread-local access).
fn current_span() -> Option<tracing::Span> {
    tracing::dispatcher::has_been_set().then(tracing::Span::current)
}

/// Records `value` as `field` on the current span (a no-op on a span without it).
fn record_on_span(field: &str, value: impl tracing::Value) {
    if let Some(span) = current_span() {
        span.record(field, value);
    }
}

/// `span`, or no span at all when no subscriber takes it: entering a disabled span
/// at every poll still costs (with tracing's `log` feature, a `log` level check at
/// each enter and exit), for nothing a subscriber sees.
pub(crate) fn enterable(span: tracing::Span) -> tracing::Span {
    if span.is_disabled() {
        tracing::Span::none()
    } else {
        span
    }
}

fn check_id(id: &str) -> Result<(), Rejection> {
    if id.is_empty() {
        Err(Rejection::InvalidId("empty"))
    } else if id.len() > MAX_ID_LEN {
        Err(Rejection::InvalidId("longer than 255 bytes"))
    } else if has_control(id) {
        Err(Rejection::InvalidId("contains control characters"))
    } else {
        Ok(())
    }
}

/// Whether `id` holds a control character: printable ASCII (almost every id) is
/// told without decoding.
fn has_control(id: &str) -> bool {
    !id.bytes().all(|b| (0x20..0x7f).contains(&b)) && id.chars().any(char::is_control)
}

/// How to answer a delivery that finds another delivery of its id in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum InProgressAnswer {
    /// 409 with `Retry-After`: the sender retries later (the default).
    #[default]
    RetryLater,
    /// 200: for senders whose first delivery is durable, so no retry is needed.
    ///
    /// A sender that stops retrying at the first 2xx loses the event when the
    /// delivery in progress then fails, or ends before its handler ran (its request
    /// dropped while it claimed, its claim answered stale): nothing delivers it
    /// again. A reconciler does not cover it either: the guard asks one after an
    /// escalation, a permanent failure or a lost lease, not after a retryable
    /// failure (the sender's retry is its remedy). Use it only with a sender that
    /// retries each delivery on its own.
    Accept,
}

/// The longest handler error text the guard and the inbox worker keep, in bytes:
/// a longer one is cut on a character boundary and marked `… (cut)`, so that a
/// failure's history, its log line and the stores' columns stay bounded (MySQL
/// keeps a history in a `MEDIUMTEXT`, and a statement within `max_allowed_packet`).
pub const MAX_ERROR_LEN: usize = 2048;

/// `text`, cut to at most [`MAX_ERROR_LEN`] bytes, its mark included.
pub(crate) fn bounded_error(mut text: String) -> String {
    const MARK: &str = "… (cut)";
    if text.len() > MAX_ERROR_LEN {
        let mut cut = MAX_ERROR_LEN - MARK.len();
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(MARK);
    }
    text
}

/// The text of a handler's error, bounded by [`bounded_error`]. An error whose
/// `Display` panics (a host's bug) is kept as such a failure, not let through to
/// unwind the delivery or the worker (which would leave the claim or the event to
/// run out its lease).
pub(crate) fn error_text(error: &dyn fmt::Display) -> String {
    let text = std::panic::catch_unwind(AssertUnwindSafe(|| error.to_string()));
    bounded_error(text.unwrap_or_else(|panic| {
        format!(
            "the handler's error could not be written: its Display panicked: {}",
            panic_message(&*panic)
        )
    }))
}

/// What a handler returns when it fails. Its error's text is kept (in the
/// record's history, the outcome, the log) up to [`MAX_ERROR_LEN`] bytes.
#[derive(Debug)]
#[non_exhaustive]
pub enum HandlerError {
    /// Worth retrying: the claim is released and the failure counted.
    Retryable(crate::store::BoxError),
    /// Retrying cannot help: answered 200 with the alert hook.
    Permanent(crate::store::BoxError),
}

impl HandlerError {
    /// A retryable failure.
    pub fn retryable(e: impl Into<crate::store::BoxError>) -> Self {
        Self::Retryable(e.into())
    }

    /// A permanent failure.
    pub fn permanent(e: impl Into<crate::store::BoxError>) -> Self {
        Self::Permanent(e.into())
    }
}

/// Any error turns into a retryable failure, so `?` works in handlers. Its text is
/// logged and stored in the record's history: an error that quotes the payload (as
/// serde's do) puts payload contents there too.
impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(e: E) -> Self {
        Self::Retryable(Box::new(e))
    }
}

/// A configuration the builder refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No store was given.
    #[error("no store configured")]
    NoStore,
    /// No verifier was given (use `NoVerification` explicitly to turn it off).
    #[error("no verifier configured; use NoVerification to turn verification off")]
    NoVerifier,
    /// Retention must cover at least one lease.
    #[error("retention ({retention:?}) is shorter than the lease ({lease:?})")]
    RetentionBelowLease {
        /// The configured retention.
        retention: Duration,
        /// The configured lease.
        lease: Duration,
    },
    /// Retention must outlast a replay the signature still accepts.
    #[error(
        "retention ({retention:?}) is shorter than twice the verifier's tolerance \
         ({tolerance:?}): a replay could outlive its id"
    )]
    RetentionBelowTolerance {
        /// The configured retention.
        retention: Duration,
        /// The verifier's tolerance for signed timestamps.
        tolerance: Duration,
    },
    /// A duration is zero or too large to represent.
    #[error("{0} must be positive and below 100 years")]
    BadDuration(&'static str),
    /// `escalate_after` must be at least 1.
    #[error("escalate_after must be at least 1")]
    ZeroEscalation,
    /// The namespace is empty, longer than 64 bytes or holds control characters.
    #[error("namespace must be 1 to 64 bytes without control characters")]
    BadNamespace,
    /// The body limit is zero.
    #[error("max_body must be positive")]
    ZeroBodyLimit,
    /// The operation needs an inbox (see [`WebhookGuardBuilder::inbox`]).
    #[error("no inbox configured")]
    NoInbox,
}

/// Builds a [`WebhookGuard`]. See [`WebhookGuard::builder`].
#[must_use]
#[derive(Debug)]
pub struct WebhookGuardBuilder {
    store: Option<Arc<DynProcessedStore>>,
    verifier: Option<Arc<dyn Verifier>>,
    clock: Arc<dyn Clock>,
    hooks: Arc<dyn Hooks>,
    namespace: String,
    event_id: EventId,
    lease: Duration,
    retention: Option<Duration>,
    escalate_after: Option<u32>,
    max_body: usize,
    in_progress: InProgressAnswer,
    fingerprint: Option<bool>,
    status: [Option<StatusCode>; KINDS],
    inbox: Option<Arc<dyn InboxStore>>,
    ordering: Option<Arc<dyn OrderingStore>>,
    reconciler: Option<Arc<dyn Reconciler>>,
    meta: Option<MetaExtractor>,
}

const KINDS: usize = OutcomeKind::ALL.len();

impl WebhookGuardBuilder {
    /// The inbox for [`WebhookGuard::accept`] and [`WebhookGuard::worker`].
    pub fn inbox(mut self, inbox: Arc<dyn InboxStore>) -> Self {
        self.inbox = Some(inbox);
        self
    }

    /// The ordering store: with it, an event older than one already seen for its
    /// target object and family (see [`EventMeta`]) does not run the handler: it is
    /// answered [`Outcome::Stale`] and the stale hook is called.
    pub fn ordering(mut self, ordering: Arc<dyn OrderingStore>) -> Self {
        self.ordering = Some(ordering);
        self
    }

    /// The reconciler, called (in the background) when an id is escalated or fails
    /// permanently, when a handler succeeded but its lease was taken over meanwhile
    /// or a newer event of its object was seen while it ran, and by
    /// [`WebhookGuard::reconcile_stale`].
    pub fn reconciler(mut self, reconciler: Arc<dyn Reconciler>) -> Self {
        self.reconciler = Some(reconciler);
        self
    }

    /// Where the event's type, creation time and target object are in the body
    /// (default: where the verifier's provider puts them — Stripe and Jamm presets
    /// know — else nowhere). The ordering guard, the inbox and reconciliation use it.
    /// [`WebhookGuard::handle`], [`WebhookGuard::handle_owned`] and
    /// [`WebhookGuard::begin`] (and the framework integrations, built on them) read
    /// it only once a delivery has claimed its id, and only when the guard has an
    /// ordering store or a reconciler, its only readers there: duplicates, conflicts,
    /// deliveries in progress elsewhere and the deliveries of a guard with neither
    /// are not scanned for it.
    /// [`WebhookGuard::accept`] reads it for every verified delivery (the inbox
    /// stores it with the event).
    pub fn event_meta(mut self, meta: MetaExtractor) -> Self {
        self.meta = Some(meta);
        self
    }

    /// The store (required).
    pub fn store(mut self, store: impl ProcessedStore) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// The store, already shared.
    pub fn shared_store(mut self, store: Arc<DynProcessedStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// The signature verifier (required; [`NoVerification`](crate::verify::NoVerification)
    /// turns verification off explicitly).
    pub fn verifier(mut self, verifier: impl Verifier) -> Self {
        self.verifier = Some(Arc::new(verifier));
        self
    }

    /// The clock (default: the system clock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Hooks called on claims, duplicates, conflicts, failures, escalations and
    /// unrecorded completions.
    pub fn hooks(mut self, hooks: impl Hooks) -> Self {
        self.hooks = Arc::new(hooks);
        self
    }

    /// The namespace keys live in (default `"default"`): one per provider or endpoint,
    /// so two providers' ids never collide.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Where the event id is (default: [`EventId::FromVerifier`]).
    pub fn event_id(mut self, source: EventId) -> Self {
        self.event_id = source;
        self
    }

    /// How long a claim holds before another delivery may take it over (default
    /// [`DEFAULT_LEASE`]). Choose it longer than your handler's slowest run; long
    /// handlers can renew with [`Event::renew_lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long records are kept (default: [`DEFAULT_RETENTION`], or the verifier's
    /// retry window if longer). It must cover the provider's whole retry window, or a
    /// late retry runs the handler again.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// After how many failures an id is escalated (default 5, or the verifier's
    /// [`deliveries`](Verifier::deliveries) if fewer: GitHub delivers once, Slack and
    /// Linear four times, and an event failing on each of them would otherwise never
    /// be escalated).
    pub fn escalate_after(mut self, failures: u32) -> Self {
        self.escalate_after = Some(failures);
        self
    }

    /// The largest body accepted, in bytes (default 1 MiB).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// How to answer a delivery whose id another delivery holds.
    pub fn in_progress_answer(mut self, answer: InProgressAnswer) -> Self {
        self.in_progress = answer;
        self
    }

    /// Whether to answer [`Outcome::Conflict`] when an id comes back with another body
    /// (compared by SHA-256). Default: on, unless the verifier says its provider
    /// changes the body between retries (Linear). Off, the body is not hashed and the
    /// record keeps [`Fingerprint::UNKNOWN`](crate::store::Fingerprint::UNKNOWN).
    /// Guards of either setting may share a store: a fingerprint one of them did
    /// not compare is never a conflict, and a failed event is run again by either.
    pub fn detect_conflicts(mut self, on: bool) -> Self {
        self.fingerprint = Some(on);
        self
    }

    /// Overrides the HTTP status answered for `kind`.
    pub fn status(mut self, kind: OutcomeKind, status: StatusCode) -> Self {
        self.status[kind.index()] = Some(status);
        self
    }

    /// Builds the guard.
    ///
    /// # Errors
    /// [`ConfigError`] for a missing store or verifier, a retention below the lease
    /// or below twice the verifier's tolerance, a zero duration, threshold or body
    /// limit, a duration past a century, or a bad namespace.
    pub fn build(self) -> Result<WebhookGuard, ConfigError> {
        let store = self.store.ok_or(ConfigError::NoStore)?;
        let verifier = self.verifier.ok_or(ConfigError::NoVerifier)?;
        let fingerprint = self
            .fingerprint
            .unwrap_or(!verifier.body_changes_on_retry());
        let verifier_meta = verifier.event_meta();
        let retention = self
            .retention
            .unwrap_or_else(|| DEFAULT_RETENTION.max(verifier.retry_window().unwrap_or_default()));
        let lease_delta = delta(self.lease, "lease")?;
        let retention_delta = delta(retention, "retention")?;
        if retention < self.lease {
            return Err(ConfigError::RetentionBelowLease {
                retention,
                lease: self.lease,
            });
        }
        if let Some(tolerance) = verifier.tolerance() {
            // A signed time may lie a tolerance ahead of the clock and be accepted
            // until a tolerance behind it.
            if retention < tolerance.saturating_mul(2) {
                return Err(ConfigError::RetentionBelowTolerance {
                    retention,
                    tolerance,
                });
            }
        }
        let escalate_after = self.escalate_after.unwrap_or_else(|| {
            DEFAULT_ESCALATE_AFTER.min(verifier.deliveries().unwrap_or(u32::MAX).max(1))
        });
        if escalate_after == 0 {
            return Err(ConfigError::ZeroEscalation);
        }
        if self.max_body == 0 {
            return Err(ConfigError::ZeroBodyLimit);
        }
        let ns = &self.namespace;
        if ns.is_empty() || ns.len() > 64 || ns.chars().any(char::is_control) {
            return Err(ConfigError::BadNamespace);
        }
        Ok(WebhookGuard {
            inner: Arc::new(Inner {
                store,
                verifier,
                clock: self.clock,
                safe_hooks: PanicSafe::wrap(self.hooks.clone()),
                hooks: self.hooks,
                namespace: self.namespace,
                event_id: self.event_id,
                lease: self.lease,
                lease_delta,
                retention,
                retention_delta,
                escalate_after,
                max_body: self.max_body,
                in_progress: self.in_progress,
                fingerprint,
                status: self.status,
                inbox: self.inbox,
                ordering: self.ordering,
                reconciler: self.reconciler,
                meta: self
                    .meta
                    .unwrap_or_else(|| verifier_meta.unwrap_or_default()),
                lost_searches: Arc::default(),
                dropped_searches: Arc::default(),
            }),
        })
    }
}

fn delta(d: Duration, what: &'static str) -> Result<TimeDelta, ConfigError> {
    if d.is_zero() || d > crate::CENTURY {
        return Err(ConfigError::BadDuration(what));
    }
    TimeDelta::from_std(d).map_err(|_| ConfigError::BadDuration(what))
}

/// The guard: one per endpoint, built at start-up, cloned into every request.
///
/// Cloning is cheap (an [`Arc`] inside).
#[derive(Clone, Debug)]
pub struct WebhookGuard {
    inner: Arc<Inner>,
}

// Aligned to 128 bytes so that `Arc`'s counters, which every claimed delivery
// changes (its `ClaimState` holds a clone of the guard), share no cache line with
// the fields every delivery reads: on two cores, each count change would evict
// them from the other core's cache.
#[repr(align(128))]
struct Inner {
    store: Arc<DynProcessedStore>,
    verifier: Arc<dyn Verifier>,
    clock: Arc<dyn Clock>,
    /// The hooks as given (a worker or sweeper made from the guard wraps them itself).
    hooks: Arc<dyn Hooks>,
    /// What the guard calls: `hooks`, panic-safe.
    safe_hooks: Arc<dyn Hooks>,
    namespace: String,
    event_id: EventId,
    lease: Duration,
    lease_delta: TimeDelta,
    retention: Duration,
    retention_delta: TimeDelta,
    escalate_after: u32,
    max_body: usize,
    in_progress: InProgressAnswer,
    fingerprint: bool,
    status: [Option<StatusCode>; KINDS],
    inbox: Option<Arc<dyn InboxStore>>,
    ordering: Option<Arc<dyn OrderingStore>>,
    reconciler: Option<Arc<dyn Reconciler>>,
    meta: MetaExtractor,
    /// Background searches for claims the store did not answer, running now (at
    /// most [`MAX_SEARCHES`]).
    lost_searches: Arc<AtomicUsize>,
    /// The same for claims whose delivery was dropped: a slot count of their own,
    /// as such a search may run for a whole lease (one whose claim was answered
    /// `Existing` never finds its token) and must not starve the others.
    dropped_searches: Arc<AtomicUsize>,
}

/// How many claims the store did not answer are looked for at once, per guard, and
/// as many whose delivery was dropped: during an outage every delivery fails so,
/// and most of those claims never reached the store; when the store is slow,
/// senders hang up. The searches must not pile up against it.
const MAX_SEARCHES: usize = 64;

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookGuard")
            .field("namespace", &self.namespace)
            .field("store", &self.store)
            .field("verifier", &self.verifier)
            .field("event_id", &self.event_id)
            .field("lease", &self.lease)
            .field("retention", &self.retention)
            .field("escalate_after", &self.escalate_after)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

/// A delivery that passed verification, with its event id.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifiedDelivery {
    /// The event id.
    pub id: String,
    /// The signed timestamp, where the scheme signs one.
    pub signed_at: Option<DateTime<Utc>>,
    /// Type, creation time and target object, as configured with
    /// [`WebhookGuardBuilder::event_meta`].
    pub meta: EventMeta,
}

/// The answer to [`WebhookGuard::begin`]: either this delivery won the claim, or
/// there is already an outcome (duplicate, in progress, rejected, ...).
#[derive(Debug)]
#[must_use]
pub enum Begin<'a> {
    /// This delivery holds the claim: run the work, then call
    /// [`Claimed::complete`] or [`Claimed::fail`].
    Claimed(Claimed<'a>),
    /// Nothing to run: answer this outcome.
    Done(Outcome),
}

/// The event handed to a handler. It borrows the body for `'a` and shares the claim,
/// so a handler can be any closure returning an `async move` block.
#[derive(Clone)]
pub struct Event<'a> {
    body: &'a [u8],
    claim: Arc<ClaimState>,
}

impl fmt::Debug for Event<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("id", &self.claim.id)
            .field("attempt", &self.claim.record.attempts)
            .field("body", &crate::BodyLen(self.body.len()))
            .finish()
    }
}

impl<'a> Event<'a> {
    /// The event id.
    pub fn id(&self) -> &str {
        &self.claim.id
    }

    /// The raw body, exactly as received and verified.
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// Which claim of this id this is (1 for the first claim).
    pub fn attempt(&self) -> u32 {
        self.claim.record.attempts
    }

    /// Parses the body as JSON.
    ///
    /// # Errors
    /// The parser's error.
    pub fn json<T: serde::Deserialize<'a>>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(self.body)
    }

    /// Extends this claim's lease by the guard's lease duration from now.
    ///
    /// # Errors
    /// [`LeaseError::Lost`] if another delivery took the claim over, or the store's error.
    pub async fn renew_lease(&self) -> Result<(), LeaseError> {
        self.claim.renew().await
    }
}

/// An [`Event`] that owns its body: what [`WebhookGuard::handle_owned`] and the
/// framework integrations hand to a handler, so its future can be `'static`.
///
/// Cloning is cheap (the body is a [`Bytes`], the claim is shared).
#[derive(Clone)]
pub struct OwnedEvent {
    body: Bytes,
    claim: Arc<ClaimState>,
}

impl fmt::Debug for OwnedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedEvent")
            .field("id", &self.claim.id)
            .field("attempt", &self.claim.record.attempts)
            .field("body", &crate::BodyLen(self.body.len()))
            .finish()
    }
}

impl OwnedEvent {
    /// The event id.
    pub fn id(&self) -> &str {
        &self.claim.id
    }

    /// The raw body, exactly as received and verified.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The raw body as [`Bytes`] (a cheap clone).
    pub fn bytes(&self) -> Bytes {
        self.body.clone()
    }

    /// Which claim of this id this is (1 for the first claim).
    pub fn attempt(&self) -> u32 {
        self.claim.record.attempts
    }

    /// Parses the body as JSON.
    ///
    /// # Errors
    /// The parser's error.
    pub fn json<'de, T: serde::Deserialize<'de>>(&'de self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// Extends this claim's lease by the guard's lease duration from now.
    ///
    /// # Errors
    /// [`LeaseError::Lost`] if another delivery took the claim over, or the store's error.
    pub async fn renew_lease(&self) -> Result<(), LeaseError> {
        self.claim.renew().await
    }
}

/// Why a lease could not be renewed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The lease was taken over or the record finished: stop working on this claim.
    #[error("lease lost")]
    Lost,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug)]
struct ClaimState {
    guard: WebhookGuard,
    id: String,
    token: FencingToken,
    record: Record,
    meta: EventMeta,
    /// Whether the event takes part in ordering: an ordering store is set and the
    /// event has an object and a plausible `created_at` (decided at arrival).
    ordered: bool,
    /// When the delivery began (before verification).
    started: Instant,
    /// When the claim was won: the handler's clock starts here.
    claimed_at: Instant,
}

impl ClaimState {
    /// The finish that ends this claim in `state` at `now`, keeping its failure
    /// count and history.
    fn finish_as(&self, state: RecordState, now: DateTime<Utc>) -> Finish<'_> {
        Finish {
            state,
            failures: self.record.failures,
            history: &self.record.history,
            now,
            expires_at: crate::later(now, self.guard.inner.retention_delta),
        }
    }

    /// The event's object and `created_at`, when it takes part in ordering.
    fn object_key(&self) -> Option<(ObjectKey<'_>, DateTime<Utc>)> {
        let namespace = &self.guard.inner.namespace;
        self.ordered
            .then(|| crate::ordering::object_key(namespace, &self.meta))
            .flatten()
    }

    /// With an ordering store: `Some(Stale)` (the claim finished as completed) when a
    /// newer event was already seen for the object, `Some(StoreUnavailable)` when the
    /// ordering store failed (the claim released), `None` to run the handler.
    async fn check_order(&self, now: DateTime<Utc>) -> Option<Outcome> {
        let ordering = self.guard.inner.ordering.as_ref()?;
        let (key, created_at) = self.object_key()?;
        let newest = match ordering.observe(key, created_at, now).await {
            Ok(Freshness::Fresh) => return None,
            Ok(Freshness::Stale { newest }) => newest,
            Err(error) => {
                // Our outage, not the handler's failure: release the claim without
                // counting a failure towards escalation.
                let release = self.finish_as(RecordState::Failed, now);
                if let Err(e) = store(&self.guard.inner)
                    .finish(self.key(), self.token, &release)
                    .await
                {
                    // Released in the background, or the lease would run out and
                    // count as a failure.
                    tracing::warn!(id = %self.id, error = %e, "could not release a claim");
                    self.finish_in_background(
                        RecordState::Failed,
                        self.record.failures,
                        &self.record.history,
                    );
                }
                return Some(Outcome::StoreUnavailable {
                    id: Some(self.id.clone()),
                    error,
                });
            }
        };
        let finish = self.finish_as(RecordState::Completed, now);
        let finished = store(&self.guard.inner)
            .finish(self.key(), self.token, &finish)
            .await;
        if let Err(e) = finished {
            // Recorded in the background: a claim left to run out its lease would
            // count as a failure, and a resend could escalate an event that never ran.
            tracing::warn!(id = %self.id, error = %e, "could not record a stale event");
            self.finish_in_background(
                RecordState::Completed,
                self.record.failures,
                &self.record.history,
            );
        }
        self.guard.inner.safe_hooks.on_stale(self.key(), &self.meta);
        Some(Outcome::Stale {
            id: self.id.clone(),
            newest,
        })
    }

    /// Settles the event's object; `false` only when the ordering store answers that
    /// a newer event of the object was seen since, or that another one created at
    /// the same time settled it first.
    async fn settle_object(&self, status: ObjectStatus) -> bool {
        let Some(ordering) = &self.guard.inner.ordering else {
            return true;
        };
        let Some((key, created_at)) = self.object_key() else {
            return true;
        };
        let now = self.guard.inner.clock.now();
        match ordering.settle_object(key, created_at, status, now).await {
            Ok(settled) => settled,
            Err(e) => {
                tracing::warn!(id = %self.id, error = %e, "could not settle object state");
                if status == ObjectStatus::Failed {
                    // A failure must reach the ledger, or `reconcile_stale` never
                    // lists the object should the reconciler fail too.
                    crate::ordering::settle_failed_later(
                        ordering.clone(),
                        self.guard.inner.clock.clone(),
                        key,
                        created_at,
                        &self.id,
                    );
                }
                true
            }
        }
    }

    fn reconcile(&self, reason: ReconcileReason) {
        let request = ReconcileRequest::new(
            self.guard.inner.namespace.clone(),
            Some(self.id.clone()),
            self.meta.clone(),
            reason,
        );
        // This event settled its object failed: once the reconciler has settled
        // it, mark it applied, as `reconcile_stale` does (it would ask again).
        // Other reasons leave the object to the event that holds it.
        let failed = matches!(
            reason,
            ReconcileReason::Escalated | ReconcileReason::PermanentFailure
        );
        let mark = (failed && self.object_key().is_some()).then_some(self.guard.inner.clock.now());
        self.guard.spawn_reconcile(request, mark);
    }

    fn key(&self) -> Key<'_> {
        Key::new(&self.guard.inner.namespace, &self.id)
    }

    async fn renew(&self) -> Result<(), LeaseError> {
        let inner = &self.guard.inner;
        let now = inner.clock.now();
        let fence = store(inner)
            .renew(
                self.key(),
                self.token,
                crate::later(now, inner.lease_delta),
                crate::later(now, inner.retention_delta),
            )
            .await?;
        match fence {
            Fence::Applied => Ok(()),
            Fence::LeaseLost => Err(LeaseError::Lost),
        }
    }
}

/// A won claim. Finish it with [`Claimed::complete`] or [`Claimed::fail`]; dropping
/// it unfinished releases the claim as a failed attempt (in the background, with the
/// `tokio` feature and a runtime; otherwise the lease simply runs out).
#[must_use = "a claim must be completed or failed"]
pub struct Claimed<'a> {
    state: Option<Arc<ClaimState>>,
    body: &'a [u8],
}

impl fmt::Debug for Claimed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claimed")
            .field("id", &self.state.as_ref().map(|s| s.id.as_str()))
            .field("body", &crate::BodyLen(self.body.len()))
            .finish()
    }
}

impl<'a> Claimed<'a> {
    /// The event id.
    pub fn id(&self) -> &str {
        &self.state().id
    }

    /// The event to hand to the work.
    pub fn event(&self) -> Event<'a> {
        Event {
            body: self.body,
            claim: self.state().clone(),
        }
    }

    /// The event, owning `body`, which must be the body this claim was made with.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn owned_event(&self, body: Bytes) -> OwnedEvent {
        debug_assert_eq!(&body[..], self.body);
        OwnedEvent {
            body,
            claim: self.state().clone(),
        }
    }

    fn state(&self) -> &Arc<ClaimState> {
        self.state
            .as_ref()
            .expect("a claim is finished only by value")
    }

    fn take(mut self) -> Arc<ClaimState> {
        self.state
            .take()
            .expect("a claim is finished only by value")
    }

    /// Records success: [`Outcome::Processed`], or [`Outcome::Unrecorded`] if the
    /// lease was lost or the store failed.
    ///
    /// The success is the future's from the call on: dropped before the store has
    /// recorded it, even before its first poll (a `select!` whose other branch won,
    /// the sender hung up, a timeout), the future leaves the recording to the
    /// background (with the `tokio` feature and a runtime), or a redelivery after
    /// the lease would run the handler again.
    pub fn complete(self) -> impl Future<Output = Outcome> + Send + 'static {
        let state = self.take();
        let handler_elapsed = state.claimed_at.elapsed();
        let pending = RecordOnDrop(Some(state), handler_elapsed);
        async move {
            let state = pending.state();
            let inner = &state.guard.inner;
            let now = inner.clock.now();
            let finish = state.finish_as(RecordState::Completed, now);
            let result = store(inner).finish(state.key(), state.token, &finish).await;
            let result = state.own_fence(result, RecordState::Completed).await;
            Self::completed(pending.disarm(), result, handler_elapsed).await
        }
    }

    /// What [`Claimed::complete`] answers once the store answered.
    async fn completed(
        state: Arc<ClaimState>,
        result: Result<Fence, StoreError>,
        handler_elapsed: Duration,
    ) -> Outcome {
        let outcome = match result {
            Ok(Fence::Applied) if state.ordered => {
                // The object's settle, the reconcile it may ask for and the report
                // finish even if the delivery is dropped meanwhile. Boxed: only for
                // an event that takes part in ordering.
                return Detachable::new(async move {
                    state.settle_applied().await;
                    let outcome = Outcome::Processed {
                        id: state.id.clone(),
                    };
                    state.report(&outcome, handler_elapsed);
                    outcome
                })
                .await;
            }
            Ok(Fence::Applied) => {
                // The handler's `Event` is gone by now: the id and the guard move out,
                // uncopied (a clone of the guard would write its reference count, a
                // cache line every thread of the host shares).
                let (guard, id, attempts, started) = match Arc::try_unwrap(state) {
                    Ok(ClaimState {
                        guard,
                        id,
                        record,
                        started,
                        ..
                    }) => (guard, id, record.attempts, started),
                    Err(state) => (
                        state.guard.clone(),
                        state.id.clone(),
                        state.record.attempts,
                        state.started,
                    ),
                };
                let outcome = Outcome::Processed { id };
                guard.report(&outcome, Some(attempts), started, Some(handler_elapsed));
                return outcome;
            }
            Ok(Fence::LeaseLost) => {
                // The delivery that took the lease over may run the handler again.
                state.reconcile(ReconcileReason::LeaseLost);
                state.unrecorded(Unrecorded::LeaseLost)
            }
            Err(e) => {
                // Reported here; the background recording reports nothing more.
                state.clone().record_completion_later(None);
                state.unrecorded(Unrecorded::Store(e))
            }
        };
        state.report(&outcome, handler_elapsed);
        outcome
    }

    /// Records a failure: retryable ones are released and counted (and escalated at
    /// the threshold), permanent ones end the id.
    ///
    /// As with [`Claimed::complete`], the failure is the future's from the call on:
    /// dropped unfinished, even before its first poll, the future finishes its work
    /// in the background (with the `tokio` feature and a runtime).
    pub fn fail(self, error: HandlerError) -> impl Future<Output = Outcome> + Send + 'static {
        let failure = match error {
            HandlerError::Retryable(e) => Failure::Retryable(error_text(&e)),
            HandlerError::Permanent(e) => Failure::Permanent(error_text(&e)),
        };
        let body = self.body;
        let state = self.take();
        let handler_elapsed = state.claimed_at.elapsed();
        // The recording, its hooks, the object's settle and the report finish even if
        // the delivery is dropped meanwhile (the sender hung up, a timeout); otherwise
        // the claim would hold its lease to the end. The body is copied for that
        // (an escalation shows it to its hook): a failure's cost, not a success's.
        let body = body.to_vec();
        Detachable::new(async move {
            let outcome = state.record_failure(&body, failure).await;
            state.report(&outcome, handler_elapsed);
            outcome
        })
    }
}

/// Armed while a delivery awaits its claim or its ordering check, before a
/// [`Claimed`] exists: if the delivery's future is dropped there, a claim the store
/// granted is released in the background (with the `tokio` feature and a runtime),
/// fenced by its token and without counting a failure, since no handler ran. A
/// claim still in flight is waited for until its lease would have run out. A claim
/// whose answer was lost ([`ReleaseOnDrop::lost`]) is released the same way.
#[cfg_attr(not(feature = "tokio"), allow(dead_code))]
struct ReleaseOnDrop<'g> {
    guard: &'g WebhookGuard,
    id: &'g str,
    token: FencingToken,
    /// When the claim was made: its request's `now`, or the time the store kept.
    claimed_at: DateTime<Utc>,
    armed: bool,
}

impl<'g> ReleaseOnDrop<'g> {
    fn arm(
        guard: &'g WebhookGuard,
        id: &'g str,
        token: FencingToken,
        claimed_at: DateTime<Utc>,
    ) -> Self {
        Self {
            guard,
            id,
            token,
            claimed_at,
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }

    /// The store could not be reached: the claim may still have been applied (a
    /// timeout after the request was sent, a batch answered late), with a token no
    /// delivery holds. Released in the background, as for a dropped delivery.
    /// At most [`MAX_SEARCHES`] at once; past that, such a claim (if it was
    /// applied at all) holds its lease to the end.
    fn lost(mut self) {
        self.armed = false;
        let Some(slot) = self.search_slot(&self.guard.inner.lost_searches) else {
            tracing::debug!(id = %self.id, "claim not answered; too many searches already, not looked for");
            return;
        };
        if !self.release(Search::Lost { _slot: slot }) {
            return;
        }
        tracing::debug!(id = %self.id, "claim not answered; looking for it in the background in case it was applied");
    }

    /// One of the [`MAX_SEARCHES`] slots counted by `searches`, if one is free.
    fn search_slot(&self, searches: &Arc<AtomicUsize>) -> Option<SearchSlot> {
        searches
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_SEARCHES).then_some(n + 1)
            })
            .ok()?;
        Some(SearchSlot(searches.clone()))
    }

    /// Spawns the release; whether it was (with the `tokio` feature and a runtime).
    #[cfg_attr(not(feature = "tokio"), allow(unused_variables))]
    fn release(&self, search: Search) -> bool {
        #[cfg(feature = "tokio")]
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (guard, id, token) = (self.guard.clone(), self.id.to_owned(), self.token);
            let claimed_at = self.claimed_at;
            rt.spawn(async move { guard.release_unrun(&id, token, claimed_at, search).await });
            return true;
        }
        false
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        tracing::warn!(id = %self.id, "delivery dropped while claiming; releasing the claim in the background");
        let slot = self.search_slot(&self.guard.inner.dropped_searches);
        self.release(Search::Dropped { _slot: slot });
    }
}

/// The waits of a background retry: the first `first` (zero: try at once), then
/// doubling (from 25 ms) up to `cap`, until `within` has passed (a `within` of zero:
/// the first try only). On tokio's clock, as the waits: a paused test clock must not
/// spin a retry loop.
#[cfg(feature = "tokio")]
pub(crate) struct Backoff {
    deadline: tokio::time::Instant,
    wait: Duration,
    cap: Duration,
    tried: bool,
}

#[cfg(feature = "tokio")]
impl Backoff {
    pub(crate) fn new(first: Duration, cap: Duration, within: Duration) -> Self {
        Self {
            deadline: tokio::time::Instant::now() + within,
            wait: first,
            cap,
            tried: false,
        }
    }

    /// Waits for the next try (never past the deadline); `false` once the deadline
    /// has passed, with no try left. The first try is always made.
    pub(crate) async fn wait(&mut self) -> bool {
        let left = self
            .deadline
            .saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() && self.tried {
            return false;
        }
        self.tried = true;
        tokio::time::sleep(self.wait.min(left)).await;
        self.wait = (self.wait * 2).clamp(Duration::from_millis(25), self.cap);
        true
    }
}

/// How a finish recorded in the background ended.
#[cfg(feature = "tokio")]
enum Late {
    /// Recorded, by this try or by an earlier one whose answer was lost.
    Recorded,
    /// Another claim took the record over first.
    TakenOver,
    /// The store kept failing until the deadline.
    GaveUp(StoreError),
}

/// Why a claim is released in the background: how long to look for it.
#[derive(Debug)]
enum Search {
    /// Its delivery was dropped: looked for at once, then, holding one of the
    /// guard's [`MAX_SEARCHES`] slots for dropped claims, up to the end of its lease
    /// (without a free slot, only at once: a slow store that many senders hang up
    /// on is not polled once per dropped delivery).
    Dropped {
        /// Given back when the search ends.
        _slot: Option<SearchSlot>,
    },
    /// The store did not answer it: looked for from a second on, for up to 30 s,
    /// holding one of the guard's [`MAX_SEARCHES`] slots.
    Lost {
        /// Given back when the search ends.
        _slot: SearchSlot,
    },
}

/// One of the guard's slots for searches of unanswered or dropped claims, given
/// back on drop.
#[derive(Debug)]
struct SearchSlot(Arc<AtomicUsize>);

impl Drop for SearchSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A handler's failure, as the guard records it.
#[derive(Debug)]
enum Failure {
    Retryable(String),
    Permanent(String),
}

/// Work that must finish even if the delivery's future is dropped: polled in place,
/// inside the delivery's span, and spawned (with the `tokio` feature and a runtime)
/// if dropped unfinished, so it is never run twice nor left half done.
struct Detachable<T: Send + 'static>(Option<Pin<Box<dyn Future<Output = T> + Send>>>);

impl<T: Send + 'static> Detachable<T> {
    fn new(work: impl Future<Output = T> + Send + 'static) -> Self {
        Self(Some(Box::pin(work.instrument(tracing::Span::current()))))
    }
}

impl<T: Send + 'static> Future for Detachable<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        // Out while polled: work that panics is dropped as the panic unwinds, never
        // spawned to be polled again.
        let mut work = self
            .0
            .take()
            .expect("a Detachable is not polled after it finished");
        let out = work.as_mut().poll(cx);
        if out.is_pending() {
            self.0 = Some(work);
        }
        out
    }
}

impl<T: Send + 'static> Drop for Detachable<T> {
    fn drop(&mut self) {
        let Some(work) = self.0.take() else {
            return;
        };
        #[cfg(feature = "tokio")]
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            tracing::debug!("delivery dropped mid-way; finishing its work in the background");
            rt.spawn(async move {
                work.await;
            });
            return;
        }
        tracing::warn!("delivery dropped mid-way without a runtime; its unfinished work is lost");
        drop(work);
    }
}

/// Armed from the call of [`Claimed::complete`] until the store answered: if its
/// future is dropped before, the handler's success is recorded in the background
/// ([`ClaimState::record_completion_later`]).
struct RecordOnDrop(Option<Arc<ClaimState>>, Duration);

impl RecordOnDrop {
    fn state(&self) -> &Arc<ClaimState> {
        self.0.as_ref().expect("armed until disarmed")
    }

    fn disarm(mut self) -> Arc<ClaimState> {
        self.0.take().expect("armed until disarmed")
    }
}

impl Drop for RecordOnDrop {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            tracing::warn!(id = %state.id, "delivery dropped while recording its success; recording it in the background");
            state.record_completion_later(Some(self.1));
        }
    }
}

impl ClaimState {
    /// After the store failed to record a successful run: keeps trying in the
    /// background (with the `tokio` feature and a runtime), fenced by this claim's
    /// token so it can never overwrite a newer holder, until the completion is
    /// recorded, the fence refuses it, or the lease (at least a minute) has passed.
    /// Without this, a store that comes back leaves the record `InProgress`, and a
    /// redelivery after the lease runs the handler a second time.
    ///
    /// `report` is the handler's time when the delivery was dropped before reporting:
    /// the final outcome (processed, or unrecorded) is then reported here.
    fn record_completion_later(self: Arc<Self>, report: Option<Duration>) {
        #[cfg(feature = "tokio")]
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let span = tracing::Span::current();
            rt.spawn(
                async move {
                    let unrecorded = self.record_completion().await;
                    // A delivery that reported already called its hooks: once only.
                    if let Some(handler) = report {
                        let outcome = match unrecorded {
                            None => Outcome::Processed {
                                id: self.id.clone(),
                            },
                            Some(reason) => self.unrecorded(reason),
                        };
                        self.report(&outcome, handler);
                    }
                }
                .instrument(span),
            );
        }
        #[cfg(not(feature = "tokio"))]
        let _ = report;
    }

    /// The work of [`ClaimState::record_completion_later`]: `None` once recorded,
    /// else why not.
    #[cfg(feature = "tokio")]
    async fn record_completion(&self) -> Option<Unrecorded> {
        let (state, record) = (RecordState::Completed, &self.record);
        let late = (self.guard)
            .finish_later(
                &self.id,
                self.token,
                state,
                record.failures,
                &record.history,
            )
            .await;
        match late {
            Late::Recorded => {
                tracing::info!(id = %self.id, "completion recorded late");
                self.settle_applied().await;
                None
            }
            Late::TakenOver => {
                // The delivery that took the lease over may run the handler again.
                tracing::warn!(id = %self.id, "completion not recorded late: the claim is no longer held");
                self.reconcile(ReconcileReason::LeaseLost);
                Some(Unrecorded::LeaseLost)
            }
            Late::GaveUp(error) => {
                tracing::warn!(id = %self.id, %error, "completion still not recorded; giving up");
                Some(Unrecorded::Store(error))
            }
        }
    }

    /// Settles the object of a success; when a newer event of the object was seen
    /// while the handler ran, or another one created at the same time settled it
    /// first, asks the reconciler.
    async fn settle_applied(&self) {
        if !self.settle_object(ObjectStatus::Applied).await {
            self.reconcile(ReconcileReason::Overtaken);
        }
    }

    fn unrecorded(&self, reason: Unrecorded) -> Outcome {
        self.guard
            .inner
            .safe_hooks
            .on_unrecorded(self.key(), &reason);
        Outcome::Unrecorded {
            id: self.id.clone(),
            reason,
        }
    }

    fn report(&self, outcome: &Outcome, handler: Duration) {
        self.guard.report(
            outcome,
            Some(self.record.attempts),
            self.started,
            Some(handler),
        );
    }

    fn history_with(&self, now: DateTime<Utc>, error: String) -> Vec<FailureNote> {
        let mut history = self.record.history.clone();
        // The oldest go (a store may hand back more than the limit).
        let over = (history.len() + 1).saturating_sub(HISTORY_LIMIT);
        history.drain(..over);
        history.push(FailureNote { at: now, error });
        history
    }

    async fn record_failure(&self, body: &[u8], failure: Failure) -> Outcome {
        match failure {
            Failure::Retryable(error) => self.fail_retryable(body, error).await,
            Failure::Permanent(error) => self.fail_permanent(error).await,
        }
    }

    async fn fail_retryable(&self, body: &[u8], error: String) -> Outcome {
        let inner = &self.guard.inner;
        let now = inner.clock.now();
        let failures = self.record.failures.saturating_add(1);
        let history = self.history_with(now, error.clone());
        if failures >= inner.escalate_after {
            return self.escalate(body, failures, &history, now).await;
        }
        let finish = Finish {
            state: RecordState::Failed,
            failures,
            history: &history,
            now,
            expires_at: crate::later(now, inner.retention_delta),
        };
        // Whatever the store says, the sender must retry. A release the store
        // missed is made in the background: held to the end of its lease, the
        // claim would answer the sender's early retries 409 and run nothing, so a
        // provider with few deliveries could give up before the failures reach
        // `escalate_after`. (Should it never land, the next claim after the lease
        // counts the failure.)
        let fence = store(inner).finish(self.key(), self.token, &finish).await;
        match self.own_fence(fence, RecordState::Failed).await {
            Ok(Fence::Applied) => {}
            Ok(Fence::LeaseLost) => return self.lease_lost_before(&error, "failure"),
            Err(e) => {
                tracing::warn!(id = %self.id, error = %e, "could not release a failed claim; retrying in the background");
                self.finish_in_background(RecordState::Failed, failures, &history);
            }
        }
        inner.safe_hooks.on_failure(self.key(), failures, &error);
        Outcome::RetryableFailure {
            id: self.id.clone(),
            failures,
            error,
        }
    }

    /// A failure that could not be recorded because another delivery took the
    /// lease over while the handler ran: the id is that delivery's now, so this one
    /// counts nothing, calls no hook and settles nothing; the sender retries, and
    /// the retry meets the other delivery's record.
    fn lease_lost_before(&self, error: &str, what: &str) -> Outcome {
        tracing::warn!(id = %self.id, %error, "lease lost before the {what} was recorded");
        Outcome::RetryableFailure {
            id: self.id.clone(),
            failures: self.record.failures,
            error: format!("lease lost before the {what} was recorded: {error}"),
        }
    }

    async fn fail_permanent(&self, error: String) -> Outcome {
        let inner = &self.guard.inner;
        let now = inner.clock.now();
        let history = self.history_with(now, error.clone());
        let finish = Finish {
            state: RecordState::PermanentFailure,
            failures: self.record.failures.saturating_add(1),
            history: &history,
            now,
            expires_at: crate::later(now, inner.retention_delta),
        };
        let state = RecordState::PermanentFailure;
        let fence = store(inner).finish(self.key(), self.token, &finish).await;
        match self.own_fence(fence, state).await {
            Ok(Fence::Applied) => {}
            Ok(Fence::LeaseLost) => return self.lease_lost_before(&error, "permanent failure"),
            Err(e) => {
                // Answered 200 all the same (the sender must not retry a permanent
                // failure): recorded in the background, or a redelivery after the
                // lease would run the handler again.
                tracing::warn!(id = %self.id, error = %e, "could not record a permanent failure; retrying in the background");
                self.finish_in_background(state, finish.failures, &history);
            }
        }
        inner.safe_hooks.on_permanent_failure(self.key(), &error);
        self.settle_object(ObjectStatus::Failed).await;
        self.reconcile(ReconcileReason::PermanentFailure);
        Outcome::PermanentFailure {
            id: self.id.clone(),
            error,
        }
    }

    async fn escalate(
        &self,
        body: &[u8],
        failures: u32,
        history: &[FailureNote],
        now: DateTime<Utc>,
    ) -> Outcome {
        let inner = &self.guard.inner;
        let finish = Finish {
            state: RecordState::Escalated,
            failures,
            history,
            now,
            expires_at: crate::later(now, inner.retention_delta),
        };
        let state = RecordState::Escalated;
        let fence = store(inner).finish(self.key(), self.token, &finish).await;
        match self.own_fence(fence, state).await {
            Err(e) => {
                // Escalated all the same (answered 200, the hook called): recorded in
                // the background, as a permanent failure is. Should that never land,
                // a redelivery after the lease escalates at its claim, and calls the
                // hook again.
                tracing::warn!(id = %self.id, error = %e, "could not record an escalation; retrying in the background");
                self.finish_in_background(state, failures, history);
                self.escalated(body, failures, history).await
            }
            Ok(Fence::Applied) => self.escalated(body, failures, history).await,
            // Someone else holds the id now; they will see the count.
            Ok(Fence::LeaseLost) => {
                let error = history.last().map_or("", |note| note.error.as_str());
                self.lease_lost_before(error, "escalation")
            }
        }
    }

    /// An escalation decided: the hook, the object settled as failed, the
    /// reconciler asked.
    async fn escalated(&self, body: &[u8], failures: u32, history: &[FailureNote]) -> Outcome {
        self.guard.inner.safe_hooks.on_escalation(&Escalation {
            key: self.key(),
            body,
            failures,
            history,
        });
        self.settle_object(ObjectStatus::Failed).await;
        self.reconcile(ReconcileReason::Escalated);
        Outcome::Escalated {
            id: self.id.clone(),
            failures,
        }
    }

    /// The answer of this claim's finish to `state`, with a `LeaseLost` that met
    /// the claim's own change read as `Applied`: the record holds its token and
    /// `state` (a transport sent the finish again after a lost reply, as a Redis
    /// Cluster connection does). When the record cannot be read to tell, the read's
    /// error: the finish may or may not have been made.
    async fn own_fence(
        &self,
        fence: Result<Fence, StoreError>,
        state: RecordState,
    ) -> Result<Fence, StoreError> {
        if !matches!(fence, Ok(Fence::LeaseLost)) {
            return fence;
        }
        match self.guard.holds(self.key(), self.token, state).await? {
            true => Ok(Fence::Applied),
            false => Ok(Fence::LeaseLost),
        }
    }

    /// Records the end of this claim (`state`, not `Completed`) in the background,
    /// fenced, until it lands or the claim is no longer held.
    fn finish_in_background(&self, state: RecordState, failures: u32, history: &[FailureNote]) {
        #[cfg(feature = "tokio")]
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (guard, id, token) = (self.guard.clone(), self.id.clone(), self.token);
            let history = history.to_vec();
            rt.spawn(async move {
                let what = state.as_str();
                match guard
                    .finish_later(&id, token, state, failures, &history)
                    .await
                {
                    Late::Recorded => {}
                    Late::TakenOver => {
                        tracing::warn!(%id, "taken over before the {what} was recorded")
                    }
                    Late::GaveUp(error) => {
                        tracing::warn!(%id, %error, "a {what} was not recorded; giving up")
                    }
                }
            });
            return;
        }
        #[cfg(not(feature = "tokio"))]
        let _ = (failures, history);
        tracing::warn!(id = %self.id, "no runtime to record a {} in the background; the lease will run out", state.as_str());
    }
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        #[cfg(feature = "tokio")]
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            // Copied: an escalation this failure reaches shows the body to its hook.
            let body = self.body.to_vec();
            rt.spawn(async move {
                let id = state.id.clone();
                let outcome = state
                    .fail_retryable(&body, "claim dropped unfinished".into())
                    .await;
                state.report(&outcome, state.claimed_at.elapsed());
                tracing::debug!(%id, outcome = %outcome.kind(), "released a dropped claim");
            });
            return;
        }
        tracing::warn!(id = %state.id, "claim dropped without a runtime; its lease will run out");
    }
}

impl WebhookGuard {
    /// Starts building a guard.
    ///
    /// ```
    /// use webhook_guard::{MemoryStore, WebhookGuard, verify::HmacSha256Header};
    ///
    /// let guard = WebhookGuard::builder()
    ///     .store(MemoryStore::new())
    ///     .verifier(HmacSha256Header::new("X-Signature", ["s3cret"]).unwrap())
    ///     .event_id(webhook_guard::EventId::json_field(["id"]))
    ///     .build()
    ///     .unwrap();
    /// # drop(guard);
    /// ```
    pub fn builder() -> WebhookGuardBuilder {
        WebhookGuardBuilder {
            store: None,
            verifier: None,
            clock: Arc::new(SystemClock),
            hooks: Arc::new(NoHooks),
            namespace: "default".into(),
            event_id: EventId::FromVerifier,
            lease: DEFAULT_LEASE,
            retention: None,
            escalate_after: None,
            max_body: DEFAULT_MAX_BODY,
            in_progress: InProgressAnswer::default(),
            fingerprint: None,
            status: [None; KINDS],
            inbox: None,
            ordering: None,
            reconciler: None,
            meta: None,
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<DynProcessedStore> {
        &self.inner.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The hooks, as given to the builder (the guard calls them panic-safe).
    pub fn hooks(&self) -> &Arc<dyn Hooks> {
        &self.inner.hooks
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The lease duration.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The retention.
    pub fn retention(&self) -> Duration {
        self.inner.retention
    }

    /// The largest body accepted, in bytes: integrations stop reading a body past it.
    pub fn max_body(&self) -> usize {
        self.inner.max_body
    }

    /// Verifies a delivery and extracts its id, without touching the store.
    ///
    /// # Errors
    /// The [`Rejection`]: body too large, signature not verified, id missing or invalid.
    pub fn verify(
        &self,
        headers: &dyn Headers,
        body: &[u8],
    ) -> Result<VerifiedDelivery, Rejection> {
        self.verify_at(headers, body, self.inner.clock.now())
    }

    /// [`WebhookGuard::verify`] at `now`, the delivery's arrival: the flow reads the
    /// clock once and uses the time for the signature's tolerance and the claim.
    fn verify_at(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<VerifiedDelivery, Rejection> {
        let (id, signed_at) = self.verify_id_at(headers, body, now)?;
        Ok(VerifiedDelivery {
            id,
            signed_at,
            meta: self.inner.meta.extract(body),
        })
    }

    /// The checks of [`WebhookGuard::verify_at`]: the event id and the signed time.
    /// The flow reads the metadata only once it has claimed the id, so that a
    /// duplicate costs no scan of the body for it.
    fn verify_id_at(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<(String, Option<DateTime<Utc>>), Rejection> {
        let inner = &self.inner;
        if body.len() > inner.max_body {
            return Err(Rejection::BodyTooLarge {
                size: body.len(),
                limit: inner.max_body,
            });
        }
        let verified = inner.verifier.verify(headers, body, now)?;
        let signed_at = verified.signed_at;
        let id = inner.event_id.extract(headers, body, verified)?;
        check_id(&id)?;
        Ok((id, signed_at))
    }

    /// Verifies the delivery and claims its id. Returns [`Begin::Claimed`] when this
    /// delivery must run the work, or [`Begin::Done`] with the outcome to answer.
    ///
    /// The headers are read and the clock is read (once, for the signature's tolerance
    /// and the claim's lease) before the returned future first runs, so the headers
    /// need not outlive it (nor be `Sync`); await it promptly. The event id and attempt are recorded on the current
    /// span when it is a delivery span (as in [`WebhookGuard::handle`]); an outcome
    /// answered here, and the one [`Claimed::complete`] or [`Claimed::fail`] returns,
    /// is logged and reported to [`Hooks::on_outcome`].
    pub fn begin<'s, 'a>(
        &'s self,
        headers: &dyn Headers,
        body: &'a [u8],
    ) -> impl Future<Output = Begin<'a>> + Send + use<'s, 'a> {
        let started = Instant::now();
        let now = self.inner.clock.now();
        let verified = self.verify_id_at(headers, body, now);
        self.claim(verified, body, started, now)
    }

    /// Reports `outcome`, reached before any handler ran, with the attempt when this
    /// delivery won the claim (stale, escalated at claim, extractor panic).
    fn done<'a>(&self, outcome: Outcome, attempt: Option<u32>, started: Instant) -> Begin<'a> {
        self.report(&outcome, attempt, started, None);
        Begin::Done(outcome)
    }

    /// Claims the id of a verified delivery: the claim to run, or the outcome to
    /// answer (reported), a rejection included. The callers await this future
    /// directly (no wrapper future around it, which would copy it once more).
    async fn claim<'a>(
        &self,
        verified: Result<(String, Option<DateTime<Utc>>), Rejection>,
        body: &'a [u8],
        started: Instant,
        now: DateTime<Utc>,
    ) -> Begin<'a> {
        let id = match verified {
            Ok((id, _)) => id,
            Err(r) => return self.done(Outcome::Rejected(r), None, started),
        };
        record_on_span("webhook.event_id", id.as_str());
        let inner = &self.inner;
        let fingerprint = if inner.fingerprint {
            Fingerprint::of(body)
        } else {
            Fingerprint::UNKNOWN
        };
        let key = Key::new(&inner.namespace, &id);
        let request = ClaimRequest {
            key,
            fingerprint,
            token: FencingToken::random(),
            now,
            lease_until: crate::later(now, inner.lease_delta),
            expires_at: crate::later(now, inner.retention_delta),
        };
        // No `Claimed` exists yet to release the claim if this future is dropped
        // while the store answers (a claim the store granted would hold its lease
        // until it ran out, and count as a failure).
        let release = ReleaseOnDrop::arm(self, &id, request.token, request.now);
        let claimed = store(inner).claim(&request).await;
        match &claimed {
            // Any error but a corrupt record (which a search would only read again)
            // may come after the store applied the claim.
            Err(StoreError::Corrupt(_)) | Ok(_) => release.disarm(),
            Err(_) => release.lost(),
        }
        let record = match claimed {
            Ok(Claim::Acquired(record)) => record,
            // This very claim, met again: a driver sent the round trip again after
            // its first run was applied, and the contract lets the store answer
            // either way. Held by no one else, it is this delivery's.
            Ok(Claim::Existing(record)) if request.made(&record) => record,
            Ok(Claim::Existing(record)) => {
                record_on_span("webhook.attempt", record.attempts);
                let outcome = self.existing(id, record, fingerprint, now);
                return self.done(outcome, None, started);
            }
            Err(error) => {
                let outcome = Outcome::StoreUnavailable {
                    id: Some(id),
                    error,
                };
                return self.done(outcome, None, started);
            }
        };
        // Panic-safe (as every hook): nothing would release the claim yet.
        inner.safe_hooks.on_claim(key, record.attempts);
        record_on_span("webhook.attempt", record.attempts);
        // The metadata is read now that this delivery holds the claim, and only for
        // its readers, ordering and reconciliation: a guard with neither skips the
        // scan of the body (and the strings it would allocate). A custom extractor
        // that panics fails the delivery as a panicking handler would: the claim is
        // released (retryable), not left to run out its lease.
        let mut panicked = None;
        let meta = if inner.ordering.is_some() || inner.reconciler.is_some() {
            std::panic::catch_unwind(AssertUnwindSafe(|| inner.meta.extract(body))).unwrap_or_else(
                |panic| {
                    panicked = Some(panic_message(&*panic).to_owned());
                    EventMeta::default()
                },
            )
        } else {
            EventMeta::default()
        };
        let ordered = inner.ordering.is_some() && crate::ordering::ordered(&id, &meta, now);
        let state = Arc::new(ClaimState {
            guard: self.clone(),
            token: request.token,
            id,
            record,
            meta,
            ordered,
            started,
            claimed_at: Instant::now(),
        });
        // The two rare early ends below are boxed (kept out of every delivery's
        // future) and detachable: they finish, hooks and report included, even if
        // the delivery is dropped meanwhile.
        let attempt = Some(state.record.attempts);
        if let Some(msg) = panicked {
            let error = bounded_error(format!("metadata extractor panicked: {msg}"));
            let (state, body) = (state.clone(), body.to_vec());
            let outcome = Detachable::new(async move {
                let outcome = state.fail_retryable(&body, error).await;
                state.guard.report(&outcome, attempt, started, None);
                outcome
            });
            return Begin::Done(outcome.await);
        }
        if state.record.failures >= inner.escalate_after {
            // Earlier holders crashed or hung until their leases ran out: stop here.
            let history = state.history_with(now, "lease expired".into());
            let failures = state.record.failures;
            let (state, body) = (state.clone(), body.to_vec());
            let outcome = Detachable::new(async move {
                let outcome = state.escalate(&body, failures, &history, now).await;
                state.guard.report(&outcome, attempt, started, None);
                outcome
            });
            return Begin::Done(outcome.await);
        }
        let claimed_at = state.record.updated_at;
        let release = ReleaseOnDrop::arm(self, &state.id, state.token, claimed_at);
        let order = state.check_order(now).await;
        release.disarm();
        if let Some(outcome) = order {
            return self.done(outcome, Some(state.record.attempts), started);
        }
        let claimed = Claimed {
            state: Some(state),
            body,
        };
        Begin::Claimed(claimed)
    }

    fn existing(
        &self,
        id: String,
        record: Record,
        fingerprint: Fingerprint,
        now: DateTime<Utc>,
    ) -> Outcome {
        let hooks = &self.inner.safe_hooks;
        if !record.fingerprint.matches(&fingerprint) {
            hooks.on_conflict(record.key());
            return Outcome::Conflict { id };
        }
        if record.state == RecordState::InProgress {
            let left = (record.lease_until - now).to_std().unwrap_or_default();
            return Outcome::InProgress {
                id,
                retry_after: left.max(Duration::from_secs(1)),
            };
        }
        hooks.on_duplicate(&record);
        Outcome::Duplicate {
            id,
            state: record.state,
        }
    }

    /// Runs one delivery through the whole flow: verify, claim, run `handler` only if
    /// this delivery won the claim, record the result, and return the [`Outcome`].
    ///
    /// A handler that panics is treated as a retryable failure; the panic does not
    /// reach the caller.
    ///
    /// The headers and the clock are read before the returned future first runs, so
    /// the headers need not outlive it; the future is `Send` when the handler's
    /// future is. The whole
    /// delivery, handler included, runs in a `webhook_delivery` tracing span (see
    /// [`WebhookGuard::delivery_span`]); its outcome is logged once at the end and
    /// reported to [`Hooks::on_outcome`]. Neither the body nor any secret is logged
    /// by the guard; a handler's error text is logged and kept in the record's
    /// history as the handler wrote it (a serde error quotes the value it refused),
    /// so keep payload contents out of it.
    ///
    /// # Cost
    ///
    /// A processed delivery makes two store round trips (claim, then complete); a
    /// duplicate makes one (the claim answers with the record). On [`MemoryStore`]
    /// with the id in a header (or with the Stripe preset, which reads it from the
    /// body), a processed delivery allocates 6 times (and, while
    /// the store is still growing, one more per 8 new records, plus now and then a
    /// shard's chunk list or table doubling) and a duplicate 4 times
    /// (`tests/allocations.rs` holds these bounds); the body is
    /// hashed once (SHA-256) for conflict detection, and read for the event's
    /// metadata only by a delivery that claims its id, and only when the guard has
    /// an ordering store or a reconciler (a duplicate skips that scan).
    /// `benches/README.md` has measured figures.
    ///
    /// [`MemoryStore`]: crate::MemoryStore
    pub fn handle<'s, 'a, F, Fut>(
        &'s self,
        headers: &dyn Headers,
        body: &'a [u8],
        handler: F,
    ) -> impl Future<Output = Outcome> + use<'s, 'a, F, Fut>
    where
        F: FnOnce(Event<'a>) -> Fut,
        Fut: Future<Output = Result<(), HandlerError>>,
    {
        let span = enterable(self.delivery_span());
        let started = Instant::now();
        let now = self.inner.clock.now();
        let verified = span.in_scope(|| self.verify_id_at(headers, body, now));
        async move {
            let begin = self.claim(verified, body, started, now).await;
            run_claimed(begin, handler).await
        }
        .instrument(span)
    }

    /// [`WebhookGuard::handle`] for a body held in [`Bytes`]: the handler receives an
    /// [`OwnedEvent`], which owns (a cheap clone of) the body, so its future can be
    /// `'static` — what web frameworks and `tokio::spawn` need.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use webhook_guard::{verify::HmacSha256Header, EventId, MemoryStore, Outcome, WebhookGuard};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let verifier = HmacSha256Header::new("X-Signature", ["s3cret"]).unwrap();
    /// let body = Bytes::from_static(br#"{"id":"evt_1"}"#);
    /// let headers = [("X-Signature", verifier.sign(&body))];
    /// let guard = WebhookGuard::builder()
    ///     .store(MemoryStore::new())
    ///     .verifier(verifier)
    ///     .event_id(EventId::json_field(["id"]))
    ///     .build()
    ///     .unwrap();
    /// let outcome = guard
    ///     .handle_owned(&headers, body, |event| async move {
    ///         // `event` is `'static`: it could be moved into a spawned task.
    ///         assert_eq!(event.id(), "evt_1");
    ///         Ok(())
    ///     })
    ///     .await;
    /// assert!(matches!(outcome, Outcome::Processed { .. }));
    /// # }
    /// ```
    pub fn handle_owned<'s, F, Fut>(
        &'s self,
        headers: &dyn Headers,
        body: Bytes,
        handler: F,
    ) -> impl Future<Output = Outcome> + use<'s, F, Fut>
    where
        F: FnOnce(OwnedEvent) -> Fut,
        Fut: Future<Output = Result<(), HandlerError>>,
    {
        let span = enterable(self.delivery_span());
        let started = Instant::now();
        let now = self.inner.clock.now();
        let verified = span.in_scope(|| self.verify_id_at(headers, &body, now));
        async move {
            let shared = body.clone();
            let begin = self.claim(verified, &body, started, now).await;
            run_claimed(begin, move |event| {
                handler(OwnedEvent {
                    body: shared,
                    claim: event.claim,
                })
            })
            .await
        }
        .instrument(span)
    }

    /// A new `webhook_delivery` span, at `INFO` level, for one delivery: field
    /// `webhook.namespace` is set, and `webhook.event_id`, `webhook.attempt`,
    /// `webhook.outcome` and `webhook.elapsed_ms` are recorded as the flow learns them.
    ///
    /// [`WebhookGuard::handle`] runs in one; an integration driving
    /// [`WebhookGuard::begin`] itself can instrument its delivery future with it.
    pub fn delivery_span(&self) -> tracing::Span {
        tracing::info_span!(
            "webhook_delivery",
            webhook.namespace = %self.inner.namespace,
            webhook.event_id = tracing::field::Empty,
            webhook.attempt = tracing::field::Empty,
            webhook.outcome = tracing::field::Empty,
            webhook.elapsed_ms = tracing::field::Empty,
        )
    }

    /// A rejection found before the guard saw the body (an integration refusing an
    /// oversized body it did not read whole), logged and reported like any outcome.
    #[cfg_attr(not(any(feature = "axum", feature = "tower")), allow(dead_code))]
    pub(crate) fn rejected_early(&self, rejection: Rejection, started: Instant) -> Outcome {
        let outcome = Outcome::Rejected(rejection);
        self.report(&outcome, None, started, None);
        outcome
    }

    /// Logs the end of a delivery and reports it to the outcome hook.
    fn report(
        &self,
        outcome: &Outcome,
        attempt: Option<u32>,
        started: Instant,
        handler: Option<Duration>,
    ) {
        let elapsed = started.elapsed();
        let kind = outcome.kind();
        let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        if let Some(span) = current_span() {
            span.record("webhook.outcome", kind.as_str());
            span.record("webhook.elapsed_ms", elapsed_ms);
        }
        let namespace = self.inner.namespace.as_str();
        let id = outcome.id().unwrap_or("");
        match kind {
            OutcomeKind::Processed
            | OutcomeKind::Duplicate
            | OutcomeKind::InProgress
            | OutcomeKind::Accepted => {
                tracing::info!(namespace, id, attempt, outcome = %kind, elapsed_ms, "webhook delivery");
            }
            _ => {
                // `Display` of an outcome holds reasons and error messages, never the
                // body or a secret.
                tracing::warn!(namespace, id, attempt, outcome = %kind, elapsed_ms, detail = %outcome, "webhook delivery");
            }
        }
        self.inner.safe_hooks.on_outcome(&DeliveryReport {
            namespace,
            outcome,
            attempt,
            elapsed,
            handler,
        });
    }

    /// What to answer the sender for `outcome`, with this guard's overrides applied.
    pub fn answer(&self, outcome: &Outcome) -> Answer {
        let kind = outcome.kind();
        let default = match (outcome, self.inner.in_progress) {
            (Outcome::Rejected(r), _) => r.status(),
            (Outcome::InProgress { .. }, InProgressAnswer::Accept) => StatusCode::OK,
            _ => kind.default_status(),
        };
        let status = self.inner.status[kind.index()].unwrap_or(default);
        Answer::with_status(outcome, status)
    }

    /// The record kept for `id`, for operators.
    ///
    /// # Errors
    /// The store's error.
    pub async fn inspect(&self, id: &str) -> Result<Option<Record>, StoreError> {
        store(&self.inner)
            .get(Key::new(&self.inner.namespace, id))
            .await
    }

    /// Forgets `id` so its next delivery runs the handler again (the "resend from the
    /// provider's dashboard" workflow). Refused while a live lease holds the id.
    ///
    /// # Errors
    /// The store's error.
    pub async fn forget(&self, id: &str) -> Result<Deleted, StoreError> {
        let now = self.inner.clock.now();
        store(&self.inner)
            .delete(Key::new(&self.inner.namespace, id), now)
            .await
    }

    /// Claims whose lease ran out without completion (crashed or hung holders).
    ///
    /// # Errors
    /// The store's error.
    pub async fn stuck(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        store(&self.inner)
            .stuck(self.inner.clock.now(), limit)
            .await
    }
}

/// The store behind the guard's `Arc`. Calling through `Arc<dyn ProcessedStore>`
/// itself would go through its forwarding impl, which boxes a second future per call.
fn store(inner: &Inner) -> &DynProcessedStore {
    &*inner.store
}

pub(crate) async fn catch_unwind<F: Future>(fut: F) -> Result<F::Output, Box<dyn Any + Send>> {
    let mut fut = pin!(fut);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    })
    .await
}

pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}

/// What a failed reconciliation's log says of its retry.
const RETRIED: &str = "reconcile_stale retries it if the object's newest event \
    failed for good (an escalation or a permanent failure, with an ordering store)";

/// What [`WebhookGuard::reconcile_stale`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// Objects found whose last event ended in failure.
    pub found: usize,
    /// Of those, how many the reconciler settled.
    pub reconciled: usize,
}

/// Inbox mode, reconciliation.
impl WebhookGuard {
    /// Persist, then acknowledge: verifies the delivery, deduplicates it and stores
    /// the event (payload, id, type, `created_at`, object) in the inbox in one atomic
    /// step, and returns at once — [`Outcome::Accepted`] (answer 200) whether this
    /// delivery stored it or an earlier one did. A [`Worker`](crate::inbox::Worker)
    /// processes it afterwards. Without an inbox configured the outcome is
    /// [`Outcome::StoreUnavailable`].
    pub fn accept<'s, 'a>(
        &'s self,
        headers: &dyn Headers,
        body: &'a [u8],
    ) -> impl Future<Output = Outcome> + Send + use<'s, 'a> {
        let span = enterable(self.delivery_span());
        let started = Instant::now();
        let now = self.inner.clock.now();
        let verified = span.in_scope(|| self.verify_at(headers, body, now));
        async move {
            let outcome = self.enqueue(verified, body, now).await;
            self.report(&outcome, None, started, None);
            outcome
        }
        .instrument(span)
    }

    async fn enqueue(
        &self,
        verified: Result<VerifiedDelivery, Rejection>,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Outcome {
        let delivery = match verified {
            Ok(d) => d,
            Err(r) => return Outcome::Rejected(r),
        };
        record_on_span("webhook.event_id", delivery.id.as_str());
        let inner = &self.inner;
        let Some(inbox) = &inner.inbox else {
            tracing::error!("accept called on a guard without an inbox");
            return Outcome::StoreUnavailable {
                id: Some(delivery.id),
                error: StoreError::backend("no inbox configured on this guard"),
            };
        };
        // As for a claim: with conflict detection off, the body is not hashed and the
        // event keeps `UNKNOWN`, which no guard compares.
        let fingerprint = if inner.fingerprint {
            Fingerprint::of(body)
        } else {
            Fingerprint::UNKNOWN
        };
        let key = Key::new(&inner.namespace, &delivery.id);
        let event = NewEvent {
            key,
            fingerprint,
            meta: &delivery.meta,
            payload: body,
            now,
            expires_at: crate::later(now, inner.retention_delta),
        };
        match inbox.enqueue(&event).await {
            Ok(Enqueued::Inserted) => Outcome::Accepted {
                id: delivery.id,
                new: true,
            },
            Ok(Enqueued::Existing { fingerprint: f, .. })
                if inner.fingerprint && !f.matches(&fingerprint) =>
            {
                inner.safe_hooks.on_conflict(key);
                Outcome::Conflict { id: delivery.id }
            }
            Ok(Enqueued::Existing { .. }) => Outcome::Accepted {
                id: delivery.id,
                new: false,
            },
            Err(error) => Outcome::StoreUnavailable {
                id: Some(delivery.id),
                error,
            },
        }
    }

    /// A [`Worker`](crate::inbox::Worker) over this guard's inbox, with its
    /// namespace, ordering store, reconciler, hooks, clock and retention.
    ///
    /// # Errors
    /// [`ConfigError::NoInbox`] when the guard has no inbox.
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn worker(
        &self,
        handler: impl crate::inbox::InboxHandler,
    ) -> Result<crate::inbox::Worker, ConfigError> {
        let inner = &self.inner;
        let inbox = inner.inbox.clone().ok_or(ConfigError::NoInbox)?;
        // The shortest retention `build` allows: settled events are the dedup
        // horizon of `accept`, so a worker keeps them at least as long.
        let lease = inner.lease_delta.to_std().unwrap_or_default();
        let tolerance = inner.verifier.tolerance().unwrap_or_default();
        let floor = lease.max(tolerance.saturating_mul(2));
        let mut worker = crate::inbox::Worker::new(inbox, inner.namespace.clone(), handler)
            .hooks(inner.hooks.clone())
            .clock(inner.clock.clone())
            .retention_floor(floor)
            .retention(inner.retention);
        if let Some(ordering) = &inner.ordering {
            worker = worker.ordering(ordering.clone());
        }
        if let Some(reconciler) = &inner.reconciler {
            worker = worker.reconciler(reconciler.clone());
        }
        Ok(worker)
    }

    /// Reconciles objects whose last event ended in failure (escalated, dead-lettered,
    /// failed permanently) at least `older_than` ago, through the reconciler; each
    /// object the reconciler settles is marked applied. Needs an ordering store and a
    /// reconciler; without them it finds nothing.
    ///
    /// An object the reconciler fails on (an error or a panic) stays failed, moved to
    /// the back of the queue, and the batch goes on.
    ///
    /// # Errors
    /// The ordering store's error when listing the objects. One that cannot be
    /// marked applied after the reconciler ran is logged, and the batch goes on (it
    /// is found again next time).
    pub async fn reconcile_stale(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Result<ReconcileReport, StoreError> {
        let inner = &self.inner;
        let (Some(ordering), Some(reconciler)) = (&inner.ordering, &inner.reconciler) else {
            return Ok(ReconcileReport::default());
        };
        let now = inner.clock.now();
        let before = TimeDelta::from_std(older_than)
            .ok()
            .and_then(|d| now.checked_sub_signed(d))
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let failed = ordering
            .failed_objects(&inner.namespace, before, limit)
            .await?;
        let mut report = ReconcileReport {
            found: failed.len(),
            reconciled: 0,
        };
        for object in failed {
            let mut meta = EventMeta::new(None, Some(object.newest), Some(object.object.clone()));
            meta.family = Some(object.family.clone());
            let request = ReconcileRequest::new(
                inner.namespace.clone(),
                None,
                meta,
                ReconcileReason::StaleFailure,
            );
            // A panicking reconciler fails its object, as an error does: the batch
            // goes on.
            let reconciled = match catch_unwind(reconciler.reconcile(&request)).await {
                Ok(result) => result,
                Err(panic) => {
                    Err(format!("the reconciler panicked: {}", panic_message(&*panic)).into())
                }
            };
            match reconciled {
                Ok(()) => {
                    // The reconciler has run: count it and go on with the batch
                    // even if its object cannot be marked now (it is found again).
                    report.reconciled += 1;
                    // Applied only while it is still the failure listed: another
                    // event created at the same time that failed meanwhile stays
                    // listed, for its own reconcile.
                    let now = inner.clock.now();
                    crate::ordering::mark_reconciled(
                        &**ordering,
                        object.key(),
                        object.newest,
                        object.updated_at,
                        now,
                    )
                    .await;
                }
                Err(e) => {
                    tracing::warn!(object = %object.object, error = %e, "reconciliation failed");
                    // To the back of the queue (its `updated_at` now): an object the
                    // reconciler keeps failing must not hold up the others. Only
                    // while it is still the failure listed: one another reconcile
                    // cleared meanwhile stays cleared.
                    let now = inner.clock.now();
                    let (key, failed) = (object.key(), ObjectStatus::Failed);
                    if let Err(e) = ordering
                        .mark_object_if_failed(key, object.newest, object.updated_at, failed, now)
                        .await
                    {
                        tracing::debug!(object = %object.object, error = %e, "could not requeue a failed object");
                    }
                }
            }
        }
        Ok(report)
    }

    /// Releases the claim `token` holds on `id`, if the store granted it, as a
    /// failed attempt that does not count towards escalation (its handler never
    /// ran): the record's failures and history stay as they are.
    ///
    /// The claim may still be in flight when its delivery is dropped (sent and not
    /// yet applied: a statement waiting for a row lock, a batch not yet answered),
    /// so until a record carries `token`, it is looked for again at doubling
    /// intervals (at most a tenth of the lease, or 1 s, apart) for as long as
    /// `search` says: up to the end of the claim's lease for a dropped delivery
    /// (after that, a later delivery takes a late claim over anyway; only at once
    /// when the guard's search slots are taken), 30 s for a claim the store did not
    /// answer.
    #[cfg(feature = "tokio")]
    async fn release_unrun(
        &self,
        id: &str,
        token: FencingToken,
        claimed_at: DateTime<Utc>,
        search: Search,
    ) {
        let inner = &self.inner;
        let key = Key::new(&inner.namespace, id);
        let (first, within) = match &search {
            Search::Dropped { _slot: Some(_) } => (Duration::ZERO, inner.lease),
            Search::Dropped { _slot: None } => (Duration::ZERO, Duration::ZERO),
            // The store just failed: first look a second later, and over a shorter
            // span, so that an outage's failed claims do not hammer it.
            Search::Lost { .. } => (
                Duration::from_secs(1),
                inner.lease.min(Duration::from_secs(30)),
            ),
        };
        let cap = (inner.lease / 10).max(Duration::from_secs(1));
        let mut backoff = Backoff::new(first, cap, within);
        let mut failed = None;
        while backoff.wait().await {
            failed = match store(inner).get(key).await {
                Ok(Some(record)) if record.token == token => {
                    if record.state != RecordState::InProgress {
                        return; // released already (the answer was lost)
                    }
                    if !crate::store::made_at(&record, token, claimed_at) {
                        // The same token on a claim made at another time: a forked
                        // process's, going on with this one's token sequence. Not
                        // this claim's to release.
                        return;
                    }
                    let now = inner.clock.now();
                    let release = Finish {
                        state: RecordState::Failed,
                        failures: record.failures,
                        history: &record.history,
                        now,
                        expires_at: crate::later(now, inner.retention_delta),
                    };
                    match store(inner).finish(key, token, &release).await {
                        // Released, or taken over meanwhile: nothing left to do.
                        Ok(_) => return,
                        Err(e) => Some(e),
                    }
                }
                // Not granted (yet, or ever).
                Ok(_) => None,
                Err(e) => Some(e),
            };
            if let Some(e) = &failed {
                tracing::debug!(%id, error = %e, "releasing the claim again");
            }
        }
        // A dropped delivery's claim was sent; an unanswered one most often never
        // reached the store (an outage), which is no news.
        match (failed, &search) {
            (Some(e), Search::Dropped { .. }) => {
                tracing::warn!(%id, error = %e, "could not release a claim; its lease will run out")
            }
            (Some(e), Search::Lost { .. }) => {
                tracing::debug!(%id, error = %e, "could not look for an unanswered claim")
            }
            (None, _) => {}
        }
    }

    /// Records a finish the store failed to record, fenced by `token`: again at
    /// doubling intervals (at most a second apart) for at least the lease (and at
    /// least a minute), until the store answers.
    #[cfg(feature = "tokio")]
    async fn finish_later(
        &self,
        id: &str,
        token: FencingToken,
        state: RecordState,
        failures: u32,
        history: &[FailureNote],
    ) -> Late {
        let inner = &self.inner;
        let key = Key::new(&inner.namespace, id);
        let within = inner.lease.max(Duration::from_secs(60));
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1), within);
        let mut failed = None;
        while backoff.wait().await {
            let now = inner.clock.now();
            let finish = Finish {
                state,
                failures,
                history,
                now,
                expires_at: crate::later(now, inner.retention_delta),
            };
            let error = match store(inner).finish(key, token, &finish).await {
                Ok(Fence::Applied) => return Late::Recorded,
                // Taken over, or recorded by the try whose answer was lost: the
                // record tells.
                Ok(Fence::LeaseLost) => match self.holds(key, token, state).await {
                    Ok(true) => return Late::Recorded,
                    Ok(false) => return Late::TakenOver,
                    Err(e) => e,
                },
                Err(e) => e,
            };
            tracing::debug!(%id, error = %error, "recording the {} again", state.as_str());
            failed = Some(error);
        }
        Late::GaveUp(
            failed.unwrap_or_else(|| StoreError::unavailable("not recorded before the deadline")),
        )
    }

    /// Whether the record under `key` holds the finish of claim `token` to `state`.
    async fn holds(
        &self,
        key: Key<'_>,
        token: FencingToken,
        state: RecordState,
    ) -> Result<bool, StoreError> {
        let record = store(&self.inner).get(key).await?;
        Ok(record.is_some_and(|r| r.token == token && r.state == state))
    }

    /// Asks the reconciler in the background; with `mark_failed_since`, marks the
    /// request's object applied once it succeeds, if the object is still marked
    /// failed by this request's event (since that time, not by a later one).
    #[cfg_attr(not(feature = "tokio"), allow(unused_variables))]
    fn spawn_reconcile(&self, request: ReconcileRequest, mark_failed_since: Option<DateTime<Utc>>) {
        let Some(reconciler) = self.inner.reconciler.clone() else {
            return;
        };
        #[cfg(feature = "tokio")]
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let guard = self.clone();
            rt.spawn(async move {
                let reason = request.reason.as_str();
                match catch_unwind(reconciler.reconcile(&request)).await {
                    // Settled through the API: marked applied, as `reconcile_stale`
                    // marks the objects it reconciles (it would ask again).
                    Ok(Ok(())) => {
                        if let Some(since) = mark_failed_since {
                            guard.mark_reconciled(&request, since).await;
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(reason, error = %e, "reconciliation failed; {RETRIED}");
                    }
                    Err(panic) => {
                        let panic = panic_message(&*panic);
                        tracing::error!(reason, panic, "the reconciler panicked; {RETRIED}");
                    }
                }
            });
            return;
        }
        tracing::warn!(
            reason = request.reason.as_str(),
            "no runtime to reconcile on; {RETRIED}"
        );
        drop((reconciler, request));
    }

    /// Marks the object of a request the reconciler settled as applied, if its
    /// newest event is still the request's.
    #[cfg(feature = "tokio")]
    async fn mark_reconciled(&self, request: &ReconcileRequest, failed_since: DateTime<Utc>) {
        let Some(ordering) = &self.inner.ordering else {
            return;
        };
        let Some((key, created_at)) =
            crate::ordering::object_key(&self.inner.namespace, &request.meta)
        else {
            return;
        };
        let now = self.inner.clock.now();
        crate::ordering::mark_reconciled(&**ordering, key, created_at, failed_since, now).await;
    }
}

/// Runs `handler` when `begin` won the claim, and records how it ended.
async fn run_claimed<'a, F, Fut>(begin: Begin<'a>, handler: F) -> Outcome
where
    F: FnOnce(Event<'a>) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    let claimed = match begin {
        Begin::Claimed(c) => c,
        Begin::Done(outcome) => return outcome,
    };
    // The handler is called inside `catch_unwind` too: a closure may panic before
    // it returns its future.
    let event = claimed.event();
    let result = catch_unwind(async move { handler(event).await }).await;
    match result {
        Ok(Ok(())) => claimed.complete().await,
        Ok(Err(e)) => claimed.fail(e).await,
        Err(panic) => {
            let msg = panic_message(&*panic);
            claimed
                .fail(HandlerError::retryable(format!("handler panicked: {msg}")))
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::has_control;

    /// Work that panicked is not spawned to be polled again when its `Detachable`
    /// is dropped by the unwinding.
    #[cfg(feature = "tokio")]
    #[tokio::test]
    async fn a_detachable_that_panicked_is_not_spawned() {
        use std::future::Future as _;
        let mut work = Box::pin(super::Detachable::new(async {
            panic!("a hook panicked");
        }));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = work.as_mut().poll(&mut cx);
        }));
        assert!(polled.is_err(), "the work panicked");
        drop(work);
        let tasks = tokio::runtime::Handle::current().metrics();
        assert_eq!(tasks.num_alive_tasks(), 0, "nothing was spawned");
    }

    #[test]
    fn control_characters_are_found_in_ascii_and_beyond() {
        for id in ["evt_1NDEXAMPLE", "a b~!", "évènement", "事件-1", ""] {
            assert!(!has_control(id), "{id:?}");
        }
        for id in ["evt\t1", "evt\r\n", "\x7f", "evt\u{85}", "é\u{9f}", "\0"] {
            assert!(has_control(id), "{id:?}");
        }
    }
}
