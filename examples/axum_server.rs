//! A complete axum server receiving webhooks: copy it and swap in your store,
//! verifier and handler.
//!
//! ```text
//! PORT=3000 WEBHOOK_SECRET=a-random-secret-of-32-characters cargo run --example axum_server --features axum
//! ```
//!
//! Then send a signed delivery (the signature is the hex HMAC-SHA256 of the body):
//!
//! ```text
//! body='{"id":"evt_1","type":"charge.succeeded"}'
//! sig=$(printf %s "$body" | openssl dgst -sha256 -hmac a-random-secret-of-32-characters -hex | cut -d' ' -f2)
//! curl -i localhost:3000/webhooks -H "X-Signature: $sig" -d "$body"
//! ```
//!
//! Send it twice: the second answer is `duplicate` and the handler does not run again.

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use webhook_guard::integrations::axum::guarded;
use webhook_guard::verify::HmacSha256Header;
use webhook_guard::{EventId, HandlerError, MemoryStore, OwnedEvent, WebhookGuard};

/// Your side effects, run once per event id with a verified body.
async fn on_event(event: OwnedEvent) -> Result<(), HandlerError> {
    let payload: serde_json::Value = event.json()?;
    println!(
        "event {} (attempt {}): {}",
        event.id(),
        event.attempt(),
        payload["type"]
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::var("WEBHOOK_SECRET")
        .unwrap_or_else(|_| "a-random-secret-of-32-characters".into());
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);

    let guard = WebhookGuard::builder()
        .namespace("payments")
        // A MemoryStore forgets on restart and is not shared between replicas: use a
        // database-backed store in production.
        .store(MemoryStore::new())
        .verifier(HmacSha256Header::new("X-Signature", [secret])?)
        .event_id(EventId::json_field(["id"]))
        .max_body(256 * 1024)
        .build()?;

    // Purges expired records and reports stuck leases in the background.
    let sweeper = guard.sweeper().interval(Duration::from_secs(60)).spawn();

    let app = Router::new()
        .route("/webhooks", guarded(guard, on_event))
        .route("/healthz", get(|| async { "ok" }));

    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
            println!("shutting down");
        })
        .await?;
    sweeper.shutdown().await;
    Ok(())
}
