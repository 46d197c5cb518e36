//! A Stripe webhook endpoint on AWS Lambda, behind API Gateway (REST or HTTP API), a
//! Function URL or an ALB: copy it, keep the guard, replace `on_event` with your
//! side effects.
//!
//! ```text
//! cargo lambda build --release --example lambda_stripe --features lambda,dynamodb
//! ```
//!
//! Environment: `STRIPE_WEBHOOK_SECRET` (the endpoint's signing secret) and
//! `WEBHOOK_GUARD_STORE`, a store every instance of the function shares:
//! `dynamodb://TABLE` (feature `dynamodb`; create the table once with
//! `webhook-guard migrate`), `redis://…` (`redis`) or `postgres://…` (`postgres`).
//! The default, `memory:`, is for trying it out locally only (`cargo lambda watch`):
//! each Lambda instance would keep its own records.
//!
//! Each delivery's claim lasts no longer than its invocation: set the function's
//! timeout below Stripe's 5 seconds' wait, so that a slow invocation is retried by
//! Stripe and its retry finds the event id free once the invocation's time is up.

use webhook_guard::integrations::lambda;
use webhook_guard::store;
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

/// Your side effects: run once per Stripe event id, with a verified body, inside
/// the invocation. Return an error to have Stripe retry.
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

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    let secret = std::env::var("STRIPE_WEBHOOK_SECRET")
        .map_err(|_| "set STRIPE_WEBHOOK_SECRET to the endpoint's signing secret (whsec_...)")?;
    let store_url = std::env::var("WEBHOOK_GUARD_STORE").unwrap_or_else(|_| "memory:".into());
    // Opened once per cold start, and reused by every invocation of the instance.
    // The URL may hold a password: errors name the kind of store, never the URL.
    let opened = store::open(&store_url).await?;

    let guard = WebhookGuard::builder()
        .namespace("stripe")
        .store(opened.shared())
        // Verifies `Stripe-Signature` over the raw body (base64-encoded events
        // decoded first) and takes the event id from the body's `id`.
        .verifier(Stripe::new([secret])?)
        .max_body(512 * 1024)
        .build()?;

    lambda_http::run(lambda::guarded(guard, on_event)).await
}
