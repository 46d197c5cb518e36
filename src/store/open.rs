//! Opening a store from a URL, for configuration files, environment variables and
//! the `webhook-guard` tool.
//!
//! | URL | Store | Feature |
//! |---|---|---|
//! | `memory:` | [`MemoryStore`] (one process, forgets on restart) | always |
//! | `sqlite:PATH`, `sqlite://PATH`, `sqlite:///ABSOLUTE/PATH` | [`SqliteStore`](super::SqliteStore) | `sqlite` |
//! | `postgres://…`, `postgresql://…` | [`PostgresStore`](super::PostgresStore) | `postgres` |
//! | `mysql://…`, `mariadb://…` | [`MySqlStore`](super::MySqlStore) | `mysql` |
//! | `redis://…`, `rediss://…` | [`RedisStore`](super::RedisStore) (standalone) | `redis` |
//! | `dynamodb://TABLE?region=…&endpoint=…&shards=…` | [`DynamoDbStore`](super::DynamoDbStore) | `dynamodb` |
//!
//! The URL is handed to the driver as written (`mariadb://` is read as `mysql://`),
//! so the driver's own parameters (`sslmode`, a Redis database number, SQLite's
//! `mode=ro|rw|rwc`, …) work. A SQLite path is percent-decoded, as the driver does
//! (`%3F` for a `?` in a file name). An in-memory SQLite database (`sqlite::memory:`,
//! `mode=memory` anywhere in the query, the `memdb` VFS, or a path that is itself a
//! `file:` URI, which could ask for one) is refused: every pooled connection would
//! open its own, and its records would vanish with the connection that held them;
//! `memory:` is the in-process store.
//! TLS (`sslmode=verify-full&sslrootcert=…`, `ssl-mode=VERIFY_IDENTITY&ssl-ca=…`,
//! `rediss://`) needs the `tls` feature; a failed TLS connection has a
//! [`TlsError`](super::TlsError) in its chain (see [`tls`](super::tls)). A
//! `rediss://` URL trusts the system's roots, which `SSL_CERT_FILE` can replace by a
//! private CA. A `dynamodb://` URL names the table; its parameters are all optional:
//! `region` (else the SDK's chain: `AWS_REGION`, the profile), `endpoint` (a local
//! DynamoDB-compatible server, such as `http://127.0.0.1:8000`, percent-encoded or
//! not) and `shards`; credentials always come from the SDK's chain. Opening
//! does not create tables: call [`OpenedStore::migrate`] (idempotent) at start-up or
//! from a deployment step (`webhook-guard migrate`).
//!
//! ```no_run
//! use webhook_guard::{store, verify::Stripe, WebhookGuard};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let url = std::env::var("WEBHOOK_GUARD_STORE").unwrap_or_else(|_| "memory:".into());
//! let opened = store::open(&url).await?;
//! opened.migrate().await?;
//! let guard = WebhookGuard::builder()
//!     .store(opened.shared())
//!     .verifier(Stripe::new(["whsec_wRNftLajMZNeslQOP6vEPm4iVx5NlZ6z"])?)
//!     .build()?;
//! # let _ = guard;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::{DynProcessedStore, MemoryStore, StoreError};

/// The kind of store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// `memory:`
    Memory,
    /// `sqlite:`
    Sqlite,
    /// `postgres://`, `postgresql://`
    Postgres,
    /// `mysql://`, `mariadb://`
    MySql,
    /// `redis://`, `rediss://`
    Redis,
    /// `dynamodb://`
    DynamoDb,
}

