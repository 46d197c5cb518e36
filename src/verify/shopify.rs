//! Shopify: `X-Shopify-Hmac-Sha256: <base64>` over the raw body.

use std::time::Duration;

use super::common::{self, Keys};
use super::macros;
use super::{Encoding, SecretFormat, Verified, Verifier, VerifyError};

const HEADERS: [&str; 2] = ["X-Shopify-Hmac-Sha256", "Shopify-Hmac-Sha256"];
const ID_HEADERS: [&str; 2] = ["X-Shopify-Webhook-Id", "Shopify-Webhook-Id"];

/// Verifies Shopify webhooks.
///
/// - Signed bytes: the raw body, HMAC-SHA256, standard base64, in
///   `X-Shopify-Hmac-Sha256` (or `Shopify-Hmac-Sha256`, the newer Events spelling).
/// - After a secret rotation Shopify keeps signing with the oldest unrevoked secret
///   for up to an hour: configure both, the delivery passes if either matches.
/// - No timestamp is signed, and the webhook id is not signed either: the guard also
///   deduplicates by the signed body (its [`content_key`](Verifier::content_key)),
///   so a captured body resent under a new id is a duplicate.
/// - Event id: `X-Shopify-Webhook-Id` (or `Shopify-Webhook-Id`). Retry window:
///   Shopify retries 8 times over 4 hours.
///
/// ```
/// use webhook_guard::verify::{Shopify, Verifier};
///
/// let shopify = Shopify::new(["shpss_0123456789abcdef0123456789abcdef"]).unwrap();
/// let body = br#"{"id":1}"#;
/// let sig = shopify.sign(body);
/// let headers = [("X-Shopify-Hmac-Sha256", sig.as_str()), ("X-Shopify-Webhook-Id", "b54557e4")];
/// let verified = shopify.verify(&headers, body, chrono::Utc::now()).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("b54557e4"));
/// ```
#[derive(Debug, Clone)]
pub struct Shopify {
    keys: Keys,
}

impl Shopify {
    /// Shopify retries a failed webhook 8 times over 4 hours.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(4 * 3600);

    /// Shopify's app client secrets (and the keys of webhooks made in a store's
    /// admin) are 32 characters or more.
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Shopify").min_len(32);

    macros::keyed! {
        /// A verifier keyed with one or more app / webhook secrets.
        new;
    }

    /// The `X-Shopify-Hmac-Sha256` value for `body`, signed with the first secret.
    pub fn sign(&self, body: &[u8]) -> String {
        common::SignatureHeader::new(HEADERS[0], "", Encoding::Base64).sign(&self.keys, &[body])
    }
}

impl Verifier for Shopify {
    macros::verifier! {
        rekeyed;
        verify |self, headers, body, _now| {
            // The first spelling present with a value: an empty one gives way, as for
            // the id headers.
            let name = HEADERS
                .into_iter()
                .find(|n| {
                    headers
                        .get_bytes(n)
                        .is_some_and(|v| !v.trim_ascii().is_empty())
                })
                .ok_or(VerifyError::MissingHeader(HEADERS[0].into()))?;
            common::SignatureHeader::new(name, "", Encoding::Base64).check(
                &self.keys,
                headers,
                &[body],
            )?;
            Ok(Verified::untimed(common::id_header(headers, &ID_HEADERS)))
        }
        /// The delivery id (`X-Shopify-Webhook-Id`) is not signed: the SHA-256 of the signed body.
        content_key: sha256;
        event_type: shopify;
        retry_window;
        answer_timeout: 5;
        /// Shopify's first attempt and its 8 retries.
        deliveries: 9;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;

    const SECRET: &str = "shpss_0123456789abcdef0123456789abcdef";
    const OLD: &str = "shpss_old00000000000000000000000000000";
    const NEW: &str = "shpss_new00000000000000000000000000000";

    #[test]
    fn an_empty_signature_header_gives_way_to_the_other_spelling() {
        let v = Shopify::new([SECRET]).unwrap();
        let sig = "4GHarqKT6Ii21bNJz9F4jAwZD+ZP23np8M9NQRhQqZI=";
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let h = [("X-Shopify-Hmac-Sha256", ""), ("Shopify-Hmac-Sha256", sig)];
        assert!(v.verify(&h, br#"{"id":1}"#, now).is_ok());
        assert_eq!(
            v.verify(&[h[0]], br#"{"id":1}"#, now),
            Err(VerifyError::MissingHeader(HEADERS[0].into()))
        );
    }

    #[test]
    fn independent_vector_and_both_spellings() {
        // Shopify publishes no fixed vector; computed independently with
        // `openssl dgst -sha256 -hmac shpss_0123456789abcdef0123456789abcdef -binary | base64` over `{"id":1}`.
        let sig = "4GHarqKT6Ii21bNJz9F4jAwZD+ZP23np8M9NQRhQqZI=";
        let s = Shopify::new([SECRET]).unwrap();
        assert_eq!(s.sign(br#"{"id":1}"#), sig);
        let old = [
            ("x-shopify-hmac-sha256", sig),
            ("x-shopify-webhook-id", "w-1"),
        ];
        let new = [("shopify-hmac-sha256", sig), ("shopify-webhook-id", "w-2")];
        assert_eq!(
            s.verify(&old, br#"{"id":1}"#, Utc::now())
                .unwrap()
                .event_id
                .as_deref(),
            Some("w-1")
        );
        assert_eq!(
            s.verify(&new, br#"{"id":1}"#, Utc::now())
                .unwrap()
                .event_id
                .as_deref(),
            Some("w-2")
        );
        assert_eq!(
            s.verify(&old, br#"{"id":2}"#, Utc::now()),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn rotation_tries_every_secret_against_the_single_signature() {
        let oldest = Shopify::new([OLD]).unwrap();
        let both = Shopify::new([NEW, OLD]).unwrap();
        let sig = oldest.sign(b"{}");
        // Without the signature header, only `other` is left.
        let delivery = Signed {
            headers: &[(HEADERS[0], sig.as_str()), ("other", "x")],
            signature: HEADERS[0],
            body: b"{}",
            tampered: b"{ }",
        };
        delivery.check(&oldest, &both, Utc::now(), None);
        assert!(matches!(
            both.verify(&[(HEADERS[0], "not base64")], b"{}", Utc::now()),
            Err(VerifyError::MalformedHeader { .. })
        ));
    }
}
