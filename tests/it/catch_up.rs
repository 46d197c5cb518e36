//! Recovering missed events (`catch_up`): a local HTTP server answers with the
//! response shapes of Stripe's List Events (`GET /v1/events`: a list object,
//! `has_more`, `starting_after`, `created[gte]`/`created[lte]`,
//! `delivery_success=false`, 429 with `Retry-After`, error objects) and of a Svix
//! polling endpoint; events go through the guard by webhook and by the list, in
//! both orders, on SQLite and PostgreSQL stores.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{json, Value};
use webhook_guard::catch_up::stripe::StripeEvents;
use webhook_guard::catch_up::svix::SvixPoller;
use webhook_guard::catch_up::{cursor_namespace, CatchUp, CatchUpError, SourceError};
use webhook_guard::clock::{Clock as _, ManualClock};
use webhook_guard::outcome::OutcomeKind;
use webhook_guard::store::{DynProcessedStore, Key, RecordState};
use webhook_guard::verify::{StandardWebhooks, Stripe};
use webhook_guard::{HandlerError, OwnedEvent, WebhookGuard};

use crate::support::backends::{self, Backend};

const SECRET: &str = "whsec_catchuptest000000000000000000000";
const API_KEY: &str = "sk_test_51CatchUpSecretKey";

// ---- a Stripe List Events server -------------------------------------------------

/// One answer forced ahead of the list: status, `Retry-After`, body.
type Forced = (StatusCode, Option<&'static str>, Value);

/// One request the server saw: when, its decoded query, its `Authorization`.
type Seen = (Instant, HashMap<String, String>, Option<String>);

#[derive(Default)]
struct FakeStripe {
    /// Every event of the account, as List Events renders it.
    events: Mutex<Vec<Value>>,
    /// Ids delivered to every endpoint: `delivery_success=false` leaves them out.
    delivered: Mutex<HashSet<String>>,
    forced: Mutex<VecDeque<Forced>>,
    requests: Mutex<Vec<Seen>>,
}

impl FakeStripe {
    fn add(&self, id: &str, created: i64) -> Value {
        let event = stripe_event(id, created);
        self.events.lock().unwrap().push(event.clone());
        event
    }

    fn queries(&self) -> Vec<HashMap<String, String>> {
        let requests = self.requests.lock().unwrap();
        requests.iter().map(|(_, q, _)| q.clone()).collect()
    }
}

/// An event as Stripe's API reference shows one.
fn stripe_event(id: &str, created: i64) -> Value {
    json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": created,
        "data": {"object": {"id": format!("pi_{id}"), "object": "payment_intent", "amount": 2000, "currency": "usd", "status": "succeeded"}},
        "livemode": false,
        "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null},
        "type": "payment_intent.succeeded"
    })
}

fn decode_query(raw: Option<&str>) -> HashMap<String, String> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .unwrap()
            .into_owned()
    };
    raw.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn stripe_error(kind: &str, code: Option<&str>, message: &str) -> Value {
    let mut error =
        json!({"type": kind, "message": message, "doc_url": "https://stripe.com/docs/error-codes"});
    if let Some(code) = code {
        error["code"] = json!(code);
    }
    json!({"error": error})
}

