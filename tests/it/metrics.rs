//! The metrics hooks and the timed store, read back through `metrics-util`'s
//! debugging recorder.

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use webhook_guard::hooks::NoHooks;
use webhook_guard::metrics::{
    MeteredStore, MetricsHooks, DELIVERIES_TOTAL, HANDLER_DURATION, STORE_CALL_DURATION,
    STUCK_LEASES, SWEEPER_PURGED_TOTAL,
};
use webhook_guard::verify::HmacSha256Header;
use webhook_guard::{EventId, HandlerError, MemoryStore, WebhookGuard};

type Snapshot = Vec<(String, Vec<(String, String)>, MetricKind, DebugValue)>;

fn run() -> Snapshot {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            webhook_guard::metrics::describe();
            let verifier =
                HmacSha256Header::new("X-Signature", ["a-random-secret-of-32-characters"]).unwrap();
            let guard = WebhookGuard::builder()
                .namespace("stripe")
                .store(MeteredStore::new(MemoryStore::new()))
                .hooks(MetricsHooks::wrap(NoHooks))
                .verifier(verifier.clone())
                .event_id(EventId::json_field(["id"]))
                .build()
                .unwrap();
            let body = br#"{"id":"evt_1"}"#;
            let headers = [("X-Signature", verifier.sign(body))];
            for _ in 0..2 {
                let _ = guard.handle(&headers, body, |_| async { Ok(()) }).await;
            }
            let failing = br#"{"id":"evt_2"}"#;
            let headers2 = [("X-Signature", verifier.sign(failing))];
            let _ = guard
                .handle(&headers2, failing, |_| async {
                    Err(HandlerError::retryable("nope"))
                })
                .await;
            let _ = guard
                .handle(&[("X-Signature", "00")], body, |_| async { Ok(()) })
                .await;
            guard.sweeper().sweep().await.unwrap();
        });
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (kind, key) = key.into_parts();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.name().to_owned(), labels, kind, value)
        })
        .collect()
}

fn find<'a>(snapshot: &'a Snapshot, name: &str, labels: &[(&str, &str)]) -> Vec<&'a DebugValue> {
    snapshot
        .iter()
        .filter(|(n, l, _, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, _, v)| v)
        .collect()
}

fn counter(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> u64 {
    find(snapshot, name, labels)
        .into_iter()
        .map(|v| match v {
            DebugValue::Counter(n) => *n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

#[test]
fn outcomes_handlers_store_calls_and_sweeps_are_measured() {
    let snapshot = run();
    let ns = ("namespace", "stripe");
    assert_eq!(
        counter(&snapshot, DELIVERIES_TOTAL, &[ns, ("outcome", "processed")]),
        1
    );
    assert_eq!(
        counter(&snapshot, DELIVERIES_TOTAL, &[ns, ("outcome", "duplicate")]),
        1
    );
    assert_eq!(
        counter(
            &snapshot,
            DELIVERIES_TOTAL,
            &[ns, ("outcome", "retryable_failure")]
        ),
        1
    );
    assert_eq!(
        counter(&snapshot, DELIVERIES_TOTAL, &[ns, ("outcome", "rejected")]),
        1
    );

    // The handler ran twice (evt_1 once, evt_2 once).
    let handler_runs: usize = find(&snapshot, HANDLER_DURATION, &[ns])
        .into_iter()
        .map(|v| match v {
            DebugValue::Histogram(samples) => samples.len(),
            other => panic!("not a histogram: {other:?}"),
        })
        .sum();
    assert_eq!(handler_runs, 2);

    // Three claims reached the store (the rejected delivery did not).
    match find(
        &snapshot,
        STORE_CALL_DURATION,
        &[("op", "claim"), ("result", "ok")],
    )[..]
    {
        [DebugValue::Histogram(samples)] => assert_eq!(samples.len(), 3),
        ref other => panic!("claim latency: {other:?}"),
    }
    assert_eq!(counter(&snapshot, SWEEPER_PURGED_TOTAL, &[]), 0);
    assert!(matches!(
        find(&snapshot, STUCK_LEASES, &[])[..],
        [DebugValue::Gauge(_)]
    ));
    // No label carries an event id.
    assert!(snapshot
        .iter()
        .all(|(_, labels, _, _)| labels.iter().all(|(_, v)| !v.starts_with("evt_"))));
}
