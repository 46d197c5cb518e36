//! Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]`.

use std::time::Duration;

use super::common::{self, Keys};
use super::macros;
use super::{SecretFormat, Verifier};

const HEADER: &str = "Stripe-Signature";

/// `t=<unix>,v1=<hex>,...`: only `v1` entries are read; `v0` (test mode's fake)
/// and unknown schemes are ignored.
pub(super) const SIGNATURE: common::TimedHeader = common::TimedHeader::t_v1(HEADER);

/// Verifies Stripe webhooks.
///
/// - Signed bytes: `{t}.{raw body}`, HMAC-SHA256, lowercase hex, keyed with the
///   endpoint secret *as written* (the `whsec_` prefix included, not decoded).
/// - Only `v1` entries are considered; `v0` and any other scheme are ignored
///   (downgrade protection). During a secret roll Stripe sends one `v1` per active
///   secret: the delivery passes if any configured secret matches any `v1`.
/// - The timestamp `t` must be within the tolerance (default 300 s) of `now`, in
///   both directions.
/// - Event id: the body's `id` field (`evt_...`). Retry window: 72 hours.
///
/// ```
/// use webhook_guard::verify::{Stripe, Verifier};
///
/// let stripe = Stripe::new(["whsec_wRNftLajMZNeslQOP6vEPm4iVx5NlZ6z"]).unwrap();
/// let body = br#"{"id":"evt_1","type":"charge.succeeded"}"#;
/// let header = stripe.sign(body, 1_700_000_000);
/// let now = chrono::DateTime::from_timestamp(1_700_000_010, 0).unwrap();
/// let verified = stripe.verify(&[("Stripe-Signature", header)], body, now).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("evt_1"));
/// ```
#[derive(Debug, Clone)]
pub struct Stripe {
    keys: Keys,
    tolerance: Duration,
}

impl Stripe {
    /// Stripe's SDK default tolerance: 300 seconds.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
    /// Stripe retries a live-mode event for up to 72 hours.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(72 * 3600);

    /// Stripe's endpoint signing secrets: `whsec_` and at least 32 letters or digits
    /// (32 from the Dashboard and the API, 64 hex digits from `stripe listen`). An
    /// API key (`sk_`, `rk_`, `pk_`) or an endpoint id (`we_`) is refused by name.
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Stripe")
        .prefix("whsec_")
        .min_len(32)
        .alphanumeric()
        .mistaken(&[
            ("sk_", "a secret API key"),
            ("rk_", "a restricted API key"),
            ("pk_", "a publishable key"),
            ("we_", "a webhook endpoint id"),
        ]);

    macros::keyed! {
        /// A verifier keyed with one or more endpoint secrets (`whsec_...`, used as-is).
        new;
        /// How far the signed timestamp may be from `now`, either way (default 300 s).
        tolerance;
    }

    /// The `Stripe-Signature` value Stripe would send for `body` at `timestamp`
    /// (Unix seconds), signed with the first secret.
    pub fn sign(&self, body: &[u8], timestamp: i64) -> String {
        SIGNATURE.sign(&self.keys, timestamp, body)
    }
}

impl Verifier for Stripe {
    macros::verifier! {
        rekeyed;
        verify |self, headers, body, now| {
            SIGNATURE.verify(&self.keys, headers, body, now, self.tolerance, || {
                common::body_field(body, "id")
            })
        }
        event_meta: crate::meta::MetaExtractor::stripe();
        event_type: stripe;
        tolerance;
        retry_window;
        answer_timeout: 5;
    }
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;
    use crate::verify::testing::*;

    const SECRET: &str = "whsec_testsecret0123456789abcdefghijkl";
    const BODY: &[u8] = br#"{"id":"evt_test_webhook","object":"event"}"#;
    const T: i64 = 1_700_000_000;
    const OLD: &str = "whsec_old00000000000000000000000000000";
    const NEW: &str = "whsec_new00000000000000000000000000000";

    fn verify(header: &str) -> Result<Verified, VerifyError> {
        Stripe::new([SECRET])
            .unwrap()
            .verify(&[("stripe-signature", header)], BODY, at(T))
    }

