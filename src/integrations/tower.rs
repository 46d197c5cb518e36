//! A tower [`Layer`] that guards any tower-based service whose request body can be
//! built from `Bytes` (axum routes; a hyper service once its `Incoming` body is
//! mapped, since `Incoming` cannot be) without changing its handler.
//!
//! For each request, [`WebhookGuardService`]:
//!
//! 1. reads the body, at most [`WebhookGuard::max_body`] bytes (see the
//!    [module docs](crate::integrations#bodies-over-the-limit) for larger ones);
//! 2. verifies and claims the delivery ([`WebhookGuard::begin`], given the
//!    request's method and target as well as its headers). A duplicate, a
//!    delivery in progress elsewhere, a rejected delivery, a provider's handshake
//!    (answered as the preset says) or a store outage is answered by the layer
//!    from its [`Outcome`](crate::Outcome), and **the inner service is not
//!    called**;
//! 3. when this delivery won the claim, calls the inner service with the request,
//!    its body rebuilt from the buffered bytes, and the verified [`OwnedEvent`] in
//!    the request's extensions (an axum handler can take
//!    `Extension<OwnedEvent>`, to read the id or renew the lease);
//! 4. reads the inner service's status:
//!
//! | Inner status | Recorded as | Answer |
//! |---|---|---|
//! | 2xx | success ([`Claimed::complete`](crate::guard::Claimed::complete)) | the inner response, with the [`OutcomeKind`](crate::outcome::OutcomeKind) in its extensions |
//! | 5xx, 408, 429 | retryable failure | from the outcome: 500 (with the inner `Retry-After`, if any), or 200 once escalated |
//! | any other (1xx, 3xx, 4xx) | permanent failure (alert hook) | from the outcome: 200 |
//! | the service's `Err` | retryable failure | the error, passed on; 200 once escalated |
//!
//! A 4xx from the inner service means it refused a verified delivery: retrying the
//! same body cannot change that, so it is recorded as a permanent failure and the
//! sender is told to stop (200, with the alert hook called), as for
//! [`HandlerError::permanent`](crate::HandlerError::permanent).
//!
//! So mind the inner service's own refusals of a delivery the guard accepted. An
//! axum extractor keeps its own body limit (`DefaultBodyLimit`, 2 MB unless
//! changed): with a larger [`max_body`](crate::WebhookGuardBuilder::max_body), raise it on
//! the route too, or a delivery between the two limits is refused with 413 and
//! recorded as a permanent failure (answered 200, alert hook called). `Json` refuses
//! a body without `Content-Type: application/json` (415) the same way; take `Bytes`
//! or `String` and parse it yourself when a sender leaves that header out.
//!
//! The work from step 1 on moves to a task of its own if the request's future is
//! dropped (with a runtime, within the guard's
//! [`detached_limit`](crate::WebhookGuardBuilder::detached_limit)): a
//! client that hangs up cancels neither the inner service nor the recording, and
//! the provider's retry finds the event done (`Duplicate`). The layer answers with
//! the inner service's response when it ends: the guard's
//! [answer deadline](crate::WebhookGuardBuilder::answer_deadline) applies to
//! [`guarded`](crate::integrations::axum::guarded) and
//! [`WebhookGuard::handle_spawned`], not to this layer.
//!
//! Layer it on the webhook route only (`route_layer`, or a router that holds only
//! webhook routes): every request through it is treated as a delivery.
//!
//! ```
//! use axum::{routing::post, Router};
//! use webhook_guard::integrations::tower::WebhookGuardLayer;
//! use webhook_guard::{verify::HmacSha256Header, EventId, MemoryStore, WebhookGuard};
//!
//! let guard = WebhookGuard::builder()
//!     .store(MemoryStore::new())
//!     .verifier(HmacSha256Header::new("X-Signature", ["a-random-secret-of-32-characters"]).unwrap())
//!     .event_id(EventId::json_field(["id"]))
//!     .build()
//!     .unwrap();
//!
//! // The handler keeps its usual signature; it runs once per event id.
//! async fn on_event(body: String) -> &'static str {
//!     println!("{body}");
//!     "ok"
//! }
//!
//! let app: Router = Router::new()
//!     .route("/webhooks", post(on_event))
//!     .route_layer(WebhookGuardLayer::new(guard));
//! # drop(app);
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use super::read_body;
use crate::guard::Begin;
use crate::{HandlerError, OwnedEvent, WebhookGuard};

/// Guards the services it wraps: see the [module docs](self).
#[derive(Debug, Clone)]
pub struct WebhookGuardLayer {
    guard: WebhookGuard,
}

