//! Receive webhooks safely: verify the signature over the raw body, deduplicate
//! deliveries by event id atomically, and escalate before the provider gives up.
//!
//! # Why
//!
//! Webhook providers deliver *at least once*. They retry whenever an endpoint answers
//! non-2xx or too slowly (Stripe for 72 hours, Jamm 20 times over about 2 days), so
//! the same event arrives more than once — sometimes concurrently, sometimes out of
//! order. A receiver that runs its side effects on every delivery charges twice,
//! mails twice, ships twice. A [`WebhookGuard`] sits inside your handler and makes
//! every event run your code once:
//!
//! 1. it verifies the signature (a [`Verifier`](verify::Verifier)) before trusting anything;
//! 2. it extracts the event id ([`EventId`]) — stable across retries;
//! 3. it atomically *claims* `(namespace, id)` in a [`ProcessedStore`]: of two
//!    concurrent deliveries, exactly one wins and runs the handler;
//! 4. it records the result and returns an [`Outcome`] that says what to answer.
//!
//! ```
//! use webhook_guard::{verify::HmacSha256Header, EventId, MemoryStore, Outcome, WebhookGuard};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let verifier = HmacSha256Header::new("X-Signature", ["a-random-secret-of-32-characters"]).unwrap();
//! let body = br#"{"id":"evt_1","type":"charge.succeeded"}"#;
//! let signature = verifier.sign(body);
//! let guard = WebhookGuard::builder()
//!     .store(MemoryStore::new())
//!     .verifier(verifier)
//!     .event_id(EventId::json_field(["id"]))
//!     .build()
//!     .unwrap();
//!
//! let headers = [("X-Signature", signature.as_str())];
//! let outcome = guard
//!     .handle(&headers, body, |event| async move {
//!         println!("charging for {}", event.id());
//!         Ok(())
//!     })
//!     .await;
//! assert!(matches!(outcome, Outcome::Processed { .. }));
//! assert_eq!(guard.answer(&outcome).status, 200);
//!
//! // The provider retries: the handler does not run again.
//! let again = guard.handle(&headers, body, |_| async { unreachable!() }).await;
//! assert!(matches!(again, Outcome::Duplicate { .. }));
//! # }
//! ```
//!
//! # What each outcome means to the sender
//!
//! | Outcome | Default answer | Handler ran? | The sender... |
//! |---|---|---|---|
//! | [`Processed`](Outcome::Processed) | 200 | yes | stops |
//! | [`Duplicate`](Outcome::Duplicate) | 200 | no | stops |
//! | [`InProgress`](Outcome::InProgress) | 409 + `Retry-After` (or 200, see [`InProgressAnswer`](guard::InProgressAnswer)) | no | retries later |
//! | [`Rejected`](Outcome::Rejected) | 400 / 401 / 413 (404 / 403 for an unknown tenant or a mismatch: [`tenant`]) + reason | no, nothing stored | gives up or alerts its owner |
//! | [`Conflict`](Outcome::Conflict) | 422 + conflict hook | no | gives up |
//! | [`RetryableFailure`](Outcome::RetryableFailure) | 500 | yes | retries; the failure is counted |
//! | [`Escalated`](Outcome::Escalated) | 200 + escalation hook | yes (or crashed) | stops; you reconcile via the API |
//! | [`PermanentFailure`](Outcome::PermanentFailure) | 200 + alert hook | yes | stops |
//! | [`Unrecorded`](Outcome::Unrecorded) | 200 + alert hook | yes | stops; the store missed the result |
//! | [`StoreUnavailable`](Outcome::StoreUnavailable) | 503 + `Retry-After` | no | retries; nothing lost |
//! | [`Accepted`](Outcome::Accepted) | 200 | later (inbox mode) | stops |
//! | [`Stale`](Outcome::Stale) | 200 + stale hook | no | stops |
//! | [`Handshake`](Outcome::Handshake) | the handshake's own (200, its body and content type) | no, nothing stored | enables the endpoint |
//!
//! Escalation is the seed advice "escalate before the provider gives up": after
//! `escalate_after` failed deliveries of one id (default 5, or fewer when the
//! verifier's provider delivers an event fewer times), the guard answers 200,
//! calls [`Hooks::on_escalation`] once, and treats the id as done. Reconcile the
//! object through the provider's API from there, rather than leaning on hourly retries.
//!
//! # Choosing retention and lease
//!
//! - **Retention** must cover the provider's whole retry window, or a late retry
//!   runs the handler again: 72 h for Stripe (the default), at least 56 h for Jamm
//!   (20 attempts, 1 h doubling to a 3 h cap: 54 h 38 min).
//!   It can never be shorter than the lease.
//! - **Lease** is how long a claim holds before another delivery may take it over
//!   (a crashed holder's claim). Make it longer than your slowest handler run
//!   (default 5 minutes); a long handler can call [`Event::renew_lease`]. A holder whose
//!   lease was taken over cannot record its result: every claim carries a
//!   [`FencingToken`](store::FencingToken).
//!
//! # Writing a custom store
//!
//! Implement [`ProcessedStore`] (its docs carry the contract: what each method must
//! do atomically) and run the public conformance suite from your tests with the
//! `conformance` feature: `webhook_guard::conformance::run_all(&store).await`.
//!
//! # Cargo features
//!
//! - `tokio` (default): the background sweeper ([`Sweeper::spawn`](sweeper::Sweeper::spawn)), the inbox
//!   `Worker`, and releasing a dropped claim in the background.
//! - `conformance`: the `conformance` module, a suite for store implementations.
//! - `axum`: axum 0.8 integration ([`integrations::axum`]): outcomes as responses
//!   and `guarded(guard, handler)` routes.
//! - `tower`: [`integrations::tower::WebhookGuardLayer`], guarding any tower service
//!   whose request body can be built from `Bytes` (a hyper service after mapping
//!   its `Incoming` body).
//! - `lambda`: AWS Lambda on `lambda_http` ([`integrations::lambda`]):
//!   `lambda_http::run(lambda::guarded(guard, handler))` behind API Gateway, a
//!   Function URL or an ALB; claims end no later than the invocation's deadline.
//! - `console`: the operator console ([`console::router`]): an axum `Router` of
//!   pages and JSON over the guard's records, inbox and dead letters, behind an
//!   authenticator.
//! - `metrics`: metrics through the `metrics` facade (module `metrics`: metric names,
//!   [`Hooks`] that record them, a timing store wrapper).
//! - `mysql`: `store::MySqlStore`, on MySQL 8 or MariaDB through sqlx.
//! - `redis`: `store::RedisStore`, on Redis or Redis Cluster (a claim is one round
//!   trip of native commands, `SET NX GET`; Lua scripts for take-overs and finishes;
//!   the driver is re-exported as `store::redis::redis`).
//! - `dynamodb`: `store::DynamoDbStore`, on one DynamoDB table through the official
//!   AWS SDK (re-exported as `store::dynamodb::aws_sdk_dynamodb`): conditional writes
//!   fence every change; a sparse index lists what is due; TTL for retention.
//! - `ed25519`: Standard Webhooks' asymmetric `v1a` signatures.
//! - `postgres`: `store::PostgresStore`, a durable store shared by
//!   every replica, on sqlx (re-exported as `store::postgres::sqlx`).
//! - `sqlite`: `store::SqliteStore`, the embedded durable store (one
//!   file, no server), on sqlx with a bundled libsqlite3.
//! - `cli`: the `webhook-guard` operator tool (a binary).
//! - `catch-up`: the `catch_up` module, recovering events the provider never
//!   delivered through its API, run through the guard's dedup; `stripe-catch-up`
//!   and `svix-catch-up` add Stripe's List Events and Svix's polling endpoints.
//!
//! # Observability
//!
//! [`WebhookGuard::handle`] runs each delivery in a `webhook_delivery` tracing span
//! (namespace, event id, attempt, outcome, elapsed milliseconds) and logs its outcome
//! once; bodies and secrets are never logged. Every outcome also reaches
//! [`Hooks::on_outcome`].
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "catch-up")]
#[cfg_attr(docsrs, doc(cfg(feature = "catch-up")))]
pub mod catch_up;
pub mod clock;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
#[cfg(feature = "console")]
#[cfg_attr(docsrs, doc(cfg(feature = "console")))]
pub mod console;
#[cfg(test)]
mod forward;
pub mod guard;
mod headers;
pub mod hooks;
pub mod inbox;
pub mod integrations;
mod json;
pub mod meta;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
pub mod ordering;
pub mod outcome;
pub mod reconcile;
pub mod route;
mod runtime;
pub mod store;
pub mod sweeper;
pub mod tenant;
pub mod verify;

