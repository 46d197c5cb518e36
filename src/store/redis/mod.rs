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
//! checks the fence and rewrites it; so is every other change of the
//! [`ProcessedStore`] contract. This needs Redis 7.0 or later (Valkey 7.2 or
//! later), where `SET` takes `NX` and `GET` together. It talks to a standalone
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
//!   end of its lease (to find [stuck](ProcessedStore::stuck) claims) or its expiry
//!   (to [purge](ProcessedStore::purge_expired) it). A claim files a new record at
//!   the end of its lease; a finish leaves the entry there unless the expiry is
//!   earlier. Entries scored too early are re-filed when a purge or a stuck scan
//!   meets them, and so are finished records when a tidy (below) does.
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
//! [`purge_expired`](ProcessedStore::purge_expired) honours the contract for any
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
//! [`Sweeper`](crate::Sweeper) anyway reports stuck claims and keeps the index
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
//! one bare `SET` does. `benches/README.md` has the measured figures.
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

use std::fmt;
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{
    ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError, Script, ServerErrorKind,
    ToRedisArgs, Value,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{
    ceil_millis, decode_history, encode_history, Claim, ClaimRequest, Decision, Deleted, Fence,
    FencingToken, Fingerprint, Finish, Key, ProcessedStore, Record, RecordState, StoreError,
};

/// The `redis` crate this store is built on, for building connections by hand.
pub use ::redis;

mod batch;
mod inbox;

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

/// A configuration or connection error while building a [`RedisStore`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// The key prefix is empty, too long, or holds a character that is not printable
    /// ASCII, a space, `{` or `}` (braces would change the cluster hash tag).
    #[error("invalid Redis key prefix {prefix:?}: {reason}")]
    InvalidPrefix {
        /// The prefix given.
        prefix: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The shard count is 0 or above [`MAX_SHARDS`].
    #[error("invalid shard count {0}: must be 1 to {MAX_SHARDS}")]
    InvalidShards(u16),
    /// The URL is invalid or the server could not be reached.
    #[error("could not connect to Redis: {source}")]
    Connect {
        /// The driver's error.
        #[source]
        source: RedisError,
    },
    /// The server is older than Redis 7.0, whose `SET` takes `NX` and `GET` together
    /// (every claim needs it).
    #[error("Redis {version} is too old: the store needs Redis 7.0 or later (or Valkey)")]
    UnsupportedVersion {
        /// The `redis_version` the server reported.
        version: String,
    },
}

impl RedisStoreError {
    /// Whether connecting failed because the server could not be reached (rather
    /// than a bad configuration).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Connect { source } if is_unreachable(source))
    }
}

/// A connection a [`RedisStore`] runs on: both kinds multiplex requests over one
/// connection (per node) and reconnect by themselves.
#[derive(Clone)]
#[non_exhaustive]
pub enum RedisConnection {
    /// A standalone server (or a proxy in front of one).
    Standalone(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Standalone(_) => "Standalone",
            Self::Cluster(_) => "Cluster",
        })
    }
}

impl From<ConnectionManager> for RedisConnection {
    fn from(c: ConnectionManager) -> Self {
        Self::Standalone(c)
    }
}

impl From<ClusterConnection> for RedisConnection {
    fn from(c: ClusterConnection) -> Self {
        Self::Cluster(c)
    }
}

/// One `EVALSHA` built in place: keys and arguments are written straight into the
/// command (a [`ScriptInvocation`](::redis::ScriptInvocation) buffers each in its
/// own vector, then copies them all into a command per call).
pub(crate) struct Eval<'s> {
    script: &'s Script,
    cmd: ::redis::Cmd,
}

impl<'s> Eval<'s> {
    /// An `EVALSHA` of `script` with `keys` keys, to be given first with
    /// [`Eval::key`], then the arguments.
    pub(crate) fn new(script: &'s Script, keys: usize) -> Self {
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys);
        Self { script, cmd }
    }

    /// Adds a key (before any argument).
    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(key);
        self
    }

    /// Adds an argument.
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }
}

