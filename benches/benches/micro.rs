//! Criterion micro-benchmarks of the guard's hot paths on `MemoryStore`, for
//! development (`cargo bench --bench micro`). The side-by-side ratios of the issue
//! come from `benches/compare.rs`.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use webhook_guard::store::{ClaimRequest, FencingToken, Fingerprint, Key};
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, HandlerError, MemoryStore, ProcessedStore, WebhookGuard};

const BODY: &[u8] =
    br#"{"id":"evt_1","type":"charge.succeeded","data":{"object":{"id":"ch_1","amount":2000}}}"#;

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

fn guard() -> WebhookGuard {
    WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(NoVerification)
        .event_id(EventId::header("x-event-id"))
        .build()
        .unwrap()
}

fn handle(guard: &WebhookGuard, id: &str) -> webhook_guard::Outcome {
    let headers = [("x-event-id", id)];
    ready(guard.handle(&headers, BODY, |_| async { Ok::<(), HandlerError>(()) }))
}

fn guard_paths(c: &mut Criterion) {
    let g = guard();
    let mut i = 0u64;
    c.bench_function("guard_cycle_unique_id", |b| {
        b.iter_batched(
            || {
                i += 1;
                format!("evt_{i:026}")
            },
            |id| black_box(handle(&g, &id)),
            BatchSize::SmallInput,
        )
    });
    handle(&g, "evt_duplicate");
    c.bench_function("guard_duplicate", |b| {
        b.iter(|| black_box(handle(&g, "evt_duplicate")))
    });
    c.bench_function("fingerprint_sha256", |b| {
        b.iter(|| black_box(Fingerprint::of(black_box(BODY))))
    });
}

fn store_paths(c: &mut Criterion) {
    let store = MemoryStore::new();
    let now = chrono::Utc::now();
    let req = |id| ClaimRequest {
        key: Key::new("default", id),
        fingerprint: Fingerprint::default(),
        token: FencingToken::random(),
        now,
        lease_until: now + chrono::TimeDelta::minutes(5),
        expires_at: now + chrono::TimeDelta::hours(72),
    };
    ready(store.claim(&req("evt_existing"))).unwrap();
    c.bench_function("store_claim_existing", |b| {
        b.iter(|| black_box(ready(store.claim(&req("evt_existing"))).unwrap()))
    });
    c.bench_function("fencing_token_random", |b| {
        b.iter(|| black_box(FencingToken::random()))
    });
}

criterion_group!(benches, guard_paths, store_paths);
criterion_main!(benches);