// Not public API: the fuzz targets' way into the private JSON reader (see `json::fuzz`).
#[cfg(feature = "__fuzz")]
#[doc(hidden)]
pub use json::fuzz as __fuzz;

// The front door: what a user of the happy path touches. Everything else lives in
// its module (`guard`, `store`, `outcome`, `hooks`, `clock`, `sweeper`, ...).
pub use guard::{ConfigError, Event, EventId, OwnedEvent, WebhookGuard, WebhookGuardBuilder};
pub use headers::{Headers, RequestHead};
pub use hooks::Hooks;
pub use outcome::{HandlerError, Outcome};
pub use store::{MemoryStore, ProcessedStore, StoreError};

/// A body in `Debug` output: its length only, since a payload may hold personal
/// data that must not reach logs.
pub(crate) struct BodyLen(pub(crate) usize);

impl std::fmt::Debug for BodyLen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes>", self.0)
    }
}

/// `t + by`, or the end of time where that would pass it: a clock at the end of
/// chrono's range (a test clock advanced by `TimeDelta::MAX`, say) must not make a
/// delivery panic.
#[inline]
pub(crate) fn later(
    t: chrono::DateTime<chrono::Utc>,
    by: chrono::TimeDelta,
) -> chrono::DateTime<chrono::Utc> {
    t.checked_add_signed(by)
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
}

