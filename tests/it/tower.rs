//! The tower layer around an axum route: what is the layer's own (an inner
//! service that panics, errs or asks for a back-off). The scenarios every
//! integration shares are in `web_cases`.

use crate::support::http_client;
use crate::support::web;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post as post_route;
use axum::{Extension, Router};
use webhook_guard::integrations::tower::WebhookGuardLayer;
use webhook_guard::{MemoryStore, OwnedEvent, WebhookGuard};

use http_client::post;
use web::{body, guard, serve, sign, SIGNATURE_HEADER};

#[derive(Clone)]
struct App {
    runs: Arc<AtomicUsize>,
    delay: Duration,
}

/// An ordinary axum handler: it knows nothing of the guard. It answers the status
/// named in the event id (`status_500_...`), panics on `panic_...`, and answers 200
/// otherwise.
async fn on_event(
    State(app): State<App>,
    Extension(event): Extension<OwnedEvent>,
    body: String,
) -> (StatusCode, String) {
    app.runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(app.delay).await;
    if event.id().starts_with("panic_") {
        panic!("the inner service broke on {}", event.id());
    }
    assert!(
        body.contains(event.id()),
        "the inner service sees the raw body"
    );
    let status = event
        .id()
        .strip_prefix("status_")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok())
        .map_or(StatusCode::OK, |code| StatusCode::from_u16(code).unwrap());
    (status, format!("handled {}", event.id()))
}

async fn server(guard: WebhookGuard, delay: Duration) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/webhooks", post_route(on_event))
        .route_layer(WebhookGuardLayer::new(guard))
        .with_state(App {
            runs: runs.clone(),
            delay,
        });
    (serve(app).await, runs)
}

/// A panicking inner service fails the delivery as a retryable failure, answered
/// 500 (as `axum::guarded` answers a panicking handler), and is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_inner_service_is_a_retryable_failure() {
    let guard = guard(MemoryStore::new());
    let (addr, runs) = server(guard.clone(), Duration::ZERO).await;
    let body = body("panic_1");
    let sig = sign(&body);
    let first = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &body).await;
    assert_eq!(first.status, 500, "{first:?}");
    assert_eq!(first.json()["outcome"], "retryable_failure");
    let record = guard.inspect("panic_1").await.unwrap().unwrap();
    assert_eq!(record.state, webhook_guard::store::RecordState::Failed);
    assert!(
        record.history[0]
            .error
            .contains("the inner service panicked"),
        "{record:?}"
    );
    let retry = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &body).await;
    assert_eq!(retry.status, 500);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "retried");
}

/// A service that answers what its closure makes, in `call` itself (a panic there
/// comes before any future exists): for the layer called directly.
#[derive(Clone)]
struct Answers<F>(F);

impl<F, E> tower_service::Service<axum::extract::Request> for Answers<F>
where
    F: FnMut() -> Result<axum::response::Response, E>,
{
    type Response = axum::response::Response;
    type Error = E;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: axum::extract::Request) -> Self::Future {
        std::future::ready((self.0)())
    }
}

/// A panic in the inner service's `call` is caught too: 500, a retryable failure.
/// The layer wraps the service directly (axum's router would defer `call` into a
/// future of its own).
#[tokio::test]
async fn a_service_panicking_in_call_is_a_retryable_failure() {
    use tower_layer::Layer as _;
    use tower_service::Service as _;
    let guard = guard(MemoryStore::new());
    let mut service = WebhookGuardLayer::new(guard.clone()).layer(Answers(
        || -> Result<_, std::convert::Infallible> { panic!("broke before answering") },
    ));
    let body = body("evt_sync");
    let request = axum::http::Request::post("/webhooks")
        .header(SIGNATURE_HEADER, sign(&body))
        .body(axum::body::Body::from(body))
        .unwrap();
    let response = service.call(request).await.unwrap();
    assert_eq!(response.status(), 500);
    let record = guard.inspect("evt_sync").await.unwrap().unwrap();
    assert_eq!(record.state, webhook_guard::store::RecordState::Failed);
    assert!(record.history[0].error.contains("broke before answering"));
}

/// The inner service's own 2xx answer is passed on with the outcome's kind in its
/// extensions, as the layer's own answers carry it, for middleware.
#[tokio::test]
async fn a_passed_on_answer_carries_the_outcome_kind() {
    use tower_layer::Layer as _;
    use tower_service::Service as _;
    let mut service = WebhookGuardLayer::new(guard(MemoryStore::new())).layer(Answers(|| {
        Ok::<_, std::convert::Infallible>(axum::response::Response::new("done".into()))
    }));
    let body = body("evt_kind");
    for expected in [
        webhook_guard::outcome::OutcomeKind::Processed,
        webhook_guard::outcome::OutcomeKind::Duplicate,
    ] {
        let request = axum::http::Request::post("/webhooks")
            .header(SIGNATURE_HEADER, sign(&body))
            .body(axum::body::Body::from(body.clone()))
            .unwrap();
        let response = service.call(request).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response
                .extensions()
                .get::<webhook_guard::outcome::OutcomeKind>(),
            Some(&expected)
        );
    }
}

/// The inner service's error is passed on while the sender should retry, and
/// replaced by the escalation's 200 once the id is escalated (the sender must stop).
#[tokio::test]
async fn an_inner_error_is_answered_200_once_escalated() {
    use tower_layer::Layer as _;
    use tower_service::Service as _;
    let guard = WebhookGuard::builder()
        .namespace("test")
        .store(MemoryStore::new())
        .verifier(web::verifier())
        .event_id(webhook_guard::EventId::json_field(["id"]))
        .escalate_after(2)
        .build()
        .unwrap();
    let mut service =
        WebhookGuardLayer::new(guard).layer(Answers(|| Err(std::io::Error::other("backend gone"))));
    let body = body("evt_err");
    let request = || {
        axum::http::Request::post("/webhooks")
            .header(SIGNATURE_HEADER, sign(&body))
            .body(axum::body::Body::from(body.clone()))
            .unwrap()
    };
    let first = service.call(request()).await;
    assert_eq!(first.unwrap_err().to_string(), "backend gone");
    let second = service
        .call(request())
        .await
        .expect("an answer, not the error");
    assert_eq!(second.status(), 200);
    assert_eq!(
        second
            .extensions()
            .get::<webhook_guard::outcome::OutcomeKind>(),
        Some(&webhook_guard::outcome::OutcomeKind::Escalated)
    );
}

/// The inner service's `Retry-After` is passed on with the retryable failure's 500.
#[tokio::test]
async fn an_inner_retry_after_is_passed_on() {
    use tower_layer::Layer as _;
    use tower_service::Service as _;
    let mut service = WebhookGuardLayer::new(guard(MemoryStore::new())).layer(Answers(|| {
        // Asks to be left alone for two minutes.
        let mut response = axum::response::Response::new("busy".into());
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        (response.headers_mut()).insert("retry-after", axum::http::HeaderValue::from_static("120"));
        Ok::<_, std::convert::Infallible>(response)
    }));
    let body = body("evt_busy");
    let request = axum::http::Request::post("/webhooks")
        .header(SIGNATURE_HEADER, sign(&body))
        .body(axum::body::Body::from(body.clone()))
        .unwrap();
    let response = service.call(request).await.unwrap();
    assert_eq!(response.status(), 500);
    assert_eq!(response.headers()["retry-after"], "120");
}
