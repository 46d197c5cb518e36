//! Dropbox: `X-Dropbox-Signature: <hex>` over the raw body.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::common::{self, Keys};
use super::SecretFormat;
use super::{Encoding, Verified, Verifier, VerifyError};
use crate::Headers;

const HEADER: &str = "X-Dropbox-Signature";

/// Verifies Dropbox webhook notifications.
///
/// - Signed bytes: the raw body, HMAC-SHA256 keyed with the app secret, lowercase
///   hex in `X-Dropbox-Signature`.
/// - No timestamp is signed: no replay window.
/// - Event id: **none exists.** A Dropbox notification only says "these accounts
///   changed" (`{"list_folder":{"accounts":[..]},"delta":{"users":[..]}}`); the same
///   body arrives again for every later change of the same accounts. Deduplicating
///   on the body would drop those later notifications, so this preset gives each
///   delivery an id of its own, `dropbox-{unix ms}-{first 16 hex digits of the
///   MAC}`: every verified delivery runs the handler, which reads the changes with
///   `files/list_folder/continue` from its stored cursor (idempotent by design,
///   so a replayed or retried notification costs one extra poll, nothing more).
/// - Retry window: Dropbox retries a failed notification with exponential backoff
///   over about ten minutes (15 minutes here), and waits 10 s for an answer.
/// - Handshake: Dropbox first sends `GET ?challenge=…`, to be echoed back as
///   `text/plain` with `X-Content-Type-Options: nosniff`. The guard does not answer
///   it: route the `GET` to your own handler.
///
/// ```
/// use webhook_guard::verify::{Dropbox, Verifier};
///
/// let dropbox = Dropbox::new(["app_secret"]).unwrap();
/// let body = br#"{"list_folder":{"accounts":["dbid:AAH4f99T0taONIb"]}}"#;
/// let sig = dropbox.sign(body);
/// let now = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
/// let verified = dropbox.verify(&[("X-Dropbox-Signature", sig.as_str())], body, now).unwrap();
/// assert!(verified.event_id.unwrap().starts_with("dropbox-1700000000000-"));
/// ```
#[derive(Debug, Clone)]
pub struct Dropbox {
    keys: Keys,
}

impl Dropbox {
    /// What the constructor accepts as a secret: its app secret (15 letters and digits as Dropbox issues them today; not enforced); any bytes
    /// without surrounding whitespace (a trailing newline from an environment
    /// variable is refused).
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Dropbox");

    /// Dropbox retries over about ten minutes; rounded up to 15.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(15 * 60);

    common::keyed! {
        /// A verifier keyed with one or more app secrets.
        new;
    }

    /// The `X-Dropbox-Signature` value for `body`, signed with the first secret.
    pub fn sign(&self, body: &[u8]) -> String {
        hex::encode(self.keys.sign_first(&[body]))
    }
}

impl Verifier for Dropbox {
    common::rekeyed!();

    fn verify(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Verified, VerifyError> {
        let value = common::bounded_header(headers, HEADER)?;
        let tag = common::single_tag(value, b"", Encoding::Hex, &HEADER.into())?;
        self.keys.check(&[body], &[tag])?;
        Ok(Verified {
            handshake: None,
            event_id: Some(format!(
                "dropbox-{}-{}",
                now.timestamp_millis(),
                hex::encode(&tag[..8])
            )),
            signed_at: None,
        })
    }

    common::limits! {
        retry_window;
        answer_timeout: 10;
    }
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;

    const BODY: &[u8] = br#"{"list_folder": {"accounts": ["dbid:AAH4f99T0taONIb-OurWxbNQ6ywGRopQngc", "dbid:AAD2Bj5UuOJsRjHv6-xTNlk3nEs2zrDnjJA"]}, "delta": {"users": [12345, 67890]}}"#;
    // Computed independently with Python's hmac (sha256, hex) over BODY.
    const SIG: &str = "88678f95d2c2c38721e6d21b8d79e2592fe836b444bb57dc7ea3259d685980a4";

    #[test]
    fn independent_vector_and_a_fresh_id_per_delivery() {
        let d = Dropbox::new(["dbx_app_secret"]).unwrap();
        assert_eq!(d.sign(BODY), SIG);
        let first = d.verify(&[(HEADER, SIG)], BODY, at(1_700_000_000)).unwrap();
        let later = d.verify(&[(HEADER, SIG)], BODY, at(1_700_000_060)).unwrap();
        assert_eq!(
            first.event_id.as_deref(),
            Some("dropbox-1700000000000-88678f95d2c2c387")
        );
        assert_ne!(first.event_id, later.event_id);
        let upper = SIG.to_uppercase();
        assert!(d.verify(&[(HEADER, upper.as_str())], BODY, at(1)).is_ok());
        assert_eq!(
            d.verify(&[(HEADER, SIG)], b"{}", at(1)),
            Err(VerifyError::NoMatch)
        );
        let rotated = Dropbox::new(["new", "dbx_app_secret"]).unwrap();
        assert!(rotated.verify(&[(HEADER, SIG)], BODY, at(1)).is_ok());
    }
}
