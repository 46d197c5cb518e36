//! A small HTTP/1.1 client over plain TCP: one `POST` per connection, no TLS.
//! Enough to drive a local endpoint like a provider would, without a client stack.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest response read (the guard's answers are a few dozen bytes).
const MAX_REPLY: usize = 1 << 20;

/// Where to send: resolved addresses, the `Host` header and the request target.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) url: String,
    host: String,
    path: String,
    addrs: Vec<SocketAddr>,
}

/// A response: status line and body (decoded from chunks if chunked).
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) reason: String,
    pub(crate) body: String,
}

impl Target {
    /// Parses an `http://host[:port][/path]` URL and resolves the host. Unless
    /// `allow_remote`, every address must be loopback.
    pub(crate) async fn resolve(url: &str, allow_remote: bool) -> Result<Self, String> {
        // The scheme in any case, as URLs allow.
        let scheme = url.get(..8).unwrap_or(url).to_ascii_lowercase();
        let rest = if scheme.starts_with("http://") {
            &url[7..]
        } else if scheme.starts_with("https://") {
            return Err(
                "https is not supported: `send` is a development tool for a local \
                        endpoint (http://127.0.0.1:PORT/path); test a public endpoint \
                        with the provider's own test deliveries"
                    .into(),
            );
        } else {
            // Not echoed: a URL may carry credentials.
            return Err("--url must start with http://".into());
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_owned()),
        };
        // Anywhere, not only in the authority as parsed here: in a malformed
        // userinfo (a raw `/` or `?`) the `@` comes after the cut, and a part of the
        // credential would be echoed as the host.
        if rest.contains('@') {
            return Err(
                "--url must not carry credentials (no `@`; write an `@` of the path or \
                 query as `%40`)"
                    .into(),
            );
        }
        let (host, port) = split_host_port(authority)?;
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| format!("cannot resolve `{host}`: {e}"))?
            .collect();
        if addrs.is_empty() {
            return Err(format!("`{host}` resolves to no address"));
        }
        if !allow_remote && !addrs.iter().all(|a| a.ip().is_loopback()) {
            return Err(format!(
                "`{host}` is not a loopback address: `send` posts test events to local \
                 endpoints only (pass --allow-remote for a host on a trusted network)"
            ));
        }
        Ok(Self {
            url: url.to_owned(),
            host: authority.to_owned(),
            path,
            addrs,
        })
    }

    /// `POST`s `body` with `headers` and reads the whole answer, within `timeout`.
    pub(crate) async fn post(
        &self,
        headers: &[(String, String)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Reply, String> {
        match tokio::time::timeout(timeout, self.exchange(headers, body)).await {
            Ok(reply) => reply,
            Err(_) => Err(format!("no answer within {timeout:?}")),
        }
    }

    async fn exchange(&self, headers: &[(String, String)], body: &[u8]) -> Result<Reply, String> {
        let mut stream = TcpStream::connect(&self.addrs[..])
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.host))?;
        let mut request = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.path,
            self.host,
            body.len()
        );
        for (name, value) in headers {
            request.push_str(name);
            request.push_str(": ");
            request.push_str(value);
            request.push_str("\r\n");
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        stream
            .write_all(&bytes)
            .await
            .map_err(|e| format!("send failed: {e}"))?;
        let mut raw = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => {
                    raw.extend_from_slice(&buf[..n]);
                    if raw.len() > MAX_REPLY {
                        return Err("response larger than 1 MiB".into());
                    }
                }
                // A reset after the answer arrived is fine.
                Err(_) if has_head(&raw) => break,
                Err(e) => return Err(format!("receive failed: {e}")),
            }
        }
        parse(&raw)
    }
}

fn split_host_port(authority: &str) -> Result<(&str, u16), String> {
    let bad = || format!("bad host or port in `{authority}`");
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, rest) = v6.split_once(']').ok_or_else(bad)?;
        let port = match rest.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad())?,
            None if rest.is_empty() => 80,
            None => return Err(bad()),
        };
        return Ok((host, port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Ok((host, port.parse().map_err(|_| bad())?)),
        None if !authority.is_empty() => Ok((authority, 80)),
        None => Err(bad()),
    }
}

fn has_head(raw: &[u8]) -> bool {
    find(raw, b"\r\n\r\n").is_some()
}

