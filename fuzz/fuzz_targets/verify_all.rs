#![no_main]

//! Every preset against arbitrary header values and bodies: must never panic.

use libfuzzer_sys::fuzz_target;
use webhook_guard::verify::{Provider, Verifier};

fuzz_target!(|input: (Vec<u8>, Vec<u8>, Vec<u8>)| {
    let (signature, timestamp, body) = input;
    let now = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    for p in Provider::ALL {
        let v: Box<dyn Verifier> = p.verifier([p.sample_secret()]).unwrap();
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
        ];
        let _ = v.verify(&headers, &body, now);
    }
});
