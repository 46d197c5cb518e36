//! actix-web 4: outcomes as responses, a [`Headers`] impl for actix's `HeaderMap`,
//! and a guarded route in a few lines.
//!
//! ```no_run
//! use std::time::Duration;
//! use actix_web::{App, HttpServer};
//! use webhook_guard::integrations::actix::guarded;
//! use webhook_guard::{verify::HmacSha256Header, EventId, MemoryStore, OwnedEvent, WebhookGuard};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let guard = WebhookGuard::builder()
//!     .store(MemoryStore::new())
//!     .verifier(HmacSha256Header::new("X-Signature", ["a-random-secret-of-32-characters"])?)
//!     .event_id(EventId::json_field(["id"]))
//!     .build()?;
//!
//! // Built outside the server's factory: handlers run on this runtime (see below).
//! let webhooks = guarded(guard.clone(), |event: OwnedEvent| async move {
//!     // Runs once per event id, with a verified body.
//!     let payload: serde_json::Value = event.json()?;
//!     println!("{} {}", event.id(), payload["type"]);
//!     Ok(())
//! });
//! HttpServer::new(move || App::new().route("/webhooks", webhooks.route()))
//!     .bind(("127.0.0.1", 8080))?
//!     .run()
//!     .await?;
//! guard.drain(Duration::from_secs(30)).await;
//! # Ok(())
//! # }
//! ```
//!
//! The route reads the body from actix's payload stream itself, at most
//! [`WebhookGuard::max_body`] bytes (actix's `PayloadConfig` limit does not apply):
//! a body over the limit is answered 413 `body_too_large` without being read whole
//! (see the [module docs](crate::integrations#bodies-over-the-limit)).
//!
//! The handler runs on a task of its own ([`WebhookGuard::handle_spawned`]): a
//! client that hangs up does not cancel it, its result is recorded, and the
//! provider's retry is a `Duplicate`; with a preset that knows the provider's
//! timeout, a handler still running at four fifths of it is answered `InProgress`
//! (409 + `Retry-After`) while it runs on. The route answers from the
//! [`Outcome`] with the guard's status mapping (see [`GuardResponse`]).
//!
//! # Where handlers run
//!
//! actix-web serves requests on worker threads, each with a runtime of its own that
//! stops with the server: a handler spawned there would be dropped mid-way at
//! shutdown. [`guarded`] therefore notes the tokio runtime it is called on (the
//! one under `#[actix_web::main]` or `#[tokio::main]`) and spawns handlers there,
//! so that [`WebhookGuard::drain`], awaited once the server has stopped, waits for
//! them. Under `#[actix_web::main]` that runtime runs on one thread, so handlers
//! share it; under `#[tokio::main]` they spread over its worker threads. Called
//! outside any runtime (or inside the server's factory), handlers run on the
//! worker's runtime.

use std::future::Future;

use actix_web::body::BoxBody;
use actix_web::http::header::{
    HeaderMap, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, X_CONTENT_TYPE_OPTIONS,
};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, Responder};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt as _;

use super::{BodyError, GuardResponse};
use crate::headers::Headers;
use crate::{HandlerError, Outcome, OwnedEvent, WebhookGuard};

impl Headers for HeaderMap {
    fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        // actix's `HeaderMap::get` lower-cases a `&str` name; a name that is not a
        // valid header name matches nothing.
        self.get(name).map(HeaderValue::as_bytes)
    }
}

/// The request's headers, method and target: what [`handle_request`] gives the
/// guard, so that a scheme signing the method or URL (and a handshake sent as a
/// `GET`) sees them.
impl Headers for HttpRequest {
    fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        self.headers().get_bytes(name)
    }

    fn method(&self) -> Option<&str> {
        Some(HttpRequest::method(self).as_str())
    }

    fn target(&self) -> Option<&str> {
        Some(self.uri().path_and_query().map_or("/", |pq| pq.as_str()))
    }
}

impl GuardResponse {
    /// An actix-web [`HttpResponse`]: the status, `Retry-After`, `Content-Type:
    /// application/json` and the JSON body, `X-Content-Type-Options: nosniff`, with the
    /// [`OutcomeKind`](crate::outcome::OutcomeKind) in the response's extensions.
    pub fn into_actix(self) -> HttpResponse {
        let status = StatusCode::from_u16(self.answer.status.as_u16())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut builder = HttpResponse::build(status);
        // A custom verifier's content type that is no header value becomes bytes.
        let content_type = HeaderValue::from_str(self.content_type())
            .unwrap_or(HeaderValue::from_static("application/octet-stream"));
        builder.insert_header((CONTENT_TYPE, content_type));
        builder.insert_header((X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")));
        if let Some(secs) = self.answer.retry_after {
            builder.insert_header((RETRY_AFTER, HeaderValue::from(secs)));
        }
        if let Some(outcome) = &self.outcome {
            builder.extensions_mut().insert(outcome.kind());
        }
        builder.body(self.body())
    }
}

impl From<GuardResponse> for HttpResponse {
    fn from(response: GuardResponse) -> Self {
        response.into_actix()
    }
}

impl Responder for GuardResponse {
    type Body = BoxBody;

    fn respond_to(self, _request: &HttpRequest) -> HttpResponse {
        self.into_actix()
    }
}

/// Answers with the **default** status mapping (the table in the crate docs). A guard
/// with status overrides should answer [`WebhookGuard::respond`] instead.
///
/// ```
/// use actix_web::Responder;
/// use webhook_guard::Outcome;
///
/// let request = actix_web::test::TestRequest::default().to_http_request();
/// let response = Outcome::Processed { id: "evt_1".into() }.respond_to(&request);
/// assert_eq!(response.status(), 200);
/// ```
impl Responder for Outcome {
    type Body = BoxBody;

    fn respond_to(self, _request: &HttpRequest) -> HttpResponse {
        GuardResponse::with_default_answer(self).into_actix()
    }
}

/// A guarded webhook endpoint: the guard, the handler and the runtime handlers run
/// on. Build it with [`guarded`] before the server's factory, clone it into the
/// factory, and mount [`Guarded::route`].
#[derive(Clone)]
pub struct Guarded<F> {
    guard: WebhookGuard,
    handler: F,
    home: Option<tokio::runtime::Handle>,
}

impl<F> std::fmt::Debug for Guarded<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarded")
            .field("guard", &self.guard)
            .field("home", &self.home.is_some())
            .finish_non_exhaustive()
    }
}