impl RedisConnection {
    /// Runs `eval`, loading its script first if the server does not know it.
    pub(crate) async fn eval<T: FromRedisValue>(&self, eval: &Eval<'_>) -> Result<T, RedisError> {
        match self.query(&eval.cmd).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // As `ScriptInvocation::invoke_async` does (on a cluster the driver
                // sends `SCRIPT LOAD` to every primary).
                let _: String = match self {
                    Self::Standalone(c) => eval.script.load_async(&mut c.clone()).await?,
                    Self::Cluster(c) => eval.script.load_async(&mut c.clone()).await?,
                };
                self.query(&eval.cmd).await
            }
            other => other,
        }
    }

    pub(crate) async fn query_pipe<T: FromRedisValue>(
        &self,
        pipe: &::redis::Pipeline,
    ) -> Result<T, RedisError> {
        match self {
            Self::Standalone(c) => pipe.query_async(&mut c.clone()).await,
            Self::Cluster(c) => pipe.query_async(&mut c.clone()).await,
        }
    }

    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        cmd: &::redis::Cmd,
    ) -> Result<T, RedisError> {
        match self {
            Self::Standalone(c) => cmd.query_async(&mut c.clone()).await,
            Self::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
}

/// Builds a [`RedisStore`]: key prefix, shard count, timeouts, then a connection.
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    prefix: String,
    shards: u16,
    connection_timeout: Duration,
    response_timeout: Duration,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            shards: DEFAULT_SHARDS,
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
        }
    }
}

impl RedisStoreBuilder {
    /// The prefix of every key the store writes (default [`DEFAULT_PREFIX`]): 1 to
    /// [`MAX_PREFIX_LEN`] bytes of printable ASCII without spaces, `{` or `}`.
    /// Stores with different prefixes share nothing, as long as neither prefix is
    /// the other followed by `:` (`app` and `app:i` can meet in a key: keep the
    /// prefixes of one server from nesting).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many shards records are spread over (default [`DEFAULT_SHARDS`], at most
    /// [`MAX_SHARDS`]): see the [module docs](self). Every process sharing a prefix
    /// must use the same count.
    pub fn shards(mut self, shards: u16) -> Self {
        self.shards = shards;
        self
    }

    /// How long one connection attempt may take (default
    /// [`DEFAULT_CONNECTION_TIMEOUT`]). Used by [`connect`](Self::connect) and
    /// [`connect_cluster`](Self::connect_cluster).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long a command may wait for its answer before the store answers
    /// [`StoreError::Unavailable`] (default [`DEFAULT_RESPONSE_TIMEOUT`]). Used by
    /// [`connect`](Self::connect) and [`connect_cluster`](Self::connect_cluster);
    /// claims and finishes, which wait for their batch's turn first, wait at most
    /// twice as long (with [`build`](Self::build) too).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Connects to the standalone server at `url` (such as `redis://127.0.0.1:6379`)
    /// through a [`ConnectionManager`], which reconnects by itself.
    ///
    /// # Errors
    /// [`RedisStoreError`] for a bad prefix or shard count, a bad URL, or a server
    /// that cannot be reached now.
    pub async fn connect(
        self,
        url: impl IntoConnectionInfo,
    ) -> Result<RedisStore, RedisStoreError> {
        self.validate()?;
        let connect = |source| RedisStoreError::Connect { source };
        let client = ::redis::Client::open(url).map_err(connect)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
            // Fail fast while the server is away: the next request tries again.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let manager = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(connect)?;
        let store = self.build(manager)?;
        store.check_version().await?;
        Ok(store)
    }

