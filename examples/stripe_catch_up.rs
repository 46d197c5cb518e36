//! Recover the Stripe events your endpoint never received: list them from
//! Stripe's List Events (`delivery_success=false`) and run each through the same
//! guard, store and handler as the webhook route, so an event that arrives both
//! ways runs the handler once.
//!
//! ```text
//! STRIPE_API_KEY=sk_test_... WEBHOOK_GUARD_SQLITE_PATH=webhooks.db \
//!   cargo run --example stripe_catch_up --features stripe-catch-up,sqlite
//! ```
//!
//! One pass, then a report; in a server, `task.spawn()` beside the webhook
//! route (`examples/axum_stripe.rs`, on the same store and namespace) runs a pass
//! every minute, and `handle.shutdown().await` stops it. `STRIPE_API_BASE`
//! points the source at another server (`http://` only to this machine). The
//! cursor is kept in the SQLite file: a second run goes on where the first
//! stopped.

use webhook_guard::catch_up::stripe::StripeEvents;
use webhook_guard::catch_up::CatchUp;
use webhook_guard::store::SqliteStore;
use webhook_guard::verify::Stripe;
use webhook_guard::{HandlerError, OwnedEvent, WebhookGuard};

/// The webhook route's handler, shared by the catch-up task.
async fn on_event(event: OwnedEvent) -> Result<(), HandlerError> {
    let payload: serde_json::Value = event.json()?;
    let kind = payload["type"].as_str().unwrap_or("?");
    println!("recovered {} ({kind})", event.id());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(api_key) = std::env::var("STRIPE_API_KEY") else {
        eprintln!("set STRIPE_API_KEY: a secret key, or a restricted key allowed to read events");
        std::process::exit(2);
    };
    let secret = std::env::var("STRIPE_WEBHOOK_SECRET")
        .unwrap_or_else(|_| "whsec_test0000000000000000000000000000".into());
    let path = std::env::var_os("WEBHOOK_GUARD_SQLITE_PATH")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("webhook-guard-catch-up.db"));

    // The same guard as the webhook route's: same store, same namespace.
    let guard = WebhookGuard::builder()
        .store(SqliteStore::open(&path).await?)
        .verifier(Stripe::new([secret])?)
        .namespace("stripe")
        .build()?;

    let mut source = StripeEvents::builder(api_key);
    if let Ok(base) = std::env::var("STRIPE_API_BASE") {
        source = source.base_url(base);
    }
    let task = CatchUp::new(guard, source.build()?, on_event);

    let report = task.run_once().await?;
    println!(
        "pages {}, listed {}, processed {}, already done {}, not settled {}, caught up: {}",
        report.pages,
        report.listed,
        report.processed,
        report.duplicates,
        report.unsettled,
        report.caught_up
    );
    println!("cursor kept in {}: {:?}", path.display(), report.cursor);
    Ok(())
}
