//! Load: deliveries with 10 % duplicates at 64-way concurrency against every backend.
//! No event lost, none processed twice, no outcome other than the expected ones; on
//! the memory store, with a short retention and the sweeper's pass once per simulated
//! second, `MemoryStore::len()` stays bounded.
//!
//! CI runs 5,000 deliveries per backend; `WEBHOOK_GUARD_LONG=1` runs 100,000.
//!
//! Time is a manual clock moved one second per batch of deliveries; every duplicate
//! is delivered in the same batch as its original (a provider's retries come within
//! its window, and retention here is several batches long).

use crate::support;

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta};
use futures_util::stream::{self, StreamExt};
use support::backends::{self, Backend};
use webhook_guard::clock::ManualClock;
use webhook_guard::outcome::OutcomeKind;
use webhook_guard::verify::HmacSha256Header;
use webhook_guard::{EventId, MemoryStore, WebhookGuard};

const CONCURRENCY: usize = 64;

fn total() -> usize {
    if std::env::var_os("WEBHOOK_GUARD_LONG").is_some() {
        100_000
    } else {
        5_000
    }
}

async fn load(backend: Backend) {
    let Some((store, cleanup)) = backends::store(backend, 32, None).await else {
        return;
    };
    // For the memory store, keep a typed handle to read `len()`.
    let memory = if backend == Backend::Memory {
        Some(MemoryStore::new())
    } else {
        None
    };
    let store = match &memory {
        Some(m) => Arc::new(m.clone()) as Arc<_>,
        None => store,
    };
    let clock = ManualClock::new(DateTime::from_timestamp(1_700_000_000, 0).unwrap());
    let total = total();
    let events = total * 10 / 11; // plus 10 % duplicates
    let batches = 20;
    let batch = events.div_ceil(batches);
    let retention_secs = 3; // batches
    let guard = WebhookGuard::builder()
        .store(store)
        .verifier(HmacSha256Header::new("X-Signature", ["load-secret-0123456789"]).unwrap())
        .event_id(EventId::json_field(["id"]))
        .clock(clock.clone())
        .lease(Duration::from_secs(1))
        .retention(Duration::from_secs(retention_secs))
        .build()
        .unwrap();
    let sweeper = guard.sweeper().batch(10_000).max_batches(1_000);
    let signer = HmacSha256Header::new("X-Signature", ["load-secret-0123456789"]).unwrap();
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..events).map(|_| AtomicU32::new(0)).collect());
    let unexpected = AtomicUsize::new(0);
    let in_progress = AtomicUsize::new(0);
    let duplicates_answered = AtomicUsize::new(0);
    let mut deliveries = 0usize;
    let mut planned = 0usize;
    let mut max_len = 0usize;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for b in 0..batches {
        let range = (b * batch)..((b + 1) * batch).min(events);
        let mut order: Vec<usize> = range.clone().collect();
        order.extend(range.clone().step_by(10));
        for i in (1..order.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            order.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        planned += order.len();
        let mut pending = order;
        // The provider retries whatever was not acknowledged (a duplicate that met
        // its original in flight gets 409 and comes back).
        while !pending.is_empty() {
            deliveries += pending.len();
            let retry: Vec<usize> = stream::iter(pending)
                .map(|i| {
                    let guard = &guard;
                    let signer = &signer;
                    let runs = &runs;
                    let (unexpected, in_progress, duplicates_answered) =
                        (&unexpected, &in_progress, &duplicates_answered);
                    async move {
                        let body = format!(r#"{{"id":"evt_{i:07}","amount":{i}}}"#);
                        let sig = signer.sign(body.as_bytes());
                        let outcome = guard
                            .handle(
                                &[("X-Signature", sig.as_str())],
                                body.as_bytes(),
                                |_| async {
                                    runs[i].fetch_add(1, Ordering::SeqCst);
                                    // A handler that waits once, so that deliveries
                                    // overlap on every store (the memory store's
                                    // calls never wait: without this, each delivery
                                    // would end before the next began).
                                    tokio::task::yield_now().await;
                                    Ok(())
                                },
                            )
                            .await;
                        match outcome.kind() {
                            OutcomeKind::Processed => None,
                            OutcomeKind::Duplicate => {
                                duplicates_answered.fetch_add(1, Ordering::SeqCst);
                                None
                            }
                            OutcomeKind::InProgress => {
                                in_progress.fetch_add(1, Ordering::SeqCst);
                                Some(i)
                            }
                            _ => {
                                eprintln!("evt {i}: unexpected {outcome}");
                                unexpected.fetch_add(1, Ordering::SeqCst);
                                Some(i)
                            }
                        }
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .filter_map(|r| async move { r })
                .collect()
                .await;
            assert!(
                unexpected.load(Ordering::SeqCst) == 0,
                "unexpected outcomes on {}",
                backend.name()
            );
            pending = retry;
        }
        // One simulated second passes; the sweeper makes its pass.
        clock.advance(TimeDelta::seconds(1));
        let report = sweeper.sweep().await.unwrap();
        if let Some(m) = &memory {
            max_len = max_len.max(m.len());
            let _ = report;
        }
    }
    let mut lost = 0;
    let mut twice = 0;
    let mut handler_runs = 0u64;
    for r in runs.iter() {
        let r = r.load(Ordering::SeqCst);
        handler_runs += u64::from(r);
        lost += usize::from(r == 0);
        twice += usize::from(r > 1);
    }
    println!(
        "RESULT backend={} scenario=load deliveries={deliveries} events={events} duplicates={} concurrency={CONCURRENCY} faults=none handler_runs={handler_runs} lost={lost} twice={twice} duplicates_answered={} in_progress_409={} unexpected={} memory_max_len={}",
        backend.name(),
        planned - events,
        duplicates_answered.load(Ordering::SeqCst),
        in_progress.load(Ordering::SeqCst),
        unexpected.load(Ordering::SeqCst),
        if memory.is_some() { max_len.to_string() } else { "-".into() },
    );
    assert_eq!(lost, 0);
    assert_eq!(twice, 0);
    assert!(
        in_progress.load(Ordering::SeqCst) > 0,
        "deliveries of one id overlapped (else `twice` proves nothing) on {}",
        backend.name()
    );
    if memory.is_some() {
        // Records live `retention_secs` simulated seconds: at most that many batches
        // (plus the one just written) are ever kept, whatever the total.
        let bound = (retention_secs as usize + 1) * batch;
        assert!(max_len <= bound, "memory not flat: {max_len} > {bound}");
        assert!(
            max_len < events,
            "the bound must be below the total to mean anything"
        );
    }
    cleanup.run().await;
}

backends::per_backend!(load:
    load_memory => Memory,
    load_sqlite => Sqlite,
    load_postgres => Postgres,
    load_mariadb => MySql,
    load_redis => Redis,
);

/// Against the DynamoDB emulator the run takes about 90 s (the emulator's pace, not
/// the store's), so it is left out of the default run: `-- load::load_dynamodb
/// --ignored`.
#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about 90 s against the DynamoDB emulator"]
async fn load_dynamodb() {
    load(Backend::DynamoDb).await;
}