fn parse(raw: &[u8]) -> Result<Reply, String> {
    let end = find(raw, b"\r\n\r\n").ok_or("the connection closed before a complete answer")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let body = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (version, status, reason) = (parts.next(), parts.next(), parts.next());
    if !version.is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(format!("not an HTTP/1.x answer: `{status_line}`"));
    }
    let status = status
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line `{status_line}`"))?;
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")
        })
    });
    Ok(Reply {
        status,
        reason: reason.unwrap_or_default().to_owned(),
        body: if chunked {
            String::from_utf8_lossy(&dechunk(body)).into_owned()
        } else {
            String::from_utf8_lossy(body).into_owned()
        },
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The bytes of a chunked body, up to the last chunk or the first malformed one.
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = find(rest, b"\r\n") {
        let size = std::str::from_utf8(&rest[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .unwrap_or(0);
        let after = &rest[eol + 2..];
        if size == 0 || size > after.len() {
            break;
        }
        out.extend_from_slice(&after[..size]);
        rest = &after[size..];
        while let Some(next) = rest.strip_prefix(b"\r\n") {
            rest = next;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_url_is_read_in_any_case_and_never_echoed() {
        let target = Target::resolve("HTTP://127.0.0.1:9/hook", false)
            .await
            .unwrap();
        assert_eq!(target.path, "/hook");
        let err = Target::resolve("ftp://user:hunter2@127.0.0.1/x", false)
            .await
            .err()
            .unwrap();
        assert!(!err.contains("hunter2"), "{err}");
        // A malformed userinfo: its `?` or `/` comes before the `@`.
        for url in [
            "http://admin:s3cr?t@127.0.0.1/",
            "http://admin:s3cr/t@127.0.0.1/",
            "http://adm1n:123/x@127.0.0.1/",
        ] {
            let err = Target::resolve(url, false).await.err().unwrap();
            assert!(!err.contains("s3cr") && !err.contains("adm1n"), "{err}");
        }
    }

    /// An `@` is refused anywhere (it may end a malformed userinfo), with the way
    /// around for one in the path or query.
    #[tokio::test]
    async fn an_at_sign_of_a_query_is_written_percent_encoded() {
        let err = Target::resolve("http://127.0.0.1:9/hook?to=a@b", false)
            .await
            .err()
            .unwrap();
        assert!(err.contains("%40"), "{err}");
        let target = Target::resolve("http://127.0.0.1:9/hook?to=a%40b", false)
            .await
            .unwrap();
        assert_eq!(target.path, "/hook?to=a%40b");
    }

    #[test]
    fn parses_answers() {
        let r = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").unwrap();
        assert_eq!(
            (r.status, r.reason.as_str(), r.body.as_str()),
            (200, "OK", "ok")
        );
        let r = parse(b"HTTP/1.1 409 Conflict\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n")
            .unwrap();
        assert_eq!((r.status, r.body.as_str()), (409, "abc"));
        assert!(parse(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse(b"SSH-2.0\r\n\r\n").is_err());
    }

    #[test]
    fn chunks_may_split_characters() {
        let r = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n\xc3\r\n1\r\n\xa9\r\n0\r\n\r\n")
            .unwrap();
        assert_eq!(r.body, "\u{e9}");
        let r = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n\xc3\xa9\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, "\u{e9}");
        let r =
            parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n\xffa\r\n0\r\n\r\n")
                .unwrap();
        assert_eq!(r.body, "\u{fffd}a");
        let r =
            parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\nzz\r\nb\r\n")
                .unwrap();
        assert_eq!(r.body, "a");
        let r = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n\xc3\xa9\r\n")
            .unwrap();
        assert_eq!(r.body, "");
    }

    #[test]
    fn host_and_port() {
        assert_eq!(
            split_host_port("127.0.0.1:3000").unwrap(),
            ("127.0.0.1", 3000)
        );
        assert_eq!(split_host_port("[::1]:8080").unwrap(), ("::1", 8080));
        assert_eq!(split_host_port("localhost").unwrap(), ("localhost", 80));
        assert!(split_host_port("h:port").is_err());
    }

    #[tokio::test]
    async fn refuses_tls_and_remote_hosts() {
        assert!(Target::resolve("https://127.0.0.1/x", false).await.is_err());
        assert!(Target::resolve("ftp://127.0.0.1/x", false).await.is_err());
        assert!(Target::resolve("http://192.0.2.1:80/x", false)
            .await
            .unwrap_err()
            .contains("loopback"));
        let t = Target::resolve("http://127.0.0.1:9/hooks?a=1", false)
            .await
            .unwrap();
        assert_eq!(t.path, "/hooks?a=1");
        let t = Target::resolve("http://localhost:9", false).await.unwrap();
        assert_eq!(t.path, "/");
    }
}
