//! Runtime helpers shared by the guard, the inbox worker, the sweeper, the hooks
//! and the integrations: catching panics, bounded error text, tracing spans,
//! retry waits and detached work. Everything that needs tokio sits behind the one
//! `tokio` gate in this file; nothing here depends on the delivery flow.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

/// The longest handler error text the guard and the inbox worker keep, in bytes:
/// a longer one is cut on a character boundary and marked `… (cut)`, so that a
/// failure's history, its log line and the stores' columns stay bounded (MySQL
/// keeps a history in a `MEDIUMTEXT`, and a statement within `max_allowed_packet`).
pub const MAX_ERROR_LEN: usize = 2048;

/// `text`, cut to at most [`MAX_ERROR_LEN`] bytes, its mark included.
pub(crate) fn bounded_error(mut text: String) -> String {
    const MARK: &str = "… (cut)";
    if text.len() > MAX_ERROR_LEN {
        let mut cut = MAX_ERROR_LEN - MARK.len();
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(MARK);
    }
    text
}

/// The text of a handler's error, bounded by [`bounded_error`]. An error whose
/// `Display` panics (a host's bug) is kept as such a failure, not let through to
/// unwind the delivery or the worker (which would leave the claim or the event to
/// run out its lease).
pub(crate) fn error_text(error: &dyn fmt::Display) -> String {
    let text = std::panic::catch_unwind(AssertUnwindSafe(|| error.to_string()));
    bounded_error(text.unwrap_or_else(|panic| {
        format!(
            "the handler's error could not be written: its Display panicked: {}",
            panic_message(&*panic)
        )
    }))
}

/// Runs `fut` to its end, catching a panic at any of its polls.
pub(crate) async fn catch_unwind<F: Future>(fut: F) -> Result<F::Output, Box<dyn Any + Send>> {
    let mut fut = pin!(fut);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    })
    .await
}

/// The message of a caught panic, when it is a string.
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}

/// `span`, or no span at all when no subscriber takes it: entering a disabled span
/// at every poll still costs (with tracing's `log` feature, a `log` level check at
/// each enter and exit), for nothing a subscriber sees.
pub(crate) fn enterable(span: tracing::Span) -> tracing::Span {
    if span.is_disabled() {
        tracing::Span::none()
    } else {
        span
    }
}

/// `work`'s output, or `None` when it did not finish within `budget` (with the
/// `tokio` feature and a runtime; otherwise it is awaited whole). Work ready at its
/// first poll sets no timer.
pub(crate) async fn within<F: Future>(budget: Duration, work: F) -> Option<F::Output> {
    let mut work = std::pin::pin!(work);
    let first = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await;
    if let Poll::Ready(out) = first {
        return Some(out);
    }
    imp::timeout(budget, work).await
}

/// The current span, or `None` when no tracing subscriber was ever set (so there
/// is no span to record on, and looking one up would cost a thread-local access).
pub(crate) fn current_span() -> Option<tracing::Span> {
    tracing::dispatcher::has_been_set().then(tracing::Span::current)
}

/// The waits of a background retry: the first `first` (zero: try at once), then
/// doubling (from 25 ms) up to `cap`, until `within` has passed (a `within` of zero:
/// the first try only). On the runtime's clock, as the waits: a paused test clock
/// must not spin a retry loop. Only detached work waits on it (see [`current`]).
pub(crate) struct Backoff {
    deadline: imp::Instant,
    wait: Duration,
    cap: Duration,
    tried: bool,
}

impl Backoff {
    pub(crate) fn new(first: Duration, cap: Duration, within: Duration) -> Self {
        Self {
            deadline: imp::Instant::now() + within,
            wait: first,
            cap,
            tried: false,
        }
    }

    /// Waits for the next try (never past the deadline); `false` once the deadline
    /// has passed, with no try left. The first try is always made.
    pub(crate) async fn wait(&mut self) -> bool {
        let left = self.deadline.saturating_duration_since(imp::Instant::now());
        if left.is_zero() && self.tried {
            return false;
        }
        self.tried = true;
        imp::sleep(self.wait.min(left)).await;
        self.wait = (self.wait * 2).clamp(Duration::from_millis(25), self.cap);
        true
    }
}

pub(crate) use imp::*;

/// The runtime detached work runs on: tokio's, with the `tokio` feature.
#[cfg(feature = "tokio")]
mod imp {
    use std::future::Future;

    pub(super) use tokio::time::{sleep, Instant};

    /// A handle to the runtime the caller runs on.
    #[derive(Debug)]
    pub(crate) struct Runtime(tokio::runtime::Handle);

    /// The runtime the caller runs on, if any: detached work (a dropped delivery's
    /// release, a recording retried in the background, a reconcile) needs one.
    pub(crate) fn current() -> Option<Runtime> {
        tokio::runtime::Handle::try_current().ok().map(Runtime)
    }

    /// `work` within `budget` on the runtime's timer; without a runtime, whole.
    pub(super) async fn timeout<F: Future>(
        budget: std::time::Duration,
        work: F,
    ) -> Option<F::Output> {
        if current().is_none() {
            return Some(work.await);
        }
        tokio::time::timeout(budget, work).await.ok()
    }

