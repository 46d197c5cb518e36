//! Hooks: where the host alerts, logs or reconciles its own way.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use crate::inbox::InboxEvent;
use crate::meta::EventMeta;
use crate::outcome::{Outcome, Unrecorded};
use crate::store::{FailureNote, Key, Record};

/// What the escalation hook is told. Its `Debug` shows the body's length only.
#[derive(derive_more::Debug)]
#[non_exhaustive]
pub struct Escalation<'a> {
    /// The escalated id.
    pub key: Key<'a>,
    /// The body of the delivery that escalated.
    #[debug("{:?}", crate::BodyLen(body.len()))]
    pub body: &'a [u8],
    /// How many times the id failed.
    pub failures: u32,
    /// The latest failures, oldest first.
    pub history: &'a [FailureNote],
    /// `true` when the escalation was recorded by a process that died before it
    /// called this hook, and the guard calls it now: at the id's next delivery
    /// (`body` is that delivery's) or from the guard's sweeper (`body` is empty).
    pub resumed: bool,
}

/// What the outcome hook is told at the end of every delivery.
#[derive(Debug)]
#[non_exhaustive]
pub struct DeliveryReport<'a> {
    /// The guard's namespace (for a tenant's delivery, that of the guard serving
    /// the tenants, not the tenant's own: see [`crate::tenant`]).
    pub namespace: &'a str,
    /// The tenant, for a delivery run through a tenant's guard.
    pub tenant: Option<&'a str>,
    /// What became of the delivery.
    pub outcome: &'a Outcome,
    /// Which claim of the id this was, when the store was reached.
    pub attempt: Option<u32>,
    /// From the start of verification to the outcome.
    pub elapsed: Duration,
    /// From winning the claim to the handler's result, when this delivery ran it.
    pub handler: Option<Duration>,
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepReport {
    /// Records purged.
    pub purged: u64,
    /// `InProgress` records whose lease ran out (up to the sweeper's stuck limit).
    pub stuck: usize,
    /// How long ago the oldest of those leases ran out.
    pub oldest_stuck: Option<Duration>,
    /// Whether the stuck leases were counted: `false` when the store failed to list
    /// them (then `stuck` and `oldest_stuck` say nothing; `purged` still holds).
    pub stuck_counted: bool,
    /// Escalations and permanent failures whose process died after recording them
    /// and before announcing them, announced by this pass (a guard's sweeper only:
    /// the hook called, the reconciler asked).
    pub followed_up: usize,
}

/// Callbacks on what the guard does. Every method has a no-op default; implement the
/// ones you need. They run on the delivery's task (on a background task for the
/// work of a delivery dropped mid-way, or a claim dropped unfinished): keep them
/// quick, and spawn anything slow (an API call to reconcile, a page to the on-call).
///
/// Hooks never receive secrets. A hook that panics is logged (at `ERROR`) and the
/// guard or worker goes on as if it had returned.
#[auto_impl::auto_impl(Arc, Box)]
pub trait Hooks: fmt::Debug + Send + Sync + 'static {
    /// A delivery won the claim of `key`; `attempt` counts claims of this id.
    fn on_claim(&self, key: Key<'_>, attempt: u32) {
        let _ = (key, attempt);
    }

    /// A delivery of an id already finished was answered without running the handler.
    fn on_duplicate(&self, record: &Record) {
        let _ = record;
    }

    /// An id came back with a different body. Worth an alert.
    fn on_conflict(&self, key: Key<'_>) {
        let _ = key;
    }

    /// The handler failed with a retryable error; `failures` counts them for the id.
    fn on_failure(&self, key: Key<'_>, failures: u32, error: &str) {
        let _ = (key, failures, error);
    }

    /// The id failed `escalate_after` times: alert, and reconcile the object through
    /// the provider's API.
    ///
    /// Called at least once per escalated id. More than once when the process
    /// died between recording the escalation and releasing its follow-up marker
    /// (the id's next delivery, or the guard's sweeper, calls it again, with
    /// [`Escalation::resumed`] set), and when the store could not record the
    /// escalation (it is recorded in the background; should that never land, a
    /// redelivery after the lease escalates again). Make it idempotent per key.
    fn on_escalation(&self, escalation: &Escalation<'_>) {
        let _ = escalation;
    }

    /// The handler reported a permanent failure. Worth an alert.
    ///
    /// Called at least once per id, as [`Hooks::on_escalation`] is: again when the
    /// process died after recording the failure and before releasing its follow-up
    /// marker (then `error` is the latest failure the record keeps). Make it
    /// idempotent per key.
    fn on_permanent_failure(&self, key: Key<'_>, error: &str) {
        let _ = (key, error);
    }

    /// The handler succeeded but its completion could not be recorded. Worth an alert:
    /// the guard keeps trying to record it in the background, but if the store stays
    /// down (or the lease was lost) the event may run again when redelivered after
    /// the lease runs out.
    fn on_unrecorded(&self, key: Key<'_>, reason: &Unrecorded) {
        let _ = (key, reason);
    }

    /// An event older than one already seen for its object and family was skipped
    /// (ordering guard). Hand it to your own logic if older events still matter.
    fn on_stale(&self, key: Key<'_>, meta: &EventMeta) {
        let _ = (key, meta);
    }

    /// The inbox worker gave up on an event (last attempt failed, or a permanent
    /// failure). Worth an alert; the reconciler is asked next.
    fn on_dead_letter(&self, event: &InboxEvent, error: &str) {
        let _ = (event, error);
    }

    /// The sweeper finished a pass. Read
    /// [`SweepReport::stuck_counted`](SweepReport::stuck_counted) before
    /// `stuck`: a pass whose stuck scan failed reports 0 stuck leases.
    fn on_sweep(&self, report: &SweepReport) {
        let _ = report;
    }

    /// A delivery ended with an outcome: called once for every delivery that
    /// reached the guard, whatever the outcome, after the more specific hooks
    /// above. The place for metrics. Not called for a request whose body could not
    /// be read (the integrations answer it before the guard sees it), nor for a
    /// delivery dropped before its handler could start: while its claim or its
    /// ordering check awaited the store (a claim it won is released in the
    /// background, unrun and counting no failure).
    fn on_outcome(&self, report: &DeliveryReport<'_>) {
        let _ = report;
    }
}

