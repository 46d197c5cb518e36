//! A store a user writes in an afternoon: every record in one `Mutex<HashMap>`,
//! validated by the crate's public conformance suite, then used by a guard.
//!
//! Run it with `cargo run --example custom_store --features conformance`.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use webhook_guard::store::{
    Claim, ClaimRequest, Deleted, Fence, FencingToken, Fingerprint, Finish, Key, ProcessedStore,
    Record, RecordState, StoreError,
};
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, Outcome, WebhookGuard};

/// Every record under one lock: simple, correct, and fine for one process.
#[derive(Debug, Default)]
struct HashMapStore {
    records: Mutex<HashMap<(String, String), Record>>,
}

fn owned(key: Key<'_>) -> (String, String) {
    (key.namespace.to_owned(), key.id.to_owned())
}

impl HashMapStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Record>> {
        // A panic while the lock was held cannot leave a record half-written: every
        // change below is one assignment.
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl ProcessedStore for HashMapStore {
    async fn claim(&self, r: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let mut records = self.lock();
        let fresh = || {
            Record::new(
                r.key,
                RecordState::InProgress,
                r.fingerprint,
                r.token,
                1,
                0,
                r.lease_until,
                r.expires_at,
                r.now,
                r.now,
                Vec::new(),
            )
        };
        let Some(old) = records.get_mut(&owned(r.key)) else {
            let record = fresh();
            records.insert(owned(r.key), record.clone());
            return Ok(Claim::Acquired(record));
        };
        let live_lease = old.state == RecordState::InProgress && old.lease_until > r.now;
        if old.expires_at <= r.now && !live_lease {
            *old = fresh();
            return Ok(Claim::Acquired(old.clone()));
        }
        let abandoned = old.state == RecordState::InProgress && old.lease_until <= r.now;
        // `matches`: equal, or either one unknown (a guard that detects no conflicts).
        if !old.fingerprint.matches(&r.fingerprint)
            || !(old.state == RecordState::Failed || abandoned)
        {
            return Ok(Claim::Existing(old.clone()));
        }
        let fingerprint = match old.fingerprint {
            Fingerprint::UNKNOWN => r.fingerprint,
            known => known,
        };
        let mut next = Record::new(
            r.key,
            RecordState::InProgress,
            fingerprint,
            r.token,
            old.attempts + 1,
            old.failures + u32::from(abandoned),
            r.lease_until,
            old.expires_at.max(r.expires_at),
            old.created_at,
            r.now,
            std::mem::take(&mut old.history),
        );
        std::mem::swap(old, &mut next);
        Ok(Claim::Acquired(old.clone()))
    }

    async fn finish(
        &self,
        key: Key<'_>,
        token: FencingToken,
        f: &Finish<'_>,
    ) -> Result<Fence, StoreError> {
        let mut records = self.lock();
        let Some(old) = records.get(&owned(key)) else {
            return Ok(Fence::LeaseLost);
        };
        if old.state != RecordState::InProgress || old.token != token {
            return Ok(Fence::LeaseLost);
        }
        let next = Record::new(
            key,
            f.state,
            old.fingerprint,
            token,
            old.attempts,
            f.failures,
            old.lease_until,
            f.expires_at,
            old.created_at,
            f.now,
            f.history.to_vec(),
        );
        records.insert(owned(key), next);
        Ok(Fence::Applied)
    }

    async fn renew(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        let mut records = self.lock();
        let Some(old) = records
            .get(&owned(key))
            .filter(|r| r.state == RecordState::InProgress && r.token == token)
        else {
            return Ok(Fence::LeaseLost);
        };
        let next = Record::new(
            key,
            old.state,
            old.fingerprint,
            token,
            old.attempts,
            old.failures,
            lease_until,
            old.expires_at.max(expires_at),
            old.created_at,
            old.updated_at,
            old.history.clone(),
        );
        records.insert(owned(key), next);
        Ok(Fence::Applied)
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        Ok(self.lock().get(&owned(key)).cloned())
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        let mut records = self.lock();
        match records.get(&owned(key)) {
            None => Ok(Deleted::NotFound),
            Some(r) if r.state == RecordState::InProgress && r.lease_until > now => {
                Ok(Deleted::LeaseHeld)
            }
            Some(_) => {
                records.remove(&owned(key));
                Ok(Deleted::Removed)
            }
        }
    }

    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let mut records = self.lock();
        let expired: Vec<_> = records
            .iter()
            .filter(|(_, r)| {
                r.expires_at <= now && !(r.state == RecordState::InProgress && r.lease_until > now)
            })
            .map(|(k, _)| k.clone())
            .take(limit)
            .collect();
        for k in &expired {
            records.remove(k);
        }
        Ok(expired.len() as u64)
    }

    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        // The longest-expired leases first.
        let mut stuck: Vec<Record> = (self.lock().values())
            .filter(|r| r.lease_expired(now))
            .cloned()
            .collect();
        stuck.sort_by_key(|r| r.lease_until);
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
    for attempt in ["first delivery", "retry"] {
        let outcome = guard
            .handle(&[("x-event-id", "evt_42")], b"{}", |_| async { Ok(()) })
            .await;
        assert!(matches!(
            outcome,
            Outcome::Processed { .. } | Outcome::Duplicate { .. }
        ));
        println!(
            "{attempt}: {} ({})",
            outcome.kind(),
            guard.answer(&outcome).status
        );
    }
    Ok(())
}
