//! The retention sweeper: purges expired records, reports stuck leases and, for a
//! guard's sweeper, announces failures for good a crashed process left unannounced.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::hooks::{Hooks, PanicSafe, SweepReport};
use crate::store::{DynProcessedStore, StoreError};

/// Purges expired records in batches and counts stuck leases.
///
/// Build it with [`Sweeper::new`] or [`WebhookGuard::sweeper`](crate::WebhookGuard::sweeper);
/// call [`Sweeper::sweep`] yourself, or [`Sweeper::spawn`] it on tokio.
#[derive(Debug, Clone)]
pub struct Sweeper {
    store: Arc<DynProcessedStore>,
    clock: Arc<dyn Clock>,
    hooks: Arc<dyn Hooks>,
    interval: Duration,
    batch: usize,
    max_batches: usize,
    stuck_limit: usize,
    /// The guard whose follow-up markers this sweeper pays (made by
    /// [`WebhookGuard::sweeper`](crate::WebhookGuard::sweeper)).
    guard: Option<crate::WebhookGuard>,
}

impl Sweeper {
    /// A sweeper over `store`: every 60 s, batches of 1,000, at most 100 batches a pass.
    pub fn new(
        store: Arc<DynProcessedStore>,
        clock: Arc<dyn Clock>,
        hooks: Arc<dyn Hooks>,
    ) -> Self {
        Self {
            store,
            clock,
            hooks: PanicSafe::wrap(hooks),
            interval: Duration::from_secs(60),
            batch: 1000,
            max_batches: 100,
            stuck_limit: 1000,
            guard: None,
        }
    }

    /// Time between passes (at least 1 ms, at most a century).
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.clamp(Duration::from_millis(1), crate::CENTURY);
        self
    }

    /// Records purged per store call (at least 1).
    #[must_use]
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Store calls per pass at most (at least 1); the rest waits for the next pass.
    #[must_use]
    pub fn max_batches(mut self, n: usize) -> Self {
        self.max_batches = n.max(1);
        self
    }

    /// One pass: purge batches until one comes back short, then count stuck leases.
    ///
    /// A guard's sweeper ([`WebhookGuard::sweeper`](crate::WebhookGuard::sweeper))
    /// also finishes, among the stuck leases, the guard's follow-up markers: an
    /// escalation or permanent failure whose process died after recording it and
    /// before announcing it gets its hook called (an escalation's with an empty
    /// body), its reconcile asked (by event id: the object is read from the body,
    /// which the record does not keep), and is counted in
    /// [`SweepReport::followed_up`] instead of [`SweepReport::stuck`].
    ///
    /// # Errors
    /// The store's error (the purge's, if both failed). Unless both failed, the pass
    /// is reported to [`Hooks::on_sweep`] all the same, with what it did: a purge
    /// that keeps failing must not hide stuck leases, nor a failing stuck scan the
    /// records purged (then [`SweepReport::stuck_counted`] is `false`).
    pub async fn sweep(&self) -> Result<SweepReport, StoreError> {
        let now = self.clock.now();
        let mut report = SweepReport::default();
        let mut purge_error = None;
        for _ in 0..self.max_batches {
            match self.store.purge_expired(now, self.batch).await {
                Ok(n) => {
                    report.purged += n;
                    if n < self.batch as u64 {
                        break;
                    }
                }
                Err(e) => {
                    purge_error = Some(e);
                    break;
                }
            }
        }
        let stuck_error = match self.store.stuck(now, self.stuck_limit).await {
            Ok(mut stuck) => {
                if let Some(guard) = &self.guard {
                    report.followed_up = follow_up(guard, &mut stuck).await;
                }
                report.stuck = stuck.len();
                report.oldest_stuck = stuck
                    .iter()
                    .map(|r| r.lease_until)
                    .min()
                    .and_then(|at| (now - at).to_std().ok());
                report.stuck_counted = true;
                None
            }
            Err(e) => Some(e),
        };
        // A pass that learned something is reported; one where both failed is not.
        if purge_error.is_none() || stuck_error.is_none() {
            self.hooks.on_sweep(&report);
        }
        match purge_error.or(stuck_error) {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Runs [`Sweeper::sweep`] every interval on tokio, skipping the immediate first
    /// tick. A store error, or a panic in the store or a hook, is logged and the
    /// sweeper goes on.
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    ///
    /// Dropping the returned handle lets the sweeper run on, detached (as dropping a
    /// tokio `JoinHandle` does); keep the handle to stop it.
    #[must_use = "keep the handle to stop the sweeper (dropping it leaves it running)"]
    pub fn spawn(self) -> SweeperHandle {
        let task = crate::runtime::Spawned::new(move |mut stopped| async move {
            let mut ticks = tokio::time::interval(self.interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                tokio::select! {
                    // A stop requested while a tick is due too ends the loop first.
                    biased;
                    () = stopped.requested() => return,
                    _ = ticks.tick() => {}
                }
                // A panicking hook or store must not end the sweeps for good.
                match crate::runtime::catch_unwind(self.sweep()).await {
                    Ok(Ok(r)) if r.purged > 0 || r.stuck > 0 => {
                        tracing::info!(purged = r.purged, stuck = r.stuck, "webhook-guard sweep");
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "webhook-guard sweep failed; will retry")
                    }
                    Err(panic) => tracing::error!(
                        panic = crate::runtime::panic_message(&*panic),
                        "webhook-guard sweep panicked; will retry"
                    ),
                }
            }
        });
        SweeperHandle { task }
    }
}

