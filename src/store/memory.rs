//! The in-process store: sharded maps with an expiry queue per shard.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{
    Claim, ClaimRequest, Deleted, FailureNote, Fence, FencingToken, Fingerprint, Finish, Key,
    ProcessedStore, Record, RecordState, StoreError,
};

/// How many expired records one purge removes per lock hold, so claims wait little.
const PURGE_CHUNK: usize = 256;

/// A concurrent in-memory [`ProcessedStore`], the default. It also keeps an inbox
/// ([`InboxStore`](crate::inbox::InboxStore)) and an ordering ledger
/// ([`OrderingStore`](crate::ordering::OrderingStore)).
///
/// Records are spread over lock-striped shards; each shard keeps an expiry queue so
/// a purge touches only records that are due, in small batches. Nothing survives a
/// restart and nothing is shared between processes: use a durable store when the
/// host runs more than one replica.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    hasher: RandomState,
    shards: Box<[Mutex<Shard>]>,
    queue: Mutex<crate::inbox::memory::Queue>,
    ledger: Mutex<crate::inbox::memory::Ledger>,
}

#[derive(Debug, Default)]
struct Shard {
    records: HashMap<Arc<str>, Entry>,
    /// Every key in `records` appears here at least once, at or before its expiry.
    expiry: BinaryHeap<Reverse<(i64, Arc<str>)>>,
    in_progress: HashSet<Arc<str>>,
}

#[derive(Debug, Clone)]
struct Entry {
    state: RecordState,
    fingerprint: Fingerprint,
    token: FencingToken,
    attempts: u32,
    failures: u32,
    lease_until: i64,
    expires_at: i64,
    created_at: i64,
    updated_at: i64,
    history: Option<Box<[FailureNote]>>,
}

fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `namespace`, a NUL, then `id`: NUL cannot appear in a namespace the guard accepts.
fn map_key(key: Key<'_>) -> String {
    let mut k = String::with_capacity(key.namespace.len() + 1 + key.id.len());
    push_key(&mut k, key);
    k
}

fn push_key(k: &mut String, key: Key<'_>) {
    k.push_str(key.namespace);
    k.push('\0');
    k.push_str(key.id);
}

thread_local! {
    /// Where lookups spell their map key, so a lookup does not allocate.
    static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Calls `f` with the map key of `key`, spelled in a per-thread buffer.
fn with_key<T>(key: Key<'_>, f: impl FnOnce(&str) -> T) -> T {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut k) => {
            k.clear();
            push_key(&mut k, key);
            f(&k)
        }
        // Only reachable if `f` itself came back here; stay correct regardless.
        Err(_) => f(&map_key(key)),
    })
}

impl Entry {
    fn record(&self, key: Key<'_>) -> Record {
        Record::new(
            key,
            self.state,
            self.fingerprint,
            self.token,
            self.attempts,
            self.failures,
            time(self.lease_until),
            time(self.expires_at),
            time(self.created_at),
            time(self.updated_at),
            self.history.as_deref().unwrap_or_default().to_vec(),
        )
    }

    fn lease_live(&self, now: i64) -> bool {
        self.state == RecordState::InProgress && self.lease_until > now
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store with one shard per 4 logical CPUs' worth of contention (at least 16).
    pub fn new() -> Self {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        Self::with_shards((cpus * 4).max(16))
    }

    /// A store with `shards` lock stripes (rounded up to a power of two).
    pub fn with_shards(shards: usize) -> Self {
        let n = shards.max(1).next_power_of_two();
        Self {
            inner: Arc::new(Inner {
                hasher: RandomState::new(),
                shards: (0..n).map(|_| Mutex::default()).collect(),
                queue: Mutex::default(),
                ledger: Mutex::default(),
            }),
        }
    }

    /// How many records the store holds, expired or not.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| lock(s).records.len())
            .sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn queue(&self) -> &Mutex<crate::inbox::memory::Queue> {
        &self.inner.queue
    }

    pub(crate) fn ledger(&self) -> &Mutex<crate::inbox::memory::Ledger> {
        &self.inner.ledger
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let i = self.inner.hasher.hash_one(key) as usize & (self.inner.shards.len() - 1);
        lock(&self.inner.shards[i])
    }
}

/// A poisoned shard still holds consistent records (every change below is made in
/// one step after all checks), so poisoning is ignored.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shard {
    fn claim(&mut self, k: &str, req: &ClaimRequest<'_>) -> Claim {
        let now = millis(req.now);
        let fresh = Entry {
            state: RecordState::InProgress,
            fingerprint: req.fingerprint,
            token: req.token,
            attempts: 1,
            failures: 0,
            lease_until: millis(req.lease_until),
            expires_at: millis(req.expires_at),
            created_at: now,
            updated_at: now,
            history: None,
        };
        let Some(entry) = self.records.get_mut(k) else {
            let key: Arc<str> = Arc::from(k);
            self.expiry.push(Reverse((fresh.expires_at, key.clone())));
            self.in_progress.insert(key.clone());
            self.records.insert(key, fresh.clone());
            return Claim::Acquired(fresh.record(req.key));
        };
        if entry.expires_at <= now && !entry.lease_live(now) {
            *entry = fresh;
        } else if entry.fingerprint == req.fingerprint
            && (entry.state == RecordState::Failed
                || (entry.state == RecordState::InProgress && entry.lease_until <= now))
        {
            if entry.state == RecordState::InProgress {
                entry.failures = entry.failures.saturating_add(1);
            }
            entry.state = RecordState::InProgress;
            entry.token = req.token;
            entry.attempts = entry.attempts.saturating_add(1);
            entry.lease_until = fresh.lease_until;
            entry.expires_at = entry.expires_at.max(fresh.expires_at);
            entry.updated_at = now;
        } else {
            return Claim::Existing(entry.record(req.key));
        }
        let record = entry.record(req.key);
        if let Some((key, _)) = self.records.get_key_value(k) {
            let key = key.clone();
            self.in_progress.insert(key);
        }
        Claim::Acquired(record)
    }

