use std::borrow::Cow;

use super::common::{self, Keys};
use super::macros;
use super::{Secret, Verified, Verifier};

/// Longest signature header this verifier reads; longer ones are rejected unread.
const MAX_HEADER_LEN: usize = 4096;

/// How a MAC is written in a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Encoding {
    /// Lowercase or uppercase hexadecimal.
    Hex,
    /// Standard base64 with padding.
    Base64,
}

impl Encoding {
    /// A 32-byte MAC written in this encoding, or why the text is not one.
    pub(crate) fn decode32(self, text: &[u8]) -> Result<[u8; 32], &'static str> {
        match self {
            Self::Hex => super::common::hex32(text).ok_or("not 64 hex digits"),
            Self::Base64 => super::common::base64_32(text).ok_or("not base64 of 32 bytes"),
        }
    }

    /// `mac` written in this encoding (hex in lowercase).
    pub(crate) fn encode(self, mac: &[u8]) -> String {
        match self {
            Self::Hex => hex::encode(mac),
            Self::Base64 => super::common::base64_encode(mac),
        }
    }
}

/// A generic verifier for schemes that put `prefix + encode(HMAC-SHA256(secret, raw body))`
/// in one header, such as GitHub's `X-Hub-Signature-256: sha256=<hex>`.
///
/// It accepts several secrets (rotation) and passes if any of them matches.
///
/// ```
/// use webhook_guard::verify::{Encoding, HmacSha256Header, Verifier};
///
/// let verifier = HmacSha256Header::new("X-Signature", ["a-random-secret-of-32-characters"])
///     .unwrap()
///     .prefix("sha256=")
///     .encoding(Encoding::Hex)
///     .event_id_header("X-Event-Id");
/// let body = br#"{"hello":"world"}"#;
/// let signature = verifier.sign(body);
/// let headers = [("x-signature", signature.as_str()), ("x-event-id", "evt_1")];
/// let verified = verifier.verify(&headers, body, chrono::Utc::now()).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("evt_1"));
/// ```
#[derive(Debug, Clone)]
pub struct HmacSha256Header {
    header: Cow<'static, str>,
    prefix: Cow<'static, str>,
    encoding: Encoding,
    id_header: Option<Cow<'static, str>>,
    keys: Keys,
}

