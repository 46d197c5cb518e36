//! Inbox mode on the memory store: persist then acknowledge, the worker's retries,
//! dead letters, the ordering guard, reconciliation, and killed workers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use webhook_guard::clock::{Clock, ManualClock};
use webhook_guard::inbox::{InboxEvent, InboxState, InboxStore, LeaseRequest, RetryPolicy, Worker};
use webhook_guard::meta::{EventMeta, MetaExtractor};
use webhook_guard::ordering::{
    FailedMark, FailedPage, ObjectKey, ObjectMark, ObjectStatus, Observation, OrderingStore,
};
use webhook_guard::outcome::OutcomeKind;
use webhook_guard::reconcile::{ReconcileReason, ReconcileRequest, Reconciler};
use webhook_guard::store::{BoxError, Key};
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, HandlerError, Hooks, MemoryStore, Outcome, WebhookGuard};

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap()
}

#[derive(Debug, Default)]
struct Seen {
    dead: Mutex<Vec<String>>,
    stale: Mutex<Vec<String>>,
    outcomes: Mutex<Vec<OutcomeKind>>,
    attempts: Mutex<Vec<Option<u32>>>,
}

impl Hooks for Seen {
    fn on_dead_letter(&self, event: &InboxEvent, _: &str) {
        self.dead.lock().unwrap().push(event.id.clone());
    }
    fn on_stale(&self, key: Key<'_>, _: &EventMeta) {
        self.stale.lock().unwrap().push(key.id.to_owned());
    }
    fn on_outcome(&self, report: &webhook_guard::hooks::DeliveryReport<'_>) {
        self.outcomes.lock().unwrap().push(report.outcome.kind());
        self.attempts.lock().unwrap().push(report.attempt);
    }
}

#[derive(Debug, Default)]
struct Api {
    calls: Mutex<Vec<(Option<String>, ReconcileReason)>>,
}

#[async_trait]
impl Reconciler for Api {
    async fn reconcile(&self, r: &ReconcileRequest) -> Result<(), BoxError> {
        self.calls
            .lock()
            .unwrap()
            .push((r.meta.object.clone(), r.reason));
        Ok(())
    }
}

struct Setup {
    guard: WebhookGuard,
    store: MemoryStore,
    clock: ManualClock,
    hooks: Arc<Seen>,
    api: Arc<Api>,
}

fn setup() -> Setup {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let hooks = Arc::new(Seen::default());
    let api = Arc::new(Api::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .ordering(store.clone())
        .reconciler(api.clone())
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .namespace("inbox-test")
        .clock(clock.clone())
        .hooks(hooks.clone())
        .build()
        .unwrap();
    Setup {
        guard,
        store,
        clock,
        hooks,
        api,
    }
}

fn body(id: &str, ty: &str, object: &str, created: i64) -> Vec<u8> {
    format!(r#"{{"id":"{id}","type":"{ty}","object":"{object}","created":{created}}}"#).into_bytes()
}

/// The event stored under `namespace` and `id` (it must be there).
async fn stored(store: &MemoryStore, namespace: &str, id: &str) -> InboxEvent {
    store
        .get_event(Key::new(namespace, id))
        .await
        .unwrap()
        .expect("stored")
}

async fn accept(guard: &WebhookGuard, body: &[u8]) -> Outcome {
    guard
        .accept(&[("content-type", "application/json")], body)
        .await
}

#[tokio::test]
async fn a_long_error_of_nuls_is_kept_within_the_bound() {
    let s = setup();
    accept(
        &s.guard,
        &body("evt_nul", "charge.succeeded", "ch_nul", 100),
    )
    .await;
    let worker = s
        .guard
        .worker(|_: InboxEvent| async {
            // Each NUL is stored as U+FFFD, three bytes: bounded after that.
            Err(HandlerError::retryable(
                "\0".repeat(webhook_guard::guard::MAX_ERROR_LEN),
            ))
        })
        .unwrap();
    assert_eq!(worker.run_once().await.unwrap(), 1);
    let event = stored(&s.store, "inbox-test", "evt_nul").await;
    let error = event.last_error.expect("an error is kept");
    assert!(
        error.len() <= webhook_guard::guard::MAX_ERROR_LEN,
        "{}",
        error.len()
    );
    assert!(error.starts_with('\u{fffd}') && !error.contains('\0'));
}

#[tokio::test]
async fn accept_stores_once_and_answers_200_at_once() {
    let s = setup();
    let b = body("evt_1", "charge.succeeded", "ch_1", 100);
    let first = accept(&s.guard, &b).await;
    assert!(
        matches!(first, Outcome::Accepted { new: true, .. }),
        "{first:?}"
    );
    assert_eq!(s.guard.answer(&first).status, 200);
    let again = accept(&s.guard, &b).await;
    assert!(matches!(again, Outcome::Accepted { new: false, .. }));
    let other = accept(&s.guard, &body("evt_1", "charge.failed", "ch_1", 100)).await;
    assert!(matches!(other, Outcome::Conflict { .. }));
    let no_id = accept(&s.guard, b"{}").await;
    assert!(matches!(no_id, Outcome::Rejected(_)), "{no_id:?}");
    assert_eq!(
        *s.hooks.outcomes.lock().unwrap(),
        [
            OutcomeKind::Accepted,
            OutcomeKind::Accepted,
            OutcomeKind::Conflict,
            OutcomeKind::Rejected
        ],
        "every accepted delivery reaches the outcome hook"
    );
    let event = stored(&s.store, "inbox-test", "evt_1").await;
    assert_eq!(event.state, InboxState::Pending);
    assert_eq!(event.payload, b);
    assert_eq!(event.meta.object.as_deref(), Some("ch_1"));
    assert_eq!(event.meta.event_type.as_deref(), Some("charge.succeeded"));
    assert_eq!(event.meta.created_at.unwrap().timestamp(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_never_delays_the_answer() {
    let s = setup();
    let gate = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let worker = {
        let (gate, started) = (gate.clone(), started.clone());
        s.guard
            .worker(move |_event: InboxEvent| {
                let (gate, started) = (gate.clone(), started.clone());
                async move {
                    started.notify_one();
                    gate.notified().await; // blocks until the test lets it go
                    Ok(())
                }
            })
            .unwrap()
    };
    assert!(matches!(
        accept(&s.guard, &body("evt_a", "x.y", "o", 1)).await,
        Outcome::Accepted { .. }
    ));
    let running = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_once().await }
    });
    started.notified().await;
    // The handler is stuck; new deliveries are still stored and acknowledged.
    for i in 0..20 {
        let outcome = tokio::time::timeout(
            Duration::from_secs(5),
            accept(&s.guard, &body(&format!("evt_b{i}"), "x.y", "o2", 2)),
        )
        .await
        .expect("accept must not wait for the handler");
        assert!(matches!(outcome, Outcome::Accepted { new: true, .. }));
    }
    gate.notify_one();
    assert_eq!(running.await.unwrap().unwrap(), 1);
}

#[tokio::test]
async fn the_worker_retries_with_backoff_then_succeeds() {
    let s = setup();
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = {
        let calls = calls.clone();
        s.guard
            .worker(move |_e: InboxEvent| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 2 {
                        Err(HandlerError::retryable("flaky"))
                    } else {
                        Ok(())
                    }
                }
            })
            .unwrap()
            .retry_policy(
                RetryPolicy::exponential(5, Duration::from_secs(10), Duration::from_secs(60))
                    .without_jitter(),
            )
    };
    accept(&s.guard, &body("evt_r", "charge.succeeded", "ch_r", 1)).await;
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(
        worker.run_once().await.unwrap(),
        0,
        "not due before the backoff"
    );
    s.clock.advance(TimeDelta::seconds(10));
    assert_eq!(worker.run_once().await.unwrap(), 1);
    s.clock.advance(TimeDelta::seconds(19));
    assert_eq!(
        worker.run_once().await.unwrap(),
        0,
        "the second delay doubles"
    );
    s.clock.advance(TimeDelta::seconds(1));
    assert_eq!(worker.run_once().await.unwrap(), 1);
    let e = stored(&s.store, "inbox-test", "evt_r").await;
    assert_eq!((e.state, e.attempts), (InboxState::Done, 3));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let object = s
        .store
        .get_object(ObjectKey {
            namespace: "inbox-test",
            object: "ch_r",
            family: "charge",
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(object.status, ObjectStatus::Applied);
}

#[tokio::test]
async fn the_last_attempt_dead_letters_once_and_reconciles() {
    let s = setup();
    let worker = s
        .guard
        .worker(|_e: InboxEvent| async { Err(HandlerError::retryable("always down")) })
        .unwrap()
        .retry_policy(
            RetryPolicy::exponential(3, Duration::from_secs(1), Duration::from_secs(1))
                .without_jitter(),
        );
    accept(&s.guard, &body("evt_d", "charge.succeeded", "ch_d", 1)).await;
    for _ in 0..6 {
        worker.run_once().await.unwrap();
        s.clock.advance(TimeDelta::seconds(2));
    }
    let e = stored(&s.store, "inbox-test", "evt_d").await;
    assert_eq!((e.state, e.attempts), (InboxState::Dead, 3));
    assert_eq!(e.last_error.as_deref(), Some("always down"));
    assert_eq!(
        *s.hooks.dead.lock().unwrap(),
        vec!["evt_d".to_owned()],
        "the hook runs once"
    );
    assert_eq!(
        *s.api.calls.lock().unwrap(),
        vec![(Some("ch_d".to_owned()), ReconcileReason::DeadLettered)]
    );
    // Reconciled, so nothing is left for the stale sweep.
    let report = s.guard.reconcile_stale(Duration::ZERO, 100).await.unwrap();
    assert_eq!(report.found, 0);
}

#[tokio::test]
async fn an_event_whose_runs_never_finish_is_dead_lettered() {
    let s = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let worker = {
        let runs = runs.clone();
        s.guard
            .worker(move |_e: InboxEvent| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok(()) }
            })
            .unwrap()
            .retry_policy(RetryPolicy::exponential(
                3,
                Duration::from_secs(1),
                Duration::from_secs(1),
            ))
    };
    accept(&s.guard, &body("evt_crash", "charge.succeeded", "ch_c", 1)).await;
    // Three workers lease it and die before they settle (a poison event that
    // crashes its process): each lease counts an attempt.
    for _ in 0..3 {
        let now = s.clock.now();
        let leased = s
            .store
            .lease(&LeaseRequest {
                namespace: "inbox-test",
                now,
                lease_until: now + TimeDelta::seconds(30),
                limit: 10,
            })
            .await
            .unwrap();
        assert_eq!(leased.len(), 1);
        s.clock.advance(TimeDelta::seconds(31));
    }
    assert_eq!(worker.run_once().await.unwrap(), 1);
    let e = stored(&s.store, "inbox-test", "evt_crash").await;
    assert_eq!((e.state, e.attempts), (InboxState::Dead, 4));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "not run a fourth time");
    assert_eq!(*s.hooks.dead.lock().unwrap(), vec!["evt_crash".to_owned()]);
}

