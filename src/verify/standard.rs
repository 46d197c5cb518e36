//! Standard Webhooks (and Svix): `webhook-id`, `webhook-timestamp`, `webhook-signature`.

use std::time::Duration;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;

use super::common::{self, Keys};
use super::macros;
use super::{parse_unix_seconds, KeyError, Secret, SecretFormat, Verifier, VerifyError};

/// Header names: the Standard Webhooks spelling and Svix's.
const STANDARD: Names = Names {
    id: "webhook-id",
    timestamp: "webhook-timestamp",
    signature: "webhook-signature",
};
const SVIX: Names = Names {
    id: "svix-id",
    timestamp: "svix-timestamp",
    signature: "svix-signature",
};

struct Names {
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
}

/// Base64 that accepts a secret with or without its padding.
const LENIENT_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Verifies [Standard Webhooks](https://www.standardwebhooks.com/) deliveries, including
/// Svix's `svix-*` header spelling.
///
/// - Signed bytes: `{webhook-id}.{webhook-timestamp}.{raw body}`, HMAC-SHA256, standard
///   base64. The signature header is a space-separated list of `v1,<base64>` entries;
///   the delivery passes if any configured secret matches any `v1` entry. Entries of
///   other versions are ignored.
/// - Secrets: `whsec_<base64>` (the prefix is optional; missing padding is accepted).
/// - With the `ed25519` feature, [`StandardWebhooks::ed25519`] verifies the asymmetric
///   `v1a,<base64>` entries with `whpk_` public keys instead.
/// - The timestamp must be within the tolerance (default 300 s) of `now`, both ways.
/// - Event id: the `webhook-id` (or `svix-id`) header. Retry window: about 28 hours
///   (Svix's schedule: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h).
///
/// ```
/// use webhook_guard::verify::{StandardWebhooks, Verifier};
///
/// let v = StandardWebhooks::new(["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"]).unwrap();
/// let body = br#"{"email":"test@example.com","username":"test_user"}"#;
/// let headers = v.sign_headers("msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", 1649367553, body);
/// let now = chrono::DateTime::from_timestamp(1649367553, 0).unwrap();
/// let verified = v.verify(&headers, body, now).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"));
/// ```
#[derive(Debug, Clone)]
pub struct StandardWebhooks {
    keys: Keys,
    #[cfg(feature = "ed25519")]
    public_keys: Vec<ed25519_dalek::VerifyingKey>,
    tolerance: Duration,
}

impl StandardWebhooks {
    /// The tolerance of the Standard Webhooks reference libraries: 300 seconds.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
    /// Svix retries over about 27.6 hours; rounded up to 28.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(28 * 3600);
    /// The shortest key accepted, in bytes once decoded: 16, as the generic
    /// verifiers (the specification recommends 24 to 64; Svix issues 24).
    pub const MIN_KEY_LEN: usize = 16;

    /// A verifier keyed with one or more `whsec_` secrets (symmetric `v1` signatures).
    ///
    /// # Errors
    /// [`KeyError::EmptySecret`] if no secret is given or one is empty;
    /// [`KeyError::BadEncoding`] if a secret is not base64 after its `whsec_` prefix.
    pub fn new<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Result<Self, KeyError> {
        Ok(Self {
            keys: Keys::from_secrets_with(secrets, decode_secret)?,
            #[cfg(feature = "ed25519")]
            public_keys: Vec::new(),
            tolerance: Self::DEFAULT_TOLERANCE,
        })
    }

    /// A verifier of asymmetric `v1a` (ed25519) signatures, given `whpk_` public keys.
    ///
    /// # Errors
    /// [`KeyError::EmptySecret`] if no key is given; [`KeyError::BadEncoding`] if a
    /// key is not base64 of a valid 32-byte ed25519 public key.
    #[cfg(feature = "ed25519")]
    #[cfg_attr(docsrs, doc(cfg(feature = "ed25519")))]
    pub fn ed25519<K: AsRef<str>>(
        public_keys: impl IntoIterator<Item = K>,
    ) -> Result<Self, KeyError> {
        let public_keys = common::public_keys(public_keys, |k| {
            let text = k.as_ref();
            let b64 = text.strip_prefix("whpk_").unwrap_or(text);
            let bytes: [u8; 32] = LENIENT_BASE64
                .decode(b64)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or(KeyError::BadEncoding("whpk_ base64 of 32 bytes"))?;
            ed25519_dalek::VerifyingKey::from_bytes(&bytes)
                .map_err(|_| KeyError::BadEncoding("ed25519 public key"))
        })?;
        Ok(Self {
            keys: Keys::default(),
            public_keys,
            tolerance: Self::DEFAULT_TOLERANCE,
        })
    }

    macros::keyed! {
        /// How far the signed timestamp may be from `now`, either way (default 300 s).
        tolerance;
    }

    /// The `webhook-signature` value (`v1,<base64>`) for a message, signed with the
    /// first secret. Panics if this verifier was built from public keys only.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        assert!(self.keys.len() > 0, "no symmetric secret to sign with");
        let t = timestamp.to_string();
        let tag = self
            .keys
            .sign_first(&[id.as_bytes(), b".", t.as_bytes(), b".", body]);
        format!("v1,{}", common::base64_encode(&tag))
    }

    /// The three headers a sender puts on a message: `webhook-id`,
    /// `webhook-timestamp` and `webhook-signature`.
    pub fn sign_headers(
        &self,
        id: &str,
        timestamp: i64,
        body: &[u8],
    ) -> Vec<(&'static str, String)> {
        vec![
            (STANDARD.id, id.to_owned()),
            (STANDARD.timestamp, timestamp.to_string()),
            (STANDARD.signature, self.sign(id, timestamp, body)),
        ]
    }

    /// The `v1a,<base64>` entry for a message, signed with a `whsk_` key (base64 of
    /// a 32-byte ed25519 seed, or of the 64-byte seed-and-public-key form).
    ///
    /// # Errors
    /// [`KeyError::BadEncoding`] if the key is not in that form.
    #[cfg(feature = "ed25519")]
    #[cfg_attr(docsrs, doc(cfg(feature = "ed25519")))]
    pub fn sign_ed25519(
        signing_key: &str,
        id: &str,
        timestamp: i64,
        body: &[u8],
    ) -> Result<String, KeyError> {
        use ed25519_dalek::Signer as _;
        let key = signing_key_from(signing_key)?;
        let msg = signed_content(id.as_bytes(), timestamp.to_string().as_bytes(), body);
        Ok(format!(
            "v1a,{}",
            common::base64_encode(&key.sign(&msg).to_bytes())
        ))
    }

    /// The `whpk_` public key that goes with a `whsk_` signing key.
    ///
    /// # Errors
    /// [`KeyError::BadEncoding`] if the key is not base64 of 32 or 64 bytes.
    #[cfg(feature = "ed25519")]
    #[cfg_attr(docsrs, doc(cfg(feature = "ed25519")))]
    pub fn public_key_of(signing_key: &str) -> Result<String, KeyError> {
        let key = signing_key_from(signing_key)?;
        Ok(format!(
            "whpk_{}",
            common::base64_encode(key.verifying_key().as_bytes())
        ))
    }

    #[cfg(feature = "ed25519")]
    fn ed25519_matches(&self, id: &[u8], ts: &[u8], body: &[u8], sigs: &[[u8; 64]]) -> bool {
        if self.public_keys.is_empty() || sigs.is_empty() {
            return false;
        }
        let msg = signed_content(id, ts, body);
        self.public_keys.iter().any(|key| {
            sigs.iter().any(|sig| {
                key.verify_strict(&msg, &ed25519_dalek::Signature::from_bytes(sig))
                    .is_ok()
            })
        })
    }
}

