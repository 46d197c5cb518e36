//! The HTTPS client the catch-up sources share: hyper's pooled client over rustls
//! (ring, the system's trusted roots), an API key sent as a bearer token and
//! never shown, and GET with bounded retries (429 honouring `Retry-After`, 5xx
//! and network errors with exponential backoff and jitter).

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use http::header::{HeaderValue, ACCEPT, AUTHORIZATION, RETRY_AFTER, USER_AGENT};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;

use super::SourceError;

/// The largest answer read, in bytes (a page of 100 large events fits).
const MAX_ANSWER: usize = 32 * 1024 * 1024;
/// How long one request may take, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The first wait after a 429 without `Retry-After`, a 5xx or a network error.
const FIRST_WAIT: Duration = Duration::from_millis(500);
/// The longest wait between two requests for one page: a `Retry-After` longer
/// than this ends the attempt ([`SourceError::RateLimited`]); the task's next
/// pass tries again.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Requests made for one page at most.
const MAX_ATTEMPTS: u32 = 6;
/// The longest provider error text kept in an error.
const MAX_MESSAGE: usize = 300;

/// A catch-up source's configuration refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The API key is empty or holds characters a header cannot carry.
    #[error("the API key is empty or not printable ASCII")]
    InvalidKey,
    /// The URL cannot be parsed, or has no host.
    #[error("invalid URL: {0}")]
    InvalidUrl(String),
    /// An `http://` URL to a host other than this machine: the API key would
    /// cross the network in clear text.
    #[error("refusing plain http to a host other than localhost: use https")]
    PlainHttp,
    /// The system's trusted roots could not be loaded.
    #[error("no trusted TLS roots: {0}")]
    Roots(#[source] std::io::Error),
}

