//! The inbox worker: leases stored events and runs the handler with its own retries.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};

use super::{InboxEvent, InboxState, InboxStore, LeaseRequest, RenewLease};
use crate::clock::{Clock, SystemClock};
use crate::hooks::{Hooks, NoHooks, PanicSafe};
use crate::ordering::{Freshness, ObjectKey, ObjectStatus, Observation, OrderingStore};
use crate::outcome::HandlerError;
use crate::reconcile::{ReconcileReason, ReconcileRequest, Reconciler};
use crate::runtime::{catch_unwind, panic_message};
use crate::store::{Fence, FencingToken, StoreError};

mod settle;

/// Processes one stored event. Implemented for closures
/// `Fn(InboxEvent) -> impl Future<Output = Result<(), HandlerError>>`.
#[async_trait]
pub trait InboxHandler: Send + Sync + 'static {
    /// Processes `event`. A retryable error is retried by the worker's policy.
    async fn handle(&self, event: &InboxEvent) -> Result<(), HandlerError>;
}

#[async_trait]
impl<F, Fut> InboxHandler for F
where
    F: Fn(InboxEvent) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send,
{
    async fn handle(&self, event: &InboxEvent) -> Result<(), HandlerError> {
        self(event.clone()).await
    }
}

/// When the worker retries a failed event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts before the event is dead-lettered (at least 1). Runs that never
    /// settle (the process died, the lease was lost) count too: an event leased
    /// more often than this is dead-lettered instead of being run again. A lease
    /// whose attempt was given back does not count: the worker's ordering store
    /// failed or did not answer, or the lease ended before the handler started.
    pub max_attempts: u32,
    /// The delay after the first failure; it doubles with each attempt.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
    /// Whether to spread each delay randomly over `[delay / 2, delay]`.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    /// 8 attempts, from 1 s doubling to at most 5 minutes, with jitter.
    fn default() -> Self {
        Self {
            max_attempts: 8,
            base: Duration::from_secs(1),
            max: Duration::from_secs(300),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// A policy of `max_attempts` attempts, exponential from `base` up to `max`.
    pub fn exponential(max_attempts: u32, base: Duration, max: Duration) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            base,
            max,
            jitter: true,
        }
    }

    /// The same policy without jitter (for tests and exact schedules).
    #[must_use]
    pub fn without_jitter(mut self) -> Self {
        self.jitter = false;
        self
    }

    /// The delay after failed attempt number `attempt` (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(31));
        let delay = self.base.saturating_mul(factor).min(self.max);
        if !self.jitter {
            return delay;
        }
        // Uniform in [delay/2, delay].
        let frac = (FencingToken::random().0 >> 11) as f64 / (1u64 << 53) as f64;
        delay.mul_f64(0.5 + frac / 2.0)
    }
}

/// Runs the handler over an inbox's due events. Build it with
/// [`WebhookGuard::worker`](crate::WebhookGuard::worker) (sharing the guard's inbox,
/// ordering store, reconciler, hooks and clock) or [`Worker::new`]; run it with
/// [`Worker::run_once`] or [`Worker::spawn`].
///
/// Several workers, in one process or many, can share one inbox: each event is leased
/// to one of them at a time; a dead worker's lease runs out and the event is leased
/// again. While the ordering check waits (at most three leases) and while a handler
/// runs, its worker renews the lease every third of the lease (at once if less than
/// two thirds are left), so a handler may run longer than the lease; if the lease is
/// lost (another worker leased the event, or renewals kept failing until the
/// worker's clock passed the last lease the store confirmed), the handler's future
/// is dropped and the reconciler asked. A handler that hangs therefore holds its event until
/// [`Worker::handler_timeout`] stops it: set one.
///
/// When the store fails a settle (the event done, put back for a retry, dead-lettered
/// or skipped), the worker keeps the settle and makes it again, at doubling intervals
/// from 50 ms up to a second apart, renewing the lease every third of it meanwhile,
/// until the store answers. It stops trying when the lease the store last confirmed
/// has ended by the worker's clock, or a lease after the first failure, whichever
/// comes first; the event then runs again once its lease has run out (at least once:
/// never lost). A store outage that ends a second or more before the lease left
/// when the handler finished (two thirds of a lease or more, while the store
/// answered the renewals) therefore runs no event twice. A stopping worker
/// ([`WorkerHandle::shutdown`]) waits for these tries as for a handler in flight:
/// at most until the lease ends.
#[derive(Debug, Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