#[cfg(feature = "ed25519")]
fn signing_key_from(text: &str) -> Result<ed25519_dalek::SigningKey, KeyError> {
    let b64 = text.strip_prefix("whsk_").unwrap_or(text);
    let bytes = LENIENT_BASE64
        .decode(b64)
        .map_err(|_| KeyError::BadEncoding("whsk_ base64"))?;
    let seed: [u8; 32] = bytes
        .get(..32)
        .filter(|_| bytes.len() == 32 || bytes.len() == 64)
        .and_then(|s| s.try_into().ok())
        .ok_or(KeyError::BadEncoding("whsk_ base64 of 32 or 64 bytes"))?;
    Ok(ed25519_dalek::SigningKey::from_bytes(&seed))
}

#[cfg(feature = "ed25519")]
fn signed_content(id: &[u8], ts: &[u8], body: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(id.len() + ts.len() + body.len() + 2);
    msg.extend_from_slice(id);
    msg.push(b'.');
    msg.extend_from_slice(ts);
    msg.push(b'.');
    msg.extend_from_slice(body);
    msg
}

/// Checks the text of a secret (no surrounding whitespace), strips `whsec_` and
/// base64-decodes (padding optional) a key of at least
/// [`StandardWebhooks::MIN_KEY_LEN`] bytes.
fn decode_secret(secret: Secret) -> Result<Secret, KeyError> {
    const FORMAT: SecretFormat = SecretFormat::new("Standard Webhooks");
    FORMAT.check(&secret)?;
    let raw = secret.expose();
    let b64 = raw.strip_prefix(b"whsec_").unwrap_or(raw);
    let key = LENIENT_BASE64
        .decode(b64)
        .map_err(|_| KeyError::BadEncoding("base64 after whsec_"))?;
    if key.is_empty() {
        return Err(KeyError::EmptySecret);
    }
    if key.len() < StandardWebhooks::MIN_KEY_LEN {
        return Err(KeyError::TooShort {
            provider: FORMAT.provider(),
            len: key.len(),
            min: StandardWebhooks::MIN_KEY_LEN,
            prefix: "whsec_ (decoded)",
        });
    }
    Ok(Secret::new(key))
}

