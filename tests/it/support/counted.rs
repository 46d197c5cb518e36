//! A store that counts every call of the core contract and forwards it, and lists
//! nothing (a store written against the core contract only).

use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use webhook_guard::store::{
    Claim, ClaimRequest, Deleted, Fence, Finish, Holder, Key, ProcessedStore, Record, Renew,
};
use webhook_guard::{MemoryStore, StoreError};

/// Counts every call, then forwards it to `inner`.
#[derive(Debug, Default)]
pub struct Counted<S = MemoryStore> {
    pub inner: S,
    pub calls: AtomicUsize,
}

impl<S> Counted<S> {
    /// The calls made since the last `take`.
    pub fn take(&self) -> usize {
        self.calls.swap(0, Ordering::SeqCst)
    }

    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl<S: ProcessedStore> ProcessedStore for Counted<S> {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.tick();
        self.inner.claim(request).await
    }

    async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError> {
        self.tick();
        self.inner.finish(holder, finish).await
    }

    async fn renew(&self, holder: Holder<'_>, renew: &Renew) -> Result<Fence, StoreError> {
        self.tick();
        self.inner.renew(holder, renew).await
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
