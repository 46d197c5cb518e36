//! The delivery span as a tracing subscriber sees it: one `webhook_delivery` span per
//! delivery, its fields recorded as the flow learns them, and the outcome event
//! logged inside it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_core::span::Current;
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, HandlerError, MemoryStore, Outcome, WebhookGuard};

/// Spans (name and fields by id), the entered stack, and events with the span
/// they were logged in.
#[derive(Default)]
struct Recorder {
    next: AtomicU64,
    spans: Mutex<HashMap<u64, (&'static Metadata<'static>, Fields)>>,
    stack: Mutex<Vec<u64>>,
    events: Mutex<Vec<(Option<u64>, Fields)>>,
}

type Fields = HashMap<String, String>;

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

/// The subscriber: a handle on the recorder the test reads afterwards.
struct Shared(Arc<Recorder>);

impl std::ops::Deref for Shared {
    type Target = Recorder;
    fn deref(&self) -> &Recorder {
        &self.0
    }
}

impl Subscriber for Shared {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let mut fields = Fields::new();
        span.record(&mut Collect(&mut fields));
        let meta = span.metadata();
        self.spans.lock().unwrap().insert(id, (meta, fields));
        Id::from_u64(id)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut spans = self.spans.lock().unwrap();
        let (_, fields) = spans.get_mut(&span.into_u64()).expect("a known span");
        values.record(&mut Collect(fields));
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::new();
        event.record(&mut Collect(&mut fields));
        let current = self.stack.lock().unwrap().last().copied();
        self.events.lock().unwrap().push((current, fields));
    }
    fn current_span(&self) -> Current {
        match self.stack.lock().unwrap().last() {
            Some(&id) => Current::new(Id::from_u64(id), self.spans.lock().unwrap()[&id].0),
            None => Current::none(),
        }
    }
    fn enter(&self, span: &Id) {
        self.stack.lock().unwrap().push(span.into_u64());
    }
    fn exit(&self, span: &Id) {
        let popped = self.stack.lock().unwrap().pop();
        assert_eq!(popped, Some(span.into_u64()), "spans exit in order");
    }
}

