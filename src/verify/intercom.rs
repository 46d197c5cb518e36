//! Intercom: `X-Hub-Signature: sha1=<hex>` (HMAC-SHA1) over the raw body.

use std::time::Duration;

use hmac::Mac;

use super::common::{self, Sha1Keys};
use super::macros;
use super::{Verified, Verifier, VerifyError};

const HEADER: &str = "X-Hub-Signature";
const PREFIX: &[u8] = b"sha1=";

/// Verifies Intercom webhook notifications.
///
/// - Signed bytes: the raw body, **HMAC-SHA1** keyed with the app's client secret,
///   `sha1=` + lowercase hex in `X-Hub-Signature`. SHA-1 is what Intercom signs
///   with; as an HMAC it is not open to the collision attacks on bare SHA-1.
/// - No timestamp is signed: no replay window; deduplication on the signed `id`
///   stops a replay of a captured notification.
/// - Event id: the body's `id` (`notif_…`). Retry window: 24 hours, a
///   conservative choice: Intercom's "Webhook Notifications" page publishes no
///   retry schedule (it pauses a topic for 15 minutes after 1000 consecutive
///   errors, and suspends a private app's subscription after seven days of
///   errors). It expects an answer within 5 s.
///
/// ```
/// use webhook_guard::verify::{Intercom, Verifier};
///
/// let intercom = Intercom::new(["intercom_client_secret"]).unwrap();
/// let body = br#"{"type":"notification_event","id":"notif_1","topic":"ping"}"#;
/// let sig = intercom.sign(body);
/// let verified = intercom
///     .verify(&[("X-Hub-Signature", sig.as_str())], body, chrono::Utc::now())
///     .unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("notif_1"));
/// ```
#[derive(Debug, Clone)]
pub struct Intercom {
    keys: Sha1Keys,
}

impl Intercom {
    /// Kept for 24 hours (see the type's documentation).
    pub const RETRY_WINDOW: Duration = Duration::from_secs(24 * 3600);

    macros::unpublished_format!("Intercom", "the app's client secret");

    macros::keyed! {
        /// A verifier keyed with one or more client secrets.
        new;
    }

    /// The `X-Hub-Signature` value for `body`, signed with the first secret.
    pub fn sign(&self, body: &[u8]) -> String {
        let tag = self.keys.first_fed(|mac| mac.update(body));
        format!("sha1={}", hex::encode(tag))
    }
}

impl Verifier for Intercom {
    macros::verifier! {
        /// The event type is the body's `topic`.
        event_type: json ["topic"];
        rekeyed;
        verify |self, headers, body, _now| {
            let value = common::bounded_header(headers, HEADER)?;
            let encoded = value
                .strip_prefix(PREFIX)
                .ok_or(VerifyError::NoUsableSignature)?;
            let mut tag = [0u8; 20];
            hex::decode_to_slice(encoded, &mut tag)
                .map_err(|_| common::malformed(HEADER, "not 40 hex digits"))?;
            if !self.keys.any_fed(|mac| mac.update(body), &tag) {
                return Err(VerifyError::NoMatch);
            }
            Ok(Verified::untimed(common::body_field(body, "id")))
        }
        event_meta: json ["topic"], ["created_at"], ["data", "item", "id"];
        retry_window;
        answer_timeout: 5;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;
    use crate::verify::KeyError;

    const BODY: &[u8] = br#"{"type":"notification_event","app_id":"a86dr8yl","data":{"type":"notification_event_data","item":{"type":"ping","message":"something something interzen"}},"links":{},"id":"notif_f22b5c40-5d7b-11e8-b9f1-d5b0e6d7e0f1","topic":"ping","delivery_status":null,"delivery_attempts":1,"delivered_at":0,"first_sent_at":1527145561,"created_at":1527145561,"self":null}"#;
    // Computed independently with Python's hmac (sha1, hex) over BODY.
    const SIG: &str = "sha1=1825c80f10eb1e76f0fb31f53585f9cfec060a23";

    #[test]
    fn independent_vector_prefix_and_rotation() {
        let i = Intercom::new(["ic_client_secret"]).unwrap();
        assert_eq!(i.sign(BODY), SIG);
        let both = Intercom::new(["new_ic_client_secret", "ic_client_secret"]).unwrap();
        let delivery = Signed {
            headers: &[(HEADER, SIG)],
            signature: HEADER,
            body: BODY,
            tampered: b"{}",
        };
        let id = "notif_f22b5c40-5d7b-11e8-b9f1-d5b0e6d7e0f1";
        delivery.check(&i, &both, Utc::now(), Some(id));
        assert_eq!(
            i.verify(&[(HEADER, &SIG[5..])], BODY, Utc::now()),
            Err(VerifyError::NoUsableSignature)
        );
        assert_eq!(
            i.verify(&[(HEADER, "sha1=00")], BODY, Utc::now()),
            Err(common::malformed(HEADER, "not 40 hex digits"))
        );
        assert!(!format!("{both:?}").contains("ic_client_secret"));
        assert_eq!(Intercom::new([""]).unwrap_err(), KeyError::EmptySecret);
        let meta = i.event_meta().unwrap().extract(BODY);
        assert_eq!(meta.event_type.as_deref(), Some("ping"));
        assert_eq!(meta.created_at.unwrap().timestamp(), 1_527_145_561);
    }
}