/// A worker's settings: its `Debug` shows them all but the handler.
#[derive(Clone, derive_more::Debug)]
struct Inner {
    inbox: Arc<dyn InboxStore>,
    ordering: Option<Arc<dyn OrderingStore>>,
    reconciler: Option<Arc<dyn Reconciler>>,
    hooks: Arc<dyn Hooks>,
    clock: Arc<dyn Clock>,
    #[debug(skip)]
    handler: Arc<dyn InboxHandler>,
    namespace: String,
    policy: RetryPolicy,
    concurrency: usize,
    lease: Duration,
    poll: Duration,
    timeout: Option<Duration>,
    retention: Duration,
    /// The shortest `retention` takes (a guard's worker: what the guard requires of
    /// its own retention).
    retention_floor: Duration,
}

impl Worker {
    /// A worker over `inbox` for events of `namespace`, with default settings: 8
    /// attempts with exponential backoff, 8 events at a time, a 5-minute lease, polling
    /// every second, no handler time limit, settled events kept 72 h.
    pub fn new(
        inbox: Arc<dyn InboxStore>,
        namespace: impl Into<String>,
        handler: impl InboxHandler,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                inbox,
                ordering: None,
                reconciler: None,
                hooks: Arc::new(NoHooks),
                clock: Arc::new(SystemClock),
                handler: Arc::new(handler),
                namespace: namespace.into(),
                policy: RetryPolicy::default(),
                concurrency: 8,
                lease: Duration::from_secs(300),
                poll: Duration::from_secs(1),
                timeout: None,
                retention: Duration::from_secs(72 * 3600),
                retention_floor: Duration::ZERO,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        f(Arc::make_mut(&mut self.inner));
        self
    }

    /// The retry policy.
    #[must_use]
    pub fn retry_policy(self, mut policy: RetryPolicy) -> Self {
        // At least 1, as the field says: with none, every event would go dead unrun.
        policy.max_attempts = policy.max_attempts.max(1);
        self.with(|i| i.policy = policy)
    }

    /// How many events run at once (at least 1).
    #[must_use]
    pub fn concurrency(self, n: usize) -> Self {
        self.with(|i| i.concurrency = n.max(1))
    }

