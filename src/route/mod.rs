//! Routing events by type: a [`Router`] runs the handler registered for an event's
//! type, with the payload deserialized into the handler's own type, and a fallback
//! for every other type.
//!
//! ```
//! use serde::Deserialize;
//! use webhook_guard::route::Router;
//! use webhook_guard::verify::Stripe;
//! use webhook_guard::{HandlerError, MemoryStore, OwnedEvent, Outcome, WebhookGuard};
//!
//! #[derive(Deserialize)]
//! struct PaymentSucceeded {
//!     data: Data,
//! }
//! #[derive(Deserialize)]
//! struct Data {
//!     object: PaymentIntent,
//! }
//! #[derive(Deserialize)]
//! struct PaymentIntent {
//!     id: String,
//!     amount: u64,
//! }
//!
//! async fn paid(event: PaymentSucceeded, meta: OwnedEvent) -> Result<(), HandlerError> {
//!     println!("{}: {} paid {}", meta.id(), event.data.object.id, event.data.object.amount);
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let router = Router::new()
//!     .on("payment_intent.succeeded", paid)
//!     .fallback(|event: OwnedEvent| async move {
//!         // Every other type: answered 200 (and counted) unless this says otherwise.
//!         Ok(())
//!     });
//! // Once, at start-up: a handler for `handle_owned`, `handle_spawned` and every
//! // framework integration (`integrations::axum::guarded(guard, handler)`).
//! let handler = router.into_handler();
//!
//! let stripe = Stripe::new(["whsec_test0000000000000000000000000000"])?;
//! let guard = WebhookGuard::builder()
//!     .store(MemoryStore::new())
//!     .verifier(stripe.clone()) // knows Stripe puts the type in `type`
//!     .build()?;
//! let body = br#"{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","amount":500}}}"#;
//! let headers = [("Stripe-Signature", stripe.sign(body, chrono::Utc::now().timestamp()))];
//! let outcome = guard.handle_owned(&headers, body.to_vec().into(), handler.clone()).await;
//! assert!(matches!(outcome, Outcome::Processed { .. }));
//! # Ok(())
//! # }
//! ```
//!
//! # Where the type comes from
//!
//! From the guard's [`TypeSource`](crate::meta::TypeSource): each provider preset
//! knows its provider's (Stripe's and Standard Webhooks' `type`, Jamm's and
//! Paddle's `event_type`, Slack's `event.type`, Linear's `type` and `action`,
//! GitHub's `X-GitHub-Event` header and `action`, Shopify's `X-Shopify-Topic`
//! header); [`WebhookGuardBuilder::event_type`](crate::WebhookGuardBuilder::event_type)
//! sets another. A route's key is the type as text: `"payment_intent.succeeded"`,
//! `"issues.opened"` (GitHub's event and action), `"ping"` (no action),
//! `"orders/create"`; a key matches the whole type (`"issues"` does not take
//! `issues.opened`). An inbox worker's events route on their stored
//! [`meta.event_type`](crate::meta::EventMeta::event_type).
//!
//! # Unknown types
//!
//! An event whose type has no route, or that has no type, goes to the fallback.
//! The default fallback does nothing: the event is answered `Processed` (200),
//! because providers send types an endpoint never subscribed to (Stripe after an
//! API upgrade, GitHub's `ping`), and a failure would only make them retry an
//! event no code here will ever handle. Each such event is logged (`debug`) and,
//! with feature `metrics`, counted in `webhook_guard_unrouted_events_total`.
//!
//! # A payload that does not fit
//!
//! When the payload of a routed type does not deserialize into its handler's type,
//! the handler does not run and [`InvalidPayload`] says what happens. The default,
//! [`InvalidPayload::Retry`], fails the delivery as retryable: the payload is
//! signed, so the usual cause is the handler's type being behind the provider (a new
//! API version, a new enum value), which a deploy fixes, and the provider's retries
//! then reach the fixed code; past the guard's `escalate_after` failures the event
//! is escalated (answered 200, escalation hook, reconciler) before the provider
//! gives up. [`InvalidPayload::Permanent`] answers 200 at once with the alert hook;
//! [`InvalidPayload::Ignore`] answers 200 and drops the event (logged, and counted
//! with feature `metrics` in `webhook_guard_invalid_payloads_total`). The error
//! ([`PayloadError`]) names the route and where the parser stopped, never the
//! payload's content.
//!
//! # Borrowed payloads
//!
//! With [`WebhookGuard::handle`](crate::WebhookGuard::handle), whose events borrow
//! the body, a payload type may borrow from it (`&'a str`, `Cow<'a, str>`,
//! `&'a RawValue`): build the router in the call, which costs nothing (the handlers
//! are moved in, not boxed). Events that own their body ([`OwnedEvent`], an inbox
//! worker's [`InboxEvent`]) take owned payload types, since their handlers'
//! futures outlive the request.
//!
//! # Cost
//!
//! A router allocates nothing per event beyond what the payload type itself
//! allocates: the type is read in one pass over the body (borrowed from it, unless
//! escaped), matched against the routes by comparison, and the handler's future is
//! kept inline in the answer ([`RouteFuture`]), not boxed (`tests/allocations.rs`
//! holds this). Routes are tried in turn: a few dozen cost nothing next to the
//! parse.
//!
//! Panics and errors of a routed handler (or of a payload type's `Deserialize`)
//! are those of a plain handler: a panic is a retryable failure, an error says
//! itself whether it is retryable or permanent.

