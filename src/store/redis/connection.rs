//! The connection a [`RedisStore`] runs on, its builder, and how driver errors are sorted.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{
    ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError, Script, ServerErrorKind,
    ToRedisArgs, Value,
};

use super::codec::info_texts;
use super::{
    Inner, RedisStore, ShardKeys, DEFAULT_CONNECTION_TIMEOUT, DEFAULT_PREFIX,
    DEFAULT_RESPONSE_TIMEOUT, DEFAULT_SHARDS, MAX_PREFIX_LEN, MAX_SHARDS,
};
use crate::store::tls::{classify, TlsError, TlsFailure};
use crate::store::StoreError;

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
    /// A TLS connection to the server failed (a `rediss://` URL): see
    /// [`TlsError::failure`]. Verification is on unless the URL ends in
    /// `#insecure`.
    #[error("could not connect to Redis: {0}")]
    Tls(#[source] TlsError),
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
    ///
    /// A failed TLS handshake counts as unreachable, as any connection that could
    /// not be made; a build without TLS does not.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Connect { source } => is_unreachable(source),
            Self::Tls(e) => e.failure() != TlsFailure::NotBuilt,
            _ => false,
        }
    }

    /// The driver's error, as a [`RedisStoreError::Tls`] when it is a TLS failure.
    fn connect(source: RedisError) -> Self {
        match classify(&source) {
            Some(failure) => Self::Tls(TlsError::new(failure, Box::new(source))),
            None => Self::Connect { source },
        }
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
pub(super) struct Eval<'s> {
    script: &'s Script,
    pub(super) cmd: ::redis::Cmd,
}

impl<'s> Eval<'s> {
    /// An `EVALSHA` of `script` with `keys` keys, to be given first with
    /// [`Eval::key`], then the arguments.
    pub(super) fn new(script: &'s Script, keys: usize) -> Self {
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys);
        Self { script, cmd }
    }

    /// Adds a key (before any argument).
    pub(super) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(key);
        self
    }

    /// Adds an argument.
    pub(super) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }
}

/// Runs `$body` with `$c` a handle of its own to the connection (a clone: both kinds
/// multiplex over the same connection), whichever kind it is.
macro_rules! on_handle {
    ($connection:expr, |$c:ident| $body:expr) => {
        match $connection {
            RedisConnection::Standalone(c) => {
                let $c = &mut c.clone();
                $body
            }
            RedisConnection::Cluster(c) => {
                let $c = &mut c.clone();
                $body
            }
        }
    };
}

impl RedisConnection {
    /// Runs `eval`, loading its script first if the server does not know it.
    pub(super) async fn eval<T: FromRedisValue>(&self, eval: &Eval<'_>) -> Result<T, RedisError> {
        match self.query(&eval.cmd).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // As `ScriptInvocation::invoke_async` does (on a cluster the driver
                // sends `SCRIPT LOAD` to every primary).
                let _: String = on_handle!(self, |c| eval.script.load_async(c).await?);
                self.query(&eval.cmd).await
            }
            other => other,
        }
    }

    pub(super) async fn query_pipe<T: FromRedisValue>(
        &self,
        pipe: &::redis::Pipeline,
    ) -> Result<T, RedisError> {
        on_handle!(self, |c| pipe.query_async(c).await)
    }

    pub(super) async fn query<T: FromRedisValue>(
        &self,
        cmd: &::redis::Cmd,
    ) -> Result<T, RedisError> {
        on_handle!(self, |c| cmd.query_async(c).await)
    }
}

/// Builds a [`RedisStore`]: key prefix, shard count, timeouts, trusted CAs, then a
/// connection.
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    prefix: String,
    shards: u16,
    connection_timeout: Duration,
    response_timeout: Duration,
    #[cfg(feature = "tls")]
    root_certificates: Option<Pem>,
    native_compare_and_set: bool,
}

/// PEM text, shown by its length.
#[cfg(feature = "tls")]
#[derive(Clone)]
struct Pem(Vec<u8>);

