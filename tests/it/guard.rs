//! The delivery flow on the memory store: every outcome, concurrency, leases,
//! escalation, panics, retention.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use webhook_guard::clock::ManualClock;
use webhook_guard::guard::{Begin, InProgressAnswer};
use webhook_guard::hooks::Escalation;
use webhook_guard::meta::{EventMeta, MetaExtractor};
use webhook_guard::outcome::{OutcomeKind, Rejection};
use webhook_guard::store::{
    Claim, ClaimRequest, Deleted, Fence, Finish, Holder, Key, Renew, StoreError,
};
use webhook_guard::store::{Record, RecordState};
use webhook_guard::verify::{HmacSha256Header, NoVerification};
use webhook_guard::{
    ConfigError, EventId, HandlerError, Hooks, MemoryStore, Outcome, ProcessedStore, WebhookGuard,
};

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

/// Records every hook call, for assertions.
#[derive(Debug, Default)]
struct Recorder {
    escalations: Mutex<Vec<(String, u32, Vec<String>)>>,
    conflicts: AtomicUsize,
    permanent: AtomicUsize,
    unrecorded: AtomicUsize,
    duplicates: AtomicUsize,
    failures: AtomicUsize,
    claims: AtomicUsize,
    processed: AtomicUsize,
}

impl Hooks for Recorder {
    fn on_claim(&self, _: Key<'_>, _: u32) {
        self.claims.fetch_add(1, Ordering::SeqCst);
    }
    fn on_duplicate(&self, _: &Record) {
        self.duplicates.fetch_add(1, Ordering::SeqCst);
    }
    fn on_conflict(&self, _: Key<'_>) {
        self.conflicts.fetch_add(1, Ordering::SeqCst);
    }
    fn on_failure(&self, _: Key<'_>, _: u32, _: &str) {
        self.failures.fetch_add(1, Ordering::SeqCst);
    }
    fn on_escalation(&self, e: &Escalation<'_>) {
        let errors = e.history.iter().map(|n| n.error.clone()).collect();
        self.escalations
            .lock()
            .unwrap()
            .push((e.key.id.to_owned(), e.failures, errors));
    }
    fn on_permanent_failure(&self, _: Key<'_>, _: &str) {
        self.permanent.fetch_add(1, Ordering::SeqCst);
    }
    fn on_unrecorded(&self, _: Key<'_>, _: &webhook_guard::outcome::Unrecorded) {
        self.unrecorded.fetch_add(1, Ordering::SeqCst);
    }
    fn on_outcome(&self, report: &webhook_guard::hooks::DeliveryReport<'_>) {
        if report.outcome.kind() == OutcomeKind::Processed {
            self.processed.fetch_add(1, Ordering::SeqCst);
        }
    }
}

struct Setup {
    guard: WebhookGuard,
    clock: ManualClock,
    hooks: Arc<Recorder>,
}

fn setup() -> Setup {
    let clock = ManualClock::new(start());
    let hooks = Arc::new(Recorder::default());
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .clock(clock.clone())
        .hooks(hooks.clone())
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    Setup {
        guard,
        clock,
        hooks,
    }
}

/// Asserts that `outcome` is the first retryable failure of its id, with an error
/// that mentions `needle`.
fn assert_first_retryable_failure(outcome: &Outcome, needle: &str) {
    let Outcome::RetryableFailure {
        error, failures, ..
    } = outcome
    else {
        panic!("expected RetryableFailure, got {outcome:?}");
    };
    assert_eq!(*failures, 1);
    assert!(error.contains(needle), "{error}");
}

async fn ok_run(guard: &WebhookGuard, id: &str, body: &[u8]) -> Outcome {
    guard
        .handle(&[("x-id", id)], body, |_| async { Ok(()) })
        .await
}

async fn failing_run(guard: &WebhookGuard, id: &str) -> Outcome {
    guard
        .handle(&[("x-id", id)], b"{}", |_| async {
            Err(HandlerError::retryable("downstream timeout"))
        })
        .await
}

#[tokio::test]
async fn first_delivery_is_processed_and_a_retry_is_a_duplicate() {
    let s = setup();
    let ran = AtomicUsize::new(0);
    for _ in 0..3 {
        let outcome = s
            .guard
            .handle(&[("x-id", "evt_1")], b"{}", |event| {
                assert_eq!(event.id(), "evt_1");
                assert_eq!(event.body(), b"{}");
                ran.fetch_add(1, Ordering::SeqCst);
                async { Ok(()) }
            })
            .await;
        assert!(matches!(
            outcome,
            Outcome::Processed { .. }
                | Outcome::Duplicate {
                    state: RecordState::Completed,
                    ..
                }
        ));
        assert_eq!(s.guard.answer(&outcome).status, 200);
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(s.hooks.duplicates.load(Ordering::SeqCst), 2);
    let record = s.guard.inspect("evt_1").await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.attempts, 1);
}

/// A guard whose metadata extractor counts its calls (and panics on the calls whose
/// numbers `panic_on` holds), with an ordering store, which reads the metadata.
fn counting_meta_guard(panic_on: &'static [usize]) -> (WebhookGuard, Arc<AtomicUsize>) {
    let (builder, reads) = counting_meta_builder(panic_on);
    let guard = builder.ordering(MemoryStore::new()).build().unwrap();
    (guard, reads)
}

/// The builder of [`counting_meta_guard`], without an ordering store.
fn counting_meta_builder(
    panic_on: &'static [usize],
) -> (webhook_guard::WebhookGuardBuilder, Arc<AtomicUsize>) {
    let reads = Arc::new(AtomicUsize::new(0));
    let counter = reads.clone();
    let builder = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .event_meta(MetaExtractor::custom(move |_| {
            let call = counter.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(
                !panic_on.contains(&call),
                "metadata extractor call {call} fails"
            );
            EventMeta::default()
        }));
    (builder, reads)
}

/// Only ordering and reconciliation read the metadata of a claimed delivery: a
/// guard with neither processes without scanning the body for it (so an extractor
/// that would panic fails nothing), one with a reconciler reads it, and `verify`
/// answers it whatever the guard has.
#[tokio::test]
async fn a_claimed_delivery_reads_the_metadata_only_for_ordering_or_reconciliation() {
    let (builder, reads) = counting_meta_builder(&[1, 2]);
    let guard = builder.build().unwrap();
    for id in ["evt_1", "evt_2"] {
        let outcome = ok_run(&guard, id, b"{}").await;
        assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    }
    assert_eq!(reads.load(Ordering::SeqCst), 0, "nothing would use it");
    let verify = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        guard.verify(&[("x-id", "evt_3")], b"{}")
    }));
    assert!(
        verify.is_err(),
        "`verify` calls the extractor, which panics"
    );
    assert_eq!(reads.load(Ordering::SeqCst), 1);

    let (builder, reads) = counting_meta_builder(&[]);
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let guard = builder.reconciler(Reasons(tx)).build().unwrap();
    let outcome = ok_run(&guard, "evt_1", b"{}").await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(reads.load(Ordering::SeqCst), 1, "a reconciler may need it");
}

