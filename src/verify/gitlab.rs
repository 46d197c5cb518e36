//! GitLab: the shared secret token in `X-Gitlab-Token`.

use std::fmt;
use std::time::Duration;

use hmac::Mac;

use super::common::{self, HmacSha256};
use super::macros;
use super::{KeyError, Secret, SecretFormat, Verified, Verifier, VerifyError};

const HEADER: &str = "X-Gitlab-Token";
const ID_HEADERS: [&str; 2] = ["Idempotency-Key", "X-Gitlab-Event-UUID"];

/// The key under which tokens are compared (by their MACs, so that the comparison
/// takes the same time whatever the token's length or common prefix). Not secret.
const COMPARE_KEY: &[u8] = b"webhook-guard gitlab token comparison";

/// Verifies GitLab webhooks, which carry a **secret token**, not a signature.
///
/// - `X-Gitlab-Token` must equal one of the configured tokens. The comparison is
///   constant-time (both sides are reduced to an HMAC-SHA256 under a fixed key and
///   compared with `verify_slice`), so its time tells neither the length nor a
///   matching prefix.
/// - Nothing is signed: the token authenticates the sender but protects neither the
///   body nor the id, and anyone who sees one request (a proxy, a log) can send any
///   body. Deliver over TLS only, keep the token out of logs, and treat the id as
///   unauthenticated (see "Known limits" in `SECURITY.md`).
/// - Event id: the `Idempotency-Key` header (GitLab 17.4 and later: the same on
///   every retry of one event), else `X-Gitlab-Event-UUID` (older versions).
///   Retry window: 48 hours, a conservative choice: GitLab does not retry on a
///   schedule; failed requests can be re-sent by hand from the hook's recent
///   events, kept 2 days. GitLab.com waits 10 s for an answer.
///
/// ```
/// use webhook_guard::verify::{GitLab, Verifier};
///
/// let gitlab = GitLab::new(["glpat-not-this; the hook's secret token"]).unwrap();
/// let headers = [
///     ("X-Gitlab-Token", "glpat-not-this; the hook's secret token"),
///     ("X-Gitlab-Event-UUID", "1a9c2a07-5d88-4a5e-9d15-8f3c8bbfc8f4"),
/// ];
/// let verified = gitlab.verify(&headers, b"{}", chrono::Utc::now()).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("1a9c2a07-5d88-4a5e-9d15-8f3c8bbfc8f4"));
/// ```
#[derive(Clone)]
pub struct GitLab {
    tokens: Vec<[u8; 32]>,
}

impl fmt::Debug for GitLab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GitLab {{ tokens: <{} token(s), redacted> }}",
            self.tokens.len()
        )
    }
}

fn digest(token: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(COMPARE_KEY).expect("HMAC takes keys of any length");
    mac.update(token);
    mac
}

impl GitLab {
    /// What the constructor accepts as a secret: the hook's secret token, which
    /// you chose (GitLab publishes no format or minimum): at least 16 bytes (the
    /// crate's floor for a chosen secret), without surrounding whitespace (a
    /// trailing newline from an environment variable is refused).
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("GitLab").min_len(16);

    /// Redeliveries by hand are possible for 2 days.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(48 * 3600);

    /// A verifier accepting one or more secret tokens.
    ///
    /// # Errors
    /// [`KeyError::EmptySecret`] if no token is given or one is empty; the other
    /// [`KeyError`]s of [`Self::SECRET_FORMAT`] (surrounding whitespace, fewer
    /// than 16 bytes).
    pub fn new<S: Into<Secret>>(tokens: impl IntoIterator<Item = S>) -> Result<Self, KeyError> {
        let tokens = tokens
            .into_iter()
            .map(|s| {
                let s: Secret = s.into();
                Self::SECRET_FORMAT.check(&s)?;
                Ok(digest(s.expose()).finalize().into_bytes().into())
            })
            .collect::<Result<Vec<_>, _>>()?;
        if tokens.is_empty() {
            return Err(KeyError::EmptySecret);
        }
        Ok(Self { tokens })
    }
}

impl Verifier for GitLab {
    macros::verifier! {
        /// The event type is the body's `object_kind`.
        event_type: json ["object_kind"];
        rekeyed(by new);
        verify |self, headers, _body, _now| {
            let token = common::bounded_header(headers, HEADER)?;
            let mac = digest(token);
            if !self
                .tokens
                .iter()
                .any(|known| mac.clone().verify_slice(known).is_ok())
            {
                return Err(VerifyError::NoMatch);
            }
            Ok(Verified::untimed(common::id_header(headers, &ID_HEADERS)))
        }
        event_meta: json ["object_kind"], [], ["object_attributes", "id"];
        retry_window;
        answer_timeout: 10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;

    #[test]
    fn tokens_match_exactly_and_ids_prefer_the_idempotency_key() {
        let g = GitLab::new(["old-secret-token", "new-secret-token"]).unwrap();
        let now = Utc::now();
        for token in ["old-secret-token", "new-secret-token"] {
            assert!(g.verify(&[(HEADER, token)], b"", now).is_ok());
        }
        for bad in [
            "new-secret-toke",
            "NEW-SECRET-TOKEN",
            "",
            "new-secret-tokenx",
            "new-secret-token\0",
        ] {
            assert_eq!(
                g.verify(&[(HEADER, bad)], b"", now),
                Err(VerifyError::NoMatch),
                "{bad:?}"
            );
        }
        assert_eq!(
            g.verify(&[("X-Gitlab-Event-UUID", "u")], b"", now),
            Err(VerifyError::MissingHeader(HEADER.into()))
        );
        let both = [
            (HEADER, "new-secret-token"),
            ("X-Gitlab-Event-UUID", "uuid-1"),
            ("Idempotency-Key", "idem-1"),
        ];
        let v = g.verify(&both, b"", now).unwrap();
        assert_eq!(v.event_id.as_deref(), Some("idem-1"));
        let v = g.verify(&both[..2].to_vec(), b"", now).unwrap();
        assert_eq!(v.event_id.as_deref(), Some("uuid-1"));
        assert!(!format!("{g:?}").contains("token\""));
        assert!(!format!("{g:?}").contains("old-secret-token"));
        assert_eq!(GitLab::new([""]).unwrap_err(), KeyError::EmptySecret);
    }
}
