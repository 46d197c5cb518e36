//! Settling a leased event, and making the settle again while the store fails it.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{delta, Held, Inner};
use crate::inbox::{InboxState, RenewLease, Settle};
use crate::reconcile::ReconcileReason;
use crate::runtime::Backoff;
use crate::store::{Fence, StoreError};

/// The first wait before a settle the store failed is made again; the waits double
/// up to [`AGAIN_CAP`].
const AGAIN_FIRST: Duration = Duration::from_millis(50);
const AGAIN_CAP: Duration = Duration::from_secs(1);

impl Inner {
    /// Settles the `held` event (its attempt given back unless it `counts`); `true`
    /// when applied. A lost lease after a run (an attempt that counts, not a stale
    /// skip) is an ambiguous outcome: another worker has the event, and the
    /// reconciler is told. A settle the store fails is made again (see
    /// [`Inner::settle_again`]) while the lease, as last confirmed (`held.until`),
    /// holds.
    pub(super) async fn settle_at(
        &self,
        held: &mut Held<'_>,
        state: InboxState,
        error: Option<&str>,
        next_attempt_at: DateTime<Utc>,
        counts: bool,
    ) -> bool {
        let event = held.event;
        let now = self.clock.now();
        // Bounded once NULs are replaced (each becomes three bytes).
        let error =
            error.map(|e| crate::runtime::bounded_error(crate::without_nul(e).into_owned()));
        let settle = Settle {
            holder: event.holder(),
            state,
            next_attempt_at,
            error: error.as_deref(),
            now,
            expires_at: crate::later(now, delta(self.retention)),
            attempt_counts: counts,
        };
        let answer = match self.inbox.settle_event(&settle).await {
            Err(e) => self.settle_again(held, &settle, e).await,
            answer => answer,
        };
        match answer {
            Ok(Fence::Applied) => true,
            // Another worker has the event now. After a run, the outcome is
            // ambiguous: the reconciler is told. An event put back unrun (its attempt
            // given back) or skipped as stale ran no handler: nothing to reconcile.
            Ok(Fence::LeaseLost) if counts && state != InboxState::Skipped => {
                tracing::warn!(id = %event.id, "inbox lease lost while the handler ran");
                self.reconcile(event, ReconcileReason::LeaseLost).await;
                false
            }
            Ok(Fence::LeaseLost) => {
                tracing::warn!(id = %event.id, "inbox lease lost before the handler ran");
                false
            }
            Err(e) => {
                tracing::warn!(id = %event.id, error = %e, "could not settle an inbox event; its lease will run out");
                false
            }
        }
    }

    /// Makes `settle`, which the store failed with `error`, again: the same settle
    /// (its time included), so that a try whose answer was lost and the next one
    /// agree (the store answers `Applied` to the same settle made again). Tries
    /// at doubling intervals, from 50 ms up to a second apart, and renews the lease
    /// (confirmed until `held.until`, which a renewal moves) once a third of it has
    /// passed since it was last confirmed. Stops at the store's first answer, or
    /// with the last error when the lease the store confirmed has ended by the
    /// worker's clock (another worker may lease the event then), or once a lease
    /// has passed since the first failure (a store that renews but keeps failing
    /// the settle holds the event no longer than that).
    async fn settle_again(
        &self,
        held: &mut Held<'_>,
        settle: &Settle<'_>,
        error: StoreError,
    ) -> Result<Fence, StoreError> {
        let event = held.event;
        tracing::debug!(id = %event.id, error = %error, "could not settle an inbox event; trying again while its lease holds");
        let ended = "inbox lease ran out before the event could be settled";
        let every = self.lease / 3;
        let mut backoff = Backoff::new(AGAIN_FIRST, AGAIN_CAP, self.lease);
        let mut last = error;
        loop {
            let Some(left) = self.held_for(held, ended) else {
                return Err(last);
            };
            let more = tokio::select! {
                more = backoff.wait() => more,
                () = tokio::time::sleep(left) => true,
            };
            if !more {
                return Err(last);
            }
            let Some(left) = self.held_for(held, ended) else {
                return Err(last);
            };
            if left <= self.lease.saturating_sub(every) {
                // Only an applied renewal moves the lease. A lost one leaves the
                // settle to answer: the event may hold this very settle already.
                let until = crate::later(self.clock.now(), delta(self.lease));
                let renew = RenewLease {
                    holder: settle.holder,
                    lease_until: until,
                };
                if let Ok(Fence::Applied) = self.inbox.renew_event(&renew).await {
                    held.until = until;
                }
            }
            match self.inbox.settle_event(settle).await {
                Err(e) => last = e,
                answer => return answer,
            }
        }
    }
}