    impl Runtime {
        /// Spawns `work`, detached: nothing waits for it.
        pub(crate) fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
            drop(self.0.spawn(work));
        }
    }

    /// A bound on the tasks spawned for one purpose (handlers that outlive their
    /// request), and a way to wait for them all. A clone shares the bound (a
    /// guard's tenants share their guard's).
    #[derive(Debug, Clone)]
    pub(crate) struct Slots {
        semaphore: std::sync::Arc<tokio::sync::Semaphore>,
        limit: u32,
    }

    /// One taken slot, given back on drop.
    pub(crate) struct Slot(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

    impl Slots {
        pub(crate) fn new(limit: u32) -> Self {
            Self {
                semaphore: std::sync::Arc::new(tokio::sync::Semaphore::new(limit as usize)),
                limit,
            }
        }

        /// A free slot, if any.
        pub(crate) fn take(&self) -> Option<Slot> {
            self.semaphore.clone().try_acquire_owned().ok().map(Slot)
        }

        /// Waits at most `grace` for every slot to be free again: how many are
        /// still taken then.
        pub(crate) async fn drain(&self, grace: std::time::Duration) -> usize {
            let all = self.semaphore.acquire_many(self.limit);
            match tokio::time::timeout(grace, all).await {
                Ok(_) => 0,
                Err(_) => self.limit as usize - self.semaphore.available_permits(),
            }
        }
    }

    /// A loop spawned on tokio, and the signal that stops it.
    #[derive(Debug)]
    pub(crate) struct Spawned {
        stop: tokio::sync::watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Spawned {
        /// Spawns the loop `work` makes of what it waits on to stop.
        pub(crate) fn new<F, Fut>(work: F) -> Self
        where
            F: FnOnce(Stopped) -> Fut,
            Fut: Future<Output = ()> + Send + 'static,
        {
            let (stop, rx) = tokio::sync::watch::channel(false);
            let stopped = Stopped {
                rx,
                detached: false,
            };
            let task = tokio::spawn(work(stopped));
            Self { stop, task }
        }

        /// Asks the loop to stop, and waits for it to end.
        pub(crate) async fn shutdown(self) {
            let _ = self.stop.send(true);
            let _ = self.task.await;
        }

        /// Ends the loop at once.
        pub(crate) fn abort(self) {
            self.task.abort();
        }

        /// Whether the loop has ended.
        #[cfg(test)]
        pub(crate) fn is_finished(&self) -> bool {
            self.task.is_finished()
        }
    }

    /// What a spawned loop waits on to stop. A dropped handle detaches the loop: it
    /// never stops it.
    pub(crate) struct Stopped {
        rx: tokio::sync::watch::Receiver<bool>,
        detached: bool,
    }

    impl Stopped {
        /// Whether a stop was requested.
        pub(crate) fn is_requested(&self) -> bool {
            *self.rx.borrow()
        }

        /// Resolves when a stop is requested; never, once the handle is dropped.
        pub(crate) async fn requested(&mut self) {
            if !self.detached && self.rx.changed().await.is_ok() {
                return;
            }
            self.detached = true;
            std::future::pending().await
        }
    }
}

/// Without the `tokio` feature there is no runtime: detached work is dropped, so
/// nothing waits on a [`Backoff`](super::Backoff).
#[cfg(not(feature = "tokio"))]
mod imp {
    use std::future::Future;
    use std::time::Duration;

    pub(super) use std::time::Instant;

    /// No runtime: never made.
    #[derive(Debug)]
    pub(crate) enum Runtime {}

    /// No runtime without the `tokio` feature.
    pub(crate) fn current() -> Option<Runtime> {
        None
    }

    /// Without a timer, `work` whole.
    pub(super) async fn timeout<F: Future>(budget: Duration, work: F) -> Option<F::Output> {
        let _ = budget;
        Some(work.await)
    }

    impl Runtime {
        pub(crate) fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
            drop(work);
            match *self {}
        }
    }

    /// No slots without a runtime: nothing is spawned.
    #[derive(Debug, Clone)]
    pub(crate) struct Slots;

    /// Never taken.
    pub(crate) enum Slot {}

    impl Slots {
        pub(crate) fn new(limit: u32) -> Self {
            let _ = limit;
            Self
        }

        pub(crate) fn take(&self) -> Option<Slot> {
            None
        }
    }

    /// Never awaited: only detached work waits, and none is spawned.
    pub(super) async fn sleep(wait: Duration) {
        let _ = wait;
    }
}

#[cfg(test)]
mod tests {
    use super::{bounded_error, MAX_ERROR_LEN};

    #[test]
    fn long_error_text_is_cut_on_a_character_boundary() {
        assert_eq!(bounded_error("short".into()), "short");
        let long = "é".repeat(MAX_ERROR_LEN);
        let cut = bounded_error(long);
        assert!(cut.len() <= MAX_ERROR_LEN, "{}", cut.len());
        assert!(cut.ends_with("… (cut)"));
    }
}
