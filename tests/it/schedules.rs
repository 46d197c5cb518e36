//! Providers' published retry schedules, played on the injected clock against
//! handlers that fail transiently, fail permanently, or hang past the provider's
//! timeout.
//!
//! - Jamm (seed documentation): up to 20 attempts, backoff starting at 1 h and
//!   doubling, capped at 3 h; an attempt not answered within 2 minutes failed.
//! - Stripe: retries for up to 72 h with exponential backoff; an attempt not
//!   answered within 5 s failed. Stripe does not publish exact intervals: the model
//!   here starts at 5 minutes and doubles, stopping at 72 h.
//!
//! At every attempt time the sweeper's purge runs first, then the harness checks the
//! id is still remembered (retention never forgets an id the provider may still
//! retry). After the provider got its 2xx, the rest of its schedule is played too, as
//! if every acknowledgement had been lost: each of those is a duplicate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use webhook_guard::clock::ManualClock;
use webhook_guard::hooks::Escalation;
use webhook_guard::outcome::OutcomeKind;
use webhook_guard::reconcile::{ReconcileRequest, Reconciler};
use webhook_guard::store::RecordState;
use webhook_guard::store::{BoxError, DynProcessedStore, Key};
use webhook_guard::verify::{Jamm, Stripe};
use webhook_guard::{HandlerError, Hooks, MemoryStore, Outcome, ProcessedStore, WebhookGuard};

const T0: i64 = 1_700_000_000;
const N: u32 = 5; // escalate_after, the default

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provider {
    Jamm,
    Stripe,
}

impl Provider {
    /// Delays after each failed attempt (the schedule), in order.
    fn delays(self) -> Vec<TimeDelta> {
        match self {
            Self::Jamm => {
                let mut d = TimeDelta::hours(1);
                (0..19)
                    .map(|_| {
                        let this = d.min(TimeDelta::hours(3));
                        d = d * 2;
                        this
                    })
                    .collect()
            }
            Self::Stripe => {
                let mut out = Vec::new();
                let mut d = TimeDelta::minutes(5);
                let mut total = TimeDelta::zero();
                while total + d < TimeDelta::hours(72) {
                    total += d;
                    out.push(d);
                    d = d * 2;
                }
                out
            }
        }
    }

    fn timeout(self) -> TimeDelta {
        match self {
            Self::Jamm => TimeDelta::minutes(2),
            Self::Stripe => TimeDelta::seconds(5),
        }
    }

