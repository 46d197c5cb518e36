//! [`CatchUp`]: passes over an [`EventSource`], each event run through the guard.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tracing::Instrument as _;

use super::cursor::{self, Held};
use super::{EventSource, PageRequest, SourceError};
use crate::outcome::{HandlerError, Outcome};
use crate::store::{Fence, StoreError};
use crate::{OwnedEvent, WebhookGuard};

/// How far inside the retention's edge a pass stops listing (see the module
/// docs): the time a pass takes, and clocks that disagree a little.
const EDGE: TimeDelta = TimeDelta::minutes(10);

/// The default time between passes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// A catch-up task: lists the events of an [`EventSource`] and runs each through
/// `guard` with `handler` (see the [module docs](super)).
///
/// Each pass ([`CatchUp::run_once`]) claims the source's cursor, then asks for
/// pages until the source is caught up, a page holds an event that could not be
/// settled (a retryable failure, an event another delivery holds: listed again
/// at the next pass), or an error; [`CatchUp::spawn`] runs a pass every
/// [interval](CatchUp::interval).
pub struct CatchUp<H> {
    guard: WebhookGuard,
    source: Arc<dyn EventSource>,
    handler: H,
    interval: Duration,
}

impl<H> fmt::Debug for CatchUp<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CatchUp")
            .field("namespace", &self.guard.namespace())
            .field("source", &self.source)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PassReport {
    /// Pages listed.
    pub pages: u32,
    /// Events listed.
    pub listed: usize,
    /// Events whose handler ran and succeeded here: the ones the deliveries missed.
    pub processed: usize,
    /// Events already settled (delivered, or listed by an earlier pass).
    pub duplicates: usize,
    /// Events that escalated or failed permanently here (their hooks were called).
    pub failed_for_good: usize,
    /// Events whose handler ran but whose record the store missed, and events
    /// older than one already settled for their object (`Unrecorded`, `Stale`).
    pub settled_otherwise: usize,
    /// Events refused by the guard (an id it does not take, a body over its
    /// limit): never runnable, logged, and passed over.
    pub rejected: usize,
    /// Events created before the guard's retention could tell them from
    /// processed ones: passed over (see the module docs).
    pub too_old: usize,
    /// Events not settled (a retryable failure, an event held by a delivery
    /// running now): their page is listed again at the next pass.
    pub unsettled: usize,
    /// The cursor kept at the end of the pass.
    pub cursor: Option<String>,
    /// The source said it is caught up to now.
    pub caught_up: bool,
    /// Another pass (another replica) held the cursor: this one listed nothing.
    pub busy: bool,
    /// Another pass took the cursor over during this one (a pause longer than
    /// the lease): this pass stopped, and moved no cursor after that.
    pub lease_lost: bool,
}

