//! Recovering events the provider never delivered: a catch-up task that lists
//! them from the provider's API and runs each through the guard's own claim,
//! handler and record, so that an event that arrives both by delivery and by the
//! list runs the handler once.
//!
//! An endpoint down longer than the provider's retry window, a provider-side
//! outage or an endpoint the provider disabled loses events silently. Providers
//! keep a list of them: Stripe's List Events with `delivery_success=false` (30
//! days), Svix's polling endpoints. An [`EventSource`] reads such a list page by
//! page from a cursor; a [`CatchUp`] task keeps the cursor in the guard's store and
//! hands each listed event to [`WebhookGuard::handle_fetched`]: the same
//! namespace, deduplication, hooks and escalation as a delivery, without the
//! signature check (the API call authenticated the event).
//!
//! ```no_run
//! # #[cfg(feature = "stripe-catch-up")]
//! # async fn demo(guard: webhook_guard::WebhookGuard) -> Result<(), Box<dyn std::error::Error>> {
//! use webhook_guard::catch_up::{stripe::StripeEvents, CatchUp};
//! use webhook_guard::OwnedEvent;
//!
//! let source = StripeEvents::new(std::env::var("STRIPE_API_KEY")?)?;
//! let task = CatchUp::new(guard, source, |event: OwnedEvent| async move {
//!     // The same handler as the webhook route's.
//!     Ok(())
//! })
//! .spawn();
//! # task.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # The cursor
//!
//! The cursor (where the source's list goes on; its text is the source's) is kept
//! in the guard's store as one record in a namespace of its own
//! ([`cursor_namespace`]), under the source's [name](EventSource::name), through
//! the ordinary [`ProcessedStore`](crate::ProcessedStore) calls, so every store
//! keeps it, a custom one too:
//!
//! 1. a pass claims the record (a lease, as a delivery claims an id): of several
//!    replicas running the task, one lists at a time; the claim answers the
//!    record, whose last history note holds the cursor;
//! 2. it asks the source for the page after the cursor and runs each event;
//! 3. once every event of the page is settled (processed, a duplicate,
//!    escalated, failed for good), it finishes the record (`Failed`, claimable
//!    again) with the page's next cursor; otherwise with the cursor unchanged, and
//!    the next pass lists the page again (its settled events are then duplicates).
//!
//! A process that dies anywhere in between leaves the old cursor: the page is
//! listed again once the record's lease ran out, and nothing is lost. A pass
//! whose lease was taken over (a pause longer than the lease) cannot move the
//! cursor: the finish is fenced by the claim's token.
//!
//! # Events older than the retention
//!
//! The guard remembers an id for its retention. An event created longer ago
//! than that may have been processed on delivery and forgotten since: listing it
//! would run the handler again. A pass therefore asks for nothing created before
//! `now - retention + 10 minutes` ([`PageRequest::not_before`]), and skips (and
//! counts, [`PassReport::too_old`]) any event a source lists from before it. A task
//! stopped for longer than the retention resumes there; give the guard a
//! retention as long as the recovery you need (Stripe lists 30 days).

mod cursor;
mod runner;

#[cfg(any(feature = "stripe-catch-up", feature = "svix-catch-up"))]
mod http;
#[cfg(feature = "stripe-catch-up")]
#[cfg_attr(docsrs, doc(cfg(feature = "stripe-catch-up")))]
pub mod stripe;
#[cfg(feature = "svix-catch-up")]
#[cfg_attr(docsrs, doc(cfg(feature = "svix-catch-up")))]
pub mod svix;

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};

#[cfg(doc)]
use crate::WebhookGuard;
pub use cursor::{cursor_namespace, MAX_CURSOR_LEN};
#[cfg(any(feature = "stripe-catch-up", feature = "svix-catch-up"))]
pub use http::ConfigError;
pub use runner::{CatchUp, CatchUpError, CatchUpHandle, PassReport, DEFAULT_INTERVAL};

/// A boxed error that crosses threads, kept as a [`SourceError`]'s source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// One event as a source listed it.
#[derive(Clone, PartialEq, Eq, derive_more::Debug)]
#[non_exhaustive]
pub struct FetchedEvent {
    /// The event id: the one its deliveries carry (Stripe's `evt_…`, Svix's
    /// `msg_…`, the `webhook-id` of its deliveries), so both routes claim one key.
    pub id: String,
    /// The event's JSON, as the handler receives it.
    #[debug("{:?}", crate::BodyLen(body.len()))]
    pub body: Bytes,
    /// When the provider created the event, when the list says.
    pub created: Option<DateTime<Utc>>,
}

impl FetchedEvent {
    /// An event with its id, body and creation time.
    pub fn new(id: impl Into<String>, body: Bytes, created: Option<DateTime<Utc>>) -> Self {
        Self {
            id: id.into(),
            body,
            created,
        }
    }
}

