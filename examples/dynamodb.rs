//! A webhook receiver deduplicating on DynamoDB: the same delivery twice runs the
//! handler once.
//!
//! Credentials and region come from the AWS SDK's standard chain. Against a local
//! DynamoDB-compatible server (such as `moto_server -p 8766`, which takes any
//! credentials):
//!
//! ```text
//! AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 \
//! WEBHOOK_GUARD_DYNAMODB_URL=http://127.0.0.1:8766 \
//!     cargo run --example dynamodb --features dynamodb
//! ```
//!
//! Without `WEBHOOK_GUARD_DYNAMODB_URL` it talks to the region's DynamoDB.

use std::time::Duration;

use serde::Deserialize;
use webhook_guard::store::DynamoDbStore;
use webhook_guard::verify::HmacSha256Header;
use webhook_guard::{EventId, HandlerError, Outcome, WebhookGuard};

#[derive(Debug, Deserialize)]
struct Payment {
    id: String,
    amount: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One store per process, shared by every guard (clones share one SDK client).
    let mut builder = DynamoDbStore::builder("webhook_guard_example");
    if let Ok(endpoint) = std::env::var("WEBHOOK_GUARD_DYNAMODB_URL") {
        builder = builder.endpoint_url(endpoint);
    }
    let store = builder.connect().await?;
    // Idempotent: the table, its `due` index and its time to live. Run it at
    // start-up or from a deployment step (`webhook-guard migrate`).
    store.create_table().await?;

    let verifier = HmacSha256Header::new("X-Signature", ["example-secret-0123456789abcdef"])?;
    let guard = WebhookGuard::builder()
        .store(store)
        .verifier(verifier.clone())
        .event_id(EventId::json_field(["id"]))
        .namespace("payments")
        .lease(Duration::from_secs(60))
        .retention(Duration::from_secs(72 * 3600))
        .build()?;

    // A unique id per run, so that the first delivery really is the first.
    let id = format!("evt_{}", chrono::Utc::now().timestamp_millis());
    let body = format!(r#"{{"id":"{id}","amount":4200}}"#);
    let signature = verifier.sign(body.as_bytes());
    let headers = [("X-Signature", signature.as_str())];

    for delivery in ["first delivery", "duplicate"] {
        let outcome = guard
            .handle(&headers, body.as_bytes(), |event| async move {
                let payment: Payment = event.json().map_err(HandlerError::permanent)?;
                println!(
                    "  handler: booking {} of {} cents",
                    payment.id, payment.amount
                );
                Ok(())
            })
            .await;
        let answer = guard.answer(&outcome);
        println!("{delivery}: {:?} -> HTTP {}", outcome.kind(), answer.status);
        if let Outcome::StoreUnavailable { .. } = outcome {
            eprintln!("DynamoDB is unreachable: the provider will retry");
        }
    }

    if let Some(record) = guard.inspect(&id).await? {
        println!(
            "record: {} after {} attempt(s), kept until {}",
            record.state, record.attempts, record.expires_at
        );
    }
    Ok(())
}
