//! What an id that failed for good still owes once its record says so: the hook,
//! its object marked failed, the reconciler. A follow-up marker keeps the debt in
//! the store, so that no crash between the record and the hook abandons it.
//!
//! The order, for an escalation and a permanent failure alike:
//! 1. the claim's lease renewed (which confirms the claim still holds the id), then
//!    the object settled `Failed` (with an ordering store): `reconcile_stale` lists
//!    it from here on;
//! 2. the marker claimed: a record under the guard's follow-up namespace and the
//!    event id, `InProgress` with a lease;
//! 3. the id's record finished `Escalated` / `PermanentFailure`;
//! 4. the hook called, the reconciler asked;
//! 5. the marker released (finished `Failed`, which a later claim may take again).
//!
//! A process that dies before 3 lands leaves the id's record held: its lease runs
//! out and a redelivery takes it over, as after any crash before a record (an
//! escalation is reached again at that claim, which counts the abandoned attempt,
//! and runs no handler). One that dies after 3 leaves the marker held: once its
//! lease ran out, the id's next delivery (answered `Duplicate`) or the guard's
//! sweeper pays the debt — calls the hook, settles the object, asks the reconciler
//! — and releases it. The hook is so called at least once, more than once only
//! across a crash or a lost lease.

use std::time::Instant;

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};

use super::state::ClaimState;
use super::{store, LeaseError, WebhookGuard};
use crate::hooks::Escalation;
use crate::meta::EventMeta;
use crate::ordering::ObjectStatus;
use crate::reconcile::ReconcileReason;
use crate::store::{
    Claim, ClaimRequest, Fence, FencingToken, Fingerprint, Finish, Holder, Key, Record, RecordState,
};

/// The namespace of the follow-up markers of the guard in `namespace`: a control
/// character (which no guard's namespace holds) and a hash of `namespace`, so it
/// fits every store's namespace column whatever the namespace's length.
pub(super) fn followup_namespace(namespace: &str) -> String {
    let digest = Sha256::digest(namespace.as_bytes());
    format!("\u{1}followup:{}", hex::encode(&digest[..8]))
}

/// The follow-up marker a failure for good holds while it announces itself: its
/// token when this claim holds it.
#[must_use]
pub(super) struct Owed(Option<FencingToken>);

/// What the sweeper did with a stuck follow-up marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Paid {
    /// The hook called, the object settled, the reconciler asked, for a failure for
    /// good a crashed process had recorded but not announced.
    Announced,
    /// Nothing was owed (the process died before the id's record was finished):
    /// the marker released.
    Released,
    /// Another delivery or sweeper took the marker first.
    Busy,
}

impl WebhookGuard {
    /// The key of `id`'s follow-up marker.
    fn marker<'a>(&'a self, id: &'a str) -> Key<'a> {
        Key::new(&self.inner.followup_namespace, id)
    }

    /// Whether `record` is one of this guard's follow-up markers, or of one of its
    /// tenants'.
    pub(crate) fn is_marker(&self, record: &Record) -> bool {
        record.namespace == self.inner.followup_namespace
            || self.tenant_marker_part(record).is_some()
    }

    /// Claims `id`'s marker at `now`: its token when granted (also by taking over
    /// one whose lease ran out), `None` when another holds it or the store failed.
    async fn claim_marker(&self, id: &str, now: DateTime<Utc>) -> Option<FencingToken> {
        let inner = &self.inner;
        let request = ClaimRequest {
            key: self.marker(id),
            fingerprint: Fingerprint::UNKNOWN,
            token: FencingToken::random(),
            now,
            lease_until: crate::later(now, inner.lease_delta),
            expires_at: crate::later(now, inner.retention_delta),
        };
        match store(inner).claim(&request).await {
            Ok(Claim::Acquired(_)) => Some(request.token),
            Ok(Claim::Existing(record)) if request.made(&record) => Some(request.token),
            Ok(Claim::Existing(_)) => None,
            Err(e) => {
                tracing::warn!(%id, error = %e, "could not claim a follow-up marker; a crash before the hook would go unnoticed");
                None
            }
        }
    }

    /// Releases `id`'s marker held by `token`: nothing is owed any more.
    async fn release_marker(&self, id: &str, token: FencingToken) {
        let inner = &self.inner;
        let now = inner.clock.now();
        let finish = Finish {
            state: RecordState::Failed,
            failures: 0,
            history: &[],
            now,
            expires_at: crate::later(now, inner.retention_delta),
        };
        match store(inner)
            .finish(Holder::new(self.marker(id), token), &finish)
            .await
        {
            Ok(Fence::Applied) => {}
            // Taken over by a sweeper or delivery that will pay it again.
            Ok(Fence::LeaseLost) => {
                tracing::debug!(%id, "a follow-up marker was taken over before its release");
            }
            Err(e) => {
                tracing::warn!(%id, error = %e, "could not release a follow-up marker; the hook may be called again once its lease ran out");
            }
        }
    }

