//! Mailgun: HMAC-SHA256 of `timestamp` + `token`, both in the body's `signature`.

use std::borrow::Cow;
use std::time::Duration;

use chrono::DateTime;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::common::{self, Keys};
use super::macros;
use super::{parse_unix_seconds, Verifier, VerifyError};

/// Longest token accepted (Mailgun's are 50 characters).
const MAX_TOKEN: usize = 256;

/// Verifies Mailgun webhooks (the JSON `{"signature":{…},"event-data":{…}}` bodies).
///
/// # What is signed — and what is not
///
/// HMAC-SHA256, keyed with the HTTP webhook signing key, over `timestamp` followed
/// by `token` (no separator), lowercase hex in `signature.signature` (or, for a
/// subaccount's event, `signature.parent-signature` under the primary account's
/// key). **The event data is not signed**: whoever captures one delivery holds a
/// valid `(timestamp, token, signature)` and can attach any `event-data` to it.
/// What stops that is Mailgun's advice, enforced here through the store:
///
/// - **the token is the event id**, so a token is used once: the first delivery
///   carrying it claims it, and any later one (a replay, with any body) is a
///   duplicate or a conflict, never run again. An id made of an unsigned field
///   (`event-data.id`) would let a replay through under a new id;
/// - the timestamp must be within the tolerance (default 300 s) of `now`, both
///   ways, and the guard keeps ids at least twice that long, so a token is
///   remembered for as long as its signature verifies.
///
/// The cost: Mailgun signs each attempt afresh, so its retries of one event come
/// with new tokens and are **not** deduplicated: a handler that must not apply one
/// event twice keys its own writes on `event-data.id`.
///
/// Form-encoded bodies (legacy webhooks, routes) are not read: use the JSON
/// webhooks.
///
/// - Retry window: Mailgun's "Automatic Retries" page: it retries during 8 hours
///   (5, 10, 15 minutes, 1, 2 and 4 hours; an older schedule adds up to 8 h 5 min):
///   9 hours here, with margin.
///
/// ```
/// use webhook_guard::verify::{Mailgun, Verifier};
///
/// let mailgun = Mailgun::new(["key-mailgun-signing"]).unwrap();
/// let body = mailgun.envelope(1_700_000_000, "a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0",
///     r#"{"event":"delivered","id":"CPgfbmQMTCKtHW6uIWtuVe"}"#);
/// let now = chrono::DateTime::from_timestamp(1_700_000_030, 0).unwrap();
/// let verified = mailgun.verify(&[("", ""); 0], body.as_bytes(), now).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0"));
/// ```
#[derive(Debug, Clone)]
pub struct Mailgun {
    keys: Keys,
    tolerance: Duration,
}

impl Mailgun {
    macros::unpublished_format!("Mailgun", "the HTTP webhook signing key");

    /// Mailgun documents no tolerance; 300 s, as most schemes.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
    /// Mailgun retries for about 8 hours; 9 here.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(9 * 3600);

    macros::keyed! {
        /// A verifier keyed with one or more HTTP webhook signing keys (several for
        /// rotation, or a subaccount's key beside the primary account's).
        new;
        /// How far the signed timestamp may be from `now`, either way (default 300 s).
        tolerance;
    }

    /// The `signature` field's hex value for `timestamp` and `token`, under the
    /// first key.
    pub fn sign(&self, timestamp: i64, token: &str) -> String {
        let t = timestamp.to_string();
        hex::encode(self.keys.sign_first(&[t.as_bytes(), token.as_bytes()]))
    }

    /// A whole webhook body as Mailgun sends it, with `event_data` (a JSON object's
    /// text) embedded as written.
    pub fn envelope(&self, timestamp: i64, token: &str, event_data: &str) -> String {
        let signature = serde_json::json!({
            "timestamp": timestamp.to_string(),
            "token": token,
            "signature": self.sign(timestamp, token),
        });
        format!(r#"{{"signature":{signature},"event-data":{event_data}}}"#)
    }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    signature: Signature<'a>,
}

#[derive(Deserialize)]
struct Signature<'a> {
    #[serde(borrow)]
    timestamp: &'a RawValue,
    #[serde(borrow)]
    token: Cow<'a, str>,
    #[serde(borrow)]
    signature: Cow<'a, str>,
    #[serde(rename = "parent-signature", borrow, default)]
    parent: Option<Cow<'a, str>>,
}

fn bad(reason: &'static str) -> VerifyError {
    VerifyError::MalformedBody(reason)
}

impl Verifier for Mailgun {
    macros::verifier! {
        /// The event type is the body's `event-data.event`.
        event_type: json ["event-data", "event"];
        rekeyed;
        verify |self, _headers, body, now| {
            let envelope: Envelope<'_> = serde_json::from_slice(body)
                .map_err(|_| bad("not a Mailgun webhook body with a signature object"))?;
            let sig = envelope.signature;
            // The timestamp is signed as written: a JSON string of digits, or a number.
            let raw = sig.timestamp.get();
            let timestamp = raw
                .strip_prefix('"')
                .and_then(|t| t.strip_suffix('"'))
                .unwrap_or(raw);
            let signed_at = parse_unix_seconds(timestamp.as_bytes(), "signature.timestamp")
                .map_err(|_| bad("signature.timestamp is not Unix seconds"))?;
            let token = sig.token.as_ref();
            if token.is_empty()
                || token.len() > MAX_TOKEN
                || !token.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err(bad(
                    "signature.token is not 1 to 256 printable ASCII characters",
                ));
            }
            let tags: Vec<[u8; 32]> = std::iter::once(&sig.signature)
                .chain(sig.parent.as_ref())
                .filter_map(|s| common::hex32(s.as_bytes()))
                .collect();
            if tags.is_empty() {
                return Err(VerifyError::NoUsableSignature);
            }
            self.keys
                .check(&[timestamp.as_bytes(), token.as_bytes()], &tags)?;
            common::timed(signed_at, now, self.tolerance, || Some(token.to_owned()))
        }
        event_meta: crate::meta::MetaExtractor::custom(meta);
        tolerance;
        retry_window;
        /// The older schedule: the first attempt and 7 retries.
        deliveries: 8;
    }
}