/// `text` with each NUL replaced by U+FFFD: PostgreSQL refuses NUL in text columns,
/// so text a store keeps (an inbox event's error and metadata) never holds one, and
/// every store keeps the same text.
pub(crate) fn without_nul(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        std::borrow::Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// A `Retry-After` in whole seconds: rounded up, so that a sender that obeys it
/// comes back after the lease it waits for has ended, and at least 1.
pub(crate) fn retry_after_secs(wait: std::time::Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// The longest lease, retention or interval the crate takes: longer ones would
/// reach past what chrono can represent when added to a time.
pub(crate) const CENTURY: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 86_400);

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// For the crate's own tests of a live server: the URL in the environment
/// variable `var`. Unset, the test fails in CI (`CI` set: a missing server is a
/// failure) and is skipped elsewhere, saying so.
#[cfg(test)]
#[cfg_attr(not(any(feature = "mysql", feature = "redis")), allow(dead_code))]
pub(crate) fn test_server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{var} is not set: CI requires every backend's server")
        }
        _ => {
            eprintln!("SKIPPED: {var} is not set, so this test did not run");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn retry_after_is_rounded_up_to_whole_seconds() {
        let secs = |ms| super::retry_after_secs(Duration::from_millis(ms));
        assert_eq!(secs(0), 1);
        assert_eq!(secs(1), 1);
        assert_eq!(secs(1_500), 2);
        assert_eq!(secs(40_000), 40);
        assert_eq!(secs(299_600), 300);
    }
}