    /// Connects to the Redis Cluster that `nodes` belong to (one or more seed
    /// addresses, such as `redis://127.0.0.1:7101`) through a [`ClusterConnection`],
    /// which follows slot moves and reconnects by itself.
    ///
    /// # Errors
    /// [`RedisStoreError`] for a bad prefix or shard count, a bad address, or a
    /// cluster that cannot be reached now.
    pub async fn connect_cluster<T: IntoConnectionInfo>(
        self,
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<RedisStore, RedisStoreError> {
        self.validate()?;
        let connect = |source| RedisStoreError::Connect { source };
        let client = ClusterClient::builder(nodes)
            .connection_timeout(self.connection_timeout)
            .response_timeout(self.response_timeout)
            .retries(2)
            .build()
            .map_err(connect)?;
        let connection = client.get_async_connection().await.map_err(connect)?;
        let store = self.build(connection)?;
        store.check_version().await?;
        Ok(store)
    }

    /// A store on a connection the host built. Unlike [`connect`](Self::connect), it
    /// asks the server nothing, so it does not check for Redis 7.0 or later: on an
    /// older server every claim fails with a syntax error.
    ///
    /// # Errors
    /// [`RedisStoreError`] for a bad prefix or shard count.
    pub fn build(
        self,
        connection: impl Into<RedisConnection>,
    ) -> Result<RedisStore, RedisStoreError> {
        self.validate()?;
        let keys = (0..self.shards)
            .map(|n| ShardKeys::new(&format!("{{{}:{n}}}", self.prefix)))
            .collect();
        Ok(RedisStore {
            inner: Arc::new(Inner {
                keys,
                batcher: Mutex::new(None),
                response_timeout: self.response_timeout,
                connection: connection.into(),
                prefix: self.prefix,
                shards: self.shards,
                inboxes: Default::default(),
            }),
        })
    }

    fn validate(&self) -> Result<(), RedisStoreError> {
        let p = &self.prefix;
        let bad = |reason| {
            Err(RedisStoreError::InvalidPrefix {
                prefix: p.clone(),
                reason,
            })
        };
        if p.is_empty() {
            return bad("empty");
        }
        if p.len() > MAX_PREFIX_LEN {
            return bad("longer than 64 bytes");
        }
        if !p
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
        {
            return bad("only printable ASCII without spaces, `{` or `}`");
        }
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(RedisStoreError::InvalidShards(self.shards));
        }
        Ok(())
    }
}

/// A [`ProcessedStore`], an [`InboxStore`](crate::inbox::InboxStore) and an
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
    /// [`RedisStoreError::Connect`] for a bad URL or a server that cannot be reached.
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

    /// The connection the store runs on (clones share it).
    pub fn connection(&self) -> &RedisConnection {
        &self.inner.connection
    }

    fn shard_of(&self, key: Key<'_>) -> u16 {
        self.shard_for(&[key.namespace, key.id])
    }

    /// The shard of `parts` joined by NULs.
    pub(crate) fn shard_for(&self, parts: &[&str]) -> u16 {
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
    pub(crate) fn shard_tag(&self, shard: u16) -> String {
        format!("{{{}:{shard}}}", self.inner.prefix)
    }

    /// The namespaces this process has registered for the inbox (see
    /// `inbox::redis`).
    pub(crate) fn registered_inboxes(
        &self,
    ) -> &std::sync::Mutex<std::collections::HashSet<String>> {
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
}

impl ShardKeys {
    fn new(tag: &str) -> Self {
        Self {
            records: format!("{tag}:r:"),
            due: format!("{tag}:due"),
        }
    }
}

fn is_unreachable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        )
}

pub(crate) fn store_error(e: RedisError) -> StoreError {
    if is_unreachable(&e) {
        StoreError::unavailable(e)
    } else {
        StoreError::backend(e)
    }
}

pub(crate) fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub(crate) fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Milliseconds from `now` until `due`, at least 1 (a TTL).
fn ttl(due: i64, now: i64) -> i64 {
    due.saturating_sub(now).max(1)
}

pub(crate) fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("redis record: {what}"))
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => text(v)?.parse().ok(),
    }
}

pub(crate) fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// The `redis_version` in the text of `INFO server`, and whether it is 7.0 or later.
fn server_version(info: &str) -> Option<(&str, bool)> {
    let version = info
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))?
        .trim();
    let major: u32 = version.split('.').next()?.parse().ok()?;
    Some((version, major >= 7))
}

