//! Linear: `Linear-Signature: <hex>` over the raw body, `webhookTimestamp` in the body.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::common::{self, Keys};
use super::macros;
use super::{Encoding, SecretFormat, Verifier, VerifyError};

const HEADER: &str = "Linear-Signature";
const SIGNATURE: common::SignatureHeader = common::SignatureHeader::new(HEADER, "", Encoding::Hex);
const DELIVERY: &str = "Linear-Delivery";

/// Verifies Linear webhooks.
///
/// - Signed bytes: the raw body, HMAC-SHA256, lowercase hex without prefix.
/// - The body field `webhookTimestamp` (Unix milliseconds) must be within the
///   tolerance (default 60 s, as Linear's SDK) of `now`, both ways. It is covered
///   by the signature because the whole body is. A body without it is refused.
/// - Event id: the `Linear-Delivery` header, which the signature does not cover: the
///   guard also deduplicates by the signed body (its
///   [`content_key`](Verifier::content_key)), so the body replayed inside the
///   tolerance under a new id is a duplicate. Each retry is re-signed with a fresh
///   `webhookTimestamp`, a new body under the same id: deduplicated by the id, and
///   never a conflict ([`Verifier::body_changes_on_retry`]). Retry window: Linear
///   retries a failed delivery after about 10 minutes, 30 minutes and 1 hour: about
///   100 minutes.
///
/// ```
/// use webhook_guard::verify::{Linear, Verifier};
///
/// let linear = Linear::new(["lin_wh_0123456789abcdef0123456789abcdef"]).unwrap();
/// let body = br#"{"action":"create","type":"Issue","webhookTimestamp":1700000000000}"#;
/// let sig = linear.sign(body);
/// let headers = [("Linear-Signature", sig.as_str()), ("Linear-Delivery", "234d1a4e")];
/// let now = chrono::DateTime::from_timestamp(1_700_000_030, 0).unwrap();
/// let verified = linear.verify(&headers, body, now).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("234d1a4e"));
/// ```
#[derive(Debug, Clone)]
pub struct Linear {
    keys: Keys,
    tolerance: Duration,
}

impl Linear {
    /// The tolerance of Linear's SDK: 60 seconds.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(60);
    /// Linear's retries (about 10 min, 30 min, 1 h) span about 100 minutes.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(100 * 60);

    /// Linear's webhook signing secrets (`lin_wh_...`) are longer than 32
    /// characters; an API key (`lin_api_`) is refused by name.
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Linear")
        .min_len(32)
        .mistaken(&[("lin_api_", "a Linear API key")]);

    macros::keyed! {
        /// A verifier keyed with one or more webhook signing secrets.
        new;
        /// How far `webhookTimestamp` may be from `now`, either way (default 60 s).
        tolerance;
    }

    /// The `Linear-Signature` value for `body`, signed with the first secret.
    pub fn sign(&self, body: &[u8]) -> String {
        SIGNATURE.sign(&self.keys, &[body])
    }
}

/// Parses `webhookTimestamp` (decimal milliseconds, at most 16 digits).
fn parse_millis(text: &str) -> Option<DateTime<Utc>> {
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    DateTime::from_timestamp_millis(text.parse().ok()?)
}

impl Verifier for Linear {
    macros::verifier! {
        rekeyed;
        verify |self, headers, body, now| {
            let value = common::bounded_header(headers, HEADER)?;
            let tag = SIGNATURE.tag_of(value.trim_ascii())?;
            self.keys.check(&[body], &[tag])?;
            let ts = common::body_field(body, "webhookTimestamp")
                .ok_or(VerifyError::MalformedBody("no webhookTimestamp"))?;
            let signed_at = parse_millis(&ts).ok_or(VerifyError::MalformedBody(
                "webhookTimestamp is not Unix milliseconds",
            ))?;
            common::timed(signed_at, now, self.tolerance, || {
                common::id_header(headers, &[DELIVERY])
            })
        }
        /// Linear puts a fresh `webhookTimestamp` in each retry's body (the 60 s
        /// tolerance would refuse an old one), so the body differs between attempts.
        body_changes_on_retry;
        /// The delivery id (`Linear-Delivery`) is not signed: the SHA-256 of the signed body.
        content_key: sha256;
        event_type: linear;
        tolerance;
        retry_window;
        /// Linear's first attempt and its 3 retries.
        deliveries: 4;
    }
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;
    use crate::verify::testing::*;

    const SECRET: &str = "lin_wh_0123456789abcdef0123456789abcdef";
    const NEW: &str = "lin_wh_new00000000000000000000000000000";

    #[test]
    fn independent_vector_and_timestamp_window() {
        // Linear's SDK tests sign at run time; this vector was computed independently
        // with `openssl dgst -sha256 -hmac lin_wh_0123456789abcdef0123456789abcdef` over the body below.
        let body = br#"{"action":"create","webhookTimestamp":1700000000000}"#;
        let sig = "36314d946af51dc1cbfb926a8120b6855a11edfb9fa342e81f22f17927ba361a";
        let l = Linear::new([SECRET]).unwrap();
        assert_eq!(l.sign(body), sig);
        let delivery = Signed {
            headers: &[("linear-signature", sig), ("linear-delivery", "d-1")],
            signature: HEADER,
            body,
            tampered: b"{}",
        };
        let both = Linear::new([NEW, SECRET]).unwrap();
        let v = delivery.check(&l, &both, at(1_700_000_000), Some("d-1"));
        assert_eq!(v.signed_at, Some(at(1_700_000_000)));
    }

    #[test]
    fn timestamp_edges_and_bad_timestamps() {
        let l = Linear::new([SECRET]).unwrap();
        let check = |body: &str, now: i64| {
            let sig = l.sign(body.as_bytes());
            l.verify(&[(HEADER, sig.as_str())], body.as_bytes(), at(now))
        };
        let body = r#"{"webhookTimestamp":1700000000000}"#;
        window(1_700_000_000, 60, |now| check(body, now));
        for bad in [
            r#"{}"#,
            r#"{"webhookTimestamp":-1}"#,
            r#"{"webhookTimestamp":"x"}"#,
            r#"{"webhookTimestamp":99999999999999999999}"#,
            r#"{"webhookTimestamp":1.5}"#,
            "not json",
        ] {
            assert!(
                matches!(
                    check(bad, 1_700_000_000),
                    Err(VerifyError::MalformedBody(_))
                ),
                "{bad}"
            );
        }
    }
}
