//! Signature verification: the [`Verifier`] trait and the verifiers shipped with the crate.
//!
//! A verifier turns `(headers, raw body, now)` into a [`Verified`] delivery or a
//! [`VerifyError`] that says what was wrong. It knows nothing of stores. It works on
//! the raw body bytes and never re-serializes JSON.
//!
//! # Request context
//!
//! Some schemes sign more than headers and body: HubSpot v3 signs the method and
//! URL, Twilio the URL with its query, and Meta's subscription check is a `GET`
//! whose parameters are in the query. A verifier reads these through
//! [`Headers::method`] and [`Headers::target`]. The integrations pass them (they
//! give the guard the request's `http::request::Parts`, or actix's `HttpRequest`);
//! a host that calls [`WebhookGuard::handle`](crate::WebhookGuard::handle) itself
//! passes an [`http::Request`], its `Parts`, or a
//! [`RequestHead`](crate::RequestHead) around its header map. A bare header map
//! answers `None` to both: the presets that need them say what they do then.
//!
//! # Handshakes
//!
//! A verifier that recognizes its provider's handshake (a request that checks the
//! endpoint rather than delivering an event) returns
//! [`Verified::with_handshake`] once the request has verified, and the guard
//! answers it itself: see [`Handshake`].

mod adyen;
mod calendly;
mod common;
#[cfg(feature = "ed25519")]
mod discord;
mod dropbox;
mod generic;
mod github;
mod gitlab;
mod handshake;
mod hmac_header;
mod hubspot;
mod intercom;
mod jamm;
mod linear;
mod macros;
mod mailgun;
mod meta;
mod paddle;
mod provider;
mod request;
mod secret;
#[cfg(feature = "sendgrid")]
mod sendgrid;
mod shopify;
mod slack;
mod square;
mod standard;
mod stripe;
#[cfg(test)]
mod testing;
mod twilio;
mod twitch;
mod typeform;
mod zoom;

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

pub use adyen::{Adyen, AdyenItem};
pub use calendly::Calendly;
#[cfg(feature = "ed25519")]
#[cfg_attr(docsrs, doc(cfg(feature = "ed25519")))]
pub use discord::Discord;
pub use dropbox::Dropbox;
pub use generic::{GenericHmac, Template, TemplateError};
pub use github::GitHub;
pub use gitlab::GitLab;
pub use handshake::Handshake;
pub use hmac_header::{Encoding, HmacSha256Header, KeyError};
pub use hubspot::HubSpot;
pub use intercom::Intercom;
pub use jamm::Jamm;
pub use linear::Linear;
pub use mailgun::Mailgun;
pub use meta::Meta;
pub use paddle::Paddle;
pub use provider::{Provider, UnknownProvider};
pub use secret::{Secret, SecretFormat};
#[cfg(feature = "sendgrid")]
#[cfg_attr(docsrs, doc(cfg(feature = "sendgrid")))]
pub use sendgrid::SendGrid;
pub use shopify::Shopify;
pub use slack::Slack;
pub use square::Square;
pub use standard::StandardWebhooks;
pub use stripe::Stripe;
pub use twilio::Twilio;
pub use twitch::{Revocation, Twitch};
pub use typeform::Typeform;
pub use zoom::Zoom;

use crate::Headers;

/// What a successful verification learned about the delivery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verified {
    /// The event id, where the provider puts one where this verifier looks
    /// (a header or a body field). The guard uses it unless configured otherwise.
    pub event_id: Option<String>,
    /// The signed timestamp, where the scheme signs one.
    pub signed_at: Option<DateTime<Utc>>,
    /// Set when the request is the provider's handshake, not an event: the guard
    /// answers it (see [`Handshake`]) without looking for an event id, claiming
    /// anything or running the handler.
    pub handshake: Option<Handshake>,
}

impl Verified {
    /// A verification result carrying an event id.
    pub fn with_event_id(id: impl Into<String>) -> Self {
        Self {
            event_id: Some(id.into()),
            ..Self::default()
        }
    }

    /// The result of a scheme that signs no time, for a delivery (no handshake)
    /// with `event_id`, if any.
    pub(crate) fn untimed(event_id: Option<String>) -> Self {
        Self {
            event_id,
            ..Self::default()
        }
    }

    /// A verified handshake, to be answered with `handshake`.
    pub fn with_handshake(handshake: Handshake) -> Self {
        Self {
            handshake: Some(handshake),
            ..Self::default()
        }
    }

    /// Sets the signed timestamp.
    #[must_use]
    pub fn signed_at(mut self, at: DateTime<Utc>) -> Self {
        self.signed_at = Some(at);
        self
    }
}

