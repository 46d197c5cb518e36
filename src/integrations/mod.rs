//! Web framework integrations: they sit on top of [`WebhookGuard`] and never the
//! other way round.
//!
//! - [`GuardResponse`] (always available, `http` types only): an [`Outcome`] with the
//!   answer the guard chose for it, ready to become an HTTP response.
//! - [`axum`] (feature `axum`): `IntoResponse` for outcomes, and [`guarded`](axum::guarded),
//!   a route handler that reads the raw body, runs the guard and hands your code the
//!   verified event.
//! - [`tower`] (feature `tower`): [`WebhookGuardLayer`](tower::WebhookGuardLayer), which
//!   guards any tower service whose request body can be built from `Bytes` (axum's
//!   `Body`, for one) without changing its signature.
//! - [`lambda`] (feature `lambda`): [`guarded`](lambda::guarded), a function for
//!   `lambda_http::run` behind API Gateway, a Function URL or an ALB, whose claims
//!   end no later than the invocation.
//!
//! - [`actix`] (feature `actix`): `Responder` for outcomes, a
//!   [`Headers`](crate::Headers) impl for actix's `HeaderMap`, and
//!   [`guarded`](actix::guarded), the same one-call route as axum's.
//!
//! For any other framework (rocket, warp, hyper, ...), call
//! [`WebhookGuard::handle_spawned`] (or [`WebhookGuard::handle`]) with the
//! request's headers and raw body, then answer [`WebhookGuard::respond`] (see
//! `examples/plain_http.rs`); with feature `http02`, `http` 0.2's `HeaderMap` (warp
//! 0.3, hyper 0.14) is a [`Headers`](crate::Headers) too.
//!
//! # Handshakes and the request line
//!
//! Every integration gives the guard the request's method and target (path and
//! query) with its headers, for the presets that sign them (Twilio, HubSpot) or
//! read them (Meta's subscription check); see
//! [request context](crate::verify#request-context). A provider's handshake
//! (Slack, Zoom, Meta, Twitch, Discord) is answered with its own status, content
//! type and body ([`Outcome::Handshake`]), without running the handler or touching
//! the store. The axum and actix `guarded` routes take `GET` as well as `POST`
//! for Meta's check; with the tower layer, route `GET` to the layered service too
//! where a provider checks the endpoint with one.
//!
//! # Bodies over the limit
//!
//! The integrations read at most [`WebhookGuard::max_body`] bytes: a request whose
//! `Content-Length` is over the limit is refused before its body is read, and a
//! streamed body is refused as soon as it passes the limit, without buffering the
//! rest. Every integration answers it the same way, as the guard does for a body
//! handed to [`WebhookGuard::handle`] whole: the guard's [`Outcome::Rejected`] with
//! [`Rejection::BodyTooLarge`](crate::outcome::Rejection::BodyTooLarge), **413
//! Payload Too Large** by default, with reason `body_too_large`. Its `size` is the
//! declared `Content-Length`, or `limit + 1` for a streamed body. (A status set with
//! [`WebhookGuardBuilder::status`](crate::WebhookGuardBuilder::status) for
//! [`OutcomeKind::Rejected`] applies to every rejection, this one included.)

use std::fmt;

use http::header::{CONTENT_TYPE, RETRY_AFTER, X_CONTENT_TYPE_OPTIONS};
use http::{HeaderValue, StatusCode};

use crate::outcome::{Answer, Outcome, OutcomeKind};
use crate::WebhookGuard;

#[cfg(feature = "actix")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
pub mod actix;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum;
#[cfg(feature = "lambda")]
#[cfg_attr(docsrs, doc(cfg(feature = "lambda")))]
pub mod lambda;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

/// An [`Outcome`] with the [`Answer`] chosen for it: the status, a `Retry-After`
/// where the answer has one, and a small JSON body
/// `{"outcome": "...", "reason": "...", "id": "..."}` — or, for
/// [`Outcome::Handshake`], the handshake's own status, content type and body.
///
/// The body holds the outcome kind, the machine-readable reason and the event id —
/// never an error message, the payload or a secret.
///
/// Build one with [`WebhookGuard::respond`] (the guard's status mapping) or
/// [`GuardResponse::with_default_answer`]; with feature `axum` it is an
/// `IntoResponse`, with feature `actix` a `Responder` (and `into_actix`), and
/// [`GuardResponse::into_http`] turns it into an [`http::Response`] for any
/// framework.
///
/// ```
/// use webhook_guard::{Outcome, integrations::GuardResponse};
///
/// let response = GuardResponse::with_default_answer(Outcome::Processed { id: "evt_1".into() });
/// assert_eq!(response.answer().status, 200);
/// assert_eq!(response.body(), r#"{"outcome":"processed","reason":"processed","id":"evt_1"}"#);
/// let http: http::Response<String> = response.into_http();
/// assert_eq!(http.headers()["content-type"], "application/json");
/// ```
#[must_use]
pub struct GuardResponse {
    answer: Answer,
    outcome: Option<Outcome>,
}