async fn list_events(
    State(fake): State<Arc<FakeStripe>>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Response {
    let query = decode_query(raw.as_deref());
    let auth = headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_owned());
    fake.requests
        .lock()
        .unwrap()
        .push((Instant::now(), query.clone(), auth.clone()));
    if let Some((status, retry_after, body)) = fake.forced.lock().unwrap().pop_front() {
        let mut response = json_answer(status, &body);
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert("retry-after", secs.parse().unwrap());
        }
        return response;
    }
    if auth.as_deref() != Some(&format!("Bearer {API_KEY}")) {
        let message = "Invalid API Key provided: sk_test_****tKey";
        let body = stripe_error("invalid_request_error", None, message);
        return json_answer(StatusCode::UNAUTHORIZED, &body);
    }
    let int = |name: &str| query.get(name).map(|v| v.parse::<i64>().unwrap());
    let (gte, lte) = (int("created[gte]"), int("created[lte]"));
    let limit = int("limit").unwrap_or(10) as usize;
    let only_undelivered = query.get("delivery_success").map(String::as_str) == Some("false");
    let delivered = fake.delivered.lock().unwrap().clone();
    let mut listed: Vec<Value> = (fake.events.lock().unwrap().iter())
        .filter(|e| {
            let created = e["created"].as_i64().unwrap();
            gte.is_none_or(|g| created >= g) && lte.is_none_or(|l| created <= l)
        })
        .filter(|e| !only_undelivered || !delivered.contains(e["id"].as_str().unwrap()))
        .cloned()
        .collect();
    // Newest first, as Stripe lists.
    listed.sort_by(|a, b| {
        let key = |e: &Value| {
            (
                e["created"].as_i64().unwrap(),
                e["id"].as_str().unwrap().to_owned(),
            )
        };
        key(b).cmp(&key(a))
    });
    if let Some(after) = query.get("starting_after") {
        let Some(at) = listed.iter().position(|e| e["id"] == after.as_str()) else {
            let body = stripe_error(
                "invalid_request_error",
                Some("resource_missing"),
                "No such event",
            );
            return json_answer(StatusCode::BAD_REQUEST, &body);
        };
        listed.drain(..=at);
    }
    let has_more = listed.len() > limit;
    listed.truncate(limit);
    json_answer(
        StatusCode::OK,
        &json!({"object": "list", "url": "/v1/events", "has_more": has_more, "data": listed}),
    )
}

/// Serves `fake` on a free local port: its base URL.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

async fn fake_stripe() -> (Arc<FakeStripe>, String) {
    let fake = Arc::new(FakeStripe::default());
    let router = Router::new()
        .route("/v1/events", get(list_events))
        .with_state(fake.clone());
    (fake, serve(router).await)
}

fn json_answer(status: StatusCode, body: &Value) -> Response {
    let headers = [("content-type", "application/json")];
    (status, headers, body.to_string()).into_response()
}

// ---- the receiver --------------------------------------------------------------

/// How often the handler completed, per event id.
type Runs = Arc<Mutex<HashMap<String, u32>>>;

fn counting(
    runs: &Runs,
) -> impl Fn(OwnedEvent) -> futures_util::future::Ready<Result<(), HandlerError>> + Send + Sync + 'static
{
    let runs = runs.clone();
    move |event: OwnedEvent| {
        // The body is the event's JSON, whichever way it came.
        let body: Value = event.json().expect("an event's JSON");
        assert_eq!(body["id"], event.id());
        *runs
            .lock()
            .unwrap()
            .entry(event.id().to_owned())
            .or_default() += 1;
        futures_util::future::ready(Ok(()))
    }
}

fn guard(store: &Arc<DynProcessedStore>, clock: &ManualClock) -> WebhookGuard {
    WebhookGuard::builder()
        .store(store.clone())
        .verifier(Stripe::new([SECRET]).unwrap())
        .namespace("stripe")
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn source(base: &str) -> StripeEvents {
    StripeEvents::builder(API_KEY)
        .base_url(base)
        .window(Duration::from_secs(86_400))
        .build()
        .unwrap()
}

/// Delivers `event` to the guard as Stripe's webhook would.
async fn deliver(
    guard: &WebhookGuard,
    clock: &ManualClock,
    event: &Value,
    runs: &Runs,
) -> OutcomeKind {
    let body = Bytes::from(serde_json::to_vec_pretty(event).unwrap());
    let signature = Stripe::new([SECRET])
        .unwrap()
        .sign(&body, clock.now().timestamp());
    let headers = [("Stripe-Signature", signature.as_str())];
    let outcome = guard.handle_owned(&headers, body, counting(runs)).await;
    outcome.kind()
}

fn runs_of(runs: &Runs, id: &str) -> u32 {
    runs.lock().unwrap().get(id).copied().unwrap_or(0)
}

/// The cursor kept in the store for the Stripe source of the guard in `stripe`.
async fn stored_cursor(store: &Arc<DynProcessedStore>) -> Option<String> {
    let namespace = cursor_namespace("stripe");
    let record = store
        .get(Key::new(&namespace, "stripe-events"))
        .await
        .unwrap()?;
    assert_eq!(
        record.state,
        RecordState::Failed,
        "a cursor at rest is claimable"
    );
    record.history.last().map(|n| n.error.clone())
}

async fn open(backend: Backend) -> Option<(Arc<DynProcessedStore>, backends::Cleanup)> {
    backends::store(backend, 4, None).await
}

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(Utc::now().timestamp(), 0).unwrap()
}

