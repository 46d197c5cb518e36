//! Square: `x-square-hmacsha256-signature: <base64>` over the notification URL and
//! the raw body.

use std::time::Duration;

use super::common::{self, Keys};
use super::macros;
use super::{Encoding, KeyError, Secret, Verified, Verifier};

const HEADER: &str = "x-square-hmacsha256-signature";
const SIGNATURE: common::SignatureHeader =
    common::SignatureHeader::new(HEADER, "", Encoding::Base64);

/// Verifies Square webhooks (API version 2 subscriptions).
///
/// - Signed bytes: the subscription's **notification URL**, then the raw body:
///   HMAC-SHA256 keyed with the subscription's signature key, standard base64, in
///   `x-square-hmacsha256-signature`. The URL is configuration, given to
///   [`Square::new`] exactly as it is written in the subscription (scheme, host,
///   path, query): behind a proxy that rewrites it, the URL the endpoint sees is not
///   the one Square signed, so it is never read from the request.
/// - No timestamp is signed: there is no replay window; deduplication on the signed
///   `event_id` stops a replay of a captured delivery.
/// - Event id: the body's `event_id` (Square: "use this value to bypass processing
///   if it's a repeated value"). Retry window: Square's "Troubleshoot Webhooks"
///   page: unsuccessful deliveries are retried for up to 72 hours (1, 2, 4, 8, 16
///   and 32 minutes, then hourly: 79 deliveries at most), and a notification must
///   be acknowledged within 10 s.
/// - The legacy `x-square-signature` (HMAC-SHA1) header is never read.
///
/// ```
/// use webhook_guard::verify::{Square, Verifier};
///
/// let square = Square::new(
///     "https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9",
///     ["Ibxx_5AKakO-3qeNVR61Dw"],
/// ).unwrap();
/// let body = br#"{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification","event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z","data":{"type":"webhooks","id":"bc368e64-01aa-407e-b46e-3231809b1129"}}"#;
/// let headers = [("x-square-hmacsha256-signature", "GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4=")];
/// let verified = square.verify(&headers, body, chrono::Utc::now()).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("ac3ac95b-f97d-458c-a6e6-18981597e05f"));
/// ```
#[derive(Debug, Clone)]
pub struct Square {
    keys: Keys,
    url: Box<str>,
}

impl Square {
    macros::unpublished_format!("Square", "the subscription's signature key");

    /// Square retries for up to 72 hours after the event.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(72 * 3600);

    /// A verifier for the subscription posting to `notification_url`, keyed with one
    /// or more signature keys (used as their UTF-8 bytes).
    ///
    /// # Errors
    /// [`KeyError::NeedsUrl`] if the URL is empty or has surrounding whitespace;
    /// [`KeyError::EmptySecret`] if no key is given or one is empty.
    pub fn new<S: Into<Secret>>(
        notification_url: impl Into<String>,
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Self, KeyError> {
        let url = notification_url.into();
        if url.is_empty() || url.trim() != url {
            return Err(KeyError::NeedsUrl);
        }
        Ok(Self {
            keys: Keys::checked(secrets, &Self::SECRET_FORMAT)?,
            url: url.into(),
        })
    }

    /// The notification URL this verifier expects Square to have signed.
    pub fn notification_url(&self) -> &str {
        &self.url
    }

    /// The `x-square-hmacsha256-signature` value for `body`, signed with the first key.
    pub fn sign(&self, body: &[u8]) -> String {
        SIGNATURE.sign(&self.keys, &[self.url.as_bytes(), body])
    }
}

impl Verifier for Square {
    macros::verifier! {
        /// The event type is the body's `type`.
        event_type: json ["type"];
        rekeyed;
        verify |self, headers, body, _now| {
            SIGNATURE.check(&self.keys, headers, &[self.url.as_bytes(), body])?;
            Ok(Verified::untimed(common::body_field(body, "event_id")))
        }
        event_meta: json ["type"], ["created_at"], ["data", "id"];
        retry_window;
        answer_timeout: 10;
        /// The first attempt, 6 backed-off retries, then hourly to 72 h: 79 at most.
        deliveries: 79;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;

    // Published vector: the `WebhooksHelper` tests of Square's SDKs.
    const URL: &str = "https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9";
    const KEY: &str = "Ibxx_5AKakO-3qeNVR61Dw";
    const SIG: &str = "GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4=";
    const BODY: &str = r#"{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification","event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z","data":{"type":"webhooks","id":"bc368e64-01aa-407e-b46e-3231809b1129"}}"#;

    fn check(url: &str, key: &str, sig: &str, body: &str) -> Result<Verified, VerifyError> {
        Square::new(url, [key])
            .unwrap()
            .verify(&[(HEADER, sig)], body.as_bytes(), Utc::now())
    }

    #[test]
    fn sdk_vectors() {
        let v = check(URL, KEY, SIG, BODY).unwrap();
        assert_eq!(
            v.event_id.as_deref(),
            Some("ac3ac95b-f97d-458c-a6e6-18981597e05f")
        );
        assert_eq!(Square::new(URL, [KEY]).unwrap().sign(BODY.as_bytes()), SIG);
        // The SDK tests' failing cases: another URL, key, signature or body.
        let other_url = "https://webhook.site/79a4f3a-dcfa-49ee-bac5-9d0edad886b9";
        assert_eq!(check(other_url, KEY, SIG, BODY), Err(VerifyError::NoMatch));
        assert_eq!(
            check(URL, "MCmhFRxGX82xMwg5FsaoQA", SIG, BODY),
            Err(VerifyError::NoMatch)
        );
        assert!(check(URL, KEY, "1z2n3DEJJiUPKcPzQo1ftvbxGdw=", BODY).is_err());
        let june = BODY.replace("2022-07-13", "2022-06-13");
        assert_eq!(check(URL, KEY, SIG, &june), Err(VerifyError::NoMatch));
        let pretty =
            serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(BODY).unwrap())
                .unwrap();
        assert_eq!(check(URL, KEY, SIG, &pretty), Err(VerifyError::NoMatch));
    }

    #[test]
    fn the_url_is_required_and_keys_rotate() {
        assert_eq!(Square::new("", [KEY]).unwrap_err(), KeyError::NeedsUrl);
        assert_eq!(
            Square::new(format!("{URL}\n"), [KEY]).unwrap_err(),
            KeyError::NeedsUrl
        );
        assert_eq!(Square::new(URL, [""]).unwrap_err(), KeyError::EmptySecret);
        let both = Square::new(URL, ["new-signature-key-22ch", KEY]).unwrap();
        let june = BODY.replace("2022-07-13", "2022-06-13");
        // The legacy header stays unread once the signature header is left out.
        let delivery = Signed {
            headers: &[(HEADER, SIG), ("x-square-signature", SIG)],
            signature: HEADER,
            body: BODY.as_bytes(),
            tampered: june.as_bytes(),
        };
        let id = "ac3ac95b-f97d-458c-a6e6-18981597e05f";
        delivery.check(
            &Square::new(URL, [KEY]).unwrap(),
            &both,
            Utc::now(),
            Some(id),
        );
        assert!(!format!("{both:?}").contains(KEY));
    }
}
