//! What a delivery dropped mid-way leaves to the background: a claim it won but
//! never ran is released ([`ReleaseOnDrop`], searched for within the guard's
//! [`MAX_SEARCHES`] slots), a success being recorded is recorded
//! ([`RecordOnDrop`]), and a failure's recording finishes ([`Detachable`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::Instrument as _;

use super::state::ClaimState;
use super::{store, WebhookGuard};
use crate::runtime::{self, Backoff};
use crate::store::{FencingToken, Holder, Key, RecordState};

/// How many claims the store did not answer are looked for at once, per guard, and
/// as many whose delivery was dropped: during an outage every delivery fails so,
/// and most of those claims never reached the store; when the store is slow,
/// senders hang up. The searches must not pile up against it.
pub(super) const MAX_SEARCHES: usize = 64;

/// Armed while a delivery awaits its claim or its ordering check, before a
/// [`Claimed`](super::Claimed) exists: if the delivery's future is dropped there, a claim the store
/// granted is released in the background (with the `tokio` feature and a runtime),
/// fenced by its token and without counting a failure, since no handler ran. A
/// claim still in flight is waited for until its lease would have run out. A claim
/// whose answer was lost ([`ReleaseOnDrop::lost`]) is released the same way.
pub(super) struct ReleaseOnDrop<'g> {
    guard: &'g WebhookGuard,
    id: &'g str,
    token: FencingToken,
    /// When the claim was made: its request's `now`, or the time the store kept.
    claimed_at: DateTime<Utc>,
    armed: bool,
}

impl<'g> ReleaseOnDrop<'g> {
    pub(super) fn arm(
        guard: &'g WebhookGuard,
        id: &'g str,
        token: FencingToken,
        claimed_at: DateTime<Utc>,
    ) -> Self {
        Self {
            guard,
            id,
            token,
            claimed_at,
            armed: true,
        }
    }

    pub(super) fn disarm(mut self) {
        self.armed = false;
    }

    /// The store could not be reached: the claim may still have been applied (a
    /// timeout after the request was sent, a batch answered late), with a token no
    /// delivery holds. Released in the background, as for a dropped delivery.
    /// At most [`MAX_SEARCHES`] at once; past that, such a claim (if it was
    /// applied at all) holds its lease to the end.
    pub(super) fn lost(mut self) {
        self.armed = false;
        let Some(slot) = self.search_slot(&self.guard.inner.lost_searches) else {
            tracing::debug!(id = %self.id, "claim not answered; too many searches already, not looked for");
            return;
        };
        if !self.release(Search::Lost { _slot: slot }) {
            return;
        }
        tracing::debug!(id = %self.id, "claim not answered; looking for it in the background in case it was applied");
    }

    /// One of the [`MAX_SEARCHES`] slots counted by `searches`, if one is free.
    fn search_slot(&self, searches: &Arc<AtomicUsize>) -> Option<SearchSlot> {
        searches
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_SEARCHES).then_some(n + 1)
            })
            .ok()?;
        Some(SearchSlot(searches.clone()))
    }

    /// Spawns the release; whether it was (with the `tokio` feature and a runtime).
    fn release(&self, search: Search) -> bool {
        let Some(runtime) = runtime::current() else {
            return false;
        };
        let (guard, id, token) = (self.guard.clone(), self.id.to_owned(), self.token);
        let claimed_at = self.claimed_at;
        runtime.spawn(async move { guard.release_unrun(&id, token, claimed_at, search).await });
        true
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        tracing::warn!(id = %self.id, "delivery dropped while claiming; releasing the claim in the background");
        let slot = self.search_slot(&self.guard.inner.dropped_searches);
        self.release(Search::Dropped { _slot: slot });
    }
}

/// Why a claim is released in the background: how long to look for it.
#[derive(Debug)]
enum Search {
    /// Its delivery was dropped: looked for at once, then, holding one of the
    /// guard's [`MAX_SEARCHES`] slots for dropped claims, up to the end of its lease
    /// (without a free slot, only at once: a slow store that many senders hang up
    /// on is not polled once per dropped delivery).
    Dropped {
        /// Given back when the search ends.
        _slot: Option<SearchSlot>,
    },
    /// The store did not answer it: looked for from a second on, for up to 30 s,
    /// holding one of the guard's [`MAX_SEARCHES`] slots.
    Lost {
        /// Given back when the search ends.
        _slot: SearchSlot,
    },
}

/// One of the guard's slots for searches of unanswered or dropped claims, given
/// back on drop.
#[derive(Debug)]
struct SearchSlot(Arc<AtomicUsize>);

impl Drop for SearchSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Work that must finish even if the delivery's future is dropped: polled in place,
/// inside the delivery's span, and spawned (with the `tokio` feature and a runtime)
/// if dropped unfinished, so it is never run twice nor left half done.
pub(crate) struct Detachable<T: Send + 'static>(Option<Pin<Box<dyn Future<Output = T> + Send>>>);

impl<T: Send + 'static> Detachable<T> {
    pub(crate) fn new(work: impl Future<Output = T> + Send + 'static) -> Self {
        Self(Some(Box::pin(work.instrument(tracing::Span::current()))))
    }
}

