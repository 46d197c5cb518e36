//! HubSpot, signature v3: `X-HubSpot-Signature-v3`, HMAC-SHA256 (base64) over
//! method + URI + raw body + `X-HubSpot-Request-Timestamp`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::DateTime;
use sha2::{Digest as _, Sha256};

use super::common::{self, Keys};
use super::macros;
use super::request::{query, PublicUrl};
use super::{Verifier, VerifyError};

const SIGNATURE: &str = "X-HubSpot-Signature-v3";
const TIMESTAMP: &str = "X-HubSpot-Request-Timestamp";

/// Verifies HubSpot requests (Webhooks API deliveries, and the other requests
/// HubSpot signs for an app) by their v3 signature.
///
/// - Signed bytes: the method, the URI HubSpot called, the raw body and the
///   `X-HubSpot-Request-Timestamp` value (milliseconds), concatenated; HMAC-SHA256
///   with the app's client secret, base64, in `X-HubSpot-Signature-v3`. The URI is
///   the **public URL** given here (a proxy may rewrite what the server sees)
///   followed by the request's query, with the characters HubSpot's guide lists
///   (`%3A`, `%2F`, `%3F`, `%40`, `%21`, `%24`, `%27`, `%28`, `%29`, `%2A`, `%2C`,
///   `%3B`) decoded. The method and query come from the request context the
///   integrations pass (see [request context](super#request-context)); without
///   one, the method is taken to be `POST` (webhooks are) and the URI is the
///   public URL alone.
/// - Replay window: HubSpot says to refuse a timestamp older than 5 minutes; the
///   tolerance (default 5 minutes) applies both ways.
/// - Event id: a delivery is a JSON array of events, each with an `eventId` that
///   HubSpot does not guarantee unique, and an `attemptNumber` that grows with each
///   retry (so the body changes between retries). The id is `hubspot:` and the
///   SHA-256 of the events as sent with their `attemptNumber` left out (each
///   event's fields sorted, the events sorted): a retry of the same batch is a
///   duplicate, a different batch is not. A body that is not such an array (a CRM
///   card's or a workflow's request) has no id here: configure an
///   [`EventId`](crate::EventId).
/// - Retry window: HubSpot's webhooks documentation ("Retries") re-sends a failed
///   notification up to 10 times with exponential backoff, the first retry after
///   2 minutes, then 4, 8, ... minutes: the tenth comes 2046 minutes (34 h 6 min)
///   after the first attempt, so the window is 35 hours.
///
/// ```
/// use webhook_guard::verify::{HubSpot, Verifier};
/// use webhook_guard::RequestHead;
///
/// let hubspot = HubSpot::new("https://example.com/hubspot", ["hubspot-client-secret"]).unwrap();
/// let body = br#"[{"eventId":1,"subscriptionId":2,"portalId":3,"occurredAt":1700000000000,"subscriptionType":"contact.creation","attemptNumber":0,"objectId":4}]"#;
/// let headers = hubspot.sign_headers("POST", "https://example.com/hubspot", body, 1700000000000);
/// let request = RequestHead::new(&headers[..], "POST", "/hubspot");
/// let now = chrono::DateTime::from_timestamp(1700000000, 0).unwrap();
/// let verified = hubspot.verify(&request, body, now).unwrap();
/// assert!(verified.event_id.unwrap().starts_with("hubspot:"));
/// ```
#[derive(Debug, Clone)]
pub struct HubSpot {
    url: PublicUrl,
    keys: Keys,
    tolerance: Duration,
}

impl HubSpot {
    macros::unpublished_format!("HubSpot", "the app's client secret");

    /// Refuse requests older than 5 minutes, as HubSpot's guide says.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);
    /// Up to 10 retries, 2 minutes apart and doubling: 34 h 6 min, so 35 hours.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(35 * 3600);

