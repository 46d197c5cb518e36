//! Zoom: `x-zm-signature: v0=<hex>` over `v0:{timestamp}:{raw body}`, and the
//! `endpoint.url_validation` handshake.

use std::time::Duration;

use super::common::{self, Keys};
use super::handshake::{self, Handshake};
use super::macros;
use super::request::digest_id;
use super::{Verifier, VerifyError};

const HEADER: &str = "x-zm-signature";
const TIMESTAMP: &str = "x-zm-request-timestamp";
/// Slack's scheme under Zoom's header names.
const SIGNATURE: common::V0Header = common::V0Header {
    signature: HEADER,
    timestamp: TIMESTAMP,
};

/// Verifies Zoom webhooks (Marketplace apps' event subscriptions).
///
/// - Signed bytes: `v0:{x-zm-request-timestamp}:{raw body}`, HMAC-SHA256 with the
///   app's secret token, `v0=` + lowercase hex in `x-zm-signature`.
/// - Replay window: Zoom publishes none; the timestamp must be within the tolerance
///   (default 300 s) of `now`, both ways.
/// - Event id: Zoom's deliveries carry no event or delivery id (the body has the
///   `event` name and `event_ts`, which two events can share), so the id is the
///   SHA-256 of the signed body (`sha256:<hex>`): the same delivery sent again is a
///   duplicate. Deduplicate on the payload's own object ids in the handler where a
///   retry could differ.
/// - Retry window: Zoom's developer blog ("Resolving webhook delays") says a
///   delivery not answered 200 or 204 within 3 seconds is sent 3 more times, 5
///   minutes after the first attempt, 20 minutes after the first retry and 60
///   minutes after the second: 85 minutes.
/// - Handshake: an `endpoint.url_validation` request (signed like every request,
///   body `{"event":"endpoint.url_validation","payload":{"plainToken":...}}`) is
///   answered by the guard with `{"plainToken":...,"encryptedToken":...}`, the
///   token's HMAC-SHA256 (hex) under the secret that signed the request, as Zoom
///   asks when the endpoint is added and every 72 hours; the handler does not run
///   and nothing is stored.
///
/// ```
/// use webhook_guard::verify::{Verifier, Zoom};
///
/// let zoom = Zoom::new(["zoom-secret-token-22ch"]).unwrap();
/// let body = br#"{"event":"endpoint.url_validation","payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680}"#;
/// let headers = zoom.sign_headers(1654503849, body);
/// let now = chrono::DateTime::from_timestamp(1654503849, 0).unwrap();
/// let handshake = zoom.verify(&headers, body, now).unwrap().handshake.unwrap();
/// let answer: serde_json::Value = serde_json::from_str(&handshake.body).unwrap();
/// assert_eq!(answer["plainToken"], "qgg8vlvZRS6UYooatFL8Aw");
/// ```
#[derive(Debug, Clone)]
pub struct Zoom {
    keys: Keys,
    tolerance: Duration,
}

impl Zoom {
    macros::unpublished_format!("Zoom", "the app's secret token");

    /// The tolerance used unless set: 300 seconds (Zoom publishes none).
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
    /// 3 retries, 5, 20 and 60 minutes apart: 85 minutes.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(85 * 60);

    macros::keyed! {
        /// A verifier keyed with one or more secret tokens.
        new;
        /// How far the signed timestamp may be from `now`, either way (default 300 s).
        tolerance;
    }

    /// The `x-zm-signature` value for `body` at `timestamp`, signed with the first
    /// secret token.
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> String {
        SIGNATURE.sign(&self.keys, timestamp, body)
    }

    /// The two headers Zoom sends: the timestamp and the signature.
    pub fn sign_headers(&self, timestamp: i64, body: &[u8]) -> Vec<(&'static str, String)> {
        SIGNATURE.sign_headers(&self.keys, timestamp, body)
    }
}

