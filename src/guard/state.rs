//! A won claim's state ([`ClaimState`], shared by the flow, the handler's event and
//! the work left to the background), and the ordering check made before the
//! handler runs. Recording the claim's end is in `record.rs`.

use std::time::Instant;

use chrono::{DateTime, Utc};

use super::{store, LeaseError, WebhookGuard};
use crate::meta::{EventMeta, EventType, TypeHeader};
use crate::ordering::{Freshness, ObjectKey, ObjectStatus, Observation};
use crate::outcome::Outcome;
use crate::reconcile::{ReconcileReason, ReconcileRequest};
use crate::store::{Fence, FencingToken, Finish, Holder, Key, Record, RecordState, Renew};

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
    /// The latest end of the claim's lease, renewals included, when the delivery
    /// has one ([`WebhookGuard::handle_owned_until`]).
    pub(super) lease_cap: Option<DateTime<Utc>>,
    /// The content key this claim holds beside its id (`content.rs`): ended as the
    /// id's record ends, renewed with it.
    pub(super) content: Option<super::content::ContentClaim>,
    /// The event type's header, read at verification (when the guard's type
    /// source names one).
    pub(super) type_header: Option<TypeHeader>,
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
        let newest = match ordering
            .observe(&Observation {
                key,
                created_at,
                now,
            })
            .await
        {
            Ok(Freshness::Fresh) => return None,
            Ok(Freshness::Stale { newest }) => newest,
            Err(error) => {
                // Our outage, not the handler's failure: release the claim without
                // counting a failure towards escalation.
                let release = self.finish_as(RecordState::Failed, now);
                self.end_content(RecordState::Failed).await;
                if let Err(e) = store(&self.guard.inner)
                    .finish(self.holder(), &release)
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
            .finish(self.holder(), &finish)
            .await;
        self.end_content(RecordState::Completed).await;
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
        let inner = &self.guard.inner;
        let (ordering, object) = (inner.ordering.as_ref(), self.object_key());
        crate::ordering::settle_object(ordering, &inner.clock, object, status, &self.id).await
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

    /// Ends the content key this claim holds, if any, in `state`.
    pub(super) async fn end_content(&self, state: RecordState) {
        if let Some(content) = &self.content {
            self.guard.end_content(content, state).await;
        }
    }

    /// The event's type: from the header kept at verification and `body`.
    pub(super) fn event_type<'a>(&'a self, body: &'a [u8]) -> Option<EventType<'a>> {
        let source = self.guard.inner.event_type.as_ref()?;
        source.read(self.type_header.as_ref(), body)
    }

    pub(super) fn key(&self) -> Key<'_> {
        Key::new(&self.guard.inner.namespace, &self.id)
    }

    /// The key with this claim's token: what each write of the claim carries.
    pub(super) fn holder(&self) -> Holder<'_> {
        Holder::new(self.key(), self.token)
    }

    pub(super) async fn renew(&self) -> Result<(), LeaseError> {
        let inner = &self.guard.inner;
        let now = inner.clock.now();
        let lease_until = super::capped(crate::later(now, inner.lease_delta), self.lease_cap, now);
        let expires_at = crate::later(now, inner.retention_delta);
        if let Some(content) = &self.content {
            (self.guard)
                .renew_content(content, lease_until, expires_at)
                .await;
        }
        let fence = store(inner)
            .renew(
                self.holder(),
                &Renew {
                    lease_until,
                    expires_at,
                },
            )
            .await?;
        match fence {
            Fence::Applied => Ok(()),
            Fence::LeaseLost => Err(LeaseError::Lost),
        }
    }
}

/// A handler's failure, as the guard records it.
#[derive(Debug)]
pub(super) enum Failure {
    Retryable(String),
    Permanent(String),
}
