//! Checks one recorded webhook delivery against a provider preset.
//!
//! ```text
//! cargo run --example verify -- --provider stripe --secret whsec_... \
//!     --header 'Stripe-Signature: t=...,v1=...' --body-file body.json [--now 1700000000]
//! ```
//!
//! Prints `ok <event id>` and exits 0 when the delivery verifies (`handshake
//! <name>: <answer>` for a provider's handshake); prints `rejected: <reason>
//! (<code>)` and exits 1 when it does not; exits 2 on a usage error.
//!
//! Schemes that sign the request line take it too: `--url` is the public URL
//! Twilio or HubSpot call (without query), `--method` and `--target` the request's
//! method and path-and-query as received (`--target '/sms?bodySHA256=...'`, or
//! `--method GET --target '/meta?hub.mode=...'`). For discord, `--secret` is the
//! application's public key (hex).
//!
//! For `square`, whose signature covers the notification URL, add `--url <URL>` (as
//! configured at Square); for `sendgrid`, `--secret` is the public verification key;
//! for `gitlab`, the secret token.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use webhook_guard::verify::Provider;
use webhook_guard::RequestHead;

const USAGE: &str = "usage: verify --provider <stripe|standard|github|shopify|slack|jamm|paddle|linear|\
square|sendgrid|adyen|mailgun|intercom|gitlab|typeform|calendly|dropbox|zoom|meta|twitch|discord|twilio|hubspot> \
--secret <s> [--secret <s2> ...] [--header 'Name: value' ...] --body-file <path> [--now <unix seconds>] \
[--url <public URL>] [--method <METHOD>] [--target <path?query>]";

struct Args {
    provider: Provider,
    secrets: Vec<String>,
    headers: Vec<(String, String)>,
    body_file: String,
    now: Option<DateTime<Utc>>,
    url: Option<String>,
    method: Option<String>,
    target: Option<String>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut provider, mut body_file, mut now) = (None, None, None);
    let (mut url, mut method, mut target) = (None, None, None);
    let (mut secrets, mut headers) = (Vec::new(), Vec::new());
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--provider" => {
                provider = Some(value()?.parse::<Provider>().map_err(|e| e.to_string())?)
            }
            "--secret" => secrets.push(value()?),
            "--header" => {
                let text = value()?;
                let (name, val) = text
                    .split_once(':')
                    .ok_or_else(|| format!("header `{text}` is not `Name: value`"))?;
                headers.push((name.trim().to_owned(), val.trim().to_owned()));
            }
            "--body-file" => body_file = Some(value()?),
            "--url" => url = Some(value()?),
            "--method" => method = Some(value()?),
            "--target" => target = Some(value()?),
            "--now" => {
                let text = value()?;
                let secs: i64 = text
                    .parse()
                    .map_err(|_| format!("--now `{text}` is not Unix seconds"))?;
                now = Some(DateTime::from_timestamp(secs, 0).ok_or("--now is out of range")?);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if secrets.is_empty() {
        return Err("at least one --secret is required".into());
    }
    Ok(Args {
        provider: provider.ok_or("--provider is required")?,
        secrets,
        headers,
        body_file: body_file.ok_or("--body-file is required")?,
        now,
        url,
        method,
        target,
    })
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("verify: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let body = match std::fs::read(&args.body_file) {
        Ok(body) => body,
        Err(e) => {
            eprintln!("verify: cannot read {}: {e}", args.body_file);
            return ExitCode::from(2);
        }
    };
    let built = match &args.url {
        Some(url) => args.provider.verifier_with_url(url, args.secrets),
        None => args.provider.verifier(args.secrets),
    };
    let verifier = match built {
        Ok(v) => v,
        Err(e) => {
            let hint = if e == webhook_guard::verify::KeyError::NeedsUrl {
                " (give it with --url)"
            } else {
                ""
            };
            eprintln!("verify: cannot verify {}: {e}{hint}", args.provider);
            return ExitCode::from(2);
        }
    };
    let now = args.now.unwrap_or_else(Utc::now);
    let method = args.method.as_deref().unwrap_or("POST");
    let verified = match &args.target {
        Some(target) => verifier.verify(
            &RequestHead::new(&args.headers[..], method, target),
            &body,
            now,
        ),
        None => verifier.verify(&args.headers, &body, now),
    };
    match verified {
        Ok(verified) => {
            // Values from the delivery are printed escaped.
            match (verified.handshake, verified.event_id) {
                (Some(h), _) => println!("handshake {}: {}", h.name, h.body.escape_debug()),
                (None, Some(id)) => println!("ok {}", id.escape_debug()),
                (None, None) => println!("ok"),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("rejected: {e} ({})", e.code());
            ExitCode::from(1)
        }
    }
}
