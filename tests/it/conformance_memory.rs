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
    conformance::listing::run_all(&MemoryStore::new()).await;
}

#[tokio::test]
async fn a_single_shard_store_passes_too() {
    conformance::run_all(&MemoryStore::with_shards(1)).await;
}

/// Claims racing on four threads, released together by a barrier, for 500 ids:
/// the suite's own race on threads, in a second form.
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
    conformance::listing::run_inbox(&store).await;
}

/// The inbox suite's concurrent leases run on one task; here four threads lease
/// the same 200 due events at once, released together: none is leased twice, and
/// all are leased.
#[test]
fn leases_racing_on_threads_are_exclusive() {
    use webhook_guard::inbox::{InboxStore, LeaseRequest, NewEvent};
    use webhook_guard::meta::EventMeta;
    let store = MemoryStore::new();
    let now = Utc::now();
    let meta = EventMeta::default();
    for i in 0..200 {
        let id = format!("evt-{i}");
        let event = NewEvent {
            key: Key::new("threads", &id),
            fingerprint: Fingerprint::of(b"p"),
            meta: &meta,
            payload: b"p",
            now,
            expires_at: now + Duration::from_secs(3600),
        };
        ready(store.enqueue(&event)).expect("enqueue");
    }
    let barrier = Barrier::new(4);
    let leased = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                barrier.wait();
                loop {
                    let until = now + Duration::from_secs(60);
                    let got = ready(store.lease(&LeaseRequest {
                        namespace: "threads",
                        now,
                        lease_until: until,
                        limit: 7,
                    }))
                    .expect("lease");
                    if got.is_empty() {
                        break;
                    }
                    leased.lock().unwrap().extend(got.into_iter().map(|e| e.id));
                }
            });
        }
    });
    let mut ids = leased.into_inner().unwrap();
    ids.sort();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "no event leased twice");
    assert_eq!(n, 200, "every due event leased");
}

/// Observations of one object racing on four threads keep the newest, and each
/// answer is stale only against a newer time.
#[test]
fn observations_racing_on_threads_keep_the_newest() {
    use webhook_guard::ordering::{Freshness, ObjectKey, Observation, OrderingStore};
    let store = MemoryStore::new();
    let now = Utc::now();
    for round in 0..200 {
        let object = format!("trx-{round}");
        let key = ObjectKey {
            namespace: "threads",
            object: &object,
            family: "charge",
        };
        let barrier = Barrier::new(4);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (store, barrier) = (&store, &barrier);
                s.spawn(move || {
                    let created = now + Duration::from_secs(t);
                    barrier.wait();
                    match ready(store.observe(&Observation {
                        key,
                        created_at: created,
                        now,
                    }))
                    .expect("observe")
                    {
                        Freshness::Fresh => {}
                        Freshness::Stale { newest } => assert!(newest > created),
                    }
                });
            }
        });
        let newest = ready(store.get_object(key)).unwrap().unwrap().newest;
        assert_eq!(newest, now + Duration::from_secs(3), "{object}");
    }
}