impl Backend {
    /// A short lowercase name, such as `"postgres"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
            Self::Redis => "redis",
            Self::DynamoDb => "dynamodb",
        }
    }

    /// The crate feature that builds this backend (`None` for memory).
    pub fn feature(self) -> Option<&'static str> {
        match self {
            Self::Memory => None,
            other => Some(other.name()),
        }
    }

    /// Whether this backend keeps its records in an SQL table.
    pub fn is_sql(self) -> bool {
        matches!(self, Self::Sqlite | Self::Postgres | Self::MySql)
    }

    fn enabled(self) -> bool {
        match self {
            Self::Memory => true,
            Self::Sqlite => cfg!(feature = "sqlite"),
            Self::Postgres => cfg!(feature = "postgres"),
            Self::MySql => cfg!(feature = "mysql"),
            Self::Redis => cfg!(feature = "redis"),
            Self::DynamoDb => cfg!(feature = "dynamodb"),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a store URL could not be opened.
///
/// No variant holds the URL itself, which may carry a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL's scheme names no store this crate knows.
    #[error(
        "unknown store scheme `{0}`; expected memory:, sqlite:PATH, postgres://, \
         postgresql://, mysql://, mariadb://, redis://, rediss:// or dynamodb://"
    )]
    UnknownScheme(String),
    /// The store exists, but this build of the crate was compiled without it.
    #[error("`{scheme}` stores need webhook-guard built with the `{feature}` feature")]
    FeatureDisabled {
        /// The scheme of the URL.
        scheme: String,
        /// The crate feature to turn on.
        feature: &'static str,
    },
    /// The URL is malformed for its scheme.
    #[error("invalid store URL: {0}")]
    InvalidUrl(&'static str),
    /// The table name is not `[A-Za-z_][A-Za-z0-9_]{0,62}`.
    #[error("invalid table name `{0}`: use letters, digits and `_` (at most 63)")]
    InvalidTable(String),
    /// A table name was given for a store that has no tables.
    #[error("a table name applies to SQL stores only, not to {0}")]
    TableUnsupported(Backend),
    /// The store could not be reached or refused the connection.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A parsed store URL, with options, ready to [`open`](StoreUrl::open).
///
/// ```
/// use webhook_guard::store::{Backend, StoreUrl};
///
/// let url: StoreUrl = "memory:".parse().unwrap();
/// assert_eq!(url.backend(), Backend::Memory);
/// // A scheme whose store this build lacks names the feature to turn on.
/// # #[cfg(feature = "sqlite")]
/// let url: StoreUrl = "sqlite:///var/lib/app/webhooks.db".parse().unwrap();
/// # #[cfg(feature = "sqlite")]
/// assert_eq!(url.backend(), Backend::Sqlite);
/// assert!("carrier-pigeon://coop".parse::<StoreUrl>().is_err());
/// ```
#[derive(Clone)]
pub struct StoreUrl {
    backend: Backend,
    /// The driver URL, or the SQLite file path.
    target: String,
    table: Option<String>,
    create_if_missing: bool,
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The target of a server URL may hold a password: never shown.
        let target = if self.backend == Backend::Sqlite {
            self.target.as_str()
        } else {
            ".."
        };
        f.debug_struct("StoreUrl")
            .field("backend", &self.backend)
            .field("target", &target)
            .field("table", &self.table)
            .field("create_if_missing", &self.create_if_missing)
            .finish()
    }
}

impl FromStr for StoreUrl {
    type Err = OpenError;

    fn from_str(url: &str) -> Result<Self, OpenError> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(OpenError::UnknownScheme(String::new()));
        };
        let scheme = scheme.to_ascii_lowercase();
        let (backend, target) = match scheme.as_str() {
            "memory" => (Backend::Memory, String::new()),
            "sqlite" => {
                let target = rest.strip_prefix("//").unwrap_or(rest);
                let (path, query) = target.split_once('?').unwrap_or((target, ""));
                if path.is_empty() {
                    return Err(OpenError::InvalidUrl("sqlite: needs a file path"));
                }
                // Each pooled connection would open a database of its own, and
                // the records would vanish with the connection that held them.
                if in_memory(path, query) {
                    return Err(OpenError::InvalidUrl(IN_MEMORY));
                }
                (Backend::Sqlite, target.to_owned())
            }
            "postgres" | "postgresql" => (Backend::Postgres, url.to_owned()),
            "mysql" => (Backend::MySql, url.to_owned()),
            "mariadb" => (Backend::MySql, format!("mysql:{rest}")),
            "redis" | "rediss" => (Backend::Redis, url.to_owned()),
            "dynamodb" => {
                let target = rest.strip_prefix("//").unwrap_or(rest);
                dynamodb_target(target)?;
                (Backend::DynamoDb, target.to_owned())
            }
            _ => {
                // Only a plausible scheme is echoed back, never what could be a
                // `user:password@host` typed without a scheme.
                let shown = if scheme.len() <= 32
                    && scheme
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
                {
                    scheme
                } else {
                    "?".to_owned()
                };
                return Err(OpenError::UnknownScheme(shown));
            }
        };
        if backend != Backend::Memory && backend != Backend::Sqlite && !rest.starts_with("//") {
            return Err(OpenError::InvalidUrl("expected `scheme://host...`"));
        }
        if !backend.enabled() {
            return Err(OpenError::FeatureDisabled {
                scheme,
                feature: backend.feature().unwrap_or_default(),
            });
        }
        Ok(Self {
            backend,
            target,
            table: None,
            create_if_missing: true,
        })
    }
}

