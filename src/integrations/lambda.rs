//! AWS Lambda, on `lambda_http` 1: a guarded function behind API Gateway (REST
//! and HTTP APIs), a Function URL or an Application Load Balancer.
//!
//! ```no_run
//! use webhook_guard::integrations::lambda;
//! use webhook_guard::{verify::HmacSha256Header, EventId, MemoryStore, OwnedEvent, WebhookGuard};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_http::Error> {
//!     let guard = WebhookGuard::builder()
//!         .store(MemoryStore::new()) // a shared store in production: DynamoDB, Redis, ...
//!         .verifier(HmacSha256Header::new("X-Signature", ["a-random-secret-of-32-characters"])?)
//!         .event_id(EventId::json_field(["id"]))
//!         .build()?;
//!     lambda_http::run(lambda::guarded(guard, |event: OwnedEvent| async move {
//!         // Runs once per event id, with a verified body.
//!         let payload: serde_json::Value = event.json()?;
//!         println!("{} {}", event.id(), payload["type"]);
//!         Ok(())
//!     }))
//!     .await
//! }
//! ```
//!
//! # The raw body
//!
//! `lambda_http` hands the body over as the event carried it: text as is, and a
//! body the event marks `isBase64Encoded` (API Gateway with binary media types, a
//! Function URL or an ALB given a binary content type) decoded to its bytes. The
//! guard verifies the signature over exactly those bytes, never over a
//! re-serialized payload.
//!
//! # The handler runs inside the invocation
//!
//! Lambda freezes the execution environment once the function has answered, so
//! nothing may run after the answer: the handler runs inside the invocation
//! ([`WebhookGuard::handle_owned_until`]), and the invocation answers when the
//! handler's result is recorded. Keep the function's timeout below the provider's
//! (API Gateway itself gives up after 29 seconds by default).
//!
//! # The claim ends with the invocation
//!
//! The claim's lease ends at the guard's [lease](crate::WebhookGuardBuilder::lease)
//! or at the invocation's deadline (`Context::deadline`), whichever comes first, and
//! a renewal never passes the deadline: an invocation that times out holds the
//! event id no longer than it could run, and the provider's next retry takes the
//! claim over. A request without a Lambda context (or with a zero deadline, as a
//! default `Context` has) keeps the guard's lease.
//!
//! The function answers from the [`Outcome`](crate::Outcome) with the guard's
//! status mapping (see [`GuardResponse`]), as the other integrations do.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use lambda_http::{Body, Request, RequestExt as _, Response, Service};

use super::GuardResponse;
use crate::{HandlerError, OwnedEvent, WebhookGuard};

/// A `lambda_http` service that runs `handler` once per event id: pass it to
/// [`lambda_http::run`].
///
/// For every invocation it takes the raw body, verifies and claims the delivery
/// with the claim's lease capped at the invocation's deadline, calls `handler` with
/// the verified [`OwnedEvent`] only when this delivery won the claim, records its
/// result and answers with [`WebhookGuard::respond`]. Returning
/// [`HandlerError::retryable`] (or any error, through `?`) answers 500 so the
/// sender retries; [`HandlerError::permanent`] answers 200 and calls the alert hook.
/// The service never fails: every outcome is an HTTP answer.
///
/// See the [module docs](self) for an example.
pub fn guarded<F, Fut>(
    guard: WebhookGuard,
    handler: F,
) -> impl Service<
    Request,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
>
where
    F: Fn(OwnedEvent) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    lambda_http::service_fn(move |request: Request| {
        let (guard, handler) = (guard.clone(), handler.clone());
        async move { Ok(handle_request(&guard, request, handler).await) }
    })
}

/// The body of [`guarded`], for a function that routes or answers some requests
/// itself: runs `request` through the guard and answers the response to return.
///
/// ```
/// use lambda_http::{Body, Request};
/// use webhook_guard::{integrations::lambda, verify::NoVerification};
/// use webhook_guard::{EventId, MemoryStore, WebhookGuard};
///
/// async fn function(guard: &WebhookGuard, request: Request) -> lambda_http::Response<Body> {
///     if request.uri().path() != "/webhooks" {
///         let mut not_found = lambda_http::Response::new(Body::Empty);
///         *not_found.status_mut() = http::StatusCode::NOT_FOUND;
///         return not_found;
///     }
///     lambda::handle_request(guard, request, |_event| async { Ok(()) }).await
/// }
/// # let _ = function;
/// ```
pub async fn handle_request<F, Fut>(
    guard: &WebhookGuard,
    request: Request,
    handler: F,
) -> Response<Body>
where
    F: FnOnce(OwnedEvent) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    respond(guard, request, handler).await.into_http::<Body>()
}

/// [`handle_request`], answering the [`GuardResponse`] (the outcome included)
/// rather than the HTTP response made from it.
pub async fn respond<F, Fut>(guard: &WebhookGuard, request: Request, handler: F) -> GuardResponse
where
    F: FnOnce(OwnedEvent) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    let deadline = deadline(&request);
    let (parts, body) = request.into_parts();
    let body = raw_body(body);
    let outcome = match deadline {
        Some(deadline) => (guard.handle_owned_until(&parts, body, deadline, handler)).await,
        None => guard.handle_owned(&parts, body, handler).await,
    };
    guard.respond(outcome)
}

/// The bytes of a body as `lambda_http` decoded it (text and binary bodies
/// without a copy).
fn raw_body(body: Body) -> Bytes {
    match body {
        Body::Empty => Bytes::new(),
        Body::Text(text) => Bytes::from(text),
        Body::Binary(bytes) => Bytes::from(bytes),
        // A kind of body a later `lambda_http` may add: its bytes, copied.
        other => Bytes::copy_from_slice(&other),
    }
}

/// The invocation's deadline, when the request carries a Lambda context with one.
fn deadline(request: &Request) -> Option<DateTime<Utc>> {
    let millis = request.lambda_context_ref()?.deadline;
    if millis == 0 {
        return None;
    }
    DateTime::from_timestamp_millis(i64::try_from(millis).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_is_read_from_the_context_in_milliseconds() {
        let request = Request::new(Body::Empty);
        assert_eq!(deadline(&request), None, "no context");
        let mut context = lambda_http::Context::default();
        let request = Request::new(Body::Empty).with_lambda_context(context.clone());
        assert_eq!(deadline(&request), None, "a zero deadline");
        context.deadline = 1_764_950_400_123;
        let request = Request::new(Body::Empty).with_lambda_context(context);
        let want = DateTime::from_timestamp_millis(1_764_950_400_123).unwrap();
        assert_eq!(deadline(&request), Some(want));
    }

    #[test]
    fn every_body_kind_gives_its_bytes() {
        assert_eq!(raw_body(Body::Empty), Bytes::new());
        assert_eq!(raw_body(Body::Text("{\"a\":1} ".into())), "{\"a\":1} ");
        assert_eq!(
            raw_body(Body::Binary(vec![0, 255, 10])),
            &[0u8, 255, 10][..]
        );
    }
}
