//! What a delivery is to the guard and to its handler: where its event id is
//! ([`EventId`]), what verification found ([`VerifiedDelivery`]), the event a
//! handler receives ([`Event`], [`OwnedEvent`]) and why its lease could not be
//! renewed ([`LeaseError`]).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::state::ClaimState;
use crate::meta::EventMeta;
use crate::outcome::Rejection;
use crate::store::StoreError;
use crate::verify::Verified;
use crate::Headers;

/// The longest event id accepted, in bytes.
pub const MAX_ID_LEN: usize = 255;

/// A function that finds the event id in a delivery's headers and body.
pub type IdExtractor = dyn Fn(&dyn Headers, &[u8]) -> Option<String> + Send + Sync;

/// Where the guard finds a delivery's event id.
#[derive(Clone)]
#[non_exhaustive]
pub enum EventId {
    /// The id the verifier found (provider presets know where their provider puts it).
    FromVerifier,
    /// A request header.
    Header(Cow<'static, str>),
    /// A field of the JSON body, given as a path of object keys, read without
    /// building the document.
    JsonField(Vec<String>),
    /// A function of the headers and body.
    Custom(Arc<IdExtractor>),
}

impl EventId {
    /// The id in header `name`.
    pub fn header(name: impl Into<Cow<'static, str>>) -> Self {
        Self::Header(name.into())
    }

    /// The id at `path` in the JSON body, such as `["id"]`.
    pub fn json_field<S: Into<String>>(path: impl IntoIterator<Item = S>) -> Self {
        Self::JsonField(path.into_iter().map(Into::into).collect())
    }

    pub(super) fn extract(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        verified: Verified,
    ) -> Result<String, Rejection> {
        match self {
            Self::FromVerifier => verified.event_id.ok_or_else(|| {
                Rejection::MissingId("the verifier found no event id; configure EventId".into())
            }),
            Self::Header(name) => headers
                .get_str(name)
                .map(str::to_owned)
                .ok_or_else(|| Rejection::MissingId(format!("header `{name}` is missing"))),
            Self::JsonField(path) => {
                let path: Vec<&str> = path.iter().map(String::as_str).collect();
                crate::json::field(body, &path).map_err(|e| Rejection::MissingId(e.to_string()))
            }
            Self::Custom(f) => {
                f(headers, body).ok_or_else(|| Rejection::MissingId("custom extractor".into()))
            }
        }
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FromVerifier => f.write_str("FromVerifier"),
            Self::Header(h) => f.debug_tuple("Header").field(h).finish(),
            Self::JsonField(p) => f.debug_tuple("JsonField").field(p).finish(),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

pub(super) fn check_id(id: &str) -> Result<(), Rejection> {
    if id.is_empty() {
        Err(Rejection::InvalidId("empty"))
    } else if id.len() > MAX_ID_LEN {
        Err(Rejection::InvalidId("longer than 255 bytes"))
    } else if has_control(id) {
        Err(Rejection::InvalidId("contains control characters"))
    } else {
        Ok(())
    }
}

/// Whether `id` holds a control character: printable ASCII (almost every id) is
/// told without decoding.
fn has_control(id: &str) -> bool {
    !id.bytes().all(|b| (0x20..0x7f).contains(&b)) && id.chars().any(char::is_control)
}

/// How a delivery ends before its id is claimed: refused, or a handshake to answer
/// (boxed: it is rare, and keeps every delivery's result small).
pub(super) enum Early {
    Rejected(Rejection),
    Handshake(Box<crate::verify::Handshake>),
}

impl Early {
    pub(super) fn into_outcome(self) -> crate::Outcome {
        match self {
            Self::Rejected(rejection) => crate::Outcome::Rejected(rejection),
            Self::Handshake(handshake) => crate::Outcome::Handshake(*handshake),
        }
    }
}

impl From<Rejection> for Early {
    fn from(rejection: Rejection) -> Self {
        Self::Rejected(rejection)
    }
}

impl From<crate::verify::VerifyError> for Early {
    fn from(error: crate::verify::VerifyError) -> Self {
        Self::Rejected(error.into())
    }
}

/// A delivery that passed verification, with its event id.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifiedDelivery {
    /// The event id.
    pub id: String,
    /// The signed timestamp, where the scheme signs one.
    pub signed_at: Option<DateTime<Utc>>,
    /// Type, creation time and target object, as configured with
    /// [`WebhookGuardBuilder::event_meta`](crate::WebhookGuardBuilder::event_meta).
    pub meta: EventMeta,
    /// Set when the request was the provider's handshake: answer it; `id` is then
    /// empty and `meta` default, as there is no event.
    pub handshake: Option<crate::verify::Handshake>,
}

/// The event handed to a handler. It borrows the body for `'a` and shares the claim,
/// so a handler can be any closure returning an `async move` block.
#[derive(Clone)]
pub struct Event<'a> {
    pub(super) body: &'a [u8],
    pub(super) claim: Arc<ClaimState>,
}

impl fmt::Debug for Event<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_event(f, "Event", &self.claim, self.body)
    }
}