/// `event-data.event`, `event-data.timestamp` (seconds with a fraction) and the
/// message's `Message-Id`.
fn meta(body: &[u8]) -> crate::meta::EventMeta {
    let data = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("event-data").cloned());
    let data = data.as_ref();
    let event = data
        .and_then(|d| d.get("event")?.as_str())
        .map(str::to_owned);
    let created = data
        .and_then(|d| d.get("timestamp")?.as_f64())
        .filter(|t| t.is_finite() && *t >= 0.0 && *t < 253_402_300_800.0)
        .and_then(|t| {
            #[allow(clippy::cast_possible_truncation)]
            DateTime::from_timestamp_millis((t * 1000.0) as i64)
        });
    let message = data
        .and_then(|d| d.pointer("/message/headers/message-id")?.as_str())
        .map(str::to_owned);
    crate::meta::EventMeta::new(event, created, message)
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;
    use crate::verify::testing::*;

    const TOKEN: &str = "a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0";
    // Computed independently with Python's hmac (sha256, hex) over
    // "1529006854" + TOKEN, key "key-mailgun-signing".
    const SIG: &str = "382f1362077a4f904d689d6f83b12f7f8a7b2a03aaca4053eadd3f6568f950ab";
    const T: i64 = 1_529_006_854;

    fn body(timestamp: &str, signature: &str) -> String {
        format!(
            r#"{{"signature":{{"timestamp":{timestamp},"token":"{TOKEN}","signature":"{signature}"}},"event-data":{{"event":"delivered","timestamp":1529006854.329574,"id":"DACSsAdVSeGpLid7TN03WA","message":{{"headers":{{"message-id":"20130503182626.18666.16540@example.com"}}}}}}}}"#
        )
    }

    fn verify(body: &str, now: i64) -> Result<Verified, VerifyError> {
        Mailgun::new(["key-mailgun-signing"]).unwrap().verify(
            &[("", ""); 0],
            body.as_bytes(),
            at(now),
        )
    }

    #[test]
    fn independent_vector_token_id_and_window() {
        let b = body("\"1529006854\"", SIG);
        let v = verify(&b, T).unwrap();
        assert_eq!(v.event_id.as_deref(), Some(TOKEN));
        assert_eq!(v.signed_at, Some(at(T)));
        assert_eq!(
            Mailgun::new(["key-mailgun-signing"])
                .unwrap()
                .sign(T, TOKEN),
            SIG
        );
        // A number timestamp signs the same digits.
        assert!(verify(&body("1529006854", SIG), T).is_ok());
        window(T, 300, |now| verify(&b, now));
        assert_eq!(
            verify(&body("\"1529006855\"", SIG), T),
            Err(VerifyError::NoMatch)
        );
        let meta = Mailgun::new(["key-mailgun-signing"])
            .unwrap()
            .event_meta()
            .unwrap()
            .extract(b.as_bytes());
        assert_eq!(meta.event_type.as_deref(), Some("delivered"));
        assert_eq!(
            meta.created_at.unwrap().timestamp_millis(),
            1_529_006_854_329
        );
        assert_eq!(
            meta.object.as_deref(),
            Some("20130503182626.18666.16540@example.com")
        );
    }

    /// The event data is not signed: a replayed signature verifies with any data.
    /// Only the token as id (one use, through the store) stops the replay.
    #[test]
    fn the_event_data_is_not_signed_so_the_id_is_the_token() {
        let forged = body("\"1529006854\"", SIG).replace("delivered", "unsubscribed");
        assert_eq!(verify(&forged, T).unwrap().event_id.as_deref(), Some(TOKEN));
    }

    #[test]
    fn parent_signature_rotation_and_bad_bodies() {
        let parent = Mailgun::new(["primary-signing-key"])
            .unwrap()
            .sign(T, TOKEN);
        let sub = body("\"1529006854\"", &"0".repeat(64)).replacen(
            "\"signature\":\"0",
            &format!("\"parent-signature\":\"{parent}\",\"signature\":\"0"),
            1,
        );
        let both = Mailgun::new(["subaccount-signing-key", "primary-signing-key"]).unwrap();
        assert!(both.verify(&[("", ""); 0], sub.as_bytes(), at(T)).is_ok());
        assert_eq!(verify(&sub, T), Err(VerifyError::NoMatch));
        for bad in [
            "{}".to_owned(),
            body("\"-1\"", SIG),
            body("\"15290068541529006854\"", SIG),
            body("\"1529006854\"", SIG).replace(TOKEN, "has space"),
            body("\"1529006854\"", SIG).replace(TOKEN, ""),
            body("\"1529006854\"", SIG).replacen("\"token\"", "\"token\":\"x\",\"token\"", 1),
        ] {
            assert!(
                matches!(verify(&bad, T), Err(VerifyError::MalformedBody(_))),
                "{bad}"
            );
        }
        assert_eq!(
            verify(&body("\"1529006854\"", "zz"), T),
            Err(VerifyError::NoUsableSignature)
        );
    }
}