// ---- the scenarios ---------------------------------------------------------------

/// An event delivered by webhook and then listed runs once; an event listed first
/// and delivered late runs once.
async fn both_routes_run_the_handler_once(backend: Backend) {
    let Some((store, cleanup)) = open(backend).await else {
        return;
    };
    let (fake, base) = fake_stripe().await;
    let clock = ManualClock::new(now());
    let created = clock.now().timestamp() - 2 * 3600;
    let first = fake.add("evt_1DeliveredFirst", created);
    let second = fake.add("evt_2ListedFirst", created + 60);
    let runs = Runs::default();
    let guard = guard(&store, &clock);

    // By webhook first: processed; another endpoint of the account failed it, so
    // Stripe still lists it.
    assert_eq!(
        deliver(&guard, &clock, &first, &runs).await,
        OutcomeKind::Processed
    );
    let task = CatchUp::new(guard.clone(), source(&base), counting(&runs));
    let report = task.run_once().await.unwrap();
    assert_eq!((report.duplicates, report.processed), (1, 1), "{report:?}");
    assert!(report.caught_up);
    // Then the late delivery of the event the list found first.
    assert_eq!(
        deliver(&guard, &clock, &second, &runs).await,
        OutcomeKind::Duplicate
    );
    assert_eq!(runs_of(&runs, "evt_1DeliveredFirst"), 1);
    assert_eq!(runs_of(&runs, "evt_2ListedFirst"), 1);

    // Every request was the documented one, with the key as a bearer token.
    let requests = fake.requests.lock().unwrap().clone();
    for (_, query, auth) in &requests {
        assert_eq!(query["delivery_success"], "false");
        assert_eq!(query["limit"], "100");
        assert!(query.contains_key("created[gte]") && query.contains_key("created[lte]"));
        assert_eq!(auth.as_deref(), Some(format!("Bearer {API_KEY}").as_str()));
    }
    // Nothing listed from before the retention could tell it from a processed one.
    let retention = TimeDelta::from_std(guard.retention()).unwrap();
    let first_gte: i64 = requests[0].1["created[gte]"].parse().unwrap();
    assert!(first_gte >= (clock.now() - retention).timestamp());
    cleanup.run().await;
}

backends::per_backend!(both_routes_run_the_handler_once:
    both_routes_run_once_sqlite => Sqlite,
    both_routes_run_once_postgres => Postgres,
);

/// The cursor is kept in the store: a new guard and source on the same store
/// (a restarted process) go on from it, not from the retention's edge.
async fn the_cursor_survives_a_restart(backend: Backend) {
    let Some((store, cleanup)) = open(backend).await else {
        return;
    };
    let (fake, base) = fake_stripe().await;
    let clock = ManualClock::new(now());
    let start = clock.now().timestamp();
    fake.add("evt_BeforeRestart", start - 3 * 3600);
    let runs = Runs::default();
    {
        let task = CatchUp::new(guard(&store, &clock), source(&base), counting(&runs));
        let report = task.run_once().await.unwrap();
        assert_eq!(report.processed, 1);
        assert_eq!(stored_cursor(&store).await, report.cursor);
    }
    let kept = stored_cursor(&store).await.expect("a cursor kept");
    let resumed_from: i64 = kept.strip_prefix("s1:").unwrap().parse().unwrap();
    // The list reached `now - delay` (10 minutes): the next window starts after it.
    assert_eq!(resumed_from, start - 600 + 1);

    // An hour later, the process starts again: new guard, new source, same store.
    clock.advance(TimeDelta::hours(1));
    fake.add("evt_AfterRestart", start + 60);
    let before = fake.requests.lock().unwrap().len();
    let task = CatchUp::new(guard(&store, &clock), source(&base), counting(&runs));
    let report = task.run_once().await.unwrap();
    assert_eq!((report.processed, report.duplicates), (1, 0), "{report:?}");
    let queries = fake.queries();
    assert_eq!(queries[before]["created[gte]"], resumed_from.to_string());
    assert_eq!(runs_of(&runs, "evt_BeforeRestart"), 1);
    assert_eq!(runs_of(&runs, "evt_AfterRestart"), 1);
    cleanup.run().await;
}