/// The version in an `INFO server` text if it is older than 7.0.
fn too_old(info: &str) -> Option<String> {
    match server_version(info) {
        Some((version, false)) => Some(version.to_owned()),
        _ => None,
    }
}

impl RedisStore {
    /// Refuses a server older than Redis 7.0 (see
    /// [`RedisStoreError::UnsupportedVersion`]). A server whose `INFO` does not say
    /// (a proxy, say) is let through.
    async fn check_version(&self) -> Result<(), RedisStoreError> {
        let info: Value = self
            .inner
            .connection
            .query(::redis::cmd("INFO").arg("server"))
            .await
            .map_err(|source| RedisStoreError::Connect { source })?;
        // A cluster answers one text per primary.
        let mut texts = vec![&info];
        let mut old = None;
        while let Some(v) = texts.pop() {
            match v {
                Value::Map(pairs) => texts.extend(pairs.iter().map(|(_, v)| v)),
                Value::Array(items) => texts.extend(items),
                Value::VerbatimString { text, .. } => old = old.or(too_old(text)),
                v => old = old.or(text(v).and_then(too_old)),
            }
        }
        match old {
            Some(version) => Err(RedisStoreError::UnsupportedVersion { version }),
            None => Ok(()),
        }
    }
}

/// Tidies part of a shard's due index (see [`TIDY`]). A failure is only logged:
/// the claims it follows stand, and a later batch tries again.
async fn tidy(connection: &RedisConnection, keys: &ShardKeys, now: i64) {
    let mut inv = Eval::new(&SCRIPTS.tidy, 1);
    inv.key(&keys.due).arg(&keys.records).arg(now);
    if let Err(e) = connection.eval::<i64>(&inv).await {
        tracing::debug!(error = %e, "redis store: tidying the due index failed");
    }
}

/// A record from its stored form: `s|t|f|a|l|c|x|e|u|h` — state, token (decimal
/// u64), fingerprint (hex), attempts, lease_until, created_at, failures,
/// expires_at, updated_at (times in ms since the epoch) and the history (JSON, empty
/// when there is none; last, so it may hold `|`). A finish keeps `t|f|a|l|c` and
/// rewrites the rest.
fn record(key: Key<'_>, stored: &str) -> Result<Record, StoreError> {
    let mut fields = [""; 10];
    let mut parts = stored.splitn(10, '|');
    for field in &mut fields {
        *field = parts.next().ok_or_else(|| corrupt("wrong field count"))?;
    }
    let [s, t, f, a, l, c, x, e, u, h] = fields;
    let num = |v: &str, name: &str| v.parse::<i64>().map_err(|_| corrupt(name));
    let small = |v: &str, name: &str| v.parse::<u32>().map_err(|_| corrupt(name));
    Ok(Record::new(
        key,
        RecordState::parse(s).ok_or_else(|| corrupt("state"))?,
        Fingerprint::from_hex(f).ok_or_else(|| corrupt("fingerprint"))?,
        FencingToken(t.parse().map_err(|_| corrupt("token"))?),
        small(a, "attempts")?,
        small(x, "failures")?,
        time(num(l, "lease_until")?),
        time(num(e, "expires_at")?),
        time(num(c, "created_at")?),
        time(num(u, "updated_at")?),
        decode_history(h)?,
    ))
}

/// Whether `existing` is this very claim's own write, read back: `InProgress` with
/// the request's token. Tokens are random per claim, so only a repeated run of the
/// same round trip (a Redis Cluster connection sends a pipeline again after a
/// redirect or a lost reply, and the first run may have applied) meets one; the
/// claim was granted, so it is answered as granted.
fn own_claim(existing: &Record, request: &ClaimRequest<'_>) -> bool {
    request.made(existing)
}

