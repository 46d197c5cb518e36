//! Jamm: the signature is inside the body, over the `content` object.

use std::borrow::Cow;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::common::{self, Keys};
use super::macros;
use super::{SecretFormat, Verified, Verifier, VerifyError};
use crate::Headers;

const PREFIX: &str = "sha256=";

/// Verifies Jamm webhooks, whose signature travels in the body:
/// `{"id":"mwh-...","signature":"sha256=<hex>","event_type":...,"content":{...},"created_at":...}`.
///
/// # What is signed
///
/// HMAC-SHA256, keyed with the client secret, over the JSON text of the `content`
/// value **as it appears in the raw body, minified**: every space, tab, CR and LF
/// outside string literals is removed, nothing else is touched (no key reordering,
/// no re-escaping, no number reformatting). That equals the compact serialization
/// Jamm's SDKs compute as long as the sender wrote `content` in its own key order,
/// which it does. The JSON is never parsed into values and re-serialized.
///
/// Only `content` is authenticated: `id`, `event_type` and `created_at` are not.
/// The event id the guard deduplicates on is the unauthenticated `id`, so the guard
/// also deduplicates by the signed `content` (its
/// [`content_key`](Verifier::content_key): the SHA-256 of the minified `content`):
/// a genuine `content` replayed under another id, in a padded or rewritten
/// envelope, is a duplicate for as long as the guard's retention keeps it. A body
/// holding more than [`Jamm::MAX_ENVELOPE`] bytes around its `content` is refused.
/// Nothing signed carries a time, so there is no replay window beyond that
/// retention. With an ordering store, a rewritten `created_at` counts only up to
/// [`MAX_CLOCK_SKEW`](crate::ordering::MAX_CLOCK_SKEW) ahead of the clock; a forger
/// who replays a `content` after its retention ran out, under a new id and with a
/// rewritten `created_at`, can still make it count as the object's newest time, so
/// that Jamm's genuine events are answered stale (200, not retried) while the
/// replayed old `content` is applied. Where forged deliveries are a concern, leave the
/// ordering guard off for Jamm (no `.ordering(..)` on its guard) and order by a time
/// the handler can trust, and reconcile critical state through Jamm's API.
///
/// Jamm publishes no test vector; this preset is tested by round trips and against a
/// pretty-printed body.
///
/// - Event id: the body field `id`. Retry window: 20 attempts over about 2 days
///   (54 h 38 min at most by the published schedule: see [`Jamm::RETRY_WINDOW`]).
///
/// ```
/// use webhook_guard::verify::{Jamm, Verifier};
///
/// let jamm = Jamm::new(["jamm_client_secret_0123456789"]).unwrap();
/// let body = jamm.envelope("mwh-1", "EVENT_TYPE_CHARGE_SUCCESS", r#"{"charge":{"id":"trx-1"}}"#, "2024-01-01T00:00:00Z");
/// let verified = jamm.verify(&[("", ""); 0], body.as_bytes(), chrono::Utc::now()).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("mwh-1"));
/// ```
#[derive(Debug, Clone)]
pub struct Jamm {
    keys: Keys,
}

impl Jamm {
    /// Jamm retries up to 20 times, backing off from 1 h, doubling, capped at 3 h:
    /// 54 h of backoff plus up to 19 two-minute timeouts (54 h 38 min), rounded up.
    /// ("about 2 days" in Jamm's prose; the schedule itself is longer.)
    pub const RETRY_WINDOW: Duration = Duration::from_secs(56 * 3600);
    /// The most bytes a body may hold around its signed `content` (the unsigned
    /// `id`, `event_type`, `created_at`, the signature, whitespace): Jamm's own take
    /// a few hundred. A larger envelope is refused (`malformed_body`), so a
    /// captured `content` cannot be padded with unsigned fields up to the guard's
    /// body limit.
    pub const MAX_ENVELOPE: usize = 4096;

    /// Jamm does not publish its client secrets' format: at least 16 bytes, as the
    /// generic verifiers.
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Jamm").min_len(16);

    macros::keyed! {
        /// A verifier keyed with one or more client secrets.
        new;
    }

    /// The `signature` field value (`sha256=<hex>`) for a `content` JSON text,
    /// signed with the first secret over its minified form.
    pub fn sign(&self, content: &[u8]) -> String {
        let minified = minify(content);
        format!(
            "{PREFIX}{}",
            hex::encode(self.keys.sign_first(&[&minified]))
        )
    }