    /// How long a lease holds before another worker may take the event, unless the
    /// worker holding it renews it (it does, every third of the lease, while the
    /// ordering check waits and while the handler runs). At least 100 ms (a shorter lease, zero say, would end before
    /// its event ran, so that another lease could take it meanwhile, and would renew
    /// without pause); at most a century.
    #[must_use]
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|i| i.lease = lease.clamp(MIN_LEASE, crate::CENTURY))
    }

    /// How long to wait when no event is due, or the inbox store failed (at least
    /// 1 ms, at most a century).
    #[must_use]
    pub fn poll_interval(self, poll: Duration) -> Self {
        self.with(|i| i.poll = poll.clamp(Duration::from_millis(1), crate::CENTURY))
    }

    /// A time limit for one handler run. A run past it is an ambiguous outcome: the
    /// reconciler is asked; if it succeeds the event is done, else the run fails as a
    /// retryable error (retried, or dead-lettered after the last attempt).
    ///
    /// The handler's future is dropped at the limit. A handler that opens database
    /// transactions must be safe to cancel: with sqlx 0.8 on PostgreSQL or MySQL a
    /// `begin()` dropped while in flight can leave a pooled connection inside a
    /// transaction (sqlx issue 2054); run such work in a spawned task.
    #[must_use]
    pub fn handler_timeout(self, timeout: Duration) -> Self {
        self.with(|i| i.timeout = Some(timeout))
    }

    /// How long settled events are kept (the dedup horizon of `accept`); at most a
    /// century (longer counts as a century). For a worker made by
    /// [`WebhookGuard::worker`](crate::WebhookGuard::worker), at least what the
    /// guard requires of its own retention (its lease, and twice its verifier's
    /// tolerance; shorter counts as that): a settled event forgotten sooner would
    /// let a resend, or a replay within the tolerance, run again.
    #[must_use]
    pub fn retention(self, retention: Duration) -> Self {
        self.with(|i| i.retention = retention.max(i.retention_floor))
    }

    /// The shortest retention [`Worker::retention`] takes from now on.
    pub(crate) fn retention_floor(self, floor: Duration) -> Self {
        self.with(|i| i.retention_floor = floor)
    }

    /// The ordering store: an event older than one of its object already seen is
    /// skipped (state `Skipped`, the stale hook called).
    #[must_use]
    pub fn ordering(self, ordering: Arc<dyn OrderingStore>) -> Self {
        self.with(|i| i.ordering = Some(ordering))
    }

    /// The reconciler, asked on dead letters, permanent failures and ambiguous outcomes.
    #[must_use]
    pub fn reconciler(self, reconciler: Arc<dyn Reconciler>) -> Self {
        self.with(|i| i.reconciler = Some(reconciler))
    }

    /// The hooks (failures, dead letters, stale events).
    #[must_use]
    pub fn hooks(self, hooks: Arc<dyn Hooks>) -> Self {
        self.with(|i| i.hooks = PanicSafe::wrap(hooks))
    }

    /// The clock.
    #[must_use]
    pub fn clock(self, clock: Arc<dyn Clock>) -> Self {
        self.with(|i| i.clock = clock)
    }

    /// Leases up to `concurrency` due events, processes them concurrently, and returns
    /// how many it processed.
    ///
    /// Dropped before it returns (a `select!` whose other branch won, a timeout),
    /// it aborts the handlers it started, as a crash of the process would: their
    /// events stay `Running`, their attempts counted, until their leases end, and
    /// then run again. (Left running instead, they would escape `concurrency`: a
    /// loop of timed-out calls would start ever more.) To stop a worker without
    /// cutting its handlers off, run it with [`Worker::spawn`] and stop it with
    /// [`WorkerHandle::shutdown`].
    ///
    /// # Errors
    /// The store's error when leasing failed. A settle the store fails is made
    /// again while the event's lease holds (see [`Worker`]); if the store fails it
    /// until then, the error is logged, and the event is leased again once its
    /// lease has run out.
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        let mut tasks = tokio::task::JoinSet::new();
        let n = self.lease_into(&mut tasks, self.inner.concurrency).await?;
        while let Some(done) = tasks.join_next().await {
            log_task(done);
        }
        Ok(n)
    }

    /// Leases up to `n` due events and starts each on a task of `tasks`; how many.
    async fn lease_into(
        &self,
        tasks: &mut tokio::task::JoinSet<()>,
        n: usize,
    ) -> Result<usize, StoreError> {
        let i = &self.inner;
        let now = i.clock.now();
        let lease_until = crate::later(now, delta(i.lease));
        let namespace = &i.namespace;
        let request = LeaseRequest {
            namespace,
            now,
            lease_until,
            limit: n,
        };
        let events = i.inbox.lease(&request).await?;
        let leased = events.len();
        for event in events {
            let inner = self.inner.clone();
            tasks.spawn(async move { inner.process(event).await });
        }
        Ok(leased)
    }

    /// Runs until stopped: keeps up to `concurrency` events running (a slow event
    /// holds its own slot, never the others), purges settled events past retention
    /// once a minute, and logs and goes on after a store error.
    /// [`WorkerHandle::shutdown`] lets the events (and a purge) in flight finish.
    ///
    /// While the last lease filled every free slot, each event that finishes frees
    /// its slot for a lease of one more at once (under full load, about one lease
    /// call per event); otherwise the worker leases again after `poll_interval`.
    ///
    /// Dropping the returned handle lets the worker run on, detached (as dropping a
    /// tokio `JoinHandle` does); keep the handle to stop it.
    #[must_use = "keep the handle to stop the worker (dropping it leaves it running)"]
    pub fn spawn(self) -> WorkerHandle {
        let task = crate::runtime::Spawned::new(move |mut stopped| async move {
            let mut running = tokio::task::JoinSet::new();
            // The purge, on a task of its own: a long one holds up no lease.
            let mut purging = tokio::task::JoinSet::new();
            let mut last_purge: Option<DateTime<Utc>> = None;
            while !stopped.is_requested() {
                while let Some(done) = running.try_join_next() {
                    log_task(done);
                }
                let free = self.inner.concurrency.saturating_sub(running.len());
                // Whether every slot is taken: then the next lease waits for a free one.
                // A lease that panics (a custom store) ends no more than that lease:
                // the worker goes on, as after a store error.
                let full = free == 0
                    || match crate::runtime::catch_unwind(self.lease_into(&mut running, free)).await
                    {
                        Ok(Ok(n)) => n == free,
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "inbox lease failed; will retry");
                            false
                        }
                        Err(panic) => {
                            let panic = crate::runtime::panic_message(&*panic);
                            tracing::error!(panic, "inbox lease panicked; will retry");
                            false
                        }
                    };
                while let Some(done) = purging.try_join_next() {
                    log_task(done);
                }
                let now = self.inner.clock.now();
                let due = last_purge.is_none_or(|t| now - t >= TimeDelta::minutes(1));
                if due && purging.is_empty() {
                    last_purge = Some(now);
                    let worker = self.clone();
                    purging.spawn(async move { worker.purge(now).await });
                }
                // With every slot taken, a finished event frees one at once; the poll
                // interval still passes by (for the purge) while handlers run long.
                tokio::select! {
                    Some(done) = running.join_next(), if full => log_task(done),
                    () = tokio::time::sleep(self.inner.poll) => {}
                    () = stopped.requested() => break,
                }
            }
            while let Some(done) = running.join_next().await {
                log_task(done);
            }
            while let Some(done) = purging.join_next().await {
                log_task(done);
            }
        });
        WorkerHandle { task }
    }

    /// Purges settled events past retention at `now`: in batches until one comes
    /// back short, at most 100 of them (a backlog is worked off over the next
    /// minutes, not at once).
    async fn purge(&self, now: DateTime<Utc>) {
        for _ in 0..PURGE_BATCHES {
            match self.inner.inbox.purge_settled(now, PURGE_BATCH).await {
                Ok(n) if n >= PURGE_BATCH as u64 => {}
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "inbox purge failed; will retry");
                    break;
                }
            }
        }
    }
}