/// Why a pass ended early. What it settled before stays settled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatchUpError {
    /// The source could not list a page.
    #[error("catch-up source: {0}")]
    Source(#[from] SourceError),
    /// The store failed (the cursor stays where it was).
    #[error("catch-up store: {0}")]
    Store(#[from] StoreError),
    /// The source answered a cursor that cannot be kept (see [`super::Page::cursor`]).
    #[error("the source answered a cursor that cannot be kept: {0}")]
    InvalidCursor(&'static str),
    /// The source's name cannot be a record's id.
    #[error("the source's name cannot name its cursor: {0}")]
    InvalidName(&'static str),
}

impl<H, Fut> CatchUp<H>
where
    H: Fn(OwnedEvent) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    /// A task running `source`'s events through `guard` with `handler` (give it
    /// the handler of the webhook route: each event runs it once, whichever way
    /// it came).
    pub fn new(guard: WebhookGuard, source: impl EventSource, handler: H) -> Self {
        Self {
            guard,
            source: Arc::new(source),
            handler,
            interval: DEFAULT_INTERVAL,
        }
    }

    /// The time between two passes of [`CatchUp::spawn`] (default 60 s).
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.min(crate::CENTURY);
        self
    }

    /// One pass: claims the cursor, then lists and runs pages until the source
    /// is caught up or a page cannot be settled.
    ///
    /// # Errors
    /// [`CatchUpError`]: the source or the store failed, or the source answered a
    /// cursor that cannot be kept. The cursor is then where the last settled page
    /// left it.
    pub async fn run_once(&self) -> Result<PassReport, CatchUpError> {
        self.pass(None).await
    }

    async fn pass(
        &self,
        stop: Option<&crate::runtime::Stopped>,
    ) -> Result<PassReport, CatchUpError> {
        let name = self.source.name();
        check_name(name)?;
        let span = tracing::info_span!("webhook_catch_up", webhook.namespace = %self.guard.namespace(), source = %name);
        async move {
            let mut report = PassReport::default();
            loop {
                let now = self.guard.clock().now();
                let Some(held) = cursor::claim(&self.guard, name, now).await? else {
                    report.busy = true;
                    return Ok(report);
                };
                let more = self.page(held, now, &mut report).await?;
                let stopping = stop.is_some_and(|s| s.is_requested());
                if !more || stopping {
                    return Ok(report);
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Lists and runs the page after `held`'s cursor: whether to go on at once.
    async fn page(
        &self,
        mut held: Held,
        now: DateTime<Utc>,
        report: &mut PassReport,
    ) -> Result<bool, CatchUpError> {
        let not_before = not_before(&self.guard, now);
        let stored = held.cursor.clone();
        let request = PageRequest::new(stored.as_deref(), now, not_before);
        let page = match self.source.page(&request).await {
            Ok(page) if cursor::valid(&page.cursor) => page,
            listed => {
                // Nothing ran: the stored cursor stays (the release is best effort;
                // the lease runs out otherwise).
                let _ = held.release(stored.as_deref(), now).await;
                return match listed {
                    Err(e) => Err(e.into()),
                    Ok(_) => Err(CatchUpError::InvalidCursor(
                        "longer than MAX_CURSOR_LEN or not printable ASCII",
                    )),
                };
            }
        };
        report.pages += 1;
        report.listed += page.events.len();
        let mut settled = true;
        for event in page.events {
            if event.created.is_some_and(|created| created < not_before) {
                tracing::warn!(id = %event.id, "catch-up passed over an event older than the guard's retention");
                report.too_old += 1;
                continue;
            }
            if !held.keep(self.guard.clock().now()).await? {
                report.lease_lost = true;
                return Ok(false);
            }
            let handler = &self.handler;
            let id = event.id;
            let outcome = self.guard.handle_fetched(&id, event.body, handler).await;
            match outcome {
                Outcome::Processed { .. } => report.processed += 1,
                Outcome::Duplicate { .. } => report.duplicates += 1,
                Outcome::Escalated { .. } | Outcome::PermanentFailure { .. } => {
                    report.failed_for_good += 1;
                }
                // A fetched event is never a handshake (no verifier reads it).
                Outcome::Unrecorded { .. } | Outcome::Stale { .. } | Outcome::Handshake(_) => {
                    report.settled_otherwise += 1
                }
                Outcome::Rejected(rejection) => {
                    tracing::error!(%id, reason = %rejection, "catch-up passed over an event the guard refuses");
                    report.rejected += 1;
                }
                Outcome::StoreUnavailable { error, .. } => {
                    // The cursor's own release would meet the same store: its lease
                    // runs out, and the next pass lists the page again.
                    report.unsettled += 1;
                    return Err(error.into());
                }
                Outcome::RetryableFailure { .. } | Outcome::InProgress { .. } => {
                    report.unsettled += 1;
                    settled = false;
                }
                // Not answered to a fetched event (no inbox, a claim without a
                // fingerprint): counted as settled, as the guard answered it.
                Outcome::Accepted { .. } | Outcome::Conflict { .. } => {
                    report.settled_otherwise += 1
                }
            }
        }
        let kept = if settled {
            Some(page.cursor.as_str())
        } else {
            stored.as_deref()
        };
        match held.release(kept, self.guard.clock().now()).await? {
            Fence::Applied => report.cursor = kept.map(str::to_owned),
            Fence::LeaseLost => {
                report.lease_lost = true;
                return Ok(false);
            }
        }
        report.caught_up = settled && !page.more;
        if settled && page.more && kept == stored.as_deref() {
            // A source that says "more" without moving on would be asked again
            // forever: the pass ends here, and the next one asks again.
            tracing::warn!(
                source = self.source.name(),
                "the catch-up source answered the same cursor with more to come"
            );
            return Ok(false);
        }
        Ok(settled && page.more)
    }

    /// Runs a pass at once, then one every [interval](CatchUp::interval), on
    /// tokio. An error or a panic is logged and the task goes on.
    ///
    /// Dropping the returned handle lets the task run on, detached; keep it to
    /// stop the task.
    #[must_use = "keep the handle to stop the task (dropping it leaves it running)"]
    pub fn spawn(self) -> CatchUpHandle {
        let task = crate::runtime::Spawned::new(move |mut stopped| async move {
            loop {
                match crate::runtime::catch_unwind(self.pass(Some(&stopped))).await {
                    Ok(Ok(r)) if r.processed + r.failed_for_good + r.unsettled + r.rejected > 0 => {
                        tracing::info!(
                            source = self.source.name(),
                            processed = r.processed,
                            failed_for_good = r.failed_for_good,
                            unsettled = r.unsettled,
                            rejected = r.rejected,
                            "webhook-guard catch-up"
                        );
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(source = self.source.name(), error = %e, "webhook-guard catch-up failed; will retry");
                    }
                    Err(panic) => tracing::error!(
                        source = self.source.name(),
                        panic = crate::runtime::panic_message(&*panic),
                        "webhook-guard catch-up panicked; will retry"
                    ),
                }
                tokio::select! {
                    biased;
                    () = stopped.requested() => return,
                    () = tokio::time::sleep(self.interval) => {}
                }
            }
        });
        CatchUpHandle { task }
    }
}

/// The earliest creation time the guard's records cover at `now`, less [`EDGE`]
/// (half the retention, for a retention shorter than twice that).
fn not_before(guard: &WebhookGuard, now: DateTime<Utc>) -> DateTime<Utc> {
    let retention = TimeDelta::from_std(guard.retention()).unwrap_or(TimeDelta::MAX);
    let covered = retention - EDGE.min(retention / 2);
    now.checked_sub_signed(covered)
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

fn check_name(name: &str) -> Result<(), CatchUpError> {
    if name.is_empty() {
        Err(CatchUpError::InvalidName("empty"))
    } else if name.len() > crate::guard::MAX_ID_LEN {
        Err(CatchUpError::InvalidName("longer than 255 bytes"))
    } else if name.chars().any(char::is_control) {
        Err(CatchUpError::InvalidName("contains control characters"))
    } else {
        Ok(())
    }
}

/// Stops a spawned [`CatchUp`].
#[derive(Debug)]
pub struct CatchUpHandle {
    task: crate::runtime::Spawned,
}

impl CatchUpHandle {
    /// Stops the task once its current page is settled, and waits for it.
    pub async fn shutdown(self) {
        self.task.shutdown().await;
    }
}
