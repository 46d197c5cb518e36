//! The web integrations (axum's `guarded`, the tower layer, actix's `guarded`)
//! driven through real HTTP on loopback, from ONE list of scenarios.
//!
//! Each scenario is a function generic over a [`Framework`], which serves a guard
//! and the shared [`Probe`] handler its own way; [`web_cases!`] instantiates every
//! scenario for one framework as a `#[tokio::test]` in a module named after it.

use crate::support::http_client::{post, post_chunked, Reply};
use crate::support::web::{self, body, guard, sign, DownStore, SIGNATURE_HEADER};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use webhook_guard::store::RecordState;
use webhook_guard::{HandlerError, MemoryStore, WebhookGuard};

/// What the shared handler decided for an event, from its id's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Done (`Ok(())`, or a 200 from a tower inner service).
    Done,
    /// `fail_...`: a retryable failure (`HandlerError::retryable`, or a 503).
    Retryable,
    /// `perm_...`: a permanent failure (`HandlerError::permanent`, or a 422).
    Permanent,
}

impl Verdict {
    /// The verdict as a guarded handler's result.
    pub fn into_result(self) -> Result<(), HandlerError> {
        match self {
            Self::Done => Ok(()),
            Self::Retryable => Err(HandlerError::retryable("downstream is down")),
            Self::Permanent => Err(HandlerError::permanent("downstream refused it")),
        }
    }
}

/// The handler every framework runs: it counts its runs and its ends, sleeps
/// 300 ms for `slow_...` ids, waits to be released for `hang_...` ids, and fails as
/// [`Verdict`] says.
#[derive(Debug, Default)]
pub struct Probe {
    pub runs: AtomicUsize,
    pub finished: AtomicUsize,
    pub started: tokio::sync::Notify,
    pub release: tokio::sync::Notify,
}

impl Probe {
    pub async fn run(&self, id: &str, body: &[u8]) -> Verdict {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let payload: serde_json::Value = serde_json::from_slice(body).expect("a JSON body");
        assert_eq!(payload["id"], id, "the handler sees the raw body");
        if id.starts_with("slow_") {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        if id.starts_with("hang_") {
            self.started.notify_one();
            self.release.notified().await;
        }
        self.finished.fetch_add(1, Ordering::SeqCst);
        if id.starts_with("fail_") {
            Verdict::Retryable
        } else if id.starts_with("perm_") {
            Verdict::Permanent
        } else {
            Verdict::Done
        }
    }

    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// A web integration under test.
pub trait Framework {
    /// Serves `guard` with the [`Probe`] as its handler, `POST /webhooks`, on
    /// `127.0.0.1:0` in the background.
    fn serve(guard: WebhookGuard, probe: Arc<Probe>) -> impl Future<Output = SocketAddr>;

    /// Whether `reply` is this framework's answer to a delivery of `id` that ran
    /// the handler to success.
    fn is_processed(reply: &Reply, id: &str) -> bool {
        reply.status == 200 && reply.json()["outcome"] == "processed" && reply.json()["id"] == id
    }
}

async fn start<F: Framework>(guard: WebhookGuard) -> (SocketAddr, Arc<Probe>) {
    let probe = Arc::new(Probe::default());
    (F::serve(guard, probe.clone()).await, probe)
}

async fn deliver(addr: SocketAddr, body: &[u8]) -> Reply {
    post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sign(body))], body).await
}

pub async fn processed_then_duplicate<F: Framework>() {
    let (addr, probe) = start::<F>(guard(MemoryStore::new())).await;
    let body = body("evt_1");
    let first = deliver(addr, &body).await;
    assert!(F::is_processed(&first, "evt_1"), "{first:?}");
    assert_eq!(probe.runs(), 1);

    let again = deliver(addr, &body).await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.header("content-type"), Some("application/json"));
    assert_eq!(again.json()["outcome"], "duplicate");
    assert_eq!(again.json()["id"], "evt_1");
    assert_eq!(probe.runs(), 1, "a duplicate must not run the handler");
}

