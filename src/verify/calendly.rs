//! Calendly: `Calendly-Webhook-Signature: t=<unix>,v1=<hex>` over `{t}.{raw body}`.

use std::time::Duration;

use super::common::{self, Keys};
use super::macros;
use super::SecretFormat;
use super::Verifier;

const HEADER: &str = "Calendly-Webhook-Signature";

/// `t=<unix>,v1=<hex>`: as Stripe's header, only `v1` entries are read.
const SIGNATURE: common::TimedHeader = common::TimedHeader::t_v1(HEADER);

/// Verifies Calendly webhooks.
///
/// - Signed bytes: `{t}.{raw body}`, HMAC-SHA256 keyed with the webhook signing key,
///   lowercase hex, in `Calendly-Webhook-Signature: t=<unix>,v1=<hex>`.
/// - The timestamp must be within the tolerance (default 180 s, the three minutes
///   of Calendly's own example) of `now`, both ways.
/// - Event id: Calendly's payload carries no event id. The preset uses the signed
///   pair `{event}:{payload.uri}` (`invitee.created:https://api.calendly.com/
///   scheduled_events/…/invitees/…`): one invitee is created, canceled or marked a
///   no-show once per resource, so the pair names one event. Retry window: Calendly's
///   "Webhook Errors" page: it keeps trying for 24 hours with exponential back-off;
///   its webhooks overview gives 10 s to connect and 15 s to read the answer.
///
/// ```
/// use webhook_guard::verify::{Calendly, Verifier};
///
/// let calendly = Calendly::new(["a-signing-key-you-chose"]).unwrap();
/// let body = br#"{"event":"invitee.created","payload":{"uri":"https://api.calendly.com/scheduled_events/E1/invitees/I1"}}"#;
/// let header = calendly.sign(body, 1_700_000_000);
/// let now = chrono::DateTime::from_timestamp(1_700_000_010, 0).unwrap();
/// let verified = calendly.verify(&[("Calendly-Webhook-Signature", header)], body, now).unwrap();
/// assert_eq!(
///     verified.event_id.as_deref(),
///     Some("invitee.created:https://api.calendly.com/scheduled_events/E1/invitees/I1")
/// );
/// ```
#[derive(Debug, Clone)]
pub struct Calendly {
    keys: Keys,
    tolerance: Duration,
}

impl Calendly {
    /// What the constructor accepts as a secret: the subscription's webhook signing
    /// key. Calendly documents it as a key you choose when you create the subscription
    /// with a personal access token (or one it makes for an OAuth app), in no
    /// published format: at least 16 bytes (the crate's floor for a chosen HMAC key),
    /// without surrounding whitespace (a trailing newline from an environment
    /// variable is refused).
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Calendly").min_len(16);

    /// The tolerance of Calendly's documented example: 3 minutes.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(180);
    /// Calendly retries for 24 hours.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(24 * 3600);

    macros::keyed! {
        /// A verifier keyed with one or more webhook signing keys.
        new;
        /// How far the signed timestamp may be from `now`, either way (default 180 s).
        tolerance;
    }

    /// The `Calendly-Webhook-Signature` value for `body` at `timestamp` (Unix
    /// seconds), signed with the first key.
    pub fn sign(&self, body: &[u8], timestamp: i64) -> String {
        SIGNATURE.sign(&self.keys, timestamp, body)
    }
}

/// `{event}:{payload.uri}` of a Calendly body.
fn event_id(body: &[u8]) -> Option<String> {
    let event = crate::json::field(body, &["event"]).ok()?;
    let uri = crate::json::field(body, &["payload", "uri"]).ok()?;
    Some(format!("{event}:{uri}"))
}

impl Verifier for Calendly {
    macros::verifier! {
        /// The event type is the body's `event`.
        event_type: json ["event"];
        rekeyed;
        verify |self, headers, body, now| {
            SIGNATURE.verify(&self.keys, headers, body, now, self.tolerance, || {
                event_id(body)
            })
        }
        event_meta: json ["event"], ["created_at"], ["payload", "uri"];
        tolerance;
        retry_window;
        answer_timeout: 15;
    }
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;
    use crate::verify::testing::*;

    const BODY: &[u8] = br#"{"created_at":"2024-05-01T10:00:00.000000Z","created_by":"https://api.calendly.com/users/AAAA","event":"invitee.created","payload":{"uri":"https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2/invitees/AAAAAAAAAAAAAAAA"}}"#;
    // Computed independently with Python's hmac (sha256, hex) over `1714557600.` + BODY.
    const HEADER_VALUE: &str =
        "t=1714557600,v1=2b0d9dc698fdeed157912ea719d0902bb966b98516076de525ae4da1966ba617";
    const T: i64 = 1_714_557_600;

    /// Keyed with the vector's key, shorter than the constructor takes.
    fn vector_key() -> Calendly {
        Calendly {
            keys: Keys::from_secrets(["cal_signing_key"]).unwrap(),
            tolerance: Calendly::DEFAULT_TOLERANCE,
        }
    }

    fn verify(header: &str, now: i64) -> Result<Verified, VerifyError> {
        vector_key().verify(&[(HEADER, header)], BODY, at(now))
    }

    #[test]
    fn independent_vector_id_and_window() {
        let v = verify(HEADER_VALUE, T).unwrap();
        assert_eq!(
            v.event_id.as_deref(),
            Some("invitee.created:https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2/invitees/AAAAAAAAAAAAAAAA")
        );
        assert_eq!(vector_key().sign(BODY, T), HEADER_VALUE);
        window(T, 180, |now| verify(HEADER_VALUE, now));
        let moved = HEADER_VALUE.replace("t=1714557600", "t=1714557601");
        assert_eq!(verify(&moved, T), Err(VerifyError::NoMatch));
        assert!(matches!(
            verify("v1=00", T),
            Err(VerifyError::MalformedHeader { .. })
        ));
    }

    #[test]
    fn rotation_and_the_id_needs_both_fields() {
        let old = Calendly::new(["old-signing-key-1"]).unwrap();
        let both = Calendly::new(["new-signing-key-2", "old-signing-key-1"]).unwrap();
        let h = old.sign(b"{\"event\":\"x\"}", T);
        let delivery = Signed {
            headers: &[(HEADER, h.as_str())],
            signature: HEADER,
            body: b"{\"event\":\"x\"}",
            tampered: b"{\"event\":\"y\"}",
        };
        delivery.check(&old, &both, at(T), None);
    }
}
