//! Discord interactions: ed25519 over `X-Signature-Timestamp` + raw body, and the
//! `PING` answered with a `PONG`.

use std::time::Duration;

use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};

use super::common;
use super::handshake::Handshake;
use super::macros;
use super::{parse_unix_seconds, KeyError, Secret, SecretFormat, Verifier, VerifyError};

const SIGNATURE: &str = "X-Signature-Ed25519";
const TIMESTAMP: &str = "X-Signature-Timestamp";

/// Verifies Discord interactions sent to an application's Interactions Endpoint
/// URL (feature `ed25519`).
///
/// - Signed bytes: `X-Signature-Timestamp` (as sent) + the raw body, ed25519 with
///   the application's key pair; the signature is hex in `X-Signature-Ed25519`,
///   checked against the application's public key (hex, from the Developer
///   Portal). Several public keys may be given.
/// - Replay window: Discord publishes none; the timestamp (Unix seconds) must be
///   within the tolerance (default 300 s) of `now`, both ways.
/// - Event id: the interaction's `id` (a snowflake, in the signed body).
/// - Retry window: Discord does not retry an interaction; it must be answered
///   within 3 seconds (a slower handler answers through a deferred response).
/// - Handshake: a `PING` (body `"type": 1`, signed like every interaction, which
///   is how Discord checks the endpoint, with valid and invalid signatures) is
///   answered by the guard with the `PONG` `{"type":1}`; the handler does not run
///   and nothing is stored. Any other interaction type reaches the handler, which
///   answers Discord through the interaction's follow-up endpoints.
///
/// ```
/// use webhook_guard::verify::{Discord, Verifier};
///
/// let seed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
/// let discord = Discord::new([Discord::public_key(seed).unwrap()]).unwrap();
/// let body = br#"{"id":"1234567890","type":1}"#;
/// let headers = Discord::sign_headers(seed, 1700000000, body).unwrap();
/// let now = chrono::DateTime::from_timestamp(1700000000, 0).unwrap();
/// let pong = discord.verify(&headers, body, now).unwrap().handshake.unwrap();
/// assert_eq!(pong.body, r#"{"type":1}"#);
/// ```
#[derive(Debug, Clone)]
pub struct Discord {
    public_keys: Vec<VerifyingKey>,
    tolerance: Duration,
}

impl Discord {
    /// The tolerance used unless set: 300 seconds (Discord publishes none).
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

    /// What the constructor accepts as a "secret": the application's public key,
    /// which Discord shows in hex and verifies ed25519 signatures with: an ed25519
    /// public key is 32 bytes, so exactly 64 hexadecimal digits, without
    /// surrounding whitespace (a trailing newline from an environment variable is
    /// refused). The key is then checked to be a valid ed25519 point.
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Discord").hex().exact_len(64);

    /// A verifier of interactions signed with any of `public_keys` (hex, as the
    /// Developer Portal shows them).
    ///
    /// # Errors
    /// [`KeyError::EmptySecret`] if no key is given; the other [`KeyError`]s of
    /// [`Self::SECRET_FORMAT`] (surrounding whitespace, a character that is no hex
    /// digit, fewer or more than 64 digits); [`KeyError::BadEncoding`] if the key
    /// is no valid ed25519 public key.
    pub fn new<K: AsRef<str>>(public_keys: impl IntoIterator<Item = K>) -> Result<Self, KeyError> {
        let public_keys = common::public_keys(public_keys, |k| {
            Self::SECRET_FORMAT.check(&Secret::from(k.as_ref()))?;
            let bytes = common::hex32(k.as_ref().as_bytes())
                .ok_or(KeyError::BadEncoding("hex of a 32-byte ed25519 public key"))?;
            VerifyingKey::from_bytes(&bytes)
                .map_err(|_| KeyError::BadEncoding("ed25519 public key"))
        })?;
        Ok(Self {
            public_keys,
            tolerance: Self::DEFAULT_TOLERANCE,
        })
    }

    macros::keyed! {
        /// How far the signed timestamp may be from `now`, either way (default 300 s).
        tolerance;
    }

    /// The public key (hex) of a signing key given as hex of its 32-byte seed (or
    /// of the 64-byte seed-and-public-key form NaCl libraries use): for tests and
    /// the `send` simulator.
    ///
    /// # Errors
    /// [`KeyError::BadEncoding`] for anything else.
    pub fn public_key(signing_key: &str) -> Result<String, KeyError> {
        Ok(hex::encode(
            signing_key_from(signing_key)?.verifying_key().as_bytes(),
        ))
    }

    /// The headers Discord sends with `body` at `timestamp`, signed with
    /// `signing_key` (hex, as for [`Discord::public_key`]): for tests and the
    /// `send` simulator.
    ///
    /// # Errors
    /// [`KeyError::BadEncoding`] for a signing key that is not such hex.
    pub fn sign_headers(
        signing_key: &str,
        timestamp: i64,
        body: &[u8],
    ) -> Result<Vec<(&'static str, String)>, KeyError> {
        let key = signing_key_from(signing_key)?;
        let t = timestamp.to_string();
        let mut msg = Vec::with_capacity(t.len() + body.len());
        msg.extend_from_slice(t.as_bytes());
        msg.extend_from_slice(body);
        let signature = key.sign(&msg);
        Ok(vec![
            (SIGNATURE, hex::encode(signature.to_bytes())),
            (TIMESTAMP, t),
        ])
    }
}

