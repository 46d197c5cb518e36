//! `route::Router`: typed dispatch on the type each preset's provider gives (a body
//! field, GitHub's header and action, Shopify's topic), the fallback, the policies
//! for a payload that does not fit, and a routed handler's panics and errors, through
//! `handle`, `handle_owned`, `handle_spawned`, an inbox worker and axum.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::Deserialize;
use webhook_guard::meta::TypeSource;
use webhook_guard::route::{InvalidPayload, Router};
use webhook_guard::store::RecordState;
use webhook_guard::verify::{
    GitHub, Jamm, Linear, Paddle, Shopify, Slack, StandardWebhooks, Stripe, Verifier,
};
use webhook_guard::{Event, HandlerError, MemoryStore, Outcome, OwnedEvent, WebhookGuard};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn guard(verifier: impl Verifier) -> WebhookGuard {
    // One sample body is sent under several ids: keyed on the id alone (content
    // keys would answer the copies `Duplicate`; tests/it/replay.rs covers them).
    WebhookGuard::builder()
        .namespace("routing")
        .store(MemoryStore::new())
        .verifier(verifier)
        .content_keys(false)
        .build()
        .unwrap()
}

/// What ran, in order: `route:id` for each handler call.
#[derive(Clone, Default)]
struct Ran(Arc<Mutex<Vec<String>>>);

impl Ran {
    fn push(&self, what: impl Into<String>) {
        self.0.lock().unwrap().push(what.into());
    }
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn stripe_body(id: &str, kind: &str, amount: &str) -> Vec<u8> {
    format!(
        r#"{{"id":"{id}","object":"event","type":"{kind}","data":{{"object":{{"id":"pi_{id}","amount":{amount},"customer":"cus_\u00e9"}}}}}}"#
    )
    .into_bytes()
}

fn stripe_headers(body: &[u8]) -> Vec<(&'static str, String)> {
    let signer = Stripe::new([SECRET]).unwrap();
    vec![("Stripe-Signature", signer.sign(body, now()))]
}

/// A Stripe event whose strings borrow the body where they can.
#[derive(Deserialize)]
struct Borrowed<'a> {
    #[serde(borrow)]
    data: BorrowedData<'a>,
}

#[derive(Deserialize)]
struct BorrowedData<'a> {
    #[serde(borrow)]
    object: BorrowedIntent<'a>,
}

#[derive(Deserialize)]
struct BorrowedIntent<'a> {
    id: &'a str,
    amount: u64,
    #[serde(borrow)]
    customer: Cow<'a, str>,
}

/// The same, owned: for events that own their body.
#[derive(Deserialize)]
struct Owned {
    data: OwnedData,
}

#[derive(Deserialize)]
struct OwnedData {
    object: OwnedIntent,
}

#[derive(Deserialize)]
struct OwnedIntent {
    id: String,
    amount: u64,
}

