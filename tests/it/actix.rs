//! What is actix-web's own: its `HeaderMap` as `Headers`, and handlers that
//! outlive the server's worker threads. The scenarios every integration shares are
//! in `web_cases`.

use crate::support::http_client::post;
use crate::support::web::{body, sign, verifier, SIGNATURE_HEADER};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use webhook_guard::integrations::actix::guarded;
use webhook_guard::store::RecordState;
use webhook_guard::{EventId, Headers, MemoryStore, OwnedEvent, WebhookGuard};

#[test]
fn actix_header_map_lookup_is_case_insensitive() {
    let mut map = HeaderMap::new();
    let name = HeaderName::from_static("x-signature");
    map.append(name.clone(), HeaderValue::from_static("first"));
    map.append(name, HeaderValue::from_static("second"));
    map.insert(
        HeaderName::from_static("bin"),
        HeaderValue::from_bytes(b"\xff").unwrap(),
    );
    assert_eq!(map.get_str("X-Signature"), Some("first"));
    assert_eq!(map.get_bytes("BIN"), Some(&b"\xff"[..]));
    assert_eq!(map.get_str("bin"), None, "not UTF-8");
    assert_eq!(map.get_str("missing"), None);
    assert_eq!(map.get_str("not a header name"), None);
}

/// A handler answered `InProgress` at the deadline keeps running after the server
/// stopped (its worker threads and their runtimes are gone): it runs on the runtime
/// `guarded` was built on, and `drain` waits for it to end and record. Under
/// `#[tokio::main]`:
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_outlive_the_workers_and_drain_waits_for_them() {
    outlive_the_workers().await;
}

/// The same under actix's own runtime (what `#[actix_web::main]` runs): one
/// thread, which the handlers share with the main task.
#[test]
fn handlers_outlive_the_workers_under_actix_rt() {
    actix_web::rt::System::new().block_on(outlive_the_workers());
}

async fn outlive_the_workers() {
    let guard = WebhookGuard::builder()
        .namespace("test")
        .store(MemoryStore::new())
        .verifier(verifier())
        .event_id(EventId::json_field(["id"]))
        .answer_deadline(Duration::from_millis(200))
        .build()
        .unwrap();
    let release = Arc::new(tokio::sync::Notify::new());
    let finished = Arc::new(AtomicUsize::new(0));
    let webhooks = guarded(guard.clone(), {
        let (release, finished) = (release.clone(), finished.clone());
        move |_event: OwnedEvent| {
            let (release, finished) = (release.clone(), finished.clone());
            async move {
                release.notified().await;
                finished.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }
    });
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new().route("/webhooks", webhooks.route())
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .listen(listener)
    .unwrap()
    .run();
    let handle = server.handle();
    let running = tokio::spawn(server);

    let body = body("evt_outlives");
    let reply = post(
        addr,
        "/webhooks",
        &[(SIGNATURE_HEADER, &sign(&body))],
        &body,
    )
    .await;
    assert_eq!(reply.status, 409, "{reply:?}");
    assert_eq!(reply.json()["outcome"], "in_progress");

    handle.stop(true).await;
    running.await.unwrap().unwrap();
    // Time for the worker thread to end and drop its runtime.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(finished.load(Ordering::SeqCst), 0, "still waiting");

    release.notify_one();
    assert_eq!(guard.drain(Duration::from_secs(5)).await, 0);
    assert_eq!(finished.load(Ordering::SeqCst), 1, "it ran to its end");
    let record = guard.inspect("evt_outlives").await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
}
