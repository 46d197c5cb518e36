//! A store that counts every call of the core contract and forwards it, and lists
//! nothing (a store written against the core contract only). It can also refuse to
//! release follow-up markers, as a process dying after its hook would leave them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
    /// While set, the finish of a follow-up marker (its namespace starts with
    /// `\u{1}followup:`) fails as if the process died before it.
    pub keep_markers: AtomicBool,
}

impl<S> Counted<S> {
    /// Counts the calls to `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            calls: AtomicUsize::default(),
            keep_markers: AtomicBool::default(),
        }
    }

    /// The calls made since the last `take`, without resetting them.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

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
        let marker = holder.key.namespace.starts_with("\u{1}followup:");
        if marker && self.keep_markers.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("the process died (test)"));
        }
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