/// What a `dynamodb://` URL says: the table, and the `region`, `endpoint` and
/// `shards` parameters (percent-decoded).
#[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
struct DynamoDbTarget {
    table: String,
    region: Option<String>,
    endpoint: Option<String>,
    shards: Option<u16>,
}

/// Reads `TABLE?param=value&…`, the part of a `dynamodb://` URL after `//`.
fn dynamodb_target(target: &str) -> Result<DynamoDbTarget, OpenError> {
    let (table, query) = target.split_once('?').unwrap_or((target, ""));
    let table = percent_decoded(table);
    let table_ok = (3..=255).contains(&table.len())
        && (table.bytes()).all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if !table_ok {
        return Err(OpenError::InvalidUrl(
            "dynamodb: expected dynamodb://TABLE, a table name of 3 to 255 letters, digits, `_`, `-` or `.`",
        ));
    }
    let mut out = DynamoDbTarget {
        table,
        region: None,
        endpoint: None,
        shards: None,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decoded(v);
        match percent_decoded(k).as_str() {
            "region" if !v.is_empty() => out.region = Some(v),
            "endpoint" if v.starts_with("http://") || v.starts_with("https://") => {
                out.endpoint = Some(v);
            }
            "endpoint" => {
                return Err(OpenError::InvalidUrl(
                    "dynamodb: endpoint must be an http:// or https:// URL",
                ))
            }
            "shards" => {
                let shards = v.parse().ok().filter(|n| (1..=1024).contains(n));
                out.shards = Some(shards.ok_or(OpenError::InvalidUrl(
                    "dynamodb: shards must be a number from 1 to 1024",
                ))?);
            }
            _ => return Err(OpenError::InvalidUrl(
                "dynamodb: unknown or empty parameter; the store takes region, endpoint and shards",
            )),
        }
    }
    Ok(out)
}

/// Why an in-memory SQLite database is refused.
const IN_MEMORY: &str = "sqlite: an in-memory database is not a store; use memory:";

/// Whether the SQLite driver would open `path?query` as an in-memory database,
/// read as the driver reads it: percent-decoded, a `mode=memory` anywhere (a later
/// `mode` does not undo it), and the `memdb` VFS counted too. A path that decodes
/// to a `file:` URI is counted too: the driver opens paths as URIs, and one can
/// carry `:memory:` or `mode=memory` of its own.
fn in_memory(path: &str, query: &str) -> bool {
    let path = percent_decoded(path);
    path == ":memory:"
        || path.starts_with("file:")
        || query_params(query, "mode").any(|mode| mode == "memory")
        || query_param(query, "vfs").is_some_and(|vfs| vfs.starts_with("memdb"))
}

/// Every value of `key` in a URL query, percent-decoded.
fn query_params<'q>(query: &'q str, key: &'q str) -> impl Iterator<Item = String> + 'q {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(move |(k, _)| percent_decoded(k) == key)
        .map(|(_, v)| percent_decoded(v))
}

/// The value of `key` in a URL query (`a=1&b=2`) as the SQLite driver reads it:
/// percent-decoded, the last one winning.
fn query_param(query: &str, key: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .rev()
        .find(|(k, _)| percent_decoded(k) == key)
        .map(|(_, v)| percent_decoded(v))
}

