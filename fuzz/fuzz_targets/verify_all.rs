#![no_main]

//! Every preset against arbitrary header values and bodies: must never panic.

use libfuzzer_sys::fuzz_target;
use webhook_guard::verify::{Provider, Verifier};

fuzz_target!(|input: (Vec<u8>, Vec<u8>, Vec<u8>)| {
    let (signature, timestamp, body) = input;
    let now = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    for p in Provider::ALL {
        let secret = match p {
            Provider::Standard => "whsec_c2VjcmV0",
            Provider::Adyen => "736563726574",
            Provider::SendGrid => "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==",
            _ => "secret",
        };
        // SendGrid needs its feature; every other preset builds.
        let Ok(v) = p.verifier_with_url([secret], "https://example.com/hook") else {
            assert_eq!(p, Provider::SendGrid);
            continue;
        };
        let v: Box<dyn Verifier> = v;
        let headers: Vec<(&str, &[u8])> = vec![
            ("Stripe-Signature", &signature),
            ("webhook-signature", &signature),
            ("webhook-id", &timestamp),
            ("webhook-timestamp", &timestamp),
            ("X-Hub-Signature-256", &signature),
            ("X-Shopify-Hmac-Sha256", &signature),
            ("X-Slack-Signature", &signature),
            ("X-Slack-Request-Timestamp", &timestamp),
            ("Paddle-Signature", &signature),
            ("Linear-Signature", &signature),
            ("x-square-hmacsha256-signature", &signature),
            ("X-Twilio-Email-Event-Webhook-Signature", &signature),
            ("X-Twilio-Email-Event-Webhook-Timestamp", &timestamp),
            ("X-Hub-Signature", &signature),
            ("X-Gitlab-Token", &signature),
            ("Typeform-Signature", &signature),
            ("Calendly-Webhook-Signature", &signature),
            ("X-Dropbox-Signature", &signature),
        ];
        let _ = v.verify(&headers, &body, now);
    }
});