#[cfg(feature = "tls")]
impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pem({} bytes)", self.0.len())
    }
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            shards: DEFAULT_SHARDS,
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            #[cfg(feature = "tls")]
            root_certificates: None,
            native_compare_and_set: true,
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
    /// [`MAX_SHARDS`]): see the [module docs](crate::store::redis). Every process sharing a prefix
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

    /// Trusts only the CA certificates in `pem` (PEM text, one or more
    /// certificates) for `rediss://` connections, instead of the system's trusted
    /// roots (which `SSL_CERT_FILE` or `SSL_CERT_DIR` can point elsewhere). The
    /// server's certificate must chain to one of them and name the URL's host. With
    /// [`connect`](Self::connect) the URL must be `rediss://`; with
    /// [`connect_cluster`](Self::connect_cluster) the nodes are reached over TLS.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificates = Some(Pem(pem.into()));
        self
    }

    /// The trusted CAs given, for the driver.
    #[cfg(feature = "tls")]
    fn certificates(&self) -> Option<::redis::TlsCertificates> {
        let pem = self.root_certificates.as_ref()?;
        Some(::redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.0.clone()),
        })
    }

    /// Whether fenced finishes may use the server's native compare-and-set,
    /// `SET … IFEQ` (default `true`): [`connect`](Self::connect) and
    /// [`connect_cluster`](Self::connect_cluster) turn it on when the server
    /// (every primary of a cluster) says in `INFO server` that it is Valkey 8.1 or
    /// later or Redis 8.4 or later; elsewhere, and with [`build`](Self::build),
    /// finishes run a Lua script. `false` keeps the script on every server. Both
    /// keep the same contract; see the [module docs](crate::store::redis).
    pub fn native_compare_and_set(mut self, enabled: bool) -> Self {
        self.native_compare_and_set = enabled;
        self
    }

    /// Connects to the standalone server at `url` (such as `redis://127.0.0.1:6379`,
    /// or `rediss://` for TLS) through a [`ConnectionManager`], which reconnects by
    /// itself.
    ///
    /// `rediss://` needs the `tls` feature. It checks the server's certificate
    /// against the system's trusted roots, or the
    /// [`root_certificates`](Self::root_certificates) given, and that it names the
    /// URL's host; a URL ending in `#insecure` turns both checks off. When the
    /// process has no default rustls `CryptoProvider` yet, ring's is installed as
    /// the default (the driver takes the default one).
    ///
    /// # Errors
    /// [`RedisStoreError`] for a bad prefix or shard count, a bad URL, a server that
    /// cannot be reached now, or a failed TLS connection
    /// ([`RedisStoreError::Tls`]).
    pub async fn connect(
        self,
        url: impl IntoConnectionInfo,
    ) -> Result<RedisStore, RedisStoreError> {
        self.validate()?;
        let connect = RedisStoreError::connect;
        let info = url.into_connection_info().map_err(connect)?;
        #[cfg(feature = "tls")]
        let client = {
            if matches!(info.addr(), ::redis::ConnectionAddr::TcpTls { .. }) {
                crate::store::tls::install_crypto_provider();
            }
            match self.certificates() {
                Some(certificates) => ::redis::Client::build_with_tls(info, certificates),
                None => ::redis::Client::open(info),
            }
        };
        #[cfg(not(feature = "tls"))]
        let client = ::redis::Client::open(info);
        let client = client.map_err(connect)?;
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
        let native = self.native_compare_and_set;
        let store = self.build(manager)?;
        store.check_version(native).await?;
        store.warn_without_persistence().await;
        Ok(store)
    }

    /// Connects to the Redis Cluster that `nodes` belong to (one or more seed
    /// addresses, such as `redis://127.0.0.1:7101`) through a [`ClusterConnection`],
    /// which follows slot moves and reconnects by itself.
    ///
    /// TLS is as for [`connect`](Self::connect): `rediss://` seeds (or
    /// [`root_certificates`](Self::root_certificates)) reach every node over TLS.
    ///
    /// # Errors
    /// [`RedisStoreError`] for a bad prefix or shard count, a bad address, a
    /// cluster that cannot be reached now, or a failed TLS connection
    /// ([`RedisStoreError::Tls`]).
    pub async fn connect_cluster<T: IntoConnectionInfo>(
        self,
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<RedisStore, RedisStoreError> {
        self.validate()?;
        let connect = RedisStoreError::connect;
        let nodes = nodes
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<Result<Vec<_>, _>>()
            .map_err(connect)?;
        let builder = ClusterClient::builder(nodes.iter().cloned())
            .connection_timeout(self.connection_timeout)
            .response_timeout(self.response_timeout)
            .retries(2);
        #[cfg(feature = "tls")]
        let builder = {
            let tls = nodes
                .iter()
                .any(|n| matches!(n.addr(), ::redis::ConnectionAddr::TcpTls { .. }));
            if tls || self.root_certificates.is_some() {
                crate::store::tls::install_crypto_provider();
            }
            match self.certificates() {
                Some(certificates) => builder.certs(certificates),
                None => builder,
            }
        };
        let client = builder.build().map_err(connect)?;
        let connection = client.get_async_connection().await.map_err(connect)?;
        let native = self.native_compare_and_set;
        let store = self.build(connection)?;
        store.check_version(native).await?;
        store.warn_without_persistence().await;
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
                native: Default::default(),
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

pub(super) fn store_error(e: RedisError) -> StoreError {
    if e.is_connection_refusal() {
        // The (re)connection was refused: nothing was sent.
        StoreError::not_sent(e)
    } else if is_unreachable(&e) {
        StoreError::unavailable(e)
    } else {
        StoreError::backend(e)
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
    /// Runs a script on the store's connection.
    pub(super) async fn eval<T: FromRedisValue>(&self, eval: &Eval<'_>) -> Result<T, StoreError> {
        self.connection().eval(eval).await.map_err(store_error)
    }

    /// Sends a command on the store's connection.
    pub(super) async fn query<T: FromRedisValue>(
        &self,
        cmd: &::redis::Cmd,
    ) -> Result<T, StoreError> {
        self.connection().query(cmd).await.map_err(store_error)
    }

    /// Refuses a server older than Redis 7.0 (see
    /// [`RedisStoreError::UnsupportedVersion`]). A server whose `INFO` does not say
    /// (a proxy, say) is let through. With `native`, turns on the native
    /// compare-and-set path when every server answering takes `SET … IFEQ`.
    async fn check_version(&self, native: bool) -> Result<(), RedisStoreError> {
        let info: Value = self
            .inner
            .connection
            .query(::redis::cmd("INFO").arg("server"))
            .await
            .map_err(RedisStoreError::connect)?;
        // A cluster answers one text per primary.
        let mut old = None;
        let (mut servers, mut with_ifeq) = (0, 0);
        for info in info_texts(&info) {
            old = old.or(too_old(info));
            servers += 1;
            with_ifeq += usize::from(super::native::has_ifeq(info));
        }
        if let Some(version) = old {
            return Err(RedisStoreError::UnsupportedVersion { version });
        }
        if native && servers > 0 && with_ifeq == servers {
            self.inner.native.enable();
        }
        Ok(())
    }
}