fn signing_key_from(text: &str) -> Result<SigningKey, KeyError> {
    let bytes = hex::decode(text.trim()).map_err(|_| KeyError::BadEncoding("hex signing key"))?;
    let seed: [u8; 32] = bytes
        .get(..32)
        .filter(|_| bytes.len() == 32 || bytes.len() == 64)
        .and_then(|s| s.try_into().ok())
        .ok_or(KeyError::BadEncoding(
            "hex of a 32- or 64-byte ed25519 signing key",
        ))?;
    Ok(SigningKey::from_bytes(&seed))
}

impl Verifier for Discord {
    macros::verifier! {
        verify |self, headers, body, now| {
            let value = common::bounded_header(headers, SIGNATURE)?;
            let ts = common::bounded_header(headers, TIMESTAMP)?;
            let signed_at = parse_unix_seconds(ts, TIMESTAMP)?;
            let mut sig = [0u8; 64];
            hex::decode_to_slice(value, &mut sig)
                .map_err(|_| common::malformed(SIGNATURE, "not 128 hex digits"))?;
            let signature = ed25519_dalek::Signature::from_bytes(&sig);
            let mut msg = Vec::with_capacity(ts.len() + body.len());
            msg.extend_from_slice(ts);
            msg.extend_from_slice(body);
            let ok = self
                .public_keys
                .iter()
                .any(|key| key.verify_strict(&msg, &signature).is_ok());
            if !ok {
                return Err(VerifyError::NoMatch);
            }
            let mut verified = common::timed(signed_at, now, self.tolerance, || {
                common::body_field(body, "id")
            })?;
            if common::body_field(body, "type").as_deref() == Some("1") {
                verified.handshake = Some(Handshake::json(
                    "discord_ping",
                    &serde_json::json!({ "type": 1 }),
                ));
            }
            Ok(verified)
        }
        tolerance;
        answer_timeout: 3;
        /// Discord sends an interaction once.
        deliveries: 1;
    }

    /// The application's public keys (hex) as the "secrets".
    fn with_secrets(
        &self,
        secrets: &[super::Secret],
    ) -> Option<Result<Box<dyn Verifier>, KeyError>> {
        let keys = secrets
            .iter()
            .map(|s| String::from_utf8_lossy(s.expose()).into_owned());
        Some(Self::new(keys.collect::<Vec<_>>()).map(|mut v| {
            v.tolerance = self.tolerance;
            Box::new(v) as Box<dyn Verifier>
        }))
    }

    fn retry_window(&self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;
    use crate::verify::testing::*;

    // RFC 8032, section 7.1, test 1: the key pair.
    const SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    const PUBLIC: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

    #[test]
    fn interactions_verify_and_pings_are_answered() {
        assert_eq!(Discord::public_key(SEED).unwrap(), PUBLIC);
        let other = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb";
        let d = Discord::new([Discord::public_key(other).unwrap().as_str(), PUBLIC]).unwrap();
        let body = br#"{"id":"1105219734829346837","type":2,"data":{"name":"hi"}}"#;
        let h = Discord::sign_headers(SEED, 1_700_000_000, body).unwrap();
        let v = d.verify(&h, body, at(1_700_000_000)).unwrap();
        assert_eq!(v.event_id.as_deref(), Some("1105219734829346837"));
        assert_eq!(v.handshake, None);
        let mut tampered = body.to_vec();
        tampered[8] = b'2';
        assert_eq!(
            d.verify(&h, &tampered, at(1_700_000_000)),
            Err(VerifyError::NoMatch)
        );
        let mut later = h.clone();
        later[1].1 = "1700000001".into();
        assert_eq!(
            d.verify(&later, body, at(1_700_000_000)),
            Err(VerifyError::NoMatch)
        );
        window(1_700_000_000, 300, |now| d.verify(&h, body, at(now)));
        let ping = br#"{"id":"1","type":1,"application_id":"2"}"#;
        let h = Discord::sign_headers(SEED, 1_700_000_000, ping).unwrap();
        let pong = d
            .verify(&h, ping, at(1_700_000_000))
            .unwrap()
            .handshake
            .unwrap();
        assert_eq!(
            (pong.body.as_str(), pong.content_type),
            (r#"{"type":1}"#, "application/json")
        );
        let forged =
            Discord::sign_headers(other.replace('4', "5").as_str(), 1_700_000_000, ping).unwrap();
        assert_eq!(
            d.verify(&forged, ping, at(1_700_000_000)),
            Err(VerifyError::NoMatch)
        );
        let short = [(SIGNATURE, "abcd"), (TIMESTAMP, "1700000000")];
        assert_eq!(
            d.verify(&short, ping, at(1_700_000_000))
                .unwrap_err()
                .code(),
            "malformed_header"
        );
        assert!(Discord::new(["zz"]).is_err());
        assert!(Discord::new(Vec::<String>::new()).is_err());
    }
}
