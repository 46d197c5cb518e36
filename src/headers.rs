//! Header lookup that works with `http::HeaderMap` and with plain pairs, and the
//! request line (method and target) for the schemes that sign it.

/// A source of request headers, looked up by case-insensitive name.
///
/// Implemented for [`http::HeaderMap`] and for slices of `(name, value)` pairs, so
/// the guard works in any framework:
///
/// ```
/// use webhook_guard::Headers;
///
/// let pairs = [("Webhook-Id", "msg_1")];
/// assert_eq!(pairs.get_str("webhook-id"), Some("msg_1"));
/// ```
pub trait Headers {
    /// The first value of the header `name` (ASCII case-insensitive), as bytes
    /// (from `(name, value)` pairs, trimmed of surrounding whitespace).
    fn get_bytes(&self, name: &str) -> Option<&[u8]>;

    /// The first value of the header `name`, if it is valid UTF-8.
    fn get_str(&self, name: &str) -> Option<&str> {
        self.get_bytes(name)
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The request's method (`POST`, `GET`), when the source knows it.
    ///
    /// A header map alone does not: `None`. [`http::request::Parts`],
    /// [`http::Request`] and [`RequestHead`] do, and the integrations pass one of
    /// them, so that the schemes that sign the method (HubSpot v3) or answer a
    /// handshake sent as a `GET` (Meta's subscription check) see it.
    fn method(&self) -> Option<&str> {
        None
    }

    /// The request target as received: the path and the query, such as
    /// `/hooks/twilio?bodySHA256=...` (no scheme or host), when the source knows it.
    ///
    /// The schemes that sign the URL (Twilio, HubSpot v3) take the query from here
    /// and the scheme, host and path from their configuration (a proxy may rewrite
    /// those); Meta's subscription check reads its `hub.*` parameters here.
    fn target(&self) -> Option<&str> {
        None
    }
}

/// The method and target of a request alongside its headers, for a host that calls
/// the guard with a header map of its own (warp, rocket, a hand-written server):
/// what the integrations pass for you.
///
/// ```
/// use webhook_guard::{Headers, RequestHead};
///
/// let headers = [("X-Twilio-Signature", "...")];
/// let head = RequestHead::new(&headers[..], "POST", "/twilio?a=1");
/// assert_eq!(head.method(), Some("POST"));
/// assert_eq!(head.target(), Some("/twilio?a=1"));
/// assert_eq!(head.get_str("x-twilio-signature"), Some("..."));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a, H: ?Sized> {
    headers: &'a H,
    method: &'a str,
    target: &'a str,
}

impl<'a, H: Headers + ?Sized> RequestHead<'a, H> {
    /// `headers` of a request made with `method` to `target` (its path and query,
    /// as received).
    pub fn new(headers: &'a H, method: &'a str, target: &'a str) -> Self {
        Self {
            headers,
            method,
            target,
        }
    }
}

impl<H: Headers + ?Sized> Headers for RequestHead<'_, H> {
    fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        self.headers.get_bytes(name)
    }

    fn method(&self) -> Option<&str> {
        Some(self.method)
    }

    fn target(&self) -> Option<&str> {
        Some(self.target)
    }
}

/// The head of an `http` request: its headers, method and target. What the axum,
/// tower and Lambda integrations pass to the guard.
impl Headers for http::request::Parts {
    fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        self.headers.get_bytes(name)
    }

    fn method(&self) -> Option<&str> {
        Some(self.method.as_str())
    }

    fn target(&self) -> Option<&str> {
        Some(uri_target(&self.uri))
    }
}

/// An `http` request's headers, method and target (its body is not read).
impl<B> Headers for http::Request<B> {
    fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        self.headers().get_bytes(name)
    }

    fn method(&self) -> Option<&str> {
        Some(self.method().as_str())
    }

    fn target(&self) -> Option<&str> {
        Some(uri_target(self.uri()))
    }
}

/// The path and query of `uri` (`/` when it has neither).
fn uri_target(uri: &http::Uri) -> &str {
    uri.path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str)
}

impl Headers for http::HeaderMap {
    fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        // `HeaderMap::get` lower-cases a `&str` name for us; names with characters
        // that are not valid in a header name simply do not match.
        self.get(name).map(http::HeaderValue::as_bytes)
    }
}

/// `http` 0.2's `HeaderMap` (feature `http02`), for warp 0.3, hyper 0.14 and the
/// other frameworks still on `http` 0.2.
#[cfg(feature = "http02")]
#[cfg_attr(docsrs, doc(cfg(feature = "http02")))]
impl Headers for http02::HeaderMap {
    fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(http02::HeaderValue::as_bytes)
    }
}