/// The signature entries of a `webhook-signature` value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[doc(hidden)]
pub struct Signatures {
    /// Decoded `v1` (HMAC-SHA256) signatures.
    pub v1: Vec<[u8; 32]>,
    /// Decoded `v1a` (ed25519) signatures.
    pub v1a: Vec<[u8; 64]>,
}

/// Parses a space-separated `webhook-signature` value. Bounded: refuses more than
/// 8 KiB or 32 entries before reading any. Unreadable entries and unknown versions
/// are skipped.
///
/// # Errors
/// [`VerifyError::MalformedHeader`] for too long a header or too many entries;
/// [`VerifyError::NoUsableSignature`] when no entry decodes.
#[doc(hidden)]
pub fn parse_signatures(value: &[u8]) -> Result<Signatures, VerifyError> {
    parse_signatures_of(value, STANDARD.signature)
}

/// [`parse_signatures`] of the header `name` (`svix-signature` for a Svix delivery),
/// which its errors name.
fn parse_signatures_of(value: &[u8], name: &'static str) -> Result<Signatures, VerifyError> {
    common::check_len(value, name)?;
    common::check_entries(value, b' ', name)?;
    let mut out = Signatures::default();
    for entry in value.split(|&b| b == b' ').filter(|e| !e.is_empty()) {
        let Some(comma) = entry.iter().position(|&b| b == b',') else {
            continue;
        };
        let (version, sig) = (&entry[..comma], &entry[comma + 1..]);
        match version {
            b"v1" => out.v1.extend(common::base64_32(sig)),
            // 64 bytes are 88 base64 characters with padding.
            b"v1a" if sig.len() == 88 => {
                let mut buf = [0u8; 66];
                if let Ok(64) =
                    base64::engine::general_purpose::STANDARD.decode_slice(sig, &mut buf)
                {
                    out.v1a.push(buf[..64].try_into().expect("64 bytes"));
                }
            }
            _ => {}
        }
    }
    if out.v1.is_empty() && out.v1a.is_empty() {
        return Err(VerifyError::NoUsableSignature);
    }
    Ok(out)
}

impl Verifier for StandardWebhooks {
    macros::verifier! {
        verify |self, headers, body, now| {
            // Each header is read once: the signature header also tells the spelling.
            let (names, signatures) = match headers.get_bytes(STANDARD.signature) {
                Some(value) => (&STANDARD, value),
                None => match headers.get_bytes(SVIX.signature) {
                    Some(value) => (&SVIX, value),
                    None => return Err(VerifyError::MissingHeader(STANDARD.signature.into())),
                },
            };
            let id = common::bounded_header(headers, names.id)?;
            if id.is_empty() {
                return Err(common::malformed(names.id, "empty id"));
            }
            let ts = common::bounded_header(headers, names.timestamp)?;
            let signed_at = parse_unix_seconds(ts, names.timestamp)?;
            common::check_len(signatures, names.signature)?;
            let sigs = parse_signatures_of(signatures, names.signature)?;
            // Entries only of the scheme this verifier does not hold keys for.
            #[cfg(feature = "ed25519")]
            let usable = (self.keys.len() > 0 && !sigs.v1.is_empty())
                || (!self.public_keys.is_empty() && !sigs.v1a.is_empty());
            #[cfg(not(feature = "ed25519"))]
            let usable = !sigs.v1.is_empty();
            if !usable {
                return Err(VerifyError::NoUsableSignature);
            }
            let hmac_ok = self.keys.any_match(&[id, b".", ts, b".", body], &sigs.v1);
            #[cfg(feature = "ed25519")]
            let ok = hmac_ok || self.ed25519_matches(id, ts, body, &sigs.v1a);
            #[cfg(not(feature = "ed25519"))]
            let ok = hmac_ok;
            if !ok {
                return Err(VerifyError::NoMatch);
            }
            common::timed(signed_at, now, self.tolerance, || common::id_value(id))
        }
        event_type: standard_webhooks;
        tolerance;
        retry_window;
        /// Svix's schedule: the first attempt and 7 retries.
        deliveries: 8;
    }

