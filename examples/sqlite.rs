//! A signed payment webhook received twice through a guard on SQLite: the first
//! delivery runs the handler, the provider's retry is answered as a duplicate.
//!
//! ```text
//! WEBHOOK_GUARD_SQLITE_PATH=/tmp/webhooks.db cargo run --example sqlite --features sqlite
//! ```
//!
//! The file survives restarts: a retry that arrives after a deploy is still
//! recognised. Every process on the host may open the same file.

use serde::Deserialize;
use webhook_guard::store::SqliteStore;
use webhook_guard::verify::{Encoding, HmacSha256Header};
use webhook_guard::{EventId, HandlerError, WebhookGuard};

const SECRET: &str = "sqlite-example-secret-0123456789";

#[derive(Deserialize)]
struct PaymentEvent<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    amount: u64,
    currency: &'a str,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::var_os("WEBHOOK_GUARD_SQLITE_PATH")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("webhook-guard-example.db"));
    let store = SqliteStore::open(&path).await?; // creates the file and the table
    println!("store: SQLite, file {}", path.display());

    let verifier = HmacSha256Header::new("X-Signature", [SECRET])?
        .prefix("sha256=")
        .encoding(Encoding::Hex);
    // A fresh id per run, so that every run shows a first delivery.
    let event_id = format!("evt_{}", chrono::Utc::now().timestamp_millis());
    let body = format!(
        r#"{{"id":"{event_id}","type":"payment.succeeded","amount":4200,"currency":"eur"}}"#
    );
    let signature = verifier.sign(body.as_bytes());
    let guard = WebhookGuard::builder()
        .store(store)
        .verifier(verifier)
        .event_id(EventId::json_field(["id"]))
        .namespace("payments")
        .build()?;

    let headers = [("X-Signature", signature.as_str())];
    for delivery in ["first delivery", "provider retry"] {
        let outcome = guard
            .handle(&headers, body.as_bytes(), |event| async move {
                let payment: PaymentEvent<'_> = event.json().map_err(HandlerError::permanent)?;
                println!(
                    "  handler: {} {} — crediting {}.{:02} {}",
                    payment.id,
                    payment.kind,
                    payment.amount / 100,
                    payment.amount % 100,
                    payment.currency.to_uppercase()
                );
                Ok(())
            })
            .await;
        let answer = guard.answer(&outcome);
        println!(
            "{delivery:<15} -> {:?}, HTTP {}",
            outcome.kind(),
            answer.status
        );
    }
    Ok(())
}