/// `handle`: the router is built in the call (it costs nothing), so payloads borrow
/// the body; an unknown type goes to the fallback and is processed.
#[tokio::test]
async fn handle_routes_stripe_types_to_typed_handlers_with_borrowed_payloads() {
    let guard = guard(Stripe::new([SECRET]).unwrap());
    let ran = Ran::default();
    let deliver = |body: Vec<u8>| {
        let (guard, ran) = (guard.clone(), ran.clone());
        async move {
            let headers = stripe_headers(&body);
            let router = Router::new()
                .on("payment_intent.succeeded", {
                    let ran = ran.clone();
                    move |intent: Borrowed<'_>, event: Event<'_>| {
                        let object = &intent.data.object;
                        // Borrowed from the body itself; the escaped one is decoded.
                        assert!(event.body().as_ptr_range().contains(&object.id.as_ptr()));
                        assert_eq!(object.customer, "cus_é");
                        ran.push(format!("succeeded:{}:{}", event.id(), object.amount));
                        async { Ok(()) }
                    }
                })
                .on("payment_intent.canceled", {
                    let ran = ran.clone();
                    move |intent: Borrowed<'_>, _: Event<'_>| {
                        ran.push(format!("canceled:{}", intent.data.object.id));
                        async { Ok(()) }
                    }
                })
                .fallback({
                    let ran = ran.clone();
                    move |event: Event<'_>| {
                        ran.push(format!("fallback:{}", event.event_type().unwrap()));
                        async { Ok(()) }
                    }
                });
            guard
                .handle(&headers, &body, |event| router.dispatch(event))
                .await
        }
    };
    let outcome = deliver(stripe_body("evt_1", "payment_intent.succeeded", "500")).await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    let outcome = deliver(stripe_body("evt_2", "payment_intent.canceled", "1")).await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    let outcome = deliver(stripe_body("evt_3", "charge.refunded", "1")).await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    // A duplicate runs nothing.
    let outcome = deliver(stripe_body("evt_1", "payment_intent.succeeded", "500")).await;
    assert!(matches!(outcome, Outcome::Duplicate { .. }), "{outcome:?}");
    assert_eq!(
        ran.take(),
        [
            "succeeded:evt_1:500",
            "canceled:pi_evt_2",
            "fallback:charge.refunded"
        ]
    );
}

#[tokio::test]
async fn handle_owned_and_handle_spawned_take_the_router_as_their_handler() {
    let guard = guard(Stripe::new([SECRET]).unwrap());
    let ran = Ran::default();
    let (succeeded, fallback) = (ran.clone(), ran.clone());
    let handler = Router::new()
        .on(
            "payment_intent.succeeded",
            move |intent: Owned, event: OwnedEvent| {
                let ran = succeeded.clone();
                async move {
                    let amount = intent.data.object.amount;
                    ran.push(format!("succeeded:{}:{amount}", event.id()));
                    Ok(())
                }
            },
        )
        .fallback(move |event: OwnedEvent| {
            let ran = fallback.clone();
            async move {
                let kind = event.event_type().map(|t| t.to_string());
                ran.push(format!("fallback:{}", kind.unwrap_or_default()));
                Ok(())
            }
        })
        .into_handler();
    for (i, kind) in ["payment_intent.succeeded", "customer.created"]
        .iter()
        .enumerate()
    {
        let body = stripe_body(&format!("evt_o{i}"), kind, "7");
        let headers = stripe_headers(&body);
        let outcome = guard
            .handle_owned(&headers, Bytes::from(body), handler.clone())
            .await;
        assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    }
    let body = stripe_body("evt_s", "payment_intent.succeeded", "9");
    let headers = stripe_headers(&body);
    let outcome = guard
        .handle_spawned(&headers, Bytes::from(body), handler.clone())
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(
        ran.take(),
        [
            "succeeded:evt_o0:7",
            "fallback:customer.created",
            "succeeded:evt_s:9"
        ]
    );
}

/// A generic payload: what the preset tests route.
#[derive(Deserialize)]
struct Any {}

/// Delivers `body` with `headers` to `guard` through a router with one route,
/// `expected`, and answers what ran.
async fn routed(
    guard: &WebhookGuard,
    headers: &[(&str, String)],
    body: &[u8],
    expected: &'static str,
) -> String {
    let ran = Ran::default();
    let (hit, fallback) = (ran.clone(), ran.clone());
    let router = Router::new()
        .on(expected, move |_: Any, event: OwnedEvent| {
            hit.push(format!("route:{}", event.event_type().unwrap()));
            async { Ok(()) }
        })
        .fallback(move |event: OwnedEvent| {
            let found = event.event_type().map(|t| t.to_string());
            fallback.push(format!("fallback:{}", found.unwrap_or_else(|| "-".into())));
            async { Ok(()) }
        });
    let outcome = guard
        .handle_owned(
            &headers,
            Bytes::copy_from_slice(body),
            router.into_handler(),
        )
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    let mut ran = ran.take();
    assert_eq!(ran.len(), 1, "{ran:?}");
    ran.remove(0)
}

