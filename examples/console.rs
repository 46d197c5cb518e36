//! A Stripe endpoint and the operator console on one axum server, with an inbox
//! worker so that dead letters exist.
//!
//! ```text
//! CONSOLE_PASSWORD='a long password' STRIPE_WEBHOOK_SECRET=whsec_test \
//!     cargo run --example console --features console
//! ```
//!
//! Then open <http://127.0.0.1:3000/admin/webhooks> (user `ops`, the password
//! above) and send test deliveries with the CLI (`--features cli`):
//!
//! ```text
//! export WEBHOOK_GUARD_SECRET=whsec_test
//! webhook-guard send --provider stripe --url http://127.0.0.1:3000/webhooks/stripe          # processed
//! webhook-guard send --provider stripe --url http://127.0.0.1:3000/webhooks/stripe --body-file fail.json --duplicates 4
//! webhook-guard send --provider stripe --url http://127.0.0.1:3000/webhooks/stripe/inbox    # stored, then run by the worker
//! ```
//!
//! What the handlers do, by the event's `type`, so every state can be made:
//! - `/webhooks/stripe` runs the handler in the request: `test.fail` fails
//!   (retryable: answered 500, escalated at the fifth delivery), `test.permanent`
//!   fails for good, anything else succeeds.
//! - `/webhooks/stripe/inbox` stores the event and answers 200; the worker runs it
//!   once (no retries): `test.outage` fails the first time an id is run (the
//!   downstream was down), so it lands in the dead letters, and succeeds when an
//!   operator requeues it.
//!
//! `ADDR` sets where it listens (default `127.0.0.1:3000`); the first line it
//! prints is `listening on http://ADDR`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use webhook_guard::console::{Auth, Console};
use webhook_guard::inbox::{InboxEvent, RetryPolicy};
use webhook_guard::integrations::axum::guarded;
use webhook_guard::verify::Stripe;
use webhook_guard::{HandlerError, MemoryStore, OwnedEvent, WebhookGuard};

/// The event's `type`, for the test behaviours above.
fn event_type(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The handler run in the provider's request.
async fn on_event(event: OwnedEvent) -> Result<(), HandlerError> {
    match event_type(event.body()).as_str() {
        "test.fail" => Err(HandlerError::retryable(format!(
            "ledger service answered 503 for {}",
            event.id()
        ))),
        "test.permanent" => Err(HandlerError::permanent(
            "customer cus_123 does not exist in this account",
        )),
        _ => Ok(()),
    }
}

/// The inbox route: store, answer 200, let the worker run it.
async fn accept(
    State(guard): State<WebhookGuard>,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let outcome = guard.accept(&headers, &body).await;
    guard.respond(outcome)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The console's audit lines (target `webhook_guard::console::audit`) on stdout.
    tracing_subscriber::fmt()
        .with_target(true)
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    let secret = std::env::var("STRIPE_WEBHOOK_SECRET")
        .unwrap_or_else(|_| "whsec_test0000000000000000000000000000".into());
    let password = std::env::var("CONSOLE_PASSWORD")
        .map_err(|_| "set CONSOLE_PASSWORD (at least 12 characters) for the console's user ops")?;
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());

    let store = MemoryStore::new();
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store)
        .verifier(Stripe::new([secret])?)
        .namespace("stripe")
        .build()?;

    // The worker: one attempt per event, so a failure is a dead letter at once.
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let worker = guard
        .worker(move |event: InboxEvent| {
            let seen = seen.clone();
            async move {
                let first = seen.lock().unwrap().insert(event.id.clone());
                if event_type(&event.payload) == "test.outage" && first {
                    return Err(HandlerError::retryable(
                        "warehouse API unreachable: connection refused",
                    ));
                }
                println!("worker processed {:?}", event.id);
                Ok(())
            }
        })?
        .retry_policy(RetryPolicy::exponential(
            1,
            Duration::from_secs(1),
            Duration::from_secs(1),
        ))
        .poll_interval(Duration::from_millis(100))
        .spawn();

    let console = Console::new(guard.clone())
        .show_bodies(true)
        .router(Auth::basic("ops", password)?)?;
    let app = Router::new()
        .route("/webhooks/stripe", guarded(guard.clone(), on_event))
        .route(
            "/webhooks/stripe/inbox",
            post(accept).with_state(guard.clone()),
        )
        .nest("/admin/webhooks", console);

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!(
        "console: http://{}/admin/webhooks (user ops)",
        listener.local_addr()?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    worker.shutdown().await;
    Ok(())
}
