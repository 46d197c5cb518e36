//! The guard in any framework, with nothing but `http` types.
//!
//! actix-web, rocket, warp, poem, lambda_http...: every framework hands you the
//! request's headers and lets you read its raw body. Do exactly what `receive`
//! does below: give the guard the headers and the body *as received* (never a
//! re-serialized JSON value — the signature is over the raw bytes), then answer what
//! `guard.answer(&outcome)` says. Cap the body at `guard.max_body()` with your
//! framework's own limit (actix-web `PayloadConfig`, rocket `Limits`, warp
//! `body::content_length_limit`).
//!
//! Run with `cargo run --example plain_http`.

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response};
use webhook_guard::verify::HmacSha256Header;
use webhook_guard::{EventId, HandlerError, MemoryStore, WebhookGuard};

/// One delivery in, one answer out: the whole integration.
async fn receive(guard: &WebhookGuard, request: Request<Vec<u8>>) -> Response<String> {
    let outcome = guard
        // The whole request, not only its headers: a scheme that signs the method or
        // URL (HubSpot, Twilio) or a handshake sent as a GET (Meta) needs them too.
        .handle(&request, request.body(), |event| async move {
            // Your side effects, run once per event id.
            let payload: serde_json::Value = event.json()?;
            println!("  handler: {} ({})", event.id(), payload["type"]);
            if payload["type"] == "invoice.broken" {
                return Err(HandlerError::retryable("the billing service is down"));
            }
            Ok(())
        })
        .await;

    let answer = guard.answer(&outcome);
    // A provider's handshake (Slack's url_verification, Meta's subscription check,
    // ...) is answered with its own status, content type and body.
    if let Some(handshake) = outcome.handshake() {
        return Response::builder()
            .status(answer.status)
            .header(CONTENT_TYPE, handshake.content_type)
            .body(handshake.body.clone())
            .expect("valid response");
    }
    let mut response = Response::builder()
        .status(answer.status)
        .header(CONTENT_TYPE, "application/json");
    if let Some(seconds) = answer.retry_after {
        response = response.header(RETRY_AFTER, seconds);
    }
    // A short machine-readable reason; never the error text or the payload.
    let body = serde_json::json!({ "outcome": outcome.kind().as_str(), "reason": answer.reason });
    response.body(body.to_string()).expect("valid response")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let verifier = HmacSha256Header::new("X-Signature", ["a-random-secret-of-32-characters"])?;
    let guard = WebhookGuard::builder()
        .namespace("billing")
        .store(MemoryStore::new())
        .verifier(verifier.clone())
        .event_id(EventId::json_field(["id"]))
        .build()?;

    let deliveries = [
        (r#"{"id":"evt_1","type":"invoice.paid"}"#, true),
        (r#"{"id":"evt_1","type":"invoice.paid"}"#, true), // the provider retries
        (r#"{"id":"evt_2","type":"invoice.paid"}"#, false), // forged
        (r#"{"id":"evt_3","type":"invoice.broken"}"#, true),
    ];
    for (body, signed) in deliveries {
        let signature = if signed {
            verifier.sign(body.as_bytes())
        } else {
            "00".repeat(32)
        };
        let request = Request::post("/webhooks")
            .header("X-Signature", signature)
            .body(body.as_bytes().to_vec())?;
        println!("POST {body}");
        let response = receive(&guard, request).await;
        println!("  -> {} {}", response.status(), response.body());
    }
    Ok(())
}