impl fmt::Debug for GuardResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardResponse")
            .field("answer", &self.answer)
            .field("outcome", &self.outcome.as_ref().map(Outcome::kind))
            .finish()
    }
}

impl GuardResponse {
    /// `outcome` answered with `answer`.
    pub fn new(outcome: Outcome, answer: Answer) -> Self {
        Self {
            answer,
            outcome: Some(outcome),
        }
    }

    /// `outcome` answered with the default mapping (see the table in the crate docs),
    /// ignoring any status a guard overrides.
    pub fn with_default_answer(outcome: Outcome) -> Self {
        let answer = default_answer(&outcome);
        Self::new(outcome, answer)
    }

    /// A request whose body could not be read (the connection broke): 400 with reason
    /// `body_unreadable`. No outcome: the guard never saw the delivery.
    #[cfg_attr(
        not(any(feature = "axum", feature = "tower", feature = "actix")),
        allow(dead_code)
    )]
    pub(crate) fn unreadable() -> Self {
        Self {
            answer: Answer {
                status: StatusCode::BAD_REQUEST,
                retry_after: None,
                reason: "body_unreadable",
            },
            outcome: None,
        }
    }

    /// The answer: status, `Retry-After`, reason.
    pub fn answer(&self) -> Answer {
        self.answer
    }

    /// The outcome (`None` only for a body that could not be read at all).
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// The outcome, by value.
    pub fn into_outcome(self) -> Option<Outcome> {
        self.outcome
    }

    /// The outcome's kind, for the body and metrics (`rejected` for an unreadable body).
    fn kind_str(&self) -> &'static str {
        self.outcome
            .as_ref()
            .map_or(OutcomeKind::Rejected.as_str(), |o| o.kind().as_str())
    }

    /// The `Content-Type` of [`GuardResponse::body`]: `application/json`, or the
    /// handshake's own.
    pub fn content_type(&self) -> &'static str {
        match self.outcome.as_ref().and_then(Outcome::handshake) {
            Some(handshake) => handshake.content_type,
            None => "application/json",
        }
    }

    /// The JSON body: `{"outcome": kind, "reason": code, "id": event id}`, the id
    /// left out when there is none. For a handshake, the handshake's own body.
    pub fn body(&self) -> String {
        if let Some(handshake) = self.outcome.as_ref().and_then(Outcome::handshake) {
            return handshake.body.clone();
        }
        let (outcome, reason) = (self.kind_str(), self.answer.reason);
        let id = self.outcome.as_ref().and_then(Outcome::id);
        // The kind and reason are fixed ASCII words. When the id needs no escaping
        // either (the usual case), the body is written directly: byte for byte what
        // serde_json writes below, without going through a serializer.
        let plain = |s: &str| !s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20);
        if plain(outcome) && plain(reason) && id.is_none_or(plain) {
            // The exact length: a `String` whose capacity is its length becomes a
            // response body (`Bytes`) without another allocation.
            let len = 26 + outcome.len() + reason.len() + id.map_or(0, |id| 8 + id.len());
            let mut body = String::with_capacity(len);
            body.push_str(r#"{"outcome":""#);
            body.push_str(outcome);
            body.push_str(r#"","reason":""#);
            body.push_str(reason);
            if let Some(id) = id {
                body.push_str(r#"","id":""#);
                body.push_str(id);
            }
            body.push_str(r#""}"#);
            debug_assert_eq!(body.len(), len);
            return body;
        }
        serde_body(outcome, reason, id)
    }

    /// An [`http::Response`] with the status, `Retry-After`, `Content-Type:
    /// application/json` and the JSON body (a handshake's own content type and
    /// body), and `X-Content-Type-Options: nosniff`. The [`OutcomeKind`] is also put in the response's extensions, for
    /// middleware.
    pub fn into_http<B: From<String>>(self) -> http::Response<B> {
        let mut response = http::Response::new(B::from(self.body()));
        *response.status_mut() = self.answer.status;
        let content_type = self.content_type();
        let headers = response.headers_mut();
        // A custom verifier's content type that is no header value becomes bytes.
        let content_type = HeaderValue::from_str(content_type)
            .unwrap_or(HeaderValue::from_static("application/octet-stream"));
        headers.insert(CONTENT_TYPE, content_type);
        // A handshake echoes a value the caller sent: never sniffed as markup.
        headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        if let Some(secs) = self.answer.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(outcome) = &self.outcome {
            response.extensions_mut().insert(outcome.kind());
        }
        response
    }
}

/// [`GuardResponse::body`] through serde_json, for ids that need escaping.
fn serde_body(outcome: &str, reason: &str, id: Option<&str>) -> String {
    #[derive(serde::Serialize)]
    struct Body<'a> {
        outcome: &'a str,
        reason: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<&'a str>,
    }
    let body = Body {
        outcome,
        reason,
        id,
    };
    serde_json::to_string(&body).expect("a struct of strings serializes")
}

impl From<Outcome> for GuardResponse {
    /// [`GuardResponse::with_default_answer`].
    fn from(outcome: Outcome) -> Self {
        Self::with_default_answer(outcome)
    }
}

fn default_answer(outcome: &Outcome) -> Answer {
    let status = match outcome {
        Outcome::Rejected(r) => r.status(),
        Outcome::Handshake(h) => h.status,
        other => other.kind().default_status(),
    };
    Answer::with_status(outcome, status)
}

impl WebhookGuard {
    /// `outcome` with this guard's answer ([`WebhookGuard::answer`]), ready to send.
    ///
    /// ```
    /// use webhook_guard::outcome::OutcomeKind;
    /// use webhook_guard::{verify::NoVerification, MemoryStore, Outcome, WebhookGuard};
    ///
    /// let guard = WebhookGuard::builder()
    ///     .store(MemoryStore::new())
    ///     .verifier(NoVerification)
    ///     .event_id(webhook_guard::EventId::header("X-Event-Id"))
    ///     .status(OutcomeKind::Duplicate, http::StatusCode::ACCEPTED)
    ///     .build()
    ///     .unwrap();
    /// let response = guard.respond(Outcome::Duplicate {
    ///     id: "evt_1".into(),
    ///     state: webhook_guard::store::RecordState::Completed,
    /// });
    /// assert_eq!(response.answer().status, 202);
    /// ```
    pub fn respond(&self, outcome: Outcome) -> GuardResponse {
        let answer = self.answer(&outcome);
        GuardResponse::new(outcome, answer)
    }
}

/// Why a body could not be taken whole.
#[cfg(any(feature = "axum", feature = "tower", feature = "actix"))]
enum BodyError {
    /// Over the limit: the declared length, or `limit + 1` when streamed.
    TooLarge(usize),
    /// The body stream failed.
    Unreadable,
}

/// Reads `body` whole, refusing it once it passes `limit` (or at once, when its
/// declared `Content-Length` does) without buffering the rest.
#[cfg(any(feature = "axum", feature = "tower"))]
async fn read_limited<B>(
    headers: &http::HeaderMap,
    body: B,
    limit: usize,
) -> Result<bytes::Bytes, BodyError>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use http_body_util::BodyExt as _;

    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(size) = declared.filter(|&size| size > limit) {
        return Err(BodyError::TooLarge(size));
    }
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(BodyError::TooLarge(limit.saturating_add(1)))
        }
        Err(_) => Err(BodyError::Unreadable),
    }
}

