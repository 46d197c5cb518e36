//! Recording how a claim ended: a success recorded late, a retryable failure
//! (escalated at the threshold), a permanent failure, and a finish the store
//! missed, retried in the background.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::Instrument as _;

use super::state::{ClaimState, Failure};
use super::{store, WebhookGuard};
use crate::hooks::Escalation;
use crate::ordering::ObjectStatus;
use crate::outcome::{Outcome, Unrecorded};
use crate::reconcile::ReconcileReason;
use crate::runtime::{self, Backoff};
use crate::store::{
    FailureNote, Fence, FencingToken, Finish, Holder, Key, RecordState, StoreError, HISTORY_LIMIT,
};

/// How a finish recorded in the background ended.
enum Late {
    /// Recorded, by this try or by an earlier one whose answer was lost.
    Recorded,
    /// Another claim took the record over first.
    TakenOver,
    /// The store kept failing until the deadline.
    GaveUp(StoreError),
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
    pub(super) fn record_completion_later(self: Arc<Self>, report: Option<Duration>) {
        if let Some(runtime) = runtime::current() {
            let span = tracing::Span::current();
            runtime.spawn(
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
    }

    /// The work of [`ClaimState::record_completion_later`]: `None` once recorded,
    /// else why not.
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
                self.end_content(state).await;
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
    pub(super) async fn settle_applied(&self) {
        if !self.settle_object(ObjectStatus::Applied).await {
            self.reconcile(ReconcileReason::Overtaken);
        }
    }

    pub(super) fn unrecorded(&self, reason: Unrecorded) -> Outcome {
        self.guard
            .inner
            .safe_hooks
            .on_unrecorded(self.key(), &reason);
        Outcome::Unrecorded {
            id: self.id.clone(),
            reason,
        }
    }

    pub(super) fn report(&self, outcome: &Outcome, handler: Duration) {
        self.guard.report(
            outcome,
            Some(self.record.attempts),
            self.started,
            Some(handler),
        );
    }

    pub(super) fn history_with(&self, now: DateTime<Utc>, error: String) -> Vec<FailureNote> {
        let mut history = self.record.history.clone();
        // The oldest go (a store may hand back more than the limit).
        let over = (history.len() + 1).saturating_sub(HISTORY_LIMIT);
        history.drain(..over);
        history.push(FailureNote { at: now, error });
        history
    }

    pub(super) async fn record_failure(&self, body: &[u8], failure: Failure) -> Outcome {
        match failure {
            Failure::Retryable(error) => self.fail_retryable(body, error).await,
            Failure::Permanent(error) => self.fail_permanent(error).await,
        }
    }

    pub(super) async fn fail_retryable(&self, body: &[u8], error: String) -> Outcome {
        let inner = &self.guard.inner;
        let now = inner.clock.now();
        let failures = self.record.failures.saturating_add(1);
        let history = self.history_with(now, error.clone());
        if failures >= inner.escalate_after {
            return self.escalate(body, failures, &history, now).await;
        }
        // Whatever the store says, the sender must retry. A release the store
        // missed is made in the background: held to the end of its lease, the
        // claim would answer the sender's early retries 409 and run nothing, so a
        // provider with few deliveries could give up before the failures reach
        // `escalate_after`. (Should it never land, the next claim after the lease
        // counts the failure.)
        let (state, unrecorded) = (RecordState::Failed, "could not release a failed claim");
        let ended = self.record_end(state, failures, &history, now, "failure", unrecorded);
        if let Err(lost) = ended.await {
            return lost;
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
        let (state, failures) = (
            RecordState::PermanentFailure,
            self.record.failures.saturating_add(1),
        );
        // The debt first (the object failed, the follow-up marker), then the
        // record: see `followup.rs`. Answered 200 even when the store fails (the
        // sender must not retry a permanent failure): recorded in the background
        // then, or a redelivery after the lease would run the handler again.
        let owed = self.owe(now).await;
        let unrecorded = "could not record a permanent failure";
        let ended = self.record_end(
            state,
            failures,
            &history,
            now,
            "permanent failure",
            unrecorded,
        );
        if let Err(lost) = ended.await {
            self.paid(owed).await;
            return lost;
        }
        inner.safe_hooks.on_permanent_failure(self.key(), &error);
        self.reconcile(ReconcileReason::PermanentFailure);
        self.paid(owed).await;
        Outcome::PermanentFailure {
            id: self.id.clone(),
            error,
        }
    }

    pub(super) async fn escalate(
        &self,
        body: &[u8],
        failures: u32,
        history: &[FailureNote],
        now: DateTime<Utc>,
    ) -> Outcome {
        // The debt first (the object failed, the follow-up marker), then the
        // record: see `followup.rs`. Escalated even when the store fails (answered
        // 200, the hook called): recorded in the background then, as a permanent
        // failure is. Should that never land, a redelivery after the lease escalates
        // at its claim, and calls the hook again. When someone else holds the id
        // now, they see the count.
        let owed = self.owe(now).await;
        let (state, unrecorded) = (RecordState::Escalated, "could not record an escalation");
        let outcome = match (self.record_end(
            state,
            failures,
            history,
            now,
            "escalation",
            unrecorded,
        ))
        .await
        {
            Ok(()) => self.escalated(body, failures, history),
            Err(lost) => lost,
        };
        self.paid(owed).await;
        outcome
    }

    /// Records this claim's end to `state` at `now`, the latest of `history` being
    /// the failure's text. `Err` with the answer when another delivery took the
    /// lease over before the `what` was recorded; a store error is logged
    /// (`unrecorded`) and the end recorded in the background.
    async fn record_end(
        &self,
        state: RecordState,
        failures: u32,
        history: &[FailureNote],
        now: DateTime<Utc>,
        what: &str,
        unrecorded: &str,
    ) -> Result<(), Outcome> {
        match self.finish(state, failures, history, now).await {
            Ok(Fence::Applied) => Ok(()),
            Ok(Fence::LeaseLost) => {
                let error = history.last().map_or("", |note| note.error.as_str());
                Err(self.lease_lost_before(error, what))
            }
            Err(e) => {
                tracing::warn!(id = %self.id, error = %e, "{unrecorded}; retrying in the background");
                self.finish_in_background(state, failures, history);
                Ok(())
            }
        }
    }

    /// An escalation recorded: the hook, the reconciler asked (the object was
    /// settled failed before the record).
    fn escalated(&self, body: &[u8], failures: u32, history: &[FailureNote]) -> Outcome {
        self.guard.inner.safe_hooks.on_escalation(&Escalation {
            key: self.key(),
            body,
            failures,
            history,
            resumed: false,
        });
        self.reconcile(ReconcileReason::Escalated);
        Outcome::Escalated {
            id: self.id.clone(),
            failures,
        }
    }

    /// Finishes this claim to `state` at `now`, fenced by its token: the store's
    /// answer, read by [`ClaimState::own_fence`].
    pub(super) async fn finish(
        &self,
        state: RecordState,
        failures: u32,
        history: &[FailureNote],
        now: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        let finish = self.guard.finish_at(state, failures, history, now);
        let fence = store(&self.guard.inner)
            .finish(self.holder(), &finish)
            .await;
        let fence = self.own_fence(fence, state).await;
        if let Ok(Fence::Applied) = fence {
            self.end_content(state).await;
        }
        fence
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
    pub(super) fn finish_in_background(
        &self,
        state: RecordState,
        failures: u32,
        history: &[FailureNote],
    ) {
        if let Some(runtime) = runtime::current() {
            let (guard, id, token) = (self.guard.clone(), self.id.clone(), self.token);
            let (history, content) = (history.to_vec(), self.content.clone());
            runtime.spawn(async move {
                let what = state.as_str();
                match guard
                    .finish_later(&id, token, state, failures, &history)
                    .await
                {
                    Late::Recorded => {
                        if let Some(content) = &content {
                            guard.end_content(content, state).await;
                        }
                    }
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
        tracing::warn!(id = %self.id, "no runtime to record a {} in the background; the lease will run out", state.as_str());
    }
}

impl WebhookGuard {
    /// A finish to `state` at `now`, kept for the guard's retention from then.
    pub(super) fn finish_at<'h>(
        &self,
        state: RecordState,
        failures: u32,
        history: &'h [FailureNote],
        now: DateTime<Utc>,
    ) -> Finish<'h> {
        Finish {
            state,
            failures,
            history,
            now,
            expires_at: crate::later(now, self.inner.retention_delta),
        }
    }

    /// Records a finish the store failed to record, fenced by `token`: again at
    /// doubling intervals (at most a second apart) for at least the lease (and at
    /// least a minute), until the store answers.
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
            let finish = self.finish_at(state, failures, history, inner.clock.now());
            let error = match store(inner).finish(Holder { key, token }, &finish).await {
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
    pub(super) async fn holds(
        &self,
        key: Key<'_>,
        token: FencingToken,
        state: RecordState,
    ) -> Result<bool, StoreError> {
        let record = store(&self.inner).get(key).await?;
        Ok(record.is_some_and(|r| r.token == token && r.state == state))
    }
}