    macros::keyed! {
        /// A verifier for requests HubSpot sends to `url` (the public URL configured
        /// in the app, without query or fragment), keyed with one or more client
        /// secrets.
        new(url);
        /// How far the signed timestamp may be from `now`, either way (default 5
        /// minutes).
        tolerance;
    }

    /// The headers HubSpot sends with a `method` request to `uri` (the full URL,
    /// query included) carrying `body` at `timestamp_ms`, signed with the first
    /// client secret: for tests and the `send` simulator.
    pub fn sign_headers(
        &self,
        method: &str,
        uri: &str,
        body: &[u8],
        timestamp_ms: i64,
    ) -> Vec<(&'static str, String)> {
        let t = timestamp_ms.to_string();
        let uri = decode_listed(uri);
        let tag = self
            .keys
            .sign_first(&[method.as_bytes(), uri.as_bytes(), body, t.as_bytes()]);
        vec![(SIGNATURE, common::base64_encode(&tag)), (TIMESTAMP, t)]
    }
}

/// `uri` with the escapes HubSpot's guide lists decoded (and no other).
fn decode_listed(uri: &str) -> String {
    const LISTED: [(&str, char); 12] = [
        ("3A", ':'),
        ("2F", '/'),
        ("3F", '?'),
        ("40", '@'),
        ("21", '!'),
        ("24", '$'),
        ("27", '\''),
        ("28", '('),
        ("29", ')'),
        ("2A", '*'),
        ("2C", ','),
        ("3B", ';'),
    ];
    let mut out = String::with_capacity(uri.len());
    let mut rest = uri;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3);
        let decoded = code.and_then(|code| {
            LISTED
                .iter()
                .find(|(hex, _)| hex.eq_ignore_ascii_case(code))
                .map(|&(_, c)| c)
        });
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[at + 3..];
            }
            None => {
                out.push('%');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The id of a Webhooks API delivery: see [`HubSpot`].
fn batch_id(body: &[u8]) -> Option<String> {
    let events: Vec<BTreeMap<String, serde_json::Value>> = serde_json::from_slice(body).ok()?;
    if events.is_empty() {
        return None;
    }
    let mut lines: Vec<String> = events
        .into_iter()
        .map(|mut event| {
            event.remove("attemptNumber");
            serde_json::to_string(&event).expect("JSON values serialize")
        })
        .collect();
    lines.sort_unstable();
    let mut hash = Sha256::new();
    for line in &lines {
        hash.update(line.as_bytes());
        hash.update(b"\n");
    }
    Some(format!("hubspot:{}", hex::encode(hash.finalize())))
}

impl Verifier for HubSpot {
    macros::verifier! {
        rekeyed;
        verify |self, headers, body, now| {
            let value = common::bounded_header(headers, SIGNATURE)?;
            let ts = common::bounded_header(headers, TIMESTAMP)?;
            let tag = common::base64_32(value)
                .ok_or_else(|| common::malformed(SIGNATURE, "not base64 of 32 bytes"))?;
            let millis = Some(ts)
                .filter(|t| !t.is_empty() && t.len() <= 15 && t.iter().all(u8::is_ascii_digit))
                .and_then(|t| std::str::from_utf8(t).ok()?.parse::<i64>().ok())
                .and_then(DateTime::from_timestamp_millis)
                .ok_or_else(|| common::malformed(TIMESTAMP, "not a number of milliseconds"))?;
            let method = headers.method().unwrap_or("POST");
            let query = query(headers)?;
            let matched = self.url.forms(query).any(|uri| {
                let uri = decode_listed(&uri);
                self.keys
                    .any_match(&[method.as_bytes(), uri.as_bytes(), body, ts], &[tag])
            });
            if !matched {
                return Err(VerifyError::NoMatch);
            }
            common::timed(millis, now, self.tolerance, || batch_id(body))
        }
        body_changes_on_retry;
        tolerance;
        retry_window;
        answer_timeout: 5;
        /// HubSpot's first attempt and its up to 10 retries.
        deliveries: 11;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;
    use crate::RequestHead;

    const BODY: &[u8] = br#"[{"objectId":1246965,"propertyName":"lifecyclestage","propertyValue":"subscriber","changeSource":"ACADEMY","eventId":3816279340,"subscriptionId":25,"portalId":33,"appId":1160452,"occurredAt":1462216307945,"subscriptionType":"contact.propertyChange","attemptNumber":0}]"#;

    fn at_ms(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).unwrap()
    }

    #[test]
    fn signs_method_uri_body_and_timestamp() {
        let hs = HubSpot::new(
            "https://example.com/webhooks",
            ["old-hubspot-secret", "hubspot-client-secret"],
        )
        .unwrap();
        let signer =
            HubSpot::new("https://example.com/webhooks", ["hubspot-client-secret"]).unwrap();
        let uri = "https://example.com/webhooks?portal=33&x=a%3Ab";
        let h = signer.sign_headers("POST", uri, BODY, 1_462_216_308_000);
        let head = |method, target| RequestHead::new(&h[..], method, target);
        let now = at_ms(1_462_216_308_000);
        let v = hs
            .verify(&head("POST", "/in/webhooks?portal=33&x=a%3Ab"), BODY, now)
            .unwrap();
        assert_eq!(v.event_id, batch_id(BODY));
        assert_eq!(v.signed_at, Some(now));
        // `%3A` is decoded before signing: a sender writing `:` signs the same URI.
        assert!(hs
            .verify(&head("POST", "/webhooks?portal=33&x=a:b"), BODY, now)
            .is_ok());
        for (method, target) in [
            ("PUT", "/webhooks?portal=33&x=a%3Ab"),
            ("POST", "/webhooks?portal=34&x=a%3Ab"),
            ("POST", "/webhooks"),
        ] {
            assert_eq!(
                hs.verify(&head(method, target), BODY, now),
                Err(VerifyError::NoMatch),
                "{method} {target}"
            );
        }
        assert!(matches!(
            hs.verify(
                &head("POST", "/w?portal=33&x=a%3Ab"),
                BODY,
                at_ms(1_462_216_308_000 + 300_001)
            ),
            Err(VerifyError::TimestampTooOld { .. })
        ));
        // Without a request context: POST to the public URL.
        let bare = signer.sign_headers(
            "POST",
            "https://example.com/webhooks",
            BODY,
            1_462_216_308_000,
        );
        assert!(hs.verify(&bare, BODY, now).is_ok());
        let mut bad = bare.clone();
        bad[1].1 = "1.5".into();
        assert_eq!(
            hs.verify(&bad, BODY, now).unwrap_err().code(),
            "malformed_header"
        );
    }

    #[test]
    fn the_timestamp_holds_five_minutes_either_way() {
        let hs = HubSpot::new("https://example.com/webhooks", ["hubspot-client-secret"]).unwrap();
        let t = 1_462_216_308;
        let h = hs.sign_headers("POST", "https://example.com/webhooks", BODY, t * 1000);
        window(t, 300, |now| hs.verify(&h, BODY, at_ms(now * 1000)));
    }

    #[test]
    fn a_retry_keeps_its_id_and_other_batches_differ() {
        let retry =
            String::from_utf8_lossy(BODY).replace("\"attemptNumber\":0", "\"attemptNumber\":3");
        assert_eq!(batch_id(BODY), batch_id(retry.as_bytes()));
        let other = String::from_utf8_lossy(BODY).replace("3816279340", "3816279341");
        assert_ne!(batch_id(BODY), batch_id(other.as_bytes()));
        assert_eq!(batch_id(b"{}"), None);
        assert_eq!(batch_id(b"[]"), None);
        assert_eq!(decode_listed("/a%3a%2F%20%zz%"), "/a:/%20%zz%");
    }
}