#[tokio::test]
async fn durations_beyond_chronos_range_are_a_century() {
    let s = setup();
    let worker = s
        .guard
        .worker(|_e: InboxEvent| async { Ok(()) })
        .unwrap()
        .lease(Duration::MAX)
        .retention(Duration::MAX);
    accept(&s.guard, &body("evt_forever", "x.y", "o", 1)).await;
    assert_eq!(worker.run_once().await.unwrap(), 1);
    let e = stored(&s.store, "inbox-test", "evt_forever").await;
    assert_eq!(e.state, InboxState::Done);
    assert!(e.expires_at > s.clock.now() + TimeDelta::days(36_000));
    let report = s.guard.reconcile_stale(Duration::MAX, 10).await.unwrap();
    assert_eq!(report.found, 0);
}

/// Waits (up to 5 s) until the reconciler was asked about `object` for `reason`.
async fn reconciled(api: &Api, object: &str, reason: ReconcileReason) {
    for _ in 0..500 {
        let calls = api.calls.lock().unwrap().clone();
        if calls.contains(&(Some(object.to_owned()), reason)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "no {reason:?} reconciliation of {object}: {:?}",
        api.calls.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_overtaken_while_its_handler_ran_reconciles_its_object() {
    let s = setup();
    let (gate, started) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let worker = {
        let (gate, started) = (gate.clone(), started.clone());
        s.guard
            .worker(move |e: InboxEvent| {
                let (gate, started) = (gate.clone(), started.clone());
                async move {
                    if e.id == "evt_old" {
                        started.notify_one(); // the object has been observed
                        gate.notified().await; // until the newer event is done
                    }
                    Ok(())
                }
            })
            .unwrap()
            .concurrency(1)
    };
    accept(&s.guard, &body("evt_old", "customer.updated", "cus_o", 10)).await;
    let slow = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_once().await }
    });
    started.notified().await;
    // A newer event of the object arrives and is processed while the old one runs.
    accept(&s.guard, &body("evt_new", "customer.updated", "cus_o", 20)).await;
    assert_eq!(worker.run_once().await.unwrap(), 1);
    let newer = Key::new("inbox-test", "evt_new");
    assert_eq!(
        s.store.get_event(newer).await.unwrap().unwrap().state,
        InboxState::Done
    );
    gate.notify_one();
    assert_eq!(slow.await.unwrap().unwrap(), 1);
    reconciled(&s.api, "cus_o", ReconcileReason::Overtaken).await;

    // The same in the direct mode.
    let (gate, started) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let old = body("evt_old2", "customer.updated", "cus_d", 10);
    let slow = tokio::spawn({
        let (guard, gate, started) = (s.guard.clone(), gate.clone(), started.clone());
        async move {
            guard
                .handle(
                    &[("content-type", "application/json")],
                    &old,
                    |_| async move {
                        started.notify_one(); // the object has been observed
                        gate.notified().await;
                        Ok(())
                    },
                )
                .await
        }
    });
    started.notified().await;
    let new = body("evt_new2", "customer.updated", "cus_d", 20);
    let outcome = s
        .guard
        .handle(&[("content-type", "application/json")], &new, |_| async {
            Ok(())
        })
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    gate.notify_one();
    assert!(matches!(slow.await.unwrap(), Outcome::Processed { .. }));
    reconciled(&s.api, "cus_d", ReconcileReason::Overtaken).await;
}

#[tokio::test]
async fn an_event_from_the_far_future_does_not_freeze_its_object() {
    let s = setup();
    let now = start().timestamp();
    let run = |b: Vec<u8>| {
        let guard = s.guard.clone();
        async move {
            guard
                .handle(&[("content-type", "application/json")], &b, |_| async {
                    Ok(())
                })
                .await
        }
    };
    // A year ahead (a provider's bug, or an unsigned `created_at` rewritten by a
    // replayer): processed, but not ordered.
    let future = body("evt_future", "charge.updated", "ch_f", now + 365 * 86_400);
    assert!(matches!(run(future).await, Outcome::Processed { .. }));
    // The object's genuine events go on being applied.
    let genuine = body("evt_genuine", "charge.updated", "ch_f", now - 60);
    let outcome = run(genuine).await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    // Within the allowed skew, an event is ordered as usual.
    let ahead = body("evt_ahead", "charge.updated", "ch_f", now + 60);
    assert!(matches!(run(ahead).await, Outcome::Processed { .. }));
    let older = body("evt_older", "charge.updated", "ch_f", now - 30);
    assert!(matches!(run(older).await, Outcome::Stale { .. }));

    // The same through the inbox: the worker decides by the event's arrival.
    let worker = s.guard.worker(|_e: InboxEvent| async { Ok(()) }).unwrap();
    accept(
        &s.guard,
        &body("evt_future_i", "charge.updated", "ch_i", now + 365 * 86_400),
    )
    .await;
    accept(
        &s.guard,
        &body("evt_genuine_i", "charge.updated", "ch_i", now - 60),
    )
    .await;
    while worker.run_once().await.unwrap() > 0 {}
    for id in ["evt_future_i", "evt_genuine_i"] {
        let e = stored(&s.store, "inbox-test", id).await;
        assert_eq!(e.state, InboxState::Done, "{id} applied, not skipped");
    }
    assert!(s
        .hooks
        .stale
        .lock()
        .unwrap()
        .iter()
        .all(|id| !id.ends_with("_i")));
}

#[tokio::test]
async fn out_of_order_deliveries_end_in_the_newest_state() {
    let s = setup();
    let state: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let worker = {
        let state = state.clone();
        s.guard
            .worker(move |e: InboxEvent| {
                let state = state.clone();
                async move {
                    let object = e.meta.object.clone().unwrap();
                    state
                        .lock()
                        .unwrap()
                        .insert(object, e.meta.event_type.clone().unwrap());
                    Ok(())
                }
            })
            .unwrap()
    };
    // Created in order pending(10) → succeeded(20) → refunded(30); delivered 20, 30, 10.
    for (id, ty, at) in [
        ("e2", "charge.succeeded", 20),
        ("e3", "charge.refunded", 30),
        ("e1", "charge.pending", 10),
    ] {
        accept(&s.guard, &body(id, ty, "ch_o", at)).await;
        worker.run_once().await.unwrap();
    }
    assert_eq!(state.lock().unwrap()["ch_o"], "charge.refunded");
    assert_eq!(*s.hooks.stale.lock().unwrap(), vec!["e1".to_owned()]);
    let e1 = stored(&s.store, "inbox-test", "e1").await;
    assert_eq!(e1.state, InboxState::Skipped);
}