mod future;

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Deserialize;

pub use future::{NoFuture, OneOf, RouteFuture};

use crate::inbox::InboxEvent;
use crate::meta::EventType;
use crate::outcome::HandlerError;
use crate::{Event, OwnedEvent};

/// What a router does with a payload that does not deserialize into the type of
/// the handler its event type routes to. See the [module docs](self#a-payload-that-does-not-fit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidPayload {
    /// A retryable failure (answered 500; the provider retries, the guard escalates
    /// after `escalate_after` failures). The default.
    #[default]
    Retry,
    /// A permanent failure (answered 200, the alert hook is called).
    Permanent,
    /// Processed as if handled (answered 200): the event is dropped, logged and
    /// counted.
    Ignore,
}

impl InvalidPayload {
    /// `retry`, `permanent` or `ignore`: the policy's metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Permanent => "permanent",
            Self::Ignore => "ignore",
        }
    }
}

/// A payload that did not deserialize into its handler's type: the route and where
/// the parser stopped, never the payload's content (which a serde message quotes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the payload of `{route}` does not fit its handler's type: {category} error at line {line}, column {column}")]
#[non_exhaustive]
pub struct PayloadError {
    /// The route's event type, as registered.
    pub route: Cow<'static, str>,
    /// `syntax`, `data` (a field missing or of another type), `end of input` or `io`.
    pub category: &'static str,
    /// The line where the parser stopped (1-based).
    pub line: usize,
    /// The column where the parser stopped (1-based).
    pub column: usize,
}