backends::per_backend!(the_cursor_survives_a_restart:
    cursor_survives_restart_sqlite => Sqlite,
    cursor_survives_restart_postgres => Postgres,
    cursor_survives_restart_memory => Memory,
);

// The cursor is an ordinary record: every other store keeps it too.
#[cfg(all(feature = "mysql", feature = "redis", feature = "dynamodb"))]
backends::per_backend!(the_cursor_survives_a_restart:
    cursor_survives_restart_mariadb => MySql,
    cursor_survives_restart_redis => Redis,
    cursor_survives_restart_dynamodb => DynamoDb,
);

/// A page that cannot be settled keeps the cursor before it; a pass that dies
/// in the middle of a page (its task dropped) leaves the cursor too, and once
/// the lease ran out the next pass lists the page again: every event runs once.
async fn a_crash_mid_page_loses_nothing(backend: Backend) {
    let Some((store, cleanup)) = open(backend).await else {
        return;
    };
    let (fake, base) = fake_stripe().await;
    let clock = ManualClock::new(now());
    let created = clock.now().timestamp() - 3600;
    for (i, id) in ["evt_A", "evt_B", "evt_C"].iter().enumerate() {
        fake.add(id, created + i as i64);
    }
    let runs = Runs::default();
    let guard = guard(&store, &clock);

    // evt_B fails (retryable): its page is not settled, the cursor stays.
    let failing = {
        let runs = runs.clone();
        move |event: OwnedEvent| {
            let failed = event.id() == "evt_B";
            if !failed {
                *runs
                    .lock()
                    .unwrap()
                    .entry(event.id().to_owned())
                    .or_default() += 1;
            }
            async move {
                if failed {
                    Err(HandlerError::retryable("database down"))
                } else {
                    Ok(())
                }
            }
        }
    };
    let report = CatchUp::new(guard.clone(), source(&base), failing)
        .run_once()
        .await
        .unwrap();
    assert_eq!((report.processed, report.unsettled), (2, 1), "{report:?}");
    assert!(!report.caught_up);
    let before_page = stored_cursor(&store).await;
    assert_eq!(report.cursor, before_page);
    // The empty windows before the page were passed, not the page.
    let kept = before_page.clone().expect("the empty windows' cursor");
    let from: i64 = kept.strip_prefix("s1:").unwrap().parse().unwrap();
    assert!(from <= created, "{kept}");

    // Now the pass dies in the middle of the page: evt_B's handler never ends,
    // and the task is dropped (the process killed) while it runs.
    let entered = Arc::new(tokio::sync::Notify::new());
    let hang = {
        let entered = entered.clone();
        move |event: OwnedEvent| {
            assert_eq!(event.id(), "evt_B", "evt_A is a duplicate");
            entered.notify_one();
            std::future::pending::<Result<(), HandlerError>>()
        }
    };
    let pass = CatchUp::new(guard.clone(), source(&base), hang);
    tokio::select! {
        _ = pass.run_once() => panic!("the pass hangs in evt_B's handler"),
        () = entered.notified() => {}
    }
    assert_eq!(
        stored_cursor_raw(&store).await,
        before_page,
        "the cursor did not move"
    );

    // Another pass within the cursor's lease finds it held.
    let task = CatchUp::new(guard.clone(), source(&base), counting(&runs));
    assert!(task.run_once().await.unwrap().busy);
    // After the lease, it goes on from the kept cursor: evt_A and evt_C are
    // duplicates, evt_B runs.
    clock.advance(TimeDelta::from_std(guard.lease()).unwrap() + TimeDelta::seconds(1));
    let report = task.run_once().await.unwrap();
    assert_eq!((report.processed, report.duplicates), (1, 2), "{report:?}");
    assert!(report.caught_up);
    for id in ["evt_A", "evt_B", "evt_C"] {
        assert_eq!(runs_of(&runs, id), 1, "{id}");
    }
    cleanup.run().await;
}