    /// At a delivery of `record`'s id answered `Duplicate` (`record` failed for
    /// good): pays what a crashed process left owing for it, if its marker is held
    /// by a lease that ran out. One store read when nothing is owed.
    pub(super) async fn pay_owed(&self, record: &Record, body: &[u8], now: DateTime<Utc>) {
        let marker = match store(&self.inner).get(self.marker(&record.id)).await {
            Ok(Some(marker)) => marker,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(id = %record.id, error = %e, "could not read a follow-up marker");
                return;
            }
        };
        if marker.state != RecordState::InProgress || marker.lease_until > now {
            return;
        }
        if let Some(token) = self.claim_marker(&record.id, now).await {
            self.pay(record, token, Some(body), now).await;
        }
    }

    /// For the sweeper: pays the debt of the stuck marker `marker` (one of this
    /// guard's or its tenants' ([`WebhookGuard::is_marker`]), whose lease ran out),
    /// or releases it when nothing is owed.
    ///
    /// # Errors
    /// The store's error reading the id's record; the marker stays, for a next pass.
    pub(crate) async fn pay_stuck(
        &self,
        marker: &Record,
    ) -> Result<Paid, crate::store::StoreError> {
        match self.marker_owner(marker) {
            Some(owner) => owner.pay_own_stuck(marker).await,
            None => Ok(Paid::Busy),
        }
    }

    /// [`WebhookGuard::pay_stuck`] of a marker of this very guard.
    async fn pay_own_stuck(&self, marker: &Record) -> Result<Paid, crate::store::StoreError> {
        let now = self.inner.clock.now();
        let Some(token) = self.claim_marker(&marker.id, now).await else {
            return Ok(Paid::Busy);
        };
        let key = Key::new(&self.inner.namespace, &marker.id);
        match store(&self.inner).get(key).await? {
            Some(record) if failed_for_good(record.state) => {
                self.pay(&record, token, None, now).await;
                Ok(Paid::Announced)
            }
            _ => {
                self.release_marker(&marker.id, token).await;
                Ok(Paid::Released)
            }
        }
    }

    /// Announces `record`'s failure for good as its own delivery would have, holding
    /// its marker (`token`): the object settled failed (again: a fresh time for the
    /// reconcile's mark), the hook, the reconciler; then releases the marker.
    /// `body`, the delivery's that found the debt, gives the hook its body and the
    /// reconciler its object; the sweeper has none.
    async fn pay(
        &self,
        record: &Record,
        token: FencingToken,
        body: Option<&[u8]>,
        now: DateTime<Utc>,
    ) {
        let inner = &self.inner;
        let meta = match body {
            Some(body) if inner.ordering.is_some() || inner.reconciler.is_some() => {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.meta.extract(body)))
                    .unwrap_or_default()
            }
            _ => EventMeta::default(),
        };
        let ordered = inner.ordering.is_some() && crate::ordering::ordered(&record.id, &meta, now);
        let state = ClaimState {
            guard: self.clone(),
            id: record.id.clone(),
            token,
            record: record.clone(),
            meta,
            ordered,
            started: Instant::now(),
            claimed_at: Instant::now(),
            lease_cap: None,
            content: None,
            type_header: None,
        };
        tracing::warn!(id = %record.id, state = %record.state, "announcing a failure for good that a crashed process recorded but did not announce");
        state.settle_object(ObjectStatus::Failed).await;
        let reason = match record.state {
            RecordState::Escalated => {
                inner.safe_hooks.on_escalation(&Escalation {
                    key: state.key(),
                    body: body.unwrap_or_default(),
                    failures: record.failures,
                    history: &record.history,
                    resumed: true,
                });
                ReconcileReason::Escalated
            }
            _ => {
                let error = record.history.last().map_or("", |note| note.error.as_str());
                inner.safe_hooks.on_permanent_failure(state.key(), error);
                ReconcileReason::PermanentFailure
            }
        };
        state.reconcile(reason);
        self.release_marker(&record.id, token).await;
    }
}

impl ClaimState {
    /// Before this claim's record ends failed for good: settles the object failed
    /// and claims the id's follow-up marker — while this claim still holds the id,
    /// which a renewal of its lease confirms (a failure whose lease another
    /// delivery took over changes nothing, its object's status included).
    pub(super) async fn owe(&self, now: DateTime<Utc>) -> Owed {
        if let Err(LeaseError::Lost) = self.renew().await {
            return Owed(None);
        }
        self.settle_object(ObjectStatus::Failed).await;
        Owed(self.guard.claim_marker(&self.id, now).await)
    }

    /// Once the hook was called and the reconciler asked (or nothing is owed after
    /// all): releases the marker this claim holds.
    pub(super) async fn paid(&self, owed: Owed) {
        if let Some(token) = owed.0 {
            self.guard.release_marker(&self.id, token).await;
        }
    }
}

/// Whether a record in `state` failed for good: escalated, or failed permanently.
pub(super) fn failed_for_good(state: RecordState) -> bool {
    matches!(
        state,
        RecordState::Escalated | RecordState::PermanentFailure
    )
}