/// Stops a spawned sweeper.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
#[derive(Debug)]
pub struct SweeperHandle {
    task: crate::runtime::Spawned,
}

#[cfg(feature = "tokio")]
impl SweeperHandle {
    /// Stops the sweeper after its current pass and waits for it.
    pub async fn shutdown(self) {
        self.task.shutdown().await;
    }
}

impl crate::WebhookGuard {
    /// A sweeper over this guard's store, clock and hooks, which also finishes the
    /// guard's follow-ups a crashed process left (see [`Sweeper::sweep`]).
    pub fn sweeper(&self) -> Sweeper {
        let mut sweeper = Sweeper::new(
            self.store().clone(),
            self.clock().clone(),
            self.hooks().clone(),
        );
        sweeper.guard = Some(self.clone());
        sweeper
    }
}

/// Pays the debts of `guard`'s follow-up markers among the `stuck` leases, and
/// leaves in `stuck` the rest (other leases, and markers that could not be paid
/// now): how many were announced.
async fn follow_up(guard: &crate::WebhookGuard, stuck: &mut Vec<crate::store::Record>) -> usize {
    use crate::guard::Paid;
    let mut announced = 0;
    let mut left = Vec::with_capacity(stuck.len());
    for record in stuck.drain(..) {
        if !guard.is_marker(&record) {
            left.push(record);
            continue;
        }
        match guard.pay_stuck(&record).await {
            Ok(Paid::Announced) => announced += 1,
            Ok(Paid::Released | Paid::Busy) => {}
            Err(e) => {
                tracing::warn!(id = %record.id, error = %e, "could not finish a follow-up; the next sweep tries again");
                left.push(record);
            }
        }
    }
    *stuck = left;
    announced
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use super::*;

    /// An interval past a century is a century, as every interval the crate takes
    /// (the crate's docs say so); and a sweeper spawned with `Duration::MAX` runs.
    #[tokio::test(start_paused = true)]
    async fn the_longest_interval_is_a_century_and_the_sweeper_lives() {
        let guard = crate::WebhookGuard::builder()
            .store(crate::MemoryStore::new())
            .verifier(crate::verify::NoVerification)
            .event_id(crate::EventId::header("x-id"))
            .build()
            .unwrap();
        let sweeper = guard.sweeper().interval(Duration::MAX);
        assert_eq!(sweeper.interval, crate::CENTURY);
        let handle = sweeper.spawn();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!handle.task.is_finished(), "the sweeper still runs");
        handle.shutdown().await;
    }
}
