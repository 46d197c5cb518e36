use std::fmt;

/// Secret key material. Its `Debug` output never shows the key, and it has no
/// `PartialEq`: an `==` on key bytes would take time that tells how many leading
/// bytes matched.
#[derive(Clone)]
pub struct Secret(Box<[u8]>);

impl Secret {
    /// Wraps raw key bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into().into_boxed_slice())
    }

    /// The key bytes.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Whether the key is empty (an empty key is refused by every verifier).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
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