impl PayloadError {
    fn new(route: Cow<'static, str>, error: &serde_json::Error) -> Self {
        use serde_json::error::Category;
        Self {
            route,
            category: match error.classify() {
                Category::Io => "io",
                Category::Syntax => "syntax",
                Category::Data => "data",
                Category::Eof => "end of input",
            },
            line: error.line(),
            column: error.column(),
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::Event<'_> {}
    impl Sealed for crate::OwnedEvent {}
    impl Sealed for crate::inbox::InboxEvent {}
    impl Sealed for super::NoRoutes {}
    impl<T, H, R> Sealed for super::Route<T, H, R> {}
}

/// An event a [`Router`] dispatches: [`Event`], [`OwnedEvent`], or an inbox
/// worker's [`InboxEvent`].
pub trait Routable: sealed::Sealed + Sized {
    /// The event's type.
    fn route_type(&self) -> Option<EventType<'_>>;
    /// The event id.
    fn route_id(&self) -> &str;
    /// The namespace the event's delivery is reported under: the guard's (for a
    /// tenant's event, that of the guard serving the tenants).
    fn route_namespace(&self) -> &str;
}

/// An event whose payload deserializes into `T`: any `T: Deserialize<'a>` for an
/// [`Event<'a>`](Event) (it may borrow the body), any `T: DeserializeOwned` for
/// [`OwnedEvent`] and [`InboxEvent`].
pub trait Payload<T>: Routable {
    /// The payload, deserialized.
    ///
    /// # Errors
    /// The parser's error.
    fn payload(&self) -> Result<T, serde_json::Error>;
}

/// [`Routable`] for the guard's events, read through their own accessors.
macro_rules! routable_guard_event {
    ($($event:ty),*) => {$(
        impl Routable for $event {
            fn route_type(&self) -> Option<EventType<'_>> {
                self.event_type()
            }
            fn route_id(&self) -> &str {
                self.id()
            }
            fn route_namespace(&self) -> &str {
                self.reported_namespace()
            }
        }
    )*};
}

routable_guard_event!(Event<'_>, OwnedEvent);

impl<'a, T: Deserialize<'a>> Payload<T> for Event<'a> {
    fn payload(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(self.body())
    }
}

impl<T: DeserializeOwned> Payload<T> for OwnedEvent {
    fn payload(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(self.body())
    }
}

impl Routable for InboxEvent {
    fn route_type(&self) -> Option<EventType<'_>> {
        self.event_type()
    }
    fn route_id(&self) -> &str {
        &self.id
    }
    fn route_namespace(&self) -> &str {
        &self.namespace
    }
}

impl<T: DeserializeOwned> Payload<T> for InboxEvent {
    fn payload(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }
}

/// A route that did not take its event: the payload did not deserialize.
pub struct Unfit<'r, E> {
    route: &'r Cow<'static, str>,
    error: serde_json::Error,
    event: E,
}

impl<E> fmt::Debug for Unfit<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unfit")
            .field("route", self.route)
            .finish_non_exhaustive()
    }
}

/// The routes of a [`Router`]: [`NoRoutes`], or a [`Route`] before the others.
pub trait Routes<E>: sealed::Sealed {
    /// The future of any of the routes' handlers.
    type Future: Future<Output = Result<(), HandlerError>>;

    /// The position of the route for `event_type`, counted from this one.
    fn position(&self, event_type: &EventType<'_>) -> Option<usize>;

    /// Whether a route has the key `key`.
    fn has(&self, key: &str) -> bool;

    /// Runs the route at `position` on `event`: its handler's future, or the event
    /// back when its payload does not deserialize.
    ///
    /// # Errors
    /// The [`Unfit`] payload, with the event.
    fn call(&self, position: usize, event: E) -> Result<Self::Future, Unfit<'_, E>>;

    /// The routes' keys, latest registered first.
    fn keys<'s>(&'s self, keys: &mut Vec<&'s str>);
}

/// No routes: what [`Router::new`] starts from.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRoutes;

impl<E> Routes<E> for NoRoutes {
    type Future = NoFuture;

    fn position(&self, _: &EventType<'_>) -> Option<usize> {
        None
    }

    fn has(&self, _: &str) -> bool {
        false
    }

    fn call(&self, _: usize, _: E) -> Result<NoFuture, Unfit<'_, E>> {
        unreachable!("no route has a position")
    }

    fn keys<'s>(&'s self, _: &mut Vec<&'s str>) {}
}

/// A route (an event type, its payload type `T` and its handler `H`) before the
/// routes registered earlier (`R`).
pub struct Route<T, H, R> {
    key: Cow<'static, str>,
    handler: H,
    next: R,
    _payload: PhantomData<fn() -> T>,
}

impl<T, H: Clone, R: Clone> Clone for Route<T, H, R> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            handler: self.handler.clone(),
            next: self.next.clone(),
            _payload: PhantomData,
        }
    }
}

