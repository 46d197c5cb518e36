//! Slack: `X-Slack-Signature: v0=<hex>` over `v0:{timestamp}:{raw body}`.

use std::time::Duration;

use super::common::{self, Keys};
use super::handshake::{self, Handshake};
use super::macros;
use super::{SecretFormat, Verifier, VerifyError};

const HEADER: &str = "X-Slack-Signature";
const TIMESTAMP: &str = "X-Slack-Request-Timestamp";
const SIGNATURE: common::V0Header = common::V0Header {
    signature: HEADER,
    timestamp: TIMESTAMP,
};

/// Verifies requests from Slack (Events API, slash commands, interactivity).
///
/// - Signed bytes: `v0:{X-Slack-Request-Timestamp}:{raw body}`, HMAC-SHA256 with the
///   app's signing secret, `v0=` + lowercase hex in `X-Slack-Signature`.
/// - The timestamp must be within the tolerance (default 300 s, as Slack's SDKs) of
///   `now`, both ways.
/// - Event id: the Events API body field `event_id`. Slash commands and
///   interactivity payloads (form-encoded bodies) carry none, so with the default
///   [`EventId`](crate::EventId) the guard refuses them (`missing_event_id`): give
///   those routes an id of their own (`EventId::Custom`, from `trigger_id` say).
///   Retry window: Slack retries an event 3 times, nearly immediately, after 1
///   minute and after 5 minutes: about 6 minutes.
/// - Handshake: the Events API's `url_verification` request (signed like every
///   request, body `{"type":"url_verification","challenge":...}`, no `event_id`)
///   is answered by the guard, 200 with the `challenge` as `text/plain`, as Slack
///   asks before it enables the request URL; the handler does not run and nothing
///   is stored (see [`Handshake`](super::Handshake)).
///
/// ```
/// use webhook_guard::verify::{Slack, Verifier};
///
/// let slack = Slack::new(["8f742231b10e8888abcd99yyyzzz85a5"]).unwrap();
/// let body = br#"{"type":"event_callback","event_id":"Ev08MFMKH6"}"#;
/// let headers = slack.sign_headers(1531420618, body);
/// let now = chrono::DateTime::from_timestamp(1531420618, 0).unwrap();
/// let verified = slack.verify(&headers, body, now).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("Ev08MFMKH6"));
/// ```
#[derive(Debug, Clone)]
pub struct Slack {
    keys: Keys,
    tolerance: Duration,
}

impl Slack {
    /// The tolerance Slack's SDKs use: 300 seconds.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
    /// Slack's 3 retries span about 6 minutes.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(6 * 60);

    /// Slack's signing secrets are 32 characters (hexadecimal digits).
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Slack").min_len(32);

    macros::keyed! {
        /// A verifier keyed with one or more signing secrets.
        new;
        /// How far the signed timestamp may be from `now`, either way (default 300 s).
        tolerance;
    }

    /// The `X-Slack-Signature` value for `body` at `timestamp`, signed with the
    /// first secret.
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> String {
        SIGNATURE.sign(&self.keys, timestamp, body)
    }

    /// The two headers Slack sends: the timestamp and the signature.
    pub fn sign_headers(&self, timestamp: i64, body: &[u8]) -> Vec<(&'static str, String)> {
        SIGNATURE.sign_headers(&self.keys, timestamp, body)
    }
}

impl Verifier for Slack {
    macros::verifier! {
        rekeyed;
        verify |self, headers, body, now| {
            let (signed_at, _) = SIGNATURE.check(&self.keys, headers, body)?;
            let mut verified = common::timed(signed_at, now, self.tolerance, || {
                common::body_field(body, "event_id")
            })?;
            // Only a body without an event id is looked at again (a handshake has none).
            if verified.event_id.is_none() {
                verified.handshake = url_verification(body)?;
            }
            Ok(verified)
        }
        event_type: slack;
        tolerance;
        retry_window;
        answer_timeout: 3;
        /// Slack's first attempt and its 3 retries.
        deliveries: 4;
    }
}

