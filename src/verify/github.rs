//! GitHub: `X-Hub-Signature-256: sha256=<hex>` over the raw body.

use std::time::Duration;

use super::common::{self, Keys};
use super::macros;
use super::{Encoding, SecretFormat, Verified, Verifier};

const HEADER: &str = "X-Hub-Signature-256";
const SIGNATURE: common::SignatureHeader =
    common::SignatureHeader::new(HEADER, "sha256=", Encoding::Hex);
const DELIVERY: &str = "X-GitHub-Delivery";

/// Verifies GitHub webhooks.
///
/// - Signed bytes: the raw body, HMAC-SHA256, `sha256=` + lowercase hex in
///   `X-Hub-Signature-256`. The legacy SHA-1 `X-Hub-Signature` header is never
///   used: a delivery carrying only that one is refused as missing
///   `X-Hub-Signature-256`.
/// - No timestamp is signed, so there is no replay window, and the delivery id is
///   not signed either: the guard also deduplicates by the signed body (its
///   [`content_key`](Verifier::content_key), see
///   [`WebhookGuardBuilder::content_keys`](crate::WebhookGuardBuilder::content_keys)),
///   so a captured body resent under a new `X-GitHub-Delivery` is a duplicate, kept
///   for the retention (`SECURITY.md`, replayed delivery).
/// - Event id: the `X-GitHub-Delivery` header. Retry window: GitHub does not retry
///   automatically, but deliveries of the past 3 days can be redelivered with the
///   same delivery id, so 3 days.
///
/// ```
/// use webhook_guard::verify::{GitHub, Verifier};
///
/// let github = GitHub::new(["It's a Secret to Everybody"]).unwrap();
/// let headers = [
///     ("X-Hub-Signature-256", "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"),
///     ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
/// ];
/// let verified = github.verify(&headers, b"Hello, World!", chrono::Utc::now()).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("72d3162e-cc78-11e3-81ab-4c9367dc0958"));
/// ```
#[derive(Debug, Clone)]
pub struct GitHub {
    keys: Keys,
}

impl GitHub {
    /// Redeliveries are possible for 3 days.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(72 * 3600);

    /// GitHub signs with the secret you choose for the webhook: at least 16 bytes,
    /// as the generic verifiers (GitHub asks for a random string of high entropy).
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("GitHub").min_len(16);

    macros::keyed! {
        /// A verifier keyed with one or more webhook secrets.
        new;
    }

    /// The `X-Hub-Signature-256` value GitHub would send for `body`, signed with the
    /// first secret.
    pub fn sign(&self, body: &[u8]) -> String {
        SIGNATURE.sign(&self.keys, &[body])
    }
}

impl Verifier for GitHub {
    macros::verifier! {
        rekeyed;
        verify |self, headers, body, _now| {
            SIGNATURE.check(&self.keys, headers, &[body])?;
            Ok(Verified::untimed(common::id_header(headers, &[DELIVERY])))
        }
        /// The delivery id (`X-GitHub-Delivery`) is not signed: the SHA-256 of the signed body.
        content_key: sha256;
        event_type: github;
        retry_window;
        answer_timeout: 10;
        /// GitHub delivers an event once (no automatic retry).
        deliveries: 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;

    // Published vector: GitHub docs, "Validating webhook deliveries".
    const SECRET: &str = "It's a Secret to Everybody";
    const SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    #[test]
    fn published_vector_passes_and_rotates() {
        let g = GitHub::new([SECRET]).unwrap();
        assert_eq!(g.sign(b"Hello, World!"), SIG);
        let delivery = Signed {
            headers: &[("x-hub-signature-256", SIG), ("x-github-delivery", "d-1")],
            signature: HEADER,
            body: b"Hello, World!",
            tampered: b"Hello, World?",
        };
        let both = GitHub::new(["new-github-secret-0", SECRET]).unwrap();
        delivery.check(&g, &both, Utc::now(), Some("d-1"));
    }

    #[test]
    fn legacy_sha1_is_refused_and_prefix_is_required() {
        let g = GitHub::new([SECRET]).unwrap();
        let sha1_only = [(
            "X-Hub-Signature",
            "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59",
        )];
        assert_eq!(
            g.verify(&sha1_only, b"Hello, World!", Utc::now()),
            Err(VerifyError::MissingHeader(HEADER.into()))
        );
        let bare = &SIG["sha256=".len()..];
        assert_eq!(
            g.verify(&[(HEADER, bare)], b"Hello, World!", Utc::now()),
            Err(VerifyError::NoUsableSignature)
        );
        assert!(matches!(
            g.verify(&[(HEADER, "sha256=zz")], b"x", Utc::now()),
            Err(VerifyError::MalformedHeader { .. })
        ));
    }
}