/// Logs a task of the worker's that ended in a panic (a handler's own panics are
/// caught and retried).
fn log_task(done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done {
        tracing::error!(error = %e, "inbox task failed");
    }
}

/// The shortest lease a worker takes.
const MIN_LEASE: Duration = Duration::from_millis(100);

/// Settled events purged per store call, and calls at most per minute.
const PURGE_BATCH: usize = 1000;
const PURGE_BATCHES: usize = 100;

/// `d` as a `TimeDelta`, at most a century: a time past chrono's range (a lease or
/// retention of `Duration::MAX`, say) would panic when added to `now`.
fn delta(d: Duration) -> TimeDelta {
    let century = TimeDelta::from_std(crate::CENTURY).expect("a century fits");
    TimeDelta::from_std(d).map_or(century, |d| d.min(century))
}

/// What the ordering check found.
enum Order {
    /// Fresh, or not ordered: run it.
    Go,
    /// Older than an event of its object already seen: skip it.
    Stale,
    /// The ordering store failed or did not answer in time (its error).
    Unavailable(String),
}

enum Ran {
    Ok,
    Failed(HandlerError),
    TimedOut,
    /// The lease could not be renewed: another worker may hold the event now.
    LeaseLost,
    /// The lease had ended before the handler could start (a slow ordering check):
    /// another worker may hold the event now, and nothing ran.
    NotStarted,
}

/// A leased event, and the end of its lease as last confirmed (by the lease, then
/// by each renewal the store applied).
struct Held<'e> {
    event: &'e InboxEvent,
    until: DateTime<Utc>,
}