impl WebhookGuardLayer {
    /// A layer running every request through `guard`.
    pub fn new(guard: WebhookGuard) -> Self {
        Self { guard }
    }
}

impl<S> Layer<S> for WebhookGuardLayer {
    type Service = WebhookGuardService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WebhookGuardService {
            inner,
            guard: self.guard.clone(),
        }
    }
}

/// The service [`WebhookGuardLayer`] builds around `S`.
#[derive(Debug, Clone)]
pub struct WebhookGuardService<S> {
    inner: S,
    guard: WebhookGuard,
}

impl<S> WebhookGuardService<S> {
    /// Wraps `inner` in `guard`.
    pub fn new(inner: S, guard: WebhookGuard) -> Self {
        Self { inner, guard }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for WebhookGuardService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: http_body::Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone that was not polled ready stays behind (the usual tower dance).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let guard = self.guard.clone();
        let span = crate::runtime::enterable(guard.delivery_span());
        let Some(slot) = guard.detached_slot() else {
            return Box::pin(tracing::Instrument::instrument(
                guarded_call(guard, inner, request),
                span,
            ));
        };
        // Polled in the request, and spawned if the request is dropped: a client that
        // hangs up cancels neither the inner service nor the recording.
        let work = tracing::Instrument::instrument(guarded_call(guard, inner, request), span);
        Box::pin(crate::guard::Detachable::new(async move {
            let _slot = slot;
            work.await
        }))
    }
}

async fn guarded_call<S, ReqBody, ResBody>(
    guard: WebhookGuard,
    mut inner: S,
    request: Request<ReqBody>,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: http_body::Body + From<Bytes>,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResBody: From<String>,
{
    let (parts, body) = request.into_parts();
    let bytes = match read_body(&guard, &parts.headers, body).await {
        Ok(bytes) => bytes,
        Err(response) => return Ok(response.into_http()),
    };
    // The request's head, so that a scheme signing the method or URL (and a
    // handshake sent as a GET) sees them.
    let claimed = match guard.begin(&parts, &bytes).await {
        Begin::Claimed(claimed) => claimed,
        Begin::Done(outcome) => return Ok(guard.respond(outcome).into_http()),
    };
    let mut request = Request::from_parts(parts, ReqBody::from(bytes.clone()));
    let event: OwnedEvent = claimed.owned_event(bytes.clone());
    request.extensions_mut().insert(event);
    // A panicking inner service fails the delivery as a panicking handler does in
    // `axum::guarded`: a retryable failure, answered 500, not a dropped connection.
    // `call` itself inside the catch: a service may panic before its future exists.
    let response =
        match crate::runtime::catch_unwind(async move { inner.call(request).await }).await {
            Ok(Ok(response)) => response,
            Err(panic) => {
                let msg = crate::runtime::panic_message(&*panic);
                let outcome = claimed
                    .fail(HandlerError::retryable(format!(
                        "the inner service panicked: {msg}"
                    )))
                    .await;
                return Ok(guard.respond(outcome).into_http());
            }
            Ok(Err(error)) => {
                let outcome = claimed
                    .fail(HandlerError::retryable(
                        "the inner service returned an error",
                    ))
                    .await;
                // Escalated: the sender must be told to stop, not shown the error.
                let answer = guard.respond(outcome);
                if answer.answer().status.is_success() {
                    return Ok(answer.into_http());
                }
                return Err(error);
            }
        };
    let status = response.status();
    let outcome = if status.is_success() {
        claimed.complete().await
    } else if is_retryable(status) {
        claimed
            .fail(HandlerError::retryable(format!(
                "the inner service answered {status}"
            )))
            .await
    } else {
        claimed
            .fail(HandlerError::permanent(format!(
                "the inner service answered {status}"
            )))
            .await
    };
    let answer = guard.respond(outcome);
    if status.is_success() && answer.answer().status.is_success() {
        let mut response = response;
        if let Some(outcome) = answer.outcome() {
            response.extensions_mut().insert(outcome.kind());
        }
        return Ok(response);
    }
    // The inner service's own back-off, passed on with a retryable failure.
    let retry_after = response.headers().get(http::header::RETRY_AFTER).cloned();
    let mut answer = answer.into_http::<ResBody>();
    if let Some(value) = retry_after {
        if !answer.status().is_success()
            && !answer.headers().contains_key(http::header::RETRY_AFTER)
        {
            answer
                .headers_mut()
                .insert(http::header::RETRY_AFTER, value);
        }
    }
    Ok(answer)
}

/// 5xx, 408 Request Timeout and 429 Too Many Requests are worth retrying.
fn is_retryable(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}
