//! Every preset's handshake answered by the guard through the web integrations
//! (axum for each; tower, actix-web and Lambda for one each), over real HTTP where
//! the integration serves it: the handshake's own status, content type and body,
//! the handler never run, the store never touched (the guard's store is down, so
//! any claim would answer 503), and a handshake with a bad signature refused. Then
//! the request context (method and target) reaching the presets that sign it
//! (HubSpot, Twilio) through axum.

use crate::support::http_client::{post, request, Reply};
use crate::support::web::{serve, DownStore};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::Router;
use chrono::Utc;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use webhook_guard::integrations::axum::guarded;
use webhook_guard::verify::{Dropbox, HubSpot, Meta, Slack, Twilio, Twitch, Verifier, Zoom};
use webhook_guard::{MemoryStore, OwnedEvent, ProcessedStore, WebhookGuard};

/// A guard over `store` with `verifier`.
fn guard(store: impl ProcessedStore, verifier: impl Verifier) -> WebhookGuard {
    WebhookGuard::builder()
        .namespace("handshakes")
        .store(store)
        .verifier(verifier)
        .build()
        .unwrap()
}

/// An axum app serving `verifier` at `/hook` on a store that is down, and the
/// count of its handler's runs.
async fn app(verifier: impl Verifier) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let route = guarded(guard(DownStore, verifier), move |_event: OwnedEvent| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok(()) }
    });
    (serve(Router::new().route("/hook", route)).await, runs)
}

/// Owned header pairs as the client takes them.
fn pairs<'a>(headers: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    headers.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn assert_answer(reply: &Reply, content_type: &str, body: &str) {
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some(content_type),
        "{reply:?}"
    );
    assert_eq!(reply.body, body);
}

fn assert_refused(reply: &Reply) {
    assert_eq!(reply.status, 401, "{reply:?}");
    assert_eq!(reply.json()["reason"], "signature_mismatch", "{reply:?}");
}

const TEXT: &str = "text/plain; charset=utf-8";

