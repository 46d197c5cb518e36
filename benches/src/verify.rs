//! Signature verification of 4 KiB bodies: the guard's verifiers against a bare
//! HMAC-SHA256 and against the `standardwebhooks` crate.

use std::hint::black_box;

use chrono::Utc;

use crate::harness::{Ctx, Figure, Report, Skip};

pub(crate) const VERIFY_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A 4,096-byte Stripe-shaped JSON event, `id` first.
pub(crate) fn body_4k() -> Vec<u8> {
    let head = br#"{"id":"evt_1NDEXAMPLE4K","object":"event","type":"charge.succeeded","created":1700000000,"data":{"object":{"id":"ch_3NDEXAMPLE","amount":2000,"currency":"usd","description":""#;
    let tail = br#""}}}"#;
    let mut body = head.to_vec();
    body.resize(4096 - tail.len(), b'x');
    body.extend_from_slice(tail);
    assert_eq!(body.len(), 4096);
    body
}

/// What a naive user writes: key the HMAC on every call, MAC the signed bytes,
/// compare in constant time.
pub(crate) fn bare_hmac(secret: &[u8], parts: &[&[u8]], tag: &[u8; 32]) -> bool {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    for part in parts {
        mac.update(part);
    }
    mac.verify_slice(tag).is_ok()
}

/// `guard` vs `baseline`, each one verification, in alternating chunks.
pub(crate) fn verify_pair(
    ctx: &Ctx,
    guard_what: &'static str,
    base_what: &'static str,
    n: usize,
    mut guard: impl FnMut() -> bool,
    mut baseline: impl FnMut() -> bool,
) -> Report {
    assert!(guard(), "guard side rejects a valid delivery");
    assert!(baseline(), "baseline rejects a valid delivery");
    let n = ctx.n(n);
    let (g, b) = ctx.interleave_chunks(
        ctx.rounds,
        n,
        || (),
        |(), range| {
            for _ in range {
                black_box(guard());
            }
        },
        |(), range| {
            for _ in range {
                black_box(baseline());
            }
        },
    );
    Report {
        ratio: g / b,
        guard: Figure {
            what: guard_what,
            value: g,
            unit: "ns/verification",
        },
        baseline: Figure {
            what: base_what,
            value: b,
            unit: "ns/verification",
        },
        notes: vec![format!(
            "4,096-byte body, {n} verifications per side per round"
        )],
    }
}

pub(crate) fn verify_stripe_4k(ctx: &Ctx) -> Result<Report, Skip> {
    use webhook_guard::verify::{Stripe, Verifier};
    let body = body_4k();
    let stripe = Stripe::new([VERIFY_SECRET]).expect("secret");
    let now = Utc::now();
    let t = now.timestamp();
    let header = stripe.sign(&body, t);
    let headers = [("stripe-signature", header.as_str())];
    let tag: [u8; 32] = hex::decode(&header[header.find("v1=").unwrap() + 3..])
        .unwrap()
        .try_into()
        .unwrap();
    let ts = t.to_string();
    Ok(verify_pair(
        ctx,
        "verify::Stripe",
        "bare HMAC-SHA256",
        40_000,
        || {
            stripe
                .verify(black_box(&headers), black_box(&body), now)
                .is_ok()
        },
        || {
            bare_hmac(
                VERIFY_SECRET.as_bytes(),
                &[ts.as_bytes(), b".", black_box(&body)],
                &tag,
            )
        },
    ))
}

/// The three Standard Webhooks headers for the 4 KiB body, signed now.
pub(crate) fn standard_input(
    body: &[u8],
) -> (
    webhook_guard::verify::StandardWebhooks,
    Vec<(&'static str, String)>,
    i64,
) {
    let v = webhook_guard::verify::StandardWebhooks::new([VERIFY_SECRET]).expect("secret");
    let t = Utc::now().timestamp();
    let headers = v.sign_headers("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", t, body);
    (v, headers, t)
}

pub(crate) fn verify_standard_4k(ctx: &Ctx) -> Result<Report, Skip> {
    use webhook_guard::verify::Verifier;
    let body = body_4k();
    let (v, headers, _) = standard_input(&body);
    let mut map = http::HeaderMap::new();
    for (name, value) in &headers {
        map.insert(*name, value.parse().unwrap());
    }
    let peer = standardwebhooks::Webhook::new(VERIFY_SECRET).expect("secret");
    // Both sides read the clock: the peer crate does so inside `verify`.
    Ok(verify_pair(
        ctx,
        "verify::StandardWebhooks",
        "standardwebhooks 1 Webhook::verify",
        10_000,
        || {
            v.verify(black_box(&map), black_box(&body), Utc::now())
                .is_ok()
        },
        || peer.verify(black_box(&body), black_box(&map)).is_ok(),
    ))
}

pub(crate) fn verify_standard_vs_hmac_4k(ctx: &Ctx) -> Result<Report, Skip> {
    use base64::Engine as _;
    use webhook_guard::verify::Verifier;
    let body = body_4k();
    let (v, headers, t) = standard_input(&body);
    let now = Utc::now();
    let sig = &headers[2].1;
    let tag: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(&sig[3..])
        .unwrap()
        .try_into()
        .unwrap();
    let key = base64::engine::general_purpose::STANDARD
        .decode(&VERIFY_SECRET[6..])
        .unwrap();
    let (id, ts) = (headers[0].1.clone(), t.to_string());
    Ok(verify_pair(
        ctx,
        "verify::StandardWebhooks",
        "bare HMAC-SHA256",
        40_000,
        || v.verify(black_box(&headers), black_box(&body), now).is_ok(),
        || {
            bare_hmac(
                &key,
                &[id.as_bytes(), b".", ts.as_bytes(), b".", black_box(&body)],
                &tag,
            )
        },
    ))
}

pub(crate) fn verify_github_4k(ctx: &Ctx) -> Result<Report, Skip> {
    use webhook_guard::verify::{GitHub, Verifier};
    let body = body_4k();
    let gh = GitHub::new([VERIFY_SECRET]).expect("secret");
    let sig = gh.sign(&body);
    let headers = [
        ("x-hub-signature-256", sig.as_str()),
        ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
    ];
    let tag: [u8; 32] = hex::decode(&sig[7..]).unwrap().try_into().unwrap();
    let now = Utc::now();
    Ok(verify_pair(
        ctx,
        "verify::GitHub",
        "bare HMAC-SHA256",
        40_000,
        || {
            gh.verify(black_box(&headers), black_box(&body), now)
                .is_ok()
        },
        || bare_hmac(VERIFY_SECRET.as_bytes(), &[black_box(&body)], &tag),
    ))
}
