//! Reconciliation: never trust delivery alone; ask the provider's API.
//!
//! Webhooks can be lost (an endpoint down for longer than the retry window), fail
//! for good, or end ambiguously (a handler timed out, a lease was lost mid-run). For
//! each of those the guard and the inbox worker call a [`Reconciler`] the host
//! implements — typically "fetch the charge / customer from the provider's API and
//! write what it says" (`GetCharge`, `GetCustomer`), keyed by the target object.

use std::fmt;
use std::future::Future;

use async_trait::async_trait;

use crate::meta::EventMeta;
use crate::store::BoxError;

/// Why reconciliation was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReconcileReason {
    /// The id failed `escalate_after` times and was answered 2xx.
    Escalated,
    /// The inbox worker gave up on the event after its last attempt.
    DeadLettered,
    /// The handler reported a permanent failure.
    PermanentFailure,
    /// The handler ran past its time limit: its effect is unknown.
    TimedOut,
    /// The lease was lost while the handler ran: its effect may be doubled or lost.
    LeaseLost,
    /// A periodic sweep found an object whose last event ended in failure.
    StaleFailure,
    /// The handler succeeded, but a newer event for the object was seen while it
    /// ran (the ordering guard checks before a handler runs), or another event
    /// created at the same time was settled first: the object may hold the older
    /// event's state.
    Overtaken,
}

impl ReconcileReason {
    /// The name used in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Escalated => "escalated",
            Self::DeadLettered => "dead_lettered",
            Self::PermanentFailure => "permanent_failure",
            Self::TimedOut => "timed_out",
            Self::LeaseLost => "lease_lost",
            Self::StaleFailure => "stale_failure",
            Self::Overtaken => "overtaken",
        }
    }
}

/// What needs reconciling.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcileRequest {
    /// The namespace.
    pub namespace: String,
    /// The webhook event id, when an event triggered the request.
    pub event_id: Option<String>,
    /// The event's metadata; `meta.object` is the key to reconcile by.
    pub meta: EventMeta,
    /// Why.
    pub reason: ReconcileReason,
}

impl ReconcileRequest {
    /// A request for `meta.object` in `namespace`.
    pub fn new(
        namespace: impl Into<String>,
        event_id: Option<String>,
        meta: EventMeta,
        reason: ReconcileReason,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            event_id,
            meta,
            reason,
        }
    }
}

/// Fetches the authoritative state of an object from the provider's API and records
/// it locally. Implemented by the host.
#[async_trait]
#[auto_impl::auto_impl(Arc, Box)]
pub trait Reconciler: fmt::Debug + Send + Sync + 'static {
    /// Reconciles the object named in `request` (`request.meta.object`).
    ///
    /// # Errors
    /// Any error; the guard logs it. With an ordering store, an object whose
    /// newest event failed for good (escalated, failed permanently, dead-lettered)
    /// stays listed for
    /// [`WebhookGuard::reconcile_stale`](crate::WebhookGuard::reconcile_stale),
    /// which asks again: run it periodically. Other reasons (an event overtaken, a
    /// lost lease) are not asked again. A panic is caught and logged the same way.
    async fn reconcile(&self, request: &ReconcileRequest) -> Result<(), BoxError>;
}

/// The two-layer read: answer from local state; when it has nothing, ask the
/// provider's API, and record what it said so the next read is local.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use webhook_guard::reconcile::two_layer;
///
/// // Local state has no subscription (its webhook never arrived); the API has one.
/// let saved = std::cell::Cell::new(false);
/// let active: Result<Option<&str>, String> = two_layer(
///     async { Ok(None) },
///     || async { Ok(Some("sub_active")) },
///     |_sub| async { saved.set(true); Ok(()) },
/// )
/// .await;
/// assert_eq!(active.unwrap(), Some("sub_active"));
/// assert!(saved.get());
/// # }
/// ```
///
/// # Errors
/// The local read's or the remote read's error. A failure to record the remote answer
/// is returned too, so the caller knows the next read will ask the API again.
pub async fn two_layer<T, E, L, R, RF, S, SF>(
    local: L,
    remote: R,
    record: S,
) -> Result<Option<T>, E>
where
    L: Future<Output = Result<Option<T>, E>>,
    R: FnOnce() -> RF,
    RF: Future<Output = Result<Option<T>, E>>,
    S: FnOnce(&T) -> SF,
    SF: Future<Output = Result<(), E>>,
{
    if let Some(found) = local.await? {
        return Ok(Some(found));
    }
    let Some(found) = remote().await? else {
        return Ok(None);
    };
    record(&found).await?;
    Ok(Some(found))
}