impl<T, H, R: fmt::Debug> fmt::Debug for Route<T, H, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("key", &self.key)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl<E, T, H, Fut, R> Routes<E> for Route<T, H, R>
where
    E: Payload<T>,
    H: Fn(T, E) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
    R: Routes<E>,
{
    type Future = OneOf<Fut, R::Future>;

    fn position(&self, event_type: &EventType<'_>) -> Option<usize> {
        if event_type.is(&self.key) {
            return Some(0);
        }
        self.next.position(event_type).map(|p| p + 1)
    }

    fn has(&self, key: &str) -> bool {
        self.key == key || self.next.has(key)
    }

    fn call(&self, position: usize, event: E) -> Result<Self::Future, Unfit<'_, E>> {
        if position > 0 {
            return self.next.call(position - 1, event).map(OneOf::further);
        }
        match event.payload() {
            Ok(payload) => Ok(OneOf::here((self.handler)(payload, event))),
            Err(error) => Err(Unfit {
                route: &self.key,
                error,
                event,
            }),
        }
    }

    fn keys<'s>(&'s self, keys: &mut Vec<&'s str>) {
        keys.push(&self.key);
        self.next.keys(keys);
    }
}

/// What runs an event whose type has no route.
pub trait Fallback<E> {
    /// The fallback's future.
    type Future: Future<Output = Result<(), HandlerError>>;

    /// Runs the fallback on `event`.
    fn call(&self, event: E) -> Self::Future;
}

impl<E, H, Fut> Fallback<E> for H
where
    H: Fn(E) -> Fut,
    Fut: Future<Output = Result<(), HandlerError>>,
{
    type Future = Fut;

    fn call(&self, event: E) -> Fut {
        self(event)
    }
}

/// The default fallback: does nothing, so the event is answered `Processed`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ignore;

impl<E> Fallback<E> for Ignore {
    type Future = std::future::Ready<Result<(), HandlerError>>;

    fn call(&self, _: E) -> Self::Future {
        std::future::ready(Ok(()))
    }
}

/// Runs the handler registered for an event's type, with the payload deserialized
/// into the handler's type, or the fallback. See the [module docs](self).
///
/// `E` is the event its handlers take ([`Event`], [`OwnedEvent`] or
/// [`InboxEvent`]), `R` its routes, `F` its fallback. It is built once and shared
/// (cheap to clone when its handlers are); [`Router::into_handler`] makes it a
/// handler closure for any of the guard's entry points and integrations.
pub struct Router<E, R = NoRoutes, F = Ignore> {
    routes: R,
    fallback: F,
    invalid: InvalidPayload,
    _event: PhantomData<fn(E)>,
}

impl<E> Router<E> {
    /// A router without routes, whose fallback does nothing and which retries an
    /// invalid payload.
    pub fn new() -> Self {
        Self {
            routes: NoRoutes,
            fallback: Ignore,
            invalid: InvalidPayload::default(),
            _event: PhantomData,
        }
    }
}

impl<E> Default for Router<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E, R: Clone, F: Clone> Clone for Router<E, R, F> {
    fn clone(&self) -> Self {
        Self {
            routes: self.routes.clone(),
            fallback: self.fallback.clone(),
            invalid: self.invalid,
            _event: PhantomData,
        }
    }
}

impl<E, R: Routes<E>, F> fmt::Debug for Router<E, R, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys = Vec::new();
        self.routes.keys(&mut keys);
        keys.reverse();
        f.debug_struct("Router")
            .field("routes", &keys)
            .field("invalid_payload", &self.invalid)
            .finish_non_exhaustive()
    }
}

impl<E, R, F> Router<E, R, F> {
    /// Routes events of type `event_type` (such as `"payment_intent.succeeded"`,
    /// `"issues.opened"`) to `handler`, which receives the payload deserialized into
    /// its first argument's type and the event.
    ///
    /// # Panics
    /// When `event_type` already has a route.
    pub fn on<T, H, Fut>(
        self,
        event_type: impl Into<Cow<'static, str>>,
        handler: H,
    ) -> Router<E, Route<T, H, R>, F>
    where
        E: Payload<T>,
        H: Fn(T, E) -> Fut,
        Fut: Future<Output = Result<(), HandlerError>>,
        R: Routes<E>,
    {
        let key = event_type.into();
        assert!(
            !self.routes.has(&key),
            "the event type `{key}` has a route already"
        );
        Router {
            routes: Route {
                key,
                handler,
                next: self.routes,
                _payload: PhantomData,
            },
            fallback: self.fallback,
            invalid: self.invalid,
            _event: PhantomData,
        }
    }

