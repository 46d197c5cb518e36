//! The in-process store: sharded sets of compact records.

use std::borrow::Borrow;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{
    Claim, ClaimRequest, Deleted, FailureNote, Fence, FencingToken, Fingerprint, Finish, Key,
    ProcessedStore, Record, RecordState, StoreError,
};

/// How many expired records one purge removes per lock hold, so claims wait little.
const PURGE_CHUNK: usize = 256;

/// The fewest shards [`MemoryStore::new`] makes. A purge or a stuck scan walks one
/// shard under its lock, so shards stay small (about 1,000 records per million).
const MIN_SHARDS: usize = 1024;

/// A concurrent in-memory [`ProcessedStore`], the default. It also keeps an inbox
/// ([`InboxStore`](crate::inbox::InboxStore)) and an ordering ledger
/// ([`OrderingStore`](crate::ordering::OrderingStore)).
///
/// Records are spread over many small lock-striped shards. A record costs about
/// 165 bytes with a 30-byte id: an 8-byte slot in its shard's table and one
/// allocation holding its fields and (up to 46 bytes) its key; failure notes, which
/// most records never have, are kept apart. Each shard knows the earliest time any of its
/// records may be purged, so a purge skips shards with nothing due and walks the
/// others in small batches. Nothing survives a restart and nothing is shared between
/// processes: use a durable store when the host runs more than one replica.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Inner {
    /// The random seed of [`shard_hash`].
    seed: u64,
    shards: Box<[Mutex<Shard>]>,
    queue: Mutex<crate::inbox::memory::Queue>,
    ledger: Mutex<crate::inbox::memory::Ledger>,
}

#[derive(Debug)]
struct Shard {
    records: HashSet<Slot>,
    /// The failure notes of the records that have some (`Core::has_history`).
    history: HashMap<Box<str>, Box<[FailureNote]>>,
    /// No record of the shard may be purged before this time (a lower bound).
    next_due: DateTime<Utc>,
    /// How many records are `InProgress`, so a stuck scan skips idle shards.
    in_progress: usize,
}

impl Default for Shard {
    fn default() -> Self {
        Self {
            records: HashSet::new(),
            history: HashMap::new(),
            next_due: DateTime::<Utc>::MAX_UTC,
            in_progress: 0,
        }
    }
}

/// One record: its map key and its fixed-size fields, in one allocation, so the
/// shard's table holds only a pointer. The fields sit in a `Cell` so a record found
/// through the set can be changed in place (always under the shard's lock).
#[derive(Debug)]
struct Node {
    core: Cell<Core>,
    key: MapKey,
}

/// Keys up to this long (namespace, NUL, id) are kept inside the record itself.
const INLINE_KEY: usize = 46;