/// The `Debug` of an event: its id, its attempt and its body's length only.
fn debug_event(
    f: &mut fmt::Formatter<'_>,
    name: &str,
    claim: &ClaimState,
    body: &[u8],
) -> fmt::Result {
    f.debug_struct(name)
        .field("id", &claim.id)
        .field("attempt", &claim.record.attempts)
        .field("body", &crate::BodyLen(body.len()))
        .finish()
}

impl<'a> Event<'a> {
    /// The event id.
    pub fn id(&self) -> &str {
        &self.claim.id
    }

    /// The raw body, exactly as received and verified.
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// Which claim of this id this is (1 for the first claim).
    pub fn attempt(&self) -> u32 {
        self.claim.record.attempts
    }

    /// Parses the body as JSON.
    ///
    /// # Errors
    /// The parser's error.
    pub fn json<T: serde::Deserialize<'a>>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(self.body)
    }

    /// Extends this claim's lease by the guard's lease duration from now (to the
    /// delivery's deadline at most, for one run by
    /// [`WebhookGuard::handle_owned_until`](crate::WebhookGuard::handle_owned_until)).
    ///
    /// # Errors
    /// [`LeaseError::Lost`] if another delivery took the claim over, or the store's error.
    pub async fn renew_lease(&self) -> Result<(), LeaseError> {
        self.claim.renew().await
    }
}

/// An [`Event`] that owns its body: what [`WebhookGuard::handle_owned`](crate::WebhookGuard::handle_owned) and the
/// framework integrations hand to a handler, so its future can be `'static`.
///
/// Cloning is cheap (the body is a [`Bytes`], the claim is shared).
#[derive(Clone)]
pub struct OwnedEvent {
    pub(super) body: Bytes,
    pub(super) claim: Arc<ClaimState>,
}

impl fmt::Debug for OwnedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_event(f, "OwnedEvent", &self.claim, &self.body)
    }
}

impl OwnedEvent {
    /// The event id.
    pub fn id(&self) -> &str {
        &self.claim.id
    }

    /// The raw body, exactly as received and verified.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The raw body as [`Bytes`] (a cheap clone).
    pub fn bytes(&self) -> Bytes {
        self.body.clone()
    }

    /// Which claim of this id this is (1 for the first claim).
    pub fn attempt(&self) -> u32 {
        self.claim.record.attempts
    }

    /// Parses the body as JSON.
    ///
    /// # Errors
    /// The parser's error.
    pub fn json<'de, T: serde::Deserialize<'de>>(&'de self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// Extends this claim's lease by the guard's lease duration from now (to the
    /// delivery's deadline at most, for one run by
    /// [`WebhookGuard::handle_owned_until`](crate::WebhookGuard::handle_owned_until)).
    ///
    /// # Errors
    /// [`LeaseError::Lost`] if another delivery took the claim over, or the store's error.
    pub async fn renew_lease(&self) -> Result<(), LeaseError> {
        self.claim.renew().await
    }
}

/// Why a lease could not be renewed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The lease was taken over or the record finished: stop working on this claim.
    #[error("lease lost")]
    Lost,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[cfg(test)]
mod tests {
    use super::has_control;

    #[test]
    fn control_characters_are_found_in_ascii_and_beyond() {
        for id in ["evt_1NDEXAMPLE", "a b~!", "évènement", "事件-1", ""] {
            assert!(!has_control(id), "{id:?}");
        }
        for id in ["evt\t1", "evt\r\n", "\x7f", "evt\u{85}", "é\u{9f}", "\0"] {
            assert!(has_control(id), "{id:?}");
        }
    }
}
