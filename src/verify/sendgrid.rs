//! SendGrid's signed Event Webhook: ECDSA P-256 over `{timestamp}{raw body}`.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::common;
use super::macros;
use super::{parse_unix_seconds, KeyError, Secret, Verifier, VerifyError};

const SIGNATURE: &str = "X-Twilio-Email-Event-Webhook-Signature";
const TIMESTAMP: &str = "X-Twilio-Email-Event-Webhook-Timestamp";

/// The DER `SubjectPublicKeyInfo` of a P-256 key (id-ecPublicKey, prime256v1) up
/// to its 65-byte uncompressed point.
const SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// Longest DER ECDSA P-256 signature (72 bytes) in base64, with room for padding.
const MAX_SIGNATURE_B64: usize = 100;

/// Verifies SendGrid's signed Event Webhook.
///
/// - Signed bytes: the `X-Twilio-Email-Event-Webhook-Timestamp` value immediately
///   followed by the raw body, ECDSA over P-256 with SHA-256; the signature is DER,
///   standard base64, in `X-Twilio-Email-Event-Webhook-Signature`. It is verified
///   with SendGrid's **public** verification key (base64 of the DER
///   `SubjectPublicKeyInfo`, as Mail Settings shows it; PEM armour is accepted too):
///   this preset holds no secret. Both forms of `s` (low and high) are accepted,
///   as SendGrid's own libraries accept them.
/// - The timestamp must be within the tolerance (default 300 s; SendGrid documents
///   none) of `now`, both ways.
/// - Event id: a POST carries a JSON array of events, each with its own
///   `sg_event_id`. With one event, its `sg_event_id`. With several, `batch-` and
///   the first 32 hex digits of the SHA-256 of their `sg_event_id`s (in order, one
///   per line): a batch sent again whole is a duplicate; a batch sent again in
///   another make-up runs again, so a handler keys its writes on each event's
///   `sg_event_id` (SendGrid's own advice: duplicates happen). A batch where an
///   event lacks `sg_event_id`: `body-` and the SHA-256 of the body.
/// - Retry window: SendGrid's Event Webhook troubleshooting page: events are
///   retried at increasing intervals for up to 24 hours after the event.
/// - Rotation: configure the old and the new public key.
///
/// ```
/// use webhook_guard::verify::{SendGrid, Verifier};
///
/// let sendgrid = SendGrid::new([
///     "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==",
/// ]).unwrap();
/// let body = br#"{"category":"example_payload","event":"test_event","message_id":"message_id"}"#;
/// let headers = [
///     ("X-Twilio-Email-Event-Webhook-Signature", "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0="),
///     ("X-Twilio-Email-Event-Webhook-Timestamp", "1588788367"),
/// ];
/// let now = chrono::DateTime::from_timestamp(1_588_788_367, 0).unwrap();
/// assert!(sendgrid.verify(&headers, body, now).is_ok());
/// ```
#[derive(Clone)]
pub struct SendGrid {
    keys: Vec<VerifyingKey>,
    tolerance: Duration,
}

impl fmt::Debug for SendGrid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendGrid")
            .field("public_keys", &self.keys.len())
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

/// The DER bytes of a base64 key, with or without PEM armour and line breaks.
fn der_of(text: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(text).ok()?;
    let b64: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("-----"))
        .flat_map(str::split_whitespace)
        .collect();
    base64::engine::general_purpose::STANDARD.decode(b64).ok()
}

impl SendGrid {
    /// No tolerance is documented by SendGrid: 300 s, as most schemes.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
    /// SendGrid retries for up to 24 hours.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(24 * 3600);

    /// A verifier of one or more public verification keys (base64 DER
    /// `SubjectPublicKeyInfo` of a P-256 key, as SendGrid shows it).
    ///
    /// # Errors
    /// [`KeyError::EmptySecret`] if no key is given or one is empty;
    /// [`KeyError::BadEncoding`] if one is not such a key.
    pub fn new<S: Into<Secret>>(
        public_keys: impl IntoIterator<Item = S>,
    ) -> Result<Self, KeyError> {
        let keys = common::public_keys(public_keys, |k| {
            let k: Secret = k.into();
            if k.is_empty() {
                return Err(KeyError::EmptySecret);
            }
            der_of(k.expose())
                .and_then(|der| VerifyingKey::from_public_key_der(&der).ok())
                .ok_or(KeyError::BadEncoding(
                    "base64 DER public key of P-256 (SendGrid's verification key)",
                ))
        })?;
        Ok(Self {
            keys,
            tolerance: Self::DEFAULT_TOLERANCE,
        })
    }

    macros::keyed! {
        /// How far the signed timestamp may be from `now`, either way (default 300 s).
        tolerance;
    }

