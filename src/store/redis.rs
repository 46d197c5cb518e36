//! The Redis store: one hash per record, changed by Lua scripts in one round trip.
//!
//! [`RedisStore`] keeps every record in a Redis hash and makes each change of the
//! [`ProcessedStore`] contract with one atomic Lua script (`EVALSHA`, loaded once per
//! server): a claim — including the fingerprint check and the takeover of an expired
//! lease — is one round trip, and so is a finish. It talks to a standalone server
//! through a [`ConnectionManager`](::redis::aio::ConnectionManager) or to a Redis
//! Cluster through a [`ClusterConnection`](::redis::cluster_async::ClusterConnection):
//! one multiplexed connection (per node) that reconnects by itself.
//!
//! The driver is re-exported as [`webhook_guard::store::redis::redis`](redis), so a
//! host can build its own connection with the very version this crate uses.
//!
//! # Key layout and Redis Cluster
//!
//! Records of a store are spread over a fixed number of *shards* (default
//! [`DEFAULT_SHARDS`]); a record's shard is a stable hash of its namespace and id.
//! Each shard `n` owns three kinds of keys, all under one hash tag so that a script
//! touching a record and its shard's indexes stays in one cluster slot:
//!
//! - `{<prefix>:<n>}:r:<namespace>\0<id>` — the record (a hash);
//! - `{<prefix>:<n>}:leases` — a sorted set of the shard's `InProgress` records by
//!   `lease_until`, for [`ProcessedStore::stuck`];
//! - `{<prefix>:<n>}:expiry` — a sorted set of the shard's records by `expires_at`,
//!   for [`ProcessedStore::purge_expired`].
//!
//! The trade-off: a shard's load lands on the node that serves its slot, so one
//! store spreads over at most `shards` slots (16 by default — enough for a few
//! nodes; raise it for a larger cluster), while `stuck` and `purge_expired` visit
//! every shard (one round trip each). Every process sharing a prefix must use the
//! same shard count: change it only together with the prefix.
//!
//! # Retention
//!
//! Times are the caller's (`now` and the times in each request), kept as integer
//! milliseconds since the epoch; the server's clock is never read. Each write also
//! sets the record key's TTL to the time left until its expiry (or until the end of
//! a live lease, whichever is later), *measured from the caller's `now`*. So Redis
//! drops expired records by itself and no sweeper is needed; when the caller's
//! clock is the real one this is exactly the contract's expiry. The expiry index
//! lets [`purge_expired`](ProcessedStore::purge_expired) still honour the contract
//! for any `now` (it removes records expired by the given time, in batches, and
//! clears index entries of records the TTL already dropped — those count as
//! removed). Running the sweeper is optional; it keeps the indexes small.
//!
//! # Errors
//!
//! A server that cannot be reached — connection refused, reset or dropped, a
//! timeout, a cluster that is down or failing over — is
//! [`StoreError::Unavailable`]; any other error is [`StoreError::Backend`]. Both
//! keep the [`RedisError`] as their source. The connection reconnects by itself: the
//! same store value works again once the server is back.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{
    ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError, Script, ScriptInvocation,
    ServerErrorKind, Value,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{
    decode_history, encode_history, Claim, ClaimRequest, Deleted, Fence, FencingToken, Fingerprint,
    Finish, Key, ProcessedStore, Record, RecordState, StoreError,
};

/// The `redis` crate this store is built on, for building connections by hand.
pub use ::redis;

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
}

impl RedisStoreError {
    /// Whether connecting failed because the server could not be reached (rather
    /// than a bad configuration).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Connect { source } if unreachable(source))
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

impl RedisConnection {
    async fn invoke<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, RedisError> {
        match self {
            Self::Standalone(c) => script.invoke_async(&mut c.clone()).await,
            Self::Cluster(c) => script.invoke_async(&mut c.clone()).await,
        }
    }

    async fn query<T: FromRedisValue>(&self, cmd: &::redis::Cmd) -> Result<T, RedisError> {
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
    /// Stores with different prefixes share nothing.
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
    /// [`connect`](Self::connect) and [`connect_cluster`](Self::connect_cluster).
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
        self.build(manager)
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
        self.build(connection)
    }

