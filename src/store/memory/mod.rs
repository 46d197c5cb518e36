//! The in-process store: sharded sets of compact records.

use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hashbrown::HashTable;

mod inbox;
mod listing;
mod ordering;

use super::{
    Claim, ClaimRequest, Decision, Deleted, FailureNote, Fence, FencingToken, Fingerprint, Finish,
    Holder, Key, ProcessedStore, Record, RecordState, Renew, StoreError,
};

/// The most expired records one lock hold removes. Each hold walks its shard once
/// (about 1,000 records per million with the default shards; a store made with
/// few shards walks more per hold).
const PURGE_CHUNK: usize = 256;

/// The most shards [`MemoryStore::with_shards`] makes.
const MAX_SHARDS: usize = 1 << 20;

/// The fewest shards [`MemoryStore::new`] makes. A purge or a stuck scan walks one
/// shard under its lock, so shards stay small (about 1,000 records per million).
const MIN_SHARDS: usize = 1024;

/// A concurrent in-memory [`ProcessedStore`], the default. It also keeps an inbox
/// ([`InboxStore`](crate::inbox::InboxStore)) and an ordering ledger
/// ([`OrderingStore`](crate::ordering::OrderingStore)).
///
/// Records are spread over many small lock-striped shards. Each shard keeps its
/// records in a slab (fields, the key's hash and, up to 46 bytes, the key, side by
/// side, 160 bytes a record), which grows 8 records at a time and never moves one,
/// and a hash table of slab indices, which grows without hashing any key again;
/// failure notes, which most records never have, are kept apart. A purged record's
/// slot is reused by the next new one, so once the store has grown, its tables do
/// not grow or allocate for a new record (the memory of purged records is kept for
/// reuse, not returned; the [`Record`] a call answers is the caller's own copy). `benches/README.md` has the measured bytes per record.
/// Each shard knows the earliest time any of its records may be purged, so a purge
/// skips shards with nothing due and walks the others in small batches. Nothing
/// survives a restart and nothing is shared between processes: use a durable store
/// when the host runs more than one replica.
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
    /// Keys every hash. A key is hashed once per call: the middle bits of the hash
    /// pick its shard, and the shard's table is searched with the whole hash.
    hasher: RandomState,
    shards: Box<[Mutex<Shard>]>,
    /// The shard the next purge starts at.
    purge_from: AtomicUsize,
    queue: Mutex<inbox::Queue>,
    ledger: Mutex<ordering::Ledger>,
}

/// One lock stripe: its records in a slab, and a table of slab indices found by
/// the key's hash.
#[derive(Debug)]
struct Shard {
    /// Indices into `nodes`.
    table: HashTable<u32>,
    /// The records. The slot of a purged or deleted record goes to `free` and is
    /// taken by the next new record, so claims and purges do not call the allocator
    /// once the store has grown (a purge on one thread would otherwise free memory
    /// that claims on another thread are allocating from).
    nodes: Slab,
    /// Slots of `nodes` handed out earlier that hold no record now.
    free: Vec<u32>,
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
            table: HashTable::new(),
            nodes: Slab::default(),
            free: Vec::new(),
            history: HashMap::new(),
            next_due: DateTime::<Utc>::MAX_UTC,
            in_progress: 0,
        }
    }
}

/// One record: its fixed-size fields, the hash of its key and the key itself, side
/// by side in the slab.
#[derive(Debug)]
struct Node {
    core: Core,
    /// The hash the shard's table files the record under, kept so that growing the
    /// table does not hash every key again.
    hash: u64,
    key: MapKey,
}

impl Node {
    /// What a slot holds before its first record.
    const VACANT: Self = Self {
        core: Core {
            fingerprint: Fingerprint([0; 32]),
            token: FencingToken(0),
            lease_until: DateTime::<Utc>::MIN_UTC,
            expires_at: DateTime::<Utc>::MIN_UTC,
            created_at: DateTime::<Utc>::MIN_UTC,
            updated_at: DateTime::<Utc>::MIN_UTC,
            attempts: 0,
            failures: 0,
            state: RecordState::Completed,
            has_history: false,
        },
        hash: 0,
        key: MapKey::EMPTY,
    };
}

/// Slots per slab chunk: small, so that a shard holding a few records keeps little
/// memory (1,280 bytes per chunk).
const CHUNK: usize = 8;

/// A shard's records, in chunks of [`CHUNK`] slots: the slab grows a chunk at a
/// time and never moves a record, so growing copies nothing (a `Vec` would copy
/// every record each time it doubled, and keep up to half its capacity unused).
#[derive(Debug, Default)]
struct Slab {
    chunks: Vec<Box<[Node]>>,
    /// Slots handed out so far (records and free slots).
    len: usize,
}