/// The stored form of the record a fresh `claim` creates (see [`record`]), and its
/// TTL: until its expiry or the end of its lease, whichever is later.
fn fresh_record(request: &ClaimRequest<'_>) -> (String, i64) {
    let now = millis(request.now);
    let lease = ceil_millis(request.lease_until);
    let expires = ceil_millis(request.expires_at);
    // Written into one buffer of its final size (at most 158 bytes while times
    // have 13 digits): the claim of every delivery builds it.
    let mut fresh = String::with_capacity(160);
    let _ = write!(fresh, "in_progress|{}|", request.token.0);
    request.fingerprint.push_hex(&mut fresh);
    let _ = write!(fresh, "|1|{lease}|{now}|0|{expires}|{now}|");
    (fresh, ttl(expires.max(lease), now))
}

/// `args` written into a string made with capacity `cap`, at least their length
/// (a finish's fields are bounded: a `u64` token has at most 20 digits, an `i64`
/// time 20 characters), so the string never grows, as a `format!` of them would
/// several times.
fn sized(cap: usize, args: fmt::Arguments<'_>) -> String {
    let mut text = String::with_capacity(cap);
    let _ = text.write_fmt(args);
    text
}

fn stored_record(key: Key<'_>, v: &Value) -> Result<Record, StoreError> {
    record(key, text(v).ok_or_else(|| corrupt("not text"))?)
}

struct Scripts {
    claim: Script,
    tidy: Script,
    finish: Script,
    renew: Script,
    delete: Script,
    purge: Script,
    stuck: Script,
}

/// Shared by every script: `parse` splits a stored record (see [`record`]) into its
/// ten fields, or answers nothing for one that does not parse, numbers included (a
/// record this crate did not write must not raise a script error: that would fail
/// every other record of a batch or a scan); `ttl` is the time left until `due`, at
/// least 1 ms.
const PRELUDE: &str = include_str!("lua/records/prelude.lua");

/// The claim script, for the rare claim that must decide on a known record (see
/// [`RedisStore::claim`]): its first lines store the id if the record vanished since
/// the claim's `SET NX GET`; KEYS record, due; ARGV the fresh record, its TTL,
/// member, fingerprint, token, now, lease_until, expires_at. Answers 0 (stored: the
/// caller knows the record).
const CLAIM_HEAD: &str = include_str!("lua/records/claim_head.lua");

/// Tidies [`TIDY_BATCH`] entries of a shard's due index that are due: drops those
/// whose record is gone (dropped by its TTL) and re-files finished ones at their
/// expiry. KEYS due; ARGV record key prefix, now.
const TIDY: &str = include_str!("lua/records/tidy.lua");

/// Each time a process has filed this many new records in a shard's due index, it
/// tidies as many of the shard's due entries ([`TIDY`]): gone records dropped,
/// finished ones re-filed at their expiry. With retention by key TTL, the index so
/// stays bounded even when no sweeper runs.
const TIDY_BATCH: u32 = 256;

/// The rest of the claim script, deciding on a known record in the same round trip:
/// an expired record is replaced (0), a failed or abandoned one with a matching
/// fingerprint (equal, or either one unknown: all zeros) taken over ({1, record}),
/// keeping a known fingerprint, and anything else answered unchanged ({2, record}).
const CLAIM_DECIDE: &str = include_str!("lua/records/claim_decide.lua");

/// Finish, for a batch of records: KEYS record and due of each; ARGV six per
/// record: the fence prefix `in_progress|<token>|`, the new record's head
/// `<state>|<token>|`, its tail `<failures>|<expires_at>|<now>|<history>`, its TTL,
/// expires_at, member. Answers one code per record: 1 (applied), 0 (lease lost) or
/// -1 (corrupt). Keeps the fields `f|a|l|c` after the fence prefix as they are. The
/// index entry stays at the lease's end (at or before the new expiry, where purge
/// and stuck re-file it) unless the new expiry is earlier. Without the prelude:
/// every line here is paid by every processed delivery.
const FINISH: &str = include_str!("lua/records/finish.lua");

/// Renew: KEYS record, due; ARGV member, token, lease_until, expires_at. No `now`
/// is given, so the TTL moves by as much as the record's due time does.
const RENEW: &str = include_str!("lua/records/renew.lua");