    /// The signature header value SendGrid would send for `body` at `timestamp`,
    /// made with `signing_key`: base64 of a PKCS#8 DER P-256 private key (as
    /// `openssl pkcs8 -topk8 -outform DER` writes it), or of its 32-byte scalar.
    /// For tests and the `send` simulator: SendGrid keeps its own private key.
    ///
    /// # Errors
    /// [`KeyError::BadEncoding`] if the key is not in that form.
    pub fn sign(signing_key: &str, timestamp: i64, body: &[u8]) -> Result<String, KeyError> {
        let key = signing_key_from(signing_key)?;
        let mut msg = timestamp.to_string().into_bytes();
        msg.extend_from_slice(body);
        let sig: Signature = key.sign(&msg);
        Ok(common::base64_encode(sig.to_der().as_bytes()))
    }

    /// The two headers SendGrid puts on `body` at `timestamp`, signed with
    /// `signing_key` (see [`SendGrid::sign`]).
    ///
    /// # Errors
    /// As [`SendGrid::sign`].
    pub fn sign_headers(
        signing_key: &str,
        timestamp: i64,
        body: &[u8],
    ) -> Result<Vec<(&'static str, String)>, KeyError> {
        Ok(vec![
            (SIGNATURE, Self::sign(signing_key, timestamp, body)?),
            (TIMESTAMP, timestamp.to_string()),
        ])
    }

    /// The public verification key (base64 DER) of `signing_key`.
    ///
    /// # Errors
    /// [`KeyError::BadEncoding`] if the key is not in the form [`SendGrid::sign`] takes.
    pub fn public_key_of(signing_key: &str) -> Result<String, KeyError> {
        let key = signing_key_from(signing_key)?;
        let point = key.verifying_key().to_encoded_point(false);
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(point.as_bytes());
        Ok(common::base64_encode(&der))
    }
}

fn signing_key_from(text: &str) -> Result<SigningKey, KeyError> {
    let bad = KeyError::BadEncoding("base64 PKCS#8 DER or 32-byte P-256 private key");
    let der = der_of(text.as_bytes()).ok_or(bad.clone())?;
    SigningKey::from_pkcs8_der(&der)
        .or_else(|_| SigningKey::from_slice(&der))
        .map_err(|_| bad)
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, default)]
    sg_event_id: Option<std::borrow::Cow<'a, str>>,
}

/// The event id of a verified body (see [`SendGrid`]).
fn event_id(body: &[u8]) -> Option<String> {
    let events: Vec<Event<'_>> = serde_json::from_slice(body).ok()?;
    let ids: Option<Vec<&str>> = events
        .iter()
        .map(|e| e.sg_event_id.as_deref().filter(|id| !id.is_empty()))
        .collect();
    match ids.as_deref() {
        Some([]) => None,
        Some([one]) => Some((*one).to_owned()),
        Some(many) => {
            let digest = Sha256::digest(many.join("\n").as_bytes());
            Some(format!("batch-{}", &hex::encode(digest)[..32]))
        }
        None => Some(format!("body-{}", hex::encode(Sha256::digest(body)))),
    }
}

impl Verifier for SendGrid {
    macros::verifier! {
        rekeyed(by new);
        verify |self, headers, body, now| {
            let sig_b64 = common::bounded_header(headers, SIGNATURE)?;
            let ts = common::bounded_header(headers, TIMESTAMP)?;
            let signed_at = parse_unix_seconds(ts, TIMESTAMP)?;
            if sig_b64.len() > MAX_SIGNATURE_B64 {
                return Err(common::malformed(
                    SIGNATURE,
                    "longer than a P-256 signature",
                ));
            }
            let der = base64::engine::general_purpose::STANDARD
                .decode(sig_b64)
                .map_err(|_| common::malformed(SIGNATURE, "not base64"))?;
            let sig = Signature::from_der(&der)
                .map_err(|_| common::malformed(SIGNATURE, "not a DER ECDSA P-256 signature"))?;
            let mut msg = Vec::with_capacity(ts.len() + body.len());
            msg.extend_from_slice(ts);
            msg.extend_from_slice(body);
            if !self.keys.iter().any(|k| k.verify(&msg, &sig).is_ok()) {
                return Err(VerifyError::NoMatch);
            }
            common::timed(signed_at, now, self.tolerance, || event_id(body))
        }
        tolerance;
        retry_window;
    }
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;
    use crate::verify::testing::*;

    // Published vector: the tests of SendGrid's SDKs (`@sendgrid/eventwebhook` and
    // the others share it).
    const PUBLIC_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==";
    const SIG: &str = "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0=";
    const TS: &str = "1588788367";
    const BODY: &[u8] =
        br#"{"category":"example_payload","event":"test_event","message_id":"message_id"}"#;