/// Why a verifier could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// No secret was given, or one of them is empty.
    #[error("a verifier needs at least one non-empty secret")]
    EmptySecret,
    /// A secret is not in the encoding the scheme requires.
    #[error("secret is not valid {0}")]
    BadEncoding(&'static str),
    /// A secret begins or ends with whitespace: a trailing newline read from an
    /// environment variable or a file, most often.
    #[error(
        "the {provider} secret begins or ends with whitespace (a trailing newline from \
         an environment variable or a file?): trim it"
    )]
    Whitespace {
        /// The provider whose format was checked.
        provider: &'static str,
    },
    /// A secret is another of the provider's keys (an API key, say), not its
    /// webhook signing secret.
    #[error(
        "this looks like {what}, not a {provider} webhook signing secret: copy the \
         endpoint's signing secret (`{expected}...`)"
    )]
    WrongKey {
        /// The provider whose format was checked.
        provider: &'static str,
        /// What the key given seems to be.
        what: &'static str,
        /// How the provider's signing secrets begin.
        expected: &'static str,
    },
    /// A secret lacks the prefix every secret of the provider has.
    #[error("a {provider} webhook signing secret begins with `{prefix}`: copy the whole secret")]
    MissingPrefix {
        /// The provider whose format was checked.
        provider: &'static str,
        /// The prefix.
        prefix: &'static str,
    },
    /// A secret holds characters the provider's secrets never hold.
    #[error(
        "the {provider} secret holds characters its secrets never hold (only \
         {expected}): copy it again"
    )]
    BadCharacters {
        /// The provider whose format was checked.
        provider: &'static str,
        /// The characters its secrets hold, such as "hexadecimal digits".
        expected: &'static str,
    },
    /// A secret is shorter than any the provider issues (or, for the generic
    /// verifiers and the presets whose provider publishes no format, than 16 bytes).
    #[error(
        "the {provider} secret is {len} bytes{}, fewer than the {min} it must hold: \
         copy the whole secret (where no format is published, as for the generic \
         verifiers, use a random secret of 16 bytes or more, or mark a sender's shorter \
         one with `Secret::allow_short`)",
        after(prefix)
    )]
    TooShort {
        /// The provider whose format was checked.
        provider: &'static str,
        /// The secret's length after the prefix, in bytes.
        len: usize,
        /// The fewest bytes the provider issues after the prefix.
        min: usize,
        /// The prefix (empty when the provider has none).
        prefix: &'static str,
    },
    /// A secret is longer than any the provider issues or accepts.
    #[error(
        "the {provider} secret is {len} bytes, more than the {max} its secrets have: \
         copy the secret alone (no quotes, no other key beside it)"
    )]
    TooLong {
        /// The provider whose format was checked.
        provider: &'static str,
        /// The secret's length after the prefix, in bytes.
        len: usize,
        /// The most bytes the provider's secrets have after the prefix.
        max: usize,
    },
    /// A header name given to a verifier is not a valid HTTP header name.
    #[error("`{0}` is not a valid HTTP header name (letters, digits and `-`, no spaces)")]
    BadHeaderName(String),
    /// The public URL a scheme signs (Twilio, HubSpot) is not usable.
    #[error("public URL: {0}")]
    BadUrl(&'static str),
    /// The provider signs the URL it calls: build its preset with
    /// [`Provider::verifier_with_url`](super::Provider::verifier_with_url).
    #[error("this provider signs the URL it calls: give the endpoint's public URL")]
    NeedsUrl,
    /// The preset needs a crate feature that is off.
    #[error("this preset needs the crate's `{0}` feature")]
    NeedsFeature(&'static str),
}

/// " after `prefix`" for a prefix, nothing without one.
fn after(prefix: &str) -> String {
    if prefix.is_empty() {
        String::new()
    } else {
        format!(" after `{prefix}`")
    }
}

/// `name` as a header name a verifier reads, refused when HTTP would not carry it.
pub(crate) fn header_name(
    name: impl Into<Cow<'static, str>>,
) -> Result<Cow<'static, str>, KeyError> {
    let name = name.into();
    match http::HeaderName::from_bytes(name.as_bytes()) {
        Ok(_) => Ok(name),
        // Escaped: the name is the caller's, but may end up in a log.
        Err(_) => Err(KeyError::BadHeaderName(name.escape_debug().to_string())),
    }
}