impl Inner {
    async fn process(&self, event: InboxEvent) {
        let key = event.key();
        // The end of the lease as last confirmed: renewed while the ordering check
        // waits as while the handler runs, so a slow check does not let the lease
        // run out (another worker would lease the event and count an attempt, and
        // this one's settle would be fenced out).
        let mut held = Held {
            event: &event,
            until: event.lease_until,
        };
        let checked = match self.ordering {
            Some(_) => {
                let check = self.check_order(&event);
                self.renewing(&mut held, check).await
            }
            None => Some(Order::Go),
        };
        // Settled out here, not inside `renewing`: the end of the lease must not cut
        // a settle off half way.
        match checked {
            Some(Order::Go) => {}
            Some(Order::Stale) => {
                self.hooks.on_stale(key, &event.meta);
                self.settle(&mut held, InboxState::Skipped, None).await;
                return;
            }
            Some(Order::Unavailable(error)) => {
                return self.order_unavailable(&mut held, &error).await
            }
            // The lease ran out unrenewed while checking: nothing ran.
            None => return self.not_started(&mut held).await,
        }
        if event.attempts > self.policy.max_attempts {
            // Its last `max_attempts` runs ended without a settle (the process died
            // or the lease was lost each time): stop here, as after the last failure.
            let error = "no attempt finished: the handler crashed or lost its lease";
            self.dead(&mut held, error, ReconcileReason::DeadLettered)
                .await;
            return;
        }
        let ran = self.run(&mut held).await;
        match ran {
            Ran::Ok => {
                if self.settle(&mut held, InboxState::Done, None).await
                    && !self.settle_object(&event, ObjectStatus::Applied).await
                {
                    // A newer event of the object was seen while this one ran, or
                    // another one created at the same time settled it first.
                    self.reconcile(&event, ReconcileReason::Overtaken).await;
                }
            }
            Ran::TimedOut => {
                let reconciled = self.reconcile(&event, ReconcileReason::TimedOut).await;
                if reconciled {
                    let settled = self
                        .settle(
                            &mut held,
                            InboxState::Done,
                            Some("handler timed out; reconciled"),
                        )
                        .await;
                    if settled {
                        // Settled as any success: first settle of its time wins (a
                        // failure another event created at the same time settled
                        // first stays, for its own reconcile).
                        self.settle_object(&event, ObjectStatus::Applied).await;
                    }
                } else {
                    self.fail(&mut held, "handler timed out".into()).await;
                }
            }
            Ran::Failed(HandlerError::Permanent(e)) => {
                let error = crate::runtime::error_text(&e);
                self.dead(&mut held, &error, ReconcileReason::PermanentFailure)
                    .await;
            }
            Ran::Failed(HandlerError::Retryable(e)) => {
                let error = crate::runtime::error_text(&e);
                self.fail(&mut held, error).await;
            }
            Ran::LeaseLost => {
                tracing::warn!(id = %event.id, "inbox lease lost while the handler ran; handler stopped");
                self.reconcile(&event, ReconcileReason::LeaseLost).await;
            }
            Ran::NotStarted => self.not_started(&mut held).await,
        }
    }

    /// Puts back an event whose lease ended before its handler started, its attempt
    /// given back (fenced: a no-op if another worker has it): nothing ran, so
    /// nothing to reconcile.
    async fn not_started(&self, held: &mut Held<'_>) {
        let error = "the lease ended before the handler started";
        let now = self.clock.now();
        self.settle_at(held, InboxState::Pending, Some(error), now, false)
            .await;
    }