/// Reads the body, or the response refusing it (reported through the guard).
#[cfg(any(feature = "axum", feature = "tower"))]
async fn read_body<B>(
    guard: &WebhookGuard,
    headers: &http::HeaderMap,
    body: B,
) -> Result<bytes::Bytes, GuardResponse>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let started = std::time::Instant::now();
    read_limited(headers, body, guard.max_body())
        .await
        .map_err(|error| refuse_body(guard, error, started))
}

/// The answer to a body that could not be taken whole, reported through the guard
/// when it was over the limit.
#[cfg(any(feature = "axum", feature = "tower", feature = "actix"))]
fn refuse_body(
    guard: &WebhookGuard,
    error: BodyError,
    started: std::time::Instant,
) -> GuardResponse {
    match error {
        BodyError::TooLarge(size) => {
            let limit = guard.max_body();
            let outcome = guard.rejected_early(
                crate::outcome::Rejection::BodyTooLarge { size, limit },
                started,
            );
            guard.respond(outcome)
        }
        BodyError::Unreadable => {
            tracing::debug!(namespace = guard.namespace(), "webhook body unreadable");
            GuardResponse::unreadable()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_what_serde_json_writes() {
        let ids = [
            "evt_1",
            "",
            "a\"b",
            "back\\slash",
            "tab\there",
            "nul\u{0}",
            "\u{1f}",
            "é日本\u{7f}",
            "</script>",
        ];
        for id in ids {
            for outcome in [
                Outcome::Processed { id: id.into() },
                Outcome::Conflict { id: id.into() },
            ] {
                let response = GuardResponse::with_default_answer(outcome);
                let want = serde_body(
                    response.kind_str(),
                    response.answer.reason,
                    response.outcome.as_ref().and_then(Outcome::id),
                );
                assert_eq!(response.body(), want, "{id:?}");
                let parsed: serde_json::Value = serde_json::from_str(&response.body()).unwrap();
                assert_eq!(parsed["id"], id);
            }
        }
        let unreadable = GuardResponse::unreadable();
        assert_eq!(
            unreadable.body(),
            serde_body("rejected", "body_unreadable", None)
        );
        assert_eq!(
            unreadable.body(),
            r#"{"outcome":"rejected","reason":"body_unreadable"}"#
        );
    }
}
