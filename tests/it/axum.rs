//! The axum integration, driven through real HTTP on loopback.

use crate::support::http_client;
use crate::support::web;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use webhook_guard::integrations::axum::guarded;
use webhook_guard::{HandlerError, MemoryStore, OwnedEvent, WebhookGuard};

use http_client::{post, post_chunked};
use web::{body, guard, serve, sign, DownStore, SIGNATURE_HEADER};

/// A server whose handler counts its runs, sleeping `delay` in each, and fails
/// (retryably) for ids starting with `fail`.
async fn server(guard: WebhookGuard, delay: Duration) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new().route(
        "/webhooks",
        guarded(guard, move |event: OwnedEvent| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                let payload: serde_json::Value = event.json()?;
                assert_eq!(payload["id"], event.id());
                if event.id().starts_with("fail") {
                    return Err(HandlerError::retryable("downstream is down"));
                }
                Ok(())
            }
        }),
    );
    (serve(app).await, runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_delivery_runs_once_and_duplicates_are_acknowledged() {
    let (addr, runs) = server(guard(MemoryStore::new()), Duration::ZERO).await;
    let body = body("evt_1");
    let sig = sign(&body);

    let first = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &body).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("content-type"), Some("application/json"));
    let json = first.json();
    assert_eq!(json["outcome"], "processed");
    assert_eq!(json["id"], "evt_1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let again = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &body).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["outcome"], "duplicate");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a duplicate must not run the handler"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_signature_is_401_and_runs_nothing() {
    let (addr, runs) = server(guard(MemoryStore::new()), Duration::ZERO).await;
    let body = body("evt_1");
    let forged = sign(b"another body");
    let reply = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &forged)], &body).await;
    assert_eq!(reply.status, 401);
    let json = reply.json();
    assert_eq!(json["outcome"], "rejected");
    assert!(json.get("id").is_none());
    assert!(!reply.body.contains("whsec"), "no secret in the answer");

    let unsigned = post(addr, "/webhooks", &[], &body).await;
    assert_eq!(unsigned.status, 401);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_is_refused_without_running_the_handler() {
    let (addr, runs) = server(guard(MemoryStore::new()), Duration::ZERO).await;
    let mut big = body("evt_big");
    big.resize(web::LIMIT * 4, b' ');
    let sig = sign(&big);

    // Declared too large: refused before the body is read.
    let declared = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &big).await;
    assert_eq!(declared.status, 400, "{declared:?}");
    assert_eq!(declared.json()["reason"], "body_too_large");

    // Streamed without a length: refused once it passes the limit.
    let streamed = post_chunked(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &big, 256).await;
    assert_eq!(streamed.status, 400, "{streamed:?}");
    assert_eq!(streamed.json()["reason"], "body_too_large");
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Exactly at the limit is fine.
    let mut fits = body("evt_fits");
    fits.resize(web::LIMIT, b' ');
    let sig = sign(&fits);
    let ok = post_chunked(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &fits, 100).await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_is_503_with_retry_after() {
    let (addr, runs) = server(guard(DownStore), Duration::ZERO).await;
    let body = body("evt_1");
    let reply = post(
        addr,
        "/webhooks",
        &[(SIGNATURE_HEADER, &sign(&body))],
        &body,
    )
    .await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("retry-after"), Some("5"));
    let json = reply.json();
    assert_eq!(json["outcome"], "store_unavailable");
    assert!(
        !reply.body.contains("connection refused"),
        "no internals in the answer"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_run_the_handler_once() {
    let (addr, runs) = server(guard(MemoryStore::new()), Duration::from_millis(300)).await;
    let body = body("evt_race");
    let sig = sign(&body);
    let headers = [(SIGNATURE_HEADER, sig.as_str())];
    let replies =
        futures_util::future::join_all((0..8).map(|_| post(addr, "/webhooks", &headers, &body)))
            .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let processed = replies.iter().filter(|r| r.status == 200).count();
    let in_progress: Vec<_> = replies.iter().filter(|r| r.status == 409).collect();
    assert_eq!(processed + in_progress.len(), 8, "{replies:?}");
    assert!(processed >= 1);
    assert!(
        !in_progress.is_empty(),
        "the duplicates arrived while the first ran (300 ms): {replies:?}"
    );
    for reply in in_progress {
        assert_eq!(reply.json()["outcome"], "in_progress");
        assert!(reply.header("retry-after").is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_failure_is_500_and_the_retry_runs_again() {
    let (addr, runs) = server(guard(MemoryStore::new()), Duration::ZERO).await;
    let body = body("fail_1");
    let sig = sign(&body);
    let first = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &body).await;
    assert_eq!(first.status, 500);
    assert_eq!(first.json()["outcome"], "retryable_failure");
    assert!(
        !first.body.contains("downstream"),
        "no error message in the answer"
    );
    let second = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &body).await;
    assert_eq!(second.status, 500);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