    /// A store on a connection the host built.
    ///
    /// # Errors
    /// [`RedisStoreError`] for a bad prefix or shard count.
    pub fn build(
        self,
        connection: impl Into<RedisConnection>,
    ) -> Result<RedisStore, RedisStoreError> {
        self.validate()?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                connection: connection.into(),
                prefix: self.prefix,
                shards: self.shards,
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

/// A [`ProcessedStore`] on Redis, standalone or Cluster: see the [module docs](self)
/// for the key layout, retention by TTL and errors.
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
        // FNV-1a: stable across processes, platforms and versions (part of the layout).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let bytes = key.namespace.bytes().chain([0]).chain(key.id.bytes());
        for b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h % u64::from(self.inner.shards)) as u16
    }

    fn keys(&self, shard: u16) -> ShardKeys {
        let tag = format!("{{{}:{shard}}}", self.inner.prefix);
        ShardKeys {
            records: format!("{tag}:r:"),
            leases: format!("{tag}:leases"),
            expiry: format!("{tag}:expiry"),
        }
    }

    /// The record key, the shard's lease and expiry indexes, and the index member.
    fn locate(&self, key: Key<'_>) -> (String, ShardKeys, String) {
        let keys = self.keys(self.shard_of(key));
        let member = member(key);
        (format!("{}{member}", keys.records), keys, member)
    }
}

struct ShardKeys {
    records: String,
    leases: String,
    expiry: String,
}

/// `namespace`, a NUL, then `id`: NUL cannot appear in a namespace the guard accepts.
fn member(key: Key<'_>) -> String {
    let mut m = String::with_capacity(key.namespace.len() + 1 + key.id.len());
    m.push_str(key.namespace);
    m.push('\0');
    m.push_str(key.id);
    m
}

fn unreachable(e: &RedisError) -> bool {
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

fn store_error(e: RedisError) -> StoreError {
    if unreachable(&e) {
        StoreError::unavailable(e)
    } else {
        StoreError::backend(e)
    }
}

fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("redis record: {what}"))
}

fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => text(v)?.parse().ok(),
    }
}

fn field<'v, T>(
    v: &'v Value,
    name: &str,
    parse: impl FnOnce(&'v Value) -> Option<T>,
) -> Result<T, StoreError> {
    parse(v).ok_or_else(|| corrupt(name))
}

fn count(v: &Value, name: &str) -> Result<u32, StoreError> {
    field(v, name, |v| int(v).and_then(|i| u32::try_from(i).ok()))
}

fn history(v: &Value) -> Result<Vec<super::FailureNote>, StoreError> {
    match v {
        Value::Nil => Ok(Vec::new()),
        v => decode_history(field(v, "history", text)?),
    }
}

/// A record from the ten fields `s f t a x l e c u h`, as the scripts answer them.
fn record(key: Key<'_>, f: &[Value]) -> Result<Record, StoreError> {
    let [s, fp, t, a, x, l, e, c, u, h] = f else {
        return Err(corrupt("wrong field count"));
    };
    Ok(Record::new(
        key,
        field(s, "state", |v| RecordState::parse(text(v)?))?,
        field(fp, "fingerprint", |v| Fingerprint::from_hex(text(v)?))?,
        field(t, "token", |v| text(v)?.parse().ok().map(FencingToken))?,
        count(a, "attempts")?,
        count(x, "failures")?,
        time(field(l, "lease_until", int)?),
        time(field(e, "expires_at", int)?),
        time(field(c, "created_at", int)?),
        time(field(u, "updated_at", int)?),
        history(h)?,
    ))
}

/// The fields every record-returning script answers, in this order.
const FIELDS: [&str; 10] = ["s", "f", "t", "a", "x", "l", "e", "c", "u", "h"];

struct Scripts {
    claim: Script,
    finish: Script,
    renew: Script,
    delete: Script,
    purge: Script,
    stuck: Script,
}

