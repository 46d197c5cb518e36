//! The inbox worker's settle under a store cut, injected with a TCP proxy between
//! the worker and the real PostgreSQL, MariaDB and Redis servers.
//!
//! Each event's handler runs, then the store is cut just as it finishes (its settle
//! fails), and restored after a pause.
//! - `settle_cut_within_lease_*`: the pause is shorter than the worker's lease: the
//!   worker makes the settle again once the store is back, every event ends `Done`
//!   and, past the lease, no event runs twice.
//! - `settle_cut_past_lease_*`: the pause is longer than the lease: the worker gives
//!   up when its lease ends, and each event runs again once the store is back (at
//!   least once, never lost) and ends `Done`.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use support::backends::{self, host_port, Backend};
use support::proxy::FaultProxy;
use webhook_guard::inbox::{Enqueued, InboxEvent, InboxState, NewEvent, Worker};
use webhook_guard::meta::EventMeta;
use webhook_guard::store::{FencingToken, Fingerprint, Key};

/// Events per scenario, leased together.
const EVENTS: usize = 6;

/// Millisecond-precision "now", as the SQL stores keep it.
fn now_ms() -> DateTime<Utc> {
    DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap()
}

async fn settle_cut(backend: Backend, lease: Duration, cut: Duration) {
    let Some(url) = support::server_url(backend.url_var().unwrap()) else {
        return;
    };
    let proxy = Arc::new(FaultProxy::start(&host_port(&url)).await);
    let (inbox, cleanup) = backends::inbox(backend, 4, Some(&proxy.addr()))
        .await
        .unwrap();
    let namespace = format!("settle_{:016x}", FencingToken::random().0);
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("s{i}")).collect();
    for id in &ids {
        let meta = EventMeta::default();
        let now = now_ms();
        let event = NewEvent {
            key: Key::new(&namespace, id),
            fingerprint: Fingerprint::of(id.as_bytes()),
            meta: &meta,
            payload: id.as_bytes(),
            now,
            expires_at: now + TimeDelta::hours(72),
        };
        assert_eq!(inbox.enqueue(&event).await.unwrap(), Enqueued::Inserted);
    }

    // Each first run says it started and waits for `go`: the store is cut just
    // before every handler finishes. Later runs finish at once.
    let runs: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let handler = {
        let runs = runs.clone();
        move |e: InboxEvent| {
            let (runs, started_tx, mut go_rx) = (runs.clone(), started_tx.clone(), go_rx.clone());
            async move {
                let first = {
                    let mut runs = runs.lock().unwrap();
                    let n = runs.entry(e.id.clone()).or_default();
                    *n += 1;
                    *n == 1
                };
                if first {
                    let _ = started_tx.send(());
                    let _ = go_rx.wait_for(|go| *go).await;
                }
                Ok(())
            }
        }
    };
    let worker = Worker::new(inbox.clone(), namespace.clone(), handler)
        .concurrency(EVENTS)
        .lease(lease)
        .poll_interval(Duration::from_millis(100))
        .spawn();

    let all_started = async {
        for _ in 0..EVENTS {
            started_rx.recv().await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all_started)
        .await
        .expect("every event was leased and started");
    let cut_at = tokio::time::Instant::now();
    proxy.cut();
    go_tx.send(true).unwrap();
    tokio::time::sleep(cut).await;
    proxy.restore();

    // Every event ends `Done` (bounded: a lease after the cut, and a margin).
    let settled = async {
        loop {
            let mut done = 0;
            for id in &ids {
                if let Ok(Some(e)) = inbox.get_event(Key::new(&namespace, id)).await {
                    done += usize::from(e.state == InboxState::Done);
                }
            }
            if done == EVENTS {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let limit = cut + lease * 2 + Duration::from_secs(30);
    tokio::time::timeout(limit, settled)
        .await
        .expect("every event ended Done");
    // Past the lease taken before the cut (and a margin): no event runs again.
    tokio::time::sleep_until(cut_at + cut.max(lease) + Duration::from_secs(3)).await;
    worker.shutdown().await;

    let runs = runs.lock().unwrap().clone();
    let mut handler_runs = 0;
    let (mut twice, mut lost) = (0, 0);
    for id in &ids {
        let r = runs.get(id).copied().unwrap_or(0);
        handler_runs += r;
        twice += usize::from(r > 1);
        lost += usize::from(r == 0);
        let e = inbox
            .get_event(Key::new(&namespace, id))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(e.state, InboxState::Done, "{id}: {e:?}");
    }
    let scenario = if cut < lease {
        "settle_cut_within_lease"
    } else {
        "settle_cut_past_lease"
    };
    println!(
        "RESULT backend={} scenario={scenario} lease={}s cut={}s events={EVENTS} handler_runs={handler_runs} applied_twice={twice} lost={lost} connections_reset={}",
        backend.name(),
        lease.as_secs_f64(),
        cut.as_secs_f64(),
        proxy.killed(),
    );
    assert_eq!(lost, 0, "events never run: {runs:?}");
    if cut < lease {
        assert_eq!(twice, 0, "events run twice: {runs:?}");
    } else {
        // The store stayed down past the lease: the settle was given up, and every
        // event ran again once its lease had run out.
        assert_eq!(twice, EVENTS, "every event ran again: {runs:?}");
    }
    cleanup.run().await;
}

/// A 2 s cut under an 8 s lease.
async fn within_lease(backend: Backend) {
    settle_cut(backend, Duration::from_secs(8), Duration::from_secs(2)).await;
}

/// A 6 s cut under a 3 s lease.
async fn past_lease(backend: Backend) {
    settle_cut(backend, Duration::from_secs(3), Duration::from_secs(6)).await;
}

backends::per_backend!(within_lease:
    settle_cut_within_lease_postgres => Postgres,
    settle_cut_within_lease_mariadb => MySql,
    settle_cut_within_lease_redis => Redis,
);

#[cfg(feature = "dynamodb")]
backends::per_backend!(within_lease:
    settle_cut_within_lease_dynamodb => DynamoDb,
);

backends::per_backend!(past_lease:
    settle_cut_past_lease_postgres => Postgres,
    settle_cut_past_lease_mariadb => MySql,
    settle_cut_past_lease_redis => Redis,
);

#[cfg(feature = "dynamodb")]
backends::per_backend!(past_lease:
    settle_cut_past_lease_dynamodb => DynamoDb,
);