/// The cursor text in the store, whatever the record's state.
async fn stored_cursor_raw(store: &Arc<DynProcessedStore>) -> Option<String> {
    let namespace = cursor_namespace("stripe");
    let record = store
        .get(Key::new(&namespace, "stripe-events"))
        .await
        .unwrap()?;
    record.history.last().map(|n| n.error.clone())
}

backends::per_backend!(a_crash_mid_page_loses_nothing:
    crash_mid_page_sqlite => Sqlite,
    crash_mid_page_postgres => Postgres,
);

/// Pages follow `has_more` with `starting_after`; each page runs oldest first.
#[tokio::test]
async fn pages_follow_has_more_and_starting_after() {
    let store: Arc<DynProcessedStore> = Arc::new(webhook_guard::MemoryStore::new());
    let (fake, base) = fake_stripe().await;
    let clock = ManualClock::new(now());
    let created = clock.now().timestamp() - 3600;
    let ids = ["evt_P1", "evt_P2", "evt_P3", "evt_P4", "evt_P5"];
    for (i, id) in ids.iter().enumerate() {
        fake.add(id, created + i as i64);
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let order = order.clone();
        move |event: OwnedEvent| {
            order.lock().unwrap().push(event.id().to_owned());
            async { Ok(()) }
        }
    };
    let source = StripeEvents::builder(API_KEY)
        .base_url(&base)
        .window(Duration::from_secs(4 * 86_400))
        .limit(2)
        .build()
        .unwrap();
    let report = CatchUp::new(guard(&store, &clock), source, handler)
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.processed, 5);
    assert_eq!(report.pages, 3, "three pages of one window");
    let queries = fake.queries();
    assert_eq!(queries[0].get("starting_after"), None);
    assert_eq!(queries[1]["starting_after"], "evt_P4");
    assert_eq!(queries[2]["starting_after"], "evt_P2");
    assert_eq!(
        queries[1]["created[lte]"], queries[0]["created[lte]"],
        "one window"
    );
    assert_eq!(
        *order.lock().unwrap(),
        ["evt_P4", "evt_P5", "evt_P2", "evt_P3", "evt_P1"]
    );
}

/// A 429 is waited out (its `Retry-After` honoured), then the page is listed.
#[tokio::test]
async fn rate_limiting_is_waited_out() {
    let store: Arc<DynProcessedStore> = Arc::new(webhook_guard::MemoryStore::new());
    let (fake, base) = fake_stripe().await;
    let clock = ManualClock::new(now());
    fake.add("evt_AfterLimit", clock.now().timestamp() - 3600);
    let limited = stripe_error(
        "invalid_request_error",
        Some("rate_limit"),
        "Too many requests hit the API too quickly.",
    );
    fake.forced
        .lock()
        .unwrap()
        .push_back((StatusCode::TOO_MANY_REQUESTS, Some("2"), limited));
    let runs = Runs::default();
    let report = CatchUp::new(guard(&store, &clock), source(&base), counting(&runs))
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.processed, 1);
    let requests = fake.requests.lock().unwrap();
    assert_eq!(requests[1].1, requests[0].1, "the same page asked again");
    // A lower bound the source must respect, not a speed: it waited at least the
    // two seconds Stripe asked for.
    assert!(requests[1].0 - requests[0].0 >= Duration::from_secs(2));
}

