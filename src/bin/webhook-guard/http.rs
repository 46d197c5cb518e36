//! The HTTP client of `send`: one `POST` per connection over plain TCP (HTTP/1.1
//! through hyper, no TLS). Enough to drive a local endpoint as a provider would.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
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
        let stream = TcpStream::connect(&self.addrs[..])
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.host))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| failed("send failed", &e))?;
        // Drives the connection while the request is sent and the answer read.
        let connection = tokio::spawn(connection);
        let mut request = hyper::Request::post(self.path.as_str())
            .header(hyper::header::HOST, self.host.as_str())
            .header(hyper::header::CONNECTION, "close");
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(|e| format!("send failed: {e}"))?;
        let reply = sender.send_request(request).await;
        let reply = match reply {
            Ok(response) => read(response).await,
            Err(e) if e.is_incomplete_message() => {
                Err("the connection closed before a complete answer".into())
            }
            Err(e) if e.is_parse() => Err(failed("not an HTTP/1.x answer", &e)),
            Err(e) => Err(failed("send failed", &e)),
        };
        connection.abort();
        reply
    }
}

/// The status, reason and body of `response`, the body read up to [`MAX_REPLY`].
async fn read(response: hyper::Response<hyper::body::Incoming>) -> Result<Reply, String> {
    let status = response.status();
    let reason = match response.extensions().get::<hyper::ext::ReasonPhrase>() {
        Some(reason) => String::from_utf8_lossy(reason.as_bytes()).into_owned(),
        None => status.canonical_reason().unwrap_or_default().to_owned(),
    };
    let mut body = response.into_body();
    let mut raw = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    raw.extend_from_slice(data);
                    if raw.len() > MAX_REPLY {
                        return Err("response larger than 1 MiB".into());
                    }
                }
            }
            // A fault after the head (a reset, a malformed chunk): the answer is what
            // arrived before it.
            Err(_) => break,
        }
    }
    Ok(Reply {
        status: status.as_u16(),
        reason,
        body: String::from_utf8_lossy(&raw).into_owned(),
    })
}

/// `what: error: its causes`.
fn failed(what: &str, e: &hyper::Error) -> String {
    let mut text = format!("{what}: {e}");
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
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

    /// What `post` makes of `raw`, sent by a server as its whole answer (the
    /// connection closed after it), and the request the server read.
    async fn answer(raw: &'static [u8]) -> (Result<Reply, String>, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook?a=1", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            while !seen.ends_with(b"\r\n\r\nbody") {
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                seen.extend_from_slice(&buf[..n]);
            }
            socket.write_all(raw).await.unwrap();
            socket.shutdown().await.unwrap();
            String::from_utf8(seen).unwrap()
        });
        let target = Target::resolve(&url, false).await.unwrap();
        let headers = [("X-Test-Signature".to_owned(), "v1=ab".to_owned())];
        let reply = target
            .post(&headers, b"body", Duration::from_secs(10))
            .await;
        (reply, server.await.unwrap())
    }

    #[tokio::test]
    async fn sends_one_post_and_reads_its_answer() {
        let (r, request) = answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        let r = r.unwrap();
        assert_eq!(
            (r.status, r.reason.as_str(), r.body.as_str()),
            (200, "OK", "ok")
        );
        let request = request.to_ascii_lowercase();
        assert!(
            request.starts_with("post /hook?a=1 http/1.1\r\n"),
            "{request}"
        );
        for line in [
            "\r\nhost: 127.0.0.1:",
            "\r\nconnection: close\r\n",
            "\r\ncontent-length: 4\r\n",
            "\r\nx-test-signature: v1=ab\r\n",
        ] {
            assert!(request.contains(line), "{line:?} in {request}");
        }
        let (r, _) = answer(b"HTTP/1.1 409 Conflict\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n")
            .await;
        let r = r.unwrap();
        assert_eq!((r.status, r.body.as_str()), (409, "abc"));
        let (r, _) = answer(b"HTTP/1.1 200 Fine\r\ncontent-length: 0\r\n\r\n").await;
        assert_eq!(r.unwrap().reason, "Fine");
        assert!(answer(b"HTTP/1.1 200 OK\r\n").await.0.is_err());
        assert!(answer(b"SSH-2.0\r\n\r\n").await.0.is_err());
    }

    #[tokio::test]
    async fn chunks_may_split_characters() {
        let body = |raw| async move { answer(raw).await.0.unwrap().body };
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n\xc3\r\n1\r\n\xa9\r\n0\r\n\r\n").await,
            "\u{e9}"
        );
        assert_eq!(
            body(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n\xc3\xa9\r\n0\r\n\r\n"
            )
            .await,
            "\u{e9}"
        );
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n\xffa\r\n0\r\n\r\n")
                .await,
            "\u{fffd}a"
        );
        // A malformed chunk: the answer is what arrived before it.
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\nzz\r\nb\r\n")
                .await,
            "a"
        );
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
