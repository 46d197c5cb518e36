//! Dropbox: `X-Dropbox-Signature: <hex>` over the raw body, and the verification
//! request sent as a `GET`.

use std::time::Duration;

use super::common::{self, Keys};
use super::handshake;
use super::macros;
use super::request::query;
use super::SecretFormat;
use super::{Encoding, Verified, Verifier, VerifyError};
use crate::Headers;

const HEADER: &str = "X-Dropbox-Signature";
const SIGNATURE: common::SignatureHeader = common::SignatureHeader::new(HEADER, "", Encoding::Hex);

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
/// - Retry window: Dropbox's webhook reference says a notification answered
///   other than 200, or not in time, is retried with exponential backoff "over the
///   course of about ten minutes" (15 minutes here, with margin); its webhook
///   documentation gives 10 s to answer.
/// - Handshake: when the webhook URI is entered in the App Console, Dropbox sends
///   a verification request, a `GET` with the query parameter `challenge`, and
///   enables the URI once the answer's body is that challenge. It is unsigned;
///   the guard answers it itself: 200, the challenge as `text/plain; charset=utf-8`
///   with `X-Content-Type-Options: nosniff` (as Dropbox asks, against reflected
///   XSS; every integration sends `nosniff` on every answer). The handler does not
///   run and nothing is stored. A challenge is echoed only when it is a plain
///   token (1 to 1024 visible ASCII characters, no quotes, `<`, `>`, `&` or `\`);
///   any other, and a `GET` without one, is refused (`malformed_query`, 401). The
///   guard learns the method and query from the integrations (see
///   [request context](super#request-context)).
///
/// ```
/// use webhook_guard::verify::{Dropbox, Verifier};
///
/// let dropbox = Dropbox::new(["dbx-app-secret1"]).unwrap();
/// let body = br#"{"list_folder":{"accounts":["dbid:AAH4f99T0taONIb"]}}"#;
/// let sig = dropbox.sign(body);
/// let now = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
/// let verified = dropbox.verify(&[("X-Dropbox-Signature", sig.as_str())], body, now).unwrap();
/// assert!(verified.event_id.unwrap().starts_with("dropbox-1700000000000-"));
///
/// // The verification request, answered with its challenge.
/// use webhook_guard::RequestHead;
/// let no_headers: [(&str, &str); 0] = [];
/// let check = RequestHead::new(&no_headers[..], "GET", "/dropbox?challenge=abc123");
/// assert_eq!(dropbox.verify(&check, b"", now).unwrap().handshake.unwrap().body, "abc123");
/// ```
#[derive(Debug, Clone)]
pub struct Dropbox {
    keys: Keys,
}

impl Dropbox {
    /// What the constructor accepts as a secret: the app secret, which Dropbox
    /// issues as 15 characters: at least 15 bytes and no surrounding whitespace (a
    /// trailing newline from an environment variable is refused); its characters are
    /// not checked.
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Dropbox").min_len(15);

    /// Dropbox retries over about ten minutes; rounded up to 15.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(15 * 60);

    macros::keyed! {
        /// A verifier keyed with one or more app secrets.
        new;
    }

    /// The `X-Dropbox-Signature` value for `body`, signed with the first secret.
    pub fn sign(&self, body: &[u8]) -> String {
        SIGNATURE.sign(&self.keys, &[body])
    }

    /// The answer to the verification request: its challenge, when it is a plain
    /// token.
    fn verification(headers: &dyn Headers) -> Result<Verified, VerifyError> {
        let query = query(headers)?.ok_or(VerifyError::MalformedQuery(
            "a GET without the challenge parameter",
        ))?;
        handshake::echo_query_param(
            query.as_bytes(),
            "challenge",
            "dropbox_verification",
            ("challenge is missing", "challenge is not a plain token"),
        )
    }
}

impl Verifier for Dropbox {
    macros::verifier! {
        rekeyed;
        verify |self, headers, body, now| {
            if headers.method() == Some("GET") {
                return Self::verification(headers);
            }
            let tag = SIGNATURE.tag(headers)?;
            self.keys.check(&[body], &[tag])?;
            let id = format!(
                "dropbox-{}-{}",
                now.timestamp_millis(),
                hex::encode(&tag[..8])
            );
            Ok(Verified::with_event_id(id))
        }
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
    const SIG: &str = "3957c8bf7c28b50b5f55fd670ed4b89e33a2c27ae2896aae573927b878e2ab1f";

    #[test]
    fn independent_vector_and_a_fresh_id_per_delivery() {
        let d = Dropbox::new(["dbx_app_secret1"]).unwrap();
        assert_eq!(d.sign(BODY), SIG);
        let first = d.verify(&[(HEADER, SIG)], BODY, at(1_700_000_000)).unwrap();
        let later = d.verify(&[(HEADER, SIG)], BODY, at(1_700_000_060)).unwrap();
        assert_eq!(
            first.event_id.as_deref(),
            Some("dropbox-1700000000000-3957c8bf7c28b50b")
        );
        assert_ne!(first.event_id, later.event_id);
        let upper = SIG.to_uppercase();
        assert!(d.verify(&[(HEADER, upper.as_str())], BODY, at(1)).is_ok());
        assert_eq!(
            d.verify(&[(HEADER, SIG)], b"{}", at(1)),
            Err(VerifyError::NoMatch)
        );
        let rotated = Dropbox::new(["new_app_secret1", "dbx_app_secret1"]).unwrap();
        assert!(rotated.verify(&[(HEADER, SIG)], BODY, at(1)).is_ok());
    }

    #[test]
    fn the_verification_request_echoes_a_plain_challenge_only() {
        use crate::RequestHead;
        const NONE: [(&str, &str); 0] = [];
        let d = Dropbox::new(["dbx_app_secret1"]).unwrap();
        let get = |target| d.verify(&RequestHead::new(&NONE[..], "GET", target), b"", at(1));
        let ok = get("/w?challenge=abc123").unwrap();
        let hs = ok.handshake.unwrap();
        assert_eq!(
            (hs.name, hs.body.as_str(), hs.content_type),
            (
                "dropbox_verification",
                "abc123",
                "text/plain; charset=utf-8"
            )
        );
        assert_eq!(ok.event_id, None);
        let long = format!(
            "/w?challenge={}",
            "a".repeat(handshake::MAX_CHALLENGE_LEN + 1)
        );
        for target in [
            "/w",
            "/w?other=1",
            "/w?challenge=",
            "/w?challenge=%3Cscript%3Ealert(1)%3C%2Fscript%3E",
            "/w?challenge=a%22b",
            "/w?challenge=a+b",
            long.as_str(),
        ] {
            assert!(
                matches!(get(target), Err(VerifyError::MalformedQuery(_))),
                "{target}"
            );
        }
        // A POST carrying a challenge is verified as a notification.
        let head = RequestHead::new(&NONE[..], "POST", "/w?challenge=abc123");
        assert_eq!(
            d.verify(&head, BODY, at(1)),
            Err(VerifyError::MissingHeader(HEADER.into()))
        );
    }
}