/// The hooks a guard or a worker calls: `hooks` with each call's panic caught and
/// logged, so that a hook cannot cut short the path that called it (a claim left
/// held to the end of its lease, an object left unsettled, a reconciler never
/// asked, a duplicate answered 500 at every retry).
#[derive(Debug)]
pub(crate) struct PanicSafe(pub(crate) Arc<dyn Hooks>);

impl PanicSafe {
    /// `hooks`, made panic-safe. Wrap the hooks as given, once: the guard keeps
    /// them as given beside the wrapped ones for a worker or sweeper made from it.
    pub(crate) fn wrap(hooks: Arc<dyn Hooks>) -> Arc<dyn Hooks> {
        Arc::new(Self(hooks))
    }
}

fn caught(hook: &'static str, call: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(call)) {
        let panic = crate::runtime::panic_message(&*panic);
        tracing::error!(
            hook,
            panic,
            "a hook panicked; going on as if it had returned"
        );
    }
}

#[deny(clippy::missing_trait_methods)]
impl Hooks for PanicSafe {
    fn on_claim(&self, key: Key<'_>, attempt: u32) {
        caught("on_claim", || self.0.on_claim(key, attempt));
    }
    fn on_duplicate(&self, record: &Record) {
        caught("on_duplicate", || self.0.on_duplicate(record));
    }
    fn on_conflict(&self, key: Key<'_>) {
        caught("on_conflict", || self.0.on_conflict(key));
    }
    fn on_failure(&self, key: Key<'_>, failures: u32, error: &str) {
        caught("on_failure", || self.0.on_failure(key, failures, error));
    }
    fn on_escalation(&self, escalation: &Escalation<'_>) {
        caught("on_escalation", || self.0.on_escalation(escalation));
    }
    fn on_permanent_failure(&self, key: Key<'_>, error: &str) {
        caught("on_permanent_failure", || {
            self.0.on_permanent_failure(key, error);
        });
    }
    fn on_unrecorded(&self, key: Key<'_>, reason: &Unrecorded) {
        caught("on_unrecorded", || self.0.on_unrecorded(key, reason));
    }
    fn on_stale(&self, key: Key<'_>, meta: &EventMeta) {
        caught("on_stale", || self.0.on_stale(key, meta));
    }
    fn on_dead_letter(&self, event: &InboxEvent, error: &str) {
        caught("on_dead_letter", || self.0.on_dead_letter(event, error));
    }
    fn on_sweep(&self, report: &SweepReport) {
        caught("on_sweep", || self.0.on_sweep(report));
    }
    fn on_outcome(&self, report: &DeliveryReport<'_>) {
        caught("on_outcome", || self.0.on_outcome(report));
    }
}

/// Hooks that do nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_escalation_shows_its_body_length_only() {
        let escalation = Escalation {
            key: Key::new("ns", "evt_1"),
            body: b"PAYLOAD-MARKER",
            failures: 5,
            history: &[],
            resumed: false,
        };
        let text = format!("{escalation:?}");
        assert!(!text.contains("PAYLOAD-MARKER"), "{text}");
        // A derived `Debug` prints the bytes as numbers, not as text.
        let as_bytes = format!("{:?}", &b"PAYLOAD-MARKER"[..]);
        assert!(!text.contains(&as_bytes[1..as_bytes.len() - 1]), "{text}");
        assert!(text.contains("<14 bytes>"), "{text}");
    }
}