/// Values are trimmed of surrounding whitespace, as an HTTP server does before a
/// `HeaderMap` sees them, so that a verifier reads `" sha256=..."` from pairs as it
/// would from a `HeaderMap`.
impl<K: AsRef<str>, V: AsRef<[u8]>> Headers for [(K, V)] {
    fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(k, _)| k.as_ref().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref().trim_ascii())
    }
}

impl<K: AsRef<str>, V: AsRef<[u8]>, const N: usize> Headers for [(K, V); N] {
    fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        self.as_slice().get_bytes(name)
    }
}

impl<K: AsRef<str>, V: AsRef<[u8]>> Headers for Vec<(K, V)> {
    fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        self.as_slice().get_bytes(name)
    }
}

impl<H: Headers + ?Sized> Headers for &H {
    fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        (**self).get_bytes(name)
    }

    fn method(&self) -> Option<&str> {
        (**self).method()
    }

    fn target(&self) -> Option<&str> {
        (**self).target()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_map_lookup_is_case_insensitive() {
        let mut map = http::HeaderMap::new();
        map.insert("stripe-signature", "t=1,v1=aa".parse().unwrap());
        assert_eq!(map.get_str("Stripe-Signature"), Some("t=1,v1=aa"));
        assert_eq!(map.get_str("missing"), None);
    }

    #[cfg(feature = "http02")]
    #[test]
    fn http02_header_map_lookup_is_case_insensitive() {
        let mut map = http02::HeaderMap::new();
        map.insert("x-signature", "ab".parse().unwrap());
        map.append("x-signature", "cd".parse().unwrap());
        map.insert("bin", http02::HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(map.get_str("X-Signature"), Some("ab"), "the first value");
        assert_eq!(map.get_bytes("BIN"), Some(&b"\xff"[..]));
        assert_eq!(map.get_str("bin"), None);
        assert_eq!(map.get_str("missing"), None);
        assert_eq!(map.get_str("not a header name"), None);
    }

    /// The guard verifies a delivery whose headers are an `http` 0.2 map.
    #[cfg(feature = "http02")]
    #[test]
    fn the_guard_reads_an_http02_header_map() {
        use crate::verify::HmacSha256Header;
        let verifier = HmacSha256Header::new("X-Signature", ["k-0123456789abcdef"]).unwrap();
        let guard = crate::WebhookGuard::builder()
            .store(crate::MemoryStore::new())
            .verifier(verifier.clone())
            .event_id(crate::EventId::json_field(["id"]))
            .build()
            .unwrap();
        let body = br#"{"id":"evt_1"}"#;
        let mut map = http02::HeaderMap::new();
        map.insert("x-signature", verifier.sign(body).parse().unwrap());
        assert_eq!(guard.verify(&map, body).unwrap().id, "evt_1");
        map.insert("x-signature", verifier.sign(b"other").parse().unwrap());
        assert_eq!(
            guard.verify(&map, body).unwrap_err().code(),
            "signature_mismatch"
        );
    }

    #[test]
    fn request_heads_know_their_method_and_target() {
        let request = http::Request::post("https://example.com/hooks?a=1&b=%20")
            .header("X-Sig", "ab")
            .body(())
            .unwrap();
        assert_eq!(Headers::method(&request), Some("POST"));
        assert_eq!(Headers::target(&request), Some("/hooks?a=1&b=%20"));
        let (parts, ()) = request.into_parts();
        assert_eq!(Headers::method(&parts), Some("POST"));
        assert_eq!(parts.target(), Some("/hooks?a=1&b=%20"));
        assert_eq!(parts.get_str("x-sig"), Some("ab"));
        let by_ref: &dyn Headers = &&parts;
        assert_eq!(by_ref.target(), Some("/hooks?a=1&b=%20"));
        let map = http::HeaderMap::new();
        assert_eq!((map.method(), map.target()), (None, None));
        let bare = http::Request::get("http://example.com").body(()).unwrap();
        assert_eq!(Headers::target(&bare), Some("/"));
    }

    #[test]
    fn pairs_lookup_is_case_insensitive_and_takes_the_first() {
        let pairs = vec![("X-A", "1"), ("x-a", "2")];
        assert_eq!(pairs.get_str("x-A"), Some("1"));
        let bytes: [(&str, &[u8]); 1] = [("bin", b"\xff")];
        assert_eq!(bytes.get_bytes("BIN"), Some(&b"\xff"[..]));
        assert_eq!(bytes.get_str("bin"), None);
        let padded = [("X-Sig", " \tsha256=ab \t")];
        assert_eq!(padded.get_str("x-sig"), Some("sha256=ab"));
    }
}
