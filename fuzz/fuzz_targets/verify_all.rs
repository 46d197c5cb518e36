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
            // RFC 8032's first public key.
            Provider::Discord => "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
            _ => "secret",
        };
        // Discord needs the `ed25519` feature: a preset that cannot be built is skipped.
        let Ok(v): Result<Box<dyn Verifier>, _> =
            p.verifier_with_url("https://example.com/hook", [secret])
        else {
            continue;
        };
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
            ("x-zm-signature", &signature),
            ("x-zm-request-timestamp", &timestamp),
            ("Twitch-Eventsub-Message-Signature", &signature),
            ("Twitch-Eventsub-Message-Id", &timestamp),
            ("Twitch-Eventsub-Message-Timestamp", &timestamp),
            ("X-Signature-Ed25519", &signature),
            ("X-Signature-Timestamp", &timestamp),
            ("X-Twilio-Signature", &signature),
            ("X-HubSpot-Signature-v3", &signature),
            ("X-HubSpot-Request-Timestamp", &timestamp),
        ];
        let _ = v.verify(&headers, &body, now);
    }
});