    /// A whole webhook body as Jamm would send it, with `content_json` (a JSON
    /// object's text) embedded as written and signed.
    pub fn envelope(
        &self,
        id: &str,
        event_type: &str,
        content_json: &str,
        created_at: &str,
    ) -> String {
        let s = |v: &str| serde_json::to_string(v).expect("strings serialize");
        format!(
            r#"{{"id":{},"signature":{},"event_type":{},"content":{content_json},"created_at":{}}}"#,
            s(id),
            s(&self.sign(content_json.as_bytes())),
            s(event_type),
            s(created_at),
        )
    }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    content: &'a RawValue,
    #[serde(borrow)]
    signature: Cow<'a, str>,
}

/// The raw `content` bytes and the signature text of a Jamm body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[doc(hidden)]
pub struct JammBody<'a> {
    /// The raw JSON text of `content`, exactly as in the body.
    pub content: &'a [u8],
    /// The decoded signature.
    pub tag: [u8; 32],
}

/// Finds `content` and `signature` in a Jamm body without building the JSON.
/// Duplicate keys are refused.
///
/// # Errors
/// [`VerifyError::MalformedBody`] when the body is not such an envelope;
/// [`VerifyError::NoUsableSignature`] when the signature lacks its `sha256=` prefix.
#[doc(hidden)]
pub fn parse_body(body: &[u8]) -> Result<JammBody<'_>, VerifyError> {
    let env: Envelope<'_> = serde_json::from_slice(body).map_err(|_| {
        VerifyError::MalformedBody("not a Jamm envelope with content and signature")
    })?;
    let content = env.content.get().as_bytes();
    if content.first() != Some(&b'{') {
        return Err(VerifyError::MalformedBody("content is not an object"));
    }
    let hex = env
        .signature
        .strip_prefix(PREFIX)
        .ok_or(VerifyError::NoUsableSignature)?;
    let tag = common::hex32(hex.as_bytes()).ok_or(VerifyError::MalformedBody(
        "signature is not sha256=<64 hex digits>",
    ))?;
    // `content` borrows from `body` (RawValue keeps the input's bytes).
    let start = content.as_ptr() as usize - body.as_ptr() as usize;
    Ok(JammBody {
        content: &body[start..start + content.len()],
        tag,
    })
}

/// Removes insignificant whitespace (outside string literals) from JSON text.
/// Borrows when there is none to remove.
pub(crate) fn minify(json: &[u8]) -> Cow<'_, [u8]> {
    let is_ws = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let mut in_string = false;
    let mut escaped = false;
    let mut out: Option<Vec<u8>> = None;
    for (i, &b) in json.iter().enumerate() {
        let keep = if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            true
        } else if b == b'"' {
            in_string = true;
            true
        } else {
            !is_ws(b)
        };
        match (&mut out, keep) {
            (Some(buf), true) => buf.push(b),
            (None, false) => out = Some(json[..i].to_vec()),
            _ => {}
        }
    }
    out.map_or(Cow::Borrowed(json), Cow::Owned)
}

impl Verifier for Jamm {
    macros::verifier! {
        rekeyed;
        verify |self, _headers, body, _now| {
            let parsed = parse_body(body)?;
            if body.len() - parsed.content.len() > Self::MAX_ENVELOPE {
                return Err(VerifyError::MalformedBody(
                    "more than 4 KiB of envelope around the signed content",
                ));
            }
            let content = minify(parsed.content);
            self.keys.check(&[&content], &[parsed.tag])?;
            Ok(Verified::untimed(common::body_field(body, "id")))
        }
        event_meta: crate::meta::MetaExtractor::jamm();
        event_type: jamm;
        retry_window;
        answer_timeout: 120;
        /// Jamm's 20 attempts.
        deliveries: 20;
    }

