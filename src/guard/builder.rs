//! The builder of a [`WebhookGuard`], its defaults, and the configurations it refuses.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use chrono::TimeDelta;
use http::StatusCode;

use super::tenant::TenantCache;
use super::{EventId, Inner, WebhookGuard};
use crate::clock::{Clock, SystemClock};
use crate::hooks::{Hooks, NoHooks, PanicSafe};
use crate::inbox::InboxStore;
use crate::meta::{MetaExtractor, TypeSource};
use crate::ordering::OrderingStore;
use crate::outcome::OutcomeKind;
use crate::reconcile::Reconciler;
use crate::store::{DynProcessedStore, ProcessedStore};
use crate::tenant::{Tenants, MAX_TENANT_GUARD_NAMESPACE};
use crate::verify::Verifier;

/// The default lease: how long a claim holds before another delivery may take over.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(5 * 60);
/// The default retention: Stripe's 72-hour retry window (Jamm's schedule spans 54 h 38 min).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(72 * 3600);
/// The default number of failures after which an id is escalated (seed: about 5).
pub const DEFAULT_ESCALATE_AFTER: u32 = 5;
/// The default body size limit: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;
/// The default store budget: how long a delivery waits for its claim before it is
/// answered 503. Well inside the shortest timeout of a preset's provider (Slack's
/// 3 s; Stripe's and Shopify's 5 s).
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// The default bound on handlers running apart from their request
/// ([`WebhookGuard::handle_spawned`]): past it, a handler runs inside its request.
pub const DEFAULT_DETACHED_LIMIT: u32 = 1024;

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
    /// A guard serving tenants ([`WebhookGuardBuilder::tenants`]) was configured
    /// with what it cannot serve them with: a verifier that cannot be keyed with a
    /// tenant's secrets, an inbox, a namespace over
    /// [`MAX_TENANT_GUARD_NAMESPACE`](crate::tenant::MAX_TENANT_GUARD_NAMESPACE)
    /// bytes, or a cache of no tenant.
    #[error("tenants: {0}")]
    Tenants(&'static str),
    /// The retention is shorter than the provider's retry window: a retry after
    /// the record expired would run the handler again.
    #[error(
        "retention ({retention:?}) is shorter than the provider's retry window \
         ({retry_window:?}): a late retry would run the handler again; raise the \
         retention, or call `allow_retention_below_retry_window()` if that is meant"
    )]
    RetentionBelowRetryWindow {
        /// The configured retention.
        retention: Duration,
        /// The verifier's retry window.
        retry_window: Duration,
    },
    /// The event id comes from the verifier, which finds none (a generic verifier
    /// given no id header, or `NoVerification`): every delivery would be answered
    /// `missing_event_id`.
    #[error(
        "the verifier finds no event id: name the id's header on the verifier \
         (`event_id_header` / `id_header`, or `{{id:...}}` in a template), or tell the \
         guard where it is with `event_id(EventId::header(..))` or \
         `EventId::json_field(..)`"
    )]
    NoEventIdSource,
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
    store_timeout: Duration,
    /// `None`: the verifier's; `Some(None)`: none.
    answer_deadline: Option<Option<Duration>>,
    detached_limit: u32,
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
    event_type: Option<TypeSource>,
    tenants: Option<Tenants>,
    short_retention: bool,
    content_keys: bool,
}

pub(super) const KINDS: usize = OutcomeKind::ALL.len();

impl WebhookGuardBuilder {
    /// The inbox for [`WebhookGuard::accept`] and [`WebhookGuard::worker`]: a
    /// store, or an `Arc` of one to share it.
    pub fn inbox(mut self, inbox: impl InboxStore) -> Self {
        self.inbox = Some(shared(inbox, |inbox| {
            Arc::new(inbox) as Arc<dyn InboxStore>
        }));
        self
    }

    /// The ordering store: with it, an event older than one already seen for its
    /// target object and family (see [`EventMeta`](crate::meta::EventMeta)) does not run the handler: it is
    /// answered [`Outcome::Stale`](crate::Outcome::Stale) and the stale hook is called.
    pub fn ordering(mut self, ordering: impl OrderingStore) -> Self {
        self.ordering = Some(shared(ordering, |ordering| {
            Arc::new(ordering) as Arc<dyn OrderingStore>
        }));
        self
    }

