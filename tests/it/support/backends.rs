//! Every backend built the same way for the reliability tests, optionally through a
//! [`FaultProxy`](super::proxy::FaultProxy), each in a fresh table or key prefix
//! that [`Cleanup::run`] removes.

use std::sync::Arc;
use std::time::Duration;

use webhook_guard::inbox::InboxStore;
use webhook_guard::ordering::OrderingStore;
#[cfg(feature = "sqlite")]
use webhook_guard::store::SqliteStore;
use webhook_guard::store::{DynProcessedStore, FencingToken, ProcessedStore};
use webhook_guard::MemoryStore;

/// The backends the reliability scenarios run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Sqlite,
    Postgres,
    MySql,
    Redis,
    DynamoDb,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::MySql => "mariadb",
            Self::Redis => "redis",
            Self::DynamoDb => "dynamodb",
        }
    }

    /// The environment variable holding the server's URL, for networked backends.
    pub fn url_var(self) -> Option<&'static str> {
        match self {
            Self::Postgres => Some("WEBHOOK_GUARD_POSTGRES_URL"),
            Self::MySql => Some("WEBHOOK_GUARD_MYSQL_URL"),
            Self::Redis => Some("WEBHOOK_GUARD_REDIS_URL"),
            Self::DynamoDb => Some("WEBHOOK_GUARD_DYNAMODB_URL"),
            _ => None,
        }
    }
}

/// One test per backend running the same scenario: for each `test => Variant`, a
/// multi-threaded `#[tokio::test]` named `test` that awaits
/// `scenario(Backend::Variant)`.
#[allow(unused_macros)]
macro_rules! per_backend {
    ($scenario:ident: $($test:ident => $backend:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            $scenario($crate::support::backends::Backend::$backend).await;
        }
    )+};
}
#[allow(unused_imports)]
pub(crate) use per_backend;

pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{:016x}", FencingToken::random().0)
}

/// What to remove after a test.
#[derive(Debug)]
pub enum Cleanup {
    Nothing,
    #[allow(dead_code)]
    File(std::path::PathBuf),
    #[allow(dead_code)]
    Table {
        url: String,
        table: String,
    },
    #[allow(dead_code)]
    Prefix {
        url: String,
        prefix: String,
    },
    /// A DynamoDB table, deleted through the store's own client (made before any
    /// proxy in front of the server is cut).
    #[cfg(feature = "dynamodb")]
    DynamoDbTable(webhook_guard::store::DynamoDbStore),
}

