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