    /// The reconciler, called (in the background) when an id is escalated or fails
    /// permanently, when a handler succeeded but its lease was taken over meanwhile
    /// or a newer event of its object was seen while it ran, and by
    /// [`WebhookGuard::reconcile_stale`].
    pub fn reconciler(mut self, reconciler: impl Reconciler) -> Self {
        self.reconciler = Some(shared(reconciler, |reconciler| {
            Arc::new(reconciler) as Arc<dyn Reconciler>
        }));
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

    /// Where a delivery's event type is (default: where the verifier's provider
    /// puts it — every provider preset knows — else nowhere): what
    /// [`Event::event_type`](crate::Event::event_type) reads and the
    /// [router](crate::route::Router) dispatches on. A header named here is read
    /// when the delivery is verified and kept with its claim; body fields are read
    /// only when the handler asks.
    pub fn event_type(mut self, source: TypeSource) -> Self {
        self.event_type = Some(source);
        self
    }

    /// The store (required): a store, or an `Arc` of one to share it (an
    /// `Arc<dyn ProcessedStore>` is kept as it is, not wrapped again).
    pub fn store(mut self, store: impl ProcessedStore) -> Self {
        self.store = Some(shared(store, |store| {
            Arc::new(store) as Arc<DynProcessedStore>
        }));
        self
    }

    /// The signature verifier (required; [`NoVerification`](crate::verify::NoVerification)
    /// turns verification off explicitly).
    pub fn verifier(mut self, verifier: impl Verifier) -> Self {
        self.verifier = Some(shared(verifier, |verifier| {
            Arc::new(verifier) as Arc<dyn Verifier>
        }));
        self
    }

    /// Serves many tenants, each with its own secrets, resolved per delivery, and
    /// its own namespace (see [`crate::tenant`]). The [verifier](Self::verifier)
    /// is then a template: each tenant's is made from it keyed with the tenant's
    /// secrets ([`Verifier::with_secrets`]), and its own secrets verify nothing. A
    /// delivery goes through [`WebhookGuard::tenant`] first; the guard itself
    /// rejects every delivery it is handed directly
    /// ([`Rejection::MissingTenant`](crate::outcome::Rejection::MissingTenant)).
    /// An inbox does not serve tenants.
    pub fn tenants(mut self, tenants: Tenants) -> Self {
        self.tenants = Some(tenants);
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
        self.hooks = shared(hooks, |hooks| Arc::new(hooks) as Arc<dyn Hooks>);
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
    /// handlers can renew with [`Event::renew_lease`](crate::Event::renew_lease).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long a delivery waits for the store to answer its claim before it is
    /// answered [`Outcome::StoreUnavailable`](crate::Outcome::StoreUnavailable)
    /// (503, the provider retries): default [`DEFAULT_STORE_TIMEOUT`]. Keep it well
    /// inside the provider's own timeout, or an outage is seen as timeouts rather
    /// than 503s. A claim the store may have applied after all is looked for and
    /// released in the background.
    ///
    /// Needs the `tokio` feature and a runtime with its timer (`#[tokio::main]`
    /// has one); a store that answers at its first poll (the memory store) never
    /// sets a timer.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = timeout;
        self
    }

    /// When [`WebhookGuard::handle_spawned`] (and the integrations) answer a delivery
    /// whose handler still runs: that long after the delivery arrived, it is
    /// answered [`Outcome::InProgress`](crate::Outcome::InProgress) (409 with
    /// `Retry-After`, or 200 with [`InProgressAnswer::Accept`]) while the handler
    /// runs on and records its result; the provider's retry then finds it done
    /// (`Duplicate`) or, if it failed, runs it again.
    ///
    /// Default: four fifths of the verifier's
    /// [`answer_timeout`](crate::verify::Verifier::answer_timeout), the provider's
    /// own wait (Stripe 4 s of 5, Slack 2.4 s of 3, GitHub 8 s of 10, Shopify 4 s of
    /// 5, Jamm 96 s of 120); none when the verifier does not know it. A provider
    /// that timed out would retry all the same, and count the attempt as failed
    /// without an answer; answered in time, it shows a clear status instead.
    pub fn answer_deadline(mut self, deadline: Duration) -> Self {
        self.answer_deadline = Some(Some(deadline));
        self
    }

    /// No answer deadline: a spawned handler is awaited to its end, however long
    /// the provider waits.
    pub fn no_answer_deadline(mut self) -> Self {
        self.answer_deadline = Some(None);
        self
    }

    /// How many handlers may run apart from their request at once (default
    /// [`DEFAULT_DETACHED_LIMIT`]); past it, [`WebhookGuard::handle_spawned`] runs
    /// a handler inside its request, which a dropped request then cancels (its claim
    /// released, the next delivery runs it again). Zero keeps every handler inside
    /// its request.
    pub fn detached_limit(mut self, limit: u32) -> Self {
        self.detached_limit = limit;
        self
    }

    /// How long records are kept (default: [`DEFAULT_RETENTION`], or the verifier's
    /// retry window if longer). It must cover the provider's whole retry window, or a
    /// late retry runs the handler again.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Accepts a [`retention`](Self::retention) shorter than the verifier's
    /// [`retry_window`](Verifier::retry_window), which the builder refuses otherwise
    /// ([`ConfigError::RetentionBelowRetryWindow`]): a retry the provider sends
    /// after its record expired then runs the handler again.
    pub fn allow_retention_below_retry_window(mut self) -> Self {
        self.short_retention = true;
        self
    }

    /// Whether to deduplicate by the signed content too, where the verifier's
    /// scheme does not sign its event id (default: on). A verifier that gives a
    /// [`content_key`](Verifier::content_key) (GitHub, Shopify, Linear, Jamm) then
    /// has it claimed beside the id, under a namespace of the guard's own
    /// (`"\u{1}content:"` and a hash of the namespace), kept for the retention:
    ///
    /// - the signed content replayed under any other id is answered
    ///   [`Outcome::Duplicate`](crate::Outcome::Duplicate) (or
    ///   [`Outcome::InProgress`](crate::Outcome::InProgress) while its first
    ///   delivery runs), the handler not run and the replay's id never claimed, so
    ///   a captured delivery cannot take an id the provider will use later;
    /// - the provider's own retry (the same content, or Linear's re-signed body
    ///   under the same id) is deduplicated as before, and a content whose handler
    ///   failed is released with it, so its retry (or a copy under another id, if
    ///   that comes first) runs it; a crash between the two claims leaves the
    ///   content's claim to run out its lease, as an id's would;
    /// - with conflict detection, the fingerprint kept is the content key (for
    ///   Jamm, the signed `content`, not the unsigned envelope around it).
    ///
    /// Cost: one more store round trip for a delivery answered at its content's
    /// claim (a duplicate of a finished content costs one, as before); two more
    /// (the content's claim and its finish) for a delivery that runs the handler
    /// or meets its id already known.
    pub fn content_keys(mut self, on: bool) -> Self {
        self.content_keys = on;
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

    /// Whether to answer [`Outcome::Conflict`](crate::Outcome::Conflict) when an id comes back with another body
    /// (compared by SHA-256). Default: on, unless the verifier says its provider
    /// changes the body between retries (Linear). Off, the body is not hashed and the
    /// record keeps [`Fingerprint::UNKNOWN`](crate::store::Fingerprint::UNKNOWN).
    /// Guards of either setting may share a store: a fingerprint one of them did
    /// not compare is never a conflict, and a failed event is run again by either.
    pub fn detect_conflicts(mut self, on: bool) -> Self {
        self.fingerprint = Some(on);
        self
    }

    /// Overrides the HTTP status answered for `kind`. A handshake is always answered
    /// with its own status (the provider checks it): an override for
    /// [`OutcomeKind::Handshake`] is ignored.
    pub fn status(mut self, kind: OutcomeKind, status: StatusCode) -> Self {
        self.status[kind.index()] = Some(status);
        self
    }

    /// Builds the guard.
    ///
    /// # Errors
    /// [`ConfigError`] for a missing store or verifier, a retention below the lease,
    /// below twice the verifier's tolerance or (unless allowed) below its retry
    /// window, an event id left to a verifier that finds none, a zero duration,
    /// threshold or body limit, a duration past a century, a bad namespace, or tenants
    /// it cannot serve ([`ConfigError::Tenants`]).
    pub fn build(self) -> Result<WebhookGuard, ConfigError> {
        let store = self.store.ok_or(ConfigError::NoStore)?;
        let verifier = self.verifier.ok_or(ConfigError::NoVerifier)?;
        let fingerprint = self
            .fingerprint
            .unwrap_or(!verifier.body_changes_on_retry());
        let verifier_meta = verifier.event_meta();
        let event_type = self.event_type.or_else(|| verifier.event_type());
        let retention = self
            .retention
            .unwrap_or_else(|| DEFAULT_RETENTION.max(verifier.retry_window().unwrap_or_default()));
        let lease_delta = delta(self.lease, "lease")?;
        delta(self.store_timeout, "store_timeout")?;
        let answer_deadline = match self.answer_deadline {
            Some(deadline) => deadline,
            None => verifier.answer_timeout().map(|t| t * 4 / 5),
        };
        if let Some(deadline) = answer_deadline {
            delta(deadline, "answer_deadline")?;
        }
        let retention_delta = delta(retention, "retention")?;
        if retention < self.lease {
            return Err(ConfigError::RetentionBelowLease {
                retention,
                lease: self.lease,
            });
        }
        if matches!(self.event_id, EventId::FromVerifier) && !verifier.finds_event_id() {
            return Err(ConfigError::NoEventIdSource);
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
        if let Some(retry_window) = verifier.retry_window() {
            if retention < retry_window && !self.short_retention {
                return Err(ConfigError::RetentionBelowRetryWindow {
                    retention,
                    retry_window,
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
        let tenants = match self.tenants {
            Some(tenants) => Some(Arc::new(tenant_cache(
                tenants,
                &*verifier,
                ns,
                self.inbox.is_some(),
            )?)),
            None => None,
        };
        Ok(WebhookGuard {
            inner: Arc::new(Inner {
                store,
                verifier,
                clock: self.clock,
                safe_hooks: PanicSafe::wrap(self.hooks.clone()),
                hooks: self.hooks,
                followup_namespace: super::followup::followup_namespace(&self.namespace),
                content_namespace: (self.content_keys)
                    .then(|| super::content::content_namespace(&self.namespace)),
                namespace: self.namespace,
                event_id: self.event_id,
                lease: self.lease,
                lease_delta,
                store_timeout: self.store_timeout,
                answer_deadline,
                detached: crate::runtime::Slots::new(self.detached_limit),
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
                type_headers: event_type.as_ref().is_some_and(TypeSource::reads_headers),
                event_type,
                lost_searches: Arc::default(),
                dropped_searches: Arc::default(),
                tenants,
                served: None,
            }),
        })
    }
}

/// `value` behind an `Arc<D>`: an `Arc<D>` itself as it is, anything else put in
/// one by `wrap`. An `Arc` in an `Arc` would answer each call through two forwarding
/// impls (for a store, a second boxed future per call).
fn shared<T: 'static, D: ?Sized + 'static>(value: T, wrap: impl FnOnce(T) -> Arc<D>) -> Arc<D> {
    let mut value = Some(value);
    if let Some(arc) = (&mut value as &mut dyn Any).downcast_mut::<Option<Arc<D>>>() {
        return arc.take().expect("the value is there");
    }
    wrap(value.expect("the value is there"))
}

/// The cache of a guard serving `tenants`, with `verifier` as its template, in
/// namespace `ns`, with or without an inbox.
fn tenant_cache(
    tenants: Tenants,
    verifier: &dyn Verifier,
    ns: &str,
    inbox: bool,
) -> Result<TenantCache, ConfigError> {
    if verifier.with_secrets(&[]).is_none() {
        return Err(ConfigError::Tenants(
            "the verifier cannot be keyed with a tenant's secrets",
        ));
    }
    if inbox {
        return Err(ConfigError::Tenants("an inbox does not serve tenants"));
    }
    if ns.len() > MAX_TENANT_GUARD_NAMESPACE {
        return Err(ConfigError::Tenants(
            "the namespace of a guard serving tenants is at most 26 bytes",
        ));
    }
    if tenants.capacity == 0 {
        return Err(ConfigError::Tenants(
            "the cache must hold at least one tenant",
        ));
    }
    let ttl = delta(tenants.ttl, "tenant cache ttl")?;
    let unknown_ttl = delta(tenants.unknown_ttl, "unknown tenant ttl")?;
    Ok(TenantCache::new(tenants, ttl, unknown_ttl))
}

fn delta(d: Duration, what: &'static str) -> Result<TimeDelta, ConfigError> {
    if d.is_zero() || d > crate::CENTURY {
        return Err(ConfigError::BadDuration(what));
    }
    TimeDelta::from_std(d).map_err(|_| ConfigError::BadDuration(what))
}

impl WebhookGuard {
    /// Starts building a guard.
    ///
    /// ```
    /// use webhook_guard::{MemoryStore, WebhookGuard, verify::HmacSha256Header};
    ///
    /// let guard = WebhookGuard::builder()
    ///     .store(MemoryStore::new())
    ///     .verifier(HmacSha256Header::new("X-Signature", ["a-random-secret-of-32-characters"]).unwrap())
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
            store_timeout: DEFAULT_STORE_TIMEOUT,
            answer_deadline: None,
            detached_limit: DEFAULT_DETACHED_LIMIT,
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
            event_type: None,
            tenants: None,
            short_retention: false,
            content_keys: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::store::DynProcessedStore;
    use crate::verify::NoVerification;
    use crate::{MemoryStore, WebhookGuard};

    #[test]
    fn a_shared_store_is_kept_as_it_is() {
        let store: Arc<DynProcessedStore> = Arc::new(MemoryStore::new());
        let guard = WebhookGuard::builder()
            .store(store.clone())
            .verifier(NoVerification)
            .event_id(crate::EventId::header("X-Id"))
            .build()
            .unwrap();
        assert!(Arc::ptr_eq(guard.store(), &store), "not wrapped again");
    }
}