/// A map key: inline when short (most provider ids), else on the heap.
#[derive(Debug)]
enum MapKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl MapKey {
    fn new(k: &str) -> Self {
        match u8::try_from(k.len()) {
            Ok(len) if k.len() <= INLINE_KEY => {
                let mut bytes = [0; INLINE_KEY];
                bytes[..k.len()].copy_from_slice(k.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(k.as_bytes().into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(bytes) => bytes,
        }
    }

    /// The key as text (it was made from a `&str`).
    fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

/// A shard's table entry: hashed and compared by the map key's bytes alone, so the
/// set is searched with `k.as_bytes()`.
#[derive(Debug)]
struct Slot(Box<Node>);

impl Borrow<[u8]> for Slot {
    fn borrow(&self) -> &[u8] {
        self.0.key.as_bytes()
    }
}

impl Hash for Slot {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Exactly as `[u8]` hashes, as `Borrow<[u8]>` requires.
        self.0.key.as_bytes().hash(state);
    }
}

impl PartialEq for Slot {
    fn eq(&self, other: &Self) -> bool {
        self.0.key.as_bytes() == other.0.key.as_bytes()
    }
}

impl Eq for Slot {}

#[derive(Debug, Clone, Copy)]
struct Core {
    fingerprint: Fingerprint,
    token: FencingToken,
    lease_until: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    attempts: u32,
    failures: u32,
    state: RecordState,
    has_history: bool,
}

impl Core {
    fn record(&self, key: Key<'_>, history: &[FailureNote]) -> Record {
        Record::new(
            key,
            self.state,
            self.fingerprint,
            self.token,
            self.attempts,
            self.failures,
            self.lease_until,
            self.expires_at,
            self.created_at,
            self.updated_at,
            history.to_vec(),
        )
    }

    fn lease_live(&self, now: DateTime<Utc>) -> bool {
        self.state == RecordState::InProgress && self.lease_until > now
    }

    /// From when a purge may remove the record: its expiry, or the end of a live
    /// lease if later.
    fn due(&self) -> DateTime<Utc> {
        if self.state == RecordState::InProgress {
            self.expires_at.max(self.lease_until)
        } else {
            self.expires_at
        }
    }
}

/// Picks a key's shard: a multiply-fold over the key, 8 bytes at a time, from a
/// random seed per store (about a tenth of the cost of SipHash on a 30-byte key).
/// It is not built to resist a sender who crafts ids against it, and need not be:
/// each shard's table hashes with the standard library's keyed SipHash, so ids
/// piled onto one shard could only make that shard larger, never its lookups slow.
fn shard_hash(seed: u64, key: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let fold = |h: u64, word: u64| (h ^ word).wrapping_mul(K).rotate_left(29);
    let mut h = seed ^ key.len() as u64;
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        h = fold(h, u64::from_le_bytes(w.try_into().unwrap_or_default()));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = fold(h, u64::from_le_bytes(w));
    }
    // Mix the high bits down: the shard is taken from the low ones.
    h ^= h >> 32;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^ (h >> 29)
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

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store with 1,024 shards, or 64 per logical CPU if that is more.
    pub fn new() -> Self {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        Self::with_shards((cpus * 64).max(MIN_SHARDS))
    }

    /// A store with `shards` lock stripes (rounded up to a power of two).
    pub fn with_shards(shards: usize) -> Self {
        let n = shards.max(1).next_power_of_two();
        Self {
            inner: Arc::new(Inner {
                seed: RandomState::new().build_hasher().finish(),
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
        let i =
            shard_hash(self.inner.seed, key.as_bytes()) as usize & (self.inner.shards.len() - 1);
        lock(&self.inner.shards[i])
    }
}

/// The record under `k` if it is `InProgress` with `token`, with its fields.
// A `Slot` hashes and compares by its key, which never changes; the `Cell` holds
// only the other fields.
#[allow(clippy::mutable_key_type)]
fn fenced<'s>(
    records: &'s HashSet<Slot>,
    k: &str,
    token: FencingToken,
) -> Option<(&'s Cell<Core>, Core)> {
    let cell = &records.get(k.as_bytes())?.0.core;
    let core = cell.get();
    (core.state == RecordState::InProgress && core.token == token).then_some((cell, core))
}

/// A poisoned shard still holds consistent records (every change below is made in
/// one step after all checks), so poisoning is ignored.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shard {
    fn history_of(&self, k: &str, core: &Core) -> &[FailureNote] {
        match core.has_history {
            true => self.history.get(k).map_or(&[], |h| h),
            false => &[],
        }
    }

    fn claim(&mut self, k: &str, req: &ClaimRequest<'_>) -> Claim {
        let now = req.now;
        let fresh = Core {
            state: RecordState::InProgress,
            fingerprint: req.fingerprint,
            token: req.token,
            attempts: 1,
            failures: 0,
            lease_until: req.lease_until,
            expires_at: req.expires_at,
            created_at: now,
            updated_at: now,
            has_history: false,
        };
        let Some(slot) = self.records.get(k.as_bytes()) else {
            self.records.insert(Slot(Box::new(Node {
                key: MapKey::new(k),
                core: Cell::new(fresh),
            })));
            self.in_progress += 1;
            self.next_due = self.next_due.min(fresh.due());
            return Claim::Acquired(fresh.record(req.key, &[]));
        };
        let mut core = slot.0.core.get();
        let was_in_progress = core.state == RecordState::InProgress;
        if core.expires_at <= now && !core.lease_live(now) {
            if core.has_history {
                self.history.remove(k);
            }
            core = fresh;
        } else if core.fingerprint == req.fingerprint
            && (core.state == RecordState::Failed
                || (core.state == RecordState::InProgress && core.lease_until <= now))
        {
            if core.state == RecordState::InProgress {
                core.failures = core.failures.saturating_add(1);
            }
            core.state = RecordState::InProgress;
            core.token = req.token;
            core.attempts = core.attempts.saturating_add(1);
            core.lease_until = fresh.lease_until;
            core.expires_at = core.expires_at.max(fresh.expires_at);
            core.updated_at = now;
        } else {
            return Claim::Existing(core.record(req.key, self.history_of(k, &core)));
        }
        slot.0.core.set(core);
        if !was_in_progress {
            self.in_progress += 1;
        }
        self.next_due = self.next_due.min(core.due());
        Claim::Acquired(core.record(req.key, self.history_of(k, &core)))
    }

    /// Takes out up to `limit` records due at `now`; walks the whole shard (it is
    /// small) and leaves `next_due` exact. The caller drops what comes back after
    /// releasing the lock, so claims do not wait on the frees.
    fn purge(&mut self, now: DateTime<Utc>, limit: usize) -> Vec<Slot> {
        if self.next_due > now {
            return Vec::new();
        }
        let Self {
            records,
            history,
            next_due,
            in_progress,
        } = self;
        let mut removed = 0;
        let mut next = DateTime::<Utc>::MAX_UTC;
        let out = records
            .extract_if(|slot| {
                let core = slot.0.core.get();
                if removed < limit && core.due() <= now {
                    removed += 1;
                    if core.has_history {
                        history.remove(slot.0.key.as_str());
                    }
                    if core.state == RecordState::InProgress {
                        *in_progress -= 1;
                    }
                    true
                } else {
                    next = next.min(core.due());
                    false
                }
            })
            .collect();
        *next_due = next;
        out
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
            let shard = &mut *shard;
            let Some((cell, mut core)) = fenced(&shard.records, k, token) else {
                return Fence::LeaseLost;
            };
            core.state = finish.state;
            core.failures = finish.failures;
            core.updated_at = finish.now;
            core.expires_at = finish.expires_at;
            if finish.history.is_empty() {
                if core.has_history {
                    shard.history.remove(k);
                }
            } else if let Some(notes) = shard.history.get_mut(k) {
                *notes = finish.history.into();
            } else {
                shard.history.insert(k.into(), finish.history.into());
            }
            core.has_history = !finish.history.is_empty();
            cell.set(core);
            if finish.state != RecordState::InProgress {
                shard.in_progress -= 1;
            }
            shard.next_due = shard.next_due.min(core.due());
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
            let shard = &mut *shard;
            let Some((cell, mut core)) = fenced(&shard.records, k, token) else {
                return Fence::LeaseLost;
            };
            core.lease_until = lease_until;
            core.expires_at = core.expires_at.max(expires_at);
            cell.set(core);
            shard.next_due = shard.next_due.min(core.due());
            Fence::Applied
        }))
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        Ok(with_key(key, |k| {
            let shard = self.shard(k);
            let core = shard.records.get(k.as_bytes())?.0.core.get();
            Some(core.record(key, shard.history_of(k, &core)))
        }))
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        Ok(with_key(key, |k| {
            let mut shard = self.shard(k);
            let Some(core) = shard.records.get(k.as_bytes()).map(|s| s.0.core.get()) else {
                return Deleted::NotFound;
            };
            if core.lease_live(now) {
                return Deleted::LeaseHeld;
            }
            shard.records.remove(k.as_bytes());
            if core.has_history {
                shard.history.remove(k);
            }
            if core.state == RecordState::InProgress {
                shard.in_progress -= 1;
            }
            Deleted::Removed
        }))
    }

    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let mut removed = 0;
        for shard in self.inner.shards.iter() {
            loop {
                let left = limit - removed;
                if left == 0 {
                    return Ok(removed as u64);
                }
                let purged = lock(shard).purge(now, left.min(PURGE_CHUNK));
                let n = purged.len();
                drop(purged); // outside the lock
                removed += n;
                if n < left.min(PURGE_CHUNK) {
                    break;
                }
            }
        }
        Ok(removed as u64)
    }

    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        let mut out = Vec::new();
        for shard in self.inner.shards.iter() {
            let shard = lock(shard);
            if shard.in_progress == 0 {
                continue;
            }
            for slot in &shard.records {
                if out.len() >= limit {
                    return Ok(out);
                }
                let core = slot.0.core.get();
                if core.state == RecordState::InProgress && core.lease_until <= now {
                    let k = slot.0.key.as_str();
                    let (namespace, id) = k.split_once('\0').unwrap_or(("", k));
                    out.push(core.record(Key::new(namespace, id), shard.history_of(k, &core)));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;

    #[test]
    fn ids_that_differ_only_in_a_counter_spread_evenly_over_the_shards() {
        let shards = 1024;
        for (seed, width) in [(1, 10), (0xdead_beef, 26), (7, 3)] {
            let mut load = vec![0u32; shards];
            for i in 0..100_000u32 {
                let key = format!("stripe\0evt_{i:0width$}");
                load[shard_hash(seed, key.as_bytes()) as usize & (shards - 1)] += 1;
            }
            let mean = 100_000 / shards as u32;
            let (min, max) = (load.iter().min().unwrap(), load.iter().max().unwrap());
            assert!(
                *max < mean * 2 && *min > mean / 2,
                "{min}..{max} around {mean}"
            );
        }
    }

    fn ready<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => unreachable!("the memory store never waits"),
        }
    }

    fn request(id: &str, now: DateTime<Utc>) -> ClaimRequest<'_> {
        ClaimRequest {
            key: Key::new("ns", id),
            fingerprint: Fingerprint::of(b"body"),
            token: FencingToken::random(),
            now,
            lease_until: now + TimeDelta::seconds(60),
            expires_at: now + TimeDelta::seconds(3600),
        }
    }

    /// The side table of failure notes and the per-shard counters follow every change.
    #[test]
    fn history_and_shard_counters_follow_the_records() {
        let store = MemoryStore::with_shards(1);
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        // One guard at a time: (in-progress count, notes kept).
        let counts = || {
            let shard = lock(&store.inner.shards[0]);
            (shard.in_progress, shard.history.len())
        };
        let note = [FailureNote {
            at: t0,
            error: "boom".into(),
        }];
        let finish = |state, history: &'static [FailureNote], at| Finish {
            state,
            failures: history.len() as u32,
            history,
            now: at,
            expires_at: at + TimeDelta::seconds(3600),
        };
        let note: &'static [FailureNote] = Box::leak(Box::new(note));

        let first = request("a", t0);
        ready(store.claim(&first)).unwrap();
        assert_eq!(counts().0, 1);
        let failed = finish(RecordState::Failed, note, t0);
        let fence = ready(store.finish(first.key, first.token, &failed)).unwrap();
        assert_eq!(fence, Fence::Applied);
        assert_eq!(counts(), (0, 1));
        let rec = ready(store.get(first.key)).unwrap().unwrap();
        assert_eq!(rec.history, note);

        // A retry takes the failed record over and keeps its notes.
        let retry = request("a", t0 + TimeDelta::seconds(1));
        let Claim::Acquired(rec) = ready(store.claim(&retry)).unwrap() else {
            panic!("a failed record is claimed again");
        };
        assert_eq!((rec.attempts, rec.history.as_slice()), (2, note));
        assert_eq!(counts().0, 1);
        let done = finish(RecordState::Completed, &[], t0 + TimeDelta::seconds(2));
        let fence = ready(store.finish(retry.key, retry.token, &done)).unwrap();
        assert_eq!(fence, Fence::Applied);
        assert_eq!(counts(), (0, 0));

        // An abandoned claim is stuck, then purged with its notes once expired.
        let b = request("b", t0);
        ready(store.claim(&b)).unwrap();
        let renewed = ready(store.renew(b.key, b.token, t0, t0)).unwrap();
        assert_eq!(renewed, Fence::Applied);
        let stuck = ready(store.stuck(t0 + TimeDelta::seconds(61), 10)).unwrap();
        assert_eq!(stuck.len(), 1);
        assert_eq!(stuck[0].key(), b.key);
        let later = t0 + TimeDelta::seconds(7200);
        assert_eq!(ready(store.purge_expired(later, 1)).unwrap(), 1);
        assert_eq!(ready(store.purge_expired(later, 10)).unwrap(), 1);
        assert_eq!(ready(store.purge_expired(later, 10)).unwrap(), 0);
        let shard = lock(&store.inner.shards[0]);
        assert!(shard.records.is_empty() && shard.history.is_empty());
        assert_eq!(
            (shard.in_progress, shard.next_due),
            (0, DateTime::<Utc>::MAX_UTC)
        );
    }

    /// Keys too long to sit inside the record live on the heap and work the same.
    #[test]
    fn long_keys_round_trip() {
        let store = MemoryStore::with_shards(1);
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        for id in [
            "a".repeat(INLINE_KEY - 3),
            "b".repeat(INLINE_KEY - 2),
            "é".repeat(100),
        ] {
            let req = request(&id, t0);
            assert!(matches!(
                ready(store.claim(&req)).unwrap(),
                Claim::Acquired(_)
            ));
            assert!(matches!(
                ready(store.claim(&req)).unwrap(),
                Claim::Existing(_)
            ));
            let rec = ready(store.get(req.key)).unwrap().unwrap();
            assert_eq!(rec.id, id);
            let stuck = ready(store.stuck(t0 + TimeDelta::seconds(61), 10)).unwrap();
            assert!(stuck.iter().any(|r| r.id == id));
        }
    }
}
