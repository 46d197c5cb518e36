//! [`StripeEvents`]: Stripe's List Events (`GET /v1/events`) as an
//! [`EventSource`], listing the events not yet delivered to every endpoint.
//!
//! Stripe lists events newest first, and pages to older ones with
//! `starting_after`. So the source walks time forward in **windows** of
//! creation time (`created[gte]`, `created[lte]`, one hour by default) and pages
//! through each window newest first; the cursor names the window and the last
//! event listed in it (`s1:FROM:TO:AFTER`, seconds since the epoch), and moves to
//! the next window once a page comes back with `has_more: false`. A window
//! never reaches past `now - delay` (10 minutes by default): a younger event is
//! most likely being delivered right now, and Stripe's list may not show every
//! event of the last seconds yet. Within a page, events are handed over oldest
//! first.
//!
//! Only events with `delivery_success=false` are listed: Stripe's "events which
//! are still pending or have failed all delivery attempts to a webhook
//! endpoint", to any of the account's endpoints, so an event delivered to yours
//! but not to another one is listed too (and answered `Duplicate` by the guard).
//! List Events goes back 30 days; the task asks for nothing older than the
//! guard's retention allows (see the [module docs](super)).
//!
//! Tested against a local server answering with the response shapes of
//! Stripe's API reference (lists, `has_more`, 429, error objects), not against
//! the live API.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, TimeDelta, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::http::{Client, ConfigError};
use super::{EventSource, FetchedEvent, Page, PageRequest, SourceError};

/// Stripe's API.
pub const STRIPE_API: &str = "https://api.stripe.com";

/// Stripe's List Events, as an [`EventSource`].
///
/// ```
/// use std::time::Duration;
/// use webhook_guard::catch_up::stripe::StripeEvents;
///
/// let source = StripeEvents::builder("sk_test_...")
///     .window(Duration::from_secs(3600))
///     .build()
///     .unwrap();
/// assert!(!format!("{source:?}").contains("sk_test_"));
/// ```
#[derive(Debug, Clone)]
pub struct StripeEvents {
    client: Client,
    name: String,
    limit: u8,
    window: i64,
    delay: TimeDelta,
}

/// Builds a [`StripeEvents`].
#[derive(Debug)]
#[must_use]
pub struct StripeEventsBuilder {
    key: ApiKeyText,
    base: String,
    account: Option<String>,
    name: Option<String>,
    limit: u8,
    window: Duration,
    delay: Duration,
}

/// The key as given, never shown.
struct ApiKeyText(String);

impl std::fmt::Debug for ApiKeyText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl StripeEvents {
    /// A source reading `https://api.stripe.com` with `api_key` (a secret key
    /// `sk_…` or a restricted key `rk_…` allowed to read events), with the
    /// defaults.
    ///
    /// # Errors
    /// [`ConfigError`]: an empty or unprintable key, or no trusted TLS roots.
    pub fn new(api_key: impl Into<String>) -> Result<Self, ConfigError> {
        Self::builder(api_key).build()
    }

    /// A builder for a source with `api_key`.
    pub fn builder(api_key: impl Into<String>) -> StripeEventsBuilder {
        StripeEventsBuilder {
            key: ApiKeyText(api_key.into()),
            base: STRIPE_API.to_owned(),
            account: None,
            name: None,
            limit: 100,
            window: Duration::from_secs(3600),
            delay: Duration::from_secs(600),
        }
    }
}

impl StripeEventsBuilder {
    /// The API's base URL (default `https://api.stripe.com`): `https://`, or
    /// `http://` to this machine only (a test server).
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base = url.into();
        self
    }

    /// Lists the events of a connected account (`Stripe-Account` header), for a
    /// Connect platform; the cursor's name then holds the account.
    pub fn account(mut self, account: impl Into<String>) -> Self {
        self.account = Some(account.into());
        self
    }

    /// The name the cursor is kept under (default `stripe-events`, or
    /// `stripe-events:ACCOUNT`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Events per page, 1 to 100 (default 100, Stripe's largest).
    pub fn limit(mut self, limit: u8) -> Self {
        self.limit = limit.clamp(1, 100);
        self
    }

    /// The span of creation time one window covers (default one hour; at least
    /// one second).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window.clamp(Duration::from_secs(1), crate::CENTURY);
        self
    }

    /// How old an event must be before it is listed (default 10 minutes).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay.min(crate::CENTURY);
        self
    }

    /// The source.
    ///
    /// # Errors
    /// [`ConfigError`]: an empty or unprintable key, a base URL that is not
    /// `https://` (or `http://` to this machine), an account that cannot be a
    /// header, or no trusted TLS roots.
    pub fn build(self) -> Result<StripeEvents, ConfigError> {
        let mut client = Client::new(&self.base, self.key.0)?;
        if let Some(account) = &self.account {
            client.header("stripe-account", account)?;
        }
        let name = match (self.name, &self.account) {
            (Some(name), _) => name,
            (None, Some(account)) => format!("stripe-events:{account}"),
            (None, None) => "stripe-events".to_owned(),
        };
        Ok(StripeEvents {
            client,
            name,
            limit: self.limit,
            window: i64::try_from(self.window.as_secs()).unwrap_or(i64::MAX),
            delay: TimeDelta::from_std(self.delay).unwrap_or(TimeDelta::MAX),
        })
    }
}

/// Where the list stands: the next window starts at `from`; while a window is
/// being paged, its end and the last event listed in it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cursor {
    from: i64,
    window: Option<(i64, Option<String>)>,
}

