//! The operator console's router without a browser: each authenticator, content
//! negotiation, CSRF per operator and per site, a store that cannot list, bodies
//! opt-in. (The browser test, tests/console_browser.rs, drives the pages.)

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;
use tower_service::Service;
use webhook_guard::console::{self, Auth, Console, Operator};
use webhook_guard::store::ProcessedStore;
use webhook_guard::verify::HmacSha256Header;
use webhook_guard::{EventId, MemoryStore, Outcome, WebhookGuard};

const TOKEN: &str = "a-bearer-token-for-scripts";

fn guard_on(store: impl ProcessedStore, inbox: Option<MemoryStore>) -> WebhookGuard {
    let mut builder = WebhookGuard::builder()
        .store(store)
        .verifier(HmacSha256Header::new("X-Signature", ["s3cret-0123456789abcdef"]).unwrap())
        .event_id(EventId::json_field(["id"]))
        .namespace("shop");
    if let Some(inbox) = inbox {
        builder = builder.inbox(inbox);
    }
    builder.build().unwrap()
}

async fn deliver(guard: &WebhookGuard, id: &str) -> Outcome {
    let body = format!(
        r#"{{"id":"{id}","type":"order.paid","secret_note":"{}"}}"#,
        "x".repeat(40)
    );
    let verifier = HmacSha256Header::new("X-Signature", ["s3cret-0123456789abcdef"]).unwrap();
    let signature = verifier.sign(body.as_bytes());
    let headers = [("X-Signature", signature.as_str())];
    guard
        .handle(&headers, body.as_bytes(), |_| async { Ok(()) })
        .await
}

