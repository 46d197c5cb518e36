//! axum 0.8: outcomes as responses, and a guarded route in a few lines.
//!
//! ```no_run
//! use axum::Router;
//! use webhook_guard::integrations::axum::guarded;
//! use webhook_guard::{verify::HmacSha256Header, EventId, MemoryStore, OwnedEvent, WebhookGuard};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let guard = WebhookGuard::builder()
//!     .store(MemoryStore::new())
//!     .verifier(HmacSha256Header::new("X-Signature", ["a-random-secret-of-32-characters"])?)
//!     .event_id(EventId::json_field(["id"]))
//!     .build()?;
//!
//! let app: Router = Router::new().route(
//!     "/webhooks",
//!     guarded(guard, |event: OwnedEvent| async move {
//!         // Runs once per event id, with a verified body.
//!         let payload: serde_json::Value = event.json()?;
//!         println!("{} {}", event.id(), payload["type"]);
//!         Ok(())
//!     }),
//! );
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! A handler that needs application state captures it (an `Arc`, a pool) in the
//! closure. It runs on its own task ([`WebhookGuard::handle_spawned`]): a client
//! that hangs up does not cancel it, its result is recorded, and the provider's
//! retry is a `Duplicate`; with a preset that knows the provider's timeout, a
//! handler still running at four fifths of it is answered `InProgress` (409 +
//! `Retry-After`) while it runs on. The route answers from the [`Outcome`] with the guard's status mapping:
//! see [`GuardResponse`]. A body over the guard's limit is answered 413
//! `body_too_large` without being read whole (see the
//! [module docs](crate::integrations#bodies-over-the-limit)).

use std::convert::Infallible;
use std::future::Future;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;

use super::{read_body, GuardResponse};
use crate::{HandlerError, Outcome, OwnedEvent, WebhookGuard};

impl IntoResponse for GuardResponse {
    fn into_response(self) -> Response {
        self.into_http::<Body>()
    }
}

/// Answers with the **default** status mapping (the table in the crate docs). A guard
/// with status overrides should answer [`WebhookGuard::respond`] instead.
///
/// ```
/// use axum::response::IntoResponse;
/// use webhook_guard::Outcome;
///
/// let response = Outcome::Processed { id: "evt_1".into() }.into_response();
/// assert_eq!(response.status(), 200);
/// ```
impl IntoResponse for Outcome {
    fn into_response(self) -> Response {
        GuardResponse::with_default_answer(self).into_response()
    }
}

/// A `POST` route that runs `handler` once per event id (and answers `GET` too, for
/// a provider's handshake sent as a `GET`: Meta's subscription check; the verifier
/// refuses any other `GET`, 401 by default).
///
/// It reads the raw body (at most [`WebhookGuard::max_body`] bytes, never
/// re-serialized), verifies and claims the delivery, calls `handler` with the
/// verified [`OwnedEvent`] only when this delivery won the claim, records its result
/// and answers with [`WebhookGuard::respond`]. Returning
/// [`HandlerError::retryable`] (or any error, through `?`) answers 500 so the
/// sender retries (200 once the id is escalated, with the escalation hook);
/// [`HandlerError::permanent`] answers 200 and calls the alert hook.
///
/// See the [module docs](self) for an example.
pub fn guarded<F, Fut, S>(guard: WebhookGuard, handler: F) -> MethodRouter<S, Infallible>
where
    F: Fn(OwnedEvent) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    S: Clone + Send + Sync + 'static,
{
    // axum clones the route's closure for every request and calls the clone once,
    // so the closure hands its own guard and handler to the request's future: no
    // second clone of them (a guard's clone writes the reference count that every
    // worker of the host shares).
    let methods = axum::routing::MethodFilter::POST.or(axum::routing::MethodFilter::GET);
    axum::routing::on(methods, move |request: Request| async move {
        handle_request(&guard, request, handler).await
    })
}