pub async fn forged_signature_is_401<F: Framework>() {
    let (addr, probe) = start::<F>(guard(MemoryStore::new())).await;
    let body = body("evt_1");
    let forged = sign(b"another body");
    let reply = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &forged)], &body).await;
    assert_eq!(reply.status, 401, "{reply:?}");
    let json = reply.json();
    assert_eq!(json["outcome"], "rejected");
    assert_eq!(json["reason"], "signature_mismatch");
    assert!(json.get("id").is_none());
    assert!(!reply.body.contains("whsec"), "no secret in the answer");
    assert_eq!(probe.runs(), 0);
}

pub async fn unsigned_is_401<F: Framework>() {
    let (addr, probe) = start::<F>(guard(MemoryStore::new())).await;
    let reply = post(addr, "/webhooks", &[], &body("evt_1")).await;
    assert_eq!(reply.status, 401, "{reply:?}");
    assert_eq!(reply.json()["outcome"], "rejected");
    assert_eq!(probe.runs(), 0);
}

/// A body four times the limit, signed.
fn big() -> (Vec<u8>, String) {
    let mut big = body("evt_big");
    big.resize(web::LIMIT * 4, b' ');
    let sig = sign(&big);
    (big, sig)
}

pub async fn oversized_declared_is_413<F: Framework>() {
    let guard = guard(MemoryStore::new());
    let (addr, probe) = start::<F>(guard.clone()).await;
    let (big, sig) = big();
    let reply = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &big).await;
    assert_eq!(reply.status, 413, "{reply:?}");
    assert_eq!(reply.json()["outcome"], "rejected");
    assert_eq!(reply.json()["reason"], "body_too_large");
    assert_eq!(probe.runs(), 0);
    assert!(
        guard.inspect("evt_big").await.unwrap().is_none(),
        "nothing stored"
    );
}

pub async fn oversized_streamed_is_413<F: Framework>() {
    let (addr, probe) = start::<F>(guard(MemoryStore::new())).await;
    let (big, sig) = big();
    // No length: refused once it passes the limit.
    let reply = post_chunked(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &big, 256).await;
    assert_eq!(reply.status, 413, "{reply:?}");
    assert_eq!(reply.json()["reason"], "body_too_large");
    assert_eq!(probe.runs(), 0);

    // Exactly at the limit is fine, streamed or declared.
    let mut fits = body("evt_fits");
    fits.resize(web::LIMIT, b' ');
    let sig = sign(&fits);
    let ok = post_chunked(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &fits, 100).await;
    assert!(F::is_processed(&ok, "evt_fits"), "{ok:?}");
    let mut fits2 = body("evt_fits2");
    fits2.resize(web::LIMIT, b' ');
    let ok = deliver(addr, &fits2).await;
    assert!(F::is_processed(&ok, "evt_fits2"), "{ok:?}");
    assert_eq!(probe.runs(), 2);
}

/// A streamed body that passes the limit is answered 413 before it ends: the
/// client sends twice the limit and then nothing more (no last chunk), so an
/// integration that waited for the whole body would never answer.
pub async fn oversized_stream_is_refused_before_its_end<F: Framework>() {
    use tokio::io::AsyncReadExt;
    let (addr, probe) = start::<F>(guard(MemoryStore::new())).await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /webhooks HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\n{SIGNATURE_HEADER}: 00\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 256];
    // The server may answer and close before the whole stream is written: a
    // broken pipe then ends the writing, and the answer is read below.
    for _ in 0..(2 * web::LIMIT / chunk.len()) {
        let sent = async {
            stream.write_all(b"100\r\n").await?;
            stream.write_all(&chunk).await?;
            stream.write_all(b"\r\n").await
        };
        if sent.await.is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let read_head = async {
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed without an answer");
            answer.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read_head)
        .await
        .expect("answered before the body ended");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(probe.runs(), 0);
}

