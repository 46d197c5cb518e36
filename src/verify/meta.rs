//! Meta (WhatsApp, Instagram, Messenger and other Graph API webhooks):
//! `X-Hub-Signature-256: sha256=<hex>` over the raw body, and the subscription
//! check sent as a `GET`.

use std::time::Duration;

use super::common::{self, Keys};
use super::handshake;
use super::macros;
use super::request::{constant_time_eq, digest_id, param, query};
use super::{Encoding, Secret, Verified, Verifier, VerifyError};
use crate::Headers;

const HEADER: &str = "X-Hub-Signature-256";
const SIGNATURE: common::SignatureHeader =
    common::SignatureHeader::new(HEADER, "sha256=", Encoding::Hex);

/// Verifies Meta webhooks: WhatsApp Business Platform, Instagram, Messenger and the
/// other Graph API objects.
///
/// - Signed bytes: the raw body, HMAC-SHA256 with the app secret, `sha256=` +
///   lowercase hex in `X-Hub-Signature-256`. The legacy SHA-1 `X-Hub-Signature` is
///   never used. No timestamp is signed, so there is no replay window.
/// - Event id: Meta's deliveries carry no delivery id (and batch several changes
///   in one body), so the id is the SHA-256 of the signed body (`sha256:<hex>`):
///   the same delivery sent again is a duplicate. A retry that batches changes
///   differently is not; deduplicate on the payload's own ids (a WhatsApp message's
///   `wamid`, a Messenger `mid`) in the handler as well.
/// - Retry window: 7 days, a conservative choice: the Meta documentation consulted
///   gives no retry window for the Graph API webhooks (the WhatsApp Business
///   Platform is commonly described as retrying for up to 7 days).
/// - Handshake: when the endpoint is set up, Meta sends a `GET` with the query
///   parameters `hub.mode=subscribe`, `hub.verify_token` and `hub.challenge`. With a
///   [verify token](Meta::verify_token) configured, the guard compares it in
///   constant time and answers 200 with the challenge as `text/plain`; the handler
///   does not run and nothing is stored. A wrong token is refused
///   (`signature_mismatch`, 401), and so is every `GET` without a verify token
///   configured. The guard learns the method and query from the integrations (see
///   [request context](super#request-context)).
///
/// ```
/// use webhook_guard::verify::{Meta, Verifier};
/// use webhook_guard::RequestHead;
///
/// let meta = Meta::new(["meta-app-secret-0123"]).unwrap().verify_token("my-verify-token");
/// let no_headers: [(&str, &str); 0] = [];
/// let check = RequestHead::new(
///     &no_headers[..],
///     "GET",
///     "/meta?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=my-verify-token",
/// );
/// let verified = meta.verify(&check, b"", chrono::Utc::now()).unwrap();
/// assert_eq!(verified.handshake.unwrap().body, "1158201444");
///
/// let body = br#"{"object":"whatsapp_business_account","entry":[]}"#;
/// let headers = [("X-Hub-Signature-256", meta.sign(body))];
/// assert!(meta.verify(&headers, body, chrono::Utc::now()).unwrap().event_id.is_some());
/// ```
#[derive(Clone)]
pub struct Meta {
    keys: Keys,
    verify_token: Option<Secret>,
}

impl std::fmt::Debug for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meta")
            .field("keys", &self.keys)
            .field("verify_token", &self.verify_token.is_some())
            .finish()
    }
}

impl Meta {
    macros::unpublished_format!("Meta", "the app secret");

    /// 7 days, a conservative choice (see the type's documentation).
    pub const RETRY_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