    /// Keyed with `whsec_` secrets, or, for a verifier of `v1a` signatures, with
    /// `whpk_` public keys (as text).
    fn with_secrets(&self, secrets: &[Secret]) -> Option<Result<Box<dyn Verifier>, KeyError>> {
        #[cfg(feature = "ed25519")]
        if !self.public_keys.is_empty() {
            let keys = secrets
                .iter()
                .map(|s| std::str::from_utf8(s.expose()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| KeyError::BadEncoding("whpk_ base64 of 32 bytes"));
            return Some(keys.and_then(Self::ed25519).map(|verifier| {
                Box::new(verifier.tolerance(self.tolerance)) as Box<dyn Verifier>
            }));
        }
        let keys = Keys::from_secrets_with(secrets.iter().cloned(), decode_secret);
        Some(keys.map(|keys| {
            let mut verifier = self.clone();
            verifier.keys = keys;
            Box::new(verifier) as Box<dyn Verifier>
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;
    use crate::verify::testing::*;

    // Published vector from the Standard Webhooks spec libraries' tests.
    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const TS: &str = "1649367553";
    const BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const SIG: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    fn now() -> DateTime<Utc> {
        at(1_649_367_553)
    }

    /// The published id and timestamp, with `signature`, in the standard spelling.
    fn headers(signature: &str) -> [(&'static str, &str); 3] {
        [
            ("webhook-id", ID),
            ("webhook-timestamp", TS),
            ("webhook-signature", signature),
        ]
    }

    #[test]
    fn published_vector_passes_with_both_header_spellings() {
        let v = StandardWebhooks::new([SECRET]).unwrap();
        let std_h = headers(SIG);
        let svix_h = [
            ("Svix-Id", ID),
            ("Svix-Timestamp", TS),
            ("Svix-Signature", SIG),
        ];
        for h in [&std_h, &svix_h] {
            let verified = v.verify(h, BODY, now()).unwrap();
            assert_eq!(verified.event_id.as_deref(), Some(ID));
            assert_eq!(verified.signed_at, Some(now()));
        }
        assert_eq!(v.sign(ID, 1_649_367_553, BODY), SIG);
        assert_eq!(v.verify(&std_h, b"{}", now()), Err(VerifyError::NoMatch));
    }

    /// An error about a Svix delivery's signature list names the header it came in.
    #[test]
    fn too_many_svix_entries_name_the_svix_header() {
        let v = StandardWebhooks::new([SECRET]).unwrap();
        let list = vec![SIG; 33].join(" ");
        let h = [
            ("svix-id", ID),
            ("svix-timestamp", TS),
            ("svix-signature", list.as_str()),
        ];
        match v.verify(&h, BODY, now()) {
            Err(VerifyError::MalformedHeader { header, reason }) => {
                assert_eq!((&*header, reason), ("svix-signature", "too many entries"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn secrets_without_prefix_or_padding_work_and_bad_ones_are_key_errors() {
        let bare = StandardWebhooks::new(["C2FVsBQIhrscChlQIMV+b5sSYspob7oD"]).unwrap();
        assert_eq!(bare.sign(ID, 1_649_367_553, BODY), SIG);
        // 24 bytes encode without padding; check a key that needs it.
        let padded = format!("whsec_{}", common::base64_encode(b"sixteen byte key!"));
        let unpadded = padded.trim_end_matches('=').to_owned();
        assert_ne!(padded, unpadded);
        assert_eq!(
            StandardWebhooks::new([padded]).unwrap().sign(ID, 1, BODY),
            StandardWebhooks::new([unpadded]).unwrap().sign(ID, 1, BODY)
        );
        assert!(matches!(
            StandardWebhooks::new(["whsec_not base64!"]),
            Err(KeyError::BadEncoding(_))
        ));
        assert_eq!(
            StandardWebhooks::new(["whsec_"]).unwrap_err(),
            KeyError::EmptySecret
        );
    }

    #[test]
    fn any_entry_and_any_secret_passes() {
        let v = StandardWebhooks::new(["whsec_YSBuZXcga2V5IG9mIDI0IGJ5dGVzISEh", SECRET]).unwrap();
        let list = format!("v1,{} v2,abc {SIG}", common::base64_encode(&[0; 32]));
        let h = headers(list.as_str());
        assert!(v.verify(&h, BODY, now()).is_ok());
        let none = headers("v2,abc");
        assert_eq!(
            v.verify(&none, BODY, now()),
            Err(VerifyError::NoUsableSignature)
        );
    }

    #[test]
    fn tolerance_both_directions_and_missing_headers() {
        let v = StandardWebhooks::new([SECRET]).unwrap();
        let h = headers(SIG);
        window(1_649_367_553, 300, |now| v.verify(&h, BODY, at(now)));
        assert_eq!(
            v.verify(&[h[0], h[1]], BODY, now()),
            Err(VerifyError::MissingHeader("webhook-signature".into()))
        );
        assert_eq!(
            v.verify(&[h[1], h[2]], BODY, now()),
            Err(VerifyError::MissingHeader("webhook-id".into()))
        );
        let bad_ts = [
            ("webhook-id", ID),
            ("webhook-timestamp", "-5"),
            ("webhook-signature", SIG),
        ];
        assert!(matches!(
            v.verify(&bad_ts, BODY, now()),
            Err(VerifyError::MalformedHeader { .. })
        ));
    }

    #[test]
    fn hostile_signature_lists_are_bounded() {
        let many = vec![SIG; 10_000].join(" ");
        assert!(matches!(
            parse_signatures(many.as_bytes()),
            Err(VerifyError::MalformedHeader {
                reason: "header too long",
                ..
            })
        ));
        let count = vec!["v1,x"; 40].join(" ");
        assert!(matches!(
            parse_signatures(count.as_bytes()),
            Err(VerifyError::MalformedHeader {
                reason: "too many entries",
                ..
            })
        ));
    }

    #[cfg(feature = "ed25519")]
    #[test]
    fn ed25519_v1a_round_trips_and_refuses_other_keys() {
        let sk = format!("whsk_{}", common::base64_encode(&[7; 32]));
        let other = format!("whsk_{}", common::base64_encode(&[8; 32]));
        let pk = StandardWebhooks::public_key_of(&sk).unwrap();
        let sig = StandardWebhooks::sign_ed25519(&sk, ID, 1_649_367_553, BODY).unwrap();
        let v = StandardWebhooks::ed25519([pk.as_str()]).unwrap();
        let h = headers(sig.as_str());
        assert_eq!(
            v.verify(&h, BODY, now()).unwrap().event_id.as_deref(),
            Some(ID)
        );
        assert_eq!(v.verify(&h, b"x", now()), Err(VerifyError::NoMatch));
        let wrong =
            StandardWebhooks::ed25519([StandardWebhooks::public_key_of(&other).unwrap()]).unwrap();
        assert_eq!(wrong.verify(&h, BODY, now()), Err(VerifyError::NoMatch));
        // A verifier finds no entry of its own scheme in the other's signatures.
        let sym = StandardWebhooks::new([SECRET]).unwrap();
        assert_eq!(
            sym.verify(&h, BODY, now()),
            Err(VerifyError::NoUsableSignature)
        );
        let h1 = headers(SIG);
        assert_eq!(
            v.verify(&h1, BODY, now()),
            Err(VerifyError::NoUsableSignature)
        );
        let both = format!("{SIG} {sig}");
        let h2 = headers(both.as_str());
        assert!(
            v.verify(&h2, BODY, now()).is_ok(),
            "its own entry among others"
        );
        assert!(
            sym.verify(&h2, BODY, now()).is_ok(),
            "its own entry among others"
        );
        assert!(StandardWebhooks::ed25519(["whpk_AAAA"]).is_err());
    }
}