pub async fn store_outage_is_503<F: Framework>() {
    let (addr, probe) = start::<F>(guard(DownStore)).await;
    let reply = deliver(addr, &body("evt_1")).await;
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(reply.header("retry-after"), Some("5"));
    assert_eq!(reply.json()["outcome"], "store_unavailable");
    assert!(
        !reply.body.contains("connection refused"),
        "no internals in the answer"
    );
    assert_eq!(probe.runs(), 0);
}

pub async fn retryable_failure_is_500_and_retried<F: Framework>() {
    let (addr, probe) = start::<F>(guard(MemoryStore::new())).await;
    let body = body("fail_1");
    let first = deliver(addr, &body).await;
    assert_eq!(first.status, 500, "{first:?}");
    assert_eq!(first.json()["outcome"], "retryable_failure");
    assert!(
        !first.body.contains("downstream"),
        "no error message in the answer"
    );
    let second = deliver(addr, &body).await;
    assert_eq!(second.status, 500, "{second:?}");
    assert_eq!(probe.runs(), 2, "a retryable failure is retried");
}

pub async fn permanent_failure_is_200_and_not_retried<F: Framework>() {
    let (addr, probe) = start::<F>(guard(MemoryStore::new())).await;
    let body = body("perm_1");
    let first = deliver(addr, &body).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.json()["outcome"], "permanent_failure");
    let again = deliver(addr, &body).await;
    assert_eq!(again.json()["outcome"], "duplicate", "{again:?}");
    assert_eq!(probe.runs(), 1, "a permanent failure is not retried");
}

/// 64 copies of one event at once (the handler takes 300 ms): the handler runs
/// once, one copy is answered as processed, the others 409 `InProgress` (with
/// `Retry-After`) or, once it ended, 200 `Duplicate`.
pub async fn concurrent_copies_run_the_handler_once<F: Framework>() {
    let (addr, probe) = start::<F>(guard(MemoryStore::new())).await;
    let body = body("slow_race");
    let replies = futures_util::future::join_all((0..64).map(|_| deliver(addr, &body))).await;
    assert_eq!(probe.runs(), 1);
    let processed = replies
        .iter()
        .filter(|r| F::is_processed(r, "slow_race"))
        .count();
    assert_eq!(processed, 1, "{replies:?}");
    let mut in_progress = 0;
    for reply in replies.iter().filter(|r| !F::is_processed(r, "slow_race")) {
        match reply.status {
            409 => {
                in_progress += 1;
                assert_eq!(reply.json()["outcome"], "in_progress");
                assert!(reply.header("retry-after").is_some(), "{reply:?}");
            }
            200 => assert_eq!(reply.json()["outcome"], "duplicate", "{reply:?}"),
            _ => panic!("unexpected answer {reply:?}"),
        }
    }
    assert!(
        in_progress > 0,
        "copies arrived while the first ran (300 ms): {replies:?}"
    );
}

/// Waits (at most 10 s) until `id`'s record is in `state`.
async fn reaches(guard: &WebhookGuard, id: &str, state: RecordState) -> bool {
    for _ in 0..200 {
        let now = guard.inspect(id).await.unwrap().map(|r| r.state);
        if now == Some(state) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The client hangs up while the handler runs: the handler goes on to its end, its
/// success is recorded, and the provider's redelivery is a duplicate that runs
/// nothing.
pub async fn a_client_hanging_up_cancels_nothing<F: Framework>() {
    let guard = guard(MemoryStore::new());
    let (addr, probe) = start::<F>(guard.clone()).await;
    let body = body("hang_1");
    let sig = sign(&body);
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /webhooks HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n{SIGNATURE_HEADER}: {sig}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body).await.unwrap();
    probe.started.notified().await;
    drop(stream);
    // Give the server time to see the hang-up and drop the request's future.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(probe.finished.load(Ordering::SeqCst), 0);
    probe.release.notify_one();

    assert!(
        reaches(&guard, "hang_1", RecordState::Completed).await,
        "the handler finished and its success was recorded"
    );
    assert_eq!(probe.finished.load(Ordering::SeqCst), 1);
    let retry = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &body).await;
    assert_eq!(retry.status, 200, "{retry:?}");
    assert_eq!(retry.json()["outcome"], "duplicate", "{retry:?}");
    assert_eq!(probe.runs(), 1, "not run again");
}