#[tokio::test]
async fn the_direct_mode_ordering_guard_answers_stale() {
    let s = setup();
    let ran = AtomicUsize::new(0);
    for (id, at) in [("d2", 20), ("d1", 10)] {
        let b = body(id, "customer.updated", "cus_1", at);
        let outcome = s
            .guard
            .handle(&[("a", "b")], &b, |_| {
                ran.fetch_add(1, Ordering::SeqCst);
                async { Ok(()) }
            })
            .await;
        if id == "d1" {
            assert!(matches!(outcome, Outcome::Stale { .. }), "{outcome:?}");
            assert_eq!(s.guard.answer(&outcome).status, 200);
        }
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let again = s
        .guard
        .handle(
            &[("a", "b")],
            &body("d1", "customer.updated", "cus_1", 10),
            |_| async { Ok(()) },
        )
        .await;
    assert!(
        matches!(again, Outcome::Duplicate { .. }),
        "a stale id is remembered: {again:?}"
    );
    assert_eq!(
        *s.hooks.attempts.lock().unwrap(),
        [Some(1), Some(1), None],
        "a stale delivery won its claim: its attempt is reported; a duplicate has none"
    );
}

/// A guard on `store` (its ordering store too) that escalates at the first
/// failure and asks `api` to reconcile; its clock and hooks are the caller's.
fn escalating_guard(
    store: &MemoryStore,
    api: Arc<dyn Reconciler>,
) -> webhook_guard::WebhookGuardBuilder {
    WebhookGuard::builder()
        .store(store.clone())
        .ordering(store.clone())
        .reconciler(api)
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .escalate_after(1)
}

/// Delivers `body` to `guard` (built with [`escalating_guard`]) with a handler that
/// fails: escalated at once.
async fn escalate(guard: &WebhookGuard, body: &[u8]) {
    let outcome = guard
        .handle(&[("a", "b")], body, |_| async {
            Err(HandlerError::retryable("no"))
        })
        .await;
    assert!(matches!(outcome, Outcome::Escalated { .. }), "{outcome:?}");
}

#[tokio::test]
async fn escalation_reconciles_and_reconcile_stale_retries_failures() {
    #[derive(Debug, Default)]
    struct Down(AtomicUsize);
    #[async_trait]
    impl Reconciler for Down {
        async fn reconcile(&self, _: &ReconcileRequest) -> Result<(), BoxError> {
            if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                Err("provider API down".into())
            } else {
                Ok(())
            }
        }
    }
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let api = Arc::new(Down::default());
    let guard = escalating_guard(&store, api.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    let b = body("x1", "charge.succeeded", "trx-1", 5);
    escalate(&guard, &b).await;
    // The escalation's reconcile runs in the background and fails once.
    for _ in 0..100 {
        if api.0.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(api.0.load(Ordering::SeqCst), 1);
    clock.advance(TimeDelta::minutes(10));
    let report = guard
        .reconcile_stale(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!((report.found, report.reconciled), (1, 1));
    let report = guard
        .reconcile_stale(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!(report.found, 0, "a reconciled object is settled");
}

#[tokio::test]
async fn an_escalation_reconciled_at_once_is_not_reconciled_again() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let api = Arc::new(Api::default());
    let guard = escalating_guard(&store, api.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    let b = body("x2", "charge.succeeded", "trx-2", 5);
    escalate(&guard, &b).await;
    // The reconcile runs in the background; then its object is marked applied.
    let object = ObjectKey {
        namespace: guard.namespace(),
        object: "trx-2",
        family: "charge",
    };
    for _ in 0..1000 {
        let marked = store.get_object(object).await.unwrap();
        if marked.is_some_and(|o| o.status == ObjectStatus::Applied) {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(api.calls.lock().unwrap().len(), 1);
    clock.advance(TimeDelta::minutes(10));
    let report = guard
        .reconcile_stale(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!(report.found, 0, "reconciled once, at the escalation");
    assert_eq!(api.calls.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_panicking_escalation_hook_skips_neither_settle_nor_reconcile() {
    #[derive(Debug)]
    struct Panics;
    impl Hooks for Panics {
        fn on_escalation(&self, _: &webhook_guard::hooks::Escalation<'_>) {
            panic!("a hook bug");
        }
        fn on_permanent_failure(&self, _: Key<'_>, _: &str) {
            panic!("a hook bug");
        }
    }
    /// Records what it is asked, and fails: the objects stay settled failed.
    #[derive(Debug, Default)]
    struct Down(Mutex<Vec<Option<String>>>);
    #[async_trait]
    impl Reconciler for Down {
        async fn reconcile(&self, r: &ReconcileRequest) -> Result<(), BoxError> {
            self.0.lock().unwrap().push(r.meta.object.clone());
            Err("provider API down".into())
        }
    }
    let store = MemoryStore::new();
    let api = Arc::new(Down::default());
    let guard = escalating_guard(&store, api.clone())
        .hooks(Panics)
        .build()
        .unwrap();
    let escalating = body("x3", "charge.succeeded", "trx-3", 5);
    let permanent = body("x4", "charge.succeeded", "trx-4", 5);
    for (b, error) in [
        (&escalating, HandlerError::retryable("no")),
        (&permanent, HandlerError::permanent("never")),
    ] {
        let outcome = guard
            .handle(&[("a", "b")], b, |_| async { Err(error) })
            .await;
        assert!(
            matches!(
                outcome,
                Outcome::Escalated { .. } | Outcome::PermanentFailure { .. }
            ),
            "{outcome:?}"
        );
    }
    for object in ["trx-3", "trx-4"] {
        let key = ObjectKey {
            namespace: guard.namespace(),
            object,
            family: "charge",
        };
        let settled = store.get_object(key).await.unwrap().expect("observed");
        assert_eq!(
            settled.status,
            ObjectStatus::Failed,
            "{object} settled failed"
        );
    }
    for _ in 0..1000 {
        if api.0.lock().unwrap().len() == 2 {
            break;
        }
        tokio::task::yield_now().await;
    }
    let mut asked = api.0.lock().unwrap().clone();
    asked.sort();
    assert_eq!(asked, [Some("trx-3".to_owned()), Some("trx-4".to_owned())]);
}

/// An inbox that "dies" at a chosen store call: from that call on it never answers,
/// as if the worker's process was killed there. With `fail_renewals`, every lease
/// renewal fails as if the store could not be reached.
#[derive(Debug)]
struct DiesAt {
    inner: MemoryStore,
    calls: AtomicUsize,
    die_at: usize,
    fail_renewals: bool,
    /// Every purge hangs.
    hang_purges: bool,
    /// Every lease renewal hangs (a store that takes the request and never answers).
    hang_renewals: bool,
    /// The call with this number (counted as for `die_at`) panics, as a store with a
    /// bug might.
    panic_at: usize,
}

impl DiesAt {
    async fn step(&self) {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        assert_ne!(call, self.panic_at, "a store bug");
        if call >= self.die_at {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl InboxStore for DiesAt {
    async fn enqueue(
        &self,
        e: &webhook_guard::inbox::NewEvent<'_>,
    ) -> Result<webhook_guard::inbox::Enqueued, webhook_guard::StoreError> {
        self.inner.enqueue(e).await
    }
    async fn lease(
        &self,
        request: &LeaseRequest<'_>,
    ) -> Result<Vec<InboxEvent>, webhook_guard::StoreError> {
        self.step().await;
        self.inner.lease(request).await
    }
    async fn settle_event(
        &self,
        settle: &webhook_guard::inbox::Settle<'_>,
    ) -> Result<webhook_guard::store::Fence, webhook_guard::StoreError> {
        self.step().await;
        self.inner.settle_event(settle).await
    }
    async fn renew_event(
        &self,
        renew: &webhook_guard::inbox::RenewLease<'_>,
    ) -> Result<webhook_guard::store::Fence, webhook_guard::StoreError> {
        self.step().await;
        if self.hang_renewals {
            std::future::pending::<()>().await;
        }
        if self.fail_renewals {
            return Err(webhook_guard::StoreError::unavailable("connection refused"));
        }
        self.inner.renew_event(renew).await
    }
    async fn get_event(&self, k: Key<'_>) -> Result<Option<InboxEvent>, webhook_guard::StoreError> {
        self.inner.get_event(k).await
    }
    async fn purge_settled(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64, webhook_guard::StoreError> {
        if self.hang_purges {
            std::future::pending::<()>().await;
        }
        self.inner.purge_settled(now, limit).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_longer_than_the_lease_keeps_its_event() {
    let s = setup();
    let lease = Duration::from_millis(300); // renewed every 100 ms while the handler runs
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let worker = {
        let (runs, gate, started) = (runs.clone(), gate.clone(), started.clone());
        s.guard
            .worker(move |_e: InboxEvent| {
                let (runs, gate, started) = (runs.clone(), gate.clone(), started.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    started.notify_one();
                    gate.notified().await;
                    Ok(())
                }
            })
            .unwrap()
            .lease(lease)
    };
    accept(&s.guard, &body("evt_long", "x.y", "o", 1)).await;
    let first = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_once().await }
    });
    started.notified().await;
    // Twice the lease passes on the store's clock while the handler runs; the
    // worker renews the lease meanwhile, so another worker finds nothing due.
    for _ in 0..3 {
        s.clock.advance(TimeDelta::milliseconds(200));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // (Bounded: a worker that did lease it would wait in the handler.)
    let second = tokio::time::timeout(Duration::from_secs(2), worker.run_once()).await;
    assert_eq!(
        second.ok().map(Result::unwrap),
        Some(0),
        "the event is still leased"
    );
    gate.notify_one();
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let event = stored(&s.store, "inbox-test", "evt_long").await;
    assert_eq!(event.state, InboxState::Done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_handle_is_dropped_runs_on() {
    let s = setup();
    let worker = s
        .guard
        .worker(|_e: InboxEvent| async { Ok(()) })
        .unwrap()
        .poll_interval(Duration::from_millis(10));
    drop(worker.spawn());
    tokio::time::sleep(Duration::from_millis(100)).await; // idle polls meanwhile
    accept(&s.guard, &body("evt_later", "x.y", "o", 1)).await;
    let key = Key::new("inbox-test", "evt_later");
    for _ in 0..500 {
        if s.store.get_event(key).await.unwrap().unwrap().state == InboxState::Done {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the detached worker stopped");
}

#[tokio::test]
async fn a_worker_killed_at_any_store_call_loses_nothing() {
    // Kill points: 0 = before the lease, 1 = after the handler ran but before settle
    // (the handler's own effect is then applied again: at-least-once, which is why
    // effects in the same database belong in the transactional mode), 2 = never.
    for die_at in 0..3 {
        let store = MemoryStore::new();
        let clock = ManualClock::new(start());
        let guard = WebhookGuard::builder()
            .store(store.clone())
            .inbox(store.clone())
            .verifier(NoVerification)
            .event_id(EventId::json_field(["id"]))
            .clock(clock.clone())
            .build()
            .unwrap();
        for i in 0..5 {
            accept(&guard, &body(&format!("k{i}"), "t.x", "o", i)).await;
        }
        let runs: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let handler = {
            let runs = runs.clone();
            move |e: InboxEvent| {
                *runs.lock().unwrap().entry(e.id.clone()).or_default() += 1;
                async { Ok(()) }
            }
        };
        let dying = Arc::new(DiesAt {
            inner: store.clone(),
            calls: AtomicUsize::new(0),
            die_at,
            fail_renewals: false,
            hang_purges: false,
            hang_renewals: false,
            panic_at: usize::MAX,
        });
        let doomed = Worker::new(dying, "default", handler.clone())
            .clock(Arc::new(clock.clone()))
            .concurrency(1)
            .lease(Duration::from_secs(30));
        let killed = tokio::time::timeout(Duration::from_millis(200), doomed.run_once()).await;
        assert_eq!(
            killed.is_err(),
            die_at < 2,
            "the worker dies at call {die_at}"
        );
        // After the lease runs out a fresh worker finishes everything.
        clock.advance(TimeDelta::seconds(31));
        let survivor = Worker::new(Arc::new(store.clone()), "default", handler)
            .clock(Arc::new(clock.clone()))
            .concurrency(10);
        while survivor.run_once().await.unwrap() > 0 {}
        for i in 0..5 {
            let e = store
                .get_event(Key::new("default", &format!("k{i}")))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                e.state,
                InboxState::Done,
                "k{i} processed (die_at {die_at})"
            );
        }
        let runs = runs.lock().unwrap();
        let total: usize = runs.values().sum();
        let expected_reruns = usize::from(die_at == 1);
        assert_eq!(total, 5 + expected_reruns, "die_at {die_at}: {runs:?}");
    }
}

#[tokio::test]
async fn an_ordering_store_outage_is_503_and_counts_no_handler_failure() {
    let store = MemoryStore::new();
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .ordering(OrderingDown::new(&store, true))
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .build()
        .unwrap();
    let b = body("o1", "charge.succeeded", "ch_o", 10);
    for _ in 0..6 {
        let outcome = guard
            .handle(&[("a", "b")], &b, |_| async { panic!("must not run") })
            .await;
        assert!(
            matches!(outcome, Outcome::StoreUnavailable { .. }),
            "{outcome:?}"
        );
        assert_eq!(guard.answer(&outcome).status, 503);
    }
    let record = guard.inspect("o1").await.unwrap().unwrap();
    assert_eq!(
        record.failures, 0,
        "an outage of ours is not the handler's failure"
    );
    assert_eq!(
        record.state,
        webhook_guard::store::RecordState::Failed,
        "the claim was released"
    );
}

/// Two events of one object created in the same second (Stripe's `created` has
/// whole seconds): the one applied second cannot know it is the newer, so its object
/// is reconciled; a retry of one event after its failure is not a tie with another.
#[tokio::test]
async fn the_second_of_two_events_created_at_the_same_time_is_reconciled() {
    let s = setup();
    let first = body("evt_fin", "invoice.finalized", "in_1", 100);
    let failed = s
        .guard
        .handle(&[("a", "b")], &first, |_| async {
            Err(HandlerError::retryable("downstream down"))
        })
        .await;
    assert!(
        matches!(failed, Outcome::RetryableFailure { .. }),
        "{failed:?}"
    );
    let retried = s
        .guard
        .handle(&[("a", "b")], &first, |_| async { Ok(()) })
        .await;
    assert!(matches!(retried, Outcome::Processed { .. }), "{retried:?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        s.api.calls.lock().unwrap().is_empty(),
        "a retry of the same event is no tie"
    );
    let second = body("evt_paid", "invoice.paid", "in_1", 100);
    let applied = s
        .guard
        .handle(&[("a", "b")], &second, |_| async { Ok(()) })
        .await;
    assert!(matches!(applied, Outcome::Processed { .. }), "{applied:?}");
    reconciled(&s.api, "in_1", ReconcileReason::Overtaken).await;
    assert_eq!(s.api.calls.lock().unwrap().len(), 1);
}

/// A reconciler that fails, for good, for the first object it is asked about.
#[derive(Debug, Default)]
struct FailsFirst {
    first: Mutex<Option<String>>,
    done: Mutex<Vec<String>>,
}

#[async_trait]
impl Reconciler for FailsFirst {
    async fn reconcile(&self, r: &ReconcileRequest) -> Result<(), BoxError> {
        let object = r.meta.object.clone().unwrap_or_default();
        let mut first = self.first.lock().unwrap();
        if *first.get_or_insert_with(|| object.clone()) == object {
            return Err("the provider's API keeps failing for this one".into());
        }
        self.done.lock().unwrap().push(object);
        Ok(())
    }
}

/// An object the reconciler keeps failing goes to the back of the queue, so
/// `reconcile_stale` gets to the others.
#[tokio::test]
async fn reconcile_stale_gets_past_an_object_that_keeps_failing() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let api = Arc::new(FailsFirst::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .ordering(store.clone())
        .reconciler(api.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .namespace("stale")
        .clock(clock.clone())
        .build()
        .unwrap();
    for (i, object) in ["cus_a", "cus_b", "cus_c"].into_iter().enumerate() {
        let key = ObjectKey {
            namespace: "stale",
            object,
            family: "",
        };
        let at = start() + TimeDelta::seconds(i as i64);
        store
            .observe(&Observation {
                key,
                created_at: at,
                now: at,
            })
            .await
            .unwrap();
        assert!(store
            .settle_object(&ObjectMark {
                key,
                created_at: at,
                status: ObjectStatus::Failed,
                now: at
            })
            .await
            .unwrap());
    }
    let mut reconciled = 0;
    for _ in 0..3 {
        clock.advance(TimeDelta::seconds(10));
        reconciled += guard
            .reconcile_stale(Duration::ZERO, 1)
            .await
            .unwrap()
            .reconciled;
    }
    assert_eq!(reconciled, 2, "the two others, one per pass");
    assert_eq!(api.done.lock().unwrap().len(), 2);
}

/// A handler whose lease cannot be renewed is stopped once that lease has ended,
/// before another worker may take the event: never two runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_cannot_be_renewed_stops_its_handler_when_it_ends() {
    lease_end_stops_the_handler(true, false).await;
}

/// A renewal the store never answers does not keep the handler running past the
/// lease either: the end of the lease is looked at while the renewal waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_never_answers_stops_its_handler_when_the_lease_ends() {
    lease_end_stops_the_handler(false, true).await;
}

/// The first run hangs; its lease ends (renewals failing or hanging): the run is
/// dropped, and another worker then runs the event alone.
async fn lease_end_stops_the_handler(fail_renewals: bool, hang_renewals: bool) {
    let store = MemoryStore::new();
    let dying = Arc::new(DiesAt {
        inner: store.clone(),
        calls: AtomicUsize::new(0),
        die_at: usize::MAX,
        fail_renewals,
        hang_purges: false,
        hang_renewals,
        panic_at: usize::MAX,
    });
    let clock = ManualClock::new(start());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(dying.clone())
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .namespace("renew")
        .clock(clock.clone())
        .build()
        .unwrap();
    let (running, most, runs) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let gate = Arc::new(tokio::sync::Notify::new());
    let worker = {
        let (running, most, runs, gate) =
            (running.clone(), most.clone(), runs.clone(), gate.clone());
        guard
            .worker(move |_e: InboxEvent| {
                let (running, most, runs, gate) =
                    (running.clone(), most.clone(), runs.clone(), gate.clone());
                async move {
                    // Counted out when the run ends or is dropped.
                    struct Running(Arc<AtomicUsize>);
                    impl Drop for Running {
                        fn drop(&mut self) {
                            self.0.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    let _running = Running(running);
                    most.fetch_max(now, Ordering::SeqCst);
                    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                        gate.notified().await; // the first run hangs
                    }
                    Ok(())
                }
            })
            .unwrap()
            .lease(Duration::from_millis(300))
    };
    accept(&guard, &body("evt_hang", "x.y", "o", 1)).await;
    let first = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_once().await }
    });
    // The run has begun and a renewal has been sent (the lease, then a renewal:
    // two store calls), so the end of the lease is met while renewing.
    while runs.load(Ordering::SeqCst) == 0 || dying.calls.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The lease ends on the store's clock; renewals fail meanwhile.
    clock.advance(TimeDelta::milliseconds(400));
    let first = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the hung handler was stopped at the end of its lease");
    assert_eq!(first.unwrap().unwrap(), 1);
    assert_eq!(
        running.load(Ordering::SeqCst),
        0,
        "the first run was dropped"
    );
    // Another worker now takes the event and runs it, alone.
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(most.load(Ordering::SeqCst), 1, "never two runs at once");
    gate.notify_waiters();
}

/// The memory store, with the ordering ledger unreachable while `down` is set.
#[derive(Debug)]
struct OrderingDown {
    inner: MemoryStore,
    down: std::sync::atomic::AtomicBool,
    /// Taken by the first `observe`, which then moves the clock on by as much (a
    /// slow round trip).
    slow_once: Mutex<Option<(ManualClock, TimeDelta)>>,
    /// Taken by the first `observe`, which then waits this long on the real clock.
    nap_once: Mutex<Option<Duration>>,
}

impl OrderingDown {
    /// The memory store's ledger, reachable unless `down`.
    fn new(store: &MemoryStore, down: bool) -> Self {
        Self {
            inner: store.clone(),
            down: down.into(),
            slow_once: Mutex::default(),
            nap_once: Mutex::default(),
        }
    }

    fn check(&self) -> Result<(), webhook_guard::StoreError> {
        match self.down.load(Ordering::SeqCst) {
            true => Err(webhook_guard::StoreError::unavailable("connection refused")),
            false => Ok(()),
        }
    }
}

#[async_trait]
impl OrderingStore for OrderingDown {
    async fn observe(
        &self,
        event: &Observation<'_>,
    ) -> Result<webhook_guard::ordering::Freshness, webhook_guard::StoreError> {
        self.check()?;
        if let Some((clock, by)) = self.slow_once.lock().unwrap().take() {
            clock.advance(by);
        }
        let nap = self.nap_once.lock().unwrap().take();
        if let Some(nap) = nap {
            tokio::time::sleep(nap).await;
        }
        self.inner.observe(event).await
    }
    async fn settle_object(
        &self,
        mark: &ObjectMark<'_>,
    ) -> Result<bool, webhook_guard::StoreError> {
        self.check()?;
        self.inner.settle_object(mark).await
    }
    async fn mark_object(&self, mark: &ObjectMark<'_>) -> Result<bool, webhook_guard::StoreError> {
        self.check()?;
        self.inner.mark_object(mark).await
    }
    async fn mark_object_if_failed(
        &self,
        mark: &FailedMark<'_>,
    ) -> Result<bool, webhook_guard::StoreError> {
        self.check()?;
        self.inner.mark_object_if_failed(mark).await
    }
    async fn get_object(
        &self,
        key: ObjectKey<'_>,
    ) -> Result<Option<webhook_guard::ordering::ObjectRecord>, webhook_guard::StoreError> {
        self.inner.get_object(key).await
    }
    async fn failed_objects(
        &self,
        page: &FailedPage<'_>,
    ) -> Result<Vec<webhook_guard::ordering::ObjectRecord>, webhook_guard::StoreError> {
        self.inner.failed_objects(page).await
    }
}

/// An outage of the ordering store longer than the retry policy is ours, not the
/// handler's: once it ends, the event runs (before, its leases during the outage
/// used up its attempts and it was dead-lettered unrun).
#[tokio::test]
async fn an_ordering_outage_does_not_use_up_the_attempts() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let ordering = Arc::new(OrderingDown::new(&store, true));
    let guard = outage_guard(&store, ordering.clone(), &clock);
    let runs = Arc::new(AtomicUsize::new(0));
    let worker = {
        let runs = runs.clone();
        guard
            .worker(move |_e: InboxEvent| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .unwrap()
    };
    let now = start().timestamp();
    accept(&guard, &body("evt_o", "charge.updated", "ch_o", now)).await;
    for _ in 0..20 {
        worker.run_once().await.unwrap();
        clock.advance(TimeDelta::hours(1));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "nothing ran during the outage"
    );
    let event = stored(&store, "outage", "evt_o").await;
    assert_eq!(event.attempts, 0, "each attempt was given back");
    ordering.down.store(false, Ordering::SeqCst);
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let event = stored(&store, "outage", "evt_o").await;
    assert_eq!(event.state, InboxState::Done);
}

/// A spawned worker purges every settled event that expired, not one batch of
/// 1,000 a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_worker_purges_a_backlog_of_settled_events() {
    let s = setup();
    let worker = s
        .guard
        .worker(|_e: InboxEvent| async { Ok(()) })
        .unwrap()
        .retention(Duration::from_secs(360));
    for i in 0..2_500 {
        accept(
            &s.guard,
            &body(&format!("evt_p{i}"), "x.y", &format!("o{i}"), 1),
        )
        .await;
    }
    while worker.run_once().await.unwrap() > 0 {}
    s.clock.advance(TimeDelta::minutes(7));
    let handle = worker.spawn();
    let key = |i: i32| format!("evt_p{i}");
    for _ in 0..200 {
        let left = s
            .store
            .get_event(Key::new("inbox-test", &key(2_499)))
            .await
            .unwrap();
        if left.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.shutdown().await;
    for i in [0, 999, 1_000, 1_999, 2_000, 2_499] {
        assert!(
            s.store
                .get_event(Key::new("inbox-test", &key(i)))
                .await
                .unwrap()
                .is_none(),
            "{} purged",
            key(i)
        );
    }
}

/// Hooks whose dead-letter alert panics (a bug in the host's alerting).
#[derive(Debug)]
struct PanickingAlert;

impl Hooks for PanickingAlert {
    fn on_dead_letter(&self, _: &InboxEvent, _: &str) {
        panic!("the pager client broke");
    }
}

/// A panicking dead-letter hook does not skip the object's settle nor the
/// reconciler: the event is terminal, and nothing would ask for them again.
#[tokio::test]
async fn a_panicking_dead_letter_hook_still_reconciles() {
    let store = MemoryStore::new();
    let api = Arc::new(Api::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .ordering(store.clone())
        .reconciler(api.clone())
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .namespace("alerts")
        .clock(ManualClock::new(start()))
        .hooks(Arc::new(PanickingAlert))
        .build()
        .unwrap();
    let worker = guard
        .worker(|_e: InboxEvent| async { Err(HandlerError::permanent("unknown customer")) })
        .unwrap();
    accept(&guard, &body("evt_dl", "charge.updated", "ch_dl", 1)).await;
    assert_eq!(worker.run_once().await.unwrap(), 1);
    let calls = api.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [(Some("ch_dl".to_owned()), ReconcileReason::PermanentFailure)]
    );
    let object = store
        .get_object(ObjectKey {
            namespace: "alerts",
            object: "ch_dl",
            family: "charge",
        })
        .await
        .unwrap()
        .unwrap();
    // Settled failed, then marked applied once the reconciler succeeded.
    assert_eq!(object.status, ObjectStatus::Applied);
}

/// A spawned worker keeps its slots full: one event whose handler hangs holds its
/// own slot, and the events after it run meanwhile (they once waited for the whole
/// batch the hung event was leased in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_event_holds_only_its_own_slot() {
    let s = setup();
    let (runs, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let gate = Arc::new(tokio::sync::Notify::new());
    let worker = {
        let (runs, done, gate) = (runs.clone(), done.clone(), gate.clone());
        s.guard
            .worker(move |_e: InboxEvent| {
                let (runs, done, gate) = (runs.clone(), done.clone(), gate.clone());
                async move {
                    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                        gate.notified().await; // the first run hangs until released
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .unwrap()
            .concurrency(2)
            .poll_interval(Duration::from_secs(3600))
    };
    for i in 0..5 {
        accept(
            &s.guard,
            &body(&format!("evt_h{i}"), "x.y", &format!("o{i}"), 1),
        )
        .await;
    }
    let handle = worker.spawn();
    // No poll interval passes: each finished event frees its slot for the next.
    for _ in 0..500 {
        if done.load(Ordering::SeqCst) == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        done.load(Ordering::SeqCst),
        4,
        "the four other events ran while the first hung"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    gate.notify_one();
    handle.shutdown().await; // waits for the released event
    assert_eq!(done.load(Ordering::SeqCst), 5);
    for i in 0..5 {
        let key = format!("evt_h{i}");
        let event = s
            .store
            .get_event(Key::new("inbox-test", &key))
            .await
            .unwrap();
        assert_eq!(event.unwrap().state, InboxState::Done, "{key}");
    }
}

/// A lease of zero is taken as the shortest lease, 100 ms: a zero lease ended
/// before its event ran, so that another lease could take the event meanwhile.
#[tokio::test]
async fn a_zero_lease_is_the_shortest_lease() {
    let s = setup();
    let held = Arc::new(Mutex::new(None));
    let worker = {
        let (store, clock, held) = (s.store.clone(), s.clock.clone(), held.clone());
        s.guard
            .worker(move |e: InboxEvent| {
                let (store, clock, held) = (store.clone(), clock.clone(), held.clone());
                async move {
                    let stored = store.get_event(e.key()).await.unwrap().unwrap();
                    *held.lock().unwrap() = Some(stored.lease_until - clock.now());
                    Ok(())
                }
            })
            .unwrap()
            .lease(Duration::ZERO)
    };
    accept(&s.guard, &body("evt_z", "x.y", "o", 1)).await;
    assert_eq!(worker.run_once().await.unwrap(), 1);
    let held = held.lock().unwrap().expect("the handler ran");
    assert_eq!(held, TimeDelta::milliseconds(100));
}

/// A guard on `store`'s inbox in namespace `outage`, with `ordering` as its
/// ordering store.
fn outage_guard(
    store: &MemoryStore,
    ordering: Arc<OrderingDown>,
    clock: &ManualClock,
) -> WebhookGuard {
    WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .ordering(ordering)
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .namespace("outage")
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// A handler error that reads like the worker's own ordering outage is the
/// handler's failure all the same: an event whose later runs died unsettled is
/// dead-lettered once past its attempts, not run again.
#[tokio::test]
async fn a_handler_error_cannot_pass_for_an_ordering_outage() {
    let s = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let worker = {
        let runs = runs.clone();
        s.guard
            .worker(move |_e: InboxEvent| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err(HandlerError::retryable(
                        "ordering store unavailable: not ours",
                    ))
                }
            })
            .unwrap()
            .retry_policy(RetryPolicy::exponential(
                2,
                Duration::from_secs(1),
                Duration::from_secs(1),
            ))
    };
    accept(&s.guard, &body("evt_s", "x.y", "o", 1)).await;
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The second attempt: a worker leases the event and dies before settling it.
    s.clock.advance(TimeDelta::seconds(2));
    let now = s.clock.now();
    let died = s
        .store
        .lease(&LeaseRequest {
            namespace: "inbox-test",
            now,
            lease_until: now + TimeDelta::seconds(1),
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(died.len(), 1);
    s.clock.advance(TimeDelta::seconds(2));
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not run a third time");
    let event = stored(&s.store, "inbox-test", "evt_s").await;
    assert_eq!(event.state, InboxState::Dead);
}

/// The attempt an ordering outage gives back does not grow the policy's delay, so
/// the wait grows with the time the event has waited: it backs off through a long
/// outage instead of coming back every poll interval.
#[tokio::test]
async fn an_ordering_outage_backs_off() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let ordering = Arc::new(OrderingDown::new(&store, true));
    let guard = outage_guard(&store, ordering, &clock);
    let worker = guard
        .worker(|_e: InboxEvent| async { Ok(()) })
        .unwrap()
        .poll_interval(Duration::from_secs(1));
    accept(
        &guard,
        &body("evt_b", "charge.updated", "ch_b", start().timestamp()),
    )
    .await;
    let key = Key::new("outage", "evt_b");
    let wait = || async {
        let event = store.get_event(key).await.unwrap().unwrap();
        assert_eq!(event.state, InboxState::Pending);
        event.next_attempt_at - clock.now()
    };
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert!(
        wait().await <= TimeDelta::seconds(1),
        "a fresh event waits a poll"
    );
    clock.advance(TimeDelta::minutes(4));
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(
        wait().await,
        TimeDelta::minutes(1),
        "a quarter of its 4 minutes"
    );
    clock.advance(TimeDelta::hours(1));
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(
        wait().await,
        TimeDelta::minutes(5),
        "the policy's longest delay"
    );
}

/// A purge that takes long holds up no lease: the spawned worker purges on a task
/// of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_purge_holds_up_no_event() {
    let store = MemoryStore::new();
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(Arc::new(DiesAt {
            inner: store.clone(),
            calls: AtomicUsize::new(0),
            die_at: usize::MAX,
            fail_renewals: false,
            hang_purges: true,
            hang_renewals: false,
            panic_at: usize::MAX,
        }))
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .namespace("purge")
        .build()
        .unwrap();
    let worker = guard
        .worker(|_e: InboxEvent| async { Ok(()) })
        .unwrap()
        .poll_interval(Duration::from_millis(10));
    let handle = worker.spawn(); // its first pass starts a purge, which hangs
    tokio::time::sleep(Duration::from_millis(50)).await;
    accept(&guard, &body("evt_after", "x.y", "o", 1)).await;
    let key = Key::new("purge", "evt_after");
    for _ in 0..500 {
        if store.get_event(key).await.unwrap().unwrap().state == InboxState::Done {
            handle.abort();
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the event waited for the purge");
}

/// A reconciler with a bug.
#[derive(Debug)]
struct PanickingReconciler;

#[async_trait]
impl Reconciler for PanickingReconciler {
    async fn reconcile(&self, _: &ReconcileRequest) -> Result<(), BoxError> {
        panic!("a reconciler bug")
    }
}

/// A run past its time limit whose reconciler panics fails as a retryable error,
/// as when the reconciler errs: the event is put back, not left running.
#[tokio::test]
async fn a_panicking_reconciler_does_not_leave_a_timed_out_event_running() {
    let store = MemoryStore::new();
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .reconciler(PanickingReconciler)
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .namespace("panics")
        .clock(ManualClock::new(start()))
        .build()
        .unwrap();
    accept(&guard, &body("evt_p", "x.y", "o", 1)).await;
    let worker = guard
        .worker(|_e: InboxEvent| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(())
        })
        .unwrap()
        .handler_timeout(Duration::from_millis(50));
    assert_eq!(worker.run_once().await.unwrap(), 1);
    let event = stored(&store, "panics", "evt_p").await;
    assert_eq!(event.state, InboxState::Pending);
    assert_eq!(event.last_error.as_deref(), Some("handler timed out"));
}

/// A policy of no attempts is taken as one (as the field says): the event runs once,
/// not dead-lettered unrun.
#[tokio::test]
async fn a_policy_of_zero_attempts_still_runs_the_event_once() {
    let s = setup();
    accept(&s.guard, &body("evt_z", "x.y", "o", 1)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let mut policy = RetryPolicy::default();
    policy.max_attempts = 0;
    let worker = {
        let runs = runs.clone();
        s.guard
            .worker(move |_e: InboxEvent| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .unwrap()
            .retry_policy(policy)
    };
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        stored(&s.store, "inbox-test", "evt_z").await.state,
        InboxState::Done
    );
}

/// A dead letter's object is marked failed before the event is settled dead: a
/// worker that dies in between leaves the object listed for `reconcile_stale`.
#[tokio::test]
async fn a_dead_letter_is_listed_for_reconcile_stale_even_if_its_worker_dies_settling_it() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let api = Arc::new(Api::default());
    let dying = Arc::new(DiesAt {
        inner: store.clone(),
        calls: AtomicUsize::new(0),
        die_at: 1, // the lease answers; the settle that follows never does
        fail_renewals: false,
        hang_purges: false,
        hang_renewals: false,
        panic_at: usize::MAX,
    });
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(dying.clone())
        .ordering(store.clone())
        .reconciler(api.clone())
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .namespace("dies")
        .clock(clock.clone())
        .build()
        .unwrap();
    accept(&guard, &body("evt_d", "x.y", "trx-d", 1)).await;
    let worker = guard
        .worker(|_e: InboxEvent| async { Err(HandlerError::permanent("refused")) })
        .unwrap();
    let running = tokio::spawn(async move { worker.run_once().await });
    while dying.calls.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    clock.advance(TimeDelta::minutes(10));
    let report = guard
        .reconcile_stale(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!(report.found, 1, "the object of the dead letter is listed");
    running.abort();
}

/// An event whose lease ended before its handler could start (a slow ordering
/// check) is not run: another worker may have it by then. The next lease runs it.
#[tokio::test]
async fn an_event_whose_lease_ended_before_its_run_is_not_run() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let ordering = Arc::new(OrderingDown {
        slow_once: Mutex::new(Some((clock.clone(), TimeDelta::milliseconds(400)))),
        ..OrderingDown::new(&store, false)
    });
    let guard = ordered_inbox_guard(&store, ordering, "late")
        .clock(clock.clone())
        .build()
        .unwrap();
    accept(&guard, &body("evt_late", "x.y", "trx-l", 1)).await;
    let (worker, runs) = counting_worker(&guard);
    let worker = worker.lease(Duration::from_millis(300));
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "not run on a lease that had ended"
    );
    let back = stored(&store, "late", "evt_late").await;
    assert_eq!(
        (back.state, back.attempts),
        (InboxState::Pending, 0),
        "put back at once, the attempt given back"
    );
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let done = stored(&store, "late", "evt_late").await;
    assert_eq!((done.state, done.attempts), (InboxState::Done, 1));
}

/// A guard with an inbox on `store` under `namespace`, ordering events through
/// `ordering` by their `created` and `object` fields.
fn ordered_inbox_guard(
    store: &MemoryStore,
    ordering: Arc<dyn OrderingStore>,
    namespace: &str,
) -> webhook_guard::WebhookGuardBuilder {
    WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .ordering(ordering)
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .namespace(namespace)
}

/// A worker of `guard` whose handler counts its runs, and the count.
fn counting_worker(guard: &WebhookGuard) -> (Worker, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let worker = guard
        .worker(move |_e: InboxEvent| {
            let runs = counted.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
        .unwrap();
    (worker, runs)
}

/// An ordering check slower than the lease keeps the lease (renewed while it
/// waits): no other worker leases the event meanwhile, and it runs once, on its
/// first attempt. Before, the lease ran out during the check, a second lease took
/// the event (counting an attempt), and the first one's settle was fenced out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_ordering_check_keeps_its_lease() {
    let store = MemoryStore::new();
    let ordering = Arc::new(OrderingDown::new(&store, false));
    *ordering.nap_once.lock().unwrap() = Some(Duration::from_millis(600));
    let guard = ordered_inbox_guard(&store, ordering, "slowcheck")
        .build()
        .unwrap();
    let created = Utc::now().timestamp() - 10;
    accept(&guard, &body("evt_slowcheck", "x.y", "trx-s", created)).await;
    let (worker, runs) = counting_worker(&guard);
    let worker = worker.lease(Duration::from_millis(300));
    let first = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_once().await.unwrap() }
    });
    // Past the first lease's end, while its check still waits.
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(
        worker.run_once().await.unwrap(),
        0,
        "the lease was renewed: nothing to lease"
    );
    assert_eq!(first.await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let done = stored(&store, "slowcheck", "evt_slowcheck").await;
    assert_eq!((done.state, done.attempts), (InboxState::Done, 1));
}

/// An ordering store that does not answer holds an event at most three leases (the
/// lease renewed meanwhile): then the event is put back unrun, its attempt given
/// back, as after an error of the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordering_check_that_never_answers_is_given_up() {
    let store = MemoryStore::new();
    let ordering = Arc::new(OrderingDown::new(&store, false));
    *ordering.nap_once.lock().unwrap() = Some(Duration::from_secs(3600));
    let guard = ordered_inbox_guard(&store, ordering, "hungcheck")
        .build()
        .unwrap();
    let created = Utc::now().timestamp() - 10;
    accept(&guard, &body("evt_hung", "x.y", "trx-h", created)).await;
    let (worker, runs) = counting_worker(&guard);
    let worker = worker.lease(Duration::from_millis(100));
    let ran = tokio::time::timeout(Duration::from_secs(10), worker.run_once()).await;
    assert_eq!(ran.expect("given up within three leases").unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let back = stored(&store, "hungcheck", "evt_hung").await;
    assert_eq!((back.state, back.attempts), (InboxState::Pending, 0));
    let error = back.last_error.unwrap_or_default();
    assert!(error.contains("no answer within"), "{error}");
}

/// A handler that starts with less than a third of its lease left (the lease call
/// and the ordering check took the rest) has its lease renewed at once, and runs to
/// its end. Before, the first renewal waited for the lease's end, where the run
/// was stopped as unrenewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_started_late_in_its_lease_is_renewed_at_once() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    // Seven tenths of the lease gone before the handler starts.
    let ordering = Arc::new(OrderingDown {
        slow_once: Mutex::new(Some((clock.clone(), TimeDelta::milliseconds(700)))),
        ..OrderingDown::new(&store, false)
    });
    let guard = ordered_inbox_guard(&store, ordering, "latestart")
        .clock(clock.clone())
        .build()
        .unwrap();
    accept(&guard, &body("evt_latestart", "x.y", "trx-ls", 1)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let worker = {
        let (runs, clock) = (runs.clone(), clock.clone());
        guard
            .worker(move |_e: InboxEvent| {
                let (runs, clock) = (runs.clone(), clock.clone());
                async move {
                    // Past the end of the lease as leased, a little after the start.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    clock.advance(TimeDelta::milliseconds(400));
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .unwrap()
            .lease(Duration::from_secs(1))
    };
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran to its end");
    let done = stored(&store, "latestart", "evt_latestart").await;
    assert_eq!((done.state, done.attempts), (InboxState::Done, 1));
}

/// A guard's worker keeps settled events at least as long as the guard requires
/// of its own retention (here its lease): with a shorter retention, a resend
/// right after the event was done replaced it and ran the handler again.
#[tokio::test]
async fn a_guards_worker_keeps_settled_events_past_the_guards_lease() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .namespace("short")
        .lease(Duration::from_secs(60))
        .clock(clock.clone())
        .build()
        .unwrap();
    let (worker, runs) = counting_worker(&guard);
    let worker = worker.retention(Duration::ZERO);
    let event = body("evt_short", "x.y", "trx-sh", 1);
    accept(&guard, &event).await;
    assert_eq!(worker.run_once().await.unwrap(), 1);
    clock.advance(TimeDelta::seconds(30));
    accept(&guard, &event).await;
    assert_eq!(worker.run_once().await.unwrap(), 0, "nothing to run again");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let done = stored(&store, "short", "evt_short").await;
    assert_eq!(done.state, InboxState::Done);
    assert_eq!(done.expires_at, start() + TimeDelta::seconds(60));
}

/// A lease call that panics (a store bug) does not end a spawned worker: later
/// events are still run.
#[tokio::test]
async fn a_spawned_worker_survives_a_panicking_lease() {
    let store = MemoryStore::new();
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(Arc::new(DiesAt {
            inner: store.clone(),
            calls: AtomicUsize::new(0),
            die_at: usize::MAX,
            fail_renewals: false,
            hang_purges: false,
            hang_renewals: false,
            panic_at: 0, // the first lease
        }))
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .namespace("survives")
        .build()
        .unwrap();
    let handle = guard
        .worker(|_e: InboxEvent| async { Ok(()) })
        .unwrap()
        .poll_interval(Duration::from_millis(5))
        .spawn();
    accept(&guard, &body("evt_after", "x.y", "o", 1)).await;
    let mut state = None;
    for _ in 0..500 {
        state = Some(stored(&store, "survives", "evt_after").await.state);
        if state == Some(InboxState::Done) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        state,
        Some(InboxState::Done),
        "the worker went on after the panic"
    );
    handle.shutdown().await;
}

/// A reconciler that panics in `reconcile_stale` fails its objects as an error
/// would: the call answers, every object of the batch is tried, none counted.
#[tokio::test]
async fn reconcile_stale_survives_a_panicking_reconciler() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let guard = escalating_guard(&store, Arc::new(PanickingReconciler))
        .clock(clock.clone())
        .build()
        .unwrap();
    escalate(&guard, &body("x1", "charge.succeeded", "trx-1", 5)).await;
    escalate(&guard, &body("x2", "charge.succeeded", "trx-2", 5)).await;
    clock.advance(TimeDelta::minutes(10));
    let report = guard
        .reconcile_stale(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!((report.found, report.reconciled), (2, 0));
    clock.advance(TimeDelta::minutes(10));
    let again = guard
        .reconcile_stale(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!(again.found, 2, "both stay listed");
}

/// Guards of either conflict setting may share an inbox: an event accepted by a
/// guard that detects no conflicts keeps no fingerprint to compare, so another
/// body under its id is accepted by a guard that does (as for claims).
#[tokio::test]
async fn accept_shares_an_inbox_across_conflict_settings() {
    let store = MemoryStore::new();
    let guard = |detect: bool| {
        WebhookGuard::builder()
            .store(store.clone())
            .inbox(store.clone())
            .verifier(NoVerification)
            .event_id(EventId::json_field(["id"]))
            .namespace("shared")
            .detect_conflicts(detect)
            .build()
            .unwrap()
    };
    let (off, on) = (guard(false), guard(true));
    let first = accept(&off, br#"{"id":"evt_s","n":1}"#).await;
    assert!(
        matches!(first, Outcome::Accepted { new: true, .. }),
        "{first:?}"
    );
    let second = accept(&on, br#"{"id":"evt_s","n":2}"#).await;
    assert!(
        matches!(second, Outcome::Accepted { new: false, .. }),
        "{second:?}"
    );
    // Still a conflict between two guards that both compare.
    let third = accept(&on, br#"{"id":"evt_t","n":1}"#).await;
    assert!(
        matches!(third, Outcome::Accepted { new: true, .. }),
        "{third:?}"
    );
    let fourth = accept(&on, br#"{"id":"evt_t","n":2}"#).await;
    assert!(matches!(fourth, Outcome::Conflict { .. }), "{fourth:?}");
}

/// `reconcile_stale` marks an object applied only while it is still the failure it
/// listed: another event created at the same time that failed while the reconciler
/// ran stays listed, for its own reconcile.
#[tokio::test]
async fn reconcile_stale_leaves_a_failure_that_came_during_its_reconcile() {
    #[derive(Debug)]
    struct FailsSameTimeMeanwhile {
        store: MemoryStore,
        clock: ManualClock,
        calls: AtomicUsize,
    }
    #[async_trait]
    impl Reconciler for FailsSameTimeMeanwhile {
        async fn reconcile(&self, r: &ReconcileRequest) -> Result<(), BoxError> {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err("the escalation's own reconcile fails".into());
            }
            // Meanwhile another event of the object, created at the same time, fails.
            let key = ObjectKey {
                namespace: &r.namespace,
                object: r.meta.object.as_deref().unwrap(),
                family: r.meta.family.as_deref().unwrap(),
            };
            let created_at = r.meta.created_at.unwrap();
            self.clock.advance(TimeDelta::seconds(1));
            self.store
                .settle_object(&ObjectMark {
                    key,
                    created_at,
                    status: ObjectStatus::Failed,
                    now: self.clock.now(),
                })
                .await?;
            Ok(())
        }
    }
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let api = Arc::new(FailsSameTimeMeanwhile {
        store: store.clone(),
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    let guard = escalating_guard(&store, api.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    escalate(&guard, &body("x1", "charge.succeeded", "trx-1", 5)).await;
    for _ in 0..100 {
        if api.calls.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    clock.advance(TimeDelta::minutes(10));
    let report = guard
        .reconcile_stale(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!((report.found, report.reconciled), (1, 1));
    let again = guard.reconcile_stale(Duration::ZERO, 10).await.unwrap();
    assert_eq!(
        again.found, 1,
        "the failure that came meanwhile stays listed"
    );
}

/// An object whose failure another reconcile cleared while `reconcile_stale`'s own
/// reconcile of it failed (two replicas, or an escalation's reconcile overlapping)
/// stays cleared: before, the requeue marked it failed again, whatever it was.
#[tokio::test]
async fn a_failed_reconcile_leaves_an_object_cleared_meanwhile_cleared() {
    /// Fails every reconcile; the second clears the object first, as another
    /// replica's successful reconcile would.
    #[derive(Debug)]
    struct ClearedElsewhere {
        store: MemoryStore,
        clock: ManualClock,
        calls: AtomicUsize,
    }
    #[async_trait]
    impl Reconciler for ClearedElsewhere {
        async fn reconcile(&self, r: &ReconcileRequest) -> Result<(), BoxError> {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 1 {
                let key = ObjectKey {
                    namespace: &r.namespace,
                    object: r.meta.object.as_deref().unwrap(),
                    family: r.meta.family.as_deref().unwrap(),
                };
                let object = self.store.get_object(key).await?.unwrap();
                self.clock.advance(TimeDelta::seconds(1));
                let mark = FailedMark {
                    key,
                    created_at: object.newest,
                    failed_since: object.updated_at,
                    status: ObjectStatus::Applied,
                    now: self.clock.now(),
                };
                assert!(self.store.mark_object_if_failed(&mark).await?);
            }
            Err("provider API down".into())
        }
    }
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let api = Arc::new(ClearedElsewhere {
        store: store.clone(),
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    let guard = escalating_guard(&store, api.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    escalate(&guard, &body("x1", "charge.succeeded", "trx-1", 5)).await;
    for _ in 0..100 {
        if api.calls.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        api.calls.load(Ordering::SeqCst),
        1,
        "the escalation's reconcile ran"
    );
    clock.advance(TimeDelta::minutes(10));
    let report = guard
        .reconcile_stale(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!((report.found, report.reconciled), (1, 0));
    let again = guard.reconcile_stale(Duration::ZERO, 10).await.unwrap();
    assert_eq!(again.found, 0, "cleared meanwhile: stays cleared");
}

/// A failure that lands while `reconcile_stale` marks an object it reconciled (just
/// after a read of the object, or just before the store changes it) stays listed:
/// the mark is one conditional change in the store, not a read and then a mark.
#[tokio::test]
async fn a_failure_landing_as_a_reconciled_object_is_marked_stays_listed() {
    /// The memory ledger, where another event created at the same time fails once
    /// `armed`: right after a read of the object, or right before a clear.
    #[derive(Debug)]
    struct FailsAtTheMark {
        inner: MemoryStore,
        clock: ManualClock,
        armed: std::sync::atomic::AtomicBool,
    }
    impl FailsAtTheMark {
        async fn fail_meanwhile(&self, key: ObjectKey<'_>, created_at: DateTime<Utc>) {
            if self.armed.swap(false, Ordering::SeqCst) {
                self.clock.advance(TimeDelta::seconds(1));
                let now = self.clock.now();
                let status = ObjectStatus::Failed;
                let mark = ObjectMark {
                    key,
                    created_at,
                    status,
                    now,
                };
                let settled = self.inner.settle_object(&mark);
                assert!(!settled.await.unwrap(), "settled before, failed again");
            }
        }
    }
    #[async_trait]
    impl OrderingStore for FailsAtTheMark {
        async fn observe(
            &self,
            event: &Observation<'_>,
        ) -> Result<webhook_guard::ordering::Freshness, webhook_guard::StoreError> {
            self.inner.observe(event).await
        }
        async fn settle_object(
            &self,
            mark: &ObjectMark<'_>,
        ) -> Result<bool, webhook_guard::StoreError> {
            self.inner.settle_object(mark).await
        }
        async fn mark_object(
            &self,
            mark: &ObjectMark<'_>,
        ) -> Result<bool, webhook_guard::StoreError> {
            self.inner.mark_object(mark).await
        }
        async fn mark_object_if_failed(
            &self,
            mark: &FailedMark<'_>,
        ) -> Result<bool, webhook_guard::StoreError> {
            self.fail_meanwhile(mark.key, mark.created_at).await;
            self.inner.mark_object_if_failed(mark).await
        }
        async fn get_object(
            &self,
            key: ObjectKey<'_>,
        ) -> Result<Option<webhook_guard::ordering::ObjectRecord>, webhook_guard::StoreError>
        {
            let read = self.inner.get_object(key).await;
            if let Ok(Some(object)) = &read {
                self.fail_meanwhile(key, object.newest).await;
            }
            read
        }
        async fn failed_objects(
            &self,
            page: &FailedPage<'_>,
        ) -> Result<Vec<webhook_guard::ordering::ObjectRecord>, webhook_guard::StoreError> {
            self.inner.failed_objects(page).await
        }
    }
    /// Fails the escalation's own reconcile, settles every later one.
    #[derive(Debug, Default)]
    struct FirstFails(AtomicUsize);
    #[async_trait]
    impl Reconciler for FirstFails {
        async fn reconcile(&self, _: &ReconcileRequest) -> Result<(), BoxError> {
            match self.0.fetch_add(1, Ordering::SeqCst) {
                0 => Err("provider API down".into()),
                _ => Ok(()),
            }
        }
    }
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let ordering = Arc::new(FailsAtTheMark {
        inner: store.clone(),
        clock: clock.clone(),
        armed: Default::default(),
    });
    let api = Arc::new(FirstFails::default());
    let guard = escalating_guard(&store, api.clone())
        .ordering(ordering.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    escalate(&guard, &body("x1", "charge.succeeded", "trx-1", 5)).await;
    for _ in 0..100 {
        if api.0.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        api.0.load(Ordering::SeqCst),
        1,
        "the escalation's reconcile ran"
    );
    clock.advance(TimeDelta::minutes(10));
    ordering.armed.store(true, Ordering::SeqCst);
    let report = guard
        .reconcile_stale(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!((report.found, report.reconciled), (1, 1));
    assert!(
        !ordering.armed.load(Ordering::SeqCst),
        "the failure landed during the mark"
    );
    let again = guard.reconcile_stale(Duration::ZERO, 10).await.unwrap();
    assert_eq!(
        again.found, 1,
        "the failure that landed meanwhile stays listed"
    );
}

/// A reconciler whose provider API is down.
#[derive(Debug)]
struct ApiDown;

#[async_trait]
impl Reconciler for ApiDown {
    async fn reconcile(&self, _: &ReconcileRequest) -> Result<(), BoxError> {
        Err("provider API down".into())
    }
}

/// A guard on `store` (inbox `ledger`) whose ordering store can go down and whose
/// reconciler always fails.
fn ledger_guard(store: &MemoryStore, clock: &ManualClock) -> (WebhookGuard, Arc<OrderingDown>) {
    let ordering = Arc::new(OrderingDown::new(store, false));
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .ordering(ordering.clone())
        .reconciler(ApiDown)
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .namespace("ledger")
        .clock(clock.clone())
        .build()
        .unwrap();
    (guard, ordering)
}

/// How many failed objects `reconcile_stale` finds, once it finds any (it waits up
/// to about 2 s for a background mark, moving the clock on each time).
async fn listed_eventually(guard: &WebhookGuard, clock: &ManualClock) -> usize {
    for _ in 0..200 {
        clock.advance(TimeDelta::minutes(10));
        let found = guard
            .reconcile_stale(Duration::from_secs(60), 10)
            .await
            .unwrap()
            .found;
        if found > 0 {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    0
}

/// A failure whose object the ordering store could not mark failed at once is
/// marked in the background once the store answers: with a reconciler that fails
/// too, `reconcile_stale` then lists the object (it listed nothing before).
#[tokio::test]
async fn a_failure_reaches_the_ledger_after_an_ordering_outage() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let (guard, ordering) = ledger_guard(&store, &clock);
    let down = ordering.clone();
    let outcome = guard
        .handle(
            &[("a", "b")],
            &body("p1", "charge.succeeded", "trx-p", 5),
            |_| async move {
                // The ordering store goes down while the handler runs.
                down.down.store(true, Ordering::SeqCst);
                Err(HandlerError::permanent("refused"))
            },
        )
        .await;
    assert!(
        matches!(outcome, Outcome::PermanentFailure { .. }),
        "{outcome:?}"
    );
    ordering.down.store(false, Ordering::SeqCst);
    assert_eq!(
        listed_eventually(&guard, &clock).await,
        1,
        "the failed object is listed"
    );
}

/// The same for a dead letter: its object reaches the ledger once the ordering
/// store answers again, so `reconcile_stale` lists it although its reconcile failed.
#[tokio::test]
async fn a_dead_letter_reaches_the_ledger_after_an_ordering_outage() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let (guard, ordering) = ledger_guard(&store, &clock);
    accept(&guard, &body("d1", "charge.succeeded", "trx-d", 5)).await;
    let down = ordering.clone();
    let worker = guard
        .worker(move |_e: InboxEvent| {
            let down = down.clone();
            async move {
                down.down.store(true, Ordering::SeqCst);
                Err(HandlerError::permanent("refused"))
            }
        })
        .unwrap();
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(stored(&store, "ledger", "d1").await.state, InboxState::Dead);
    ordering.down.store(false, Ordering::SeqCst);
    assert_eq!(
        listed_eventually(&guard, &clock).await,
        1,
        "the dead letter's object is listed"
    );
}

/// An inbox whose settles always fail (renewals and the rest go through).
#[derive(Debug)]
struct SettleFails {
    inner: MemoryStore,
    settles: AtomicUsize,
    renewals: AtomicUsize,
}

#[async_trait]
impl InboxStore for SettleFails {
    async fn enqueue(
        &self,
        e: &webhook_guard::inbox::NewEvent<'_>,
    ) -> Result<webhook_guard::inbox::Enqueued, webhook_guard::StoreError> {
        self.inner.enqueue(e).await
    }
    async fn lease(
        &self,
        request: &LeaseRequest<'_>,
    ) -> Result<Vec<InboxEvent>, webhook_guard::StoreError> {
        self.inner.lease(request).await
    }
    async fn settle_event(
        &self,
        _: &webhook_guard::inbox::Settle<'_>,
    ) -> Result<webhook_guard::store::Fence, webhook_guard::StoreError> {
        self.settles.fetch_add(1, Ordering::SeqCst);
        Err(webhook_guard::StoreError::unavailable("connection refused"))
    }
    async fn renew_event(
        &self,
        renew: &webhook_guard::inbox::RenewLease<'_>,
    ) -> Result<webhook_guard::store::Fence, webhook_guard::StoreError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        self.inner.renew_event(renew).await
    }
    async fn get_event(&self, k: Key<'_>) -> Result<Option<InboxEvent>, webhook_guard::StoreError> {
        self.inner.get_event(k).await
    }
    async fn purge_settled(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64, webhook_guard::StoreError> {
        self.inner.purge_settled(now, limit).await
    }
}

/// A settle the store keeps failing while it renews the lease is tried again, the
/// lease renewed meanwhile, and given up a lease after the first failure: a
/// stopping worker does not wait for it forever, and the event stays `Running`
/// until its lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_the_store_keeps_failing_is_given_up_after_a_lease() {
    let store = Arc::new(SettleFails {
        inner: MemoryStore::new(),
        settles: AtomicUsize::new(0),
        renewals: AtomicUsize::new(0),
    });
    let meta = EventMeta::default();
    let now = Utc::now();
    let key = Key::new("settle-fails", "evt_1");
    let new = webhook_guard::inbox::NewEvent {
        key,
        fingerprint: webhook_guard::store::Fingerprint::of(b"x"),
        meta: &meta,
        payload: b"x",
        now,
        expires_at: now + TimeDelta::hours(1),
    };
    store.enqueue(&new).await.unwrap();
    let ran = Arc::new(tokio::sync::Notify::new());
    let worker = {
        let ran = ran.clone();
        Worker::new(store.clone(), "settle-fails", move |_e: InboxEvent| {
            let ran = ran.clone();
            async move {
                ran.notify_one();
                Ok(())
            }
        })
        .lease(Duration::from_millis(600))
        .poll_interval(Duration::from_millis(10))
    };
    let handle = worker.spawn();
    tokio::time::timeout(Duration::from_secs(5), ran.notified())
        .await
        .expect("the handler ran");
    tokio::time::timeout(Duration::from_secs(5), handle.shutdown())
        .await
        .expect("the worker stopped: the tries end with a lease");
    assert!(
        store.settles.load(Ordering::SeqCst) > 1,
        "the settle was tried again"
    );
    assert!(
        store.renewals.load(Ordering::SeqCst) > 0,
        "the lease was renewed meanwhile"
    );
    let event = store.get_event(key).await.unwrap().unwrap();
    assert_eq!(event.state, InboxState::Running);
}