impl<T: Send + 'static> Future for Detachable<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        // Out while polled: work that panics is dropped as the panic unwinds, never
        // spawned to be polled again.
        let mut work = self
            .0
            .take()
            .expect("a Detachable is not polled after it finished");
        let out = work.as_mut().poll(cx);
        if out.is_pending() {
            self.0 = Some(work);
        }
        out
    }
}

impl<T: Send + 'static> Drop for Detachable<T> {
    fn drop(&mut self) {
        let Some(work) = self.0.take() else {
            return;
        };
        if let Some(runtime) = runtime::current() {
            tracing::debug!("delivery dropped mid-way; finishing its work in the background");
            runtime.spawn(async move {
                work.await;
            });
            return;
        }
        tracing::warn!("delivery dropped mid-way without a runtime; its unfinished work is lost");
        drop(work);
    }
}

/// Armed from the call of [`Claimed::complete`](super::Claimed::complete) until the store answered: if its
/// future is dropped before, the handler's success is recorded in the background
/// ([`ClaimState::record_completion_later`]).
pub(super) struct RecordOnDrop(pub(super) Option<Arc<ClaimState>>, pub(super) Duration);

impl RecordOnDrop {
    pub(super) fn state(&self) -> &Arc<ClaimState> {
        self.0.as_ref().expect("armed until disarmed")
    }

    pub(super) fn disarm(mut self) -> Arc<ClaimState> {
        self.0.take().expect("armed until disarmed")
    }
}

impl Drop for RecordOnDrop {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            tracing::warn!(id = %state.id, "delivery dropped while recording its success; recording it in the background");
            state.record_completion_later(Some(self.1));
        }
    }
}

impl WebhookGuard {
    /// Releases the claim `token` holds on `id`, if the store granted it, as a
    /// failed attempt that does not count towards escalation (its handler never
    /// ran): the record's failures and history stay as they are.
    ///
    /// The claim may still be in flight when its delivery is dropped (sent and not
    /// yet applied: a statement waiting for a row lock, a batch not yet answered),
    /// so until a record carries `token`, it is looked for again at doubling
    /// intervals (at most a tenth of the lease, or 1 s, apart) for as long as
    /// `search` says: up to the end of the claim's lease for a dropped delivery
    /// (after that, a later delivery takes a late claim over anyway; only at once
    /// when the guard's search slots are taken), 30 s for a claim the store did not
    /// answer.
    async fn release_unrun(
        &self,
        id: &str,
        token: FencingToken,
        claimed_at: DateTime<Utc>,
        search: Search,
    ) {
        let inner = &self.inner;
        let key = Key::new(&inner.namespace, id);
        let (first, within) = match &search {
            Search::Dropped { _slot: Some(_) } => (Duration::ZERO, inner.lease),
            Search::Dropped { _slot: None } => (Duration::ZERO, Duration::ZERO),
            // The store just failed: first look a second later, and over a shorter
            // span, so that an outage's failed claims do not hammer it.
            Search::Lost { .. } => (
                Duration::from_secs(1),
                inner.lease.min(Duration::from_secs(30)),
            ),
        };
        let cap = (inner.lease / 10).max(Duration::from_secs(1));
        let mut backoff = Backoff::new(first, cap, within);
        let mut failed = None;
        while backoff.wait().await {
            failed = match store(inner).get(key).await {
                Ok(Some(record)) if record.token == token => {
                    if record.state != RecordState::InProgress {
                        return; // released already (the answer was lost)
                    }
                    if !crate::store::made_at(&record, token, claimed_at) {
                        // The same token on a claim made at another time: a forked
                        // process's, going on with this one's token sequence. Not
                        // this claim's to release.
                        return;
                    }
                    let (failed, now) = (RecordState::Failed, inner.clock.now());
                    let release = self.finish_at(failed, record.failures, &record.history, now);
                    match store(inner).finish(Holder { key, token }, &release).await {
                        // Released, or taken over meanwhile: nothing left to do.
                        Ok(_) => return,
                        Err(e) => Some(e),
                    }
                }
                // Not granted (yet, or ever).
                Ok(_) => None,
                Err(e) => Some(e),
            };
            if let Some(e) = &failed {
                tracing::debug!(%id, error = %e, "releasing the claim again");
            }
        }
        // A dropped delivery's claim was sent; an unanswered one most often never
        // reached the store (an outage), which is no news.
        match (failed, &search) {
            (Some(e), Search::Dropped { .. }) => {
                tracing::warn!(%id, error = %e, "could not release a claim; its lease will run out")
            }
            (Some(e), Search::Lost { .. }) => {
                tracing::debug!(%id, error = %e, "could not look for an unanswered claim")
            }
            (None, _) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    /// Work that panicked is not spawned to be polled again when its `Detachable`
    /// is dropped by the unwinding.
    #[cfg(feature = "tokio")]
    #[tokio::test]
    async fn a_detachable_that_panicked_is_not_spawned() {
        use std::future::Future as _;
        let mut work = Box::pin(super::Detachable::new(async {
            panic!("a hook panicked");
        }));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = work.as_mut().poll(&mut cx);
        }));
        assert!(polled.is_err(), "the work panicked");
        drop(work);
        let tasks = tokio::runtime::Handle::current().metrics();
        assert_eq!(tasks.num_alive_tasks(), 0, "nothing was spawned");
    }
}