#[tokio::test]
async fn slack_url_verification_is_answered_with_its_challenge() {
    let slack = Slack::new(["slack-signing-secret-0123456789abcdef"]).unwrap();
    let (addr, runs) = app(slack.clone()).await;
    let body = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let now = Utc::now().timestamp();
    let reply = post(addr, "/hook", &pairs(&slack.sign_headers(now, body)), body).await;
    assert_answer(
        &reply,
        TEXT,
        "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
    );
    let forged = Slack::new(["another-secret-0123456789abcdef01234"])
        .unwrap()
        .sign_headers(now, body);
    assert_refused(&post(addr, "/hook", &pairs(&forged), body).await);
    // A signed event is no handshake: it goes to the store (down here: 503).
    let event = br#"{"type":"event_callback","event_id":"Ev1"}"#;
    let reply = post(
        addr,
        "/hook",
        &pairs(&slack.sign_headers(now, event)),
        event,
    )
    .await;
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn zoom_url_validation_is_answered_with_the_encrypted_token() {
    let zoom = Zoom::new(["zoom-secret-token"]).unwrap();
    let (addr, runs) = app(zoom.clone()).await;
    let body = br#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
    let now = Utc::now().timestamp();
    let reply = post(addr, "/hook", &pairs(&zoom.sign_headers(now, body)), body).await;
    // Zoom's own recipe: HMAC-SHA256 of the plain token under the secret token, hex.
    let mut mac = Hmac::<Sha256>::new_from_slice(b"zoom-secret-token").unwrap();
    mac.update(b"qgg8vlvZRS6UYooatFL8Aw");
    let encrypted = hex::encode(mac.finalize().into_bytes());
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(
        reply.json(),
        serde_json::json!({"plainToken": "qgg8vlvZRS6UYooatFL8Aw", "encryptedToken": encrypted})
    );
    let forged = Zoom::new(["not-the-zoom-secret-token"])
        .unwrap()
        .sign_headers(now, body);
    assert_refused(&post(addr, "/hook", &pairs(&forged), body).await);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn meta_subscription_get_is_answered_with_its_challenge() {
    let meta = Meta::new(["meta-app-secret-0123"])
        .unwrap()
        .verify_token("verify-me");
    let (addr, runs) = app(meta).await;
    let check = "/hook?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=verify-me";
    let reply = request(addr, "GET", check, &[], b"").await;
    assert_answer(&reply, TEXT, "1158201444");
    let wrong = "/hook?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=verify-you";
    assert_refused(&request(addr, "GET", wrong, &[], b"").await);
    // A GET that is no subscription check is refused too.
    let reply = request(addr, "GET", "/hook", &[], b"").await;
    assert_eq!(reply.status, 401, "{reply:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn dropbox_verification_get_is_answered_with_its_challenge_as_plain_text() {
    let dropbox = Dropbox::new(["dbx_app_secret1"]).unwrap();
    let (addr, runs) = app(dropbox.clone()).await;
    let reply = request(addr, "GET", "/hook?challenge=abc123", &[], b"").await;
    assert_answer(&reply, TEXT, "abc123");
    assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
    // Markup, a quote, an empty or absurdly long challenge: never echoed.
    let long = format!("/hook?challenge={}", "a".repeat(1025));
    for target in [
        "/hook?challenge=%3Cscript%3Ealert(1)%3C%2Fscript%3E",
        "/hook?challenge=%22onload%3D",
        "/hook?challenge=",
        "/hook",
        long.as_str(),
    ] {
        let reply = request(addr, "GET", target, &[], b"").await;
        assert_eq!(reply.status, 401, "{target}: {reply:?}");
        assert_eq!(reply.json()["reason"], "malformed_query", "{target}");
        assert!(!reply.body.contains("script"), "{reply:?}");
    }
    // A signed notification is no handshake: it goes to the store (down: 503).
    let body = br#"{"list_folder":{"accounts":["dbid:AAH4f99T0taONIb"]}}"#;
    let sig = dropbox.sign(body);
    let reply = post(
        addr,
        "/hook",
        &[("X-Dropbox-Signature", sig.as_str())],
        body,
    )
    .await;
    assert_eq!(reply.status, 503, "{reply:?}");
    let forged = Dropbox::new(["another_secret1"]).unwrap().sign(body);
    assert_refused(
        &post(
            addr,
            "/hook",
            &[("X-Dropbox-Signature", forged.as_str())],
            body,
        )
        .await,
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn twitch_challenge_is_answered_and_a_forged_one_refused() {
    let twitch = Twitch::new(["twitch-secret-1"]).unwrap();
    let (addr, runs) = app(twitch.clone()).await;
    let body = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"id":"f1c2a387-161a-49f9-a165-0f21d7a4e1c4","status":"webhook_callback_verification_pending","type":"channel.follow","version":"1"}}"#;
    let at = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    let id = "e76c6bd4-55c9-4987-8304-da1588d8988b";
    let headers = twitch.sign_headers(id, &at, "webhook_callback_verification", body);
    let reply = post(addr, "/hook", &pairs(&headers), body).await;
    assert_answer(&reply, TEXT, "pogchamp-kappa-360noscope-vohiyo");
    let forged = Twitch::new(["twitch-secret-2"]).unwrap().sign_headers(
        id,
        &at,
        "webhook_callback_verification",
        body,
    );
    assert_refused(&post(addr, "/hook", &pairs(&forged), body).await);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[cfg(feature = "ed25519")]
#[tokio::test]
async fn discord_ping_is_answered_with_a_pong() {
    use webhook_guard::verify::Discord;
    // RFC 8032's first key pair, and its second key for the forgery.
    let seed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    let other = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb";
    let (addr, runs) = app(Discord::new([Discord::public_key(seed).unwrap()]).unwrap()).await;
    let ping = br#"{"id":"1105219734829346837","type":1,"application_id":"1","version":1}"#;
    let now = Utc::now().timestamp();
    let reply = post(
        addr,
        "/hook",
        &pairs(&Discord::sign_headers(seed, now, ping).unwrap()),
        ping,
    )
    .await;
    assert_answer(&reply, "application/json", r#"{"type":1}"#);
    let forged = Discord::sign_headers(other, now, ping).unwrap();
    assert_refused(&post(addr, "/hook", &pairs(&forged), ping).await);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Through the tower layer: the inner service is never called for a handshake.
#[cfg(feature = "tower")]
#[tokio::test]
async fn a_handshake_through_the_tower_layer_never_reaches_the_inner_service() {
    use webhook_guard::integrations::tower::WebhookGuardLayer;
    let twitch = Twitch::new(["twitch-secret-1"]).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let inner = axum::routing::post(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        async { "inner" }
    });
    let app = Router::new()
        .route("/hook", inner)
        .route_layer(WebhookGuardLayer::new(guard(DownStore, twitch.clone())));
    let addr = serve(app).await;
    let body = br#"{"challenge":"tower-challenge-1","subscription":{"id":"s","status":"webhook_callback_verification_pending","type":"channel.follow"}}"#;
    let at = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    let headers = twitch.sign_headers("m-1", &at, "webhook_callback_verification", body);
    let reply = post(addr, "/hook", &pairs(&headers), body).await;
    assert_answer(&reply, TEXT, "tower-challenge-1");
    let forged = Twitch::new(["another-secret"]).unwrap().sign_headers(
        "m-1",
        &at,
        "webhook_callback_verification",
        body,
    );
    assert_refused(&post(addr, "/hook", &pairs(&forged), body).await);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Through actix-web: its route takes the `GET`, and its request gives the guard
/// the method and query.
#[cfg(feature = "actix")]
#[test]
fn a_subscription_get_through_actix_is_answered() {
    actix_web::rt::System::new().block_on(actix_get());
}

#[cfg(feature = "actix")]
async fn actix_get() {
    use actix_web::{test, App};
    use webhook_guard::integrations::actix;
    let meta = Meta::new(["meta-app-secret-0123"])
        .unwrap()
        .verify_token("verify-me");
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let route = actix::guarded(guard(DownStore, meta), move |_event: OwnedEvent| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok(()) }
    });
    let app = test::init_service(App::new().route("/hook", route.route())).await;
    let get = |target: &str| test::TestRequest::get().uri(target).to_request();
    let ok = test::call_service(
        &app,
        get("/hook?hub.mode=subscribe&hub.challenge=42&hub.verify_token=verify-me"),
    )
    .await;
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers().get("content-type").unwrap(), TEXT);
    assert_eq!(test::read_body(ok).await, "42");
    let wrong = test::call_service(
        &app,
        get("/hook?hub.mode=subscribe&hub.challenge=42&hub.verify_token=nope"),
    )
    .await;
    assert_eq!(wrong.status(), 401);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Through the Lambda integration: the event's method and path reach the guard.
#[cfg(feature = "lambda")]
#[tokio::test]
async fn a_subscription_get_through_lambda_is_answered() {
    use webhook_guard::integrations::lambda;
    let meta = Meta::new(["meta-app-secret-0123"])
        .unwrap()
        .verify_token("verify-me");
    let guard = guard(DownStore, meta);
    let get = |target: &str| {
        http::Request::get(target)
            .body(lambda_http::Body::Empty)
            .unwrap()
    };
    let never = |_event: OwnedEvent| async { panic!("a handshake runs no handler") };
    let ok = lambda::handle_request(
        &guard,
        get("/hook?hub.mode=subscribe&hub.challenge=42&hub.verify_token=verify-me"),
        never,
    )
    .await;
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["content-type"], TEXT);
    assert_eq!(ok.body().as_ref(), b"42");
    let wrong = lambda::handle_request(
        &guard,
        get("/hook?hub.mode=subscribe&hub.challenge=42&hub.verify_token=no"),
        never,
    )
    .await;
    assert_eq!(wrong.status(), 401);
}

/// HubSpot signs the method and the URI with its query: through axum, a delivery
/// verifies against the public URL the guard is given plus the query the request
/// carries, and is processed once.
#[tokio::test]
async fn hubspot_and_twilio_see_the_method_and_query_through_axum() {
    let hubspot = HubSpot::new(
        "https://hooks.example.com/public/hubspot",
        ["hs-client-secret"],
    )
    .unwrap();
    let twilio = Twilio::new(
        "https://hooks.example.com/public/twilio",
        ["twilio-auth-token"],
    )
    .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let route = |verifier: Box<dyn Verifier>| {
        let counter = runs.clone();
        let guard = WebhookGuard::builder()
            .store(MemoryStore::new())
            .verifier(verifier)
            .build()
            .unwrap();
        guarded(guard, move |_event: OwnedEvent| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }
        })
    };
    let app = Router::new()
        .route("/hubspot", route(Box::new(hubspot.clone())))
        .route("/twilio", route(Box::new(twilio.clone())));
    let addr = serve(app).await;

    let body = br#"[{"eventId":100,"subscriptionId":7,"portalId":62515,"occurredAt":1700000000000,"subscriptionType":"contact.creation","attemptNumber":0,"objectId":123}]"#;
    let ms = Utc::now().timestamp_millis();
    let headers = hubspot.sign_headers(
        "POST",
        "https://hooks.example.com/public/hubspot?portal=62515",
        body,
        ms,
    );
    let reply = post(addr, "/hubspot?portal=62515", &pairs(&headers), body).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.json()["outcome"], "processed");
    // The same signature under another query is refused.
    let reply = post(addr, "/hubspot?portal=62516", &pairs(&headers), body).await;
    assert_eq!(reply.status, 401, "{reply:?}");

    let form = b"Body=Hello&From=%2B14158675310&MessageSid=SM1";
    let signature = twilio.sign("https://hooks.example.com/public/twilio?tenant=a", form);
    let headers = [
        ("X-Twilio-Signature", signature.as_str()),
        ("I-Twilio-Idempotency-Token", "idem-1"),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    let reply = post(addr, "/twilio?tenant=a", &headers, form).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.json()["id"], "idem-1");
    let reply = post(addr, "/twilio?tenant=b", &headers, form).await;
    assert_eq!(reply.status, 401, "{reply:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
