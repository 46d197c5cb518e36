//! [`Claimed`]: a won claim, which the run step finishes with
//! [`Claimed::complete`] or [`Claimed::fail`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::cancellation::{Detachable, RecordOnDrop};
use super::state::{ClaimState, Failure};
use super::{Event, OwnedEvent};
use crate::outcome::{HandlerError, Outcome, Unrecorded};
use crate::reconcile::ReconcileReason;
use crate::runtime::{self, error_text};
use crate::store::{Fence, RecordState, StoreError};

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

    pub(super) fn take(mut self) -> Arc<ClaimState> {
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