async fn send(router: &Router, request: Request) -> (StatusCode, http::HeaderMap, String) {
    let response = router.clone().call(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

fn get(path: &str) -> http::request::Builder {
    Request::builder().method("GET").uri(path)
}

fn form(path: &str) -> http::request::Builder {
    Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/x-www-form-urlencoded")
}

fn bearer(builder: http::request::Builder) -> http::request::Builder {
    builder.header("authorization", format!("Bearer {TOKEN}"))
}

#[tokio::test]
async fn a_bearer_token_guards_every_route_and_scripts_get_json() {
    let guard = guard_on(MemoryStore::new(), None);
    assert!(matches!(
        deliver(&guard, "ord_1").await,
        Outcome::Processed { .. }
    ));
    let router = console::router(guard, Auth::bearer(TOKEN).unwrap()).unwrap();

    for path in [
        "/overview",
        "/records",
        "/record?id=ord_1",
        "/style.css",
        "/",
    ] {
        let (status, headers, _) = send(&router, get(path).body(Body::empty()).unwrap()).await;
        assert_eq!(status, 401, "{path}");
        assert_eq!(
            headers["www-authenticate"],
            r#"Bearer realm="webhook-guard console""#
        );
        assert_eq!(
            headers["content-security-policy"],
            console::CONTENT_SECURITY_POLICY_VALUE
        );
        let wrong = get(path)
            .header("authorization", format!("Bearer {TOKEN}x"))
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&router, wrong).await.0, 401, "{path}");
    }

    // `?format=json` and `Accept: application/json` answer the same data.
    let (status, headers, body) = send(
        &router,
        bearer(get("/overview?format=json"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-frame-options"], "DENY");
    let overview: Value = serde_json::from_str(&body).unwrap();
    let hour = &overview["windows"][0]["counts"];
    let completed = hour
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["state"] == "completed");
    assert_eq!(completed.unwrap()["n"], 1);
    let (_, headers, body) = send(
        &router,
        bearer(get("/records?state=completed"))
            .header("accept", "application/json")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(headers["content-type"], "application/json");
    let list: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["rows"][0]["id"], "ord_1");
    // A browser's Accept gets the page.
    let (_, headers, body) = send(
        &router,
        bearer(get("/records"))
            .header("accept", "text/html,application/json;q=0.9")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert!(body.contains("ord_1"));
    // A bad filter is a clear 400.
    let (status, _, body) = send(
        &router,
        bearer(get("/records?state=bogus&format=json"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    assert!(body.contains("unknown state"), "{body}");
}

/// The host's middleware: `x-user` names the operator; without it, 403.
async fn host_login(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match user {
        Some(user) => {
            request.extensions_mut().insert(Operator::new(user));
            next.run(request).await
        }
        None => StatusCode::FORBIDDEN.into_response(),
    }
}

async fn csrf_of(router: &Router, user: &str) -> String {
    let (_, _, body) = send(
        router,
        get("/overview?format=json")
            .header("x-user", user)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    serde_json::from_str::<Value>(&body).unwrap()["csrf_token"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn the_hosts_middleware_names_the_operator_and_csrf_tokens_are_theirs() {
    let guard = guard_on(MemoryStore::new(), None);
    deliver(&guard, "ord_1").await;
    let router = console::router(
        guard.clone(),
        Auth::host_middleware(axum::middleware::from_fn(host_login)),
    )
    .unwrap();
    let (status, headers, _) = send(&router, get("/overview").body(Body::empty()).unwrap()).await;
    assert_eq!(status, 403);
    assert!(headers.contains_key("content-security-policy"));

    let alice = csrf_of(&router, "alice").await;
    let bob = csrf_of(&router, "bob").await;
    assert_ne!(alice, bob);
    let forget = |user: &str, token: &str, site: Option<&str>| {
        let mut builder = form("/forget").header("x-user", user);
        if let Some(site) = site {
            builder = builder.header("sec-fetch-site", site);
        }
        builder
            .body(Body::from(format!("id=ord_1&csrf={token}&format=json")))
            .unwrap()
    };
    // Bob with Alice's token, no token, a cross-site post with a good token: refused.
    assert_eq!(send(&router, forget("bob", &alice, None)).await.0, 403);
    assert_eq!(send(&router, forget("alice", "", None)).await.0, 403);
    assert_eq!(
        send(&router, forget("alice", &alice, Some("cross-site")))
            .await
            .0,
        403
    );
    assert!(guard.inspect("ord_1").await.unwrap().is_some());
    // GET does not act.
    let (status, _, _) = send(
        &router,
        get(&format!("/forget?id=ord_1&csrf={alice}"))
            .header("x-user", "alice")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, 405);
    // Alice's own token, same origin: forgotten.
    let (status, _, body) = send(&router, forget("alice", &alice, Some("same-origin"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["result"],
        "done"
    );
    assert!(guard.inspect("ord_1").await.unwrap().is_none());
}

#[tokio::test]
async fn a_store_that_cannot_list_still_shows_records_and_says_so() {
    let guard = guard_on(
        // A store written against the core contract only: no listing.
        crate::support::counted::Counted::<MemoryStore>::default(),
        None,
    );
    deliver(&guard, "ord_1").await;
    let router = console::router(guard, Auth::bearer(TOKEN).unwrap()).unwrap();
    let (status, _, body) = send(
        &router,
        bearer(get("/overview")).body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("this store does not list records"), "{body}");
    let (status, _, body) = send(
        &router,
        bearer(get("/records")).body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, 501);
    assert!(body.contains("Cannot list: this store does not list records"));
    let (status, _, body) = send(
        &router,
        bearer(get("/record?id=ord_1&format=json"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["record"]["state"],
        "completed"
    );
}

#[tokio::test]
async fn bodies_are_shown_only_when_the_host_enables_them_and_cut_at_the_limit() {
    let inbox = MemoryStore::new();
    let guard = guard_on(MemoryStore::new(), Some(inbox));
    let body = r#"{"id":"ord_9","type":"order.paid","note":"<b>bold</b>"}"#;
    let signature = HmacSha256Header::new("X-Signature", ["s3cret-0123456789abcdef"])
        .unwrap()
        .sign(body.as_bytes());
    let accepted = guard
        .accept(&[("X-Signature", signature.as_str())], body.as_bytes())
        .await;
    assert!(matches!(accepted, Outcome::Accepted { .. }), "{accepted:?}");

    let hidden = console::router(guard.clone(), Auth::bearer(TOKEN).unwrap()).unwrap();
    let (_, _, page) = send(
        &hidden,
        bearer(get("/record?id=ord_9")).body(Body::empty()).unwrap(),
    )
    .await;
    assert!(page.contains("Bodies are not shown"));
    assert!(!page.contains("order.paid\""));
    let (_, _, json) = send(
        &hidden,
        bearer(get("/record?id=ord_9&format=json"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let json: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["inbox"]["state"], "pending");
    assert!(json["inbox"]["body"].is_null());

    let shown = Console::new(guard.clone())
        .show_bodies(true)
        .router(Auth::bearer(TOKEN).unwrap())
        .unwrap();
    let (_, _, page) = send(
        &shown,
        bearer(get("/record?id=ord_9")).body(Body::empty()).unwrap(),
    )
    .await;
    // Pretty-printed, and escaped.
    assert!(
        page.contains("  &quot;note&quot;: &quot;&lt;b&gt;bold&lt;/b&gt;&quot;"),
        "{page}"
    );
    let cut = Console::new(guard)
        .show_bodies(true)
        .body_limit(10)
        .router(Auth::bearer(TOKEN).unwrap())
        .unwrap();
    let (_, _, json) = send(
        &cut,
        bearer(get("/record?id=ord_9&format=json"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let json: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["inbox"]["body"]["cut"], true);
    assert_eq!(json["inbox"]["body"]["text"].as_str().unwrap().len(), 10);
}

#[test]
fn a_console_is_not_built_on_weak_settings() {
    let guard = guard_on(MemoryStore::new(), None);
    assert!(Auth::bearer("short").is_err());
    assert!(Auth::basic("ops", "short").is_err());
    let error = Console::new(guard)
        .page_size(0)
        .router(Auth::bearer(TOKEN).unwrap())
        .unwrap_err();
    assert!(error.to_string().contains("page size"), "{error}");
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn the_console_lists_a_durable_store_through_its_index() {
    use webhook_guard::store::SqliteStore;

    let path = std::env::temp_dir().join(format!("wg-console-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let store = SqliteStore::open(&path).await.unwrap();
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store)
        .verifier(HmacSha256Header::new("X-Signature", ["s3cret-0123456789abcdef"]).unwrap())
        .event_id(EventId::json_field(["id"]))
        .namespace("shop")
        .build()
        .unwrap();
    for id in ["ord_a1", "ord_a2", "ord_b1"] {
        assert!(matches!(
            deliver(&guard, id).await,
            Outcome::Processed { .. }
        ));
    }
    let router = Console::new(guard)
        .page_size(2)
        .router(Auth::bearer(TOKEN).unwrap())
        .unwrap();
    let json = |path: &str| {
        let router = router.clone();
        let path = path.to_owned();
        async move {
            let (status, _, body) =
                send(&router, bearer(get(&path)).body(Body::empty()).unwrap()).await;
            assert_eq!(status, 200, "{path}: {body}");
            serde_json::from_str::<Value>(&body).unwrap()
        }
    };
    // Newest first, two a page, then the cursor to the rest.
    let first = json("/records?state=completed&format=json").await;
    let ids: Vec<_> = first["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(ids, ["ord_b1", "ord_a2"]);
    let next = first["next"].as_str().expect("a next page");
    let second = json(&format!(
        "/records?state=completed&format=json&after={next}"
    ))
    .await;
    assert_eq!(second["rows"][0]["id"], "ord_a1");
    assert!(second["next"].is_null());
    // The id prefix, and the overview's count.
    let prefixed = json("/records?prefix=ord_a&format=json").await;
    assert_eq!(prefixed["rows"].as_array().unwrap().len(), 2);
    let overview = json("/overview?format=json").await;
    let day = overview["windows"][1]["counts"].as_array().unwrap();
    let completed = day.iter().find(|c| c["state"] == "completed").unwrap();
    assert_eq!(completed["n"], 3);
    assert_eq!(overview["dead_letters"]["n"], 0);
    // A cursor the console did not make is a clear 400.
    let (status, _, _) = send(
        &router,
        bearer(get("/records?after=nonsense&format=json"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    crate::support::backends::remove_sqlite(&path);
}