/// Every scenario above as a test, in a module `$name`, for framework `$framework`.
macro_rules! web_cases {
    ($name:ident, $framework:ty) => {
        mod $name {
            web_cases!(@tests $framework;
                processed_then_duplicate,
                forged_signature_is_401,
                unsigned_is_401,
                oversized_declared_is_413,
                oversized_streamed_is_413,
                oversized_stream_is_refused_before_its_end,
                store_outage_is_503,
                retryable_failure_is_500_and_retried,
                permanent_failure_is_200_and_not_retried,
                concurrent_copies_run_the_handler_once,
                a_client_hanging_up_cancels_nothing,
            );
        }
    };
    (@tests $framework:ty; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                crate::web_cases::$case::<$framework>().await;
            }
        )*
    };
}

/// axum 0.8, `integrations::axum::guarded`.
#[cfg(feature = "axum")]
pub struct Axum;

#[cfg(feature = "axum")]
impl Framework for Axum {
    async fn serve(guard: WebhookGuard, probe: Arc<Probe>) -> SocketAddr {
        use webhook_guard::integrations::axum::guarded;
        let app = ::axum::Router::new().route(
            "/webhooks",
            guarded(guard, move |event: webhook_guard::OwnedEvent| {
                let probe = probe.clone();
                async move { probe.run(event.id(), event.body()).await.into_result() }
            }),
        );
        web::serve(app).await
    }
}

#[cfg(feature = "axum")]
web_cases!(axum, super::Axum);

/// The tower layer around an ordinary axum handler, which answers 200 `handled
/// <id>`, 503 for a retryable failure and 422 for a permanent one.
#[cfg(feature = "tower")]
pub struct Tower;

#[cfg(feature = "tower")]
impl Framework for Tower {
    async fn serve(guard: WebhookGuard, probe: Arc<Probe>) -> SocketAddr {
        use ::axum::extract::State;
        use ::axum::http::StatusCode;
        use ::axum::Extension;
        use webhook_guard::integrations::tower::WebhookGuardLayer;

        async fn on_event(
            State(probe): State<Arc<Probe>>,
            Extension(event): Extension<webhook_guard::OwnedEvent>,
            body: ::axum::body::Bytes,
        ) -> (StatusCode, String) {
            let status = match probe.run(event.id(), &body).await {
                Verdict::Done => StatusCode::OK,
                Verdict::Retryable => StatusCode::SERVICE_UNAVAILABLE,
                Verdict::Permanent => StatusCode::UNPROCESSABLE_ENTITY,
            };
            (status, format!("handled {}", event.id()))
        }
        let app = ::axum::Router::new()
            .route("/webhooks", ::axum::routing::post(on_event))
            .route_layer(WebhookGuardLayer::new(guard))
            .with_state(probe);
        web::serve(app).await
    }

    /// A success passes the inner service's response through.
    fn is_processed(reply: &Reply, id: &str) -> bool {
        reply.status == 200 && reply.body == format!("handled {id}")
    }
}

#[cfg(feature = "tower")]
web_cases!(tower, super::Tower);

/// actix-web 4, `integrations::actix::guarded`, on two workers.
#[cfg(feature = "actix")]
pub struct Actix;

#[cfg(feature = "actix")]
impl Framework for Actix {
    async fn serve(guard: WebhookGuard, probe: Arc<Probe>) -> SocketAddr {
        use webhook_guard::integrations::actix::guarded;
        let webhooks = guarded(guard, move |event: webhook_guard::OwnedEvent| {
            let probe = probe.clone();
            async move { probe.run(event.id(), event.body()).await.into_result() }
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = actix_web::HttpServer::new(move || {
            actix_web::App::new().route("/webhooks", webhooks.route())
        })
        .workers(2)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
        tokio::spawn(server);
        addr
    }
}

#[cfg(feature = "actix")]
web_cases!(actix, super::Actix);
