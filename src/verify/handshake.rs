//! Handshakes: requests a provider sends to check an endpoint before (or between)
//! deliveries, answered by the guard itself.

use http::StatusCode;

use super::VerifyError;

/// The answer a preset gives to a provider's handshake: a request that checks the
/// endpoint (Slack's `url_verification`, Zoom's `endpoint.url_validation`, Meta's
/// subscription `GET`, Twitch's `webhook_callback_verification`, Discord's `PING`,
/// Dropbox's verification `GET`) rather than delivering an event.
///
/// A verifier returns it in [`Verified::handshake`](super::Verified::handshake)
/// once the request has verified (a handshake with a bad signature is refused like
/// any delivery). The guard then answers it as [`Outcome::Handshake`]: the handler
/// does not run and the store is not touched. Every integration sends its status,
/// `Content-Type` and body (with `X-Content-Type-Options: nosniff`, as on every
/// answer); a host answering an [`Outcome`] itself reads them from
/// [`Outcome::handshake`].
///
/// [`Outcome`]: crate::Outcome
/// [`Outcome::Handshake`]: crate::Outcome::Handshake
/// [`Outcome::handshake`]: crate::Outcome::handshake
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Handshake {
    /// What kind of handshake this is, for logs and metrics, such as
    /// `slack_url_verification`.
    pub name: &'static str,
    /// The status to answer.
    pub status: StatusCode,
    /// The `Content-Type` to answer.
    pub content_type: &'static str,
    /// The body to answer.
    pub body: String,
}

impl Handshake {
    /// A handshake answered `status` with `body` of `content_type`.
    pub fn new(
        name: &'static str,
        status: StatusCode,
        content_type: &'static str,
        body: impl Into<String>,
    ) -> Self {
        Self {
            name,
            status,
            content_type,
            body: body.into(),
        }
    }

    /// A handshake answered 200 with `body` as `text/plain; charset=utf-8`.
    pub fn text(name: &'static str, body: impl Into<String>) -> Self {
        Self::new(name, StatusCode::OK, "text/plain; charset=utf-8", body)
    }

    /// A handshake answered 200 with the JSON `body`.
    pub fn json(name: &'static str, body: &serde_json::Value) -> Self {
        Self::new(name, StatusCode::OK, "application/json", body.to_string())
    }
}

/// The longest challenge a preset echoes back.
pub(crate) const MAX_CHALLENGE_LEN: usize = 1024;

/// A challenge a provider asks to have echoed, checked before it is: 1 to
/// [`MAX_CHALLENGE_LEN`] bytes of visible ASCII (no spaces, quotes or markup
/// brackets), so that an answer never carries anything a browser or a log could
/// read as more than a token. Every provider's challenge fits (letters, digits and
/// `-`, `_`, `.`, `~`, `+`, `/`, `=`).
///
/// # Errors
/// [`VerifyError::MalformedBody`] (or for a query parameter, the same) naming
/// `what`.
pub(crate) fn challenge<'a>(value: &'a str, what: &'static str) -> Result<&'a str, VerifyError> {
    let fits = !value.is_empty()
        && value.len() <= MAX_CHALLENGE_LEN
        && value.bytes().all(|b| {
            b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'<' | b'>' | b'\\' | b'&')
        });
    if fits {
        Ok(value)
    } else {
        Err(VerifyError::MalformedBody(what))
    }
}

/// The handshake `name` answering the query parameter `param` of `query` as
/// plain text, once it is a plain token ([`challenge`]).
///
/// # Errors
/// [`VerifyError::MalformedQuery`]: `missing` without the parameter, `not_plain`
/// for one that is no plain token.
pub(crate) fn echo_query_param(
    query: &[u8],
    param: &str,
    name: &'static str,
    (missing, not_plain): (&'static str, &'static str),
) -> Result<super::Verified, VerifyError> {
    let value = super::request::param(query, param).ok_or(VerifyError::MalformedQuery(missing))?;
    let value = challenge(&value, not_plain).map_err(|_| VerifyError::MalformedQuery(not_plain))?;
    Ok(super::Verified::with_handshake(Handshake::text(
        name, value,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_plain_tokens() {
        for ok in [
            "3eZbrw1aBm2rZgRNFdxV",
            "1158201444",
            "pogchamp-kappa-360noscope-vohiyo",
            "a+b/c=_~.",
        ] {
            assert_eq!(challenge(ok, "c"), Ok(ok));
        }
        let long = "a".repeat(MAX_CHALLENGE_LEN + 1);
        for bad in ["", "a b", "<script>", "a\"b", "é", "a\nb", long.as_str()] {
            assert_eq!(
                challenge(bad, "c"),
                Err(VerifyError::MalformedBody("c")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn constructors_set_the_content_type() {
        let h = Handshake::text("t", "abc");
        assert_eq!(
            (h.status, h.content_type, h.body.as_str()),
            (StatusCode::OK, "text/plain; charset=utf-8", "abc")
        );
        let j = Handshake::json("j", &serde_json::json!({"type": 1}));
        assert_eq!(
            (j.content_type, j.body.as_str()),
            ("application/json", r#"{"type":1}"#)
        );
    }
}
