//! Replay and forgery: what an attacker who captured a delivery, or who has no
//! secret at all, can make the guard do. Work on hostile input is bounded by
//! construction (header length and entry limits, the body limit, serde_json's
//! recursion limit); these tests assert the kind of rejection, never a duration.

use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::{DateTime, TimeDelta, Utc};
use webhook_guard::clock::ManualClock;
use webhook_guard::outcome::{OutcomeKind, Rejection};
use webhook_guard::verify::{GitHub, HmacSha256Header, StandardWebhooks, Stripe, VerifyError};
use webhook_guard::{EventId, Headers, MemoryStore, Outcome, WebhookGuard};

const T: i64 = 1_700_000_000;
const STRIPE_SECRET: &str = "whsec_forgerytest0123456789abcdefghijk";
const STD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs, 0).unwrap()
}

fn stripe_guard(clock: &ManualClock) -> WebhookGuard {
    WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(Stripe::new([STRIPE_SECRET]).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Runs a delivery and answers the outcome and how many times the handler ran.
async fn deliver(guard: &WebhookGuard, headers: &dyn Headers, body: &[u8]) -> (Outcome, usize) {
    let runs = AtomicUsize::new(0);
    let outcome = guard
        .handle(headers, body, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .await;
    (outcome, runs.into_inner())
}

fn verify_code(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Rejected(r) => r.code(),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn a_captured_delivery_is_a_duplicate_inside_the_tolerance_and_rejected_after() {
    let clock = ManualClock::new(at(T + 1));
    let guard = stripe_guard(&clock);
    let body = br#"{"id":"evt_captured","object":"event","type":"charge.succeeded"}"#;
    let header = Stripe::new([STRIPE_SECRET]).unwrap().sign(body, T);
    let headers = [("Stripe-Signature", header.as_str())];

    let (first, runs) = deliver(&guard, &headers, body).await;
    assert_eq!((first.kind(), runs), (OutcomeKind::Processed, 1));

    // The attacker replays it byte for byte, inside the 300 s tolerance.
    clock.set(at(T + 299));
    let (replay, runs) = deliver(&guard, &headers, body).await;
    assert_eq!(
        (replay.kind(), runs),
        (OutcomeKind::Duplicate, 0),
        "{replay}"
    );
    assert_eq!(guard.answer(&replay).status, 200);

    // After the tolerance, the signed timestamp is too old: rejected before the store.
    clock.set(at(T + 301));
    let (late, runs) = deliver(&guard, &headers, body).await;
    assert_eq!(runs, 0);
    assert_eq!(verify_code(&late), "timestamp_too_old");
    assert_eq!(guard.answer(&late).status, 401);
    // Nor can it be replayed "from the future" (clock skew the other way).
    clock.set(at(T - 301));
    let (early, _) = deliver(&guard, &headers, body).await;
    assert_eq!(verify_code(&early), "timestamp_too_new");

    // Retention outlives twice the tolerance (the builder refuses less:
    // `guard::the_builder_refuses_nonsense_with_typed_errors`), so a replay can never
    // find the id forgotten while its signature is still accepted.
    assert!(guard.retention() >= 2 * Stripe::DEFAULT_TOLERANCE);
}

#[tokio::test]
async fn stripping_the_id_never_bypasses_dedup() {
    // Standard Webhooks signs the id: without it the signature cannot verify.
    let clock = ManualClock::new(at(T));
    let std = StandardWebhooks::new([STD_SECRET]).unwrap();
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(StandardWebhooks::new([STD_SECRET]).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let body = br#"{"type":"x"}"#;
    let signed = std.sign_headers("msg_1", T, body);
    let (ok, runs) = deliver(&guard, &signed, body).await;
    assert_eq!((ok.kind(), runs), (OutcomeKind::Processed, 1));
    let stripped: Vec<_> = signed
        .iter()
        .filter(|(k, _)| *k != "webhook-id")
        .cloned()
        .collect();
    let (o, runs) = deliver(&guard, &stripped, body).await;
    assert_eq!(runs, 0);
    assert!(matches!(o, Outcome::Rejected(_)), "{o}");
    // A different id under the same signature does not verify either.
    let renamed: Vec<_> = signed
        .iter()
        .map(|(k, v)| {
            (
                *k,
                if *k == "webhook-id" {
                    "msg_2".to_owned()
                } else {
                    v.clone()
                },
            )
        })
        .collect();
    let (o, runs) = deliver(&guard, &renamed, body).await;
    assert_eq!((verify_code(&o), runs), ("signature_mismatch", 0));

    // GitHub's delivery id is an unsigned header: stripping it is a rejection, never
    // a delivery without a key.
    let gh = GitHub::new(["gh-secret-0123456789"]).unwrap();
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(GitHub::new(["gh-secret-0123456789"]).unwrap())
        .build()
        .unwrap();
    let body = br#"{"action":"opened"}"#;
    let sig = gh.sign(body);
    let full = [
        ("X-Hub-Signature-256", sig.as_str()),
        ("X-GitHub-Delivery", "d-1"),
    ];
    assert_eq!(
        deliver(&guard, &full, body).await.0.kind(),
        OutcomeKind::Processed
    );
    let stripped = [("X-Hub-Signature-256", sig.as_str())];
    let (o, runs) = deliver(&guard, &stripped, body).await;
    assert_eq!((verify_code(&o), runs), ("missing_event_id", 0));
    let blank = [
        ("X-Hub-Signature-256", sig.as_str()),
        ("X-GitHub-Delivery", "  "),
    ];
    let (o, runs) = deliver(&guard, &blank, body).await;
    assert_eq!((o.kind(), runs), (OutcomeKind::Rejected, 0));

    // Stripe's id is in the signed body: a body signed without one has no id to
    // key on, and is refused before the store (removing it from a signed body
    // would break the signature instead).
    let clock = ManualClock::new(at(T));
    let guard = stripe_guard(&clock);
    let body = br#"{"object":"event"}"#;
    let header = Stripe::new([STRIPE_SECRET]).unwrap().sign(body, T);
    let (o, runs) = deliver(&guard, &[("Stripe-Signature", header.as_str())], body).await;
    assert_eq!((verify_code(&o), runs), ("missing_event_id", 0));
}

#[tokio::test]
async fn a_different_body_under_a_seen_id_is_a_conflict() {
    let clock = ManualClock::new(at(T));
    let std = StandardWebhooks::new([STD_SECRET]).unwrap();
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(StandardWebhooks::new([STD_SECRET]).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let a = br#"{"amount":100}"#;
    let b = br#"{"amount":100000}"#;
    let (o, runs) = deliver(&guard, &std.sign_headers("msg_same", T, a), a).await;
    assert_eq!((o.kind(), runs), (OutcomeKind::Processed, 1));
    let (o, runs) = deliver(&guard, &std.sign_headers("msg_same", T + 1, b), b).await;
    assert_eq!((o.kind(), runs), (OutcomeKind::Conflict, 0));
    assert_eq!(guard.answer(&o).status, 422);
}

#[tokio::test]
async fn forged_and_hostile_signatures_are_rejected() {
    let clock = ManualClock::new(at(T));
    let guard = stripe_guard(&clock);
    let body = br#"{"id":"evt_forged","object":"event"}"#;
    let real = Stripe::new([STRIPE_SECRET]).unwrap().sign(body, T);
    let mut cases: Vec<(&str, String)> = vec![
        (
            "another secret",
            Stripe::new(["whsec_attacker0123456789abcdefghijklmn"])
                .unwrap()
                .sign(body, T),
        ),
        ("truncated by one", real[..real.len() - 1].to_owned()),
        ("truncated to half", real[..real.len() / 2].to_owned()),
        ("no v1", format!("t={T}")),
        ("v0 only (downgrade)", real.replace("v1=", "v0=")),
        ("CR/LF injected", format!("{real}\r\nX-Injected: 1")),
        ("LF in the middle", real.replacen(',', "\n,", 1)),
        (
            "one megabyte",
            format!("{real},{}", "v1=00".repeat(200_000)),
        ),
        (
            "10,000 entries",
            format!(
                "t={T},{}",
                (0..10_000)
                    .map(|i| format!("v1={i:064x}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        ),
        ("empty", String::new()),
    ];
    // NUL bytes, which no signature holds.
    cases.push(("NUL bytes", format!("t={T},v1=\0\0\0")));
    for (what, header) in &cases {
        let (o, runs) = deliver(&guard, &[("Stripe-Signature", header.as_str())], body).await;
        assert_eq!(runs, 0, "{what}");
        let Outcome::Rejected(Rejection::Verify(e)) = &o else {
            panic!("{what}: {o:?}");
        };
        assert!(
            matches!(
                e,
                VerifyError::NoMatch
                    | VerifyError::MalformedHeader { .. }
                    | VerifyError::NoUsableSignature
                    | VerifyError::MissingHeader(_)
            ),
            "{what}: {e:?}"
        );
        assert_eq!(guard.answer(&o).status, 401, "{what}");
        assert!(
            guard.inspect("evt_forged").await.unwrap().is_none(),
            "{what}: nothing is stored"
        );
    }

    // A signed delivery tampered with: a byte of the body, or the signed time.
    let tampered = br#"{"id":"evt_forged","object":"evenT"}"#;
    let (o, runs) = deliver(&guard, &[("Stripe-Signature", real.as_str())], tampered).await;
    assert_eq!((verify_code(&o), runs), ("signature_mismatch", 0));
    let moved = real.replacen(&format!("t={T}"), &format!("t={}", T + 1), 1);
    let (o, runs) = deliver(&guard, &[("Stripe-Signature", moved.as_str())], body).await;
    assert_eq!((verify_code(&o), runs), ("signature_mismatch", 0));
    assert!(guard.inspect("evt_forged").await.unwrap().is_none());
    // The genuine delivery is stored under that id (so the reads above could fail).
    let (o, runs) = deliver(&guard, &[("Stripe-Signature", real.as_str())], body).await;
    assert_eq!((o.kind(), runs), (OutcomeKind::Processed, 1));
    assert!(guard.inspect("evt_forged").await.unwrap().is_some());
    // The bounds are what keeps work small: long headers and many entries are
    // refused as malformed before any MAC is computed.
    let long = &cases.iter().find(|c| c.0 == "one megabyte").unwrap().1;
    let (o, _) = deliver(&guard, &[("Stripe-Signature", long.as_str())], body).await;
    assert_eq!(verify_code(&o), "malformed_header");
    let many = &cases.iter().find(|c| c.0 == "10,000 entries").unwrap().1;
    let (o, _) = deliver(&guard, &[("Stripe-Signature", many.as_str())], body).await;
    assert_eq!(verify_code(&o), "malformed_header");

    // The same for Standard Webhooks' space-separated list.
    let std_guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(StandardWebhooks::new([STD_SECRET]).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let sig = StandardWebhooks::new([STD_SECRET])
        .unwrap()
        .sign("msg_1", T, body);
    let many = vec![sig.clone(); 10_000].join(" ");
    let t = T.to_string();
    let headers = [
        ("webhook-id", "msg_1"),
        ("webhook-timestamp", t.as_str()),
        ("webhook-signature", many.as_str()),
    ];
    let (o, runs) = deliver(&std_guard, &headers, body).await;
    assert_eq!((verify_code(&o), runs), ("malformed_header", 0));
}

#[tokio::test]
async fn hostile_bodies_are_bounded() {
    let verifier = HmacSha256Header::new("X-Signature", ["s-0123456789abcdef"]).unwrap();
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(HmacSha256Header::new("X-Signature", ["s-0123456789abcdef"]).unwrap())
        .event_id(EventId::json_field(["id"]))
        .event_meta(webhook_guard::meta::MetaExtractor::json(
            &["type"],
            &["created_at"],
            &["data", "object", "id"],
        ))
        .build()
        .unwrap();
    // Deeply nested JSON, correctly signed (a compromised or buggy sender): the id
    // reader stops at serde_json's recursion limit instead of overflowing the stack.
    for depth in [1_000, 100_000, 500_000] {
        let mut body = Vec::with_capacity(depth * 2 + 16);
        body.extend_from_slice(br#"{"x":"#);
        body.extend(std::iter::repeat_n(b'[', depth));
        body.extend(std::iter::repeat_n(b']', depth));
        body.extend_from_slice(br#","id":"evt_deep"}"#);
        let sig = verifier.sign(&body);
        let (o, runs) = deliver(&guard, &[("X-Signature", sig.as_str())], &body).await;
        assert_eq!(runs, 0, "depth {depth}");
        assert_eq!(verify_code(&o), "missing_event_id", "depth {depth}: {o}");
        // Same for objects.
        let mut body = Vec::new();
        body.extend(std::iter::repeat_n(&br#"{"a":"#[..], depth).flatten());
        body.extend_from_slice(b"1");
        body.extend(std::iter::repeat_n(b'}', depth));
        let sig = verifier.sign(&body);
        let (o, _) = deliver(&guard, &[("X-Signature", sig.as_str())], &body).await;
        assert_eq!(o.kind(), OutcomeKind::Rejected, "depth {depth}");
    }
    // A body over the limit is refused before its MAC is computed.
    let big = vec![b' '; webhook_guard::guard::DEFAULT_MAX_BODY + 1];
    let (o, runs) = deliver(&guard, &[("X-Signature", "00")], &big).await;
    assert_eq!((verify_code(&o), runs), ("body_too_large", 0));
    assert_eq!(guard.answer(&o).status, 413);
    // An id too long or holding control characters never reaches the store.
    for id in ["a".repeat(256), "evt\r\nx".to_owned(), String::new()] {
        let body = serde_json::to_vec(&serde_json::json!({ "id": id })).unwrap();
        let sig = verifier.sign(&body);
        let (o, runs) = deliver(&guard, &[("X-Signature", sig.as_str())], &body).await;
        assert_eq!(runs, 0);
        assert!(
            matches!(verify_code(&o), "invalid_event_id" | "missing_event_id"),
            "{o}"
        );
    }
    // Clock skew on the receiver: a delivery whose signed time is too far ahead of
    // our clock is refused, not stored for a future it may never see.
    let clock = ManualClock::new(at(T));
    let guard = stripe_guard(&clock);
    let body = br#"{"id":"evt_skew"}"#;
    let header = Stripe::new([STRIPE_SECRET]).unwrap().sign(body, T);
    clock.advance(TimeDelta::seconds(-400));
    let (o, _) = deliver(&guard, &[("Stripe-Signature", header.as_str())], body).await;
    assert_eq!(verify_code(&o), "timestamp_too_new");
}
