//! Store outages, injected with a TCP proxy between the guard and the real Redis,
//! PostgreSQL and MariaDB servers (the shared servers are never stopped).
//!
//! - `outage_*`: under a steady stream of deliveries the store is cut for a few
//!   seconds, then restored; connections are also reset once and slowed down for a
//!   while. Every delivery that begins and ends during the cut is answered 503 and
//!   runs no handler; a simulated provider that retries every non-2xx then gets every
//!   event processed exactly once, by the same guard (no restart).
//! - `cut_mid_handler_*`: the claim succeeds, the store goes away while the handler
//!   runs, completion cannot be recorded: the outcome is `Unrecorded` (200, alert
//!   hook), and the event is neither lost (the handler ran once) nor silently doubled
//!   (the completion is recorded in the background once the store is back, so a
//!   redelivery is a duplicate and nothing is left in `stuck`).

use crate::support;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{TimeDelta, TimeZone, Utc};
use support::backends::{self, host_port, Backend};
use support::proxy::FaultProxy;
use webhook_guard::clock::ManualClock;
use webhook_guard::outcome::OutcomeKind;
use webhook_guard::outcome::Unrecorded;
use webhook_guard::store::Key;
use webhook_guard::store::RecordState;
use webhook_guard::verify::HmacSha256Header;
use webhook_guard::{EventId, Hooks, Outcome, WebhookGuard};

const SECRET: &str = "fault-secret-0123456789";

#[derive(Debug, Default)]
struct Alerts {
    unrecorded: AtomicUsize,
}

impl Hooks for Alerts {
    fn on_unrecorded(&self, _key: Key<'_>, _reason: &Unrecorded) {
        self.unrecorded.fetch_add(1, Ordering::SeqCst);
    }
}

fn verifier() -> HmacSha256Header {
    HmacSha256Header::new("X-Signature", [SECRET]).unwrap()
}

