//! What an outage's deliveries are answered, and what they leave behind.
//!
//! - `stopped_server_*`: the server goes away (the proxy stops listening, as a
//!   killed server does) behind a pool that would wait 30 s for a connection: the
//!   delivery is answered 503 once the guard's store timeout (default 2 s) ran out,
//!   long before the pool would give up and well inside Stripe's 5 s.
//! - `refused_claims_then_a_lost_reply_redis`: while the server refuses
//!   connections, 100 deliveries are answered 503 with nothing sent, so no claim is
//!   looked for; then one claim's reply is lost (the server applied it after the
//!   guard stopped waiting). That claim is looked for and released, so its
//!   redelivery is processed at once — not answered 409 until the lease runs out —
//!   and no failure is counted.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::backends::{self, host_port, via, Backend, Cleanup};
use support::proxy::FaultProxy;
use webhook_guard::outcome::OutcomeKind;
use webhook_guard::store::{DynProcessedStore, RecordState, StoreError};
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, Outcome, WebhookGuard};

fn guard(store: std::sync::Arc<DynProcessedStore>) -> WebhookGuard {
    WebhookGuard::builder()
        .store(store)
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .lease(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn deliver(guard: &WebhookGuard, id: &str, runs: &AtomicUsize) -> Outcome {
    let headers = [("x-id", id)];
    guard
        .handle(&headers, b"{}", |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .await
}

/// A store of `backend` through `proxy`, on a pool that waits 30 s for a
/// connection (sqlx's default).
async fn patient_store(
    backend: Backend,
    proxy: &FaultProxy,
) -> (std::sync::Arc<DynProcessedStore>, Cleanup) {
    let url = support::server_url(backend.url_var().unwrap()).unwrap();
    let table = backends::unique("wg_budget");
    let through = via(&url, &proxy.addr());
    let store: std::sync::Arc<DynProcessedStore> = match backend {
        Backend::Postgres => {
            use webhook_guard::store::postgres::sqlx::postgres::PgPoolOptions;
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(30))
                .connect(&through)
                .await
                .unwrap();
            let store = webhook_guard::store::PostgresStore::with_table(pool, &table).unwrap();
            store.migrate().await.unwrap();
            std::sync::Arc::new(store)
        }
        Backend::MySql => {
            use webhook_guard::store::mysql::sqlx::mysql::MySqlPoolOptions;
            let pool = MySqlPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(30))
                .connect(&through)
                .await
                .unwrap();
            let store = webhook_guard::store::MySqlStore::new(pool)
                .with_table(&table)
                .unwrap();
            store.migrate().await.unwrap();
            std::sync::Arc::new(store)
        }
        other => panic!("{} has no pool", other.name()),
    };
    (store, Cleanup::Table { url, table })
}

async fn stopped_server(backend: Backend) {
    let Some(url) = support::server_url(backend.url_var().unwrap()) else {
        return;
    };
    let proxy = FaultProxy::start(&host_port(&url)).await;
    let (store, cleanup) = patient_store(backend, &proxy).await;
    let guard = guard(store);
    let runs = AtomicUsize::new(0);
    assert!(matches!(
        deliver(&guard, "evt_before", &runs).await,
        Outcome::Processed { .. }
    ));

    proxy.down().await;
    let started = Instant::now();
    let outcome = deliver(&guard, "evt_during", &runs).await;
    let waited = started.elapsed();
    let Outcome::StoreUnavailable { error, .. } = &outcome else {
        panic!("a stopped server is 503: {outcome:?}");
    };
    assert!(
        error.to_string().contains("store timeout"),
        "answered by the guard's store timeout: {error}"
    );
    assert_eq!(guard.answer(&outcome).status.as_u16(), 503);
    // The pool alone would have waited 30 s; the store timeout is 2 s.
    assert!(
        waited < Duration::from_secs(15),
        "answered by the store timeout, not the pool's 30 s: {waited:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "nothing ran during the outage"
    );
    println!(
        "RESULT backend={} scenario=stopped_server store_timeout=2s pool_timeout=30s answered=503 after_ms={}",
        backend.name(),
        waited.as_millis()
    );
    proxy.up().await;
    cleanup.run().await;
}

backends::per_backend!(stopped_server:
    stopped_server_is_answered_within_the_store_timeout_postgres => Postgres,
    stopped_server_is_answered_within_the_store_timeout_mariadb => MySql,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_claims_then_a_lost_reply_redis() {
    let Some(url) = support::server_url("WEBHOOK_GUARD_REDIS_URL") else {
        return;
    };
    let proxy = FaultProxy::start(&host_port(&url)).await;
    let (store, cleanup) = backends::store(Backend::Redis, 4, Some(&proxy.addr()))
        .await
        .unwrap();
    let guard = guard(store);
    let runs = AtomicUsize::new(0);
    assert!(matches!(
        deliver(&guard, "evt_warm", &runs).await,
        Outcome::Processed { .. }
    ));

    // The server is gone: connections are refused.
    proxy.down().await;
    let mut not_sent = 0;
    for i in 0..100 {
        let outcome = deliver(&guard, &format!("evt_refused_{i}"), &runs).await;
        let Outcome::StoreUnavailable { error, .. } = &outcome else {
            panic!("refused: {outcome:?}");
        };
        not_sent += usize::from(matches!(error, StoreError::NotSent { .. }));
    }
    // The first may find the old connection broken mid-write instead.
    assert!(not_sent >= 98, "{not_sent} of 100 known unsent");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Back, then one claim whose reply comes after the guard stopped waiting.
    proxy.up().await;
    let mut back = false;
    for _ in 0..100 {
        if let Outcome::Processed { .. } = deliver(&guard, "evt_back", &runs).await {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "the store reconnected");
    proxy.delay(Duration::from_secs(3));
    let lost = deliver(&guard, "evt_lost", &runs).await;
    proxy.delay(Duration::ZERO);
    assert_eq!(lost.kind(), OutcomeKind::StoreUnavailable, "{lost:?}");
    let runs_before = runs.load(Ordering::SeqCst);

    // The claim landed; it is found and released by the guard's search.
    let mut state = None;
    for _ in 0..150 {
        state = guard.inspect("evt_lost").await.unwrap().map(|r| r.state);
        if state.is_some_and(|s| s != RecordState::InProgress) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        state,
        Some(RecordState::Failed),
        "the lost claim was released, not left to its 60 s lease"
    );
    let again = deliver(&guard, "evt_lost", &runs).await;
    assert_eq!(
        again.kind(),
        OutcomeKind::Processed,
        "processed at its redelivery"
    );
    assert_eq!(runs.load(Ordering::SeqCst), runs_before + 1);
    let record = guard.inspect("evt_lost").await.unwrap().unwrap();
    assert_eq!(
        record.failures, 0,
        "a claim whose handler never ran counts no failure"
    );
    println!(
        "RESULT backend=redis scenario=refused_then_lost deliveries=100 refused not_sent={not_sent} lost_reply=1 processed_at_redelivery=yes failures=0"
    );
    cleanup.run().await;
}
