//! A complete store, every record in one `Mutex<HashMap>`, checked by the public conformance
//! suite, then used by a guard: `cargo run --example custom_store --features conformance`.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use webhook_guard::store::{
    async_trait, Claim, ClaimRequest, Decision, Deleted, Fence, Finish, Holder, Key,
    ProcessedStore, Record, Renew, StoreError,
};
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, WebhookGuard};

/// Every record under one lock, held through each call: simple, correct, one process.
#[derive(Debug, Default)]
struct HashMapStore(Mutex<HashMap<(String, String), Record>>);

fn owned(key: Key<'_>) -> (String, String) {
    (key.namespace.to_owned(), key.id.to_owned())
}

impl HashMapStore {
    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), Record>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()) // no call panics mid-write
    }
}

#[async_trait]
impl ProcessedStore for HashMapStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let mut records = self.lock();
        let existing = records.get(&owned(request.key));
        let next = match (request.decide(existing), existing) {
            (Decision::Keep, Some(record)) => return Ok(Claim::Existing(record.clone())),
            (Decision::TakeOver, Some(record)) => record.taken_over(request),
            _ => Record::claimed(request),
        };
        records.insert(owned(request.key), next.clone());
        Ok(Claim::Acquired(next))
    }

    async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError> {
        let Holder { key, token } = holder;
        let mut records = self.lock();
        let record = records.get_mut(&owned(key));
        Ok(record.map_or(Fence::LeaseLost, |r| r.apply_finish(token, finish)))
    }

    async fn renew(&self, holder: Holder<'_>, renew: &Renew) -> Result<Fence, StoreError> {
        let Holder { key, token } = holder;
        let mut records = self.lock();
        let record = records.get_mut(&owned(key));
        let fence = record.map(|r| r.apply_renew(token, renew));
        Ok(fence.unwrap_or(Fence::LeaseLost))
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        Ok(self.lock().get(&owned(key)).cloned())
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        let mut records = self.lock();
        if records.get(&owned(key)).is_some_and(|r| r.lease_live(now)) {
            return Ok(Deleted::LeaseHeld);
        }
        Ok(match records.remove(&owned(key)) {
            Some(_) => Deleted::Removed,
            None => Deleted::NotFound,
        })
    }

    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let mut removed = 0;
        self.lock().retain(|_, record| {
            let purge = removed < limit && record.purgeable(now);
            removed += usize::from(purge);
            !purge
        });
        Ok(removed as u64)
    }

    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        let records = self.lock();
        let expired = records.values().filter(|r| r.lease_expired(now));
        let mut stuck: Vec<Record> = expired.cloned().collect();
        stuck.sort_by_key(|r| r.lease_until); // the longest-expired leases first
        stuck.truncate(limit);
        Ok(stuck)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = HashMapStore::default();
    // The same checks every built-in store passes; each panics naming the broken rule.
    webhook_guard::conformance::run_all(&store).await;
    println!("HashMapStore passes the conformance suite");
    let guard = WebhookGuard::builder()
        .store(store)
        .verifier(NoVerification)
        .event_id(EventId::header("x-event-id"))
        .build()?;
    for (attempt, expected) in [("first delivery", "processed"), ("retry", "duplicate")] {
        let headers = [("x-event-id", "evt_42")];
        let outcome = guard.handle(&headers, b"{}", |_| async { Ok(()) }).await;
        assert_eq!(outcome.kind().as_str(), expected);
        println!("{attempt}: {expected} ({})", guard.answer(&outcome).status);
    }
    Ok(())
}