/// Delete: KEYS record, due; ARGV member, now. Answers 1 (removed), 0 (not found)
/// or 2 (live lease).
const DELETE: &str = include_str!("lua/records/delete.lua");

/// Purge one batch of a shard: KEYS due; ARGV now, limit, record key prefix,
/// offset. Answers {removed, looked at, kept in place}: stuck records whose expiry
/// has not come stay at the front of the range (for stuck), everything else leaves
/// it (removed, or re-filed at its next due time).
const PURGE: &str = include_str!("lua/records/purge.lua");

/// Stuck records of one shard: KEYS due; ARGV now, limit, record key prefix,
/// offset. Answers {looked at, kept in place, then member and record of each stuck
/// one}: stuck and expired records stay at the front of the range, everything else
/// leaves it (dropped if gone, or re-filed at its next due time).
const STUCK: &str = include_str!("lua/records/stuck.lua");

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let script = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
    Scripts {
        claim: Script::new(&format!("{CLAIM_HEAD}{PRELUDE}{CLAIM_DECIDE}")),
        tidy: Script::new(&TIDY.replace("TIDY_BATCH", &TIDY_BATCH.to_string())),
        finish: Script::new(FINISH),
        renew: script(RENEW),
        delete: script(DELETE),
        purge: script(PURGE),
        stuck: script(STUCK),
    }
});

