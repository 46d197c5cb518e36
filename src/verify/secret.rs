use std::fmt;

use super::KeyError;

/// Secret key material. Its `Debug` output never shows the key, and it has no
/// `PartialEq`: an `==` on key bytes would take time that tells how many leading
/// bytes matched.
#[derive(Clone)]
pub struct Secret {
    bytes: Box<[u8]>,
    /// Marked by [`Secret::allow_short`].
    short_ok: bool,
}

impl Secret {
    /// Wraps raw key bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            bytes: bytes.into().into_boxed_slice(),
            short_ok: false,
        }
    }

    /// Marks this secret as deliberately shorter than the 16 bytes the generic HMAC
    /// verifiers ([`HmacSha256Header`](super::HmacSha256Header),
    /// [`GenericHmac`](super::GenericHmac)) require otherwise: for a sender that
    /// issues short secrets. A preset checks the format its provider issues and
    /// ignores the mark.
    ///
    /// ```
    /// use webhook_guard::verify::{HmacSha256Header, KeyError, Secret};
    ///
    /// assert!(matches!(HmacSha256Header::new("X-Signature", ["s3cret"]), Err(KeyError::TooShort { .. })));
    /// assert!(HmacSha256Header::new("X-Signature", [Secret::from("s3cret").allow_short()]).is_ok());
    /// ```
    #[must_use]
    pub fn allow_short(mut self) -> Self {
        self.short_ok = true;
        self
    }

    /// The key bytes.
    pub fn expose(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether the key is empty (an empty key is refused by every verifier).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// What a provider's secrets look like, checked when a verifier is built so that a
/// secret that cannot be the one the provider issued (an empty or truncated value, a
/// trailing newline from an environment variable or a file, an API key pasted where
/// the webhook signing secret belongs) is refused with a [`KeyError`] naming the fix,
/// instead of answering 401 to every genuine delivery.
///
/// Every preset declares its own as `SECRET_FORMAT` and checks each secret against
/// it in its constructor ([`Stripe::SECRET_FORMAT`](super::Stripe::SECRET_FORMAT):
/// `whsec_` and at least 32 letters or digits). A new preset does the same: declare
/// the format its provider documents, and pass its secrets through
/// [`SecretFormat::check`] (the crate's presets do so through one shared
/// constructor). The generic verifiers use [`SecretFormat::GENERIC`]: at least 16
/// bytes, unless the secret is marked with [`Secret::allow_short`].
///
/// ```
/// use webhook_guard::verify::{KeyError, Secret, SecretFormat};
///
/// const ACME: SecretFormat = SecretFormat::new("Acme").prefix("acme_wh_").min_len(32);
/// assert!(ACME.check(&Secret::from("acme_wh_0123456789abcdef0123456789abcdef")).is_ok());
/// let err = ACME.check(&Secret::from("acme_wh_0123456789abcdef0123456789abcdef\n"));
/// assert!(matches!(err, Err(KeyError::Whitespace { .. })));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretFormat {
    provider: &'static str,
    prefix: Option<&'static str>,
    min_len: usize,
    max_len: usize,
    chars: Chars,
    mistaken: &'static [(&'static str, &'static str)],
    allow_short: bool,
}

impl SecretFormat {
    /// The generic HMAC verifiers' floor: at least 16 bytes (128 bits), unless the
    /// secret is marked with [`Secret::allow_short`].
    pub const GENERIC: Self = Self::new("HMAC").min_len(16).short_allowed();

    /// A format for `provider` (named in errors): any bytes without surrounding
    /// whitespace, at least one.
    pub const fn new(provider: &'static str) -> Self {
        Self {
            provider,
            prefix: None,
            min_len: 1,
            max_len: usize::MAX,
            chars: Chars::Any,
            mistaken: &[],
            allow_short: false,
        }
    }

    /// Every secret starts with `prefix` (Stripe's `whsec_`).
    #[must_use]
    pub const fn prefix(mut self, prefix: &'static str) -> Self {
        self.prefix = Some(prefix);
        self
    }

    /// At least `bytes` bytes after the prefix.
    #[must_use]
    pub const fn min_len(mut self, bytes: usize) -> Self {
        self.min_len = bytes;
        self
    }

    /// At most `bytes` bytes after the prefix (Twitch takes 100 at most).
    #[must_use]
    pub const fn max_len(mut self, bytes: usize) -> Self {
        self.max_len = bytes;
        self
    }

    /// Exactly `bytes` bytes after the prefix (a key of fixed size, in hex).
    #[must_use]
    pub const fn exact_len(self, bytes: usize) -> Self {
        self.min_len(bytes).max_len(bytes)
    }