    /// A verifier keyed with one or more app secrets.
    ///
    /// # Errors
    /// [`KeyError::EmptySecret`](super::KeyError::EmptySecret) if no secret is given
    /// or one is empty.
    pub fn new<S: Into<Secret>>(
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Self, super::KeyError> {
        Ok(Self {
            keys: Keys::checked(secrets, &Self::SECRET_FORMAT)?,
            verify_token: None,
        })
    }

    /// The verify token entered with the callback URL in the App Dashboard: the
    /// subscription check (`GET ...?hub.mode=subscribe`) is answered only when its
    /// `hub.verify_token` equals it.
    #[must_use]
    pub fn verify_token(mut self, token: impl Into<Secret>) -> Self {
        let token = token.into();
        self.verify_token = (!token.is_empty()).then_some(token);
        self
    }

    /// The `X-Hub-Signature-256` value Meta would send for `body`, signed with the
    /// first app secret.
    pub fn sign(&self, body: &[u8]) -> String {
        SIGNATURE.sign(&self.keys, &[body])
    }

    /// The answer to the subscription check: its challenge, once the verify token
    /// matched.
    fn subscription_check(&self, headers: &dyn Headers) -> Result<Verified, VerifyError> {
        let query = query(headers)?.ok_or(VerifyError::MalformedQuery(
            "a GET without the hub.mode, hub.verify_token and hub.challenge parameters",
        ))?;
        let q = query.as_bytes();
        if param(q, "hub.mode").as_deref() != Some("subscribe") {
            return Err(VerifyError::MalformedQuery("hub.mode is not subscribe"));
        }
        let expected = self.verify_token.as_ref().ok_or(VerifyError::NoMatch)?;
        let given = param(q, "hub.verify_token")
            .ok_or(VerifyError::MalformedQuery("hub.verify_token is missing"))?;
        if !constant_time_eq(given.as_bytes(), expected.expose()) {
            return Err(VerifyError::NoMatch);
        }
        handshake::echo_query_param(
            q,
            "hub.challenge",
            "meta_subscription_check",
            (
                "hub.challenge is missing",
                "hub.challenge is not a plain token",
            ),
        )
    }
}

impl Verifier for Meta {
    macros::verifier! {
        /// The event type is the body's `object` (`whatsapp_business_account`, `page`,
        /// `instagram`).
        event_type: json ["object"];
        rekeyed;
        verify |self, headers, body, _now| {
            if headers.method() == Some("GET") {
                return self.subscription_check(headers);
            }
            SIGNATURE.check(&self.keys, headers, &[body])?;
            Ok(Verified::with_event_id(digest_id(body)))
        }
        retry_window;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;
    use crate::RequestHead;

    const NONE: [(&str, &str); 0] = [];

    fn get(target: &str) -> RequestHead<'_, [(&'static str, &'static str)]> {
        RequestHead::new(&NONE[..], "GET", target)
    }

    #[test]
    fn the_subscription_check_wants_the_verify_token() {
        let meta = Meta::new(["meta-app-secret-0123"])
            .unwrap()
            .verify_token("tok en");
        let now = Utc::now();
        let ok = meta
            .verify(
                &get("/w?hub.mode=subscribe&hub.verify_token=tok+en&hub.challenge=42"),
                b"",
                now,
            )
            .unwrap();
        let hs = ok.handshake.unwrap();
        assert_eq!(
            (hs.body.as_str(), hs.content_type),
            ("42", "text/plain; charset=utf-8")
        );
        assert_eq!(ok.event_id, None);
        for (target, want) in [
            (
                "/w?hub.mode=subscribe&hub.verify_token=tok%20em&hub.challenge=42",
                "signature_mismatch",
            ),
            ("/w?hub.mode=subscribe&hub.challenge=42", "malformed_query"),
            (
                "/w?hub.mode=unsubscribe&hub.verify_token=tok+en&hub.challenge=42",
                "malformed_query",
            ),
            (
                "/w?hub.mode=subscribe&hub.verify_token=tok+en",
                "malformed_query",
            ),
            (
                "/w?hub.mode=subscribe&hub.verify_token=tok+en&hub.challenge=%3Cb%3E",
                "malformed_query",
            ),
            ("/w", "malformed_query"),
        ] {
            assert_eq!(
                meta.verify(&get(target), b"", now).unwrap_err().code(),
                want,
                "{target}"
            );
        }
        let unset = Meta::new(["meta-app-secret-0123"])
            .unwrap()
            .verify_token("");
        let target = "/w?hub.mode=subscribe&hub.verify_token=&hub.challenge=42";
        assert_eq!(
            unset.verify(&get(target), b"", now),
            Err(VerifyError::NoMatch)
        );
        assert!(!format!("{meta:?}").contains("tok en"));
    }

    #[test]
    fn posts_are_signed_over_the_body() {
        let meta = Meta::new(["new-meta-app-secret", "old-meta-app-secret"]).unwrap();
        let old = Meta::new(["old-meta-app-secret"]).unwrap();
        let body = br#"{"object":"page","entry":[{"id":"1","time":1}]}"#;
        let sig = old.sign(body);
        let delivery = Signed {
            headers: &[(HEADER, sig.as_str())],
            signature: HEADER,
            body,
            tampered: b"{}",
        };
        delivery.check(&old, &meta, Utc::now(), Some(&digest_id(body)));
        let headers = [(HEADER, sig)];
        let sha1 = [("X-Hub-Signature", "sha1=00")];
        assert_eq!(
            meta.verify(&sha1, body, Utc::now()),
            Err(VerifyError::MissingHeader(HEADER.into()))
        );
        // A POST carrying a subscription check's query is verified as a delivery.
        let head = RequestHead::new(
            &headers[..],
            "POST",
            "/w?hub.mode=subscribe&hub.challenge=1",
        );
        assert_eq!(
            meta.verify(&head, body, Utc::now()).unwrap().handshake,
            None
        );
    }
}
