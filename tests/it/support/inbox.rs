//! Shared inbox checks for the SQL backends: a guard and worker end to end with an
//! out-of-order pair, and a worker killed at every store call.
#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use tokio::sync::Notify;
use webhook_guard::clock::ManualClock;
use webhook_guard::inbox::{
    Enqueued, InboxEvent, InboxHandler, InboxState, InboxStore, LeaseRequest, NewEvent, RenewLease,
    Settle, Worker,
};
use webhook_guard::meta::{EventMeta, MetaExtractor};
use webhook_guard::ordering::{ObjectKey, ObjectStatus, OrderingStore};
use webhook_guard::store::{Fence, FencingToken, Fingerprint, Key, ProcessedStore};
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, Outcome, StoreError, WebhookGuard};

/// Millisecond-precision "now", as the SQL stores keep it.
pub fn now_ms() -> DateTime<Utc> {
    DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap()
}

fn body(id: &str, ty: &str, object: &str, created: i64) -> Vec<u8> {
    format!(r#"{{"id":"{id}","type":"{ty}","object":"{object}","created":{created}}}"#).into_bytes()
}

/// A guard in inbox mode on `store` (records, inbox and ordering) under
/// `namespace`, reading ids and metadata from JSON bodies, on a manual clock.
fn inbox_guard<S>(store: &S, namespace: &str) -> (WebhookGuard, ManualClock)
where
    S: ProcessedStore + InboxStore + OrderingStore + Clone,
{
    let clock = ManualClock::new(now_ms());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .ordering(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .event_meta(MetaExtractor::json(&["type"], &["created"], &["object"]))
        .namespace(namespace)
        .clock(clock.clone())
        .build()
        .unwrap();
    (guard, clock)
}

/// `accept` stores events on the real server, the worker applies them, and a late
/// older event is skipped: the object ends in the newest state.
pub async fn guard_and_worker_end_to_end<S>(store: S)
where
    S: ProcessedStore + InboxStore + OrderingStore + Clone,
{
    text_with_nul_is_stored(store.clone()).await;
    let namespace = format!("e2e_{:016x}", FencingToken::random().0);
    let (guard, _clock) = inbox_guard(&store, &namespace);
    let state: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let worker = {
        let (state, runs) = (state.clone(), runs.clone());
        guard
            .worker(move |e: InboxEvent| {
                let (state, runs) = (state.clone(), runs.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    state.lock().unwrap().insert(
                        e.meta.object.clone().unwrap(),
                        e.meta.event_type.clone().unwrap(),
                    );
                    Ok(())
                }
            })
            .unwrap()
    };
    let headers = [("content-type", "application/json")];
    // Created pending(10) → succeeded(20) → refunded(30); delivered 20, 30, 30 again, 10.
    for (id, ty, at) in [
        ("e2", "charge.succeeded", 20),
        ("e3", "charge.refunded", 30),
        ("e3", "charge.refunded", 30),
        ("e1", "charge.pending", 10),
    ] {
        let outcome = guard.accept(&headers, &body(id, ty, "ch_o", at)).await;
        assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
        assert_eq!(guard.answer(&outcome).status, 200);
        while worker.run_once().await.unwrap() > 0 {}
    }
    let other = guard
        .accept(&headers, &body("e3", "charge.failed", "ch_o", 30))
        .await;
    assert!(matches!(other, Outcome::Conflict { .. }), "{other:?}");
    assert_eq!(state.lock().unwrap()["ch_o"], "charge.refunded");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "e2 and e3 ran, once each");
    let states: Vec<InboxState> = futures_util::future::join_all(
        ["e1", "e2", "e3"].map(|id| store.get_event(Key::new(&namespace, id))),
    )
    .await
    .into_iter()
    .map(|e| e.unwrap().unwrap().state)
    .collect();
    assert_eq!(
        states,
        [InboxState::Skipped, InboxState::Done, InboxState::Done]
    );
    let object = store
        .get_object(ObjectKey {
            namespace: &namespace,
            object: "ch_o",
            family: "charge",
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(object.status, ObjectStatus::Applied);
    assert_eq!(object.newest.timestamp(), 30);
}

/// An inbox that "dies" at a chosen store call: from that call on it never answers,
/// as if the worker's process was killed there, and it says so through `died`.
#[derive(Debug)]
pub struct DiesAt<S> {
    inner: S,
    calls: AtomicUsize,
    die_at: usize,
    died: Notify,
}

impl<S: InboxStore> DiesAt<S> {
    async fn step(&self) {
        if self.calls.fetch_add(1, Ordering::SeqCst) >= self.die_at {
            self.died.notify_one();
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl<S: InboxStore> InboxStore for DiesAt<S> {
    async fn enqueue(&self, e: &NewEvent<'_>) -> Result<Enqueued, StoreError> {
        self.step().await;
        self.inner.enqueue(e).await
    }
    async fn lease(&self, request: &LeaseRequest<'_>) -> Result<Vec<InboxEvent>, StoreError> {
        self.step().await;
        self.inner.lease(request).await
    }
    async fn settle_event(&self, settle: &Settle<'_>) -> Result<Fence, StoreError> {
        self.step().await;
        self.inner.settle_event(settle).await
    }
    async fn renew_event(&self, renew: &RenewLease<'_>) -> Result<Fence, StoreError> {
        self.step().await;
        self.inner.renew_event(renew).await
    }
    async fn get_event(&self, k: Key<'_>) -> Result<Option<InboxEvent>, StoreError> {
        self.step().await;
        self.inner.get_event(k).await
    }
    async fn purge_settled(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        self.step().await;
        self.inner.purge_settled(now, limit).await
    }
}

/// How many events each round enqueues.
const EVENTS: usize = 5;

/// Kills a worker at its k-th store call, for every k until one survives untouched,
/// then lets a fresh worker finish after the lease ran out. `handler` applies its
/// effect through the transactional mode; `effects(namespace)` counts the effect rows
/// per event id. Every event must end `Done` with exactly one effect row. Returns the
/// number of kill points tried.
pub async fn kill_at_every_step<S, H, F>(store: S, handler: H, effects: F) -> usize
where
    S: InboxStore + Clone,
    H: InboxHandler + Clone,
    F: AsyncFn(&str) -> BTreeMap<String, i64>,
{
    let clock = ManualClock::new(now_ms());
    let mut k = 0;
    loop {
        let namespace = format!("kill{k}_{:08x}", FencingToken::random().0 as u32);
        for i in 0..EVENTS {
            let id = format!("k{i}");
            let payload = id.clone().into_bytes();
            let meta = EventMeta::default();
            let now = webhook_guard::clock::Clock::now(&clock);
            let event = NewEvent {
                key: Key::new(&namespace, &id),
                fingerprint: Fingerprint::of(&payload),
                meta: &meta,
                payload: &payload,
                now,
                expires_at: now + TimeDelta::hours(72),
            };
            assert_eq!(store.enqueue(&event).await.unwrap(), Enqueued::Inserted);
        }
        let dying = Arc::new(DiesAt {
            inner: store.clone(),
            calls: AtomicUsize::new(0),
            die_at: k,
            died: Notify::new(),
        });
        let doomed = Worker::new(dying.clone(), namespace.clone(), handler.clone())
            .clock(Arc::new(clock.clone()))
            .concurrency(2)
            .lease(Duration::from_secs(30));
        let killed = loop {
            tokio::select! {
                ran = doomed.run_once() => if ran.unwrap() == 0 { break false },
                () = dying.died.notified() => break true,
            }
        };
        // The process is gone; after its leases run out a fresh worker finishes.
        clock.advance(TimeDelta::seconds(31));
        let survivor = Worker::new(Arc::new(store.clone()), namespace.clone(), handler.clone())
            .clock(Arc::new(clock.clone()))
            .concurrency(10);
        while survivor.run_once().await.unwrap() > 0 {}
        for i in 0..EVENTS {
            let e = store
                .get_event(Key::new(&namespace, &format!("k{i}")))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(e.state, InboxState::Done, "k{i} processed (killed at {k})");
        }
        let applied = effects(&namespace).await;
        let want: BTreeMap<String, i64> = (0..EVENTS).map(|i| (format!("k{i}"), 1)).collect();
        assert_eq!(applied, want, "one effect per event (killed at call {k})");
        if !killed {
            return k;
        }
        k += 1;
    }
}

/// A NUL in signed JSON metadata and in a handler's error: PostgreSQL refuses NUL in
/// text, so the guard keeps U+FFFD in its place, and the event is stored, retried
/// and applied on every store (before, the event could not be stored, or once
/// failed, could never be settled).
async fn text_with_nul_is_stored<S>(store: S)
where
    S: ProcessedStore + InboxStore + OrderingStore + Clone,
{
    let namespace = format!("nul_{:016x}", FencingToken::random().0);
    let (guard, clock) = inbox_guard(&store, &namespace);
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let worker = {
        let seen = seen.clone();
        guard
            .worker(move |e: InboxEvent| {
                let seen = seen.clone();
                async move {
                    let mut seen = seen.lock().unwrap();
                    seen.push((
                        e.meta.event_type.clone().unwrap_or_default(),
                        e.meta.object.clone().unwrap_or_default(),
                    ));
                    match seen.len() {
                        1 => Err(webhook_guard::HandlerError::retryable("bad \0 byte")),
                        _ => Ok(()),
                    }
                }
            })
            .unwrap()
    };
    let body = br#"{"id":"n1","type":"charge.\u0000updated","object":"ch_\u0000","created":10}"#;
    let headers = [("content-type", "application/json")];
    let outcome = guard.accept(&headers, body).await;
    assert!(
        matches!(outcome, Outcome::Accepted { new: true, .. }),
        "{outcome:?}"
    );
    while worker.run_once().await.unwrap() > 0 {}
    clock.advance(TimeDelta::hours(1));
    while worker.run_once().await.unwrap() > 0 {}
    let event = store
        .get_event(Key::new(&namespace, "n1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(event.state, InboxState::Done, "{event:?}");
    let expected = (
        "charge.\u{FFFD}updated".to_owned(),
        "ch_\u{FFFD}".to_owned(),
    );
    assert_eq!(*seen.lock().unwrap(), [expected.clone(), expected]);
}