impl Verifier for Zoom {
    macros::verifier! {
        /// The event type is the body's `event`.
        event_type: json ["event"];
        rekeyed;
        verify |self, headers, body, now| {
            let (signed_at, key) = SIGNATURE.check(&self.keys, headers, body)?;
            let mut verified =
                common::timed(signed_at, now, self.tolerance, || Some(digest_id(body)))?;
            if common::body_field(body, "event").as_deref() == Some("endpoint.url_validation") {
                let token = common::first_path(body, &["payload", "plainToken"]).ok_or(
                    VerifyError::MalformedBody("url_validation without a plainToken"),
                )?;
                let token = handshake::challenge(&token, "url_validation plainToken")?;
                let encrypted = hex::encode(self.keys.sign_with(key, &[token.as_bytes()]));
                let answer =
                    serde_json::json!({ "plainToken": token, "encryptedToken": encrypted });
                verified.handshake = Some(Handshake::json("zoom_url_validation", &answer));
            }
            Ok(verified)
        }
        tolerance;
        retry_window;
        answer_timeout: 3;
        /// Zoom's first attempt and its 3 retries.
        deliveries: 4;
    }
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;
    use crate::verify::testing::*;

    const BODY: &[u8] = br#"{"event":"meeting.started","event_ts":1626230691572,"payload":{"account_id":"AAAAAABBBB","object":{"id":"1234567890","uuid":"czLF6FFFoQOKgAB99DlDb9g=="}}}"#;

    #[test]
    fn signs_v0_over_the_timestamp_and_body() {
        let zoom = Zoom::new(["old-zoom-secret-token", "new-zoom-secret-token"]).unwrap();
        let newer = Zoom::new(["new-zoom-secret-token"]).unwrap();
        let h = newer.sign_headers(1_626_230_691, BODY);
        let v = zoom.verify(&h, BODY, at(1_626_230_691)).unwrap();
        assert_eq!(v.event_id, Some(digest_id(BODY)));
        assert_eq!(v.handshake, None);
        let mut tampered = BODY.to_vec();
        tampered[10] ^= 1;
        assert_eq!(
            zoom.verify(&h, &tampered, at(1_626_230_691)),
            Err(VerifyError::NoMatch)
        );
        window(1_626_230_691, 300, |now| zoom.verify(&h, BODY, at(now)));
        assert_eq!(
            zoom.verify(&h[..1].to_vec(), BODY, at(1_626_230_691)),
            Err(VerifyError::MissingHeader(HEADER.into()))
        );
    }

    #[test]
    fn url_validation_answers_with_the_signing_secret() {
        let body = br#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
        let zoom = Zoom::new(["first-zoom-secret-token", "second-zoom-secret-token"]).unwrap();
        let signer = Zoom::new(["second-zoom-secret-token"]).unwrap();
        let h = signer.sign_headers(1_654_503_849, body);
        let hs = zoom
            .verify(&h, body, at(1_654_503_849))
            .unwrap()
            .handshake
            .unwrap();
        let answer: serde_json::Value = serde_json::from_str(&hs.body).unwrap();
        let want = hex::encode(signer.keys.sign_first(&[b"qgg8vlvZRS6UYooatFL8Aw"]));
        assert_eq!(answer["encryptedToken"], want.as_str());
        assert_eq!(hs.content_type, "application/json");
        let forged = Zoom::new(["other-zoom-secret-token"])
            .unwrap()
            .sign_headers(1_654_503_849, body);
        assert_eq!(
            zoom.verify(&forged, body, at(1_654_503_849)),
            Err(VerifyError::NoMatch)
        );
        let empty = br#"{"event":"endpoint.url_validation","payload":{}}"#;
        let h = signer.sign_headers(1_654_503_849, empty);
        assert!(matches!(
            zoom.verify(&h, empty, at(1_654_503_849)),
            Err(VerifyError::MalformedBody(_))
        ));
    }
}