    /// Only `content` is signed: the SHA-256 of its minified text, so that the
    /// content replayed in another envelope (another `id`, padded with fields) is
    /// the same key.
    fn content_key(&self, _headers: &dyn Headers, body: &[u8]) -> Option<[u8; 32]> {
        let parsed = parse_body(body).ok()?;
        Some(common::sha256(&minify(parsed.content)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;

    // No public Jamm test vector exists: round trips, plus one value computed
    // independently with `openssl dgst -sha256 -hmac jamm_client_secret_0123456789` over the compact
    // content `{"charge":{"id":"trx-1","amount":100,"memo":"a b"}}`.
    const CONTENT: &str = r#"{"charge":{"id":"trx-1","amount":100,"memo":"a b"}}"#;
    const NO_HEADERS: &[(&str, &str); 0] = &[];
    const SECRET: &str = "jamm_client_secret_0123456789";
    const NEW: &str = "jamm_client_secret_new_000000";

    fn now() -> DateTime<Utc> {
        Utc::now()
    }

    #[test]
    fn round_trip_and_independent_value() {
        let j = Jamm::new([SECRET]).unwrap();
        assert_eq!(j.sign(CONTENT.as_bytes()), format!("sha256={}", EXPECTED));
        let body = j.envelope("mwh-1", "charge.succeeded", CONTENT, "2024-01-01T00:00:00Z");
        let v = j.verify(NO_HEADERS, body.as_bytes(), now()).unwrap();
        assert_eq!(v.event_id.as_deref(), Some("mwh-1"));
        assert_eq!(v.signed_at, None);
        let tampered = body.replace("100", "101");
        assert_eq!(
            j.verify(NO_HEADERS, tampered.as_bytes(), now()),
            Err(VerifyError::NoMatch)
        );
        // The id is not authenticated: changing it does not break the signature.
        let other_id = body.replace("mwh-1", "mwh-2");
        assert!(j.verify(NO_HEADERS, other_id.as_bytes(), now()).is_ok());
    }

    const EXPECTED: &str = "77d8238c9d69066a6e31ee551f4276414b9327044caab8c5913118c92b419610";

    #[test]
    fn pretty_printed_body_verifies_and_strings_keep_their_spaces() {
        let j = Jamm::new([SECRET]).unwrap();
        let sig = j.sign(CONTENT.as_bytes());
        let pretty = format!(
            "{{\n  \"id\": \"mwh-9\",\n  \"signature\": \"{sig}\",\n  \"event_type\": \"charge.succeeded\",\n  \"content\": {{\n    \"charge\": {{\n      \"id\" : \"trx-1\",\r\n\t\"amount\": 100,\n      \"memo\": \"a b\"\n    }}\n  }},\n  \"created_at\": \"2024-01-01T00:00:00Z\"\n}}\n"
        );
        let v = j.verify(NO_HEADERS, pretty.as_bytes(), now()).unwrap();
        assert_eq!(v.event_id.as_deref(), Some("mwh-9"));
        // Whitespace inside a string is significant.
        let inside = pretty.replace("\"a b\"", "\"a  b\"");
        assert_eq!(
            j.verify(NO_HEADERS, inside.as_bytes(), now()),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn minify_respects_strings_and_escapes() {
        assert_eq!(
            &*minify(br#"{ "a" : "x \" y" , "b":[1, 2] }"#),
            br#"{"a":"x \" y","b":[1,2]}"#
        );
        assert!(matches!(minify(br#"{"a":1}"#), Cow::Borrowed(_)));
        assert_eq!(&*minify(br#"{"a":"\\" , "b" : 1}"#), br#"{"a":"\\","b":1}"#);
    }

    #[test]
    fn malformed_envelopes_and_rotation() {
        let j = Jamm::new([NEW, SECRET]).unwrap();
        let sig = Jamm::new([SECRET]).unwrap().sign(CONTENT.as_bytes());
        let ok = format!(r#"{{"id":"mwh-1","signature":"{sig}","content":{CONTENT}}}"#);
        assert!(j.verify(NO_HEADERS, ok.as_bytes(), now()).is_ok());
        let dup = format!(r#"{{"signature":"{sig}","content":{CONTENT},"content":{{}}}}"#);
        let no_prefix = format!(r#"{{"signature":"{}","content":{CONTENT}}}"#, &sig[7..]);
        for (body, want) in [
            (dup.as_str(), "malformed_body"),
            (r#"{"content":{}}"#, "malformed_body"),
            (
                r#"{"signature":"sha256=00","content":{}}"#,
                "malformed_body",
            ),
            (r#"{"signature":"x","content":[1]}"#, "malformed_body"),
            (no_prefix.as_str(), "no_usable_signature"),
            ("\u{0}\u{ff}", "malformed_body"),
        ] {
            assert_eq!(
                j.verify(NO_HEADERS, body.as_bytes(), now())
                    .unwrap_err()
                    .code(),
                want,
                "{body}"
            );
        }
    }
}
