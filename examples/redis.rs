//! A webhook receiver deduplicating on Redis: the same delivery twice runs the
//! handler once.
//!
//! ```text
//! WEBHOOK_GUARD_REDIS_URL=redis://127.0.0.1:6379 cargo run --example redis --features redis
//! ```

use std::time::Duration;

use serde::Deserialize;
use webhook_guard::store::RedisStore;
use webhook_guard::verify::HmacSha256Header;
use webhook_guard::{EventId, HandlerError, Outcome, WebhookGuard};

#[derive(Debug, Deserialize)]
struct Payment {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    amount: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("WEBHOOK_GUARD_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    // One store per process, shared by every guard: one multiplexed connection that
    // reconnects by itself. Give each application its own prefix.
    let store = RedisStore::builder()
        .prefix("example:webhooks")
        .connect(url.as_str())
        .await?;

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
    let body = format!(r#"{{"id":"{id}","type":"payment.succeeded","amount":4200}}"#);
    let signature = verifier.sign(body.as_bytes());
    let headers = [("X-Signature", signature.as_str())];

    for delivery in ["first delivery", "duplicate"] {
        let outcome = guard
            .handle(&headers, body.as_bytes(), |event| async move {
                let payment: Payment = event.json().map_err(HandlerError::permanent)?;
                println!(
                    "  handler: booking {} of {} cents ({}, attempt {})",
                    payment.id,
                    payment.amount,
                    payment.kind,
                    event.attempt()
                );
                Ok(())
            })
            .await;
        let answer = guard.answer(&outcome);
        println!("{delivery}: {:?} -> HTTP {}", outcome.kind(), answer.status);
        if let Outcome::StoreUnavailable { .. } = outcome {
            eprintln!("Redis is unreachable: the provider will retry");
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
