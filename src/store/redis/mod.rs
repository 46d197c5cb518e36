//! The Redis store: dedup records, the inbox and the ordering guard, each change
//! one round trip.
//!
//! [`RedisStore`] keeps every record in one Redis string. A claim is one round trip
//! of native commands in one transaction: `SET NX GET PX` (which stores a new id,
//! or answers the stored record of a known one) and a `ZADD NX` of the id to its
//! shard's due index. Only a claim that may change a known record — take over an
//! expired lease or a failed record, or replace a record expired by the caller's
//! clock — runs a Lua script (`EVALSHA`, loaded once per server), which decides
//! again atomically. A finish is one run of a Lua script that reads the record,
//! checks the fence and rewrites it — or, on a server with a native
//! compare-and-set (below), one `SET … IFEQ`; every other change of the
//! [`ProcessedStore`] contract is a script. This needs Redis 7.0 or later (Valkey
//! 7.2 or later), where `SET` takes `NX` and `GET` together. It talks to a standalone
//! server through a [`ConnectionManager`] or to a Redis Cluster through a
//! [`ClusterConnection`]: one multiplexed connection (per node) that reconnects by
//! itself.
//!
//! Claims and finishes of concurrent deliveries share round trips: one task per
//! store sends whatever has queued up as one pipeline (at most 256 of them, two
//! pipelines on the wire at once): one `MULTI` holding one `ZADD NX` per shard and
//! the claims' `SET`s, then one run of the finish script for all of its finishes. A
//! delivery alone is sent at once; under load the server reads, parses and starts
//! Lua once per batch instead of once per delivery. A Redis Cluster gets one
//! pipeline per shard. The task starts with the first claim, on the tokio runtime
//! it runs on, and ends with the store; if that runtime shuts down first, the next
//! claim or finish starts it again on its own.
//!
//! A claim or finish waits for its answer at most twice the
//! [response timeout](RedisStoreBuilder::response_timeout) (its batch's turn, then
//! its round trip) and then answers [`StoreError::Unavailable`]; the store then
//! starts a new task, in case the runtime of the old one is no longer driven. A
//! claim whose caller stopped waiting before its batch was sent is not made (nobody
//! would run its handler or release its lease); a finish is sent all the same.
//!
//! The driver is re-exported as [`webhook_guard::store::redis::redis`](redis), so a
//! host can build its own connection with the very version this crate uses.
//!
//! # Native compare-and-set: Valkey 8.1+, Redis 8.4+
//!
//! [`connect`](RedisStoreBuilder::connect) and
//! [`connect_cluster`](RedisStoreBuilder::connect_cluster) read `INFO server`; when
//! the server (every primary of a cluster) is Valkey 8.1 or later (`valkey_version`)
//! or Redis 8.4 or later, whose `SET` takes `IFEQ`, a fenced finish is
//! `SET <record> <new> IFEQ <old> PX <ttl>`, batched like the script it replaces
//! ([`RedisStore::uses_native_compare_and_set`] says which path a store is on;
//! [`RedisStoreBuilder::native_compare_and_set`]`(false)` keeps the script).
//!
//! `IFEQ` compares the whole stored value, and a record is stored whole in one
//! string, so the fence of the script — the record is `InProgress` with the
//! finish's token — holds for any expected value that starts with
//! `in_progress|<token>|`: the `SET` applies only while the record is still exactly
//! that value. A stale holder's finish is refused (the record then carries another
//! token, is finished or is gone), and any change between reading the expected
//! value and the `SET` makes it fail. The expected value is the record the claim
//! stored, remembered by this process under the claim's token (at most 65,536 are
//! remembered; a full memory is cleared); a finish that has none, or whose `SET`
//! meets a changed record, reads the record (`GET`), checks the fence itself and
//! tries again with what it read (at most four times). The finished record keeps
//! the stored fingerprint, attempts, lease end and creation time, as the script
//! does; the index entry moves earlier only, by `ZADD … LT`, when the new expiry
//! comes before the lease's end.
//!
//! Renew, delete, the claim that decides on a known record, purge, stuck and tidy
//! stay scripts on every server. A renew moves the key's TTL by as much as the
//! record's due time moves, which needs the TTL read and written in one step (no
//! native command adds to a TTL); the others decide on the record's fields with no
//! value known beforehand, so a native form would cost a round trip more. A renew
//! answers the renewed record, which the process remembers for the finish.
//!
//! # Key layout and Redis Cluster
//!
//! Records of a store are spread over a fixed number of *shards* (default
//! [`DEFAULT_SHARDS`]); a record's shard is a stable hash (FNV-1a) of its namespace
//! and id. Shard `n` owns two kinds of keys, under one hash tag so that a script
//! touching a record and its shard's index stays in one cluster slot:
//!
//! - `{<prefix>:<n>}:r:<namespace>\0<id>` — the record: a string
//!   `state|token|fingerprint|attempts|lease_until|created_at|failures|expires_at|updated_at|history`
//!   (times in ms since the epoch, history as JSON);
//! - `{<prefix>:<n>}:due` — a sorted set of the shard's records (member
//!   `<namespace>\0<id>`) scored at or before the time each needs attention: the
//!   end of its lease (to find [stuck](crate::store::ProcessedStore::stuck) claims) or its expiry
//!   (to [purge](crate::store::ProcessedStore::purge_expired) it). A claim files a new record at
//!   the end of its lease; a finish leaves the entry there unless the expiry is
//!   earlier. Entries scored too early are re-filed when a purge or a stuck scan
//!   meets them, and so are finished records when a tidy (below) does;
//! - `{<prefix>:<n>}:l:<state>:<namespace>` — a listing index: a sorted set of the
//!   shard's records of `namespace` in `state`, scored by `updated_at` (member
//!   the id; in `in_progress`, `<id>\0<token>`). See [Listing](#listing).
//!
//! The trade-off: a shard's load lands on the node that serves its slot, so one
//! store spreads over at most `shards` slots (16 by default — enough for a few
//! nodes; raise it for a larger cluster), while `stuck` and `purge_expired` visit
//! every shard (one round trip per shard and batch). `stuck` reads up to its limit
//! from each shard, in the order of the shard's index, and keeps the
//! longest-expired of them all: at most `shards × limit` records per call. The
//! order is the index's, which is not always exact: a claim of an id whose earlier
//! record the TTL dropped keeps that record's entry, scored early (`ZADD NX`), so
//! when such a claim is stuck it may come before, and in a shard with more stuck
//! claims than the limit push out, one whose lease ran out first. Every process
//! sharing a prefix must use the same shard count: change it only together with
//! the prefix.
//!
//! A cluster connection sends a pipeline again after a redirect or a lost reply,
//! and its first run may already have been applied. A claim that meets its own
//! record (`InProgress` with its token) is answered as granted; a finish that meets
//! its own result answers [`LeaseLost`](crate::store::Fence::LeaseLost), and the
//! guard, reading the record, finds its own token and state there and counts the
//! finish as made.
//!
//! On a cluster, each shard's claims and finishes are batched by a task of its own
//! (two batches in flight per shard): a node that stops answering until its
//! fail-over holds up its own shards' callers, each at most twice the response
//! timeout (then `Unavailable`), and not the other nodes'.
//!
//! # Listing
//!
//! [`record_listing`](crate::store::ProcessedStore::record_listing) and
//! [`inbox_listing`](crate::inbox::InboxStore::inbox_listing) answer the store
//! itself. Records are listed from the listing indexes (key layout above), which
//! the writes of a record keep in the same step:
//!
//! - a claim's transaction files `<id>\0<token>` in `in_progress` at `now` next to
//!   its `SET NX GET`; when the `SET` finds a record the claim keeps, the claim drops
//!   that entry again in a later batch (not waited for), and the claim script
//!   drops it in the same step when it decides (a take-over or replacement moves
//!   the old record's entry out of its state);
//! - the finish script moves the entry from `in_progress` to the new state, scored
//!   at the finish's `now`; on the native path the `SET … IFEQ` and the same move
//!   share one `MULTI`, which applies the move even when the `SET` is refused: the
//!   entry it drops names this claim's token, which no record holds once the lease
//!   is lost, and the one it files (or scores again) is stale (the listing
//!   repairs it);
//! - delete and purge remove the entries of what they remove; tidy, stuck and
//!   purge drop the finished states' entries of records the TTL dropped. A renew
//!   changes neither state nor `updated_at`.
//!
//! A page walks, per shard and state asked for, the index newest first
//! (`ZRANGE … BYSCORE REV LIMIT`, and the cursor's own millisecond whole, for
//! ties), merges the shards, and reads the page's records with one `MGET` per
//! shard. An entry whose record is not in the index's state at the entry's time
//! (the TTL dropped it, or it changed since the entry was read) is skipped, so a
//! page may hold fewer records than asked, with a cursor. Each skipped entry is
//! then repaired by a script, atomically against the record's own writes: scored
//! again at the record's `updated_at` if the record is in the entry's state (and,
//! in progress, under the entry's claim), removed otherwise — so an entry a
//! refused native finish scored again, one a record the TTL dropped and stored
//! again left behind, and a claim's entry read before its take-over was applied
//! all end right. Live and stuck claims
//! share `in_progress` (a lease tells them apart as it runs out, without a write):
//! listing either walks the claims in progress, few unless many are stuck. Counts of
//! finished states are `ZCOUNT`s per shard, which include stale entries no tidy
//! or listing has met yet; other counts read page by page.
//!
//! Records written by a build without the listing indexes are not listed: the
//! crate is unreleased, and no migration fills them.
//!
//! The cost on the hot path: one more `ZADD` per claim batch and namespace in the
//! claim transaction; in the finish script one `ZREM` and one `ZADD` per record;
//! on the native path a `MULTI` around the batch's `SET … IFEQ`s and the same two
//! commands per record (`benches/README.md` has the measured figures). Inbox
//! events have no listing index: a page walks the namespace's `due` and `settled`
//! sets with `ZSCAN` and reads each event, a cost that grows with the inbox.
//! Requeue and purge of a dead letter are one script each.
//!
//! # Retention
//!
//! Times are the caller's (`now` and the times in each request), kept as integer
//! milliseconds since the epoch (the end of a lease and an expiry rounded up, never
//! down); the server's clock is never read. Each write also sets the record key's
//! TTL to the time left until its expiry (or until the end of a live lease,
//! whichever is later), *measured from the caller's `now`*. So Redis
//! drops expired records by itself; when the caller's clock is the real one, this
//! is exactly the contract's expiry, and a claim treats a record expired by its
//! `now` as absent even while the key lives on.
//!
//! [`purge_expired`](crate::store::ProcessedStore::purge_expired) honours the contract for any
//! `now` through the `due` index: it removes records expired by then, in batches of
//! at most 256 per script, and clears the index entries of records the TTL already
//! dropped (those count as removed). **No sweeper is needed**: the records expire
//! by TTL, and the index tidies itself — each time a process has filed 256 new
//! records in a shard's index, it looks at as many of the shard's due entries,
//! drops those whose record is gone and re-files finished ones at their expiry, so
//! the index does not grow without bound. A tidy leaves a stuck claim's entry where
//! it is (the stuck scan reports it) until the record's TTL drops the record, so
//! while 256 or more stuck claims of one shard are due, its tidies make no
//! progress and its index grows by the records filed meanwhile. Running the
//! [`Sweeper`](crate::sweeper::Sweeper) anyway reports stuck claims and keeps the index
//! smaller.
//!
//! Run the server with `maxmemory-policy noeviction` (Redis's default), or give
//! the store a server of its own: every record key has a TTL, so under a
//! `volatile-*` or `allkeys-*` policy, memory pressure can evict records before
//! their expiry, a claim in progress included, and a retry would then run its
//! handler again.
//!
//! # Speed
//!
//! A processed delivery costs two round trips, a duplicate one, each shared with
//! the other deliveries of its batch. The claim runs no Lua: `SET NX GET PX` costs
//! the server what a bare `SET NX PX` does, plus filing the record in the sorted
//! set (one `ZADD NX` per shard and batch; a duplicate's entry stays as it is) and
//! its share of the transaction. The fenced finish is the one Lua script per batch,
//! kept short (no helper functions, plain string slicing): Redis before 8.4 has no
//! native compare-and-set, and a script's `GET`, string work and `SET` cost the
//! server a few µs per record, so a guard cycle costs the server several times what
//! one bare `SET` does. On Valkey 8.1+ and Redis 8.4+ the finish is one
//! `SET … IFEQ` per record instead. `benches/README.md` has the measured figures.
//!
//! # The inbox: one hash tag per namespace
//!
//! The [`InboxStore`](crate::inbox::InboxStore) of a `RedisStore`.
//!
//! Every key of one namespace's inbox carries the hash tag
//! `{<prefix>:i:<namespace>}`, so it lives in one cluster slot and every script
//! touches one slot. In the tag, the namespace's `%`, `{` and `}` are written
//! `%25`, `%7B` and `%7D` (a `}` would end the tag early, and two namespaces could
//! then spell one key):
//!
//! - `{…}:e:<id>` — the event, a hash: `s` state, `t` token, `f` fingerprint (hex),
//!   `a` attempts, `l` lease_until, `n` next_attempt_at, `r` received_at, `u`
//!   updated_at, `x` expires_at (times in ms since the epoch), `e` the last error,
//!   `p` the payload, and the metadata `mt` type, `mc` created_at, `mo` object,
//!   `mf` family (absent fields are `None`);
//! - `{…}:due` — a sorted set of the namespace's unsettled events scored at the time
//!   each is due: `next_attempt_at` while `Pending`, `lease_until` while `Running`.
//!   A lease re-scores what it takes at `lease_until`, so the event of a worker that
//!   died is due again when its lease runs out: nothing else has to notice the crash;
//! - `{…}:settled` — a sorted set of the settled events scored by `expires_at`, for
//!   [`purge_settled`](crate::inbox::InboxStore::purge_settled);
//! - `{…}:lease:<token>` — the ids one lease took, a list that expires with the
//!   lease (see below).
//!
//! and `{<prefix>:inboxes}`, a set of the namespaces that ever held an event, which
//! `purge_settled` visits. A process adds a namespace to it before its first enqueue
//! there (once per process), so no event lives in a namespace the purge cannot find.
//!
//! **The trade-off.** One due set per namespace makes a lease a single atomic script
//! that hands out strictly the oldest due events first, with no fan-out over shards
//! and no unfairness between them; the price is that one namespace's inbox (its
//! events and payloads included) is served by one node of a cluster. An inbox takes
//! webhooks, which providers send at most some thousands per second — well within
//! one Redis node — while the dedup records, which every delivery touches, stay
//! spread over the store's shards. Use one namespace per provider or endpoint to
//! spread inboxes over nodes.
//!
//! Retention: a settled event gets a TTL running to its `expires_at`, measured
//! from the caller's `now` (as the dedup records do), so Redis drops it by itself;
//! `purge_settled` honours the contract for any `now` through the `settled` index,
//! and clears the entries of events the TTL already dropped (they count as purged).
//! Unsettled events never expire.
//!
//! On a Redis Cluster, a script the connection sends again after a lost reply may
//! run twice (as for the dedup records above). A settle run twice finds its own
//! change (state, token and time) and answers applied again. A lease keeps the ids
//! it took in a receipt, `{…}:lease:<its first token>`, a list that expires with
//! the lease: run twice, it answers the events of its first run it still holds
//! instead of leasing others (which would leave those, received by no worker, to
//! wait out their lease with an attempt spent). An enqueue run twice answers that
//! the event exists, and the delivery is acknowledged all the same. The connection
//! to a standalone server sends no script twice.
//!
//! # The ordering guard: sharded like the dedup records
//!
//! The [`OrderingStore`](crate::ordering::OrderingStore) of a `RedisStore`.
//!
//! The record of object `o`, family `f` in namespace `ns` lives in the store's shard
//! `FNV-1a(ns, o, f) mod shards` (tag `{<prefix>:<n>}`): a hash
//! `{…}:o:<len(ns)>:<ns><len(o)>:<o><f>` with `n` newest created_at, `s` status, `u`
//! updated_at; the shard's `{…}:failed:<ns>` is a sorted set of that namespace's
//! failed records (member `<len(o)>:<o><f>`) scored by `updated_at`. `observe` and
//! `settle_object` are one script on one slot; `failed_objects` visits every shard
//! (one round trip each) and answers the oldest failures first. Ordering records do
//! not expire.
//!
//! # Errors
//!
//! A server that cannot be reached — connection refused, reset or dropped, a
//! timeout, a cluster that is down or failing over — is
//! [`StoreError::Unavailable`]; any other error is [`StoreError::Backend`]. Both
//! keep the [`RedisError`] as their source. The connection reconnects by itself: the
//! same store value works again once the server is back.
//!
//! [`ProcessedStore`]: super::ProcessedStore
//! [`StoreError::Unavailable`]: super::StoreError::Unavailable
//! [`StoreError::Backend`]: super::StoreError::Backend
//! [`ConnectionManager`]: redis::aio::ConnectionManager
//! [`ClusterConnection`]: redis::cluster_async::ClusterConnection
//! [`RedisError`]: redis::RedisError

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::IntoConnectionInfo;