    fn fenced(&mut self, k: &str, token: FencingToken) -> Option<&mut Entry> {
        self.records
            .get_mut(k)
            .filter(|e| e.state == RecordState::InProgress && e.token == token)
    }

    fn purge(&mut self, now: i64, limit: usize) -> usize {
        let mut removed = 0;
        while removed < limit {
            match self.expiry.peek() {
                Some(Reverse((at, _))) if *at <= now => {}
                _ => break,
            }
            let Some(Reverse((_, key))) = self.expiry.pop() else {
                break;
            };
            let Some(entry) = self.records.get(&key) else {
                continue; // deleted by hand since
            };
            if entry.expires_at <= now && !entry.lease_live(now) {
                self.records.remove(&key);
                self.in_progress.remove(&key);
                removed += 1;
            } else {
                let due = entry.expires_at.max(entry.lease_until);
                self.expiry.push(Reverse((due, key)));
            }
        }
        removed
    }
}

#[async_trait]
impl ProcessedStore for MemoryStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        Ok(with_key(request.key, |k| self.shard(k).claim(k, request)))
    }

    async fn finish(
        &self,
        key: Key<'_>,
        token: FencingToken,
        finish: &Finish<'_>,
    ) -> Result<Fence, StoreError> {
        Ok(with_key(key, |k| {
            let mut shard = self.shard(k);
            let Some(entry) = shard.fenced(k, token) else {
                return Fence::LeaseLost;
            };
            entry.state = finish.state;
            entry.failures = finish.failures;
            entry.history = (!finish.history.is_empty()).then(|| finish.history.into());
            entry.updated_at = millis(finish.now);
            entry.expires_at = millis(finish.expires_at);
            if finish.state != RecordState::InProgress {
                shard.in_progress.remove(k);
            }
            Fence::Applied
        }))
    }

    async fn renew(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        Ok(with_key(key, |k| {
            let mut shard = self.shard(k);
            let Some(entry) = shard.fenced(k, token) else {
                return Fence::LeaseLost;
            };
            entry.lease_until = millis(lease_until);
            entry.expires_at = entry.expires_at.max(millis(expires_at));
            Fence::Applied
        }))
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        Ok(with_key(key, |k| {
            self.shard(k).records.get(k).map(|e| e.record(key))
        }))
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        Ok(with_key(key, |k| {
            let mut shard = self.shard(k);
            match shard.records.get(k) {
                None => Deleted::NotFound,
                Some(e) if e.lease_live(millis(now)) => Deleted::LeaseHeld,
                Some(_) => {
                    shard.records.remove(k);
                    shard.in_progress.remove(k);
                    Deleted::Removed
                }
            }
        }))
    }

    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let now = millis(now);
        let mut removed = 0;
        for shard in self.inner.shards.iter() {
            loop {
                let left = limit - removed;
                if left == 0 {
                    return Ok(removed as u64);
                }
                let n = lock(shard).purge(now, left.min(PURGE_CHUNK));
                removed += n;
                if n < left.min(PURGE_CHUNK) {
                    break;
                }
            }
        }
        Ok(removed as u64)
    }

    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        let now = millis(now);
        let mut out = Vec::new();
        for shard in self.inner.shards.iter() {
            let shard = lock(shard);
            for key in &shard.in_progress {
                if out.len() >= limit {
                    return Ok(out);
                }
                if let Some(e) = shard.records.get(key).filter(|e| e.lease_until <= now) {
                    let (namespace, id) = key.split_once('\0').unwrap_or(("", key));
                    out.push(e.record(Key::new(namespace, id)));
                }
            }
        }
        Ok(out)
    }
}