impl Cleanup {
    pub async fn run(self) {
        match self {
            Self::Nothing => {}
            #[cfg(feature = "dynamodb")]
            Self::DynamoDbTable(store) => {
                let _ = (store.client().delete_table())
                    .table_name(store.table())
                    .send()
                    .await;
            }
            Self::File(path) => remove_sqlite(&path),
            #[allow(unused_variables)]
            Self::Table { url, table } => {
                #[cfg(feature = "postgres")]
                if url.starts_with("postgres") {
                    use webhook_guard::store::postgres::sqlx::{self, Executor as _};
                    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
                    let _ = pool
                        .execute(
                            format!(
                                "DROP TABLE IF EXISTS \"{table}\", \"{table}_inbox\", \"{table}_objects\""
                            )
                            .as_str(),
                        )
                        .await;
                    pool.close().await;
                    return;
                }
                #[cfg(feature = "mysql")]
                if url.starts_with("mysql") {
                    use webhook_guard::store::mysql::sqlx::{self, Executor as _};
                    let pool = sqlx::MySqlPool::connect(&url).await.expect("connect");
                    let _ = pool
                        .execute(
                            format!("DROP TABLE IF EXISTS {table}, {table}_inbox, {table}_objects")
                                .as_str(),
                        )
                        .await;
                    pool.close().await;
                }
            }
            #[allow(unused_variables)]
            Self::Prefix { url, prefix } => {
                #[cfg(feature = "redis")]
                {
                    use webhook_guard::store::redis::redis;
                    let client = redis::Client::open(url.as_str()).unwrap();
                    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                    let pattern = format!("{{{prefix}:*");
                    let mut cursor: u64 = 0;
                    loop {
                        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(&pattern)
                            .arg("COUNT")
                            .arg(1000)
                            .query_async(&mut conn)
                            .await
                            .unwrap();
                        if !keys.is_empty() {
                            let _: () = redis::cmd("UNLINK")
                                .arg(&keys)
                                .query_async(&mut conn)
                                .await
                                .unwrap();
                        }
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
            }
        }
    }
}

/// `host:port` of the server behind `url`.
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    authority.to_owned()
}

/// `url` with its `host:port` replaced by `addr`.
pub fn via(url: &str, addr: &str) -> String {
    url.replacen(&host_port(url), addr, 1)
}

/// A fresh store of `backend` with a pool of `pool` connections. With `through`
/// (`127.0.0.1:<port>` of a proxy) the store connects there instead of the server.
/// `None` when the backend's server is not configured (outside CI).
pub async fn store(
    backend: Backend,
    pool: u32,
    through: Option<&str>,
) -> Option<(Arc<DynProcessedStore>, Cleanup)> {
    let (store, _, _, cleanup) = open(backend, pool, through).await?;
    Some((store, cleanup))
}

/// The inbox of a fresh store of `backend`, built as by [`store`].
pub async fn inbox(
    backend: Backend,
    pool: u32,
    through: Option<&str>,
) -> Option<(Arc<dyn InboxStore>, Cleanup)> {
    let (_, inbox, _, cleanup) = open(backend, pool, through).await?;
    Some((inbox, cleanup))
}

/// A fresh store of `backend` and its ordering store, built as by [`store`].
#[allow(dead_code)]
pub async fn ordered(
    backend: Backend,
    pool: u32,
) -> Option<(Arc<DynProcessedStore>, Arc<dyn OrderingStore>, Cleanup)> {
    let (store, _, ordering, cleanup) = open(backend, pool, None).await?;
    Some((store, ordering, cleanup))
}

/// The three views of one fresh store.
type Views = (
    Arc<DynProcessedStore>,
    Arc<dyn InboxStore>,
    Arc<dyn OrderingStore>,
    Cleanup,
);

/// The views of one fresh store: see [`store`].
async fn open(backend: Backend, pool: u32, through: Option<&str>) -> Option<Views> {
    let url = match backend.url_var() {
        Some(var) => Some(super::server_url(var)?),
        None => None,
    };
    let connect_url = match (&url, through) {
        (Some(u), Some(addr)) => Some(via(u, addr)),
        (u, _) => u.clone(),
    };
    let _ = (&connect_url, pool);
    // Through a proxy, short timeouts: a cut store must fail fast (503), not hang
    // the delivery. Otherwise generous ones: load tests queue for connections.
    let timeout = if through.is_some() {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(60)
    };
    match backend {
        Backend::Memory => Some(both(MemoryStore::new(), Cleanup::Nothing)),
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => {
            let path = std::env::temp_dir().join(format!("{}.db", unique("wg_reliab")));
            let pool = webhook_guard::store::sqlite::sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(pool.min(4))
                .acquire_timeout(timeout)
                .connect_with(SqliteStore::connect_options(&path))
                .await
                .expect("open SQLite");
            let store = SqliteStore::new(pool);
            store.migrate().await.expect("migrate");
            Some(both(store, Cleanup::File(path)))
        }
        #[cfg(feature = "postgres")]
        Backend::Postgres => {
            use webhook_guard::store::postgres::sqlx::postgres::PgPoolOptions;
            use webhook_guard::store::PostgresStore;
            let table = unique("wg_reliab");
            let pg = PgPoolOptions::new()
                .max_connections(pool)
                .acquire_timeout(timeout)
                .connect(connect_url.as_deref().unwrap())
                .await
                .expect("connect to PostgreSQL");
            let store = PostgresStore::with_table(pg, &table).unwrap();
            store.migrate().await.expect("migrate");
            let url = url.unwrap();
            Some(both(store, Cleanup::Table { url, table }))
        }
        #[cfg(feature = "mysql")]
        Backend::MySql => {
            use webhook_guard::store::mysql::sqlx::mysql::MySqlPoolOptions;
            use webhook_guard::store::MySqlStore;
            let table = unique("wg_reliab");
            let my = MySqlPoolOptions::new()
                .max_connections(pool)
                .acquire_timeout(timeout)
                .connect(connect_url.as_deref().unwrap())
                .await
                .expect("connect to MariaDB");
            let store = MySqlStore::new(my).with_table(&table).unwrap();
            store.migrate().await.expect("migrate");
            let url = url.unwrap();
            Some(both(store, Cleanup::Table { url, table }))
        }
        #[cfg(feature = "redis")]
        Backend::Redis => {
            use webhook_guard::store::RedisStore;
            let prefix = unique("wg-reliab");
            let store = RedisStore::builder()
                .prefix(&prefix)
                .connection_timeout(Duration::from_millis(500))
                .response_timeout(timeout)
                .connect(connect_url.as_deref().unwrap())
                .await
                .expect("connect to Redis");
            let url = url.unwrap();
            Some(both(store, Cleanup::Prefix { url, prefix }))
        }
        #[cfg(feature = "dynamodb")]
        Backend::DynamoDb => {
            use webhook_guard::store::DynamoDbStore;
            let table = unique("wg_reliab");
            let connect = |endpoint: &str| {
                DynamoDbStore::builder(&table)
                    .endpoint_url(endpoint)
                    .region("us-east-1")
                    .connect_timeout(Duration::from_millis(500))
                    .attempt_timeout(timeout.min(Duration::from_secs(3)))
                    // Through a proxy, fail fast as the other stores do: a cut
                    // store answers each call's first attempt with an error.
                    .max_attempts(if through.is_some() { 1 } else { 3 })
                    .connect()
            };
            // The table is made and dropped on the server itself, never through
            // the proxy.
            let direct = connect(url.as_deref().unwrap())
                .await
                .expect("DynamoDB store");
            direct.create_table().await.expect("create the table");
            let store = connect(connect_url.as_deref().unwrap())
                .await
                .expect("DynamoDB store");
            Some(both(store, Cleanup::DynamoDbTable(direct)))
        }
        #[allow(unreachable_patterns)]
        other => panic!("{} is not built with this test's features", other.name()),
    }
}

/// `store` shared as a store of records, an inbox and an ordering store.
fn both<S: ProcessedStore + InboxStore + OrderingStore>(store: S, cleanup: Cleanup) -> Views {
    let store = Arc::new(store);
    (store.clone(), store.clone(), store, cleanup)
}

/// Removes a SQLite database file and its `-wal` and `-shm` files.
pub fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}