use super::{Key, RecordState};

/// The `redis` crate this store is built on, for building connections by hand.
pub use ::redis;

/// Declares a struct of scripts, one [`Script`](::redis::Script) per field, and
/// `static SCRIPTS`, which builds each field's script from its source (a `&str` or
/// `String` expression) once, at first use.
macro_rules! scripts {
    ($vis:vis $name:ident { $($(#[$doc:meta])* $field:ident: $source:expr),+ $(,)? }) => {
        $vis struct $name {
            $($(#[$doc])* $vis $field: ::redis::Script,)+
        }

        $vis static SCRIPTS: ::std::sync::LazyLock<$name> =
            ::std::sync::LazyLock::new(|| $name {
                $($field: ::redis::Script::new(&$source),)+
            });
    };
}

mod batch;
mod codec;
mod connection;
mod inbox;
mod listing;
mod native;
mod ordering;
mod persistence;
mod processed;
mod scripts;

pub use connection::{RedisConnection, RedisStoreBuilder, RedisStoreError};

/// The key prefix of a store built without [`RedisStoreBuilder::prefix`].
pub const DEFAULT_PREFIX: &str = "webhook-guard";
/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;
/// The shard count of a store built without [`RedisStoreBuilder::shards`].
pub const DEFAULT_SHARDS: u16 = 16;
/// The highest shard count accepted.
pub const MAX_SHARDS: u16 = 1024;
/// How long connecting may take by default (each attempt).
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a command may wait for its answer by default.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);

/// How many index entries one purge or stuck script looks at, so claims wait little.
const BATCH: usize = 256;

/// A [`ProcessedStore`](super::ProcessedStore), an [`InboxStore`](crate::inbox::InboxStore) and an
/// [`OrderingStore`](crate::ordering::OrderingStore) on Redis, standalone or
/// Cluster: see the [module docs](self) for the key layout, retention by TTL and
/// errors.
///
/// Cheap to clone: clones share one multiplexed connection.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use webhook_guard::store::RedisStore;
///
/// let store = RedisStore::builder()
///     .prefix("shop:webhooks")
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    connection: RedisConnection,
    prefix: String,
    shards: u16,
    /// Inbox namespaces already added to the registry by this process.
    inboxes: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The keys of every shard, by shard number.
    keys: Arc<[ShardKeys]>,
    /// The task sending claims and finishes in batches, started by the first one
    /// (and again when the runtime it ran on has shut down).
    batcher: Mutex<Option<batch::Batcher>>,
    /// How long a command may wait for its answer; a batched one waits twice that.
    response_timeout: Duration,
    /// Whether finishes use `SET … IFEQ`, and the records claims stored for them.
    native: native::Native,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("connection", &self.inner.connection)
            .field("prefix", &self.inner.prefix)
            .field("shards", &self.inner.shards)
            .finish()
    }
}

impl RedisStore {
    /// A builder with the default prefix, shard count and timeouts.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// Connects to the standalone server at `url` with the defaults: see
    /// [`RedisStoreBuilder::connect`].
    ///
    /// # Errors
    /// [`RedisStoreError::Connect`] for a bad URL or a server that cannot be reached,
    /// [`RedisStoreError::Tls`] for a failed TLS connection (`rediss://`).
    pub async fn connect(url: impl IntoConnectionInfo) -> Result<Self, RedisStoreError> {
        Self::builder().connect(url).await
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The shard count.
    pub fn shards(&self) -> u16 {
        self.inner.shards
    }

    /// Whether fenced finishes use the server's native compare-and-set
    /// (`SET … IFEQ`) rather than a script: see
    /// [`RedisStoreBuilder::native_compare_and_set`].
    pub fn uses_native_compare_and_set(&self) -> bool {
        self.inner.native.enabled()
    }

    /// The connection the store runs on (clones share it).
    pub fn connection(&self) -> &RedisConnection {
        &self.inner.connection
    }

    fn shard_of(&self, key: Key<'_>) -> u16 {
        self.shard_for(&[key.namespace, key.id])
    }

    /// The shard of `parts` joined by NULs.
    fn shard_for(&self, parts: &[&str]) -> u16 {
        // FNV-1a: stable across processes, platforms and versions (part of the layout).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                // The NUL separator (XOR with 0 changes nothing).
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            for b in part.bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        (h % u64::from(self.inner.shards)) as u16
    }

    /// The hash tag of shard `shard`: `{<prefix>:<shard>}`.
    fn shard_tag(&self, shard: u16) -> String {
        format!("{{{}:{shard}}}", self.inner.prefix)
    }

    /// The namespaces this process has registered for the inbox (see the `inbox`
    /// module).
    fn registered_inboxes(&self) -> &std::sync::Mutex<std::collections::HashSet<String>> {
        &self.inner.inboxes
    }

    fn keys(&self, shard: u16) -> &ShardKeys {
        &self.inner.keys[usize::from(shard)]
    }

    /// The batching task's handle, started on the current runtime when there is
    /// none, its runtime has shut down, or a caller waited too long for it.
    fn batcher(&self) -> batch::Batcher {
        let mut slot = self
            .inner
            .batcher
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*slot {
            Some(batcher) if !batcher.is_closed() => batcher.clone(),
            _ => {
                let inner = &self.inner;
                let batcher = batch::Batcher::start(
                    inner.connection.clone(),
                    inner.keys.clone(),
                    inner.response_timeout,
                );
                *slot = Some(batcher.clone());
                batcher
            }
        }
    }

    /// The record's key (and member), and the shard's keys.
    fn locate(&self, key: Key<'_>) -> (RecordKey, &ShardKeys) {
        let (rec, shard) = self.locate_shard(key);
        (rec, self.keys(shard))
    }

    /// [`locate`](Self::locate), with the shard's number.
    fn locate_shard(&self, key: Key<'_>) -> (RecordKey, u16) {
        let shard = self.shard_of(key);
        let records = &self.keys(shard).records;
        let mut rec = String::with_capacity(records.len() + key.joined_len());
        rec.push_str(records);
        key.push_joined(&mut rec);
        let member_at = records.len();
        (RecordKey { rec, member_at }, shard)
    }
}

/// A record's key, `{<prefix>:<n>}:r:<namespace>\0<id>`, whose tail
/// `<namespace>\0<id>` is the record's member in its shard's due index: one string
/// for both.
#[derive(Clone)]
pub(super) struct RecordKey {
    rec: String,
    member_at: usize,
}

impl RecordKey {
    /// The record's key.
    pub(super) fn rec(&self) -> &str {
        &self.rec
    }

    /// The record's member in its shard's due index.
    pub(super) fn member(&self) -> &str {
        &self.rec[self.member_at..]
    }
}

/// The keys of one shard, built once per store.
struct ShardKeys {
    /// The record key prefix, `{<prefix>:<n>}:r:`.
    records: String,
    /// The due index, a sorted set.
    due: String,
    /// The listing index key prefix, `{<prefix>:<n>}:l:` (see the `listing` module).
    lists: String,
}

impl ShardKeys {
    fn new(tag: &str) -> Self {
        Self {
            records: format!("{tag}:r:"),
            due: format!("{tag}:due"),
            lists: format!("{tag}:l:"),
        }
    }

    /// The listing index of records of `namespace` in `state`:
    /// `{<prefix>:<n>}:l:<state>:<namespace>`.
    fn list(&self, state: RecordState, namespace: &str) -> String {
        let state = state.as_str();
        let mut key = String::with_capacity(self.lists.len() + state.len() + 1 + namespace.len());
        key.push_str(&self.lists);
        key.push_str(state);
        key.push(':');
        key.push_str(namespace);
        key
    }
}

/// A record's entry in its listing index: its id, and in `in_progress` a NUL and
/// the claim's token (see the `listing` module).
fn list_entry(id: &str, state: RecordState, token: u64) -> String {
    if state == RecordState::InProgress {
        format!("{id}\0{token}")
    } else {
        id.to_owned()
    }
}
