//! Metrics through the [`metrics` facade](::metrics): plug in any recorder
//! (Prometheus, StatsD, OpenTelemetry, ...) and the guard reports to it.
//!
//! Two pieces, both opt-in:
//!
//! - [`MetricsHooks`], a [`Hooks`] implementation (wrapping your own hooks, if any)
//!   that counts outcomes, times deliveries and handlers, and reports sweeps;
//! - [`MeteredStore`], a [`ProcessedStore`] wrapper that times every store call.
//!
//! ```
//! use webhook_guard::metrics::{MeteredStore, MetricsHooks};
//! use webhook_guard::hooks::NoHooks;
//! use webhook_guard::{verify::NoVerification, MemoryStore, WebhookGuard};
//!
//! webhook_guard::metrics::describe();
//! let guard = WebhookGuard::builder()
//!     .namespace("stripe")
//!     .store(MeteredStore::new(MemoryStore::new()))
//!     .hooks(MetricsHooks::wrap(NoHooks)) // or your own hooks
//!     .verifier(NoVerification)
//!     .event_id(webhook_guard::EventId::header("X-Event-Id"))
//!     .build()
//!     .unwrap();
//! # drop(guard);
//! ```
//!
//! # Metrics
//!
//! | Name | Type | Labels | What |
//! |---|---|---|---|
//! | `webhook_guard_deliveries_total` | counter | `namespace`, `outcome` | deliveries, by [`OutcomeKind`](crate::outcome::OutcomeKind) name (`processed`, `duplicate`, `in_progress`, `rejected`, `conflict`, `retryable_failure`, `escalated`, `permanent_failure`, `unrecorded`, `store_unavailable`, `accepted`, `stale`, `handshake`) |
//! | `webhook_guard_delivery_duration_seconds` | histogram | `namespace`, `outcome` | from the start of verification to the outcome |
//! | `webhook_guard_handler_duration_seconds` | histogram | `namespace`, `outcome` | the handler's run, for deliveries that ran it |
//! | `webhook_guard_store_call_duration_seconds` | histogram | `op`, `result` | each store call ([`MeteredStore`]); `op` is `claim`, `finish`, `renew`, `get`, `delete`, `purge_expired` or `stuck`, `result` is `ok` or `error` |
//! | `webhook_guard_sweeper_purged_total` | counter | | records the sweeper purged |
//! | `webhook_guard_stuck_leases` | gauge | | claims whose lease ran out unfinished, at the last sweep (up to the sweeper's limit) |
//! | `webhook_guard_unrouted_events_total` | counter | `namespace` | events a [`Router`](crate::route::Router) gave to its fallback: a type without a route, or no type |
//! | `webhook_guard_invalid_payloads_total` | counter | `namespace`, `policy` | routed events whose payload did not deserialize into the handler's type, by [`InvalidPayload`](crate::route::InvalidPayload) policy (`retry`, `permanent`, `ignore`) |
//!
//! The names are also constants in this module. No label holds an event id, a body
//! or a secret.

use std::future::Future;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::hooks::SweepReport;
use crate::hooks::{DeliveryReport, Escalation, Hooks, NoHooks};
use crate::outcome::Unrecorded;
use crate::store::{
    Claim, ClaimRequest, Deleted, Fence, Finish, Holder, Key, ListingStore, ProcessedStore, Record,
    Renew, StoreError,
};

/// Counter: deliveries by `namespace` and `outcome`.
pub const DELIVERIES_TOTAL: &str = "webhook_guard_deliveries_total";
/// Histogram (seconds): whole deliveries, by `namespace` and `outcome`.
pub const DELIVERY_DURATION: &str = "webhook_guard_delivery_duration_seconds";
/// Histogram (seconds): handler runs, by `namespace` and `outcome`.
pub const HANDLER_DURATION: &str = "webhook_guard_handler_duration_seconds";
/// Histogram (seconds): store calls, by `op` and `result`.
pub const STORE_CALL_DURATION: &str = "webhook_guard_store_call_duration_seconds";
/// Counter: records purged by the sweeper.
pub const SWEEPER_PURGED_TOTAL: &str = "webhook_guard_sweeper_purged_total";
/// Gauge: stuck leases seen by the last sweep.
pub const STUCK_LEASES: &str = "webhook_guard_stuck_leases";
/// Counter: events a router gave to its fallback, by `namespace`.
pub const UNROUTED_TOTAL: &str = "webhook_guard_unrouted_events_total";
/// Counter: routed events whose payload did not fit, by `namespace` and `policy`.
pub const INVALID_PAYLOADS_TOTAL: &str = "webhook_guard_invalid_payloads_total";

/// Registers a description and unit for each metric with the installed recorder.
/// Optional; call it once after installing the recorder.
pub fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(DELIVERIES_TOTAL, "Webhook deliveries by outcome");
    describe_histogram!(
        DELIVERY_DURATION,
        Unit::Seconds,
        "Webhook delivery time, verification to outcome"
    );
    describe_histogram!(HANDLER_DURATION, Unit::Seconds, "Webhook handler run time");
    describe_histogram!(
        STORE_CALL_DURATION,
        Unit::Seconds,
        "Processed-store call latency"
    );
    describe_counter!(SWEEPER_PURGED_TOTAL, "Expired records purged");
    describe_gauge!(STUCK_LEASES, "Claims whose lease ran out unfinished");
    describe_counter!(
        UNROUTED_TOTAL,
        "Webhook events a router gave to its fallback"
    );
    describe_counter!(
        INVALID_PAYLOADS_TOTAL,
        "Routed webhook events whose payload did not fit the handler's type"
    );
}

