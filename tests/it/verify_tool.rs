//! Runs `examples/verify.rs` as a process: ok, rejected and usage exit codes.

use std::path::PathBuf;
use std::process::{Command, Output};

use webhook_guard::verify::Stripe;

/// The example binary: `cargo test` builds examples into `target/<profile>/examples`.
fn tool() -> Command {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        dir = PathBuf::from(target);
    }
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let bin = dir
        .join(profile)
        .join("examples")
        .join(format!("verify{}", std::env::consts::EXE_SUFFIX));
    if bin.exists() {
        Command::new(bin)
    } else {
        // Fall back to building it through cargo.
        let mut c = Command::new(env!("CARGO"));
        c.args(["run", "--quiet", "--example", "verify", "--"]);
        c
    }
}

fn body_file(name: &str, body: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "webhook-guard-verify-tool-{}-{name}",
        std::process::id()
    ));
    std::fs::write(&path, body).unwrap();
    path
}

fn run(args: &[&str]) -> Output {
    tool().args(args).output().unwrap()
}

const BODY: &[u8] = br#"{"id":"evt_123","type":"charge.succeeded"}"#;

#[test]
fn a_valid_stripe_delivery_prints_ok_and_the_event_id() {
    let file = body_file("ok", BODY);
    let header = format!(
        "Stripe-Signature: {}",
        Stripe::new(["whsec_old00000000000000000000000000000"])
            .unwrap()
            .sign(BODY, 1_700_000_000)
    );
    let out = run(&[
        "--provider",
        "stripe",
        "--secret",
        "whsec_new00000000000000000000000000000",
        "--secret",
        "whsec_old00000000000000000000000000000",
        "--header",
        &header,
        "--body-file",
        file.to_str().unwrap(),
        "--now",
        "1700000100",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok evt_123");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn a_stale_or_forged_delivery_is_rejected_with_exit_1() {
    let file = body_file("rejected", BODY);
    let header = format!(
        "Stripe-Signature: {}",
        Stripe::new(["whsec_a0000000000000000000000000000000"])
            .unwrap()
            .sign(BODY, 1_700_000_000)
    );
    let path = file.to_str().unwrap();
    let stale = run(&[
        "--provider",
        "stripe",
        "--secret",
        "whsec_a0000000000000000000000000000000",
        "--header",
        &header,
        "--body-file",
        path,
        "--now",
        "1700000301",
    ]);
    assert_eq!(stale.status.code(), Some(1));
    let text = String::from_utf8_lossy(&stale.stdout);
    assert!(
        text.starts_with("rejected: timestamp too old") && text.contains("(timestamp_too_old)"),
        "{text}"
    );
    let forged = run(&[
        "--provider",
        "stripe",
        "--secret",
        "whsec_b0000000000000000000000000000000",
        "--header",
        &header,
        "--body-file",
        path,
        "--now",
        "1700000000",
    ]);
    assert_eq!(forged.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&forged.stdout).contains("(signature_mismatch)"));
    assert!(
        !String::from_utf8_lossy(&forged.stdout).contains("whsec_b0000000000000000000000000000000")
    );
    let missing = run(&[
        "--provider",
        "github",
        "--secret",
        "k-0123456789abcdef",
        "--body-file",
        path,
    ]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stdout).contains("(missing_header)"));
}

#[test]
fn usage_errors_exit_2() {
    let file = body_file("usage", BODY);
    let path = file.to_str().unwrap();
    for args in [
        vec![],
        vec!["--provider", "pigeon", "--secret", "s", "--body-file", path],
        vec!["--provider", "stripe", "--body-file", path],
        vec!["--provider", "stripe", "--secret", "s"],
        vec![
            "--provider",
            "stripe",
            "--secret",
            "s",
            "--body-file",
            path,
            "--header",
            "no colon",
        ],
        vec![
            "--provider",
            "stripe",
            "--secret",
            "s",
            "--body-file",
            path,
            "--now",
            "soon",
        ],
        vec![
            "--provider",
            "stripe",
            "--secret",
            "s",
            "--body-file",
            "/nonexistent/body",
        ],
        vec![
            "--provider",
            "standard",
            "--secret",
            "whsec_%%%",
            "--body-file",
            path,
        ],
        vec!["--bogus"],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
}

/// A scheme that signs its URL takes the public URL and the request line, and a
/// handshake prints its answer.
#[test]
fn twilio_takes_the_url_and_target_and_zoom_prints_its_handshake() {
    use webhook_guard::verify::{Twilio, Zoom};
    let form = b"Body=Hello&From=%2B14158675310";
    let twilio = Twilio::new("https://example.com/sms", ["twilio-auth-token"]).unwrap();
    let signature = twilio.sign("https://example.com/sms?tenant=7", form);
    let file = body_file("twilio", form);
    let header = format!("X-Twilio-Signature: {signature}");
    let args = |target: &'static str| {
        run(&[
            "--provider",
            "twilio",
            "--secret",
            "twilio-auth-token",
            "--url",
            "https://example.com/sms",
            "--target",
            target,
            "--header",
            &header,
            "--header",
            "I-Twilio-Idempotency-Token: idem-7",
            "--body-file",
            file.to_str().unwrap(),
        ])
    };
    let ok = args("/internal/sms?tenant=7");
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "ok idem-7");
    let other = args("/internal/sms?tenant=8");
    assert_eq!(other.status.code(), Some(1), "{other:?}");
    // Without --url the preset cannot be built: a usage error.
    let no_url = run(&[
        "--provider",
        "twilio",
        "--secret",
        "t",
        "--body-file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(no_url.status.code(), Some(2), "{no_url:?}");

    let body = br#"{"event":"endpoint.url_validation","payload":{"plainToken":"abc123"}}"#;
    let zoom = Zoom::new(["zoom-secret-token-22ch"]).unwrap();
    let now = 1_700_000_000;
    let file = body_file("zoom", body);
    let headers: Vec<String> = zoom
        .sign_headers(now, body)
        .into_iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    let out = run(&[
        "--provider",
        "zoom",
        "--secret",
        "zoom-secret-token-22ch",
        "--header",
        &headers[0],
        "--header",
        &headers[1],
        "--body-file",
        file.to_str().unwrap(),
        "--now",
        "1700000000",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("handshake zoom_url_validation: {"),
        "{text}"
    );
    assert!(text.contains(r#"\"plainToken\":\"abc123\""#), "{text}");
}
