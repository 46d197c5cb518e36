//! Cross-provider properties: every preset bounds its work on hostile headers,
//! handles non-UTF-8 bodies and CR/LF in headers, and never panics.

use chrono::{DateTime, Utc};
use proptest::prelude::*;
use webhook_guard::verify::{Provider, Verifier, VerifyError};

/// The header each provider reads its signature from.
fn signature_header(p: Provider) -> &'static str {
    match p {
        Provider::Stripe => "Stripe-Signature",
        Provider::Standard => "webhook-signature",
        Provider::GitHub => "X-Hub-Signature-256",
        Provider::Shopify => "X-Shopify-Hmac-Sha256",
        Provider::Slack => "X-Slack-Signature",
        Provider::Paddle => "Paddle-Signature",
        Provider::Linear => "Linear-Signature",
        Provider::Square => "x-square-hmacsha256-signature",
        Provider::SendGrid => "X-Twilio-Email-Event-Webhook-Signature",
        Provider::Intercom => "X-Hub-Signature",
        Provider::GitLab => "X-Gitlab-Token",
        Provider::Typeform => "Typeform-Signature",
        Provider::Calendly => "Calendly-Webhook-Signature",
        Provider::Dropbox => "X-Dropbox-Signature",
        Provider::Zoom => "x-zm-signature",
        Provider::Meta => "X-Hub-Signature-256",
        Provider::Twitch => "Twitch-Eventsub-Message-Signature",
        Provider::Discord => "X-Signature-Ed25519",
        Provider::Twilio => "X-Twilio-Signature",
        Provider::HubSpot => "X-HubSpot-Signature-v3",
        _ => "X-Unused",
    }
}

/// Every provider this build has a preset for.
fn providers() -> impl Iterator<Item = Provider> {
    Provider::ALL
        .into_iter()
        .filter(|p| cfg!(feature = "sendgrid") || *p != Provider::SendGrid)
}

/// Providers whose signature travels in the body, not a header.
fn body_signed(p: Provider) -> bool {
    matches!(p, Provider::Jamm | Provider::Adyen | Provider::Mailgun)
}

fn verifier(p: Provider) -> Box<dyn Verifier> {
    p.verifier_with_url("https://example.com/hook", [p.sample_secret()])
        .unwrap()
}

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000, 0).unwrap()
}

/// Headers that satisfy everything but the signature, so parsing reaches it.
fn base_headers(p: Provider, signature: String) -> Vec<(String, Vec<u8>)> {
    let mut h = vec![(signature_header(p).to_owned(), signature.into_bytes())];
    for (k, v) in [
        ("webhook-id", "msg_1"),
        ("webhook-timestamp", "1700000000"),
        ("X-Slack-Request-Timestamp", "1700000000"),
        ("X-Twilio-Email-Event-Webhook-Timestamp", "1700000000"),
        ("x-zm-request-timestamp", "1700000000"),
        ("Twitch-Eventsub-Message-Id", "msg_1"),
        ("Twitch-Eventsub-Message-Timestamp", "2023-11-14T22:13:20Z"),
        ("X-Signature-Timestamp", "1700000000"),
        ("X-HubSpot-Request-Timestamp", "1700000000000"),
    ] {
        h.push((k.to_owned(), v.as_bytes().to_vec()));
    }
    h
}

#[test]
fn megabyte_headers_and_ten_thousand_entries_are_refused_before_any_mac() {
    let hex = "a".repeat(64);
    for p in providers().filter(|p| !body_signed(*p)) {
        let v = verifier(p);
        let entries = match p {
            Provider::Stripe => format!("t=1700000000{}", format!(",v1={hex}").repeat(10_000)),
            Provider::Paddle => format!("ts=1700000000{}", format!(";h1={hex}").repeat(10_000)),
            Provider::Standard => vec![format!("v1,{}", "A".repeat(43) + "="); 10_000].join(" "),
            _ => format!("{hex} ").repeat(10_000),
        };
        let huge = "x".repeat(1 << 20);
        // Refused as malformed, by its length or its count of entries, before any
        // MAC is computed: the work is bounded by construction (no timing is
        // asserted here, on a shared machine).
        for value in [entries, huge] {
            let result = v.verify(&base_headers(p, value), b"{}", now());
            assert!(
                matches!(result, Err(VerifyError::MalformedHeader { .. })),
                "{p}: {result:?}"
            );
        }
    }
}

