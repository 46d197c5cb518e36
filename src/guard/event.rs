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
use crate::meta::{EventMeta, EventType, TypeHeader, TypeSource};
use crate::outcome::Rejection;
use crate::store::StoreError;
use crate::verify::Verified;
use crate::Headers;

use super::WebhookGuard;

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
        Err(Rejection::InvalidId(
            "contains control, format or line/paragraph separator characters",
        ))
    } else {
        Ok(())
    }
}

/// Whether `id` holds a character of Unicode general category `Cc` (control), `Cf`
/// (format: bidi overrides, zero-width characters) or `Zl` / `Zp` (line and
/// paragraph separators), which would make an id print as another or break a log
/// line: printable ASCII (almost every id) is told without decoding.
fn has_control(id: &str) -> bool {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory as _};
    !id.bytes().all(|b| (0x20..0x7f).contains(&b))
        && id.chars().any(|c| {
            matches!(
                c.general_category(),
                GeneralCategory::Control
                    | GeneralCategory::Format
                    | GeneralCategory::LineSeparator
                    | GeneralCategory::ParagraphSeparator
            )
        })
}

/// What verification found that a claim needs: the event id, the signed time, and
/// the event type's header when the guard's type source names one.
pub(super) struct Checked {
    pub(super) id: String,
    pub(super) signed_at: Option<DateTime<Utc>>,
    pub(super) type_header: Option<TypeHeader>,
    /// The content key, for a scheme whose id is not signed (`content.rs`).
    pub(super) content_key: Option<[u8; 32]>,
}

impl Checked {
    pub(super) fn new(
        id: String,
        signed_at: Option<DateTime<Utc>>,
        type_header: Option<TypeHeader>,
    ) -> Self {
        Self {
            id,
            signed_at,
            type_header,
            content_key: None,
        }
    }

    /// The delivery's type as `source` finds it, as text.
    pub(super) fn event_type(&self, source: Option<&TypeSource>, body: &[u8]) -> Option<String> {
        let found = source?.read(self.type_header.as_ref(), body)?;
        Some(found.to_string())
    }
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
    /// [`WebhookGuardBuilder::event_meta`](crate::WebhookGuardBuilder::event_meta);
    /// where that finds no type, the type the guard's
    /// [type source](crate::WebhookGuardBuilder::event_type) finds (GitHub's and
    /// Shopify's, in a header).
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

/// The methods [`Event`] and [`OwnedEvent`] share: what they read from their claim.
macro_rules! claim_accessors {
    () => {
        /// The event id.
        pub fn id(&self) -> &str {
            &self.claim.id
        }

        /// The tenant the event was delivered for, when its guard serves one (see
        /// [`crate::tenant`]).
        pub fn tenant(&self) -> Option<&str> {
            self.claim.guard.tenant_id()
        }

        /// The namespace the event's record lives in (with a tenant's guard, the
        /// tenant's).
        pub fn namespace(&self) -> &str {
            self.claim.guard.namespace()
        }

        /// Which claim of this id this is (1 for the first claim).
        pub fn attempt(&self) -> u32 {
            self.claim.record.attempts
        }

        /// The namespace its delivery is reported under (metrics labels).
        pub(crate) fn reported_namespace(&self) -> &str {
            self.claim.guard.reported_namespace()
        }

        /// Extends this claim's lease by the guard's lease duration from now (to the
        /// delivery's deadline at most, for one run by
        /// [`WebhookGuard::handle_owned_until`](crate::WebhookGuard::handle_owned_until)).
        ///
        /// # Errors
        /// [`LeaseError::Lost`] if another delivery took the claim over, or the store's
        /// error.
        pub async fn renew_lease(&self) -> Result<(), LeaseError> {
            self.claim.renew().await
        }
    };
}

impl<'a> Event<'a> {
    claim_accessors!();

    /// The raw body, exactly as received and verified.
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// The event's type, from where the guard's type source says (for a preset,
    /// where its provider puts it: Stripe's `type`, GitHub's `X-GitHub-Event` and
    /// `action`, ...): `None` when the guard has no type source or the delivery has
    /// no type there. Body fields are read on each call (one pass over the body),
    /// borrowed from it; a header was kept when the delivery was verified.
    pub fn event_type(&self) -> Option<EventType<'_>> {
        self.claim.event_type(self.body)
    }

    /// Parses the body as JSON.
    ///
    /// # Errors
    /// The parser's error.
    pub fn json<T: serde::Deserialize<'a>>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(self.body)
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
    claim_accessors!();

    /// The raw body, exactly as received and verified.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The raw body as [`Bytes`] (a cheap clone).
    pub fn bytes(&self) -> Bytes {
        self.body.clone()
    }

    /// The event's type: see [`Event::event_type`].
    pub fn event_type(&self) -> Option<EventType<'_>> {
        self.claim.event_type(&self.body)
    }

    /// Parses the body as JSON.
    ///
    /// # Errors
    /// The parser's error.
    pub fn json<'de, T: serde::Deserialize<'de>>(&'de self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
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

/// Verification alone, without the store (for hosts and the inbox), and the
/// namespace deliveries are reported under.
impl WebhookGuard {
    /// The namespace its deliveries are reported under: for a tenant's guard, the
    /// guard that serves the tenants' (one metrics series per guard).
    pub(crate) fn reported_namespace(&self) -> &str {
        let served = self.inner.served.as_ref();
        served.map_or(&self.inner.namespace, |served| &served.namespace)
    }

    /// Verifies a delivery and extracts its id, without touching the store.
    ///
    /// # Errors
    /// The [`Rejection`]: body too large, signature not verified, id missing or invalid.
    pub fn verify(
        &self,
        headers: &dyn Headers,
        body: &[u8],
    ) -> Result<VerifiedDelivery, Rejection> {
        self.verify_at(headers, body, self.inner.clock.now())
    }

    /// [`WebhookGuard::verify`] at `now`, the delivery's arrival: the flow reads the
    /// clock once and uses the time for the signature's tolerance and the claim.
    pub(super) fn verify_at(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<VerifiedDelivery, Rejection> {
        let checked = match self.verify_id_at(headers, body, now) {
            Ok(checked) => checked,
            Err(Early::Rejected(rejection)) => return Err(rejection),
            Err(Early::Handshake(handshake)) => {
                return Ok(VerifiedDelivery {
                    id: String::new(),
                    signed_at: None,
                    meta: EventMeta::default(),
                    handshake: Some(*handshake),
                })
            }
        };
        let mut meta = self.inner.meta.extract(body);
        if meta.event_type.is_none() {
            // A type the body alone does not give (GitHub's, Shopify's header).
            meta.event_type = checked.event_type(self.inner.event_type.as_ref(), body);
        }
        Ok(VerifiedDelivery {
            id: checked.id,
            signed_at: checked.signed_at,
            meta,
            handshake: None,
        })
    }
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
        // Format (bidi overrides, zero-width, BOM) and line / paragraph separators.
        for id in [
            "evt_1\u{202e}",
            "evt\u{200b}1",
            "\u{2066}evt",
            "\u{feff}evt_1",
            "evt\u{2028}1",
            "evt\u{2029}1",
            "evt\u{ad}1",
        ] {
            assert!(has_control(id), "{id:?}");
        }
        // Spaces (Zs) and other non-ASCII letters stay allowed.
        for id in ["evt\u{a0}1", "evt\u{3000}1", "ид-1"] {
            assert!(!has_control(id), "{id:?}");
        }
    }
}
