//! A complete Stripe webhook endpoint on actix-web: copy it, keep the guard, replace
//! `on_event` with your side effects.
//!
//! ```text
//! STRIPE_WEBHOOK_SECRET=whsec_... \
//! WEBHOOK_GUARD_STORE=sqlite:webhooks.db \
//! PORT=3000 \
//! cargo run --example actix_stripe --features actix,sqlite
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

use std::time::Duration;

use actix_web::{web, App, HttpServer};
use webhook_guard::integrations::actix::guarded;
use webhook_guard::store::{self, Migration};
use webhook_guard::verify::Stripe;
use webhook_guard::{HandlerError, OwnedEvent, WebhookGuard};

/// The part of a Stripe event this endpoint reads.
#[derive(serde::Deserialize)]
struct StripeEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    data: EventData<'a>,
}

#[derive(serde::Deserialize)]
struct EventData<'a> {
    #[serde(borrow)]
    object: &'a serde_json::value::RawValue,
}

/// Your side effects: run once per Stripe event id, with a verified body.
///
/// Stripe waits 5 seconds for an answer; the Stripe preset answers `InProgress` at
/// 4 s while a slower handler runs on. Return an error to have Stripe retry; the
/// guard escalates after repeated failures.
async fn on_event(event: OwnedEvent) -> Result<(), HandlerError> {
    let parsed: StripeEvent<'_> = event.json()?;
    match parsed.kind {
        "payment_intent.succeeded" => {
            println!("fulfil order for {}", parsed.data.object.get());
        }
        "customer.subscription.deleted" => {
            println!("end subscription {}", parsed.data.object.get());
        }
        other => println!("ignoring {other} ({})", event.id()),
    }
    Ok(())
}

// `#[tokio::main]` (or `#[actix_web::main]`): handlers run on this runtime, apart
// from actix's worker threads, so that `drain` below can wait for them.
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

    // Built here, on the main runtime, and cloned into each worker's app.
    let stripe = guarded(guard.clone(), on_event);
    let server = HttpServer::new(move || {
        App::new()
            .route("/webhooks/stripe", stripe.route())
            .route("/healthz", web::get().to(|| async { "ok" }))
    })
    .shutdown_signal(shutdown_signal())
    .bind(("0.0.0.0", port))?;
    println!("listening on http://{}", server.addrs()[0]);
    server.run().await?;
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
