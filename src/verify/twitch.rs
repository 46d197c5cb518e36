//! Twitch EventSub over webhooks: `Twitch-Eventsub-Message-Signature:
//! sha256=<hex>` over message id + timestamp + raw body; the callback challenge;
//! revocations.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::common::{self, Keys};
use super::handshake::{self, Handshake};
use super::macros;
use super::SecretFormat;
use super::{Encoding, Verifier, VerifyError};

const ID: &str = "Twitch-Eventsub-Message-Id";
const TIMESTAMP: &str = "Twitch-Eventsub-Message-Timestamp";
const SIGNATURE: &str = "Twitch-Eventsub-Message-Signature";
const TYPE: &str = "Twitch-Eventsub-Message-Type";
const PREFIX: &[u8] = b"sha256=";

/// Verifies Twitch EventSub messages sent to a webhook callback.
///
/// - Signed bytes: `Twitch-Eventsub-Message-Id` + `Twitch-Eventsub-Message-Timestamp`
///   (as sent, RFC 3339) + the raw body, HMAC-SHA256 with the subscription's
///   secret, `sha256=` + lowercase hex in `Twitch-Eventsub-Message-Signature`.
/// - Replay window: Twitch's guide says to refuse a message whose timestamp is
///   older than 10 minutes; the tolerance (default 10 minutes) applies both ways.
/// - Event id: the `Twitch-Eventsub-Message-Id` header, which Twitch keeps when it
///   resends a message (it is signed). Retry window: Twitch publishes no schedule
///   (it resends when unsure a message arrived); a message older than the
///   tolerance is refused anyway, so the retry window is the tolerance.
/// - Handshake: a `webhook_callback_verification` message (signed like every
///   message) is answered by the guard, 200 with the body's `challenge` as
///   `text/plain`, as Twitch asks before it enables the subscription; the handler
///   does not run and nothing is stored.
/// - Revocation: a `revocation` message (Twitch ended the subscription: the user
///   revoked the authorization, the user was removed, or too many notifications
///   failed) is a verified event under its message id like a notification, and
///   reaches the handler, which tells it apart with [`Twitch::revocation`] (its
///   body has a `subscription` and no `event`) to re-subscribe or alert.
///
/// ```
/// use webhook_guard::verify::{Twitch, Verifier};
///
/// let twitch = Twitch::new(["s3cre7-of-10-chars"]).unwrap();
/// let body = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"id":"f1c2a387-161a-49f9-a165-0f21d7a4e1c4","status":"webhook_callback_verification_pending","type":"channel.follow"}}"#;
/// let headers = twitch.sign_headers("e76c6bd4-55c9-4987-8304-da1588d8988b", "2019-11-16T10:11:12.634234626Z", "webhook_callback_verification", body);
/// let now = "2019-11-16T10:12:00Z".parse().unwrap();
/// let handshake = twitch.verify(&headers, body, now).unwrap().handshake.unwrap();
/// assert_eq!(handshake.body, "pogchamp-kappa-360noscope-vohiyo");
/// ```
#[derive(Debug, Clone)]
pub struct Twitch {
    keys: Keys,
    tolerance: Duration,
}

/// A revocation message's subscription, from [`Twitch::revocation`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Revocation {
    /// The subscription's id.
    pub subscription_id: String,
    /// Why it was revoked: `user_removed`, `authorization_revoked`,
    /// `notification_failures_exceeded`, `version_removed`, ...
    pub status: String,
    /// The subscription's type, such as `channel.follow`.
    pub kind: String,
}

impl Twitch {
    /// What the constructor accepts as a secret: the subscription's secret, which you
    /// chose: Twitch's EventSub reference requires an ASCII string of 10 to 100
    /// characters, so that is what is accepted (visible ASCII characters and spaces),
    /// without surrounding whitespace (a trailing newline from an environment
    /// variable is refused).
    pub const SECRET_FORMAT: SecretFormat =
        SecretFormat::new("Twitch").min_len(10).max_len(100).ascii();

    /// Refuse messages older than 10 minutes, as Twitch's guide says.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(10 * 60);

    macros::keyed! {
        /// A verifier keyed with one or more subscription secrets.
        new;
        /// How far the signed timestamp may be from `now`, either way (default 10
        /// minutes).
        tolerance;
    }

    /// The `Twitch-Eventsub-Message-Signature` value for a message, signed with the
    /// first secret.
    pub fn sign(&self, id: &str, timestamp: &str, body: &[u8]) -> String {
        let tag = self
            .keys
            .sign_first(&[id.as_bytes(), timestamp.as_bytes(), body]);
        format!("sha256={}", hex::encode(tag))
    }

    /// The headers Twitch sends with a message of `message_type` (`notification`,
    /// `webhook_callback_verification` or `revocation`).
    pub fn sign_headers(
        &self,
        id: &str,
        timestamp: &str,
        message_type: &str,
        body: &[u8],
    ) -> Vec<(&'static str, String)> {
        vec![
            (ID, id.to_owned()),
            (TIMESTAMP, timestamp.to_owned()),
            (SIGNATURE, self.sign(id, timestamp, body)),
            (TYPE, message_type.to_owned()),
        ]
    }

