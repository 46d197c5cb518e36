//! The guard makes only the store round trips the semantics need: claim + complete
//! for a processed delivery, a single claim for a duplicate.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use webhook_guard::store::{
    Claim, ClaimRequest, Deleted, Fence, FencingToken, Finish, Key, ProcessedStore, Record,
};
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, HandlerError, MemoryStore, Outcome, StoreError, WebhookGuard};

/// Counts every call, then forwards it to a `MemoryStore`.
#[derive(Debug, Default)]
struct Counted {
    inner: MemoryStore,
    calls: AtomicUsize,
}

impl Counted {
    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl ProcessedStore for Counted {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.tick();
        self.inner.claim(request).await
    }

    async fn finish(
        &self,
        key: Key<'_>,
        token: FencingToken,
        finish: &Finish<'_>,
    ) -> Result<Fence, StoreError> {
        self.tick();
        self.inner.finish(key, token, finish).await
    }

    async fn renew(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        self.tick();
        self.inner.renew(key, token, lease_until, expires_at).await
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        self.tick();
        self.inner.get(key).await
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        self.tick();
        self.inner.delete(key, now).await
    }

    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        self.tick();
        self.inner.purge_expired(now, limit).await
    }

    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.tick();
        self.inner.stuck(now, limit).await
    }
}

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

#[test]
fn processed_takes_two_round_trips_and_a_duplicate_one() {
    let store = Arc::new(Counted::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-event-id"))
        .build()
        .unwrap();
    let headers = [("x-event-id", "evt_1")];
    let deliver = || ready(guard.handle(&headers, b"{}", |_| async { Ok::<(), HandlerError>(()) }));

    let outcome = deliver();
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(store.calls.swap(0, Ordering::SeqCst), 2, "claim + complete");

    let outcome = deliver();
    assert!(matches!(outcome, Outcome::Duplicate { .. }), "{outcome:?}");
    assert_eq!(store.calls.swap(0, Ordering::SeqCst), 1, "a single claim");
}