impl Slab {
    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    /// Puts `node` in a new slot; the slot's index.
    fn push(&mut self, node: Node) -> u32 {
        let i = self.len;
        if i == self.chunks.len() * CHUNK {
            self.chunks.push(
                std::iter::repeat_with(|| Node::VACANT)
                    .take(CHUNK)
                    .collect(),
            );
        }
        self.chunks[i / CHUNK][i % CHUNK] = node;
        self.len += 1;
        u32::try_from(i).expect("fewer than 2^32 records per shard")
    }
}

impl std::ops::Index<usize> for Slab {
    type Output = Node;

    fn index(&self, i: usize) -> &Node {
        &self.chunks[i / CHUNK][i % CHUNK]
    }
}

impl std::ops::IndexMut<usize> for Slab {
    fn index_mut(&mut self, i: usize) -> &mut Node {
        &mut self.chunks[i / CHUNK][i % CHUNK]
    }
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
    /// The key of a free slot (holds no heap memory).
    const EMPTY: Self = Self::Inline {
        len: 0,
        bytes: [0; INLINE_KEY],
    };

    fn new(key: Key<'_>) -> Self {
        match u8::try_from(key.joined_len()) {
            Ok(len) if usize::from(len) <= INLINE_KEY => {
                let mut bytes = [0; INLINE_KEY];
                join_into(key, &mut bytes);
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(map_key(key).into_bytes().into()),
        }
    }

    /// Whether this is the map key of `key`, compared piece by piece.
    fn spells(&self, key: Key<'_>) -> bool {
        let (b, ns, id) = (self.as_bytes(), key.namespace.as_bytes(), key.id.as_bytes());
        b.len() == ns.len() + 1 + id.len()
            && b[..ns.len()] == *ns
            && b[ns.len()] == 0
            && b[ns.len() + 1..] == *id
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

/// The map key of `key`, as [`Key::push_joined`] spells it. Lookups hash and
/// compare it piece by piece ([`MemoryStore::hash`], [`MapKey::spells`]) without
/// spelling it on the heap; it is spelled there only to store a long key and to
/// file failure notes.
fn map_key(key: Key<'_>) -> String {
    let mut k = String::with_capacity(key.joined_len());
    key.push_joined(&mut k);
    k
}

/// Spells the map key of `key` at the front of `buf` (at least
/// `key.joined_len()` long); its length.
fn join_into(key: Key<'_>, buf: &mut [u8]) -> usize {
    let (ns, id) = (key.namespace.as_bytes(), key.id.as_bytes());
    let n = key.joined_len();
    buf[..ns.len()].copy_from_slice(ns);
    buf[ns.len()] = 0;
    buf[ns.len() + 1..n].copy_from_slice(id);
    n
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

    /// A store with `shards` lock stripes, rounded up to a power of two, between 1
    /// and 2^20 (1,048,576).
    pub fn with_shards(shards: usize) -> Self {
        let n = shards.clamp(1, MAX_SHARDS).next_power_of_two();
        Self {
            inner: Arc::new(Inner {
                hasher: RandomState::new(),
                shards: (0..n).map(|_| Mutex::default()).collect(),
                purge_from: AtomicUsize::new(0),
                queue: Mutex::default(),
                ledger: Mutex::default(),
            }),
        }
    }

    /// How many records the store holds, expired or not.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).table.len()).sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn queue(&self) -> &Mutex<inbox::Queue> {
        &self.inner.queue
    }

    fn ledger(&self) -> &Mutex<ordering::Ledger> {
        &self.inner.ledger
    }

    /// The hash of the map key of `key`. A key that fits is spelled on the stack
    /// and hashed in one write (cheaper than three); a longer one is written piece
    /// by piece, which hashes the same bytes to the same value.
    fn hash(&self, key: Key<'_>) -> u64 {
        let mut h = self.inner.hasher.build_hasher();
        let mut buf = [0u8; 64];
        if key.joined_len() <= buf.len() {
            let n = join_into(key, &mut buf);
            h.write(&buf[..n]);
        } else {
            h.write(key.namespace.as_bytes());
            h.write_u8(0);
            h.write(key.id.as_bytes());
        }
        h.finish()
    }

    /// The hash of `key`, and its shard, locked.
    fn shard(&self, key: Key<'_>) -> (u64, MutexGuard<'_, Shard>) {
        let h = self.hash(key);
        (h, lock(&self.inner.shards[self.shard_index(h)]))
    }

    /// The shard of hash `h`. The table uses the low bits (bucket) and the top 7
    /// (tag): shard by others.
    fn shard_index(&self, h: u64) -> usize {
        (h >> 32) as usize & (self.inner.shards.len() - 1)
    }
}

/// A poisoned shard, inbox or ledger still holds consistent records (every change is
/// made in one step after all checks), so poisoning is ignored.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shard {
    /// The failure notes of the record of `key` (spelled only when it has some).
    fn history_of(&self, key: Key<'_>, core: &Core) -> &[FailureNote] {
        match core.has_history {
            true => self.history.get(map_key(key).as_str()).map_or(&[], |h| h),
            false => &[],
        }
    }

    /// The slot of the record of `key` (hash `h`).
    fn find(&self, h: u64, key: Key<'_>) -> Option<usize> {
        let nodes = &self.nodes;
        let i = self.table.find(h, |&i| nodes[i as usize].key.spells(key))?;
        Some(*i as usize)
    }

    /// The slot of the record of `key` if it is `InProgress` with `token`, and its
    /// fields.
    fn fenced(&self, h: u64, key: Key<'_>, token: FencingToken) -> Option<(usize, Core)> {
        let i = self.find(h, key)?;
        let core = self.nodes[i].core;
        (core.state == RecordState::InProgress && core.token == token).then_some((i, core))
    }

    /// Stores a new record of `key` (hash `h`), in a free slot if there is one.
    fn insert(&mut self, h: u64, key: Key<'_>, core: Core) {
        let node = Node {
            core,
            hash: h,
            key: MapKey::new(key),
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => self.nodes.push(node),
        };
        let nodes = &self.nodes;
        self.table.insert_unique(h, i, |&j| nodes[j as usize].hash);
    }

    /// Takes the record in slot `i` out of the counters and the history table and
    /// frees its slot (its table entry is already gone).
    fn release(
        nodes: &mut Slab,
        free: &mut Vec<u32>,
        history: &mut HashMap<Box<str>, Box<[FailureNote]>>,
        in_progress: &mut usize,
        i: u32,
    ) {
        let node = &mut nodes[i as usize];
        if node.core.has_history {
            history.remove(node.key.as_str());
        }
        if node.core.state == RecordState::InProgress {
            *in_progress -= 1;
        }
        node.key = MapKey::EMPTY;
        free.push(i);
    }

    fn claim(&mut self, h: u64, req: &ClaimRequest<'_>) -> Claim {
        let key = req.key;
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
        let Some(i) = self.find(h, key) else {
            self.insert(h, key, fresh);
            self.in_progress += 1;
            self.next_due = self.next_due.min(fresh.due());
            return Claim::Acquired(fresh.record(req.key, &[]));
        };
        let mut core = self.nodes[i].core;
        let was_in_progress = core.state == RecordState::InProgress;
        match req.decide_parts(
            core.state,
            core.fingerprint,
            core.lease_until,
            core.expires_at,
        ) {
            Decision::Replace => {
                if core.has_history {
                    self.history.remove(map_key(key).as_str());
                }
                core = fresh;
            }
            Decision::TakeOver => {
                if core.state == RecordState::InProgress {
                    core.failures = core.failures.saturating_add(1);
                }
                if core.fingerprint == Fingerprint::UNKNOWN {
                    core.fingerprint = req.fingerprint;
                }
                core.state = RecordState::InProgress;
                core.token = req.token;
                core.attempts = core.attempts.saturating_add(1);
                core.lease_until = fresh.lease_until;
                core.expires_at = core.expires_at.max(fresh.expires_at);
                core.updated_at = now;
            }
            Decision::Keep => {
                return Claim::Existing(core.record(key, self.history_of(key, &core)));
            }
        }
        self.nodes[i].core = core;
        if !was_in_progress {
            self.in_progress += 1;
        }
        self.next_due = self.next_due.min(core.due());
        Claim::Acquired(core.record(key, self.history_of(key, &core)))
    }

    /// Removes up to `limit` records due at `now`; walks the whole shard (it is
    /// small) and leaves `next_due` exact. The slots are kept for reuse; a long
    /// key's text and failure notes are freed.
    fn purge(&mut self, now: DateTime<Utc>, limit: usize) -> usize {
        if self.next_due > now {
            return 0;
        }
        let Self {
            table,
            nodes,
            free,
            history,
            next_due,
            in_progress,
        } = self;
        let mut removed = 0;
        let mut next = DateTime::<Utc>::MAX_UTC;
        table.retain(|&mut i| {
            let core = nodes[i as usize].core;
            if removed < limit && core.due() <= now {
                removed += 1;
                Self::release(nodes, free, history, in_progress, i);
                false
            } else {
                next = next.min(core.due());
                true
            }
        });
        *next_due = next;
        removed
    }
}

#[async_trait]
impl ProcessedStore for MemoryStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let (h, mut shard) = self.shard(request.key);
        Ok(shard.claim(h, request))
    }

    async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError> {
        let Holder { key, token } = holder;
        let (h, mut shard) = self.shard(key);
        let shard = &mut *shard;
        let Some((i, mut core)) = shard.fenced(h, key, token) else {
            return Ok(Fence::LeaseLost);
        };
        core.state = finish.state;
        core.failures = finish.failures;
        core.updated_at = finish.now;
        core.expires_at = finish.expires_at;
        if finish.history.is_empty() {
            if core.has_history {
                shard.history.remove(map_key(key).as_str());
            }
        } else {
            let k = map_key(key);
            match shard.history.get_mut(k.as_str()) {
                Some(notes) => *notes = finish.history.into(),
                None => drop(shard.history.insert(k.into(), finish.history.into())),
            }
        }
        core.has_history = !finish.history.is_empty();
        shard.nodes[i].core = core;
        if finish.state != RecordState::InProgress {
            shard.in_progress -= 1;
        }
        shard.next_due = shard.next_due.min(core.due());
        Ok(Fence::Applied)
    }

    async fn renew(&self, holder: Holder<'_>, renew: &Renew) -> Result<Fence, StoreError> {
        let Holder { key, token } = holder;
        let (h, mut shard) = self.shard(key);
        let Some((i, mut core)) = shard.fenced(h, key, token) else {
            return Ok(Fence::LeaseLost);
        };
        core.lease_until = renew.lease_until;
        core.expires_at = core.expires_at.max(renew.expires_at);
        shard.nodes[i].core = core;
        shard.next_due = shard.next_due.min(core.due());
        Ok(Fence::Applied)
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        let (h, shard) = self.shard(key);
        let Some(i) = shard.find(h, key) else {
            return Ok(None);
        };
        let core = shard.nodes[i].core;
        Ok(Some(core.record(key, shard.history_of(key, &core))))
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        let (h, mut shard) = self.shard(key);
        let Shard {
            table,
            nodes,
            free,
            history,
            in_progress,
            ..
        } = &mut *shard;
        let Ok(entry) = table.find_entry(h, |&i| nodes[i as usize].key.spells(key)) else {
            return Ok(Deleted::NotFound);
        };
        let i = *entry.get();
        if nodes[i as usize].core.lease_live(now) {
            return Ok(Deleted::LeaseHeld);
        }
        entry.remove();
        Shard::release(nodes, free, history, in_progress, i);
        Ok(Deleted::Removed)
    }

    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        // Each call starts at the shard after the one where the last call's limit
        // ran out, so records that keep expiring in some shards do not leave the
        // others unpurged.
        let shards = &self.inner.shards;
        let first = self.inner.purge_from.load(Ordering::Relaxed) % shards.len();
        let mut removed = 0;
        for k in 0..shards.len() {
            let i = (first + k) % shards.len();
            let shard = &shards[i];
            loop {
                let left = limit - removed;
                if left == 0 {
                    self.inner.purge_from.store(i + 1, Ordering::Relaxed);
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
        // The `limit` longest-expired leases of all shards: a heap of the best so
        // far, its latest lease on top, so a record is built only when it gets in.
        let mut best: BinaryHeap<ByLease> = BinaryHeap::new();
        if limit == 0 {
            return Ok(Vec::new());
        }
        for shard in self.inner.shards.iter() {
            let shard = lock(shard);
            if shard.in_progress == 0 {
                continue;
            }
            for &i in &shard.table {
                let node = &shard.nodes[i as usize];
                let core = node.core;
                if core.state != RecordState::InProgress || core.lease_until > now {
                    continue;
                }
                if best.len() == limit {
                    match best.peek() {
                        Some(top) if core.lease_until < top.0.lease_until => drop(best.pop()),
                        _ => continue,
                    }
                }
                let key = Key::split_joined(node.key.as_str());
                let record = core.record(key, shard.history_of(key, &core));
                best.push(ByLease(record));
            }
        }
        Ok(best.into_sorted_vec().into_iter().map(|r| r.0).collect())
    }

    fn record_listing(&self) -> Option<&dyn super::ListingStore> {
        Some(self)
    }
}

/// A record ordered by the end of its lease.
struct ByLease(Record);

impl PartialEq for ByLease {
    fn eq(&self, other: &Self) -> bool {
        self.0.lease_until == other.0.lease_until
    }
}

impl Eq for ByLease {}

impl PartialOrd for ByLease {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByLease {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.lease_until.cmp(&other.0.lease_until)
    }
}

#[cfg(test)]
mod tests;
