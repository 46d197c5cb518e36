//! Reconciliation: asking the reconciler in the background after an escalation,
//! a permanent failure or a lost lease, and [`WebhookGuard::reconcile_stale`] for
//! objects whose last event failed.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::WebhookGuard;
use crate::meta::EventMeta;
use crate::ordering::{FailedMark, FailedPage, ObjectStatus};
use crate::reconcile::{ReconcileReason, ReconcileRequest};
use crate::runtime::{self, catch_unwind, panic_message};
use crate::store::StoreError;

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

impl WebhookGuard {
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
            .failed_objects(&FailedPage {
                namespace: &inner.namespace,
                before,
                limit,
            })
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
                    let mark = FailedMark {
                        key: object.key(),
                        created_at: object.newest,
                        failed_since: object.updated_at,
                        status: ObjectStatus::Failed,
                        now,
                    };
                    if let Err(e) = ordering.mark_object_if_failed(&mark).await {
                        tracing::debug!(object = %object.object, error = %e, "could not requeue a failed object");
                    }
                }
            }
        }
        Ok(report)
    }

    /// Asks the reconciler in the background; with `mark_failed_since`, marks the
    /// request's object applied once it succeeds, if the object is still marked
    /// failed by this request's event (since that time, not by a later one).
    pub(super) fn spawn_reconcile(
        &self,
        request: ReconcileRequest,
        mark_failed_since: Option<DateTime<Utc>>,
    ) {
        let Some(reconciler) = self.inner.reconciler.clone() else {
            return;
        };
        if let Some(runtime) = runtime::current() {
            let guard = self.clone();
            runtime.spawn(async move {
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