/// What a pass asks a source for: the page after `cursor`.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct PageRequest<'a> {
    /// Where the list goes on, as a previous [`Page::cursor`] said; `None` at the
    /// first pass (or once the stored cursor expired): start at `not_before`.
    pub cursor: Option<&'a str>,
    /// The time of the pass, on the guard's clock.
    pub now: DateTime<Utc>,
    /// The earliest creation time whose events the guard's records still cover:
    /// list nothing created before it (see the [module docs](self)).
    pub not_before: DateTime<Utc>,
}

impl<'a> PageRequest<'a> {
    /// A request for the page after `cursor` at `now`, nothing before `not_before`.
    pub fn new(cursor: Option<&'a str>, now: DateTime<Utc>, not_before: DateTime<Utc>) -> Self {
        Self {
            cursor,
            now,
            not_before,
        }
    }
}

/// One page of a source's list.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Page {
    /// The events, in the order to run them (oldest first, where the source can).
    pub events: Vec<FetchedEvent>,
    /// Where the list goes on after this page: kept once every event of the page
    /// is settled. Printable ASCII, at most [`MAX_CURSOR_LEN`] bytes.
    pub cursor: String,
    /// Whether the next page may be asked for at once; `false` when the list is
    /// caught up to now (the task waits for its interval).
    pub more: bool,
}

impl Page {
    /// A page of `events`, going on at `cursor`.
    pub fn new(events: Vec<FetchedEvent>, cursor: impl Into<String>, more: bool) -> Self {
        Self {
            events,
            cursor: cursor.into(),
            more,
        }
    }
}

/// Why a source could not list a page. The text never holds an API key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The provider kept answering 429 Too Many Requests.
    #[error("rate limited by the provider after {attempts} attempts")]
    RateLimited {
        /// Requests made for the page.
        attempts: u32,
    },
    /// The provider could not be reached, or kept answering 5xx.
    #[error("provider unavailable: {source}")]
    Unavailable {
        /// The cause.
        #[source]
        source: BoxError,
    },
    /// The provider refused the request (a 4xx other than 429: a wrong API key, a
    /// parameter it does not take), with its own error's text.
    #[error("provider refused the request ({status}): {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The provider's error type and message (the API key removed).
        message: String,
    },
    /// The answer is not the shape the source reads.
    #[error("unexpected answer from the provider: {0}")]
    Malformed(String),
    /// The stored cursor is not one this source wrote.
    #[error("cursor not understood by this source: {0}")]
    Cursor(String),
}

impl SourceError {
    /// A [`SourceError::Unavailable`] wrapping `source`.
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            source: source.into(),
        }
    }
}

/// A provider's list of events, read page by page from a cursor.
///
/// # Contract
///
/// - [`EventSource::page`] answers the events after `request.cursor` (from
///   `request.not_before` when there is none), and the cursor after them. It
///   keeps no state between calls: the cursor says everything, so a restarted
///   process (or another replica) goes on from the stored one.
/// - Asked again with the same cursor, it answers the same events again, or
///   events after them: a page is listed again whenever the pass before could
///   not settle it, and nothing may be skipped then.
/// - Each event's [`FetchedEvent::id`] is the id its deliveries carry, which the
///   guard's verifier reads: that is what makes the two routes one event.
/// - Errors are typed ([`SourceError`]) and never show a credential; rate
///   limiting is the source's to wait out (with a bound) before answering
///   [`SourceError::RateLimited`].
///
/// Declared with [`async_trait`](macro@async_trait), as the store traits are:
/// put `#[async_trait]` (re-exported as `webhook_guard::store::async_trait`) on
/// the impl too.
#[async_trait]
pub trait EventSource: fmt::Debug + Send + Sync + 'static {
    /// The source's name, under which its cursor is kept (one cursor per guard
    /// namespace and name), such as `"stripe-events"`: at most 255 bytes, no
    /// control characters.
    fn name(&self) -> &str;

    /// The page after `request.cursor`.
    async fn page(&self, request: &PageRequest<'_>) -> Result<Page, SourceError>;
}

#[async_trait]
impl<S: EventSource + ?Sized> EventSource for std::sync::Arc<S> {
    fn name(&self) -> &str {
        (**self).name()
    }

    async fn page(&self, request: &PageRequest<'_>) -> Result<Page, SourceError> {
        (**self).page(request).await
    }
}

#[async_trait]
impl<S: EventSource + ?Sized> EventSource for Box<S> {
    fn name(&self) -> &str {
        (**self).name()
    }

    async fn page(&self, request: &PageRequest<'_>) -> Result<Page, SourceError> {
        (**self).page(request).await
    }
}
