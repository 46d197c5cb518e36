//! Twilio: `X-Twilio-Signature`, HMAC-SHA1 (base64) over the public URL (with the
//! request's query) and the sorted form parameters, or the URL with a
//! `bodySHA256` query parameter for a JSON body.

use std::time::Duration;

use hmac::Mac;
use sha2::{Digest as _, Sha256};

use super::common::{self, HmacSha1, Sha1Keys};
use super::macros;
use super::request::{param, query, PublicUrl};
use super::{Verified, Verifier, VerifyError};

const SIGNATURE: &str = "X-Twilio-Signature";
const SETTINGS: &str = "X-Twilio-Webhooks-Signature-Settings";
const IDEMPOTENCY: &str = "I-Twilio-Idempotency-Token";

/// Most form parameters read from one body.
const MAX_PARAMS: usize = 1024;

/// Verifies Twilio webhooks (Messaging, Voice, status callbacks) signed with the
/// account's Auth Token.
///
/// - Signed bytes: the URL Twilio called — the **public URL** it is configured
///   with, given here (a proxy in front of the server may rewrite what the server
///   sees), followed by the request's query as received — then, for a form body
///   (`application/x-www-form-urlencoded`), every parameter's name and value
///   (decoded), sorted by name, concatenated without separators. For a JSON body,
///   Twilio puts the body's SHA-256 (hex) in the query as `bodySHA256` and signs the
///   URL alone: the body must hash to it. HMAC-SHA1 with the Auth Token, base64, in
///   `X-Twilio-Signature`. As Twilio's SDKs do, the URL is tried with the scheme's
///   default port left out and written out.
/// - The query comes from the request target the integrations pass (see
///   [request context](super#request-context)); without one, the URL is the
///   configured one alone, which verifies the usual form `POST` to a URL without
///   query.
/// - Requests signed under a Webhooks Rule's shared key
///   (`X-Twilio-Webhooks-Signature-Settings`) are refused: this preset checks the
///   Auth Token's HMAC-SHA1 only.
/// - No timestamp is signed: no replay window. Event id: the
///   `I-Twilio-Idempotency-Token` header, which Twilio keeps across the retries of
///   one request; it is not signed, so deduplication stops a request resent under
///   the same token, not a captured request resent under a new one.
/// - Retry window and timeout: Twilio's error 11205 page: it tries for 10 seconds
///   to connect (two 5-second attempts) and waits 15 seconds in all for the
///   answer, so a request is not resent after 15 seconds by default (the
///   connection overrides `rt`, `tt`, `rc` change that). Rotation: give the primary and the
///   secondary Auth Token while promoting.
///
/// ```
/// use webhook_guard::verify::{Twilio, Verifier};
/// use webhook_guard::RequestHead;
///
/// let twilio = Twilio::new("https://example.com/sms", ["your-twilio-auth-token"]).unwrap();
/// let body = b"Body=Hello&From=%2B14158675310&To=%2B15017122661";
/// let signature = twilio.sign("https://example.com/sms", body);
/// let headers = [
///     ("X-Twilio-Signature", signature.as_str()),
///     ("I-Twilio-Idempotency-Token", "0f2c6e9a-...-1"),
/// ];
/// let request = RequestHead::new(&headers[..], "POST", "/internal/sms");
/// let verified = twilio.verify(&request, body, chrono::Utc::now()).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("0f2c6e9a-...-1"));
/// ```
#[derive(Clone)]
pub struct Twilio {
    url: PublicUrl,
    keys: Sha1Keys,
}

impl std::fmt::Debug for Twilio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Twilio")
            .field("url", &self.url.as_str())
            .field("keys", &self.keys)
            .finish()
    }
}

impl Twilio {
    macros::unpublished_format!("Twilio", "the account's Auth Token");

    /// Twilio retries once, within its 15-second total timeout.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(15);

    macros::keyed! {
        /// A verifier for requests Twilio sends to `url` (the public URL configured
        /// in Twilio, without query or fragment), keyed with one or more Auth Tokens.
        new(url);
    }

    /// The `X-Twilio-Signature` for a request to `url` (the full URL Twilio calls,
    /// query included) with the form body `body` (empty for none), under the first
    /// Auth Token: for tests and the `send` simulator.
    pub fn sign(&self, url: &str, body: &[u8]) -> String {
        let params = sorted_params(body).unwrap_or_default();
        common::base64_encode(&self.keys.first_fed(|mac| feed(mac, url, &params)))
    }