#[tokio::test]
async fn github_routes_on_its_event_header_and_the_body_action() {
    let github = GitHub::new([SECRET]).unwrap();
    let guard = guard(github.clone());
    let deliver = |id: &str, event: Option<&str>, body: &str| {
        let mut headers = vec![
            ("X-Hub-Signature-256", github.sign(body.as_bytes())),
            ("X-GitHub-Delivery", id.to_owned()),
        ];
        if let Some(event) = event {
            headers.push(("X-GitHub-Event", event.to_owned()));
        }
        (headers, body.to_owned())
    };
    let (h, b) = deliver(
        "d-1",
        Some("issues"),
        r#"{"action":"opened","issue":{"number":1}}"#,
    );
    assert_eq!(
        routed(&guard, &h, b.as_bytes(), "issues.opened").await,
        "route:issues.opened"
    );
    let (h, b) = deliver(
        "d-2",
        Some("issues"),
        r#"{"action":"closed","issue":{"number":1}}"#,
    );
    assert_eq!(
        routed(&guard, &h, b.as_bytes(), "issues.opened").await,
        "fallback:issues.closed"
    );
    // No action: the event alone.
    let (h, b) = deliver(
        "d-3",
        Some("ping"),
        r#"{"zen":"Keep it logically awesome.","hook_id":1}"#,
    );
    assert_eq!(routed(&guard, &h, b.as_bytes(), "ping").await, "route:ping");
    // Another event with the same action routes elsewhere.
    let (h, b) = deliver("d-4", Some("pull_request"), r#"{"action":"opened"}"#);
    assert_eq!(
        routed(&guard, &h, b.as_bytes(), "issues.opened").await,
        "fallback:pull_request.opened"
    );
    // Without the header, no type: the fallback.
    let (h, b) = deliver("d-5", None, r#"{"action":"opened"}"#);
    assert_eq!(
        routed(&guard, &h, b.as_bytes(), "issues.opened").await,
        "fallback:-"
    );
}

#[tokio::test]
async fn shopify_routes_on_its_topic_header_in_either_spelling() {
    let shopify = Shopify::new([SECRET]).unwrap();
    let guard = guard(shopify.clone());
    let body = br#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    let sig = shopify.sign(body);
    for (i, name) in ["X-Shopify-Topic", "Shopify-Topic"].iter().enumerate() {
        let headers = [
            ("X-Shopify-Hmac-Sha256", sig.clone()),
            ("X-Shopify-Webhook-Id", format!("w-{i}")),
            (name, "orders/create".to_owned()),
        ];
        assert_eq!(
            routed(&guard, &headers, body, "orders/create").await,
            "route:orders/create"
        );
    }
    let headers = [
        ("X-Shopify-Hmac-Sha256", sig.clone()),
        ("X-Shopify-Webhook-Id", "w-3".to_owned()),
        ("X-Shopify-Topic", "orders/paid".to_owned()),
    ];
    assert_eq!(
        routed(&guard, &headers, body, "orders/create").await,
        "fallback:orders/paid"
    );
}

/// The presets whose type is in the body: Standard Webhooks, Slack (inner event,
/// else envelope), Jamm, Paddle, Linear (type and action).
#[tokio::test]
async fn body_types_route_for_every_preset_that_puts_them_there() {
    let t = now();
    let standard = StandardWebhooks::new([SECRET]).unwrap();
    let body = br#"{"type":"invoice.paid","timestamp":"2026-01-01T00:00:00Z","data":{}}"#;
    let headers = standard.sign_headers("msg_1", t, body);
    let g = guard(standard);
    assert_eq!(
        routed(&g, &headers, body, "invoice.paid").await,
        "route:invoice.paid"
    );

    let slack = Slack::new([SECRET]).unwrap();
    let g = guard(slack.clone());
    let body =
        br#"{"type":"event_callback","event_id":"Ev1","event":{"type":"app_mention","text":"hi"}}"#;
    let headers = slack.sign_headers(t, body);
    assert_eq!(
        routed(&g, &headers, body, "app_mention").await,
        "route:app_mention"
    );
    let body = br#"{"type":"app_rate_limited","event_id":"Ev2","minute_rate_limited":1}"#;
    let headers = slack.sign_headers(t, body);
    assert_eq!(
        routed(&g, &headers, body, "app_mention").await,
        "fallback:app_rate_limited"
    );

    let jamm = Jamm::new([SECRET]).unwrap();
    let g = guard(jamm.clone());
    let body = jamm.envelope(
        "mwh-1",
        "EVENT_TYPE_CHARGE_SUCCESS",
        r#"{"charge":{"id":"trx-1"}}"#,
        "2026-01-01T00:00:00Z",
    );
    assert_eq!(
        routed(&g, &[], body.as_bytes(), "EVENT_TYPE_CHARGE_SUCCESS").await,
        "route:EVENT_TYPE_CHARGE_SUCCESS"
    );

    let paddle = Paddle::new([webhook_guard::verify::Provider::Paddle.sample_secret()]).unwrap();
    let g = guard(paddle.clone());
    let body = br#"{"event_id":"evt_01","event_type":"transaction.completed","data":{}}"#;
    let headers = [("Paddle-Signature", paddle.sign(t, body))];
    assert_eq!(
        routed(&g, &headers, body, "transaction.completed").await,
        "route:transaction.completed"
    );

    let linear = Linear::new([SECRET]).unwrap();
    let g = guard(linear.clone());
    let body = format!(
        r#"{{"action":"create","type":"Issue","data":{{"id":"i1"}},"webhookTimestamp":{}}}"#,
        t * 1000
    );
    let headers = [
        ("Linear-Signature", linear.sign(body.as_bytes())),
        ("Linear-Delivery", "ld-1".to_owned()),
    ];
    assert_eq!(
        routed(&g, &headers, body.as_bytes(), "Issue.create").await,
        "route:Issue.create"
    );
}

/// A guard without a preset routes on the type source it is given.
#[tokio::test]
async fn a_type_source_set_on_the_builder_replaces_the_presets() {
    let stripe = Stripe::new([SECRET]).unwrap();
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(stripe)
        .event_type(TypeSource::json(["data", "object", "object"]))
        .build()
        .unwrap();
    let body = br#"{"id":"evt_t","type":"payment_intent.succeeded","data":{"object":{"object":"payment_intent"}}}"#;
    let headers = stripe_headers(body);
    assert_eq!(
        routed(&guard, &headers, body, "payment_intent").await,
        "route:payment_intent"
    );
}

/// The outcome of a Stripe delivery whose `amount` is text (not the handler's
/// `u64`), under `policy`; and whether the handler ran.
async fn unfit_under(policy: Option<InvalidPayload>) -> (Outcome, bool, WebhookGuard) {
    let guard = guard(Stripe::new([SECRET]).unwrap());
    let ran = Ran::default();
    let hit = ran.clone();
    let mut router = Router::new().on(
        "payment_intent.succeeded",
        move |_: Owned, _: OwnedEvent| {
            hit.push("ran");
            async { Ok(()) }
        },
    );
    if let Some(policy) = policy {
        router = router.invalid_payload(policy);
    }
    let body = stripe_body("evt_bad", "payment_intent.succeeded", r#""secret-amount""#);
    let headers = stripe_headers(&body);
    let outcome = guard
        .handle_owned(&headers, Bytes::from(body), router.into_handler())
        .await;
    let ran = !ran.take().is_empty();
    (outcome, ran, guard)
}

#[tokio::test]
async fn a_payload_that_does_not_fit_follows_the_policy() {
    // Default: retry. The handler does not run; the failure is counted, and its
    // text names the route and the place, never the payload's content.
    let (outcome, ran, guard) = unfit_under(None).await;
    assert!(!ran);
    let Outcome::RetryableFailure { error, .. } = &outcome else {
        panic!("{outcome:?}");
    };
    let text = error.to_string();
    assert!(
        text.contains("payment_intent.succeeded") && text.contains("data error"),
        "{text}"
    );
    assert!(!text.contains("secret-amount"), "{text}");
    assert_eq!(guard.answer(&outcome).status, 500);
    let record = guard.inspect("evt_bad").await.unwrap().unwrap();
    assert_eq!(record.failures, 1);
    assert!(record
        .history
        .iter()
        .all(|h| !h.error.contains("secret-amount")));

    let (outcome, ran, guard) = unfit_under(Some(InvalidPayload::Permanent)).await;
    assert!(!ran);
    assert!(
        matches!(outcome, Outcome::PermanentFailure { .. }),
        "{outcome:?}"
    );
    assert_eq!(guard.answer(&outcome).status, 200);

    let (outcome, ran, guard) = unfit_under(Some(InvalidPayload::Ignore)).await;
    assert!(!ran);
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    let record = guard.inspect("evt_bad").await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
}

/// A routed handler's panic and errors end as a plain handler's do.
#[tokio::test]
async fn panics_and_errors_in_routed_handlers_are_those_of_plain_handlers() {
    let guard = guard(Stripe::new([SECRET]).unwrap());
    let router = Router::new()
        .on("a.panic", |_: Any, _: OwnedEvent| async {
            panic!("routed handler panicked");
        })
        .on("a.retry", |_: Any, _: OwnedEvent| async {
            Err(HandlerError::retryable("try later"))
        })
        .on("a.permanent", |_: Any, _: OwnedEvent| async {
            Err(HandlerError::permanent("never"))
        })
        .fallback(|_: OwnedEvent| async { Err(HandlerError::retryable("fallback failed")) });
    let handler = router.into_handler();
    let deliver = |id: &str, kind: &str| {
        let body = format!(r#"{{"id":"{id}","type":"{kind}"}}"#).into_bytes();
        let headers = stripe_headers(&body);
        let (guard, handler) = (guard.clone(), handler.clone());
        async move {
            guard
                .handle_owned(&headers, Bytes::from(body), handler)
                .await
        }
    };
    let outcome = deliver("evt_p", "a.panic").await;
    let Outcome::RetryableFailure { error, .. } = &outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        error.to_string().contains("routed handler panicked"),
        "{error}"
    );
    assert!(matches!(
        deliver("evt_r", "a.retry").await,
        Outcome::RetryableFailure { .. }
    ));
    assert!(matches!(
        deliver("evt_n", "a.permanent").await,
        Outcome::PermanentFailure { .. }
    ));
    assert!(matches!(
        deliver("evt_f", "b.other").await,
        Outcome::RetryableFailure { .. }
    ));
    // The panicking one was counted as a failure and may be retried.
    assert_eq!(guard.inspect("evt_p").await.unwrap().unwrap().failures, 1);
}

#[test]
#[should_panic(expected = "the event type `a.b` has a route already")]
fn a_type_routed_twice_is_refused() {
    let _ = Router::new()
        .on("a.b", |_: Any, _: OwnedEvent| async { Ok(()) })
        .on("a.b", |_: Any, _: OwnedEvent| async { Ok(()) });
}

#[test]
fn a_router_shows_its_routes() {
    let router = Router::new()
        .on("a.b", |_: Any, _: OwnedEvent| async { Ok(()) })
        .on("c.d", |_: Any, _: OwnedEvent| async { Ok(()) })
        .invalid_payload(InvalidPayload::Ignore);
    let shown = format!("{router:?}");
    assert!(shown.contains(r#"routes: ["a.b", "c.d"]"#), "{shown}");
    assert!(shown.contains("Ignore"), "{shown}");
}

/// An inbox worker routes on the type `accept` stored: GitHub's comes from its
/// header, which the worker never sees.
#[tokio::test]
async fn an_inbox_worker_routes_on_the_stored_type() {
    use webhook_guard::inbox::InboxEvent;
    let github = GitHub::new([SECRET]).unwrap();
    let store = MemoryStore::new();
    let guard = WebhookGuard::builder()
        .namespace("routing-inbox")
        .store(store.clone())
        .inbox(store)
        .verifier(github.clone())
        .build()
        .unwrap();
    let ran = Ran::default();
    let (opened, fallback) = (ran.clone(), ran.clone());
    #[derive(Deserialize)]
    struct Issue {
        issue: Number,
    }
    #[derive(Deserialize)]
    struct Number {
        number: u64,
    }
    let router = Router::new()
        .on("issues.opened", move |issue: Issue, event: InboxEvent| {
            opened.push(format!("opened:{}:{}", event.id, issue.issue.number));
            async { Ok(()) }
        })
        .fallback(move |event: InboxEvent| {
            fallback.push(format!("fallback:{}", event.event_type().unwrap()));
            async { Ok(()) }
        });
    for (id, action) in [("d-1", "opened"), ("d-2", "closed")] {
        let body = format!(r#"{{"action":"{action}","issue":{{"number":7}}}}"#);
        let headers = [
            ("X-Hub-Signature-256", github.sign(body.as_bytes())),
            ("X-GitHub-Delivery", id.to_owned()),
            ("X-GitHub-Event", "issues".to_owned()),
        ];
        let outcome = guard.accept(&headers, body.as_bytes()).await;
        assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    }
    let worker = guard.worker(router.into_handler()).unwrap();
    assert_eq!(worker.run_once().await.unwrap(), 2);
    let mut ran = ran.take();
    ran.sort();
    assert_eq!(ran, ["fallback:issues.closed", "opened:d-1:7"]);
}

/// Unknown types and payloads that do not fit are counted, by namespace (and
/// policy).
#[cfg(feature = "metrics")]
#[test]
fn unrouted_events_and_unfit_payloads_are_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use webhook_guard::metrics::{INVALID_PAYLOADS_TOTAL, UNROUTED_TOTAL};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let guard = guard(Stripe::new([SECRET]).unwrap());
            let handler = Router::new()
                .on(
                    "payment_intent.succeeded",
                    |_: Owned, _: OwnedEvent| async { Ok(()) },
                )
                .invalid_payload(InvalidPayload::Ignore)
                .into_handler();
            let bodies = [
                stripe_body("evt_1", "payment_intent.succeeded", "1"), // routed
                stripe_body("evt_2", "customer.created", "1"),         // unrouted
                br#"{"id":"evt_3"}"#.to_vec(),                         // no type: unrouted
                stripe_body("evt_4", "payment_intent.succeeded", "true"), // unfit
            ];
            for body in bodies {
                let headers = stripe_headers(&body);
                let outcome = guard
                    .handle_owned(&headers, Bytes::from(body), handler.clone())
                    .await;
                // Unknown types, no type and an ignored payload are all answered 200.
                assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
            }
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name: &str, labels: &[(&str, &str)]| -> u64 {
        snapshot
            .iter()
            .filter(|(key, ..)| {
                let key = key.key();
                key.name() == name
                    && labels
                        .iter()
                        .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("{name}: {other:?}"),
            })
            .sum()
    };
    assert_eq!(counter(UNROUTED_TOTAL, &[("namespace", "routing")]), 2);
    assert_eq!(
        counter(
            INVALID_PAYLOADS_TOTAL,
            &[("namespace", "routing"), ("policy", "ignore")]
        ),
        1
    );
}

/// axum's `guarded` takes the router as its handler: two typed routes and a
/// fallback, over real HTTP.
#[cfg(feature = "axum")]
#[tokio::test]
async fn axum_guarded_routes_typed_handlers_and_a_fallback() {
    use webhook_guard::integrations::axum::guarded;

    use crate::support::http_client::post;
    use crate::support::web::serve;

    #[derive(Deserialize)]
    struct Deleted {
        data: DeletedData,
    }
    #[derive(Deserialize)]
    struct DeletedData {
        object: Subscription,
    }
    #[derive(Deserialize)]
    struct Subscription {
        id: String,
    }

    let guard = guard(Stripe::new([SECRET]).unwrap());
    let ran = Ran::default();
    let (paid, ended, other) = (ran.clone(), ran.clone(), ran.clone());
    let handler = Router::new()
        .on(
            "payment_intent.succeeded",
            move |intent: Owned, _: OwnedEvent| {
                paid.push(format!("paid:{}", intent.data.object.id));
                async { Ok(()) }
            },
        )
        .on(
            "customer.subscription.deleted",
            move |sub: Deleted, _: OwnedEvent| {
                ended.push(format!("ended:{}", sub.data.object.id));
                async { Ok(()) }
            },
        )
        .fallback(move |event: OwnedEvent| {
            other.push(format!("other:{}", event.event_type().unwrap()));
            async { Ok(()) }
        })
        .into_handler();
    let app = axum::Router::new().route("/webhooks/stripe", guarded(guard.clone(), handler));
    let addr = serve(app).await;
    let send = |body: Vec<u8>| async move {
        let signature = stripe_headers(&body).remove(0).1;
        post(
            addr,
            "/webhooks/stripe",
            &[("Stripe-Signature", &signature)],
            &body,
        )
        .await
    };
    let reply = send(stripe_body("evt_a", "payment_intent.succeeded", "100")).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["outcome"], "processed");
    let deleted = br#"{"id":"evt_b","type":"customer.subscription.deleted","data":{"object":{"id":"sub_1"}}}"#;
    assert_eq!(send(deleted.to_vec()).await.status, 200);
    assert_eq!(
        send(stripe_body("evt_c", "invoice.created", "1"))
            .await
            .status,
        200
    );
    // A payload that does not fit is retried by default: 500.
    let reply = send(stripe_body("evt_d", "payment_intent.succeeded", "null")).await;
    assert_eq!(reply.status, 500, "{}", reply.body);
    assert_eq!(reply.json()["outcome"], "retryable_failure");
    // The duplicate of a routed event runs nothing.
    let reply = send(stripe_body("evt_a", "payment_intent.succeeded", "100")).await;
    assert_eq!(reply.json()["outcome"], "duplicate");
    assert_eq!(
        ran.take(),
        ["paid:pi_evt_a", "ended:sub_1", "other:invoice.created"]
    );
}

/// The future of [`stripe_handler`]'s router.
#[cfg(any(feature = "actix", feature = "lambda"))]
type Ready = std::future::Ready<Result<(), HandlerError>>;
#[cfg(any(feature = "actix", feature = "lambda"))]
type StripeFuture = webhook_guard::route::RouteFuture<
    webhook_guard::route::OneOf<Ready, webhook_guard::route::NoFuture>,
    Ready,
>;

/// The router a Stripe endpoint might mount: one typed route and the default
/// fallback, as a handler.
#[cfg(any(feature = "actix", feature = "lambda"))]
fn stripe_handler() -> impl Fn(OwnedEvent) -> StripeFuture + Clone + Send + Sync + 'static {
    fn paid(_: Owned, _: OwnedEvent) -> Ready {
        std::future::ready(Ok(()))
    }
    Router::new()
        .on("payment_intent.succeeded", paid)
        .into_handler()
}

/// actix's `guarded` takes the router as its handler (its route is built; the
/// handler bound is what matters here, as for axum above).
#[cfg(feature = "actix")]
#[test]
fn actix_guarded_takes_a_router() {
    let guarded = webhook_guard::integrations::actix::guarded(
        guard(Stripe::new([SECRET]).unwrap()),
        stripe_handler(),
    );
    let _route = guarded.route();
}

/// Lambda's `guarded` takes the router as its handler (built only: the handler
/// bound is what matters here, as for axum above).
#[cfg(feature = "lambda")]
#[test]
fn lambda_guarded_takes_a_router() {
    let _service = webhook_guard::integrations::lambda::guarded(
        guard(Stripe::new([SECRET]).unwrap()),
        stripe_handler(),
    );
}