/// [`Hooks`] that record metrics, then call the wrapped hooks. See the
/// [module docs](self) for the metric names.
#[derive(Debug, Clone, Default)]
pub struct MetricsHooks<H = NoHooks> {
    inner: H,
}

impl MetricsHooks {
    /// Metrics only.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<H: Hooks> MetricsHooks<H> {
    /// Metrics, then `inner`'s hooks.
    pub fn wrap(inner: H) -> Self {
        Self { inner }
    }

    /// The wrapped hooks.
    pub fn inner(&self) -> &H {
        &self.inner
    }
}

#[deny(clippy::missing_trait_methods)]
impl<H: Hooks> Hooks for MetricsHooks<H> {
    fn on_claim(&self, key: Key<'_>, attempt: u32) {
        self.inner.on_claim(key, attempt);
    }

    fn on_duplicate(&self, record: &Record) {
        self.inner.on_duplicate(record);
    }

    fn on_conflict(&self, key: Key<'_>) {
        self.inner.on_conflict(key);
    }

    fn on_failure(&self, key: Key<'_>, failures: u32, error: &str) {
        self.inner.on_failure(key, failures, error);
    }

    fn on_escalation(&self, escalation: &Escalation<'_>) {
        self.inner.on_escalation(escalation);
    }

    fn on_permanent_failure(&self, key: Key<'_>, error: &str) {
        self.inner.on_permanent_failure(key, error);
    }

    fn on_unrecorded(&self, key: Key<'_>, reason: &Unrecorded) {
        self.inner.on_unrecorded(key, reason);
    }

    fn on_stale(&self, key: Key<'_>, meta: &crate::meta::EventMeta) {
        self.inner.on_stale(key, meta);
    }

    fn on_dead_letter(&self, event: &crate::inbox::InboxEvent, error: &str) {
        self.inner.on_dead_letter(event, error);
    }

    fn on_sweep(&self, report: &SweepReport) {
        ::metrics::counter!(SWEEPER_PURGED_TOTAL).increment(report.purged);
        // A gauge is an f64; a count of stuck leases fits exactly. Left as it was
        // when the stuck scan failed.
        #[allow(clippy::cast_precision_loss)]
        if report.stuck_counted {
            ::metrics::gauge!(STUCK_LEASES).set(report.stuck as f64);
        }
        self.inner.on_sweep(report);
    }

    fn on_outcome(&self, report: &DeliveryReport<'_>) {
        let namespace = report.namespace.to_owned();
        let outcome = report.outcome.kind().as_str();
        ::metrics::counter!(DELIVERIES_TOTAL, "namespace" => namespace.clone(), "outcome" => outcome)
            .increment(1);
        ::metrics::histogram!(DELIVERY_DURATION, "namespace" => namespace.clone(), "outcome" => outcome)
            .record(report.elapsed.as_secs_f64());
        if let Some(handler) = report.handler {
            ::metrics::histogram!(HANDLER_DURATION, "namespace" => namespace, "outcome" => outcome)
                .record(handler.as_secs_f64());
        }
        self.inner.on_outcome(report);
    }
}

/// A [`ProcessedStore`] that times every call of the store it wraps
/// (`webhook_guard_store_call_duration_seconds{op, result}`), and otherwise passes
/// each call through unchanged.
#[derive(Debug, Clone, Default)]
pub struct MeteredStore<S> {
    inner: S,
}

impl<S: ProcessedStore> MeteredStore<S> {
    /// Times the calls of `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

/// Awaits `call`, then records how long it took and whether it failed.
async fn timed<T>(
    op: &'static str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let result = call.await;
    let elapsed: Duration = started.elapsed();
    let outcome = if result.is_ok() { "ok" } else { "error" };
    ::metrics::histogram!(STORE_CALL_DURATION, "op" => op, "result" => outcome)
        .record(elapsed.as_secs_f64());
    result
}

#[async_trait::async_trait]
impl<S: ProcessedStore> ProcessedStore for MeteredStore<S> {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        timed("claim", self.inner.claim(request)).await
    }

    async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError> {
        timed("finish", self.inner.finish(holder, finish)).await
    }

    async fn renew(&self, holder: Holder<'_>, renew: &Renew) -> Result<Fence, StoreError> {
        timed("renew", self.inner.renew(holder, renew)).await
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        timed("get", self.inner.get(key)).await
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        timed("delete", self.inner.delete(key, now)).await
    }

    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        timed("purge_expired", self.inner.purge_expired(now, limit)).await
    }

    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        timed("stuck", self.inner.stuck(now, limit)).await
    }

    fn record_listing(&self) -> Option<&dyn ListingStore> {
        self.inner.record_listing()
    }
}