/// The answer to a `url_verification` body: its challenge, as `text/plain`.
///
/// # Errors
/// [`VerifyError::MalformedBody`] for a `url_verification` whose challenge is
/// missing or is not a plain token.
fn url_verification(body: &[u8]) -> Result<Option<Handshake>, VerifyError> {
    if common::body_field(body, "type").as_deref() != Some("url_verification") {
        return Ok(None);
    }
    let challenge = common::body_field(body, "challenge").ok_or(VerifyError::MalformedBody(
        "url_verification without a challenge",
    ))?;
    let challenge = handshake::challenge(&challenge, "url_verification challenge")?;
    Ok(Some(Handshake::text("slack_url_verification", challenge)))
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;
    use crate::verify::testing::*;

    // Published vector: Slack's "Verifying requests from Slack" worked example. The
    // body's token is `xyzz0WbapA4vBCDEFasx0q6G` as on Slack's page (a copy with
    // `...BCDEbOTG` circulates; it does not produce the published signature).
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const TS: &str = "1531420618";
    const BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    #[test]
    fn published_vector_passes() {
        let s = Slack::new([SECRET]).unwrap();
        assert_eq!(s.sign(1_531_420_618, BODY.as_bytes()), SIG);
        let misquoted = BODY.replace("BCDEFasx0q6G", "BCDEbOTG");
        let delivery = Signed {
            headers: &[
                ("x-slack-signature", SIG),
                ("x-slack-request-timestamp", TS),
            ],
            signature: HEADER,
            body: BODY.as_bytes(),
            tampered: misquoted.as_bytes(),
        };
        let both = Slack::new(["0123456789abcdef0123456789abcdef", SECRET]).unwrap();
        // Form bodies carry no event id.
        let v = delivery.check(&s, &both, at(1_531_420_618 + 60), None);
        assert_eq!(v.signed_at, Some(at(1_531_420_618)));
    }

    #[test]
    fn url_verification_is_a_handshake_once_signed() {
        let s = Slack::new([SECRET]).unwrap();
        let body = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
        let h = s.sign_headers(1_531_420_618, body);
        let v = s.verify(&h, body, at(1_531_420_618)).unwrap();
        let hs = v.handshake.expect("a handshake");
        assert_eq!(
            hs.body,
            "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
        );
        assert_eq!(hs.content_type, "text/plain; charset=utf-8");
        let forged = [
            (HEADER, "v0=".to_owned() + &"0".repeat(64)),
            (TIMESTAMP, TS.to_owned()),
        ];
        assert_eq!(
            s.verify(&forged, body, at(1_531_420_618)),
            Err(VerifyError::NoMatch)
        );
        let hostile = br#"{"type":"url_verification","challenge":"<script>"}"#;
        let h = s.sign_headers(1_531_420_618, hostile);
        assert!(matches!(
            s.verify(&h, hostile, at(1_531_420_618)),
            Err(VerifyError::MalformedBody(_))
        ));
        let event = br#"{"type":"event_callback","event_id":"Ev1","challenge":"x"}"#;
        let h = s.sign_headers(1_531_420_618, event);
        assert_eq!(
            s.verify(&h, event, at(1_531_420_618)).unwrap().handshake,
            None
        );
    }

    #[test]
    fn tolerance_edges_and_bad_headers() {
        let s = Slack::new([SECRET]).unwrap();
        let h = [(HEADER, SIG), (TIMESTAMP, TS)];
        let t = 1_531_420_618;
        window(t, 300, |now| s.verify(&h, BODY.as_bytes(), at(now)));
        assert_eq!(
            s.verify(&[h[0]], BODY.as_bytes(), at(t)),
            Err(VerifyError::MissingHeader(TIMESTAMP.into()))
        );
        assert_eq!(
            s.verify(
                &[(HEADER, &SIG[3..]), (TIMESTAMP, TS)],
                BODY.as_bytes(),
                at(t)
            ),
            Err(VerifyError::NoUsableSignature)
        );
    }
}