#[async_trait]
impl ProcessedStore for RedisStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let (rec, shard) = self.locate_shard(request.key);
        let (now, lease, expires) = (
            millis(request.now),
            ceil_millis(request.lease_until),
            ceil_millis(request.expires_at),
        );
        let (fresh, fresh_ttl) = fresh_record(request);
        // The record as stored: times in whole milliseconds.
        let acquired = || {
            Claim::Acquired(Record::new(
                request.key,
                RecordState::InProgress,
                request.fingerprint,
                request.token,
                1,
                0,
                time(lease),
                time(expires),
                time(now),
                time(now),
                Vec::new(),
            ))
        };

        // One round trip for a new id and for a duplicate: a native `SET NX GET`
        // stores a new id or answers the record, and the due index learns the member
        // in the same transaction (`ZADD NX`: a duplicate's entry stays as it is),
        // sent with the other claims and finishes of its batch.
        let stored = self
            .batcher()
            .claim(batch::ClaimJob {
                shard,
                rec,
                fresh,
                ttl: fresh_ttl,
                lease,
                now,
            })
            .await
            .map_err(store_error)?;
        let Some(stored) = stored else {
            return Ok(acquired());
        };
        let existing = record(request.key, &stored)?;
        if own_claim(&existing, request) {
            return Ok(Claim::Acquired(existing));
        }
        if request.decide_on(&existing) == Decision::Keep {
            return Ok(Claim::Existing(existing));
        }

        // A known record this claim may replace or take over: the script decides
        // again, atomically (the record may have changed since). Rare, so the keys
        // and the fresh record, moved into the batch, are built again.
        let (rec, shard) = self.locate_shard(request.key);
        let (fresh, fresh_ttl) = fresh_record(request);
        let mut inv = Eval::new(&SCRIPTS.claim, 2);
        inv.key(rec.rec())
            .key(&self.keys(shard).due)
            .arg(&fresh)
            .arg(fresh_ttl)
            .arg(rec.member())
            .arg(request.fingerprint.to_hex())
            .arg(request.token.0)
            .arg(now)
            .arg(lease)
            .arg(expires);
        let answer: Value = self
            .inner
            .connection
            .eval(&inv)
            .await
            .map_err(store_error)?;
        match answer {
            Value::Int(0) => Ok(acquired()),
            Value::Array(v) => match v.as_slice() {
                [Value::Int(1), r] => Ok(Claim::Acquired(stored_record(request.key, r)?)),
                [Value::Int(2), r] => {
                    let existing = stored_record(request.key, r)?;
                    Ok(if own_claim(&existing, request) {
                        Claim::Acquired(existing)
                    } else {
                        Claim::Existing(existing)
                    })
                }
                _ => Err(corrupt("unexpected claim answer")),
            },
            _ => Err(corrupt("unexpected claim answer")),
        }
    }

    async fn finish(
        &self,
        key: Key<'_>,
        token: FencingToken,
        finish: &Finish<'_>,
    ) -> Result<Fence, StoreError> {
        let (rec, shard) = self.locate_shard(key);
        let history = if finish.history.is_empty() {
            String::new()
        } else {
            encode_history(finish.history)
        };
        let token = token.0;
        let (now, expires) = (millis(finish.now), ceil_millis(finish.expires_at));
        let state = finish.state.as_str();
        let job = batch::FinishJob {
            shard,
            rec,
            fence: sized(33, format_args!("in_progress|{token}|")),
            head: sized(state.len() + 22, format_args!("{state}|{token}|")),
            tail: sized(
                54 + history.len(),
                format_args!("{}|{expires}|{now}|{history}", finish.failures),
            ),
            ttl: ttl(expires, now),
            expires,
        };
        let finished = self.batcher().finish(job).await.map_err(store_error)?;
        match finished {
            batch::Finished::Applied => Ok(Fence::Applied),
            batch::Finished::LeaseLost => Ok(Fence::LeaseLost),
            batch::Finished::Corrupt => Err(corrupt("record")),
        }
    }

    async fn renew(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        let (rec, keys) = self.locate(key);
        let mut inv = Eval::new(&SCRIPTS.renew, 2);
        inv.key(rec.rec())
            .key(&keys.due)
            .arg(rec.member())
            .arg(token.0)
            .arg(ceil_millis(lease_until))
            .arg(ceil_millis(expires_at));
        let applied: i64 = self
            .inner
            .connection
            .eval(&inv)
            .await
            .map_err(store_error)?;
        Ok(if applied == 1 {
            Fence::Applied
        } else {
            Fence::LeaseLost
        })
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        let (rec, _) = self.locate(key);
        let stored: Option<String> = self
            .inner
            .connection
            .query(::redis::cmd("GET").arg(rec.rec()))
            .await
            .map_err(store_error)?;
        stored.map(|s| record(key, &s)).transpose()
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        let (rec, keys) = self.locate(key);
        let mut inv = Eval::new(&SCRIPTS.delete, 2);
        inv.key(rec.rec())
            .key(&keys.due)
            .arg(rec.member())
            .arg(millis(now));
        let answer: i64 = self
            .inner
            .connection
            .eval(&inv)
            .await
            .map_err(store_error)?;
        Ok(match answer {
            1 => Deleted::Removed,
            2 => Deleted::LeaseHeld,
            _ => Deleted::NotFound,
        })
    }

    /// Removes records expired at `now` through the shards' indexes, at most 256
    /// per script. Records the TTL already dropped count as removed (their index
    /// entries are cleared).
    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let now = millis(now);
        let mut removed = 0;
        for shard in 0..self.inner.shards {
            let keys = self.keys(shard);
            let mut offset = 0;
            loop {
                let want = (limit - removed).min(BATCH);
                if want == 0 {
                    return Ok(removed as u64);
                }
                let mut inv = Eval::new(&SCRIPTS.purge, 1);
                inv.key(&keys.due)
                    .arg(now)
                    .arg(want)
                    .arg(&keys.records)
                    .arg(offset);
                let (n, seen, kept): (usize, usize, usize) = self
                    .inner
                    .connection
                    .eval(&inv)
                    .await
                    .map_err(store_error)?;
                removed += n.min(want);
                offset += kept;
                if seen < want {
                    break;
                }
            }
        }
        Ok(removed as u64)
    }

    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        // Up to `limit` of each shard, each shard's in the order of its due index;
        // then the `limit` longest-expired of them all.
        let now = millis(now);
        let mut out = Vec::new();
        for shard in 0..self.inner.shards {
            let keys = self.keys(shard);
            let mut offset = 0;
            let mut found_here = 0;
            loop {
                let want = (limit - found_here).min(BATCH);
                if want == 0 {
                    break;
                }
                let mut inv = Eval::new(&SCRIPTS.stuck, 1);
                inv.key(&keys.due)
                    .arg(now)
                    .arg(want)
                    .arg(&keys.records)
                    .arg(offset);
                let answer: Vec<Value> = self
                    .inner
                    .connection
                    .eval(&inv)
                    .await
                    .map_err(store_error)?;
                let [seen, kept, found @ ..] = answer.as_slice() else {
                    return Err(corrupt("unexpected stuck answer"));
                };
                let seen = int(seen).ok_or_else(|| corrupt("stuck answer"))?;
                offset += int(kept).ok_or_else(|| corrupt("stuck answer"))?;
                for pair in found.chunks(2) {
                    let [m, r] = pair else {
                        return Err(corrupt("unexpected stuck answer"));
                    };
                    let m = text(m).ok_or_else(|| corrupt("member"))?;
                    let key = Key::split_joined(m);
                    if found_here < limit {
                        // One record this crate cannot read fails no scan (the
                        // scripts keep such records in place, for the purge).
                        match stored_record(key, r) {
                            Ok(record) => out.push(record),
                            Err(e) => {
                                tracing::warn!(namespace = %key.namespace, id = %key.id, error = %e, "a stuck record that does not read: skipped");
                            }
                        }
                        found_here += 1;
                    }
                }
                if seen < want as i64 {
                    break;
                }
            }
        }
        out.sort_by_key(|r| r.lease_until);
        out.truncate(limit);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{fresh_record, record, server_version, too_old};
    use crate::store::{
        encode_history, ClaimRequest, FailureNote, FencingToken, Fingerprint, Key, RecordState,
        StoreError,
    };

    /// A fresh claim's stored form reads back as the claim it wrote; a record with
    /// too few fields is corrupt; the history, last, may hold `|`.
    #[test]
    fn records_are_read_back_from_their_stored_form() {
        let now = chrono::DateTime::from_timestamp_millis(1_700_000_000_123).unwrap();
        let key = Key::new("default", "evt_1");
        let request = ClaimRequest {
            key,
            fingerprint: Fingerprint::of(b"body"),
            token: FencingToken(u64::MAX),
            now,
            lease_until: now + chrono::TimeDelta::seconds(60),
            expires_at: now + chrono::TimeDelta::hours(72),
        };
        let (fresh, ttl) = fresh_record(&request);
        assert!(fresh.len() <= 160, "{} bytes", fresh.len());
        assert_eq!(ttl, 72 * 3600 * 1000);
        let rec = record(key, &fresh).unwrap();
        assert!(request.made(&rec));
        assert_eq!(rec.state, RecordState::InProgress);
        assert_eq!(rec.fingerprint, request.fingerprint);
        assert_eq!((rec.attempts, rec.failures), (1, 0));
        assert_eq!(
            (rec.created_at, rec.lease_until, rec.expires_at),
            (now, request.lease_until, request.expires_at)
        );
        assert!(rec.history.is_empty());

        let short = fresh.rsplitn(3, '|').nth(2).unwrap();
        assert!(matches!(record(key, short), Err(StoreError::Corrupt(_))));

        let notes = [FailureNote {
            at: now,
            error: "a|b".into(),
        }];
        let failed = format!(
            "failed|7|{}|2|0|0|1|0|0|{}",
            request.fingerprint.to_hex(),
            encode_history(&notes)
        );
        let rec = record(key, &failed).unwrap();
        assert_eq!(rec.history[0].error, "a|b");
    }

    #[test]
    fn the_server_version_is_read_from_info() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n";
        assert_eq!(server_version(info), Some(("7.0.15", true)));
        assert_eq!(too_old(info), None);
        assert_eq!(
            too_old("redis_version:6.2.14\r\n").as_deref(),
            Some("6.2.14")
        );
        assert_eq!(
            server_version("redis_version:10.0.0"),
            Some(("10.0.0", true))
        );
        // Nothing to go by: let it through.
        assert_eq!(too_old("# Server\r\n"), None);
        assert_eq!(too_old("redis_version:unknown"), None);
    }
}