    /// The revoked subscription, when `body` is a revocation message's (a
    /// `subscription` and no `event`).
    pub fn revocation(body: &[u8]) -> Option<Revocation> {
        let doc: serde_json::Value = serde_json::from_slice(body).ok()?;
        if doc.get("event").is_some() {
            return None;
        }
        let sub = doc.get("subscription")?;
        let text = |key: &str| sub.get(key)?.as_str().map(str::to_owned);
        Some(Revocation {
            subscription_id: text("id")?,
            status: text("status")?,
            kind: text("type")?,
        })
    }
}

impl Verifier for Twitch {
    macros::verifier! {
        /// The event type is the `Twitch-Eventsub-Subscription-Type` header.
        event_type: header "Twitch-Eventsub-Subscription-Type";
        rekeyed;
        verify |self, headers, body, now| {
            let id = common::bounded_header(headers, ID)?;
            let ts = common::bounded_header(headers, TIMESTAMP)?;
            let value = common::bounded_header(headers, SIGNATURE)?;
            let tag = common::single_tag(value, PREFIX, Encoding::Hex, &SIGNATURE.into())?;
            self.keys.check(&[id, ts, body], &[tag])?;
            let signed_at = std::str::from_utf8(ts)
                .ok()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .ok_or_else(|| common::malformed(TIMESTAMP, "not an RFC 3339 time"))?
                .with_timezone(&Utc);
            let mut verified =
                common::timed(signed_at, now, self.tolerance, || common::id_value(id))?;
            if headers.get_bytes(TYPE) == Some(b"webhook_callback_verification") {
                let challenge = common::body_field(body, "challenge").ok_or(
                    VerifyError::MalformedBody("webhook_callback_verification without a challenge"),
                )?;
                let challenge = handshake::challenge(&challenge, "challenge")?;
                verified.handshake = Some(Handshake::text(
                    "twitch_webhook_callback_verification",
                    challenge,
                ));
            }
            Ok(verified)
        }
        tolerance;
    }

    fn retry_window(&self) -> Option<Duration> {
        Some(self.tolerance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;

    const MSG: &str = "e76c6bd4-55c9-4987-8304-da1588d8988b";
    const TS: &str = "2019-11-16T10:11:12.634234626Z";
    const BODY: &[u8] = br#"{"subscription":{"id":"f1c2a387-161a-49f9-a165-0f21d7a4e1c4","status":"enabled","type":"channel.follow","version":"1"},"event":{"user_id":"1234","broadcaster_user_id":"1337"}}"#;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn notifications_verify_within_ten_minutes() {
        let t = Twitch::new(["old-secret-1", "new-secret-1"]).unwrap();
        let signer = Twitch::new(["new-secret-1"]).unwrap();
        let h = signer.sign_headers(MSG, TS, "notification", BODY);
        let v = t.verify(&h, BODY, at("2019-11-16T10:21:12Z")).unwrap();
        assert_eq!(v.event_id.as_deref(), Some(MSG));
        assert_eq!(v.handshake, None);
        assert!(matches!(
            t.verify(&h, BODY, at("2019-11-16T10:21:13Z")),
            Err(VerifyError::TimestampTooOld { .. })
        ));
        let mut other_id = h.clone();
        other_id[0].1 = "another-id".into();
        assert_eq!(t.verify(&other_id, BODY, at(TS)), Err(VerifyError::NoMatch));
        let mut bad_time = signer.sign_headers(MSG, "yesterday", "notification", BODY);
        assert_eq!(
            t.verify(&bad_time, BODY, at(TS)).unwrap_err().code(),
            "malformed_header"
        );
        bad_time.remove(2);
        assert_eq!(
            t.verify(&bad_time, BODY, at(TS)),
            Err(VerifyError::MissingHeader(SIGNATURE.into()))
        );
    }

    #[test]
    fn the_challenge_is_answered_and_revocations_are_told_apart() {
        let t = Twitch::new(["secret-of-10"]).unwrap();
        let body = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"id":"f1c2","status":"webhook_callback_verification_pending","type":"channel.follow"}}"#;
        let h = t.sign_headers(MSG, TS, "webhook_callback_verification", body);
        let hs = t.verify(&h, body, at(TS)).unwrap().handshake.unwrap();
        assert_eq!(hs.body, "pogchamp-kappa-360noscope-vohiyo");
        // The same body as a notification is no handshake.
        let h = t.sign_headers(MSG, TS, "notification", body);
        assert_eq!(t.verify(&h, body, at(TS)).unwrap().handshake, None);
        let forged = Twitch::new(["other-secret"]).unwrap().sign_headers(
            MSG,
            TS,
            "webhook_callback_verification",
            body,
        );
        assert_eq!(t.verify(&forged, body, at(TS)), Err(VerifyError::NoMatch));
        let revoked = br#"{"subscription":{"id":"f1c2","status":"authorization_revoked","type":"channel.follow","version":"1"}}"#;
        let r = Twitch::revocation(revoked).unwrap();
        assert_eq!(
            (r.status.as_str(), r.kind.as_str()),
            ("authorization_revoked", "channel.follow")
        );
        assert_eq!(Twitch::revocation(BODY), None);
        assert_eq!(Twitch::revocation(b"not json"), None);
    }
}