/// A `POST` endpoint that runs `handler` once per event id: mount it with
/// [`Guarded::route`].
///
/// It reads the raw body (at most [`WebhookGuard::max_body`] bytes, never
/// re-serialized), verifies and claims the delivery, calls `handler` with the
/// verified [`OwnedEvent`] only when this delivery won the claim, records its result
/// and answers with [`WebhookGuard::respond`]. Returning
/// [`HandlerError::retryable`] (or any error, through `?`) answers 500 so the
/// sender retries (200 once the id is escalated, with the escalation hook);
/// [`HandlerError::permanent`] answers 200 and calls the alert hook.
///
/// Call it on the runtime that outlives the server (see
/// [where handlers run](self#where-handlers-run)); the [module docs](self) have an
/// example.
pub fn guarded<F, Fut>(guard: WebhookGuard, handler: F) -> Guarded<F>
where
    F: Fn(OwnedEvent) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    Guarded {
        guard,
        handler,
        home: tokio::runtime::Handle::try_current().ok(),
    }
}

impl<F, Fut> Guarded<F>
where
    F: Fn(OwnedEvent) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    /// The `POST` route, for `App::route` or `Resource::route`. It answers `GET`
    /// too, for a provider's handshake sent as a `GET` (Meta's subscription
    /// check); the verifier refuses any other `GET`, 401 by default.
    pub fn route(&self) -> actix_web::Route {
        let this = self.clone();
        let methods = actix_web::guard::Any(actix_web::guard::Post()).or(actix_web::guard::Get());
        web::route()
            .guard(methods)
            .to(move |request: HttpRequest, payload: web::Payload| {
                let this = this.clone();
                async move {
                    let Guarded {
                        guard,
                        handler,
                        home,
                    } = this;
                    on_home(home, async move {
                        handle_request(&guard, &request, payload, handler)
                            .await
                            .into_actix()
                    })
                    .await
                }
            })
    }

    /// The guard.
    pub fn guard(&self) -> &WebhookGuard {
        &self.guard
    }
}

/// `work`, polled with `home` as the current tokio runtime (so that what it spawns
/// and the timers it sets live there), or as it is without one.
async fn on_home<T>(home: Option<tokio::runtime::Handle>, work: impl Future<Output = T>) -> T {
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(move |cx| {
        let _entered = home.as_ref().map(tokio::runtime::Handle::enter);
        work.as_mut().poll(cx)
    })
    .await
}

/// The body of a guarded route, for a route of your own: reads the body of
/// `request` from `payload` within the guard's limit and runs it through
/// [`WebhookGuard::handle_spawned`] (the handler on its own task, on the current
/// runtime: it runs to its end and its result is recorded even if the client hangs
/// up, and the provider is answered by the guard's answer deadline).
///
/// ```
/// use actix_web::{web, App, HttpRequest};
/// use webhook_guard::{integrations::actix::handle_request, verify::NoVerification};
/// use webhook_guard::{EventId, MemoryStore, WebhookGuard};
///
/// let guard = WebhookGuard::builder()
///     .store(MemoryStore::new())
///     .verifier(NoVerification)
///     .event_id(EventId::header("X-Event-Id"))
///     .build()
///     .unwrap();
/// let app = App::new().route(
///     "/hooks",
///     web::put().to(move |request: HttpRequest, payload: web::Payload| {
///         let guard = guard.clone();
///         async move { handle_request(&guard, &request, payload, |_event| async { Ok(()) }).await }
///     }),
/// );
/// # drop(app);
/// ```
pub async fn handle_request<F, Fut>(
    guard: &WebhookGuard,
    request: &HttpRequest,
    payload: web::Payload,
    handler: F,
) -> GuardResponse
where
    F: FnOnce(OwnedEvent) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let started = std::time::Instant::now();
    let headers = request.headers();
    let bytes = match read_limited(headers, payload, guard.max_body()).await {
        Ok(bytes) => bytes,
        Err(error) => return super::refuse_body(guard, error, started),
    };
    let outcome = guard.handle_spawned(request, bytes, handler).await;
    guard.respond(outcome)
}

/// Reads `payload` whole, refusing it once it passes `limit` (or at once, when its
/// declared `Content-Length` does) without buffering the rest.
async fn read_limited(
    headers: &HeaderMap,
    mut payload: web::Payload,
    limit: usize,
) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(size) = declared.filter(|&size| size > limit) {
        return Err(BodyError::TooLarge(size));
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| BodyError::Unreadable)?;
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge(limit.saturating_add(1)));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}