    /// The event's object and `created_at`, when it takes part in ordering (decided
    /// by its arrival time, so that its check and its settle agree).
    fn object_key<'e>(&self, event: &'e InboxEvent) -> Option<(ObjectKey<'e>, DateTime<Utc>)> {
        crate::ordering::ordered_key(&event.namespace, &event.meta, event.received_at)
    }

    /// Whether the event is the newest of its object. The ordering store's answer
    /// is waited for at most three leases: renewed meanwhile, the lease would
    /// otherwise hold the event for as long as a store that never answers.
    async fn check_order(&self, event: &InboxEvent) -> Order {
        let Some(ordering) = &self.ordering else {
            return Order::Go;
        };
        if !crate::ordering::ordered(&event.id, &event.meta, event.received_at) {
            return Order::Go;
        }
        let Some((key, created_at)) = self.object_key(event) else {
            return Order::Go;
        };
        let seen = Observation {
            key,
            created_at,
            now: self.clock.now(),
        };
        let observed = ordering.observe(&seen);
        let limit = self.lease.saturating_mul(3);
        match tokio::time::timeout(limit, observed).await {
            Ok(Ok(Freshness::Fresh)) => Order::Go,
            Ok(Ok(Freshness::Stale { .. })) => Order::Stale,
            Ok(Err(e)) => Order::Unavailable(e.to_string()),
            Err(_) => Order::Unavailable(format!("no answer within {limit:?}")),
        }
    }

    /// Puts back an event whose ordering check the store could not answer.
    async fn order_unavailable(&self, held: &mut Held<'_>, error: &str) {
        let event = held.event;
        tracing::warn!(id = %event.id, %error, "ordering store failed; retrying event");
        // Not the handler's failure: no hook, and the attempt given back (the event
        // does not go dead unrun through an outage). So the policy's delay does not
        // grow; the wait does, with the time the event has waited so far: a quarter
        // of it, between a poll interval (no spin) and the policy's longest delay.
        let waited = (self.clock.now() - event.received_at)
            .to_std()
            .unwrap_or_default();
        let wait = (waited / 4).min(self.policy.max).max(self.poll);
        let error = format!("ordering store unavailable: {error}");
        self.retry_later(held, &error, wait, false).await;
    }

    async fn run(&self, held: &mut Held<'_>) -> Ran {
        let event = held.event;
        if self
            .held_for(held, "inbox lease ended before its run")
            .is_none()
        {
            return Ran::NotStarted;
        }
        let run = self.renewing(held, catch_unwind(self.handler.handle(event)));
        let result = match self.timeout {
            Some(limit) => match tokio::time::timeout(limit, run).await {
                Ok(r) => r,
                Err(_) => return Ran::TimedOut,
            },
            None => run.await,
        };
        let Some(result) = result else {
            return Ran::LeaseLost;
        };
        match result {
            Ok(Ok(())) => Ran::Ok,
            Ok(Err(e)) => Ran::Failed(e),
            Err(panic) => Ran::Failed(HandlerError::retryable(format!(
                "handler panicked: {}",
                panic_message(&*panic)
            ))),
        }
    }

    /// Runs `work` while renewing the event's lease (confirmed until `held.until`,
    /// which each renewal moves), so work that runs longer than the lease keeps the
    /// event (no other worker runs it meanwhile). The first renewal comes once a
    /// third of the lease has passed since it was taken, at once if the work starts
    /// later than that (a slow ordering check); the next ones every third of the
    /// lease. `None`, with `work` dropped (or never started), when the store answers
    /// that the lease is lost, or when the last lease the store confirmed has ended
    /// by this worker's clock: renewals failed, hung or came too late meanwhile, and
    /// another worker may have the event now. While a renewal waits for the store,
    /// the work goes on and the end of the lease is looked at every third of the
    /// lease at most (at once, on the real clock).
    async fn renewing<T>(&self, held: &mut Held<'_>, work: impl Future<Output = T>) -> Option<T> {
        let event = held.event;
        let mut work = std::pin::pin!(work);
        let every = self.lease / 3; // at least 33 ms: see `MIN_LEASE`
        let stopped = "inbox lease ran out unrenewed; work stopped";
        // Until the first renewal: two thirds of a lease left, or at once.
        let left = self.held_for(held, stopped)?;
        let mut wait = left.saturating_sub(self.lease.saturating_sub(every));
        loop {
            // Until the next renewal, or the end of the lease if that comes first.
            let left = self.held_for(held, stopped)?;
            tokio::select! {
                done = &mut work => return Some(done),
                () = tokio::time::sleep(wait.min(left)) => {}
            }
            wait = every;
            self.held_for(held, stopped)?;
            let renew = RenewLease {
                holder: event.holder(),
                lease_until: crate::later(self.clock.now(), delta(self.lease)),
            };
            let renewal = self.inbox.renew_event(&renew);
            let mut renewal = std::pin::pin!(renewal);
            let renewed = loop {
                let left =
                    self.held_for(held, "inbox lease ran out while renewing; work stopped")?;
                tokio::select! {
                    done = &mut work => return Some(done),
                    renewed = &mut renewal => break renewed,
                    () = tokio::time::sleep(every.min(left)) => {}
                }
            };
            match renewed {
                Ok(Fence::Applied) => held.until = renew.lease_until,
                Ok(Fence::LeaseLost) => return None,
                Err(e) => {
                    tracing::warn!(id = %event.id, error = %e, "could not renew an inbox lease; will retry");
                }
            }
        }
    }

    /// How long the `held` lease, as last confirmed, still holds by this worker's
    /// clock, or `None` (logged with `what`) once it has ended.
    fn held_for(&self, held: &Held<'_>, what: &str) -> Option<Duration> {
        match (held.until - self.clock.now()).to_std() {
            Ok(left) if !left.is_zero() => Some(left),
            _ => {
                tracing::warn!(id = %held.event.id, "{what}");
                None
            }
        }
    }

    async fn fail(&self, held: &mut Held<'_>, error: String) {
        let event = held.event;
        if event.attempts >= self.policy.max_attempts {
            self.dead(held, &error, ReconcileReason::DeadLettered).await;
        } else {
            self.hooks.on_failure(event.key(), event.attempts, &error);
            self.retry_later(held, &error, Duration::ZERO, true).await;
        }
    }

    /// Puts `event` back, due after the policy's delay (and at least `at_least`);
    /// its attempt given back unless it `counts`.
    async fn retry_later(
        &self,
        held: &mut Held<'_>,
        error: &str,
        at_least: Duration,
        counts: bool,
    ) {
        let event = held.event;
        let now = self.clock.now();
        let wait = self.policy.delay(event.attempts).max(at_least);
        let next = crate::later(now, delta(wait));
        self.settle_at(held, InboxState::Pending, Some(error), next, counts)
            .await;
    }

    async fn dead(&self, held: &mut Held<'_>, error: &str, reason: ReconcileReason) {
        let event = held.event;
        // The object is marked failed first, so that `reconcile_stale` lists it for
        // as long as its reconcile has not succeeded: marked after the settle, a
        // crash in between would leave it pending, and listed by nothing, once the
        // event is dead. Should the settle not apply (the lease lost), the mark only
        // costs a reconcile more.
        self.settle_object(event, ObjectStatus::Failed).await;
        let failed_since = self.clock.now();
        if !self.settle(held, InboxState::Dead, Some(error)).await {
            return;
        }
        // Panic-safe (as every hook): the reconciler below must run, nothing would
        // ask for it again.
        self.hooks.on_dead_letter(event, error);
        if self.reconcile(event, reason).await {
            // Applied, unless another event created at the same time failed since.
            if let (Some(ordering), Some((key, created_at))) =
                (&self.ordering, self.object_key(event))
            {
                let now = self.clock.now();
                crate::ordering::mark_reconciled(&**ordering, key, created_at, failed_since, now)
                    .await;
            }
        }
    }

    async fn settle(&self, held: &mut Held<'_>, state: InboxState, error: Option<&str>) -> bool {
        self.settle_at(held, state, error, self.clock.now(), true)
            .await
    }

    /// Settles the event's object; `false` only when the ordering store answers that
    /// a newer event of the object was seen since, or that another one created at
    /// the same time settled it first (not on an error, nor without an ordering
    /// store or object).
    async fn settle_object(&self, event: &InboxEvent, status: ObjectStatus) -> bool {
        let (ordering, object) = (self.ordering.as_ref(), self.object_key(event));
        crate::ordering::settle_object(ordering, &self.clock, object, status, &event.id).await
    }

    /// Asks the reconciler; `true` when it reconciled the object.
    async fn reconcile(&self, event: &InboxEvent, reason: ReconcileReason) -> bool {
        let Some(reconciler) = &self.reconciler else {
            return false;
        };
        let request = ReconcileRequest::new(
            event.namespace.clone(),
            Some(event.id.clone()),
            event.meta.clone(),
            reason,
        );
        // A panicking reconciler is a failed reconcile: the event's own end (its
        // settle after a timeout, say) must still follow.
        match crate::runtime::catch_unwind(reconciler.reconcile(&request)).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(id = %event.id, reason = reason.as_str(), error = %e, "reconciliation failed");
                false
            }
            Err(panic) => {
                let msg = crate::runtime::panic_message(&*panic);
                tracing::error!(id = %event.id, reason = reason.as_str(), panic = msg, "reconciler panicked");
                false
            }
        }
    }
}

/// Stops a spawned [`Worker`].
#[derive(Debug)]
pub struct WorkerHandle {
    task: crate::runtime::Spawned,
}

impl WorkerHandle {
    /// Stops taking new events, lets the events (and a purge) in flight finish, and waits.
    /// An event whose settle the store fails is tried again until its lease ends
    /// (see [`Worker`]), so with the store down this waits at most about a lease.
    pub async fn shutdown(self) {
        self.task.shutdown().await;
    }

    /// Stops at once, abandoning the events in flight (their leases run out and they
    /// are leased again): what a crash looks like. The same cancellation caveat as
    /// [`Worker::handler_timeout`] applies to the handlers in flight.
    pub fn abort(self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    /// A worker's `Debug` shows its settings, and not the handler (a closure).
    #[test]
    fn debug_shows_the_settings() {
        let worker =
            Worker::new(Arc::new(MemoryStore::new()), "jamm", |_| async { Ok(()) }).concurrency(3);
        let text = format!("{worker:?}");
        assert!(text.contains("namespace: \"jamm\""), "{text}");
        assert!(text.contains("concurrency: 3"), "{text}");
        assert!(text.contains("MemoryStore"), "{text}");
        assert!(!text.contains("handler"), "{text}");
    }
}