/// Record hash fields: s state, f fingerprint (hex), t token (decimal u64),
/// a attempts, x failures, l lease_until, e expires_at, c created_at, u updated_at
/// (times in ms), h history (JSON, absent when empty).
///
/// Claim: KEYS record, leases, expiry; ARGV member, fingerprint, token, now,
/// lease_until, expires_at. Answers 0 (fresh), {1, a, x, e, c, h} (taken over) or
/// {2, the ten fields} (existing, unchanged).
const CLAIM: &str = r"
local rec, leases, expiry = KEYS[1], KEYS[2], KEYS[3]
local member, fp, token, now_s, lease, exp = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local now = tonumber(now_s)
local r = redis.call('HMGET', rec, 's', 'f', 't', 'a', 'x', 'l', 'e', 'c', 'u', 'h')
local state = r[1]
if state then
  local l, e = tonumber(r[6]), tonumber(r[7])
  local live = state == 'in_progress' and l > now
  if e > now or live then
    if r[2] == fp and (state == 'failed' or (state == 'in_progress' and not live)) then
      local x = tonumber(r[5])
      if state == 'in_progress' then x = x + 1 end
      local a = tonumber(r[4]) + 1
      local ne = r[7]
      if tonumber(exp) > e then ne = exp end
      redis.call('HSET', rec, 's', 'in_progress', 't', token, 'a', a, 'x', x, 'l', lease, 'e', ne, 'u', now_s)
      redis.call('ZADD', leases, lease, member)
      redis.call('ZADD', expiry, ne, member)
      local ttl = math.max(tonumber(ne), tonumber(lease)) - now
      redis.call('PEXPIRE', rec, string.format('%d', math.max(ttl, 1)))
      return {1, a, x, ne, r[8], r[10]}
    end
    return {2, r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10]}
  end
  redis.call('DEL', rec)
end
redis.call('HSET', rec, 's', 'in_progress', 'f', fp, 't', token, 'a', 1, 'x', 0, 'l', lease, 'e', exp, 'c', now_s, 'u', now_s)
redis.call('ZADD', leases, lease, member)
redis.call('ZADD', expiry, exp, member)
local ttl = math.max(tonumber(exp), tonumber(lease)) - now
redis.call('PEXPIRE', rec, string.format('%d', math.max(ttl, 1)))
return 0
";

/// Finish: KEYS record, leases, expiry; ARGV member, token, state, failures,
/// history ('' for none), now, expires_at. Answers 1 (applied) or 0 (lease lost).
const FINISH: &str = r"
local rec = KEYS[1]
local r = redis.call('HMGET', rec, 's', 't', 'l')
if r[1] ~= 'in_progress' or r[2] ~= ARGV[2] then return 0 end
if ARGV[5] == '' then
  redis.call('HSET', rec, 's', ARGV[3], 'x', ARGV[4], 'u', ARGV[6], 'e', ARGV[7])
  redis.call('HDEL', rec, 'h')
else
  redis.call('HSET', rec, 's', ARGV[3], 'x', ARGV[4], 'u', ARGV[6], 'e', ARGV[7], 'h', ARGV[5])
end
local due = tonumber(ARGV[7])
if ARGV[3] == 'in_progress' then
  due = math.max(due, tonumber(r[3]))
else
  redis.call('ZREM', KEYS[2], ARGV[1])
end
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[1])
redis.call('PEXPIRE', rec, string.format('%d', math.max(due - tonumber(ARGV[6]), 1)))
return 1
";

/// Renew: KEYS record, leases, expiry; ARGV member, token, lease_until, expires_at.
/// No `now` is given, so the TTL moves by as much as the record's due time does.
const RENEW: &str = r"
local rec = KEYS[1]
local r = redis.call('HMGET', rec, 's', 't', 'l', 'e')
if r[1] ~= 'in_progress' or r[2] ~= ARGV[2] then return 0 end
local ol, oe, nl = tonumber(r[3]), tonumber(r[4]), tonumber(ARGV[3])
local ne = r[4]
if tonumber(ARGV[4]) > oe then ne = ARGV[4] end
redis.call('HSET', rec, 'l', ARGV[3], 'e', ne)
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[3], ne, ARGV[1])
local pttl = redis.call('PTTL', rec)
if pttl > 0 then
  local ttl = pttl + math.max(tonumber(ne), nl) - math.max(oe, ol)
  redis.call('PEXPIRE', rec, string.format('%d', math.max(ttl, 1)))
end
return 1
";