/// The body of [`guarded`], for a route that is not a plain `POST`: reads the body
/// of `request` within the guard's limit and runs it through
/// [`WebhookGuard::handle_spawned`] (the handler on its own task: it runs to its
/// end and its result is recorded even if the client hangs up, and the provider is
/// answered by the guard's answer deadline).
///
/// ```
/// use axum::{extract::Request, routing::put, Router};
/// use webhook_guard::{integrations::axum::handle_request, verify::NoVerification};
/// use webhook_guard::{EventId, MemoryStore, WebhookGuard};
///
/// let guard = WebhookGuard::builder()
///     .store(MemoryStore::new())
///     .verifier(NoVerification)
///     .event_id(EventId::header("X-Event-Id"))
///     .build()
///     .unwrap();
/// let app: Router = Router::new().route(
///     "/hooks",
///     put(move |request: Request| async move {
///         handle_request(&guard, request, |_event| async { Ok(()) }).await
///     }),
/// );
/// # drop(app);
/// ```
pub async fn handle_request<F, Fut>(
    guard: &WebhookGuard,
    request: Request,
    handler: F,
) -> GuardResponse
where
    F: FnOnce(OwnedEvent) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    // `handle_spawned` reads the headers before its future first runs: the request's
    // parts go out of scope before the delivery is awaited, so this future does not
    // carry them alongside it (axum boxes it per request; smaller is cheaper).
    let delivery = {
        let (parts, body) = request.into_parts();
        let bytes = match read_body(guard, &parts.headers, body).await {
            Ok(bytes) => bytes,
            Err(response) => return response,
        };
        // The request's head, so that a scheme signing the method or URL (and a
        // handshake sent as a GET) sees them.
        guard.handle_spawned(&parts, bytes, handler)
    };
    let outcome = delivery.await;
    guard.respond(outcome)
}

/// [`handle_request`] for a guard serving many tenants ([`crate::tenant`]): reads
/// the body within the guard's limit, finds the delivery's tenant
/// ([`WebhookGuard::tenant`], with `route_tenant` the tenant the route names, such
/// as axum's `Path` of `/webhooks/stripe/{tenant}`), and runs the delivery through
/// the tenant's guard with [`WebhookGuard::handle_spawned`]. An unknown tenant
/// (404), a mismatch (403) and a resolver that failed (503) are answered without
/// calling the store.
///
/// ```
/// use std::collections::HashMap;
/// use axum::{extract::{Path, Request}, routing::post, Router};
/// use webhook_guard::integrations::axum::handle_tenant_request;
/// use webhook_guard::tenant::Tenants;
/// use webhook_guard::verify::{Secret, Stripe};
/// use webhook_guard::{MemoryStore, WebhookGuard};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let secrets = HashMap::from([("acme".to_owned(), vec![Secret::from("whsec_acme0000000000000000000000000000")])]);
/// let guard = WebhookGuard::builder()
///     .store(MemoryStore::new())
///     .verifier(Stripe::new(["whsec_template000000000000000000000000"])?)
///     .tenants(Tenants::new(secrets))
///     .namespace("stripe")
///     .build()?;
/// let app: Router = Router::new().route(
///     "/webhooks/stripe/{tenant}",
///     post(move |Path(tenant): Path<String>, request: Request| async move {
///         handle_tenant_request(&guard, Some(&tenant), request, |event| async move {
///             println!("{} for {}", event.id(), event.namespace());
///             Ok(())
///         })
///         .await
///     }),
/// );
/// # drop(app);
/// # Ok(())
/// # }
/// ```
pub async fn handle_tenant_request<F, Fut>(
    guard: &WebhookGuard,
    route_tenant: Option<&str>,
    request: Request,
    handler: F,
) -> GuardResponse
where
    F: FnOnce(OwnedEvent) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let (parts, body) = request.into_parts();
    let bytes = match read_body(guard, &parts.headers, body).await {
        Ok(bytes) => bytes,
        Err(response) => return response,
    };
    let tenant = match guard.tenant(route_tenant, &parts.headers, &bytes).await {
        Ok(tenant) => tenant,
        Err(outcome) => return guard.respond(outcome),
    };
    let delivery = tenant.handle_spawned(&parts.headers, bytes, handler);
    drop(parts);
    let outcome = delivery.await;
    tenant.respond(outcome)
}