#[test]
fn each_delivery_runs_in_its_span_and_records_what_the_flow_learns() {
    let recorder = Arc::new(Recorder::default());
    let _default = tracing::subscriber::set_default(Shared(recorder.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .namespace("shop")
        .build()
        .unwrap();
    let headers = [("x-id", "evt_1")];
    let deliver = || {
        runtime.block_on(guard.handle(&headers, b"{}", |_| async {
            tracing::info!("in the handler");
            Ok::<(), HandlerError>(())
        }))
    };
    assert!(matches!(deliver(), Outcome::Processed { .. }));
    assert!(matches!(deliver(), Outcome::Duplicate { .. }));

    let spans = recorder.spans.lock().unwrap();
    let mut deliveries: Vec<(&u64, &Fields)> = spans
        .iter()
        .filter(|(_, (meta, _))| meta.name() == "webhook_delivery")
        .map(|(id, (_, fields))| (id, fields))
        .collect();
    deliveries.sort_by_key(|(id, _)| **id);
    assert_eq!(deliveries.len(), 2, "one span per delivery");
    for ((_, fields), outcome) in deliveries.iter().zip(["processed", "duplicate"]) {
        assert_eq!(fields["webhook.namespace"], "shop");
        assert_eq!(fields["webhook.event_id"], "evt_1");
        assert_eq!(fields["webhook.attempt"], "1");
        assert_eq!(fields["webhook.outcome"], outcome);
        assert!(fields.contains_key("webhook.elapsed_ms"));
    }

    let events = recorder.events.lock().unwrap();
    let in_span = |id: u64, message: &str| {
        events
            .iter()
            .any(|(span, fields)| *span == Some(id) && fields["message"] == message)
    };
    let (&first, &second) = (deliveries[0].0, deliveries[1].0);
    assert!(
        in_span(first, "in the handler"),
        "the handler runs in the span"
    );
    assert!(
        in_span(first, "webhook delivery"),
        "the outcome is logged in it"
    );
    assert!(in_span(second, "webhook delivery"));
    assert!(
        recorder.stack.lock().unwrap().is_empty(),
        "every span exited"
    );
}

/// An event about an object whose `created_at` cannot be read is processed without
/// ordering, and says so.
#[test]
fn an_undated_event_is_processed_unordered_with_a_warning() {
    let recorder = Arc::new(Recorder::default());
    let _default = tracing::subscriber::set_default(Shared(recorder.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let store = MemoryStore::new();
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .ordering(store)
        .event_meta(webhook_guard::meta::MetaExtractor::stripe())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .build()
        .unwrap();
    let deliver = |id: &str, created: &str| {
        let body = format!(
            r#"{{"type":"charge.updated","created":{created},"data":{{"object":{{"id":"ch_1"}}}}}}"#
        );
        runtime.block_on(guard.handle(&[("x-id", id)], body.as_bytes(), |_| async {
            Ok::<(), HandlerError>(())
        }))
    };
    let (undated, ahead) = (UNDATED, AHEAD);
    let warnings = |id: &str, message: &str| {
        let ids = warned_ids(&recorder, message);
        ids.iter().filter(|warned| *warned == id).count()
    };
    assert!(matches!(
        deliver("evt_dated", "1700000000"),
        Outcome::Processed { .. }
    ));
    assert_eq!(
        warnings("evt_dated", undated) + warnings("evt_dated", ahead),
        0
    );
    assert!(matches!(
        deliver("evt_float", "1700000000.5"),
        Outcome::Processed { .. }
    ));
    assert_eq!(
        warnings("evt_float", undated),
        1,
        "a float created_at is not read: the event says so, once"
    );
    // Created in 2100: processed unordered, and said once.
    assert!(matches!(
        deliver("evt_ahead", "4102444800"),
        Outcome::Processed { .. }
    ));
    assert_eq!(warnings("evt_ahead", ahead), 1);
    assert_eq!(warnings("evt_ahead", undated), 0);
}

/// A failing delivery's outcome is recorded on its span too (the failure is recorded
/// in the delivery's own future, in its span).
#[test]
fn a_failure_is_reported_in_its_delivery_span() {
    let recorder = Arc::new(Recorder::default());
    let _default = tracing::subscriber::set_default(Shared(recorder.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .build()
        .unwrap();
    let outcome = runtime.block_on(guard.handle(&[("x-id", "evt_f")], b"{}", |_| async {
        Err::<(), _>(HandlerError::retryable("downstream down"))
    }));
    assert!(matches!(outcome, Outcome::RetryableFailure { .. }));
    let spans = recorder.spans.lock().unwrap();
    let (_, fields) = spans
        .values()
        .find(|(meta, _)| meta.name() == "webhook_delivery")
        .expect("a delivery span");
    assert_eq!(
        fields.get("webhook.outcome").map(String::as_str),
        Some("retryable_failure")
    );
}

/// Through the inbox, the worker says once per run why an event about an object is
/// not ordered, and stays quiet for one that is.
#[test]
fn the_worker_warns_once_about_an_unordered_event() {
    let recorder = Arc::new(Recorder::default());
    let _default = tracing::subscriber::set_default(Shared(recorder.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = MemoryStore::new();
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .ordering(store)
        .event_meta(webhook_guard::meta::MetaExtractor::stripe())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .build()
        .unwrap();
    let warnings = |message: &str| warned_ids(&recorder, message);
    runtime.block_on(async {
        for (id, created) in [
            ("evt_dated", "1700000000"),
            ("evt_float", "1700000000.5"),
            ("evt_ahead", "4102444800"),
        ] {
            let body = format!(
                r#"{{"type":"charge.updated","created":{created},"data":{{"object":{{"id":"ch_{id}"}}}}}}"#
            );
            let outcome = guard.accept(&[("x-id", id)], body.as_bytes()).await;
            assert!(matches!(outcome, Outcome::Accepted { new: true, .. }), "{outcome:?}");
        }
        let worker = guard
            .worker(|_e: webhook_guard::inbox::InboxEvent| async { Ok(()) })
            .unwrap();
        let mut ran = 0;
        while let n @ 1.. = worker.run_once().await.unwrap() {
            ran += n;
        }
        assert_eq!(ran, 3);
    });
    assert_eq!(warnings(UNDATED), ["evt_float"]);
    assert_eq!(warnings(AHEAD), ["evt_ahead"]);
}

/// The warning for an event about an object without a readable `created_at`.
const UNDATED: &str = "event has an object but no readable created_at: not ordered";
/// The warning for an event created too far ahead to be ordered.
const AHEAD: &str = "event created in the future beyond the allowed skew: not ordered";

/// The ids of the events `recorder` saw logged with `message`, in order.
fn warned_ids(recorder: &Recorder, message: &str) -> Vec<String> {
    let events = recorder.events.lock().unwrap();
    events
        .iter()
        .filter(|(_, f)| f.get("message").map(String::as_str) == Some(message))
        .map(|(_, f)| f.get("id").cloned().unwrap_or_default())
        .collect()
}

/// A Redis server that keeps nothing on disk (the test servers run without AOF and
/// without a `save` rule) is warned about when the store connects: a restart would
/// forget every record.
#[cfg(feature = "redis")]
#[test]
fn a_redis_without_persistence_is_warned_about_at_connect() {
    let url = match std::env::var("WEBHOOK_GUARD_REDIS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ if std::env::var_os("CI").is_some() => panic!("CI requires WEBHOOK_GUARD_REDIS_URL"),
        _ => return eprintln!("SKIPPED: WEBHOOK_GUARD_REDIS_URL is not set"),
    };
    let recorder = Arc::new(Recorder::default());
    let _default = tracing::subscriber::set_default(Shared(recorder.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        webhook_guard::store::RedisStore::connect(url.as_str())
            .await
            .unwrap()
    });
    let events = recorder.events.lock().unwrap();
    let warned = events.iter().any(|(_, fields)| {
        fields
            .get("message")
            .is_some_and(|m| m.contains("keeps nothing on disk"))
    });
    assert!(warned, "warned at connect: {events:?}");
}
