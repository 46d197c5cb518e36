//! Paddle Billing: `Paddle-Signature: ts=<unix>;h1=<hex>` over `{ts}:{raw body}`.

use std::time::Duration;

use super::common::{self, Keys};
use super::macros;
use super::{SecretFormat, Verifier};

const HEADER: &str = "Paddle-Signature";

/// `ts=<unix>;h1=<hex>;...`: only `h1` entries are read.
pub(super) const SIGNATURE: common::TimedHeader = common::TimedHeader {
    name: HEADER,
    separator: b';',
    timestamp: b"ts",
    signature: b"h1",
    joiner: b":",
    repeated: "empty or repeated ts",
    empty: "empty or repeated ts",
    missing: "no ts",
};

/// Verifies Paddle Billing webhooks.
///
/// - Signed bytes: `{ts}:{raw body}`, HMAC-SHA256 with the notification
///   destination's secret key, lowercase hex. The header may carry several `h1`
///   entries (secret rotation): the delivery passes if any secret matches any `h1`.
///   Other schemes (`h2`, ...) are ignored.
/// - The timestamp must be within the tolerance of `now`, both ways. The default is
///   5 seconds, the window Paddle's official SDK gives an old timestamp (the SDK does
///   not refuse one ahead of its clock; this crate does, as for every provider: see
///   SECURITY.md); widen it with [`Paddle::tolerance`] if your clock drifts.
/// - Event id: the body field `event_id`. Retry window: live accounts are retried up
///   to 60 times over 3 days.
///
/// ```
/// use webhook_guard::verify::{Paddle, Verifier};
///
/// let paddle = Paddle::new(["pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_6h3qd3uFSi9YCD3OLYAShQI90XTI5vEI"]).unwrap();
/// let body = br#"{"event_id":"evt_01h","event_type":"transaction.completed"}"#;
/// let sig = paddle.sign(1_700_000_000, body);
/// let now = chrono::DateTime::from_timestamp(1_700_000_002, 0).unwrap();
/// let verified = paddle.verify(&[("Paddle-Signature", sig)], body, now).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("evt_01h"));
/// ```
#[derive(Debug, Clone)]
pub struct Paddle {
    keys: Keys,
    tolerance: Duration,
}

impl Paddle {
    /// The tolerance of Paddle's official SDK: 5 seconds.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5);
    /// Live accounts: up to 60 retries over 3 days.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(72 * 3600);

    /// Paddle's notification destination secret keys: `pdl_ntfset_`, the
    /// destination's id, `_` and the key (at least 32 characters after the prefix).
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Paddle")
        .prefix("pdl_ntfset_")
        .min_len(32)
        .mistaken(&[
            ("pdl_live_apikey_", "a Paddle API key"),
            ("pdl_sdbx_apikey_", "a Paddle sandbox API key"),
        ]);

    macros::keyed! {
        /// A verifier keyed with one or more secret keys.
        new;
        /// How far the signed timestamp may be from `now`, either way (default 5 s).
        tolerance;
    }

    /// The `Paddle-Signature` value for `body` at `timestamp`, signed with the first
    /// secret.
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> String {
        SIGNATURE.sign(&self.keys, timestamp, body)
    }
}

impl Verifier for Paddle {
    macros::verifier! {
        rekeyed;
        verify |self, headers, body, now| {
            SIGNATURE.verify(&self.keys, headers, body, now, self.tolerance, || {
                common::body_field(body, "event_id")
            })
        }
        event_type: paddle;
        tolerance;
        retry_window;
        /// Paddle's first attempt and up to 60 retries (live accounts).
        deliveries: 61;
    }
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;
    use crate::verify::testing::*;

    // Published vectors: paddle-node-sdk, src/__tests__/notifications/webhooks-validator.test.ts.
    // Their secrets are not in Paddle's format: built without the format check.
    const SECRET: &str = "VALID_SECRET";
    const T: i64 = 1_698_796_800;
    const OLD: &str = "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_old00000000000000000000000000000";
    const NEW: &str = "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_new00000000000000000000000000000";

    fn unchecked(secret: &str) -> Paddle {
        Paddle {
            keys: Keys::from_secrets([secret]).unwrap(),
            tolerance: Paddle::DEFAULT_TOLERANCE,
        }
    }

    fn check(body: &str, header: &str, now: i64) -> Result<Verified, VerifyError> {
        unchecked(SECRET).verify(&[("paddle-signature", header)], body.as_bytes(), at(now))
    }

    #[test]
    fn published_vectors() {
        let h = "ts=1698796800;h1=a300428748dce5c70e4da19bffd60769591ea969c99dea3105d0ec9612cf43f9";
        assert!(check(r#"{"data": ["1", "2"]}"#, h, T).is_ok());
        let multi = "ts=1698796800;h1=28981e941fae76e53db32f3d2a83cb69db41476595e84e1970a1b5d98f62b261;h1=28981e941fae76e53db32f3d2a83cb69db41476595e84e1970a1b5d98f62b261;h2=RANDOM_HASH";
        assert!(check(r#"{"data": "value"}"#, multi, T).is_ok());
        assert_eq!(
            unchecked("INVALID_VALID_SECRET").verify(
                &[(HEADER, h)],
                br#"{"data": ["1", "2"]}"#,
                at(T)
            ),
            Err(VerifyError::NoMatch)
        );
        // Re-spaced JSON is different bytes.
        assert_eq!(
            check(r#"{ "data": [ "1", "2" ]}"#, h, T),
            Err(VerifyError::NoMatch)
        );
        // The SDK's window for an old timestamp: +5 s passes, +6 s fails; and this
        // crate's for one ahead of the clock.
        window(T, 5, |now| check(r#"{"data": ["1", "2"]}"#, h, now));
        assert_eq!(unchecked(SECRET).sign(T, br#"{"data": ["1", "2"]}"#), h);
    }

    #[test]
    fn malformed_headers_from_the_sdk_tests() {
        for bad in [
            "invalid_header",
            "h1=invalid_header",
            "ts=;h1=00",
            "ts=1;ts=2;h1=00",
        ] {
            assert!(
                matches!(
                    check("{}", bad, T),
                    Err(VerifyError::MalformedHeader { .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(
            check("{}", "ts=1234;h2=invalid_header", T),
            Err(VerifyError::NoUsableSignature)
        );
        assert_eq!(
            check("{}", "ts=1234;h1=invalid_signature", T),
            Err(VerifyError::NoUsableSignature)
        );
    }

    #[test]
    fn rotation_and_event_id() {
        let old = Paddle::new([OLD]).unwrap();
        let both = Paddle::new([NEW, OLD]).unwrap();
        let body = br#"{"event_id":"evt_1"}"#;
        let sig = old.sign(T, body);
        let delivery = Signed {
            headers: &[(HEADER, sig.as_str())],
            signature: HEADER,
            body,
            tampered: br#"{"event_id":"evt_2"}"#,
        };
        delivery.check(&old, &both, at(T), Some("evt_1"));
    }
}
