//! What the presets that sign more than headers and body read from the request:
//! the public URL they are configured with, the request's query and form
//! parameters, and a digest of the body where a provider sends no event id.
//! Private to the `verify` module.

use sha2::{Digest as _, Sha256};

use super::{KeyError, VerifyError};
use crate::Headers;

/// Longest request target (path and query) a preset reads.
pub(crate) const MAX_TARGET_LEN: usize = 8 * 1024;

/// The public URL a provider calls, as configured (proxies rewrite the URL a
/// server sees): scheme, host, optional port and path; no query or fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublicUrl {
    /// The URL as given.
    url: String,
    /// The same URL with the scheme's default port written out, or left out when
    /// it was written: the providers' SDKs accept a signature over either form.
    other: Option<String>,
}

impl PublicUrl {
    /// Checks `url`: `http` or `https`, a host, no query, no fragment, no spaces.
    ///
    /// # Errors
    /// [`KeyError::BadUrl`] saying what is wrong.
    pub(crate) fn parse(url: &str) -> Result<Self, KeyError> {
        let bad = KeyError::BadUrl;
        let (scheme, rest) = url
            .split_once("://")
            .ok_or(bad("give the full URL, with http:// or https://"))?;
        let default_port = match scheme {
            "https" => "443",
            "http" => "80",
            _ => return Err(bad("the scheme must be http or https")),
        };
        if url.contains('?') || url.contains('#') {
            return Err(bad(
                "give the URL without its query or fragment: the query is read from each request",
            ));
        }
        if url.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(bad("the URL holds spaces, control or non-ASCII characters"));
        }
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.is_empty() || authority.contains('@') {
            return Err(bad("the URL needs a host (and no user information)"));
        }
        let with_port = |host: &str| format!("{scheme}://{host}:{default_port}{path}");
        // `[::1]:443` has its port after the bracket; `[::1]` has none.
        let port_at = authority
            .rfind(':')
            .filter(|&i| !authority[i..].contains(']'));
        let other = match port_at {
            Some(i) if &authority[i + 1..] == default_port => {
                Some(format!("{scheme}://{}{path}", &authority[..i]))
            }
            Some(_) => None,
            None => Some(with_port(authority)),
        };
        Ok(Self {
            url: url.to_owned(),
            other,
        })
    }

    /// The URL as configured.
    pub(crate) fn as_str(&self) -> &str {
        &self.url
    }

    /// The URL as configured, then its other form (default port written out or
    /// left out), each with `query` appended when there is one.
    pub(crate) fn forms(&self, query: Option<&str>) -> impl Iterator<Item = String> + '_ {
        let query = query.filter(|q| !q.is_empty()).map(str::to_owned);
        std::iter::once(&self.url)
            .chain(self.other.as_ref())
            .map(move |base| match &query {
                Some(q) => format!("{base}?{q}"),
                None => base.clone(),
            })
    }
}

/// The request's query (after `?`), if the host passed the target and it has one.
///
/// # Errors
/// [`VerifyError::MalformedQuery`] for a target longer than [`MAX_TARGET_LEN`].
pub(crate) fn query(headers: &dyn Headers) -> Result<Option<&str>, VerifyError> {
    let Some(target) = headers.target() else {
        return Ok(None);
    };
    if target.len() > MAX_TARGET_LEN {
        return Err(VerifyError::MalformedQuery("request target too long"));
    }
    Ok(target.split_once('?').map(|(_, q)| q))
}

/// The first value of parameter `name` in a query or form body, decoded.
pub(crate) fn param(encoded: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(encoded)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// `sha256:` and the lowercase hex SHA-256 of `body`: the event id of a provider
/// whose deliveries carry none, so that the same signed bytes sent again are a
/// duplicate.
pub(crate) fn digest_id(body: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(body)))
}

/// Whether `a` and `b` are equal, in time that depends on neither (both are
/// hashed first, so their lengths do not show either).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_urls_are_checked_and_have_two_forms() {
        let url = PublicUrl::parse("https://example.com/sms").unwrap();
        let forms: Vec<_> = url.forms(Some("a=1")).collect();
        assert_eq!(
            forms,
            [
                "https://example.com/sms?a=1",
                "https://example.com:443/sms?a=1"
            ]
        );
        let url = PublicUrl::parse("http://example.com:80").unwrap();
        assert_eq!(
            url.forms(None).collect::<Vec<_>>(),
            ["http://example.com:80", "http://example.com"]
        );
        let url = PublicUrl::parse("https://example.com:8443/x").unwrap();
        assert_eq!(url.forms(Some("")).count(), 1);
        let v6 = PublicUrl::parse("https://[::1]/x").unwrap();
        assert_eq!(v6.forms(None).nth(1).unwrap(), "https://[::1]:443/x");
        for bad in [
            "example.com/sms",
            "ftp://example.com/",
            "https://example.com/sms?x=1",
            "https://example.com/#rc=3",
            "https:///path",
            "https://user@example.com/",
            "https://example.com/a b",
        ] {
            assert!(PublicUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn queries_params_and_digests() {
        let head =
            crate::RequestHead::new(&[("a", "b")][..], "GET", "/x?hub.mode=subscribe&c=%20d+e");
        let q = query(&head).unwrap().unwrap();
        assert_eq!(param(q.as_bytes(), "c").as_deref(), Some(" d e"));
        assert_eq!(
            param(q.as_bytes(), "hub.mode").as_deref(),
            Some("subscribe")
        );
        assert_eq!(param(q.as_bytes(), "z"), None);
        assert_eq!(query(&[("a", "b")]).unwrap(), None);
        let long = format!("/?{}", "a".repeat(MAX_TARGET_LEN));
        let head = crate::RequestHead::new(&[("a", "b")][..], "GET", &long);
        assert!(query(&head).is_err());
        assert_eq!(
            digest_id(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(constant_time_eq(b"token", b"token"));
        assert!(!constant_time_eq(b"token", b"tokem"));
        assert!(!constant_time_eq(b"token", b"token "));
    }
}