fn body(i: usize) -> Vec<u8> {
    format!(r#"{{"id":"evt_{i:06}","type":"charge.succeeded","n":{i}}}"#).into_bytes()
}

const BEFORE: u8 = 0;
const CUT: u8 = 1;
const AFTER: u8 = 2;

/// Events in the outage stream: long runs with `WEBHOOK_GUARD_LONG=1`.
fn stream_len() -> usize {
    if std::env::var_os("WEBHOOK_GUARD_LONG").is_some() {
        5_000
    } else {
        600
    }
}

async fn outage(backend: Backend) {
    let Some(url) = support::server_url(backend.url_var().unwrap()) else {
        return;
    };
    let proxy = FaultProxy::start(&host_port(&url)).await;
    let (store, cleanup) = backends::store(backend, 8, Some(&proxy.addr()))
        .await
        .unwrap();
    let alerts = Arc::new(Alerts::default());
    let guard = WebhookGuard::builder()
        .store(store)
        .verifier(verifier())
        .event_id(EventId::json_field(["id"]))
        // Longer than the cut: the guarantee for a completion the store missed holds
        // when the store is back within the lease (see SECURITY.md, known limits).
        .lease(Duration::from_secs(6))
        .hooks(alerts.clone())
        .build()
        .unwrap();

    let n = stream_len();
    let signer = verifier();
    let events: Arc<Vec<(Vec<u8>, String)>> = Arc::new(
        (0..n)
            .map(|i| {
                let b = body(i);
                let s = signer.sign(&b);
                (b, s)
            })
            .collect(),
    );
    // Every event once, and 10 % of them a second time (the provider's duplicates).
    let mut order: Vec<usize> = (0..n).collect();
    order.extend((0..n).step_by(10));
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for i in (1..order.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        order.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    let deliveries_planned = order.len();
    let queue = Arc::new(Mutex::new(VecDeque::from(order)));
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..n).map(|_| AtomicU32::new(0)).collect());
    let acked: Arc<Vec<AtomicBool>> = Arc::new((0..n).map(|_| AtomicBool::new(false)).collect());
    let acked_count = Arc::new(AtomicUsize::new(0));
    let phase = Arc::new(AtomicU8::new(BEFORE));
    let kinds: Arc<Mutex<std::collections::BTreeMap<&'static str, usize>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let during_cut = Arc::new(AtomicUsize::new(0));
    let deliveries = Arc::new(AtomicUsize::new(0));

    let controller = {
        let proxy_phase = phase.clone();
        let acked_count = acked_count.clone();
        async move {
            while acked_count.load(Ordering::SeqCst) < n / 4 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            proxy_phase.store(CUT, Ordering::SeqCst);
            proxy.cut();
            tokio::time::sleep(Duration::from_secs(3)).await;
            proxy.restore();
            proxy_phase.store(AFTER, Ordering::SeqCst);
            while acked_count.load(Ordering::SeqCst) < n / 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            proxy.reset();
            proxy.delay(Duration::from_millis(20));
            tokio::time::sleep(Duration::from_millis(500)).await;
            proxy.delay(Duration::ZERO);
            (proxy.killed(), proxy)
        }
    };

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (guard, events, queue, runs, acked, acked_count, phase, kinds, violations) = (
            guard.clone(),
            events.clone(),
            queue.clone(),
            runs.clone(),
            acked.clone(),
            acked_count.clone(),
            phase.clone(),
            kinds.clone(),
            violations.clone(),
        );
        let (during_cut, deliveries) = (during_cut.clone(), deliveries.clone());
        tasks.spawn(async move {
            loop {
                let next = queue.lock().unwrap().pop_front();
                let Some(i) = next else {
                    if acked_count.load(Ordering::SeqCst) == n {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let (b, sig) = &events[i];
                let headers = [("X-Signature", sig.as_str())];
                let ran = AtomicBool::new(false);
                let started = phase.load(Ordering::SeqCst);
                let outcome = guard
                    .handle(&headers, b, |_| async {
                        ran.store(true, Ordering::SeqCst);
                        runs[i].fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    })
                    .await;
                let ended = phase.load(Ordering::SeqCst);
                deliveries.fetch_add(1, Ordering::SeqCst);
                let status = guard.answer(&outcome).status;
                let ran = ran.load(Ordering::SeqCst);
                if matches!(outcome, Outcome::Unrecorded { .. }) {
                    eprintln!("evt {i}: {outcome}");
                }
                *kinds
                    .lock()
                    .unwrap()
                    .entry(outcome.kind().as_str())
                    .or_default() += 1;
                if started == CUT && ended == CUT {
                    during_cut.fetch_add(1, Ordering::SeqCst);
                    if status != 503 || ran {
                        violations.lock().unwrap().push(format!(
                            "during the cut evt {i}: {outcome} ({status}), handler ran: {ran}"
                        ));
                    }
                }
                if matches!(outcome, Outcome::StoreUnavailable { .. }) && ran {
                    violations
                        .lock()
                        .unwrap()
                        .push(format!("evt {i}: 503 but the handler ran"));
                }
                if !matches!(
                    outcome.kind(),
                    OutcomeKind::Processed
                        | OutcomeKind::Duplicate
                        | OutcomeKind::InProgress
                        | OutcomeKind::StoreUnavailable
                        | OutcomeKind::Unrecorded
                ) {
                    violations
                        .lock()
                        .unwrap()
                        .push(format!("evt {i}: unexpected {outcome}"));
                }
                if status.is_success() {
                    if !acked[i].swap(true, Ordering::SeqCst) {
                        acked_count.fetch_add(1, Ordering::SeqCst);
                    }
                } else {
                    // The provider retries this delivery later.
                    tokio::time::sleep(Duration::from_millis(25)).await;
                    queue.lock().unwrap().push_back(i);
                }
            }
        });
    }
    let run = async {
        let controlled = controller.await;
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        controlled
    };
    let (killed, proxy) = tokio::time::timeout(Duration::from_secs(240), run)
        .await
        .expect("the stream finished (a hang is a failure)");

    let violations = violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    let during_cut = during_cut.load(Ordering::SeqCst);
    assert!(
        during_cut > 0,
        "no delivery ran during the cut: the test proved nothing"
    );
    let mut lost = 0;
    let mut twice = 0;
    let mut handler_runs = 0;
    for i in 0..n {
        let r = runs[i].load(Ordering::SeqCst);
        handler_runs += r;
        lost += usize::from(r == 0);
        twice += usize::from(r > 1);
        if r > 1 {
            eprintln!("evt {i} ran {r} times");
        }
        let rec = guard
            .inspect(&format!("evt_{i:06}"))
            .await
            .unwrap()
            .expect("a record for every event");
        // Completed, or (handler ran, completion lost in the cut) still in progress.
        assert!(
            rec.state == RecordState::Completed || rec.state == RecordState::InProgress,
            "evt {i}: {:?}",
            rec.state
        );
    }
    let kinds = kinds.lock().unwrap().clone();
    let unrecorded = alerts.unrecorded.load(Ordering::SeqCst);
    println!(
        "RESULT backend={} scenario=outage deliveries={} planned={} duplicates={} faults=cut3s+reset+delay20ms connections_reset={} handler_runs={} lost={} twice={} during_cut_503={} unrecorded_alerts={} outcomes={:?}",
        backend.name(),
        deliveries.load(Ordering::SeqCst),
        deliveries_planned,
        deliveries_planned - n,
        killed,
        handler_runs,
        lost,
        twice,
        during_cut,
        unrecorded,
        kinds
    );
    assert_eq!(lost, 0, "events never processed");
    assert_eq!(twice, 0, "events processed twice");
    assert_eq!(kinds.get("unrecorded").copied().unwrap_or(0), unrecorded);
    drop(proxy);
    cleanup.run().await;
}

backends::per_backend!(outage:
    outage_postgres => Postgres,
    outage_mariadb => MySql,
    outage_redis => Redis,
);

#[cfg(feature = "dynamodb")]
backends::per_backend!(outage:
    outage_dynamodb => DynamoDb,
);

async fn cut_mid_handler(backend: Backend) {
    let Some(url) = support::server_url(backend.url_var().unwrap()) else {
        return;
    };
    let proxy = FaultProxy::start(&host_port(&url)).await;
    let (store, cleanup) = backends::store(backend, 2, Some(&proxy.addr()))
        .await
        .unwrap();
    let clock = ManualClock::new(Utc.timestamp_opt(1_700_000_000, 0).unwrap());
    let alerts = Arc::new(Alerts::default());
    let guard = WebhookGuard::builder()
        .store(store)
        .verifier(verifier())
        .event_id(EventId::json_field(["id"]))
        .clock(clock.clone())
        .lease(Duration::from_secs(60))
        .hooks(alerts.clone())
        .build()
        .unwrap();
    let b = Bytes::from(body(1));
    let sig = verifier().sign(&b);
    let runs = Arc::new(AtomicU32::new(0));
    let (running_tx, running_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let delivery = {
        let (guard, b, sig, runs) = (guard.clone(), b.clone(), sig.clone(), runs.clone());
        tokio::spawn(async move {
            let headers = [("X-Signature", sig.as_str())];
            let outcome = guard
                .handle_owned(&headers, b, move |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    running_tx.send(()).unwrap();
                    go_rx.await.unwrap();
                    Ok(())
                })
                .await;
            let answer = guard.answer(&outcome);
            (outcome, answer)
        })
    };
    running_rx
        .await
        .expect("the handler started: the claim succeeded");
    proxy.cut();
    go_tx.send(()).unwrap();
    let (outcome, answer) = delivery.await.unwrap();
    println!(
        "{}: mid-handler cut answered {outcome} ({})",
        backend.name(),
        answer.status
    );
    assert!(
        matches!(
            outcome,
            Outcome::Unrecorded {
                reason: Unrecorded::Store(_),
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(
        answer.status, 200,
        "the work is done: the provider must not retry"
    );
    assert_eq!(
        alerts.unrecorded.load(Ordering::SeqCst),
        1,
        "the alert hook ran"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The store comes back: the guard records the completion it could not record
    // (fenced by the claim's token) without waiting for a redelivery...
    proxy.restore();
    let recorded = async {
        loop {
            if let Ok(Some(rec)) = guard.inspect("evt_000001").await {
                if rec.state == RecordState::Completed {
                    return rec;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let rec = tokio::time::timeout(Duration::from_secs(60), recorded)
        .await
        .expect("the completion was recorded once the store came back");
    assert_eq!(rec.attempts, 1);
    // ...so a redelivery (a provider that retried anyway, a manual resend), even
    // after the lease, is a duplicate: the handler does not run twice.
    clock.advance(TimeDelta::seconds(61));
    let headers = [("X-Signature", sig.as_str())];
    let again = guard
        .handle(&headers, &b, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .await;
    assert_eq!(again.kind(), OutcomeKind::Duplicate, "{again}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not doubled");
    assert!(guard.stuck(10).await.unwrap().is_empty());
    println!(
        "RESULT backend={} scenario=cut_mid_handler deliveries=2 duplicates=1 faults=cut_during_handler handler_runs={} lost=0 twice=0 outcome=unrecorded/200 alerts={}",
        backend.name(),
        runs.load(Ordering::SeqCst),
        alerts.unrecorded.load(Ordering::SeqCst)
    );
    drop(proxy);
    cleanup.run().await;
}

backends::per_backend!(cut_mid_handler:
    cut_mid_handler_postgres => Postgres,
    cut_mid_handler_mariadb => MySql,
    cut_mid_handler_redis => Redis,
);

#[cfg(feature = "dynamodb")]
backends::per_backend!(cut_mid_handler:
    cut_mid_handler_dynamodb => DynamoDb,
);