    fn window(self) -> std::time::Duration {
        match self {
            Self::Jamm => Jamm::RETRY_WINDOW,
            Self::Stripe => Stripe::RETRY_WINDOW,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Behavior {
    /// Fails with a retryable error this many times, then succeeds.
    Transient(u32),
    /// Fails permanently.
    Permanent,
    /// Hangs past the provider's timeout this many times, then succeeds.
    Hang(u32),
}

#[derive(Debug, Default)]
struct Alerts {
    escalations: AtomicUsize,
    permanent: AtomicUsize,
    failures: AtomicUsize,
    unrecorded: AtomicUsize,
    reconciles: AtomicUsize,
}

impl Hooks for Alerts {
    fn on_escalation(&self, _: &Escalation<'_>) {
        self.escalations.fetch_add(1, Ordering::SeqCst);
    }
    fn on_permanent_failure(&self, _: Key<'_>, _: &str) {
        self.permanent.fetch_add(1, Ordering::SeqCst);
    }
    fn on_failure(&self, _: Key<'_>, _: u32, _: &str) {
        self.failures.fetch_add(1, Ordering::SeqCst);
    }
    fn on_unrecorded(&self, _: Key<'_>, _: &webhook_guard::outcome::Unrecorded) {
        self.unrecorded.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Reconciler for Alerts {
    async fn reconcile(&self, _: &ReconcileRequest) -> Result<(), BoxError> {
        self.reconciles.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[derive(Debug)]
struct Played {
    attempts: usize,
    /// 1-based attempt at which the provider first got a 2xx.
    acked_at: Option<usize>,
    acked_kind: Option<OutcomeKind>,
    handler_runs: u32,
    alerts: Arc<Alerts>,
    last_attempt: TimeDelta,
}

async fn play(provider: Provider, behavior: Behavior) -> Played {
    let start = DateTime::<Utc>::from_timestamp(T0, 0).unwrap();
    let clock = ManualClock::new(start);
    let store: Arc<DynProcessedStore> = Arc::new(MemoryStore::new());
    let alerts = Arc::new(Alerts::default());
    let builder = WebhookGuard::builder()
        .store(store.clone())
        .clock(clock.clone())
        .hooks(alerts.clone())
        .reconciler(alerts.clone())
        .escalate_after(N);
    let jamm = Jamm::new(["jamm-client-secret-0123456789"]).unwrap();
    let stripe = Stripe::new(["whsec_stripe0123456789abcdefghijklmnop"]).unwrap();
    let guard = match provider {
        Provider::Jamm => builder.verifier(jamm.clone()),
        Provider::Stripe => builder.verifier(stripe.clone()),
    }
    .build()
    .unwrap();
    // The retention the guard chose covers the provider's window.
    assert!(guard.retention() >= provider.window());

    let jamm_body = jamm.envelope(
        "mwh-sched",
        "charge.succeeded",
        r#"{"charge":{"id":"trx-1"}}"#,
        "2024-01-01T00:00:00Z",
    );
    let stripe_body = r#"{"id":"evt_sched","type":"charge.succeeded"}"#.to_owned();
    let id = match provider {
        Provider::Jamm => "mwh-sched",
        Provider::Stripe => "evt_sched",
    };

    let delays = provider.delays();
    let mut t = start;
    let mut runs = 0u32;
    let mut acked_at = None;
    let mut acked_kind = None;
    let mut attempts = 0;
    for attempt in 1..=delays.len() + 1 {
        clock.set(t);
        attempts = attempt;
        // The sweeper runs, then the id must still be known (after the first attempt).
        store.purge_expired(t, 10_000).await.unwrap();
        if attempt > 1 {
            let rec = guard.inspect(id).await.unwrap();
            assert!(
                rec.is_some(),
                "{provider:?}: id forgotten at attempt {attempt} (+{}h)",
                (t - start).num_hours()
            );
        }
        // The provider signs every attempt afresh (Stripe signs the attempt's time).
        let stripe_sig = stripe.sign(stripe_body.as_bytes(), t.timestamp());
        let (headers, body): (Vec<(&str, &str)>, &[u8]) = match provider {
            Provider::Jamm => (vec![], jamm_body.as_bytes()),
            Provider::Stripe => (
                vec![("Stripe-Signature", stripe_sig.as_str())],
                stripe_body.as_bytes(),
            ),
        };
        let failures_before = match behavior {
            Behavior::Transient(k) | Behavior::Hang(k) => k,
            Behavior::Permanent => 0,
        };
        let hang_now = matches!(behavior, Behavior::Hang(_)) && runs < failures_before;
        let entered = tokio::sync::Notify::new();
        let run_no = runs;
        let fut = guard.handle(&headers, body, |_| async {
            entered.notify_one();
            match behavior {
                Behavior::Transient(k) if run_no < k => {
                    Err(HandlerError::retryable("downstream unavailable"))
                }
                Behavior::Permanent => Err(HandlerError::permanent("no such account")),
                Behavior::Hang(k) if run_no < k => std::future::pending().await,
                _ => Ok(()),
            }
        });
        let mut fut = Box::pin(fut);
        let outcome: Option<Outcome> = tokio::select! {
            o = &mut fut => Some(o),
            _ = entered.notified(), if hang_now => None,
        };
        let outcome = match outcome {
            Some(o) => {
                // The handler ran if it entered (a permit is stored when nobody waits).
                if tokio::time::timeout(std::time::Duration::ZERO, entered.notified())
                    .await
                    .is_ok()
                {
                    runs += 1;
                }
                Some(o)
            }
            None => {
                // The provider gives up waiting: the delivery future is dropped, which
                // releases the claim (as a failure) in the background.
                runs += 1;
                clock.advance(provider.timeout());
                drop(fut);
                loop {
                    let rec = guard.inspect(id).await.unwrap().unwrap();
                    if rec.state != RecordState::InProgress {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                None
            }
        };
        let status = outcome.as_ref().map(|o| guard.answer(o).status);
        match (acked_at, status) {
            (None, Some(s)) if s.is_success() => {
                acked_at = Some(attempt);
                acked_kind = outcome.as_ref().map(Outcome::kind);
            }
            (Some(_), _) => {
                // A replay after the acknowledgement (as if it had been lost).
                let kind = outcome.as_ref().map(Outcome::kind);
                assert_eq!(
                    kind,
                    Some(OutcomeKind::Duplicate),
                    "{provider:?} attempt {attempt}"
                );
            }
            _ => {}
        }
        if attempt <= delays.len() {
            if hang_now {
                // `t` already moved by the timeout.
                t = clock_now(&clock);
            }
            t += delays[attempt - 1];
        }
    }
    // Let background reconciliations finish.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    Played {
        attempts,
        acked_at,
        acked_kind,
        handler_runs: runs,
        alerts,
        last_attempt: t - start,
    }
}

fn clock_now(clock: &ManualClock) -> DateTime<Utc> {
    webhook_guard::clock::Clock::now(clock)
}

fn report(provider: Provider, behavior: Behavior, p: &Played) {
    println!(
        "RESULT provider={provider:?} behavior={behavior:?} attempts_played={} last_attempt=+{}h{}m acked_at_attempt={:?} as={:?} handler_runs={} escalations={} permanent_alerts={} reconciles={}",
        p.attempts,
        p.last_attempt.num_hours(),
        p.last_attempt.num_minutes() % 60,
        p.acked_at,
        p.acked_kind,
        p.handler_runs,
        p.alerts.escalations.load(Ordering::SeqCst),
        p.alerts.permanent.load(Ordering::SeqCst),
        p.alerts.reconciles.load(Ordering::SeqCst),
    );
}

async fn check(provider: Provider) {
    let total = provider.delays().len() + 1;
    // Transient failures below the threshold: processed at attempt k+1, no alert.
    for k in 0..N {
        let b = Behavior::Transient(k);
        let p = play(provider, b).await;
        report(provider, b, &p);
        assert_eq!(p.acked_at, Some(k as usize + 1));
        assert_eq!(p.acked_kind, Some(OutcomeKind::Processed));
        assert_eq!(p.handler_runs, k + 1);
        assert_eq!(p.alerts.escalations.load(Ordering::SeqCst), 0);
        assert_eq!(p.alerts.failures.load(Ordering::SeqCst), k as usize);
    }
    // Failing for good: at the N-th failure the guard answers 2xx, alerts once and
    // reconciles, long before the provider's last attempt.
    for k in [N, N + 3, 100] {
        let b = Behavior::Transient(k);
        let p = play(provider, b).await;
        report(provider, b, &p);
        assert_eq!(p.acked_at, Some(N as usize));
        assert!(
            (N as usize) < total,
            "escalates before the provider gives up"
        );
        assert_eq!(p.acked_kind, Some(OutcomeKind::Escalated));
        assert_eq!(p.handler_runs, N);
        assert_eq!(p.alerts.escalations.load(Ordering::SeqCst), 1);
        assert_eq!(p.alerts.reconciles.load(Ordering::SeqCst), 1);
    }
    // A permanent failure: 2xx at once, one alert, one reconciliation.
    let p = play(provider, Behavior::Permanent).await;
    report(provider, Behavior::Permanent, &p);
    assert_eq!(p.acked_at, Some(1));
    assert_eq!(p.acked_kind, Some(OutcomeKind::PermanentFailure));
    assert_eq!(p.handler_runs, 1);
    assert_eq!(p.alerts.permanent.load(Ordering::SeqCst), 1);
    assert_eq!(p.alerts.reconciles.load(Ordering::SeqCst), 1);
    // Hanging past the provider's timeout, twice, then fine: each hang is released
    // and counted; the third attempt processes it.
    let p = play(provider, Behavior::Hang(2)).await;
    report(provider, Behavior::Hang(2), &p);
    assert_eq!(p.acked_at, Some(3));
    assert_eq!(p.acked_kind, Some(OutcomeKind::Processed));
    assert_eq!(p.handler_runs, 3);
    // Hanging every time: the N-th hang escalates in the background; the next
    // attempt is answered 2xx as a duplicate of the escalated id.
    let p = play(provider, Behavior::Hang(100)).await;
    report(provider, Behavior::Hang(100), &p);
    assert_eq!(p.acked_at, Some(N as usize + 1));
    assert!((N as usize + 1) < total);
    assert_eq!(p.acked_kind, Some(OutcomeKind::Duplicate));
    assert_eq!(p.handler_runs, N);
    assert_eq!(p.alerts.escalations.load(Ordering::SeqCst), 1);
    assert_eq!(p.alerts.reconciles.load(Ordering::SeqCst), 1);
}

#[test]
fn the_schedules_are_the_published_ones() {
    let jamm = Provider::Jamm.delays();
    assert_eq!(jamm.len() + 1, 20);
    assert_eq!(
        &jamm[..3],
        &[
            TimeDelta::hours(1),
            TimeDelta::hours(2),
            TimeDelta::hours(3)
        ]
    );
    let span: TimeDelta = jamm.iter().sum();
    // 1 + 2 + 17 × 3 = 54 h of backoff, plus up to 19 two-minute timeouts.
    assert_eq!(span, TimeDelta::hours(54));
    let worst = span + Provider::Jamm.timeout() * 19;
    assert!(
        TimeDelta::from_std(Jamm::RETRY_WINDOW).unwrap() >= worst,
        "Jamm::RETRY_WINDOW ({:?}) is shorter than Jamm's schedule ({worst})",
        Jamm::RETRY_WINDOW
    );
    let stripe: TimeDelta = Provider::Stripe.delays().iter().sum();
    assert!(stripe < TimeDelta::hours(72));
}

#[tokio::test]
async fn jamm_schedule() {
    check(Provider::Jamm).await;
}

#[tokio::test]
async fn stripe_schedule() {
    check(Provider::Stripe).await;
}