/// A 429 that does not end is a typed error after a bounded number of requests,
/// and the cursor stays.
#[tokio::test]
async fn endless_rate_limiting_is_a_typed_error() {
    let store: Arc<DynProcessedStore> = Arc::new(webhook_guard::MemoryStore::new());
    let (fake, base) = fake_stripe().await;
    let clock = ManualClock::new(now());
    for _ in 0..10 {
        let limited = stripe_error(
            "invalid_request_error",
            Some("rate_limit"),
            "Too many requests",
        );
        fake.forced
            .lock()
            .unwrap()
            .push_back((StatusCode::TOO_MANY_REQUESTS, Some("0"), limited));
    }
    let runs = Runs::default();
    let error = CatchUp::new(guard(&store, &clock), source(&base), counting(&runs))
        .run_once()
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            CatchUpError::Source(SourceError::RateLimited { attempts: 6 })
        ),
        "{error}"
    );
    assert_eq!(fake.requests.lock().unwrap().len(), 6);
    assert_eq!(stored_cursor(&store).await, None, "no cursor written");
}

/// Stripe's error object is a typed refusal, its text without the API key.
#[tokio::test]
async fn an_error_object_is_a_refusal_without_the_key() {
    let store: Arc<DynProcessedStore> = Arc::new(webhook_guard::MemoryStore::new());
    let (fake, base) = fake_stripe().await;
    let clock = ManualClock::new(now());
    let message = format!("Invalid API Key provided: {API_KEY}");
    let body = stripe_error("invalid_request_error", None, &message);
    fake.forced
        .lock()
        .unwrap()
        .push_back((StatusCode::UNAUTHORIZED, None, body));
    let runs = Runs::default();
    let error = CatchUp::new(guard(&store, &clock), source(&base), counting(&runs))
        .run_once()
        .await
        .unwrap_err();
    let CatchUpError::Source(SourceError::Refused { status, message }) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(*status, 401);
    assert_eq!(
        message,
        "invalid_request_error: Invalid API Key provided: [redacted]"
    );
    assert!(!format!("{error} {error:?}").contains(API_KEY));
    assert_eq!(
        fake.requests.lock().unwrap().len(),
        1,
        "a 4xx is not retried"
    );
    // The next pass goes on from nowhere else: nothing was kept.
    assert_eq!(stored_cursor(&store).await, None);
}

/// Events delivered to every endpoint are not listed; events older than the
/// guard's retention are never asked for.
#[tokio::test]
async fn delivered_and_too_old_events_are_not_listed() {
    let store: Arc<DynProcessedStore> = Arc::new(webhook_guard::MemoryStore::new());
    let (fake, base) = fake_stripe().await;
    let clock = ManualClock::new(now());
    let now = clock.now().timestamp();
    fake.add("evt_Delivered", now - 3600);
    fake.delivered
        .lock()
        .unwrap()
        .insert("evt_Delivered".into());
    fake.add("evt_TooOld", now - 4 * 86_400); // past the 72 h retention
    fake.add("evt_Fresh", now - 60); // younger than the 10 minute delay
    fake.add("evt_Missed", now - 7200);
    let runs = Runs::default();
    let report = CatchUp::new(guard(&store, &clock), source(&base), counting(&runs))
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.processed, 1, "{report:?}");
    assert_eq!(
        runs.lock().unwrap().keys().collect::<Vec<_>>(),
        ["evt_Missed"]
    );
    // The fresh one is listed once it is older than the delay.
    clock.advance(TimeDelta::minutes(15));
    let report = CatchUp::new(guard(&store, &clock), source(&base), counting(&runs))
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.processed, 1);
    assert_eq!(runs_of(&runs, "evt_Fresh"), 1);
}

/// A spawned task catches up at once and stops on request.
#[tokio::test]
async fn a_spawned_task_catches_up_and_stops() {
    let store: Arc<DynProcessedStore> = Arc::new(webhook_guard::MemoryStore::new());
    let (fake, base) = fake_stripe().await;
    let clock = ManualClock::new(now());
    fake.add("evt_Spawned", clock.now().timestamp() - 3600);
    let runs = Runs::default();
    let handle = CatchUp::new(guard(&store, &clock), source(&base), counting(&runs))
        .interval(Duration::from_secs(3600))
        .spawn();
    while runs_of(&runs, "evt_Spawned") == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.shutdown().await;
    assert_eq!(runs_of(&runs, "evt_Spawned"), 1);
}