    /// Only ASCII letters and digits after the prefix.
    #[must_use]
    pub const fn alphanumeric(mut self) -> Self {
        self.chars = Chars::Alphanumeric;
        self
    }

    /// Only hexadecimal digits (either case) after the prefix: a key the provider
    /// shows in hex.
    #[must_use]
    pub const fn hex(mut self) -> Self {
        self.chars = Chars::Hex;
        self
    }

    /// Only visible ASCII characters (and spaces) after the prefix.
    #[must_use]
    pub const fn ascii(mut self) -> Self {
        self.chars = Chars::Ascii;
        self
    }

    /// Prefixes of the provider's other keys, each with what that key is (Stripe's
    /// `sk_live_`, "a secret API key"): named in the error when pasted instead.
    #[must_use]
    pub const fn mistaken(mut self, prefixes: &'static [(&'static str, &'static str)]) -> Self {
        self.mistaken = prefixes;
        self
    }

    /// A secret marked with [`Secret::allow_short`] may be shorter than
    /// [`SecretFormat::min_len`] (the generic verifiers, and the presets whose
    /// provider publishes no secret format, for a sender that issues short secrets).
    #[must_use]
    pub const fn short_allowed(mut self) -> Self {
        self.allow_short = true;
        self
    }

    /// The provider named in errors.
    pub const fn provider(&self) -> &'static str {
        self.provider
    }

    /// Checks `secret` against this format. The error names what is wrong and how
    /// to fix it, and never holds the secret.
    ///
    /// # Errors
    /// [`KeyError::EmptySecret`], [`KeyError::Whitespace`], [`KeyError::WrongKey`],
    /// [`KeyError::MissingPrefix`], [`KeyError::BadCharacters`],
    /// [`KeyError::TooShort`] or [`KeyError::TooLong`].
    pub fn check(&self, secret: &Secret) -> Result<(), KeyError> {
        let provider = self.provider;
        let bytes = secret.expose();
        if bytes.trim_ascii().is_empty() {
            return Err(KeyError::EmptySecret);
        }
        if bytes.trim_ascii().len() != bytes.len() {
            return Err(KeyError::Whitespace { provider });
        }
        if let Some((_, what)) =
            (self.mistaken.iter()).find(|(p, _)| bytes.starts_with(p.as_bytes()))
        {
            return Err(KeyError::WrongKey {
                provider,
                what,
                expected: self.prefix.unwrap_or(""),
            });
        }
        let rest = match self.prefix {
            Some(prefix) => bytes
                .strip_prefix(prefix.as_bytes())
                .ok_or(KeyError::MissingPrefix { provider, prefix })?,
            None => bytes,
        };
        if !rest.iter().all(|&b| self.chars.allows(b)) {
            return Err(KeyError::BadCharacters {
                provider,
                expected: self.chars.describe(),
            });
        }
        if rest.len() < self.min_len && !(self.allow_short && secret.short_ok) {
            return Err(KeyError::TooShort {
                provider,
                len: rest.len(),
                min: self.min_len,
                prefix: self.prefix.unwrap_or(""),
            });
        }
        if rest.len() > self.max_len {
            return Err(KeyError::TooLong {
                provider,
                len: rest.len(),
                max: self.max_len,
            });
        }
        Ok(())
    }
}

/// Which characters a format allows after its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chars {
    Any,
    Alphanumeric,
    Hex,
    Ascii,
}

impl Chars {
    fn allows(self, b: u8) -> bool {
        match self {
            Self::Any => true,
            Self::Alphanumeric => b.is_ascii_alphanumeric(),
            Self::Hex => b.is_ascii_hexdigit(),
            Self::Ascii => b.is_ascii_graphic() || b == b' ',
        }
    }

    /// What the error names as allowed.
    fn describe(self) -> &'static str {
        match self {
            Self::Any => "any bytes",
            Self::Alphanumeric => "letters and digits",
            Self::Hex => "hexadecimal digits",
            Self::Ascii => "visible ASCII characters",
        }
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self::new(s.as_bytes())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Self::new(s.into_bytes())
    }
}

impl From<&[u8]> for Secret {
    fn from(s: &[u8]) -> Self {
        Self::new(s)
    }
}

impl From<Vec<u8>> for Secret {
    fn from(s: Vec<u8>) -> Self {
        Self::new(s)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_key() {
        let s = Secret::from("whsec_supersecret");
        assert!(!format!("{s:?}").contains("supersecret"));
        assert!(!format!("{:?}", vec![s]).contains("supersecret"));
    }
}