    #[test]
    fn independent_vector_passes() {
        // Stripe publishes no fixed vector (its SDK tests sign at run time); this one
        // was computed independently with `openssl dgst -sha256 -hmac whsec_testsecret0123456789abcdefghijkl`
        // (and Python's hmac) over `1700000000.{"id":"evt_test_webhook","object":"event"}`.
        let header =
            "t=1700000000,v1=6402dd4c74940b3015398355b34467a49e41811cd7459e17a80c98dceffc2c22";
        assert!(verify(header).is_ok());
        assert_eq!(Stripe::new([SECRET]).unwrap().sign(BODY, T), header);
    }

    #[test]
    fn sign_round_trips_and_fills_id_and_time() {
        let v = verify(&Stripe::new([SECRET]).unwrap().sign(BODY, T)).unwrap();
        assert_eq!(v.event_id.as_deref(), Some("evt_test_webhook"));
        assert_eq!(v.signed_at, Some(at(T)));
    }

    #[test]
    fn malformed_headers_from_stripe_sdk_tests_are_rejected() {
        let good = Stripe::new([SECRET]).unwrap().sign(BODY, T);
        let sig = &good[good.find("v1=").unwrap() + 3..];
        for bad in [
            format!("t=,v1={sig}"),
            "t,v1=,v0=".to_owned(),
            ",,".to_owned(),
            "t".to_owned(),
            "v1,t=1".to_owned(),
            "t=".to_owned(),
            String::new(),
        ] {
            assert!(
                matches!(verify(&bad), Err(VerifyError::MalformedHeader { .. })),
                "{bad:?} -> {:?}",
                verify(&bad)
            );
        }
        assert_eq!(
            verify(&format!("t={T},v0={sig}")),
            Err(VerifyError::NoUsableSignature)
        );
        assert_eq!(
            verify(&format!("t={T},v1=bad_signature")),
            Err(VerifyError::NoUsableSignature)
        );
    }

    #[test]
    fn extra_invalid_v1_next_to_a_valid_one_passes() {
        let good = Stripe::new([SECRET]).unwrap().sign(BODY, T);
        assert!(verify(&format!("{good},v1=bad_signature")).is_ok());
        assert!(verify(&format!("{good},v1={}", "0".repeat(64))).is_ok());
        let zeros = format!("t={T},v1={}", "0".repeat(64));
        assert_eq!(verify(&zeros), Err(VerifyError::NoMatch));
    }

    #[test]
    fn rotation_accepts_old_and_new_secrets() {
        let old = Stripe::new([OLD]).unwrap();
        let new = Stripe::new([NEW]).unwrap();
        let both = Stripe::new([NEW, OLD]).unwrap();
        let h_old = old.sign(BODY, T);
        let h_new = new.sign(BODY, T);
        let rolled = format!("{h_old},v1={}", &h_new[h_new.find("v1=").unwrap() + 3..]);
        for h in [&h_old, &h_new, &rolled] {
            assert!(both.verify(&[(HEADER, h.as_str())], BODY, at(T)).is_ok());
        }
        assert!(old
            .verify(&[(HEADER, rolled.as_str())], BODY, at(T))
            .is_ok());
        assert!(new
            .verify(&[(HEADER, h_old.as_str())], BODY, at(T))
            .is_err());
    }

    #[test]
    fn tolerance_edges_in_both_directions() {
        let s = Stripe::new([SECRET]).unwrap();
        let h = s.sign(BODY, T);
        let h = [(HEADER, h.as_str())];
        window(T, 300, |now| s.verify(&h, BODY, at(now)));
        let strict = s.clone().tolerance(Duration::from_secs(10));
        assert!(strict.verify(&h, BODY, at(T + 11)).is_err());
    }

    #[test]
    fn hostile_headers_are_bounded() {
        let many = format!("t={T}{}", ",v1=00".repeat(40));
        assert!(matches!(
            verify(&many),
            Err(VerifyError::MalformedHeader {
                reason: "too many entries",
                ..
            })
        ));
        let huge = format!("t={T},v1={}", "a".repeat(1 << 20));
        assert!(matches!(
            verify(&huge),
            Err(VerifyError::MalformedHeader {
                reason: "header too long",
                ..
            })
        ));
        for ts in ["-1", "99999999999999999999", "1e9", "12 "] {
            let good = Stripe::new([SECRET]).unwrap().sign(BODY, T);
            let h = good.replacen(&format!("t={T}"), &format!("t={ts}"), 1);
            assert!(matches!(
                verify(&h),
                Err(VerifyError::MalformedHeader { .. })
            ));
        }
    }
}
