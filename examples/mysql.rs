//! A webhook receiver that keeps its deduplication records in MySQL / MariaDB and
//! records a payment in the same database, once per event.
//!
//! ```text
//! WEBHOOK_GUARD_MYSQL_URL=mysql://root@127.0.0.1:3306/test cargo run --example mysql --features mysql
//! ```

use webhook_guard::store::mysql::sqlx::{self, mysql::MySqlPool};
use webhook_guard::store::MySqlStore;
use webhook_guard::verify::HmacSha256Header;
use webhook_guard::{EventId, HandlerError, Outcome, WebhookGuard};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("WEBHOOK_GUARD_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let pool = MySqlPool::connect(&url).await?;

    // The guard's table, created once (idempotent), and the application's own.
    let store = MySqlStore::new(pool.clone()).with_table("example_webhook_records")?;
    store.migrate().await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS example_payments (
             event_id VARBINARY(255) PRIMARY KEY,
             amount   BIGINT NOT NULL
         )",
    )
    .execute(&pool)
    .await?;

    let verifier = HmacSha256Header::new("X-Signature", ["example-secret-0123456789abcdef"])?;
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(verifier.clone())
        .event_id(EventId::json_field(["id"]))
        .namespace("payments")
        .build()?;

    // A delivery as the provider would send it, with a fresh event id per run.
    let id = format!("evt_{}", chrono::Utc::now().timestamp_micros());
    let body = format!(r#"{{"id":"{id}","type":"payment.succeeded","amount":4200}}"#);
    let signature = verifier.sign(body.as_bytes());
    let headers = [("X-Signature", signature.as_str())];

    for delivery in ["first delivery", "provider retry"] {
        let pool = pool.clone();
        let outcome = guard
            .handle(&headers, body.as_bytes(), |event| async move {
                let amount = 4200_i64;
                sqlx::query("INSERT INTO example_payments (event_id, amount) VALUES (?, ?)")
                    .bind(event.id())
                    .bind(amount)
                    .execute(&pool)
                    .await
                    .map_err(|e| HandlerError::Retryable(e.into()))?;
                println!("  handler: recorded payment of {amount} for {}", event.id());
                Ok(())
            })
            .await;
        let answer = guard.answer(&outcome);
        let what = match &outcome {
            Outcome::Processed { .. } => "processed",
            Outcome::Duplicate { .. } => "duplicate (handler not run)",
            Outcome::StoreUnavailable { .. } => "store unavailable",
            _ => "other",
        };
        println!("{delivery}: {what}, answer {}", answer.status);
    }

    let rec = guard.inspect(&id).await?.expect("recorded");
    println!(
        "record {}/{}: {:?}, {} attempt(s)",
        rec.namespace, rec.id, rec.state, rec.attempts
    );
    Ok(())
}