    fn verify(key: &str, sig: &str, ts: &str, body: &[u8]) -> Result<Verified, VerifyError> {
        SendGrid::new([key]).unwrap().verify(
            &[(SIGNATURE, sig), (TIMESTAMP, ts)],
            body,
            at(1_588_788_367),
        )
    }

    #[test]
    fn sdk_vectors() {
        assert!(verify(PUBLIC_KEY, SIG, TS, BODY).is_ok());
        let other_key = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEqTxd43gyp8IOEto2LdIfjRQrIbsd4SXZkLW6jDutdhXSJCWHw8REntlo7aNDthvj+y7GjUuFDb/R1NGe1OPzpA==";
        assert_eq!(verify(other_key, SIG, TS, BODY), Err(VerifyError::NoMatch));
        assert_eq!(
            verify(PUBLIC_KEY, SIG, TS, b"payload"),
            Err(VerifyError::NoMatch)
        );
        let bad_sig = "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH3j/0=";
        assert_eq!(
            verify(PUBLIC_KEY, bad_sig, TS, BODY),
            Err(VerifyError::NoMatch)
        );
        assert!(matches!(
            verify(PUBLIC_KEY, SIG, "timestamp", BODY),
            Err(VerifyError::MalformedHeader { .. })
        ));
        let pem = format!("-----BEGIN PUBLIC KEY-----\n{PUBLIC_KEY}\n-----END PUBLIC KEY-----\n");
        assert!(verify(&pem, SIG, TS, BODY).is_ok());
    }

    #[test]
    fn sign_round_trips_ids_and_window() {
        // A fixed 32-byte scalar, base64.
        let private = common::base64_encode(&[7u8; 32]);
        let public = SendGrid::public_key_of(&private).unwrap();
        let v = SendGrid::new([public.as_str()]).unwrap();
        let one = br#"[{"sg_event_id":"ZGVsaXZlcmVk","event":"delivered"}]"#;
        let h = SendGrid::sign_headers(&private, 1_700_000_000, one).unwrap();
        let got = v.verify(&h, one, at(1_700_000_000)).unwrap();
        assert_eq!(got.event_id.as_deref(), Some("ZGVsaXZlcmVk"));
        window(1_700_000_000, 300, |now| v.verify(&h, one, at(now)));
        // The id of a body signed and verified at one time.
        let id_of = |body: &[u8]| {
            let h = SendGrid::sign_headers(&private, 1_700_000_000, body).unwrap();
            let verified = v.verify(&h, body, at(1_700_000_000)).unwrap();
            verified.event_id.unwrap()
        };
        let two = br#"[{"sg_event_id":"a"},{"sg_event_id":"b"}]"#;
        assert_eq!(
            id_of(two),
            format!("batch-{}", &hex::encode(Sha256::digest(b"a\nb"))[..32])
        );
        let anon = br#"[{"event":"open"}]"#;
        assert!(id_of(anon).starts_with("body-"));
        let h = SendGrid::sign_headers(&private, 1_700_000_000, anon).unwrap();
        // Rotation: either key verifies.
        let both = SendGrid::new([PUBLIC_KEY, public.as_str()]).unwrap();
        assert!(both.verify(&h, anon, at(1_700_000_000)).is_ok());
    }

    #[test]
    fn high_s_signatures_verify_too() {
        let private = common::base64_encode(&[9u8; 32]);
        let public = SendGrid::public_key_of(&private).unwrap();
        let v = SendGrid::new([public.as_str()]).unwrap();
        let body = b"[]";
        let low = SendGrid::sign(&private, 1, body).unwrap();
        let sig = Signature::from_der(
            &base64::engine::general_purpose::STANDARD
                .decode(&low)
                .unwrap(),
        )
        .unwrap();
        let (r, s) = sig.split_scalars();
        let high = Signature::from_scalars(r, -*s).unwrap();
        let high = common::base64_encode(high.to_der().as_bytes());
        assert_ne!(high, low);
        for s in [low, high] {
            assert!(v
                .verify(&[(SIGNATURE, s.as_str()), (TIMESTAMP, "1")], body, at(1))
                .is_ok());
        }
    }

    #[test]
    fn bad_keys_and_signatures_are_typed() {
        assert!(matches!(
            SendGrid::new(["not a key"]),
            Err(KeyError::BadEncoding(_))
        ));
        assert_eq!(SendGrid::new([""]).unwrap_err(), KeyError::EmptySecret);
        assert!(matches!(
            verify(PUBLIC_KEY, "AAAA", TS, BODY),
            Err(VerifyError::MalformedHeader { .. })
        ));
        let long = "A".repeat(200);
        assert!(matches!(
            verify(PUBLIC_KEY, &long, TS, BODY),
            Err(VerifyError::MalformedHeader { .. })
        ));
        assert!(!format!("{:?}", SendGrid::new([PUBLIC_KEY]).unwrap()).contains("MFkw"));
    }
}