    /// The `bodySHA256` query value Twilio adds to the URL for a JSON `body`.
    pub fn body_sha256(body: &[u8]) -> String {
        hex::encode(Sha256::digest(body))
    }
}

/// Puts in `mac` what Twilio signs: `url`, then each parameter's name and value.
fn feed(mac: &mut HmacSha1, url: &str, params: &[(String, String)]) {
    mac.update(url.as_bytes());
    for (name, value) in params {
        mac.update(name.as_bytes());
        mac.update(value.as_bytes());
    }
}

/// The form parameters of `body`, sorted by name then value, repeated pairs once
/// (as Twilio's SDKs concatenate them).
fn sorted_params(body: &[u8]) -> Result<Vec<(String, String)>, VerifyError> {
    let mut params = Vec::new();
    for (name, value) in form_urlencoded::parse(body) {
        if params.len() == MAX_PARAMS {
            return Err(VerifyError::MalformedBody("too many form parameters"));
        }
        params.push((name.into_owned(), value.into_owned()));
    }
    params.sort_unstable();
    params.dedup();
    Ok(params)
}

impl Verifier for Twilio {
    macros::verifier! {
        rekeyed;
        verify |self, headers, body, _now| {
            if headers.get_bytes(SETTINGS).is_some() {
                return Err(common::malformed(
                    SETTINGS,
                    "Webhooks Rules' shared-key signatures are not checked by this preset",
                ));
            }
            let value = common::bounded_header(headers, SIGNATURE)?;
            let tag: [u8; 20] = Some(value)
                .filter(|v| v.len() == 28)
                .and_then(|v| {
                    base64::Engine::decode(&base64::engine::general_purpose::STANDARD, v).ok()
                })
                .and_then(|bytes| bytes.try_into().ok())
                .ok_or_else(|| common::malformed(SIGNATURE, "not base64 of 20 bytes"))?;
            let query = query(headers)?;
            let body_hash = query.and_then(|q| param(q.as_bytes(), "bodySHA256"));
            let params = match &body_hash {
                Some(want) => {
                    let got = Self::body_sha256(body);
                    if !super::request::constant_time_eq(
                        got.as_bytes(),
                        want.to_ascii_lowercase().as_bytes(),
                    ) {
                        return Err(VerifyError::NoMatch);
                    }
                    Vec::new()
                }
                None if headers.method() == Some("GET") => Vec::new(),
                None => sorted_params(body)?,
            };
            let matched = (self.url.forms(query))
                .any(|url| self.keys.any_fed(|mac| feed(mac, &url, &params), &tag));
            if !matched {
                return Err(VerifyError::NoMatch);
            }
            Ok(Verified::untimed(common::id_header(
                headers,
                &[IDEMPOTENCY],
            )))
        }
        retry_window;
        answer_timeout: 15;
        /// Twilio's first attempt and its one retry.
        deliveries: 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;
    use crate::RequestHead;

    // Twilio's own vectors (twilio-python's request validator tests): Auth Token
    // 12345, this URL and these parameters; the same URL with the default port
    // written out; a JSON body under `bodySHA256`; a repeated parameter.
    const URL: &str = "https://mycompany.com/myapp.php?foo=1&bar=2";
    const PARAMS: &[u8] = b"CallSid=CA1234567890ABCDE&Digits=1234&From=%2B14158675309&To=%2B18005551212&Caller=%2B14158675309";
    const SIG: &str = "RSOYDt4T1cUTdK1PDd93/VVr8B8=";
    const SIG_443: &str = "kvajT1Ptam85bY51eRf/AJRuM3w=";
    const JSON: &[u8] = br#"{"property": "value", "boolean": true}"#;
    const JSON_HASH: &str = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
    const JSON_SIG: &str = "a9nBmqA0ju/hNViExpshrM61xv4=";

    fn head<'a>(
        headers: &'a [(&'a str, &'a str)],
        method: &'a str,
        target: &'a str,
    ) -> RequestHead<'a, [(&'a str, &'a str)]> {
        RequestHead::new(headers, method, target)
    }

    #[test]
    fn twilios_vectors_verify() {
        let twilio = Twilio::new(
            "https://mycompany.com/myapp.php",
            [Secret::new("12345").allow_short()],
        )
        .unwrap();
        assert_eq!(twilio.sign(URL, PARAMS), SIG);
        let ported = Twilio::new(
            "https://mycompany.com:443/myapp.php",
            [Secret::new("12345").allow_short()],
        )
        .unwrap();
        assert_eq!(
            ported.sign("https://mycompany.com:443/myapp.php?foo=1&bar=2", PARAMS),
            SIG_443
        );
        let repeated = b"Sid=CA123&SidAccount=AC123&Digits=5678&Digits=1234";
        assert_eq!(twilio.sign(URL, repeated), "IK+Dwps556ElfBT0I3Rgjkr1wJU=");
        assert_eq!(Twilio::body_sha256(JSON), JSON_HASH);
        let now = Utc::now();
        for sig in [SIG, SIG_443] {
            let h = [(SIGNATURE, sig), (IDEMPOTENCY, "tok-1")];
            let v = twilio
                .verify(&head(&h, "POST", "/x/myapp.php?foo=1&bar=2"), PARAMS, now)
                .unwrap();
            assert_eq!(v.event_id.as_deref(), Some("tok-1"));
            assert!(ported
                .verify(&head(&h, "POST", "/myapp.php?foo=1&bar=2"), PARAMS, now)
                .is_ok());
        }
        let h = [(SIGNATURE, SIG)];
        // The parameters in another order are the same request.
        let shuffled = b"To=%2B18005551212&Digits=1234&CallSid=CA1234567890ABCDE&From=%2B14158675309&Caller=%2B14158675309";
        assert!(twilio
            .verify(&head(&h, "POST", "/myapp.php?foo=1&bar=2"), shuffled, now)
            .is_ok());
        // Another query or another digit: refused; no target: the URL lacks its query.
        for (target, body) in [
            ("/myapp.php?foo=1&bar=3", PARAMS),
            ("/myapp.php?foo=1&bar=2", &PARAMS[..PARAMS.len() - 1]),
        ] {
            assert_eq!(
                twilio.verify(&head(&h, "POST", target), body, now),
                Err(VerifyError::NoMatch)
            );
        }
        assert_eq!(twilio.verify(&h, PARAMS, now), Err(VerifyError::NoMatch));
        let h = [(SIGNATURE, JSON_SIG)];
        let target = format!("/myapp.php?foo=1&bar=2&bodySHA256={JSON_HASH}");
        assert!(twilio.verify(&head(&h, "POST", &target), JSON, now).is_ok());
        assert_eq!(
            twilio.verify(
                &head(&h, "POST", &target),
                br#"{"property": "value", "boolean": false}"#,
                now
            ),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn json_bodies_are_bound_by_their_hash() {
        let twilio = Twilio::new("https://example.com/hook", ["twilio-auth-token"]).unwrap();
        let body = br#"{"MessageSid":"SM1","Body":"h\u00e9llo"}"#;
        let target = format!("/hook?bodySHA256={}", Twilio::body_sha256(body));
        let sig = twilio.sign(&format!("https://example.com{target}"), b"");
        let h = [(SIGNATURE, sig.as_str())];
        assert!(twilio
            .verify(&head(&h, "POST", &target), body, Utc::now())
            .is_ok());
        let tampered = br#"{"MessageSid":"SM2","Body":"h\u00e9llo"}"#;
        assert_eq!(
            twilio.verify(&head(&h, "POST", &target), tampered, Utc::now()),
            Err(VerifyError::NoMatch)
        );
        let get_target = "/hook?From=%2B1&Body=hi";
        let sig = twilio.sign(&format!("https://example.com{get_target}"), b"");
        let h = [(SIGNATURE, sig.as_str())];
        assert!(twilio
            .verify(&head(&h, "GET", get_target), b"", Utc::now())
            .is_ok());
    }

    #[test]
    fn bad_headers_urls_and_keys_are_refused() {
        let twilio = Twilio::new("https://example.com/hook", ["twilio-auth-token"]).unwrap();
        let now = Utc::now();
        assert_eq!(
            twilio.verify(&[("X-Other", "x")], b"", now),
            Err(VerifyError::MissingHeader(SIGNATURE.into()))
        );
        assert_eq!(
            twilio
                .verify(&[(SIGNATURE, "abc")], b"", now)
                .unwrap_err()
                .code(),
            "malformed_header"
        );
        let rule = [(SIGNATURE, SIG), (SETTINGS, "key=k,algorithm=HMAC_SHA256")];
        assert_eq!(
            twilio.verify(&rule, b"", now).unwrap_err().code(),
            "malformed_header"
        );
        assert_eq!(
            Twilio::new("example.com", ["t"]).unwrap_err(),
            KeyError::BadUrl("give the full URL, with http:// or https://")
        );
        assert_eq!(
            Twilio::new("https://e.com/", [""]).unwrap_err(),
            KeyError::EmptySecret
        );
        assert!(!format!("{twilio:?}").contains("token"));
    }
}