impl HmacSha256Header {
    /// A verifier reading `header`, hex-encoded without prefix, keyed with `secrets`
    /// (each at least 16 bytes, unless marked with [`Secret::allow_short`]).
    ///
    /// # Errors
    /// [`KeyError::BadHeaderName`] if `header` is not a valid header name;
    /// [`KeyError::EmptySecret`] if no secret is given or one is empty; the
    /// [`SecretFormat::GENERIC`](super::SecretFormat::GENERIC) errors
    /// ([`KeyError::TooShort`], [`KeyError::Whitespace`]).
    pub fn new<S: Into<Secret>>(
        header: impl Into<Cow<'static, str>>,
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Self, KeyError> {
        Ok(Self {
            header: header_name(header)?,
            prefix: Cow::Borrowed(""),
            encoding: Encoding::Hex,
            id_header: None,
            keys: Keys::checked(secrets, &super::SecretFormat::GENERIC)?,
        })
    }

    macros::setters! {
        /// Text that precedes the encoded MAC, such as `sha256=`.
        prefix(prefix: impl Into<Cow<'static, str>>) => prefix = prefix.into();
        /// How the MAC is encoded.
        encoding(encoding: Encoding) => encoding = encoding;
        /// A header that carries the event id. The signature does not cover it: a
        /// captured delivery resent under a *new* id runs again (SECURITY.md, known
        /// limits; this generic verifier gives no content key, as it cannot tell whether
        /// the sender resends the same body); where the body carries the id, key on it
        /// instead (`EventId::json_field`).
        event_id_header(name: impl Into<Cow<'static, str>>) => id_header = Some(name.into());
    }

    /// The header value the sender would put on `body`, signed with the first secret.
    pub fn sign(&self, body: &[u8]) -> String {
        let tag = self.keys.sign_first(&[body]);
        format!("{}{}", self.prefix, self.encoding.encode(&tag))
    }
}

impl Verifier for HmacSha256Header {
    macros::verifier! {
        rekeyed(format: super::SecretFormat::GENERIC);
        verify |self, headers, body, _now| {
            let value = common::header_within(headers, &self.header, MAX_HEADER_LEN)?;
            let tag =
                common::single_tag(value, self.prefix.as_bytes(), self.encoding, &self.header)?;
            self.keys.check(&[body], &[tag])?;
            // Read as the presets read theirs: trimmed, and absent when empty.
            let id_header = self.id_header.as_deref();
            let event_id = id_header.and_then(|name| common::id_header(headers, &[name]));
            Ok(Verified::untimed(event_id))
        }
    }

    fn finds_event_id(&self) -> bool {
        self.id_header.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;

    fn now() -> DateTime<Utc> {
        Utc::now()
    }

    #[test]
    fn github_published_vector_passes() {
        let v = HmacSha256Header::new("X-Hub-Signature-256", ["It's a Secret to Everybody"])
            .unwrap()
            .prefix("sha256=");
        let headers = [(
            "X-Hub-Signature-256",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        )];
        assert!(v.verify(&headers, b"Hello, World!", now()).is_ok());
        assert_eq!(
            v.verify(&headers, b"Hello, World?", now()),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn the_id_header_is_read_trimmed_and_empty_is_none() {
        let v = HmacSha256Header::new("sig", ["k-0123456789abcdef"])
            .unwrap()
            .event_id_header("x-id");
        let sig = v.sign(b"body");
        let mut headers = http::HeaderMap::new();
        headers.insert("sig", sig.parse().unwrap());
        headers.insert("x-id", " evt_1 ".parse().unwrap());
        let verified = v.verify(&headers, b"body", now()).unwrap();
        assert_eq!(verified.event_id.as_deref(), Some("evt_1"));
        headers.insert("x-id", "  ".parse().unwrap());
        let verified = v.verify(&headers, b"body", now()).unwrap();
        assert_eq!(verified.event_id, None);
    }

    #[test]
    fn any_of_several_secrets_passes_and_bad_input_is_typed() {
        let old = HmacSha256Header::new("sig", ["old-0123456789abcdef"]).unwrap();
        let both =
            HmacSha256Header::new("sig", ["new-0123456789abcdef", "old-0123456789abcdef"]).unwrap();
        let sig = old.sign(b"body");
        assert!(both
            .verify(&[("sig", sig.as_str())], b"body", now())
            .is_ok());
        assert_eq!(
            both.verify(&[("other", "x")], b"body", now()),
            Err(VerifyError::MissingHeader("sig".into()))
        );
        assert!(matches!(
            both.verify(&[("sig", "zz")], b"body", now()),
            Err(VerifyError::MalformedHeader { .. })
        ));
        let huge = "a".repeat(1 << 20);
        assert!(matches!(
            both.verify(&[("sig", huge.as_str())], b"body", now()),
            Err(VerifyError::MalformedHeader {
                reason: "header too long",
                ..
            })
        ));
        assert_eq!(
            HmacSha256Header::new("sig", [""]).unwrap_err(),
            KeyError::EmptySecret
        );
        assert_eq!(
            HmacSha256Header::new("sig", Vec::<&str>::new()).unwrap_err(),
            KeyError::EmptySecret
        );
    }

    #[test]
    fn base64_encoding_round_trips() {
        let v = HmacSha256Header::new("X-Shopify-Hmac-Sha256", ["topsecretkey-0123456789"])
            .unwrap()
            .encoding(Encoding::Base64);
        let sig = v.sign(b"{}");
        assert!(v
            .verify(&[("x-shopify-hmac-sha256", sig.as_str())], b"{}", now())
            .is_ok());
        assert!(!format!("{v:?}").contains("topsecretkey"));
    }
}