/// Checks that a delivery was sent by the provider.
///
/// Implementations must compare MACs in constant time, bound their work on hostile
/// input, and never put secret material in `Debug` output or errors.
#[auto_impl::auto_impl(Arc, Box)]
pub trait Verifier: fmt::Debug + Send + Sync + 'static {
    /// Verifies the delivery made of `headers` and the raw `body`, at time `now`.
    ///
    /// # Errors
    /// A [`VerifyError`] saying why the delivery is not trusted.
    fn verify(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Verified, VerifyError>;

    /// How long the provider keeps retrying one event, if known. The guard's default
    /// retention is at least this long.
    fn retry_window(&self) -> Option<Duration> {
        None
    }

    /// How many times the provider delivers one event at most (its first attempt and
    /// its retries), if known. The guard's default `escalate_after` is at most this,
    /// so that an event the handler keeps failing is escalated (alert, reconcile)
    /// before the provider gives up.
    fn deliveries(&self) -> Option<u32> {
        None
    }

    /// How long the provider waits for an answer before it counts the attempt as
    /// failed (and retries), if known. The guard's default answer deadline is four
    /// fifths of it (see [`WebhookGuardBuilder::answer_deadline`]).
    ///
    /// [`WebhookGuardBuilder::answer_deadline`]: crate::WebhookGuardBuilder::answer_deadline
    fn answer_timeout(&self) -> Option<Duration> {
        None
    }

    /// How far from `now` a signed timestamp may lie and still verify, for a scheme
    /// that signs one. The guard refuses a retention shorter than twice this: a
    /// replay the signature still accepts must find its id remembered.
    fn tolerance(&self) -> Option<Duration> {
        None
    }

    /// Whether the provider re-signs a retry with a different body (for example a
    /// fresh timestamp inside it). The guard then does not answer a changed body
    /// under a known id as a conflict, unless told to.
    fn body_changes_on_retry(&self) -> bool {
        false
    }

    /// Where this provider puts an event's type, creation time and target object, if
    /// the preset knows. The guard uses it unless configured otherwise.
    fn event_meta(&self) -> Option<crate::meta::MetaExtractor> {
        None
    }

    /// Where this provider puts an event's type (a body field, a header, a header
    /// and an action), if the preset knows: what
    /// [`Event::event_type`](crate::Event::event_type) reads and the
    /// [router](crate::route::Router) dispatches on. The guard uses it unless
    /// configured otherwise
    /// ([`WebhookGuardBuilder::event_type`](crate::WebhookGuardBuilder::event_type)).
    fn event_type(&self) -> Option<crate::meta::TypeSource> {
        None
    }

    /// A verifier of the same scheme and settings (tolerance, headers, template...)
    /// keyed with `secrets` instead of this one's: how a guard serving many tenants
    /// makes each tenant's verifier from the one it was built with (see
    /// [`crate::tenant`]). `None` for a verifier that cannot be keyed so (the
    /// default; [`NoVerification`]). Every preset, [`HmacSha256Header`] and
    /// [`GenericHmac`] can; a [`StandardWebhooks::ed25519`] verifier takes `whpk_`
    /// public keys as its "secrets".
    ///
    /// # Errors
    /// Inside the `Some`: the [`KeyError`] the scheme's constructor gives for
    /// `secrets` (none, an empty one, one in the wrong encoding).
    ///
    /// ```
    /// use webhook_guard::verify::{Secret, Stripe, Verifier};
    ///
    /// let template = Stripe::new(["whsec_template000000000000000000000000"]).unwrap();
    /// let tenant = template.with_secrets(&[Secret::from("whsec_tenant00000000000000000000000000")]).unwrap().unwrap();
    /// let body = br#"{"id":"evt_1"}"#;
    /// let header = Stripe::new(["whsec_tenant00000000000000000000000000"]).unwrap().sign(body, 1_700_000_000);
    /// let now = chrono::DateTime::from_timestamp(1_700_000_001, 0).unwrap();
    /// assert!(tenant.verify(&[("Stripe-Signature", header.as_str())], body, now).is_ok());
    /// assert!(template.verify(&[("Stripe-Signature", header.as_str())], body, now).is_err());
    /// ```
    fn with_secrets(&self, secrets: &[Secret]) -> Option<Result<Box<dyn Verifier>, KeyError>> {
        let _ = secrets;
        None
    }

    /// Whether [`Verified::event_id`] can hold an id: `false` for a verifier that
    /// finds none (a generic verifier given no id header). The builder then refuses
    /// a guard keyed on [`EventId::FromVerifier`](crate::EventId::FromVerifier),
    /// which would answer every delivery `missing_event_id`.
    fn finds_event_id(&self) -> bool {
        true
    }

    /// For a scheme whose event id the signature does not cover (GitHub, Shopify,
    /// Linear, Jamm): a key derived from the signed bytes of a delivery that
    /// verified, the same for every delivery of the same signed content. The guard
    /// claims it beside the id, so that the signed content replayed under another
    /// id is a duplicate (see
    /// [`WebhookGuardBuilder::content_keys`](crate::WebhookGuardBuilder::content_keys)).
    /// `None` (the default) for a scheme that signs its id.
    fn content_key(&self, headers: &dyn Headers, body: &[u8]) -> Option<[u8; 32]> {
        let _ = (headers, body);
        None
    }
}