    /// Runs `handler` for the events no route takes (default: nothing, answered
    /// `Processed`).
    pub fn fallback<H, Fut>(self, handler: H) -> Router<E, R, H>
    where
        H: Fn(E) -> Fut,
        Fut: Future<Output = Result<(), HandlerError>>,
    {
        Router {
            routes: self.routes,
            fallback: handler,
            invalid: self.invalid,
            _event: PhantomData,
        }
    }

    /// What to do with a payload that does not deserialize into its handler's type
    /// (default [`InvalidPayload::Retry`]).
    pub fn invalid_payload(mut self, policy: InvalidPayload) -> Self {
        self.invalid = policy;
        self
    }
}

impl<E, R, F> Router<E, R, F>
where
    E: Routable,
    R: Routes<E>,
    F: Fallback<E>,
{
    /// Runs the handler of `event`'s type, or the fallback.
    pub fn dispatch(&self, event: E) -> RouteFuture<R::Future, F::Future> {
        let event_type = event.route_type();
        let position = event_type.as_ref().and_then(|t| self.routes.position(t));
        let Some(position) = position else {
            unrouted(&event, event_type.as_ref());
            return RouteFuture::fallback(self.fallback.call(event));
        };
        match self.routes.call(position, event) {
            Ok(future) => RouteFuture::routed(future),
            Err(unfit) => RouteFuture::ready(self.unfit(&unfit)),
        }
    }

    /// This router as a handler: `Fn(E) -> impl Future`, cheap to clone (the router
    /// is shared behind an [`Arc`]), `Send`, `Sync` and `'static` when its handlers
    /// are. What [`WebhookGuard::handle_owned`](crate::WebhookGuard::handle_owned),
    /// [`handle_spawned`](crate::WebhookGuard::handle_spawned), the framework
    /// integrations' `guarded` and [`WebhookGuard::worker`](crate::WebhookGuard::worker)
    /// take.
    pub fn into_handler(self) -> impl Fn(E) -> RouteFuture<R::Future, F::Future> + Clone {
        let router = Arc::new(self);
        move |event| router.dispatch(event)
    }

    /// The answer for an event whose payload does not fit its route, by policy.
    fn unfit(&self, unfit: &Unfit<'_, E>) -> Result<(), HandlerError> {
        let error = PayloadError::new(unfit.route.clone(), &unfit.error);
        let policy = self.invalid;
        let (namespace, id) = (unfit.event.route_namespace(), unfit.event.route_id());
        tracing::warn!(namespace, id, route = %unfit.route, policy = policy.as_str(), %error, "webhook payload does not fit its handler's type");
        #[cfg(feature = "metrics")]
        ::metrics::counter!(
            crate::metrics::INVALID_PAYLOADS_TOTAL,
            "namespace" => namespace.to_owned(),
            "policy" => policy.as_str(),
        )
        .increment(1);
        match policy {
            InvalidPayload::Retry => Err(HandlerError::retryable(error)),
            InvalidPayload::Permanent => Err(HandlerError::permanent(error)),
            InvalidPayload::Ignore => Ok(()),
        }
    }
}

/// Logs and counts an event no route takes.
fn unrouted<E: Routable>(event: &E, event_type: Option<&EventType<'_>>) {
    let (namespace, id) = (event.route_namespace(), event.route_id());
    // `Debug` of the type escapes it: it comes from the delivery.
    tracing::debug!(
        namespace,
        id,
        ?event_type,
        "no route for the webhook event's type: the fallback runs"
    );
    #[cfg(feature = "metrics")]
    ::metrics::counter!(crate::metrics::UNROUTED_TOTAL, "namespace" => namespace.to_owned())
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = namespace;
}