// ---- a Svix polling endpoint -----------------------------------------------------

#[derive(Default)]
struct FakePoller {
    /// Messages as the polling endpoint renders them.
    messages: Mutex<Vec<Value>>,
    iterators: Mutex<Vec<Option<String>>>,
}

async fn poll(State(fake): State<Arc<FakePoller>>, RawQuery(raw): RawQuery) -> Response {
    let query = decode_query(raw.as_deref());
    let iterator = query.get("iterator").cloned();
    fake.iterators.lock().unwrap().push(iterator.clone());
    if iterator.is_none() {
        // A first call answers no message and an iterator at the start.
        return json_answer(
            StatusCode::OK,
            &json!({"data": [], "iterator": "it0", "done": false}),
        );
    }
    let offset: usize = iterator
        .as_deref()
        .map_or(0, |it| it.trim_start_matches("it").parse().unwrap());
    let limit: usize = query["limit"].parse().unwrap();
    let messages = fake.messages.lock().unwrap();
    let page: Vec<Value> = messages.iter().skip(offset).take(limit).cloned().collect();
    let next = offset + page.len();
    let done = next >= messages.len();
    json_answer(
        StatusCode::OK,
        &json!({"data": page, "iterator": format!("it{next}"), "done": done}),
    )
}

/// A Svix polling endpoint's messages dedup against Standard Webhooks deliveries
/// of the same message id, with the iterator as the cursor.
#[tokio::test]
async fn svix_polled_messages_dedup_against_deliveries() {
    let fake = Arc::new(FakePoller::default());
    let router = Router::new()
        .route("/api/v1/app/app_1/poller/poll_1", get(poll))
        .with_state(fake.clone());
    let base = serve(router).await;
    let clock = ManualClock::new(now());
    let at = (clock.now() - TimeDelta::hours(1)).to_rfc3339();
    for (id, n) in [("msg_1", 1), ("msg_2", 2), ("msg_3", 3)] {
        fake.messages.lock().unwrap().push(json!({
            "id": id, "eventType": "invoice.paid", "timestamp": at,
            "payload": {"id": id, "type": "invoice.paid", "n": n}, "channels": null, "tags": null
        }));
    }
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let verifier = StandardWebhooks::new([secret]).unwrap();
    let guard = WebhookGuard::builder()
        .store(webhook_guard::MemoryStore::new())
        .verifier(StandardWebhooks::new([secret]).unwrap())
        .namespace("acme")
        .clock(clock.clone())
        .build()
        .unwrap();
    let runs = Runs::default();
    // msg_2 was delivered by webhook.
    let body = Bytes::from_static(br#"{"id":"msg_2","type":"invoice.paid","n":2}"#);
    let t = clock.now().timestamp().to_string();
    let signature = verifier.sign("msg_2", clock.now().timestamp(), &body);
    let headers = [
        ("webhook-id", "msg_2"),
        ("webhook-timestamp", t.as_str()),
        ("webhook-signature", signature.as_str()),
    ];
    let delivered = guard.handle_owned(&headers, body, counting(&runs)).await;
    assert_eq!(delivered.kind(), OutcomeKind::Processed);

    let source = SvixPoller::new(
        &format!("{base}/api/v1/app/app_1/poller/poll_1"),
        "sk_poll_test",
    )
    .unwrap()
    .limit(2);
    let task = CatchUp::new(guard, source, counting(&runs));
    let first = task.run_once().await.unwrap();
    assert_eq!((first.listed, first.cursor.as_deref()), (0, Some("it0")));
    assert!(first.caught_up);
    let report = task.run_once().await.unwrap();
    assert_eq!((report.processed, report.duplicates), (2, 1), "{report:?}");
    assert_eq!(report.cursor.as_deref(), Some("it3"));
    let iterators = fake.iterators.lock().unwrap().clone();
    assert_eq!(iterators, [None, Some("it0".into()), Some("it2".into())]);
    for id in ["msg_1", "msg_2", "msg_3"] {
        assert_eq!(runs_of(&runs, id), 1, "{id}");
    }
}
