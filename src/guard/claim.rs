//! A won claim: its state ([`ClaimState`], shared by the handler's event), the
//! ordering check made before the handler runs, and [`Claimed`], which the run
//! step finishes with [`Claimed::complete`] or [`Claimed::fail`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::cancellation::{Detachable, RecordOnDrop};
use super::record::Failure;
use super::{store, Event, LeaseError, OwnedEvent, WebhookGuard};
use crate::meta::EventMeta;
use crate::ordering::{Freshness, ObjectKey, ObjectStatus};
use crate::outcome::{HandlerError, Outcome, Unrecorded};
use crate::reconcile::{ReconcileReason, ReconcileRequest};
use crate::runtime::{self, error_text};
use crate::store::{Fence, FencingToken, Finish, Key, Record, RecordState, StoreError};

/// What a won claim shares between the flow, the handler's event and the work
/// left to the background.
#[derive(Debug)]
pub(super) struct ClaimState {
    /// The guard that claimed.
    pub(super) guard: WebhookGuard,
    /// The event id.
    pub(super) id: String,
    /// The claim's fencing token: every write of this claim carries it.
    pub(super) token: FencingToken,
    /// The record as the claim left it (attempts, failures, history).
    pub(super) record: Record,
    /// Type, creation time and object, read once the id was claimed.
    pub(super) meta: EventMeta,
    /// Whether the event takes part in ordering: an ordering store is set and the
    /// event has an object and a plausible `created_at` (decided at arrival).
    pub(super) ordered: bool,
    /// When the delivery began (before verification).
    pub(super) started: Instant,
    /// When the claim was won: the handler's clock starts here.
    pub(super) claimed_at: Instant,
}

impl ClaimState {
    /// The finish that ends this claim in `state` at `now`, keeping its failure
    /// count and history.
    pub(super) fn finish_as(&self, state: RecordState, now: DateTime<Utc>) -> Finish<'_> {
        let record = &self.record;
        (self.guard).finish_at(state, record.failures, &record.history, now)
    }

    /// The event's object and `created_at`, when it takes part in ordering.
    pub(super) fn object_key(&self) -> Option<(ObjectKey<'_>, DateTime<Utc>)> {
        let namespace = &self.guard.inner.namespace;
        self.ordered
            .then(|| crate::ordering::object_key(namespace, &self.meta))
            .flatten()
    }

    /// With an ordering store: `Some(Stale)` (the claim finished as completed) when a
    /// newer event was already seen for the object, `Some(StoreUnavailable)` when the
    /// ordering store failed (the claim released), `None` to run the handler.
    pub(super) async fn check_order(&self, now: DateTime<Utc>) -> Option<Outcome> {
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
    pub(super) async fn settle_object(&self, status: ObjectStatus) -> bool {
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

    pub(super) fn reconcile(&self, reason: ReconcileReason) {
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

    pub(super) fn key(&self) -> Key<'_> {
        Key::new(&self.guard.inner.namespace, &self.id)
    }

    pub(super) async fn renew(&self) -> Result<(), LeaseError> {
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
    pub(super) state: Option<Arc<ClaimState>>,
    pub(super) body: &'a [u8],
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
            let record = &state.record;
            let completed = RecordState::Completed;
            let result = (state.finish(completed, record.failures, &record.history, now)).await;
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

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        if let Some(runtime) = runtime::current() {
            // Copied: an escalation this failure reaches shows the body to its hook.
            let body = self.body.to_vec();
            runtime.spawn(async move {
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
