//! The guard and its delivery flow: verify → extract the id → claim → run → record
//! → answer.
//!
//! [`WebhookGuard`] and its builder are re-exported at the crate root; this module
//! also holds the lower-level API ([`WebhookGuard::begin`] → [`Begin`] →
//! [`Claimed::complete`] / [`Claimed::fail`]), the event types and the defaults.
//!
//! For contributors: `mod.rs` holds one delivery from top to bottom (`handle`,
//! `handle_owned` and `begin` verify and claim, `run_claimed` runs the handler and
//! records how it ended through `Claimed`). The rest lives beside it: the builder
//! (`builder.rs`), the event types (`event.rs`), a won claim (`claim.rs`), recording
//! its end (`record.rs`), what a dropped delivery leaves to the background
//! (`cancellation.rs`), the content keys of schemes whose id is not signed
//! (`content.rs`), the operators' accessors (`operators.rs`), and the inbox and
//! reconcile glue (`inbox.rs`, `reconcile.rs`).

mod builder;
mod cancellation;
mod claim;
mod content;
mod event;
mod fetched;
mod followup;
mod inbox;
mod operators;
mod reconcile;
mod record;
mod state;
mod tenant;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, TimeDelta, Utc};
use http::StatusCode;
use tracing::Instrument as _;

use crate::clock::Clock;
use crate::hooks::{DeliveryReport, Hooks};
use crate::inbox::InboxStore;
use crate::meta::{EventMeta, MetaExtractor, TypeSource};
use crate::ordering::OrderingStore;
use crate::outcome::{Answer, HandlerError, Outcome, OutcomeKind, Rejection};
use crate::reconcile::Reconciler;
use crate::runtime::{bounded_error, catch_unwind, current_span, enterable, panic_message};
use crate::store::{
    Claim, ClaimRequest, DynProcessedStore, FencingToken, Fingerprint, Key, Record, RecordState,
    StoreError,
};
use crate::verify::Verifier;
use crate::Headers;

pub use crate::runtime::MAX_ERROR_LEN;
pub use builder::{
    ConfigError, InProgressAnswer, WebhookGuardBuilder, DEFAULT_DETACHED_LIMIT,
    DEFAULT_ESCALATE_AFTER, DEFAULT_LEASE, DEFAULT_MAX_BODY, DEFAULT_RETENTION,
    DEFAULT_STORE_TIMEOUT,
};
pub use claim::Claimed;
use event::Early;
pub use event::{
    Event, EventId, IdExtractor, LeaseError, OwnedEvent, VerifiedDelivery, MAX_ID_LEN,
};
pub use reconcile::ReconcileReport;

use builder::KINDS;
pub(crate) use cancellation::Detachable;
use cancellation::ReleaseOnDrop;
use event::{check_id, Checked};
pub(crate) use followup::Paid;
use state::ClaimState;

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
    /// Where the follow-up markers of failures for good live (`followup.rs`).
    followup_namespace: String,
    /// Where the content keys live (`content.rs`), unless turned off.
    content_namespace: Option<String>,
    event_id: EventId,
    lease: Duration,
    lease_delta: TimeDelta,
    /// How long a claim may take before the delivery is answered 503.
    store_timeout: Duration,
    /// When a spawned handler still running is answered `InProgress`.
    answer_deadline: Option<Duration>,
    /// Handlers running apart from their request.
    detached: crate::runtime::Slots,
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
    /// Where a delivery's event type is.
    event_type: Option<TypeSource>,
    /// Whether `event_type` names a header, read at verification.
    type_headers: bool,
    /// Background searches for claims the store did not answer, running now (at
    /// most [`MAX_SEARCHES`](cancellation::MAX_SEARCHES)).
    lost_searches: Arc<AtomicUsize>,
    /// The same for claims whose delivery was dropped: a slot count of their own,
    /// as such a search may run for a whole lease (one whose claim was answered
    /// `Existing` never finds its token) and must not starve the others.
    dropped_searches: Arc<AtomicUsize>,
    /// A guard serving tenants: their resolver and cached guards. Such a guard
    /// verifies no delivery itself; its tenants' guards have none.
    tenants: Option<Arc<tenant::TenantCache>>,
    /// For a tenant's guard: its tenant, and the namespace of the guard that made it.
    served: Option<Box<tenant::Served>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookGuard")
            .field("namespace", &self.namespace)
            .field("store", &self.store)
            .field("verifier", &self.verifier)
            .field("event_id", &self.event_id)
            .field("lease", &self.lease)
            .field("retention", &self.retention)
            .field("escalate_after", &self.escalate_after)
            .field("max_body", &self.max_body)
            .field("tenants", &self.tenants)
            .finish_non_exhaustive()
    }
}