/// Delete: KEYS record, leases, expiry; ARGV member, now. Answers 1 (removed),
/// 0 (not found) or 2 (live lease).
const DELETE: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 'l')
if r[1] == 'in_progress' and tonumber(r[2]) > tonumber(ARGV[2]) then return 2 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if not r[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
";

/// Purge one batch of a shard: KEYS expiry, leases; ARGV now, limit, record key
/// prefix. Answers {removed, looked at}.
const PURGE: &str = r"
local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local removed = 0
for _, m in ipairs(due) do
  local k = ARGV[3] .. m
  local r = redis.call('HMGET', k, 's', 'l', 'e')
  local l, e = tonumber(r[2]), tonumber(r[3])
  if r[1] == 'in_progress' and l > now then
    redis.call('ZADD', KEYS[1], string.format('%d', math.max(l, e)), m)
  elseif r[1] and e > now then
    redis.call('ZADD', KEYS[1], r[3], m)
  else
    if r[1] then redis.call('DEL', k) end
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZREM', KEYS[2], m)
    removed = removed + 1
  end
end
return {removed, #due}
";

/// Stuck records of one shard: KEYS leases; ARGV now, limit, record key prefix,
/// offset (how many stuck records of the shard were answered before: they stay at
/// the front of the range, while the entries repaired here leave it). Answers
/// {looked at, then member and the ten fields of each stuck record}.
const STUCK: &str = r"
local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', tonumber(ARGV[4]), tonumber(ARGV[2]))
local out, n = {#due}, 1
for _, m in ipairs(due) do
  local r = redis.call('HMGET', ARGV[3] .. m, 's', 'f', 't', 'a', 'x', 'l', 'e', 'c', 'u', 'h')
  if r[1] ~= 'in_progress' then
    redis.call('ZREM', KEYS[1], m)
  elseif tonumber(r[6]) > now then
    redis.call('ZADD', KEYS[1], r[6], m)
  else
    out[n + 1] = m
    for i = 1, 10 do out[n + 1 + i] = r[i] end
    n = n + 11
  end
end
return out
";

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Script::new(CLAIM),
    finish: Script::new(FINISH),
    renew: Script::new(RENEW),
    delete: Script::new(DELETE),
    purge: Script::new(PURGE),
    stuck: Script::new(STUCK),
});

#[async_trait]
impl ProcessedStore for RedisStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let (rec, keys, member) = self.locate(request.key);
        let now = millis(request.now);
        let lease = millis(request.lease_until);
        let mut inv = SCRIPTS.claim.prepare_invoke();
        inv.key(&rec)
            .key(&keys.leases)
            .key(&keys.expiry)
            .arg(&member)
            .arg(request.fingerprint.to_hex())
            .arg(request.token.0.to_string())
            .arg(now)
            .arg(lease)
            .arg(millis(request.expires_at));
        let answer: Value = self
            .inner
            .connection
            .invoke(&inv)
            .await
            .map_err(store_error)?;
        let fresh = |attempts, failures, expires_at, created_at, history| {
            Record::new(
                request.key,
                RecordState::InProgress,
                request.fingerprint,
                request.token,
                attempts,
                failures,
                request.lease_until,
                expires_at,
                created_at,
                time(now),
                history,
            )
        };
        match answer {
            Value::Int(0) => Ok(Claim::Acquired(fresh(
                1,
                0,
                time(millis(request.expires_at)),
                time(now),
                Vec::new(),
            ))),
            Value::Array(v) => match v.as_slice() {
                [Value::Int(1), a, x, e, c, h] => Ok(Claim::Acquired(fresh(
                    count(a, "attempts")?,
                    count(x, "failures")?,
                    time(field(e, "expires_at", int)?),
                    time(field(c, "created_at", int)?),
                    history(h)?,
                ))),
                [Value::Int(2), fields @ ..] => Ok(Claim::Existing(record(request.key, fields)?)),
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
        let (rec, keys, member) = self.locate(key);
        let history = if finish.history.is_empty() {
            String::new()
        } else {
            encode_history(finish.history)
        };
        let mut inv = SCRIPTS.finish.prepare_invoke();
        inv.key(&rec)
            .key(&keys.leases)
            .key(&keys.expiry)
            .arg(&member)
            .arg(token.0.to_string())
            .arg(finish.state.as_str())
            .arg(finish.failures)
            .arg(history)
            .arg(millis(finish.now))
            .arg(millis(finish.expires_at));
        let applied: i64 = self
            .inner
            .connection
            .invoke(&inv)
            .await
            .map_err(store_error)?;
        Ok(if applied == 1 {
            Fence::Applied
        } else {
            Fence::LeaseLost
        })
    }

    async fn renew(
        &self,
        key: Key<'_>,
        token: FencingToken,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        let (rec, keys, member) = self.locate(key);
        let mut inv = SCRIPTS.renew.prepare_invoke();
        inv.key(&rec)
            .key(&keys.leases)
            .key(&keys.expiry)
            .arg(&member)
            .arg(token.0.to_string())
            .arg(millis(lease_until))
            .arg(millis(expires_at));
        let applied: i64 = self
            .inner
            .connection
            .invoke(&inv)
            .await
            .map_err(store_error)?;
        Ok(if applied == 1 {
            Fence::Applied
        } else {
            Fence::LeaseLost
        })
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        let (rec, _, _) = self.locate(key);
        let mut cmd = ::redis::cmd("HMGET");
        cmd.arg(&rec).arg(&FIELDS[..]);
        let fields: Vec<Value> = self
            .inner
            .connection
            .query(&cmd)
            .await
            .map_err(store_error)?;
        match fields.first() {
            None | Some(Value::Nil) => Ok(None),
            Some(_) => record(key, &fields).map(Some),
        }
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        let (rec, keys, member) = self.locate(key);
        let mut inv = SCRIPTS.delete.prepare_invoke();
        inv.key(&rec)
            .key(&keys.leases)
            .key(&keys.expiry)
            .arg(&member)
            .arg(millis(now));
        let answer: i64 = self
            .inner
            .connection
            .invoke(&inv)
            .await
            .map_err(store_error)?;
        Ok(match answer {
            1 => Deleted::Removed,
            2 => Deleted::LeaseHeld,
            _ => Deleted::NotFound,
        })
    }

    /// Removes records expired at `now` through the shards' expiry indexes, in
    /// batches of at most 256 per script. Records whose TTL already dropped them
    /// count as removed (their index entries are cleared).
    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let now = millis(now);
        let mut removed = 0;
        for shard in 0..self.inner.shards {
            let keys = self.keys(shard);
            loop {
                let want = (limit - removed).min(BATCH);
                if want == 0 {
                    return Ok(removed as u64);
                }
                let mut inv = SCRIPTS.purge.prepare_invoke();
                inv.key(&keys.expiry)
                    .key(&keys.leases)
                    .arg(now)
                    .arg(want)
                    .arg(&keys.records);
                let (n, seen): (usize, usize) = self
                    .inner
                    .connection
                    .invoke(&inv)
                    .await
                    .map_err(store_error)?;
                removed += n.min(want);
                if seen < want {
                    break;
                }
            }
        }
        Ok(removed as u64)
    }

    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        let now = millis(now);
        let mut out = Vec::new();
        for shard in 0..self.inner.shards {
            let keys = self.keys(shard);
            let mut offset = 0;
            loop {
                let want = (limit - out.len()).min(BATCH);
                if want == 0 {
                    return Ok(out);
                }
                let mut inv = SCRIPTS.stuck.prepare_invoke();
                inv.key(&keys.leases)
                    .arg(now)
                    .arg(want)
                    .arg(&keys.records)
                    .arg(offset);
                let answer: Vec<Value> = self
                    .inner
                    .connection
                    .invoke(&inv)
                    .await
                    .map_err(store_error)?;
                let Some((seen, found)) = answer.split_first() else {
                    return Err(corrupt("unexpected stuck answer"));
                };
                let seen = field(seen, "stuck count", int)?;
                for chunk in found.chunks(11) {
                    let m = field(&chunk[0], "member", text)?;
                    let (namespace, id) = m.split_once('\0').unwrap_or(("", m));
                    offset += 1;
                    if out.len() < limit {
                        out.push(record(Key::new(namespace, id), &chunk[1..])?);
                    }
                }
                if seen < want as i64 {
                    break;
                }
            }
        }
        Ok(out)
    }
}
