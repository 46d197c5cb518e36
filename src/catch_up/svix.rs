//! [`SvixPoller`]: a Svix polling endpoint as an [`EventSource`], for a sender
//! that delivers through Svix (Standard Webhooks) and offers its receivers
//! polling endpoints.
//!
//! A polling endpoint is created in the sender's App Portal, beside the webhook
//! endpoint, with its own URL
//! (`https://api.us.svix.com/api/v1/app/{app_id}/poller/{poller_id}`) and API
//! key (`sk_poll_…`). `GET {url}?iterator=…&limit=…` answers
//! `{"data": [...], "iterator": "...", "done": bool}`, each message with its
//! `id` (the message id, which its webhook deliveries carry as `webhook-id`),
//! `eventType`, `payload` and `timestamp`. The iterator is the cursor; the
//! handler receives the message's `payload`, as a delivery's body.
//!
//! Unlike Stripe's list, a polling endpoint streams every message sent since it
//! was created, delivered or not: the guard answers the delivered ones
//! `Duplicate`. Messages older than the guard's retention are passed over (see
//! the [module docs](super)).
//!
//! Written from Svix's polling-endpoint documentation and its published API
//! client's models, and tested against a local server answering with those
//! shapes, not against Svix.

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::http::{Client, ConfigError};
use super::{EventSource, FetchedEvent, Page, PageRequest, SourceError};

/// A Svix polling endpoint, as an [`EventSource`].
///
/// ```
/// use webhook_guard::catch_up::svix::SvixPoller;
///
/// let source = SvixPoller::new(
///     "https://api.us.svix.com/api/v1/app/app_2mG6/poller/poll_59q",
///     "sk_poll_...",
/// )
/// .unwrap();
/// assert!(!format!("{source:?}").contains("sk_poll_"));
/// ```
#[derive(Debug, Clone)]
pub struct SvixPoller {
    client: Client,
    name: String,
    limit: u16,
}

impl SvixPoller {
    /// A source reading the polling endpoint at `url` with `api_key`, 100
    /// messages a page, its cursor kept under the name `svix-poller`.
    ///
    /// # Errors
    /// [`ConfigError`]: an empty or unprintable key, a URL that is not
    /// `https://` (or `http://` to this machine), or no trusted TLS roots.
    pub fn new(url: &str, api_key: impl Into<String>) -> Result<Self, ConfigError> {
        Ok(Self {
            client: Client::new(url, api_key.into())?,
            name: "svix-poller".to_owned(),
            limit: 100,
        })
    }

    /// The name the cursor is kept under (one per polling endpoint).
    #[must_use]
    pub fn cursor_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Messages per page (default 100, at least 1, at most 250).
    #[must_use]
    pub fn limit(mut self, limit: u16) -> Self {
        self.limit = limit.clamp(1, 250);
        self
    }
}

#[derive(Deserialize)]
struct Polled<'a> {
    #[serde(borrow)]
    data: Vec<Message<'a>>,
    iterator: String,
    done: bool,
}

#[derive(Deserialize)]
struct Message<'a> {
    id: String,
    #[serde(borrow)]
    payload: &'a RawValue,
    timestamp: Option<DateTime<Utc>>,
}

#[derive(Deserialize)]
struct ErrorBody {
    code: Option<String>,
    detail: Option<serde_json::Value>,
}

/// The text of a Svix error body: `code: detail`.
fn describe(body: &[u8]) -> Option<String> {
    let error: ErrorBody = serde_json::from_slice(body).ok()?;
    let detail = match error.detail {
        Some(serde_json::Value::String(text)) => text,
        Some(other) => other.to_string(),
        None => String::new(),
    };
    Some(format!(
        "{}: {detail}",
        error.code.unwrap_or_else(|| "error".into())
    ))
}

#[async_trait]
impl EventSource for SvixPoller {
    fn name(&self) -> &str {
        &self.name
    }

    async fn page(&self, request: &PageRequest<'_>) -> Result<Page, SourceError> {
        let mut query = format!("?limit={}", self.limit);
        if let Some(iterator) = request.cursor {
            if !iterator
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_=.".contains(&b))
            {
                return Err(SourceError::Cursor("not a Svix iterator".into()));
            }
            query.push_str("&iterator=");
            query.push_str(iterator);
        }
        let body = self.client.get(&query, describe).await?;
        let polled: Polled<'_> = serde_json::from_slice(&body)
            .map_err(|e| SourceError::Malformed(format!("not a Svix polling answer: {e}")))?;
        let events: Vec<FetchedEvent> = polled
            .data
            .into_iter()
            .map(|m| {
                let payload = Bytes::copy_from_slice(m.payload.get().as_bytes());
                FetchedEvent::new(m.id, payload, m.timestamp)
            })
            .collect();
        // An empty page is the end for now, whatever `done` says (the first answer
        // of a new endpoint is empty and not done).
        let more = !polled.done && !events.is_empty();
        Ok(Page::new(events, polled.iterator, more))
    }
}