/// One delivery: verify, claim, run, record.
impl WebhookGuard {
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
    /// duplicate makes one (the claim answers with the record). A verifier whose
    /// scheme does not sign its id (GitHub, Shopify, Linear, Jamm) adds its content
    /// key's: two more for a processed delivery, none more for a duplicate of a
    /// finished content ([`WebhookGuardBuilder::content_keys`]). On [`MemoryStore`]
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
        let (span, started, now) = self.start_delivery();
        let verified = span.in_scope(|| self.verify_id_at(headers, body, now));
        async move {
            let begin = self.claim(verified, body, started, now, None).await;
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
    /// let verifier = HmacSha256Header::new("X-Signature", ["a-random-secret-of-32-characters"]).unwrap();
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
        self.owned(headers, body, None, handler)
    }

    /// [`WebhookGuard::handle_owned`] for a delivery that cannot outlive `deadline`:
    /// its claim's lease ends at the guard's [lease](WebhookGuardBuilder::lease)
    /// from now or at `deadline`, whichever comes first (at once, for a deadline
    /// already past), and [`OwnedEvent::renew_lease`] never extends it past
    /// `deadline` either.
    ///
    /// For hosts that end the work at a known time, as AWS Lambda ends an
    /// invocation at its deadline (`integrations::lambda` passes it): a delivery cut
    /// off there holds its event id no longer than the invocation could run, and the
    /// provider's next retry takes the claim over instead of being answered
    /// `InProgress` for the rest of the guard's lease.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use chrono::{TimeDelta, Utc};
    /// use webhook_guard::{verify::NoVerification, EventId, MemoryStore, Outcome, WebhookGuard};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let guard = WebhookGuard::builder()
    ///     .store(MemoryStore::new())
    ///     .verifier(NoVerification)
    ///     .event_id(EventId::header("X-Event-Id"))
    ///     .build()
    ///     .unwrap();
    /// let deadline = Utc::now() + TimeDelta::seconds(3);
    /// let headers = [("X-Event-Id", "evt_1")];
    /// let outcome = guard
    ///     .handle_owned_until(&headers, Bytes::new(), deadline, |_event| async { Ok(()) })
    ///     .await;
    /// assert!(matches!(outcome, Outcome::Processed { .. }));
    /// # }
    /// ```
    pub fn handle_owned_until<'s, F, Fut>(
        &'s self,
        headers: &dyn Headers,
        body: Bytes,
        deadline: DateTime<Utc>,
        handler: F,
    ) -> impl Future<Output = Outcome> + use<'s, F, Fut>
    where
        F: FnOnce(OwnedEvent) -> Fut,
        Fut: Future<Output = Result<(), HandlerError>>,
    {
        self.owned(headers, body, Some(deadline), handler)
    }

    /// [`WebhookGuard::handle_owned`], its lease bounded by `lease_cap` when given.
    fn owned<'s, F, Fut>(
        &'s self,
        headers: &dyn Headers,
        body: Bytes,
        lease_cap: Option<DateTime<Utc>>,
        handler: F,
    ) -> impl Future<Output = Outcome> + use<'s, F, Fut>
    where
        F: FnOnce(OwnedEvent) -> Fut,
        Fut: Future<Output = Result<(), HandlerError>>,
    {
        let (span, started, now) = self.start_delivery();
        let verified = span.in_scope(|| self.verify_id_at(headers, &body, now));
        async move {
            let begin = self.claim(verified, &body, started, now, lease_cap).await;
            run_owned(begin, &body, handler).await
        }
        .instrument(span)
    }

    /// [`WebhookGuard::handle_owned`], with the handler run apart from the request:
    /// polled by the request's future, and moved to a task of its own (with the
    /// `tokio` feature and a runtime) when that future is dropped (the provider hung
    /// up, a server timeout) or the answer deadline comes, so that it runs to its
    /// end and its result is recorded. A handler that ends in time costs no task.
    /// What the web integrations call.
    ///
    /// The returned future answers when the handler ends, or — when the guard has an
    /// [answer deadline](WebhookGuardBuilder::answer_deadline) and the handler still
    /// runs at it — [`Outcome::InProgress`] at the deadline, so the provider is
    /// answered before its own timeout; the handler runs on, and the delivery's
    /// final outcome is logged and reported to [`Hooks::on_outcome`] when it ends.
    /// At most [`detached_limit`](WebhookGuardBuilder::detached_limit) handlers run
    /// so at once; past it (or without a runtime) the handler runs inside the
    /// request, as in [`WebhookGuard::handle_owned`]. [`WebhookGuard::drain`] waits
    /// for them at shutdown.
    // Without the `tokio` feature nothing is spawned: the detached branch is dead.
    #[cfg_attr(not(feature = "tokio"), allow(unused_variables, unreachable_code))]
    pub fn handle_spawned<'s, F, Fut>(
        &'s self,
        headers: &dyn Headers,
        body: Bytes,
        handler: F,
    ) -> impl Future<Output = Outcome> + Send + use<'s, F, Fut>
    where
        F: FnOnce(OwnedEvent) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        let (span, started, now) = self.start_delivery();
        let verified = span.in_scope(|| self.verify_id_at(headers, &body, now));
        async move {
            let claimed = match self.claim(verified, &body, started, now, None).await {
                Begin::Claimed(claimed) => claimed,
                Begin::Done(outcome) => return outcome,
            };
            let Some(slot) = self.detached_slot() else {
                return run_owned(Begin::Claimed(claimed), &body, handler).await;
            };
            let state = claimed.take();
            let (id, lease_until) = (state.id.clone(), state.record.lease_until);
            // Polled here, in the request, and spawned only if the request is dropped
            // or the deadline comes first: a handler that ends in time costs no task.
            let run = Detachable::new(async move {
                let _slot = slot;
                let claimed = Claimed {
                    state: Some(state),
                    body: &body,
                };
                run_owned(Begin::Claimed(claimed), &body, handler).await
            });
            let ended = match self.inner.answer_deadline {
                Some(deadline) => {
                    let left = deadline.saturating_sub(started.elapsed());
                    crate::runtime::within(left, run).await
                }
                None => Some(run.await),
            };
            match ended {
                Some(outcome) => outcome,
                None => {
                    let now = self.inner.clock.now();
                    let retry_after = (lease_until - now).to_std().unwrap_or_default();
                    tracing::info!(%id, "answering before the provider's timeout; the handler runs on");
                    Outcome::InProgress {
                        id,
                        retry_after: retry_after.max(Duration::from_secs(1)),
                    }
                }
            }
        }
        .instrument(span)
    }

    /// A free slot to run a handler apart from its request, when there is a
    /// runtime to move it to.
    pub(crate) fn detached_slot(&self) -> Option<crate::runtime::Slot> {
        crate::runtime::current()?;
        self.inner.detached.take()
    }

    /// Waits at most `grace` for the handlers running apart from their request
    /// ([`WebhookGuard::handle_spawned`]) to end and record their results: call it
    /// at shutdown, once the server stopped taking requests. Answers how many still
    /// run at the end of `grace` (their claims' leases run out, and a redelivery
    /// takes each over: none is lost).
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn drain(&self, grace: Duration) -> usize {
        self.inner.detached.drain(grace).await
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
        self.claim(verified, body, started, now, None)
    }

    /// The checks of [`WebhookGuard::verify_at`]: the event id and the signed time.
    /// The flow reads the metadata only once it has claimed the id, so that a
    /// duplicate costs no scan of the body for it.
    fn verify_id_at(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Checked, Early> {
        let inner = &self.inner;
        if body.len() > inner.max_body {
            return Err(Early::Rejected(Rejection::BodyTooLarge {
                size: body.len(),
                limit: inner.max_body,
            }));
        }
        if inner.tenants.is_some() {
            // Its verifier is the tenants' template.
            return Err(Early::Rejected(Rejection::MissingTenant));
        }
        let mut verified = inner.verifier.verify(headers, body, now)?;
        if let Some(handshake) = verified.handshake.take() {
            return Err(Early::Handshake(Box::new(handshake)));
        }
        let signed_at = verified.signed_at;
        let id = inner.event_id.extract(headers, body, verified)?;
        check_id(&id)?;
        // The headers are gone by the time a handler asks for the event's type.
        let source = inner.event_type.as_ref().filter(|_| inner.type_headers);
        let type_header = source.and_then(|source| source.capture(headers));
        let mut checked = Checked::new(id, signed_at, type_header);
        checked.content_key = (inner.content_namespace.as_ref())
            .and_then(|_| inner.verifier.content_key(headers, body));
        Ok(checked)
    }

    /// Claims the id of a verified delivery: the claim to run, or the outcome to
    /// answer (reported), a rejection included. The callers await this future
    /// directly (no wrapper future around it, which would copy it once more).
    /// `lease_cap`, when given, bounds the claim's lease and its renewals.
    fn claim<'s, 'a>(
        &'s self,
        verified: Result<Checked, Early>,
        body: &'a [u8],
        started: Instant,
        now: DateTime<Utc>,
        lease_cap: Option<DateTime<Utc>>,
    ) -> impl Future<Output = Begin<'a>> + Send + use<'s, 'a> {
        // A content key stands for the signed content: a Jamm envelope around the
        // same content is the same delivery, not a conflict.
        let fingerprint = match &verified {
            Ok(Checked {
                content_key: Some(key),
                ..
            }) if self.inner.fingerprint => Fingerprint(*key),
            Ok(_) if self.inner.fingerprint => Fingerprint::of(body),
            _ => Fingerprint::UNKNOWN,
        };
        self.claim_as(verified, body, fingerprint, started, now, lease_cap)
    }

    /// [`WebhookGuard::claim`] with the body's `fingerprint` given: an event fetched
    /// from the provider's API claims with [`Fingerprint::UNKNOWN`] (`fetched.rs`).
    async fn claim_as<'a>(
        &self,
        verified: Result<Checked, Early>,
        body: &'a [u8],
        fingerprint: Fingerprint,
        started: Instant,
        now: DateTime<Utc>,
        lease_cap: Option<DateTime<Utc>>,
    ) -> Begin<'a> {
        let (id, type_header, content_key) = match verified {
            Ok(checked) => (checked.id, checked.type_header, checked.content_key),
            Err(early) => return self.done(early.into_outcome(), None, started),
        };
        record_on_span("webhook.event_id", id.as_str());
        let inner = &self.inner;
        let content = match self.claim_content(&id, content_key, now, lease_cap).await {
            Ok(content) => content,
            Err(outcome) => return self.done(outcome, None, started),
        };
        let key = Key::new(&inner.namespace, &id);
        let request = ClaimRequest {
            key,
            fingerprint,
            token: FencingToken::random(),
            now,
            lease_until: capped(crate::later(now, inner.lease_delta), lease_cap, now),
            expires_at: crate::later(now, inner.retention_delta),
        };
        // No `Claimed` exists yet to release the claim if this future is dropped
        // while the store answers (a claim the store granted would hold its lease
        // until it ran out, and count as a failure).
        let release = ReleaseOnDrop::arm(self, &id, request.token, request.now);
        let claimed = crate::runtime::within(inner.store_timeout, store(inner).claim(&request))
            .await
            .unwrap_or_else(|| Err(self.store_timed_out()));
        match &claimed {
            // Any error but a corrupt record (which a search would only read again)
            // or a request that never left may come after the store applied the claim.
            Err(StoreError::Corrupt(_) | StoreError::NotSent { .. }) | Ok(_) => release.disarm(),
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
                let owing = followup::failed_for_good(record.state)
                    && record.fingerprint.matches(&fingerprint);
                if owing {
                    // What a process that died after recording it may have left
                    // unannounced (`followup.rs`).
                    self.pay_owed(&record, body, now).await;
                }
                let outcome = self.existing(id, record, fingerprint, now);
                self.content_after(content.as_ref(), &outcome).await;
                return self.done(outcome, None, started);
            }
            Err(error) => {
                let outcome = Outcome::StoreUnavailable {
                    id: Some(id),
                    error,
                };
                self.content_after(content.as_ref(), &outcome).await;
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
            lease_cap,
            content,
            type_header,
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

    /// The error of a claim the store did not answer within the store budget.
    fn store_timed_out(&self) -> StoreError {
        let budget = self.inner.store_timeout;
        StoreError::unavailable(format!(
            "no answer within the store timeout ({budget:?}): answered before the provider gives up"
        ))
    }

    /// Reports `outcome`, reached before any handler ran, with the attempt when this
    /// delivery won the claim (stale, escalated at claim, extractor panic).
    fn done<'a>(&self, outcome: Outcome, attempt: Option<u32>, started: Instant) -> Begin<'a> {
        self.report(&outcome, attempt, started, None);
        Begin::Done(outcome)
    }
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

/// [`run_claimed`] with an [`OwnedEvent`] that shares `body`, the claim's body.
async fn run_owned<F, Fut>(begin: Begin<'_>, body: &Bytes, handler: F) -> Outcome
where
    F: FnOnce(OwnedEvent) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    let shared = body.clone();
    run_claimed(begin, move |event| {
        handler(OwnedEvent {
            body: shared,
            claim: event.claim,
        })
    })
    .await
}

/// Telling how a delivery ended: its span, its log line and hook, its answer.
impl WebhookGuard {
    /// What a delivery starts with: its span (none when no subscriber takes it),
    /// the instant it began (for its elapsed time) and the clock's time.
    fn start_delivery(&self) -> (tracing::Span, Instant, DateTime<Utc>) {
        let span = enterable(self.delivery_span());
        (span, Instant::now(), self.inner.clock.now())
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
        // A tenant's delivery under its guard's namespace: one metrics series per guard.
        let (namespace, tenant) = match &self.inner.served {
            Some(served) => (served.namespace.as_str(), served.tenant.as_deref()),
            None => (self.inner.namespace.as_str(), None),
        };
        let id = outcome.id().unwrap_or("");
        match kind {
            OutcomeKind::Processed
            | OutcomeKind::Duplicate
            | OutcomeKind::InProgress
            | OutcomeKind::Accepted => {
                tracing::info!(namespace, tenant, id, attempt, outcome = %kind, elapsed_ms, "webhook delivery");
            }
            _ => {
                // `Display` of an outcome holds reasons and error messages, never the
                // body or a secret.
                tracing::warn!(namespace, tenant, id, attempt, outcome = %kind, elapsed_ms, detail = %outcome, "webhook delivery");
            }
        }
        self.inner.safe_hooks.on_outcome(&DeliveryReport {
            namespace,
            tenant,
            outcome,
            attempt,
            elapsed,
            handler,
        });
    }

    /// A rejection found before the delivery reached the flow (an integration
    /// refusing an oversized body it did not read whole, a tenant not found),
    /// logged and reported like any outcome.
    pub(crate) fn rejected_early(&self, rejection: Rejection, started: Instant) -> Outcome {
        let outcome = Outcome::Rejected(rejection);
        self.report(&outcome, None, started, None);
        outcome
    }

    /// What to answer the sender for `outcome`, with this guard's overrides applied.
    pub fn answer(&self, outcome: &Outcome) -> Answer {
        let kind = outcome.kind();
        let default = match (outcome, self.inner.in_progress) {
            // The provider checks a handshake's status: no override applies.
            (Outcome::Handshake(h), _) => return Answer::with_status(outcome, h.status),
            (Outcome::Rejected(r), _) => r.status(),
            (Outcome::InProgress { .. }, InProgressAnswer::Accept) => StatusCode::OK,
            _ => kind.default_status(),
        };
        let status = self.inner.status[kind.index()].unwrap_or(default);
        Answer::with_status(outcome, status)
    }
}

/// The store behind the guard's `Arc`. Calling through `Arc<dyn ProcessedStore>`
/// itself would go through its forwarding impl, which boxes a second future per call.
fn store(inner: &Inner) -> &DynProcessedStore {
    &*inner.store
}

/// `lease_until` bounded by `cap` when given, and never before `now`.
fn capped(
    lease_until: DateTime<Utc>,
    cap: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> DateTime<Utc> {
    cap.map_or(lease_until, |cap| lease_until.min(cap).max(now))
}

/// Records `value` as `field` on the current span (a no-op on a span without it).
fn record_on_span(field: &str, value: impl tracing::Value) {
    if let Some(span) = current_span() {
        span.record(field, value);
    }
}