impl Cursor {
    fn parse(text: &str) -> Result<Self, SourceError> {
        let bad = || SourceError::Cursor(format!("not a Stripe events cursor: {text:?}"));
        let mut parts = text.split(':');
        if parts.next() != Some("s1") {
            return Err(bad());
        }
        let from = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let window = match (parts.next(), parts.next()) {
            (None, None) => None,
            (Some(to), Some(after)) => {
                let to = to.parse().map_err(|_| bad())?;
                let after = (!after.is_empty()).then(|| after.to_owned());
                if after.as_deref().is_some_and(|a| !is_event_id(a)) {
                    return Err(bad());
                }
                Some((to, after))
            }
            _ => return Err(bad()),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self { from, window })
    }

    fn text(&self) -> String {
        match &self.window {
            None => format!("s1:{}", self.from),
            Some((to, after)) => {
                format!("s1:{}:{to}:{}", self.from, after.as_deref().unwrap_or(""))
            }
        }
    }
}

/// Whether `id` looks like a Stripe object id (letters, digits, `_`).
fn is_event_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 255 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whole seconds at or after `t`.
fn ceil_secs(t: DateTime<Utc>) -> i64 {
    t.timestamp() + i64::from(t.timestamp_subsec_nanos() > 0)
}

#[derive(Deserialize)]
struct List<'a> {
    object: &'a str,
    #[serde(borrow)]
    data: Vec<&'a RawValue>,
    has_more: bool,
}

#[derive(Deserialize)]
struct Listed {
    id: String,
    created: i64,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorObject,
}

#[derive(Deserialize)]
struct ErrorObject {
    #[serde(rename = "type")]
    kind: Option<String>,
    code: Option<String>,
    message: Option<String>,
}

/// The text of a Stripe error object: `type (code): message`.
fn describe(body: &[u8]) -> Option<String> {
    let ErrorBody { error } = serde_json::from_slice(body).ok()?;
    let kind = error.kind.unwrap_or_else(|| "error".into());
    let code = error.code.map(|c| format!(" ({c})")).unwrap_or_default();
    Some(format!(
        "{kind}{code}: {}",
        error.message.unwrap_or_default()
    ))
}

#[async_trait]
impl EventSource for StripeEvents {
    fn name(&self) -> &str {
        &self.name
    }

    async fn page(&self, request: &PageRequest<'_>) -> Result<Page, SourceError> {
        let floor = ceil_secs(request.not_before);
        let stored = request.cursor.map(Cursor::parse).transpose()?;
        let from = stored.as_ref().map_or(floor, |c| c.from.max(floor));
        let end = (request.now - self.delay).timestamp();
        let (to, after) = match stored.and_then(|c| c.window) {
            // A window begun, unless the retention's edge passed all of it.
            Some((to, after)) if to >= from => (to, after),
            _ if from > end => {
                let cursor = Cursor { from, window: None };
                return Ok(Page::new(Vec::new(), cursor.text(), false));
            }
            _ => (from.saturating_add(self.window - 1).min(end), None),
        };
        let mut query = format!(
            "/v1/events?delivery_success=false&limit={}&created%5Bgte%5D={from}&created%5Blte%5D={to}",
            self.limit
        );
        if let Some(after) = &after {
            query.push_str("&starting_after=");
            query.push_str(after);
        }
        let body = self.client.get(&query, describe).await?;
        let list: List<'_> = serde_json::from_slice(&body)
            .map_err(|e| SourceError::Malformed(format!("not a Stripe list: {e}")))?;
        if list.object != "list" {
            return Err(SourceError::Malformed(format!(
                "object {:?}, not \"list\"",
                list.object
            )));
        }
        let mut events = Vec::with_capacity(list.data.len());
        for raw in &list.data {
            let Listed { id, created } = serde_json::from_str(raw.get()).map_err(|e| {
                SourceError::Malformed(format!("an event without id or created: {e}"))
            })?;
            if !is_event_id(&id) {
                return Err(SourceError::Malformed(
                    "an event id that is not a Stripe id".into(),
                ));
            }
            let created = DateTime::from_timestamp(created, 0);
            let body = Bytes::copy_from_slice(raw.get().as_bytes());
            events.push(FetchedEvent::new(id, body, created));
        }
        let next = if list.has_more {
            // Newest first: the last one listed is where the window goes on.
            let last = events
                .last()
                .ok_or_else(|| SourceError::Malformed("has_more with an empty page".into()))?;
            Cursor {
                from,
                window: Some((to, Some(last.id.clone()))),
            }
        } else {
            Cursor {
                from: to.saturating_add(1),
                window: None,
            }
        };
        let more = list.has_more || to < end;
        events.reverse();
        Ok(Page::new(events, next.text(), more))
    }
}

#[cfg(test)]
mod tests {
    use super::{describe, Cursor};

    #[test]
    fn cursors_read_back_what_they_wrote() {
        for cursor in [
            Cursor {
                from: 1_700_000_000,
                window: None,
            },
            Cursor {
                from: 1,
                window: Some((3_600, None)),
            },
            Cursor {
                from: 1,
                window: Some((3_600, Some("evt_1Nx".into()))),
            },
        ] {
            assert_eq!(Cursor::parse(&cursor.text()).unwrap(), cursor);
        }
        for bad in [
            "",
            "s1",
            "s2:1",
            "s1:x",
            "s1:1:2",
            "s1:1:2:evt&x",
            "s1:1:2:e:3",
        ] {
            assert!(Cursor::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stripe_errors_read_as_type_code_message() {
        let body = br#"{"error":{"code":"rate_limit","message":"Too many requests","type":"invalid_request_error"}}"#;
        assert_eq!(
            describe(body).unwrap(),
            "invalid_request_error (rate_limit): Too many requests"
        );
        assert_eq!(describe(b"<html>"), None);
    }
}
