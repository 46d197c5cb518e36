//! Deliveries signed by the providers' own SDKs — twilio (npm and PyPI),
//! @hubspot/api-client, ed25519 signatures checked by discord-interactions and made
//! by PyNaCl, and for Zoom, Meta and Twitch (which ship no signing SDK) their
//! documentation's recipes — over random bodies (unicode, CRLF, pretty and minified
//! JSON, form bodies), each with a tampered twin. `scripts/sdk_vectors.sh` makes
//! them and `scripts/test.sh` passes their files in `WG_SDK_VECTORS`; in CI (`CI`
//! set) a missing file fails.

use std::collections::BTreeMap;

use base64::Engine as _;
use chrono::DateTime;
use serde::Deserialize;
use webhook_guard::verify::{Provider, Verifier};
use webhook_guard::RequestHead;

#[derive(Debug, Deserialize)]
struct Vector {
    provider: String,
    sdk: String,
    secret: String,
    url: Option<String>,
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body_b64: String,
    now: i64,
    expect: String,
    id: Option<String>,
    handshake: Option<String>,
}

fn vectors() -> Option<Vec<Vector>> {
    let paths = match std::env::var("WG_SDK_VECTORS") {
        Ok(paths) if !paths.is_empty() => paths,
        _ if std::env::var_os("CI").is_some() => {
            panic!("WG_SDK_VECTORS is not set: CI runs scripts/sdk_vectors.sh (through scripts/test.sh)")
        }
        _ => {
            eprintln!("SKIPPED: WG_SDK_VECTORS is not set (run scripts/sdk_vectors.sh, or scripts/test.sh)");
            return None;
        }
    };
    let mut all = Vec::new();
    for path in paths.split(':') {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut some: Vec<Vector> = serde_json::from_str(&text).unwrap();
        all.append(&mut some);
    }
    Some(all)
}

fn verifier(v: &Vector) -> Box<dyn Verifier> {
    let provider: Provider = v.provider.parse().unwrap();
    match &v.url {
        Some(url) => provider.verifier_with_url(url, [v.secret.as_str()]),
        None => provider.verifier([v.secret.as_str()]),
    }
    .unwrap_or_else(|e| panic!("{}: {e}", v.provider))
}

#[test]
fn sdk_signed_deliveries_verify_and_their_tampered_twins_do_not() {
    let Some(vectors) = vectors() else { return };
    let mut seen: BTreeMap<(String, String, &str), usize> = BTreeMap::new();
    for v in &vectors {
        let body = base64::engine::general_purpose::STANDARD
            .decode(&v.body_b64)
            .unwrap();
        let head = RequestHead::new(&v.headers[..], &v.method, &v.target);
        let now = DateTime::from_timestamp(v.now, 0).unwrap();
        let result = verifier(v).verify(&head, &body, now);
        let context = || {
            format!(
                "{} ({}) {:?} {:?}",
                v.provider,
                v.sdk,
                v.target,
                String::from_utf8_lossy(&body)
            )
        };
        match v.expect.as_str() {
            "ok" => {
                let verified = result.unwrap_or_else(|e| panic!("{e}: {}", context()));
                match &v.handshake {
                    Some(answer) => {
                        let handshake = verified
                            .handshake
                            .unwrap_or_else(|| panic!("no handshake: {}", context()));
                        // A JSON answer is compared as JSON (its keys in any order).
                        let json = |t: &str| serde_json::from_str::<serde_json::Value>(t).ok();
                        match (json(answer), json(&handshake.body)) {
                            (Some(want), Some(got)) if want.is_object() => {
                                assert_eq!(got, want, "{}", context())
                            }
                            _ => assert_eq!(&handshake.body, answer, "{}", context()),
                        }
                    }
                    None => {
                        assert_eq!(verified.handshake, None, "{}", context());
                        if let Some(id) = &v.id {
                            assert_eq!(verified.event_id.as_ref(), Some(id), "{}", context());
                        }
                        assert!(
                            verified.event_id.is_some() || v.provider == "twilio",
                            "{}",
                            context()
                        );
                    }
                }
            }
            _ => match result {
                Ok(_) => panic!("a tampered twin verified: {}", context()),
                Err(e) => assert_eq!(e.code(), "signature_mismatch", "{}", context()),
            },
        }
        *seen
            .entry((
                v.provider.clone(),
                v.sdk.clone(),
                if v.expect == "ok" { "ok" } else { "reject" },
            ))
            .or_default() += 1;
    }
    // Every preset, from each of its sources, both ways.
    for (provider, sdks) in [
        ("twilio", &["twilio npm", "twilio PyPI"][..]),
        ("hubspot", &["@hubspot/api-client"]),
        ("discord", &["discord-interactions (verifyKey)", "PyNaCl"]),
        ("zoom", &["Zoom docs' recipe"]),
        ("meta", &["Meta docs' recipe"]),
        ("twitch", &["Twitch docs' recipe"]),
    ] {
        for sdk in sdks {
            for way in ["ok", "reject"] {
                let n = seen
                    .get(&(provider.to_owned(), (*sdk).to_owned(), way))
                    .copied();
                assert!(n.unwrap_or(0) >= 10, "{provider} {sdk} {way}: {n:?}");
            }
        }
    }
}