#[test]
fn cr_lf_in_headers_never_verifies() {
    for p in providers().filter(|p| !body_signed(*p)) {
        let v = verifier(p);
        for value in [
            "t=1700000000\r\n,v1=00",
            "\r\n",
            "sha256=\r\nabc",
            "v0=\n",
            "ts=1\r;h1=00",
        ] {
            let result = v.verify(&base_headers(p, value.to_owned()), b"{}", now());
            assert!(result.is_err(), "{p}: {value:?}");
        }
        let mut h = base_headers(p, "x".into());
        h[1].1 = b"msg\r\n1".to_vec();
        h[2].1 = b"1700000000\r\n".to_vec();
        assert!(v.verify(&h, b"{}", now()).is_err());
    }
}

#[test]
fn non_utf8_bodies_are_signed_as_bytes() {
    let body: &[u8] = b"\xff\xfe\x00binary\x80";
    let stripe = webhook_guard::verify::Stripe::new([Provider::Stripe.sample_secret()]).unwrap();
    let h = [("Stripe-Signature", stripe.sign(body, 1_700_000_000))];
    let verified = stripe.verify(&h, body, now()).unwrap();
    assert_eq!(verified.event_id, None);
    let github = webhook_guard::verify::GitHub::new([Provider::GitHub.sample_secret()]).unwrap();
    assert!(github
        .verify(&[("X-Hub-Signature-256", github.sign(body))], body, now())
        .is_ok());
    let jamm = verifier(Provider::Jamm);
    assert_eq!(
        jamm.verify(&[("a", "b")], body, now()).unwrap_err().code(),
        "malformed_body"
    );
}

#[test]
fn errors_never_show_secrets() {
    for p in providers() {
        let v = verifier(p);
        let err = v
            .verify(&base_headers(p, "junk".into()), b"{}", now())
            .unwrap_err();
        for text in [format!("{err}"), format!("{err:?}"), format!("{v:?}")] {
            assert!(
                !text.contains("secret") || text.contains("secret(s)"),
                "{p}: {text}"
            );
            assert!(!text.contains(&p.sample_secret()[8..]), "{p}: {text}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_headers_and_bodies_never_panic(
        sig in proptest::collection::vec(any::<u8>(), 0..300),
        ts in proptest::collection::vec(any::<u8>(), 0..24),
        body in proptest::collection::vec(any::<u8>(), 0..300),
        secs in any::<i64>(),
    ) {
        let now = DateTime::from_timestamp(secs % 100_000_000_000, 0).unwrap_or_else(Utc::now);
        for p in providers() {
            let v = verifier(p);
            let h: Vec<(String, Vec<u8>)> = vec![
                (signature_header(p).to_owned(), sig.clone()),
                ("webhook-id".to_owned(), ts.clone()),
                ("webhook-timestamp".to_owned(), ts.clone()),
                ("X-Slack-Request-Timestamp".to_owned(), ts.clone()),
                ("x-zm-request-timestamp".to_owned(), ts.clone()),
                ("Twitch-Eventsub-Message-Id".to_owned(), ts.clone()),
                ("Twitch-Eventsub-Message-Timestamp".to_owned(), ts.clone()),
                ("X-Signature-Timestamp".to_owned(), ts.clone()),
                ("X-HubSpot-Request-Timestamp".to_owned(), ts.clone()),
            ];
            let _ = v.verify(&h, &body, now);
        }
    }

    #[test]
    fn structured_stripe_and_paddle_headers_never_panic(
        parts in proptest::collection::vec("(t|v1|v0|ts|h1|x)?=?[0-9a-f]{0,70}", 0..40),
        sep in prop::sample::select(vec![",", ";", " "]),
        body in "\\PC{0,64}",
    ) {
        let header = parts.join(sep);
        for p in [Provider::Stripe, Provider::Paddle, Provider::Standard] {
            let _ = verifier(p).verify(&base_headers(p, header.clone()), body.as_bytes(), now());
        }
        let _ = webhook_guard::verify::__fuzz::jamm_body(body.as_bytes());
    }
}
