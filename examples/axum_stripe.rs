//! A complete Stripe webhook endpoint on axum: copy it, keep the guard, replace
//! the routed handlers (`payment_succeeded`, `subscription_deleted`, `other_event`)
//! with your side effects.
//!
//! ```text
//! STRIPE_WEBHOOK_SECRET=whsec_... \
//! WEBHOOK_GUARD_STORE=sqlite:webhooks.db \
//! PORT=3000 \
//! cargo run --example axum_stripe --features axum,sqlite
//! ```
//!
//! `WEBHOOK_GUARD_STORE` picks the store (default `memory:`, which forgets on
//! restart and is not shared between replicas): `sqlite:PATH` (feature `sqlite`),
//! `postgres://user:pass@host/db` (`postgres`), `mysql://...` (`mysql`) or
//! `redis://host:6379` (`redis`). The table is created at start-up if missing.
//!
//! Send a signed test delivery (the same event twice: the second is a duplicate):
//!
//! ```text
//! cargo run --features cli -- send --provider stripe --secret "$STRIPE_WEBHOOK_SECRET" \
//!     --url http://127.0.0.1:3000/webhooks/stripe --duplicates 1
//! ```
//!
//! or with curl and openssl:
//!
//! ```text
//! body='{"id":"evt_test_1","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","amount":2000,"currency":"usd"}}}'
//! t=$(date +%s)
//! sig=$(printf '%s' "$t.$body" | openssl dgst -sha256 -hmac "$STRIPE_WEBHOOK_SECRET" -hex | sed 's/^.* //')
//! curl -i http://127.0.0.1:3000/webhooks/stripe \
//!     -H "Stripe-Signature: t=$t,v1=$sig" -H 'Content-Type: application/json' --data-binary "$body"
//! ```

use std::time::Duration;

use axum::routing::get;
use webhook_guard::integrations::axum::guarded;
use webhook_guard::route::Router;
use webhook_guard::store::{self, Migration};
use webhook_guard::verify::Stripe;
use webhook_guard::{HandlerError, OwnedEvent, WebhookGuard};

/// A Stripe event, with the part of its `data.object` a handler reads. Only the
/// fields named are read: a new field in a new API version changes nothing.
#[derive(serde::Deserialize)]
struct StripeEvent<T> {
    data: EventData<T>,
}

#[derive(serde::Deserialize)]
struct EventData<T> {
    object: T,
}

#[derive(serde::Deserialize)]
struct PaymentIntent {
    id: String,
    amount: u64,
    currency: String,
}

#[derive(serde::Deserialize)]
struct Subscription {
    id: String,
    customer: String,
}

// Your side effects: each runs once per Stripe event id, with a verified body
// deserialized into its type.
//
// Stripe waits 5 seconds for an answer: hand long work to a queue (or to
// `WebhookGuard::accept` and a worker) instead of doing it here. Return an error to
// have Stripe retry; the guard escalates after repeated failures.

/// `payment_intent.succeeded`: fulfil the order.
async fn payment_succeeded(
    event: StripeEvent<PaymentIntent>,
    meta: OwnedEvent,
) -> Result<(), HandlerError> {
    let intent = event.data.object;
    let (id, amount, currency) = (intent.id, intent.amount, intent.currency);
    println!("fulfil order for {id}: {amount} {currency} ({})", meta.id());
    Ok(())
}

/// `customer.subscription.deleted`: end the subscription.
async fn subscription_deleted(
    event: StripeEvent<Subscription>,
    _meta: OwnedEvent,
) -> Result<(), HandlerError> {
    let subscription = event.data.object;
    let (id, customer) = (subscription.id, subscription.customer);
    println!("end subscription {id} of {customer}");
    Ok(())
}

/// Every other type: answered 200, so Stripe does not retry events no code here
/// handles (the router counts them, with feature `metrics`).
async fn other_event(event: OwnedEvent) -> Result<(), HandlerError> {
    // `{:?}` escapes the type: it comes from the delivery.
    println!("ignoring {:?} ({})", event.event_type(), event.id());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::var("STRIPE_WEBHOOK_SECRET")
        .map_err(|_| "set STRIPE_WEBHOOK_SECRET to the endpoint's signing secret (whsec_...)")?;
    let store_url = std::env::var("WEBHOOK_GUARD_STORE").unwrap_or_else(|_| "memory:".into());
    let port: u16 = match std::env::var("PORT") {
        Ok(p) => p.parse().map_err(|_| "PORT must be a port number")?,
        Err(_) => 3000,
    };

    // The URL may hold a password: report the kind of store, never the URL.
    let opened = store::open(&store_url).await?;
    if let Migration::Applied { table } = opened.migrate().await? {
        println!("{} store ready (table {table})", opened.backend());
    } else {
        println!("{} store ready", opened.backend());
    }

    let guard = WebhookGuard::builder()
        .namespace("stripe")
        .store(opened.shared())
        // Verifies `Stripe-Signature` over the raw body (300 s tolerance) and takes
        // the event id from the body's `id`. Retention defaults to Stripe's 72 h.
        .verifier(Stripe::new([secret])?)
        .max_body(512 * 1024)
        .build()?;

    // Purges records past retention and reports stuck leases, every minute.
    let sweeper = guard.sweeper().interval(Duration::from_secs(60)).spawn();

    // The Stripe preset tells the guard where the type is (`type`); a payload that
    // does not fit its handler's type is retried (`InvalidPayload::Retry`, the
    // default) so that a deploy can fix the type before the guard escalates.
    let webhooks = Router::new()
        .on("payment_intent.succeeded", payment_succeeded)
        .on("customer.subscription.deleted", subscription_deleted)
        .fallback(other_event)
        .into_handler();

    let app = axum::Router::new()
        .route("/webhooks/stripe", guarded(guard.clone(), webhooks))
        .route("/healthz", get(|| async { "ok" }));

    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // In-flight deliveries have been answered; handlers whose provider hung up (or
    // that were answered at the deadline) may still run: give them 20 s to finish
    // and record. Any still running are taken over after their lease.
    let running = guard.drain(Duration::from_secs(20)).await;
    if running > 0 {
        eprintln!("{running} handlers still running at shutdown");
    }
    sweeper.shutdown().await;
    println!("stopped");
    Ok(())
}

/// Ctrl-C, or SIGTERM (what container runtimes send) on Unix.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    println!("shutting down: finishing in-flight deliveries");
}