/// Accepts every delivery. For tests and for hosts that verify before calling the
/// guard; it must be chosen explicitly.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoVerification;

impl Verifier for NoVerification {
    fn verify(&self, _: &dyn Headers, _: &[u8], _: DateTime<Utc>) -> Result<Verified, VerifyError> {
        Ok(Verified::default())
    }

    fn finds_event_id(&self) -> bool {
        false
    }
}

/// Why a delivery failed verification. Never contains secret material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A header the scheme needs is absent.
    #[error("missing header `{0}`")]
    MissingHeader(Cow<'static, str>),
    /// A header is present but cannot be parsed.
    #[error("malformed header `{header}`: {reason}")]
    MalformedHeader {
        /// The header's name.
        header: Cow<'static, str>,
        /// What was wrong with it.
        reason: &'static str,
    },
    /// The signature header parsed but holds no entry of a scheme this verifier uses.
    #[error("no usable signature entry")]
    NoUsableSignature,
    /// The signed timestamp is further in the past than the tolerance allows.
    #[error("timestamp too old: {age_secs} s old, tolerance {tolerance_secs} s")]
    TimestampTooOld {
        /// How old the timestamp is, in seconds.
        age_secs: u64,
        /// The tolerance, in seconds.
        tolerance_secs: u64,
    },
    /// The signed timestamp is further in the future than the tolerance allows.
    #[error("timestamp too new: {ahead_secs} s ahead, tolerance {tolerance_secs} s")]
    TimestampTooNew {
        /// How far ahead the timestamp is, in seconds.
        ahead_secs: u64,
        /// The tolerance, in seconds.
        tolerance_secs: u64,
    },
    /// Signature entries were found but none matched any configured secret.
    #[error("no signature matched")]
    NoMatch,
    /// The body is larger than the configured limit.
    #[error("body too large: {size} bytes, limit {limit}")]
    BodyTooLarge {
        /// The body's size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The body could not be read where the scheme signs part of it.
    #[error("malformed body: {0}")]
    MalformedBody(&'static str),
    /// The request's query, which the scheme signs or reads (Twilio's
    /// `bodySHA256`, Meta's `hub.*` parameters), is missing a part or malformed.
    #[error("malformed query: {0}")]
    MalformedQuery(&'static str),
}

impl VerifyError {
    /// A short machine-readable reason, stable across releases.
    pub fn code(&self) -> &'static str {
        match self {
            Self::MissingHeader(_) => "missing_header",
            Self::MalformedHeader { .. } => "malformed_header",
            Self::NoUsableSignature => "no_usable_signature",
            Self::TimestampTooOld { .. } => "timestamp_too_old",
            Self::TimestampTooNew { .. } => "timestamp_too_new",
            Self::NoMatch => "signature_mismatch",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::MalformedBody(_) => "malformed_body",
            Self::MalformedQuery(_) => "malformed_query",
        }
    }
}

/// Checks `signed_at` against `now` within `tolerance`, in both directions.
///
/// # Errors
/// [`VerifyError::TimestampTooOld`] or [`VerifyError::TimestampTooNew`].
pub fn check_tolerance(
    signed_at: DateTime<Utc>,
    now: DateTime<Utc>,
    tolerance: Duration,
) -> Result<(), VerifyError> {
    // Compared exactly: whole seconds would widen the window by up to a second
    // each way, past what a retention of twice the tolerance covers.
    let delta = now.signed_duration_since(signed_at);
    let limit = TimeDelta::from_std(tolerance).unwrap_or(TimeDelta::MAX);
    let off = delta.abs();
    if off <= limit {
        return Ok(());
    }
    // Reported in whole seconds, the distance rounded up.
    let off_secs = off.num_seconds().unsigned_abs() + u64::from(off.subsec_nanos() != 0);
    let tolerance_secs = tolerance.as_secs();
    if delta > TimeDelta::zero() {
        Err(VerifyError::TimestampTooOld {
            age_secs: off_secs,
            tolerance_secs,
        })
    } else {
        Err(VerifyError::TimestampTooNew {
            ahead_secs: off_secs,
            tolerance_secs,
        })
    }
}

/// Parses a decimal Unix timestamp in seconds, rejecting signs, overflow and junk.
///
/// # Errors
/// [`VerifyError::MalformedHeader`] naming `header`.
pub fn parse_unix_seconds(text: &[u8], header: &'static str) -> Result<DateTime<Utc>, VerifyError> {
    let bad = |reason| VerifyError::MalformedHeader {
        header: Cow::Borrowed(header),
        reason,
    };
    if text.is_empty() || text.len() > 12 || !text.iter().all(u8::is_ascii_digit) {
        return Err(bad("timestamp is not a decimal number of seconds"));
    }
    let secs = text
        .iter()
        .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'));
    DateTime::from_timestamp(secs, 0).ok_or_else(|| bad("timestamp out of range"))
}

/// Entry points for the fuzz targets under `fuzz/`: every header and body parser,
/// reachable without a verifier. Not part of the stable API.
#[doc(hidden)]
pub mod __fuzz {
    pub use super::generic::parse_template;
    pub use super::jamm::parse_body as jamm_body;
    pub use super::parse_unix_seconds;
    pub use super::standard::parse_signatures as standard_signatures;

    /// Parses a `Stripe-Signature` value: the digits of `t` and the `v1` MACs.
    ///
    /// # Errors
    /// As the Stripe verifier refuses the header.
    pub fn stripe_header(value: &[u8]) -> Result<(&[u8], Vec<[u8; 32]>), super::VerifyError> {
        super::stripe::SIGNATURE.parse_owned(value)
    }

    /// Parses a `Paddle-Signature` value: the digits of `ts` and the `h1` MACs.
    ///
    /// # Errors
    /// As the Paddle verifier refuses the header.
    pub fn paddle_header(value: &[u8]) -> Result<(&[u8], Vec<[u8; 32]>), super::VerifyError> {
        super::paddle::SIGNATURE.parse_owned(value)
    }

    /// The Jamm verifier's whitespace remover, owned.
    pub fn jamm_minify(json: &[u8]) -> Vec<u8> {
        super::jamm::minify(json).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance_is_checked_in_both_directions() {
        let now = DateTime::from_timestamp(1_000_000, 0).unwrap();
        let tol = Duration::from_secs(300);
        let at = |s| DateTime::from_timestamp(s, 0).unwrap();
        assert!(check_tolerance(at(1_000_000 - 300), now, tol).is_ok());
        assert!(check_tolerance(at(1_000_000 + 300), now, tol).is_ok());
        assert_eq!(
            check_tolerance(at(1_000_000 - 301), now, tol),
            Err(VerifyError::TimestampTooOld {
                age_secs: 301,
                tolerance_secs: 300
            })
        );
        assert_eq!(
            check_tolerance(at(1_000_000 + 301), now, tol),
            Err(VerifyError::TimestampTooNew {
                ahead_secs: 301,
                tolerance_secs: 300
            })
        );
    }

    #[test]
    fn tolerance_is_exact_below_a_second() {
        let signed = DateTime::from_timestamp(1_000_000, 0).unwrap();
        let tol = Duration::from_secs(300);
        let ms = TimeDelta::milliseconds;
        let now = |offset| signed + offset;
        assert!(check_tolerance(signed, now(ms(300_000)), tol).is_ok());
        assert!(check_tolerance(signed, now(ms(-300_000)), tol).is_ok());
        assert_eq!(
            check_tolerance(signed, now(ms(300_001)), tol),
            Err(VerifyError::TimestampTooOld {
                age_secs: 301,
                tolerance_secs: 300
            })
        );
        assert_eq!(
            check_tolerance(signed, now(ms(300_999)), tol),
            Err(VerifyError::TimestampTooOld {
                age_secs: 301,
                tolerance_secs: 300
            })
        );
        assert_eq!(
            check_tolerance(signed, now(ms(-300_001)), tol),
            Err(VerifyError::TimestampTooNew {
                ahead_secs: 301,
                tolerance_secs: 300
            })
        );
        // A fraction of a second in the tolerance is kept, not dropped.
        let tol = Duration::from_millis(1_500);
        assert!(check_tolerance(signed, now(ms(1_500)), tol).is_ok());
        assert!(check_tolerance(signed, now(ms(1_501)), tol).is_err());
        assert!(check_tolerance(signed, now(ms(-1_501)), tol).is_err());
        // The largest tolerance saturates instead of failing.
        assert!(check_tolerance(signed, now(ms(-1_501)), Duration::MAX).is_ok());
    }

    #[test]
    fn timestamps_reject_junk_signs_and_overflow() {
        for bad in [
            &b""[..],
            b"-1",
            b"+1",
            b"1.5",
            b"99999999999999999999",
            b"abc",
            b" 1",
        ] {
            assert!(parse_unix_seconds(bad, "t").is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_unix_seconds(b"1649367553", "t").unwrap().timestamp(),
            1_649_367_553
        );
    }
}