/// `text` with `%XX` escapes decoded and `+` read as a space, as in a URL query
/// (a `+` written `%2B` stays a `+`). Invalid UTF-8 becomes U+FFFD.
fn percent_decoded(text: &str) -> String {
    percent_encoding::percent_decode_str(&text.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

impl StoreUrl {
    /// Parses `url`: see the [module docs](self) for the schemes.
    ///
    /// # Errors
    /// [`OpenError::UnknownScheme`], [`OpenError::InvalidUrl`], or
    /// [`OpenError::FeatureDisabled`] for a store this build does not include.
    pub fn parse(url: &str) -> Result<Self, OpenError> {
        url.parse()
    }

    /// The kind of store.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Keeps the records in `table` instead of `webhook_guard_records` (SQL stores
    /// only; checked by [`StoreUrl::open`]).
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = Some(table.into());
        self
    }

    /// Whether opening an SQLite file that does not exist creates it (default
    /// `true`). Operator tools turn it off so a mistyped path is an error rather
    /// than a new empty database.
    #[must_use]
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    /// Connects to (or opens) the store. Does not create tables: see
    /// [`OpenedStore::migrate`].
    ///
    /// # Errors
    /// [`OpenError::InvalidTable`] or [`OpenError::TableUnsupported`] for a bad
    /// table option; [`OpenError::Store`] when the store cannot be reached or refuses
    /// the connection ([`StoreError::Unavailable`] for an unreachable server or a
    /// missing SQLite file).
    pub async fn open(&self) -> Result<OpenedStore, OpenError> {
        if self.table.is_some() && !self.backend.is_sql() {
            return Err(OpenError::TableUnsupported(self.backend));
        }
        // Checked before connecting: a bad name must not leave a new SQLite file behind.
        #[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
        if let Some(t) = &self.table {
            super::sql::TableName::new(t).map_err(|_| OpenError::InvalidTable(t.clone()))?;
        }
        match self.backend {
            Backend::Memory => Ok(OpenedStore::of(MemoryStore::new(), Backend::Memory, None)),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => self.open_sqlite().await,
            #[cfg(feature = "postgres")]
            Backend::Postgres => self.open_postgres().await,
            #[cfg(feature = "mysql")]
            Backend::MySql => self.open_mysql().await,
            #[cfg(feature = "redis")]
            Backend::Redis => self.open_redis().await,
            #[cfg(feature = "dynamodb")]
            Backend::DynamoDb => self.open_dynamodb().await,
            // A backend this build leaves out (`parse` refuses its URLs already).
            #[allow(unreachable_patterns)]
            _ => Err(OpenError::FeatureDisabled {
                scheme: self.backend.name().to_owned(),
                feature: self.backend.feature().unwrap_or_default(),
            }),
        }
    }

    #[cfg(feature = "sqlite")]
    async fn open_sqlite(&self) -> Result<OpenedStore, OpenError> {
        use super::sqlite::{self, SqliteStore};
        // The driver reads the path (percent-decoded) and its parameters.
        let parsed = sqlx::sqlite::SqliteConnectOptions::from_str(&self.target).map_err(|_| {
            OpenError::InvalidUrl(
                "sqlite: unknown parameter; the driver takes mode=ro|rw|rwc, \
                 cache=shared|private, immutable and vfs",
            )
        })?;
        let mut options = SqliteStore::tune(parsed);
        let query = self.target.split_once('?').map_or("", |(_, q)| q);
        let mode = query_param(query, "mode");
        if mode.is_none() {
            options = options.create_if_missing(self.create_if_missing);
        }
        let creates =
            matches!(mode.as_deref(), Some("rwc")) || (mode.is_none() && self.create_if_missing);
        if creates {
            // Created readable by its owner only, as `SqliteStore::open` does.
            sqlite::create_private(&options)?;
        }
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(std::time::Duration::from_millis(1500))
            .connect_with(options)
            .await
            // A file that cannot be opened is `Unavailable`, one that is not an
            // SQLite database a `Backend` error, as for `SqliteStore::open`.
            .map_err(sqlite::err)?;
        let store = match &self.table {
            Some(t) => {
                SqliteStore::with_table(pool, t).map_err(|_| OpenError::InvalidTable(t.clone()))?
            }
            None => SqliteStore::new(pool),
        };
        Ok(OpenedStore::migrating(store, Backend::Sqlite))
    }

    /// `store` on the table option, when there is one (`with_table` moves it there).
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn on_table<S, E>(
        &self,
        store: S,
        with_table: impl FnOnce(S, &str) -> Result<S, E>,
    ) -> Result<S, OpenError> {
        match &self.table {
            Some(t) => with_table(store, t).map_err(|_| OpenError::InvalidTable(t.clone())),
            None => Ok(store),
        }
    }

    #[cfg(feature = "postgres")]
    async fn open_postgres(&self) -> Result<OpenedStore, OpenError> {
        use super::PostgresStore;
        let store = PostgresStore::connect(&self.target).await?;
        let store = self.on_table(store, |s, t| PostgresStore::with_table(s.pool().clone(), t))?;
        Ok(OpenedStore::migrating(store, Backend::Postgres))
    }

    #[cfg(feature = "mysql")]
    async fn open_mysql(&self) -> Result<OpenedStore, OpenError> {
        use super::MySqlStore;
        let store = MySqlStore::connect(&self.target).await?;
        let store = self.on_table(store, MySqlStore::with_table)?;
        Ok(OpenedStore::migrating(store, Backend::MySql))
    }

    #[cfg(feature = "redis")]
    async fn open_redis(&self) -> Result<OpenedStore, OpenError> {
        let store = super::RedisStore::connect(self.target.as_str())
            .await
            .map_err(|e| {
                if e.is_unavailable() {
                    StoreError::unavailable(e)
                } else {
                    StoreError::backend(e)
                }
            })?;
        Ok(OpenedStore::of(store, Backend::Redis, None))
    }

    #[cfg(feature = "dynamodb")]
    async fn open_dynamodb(&self) -> Result<OpenedStore, OpenError> {
        let target = dynamodb_target(&self.target)?;
        let mut builder = super::DynamoDbStore::builder(&target.table);
        if let Some(region) = target.region {
            builder = builder.region(region);
        }
        if let Some(endpoint) = target.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        if let Some(shards) = target.shards {
            builder = builder.shards(shards);
        }
        let store = builder.connect().await.map_err(StoreError::backend)?;
        Ok(OpenedStore::migrating(store, Backend::DynamoDb))
    }
}

/// Parses `url` and opens the store it names, with the default table. See the
/// [module docs](self) for the schemes, and [`StoreUrl`] for options.
///
/// # Errors
/// [`OpenError`]: an unknown scheme, a store this build does not include, or a store
/// that cannot be reached.
pub async fn open(url: &str) -> Result<OpenedStore, OpenError> {
    StoreUrl::parse(url)?.open().await
}

/// A store that keeps a schema, which [`OpenedStore::migrate`] creates.
#[async_trait::async_trait]
trait KeepsSchema: Send + Sync {
    /// Creates the schema unless it exists.
    async fn create_schema(&self) -> Result<(), StoreError>;
    /// The table the schema is in.
    fn table(&self) -> &str;
}

/// Implements [`KeepsSchema`] for each store of a cargo feature, whose inherent
/// method `$create` creates its schema and `table` names its table.
macro_rules! keeps_schema {
    ($($feature:literal: $store:ty, $create:ident;)*) => {$(
        #[cfg(feature = $feature)]
        #[async_trait::async_trait]
        impl KeepsSchema for $store {
            async fn create_schema(&self) -> Result<(), StoreError> {
                self.$create().await
            }

            fn table(&self) -> &str {
                <$store>::table(self)
            }
        }
    )*};
}

keeps_schema! {
    "sqlite": super::SqliteStore, migrate;
    "postgres": super::PostgresStore, migrate;
    "mysql": super::MySqlStore, migrate;
    "dynamodb": super::DynamoDbStore, create_table;
}

/// A store opened from a URL: hand [`OpenedStore::shared`] to
/// [`WebhookGuardBuilder::store`](crate::WebhookGuardBuilder::store).
#[derive(Clone)]
pub struct OpenedStore {
    store: Arc<DynProcessedStore>,
    inbox: Arc<dyn crate::inbox::InboxStore>,
    backend: Backend,
    /// The store again, when it keeps a schema.
    schema: Option<Arc<dyn KeepsSchema>>,
}

impl fmt::Debug for OpenedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenedStore")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// What [`OpenedStore::migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Migration {
    /// The table and its indexes exist now (created, or already there).
    Applied {
        /// The table.
        table: String,
    },
    /// The store keeps no schema (memory, Redis): nothing to do.
    NotNeeded,
}