/// The metadata (type, created_at, object) is read from the body only by a delivery
/// that claimed its id: a duplicate, a conflict and a delivery whose id is in
/// progress elsewhere answer without scanning the body for it.
#[tokio::test]
async fn only_a_delivery_that_claims_its_id_reads_the_metadata() {
    let (guard, reads) = counting_meta_guard(&[]);
    let reads = || reads.load(Ordering::SeqCst);

    let outcome = ok_run(&guard, "evt_1", b"{}").await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(reads(), 1, "the first delivery reads it");
    let outcome = ok_run(&guard, "evt_1", b"{}").await;
    assert!(matches!(outcome, Outcome::Duplicate { .. }), "{outcome:?}");
    assert_eq!(reads(), 1, "a duplicate does not");
    let outcome = ok_run(&guard, "evt_1", br#"{"other":1}"#).await;
    assert!(matches!(outcome, Outcome::Conflict { .. }), "{outcome:?}");
    assert_eq!(reads(), 1, "a conflict does not");

    let Begin::Claimed(held) = guard.begin(&[("x-id", "evt_2")], b"{}").await else {
        panic!("first delivery must win the claim");
    };
    assert_eq!(reads(), 2, "a claim by `begin` reads it");
    let outcome = ok_run(&guard, "evt_2", b"{}").await;
    assert!(matches!(outcome, Outcome::InProgress { .. }), "{outcome:?}");
    assert_eq!(reads(), 2, "a delivery in progress elsewhere does not");
    assert!(matches!(held.complete().await, Outcome::Processed { .. }));

    // `verify` answers the metadata itself.
    guard.verify(&[("x-id", "evt_3")], b"{}").unwrap();
    assert_eq!(reads(), 3);
}

/// A metadata extractor that panics fails the delivery as a panicking handler does:
/// the handler does not run, the claim is released as a retryable failure (not left
/// to run out its lease) and the next delivery of the id is claimed at once.
#[tokio::test]
async fn a_panicking_metadata_extractor_releases_the_claim() {
    let (guard, reads) = counting_meta_guard(&[1]);
    let ran = AtomicUsize::new(0);
    let outcome = guard
        .handle(&[("x-id", "evt_meta")], b"{}", |_| {
            ran.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }
        })
        .await;
    assert_first_retryable_failure(&outcome, "metadata extractor call 1 fails");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler must not run");
    let record = guard.inspect("evt_meta").await.unwrap().unwrap();
    assert_eq!((record.state, record.failures), (RecordState::Failed, 1));

    let outcome = ok_run(&guard, "evt_meta", b"{}").await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(reads.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_deliveries_over_ten_ids_run_ten_handlers() {
    let s = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let guard = s.guard.clone();
        let runs = runs.clone();
        tasks.spawn(async move {
            let id = format!("evt_{}", i % 10);
            let outcome = guard
                .handle(&[("x-id", id.as_str())], b"same body", |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    Ok(())
                })
                .await;
            outcome.kind()
        });
    }
    let mut kinds = Vec::new();
    while let Some(kind) = tasks.join_next().await {
        kinds.push(kind.unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 10, "one handler run per id");
    let processed = kinds
        .iter()
        .filter(|k| **k == OutcomeKind::Processed)
        .count();
    assert_eq!(processed, 10);
    assert!(kinds.iter().all(|k| matches!(
        k,
        OutcomeKind::Processed | OutcomeKind::Duplicate | OutcomeKind::InProgress
    )));
}

#[tokio::test]
async fn an_in_flight_duplicate_is_in_progress_with_retry_after() {
    let s = setup();
    let headers = [("x-id", "evt_slow")];
    let Begin::Claimed(claim) = s.guard.begin(&headers, b"{}").await else {
        panic!("first delivery must win the claim");
    };
    s.clock.advance(TimeDelta::seconds(20));
    let second = ok_run(&s.guard, "evt_slow", b"{}").await;
    let Outcome::InProgress { retry_after, .. } = &second else {
        panic!("expected InProgress, got {second:?}");
    };
    assert_eq!(*retry_after, Duration::from_secs(40));
    let answer = s.guard.answer(&second);
    assert_eq!(answer.status, 409);
    assert_eq!(answer.retry_after, Some(40));
    assert!(matches!(claim.complete().await, Outcome::Processed { .. }));

    let accepting = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .in_progress_answer(InProgressAnswer::Accept)
        .build()
        .unwrap();
    let Begin::Claimed(held) = accepting.begin(&headers, b"{}").await else {
        panic!("first delivery must win the claim");
    };
    let second = ok_run(&accepting, "evt_slow", b"{}").await;
    let answer = accepting.answer(&second);
    assert_eq!((answer.status.as_u16(), answer.retry_after), (200, None));
    drop(held.complete().await);
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_and_the_old_holder_is_fenced() {
    let s = setup();
    let headers = [("x-id", "evt_hung")];
    let Begin::Claimed(hung) = s.guard.begin(&headers, b"{}").await else {
        panic!("first delivery must win the claim");
    };
    s.clock.advance(TimeDelta::seconds(61));
    let Begin::Claimed(second) = s.guard.begin(&headers, b"{}").await else {
        panic!("an expired lease must be taken over");
    };
    assert_eq!(second.event().attempt(), 2);
    let late = hung.complete().await;
    assert!(
        matches!(late, Outcome::Unrecorded { .. }),
        "a stale token is refused and reported: {late:?}"
    );
    assert_eq!(s.guard.answer(&late).status, 200);
    assert_eq!(s.hooks.unrecorded.load(Ordering::SeqCst), 1);
    assert!(matches!(second.complete().await, Outcome::Processed { .. }));
    let record = s.guard.inspect("evt_hung").await.unwrap().unwrap();
    assert_eq!((record.attempts, record.failures), (2, 1));
}

#[tokio::test]
async fn a_long_handler_renews_its_lease() {
    let s = setup();
    let headers = [("x-id", "evt_long")];
    let Begin::Claimed(claim) = s.guard.begin(&headers, b"{}").await else {
        panic!("first delivery must win the claim");
    };
    s.clock.advance(TimeDelta::seconds(50));
    claim.event().renew_lease().await.unwrap();
    s.clock.advance(TimeDelta::seconds(50));
    assert!(matches!(
        ok_run(&s.guard, "evt_long", b"{}").await,
        Outcome::InProgress { .. }
    ));
    assert!(matches!(claim.complete().await, Outcome::Processed { .. }));
}

#[tokio::test]
async fn escalation_after_exactly_n_failures_calls_the_hook_once() {
    let s = setup();
    for n in 1..=4 {
        let outcome = failing_run(&s.guard, "evt_bad").await;
        assert_eq!(s.guard.answer(&outcome).status, 500);
        let Outcome::RetryableFailure { failures, .. } = outcome else {
            panic!("failure {n} must be retryable, got {outcome:?}");
        };
        assert_eq!(failures, n);
        s.clock.advance(TimeDelta::hours(1));
    }
    assert!(s.hooks.escalations.lock().unwrap().is_empty());
    let fifth = failing_run(&s.guard, "evt_bad").await;
    assert!(
        matches!(fifth, Outcome::Escalated { failures: 5, .. }),
        "{fifth:?}"
    );
    assert_eq!(s.guard.answer(&fifth).status, 200);
    for _ in 0..3 {
        let later = ok_run(&s.guard, "evt_bad", b"{}").await;
        assert!(matches!(
            later,
            Outcome::Duplicate {
                state: RecordState::Escalated,
                ..
            }
        ));
    }
    let escalations = s.hooks.escalations.lock().unwrap();
    assert_eq!(escalations.len(), 1, "the escalation hook runs once");
    let (id, failures, errors) = &escalations[0];
    assert_eq!((id.as_str(), *failures), ("evt_bad", 5));
    assert_eq!(errors.len(), 5, "the hook sees the failure history");
    assert!(errors.iter().all(|e| e == "downstream timeout"));
    assert_eq!(s.hooks.failures.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn crashed_holders_count_as_failures_and_escalate() {
    let s = setup();
    let headers = [("x-id", "evt_crash")];
    for _ in 0..5 {
        // Claim and never finish: `forget` the claim so no release happens, as if the
        // process died while holding it.
        match s.guard.begin(&headers, b"{}").await {
            Begin::Claimed(c) => std::mem::forget(c),
            Begin::Done(o) => panic!("expected a claim, got {o:?}"),
        }
        s.clock.advance(TimeDelta::seconds(61));
    }
    // The sixth claim finds five expired leases: it escalates without running.
    let outcome = s
        .guard
        .handle(&headers, b"{}", |_| async { panic!("must not run") })
        .await;
    assert!(
        matches!(outcome, Outcome::Escalated { failures: 5, .. }),
        "{outcome:?}"
    );
    assert_eq!(s.hooks.escalations.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_panicking_handler_releases_its_claim() {
    let s = setup();
    let outcome = s
        .guard
        .handle(&[("x-id", "evt_panic")], b"{}", |_| async {
            panic!("boom");
        })
        .await;
    assert_first_retryable_failure(&outcome, "boom");
    assert_eq!(s.guard.answer(&outcome).status, 500);
    // No lease expiry needed: the claim was released.
    assert!(matches!(
        ok_run(&s.guard, "evt_panic", b"{}").await,
        Outcome::Processed { .. }
    ));
}

#[tokio::test]
async fn a_handler_that_panics_before_returning_its_future_releases_its_claim() {
    let s = setup();
    let outcome = s
        .guard
        .handle(
            &[("x-id", "evt_early")],
            b"{}",
            |_| -> std::future::Ready<Result<(), HandlerError>> { panic!("no future yet") },
        )
        .await;
    assert_first_retryable_failure(&outcome, "no future yet");
    assert!(matches!(
        ok_run(&s.guard, "evt_early", b"{}").await,
        Outcome::Processed { .. }
    ));
}

#[tokio::test]
async fn a_dropped_claim_is_released_in_the_background() {
    let s = setup();
    let headers = [("x-id", "evt_drop")];
    let Begin::Claimed(claim) = s.guard.begin(&headers, b"{}").await else {
        panic!("first delivery must win the claim");
    };
    drop(claim);
    for _ in 0..100 {
        let state = s.guard.inspect("evt_drop").await.unwrap().unwrap().state;
        if state == RecordState::Failed {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(matches!(
        ok_run(&s.guard, "evt_drop", b"{}").await,
        Outcome::Processed { .. }
    ));
}

#[tokio::test]
async fn a_permanent_failure_is_answered_200_with_an_alert() {
    let s = setup();
    let outcome = s
        .guard
        .handle(&[("x-id", "evt_perm")], b"{}", |_| async {
            Err(HandlerError::permanent("unknown customer"))
        })
        .await;
    assert!(matches!(outcome, Outcome::PermanentFailure { .. }));
    assert_eq!(s.guard.answer(&outcome).status, 200);
    assert_eq!(s.hooks.permanent.load(Ordering::SeqCst), 1);
    assert!(matches!(
        ok_run(&s.guard, "evt_perm", b"{}").await,
        Outcome::Duplicate {
            state: RecordState::PermanentFailure,
            ..
        }
    ));
}

#[tokio::test]
async fn question_mark_errors_are_retryable() {
    let s = setup();
    let outcome = s
        .guard
        .handle(&[("x-id", "evt_q")], b"not json", |event| async move {
            let _: serde_json::Value = event.json()?;
            Ok(())
        })
        .await;
    assert!(
        matches!(outcome, Outcome::RetryableFailure { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn the_same_id_with_another_body_is_a_conflict() {
    let s = setup();
    assert!(matches!(
        ok_run(&s.guard, "evt_c", b"one").await,
        Outcome::Processed { .. }
    ));
    let outcome = ok_run(&s.guard, "evt_c", b"two").await;
    assert!(matches!(outcome, Outcome::Conflict { .. }));
    assert_eq!(s.guard.answer(&outcome).status, 422);
    assert_eq!(s.hooks.conflicts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn bad_input_is_rejected_and_nothing_is_stored() {
    let store = MemoryStore::new();
    let verifier = HmacSha256Header::new("x-sig", ["a-random-secret-of-32-characters"]).unwrap();
    let body = br#"{"id":"evt_sig"}"#;
    let good = verifier.sign(body);
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(verifier)
        .event_id(EventId::json_field(["id"]))
        .max_body(64)
        .build()
        .unwrap();
    type Case<'a> = (Vec<(&'a str, String)>, Vec<u8>, &'a str, u16);
    let cases: Vec<Case<'_>> = vec![
        (vec![], body.to_vec(), "missing_header", 401),
        (
            vec![("x-sig", "00".repeat(32))],
            body.to_vec(),
            "signature_mismatch",
            401,
        ),
        (
            vec![("x-sig", good.clone())],
            br#"{"id":"evt_sig"} "#.to_vec(),
            "signature_mismatch",
            401,
        ),
        (
            vec![("x-sig", good.clone())],
            vec![b' '; 65],
            "body_too_large",
            413,
        ),
    ];
    for (headers, body, code, status) in cases {
        let outcome = guard
            .handle(&headers, &body, |_| async { panic!("must not run") })
            .await;
        let Outcome::Rejected(r) = &outcome else {
            panic!("expected Rejected, got {outcome:?}");
        };
        assert_eq!(r.code(), code);
        let answer = guard.answer(&outcome);
        assert_eq!((answer.status.as_u16(), answer.reason), (status, code));
    }
    // Verified but with no id where the guard looks, or an unusable id.
    let no_id = br#"{"type":"x"}"#;
    let signer = HmacSha256Header::new("x-sig", ["a-random-secret-of-32-characters"]).unwrap();
    let sig = signer.sign(no_id);
    let outcome = guard
        .handle(&[("x-sig", sig.as_str())], no_id, |_| async { Ok(()) })
        .await;
    assert!(matches!(
        outcome,
        Outcome::Rejected(Rejection::MissingId(_))
    ));
    for bad in [
        r#"{"id":"a\nb"}"#.to_owned(),
        format!(r#"{{"id":"{}"}}"#, "x".repeat(40)),
    ] {
        let guard = WebhookGuard::builder()
            .store(store.clone())
            .verifier(NoVerification)
            .event_id(EventId::json_field(["id"]))
            .build()
            .unwrap();
        let long_guard_body = bad.replace(&"x".repeat(40), &"x".repeat(300));
        let outcome = guard
            .handle(&[("a", "b")], long_guard_body.as_bytes(), |_| async {
                Ok(())
            })
            .await;
        assert!(
            matches!(outcome, Outcome::Rejected(Rejection::InvalidId(_))),
            "{outcome:?}"
        );
    }
    assert!(store.is_empty(), "a rejected delivery stores nothing");
    // And the genuine delivery passes.
    let outcome = guard
        .handle(&[("X-Sig", good.as_str())], body, |_| async { Ok(()) })
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }));
}

/// A store that fails like an unreachable server while `down` is set.
#[derive(Debug, Default)]
struct Flaky {
    inner: MemoryStore,
    down: std::sync::atomic::AtomicBool,
    finish_down: std::sync::atomic::AtomicBool,
    /// While set, a claim is made, then its answer waits (as when the server
    /// applied it and the reply is slow).
    claim_stall: std::sync::atomic::AtomicBool,
    /// While not 0, a claim is made this many milliseconds after it is sent,
    /// whatever becomes of its caller meanwhile (as a statement the server applies
    /// late, behind a lock).
    claim_late_ms: std::sync::atomic::AtomicU64,
    /// With `claim_late_ms`: the claim is answered `Unavailable` at once (a timeout),
    /// and still made later.
    claim_answer_lost: std::sync::atomic::AtomicBool,
    /// With `claim_answer_lost`: the answer is a `Backend` error instead (a reply
    /// the driver could not read).
    claim_answer_backend: std::sync::atomic::AtomicBool,
    /// While set, a finish waits before it is made.
    finish_stall: std::sync::atomic::AtomicBool,
    /// While set, a finish is made, then its answer waits.
    answer_stall: std::sync::atomic::AtomicBool,
    /// What the next finish answers once made: 0 its own answer, 1 `Unavailable`
    /// (the reply lost), 2 `LeaseLost` (the request sent again met its own change).
    finish_reply: std::sync::atomic::AtomicU8,
    /// While set, a claim is made and answered `Existing` with the record it made
    /// (a round trip sent again after its first run was applied).
    claim_met_again: std::sync::atomic::AtomicBool,
    /// While set, the id is first claimed a second earlier with the same token (a
    /// forked process going on with its parent's token sequence), then claimed.
    claim_twin: std::sync::atomic::AtomicBool,
    /// While set, reading a record fails.
    get_down: std::sync::atomic::AtomicBool,
    /// While set, a purge fails.
    purge_down: std::sync::atomic::AtomicBool,
    /// While set, listing stuck claims fails.
    stuck_down: std::sync::atomic::AtomicBool,
}

/// Waits while `flag` is set.
async fn stall(flag: &std::sync::atomic::AtomicBool) {
    while flag.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

impl Flaky {
    fn check(&self, flag: &std::sync::atomic::AtomicBool) -> Result<(), StoreError> {
        if flag.load(Ordering::SeqCst) {
            Err(StoreError::unavailable(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused",
            )))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl ProcessedStore for Flaky {
    async fn claim(&self, r: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.check(&self.down)?;
        if self.claim_twin.load(Ordering::SeqCst) {
            let second = TimeDelta::seconds(1);
            let twin = ClaimRequest {
                now: r.now - second,
                lease_until: r.lease_until - second,
                ..*r
            };
            self.inner.claim(&twin).await?;
        }
        let late = self.claim_late_ms.load(Ordering::SeqCst);
        if late > 0 {
            let (store, namespace, id, r) = (
                self.inner.clone(),
                r.key.namespace.to_owned(),
                r.key.id.to_owned(),
                *r,
            );
            let (fingerprint, token, now) = (r.fingerprint, r.token, r.now);
            let (lease_until, expires_at) = (r.lease_until, r.expires_at);
            let landed = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(late)).await;
                let request = ClaimRequest {
                    key: Key::new(&namespace, &id),
                    fingerprint,
                    token,
                    now,
                    lease_until,
                    expires_at,
                };
                store.claim(&request).await
            });
            if self.claim_answer_lost.load(Ordering::SeqCst) {
                if self.claim_answer_backend.load(Ordering::SeqCst) {
                    return Err(StoreError::backend(std::io::Error::other("bad reply")));
                }
                return Err(StoreError::unavailable("timed out waiting for the answer"));
            }
            return landed.await.expect("the late claim ran");
        }
        let claim = self.inner.claim(r).await;
        stall(&self.claim_stall).await;
        match claim {
            Ok(Claim::Acquired(own)) if self.claim_met_again.load(Ordering::SeqCst) => {
                Ok(Claim::Existing(own))
            }
            claim => claim,
        }
    }
    async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError> {
        self.check(&self.down)?;
        self.check(&self.finish_down)?;
        stall(&self.finish_stall).await;
        let fence = self.inner.finish(holder, finish).await;
        stall(&self.answer_stall).await;
        match self.finish_reply.swap(0, Ordering::SeqCst) {
            1 => Err(StoreError::unavailable("the reply was lost")),
            2 => Ok(Fence::LeaseLost),
            _ => fence,
        }
    }
    async fn renew(&self, holder: Holder<'_>, renew: &Renew) -> Result<Fence, StoreError> {
        self.check(&self.down)?;
        self.inner.renew(holder, renew).await
    }
    async fn get(&self, k: Key<'_>) -> Result<Option<Record>, StoreError> {
        self.check(&self.down)?;
        self.check(&self.get_down)?;
        self.inner.get(k).await
    }
    async fn delete(&self, k: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        self.check(&self.down)?;
        self.inner.delete(k, now).await
    }
    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        self.check(&self.down)?;
        self.check(&self.purge_down)?;
        self.inner.purge_expired(now, limit).await
    }
    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.check(&self.down)?;
        self.check(&self.stuck_down)?;
        self.inner.stuck(now, limit).await
    }
}

#[tokio::test]
async fn a_store_outage_answers_503_runs_nothing_and_loses_nothing() {
    let store = Arc::new(Flaky::default());
    let hooks = Arc::new(Recorder::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .hooks(hooks.clone())
        .build()
        .unwrap();
    store.down.store(true, Ordering::SeqCst);
    let outcome = guard
        .handle(&[("x-id", "evt_out")], b"{}", |_| async {
            panic!("must not run")
        })
        .await;
    let Outcome::StoreUnavailable { error, .. } = &outcome else {
        panic!("expected StoreUnavailable, got {outcome:?}");
    };
    assert!(error.is_unavailable());
    assert!(
        std::error::Error::source(error).is_some(),
        "the driver's error is kept"
    );
    let answer = guard.answer(&outcome);
    assert_eq!((answer.status.as_u16(), answer.retry_after), (503, Some(5)));
    // Overridden to a success, the answer asks for no retry.
    let relaxed = WebhookGuard::builder()
        .store(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .status(OutcomeKind::StoreUnavailable, http::StatusCode::OK)
        .build()
        .unwrap();
    let answer = relaxed.answer(&outcome);
    assert_eq!((answer.status.as_u16(), answer.retry_after), (200, None));
    store.down.store(false, Ordering::SeqCst);
    assert!(matches!(
        ok_run(&guard, "evt_out", b"{}").await,
        Outcome::Processed { .. }
    ));

    // The store fails between claim and completion: reported, answered 200 so the
    // sender does not redeliver work that is done.
    store.finish_down.store(true, Ordering::SeqCst);
    let outcome = ok_run(&guard, "evt_mid", b"{}").await;
    assert!(matches!(outcome, Outcome::Unrecorded { .. }), "{outcome:?}");
    assert_eq!(guard.answer(&outcome).status, 200);
    assert_eq!(hooks.unrecorded.load(Ordering::SeqCst), 1);
    store.finish_down.store(false, Ordering::SeqCst);
    let stuck = guard.stuck(10).await.unwrap();
    assert!(stuck.is_empty(), "the lease is still live");
}

/// A guard on a `Flaky` store, with the id in `x-id`.
fn flaky_guard(store: &Arc<Flaky>) -> WebhookGuard {
    WebhookGuard::builder()
        .store(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .build()
        .unwrap()
}

/// Waits (up to 5 s) until the record of `id` is in `state`; the record.
async fn record_in_state(guard: &WebhookGuard, id: &str, state: RecordState) -> Record {
    for _ in 0..500 {
        if let Some(r) = guard.inspect(id).await.unwrap() {
            if r.state == state {
                return r;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{id} never reached {state:?}: {:?}",
        guard.inspect(id).await
    );
}

#[tokio::test]
async fn a_delivery_dropped_while_recording_its_success_is_recorded_in_the_background() {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    let runs = Arc::new(AtomicUsize::new(0));
    let run = || {
        let runs = runs.clone();
        guard.handle(&[("x-id", "evt_cut")], b"{}", move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    };
    // The handler succeeds; the sender hangs up while the store records it.
    store.finish_stall.store(true, Ordering::SeqCst);
    let cut = tokio::time::timeout(Duration::from_millis(50), run()).await;
    assert!(
        cut.is_err(),
        "the delivery must still be recording: {cut:?}"
    );
    store.finish_stall.store(false, Ordering::SeqCst);
    record_in_state(&guard, "evt_cut", RecordState::Completed).await;
    // A redelivery is a duplicate: the handler ran once.
    assert!(matches!(run().await, Outcome::Duplicate { .. }));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_delivery_dropped_while_recording_its_failure_is_recorded_in_the_background() {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    for (id, permanent, state) in [
        ("evt_retry", false, RecordState::Failed),
        ("evt_perm", true, RecordState::PermanentFailure),
    ] {
        let run = guard.handle(&[("x-id", id)], b"{}", move |_| async move {
            Err(match permanent {
                true => HandlerError::permanent("bad payload"),
                false => HandlerError::retryable("downstream down"),
            })
        });
        // The handler fails; the sender hangs up while the store records it.
        store.finish_stall.store(true, Ordering::SeqCst);
        let cut = tokio::time::timeout(Duration::from_millis(50), run).await;
        assert!(
            cut.is_err(),
            "the delivery must still be recording: {cut:?}"
        );
        store.finish_stall.store(false, Ordering::SeqCst);
        // Recorded at once, not left to the end of the (minutes long) lease.
        let record = record_in_state(&guard, id, state).await;
        assert_eq!(record.failures, 1);
    }
    let retried = ok_run(&guard, "evt_retry", b"{}").await;
    assert!(matches!(retried, Outcome::Processed { .. }), "{retried:?}");
}

/// The store records a permanent failure, and the sender hangs up before its
/// answer: the hooks, the object's settle and the report still happen, once.
#[tokio::test]
async fn a_failure_recorded_as_the_sender_hangs_up_still_calls_its_hooks() {
    let store = Arc::new(Flaky::default());
    let hooks = Arc::new(Recorder::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .hooks(hooks.clone())
        .build()
        .unwrap();
    store.answer_stall.store(true, Ordering::SeqCst);
    let run = guard.handle(&[("x-id", "evt_perm")], b"{}", |_| async {
        Err(HandlerError::permanent("bad payload"))
    });
    let cut = tokio::time::timeout(Duration::from_millis(50), run).await;
    assert!(cut.is_err(), "the delivery must still be waiting: {cut:?}");
    record_in_state(&guard, "evt_perm", RecordState::PermanentFailure).await;
    assert_eq!(
        hooks.permanent.load(Ordering::SeqCst),
        0,
        "not before the answer"
    );
    store.answer_stall.store(false, Ordering::SeqCst);
    for _ in 0..500 {
        if hooks.permanent.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(hooks.permanent.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_delivery_dropped_while_claiming_releases_the_claim_uncounted() {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    // The store grants the claim, and the sender hangs up before the answer.
    store.claim_stall.store(true, Ordering::SeqCst);
    let cut =
        tokio::time::timeout(Duration::from_millis(50), ok_run(&guard, "evt_gone", b"{}")).await;
    assert!(cut.is_err(), "the delivery must still be claiming: {cut:?}");
    store.claim_stall.store(false, Ordering::SeqCst);
    // Released at once (the lease is minutes long), and not counted as a failure:
    // the handler never ran.
    let released = record_in_state(&guard, "evt_gone", RecordState::Failed).await;
    assert_eq!(released.failures, 0);
    assert!(matches!(
        ok_run(&guard, "evt_gone", b"{}").await,
        Outcome::Processed { .. }
    ));
    let done = guard.inspect("evt_gone").await.unwrap().unwrap();
    assert_eq!((done.attempts, done.failures), (2, 0));
}

/// A permanent failure the store could not record is answered 200 all the same and
/// recorded in the background once the store is back (before, the record stayed
/// `InProgress`, and a redelivery after the lease ran the handler again).
#[tokio::test]
async fn a_permanent_failure_the_store_missed_is_recorded_in_the_background() {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    store.finish_down.store(true, Ordering::SeqCst);
    let outcome = guard
        .handle(&[("x-id", "evt_perm_down")], b"{}", |_| async {
            Err(HandlerError::permanent("unknown customer"))
        })
        .await;
    assert!(
        matches!(outcome, Outcome::PermanentFailure { .. }),
        "{outcome:?}"
    );
    assert_eq!(guard.answer(&outcome).status, 200);
    store.finish_down.store(false, Ordering::SeqCst);
    let record = record_in_state(&guard, "evt_perm_down", RecordState::PermanentFailure).await;
    assert_eq!(record.failures, 1);
}

/// An error whose `Display` panics (a host's bug).
#[derive(Debug)]
struct PanickyError;

impl std::fmt::Display for PanickyError {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        panic!("no text for this error")
    }
}

impl std::error::Error for PanickyError {}

/// A handler error whose `Display` panics is recorded as a failure saying so: the
/// panic does not unwind through `handle`, nor leave the claim to run out its lease.
#[tokio::test]
async fn an_error_whose_display_panics_is_recorded_as_a_failure() {
    let s = setup();
    let outcome = s
        .guard
        .handle(&[("x-id", "evt_panicky")], b"{}", |_| async {
            Err(HandlerError::retryable(PanickyError))
        })
        .await;
    let Outcome::RetryableFailure {
        failures, error, ..
    } = &outcome
    else {
        panic!("{outcome:?}");
    };
    assert_eq!(*failures, 1);
    assert!(error.contains("Display panicked"), "{error}");
    let record = s.guard.inspect("evt_panicky").await.unwrap().unwrap();
    assert_eq!((record.state, record.failures), (RecordState::Failed, 1));
}

/// A store that answers a claim it made `Existing` with this claim's own record (a
/// driver's resend met the first run's change; the contract allows either answer)
/// has granted it: the handler runs. Before, the delivery was answered 409 and
/// the claim held its lease with a token no one had, to count a failure no
/// handler had.
#[tokio::test]
async fn a_claim_met_again_with_its_own_token_is_granted() {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    store.claim_met_again.store(true, Ordering::SeqCst);
    let outcome = ok_run(&guard, "evt_resent", b"{}").await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    let done = guard.inspect("evt_resent").await.unwrap().unwrap();
    assert_eq!(
        (done.state, done.attempts, done.failures),
        (RecordState::Completed, 1, 0)
    );
    // The same token on a claim made at another time (a forked twin's) is not this
    // claim's.
    store.claim_met_again.store(false, Ordering::SeqCst);
    store.claim_twin.store(true, Ordering::SeqCst);
    let twin = ok_run(&guard, "evt_twin", b"{}").await;
    assert!(matches!(twin, Outcome::InProgress { .. }), "{twin:?}");
    store.claim_twin.store(false, Ordering::SeqCst);
    // Someone else's live claim is still in progress.
    let Begin::Claimed(held) = guard.begin(&[("x-id", "evt_held")], b"{}").await else {
        panic!("first delivery must win the claim");
    };
    let second = ok_run(&guard, "evt_held", b"{}").await;
    assert!(matches!(second, Outcome::InProgress { .. }), "{second:?}");
    assert!(matches!(held.complete().await, Outcome::Processed { .. }));
}

/// A claim whose answer was lost is looked for, to be released, only as this
/// claim: a record with its token made at another time (a forked process going on
/// with this one's token sequence) is left alone, not released under its holder.
#[tokio::test(start_paused = true)]
async fn a_lost_claim_leaves_a_twin_claim_with_its_token_alone() {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    store.claim_twin.store(true, Ordering::SeqCst);
    store.claim_late_ms.store(10, Ordering::SeqCst);
    store.claim_answer_lost.store(true, Ordering::SeqCst);
    let outcome = ok_run(&guard, "evt_twin_lost", b"{}").await;
    assert!(
        matches!(outcome, Outcome::StoreUnavailable { .. }),
        "{outcome:?}"
    );
    store.claim_twin.store(false, Ordering::SeqCst);
    store.claim_late_ms.store(0, Ordering::SeqCst);
    store.claim_answer_lost.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(120)).await;
    let record = guard.inspect("evt_twin_lost").await.unwrap().unwrap();
    assert_eq!(
        record.state,
        RecordState::InProgress,
        "the twin's claim is left alone"
    );
}

/// The future of `complete` or `fail`, dropped before its first poll (a `select!`
/// whose other branch won), still records how the handler ended: before, the
/// claim dropped with it recorded a retryable "claim dropped unfinished" failure,
/// so a success counted as a failure and ran again, a permanent failure was retried.
#[tokio::test]
async fn an_ending_dropped_before_its_first_poll_is_recorded() {
    let s = setup();
    let claim = |id: &'static str| {
        let guard = &s.guard;
        async move {
            match guard.begin(&[("x-id", id)], b"{}").await {
                Begin::Claimed(claimed) => claimed,
                other => panic!("{id}: expected a claim, got {other:?}"),
            }
        }
    };
    drop(claim("evt_done_unpolled").await.complete());
    drop(
        claim("evt_perm_unpolled")
            .await
            .fail(HandlerError::permanent("unknown customer")),
    );
    let done = record_in_state(&s.guard, "evt_done_unpolled", RecordState::Completed).await;
    assert_eq!((done.attempts, done.failures), (1, 0));
    let perm = record_in_state(&s.guard, "evt_perm_unpolled", RecordState::PermanentFailure).await;
    assert_eq!(perm.history[0].error, "unknown customer");
    let again = ok_run(&s.guard, "evt_done_unpolled", b"{}").await;
    assert!(matches!(again, Outcome::Duplicate { .. }), "{again:?}");
}

/// A retryable failure whose release the store missed is released in the
/// background once the store is back, its failure counted once; before, the claim
/// held its lease to the end and answered the sender's early retries 409.
#[tokio::test]
async fn a_failure_the_store_missed_is_released_in_the_background() {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    store.finish_down.store(true, Ordering::SeqCst);
    let outcome = guard
        .handle(&[("x-id", "evt_fail_down")], b"{}", |_| async {
            Err(HandlerError::retryable("upstream down"))
        })
        .await;
    assert!(
        matches!(outcome, Outcome::RetryableFailure { failures: 1, .. }),
        "{outcome:?}"
    );
    store.finish_down.store(false, Ordering::SeqCst);
    let record = record_in_state(&guard, "evt_fail_down", RecordState::Failed).await;
    assert_eq!((record.attempts, record.failures), (1, 1));
    assert_eq!(record.history.len(), 1);
    assert!(matches!(
        ok_run(&guard, "evt_fail_down", b"{}").await,
        Outcome::Processed { .. }
    ));
}

/// A claim still in flight when its delivery is dropped (the store applies it
/// later) is released once it lands, not left to run out its lease.
#[tokio::test]
async fn a_claim_that_lands_after_its_delivery_was_dropped_is_released() {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    store.claim_late_ms.store(300, Ordering::SeqCst);
    let cut =
        tokio::time::timeout(Duration::from_millis(20), ok_run(&guard, "evt_late", b"{}")).await;
    assert!(cut.is_err(), "the delivery must still be claiming: {cut:?}");
    assert!(
        guard.inspect("evt_late").await.unwrap().is_none(),
        "the claim has not landed yet"
    );
    // Later claims land at once.
    store.claim_late_ms.store(0, Ordering::SeqCst);
    let released = record_in_state(&guard, "evt_late", RecordState::Failed).await;
    assert_eq!((released.attempts, released.failures), (1, 0));
    assert!(matches!(
        ok_run(&guard, "evt_late", b"{}").await,
        Outcome::Processed { .. }
    ));
}

/// A claim answered with an error (`Unavailable`: a timeout; `Backend`: a reply
/// the driver could not read) that the store still applies is released in the
/// background, not left holding its lease with a token no delivery has (its lease
/// would run out and count a failure no handler had); the provider's retry then
/// runs the handler.
#[tokio::test(start_paused = true)]
async fn a_claim_whose_answer_was_lost_is_released_when_it_lands() {
    for backend in [false, true] {
        claim_answer_lost_then_released(backend).await;
    }
}

async fn claim_answer_lost_then_released(backend: bool) {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    store.claim_late_ms.store(5_000, Ordering::SeqCst);
    store.claim_answer_lost.store(true, Ordering::SeqCst);
    store.claim_answer_backend.store(backend, Ordering::SeqCst);
    let outcome = ok_run(&guard, "evt_lost", b"{}").await;
    assert!(
        matches!(outcome, Outcome::StoreUnavailable { .. }),
        "{outcome:?}"
    );
    store.claim_late_ms.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(guard.inspect("evt_lost").await.unwrap().is_none());
    // Lands at 5 s; looked for at 1, 3, 7, 15 and 30 s.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let released = guard.inspect("evt_lost").await.unwrap().unwrap();
    assert_eq!(
        (released.state, released.failures),
        (RecordState::Failed, 0)
    );
    assert!(matches!(
        ok_run(&guard, "evt_lost", b"{}").await,
        Outcome::Processed { .. }
    ));
}

/// During an outage every claim goes unanswered, and most never reached the store:
/// the searches for them are capped (64 per guard), not one per failed delivery.
#[tokio::test(start_paused = true)]
async fn searches_for_unanswered_claims_are_capped() {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    let tasks = tokio::runtime::Handle::current().metrics();
    store.down.store(true, Ordering::SeqCst);
    for i in 0..100 {
        let outcome = ok_run(&guard, &format!("evt_down_{i}"), b"{}").await;
        assert!(matches!(outcome, Outcome::StoreUnavailable { .. }));
    }
    assert_eq!(tasks.num_alive_tasks(), 64, "one search per slot");
    // They end within 30 s, giving their slots back.
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(tasks.num_alive_tasks(), 0);
    ok_run(&guard, "evt_down_again", b"{}").await;
    assert_eq!(tasks.num_alive_tasks(), 1, "a slot is free again");
}

/// Searches for the claims of dropped deliveries share the cap: when many senders
/// hang up on a slow store, it is not polled once per dropped delivery for a whole
/// lease. Past the cap, a dropped claim is looked for only at once.
#[tokio::test(start_paused = true)]
async fn searches_for_dropped_claims_are_capped() {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    let tasks = tokio::runtime::Handle::current().metrics();
    // Each claim lands 10 minutes after it is sent (a task of the test store's).
    store.claim_late_ms.store(600_000, Ordering::SeqCst);
    for i in 0..100 {
        let id = format!("evt_hung_up_{i}");
        let cut = tokio::time::timeout(Duration::from_millis(5), ok_run(&guard, &id, b"{}")).await;
        assert!(cut.is_err(), "the delivery must still be claiming");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        tasks.num_alive_tasks(),
        100 + 64,
        "100 claims in flight, one search per slot"
    );
    // They do not take the slots of claims the store did not answer.
    store.claim_answer_lost.store(true, Ordering::SeqCst);
    let outcome = ok_run(&guard, "evt_unanswered", b"{}").await;
    assert!(matches!(outcome, Outcome::StoreUnavailable { .. }));
    assert_eq!(
        tasks.num_alive_tasks(),
        100 + 64 + 2,
        "one more claim in flight, and its search"
    );
}

/// The release looks for a late claim up to the end of its lease (5 minutes by
/// default), not only early on; and with no claim to release, it ends. Tokio's
/// clock is paused, so the minutes pass at once.
#[tokio::test(start_paused = true)]
async fn a_claim_that_lands_late_in_its_lease_is_released_and_the_search_ends() {
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    let tasks = tokio::runtime::Handle::current().metrics();
    for (id, late) in [("evt_late", 250_000), ("evt_lost", 400_000)] {
        store.claim_late_ms.store(late, Ordering::SeqCst);
        let cut = tokio::time::timeout(Duration::from_millis(20), ok_run(&guard, id, b"{}")).await;
        assert!(cut.is_err(), "the delivery must still be claiming: {cut:?}");
    }
    store.claim_late_ms.store(0, Ordering::SeqCst);
    // 250 s in, the first claim lands, and is released within a tenth of the lease.
    tokio::time::sleep(Duration::from_secs(249)).await;
    assert!(guard.inspect("evt_late").await.unwrap().is_none());
    tokio::time::sleep(Duration::from_secs(32)).await;
    let released = guard.inspect("evt_late").await.unwrap().unwrap();
    assert_eq!(
        (released.state, released.failures),
        (RecordState::Failed, 0)
    );
    // The second lands after its lease would have run out: the search for it has
    // ended by then, and only the task of that late claim remains.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(tasks.num_alive_tasks(), 1, "the searches ended");
    assert!(guard.inspect("evt_lost").await.unwrap().is_none());
}

#[tokio::test]
async fn retention_purge_follows_the_injected_clock() {
    let s = setup();
    for i in 0..50 {
        ok_run(&s.guard, &format!("evt_{i}"), b"{}").await;
    }
    let sweeper = s.guard.sweeper().batch(7);
    s.clock.advance(TimeDelta::hours(71));
    let report = sweeper.sweep().await.unwrap();
    assert_eq!(report.purged, 0, "nothing expires before 72 h");
    assert!(matches!(
        ok_run(&s.guard, "evt_3", b"{}").await,
        Outcome::Duplicate { .. }
    ));
    s.clock.advance(TimeDelta::hours(1));
    let report = sweeper.sweep().await.unwrap();
    assert_eq!(report.purged, 50);
    assert!(s.guard.inspect("evt_3").await.unwrap().is_none());
    assert!(matches!(
        ok_run(&s.guard, "evt_3", b"{}").await,
        Outcome::Processed { .. }
    ));
}

#[tokio::test]
async fn the_sweeper_reports_stuck_leases() {
    let s = setup();
    let Begin::Claimed(c) = s.guard.begin(&[("x-id", "evt_s")], b"{}").await else {
        panic!("claim expected");
    };
    std::mem::forget(c);
    s.clock.advance(TimeDelta::seconds(90));
    let report = s.guard.sweeper().sweep().await.unwrap();
    assert_eq!(report.stuck, 1);
    assert_eq!(report.oldest_stuck, Some(Duration::from_secs(30)));
    assert_eq!(s.guard.stuck(10).await.unwrap()[0].id, "evt_s");
}

#[tokio::test]
async fn a_failed_purge_still_counts_stuck_leases() {
    #[derive(Debug, Default)]
    struct Stuck(Mutex<Vec<usize>>);
    impl Hooks for Stuck {
        fn on_sweep(&self, report: &webhook_guard::hooks::SweepReport) {
            self.0.lock().unwrap().push(report.stuck);
        }
    }
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    let Begin::Claimed(c) = guard.begin(&[("x-id", "evt_p")], b"{}").await else {
        panic!("claim expected");
    };
    std::mem::forget(c);
    store.purge_down.store(true, Ordering::SeqCst);
    let hooks = Arc::new(Stuck::default());
    let clock = ManualClock::new(Utc::now() + TimeDelta::hours(1));
    let sweeper =
        webhook_guard::sweeper::Sweeper::new(store.clone(), Arc::new(clock), hooks.clone());
    let error = sweeper.sweep().await.expect_err("the purge's error");
    assert!(error.is_unavailable(), "{error}");
    assert_eq!(*hooks.0.lock().unwrap(), [1], "the stuck lease is reported");
}

/// A stuck scan that fails does not hide what the purge did: the pass is reported
/// with its purged records, marked as not having counted stuck leases.
#[tokio::test]
async fn a_failed_stuck_scan_still_reports_the_purge() {
    #[derive(Debug, Default)]
    struct Seen(Mutex<Vec<(u64, bool)>>);
    impl Hooks for Seen {
        fn on_sweep(&self, report: &webhook_guard::hooks::SweepReport) {
            self.0
                .lock()
                .unwrap()
                .push((report.purged, report.stuck_counted));
        }
    }
    let store = Arc::new(Flaky::default());
    let guard = flaky_guard(&store);
    for id in ["evt_a", "evt_b", "evt_c"] {
        assert!(matches!(
            ok_run(&guard, id, b"{}").await,
            Outcome::Processed { .. }
        ));
    }
    store.stuck_down.store(true, Ordering::SeqCst);
    let hooks = Arc::new(Seen::default());
    let clock = ManualClock::new(Utc::now() + TimeDelta::days(30));
    let sweeper =
        webhook_guard::sweeper::Sweeper::new(store.clone(), Arc::new(clock), hooks.clone());
    let error = sweeper.sweep().await.expect_err("the stuck scan's error");
    assert!(error.is_unavailable(), "{error}");
    assert_eq!(
        *hooks.0.lock().unwrap(),
        [(3, false)],
        "the purge is reported"
    );
}

#[tokio::test(start_paused = true)]
async fn the_spawned_sweeper_skips_the_first_tick_survives_errors_and_stops() {
    #[derive(Debug, Default)]
    struct Count(AtomicUsize);
    impl Hooks for Count {
        fn on_sweep(&self, _: &webhook_guard::hooks::SweepReport) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let store = Arc::new(Flaky::default());
    let count = Arc::new(Count::default());
    let sweeper = webhook_guard::sweeper::Sweeper::new(
        store.clone(),
        Arc::new(webhook_guard::clock::SystemClock),
        count.clone(),
    )
    .interval(Duration::from_secs(10));
    let handle = sweeper.spawn();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(count.0.load(Ordering::SeqCst), 0, "no sweep at start");
    store.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        0,
        "a failed sweep reports nothing"
    );
    store.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        1,
        "the sweeper went on after an error"
    );
    handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_sweep_hook_does_not_end_the_sweeper() {
    #[derive(Debug, Default)]
    struct PanicsOnce(AtomicUsize);
    impl Hooks for PanicsOnce {
        fn on_sweep(&self, _: &webhook_guard::hooks::SweepReport) {
            if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("a hook bug");
            }
        }
    }
    let hooks = Arc::new(PanicsOnce::default());
    let handle = webhook_guard::sweeper::Sweeper::new(
        Arc::new(MemoryStore::new()),
        Arc::new(webhook_guard::clock::SystemClock),
        hooks.clone(),
    )
    .interval(Duration::from_secs(10))
    .spawn();
    tokio::time::sleep(Duration::from_secs(35)).await;
    assert_eq!(
        hooks.0.load(Ordering::SeqCst),
        3,
        "the sweeps after a panicking one still run"
    );
    handle.shutdown().await;
}

#[tokio::test]
async fn a_long_handler_error_is_kept_cut() {
    let s = setup();
    let long = "é".repeat(100_000);
    let outcome = s
        .guard
        .handle(&[("x-id", "evt_long")], b"{}", |_| async {
            Err(HandlerError::retryable(long.clone()))
        })
        .await;
    let Outcome::RetryableFailure { error, .. } = outcome else {
        panic!("expected RetryableFailure, got {outcome:?}");
    };
    assert!(
        error.len() <= webhook_guard::guard::MAX_ERROR_LEN,
        "{}",
        error.len()
    );
    assert!(
        error.len() > webhook_guard::guard::MAX_ERROR_LEN - 16,
        "{}",
        error.len()
    );
    assert!(
        error.starts_with("éé") && error.ends_with("… (cut)"),
        "{error}"
    );
    let record = s.guard.inspect("evt_long").await.unwrap().unwrap();
    assert_eq!(record.history[0].error, error);
}

#[tokio::test]
async fn a_panicking_claim_hook_leaves_no_claim_held() {
    #[derive(Debug)]
    struct PanicsOnClaim;
    impl Hooks for PanicsOnClaim {
        fn on_claim(&self, _: Key<'_>, _: u32) {
            panic!("a hook bug");
        }
    }
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .hooks(PanicsOnClaim)
        .build()
        .unwrap();
    let first = tokio::spawn(async move {
        let outcome = ok_run(&guard, "evt_h", b"{}").await;
        (guard, outcome)
    })
    .await;
    let (guard, outcome) = first.expect("the delivery did not panic");
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    let again = ok_run(&guard, "evt_h", b"{}").await;
    assert!(matches!(again, Outcome::Duplicate { .. }), "{again:?}");
}

#[tokio::test(start_paused = true)]
async fn a_sweeper_whose_handle_is_dropped_runs_on() {
    #[derive(Debug, Default)]
    struct Count(AtomicUsize);
    impl Hooks for Count {
        fn on_sweep(&self, _: &webhook_guard::hooks::SweepReport) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let count = Arc::new(Count::default());
    let sweeper = webhook_guard::sweeper::Sweeper::new(
        Arc::new(MemoryStore::new()),
        Arc::new(webhook_guard::clock::SystemClock),
        count.clone(),
    )
    .interval(Duration::from_secs(10));
    drop(sweeper.spawn());
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        2,
        "two sweeps after the drop"
    );
}

#[tokio::test]
async fn forget_allows_reprocessing_but_not_under_a_live_lease() {
    let s = setup();
    ok_run(&s.guard, "evt_f", b"{}").await;
    assert_eq!(s.guard.forget("evt_f").await.unwrap(), Deleted::Removed);
    assert!(matches!(
        ok_run(&s.guard, "evt_f", b"{}").await,
        Outcome::Processed { .. }
    ));
    let Begin::Claimed(c) = s.guard.begin(&[("x-id", "evt_g")], b"{}").await else {
        panic!("claim expected");
    };
    assert_eq!(s.guard.forget("evt_g").await.unwrap(), Deleted::LeaseHeld);
    drop(c.complete().await);
    assert_eq!(s.guard.forget("nope").await.unwrap(), Deleted::NotFound);
}

#[test]
fn the_builder_refuses_nonsense_with_typed_errors() {
    let base = || {
        WebhookGuard::builder()
            .store(MemoryStore::new())
            .verifier(NoVerification)
            .event_id(EventId::header("x-id"))
    };
    let err = |b: webhook_guard::WebhookGuardBuilder| b.build().unwrap_err();
    assert_eq!(
        err(WebhookGuard::builder().verifier(NoVerification)),
        ConfigError::NoStore
    );
    assert_eq!(
        err(WebhookGuard::builder().store(MemoryStore::new())),
        ConfigError::NoVerifier
    );
    assert!(matches!(
        err(base()
            .lease(Duration::from_secs(600))
            .retention(Duration::from_secs(60))),
        ConfigError::RetentionBelowLease { .. }
    ));
    assert_eq!(err(base().escalate_after(0)), ConfigError::ZeroEscalation);
    assert_eq!(
        err(base().lease(Duration::ZERO)),
        ConfigError::BadDuration("lease")
    );
    assert_eq!(err(base().namespace("")), ConfigError::BadNamespace);
    assert_eq!(err(base().namespace("a\0b")), ConfigError::BadNamespace);
    assert_eq!(err(base().max_body(0)), ConfigError::ZeroBodyLimit);
    // A replay the signature still accepts must find its id remembered.
    let stripe = |tolerance| {
        webhook_guard::verify::Stripe::new(
            [webhook_guard::verify::Provider::Stripe.sample_secret()],
        )
        .unwrap()
        .tolerance(tolerance)
    };
    let week = Duration::from_secs(7 * 86_400);
    assert_eq!(
        err(base().verifier(stripe(week))),
        ConfigError::RetentionBelowTolerance {
            retention: Duration::from_secs(72 * 3600),
            tolerance: week,
        }
    );
    assert!(matches!(
        err(base()
            .verifier(stripe(Duration::from_secs(300)))
            .lease(Duration::from_secs(30))
            .retention(Duration::from_secs(60))),
        ConfigError::RetentionBelowTolerance { .. }
    ));
    assert!(base()
        .verifier(stripe(week))
        .retention(2 * week)
        .build()
        .is_ok());
    let guard = base().build().unwrap();
    assert_eq!(guard.retention(), Duration::from_secs(72 * 3600));
    assert_eq!(guard.lease(), Duration::from_secs(300));
}

#[tokio::test]
async fn statuses_can_be_overridden() {
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .status(OutcomeKind::Duplicate, http::StatusCode::ACCEPTED)
        .build()
        .unwrap();
    ok_run(&guard, "a", b"").await;
    let dup = ok_run(&guard, "a", b"").await;
    assert_eq!(guard.answer(&dup).status, 202);
    assert_eq!(guard.answer(&dup).reason, "duplicate");
}

#[test]
fn every_outcome_kind_has_a_distinct_name() {
    let names: std::collections::HashSet<_> = OutcomeKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(names.len(), OutcomeKind::ALL.len());
}

#[tokio::test]
async fn a_linear_retry_with_a_fresh_timestamp_is_a_duplicate_not_a_conflict() {
    use webhook_guard::verify::Linear;
    let clock = ManualClock::new(DateTime::from_timestamp(1_700_000_000, 0).unwrap());
    let linear = Linear::new(["lin_wh_0123456789abcdef0123456789abcdef"]).unwrap();
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(linear.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    let deliver = |ts_ms: i64| {
        let body = format!(r#"{{"action":"create","type":"Issue","webhookTimestamp":{ts_ms}}}"#);
        let sig = linear.sign(body.as_bytes());
        (body, sig)
    };
    let (body, sig) = deliver(1_700_000_000_000);
    let headers = [
        ("Linear-Signature", sig.as_str()),
        ("Linear-Delivery", "d-1"),
    ];
    let first = guard
        .handle(&headers, body.as_bytes(), |_| async { Ok(()) })
        .await;
    assert!(matches!(first, Outcome::Processed { .. }), "{first:?}");
    // Linear retries ten minutes later with a fresh webhookTimestamp in the body.
    clock.advance(TimeDelta::minutes(10));
    let (body, sig) = deliver(1_700_000_600_000);
    let headers = [
        ("Linear-Signature", sig.as_str()),
        ("Linear-Delivery", "d-1"),
    ];
    let retry = guard
        .handle(&headers, body.as_bytes(), |_| async {
            panic!("must not run")
        })
        .await;
    assert!(matches!(retry, Outcome::Duplicate { .. }), "{retry:?}");
}

#[tokio::test]
async fn the_stripe_preset_feeds_the_ordering_guard_by_itself() {
    use webhook_guard::verify::Stripe;
    let stripe = Stripe::new([webhook_guard::verify::Provider::Stripe.sample_secret()]).unwrap();
    let store = MemoryStore::new();
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .ordering(store)
        .verifier(stripe.clone())
        .build()
        .unwrap();
    let now = Utc::now().timestamp();
    let deliver = |id: &str, ty: &str, created: i64| {
        let body = format!(
            r#"{{"id":"{id}","type":"{ty}","created":{created},"data":{{"object":{{"id":"pi_1"}}}}}}"#
        );
        let sig = stripe.sign(body.as_bytes(), now);
        (body, sig)
    };
    let (body, sig) = deliver("evt_new", "payment_intent.succeeded", now - 10);
    let newer = guard
        .handle(
            &[("Stripe-Signature", sig.as_str())],
            body.as_bytes(),
            |_| async { Ok(()) },
        )
        .await;
    assert!(matches!(newer, Outcome::Processed { .. }), "{newer:?}");
    let (body, sig) = deliver("evt_old", "payment_intent.processing", now - 20);
    let older = guard
        .handle(
            &[("Stripe-Signature", sig.as_str())],
            body.as_bytes(),
            |_| async { panic!("a late, older event must not run") },
        )
        .await;
    assert!(matches!(older, Outcome::Stale { .. }), "{older:?}");
}

/// A stale event whose completion the store could not record at once is recorded
/// in the background: left `InProgress`, its lease would run out, count as a
/// failure, and a resend would escalate an event that never ran.
#[tokio::test]
async fn a_stale_event_is_recorded_completed_even_when_the_store_failed_at_first() {
    let store = Arc::new(Flaky::default());
    let hooks = Arc::new(Recorder::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .ordering(MemoryStore::new())
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .escalate_after(1)
        .hooks(hooks.clone())
        .build()
        .unwrap();
    let now = Utc::now().timestamp();
    let body = |created: i64| {
        format!(r#"{{"type":"charge.updated","created":{created},"object":"ch_1"}}"#)
    };
    let newer = ok_run(&guard, "evt_new", body(now - 10).as_bytes()).await;
    assert!(matches!(newer, Outcome::Processed { .. }), "{newer:?}");
    store.finish_down.store(true, Ordering::SeqCst);
    let older = guard
        .handle(
            &[("x-id", "evt_old")],
            body(now - 20).as_bytes(),
            |_| async { panic!("a late, older event must not run") },
        )
        .await;
    assert!(matches!(older, Outcome::Stale { .. }), "{older:?}");
    store.finish_down.store(false, Ordering::SeqCst);
    let record = record_in_state(&guard, "evt_old", RecordState::Completed).await;
    assert_eq!(record.failures, 0);
    assert!(hooks.escalations.lock().unwrap().is_empty());
}

/// A failure recorded after another delivery took the lease over must change
/// nothing: not the record, not the object's ordering status, and no hook fires.
#[tokio::test]
async fn a_failure_after_a_lost_lease_changes_nothing() {
    use webhook_guard::ordering::{ObjectKey, ObjectStatus, OrderingStore};
    let clock = ManualClock::new(start());
    let hooks = Arc::new(Recorder::default());
    let store = MemoryStore::new();
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .ordering(store.clone())
        .event_meta(MetaExtractor::stripe())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .clock(clock.clone())
        .hooks(hooks.clone())
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let created = start().timestamp() - 10;
    let body = format!(
        r#"{{"id":"evt_1","type":"invoice.paid","created":{created},"data":{{"object":{{"id":"in_1"}}}}}}"#
    );
    let headers = [("x-id", "evt_1")];
    let object = ObjectKey {
        namespace: guard.namespace(),
        object: "in_1",
        family: "invoice",
    };
    for permanent in [true, false] {
        let Begin::Claimed(slow) = guard.begin(&headers, body.as_bytes()).await else {
            panic!("the first delivery claims the id");
        };
        clock.advance(TimeDelta::seconds(61));
        let Begin::Claimed(fast) = guard.begin(&headers, body.as_bytes()).await else {
            panic!("an expired lease is taken over");
        };
        assert!(matches!(fast.complete().await, Outcome::Processed { .. }));
        let error = match permanent {
            true => HandlerError::permanent("bad payload"),
            false => HandlerError::retryable("timeout"),
        };
        let late = slow.fail(error).await;
        let Outcome::RetryableFailure { error, .. } = &late else {
            panic!("a fenced-out failure is answered as retryable: {late:?}");
        };
        assert!(error.contains("lease lost"), "{error}");
        let record = guard.inspect("evt_1").await.unwrap().unwrap();
        assert_eq!(
            record.state,
            RecordState::Completed,
            "the winner's record stays"
        );
        let status = store.get_object(object).await.unwrap().unwrap().status;
        assert_eq!(status, ObjectStatus::Applied, "the object stays applied");
        assert_eq!(hooks.permanent.load(Ordering::SeqCst), 0);
        assert_eq!(hooks.failures.load(Ordering::SeqCst), 0);
        assert!(guard.forget("evt_1").await.unwrap() == webhook_guard::store::Deleted::Removed);
    }
}

/// Sends every request's reason down a channel.
#[derive(Debug)]
struct Reasons(tokio::sync::mpsc::UnboundedSender<webhook_guard::reconcile::ReconcileReason>);

#[async_trait]
impl webhook_guard::reconcile::Reconciler for Reasons {
    async fn reconcile(
        &self,
        request: &webhook_guard::reconcile::ReconcileRequest,
    ) -> Result<(), webhook_guard::store::BoxError> {
        let _ = self.0.send(request.reason);
        Ok(())
    }
}

/// A handler that succeeded after its lease was taken over may have run twice: the
/// reconciler is asked to check.
#[tokio::test]
async fn a_success_after_a_lost_lease_is_reconciled() {
    use webhook_guard::reconcile::ReconcileReason;
    let clock = ManualClock::new(start());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .reconciler(Reasons(tx))
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .clock(clock.clone())
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let headers = [("x-id", "evt_1")];
    let Begin::Claimed(slow) = guard.begin(&headers, b"{}").await else {
        panic!("the first delivery claims the id");
    };
    clock.advance(TimeDelta::seconds(61));
    let Begin::Claimed(fast) = guard.begin(&headers, b"{}").await else {
        panic!("an expired lease is taken over");
    };
    assert!(matches!(fast.complete().await, Outcome::Processed { .. }));
    assert!(
        rx.try_recv().is_err(),
        "a recorded success needs no reconciling"
    );
    let late = slow.complete().await;
    assert!(matches!(late, Outcome::Unrecorded { .. }), "{late:?}");
    let reason = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert_eq!(reason.unwrap(), Some(ReconcileReason::LeaseLost));
}

/// A payload may hold personal data: `Debug` of anything carrying a body shows its
/// length, never its bytes.
#[tokio::test]
async fn debug_output_never_shows_a_body() {
    use webhook_guard::inbox::{InboxEvent, NewEvent};
    let s = setup();
    let body = br#"{"card_holder":"PAYLOAD-MARKER"}"#;
    let Begin::Claimed(claimed) = s.guard.begin(&[("x-id", "evt_dbg")], body).await else {
        panic!("the first delivery claims the id");
    };
    let meta = EventMeta::default();
    let new = NewEvent {
        key: Key::new("ns", "evt_dbg"),
        fingerprint: webhook_guard::store::Fingerprint::of(body),
        meta: &meta,
        payload: body,
        now: start(),
        expires_at: start(),
    };
    let shown = [
        format!("{claimed:?}"),
        format!("{:?}", claimed.event()),
        format!("{new:?}"),
        format!("{:?}", InboxEvent::accepted(&new)),
    ];
    // A derived `Debug` prints the bytes as numbers, not as text.
    let as_bytes = format!("{:?}", &body[..]);
    let bytes_inside = &as_bytes[1..as_bytes.len() - 1];
    for text in &shown {
        assert!(!text.contains("PAYLOAD-MARKER"), "{text}");
        assert!(!text.contains(bytes_inside), "{text}");
        assert!(text.contains(&format!("<{} bytes>", body.len())), "{text}");
    }
    assert!(matches!(
        claimed.complete().await,
        Outcome::Processed { .. }
    ));
}

/// Guards that detect conflicts and guards that do not may share a store (a rolling
/// deploy that turns detection off or on): a failed event is run again by either,
/// and a finished one is a duplicate for both, never a conflict.
#[tokio::test]
async fn guards_with_and_without_conflict_detection_share_a_store() {
    let store = MemoryStore::new();
    let guard = |detect: bool| {
        WebhookGuard::builder()
            .store(store.clone())
            .verifier(NoVerification)
            .event_id(EventId::header("x-id"))
            .detect_conflicts(detect)
            .build()
            .unwrap()
    };
    let (on, off) = (guard(true), guard(false));
    for (first, second) in [(&on, &off), (&off, &on)] {
        let id = if std::ptr::eq(first, &on) {
            "evt_on_first"
        } else {
            "evt_off_first"
        };
        let failed = first
            .handle(&[("x-id", id)], b"{}", |_| async {
                Err(HandlerError::retryable("downstream down"))
            })
            .await;
        assert!(
            matches!(failed, Outcome::RetryableFailure { .. }),
            "{failed:?}"
        );
        let retried = ok_run(second, id, b"{}").await;
        assert!(
            matches!(retried, Outcome::Processed { .. }),
            "a failed event runs again under the other setting: {retried:?}"
        );
        for guard in [first, second] {
            let again = ok_run(guard, id, b"{}").await;
            assert!(matches!(again, Outcome::Duplicate { .. }), "{again:?}");
        }
    }
    // A body that really differs is still a conflict where both fingerprints are known.
    let conflict = ok_run(&on, "evt_on_first", b"{\"other\":1}").await;
    assert!(matches!(conflict, Outcome::Conflict { .. }), "{conflict:?}");
}

/// A clock at the end of chrono's range (a test clock advanced by `TimeDelta::MAX`)
/// saturates the times the guard computes instead of panicking.
#[tokio::test]
async fn a_clock_at_the_end_of_time_does_not_panic() {
    let s = setup();
    s.clock.advance(TimeDelta::MAX);
    assert_eq!(
        webhook_guard::clock::Clock::now(&s.clock),
        DateTime::<Utc>::MAX_UTC
    );
    let first = ok_run(&s.guard, "evt_end", b"{}").await;
    assert!(matches!(first, Outcome::Processed { .. }), "{first:?}");
    // Nothing outlives the end of time: the record expired as it was made.
    let again = ok_run(&s.guard, "evt_end", b"{}").await;
    assert!(matches!(again, Outcome::Processed { .. }), "{again:?}");
    let failed = failing_run(&s.guard, "evt_end_fail").await;
    assert!(
        matches!(failed, Outcome::RetryableFailure { .. }),
        "{failed:?}"
    );
}

/// An ordering store whose settles wait while `stall` is set.
#[derive(Debug, Default)]
struct SlowOrdering {
    inner: MemoryStore,
    stall: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl webhook_guard::ordering::OrderingStore for SlowOrdering {
    async fn observe(
        &self,
        event: &webhook_guard::ordering::Observation<'_>,
    ) -> Result<webhook_guard::ordering::Freshness, StoreError> {
        self.inner.observe(event).await
    }
    async fn settle_object(
        &self,
        mark: &webhook_guard::ordering::ObjectMark<'_>,
    ) -> Result<bool, StoreError> {
        stall(&self.stall).await;
        self.inner.settle_object(mark).await
    }
    async fn mark_object(
        &self,
        mark: &webhook_guard::ordering::ObjectMark<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.mark_object(mark).await
    }
    async fn mark_object_if_failed(
        &self,
        mark: &webhook_guard::ordering::FailedMark<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.mark_object_if_failed(mark).await
    }
    async fn get_object(
        &self,
        key: webhook_guard::ordering::ObjectKey<'_>,
    ) -> Result<Option<webhook_guard::ordering::ObjectRecord>, StoreError> {
        self.inner.get_object(key).await
    }
    async fn failed_objects(
        &self,
        page: &webhook_guard::ordering::FailedPage<'_>,
    ) -> Result<Vec<webhook_guard::ordering::ObjectRecord>, StoreError> {
        self.inner.failed_objects(page).await
    }
}

/// A success whose delivery is dropped after the store recorded it still settles its
/// object: while the object is settled, or while the record's answer is on its way.
#[tokio::test]
async fn a_success_dropped_after_its_record_still_settles_its_object() {
    use webhook_guard::ordering::{ObjectKey, ObjectStatus, OrderingStore};
    let store = Arc::new(Flaky::default());
    let ordering = Arc::new(SlowOrdering::default());
    let hooks = Arc::new(Recorder::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .hooks(hooks.clone())
        .ordering(ordering.clone())
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .build()
        .unwrap();
    let created = Utc::now().timestamp() - 10;
    for (id, object, flag) in [
        ("evt_settle", "ch_settle", &ordering.stall),
        ("evt_answer", "ch_answer", &store.answer_stall),
    ] {
        let body =
            format!(r#"{{"type":"charge.succeeded","created":{created},"object":"{object}"}}"#);
        flag.store(true, Ordering::SeqCst);
        let cut = tokio::time::timeout(
            Duration::from_millis(50),
            ok_run(&guard, id, body.as_bytes()),
        )
        .await;
        assert!(cut.is_err(), "{id}: the delivery must still be waiting");
        flag.store(false, Ordering::SeqCst);
        record_in_state(&guard, id, RecordState::Completed).await;
        let key = ObjectKey {
            namespace: guard.namespace(),
            object,
            family: "charge",
        };
        let mut status = None;
        for _ in 0..500 {
            status = ordering.get_object(key).await.unwrap().map(|r| r.status);
            if status == Some(ObjectStatus::Applied) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(status, Some(ObjectStatus::Applied), "{id}");
    }
    for _ in 0..500 {
        if hooks.processed.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        hooks.processed.load(Ordering::SeqCst),
        2,
        "both dropped successes are reported, once"
    );
}

/// Inside a tokio runtime that nobody drives (entered, but polled by another
/// executor), a failing delivery still finishes: its failure is recorded in its
/// own future, not on a task only the runtime could run.
#[test]
fn a_failure_finishes_where_the_runtime_is_not_driven() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let s = setup();
    let mut delivery = std::pin::pin!(failing_run(&s.guard, "evt_undriven"));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let outcome =
        (0..1000).find_map(
            |_| match std::future::Future::poll(delivery.as_mut(), &mut cx) {
                std::task::Poll::Ready(outcome) => Some(outcome),
                std::task::Poll::Pending => None,
            },
        );
    assert!(
        matches!(outcome, Some(Outcome::RetryableFailure { .. })),
        "{outcome:?}"
    );
}

/// A delivery that escalates at its claim (earlier holders crashed) and is dropped
/// while the escalation is recorded still escalates the id, calling the hook once.
#[tokio::test]
async fn an_escalation_at_claim_finishes_when_its_delivery_is_dropped() {
    let store = Arc::new(Flaky::default());
    let clock = ManualClock::new(start());
    let hooks = Arc::new(Recorder::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .clock(clock.clone())
        .hooks(hooks.clone())
        .lease(Duration::from_secs(60))
        .escalate_after(2)
        .build()
        .unwrap();
    let headers = [("x-id", "evt_crashy")];
    // Two holders crash: their claims are never finished, their leases run out.
    for _ in 0..2 {
        let Begin::Claimed(claimed) = guard.begin(&headers, b"{}").await else {
            panic!("the claim is won after the lease ran out");
        };
        std::mem::forget(claimed);
        clock.advance(TimeDelta::seconds(61));
    }
    store.finish_stall.store(true, Ordering::SeqCst);
    let cut = tokio::time::timeout(Duration::from_millis(50), guard.begin(&headers, b"{}")).await;
    assert!(cut.is_err(), "the delivery must still be escalating");
    store.finish_stall.store(false, Ordering::SeqCst);
    record_in_state(&guard, "evt_crashy", RecordState::Escalated).await;
    assert_eq!(hooks.escalations.lock().unwrap().len(), 1);
}

/// A success the store fails to record is reported unrecorded once: the background
/// recording that then gives up calls no hook a second time.
#[tokio::test(start_paused = true)]
async fn an_unrecorded_success_calls_its_hook_once() {
    let store = Arc::new(Flaky::default());
    let hooks = Arc::new(Recorder::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .hooks(hooks.clone())
        .build()
        .unwrap();
    store.finish_down.store(true, Ordering::SeqCst);
    let outcome = ok_run(&guard, "evt_unrecorded", b"{}").await;
    assert!(matches!(outcome, Outcome::Unrecorded { .. }), "{outcome:?}");
    // Past the background recording's deadline (the lease, 5 minutes).
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(hooks.unrecorded.load(Ordering::SeqCst), 1);
}

/// A guard on `store` reporting to `hooks`, escalating at `escalate_after` failures.
fn recorded_guard(store: &Arc<Flaky>, hooks: &Arc<Recorder>, escalate_after: u32) -> WebhookGuard {
    WebhookGuard::builder()
        .store(store.clone())
        .hooks(hooks.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .escalate_after(escalate_after)
        .build()
        .unwrap()
}

/// A finish the store made whose answer is lost (an error) or comes back
/// `LeaseLost` (the request, sent again, met its own change) is the finish made:
/// an escalation calls its hook and answers 200, a permanent failure and a success
/// are answered as recorded.
#[tokio::test]
async fn a_finish_made_but_answered_otherwise_counts_as_made() {
    for reply in [1u8, 2] {
        let store = Arc::new(Flaky::default());
        let hooks = Arc::new(Recorder::default());
        let guard = recorded_guard(&store, &hooks, 1);
        store.finish_reply.store(reply, Ordering::SeqCst);
        let escalated = failing_run(&guard, "evt_esc").await;
        assert!(
            matches!(escalated, Outcome::Escalated { failures: 1, .. }),
            "reply {reply}: {escalated:?}"
        );
        assert_eq!(guard.answer(&escalated).status, 200);
        assert_eq!(hooks.escalations.lock().unwrap().len(), 1, "reply {reply}");
        let again = ok_run(&guard, "evt_esc", b"{}").await;
        assert!(
            matches!(
                again,
                Outcome::Duplicate {
                    state: RecordState::Escalated,
                    ..
                }
            ),
            "reply {reply}: {again:?}"
        );
        assert_eq!(hooks.escalations.lock().unwrap().len(), 1, "called once");

        store.finish_reply.store(reply, Ordering::SeqCst);
        let permanent = guard
            .handle(&[("x-id", "evt_perm")], b"{}", |_| async {
                Err(HandlerError::permanent("bad payload"))
            })
            .await;
        assert!(
            matches!(permanent, Outcome::PermanentFailure { .. }),
            "reply {reply}: {permanent:?}"
        );
        assert_eq!(hooks.permanent.load(Ordering::SeqCst), 1, "reply {reply}");

        if reply == 2 {
            // An error leaves a success to the background (Unrecorded, tested
            // elsewhere); `LeaseLost` that met its own change is the success.
            store.finish_reply.store(reply, Ordering::SeqCst);
            let done = ok_run(&guard, "evt_ok", b"{}").await;
            assert!(matches!(done, Outcome::Processed { .. }), "{done:?}");
            assert_eq!(hooks.unrecorded.load(Ordering::SeqCst), 0);
            // A retryable failure below the threshold: counted, its hook called.
            let patient = recorded_guard(&store, &hooks, 5);
            store.finish_reply.store(reply, Ordering::SeqCst);
            let failed = failing_run(&patient, "evt_retry").await;
            assert_first_retryable_failure(&failed, "downstream timeout");
            assert_eq!(hooks.failures.load(Ordering::SeqCst), 1);
        }
    }
}

/// A finish answered `LeaseLost` whose record cannot then be read may have been
/// made: an escalation is escalated all the same (200, the hook), not answered as a
/// lost lease the sender's retry would meet as a silent duplicate.
#[tokio::test]
async fn a_lease_lost_finish_that_cannot_be_checked_may_have_been_made() {
    let store = Arc::new(Flaky::default());
    let hooks = Arc::new(Recorder::default());
    let guard = recorded_guard(&store, &hooks, 1);
    store.finish_reply.store(2, Ordering::SeqCst);
    store.get_down.store(true, Ordering::SeqCst);
    let escalated = failing_run(&guard, "evt_unsure").await;
    assert!(
        matches!(escalated, Outcome::Escalated { failures: 1, .. }),
        "{escalated:?}"
    );
    assert_eq!(hooks.escalations.lock().unwrap().len(), 1);
    store.get_down.store(false, Ordering::SeqCst);
    let again = ok_run(&guard, "evt_unsure", b"{}").await;
    assert!(matches!(again, Outcome::Duplicate { .. }), "{again:?}");
    assert_eq!(hooks.escalations.lock().unwrap().len(), 1, "called once");
}

/// The default `escalate_after` is at most the provider's number of deliveries: an
/// event Slack delivers four times, failing each time, is escalated at the fourth
/// (at five it never would be); GitHub, which delivers once, escalates the first
/// failure. An explicit `escalate_after` still wins.
#[tokio::test]
async fn escalation_comes_before_the_providers_last_delivery() {
    use webhook_guard::verify::{GitHub, Slack};
    let slack = Slack::new(["slack-signing-secret-0123456789abc"]).unwrap();
    let at = Utc::now();
    let clock = ManualClock::new(at);
    let hooks = Arc::new(Recorder::default());
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(slack.clone())
        .clock(clock.clone())
        .hooks(hooks.clone())
        .build()
        .unwrap();
    let body = br#"{"type":"event_callback","event_id":"Ev_fail","event":{"type":"app_mention"}}"#;
    let mut outcomes = Vec::new();
    for after in [0, 1, 60, 300] {
        let now = at + TimeDelta::seconds(after);
        clock.set(now);
        let headers = slack.sign_headers(now.timestamp(), body);
        let outcome = guard
            .handle(&headers, body, |_| async {
                Err(HandlerError::retryable("downstream down"))
            })
            .await;
        outcomes.push(outcome.kind());
    }
    assert_eq!(
        outcomes,
        [
            OutcomeKind::RetryableFailure,
            OutcomeKind::RetryableFailure,
            OutcomeKind::RetryableFailure,
            OutcomeKind::Escalated
        ]
    );
    assert_eq!(hooks.escalations.lock().unwrap().len(), 1);

    let github = GitHub::new(["gh-secret-0123456789"]).unwrap();
    let once = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(github.clone())
        .build()
        .unwrap();
    let body = br#"{"action":"opened"}"#;
    let headers = [
        ("X-GitHub-Delivery", "d-1".to_owned()),
        ("X-Hub-Signature-256", github.sign(body)),
    ];
    let outcome = once
        .handle(&headers, body, |_| async {
            Err(HandlerError::retryable("no"))
        })
        .await;
    assert_eq!(outcome.kind(), OutcomeKind::Escalated);

    let explicit = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(github.clone())
        .escalate_after(3)
        .build()
        .unwrap();
    let outcome = explicit
        .handle(&headers, body, |_| async {
            Err(HandlerError::retryable("no"))
        })
        .await;
    assert_eq!(outcome.kind(), OutcomeKind::RetryableFailure);
}
