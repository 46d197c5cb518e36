//! Typeform: `Typeform-Signature: sha256=<base64>` over the raw body.

use std::time::Duration;

use super::common::{self, Keys};
use super::macros;
use super::SecretFormat;
use super::{Encoding, Verified, Verifier};

const HEADER: &str = "Typeform-Signature";
const SIGNATURE: common::SignatureHeader =
    common::SignatureHeader::new(HEADER, "sha256=", Encoding::Base64);

/// Verifies Typeform webhooks.
///
/// - Signed bytes: the raw body, HMAC-SHA256 keyed with the webhook's secret,
///   `sha256=` + standard base64 in `Typeform-Signature`.
/// - No timestamp is signed: no replay window; deduplication on the signed
///   `event_id` stops a replay of a captured delivery.
/// - Event id: the body's `event_id`. Retry window: Typeform's Webhooks API
///   documentation ("Delivery retries") retries every 2 to 3 minutes for 10 hours
///   after a 408, 423, 429 or 503 answer, and after any other failing answer backs
///   off 5, 10, 20 minutes, then 1, 2, 3 and 4 hours, which add up to 10 h 35 min:
///   11 hours here. It waits 30 s for an answer ("Timeout").
///
/// ```
/// use webhook_guard::verify::{Typeform, Verifier};
///
/// let typeform = Typeform::new(["a-secret-you-chose"]).unwrap();
/// let body = br#"{"event_id":"01HZ4TJ8","event_type":"form_response"}"#;
/// let sig = typeform.sign(body);
/// let verified = typeform
///     .verify(&[("Typeform-Signature", sig.as_str())], body, chrono::Utc::now())
///     .unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("01HZ4TJ8"));
/// ```
#[derive(Debug, Clone)]
pub struct Typeform {
    keys: Keys,
}

impl Typeform {
    /// What the constructor accepts as a secret: the secret you chose for the
    /// webhook (Typeform publishes no format or minimum): at least 16 bytes (the
    /// crate's floor for a chosen HMAC key), without surrounding whitespace (a
    /// trailing newline from an environment variable is refused).
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Typeform").min_len(16);

    /// Typeform's back-offs add up to 10 h 35 min: 11 hours.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(11 * 3600);

    macros::keyed! {
        /// A verifier keyed with one or more webhook secrets.
        new;
    }

    /// The `Typeform-Signature` value for `body`, signed with the first secret.
    pub fn sign(&self, body: &[u8]) -> String {
        SIGNATURE.sign(&self.keys, &[body])
    }
}

impl Verifier for Typeform {
    macros::verifier! {
        /// The event type is the body's `event_type`.
        event_type: json ["event_type"];
        rekeyed;
        verify |self, headers, body, _now| {
            SIGNATURE.check(&self.keys, headers, &[body])?;
            Ok(Verified::untimed(common::body_field(body, "event_id")))
        }
        event_meta: json
            ["event_type"],
            ["form_response", "submitted_at"],
            ["form_response", "token"];
        retry_window;
        answer_timeout: 30;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;

    const BODY: &[u8] = br#"{"event_id":"LtWXD3crgy","event_type":"form_response","form_response":{"form_id":"lT4Z3j","token":"a3a12ec67a1365927098a606107fac15","submitted_at":"2018-01-18T18:17:02Z"}}"#;

    #[test]
    fn independent_vector_prefix_and_rotation() {
        // Computed independently with Python's hmac (sha256, base64) over BODY,
        // key "tf_secret".
        let t = Typeform {
            keys: Keys::from_secrets(["tf_secret"]).unwrap(),
        };
        let sig = t.sign(BODY);
        assert_eq!(sig, "sha256=Ak7Px7CDOvm6Kki7/OtM9CpZdbtSF+SI4JHZaaorIwQ=");
        let mut tampered = BODY.to_vec();
        tampered[14] ^= 1;
        let delivery = Signed {
            headers: &[(HEADER, sig.as_str())],
            signature: HEADER,
            body: BODY,
            tampered: &tampered,
        };
        let both = Typeform {
            keys: Keys::from_secrets(["new-typeform-secret", "tf_secret"]).unwrap(),
        };
        delivery.check(&t, &both, Utc::now(), Some("LtWXD3crgy"));
        let bare = &sig["sha256=".len()..];
        assert_eq!(
            t.verify(&[(HEADER, bare)], BODY, Utc::now()),
            Err(VerifyError::NoUsableSignature)
        );
        let hex_sig = format!("sha256={}", hex::encode([0u8; 32]));
        assert!(matches!(
            t.verify(&[(HEADER, hex_sig.as_str())], BODY, Utc::now()),
            Err(VerifyError::MalformedHeader { .. })
        ));
        let meta = t.event_meta().unwrap().extract(BODY);
        assert_eq!(meta.event_type.as_deref(), Some("form_response"));
        assert!(meta.created_at.is_some());
    }

    #[test]
    fn the_constructor_keys_rotate() {
        let old = Typeform::new(["old-typeform-secret"]).unwrap();
        let both = Typeform::new(["new-typeform-secret", "old-typeform-secret"]).unwrap();
        let sig = old.sign(BODY);
        assert!(both
            .verify(&[(HEADER, sig.as_str())], BODY, Utc::now())
            .is_ok());
    }
}