impl OpenedStore {
    fn of<S>(store: S, backend: Backend, schema: Option<Arc<dyn KeepsSchema>>) -> Self
    where
        S: super::ProcessedStore + crate::inbox::InboxStore,
    {
        let store = Arc::new(store);
        Self {
            inbox: store.clone(),
            store,
            backend,
            schema,
        }
    }

    /// A store that keeps a schema (`schema` holds a copy of it).
    #[cfg(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "dynamodb"
    ))]
    fn migrating<S>(store: S, backend: Backend) -> Self
    where
        S: super::ProcessedStore + crate::inbox::InboxStore + KeepsSchema + Clone + 'static,
    {
        Self::of(store.clone(), backend, Some(Arc::new(store)))
    }

    /// The store's inbox, shared (every store a URL opens keeps one).
    pub fn inbox(&self) -> Arc<dyn crate::inbox::InboxStore> {
        self.inbox.clone()
    }

    /// The kind of store.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The store, shared.
    pub fn shared(&self) -> Arc<DynProcessedStore> {
        self.store.clone()
    }

    /// Creates the store's table and indexes unless they exist (SQL stores, and
    /// DynamoDB's table with its index and time to live; idempotent, safe from
    /// every replica at start-up). Memory and Redis stores need none.
    ///
    /// # Errors
    /// The store's error, for instance for lack of the privilege to create a table.
    pub async fn migrate(&self) -> Result<Migration, StoreError> {
        let Some(schema) = &self.schema else {
            return Ok(Migration::NotNeeded);
        };
        schema.create_schema().await?;
        Ok(Migration::Applied {
            table: schema.table().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_reads_a_query_as_the_driver_does() {
        assert_eq!(percent_decoded("a%20b+c%2Bd"), "a b c+d");
        assert_eq!(percent_decoded("%4d%4F%zz%4"), "MO%zz%4");
        assert_eq!(percent_decoded("%ff%C3%A9"), "\u{fffd}\u{e9}");
        assert_eq!(
            query_param("mode=ro&m%6fde=memory", "mode").as_deref(),
            Some("memory")
        );
    }

    /// The message of the [`OpenError::InvalidUrl`] that parsing `url` answers.
    fn invalid_url(url: &str) -> &'static str {
        match url.parse::<StoreUrl>() {
            Err(OpenError::InvalidUrl(message)) => message,
            other => panic!("{url}: {other:?}"),
        }
    }

    /// The feature named by the [`OpenError::FeatureDisabled`] that parsing `url`
    /// answers.
    #[cfg(not(all(feature = "dynamodb", feature = "redis")))]
    fn disabled_feature(url: &str) -> &'static str {
        match url.parse::<StoreUrl>() {
            Err(OpenError::FeatureDisabled { feature, .. }) => feature,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn schemes() {
        let p = |u: &str| u.parse::<StoreUrl>();
        assert_eq!(p("memory:").unwrap().backend(), Backend::Memory);
        assert!(matches!(p("./db.sqlite"), Err(OpenError::UnknownScheme(s)) if s.is_empty()));
        assert!(matches!(p("ftp://x"), Err(OpenError::UnknownScheme(s)) if s == "ftp"));
        // Something that is not a scheme is not echoed (it may be a password).
        let e = p("user pass@host:5432").unwrap_err().to_string();
        assert!(!e.contains("pass"), "{e}");
        assert!(matches!(p("sqlite:"), Err(OpenError::InvalidUrl(_))));
        assert!(matches!(
            p("postgres:localhost"),
            Err(OpenError::InvalidUrl(_))
        ));
        #[cfg(feature = "sqlite")]
        {
            assert_eq!(p("sqlite://a.db").unwrap().target, "a.db");
            assert_eq!(p("sqlite:///tmp/a.db").unwrap().target, "/tmp/a.db");
            assert_eq!(p("SQLITE:a.db").unwrap().target, "a.db");
            assert_eq!(p("sqlite:a.db?mode=ro").unwrap().target, "a.db?mode=ro");
        }
        for memory in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite::memory:?cache=shared",
            "sqlite:a.db?mode=memory",
        ] {
            assert!(invalid_url(memory).contains("memory:"), "{memory}");
        }
        #[cfg(feature = "mysql")]
        assert_eq!(p("mariadb://h/db").unwrap().target, "mysql://h/db");
        #[cfg(not(feature = "dynamodb"))]
        assert_eq!(disabled_feature("dynamodb://webhooks"), "dynamodb");
        for bad in [
            "dynamodb://",
            "dynamodb://ab",
            "dynamodb://no/slash",
            "dynamodb://t_1?colour=blue",
            "dynamodb://t_1?region=",
            "dynamodb://t_1?endpoint=localhost:8000",
            "dynamodb://t_1?shards=0",
            "dynamodb://t_1?shards=many",
        ] {
            assert!(invalid_url(bad).starts_with("dynamodb"), "{bad}");
        }
        let t =
            dynamodb_target("t_1?region=eu-west-1&endpoint=http%3A%2F%2F127.0.0.1%3A8000&shards=4")
                .unwrap();
        assert_eq!(t.table, "t_1");
        assert_eq!(t.region.as_deref(), Some("eu-west-1"));
        assert_eq!(t.endpoint.as_deref(), Some("http://127.0.0.1:8000"));
        assert_eq!(t.shards, Some(4));
        let t = dynamodb_target("web.hooks-1?endpoint=http://localhost:8000/").unwrap();
        assert_eq!(t.endpoint.as_deref(), Some("http://localhost:8000/"));
        #[cfg(not(feature = "redis"))]
        assert_eq!(disabled_feature("redis://h"), "redis");
        #[cfg(feature = "postgres")]
        {
            let url = p("postgresql://u:hunter2@h/db").unwrap();
            assert_eq!(url.backend(), Backend::Postgres);
            assert!(!format!("{url:?}").contains("hunter2"));
        }
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_urls_reach_the_driver_with_their_parameters() {
        let dir = std::env::temp_dir();
        let stem = format!(
            "wg-open-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        )
        .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "");
        let remove = |path: &std::path::Path| {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        };

        // The path is percent-decoded, as the driver reads it.
        let spaced = dir.join(format!("{stem} a.db"));
        let opened = open(&format!("sqlite:{}/{stem}%20a.db", dir.display()))
            .await
            .unwrap();
        assert!(spaced.exists());
        opened.migrate().await.unwrap();
        drop(opened);
        remove(&spaced);

        // `mode=ro` is the driver's: a missing file is not created.
        let missing = dir.join(format!("{stem}-missing.db"));
        let err = open(&format!("sqlite:{}?mode=ro", missing.display()))
            .await
            .unwrap_err();
        assert!(matches!(err, OpenError::Store(_)), "{err}");
        assert!(!missing.exists());

        // A file that is not an SQLite database is the backend's error; a file that
        // cannot be opened, the store being unavailable.
        let junk = dir.join(format!("{stem}-junk.db"));
        std::fs::write(&junk, vec![b'x'; 4096]).unwrap();
        let err = match open(&format!("sqlite:{}", junk.display())).await {
            Ok(opened) => opened.migrate().await.map(drop).unwrap_err(),
            Err(OpenError::Store(e)) => e,
            Err(e) => panic!("{e}"),
        };
        assert!(!err.is_unavailable(), "{err}");
        remove(&junk);
        let err = open(&format!("sqlite:{}/no/such/dir/a.db", dir.display()))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, OpenError::Store(e) if e.is_unavailable()),
            "{err}"
        );

        // A parameter the driver does not know is a bad URL.
        let err = open(&format!("sqlite:{}?colour=blue", missing.display()))
            .await
            .unwrap_err();
        assert!(
            matches!(err, OpenError::InvalidUrl(m) if m.contains("mode=")),
            "{err}"
        );
        assert!(!missing.exists());

        // In-memory databases spelled so that only the driver sees it.
        for hidden in [
            format!("sqlite:{}?mode=rwc&mode=memory", missing.display()),
            format!("sqlite:{}?mode=memory&mode=rwc", missing.display()),
            "sqlite:file::memory:".to_owned(),
            "sqlite:file:x.db%3Fmode%3Dmemory".to_owned(),
            format!("sqlite:{}?mode=%6Demory", missing.display()),
            format!("sqlite:{}?vfs=memdb", missing.display()),
            "sqlite:%3Amemory%3A".to_owned(),
        ] {
            let err = open(&hidden).await.unwrap_err();
            assert!(
                matches!(&err, OpenError::InvalidUrl(m) if m.contains("in-memory")),
                "{hidden}: {err}"
            );
        }
        assert!(!missing.exists());

        // A mode the driver decodes is the user's: read-only creates nothing.
        assert!(open(&format!("sqlite:{}?%6Dode=ro", missing.display()))
            .await
            .is_err());
        assert!(!missing.exists());

        // A bad table name is refused before the file is created.
        let err = StoreUrl::parse(&format!("sqlite:{}", missing.display()))
            .unwrap()
            .table("no-dashes")
            .open()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, OpenError::InvalidTable(t) if t == "no-dashes"),
            "{err}"
        );
        assert!(!missing.exists(), "no file is left behind");
    }

    #[tokio::test]
    async fn memory_opens_and_needs_no_migration() {
        let opened = open("memory:").await.unwrap();
        assert_eq!(opened.migrate().await.unwrap(), Migration::NotNeeded);
        assert!(matches!(
            StoreUrl::parse("memory:").unwrap().table("t").open().await,
            Err(OpenError::TableUnsupported(Backend::Memory))
        ));
    }
}