/// An API key: sent as `Authorization: Bearer …`, marked sensitive, never shown.
#[derive(Clone)]
struct ApiKey(String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

/// A client for one API: its base URL and key.
#[derive(Clone, derive_more::Debug)]
pub(super) struct Client {
    #[debug(skip)]
    http: HyperClient<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    /// The base URL, without a trailing slash.
    base: String,
    key: ApiKey,
    /// Extra headers sent with each request (Stripe's `Stripe-Account`).
    #[debug(skip)]
    headers: Vec<(&'static str, HeaderValue)>,
}

impl Client {
    /// A client for `base` (`https://…`, or `http://` to localhost), with `key`.
    pub(super) fn new(base: &str, key: String) -> Result<Self, ConfigError> {
        let valid_key = !key.is_empty() && key.bytes().all(|b| (0x21..0x7f).contains(&b));
        if !valid_key {
            return Err(ConfigError::InvalidKey);
        }
        let base = base.trim_end_matches('/').to_owned();
        let uri: Uri = base
            .parse()
            .map_err(|e: http::uri::InvalidUri| ConfigError::InvalidUrl(e.to_string()))?;
        let host = uri
            .host()
            .ok_or_else(|| ConfigError::InvalidUrl("no host".into()))?;
        match uri.scheme_str() {
            Some("https") => {}
            Some("http") if is_loopback(host) => {}
            Some("http") => return Err(ConfigError::PlainHttp),
            _ => return Err(ConfigError::InvalidUrl("not an http(s) URL".into())),
        }
        if uri.query().is_some() {
            return Err(ConfigError::InvalidUrl("a query in the base URL".into()));
        }
        let provider = rustls::crypto::ring::default_provider();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)
            .map_err(ConfigError::Roots)?
            .https_or_http()
            .enable_http1()
            .build();
        let http = HyperClient::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            http,
            base,
            key: ApiKey(key),
            headers: Vec::new(),
        })
    }

    /// Sends `value` in header `name` with every request.
    #[cfg_attr(not(feature = "stripe-catch-up"), allow(dead_code))]
    pub(super) fn header(&mut self, name: &'static str, value: &str) -> Result<(), ConfigError> {
        let value = HeaderValue::from_str(value)
            .map_err(|_| ConfigError::InvalidUrl(format!("{name}: not a header value")))?;
        self.headers.push((name, value));
        Ok(())
    }

    /// GETs `path_and_query` (after the base URL) and answers the body of a 2xx;
    /// `describe` turns the body of a refusal into its text.
    pub(super) async fn get(
        &self,
        path_and_query: &str,
        describe: fn(&[u8]) -> Option<String>,
    ) -> Result<Bytes, SourceError> {
        let url = format!("{}{path_and_query}", self.base);
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| SourceError::Malformed(e.to_string()))?;
        let mut backoff = FIRST_WAIT;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let last = attempts >= MAX_ATTEMPTS;
            let wait = match self.once(uri.clone()).await {
                Ok((status, _, body)) if status.is_success() => return Ok(body),
                Ok((StatusCode::TOO_MANY_REQUESTS, retry_after, _)) => {
                    let wait = retry_after.unwrap_or(backoff);
                    if last || wait > MAX_WAIT {
                        return Err(SourceError::RateLimited { attempts });
                    }
                    wait
                }
                Ok((status, _, body)) if status.is_server_error() => {
                    if last {
                        let text = self.text(describe, &body);
                        let error = format!("{status} after {attempts} attempts: {text}");
                        return Err(SourceError::unavailable(error));
                    }
                    backoff
                }
                Ok((status, _, body)) => {
                    return Err(SourceError::Refused {
                        status: status.as_u16(),
                        message: self.text(describe, &body),
                    })
                }
                Err(error) if last => return Err(SourceError::Unavailable { source: error }),
                Err(error) => {
                    tracing::debug!(%error, "catch-up source request failed; retrying");
                    backoff
                }
            };
            tokio::time::sleep(jittered(wait)).await;
            backoff = (backoff * 2).min(MAX_WAIT);
        }
    }

    /// One request: the status, the `Retry-After` it asked for, and the body.
    async fn once(
        &self,
        uri: Uri,
    ) -> Result<(StatusCode, Option<Duration>, Bytes), super::BoxError> {
        let mut bearer = HeaderValue::from_str(&format!("Bearer {}", self.key.0))?;
        bearer.set_sensitive(true);
        let mut request = Request::get(uri)
            .header(AUTHORIZATION, bearer)
            .header(ACCEPT, "application/json")
            .header(
                USER_AGENT,
                concat!("webhook-guard/", env!("CARGO_PKG_VERSION")),
            )
            .body(Empty::new())?;
        for (name, value) in &self.headers {
            request.headers_mut().insert(*name, value.clone());
        }
        let answer = async {
            let response = self.http.request(request).await?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(retry_after);
            let body = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, super::BoxError>((status, retry_after, body))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, answer)
            .await
            .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))?
    }

    /// The provider's text for a refusal: `describe`'s, or the body's start;
    /// the key removed, control characters escaped, bounded.
    fn text(&self, describe: fn(&[u8]) -> Option<String>, body: &[u8]) -> String {
        let text = describe(body).unwrap_or_else(|| {
            String::from_utf8_lossy(&body[..body.len().min(MAX_MESSAGE)]).into_owned()
        });
        let text = text.replace(&self.key.0, "[redacted]");
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        if out.len() > MAX_MESSAGE {
            let mut end = MAX_MESSAGE;
            while !out.is_char_boundary(end) {
                end -= 1;
            }
            out.truncate(end);
            out.push('…');
        }
        out
    }
}

/// Whether `host` is this machine.
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A `Retry-After` value: whole seconds, or an HTTP date.
pub(super) fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    Some(
        (at.with_timezone(&Utc) - Utc::now())
            .to_std()
            .unwrap_or_default(),
    )
}

/// `wait` and up to a quarter more, so that replicas rate limited together do not
/// come back together.
fn jittered(wait: Duration) -> Duration {
    let spread = u64::try_from(wait.as_millis() / 4).unwrap_or(0);
    let extra = if spread == 0 {
        0
    } else {
        crate::store::FencingToken::random().0 % spread
    };
    wait + Duration::from_millis(extra)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{is_loopback, retry_after, Client, ConfigError};

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(retry_after(" 0 "), Some(Duration::ZERO));
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon"), None);
    }

    #[test]
    fn plain_http_only_to_this_machine() {
        assert!(is_loopback("127.0.0.1") && is_loopback("[::1]") && is_loopback("localhost"));
        assert!(!is_loopback("api.stripe.com"));
        let refused = Client::new("http://api.stripe.com", "sk_test_1".into());
        assert!(matches!(refused, Err(ConfigError::PlainHttp)));
        let refused = Client::new("https://api.stripe.com", "sk test".into());
        assert!(matches!(refused, Err(ConfigError::InvalidKey)));
    }

    #[test]
    fn the_key_is_never_shown() {
        let client = Client::new("http://127.0.0.1:1", "sk_test_secret".into()).unwrap();
        assert!(!format!("{client:?}").contains("sk_test_secret"));
        let text = client.text(|_| None, b"Invalid API Key provided: sk_test_secret\n");
        assert_eq!(text, "Invalid API Key provided: [redacted]\\n");
    }
}
