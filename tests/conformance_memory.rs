//! The public conformance suite on the built-in `MemoryStore`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use chrono::Utc;
use webhook_guard::conformance;
use webhook_guard::store::{Claim, ClaimRequest, FencingToken, Fingerprint, Key, ProcessedStore};
use webhook_guard::MemoryStore;

#[tokio::test]
async fn memory_store_passes_the_conformance_suite() {
    conformance::run_all(&MemoryStore::new()).await;
}

#[tokio::test]
async fn a_single_shard_store_passes_too() {
    conformance::run_all(&MemoryStore::with_shards(1)).await;
}

/// The conformance suite's concurrent claims run on one task; here they race on
/// four threads, released together, for 500 ids.
#[test]
fn claims_racing_on_threads_have_one_winner() {
    for store in [MemoryStore::new(), MemoryStore::with_shards(1)] {
        let now = Utc::now();
        for round in 0..500 {
            let id = format!("race-{round}");
            let barrier = Barrier::new(4);
            let wins = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        let request = ClaimRequest {
                            key: Key::new("threads", &id),
                            fingerprint: Fingerprint::of(b"same"),
                            token: FencingToken::random(),
                            now,
                            lease_until: now + Duration::from_secs(60),
                            expires_at: now + Duration::from_secs(3600),
                        };
                        barrier.wait();
                        let claim = ready(store.claim(&request)).expect("claim");
                        if matches!(claim, Claim::Acquired(_)) {
                            wins.fetch_add(1, Ordering::SeqCst);
                        }
                    });
                }
            });
            assert_eq!(wins.load(Ordering::SeqCst), 1, "one winner for {id}");
        }
    }
}

/// Polls a memory store's future, which is ready at once.
fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("the memory store never waits"),
    }
}

#[tokio::test]
async fn memory_store_passes_the_inbox_and_ordering_suites() {
    let store = MemoryStore::new();
    conformance::inbox::run_all(&store).await;
    conformance::ordering::run_all(&store).await;
}
