//! Square, SendGrid, Adyen, Mailgun, Intercom, GitLab, Typeform, Calendly and
//! Dropbox against deliveries signed and judged by the providers' own SDKs
//! (`scripts/sdk_vectors_b.sh`, run here unless `WG_SDK_VECTORS_B` names its output):
//! every verdict and every event id must be the SDK's. Then what the store adds:
//! Mailgun's token used once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use base64::Engine as _;
use chrono::DateTime;
use webhook_guard::verify::{Provider, Verifier, VerifyError};

/// The providers the vectors must cover.
const PROVIDERS: [&str; 9] = [
    "square", "sendgrid", "adyen", "mailgun", "intercom", "gitlab", "typeform", "calendly",
    "dropbox",
];

/// The vectors file: `WG_SDK_VECTORS_B`, or the script's output written now. A
/// missing tool fails the test: nothing is skipped.
fn vectors() -> Vec<serde_json::Value> {
    let path = match std::env::var_os("WG_SDK_VECTORS_B") {
        Some(path) => PathBuf::from(path),
        None => {
            let path = std::env::temp_dir().join(format!(
                "webhook-guard-sdk-vectors-b-{}.jsonl",
                std::process::id()
            ));
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/sdk_vectors_b.sh");
            let status = Command::new("bash")
                .arg(script)
                .arg(&path)
                .status()
                .expect("bash runs");
            assert!(
                status.success(),
                "scripts/sdk_vectors_b.sh failed: {status}"
            );
            path
        }
    };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn verifier(v: &serde_json::Value) -> Box<dyn Verifier> {
    let provider: Provider = v["provider"].as_str().unwrap().parse().unwrap();
    let secrets: Vec<String> = v["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    let url = v["url"].as_str().unwrap_or("https://unused.example");
    provider.verifier_with_url(url, secrets).unwrap()
}

#[test]
fn every_sdk_verdict_and_id_is_the_presets() {
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for v in vectors() {
        let provider = v["provider"].as_str().unwrap().to_owned();
        if provider == "sendgrid" && !cfg!(feature = "sendgrid") {
            continue;
        }
        let label = format!("{provider} / {}", v["label"].as_str().unwrap());
        let headers: Vec<(String, String)> = v["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h[0].as_str().unwrap().into(), h[1].as_str().unwrap().into()))
            .collect();
        let body = base64::engine::general_purpose::STANDARD
            .decode(v["body"].as_str().unwrap())
            .unwrap();
        let now = DateTime::from_timestamp(v["now"].as_i64().unwrap(), 0).unwrap();
        let sdk_ok = v["sdk_ok"].as_bool().unwrap();
        let result = verifier(&v).verify(&headers, &body, now);
        assert_eq!(result.is_ok(), sdk_ok, "{label}: {result:?}");
        let count = counts.entry(provider).or_default();
        match result {
            Ok(verified) => {
                count.0 += 1;
                let id = verified.event_id.expect("an id");
                if let Some(want) = v["id"].as_str() {
                    assert_eq!(id, want, "{label}");
                } else {
                    let prefix = v["id_prefix"].as_str().expect("an id or its prefix");
                    assert!(id.starts_with(prefix), "{label}: {id}");
                }
            }
            Err(e) => {
                count.1 += 1;
                assert!(
                    matches!(e, VerifyError::NoMatch | VerifyError::NoUsableSignature),
                    "{label}: a tampered twin is refused for its signature, not {e:?}"
                );
            }
        }
    }
    for p in PROVIDERS {
        if p == "sendgrid" && !cfg!(feature = "sendgrid") {
            continue;
        }
        let (ok, refused) = counts.get(p).copied().unwrap_or_default();
        assert!(
            ok >= 12 && refused >= 12,
            "{p}: {ok} accepted, {refused} refused"
        );
    }
}

/// Mailgun signs only `timestamp` + `token`: the token is the id, so a captured
/// signature replayed with other event data finds its token taken, and the handler
/// never runs for it.
#[cfg(feature = "tokio")]
#[tokio::test]
async fn a_mailgun_token_is_used_once_whatever_the_event_data() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use webhook_guard::store::MemoryStore;
    use webhook_guard::verify::Mailgun;
    use webhook_guard::{Outcome, WebhookGuard};

    let mailgun = Mailgun::new(["key-mailgun-signing"]).unwrap();
    let now = chrono::Utc::now().timestamp();
    let token = "e0b5477167110d68991efc6b9f89f0a11066af27834600e123";
    let genuine = mailgun.envelope(now, token, r#"{"event":"delivered","id":"ev-1"}"#);
    let replay = genuine.replace("delivered", "unsubscribed");
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(mailgun.clone())
        .build()
        .unwrap();
    let ran = AtomicUsize::new(0);
    let run = |body: String| {
        let guard = guard.clone();
        let ran = &ran;
        async move {
            guard
                .handle(
                    &[("content-type", "application/json")],
                    body.as_bytes(),
                    |_| async {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    },
                )
                .await
        }
    };
    let first = run(genuine.clone()).await;
    assert!(
        matches!(&first, Outcome::Processed { id } if id == token),
        "{first:?}"
    );
    for body in [genuine, replay] {
        let again = run(body).await;
        assert!(
            matches!(again, Outcome::Duplicate { .. } | Outcome::Conflict { .. }),
            "{again:?}"
        );
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    // A fresh token (Mailgun's next attempt) is a new delivery.
    let next = mailgun.envelope(
        now,
        "f1c6588278221e79aa2a3516346695c21177bf38945711f234",
        "{}",
    );
    assert!(matches!(run(next).await, Outcome::Processed { .. }));
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

/// The `verify` example reads Square's notification URL from `--url`, and refuses
/// Square without it (exit 2, naming the flag).
#[test]
fn the_verify_tool_takes_squares_notification_url() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let body = std::env::temp_dir().join(format!("wg-square-body-{}", std::process::id()));
    std::fs::write(
        &body,
        r#"{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification","event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z","data":{"type":"webhooks","id":"bc368e64-01aa-407e-b46e-3231809b1129"}}"#,
    )
    .unwrap();
    let run = |url: Option<&str>| {
        let mut c = Command::new(env!("CARGO"));
        c.current_dir(&dir)
            .args(["run", "--quiet", "--example", "verify", "--"])
            .args(["--provider", "square", "--secret", "Ibxx_5AKakO-3qeNVR61Dw"])
            .args([
                "--header",
                "x-square-hmacsha256-signature: GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4=",
            ])
            .arg("--body-file")
            .arg(&body);
        if let Some(url) = url {
            c.args(["--url", url]);
        }
        c.output().unwrap()
    };
    let ok = run(Some(
        "https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9",
    ));
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    assert_eq!(
        String::from_utf8_lossy(&ok.stdout).trim(),
        "ok ac3ac95b-f97d-458c-a6e6-18981597e05f"
    );
    let other = run(Some("https://webhook.site/other"));
    assert_eq!(other.status.code(), Some(1), "{other:?}");
    let missing = run(None);
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("--url"));
    let _ = std::fs::remove_file(&body);
}
