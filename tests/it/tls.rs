//! The PostgreSQL, MySQL and Redis stores over TLS, on TLS-only servers that
//! `scripts/services.sh` starts with a throwaway CA (`wg_start_tls_services`):
//! `WEBHOOK_GUARD_TLS_POSTGRES_URL`, `WEBHOOK_GUARD_TLS_MYSQL_URL`,
//! `WEBHOOK_GUARD_TLS_REDIS_URL`, the CA in `WEBHOOK_GUARD_TLS_CA` and an unrelated
//! CA in `WEBHOOK_GUARD_TLS_OTHER_CA`. The server certificate names `localhost`
//! only, so a URL with `127.0.0.1` fails a hostname check. The Redis cluster test
//! starts its own TLS nodes (ports 7111-7113) with the same certificate
//! (`WEBHOOK_GUARD_TLS_CERT`, `WEBHOOK_GUARD_TLS_KEY`).

use crate::support;
use support::backends::unique;

use std::error::Error;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use webhook_guard::conformance;
use webhook_guard::store::mysql::sqlx as mysql_sqlx;
use webhook_guard::store::postgres::sqlx as pg_sqlx;
use webhook_guard::store::redis::{redis, RedisStoreError};
use webhook_guard::store::{
    self, FencingToken, Key, MySqlStore, OpenError, PostgresStore, RedisStore, TlsError, TlsFailure,
};
use webhook_guard::ProcessedStore;

/// The CA that signed the servers' certificate, and one that did not.
struct Cas {
    ca: String,
    other: String,
}

fn cas() -> Option<Cas> {
    Some(Cas {
        ca: support::server_url("WEBHOOK_GUARD_TLS_CA")?,
        other: support::server_url("WEBHOOK_GUARD_TLS_OTHER_CA")?,
    })
}

/// `url` with `query` appended.
fn with(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

/// `url` reaching the same server by an address its certificate does not name.
fn by_ip(url: &str) -> String {
    assert!(
        url.contains("@localhost:") || url.contains("//localhost:"),
        "{url}"
    );
    url.replacen("localhost", "127.0.0.1", 1)
}

/// Asserts that `error` holds a [`TlsError`] of `failure` and that its text says
/// `says`.
#[track_caller]
fn assert_tls(error: &(dyn Error + 'static), failure: TlsFailure, says: &str) {
    let found = TlsError::find(error).unwrap_or_else(|| panic!("no TlsError in: {error}"));
    assert_eq!(found.failure(), failure, "{error}");
    let text = error.to_string();
    assert!(text.contains(says), "{text:?} does not say {says:?}");
}

/// Whether a store failed to open as unreachable (not as a refusal).
fn unavailable(error: &OpenError) -> bool {
    matches!(error, OpenError::Store(e) if e.is_unavailable())
}

async fn open_err(url: &str) -> OpenError {
    match store::open(url).await {
        Ok(_) => panic!("{url} opened"),
        Err(e) => e,
    }
}

const UNTRUSTED: &str = "not signed by a trusted CA";
const WRONG_HOST: &str = "does not name the host";

// ---------------------------------------------------------------------------
// PostgreSQL

const PG: &str = "WEBHOOK_GUARD_TLS_POSTGRES_URL";

/// Whether the pool's connection is encrypted, as the server sees it.
async fn pg_encrypted(store: &PostgresStore) -> bool {
    pg_sqlx::query_scalar::<_, bool>("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .expect("pg_stat_ssl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_verified_tls_passes_the_conformance_suite() {
    let (Some(url), Some(cas)) = (support::server_url(PG), cas()) else {
        return;
    };
    let url = with(&url, &format!("sslmode=verify-full&sslrootcert={}", cas.ca));
    let connected = PostgresStore::connect(&url)
        .await
        .expect("connect over TLS");
    assert!(pg_encrypted(&connected).await);
    let table = unique("wg_tls");
    let store = PostgresStore::with_table(connected.pool().clone(), &table).unwrap();
    store.migrate().await.unwrap();
    conformance::run_all(&store).await;
    for suffix in ["", "_inbox", "_objects"] {
        pg_sqlx::query(&format!("DROP TABLE IF EXISTS \"{table}{suffix}\""))
            .execute(store.pool())
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn postgres_url_forms_connect_over_tls() {
    let (Some(url), Some(cas)) = (support::server_url(PG), cas()) else {
        return;
    };
    let ca = &cas.ca;
    for (url, what) in [
        (
            with(&url, &format!("sslmode=verify-full&sslrootcert={ca}")),
            "verify-full",
        ),
        (
            with(&url, &format!("sslmode=verify-ca&sslrootcert={ca}")),
            "verify-ca",
        ),
        // require without a CA encrypts unchecked, as libpq does.
        (with(&by_ip(&url), "sslmode=require"), "require"),
        // The default, prefer, takes the TLS the server offers.
        (url.clone(), "the default sslmode"),
    ] {
        let store = PostgresStore::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(pg_encrypted(&store).await, "{what}");
        store::open(&url)
            .await
            .unwrap_or_else(|e| panic!("{what} through store::open: {e}"));
    }
}

#[tokio::test]
async fn postgres_tls_failures_are_typed_errors() {
    let (Some(url), Some(cas)) = (support::server_url(PG), cas()) else {
        return;
    };
    // A wrong CA, or none (the system's roots do not hold the test CA).
    for query in [
        format!("sslmode=verify-full&sslrootcert={}", cas.other),
        format!("sslmode=verify-ca&sslrootcert={}", cas.other),
        "sslmode=verify-full".to_owned(),
        // A CA given with require is checked, as libpq does.
        format!("sslmode=require&sslrootcert={}", cas.other),
    ] {
        let e = open_err(&with(&url, &query)).await;
        assert_tls(&e, TlsFailure::UntrustedCertificate, UNTRUSTED);
        assert!(unavailable(&e), "{query}: {e}");
        assert!(e.to_string().contains("UnknownIssuer"), "{e}");
    }
    // The right CA, but a host the certificate does not name. sqlx 0.8 checks the
    // host for verify-ca too (sqlx issue 3793): documented, and the safe side.
    for mode in ["verify-full", "verify-ca"] {
        let e = open_err(&with(
            &by_ip(&url),
            &format!("sslmode={mode}&sslrootcert={}", cas.ca),
        ))
        .await;
        assert_tls(&e, TlsFailure::WrongHost, WRONG_HOST);
        assert!(e.to_string().contains("127.0.0.1"), "{e}");
    }
    // Plain text to a server that accepts only TLS: the server refuses it.
    let e = open_err(&with(&url, "sslmode=disable")).await;
    assert_tls(&e, TlsFailure::Refused, "accepts only TLS connections");
    assert!(
        matches!(&e, OpenError::Store(s) if !s.is_unavailable()),
        "{e}"
    );
    // The same through the store's own constructor.
    let e = PostgresStore::connect(&with(&url, "sslmode=disable"))
        .await
        .unwrap_err();
    assert_tls(&e, TlsFailure::Refused, "no encryption");
}

// ---------------------------------------------------------------------------
// MySQL / MariaDB

const MY: &str = "WEBHOOK_GUARD_TLS_MYSQL_URL";

/// The cipher of the pool's connection as the server sees it (empty: plain text).
async fn my_cipher(store: &MySqlStore) -> String {
    let (_, cipher): (String, String) =
        mysql_sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            .fetch_one(store.pool())
            .await
            .expect("Ssl_cipher");
    cipher
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_over_verified_tls_passes_the_conformance_suite() {
    let (Some(url), Some(cas)) = (support::server_url(MY), cas()) else {
        return;
    };
    let url = with(&url, &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", cas.ca));
    let connected = MySqlStore::connect(&url).await.expect("connect over TLS");
    assert!(!my_cipher(&connected).await.is_empty());
    let store = connected.with_table(&unique("wg_tls")).unwrap();
    store.migrate().await.unwrap();
    conformance::run_all(&store).await;
    let t = store.table();
    mysql_sqlx::query(&format!(
        "DROP TABLE IF EXISTS `{t}`, `{}`, `{}`",
        store.inbox_table(),
        store.objects_table()
    ))
    .execute(store.pool())
    .await
    .unwrap();
}

#[tokio::test]
async fn mysql_url_forms_connect_over_tls() {
    let (Some(url), Some(cas)) = (support::server_url(MY), cas()) else {
        return;
    };
    let ca = &cas.ca;
    for (url, what) in [
        (
            with(&url, &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")),
            "VERIFY_IDENTITY",
        ),
        (
            with(&url, &format!("ssl-mode=VERIFY_CA&ssl-ca={ca}")),
            "VERIFY_CA",
        ),
        (with(&by_ip(&url), "ssl-mode=REQUIRED"), "REQUIRED"),
        (url.clone(), "the default ssl-mode"),
    ] {
        let store = MySqlStore::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!my_cipher(&store).await.is_empty(), "{what}");
        store::open(&url.replacen("mysql:", "mariadb:", 1))
            .await
            .unwrap_or_else(|e| panic!("{what} through store::open: {e}"));
    }
}

#[tokio::test]
async fn mysql_tls_failures_are_typed_errors() {
    let (Some(url), Some(cas)) = (support::server_url(MY), cas()) else {
        return;
    };
    for query in [
        format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", cas.other),
        format!("ssl-mode=VERIFY_CA&ssl-ca={}", cas.other),
        "ssl-mode=VERIFY_IDENTITY".to_owned(),
        // A CA given with REQUIRED is checked.
        format!("ssl-mode=REQUIRED&ssl-ca={}", cas.other),
    ] {
        let e = open_err(&with(&url, &query)).await;
        assert_tls(&e, TlsFailure::UntrustedCertificate, UNTRUSTED);
        assert!(unavailable(&e), "{query}: {e}");
    }
    // sqlx 0.8 checks the host for VERIFY_CA too (sqlx issue 3793).
    for mode in ["VERIFY_IDENTITY", "VERIFY_CA"] {
        let e = open_err(&with(
            &by_ip(&url),
            &format!("ssl-mode={mode}&ssl-ca={}", cas.ca),
        ))
        .await;
        assert_tls(&e, TlsFailure::WrongHost, WRONG_HOST);
    }
    // MariaDB answers a plain-text login to a TLS-only server as it answers a wrong
    // password: the server's error, with no TLS failure to tell.
    let e = open_err(&with(&url, "ssl-mode=DISABLED")).await;
    assert!(TlsError::find(&e).is_none(), "{e}");
    assert!(!unavailable(&e), "{e}");
    assert!(e.to_string().contains("Access denied"), "{e}");

    // A server without TLS (the plain test server) and a URL that requires it.
    let Some(plain) = support::server_url("WEBHOOK_GUARD_MYSQL_URL") else {
        return;
    };
    let e = open_err(&with(&plain, "ssl-mode=REQUIRED")).await;
    assert_tls(&e, TlsFailure::NotOffered, "the server does not offer it");
}

// ---------------------------------------------------------------------------
// Redis

const REDIS: &str = "WEBHOOK_GUARD_TLS_REDIS_URL";

fn ca_pem(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn prefix(test: &str) -> String {
    format!("wg-tls-{test}-{:016x}", FencingToken::random().0)
}

/// Removes the keys of `prefix` from the server at `url`, over TLS with `ca`.
async fn cleanup(url: &str, ca: &str, prefix: &str) -> usize {
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(ca_pem(ca)),
    };
    let client = redis::Client::build_with_tls(url, certificates).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{prefix}:*"))
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
    keys.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_verified_tls_passes_the_conformance_suite() {
    let (Some(url), Some(cas)) = (support::server_url(REDIS), cas()) else {
        return;
    };
    let prefix = prefix("conformance");
    let store = RedisStore::builder()
        .prefix(&prefix)
        .root_certificates(ca_pem(&cas.ca))
        .connect(url.as_str())
        .await
        .expect("connect over TLS");
    conformance::run_all(&store).await;
    assert!(cleanup(&url, &cas.ca, &prefix).await > 0, "the suite wrote");
}

#[tokio::test]
async fn redis_tls_failures_are_typed_errors() {
    let (Some(url), Some(cas)) = (support::server_url(REDIS), cas()) else {
        return;
    };
    let connect = |url: String, ca: Option<&str>| {
        let mut builder = RedisStore::builder().connection_timeout(Duration::from_millis(500));
        if let Some(ca) = ca {
            builder = builder.root_certificates(ca_pem(ca));
        }
        async move {
            match builder.connect(url.as_str()).await {
                Ok(_) => panic!("{url} connected"),
                Err(e) => e,
            }
        }
    };
    // The system's roots (the default) and a wrong CA do not trust the server.
    for ca in [None, Some(cas.other.as_str())] {
        let e = connect(url.clone(), ca).await;
        assert!(matches!(e, RedisStoreError::Tls(_)), "{e}");
        assert_tls(&e, TlsFailure::UntrustedCertificate, UNTRUSTED);
        assert!(e.is_unavailable());
    }
    // store::open uses the system's roots: the same failure, never a panic.
    let e = open_err(&url).await;
    assert_tls(&e, TlsFailure::UntrustedCertificate, UNTRUSTED);
    // The right CA, but a host the certificate does not name.
    let e = connect(by_ip(&url), Some(&cas.ca)).await;
    assert_tls(&e, TlsFailure::WrongHost, WRONG_HOST);
    // Plain text to the TLS-only port: the server resets the connection.
    let plain = url.replacen("rediss:", "redis:", 1);
    let e = connect(plain.clone(), None).await;
    assert!(
        matches!(&e, RedisStoreError::Connect { source } if source.is_io_error()),
        "{e}"
    );
    assert!(e.is_unavailable() && TlsError::find(&e).is_none(), "{e}");
    // A CA given for a plain-text URL is refused rather than ignored.
    let e = connect(plain, Some(&cas.ca)).await;
    assert!(e.to_string().contains("rediss://"), "{e}");
    // TLS to the plain test server: no handshake answer within the timeout.
    if let Some(plain_server) = support::server_url("WEBHOOK_GUARD_REDIS_URL") {
        let e = connect(plain_server.replacen("redis:", "rediss:", 1), None).await;
        assert!(
            matches!(&e, RedisStoreError::Connect { source } if source.is_timeout()),
            "{e}"
        );
    }
}

#[tokio::test]
async fn redis_verification_is_off_only_when_the_url_says_insecure() {
    let Some(url) = support::server_url(REDIS) else {
        return;
    };
    let e = RedisStore::connect(url.as_str()).await.unwrap_err();
    assert_tls(&e, TlsFailure::UntrustedCertificate, UNTRUSTED);
    let store = RedisStore::builder()
        .prefix(prefix("insecure"))
        .connect(format!("{url}/#insecure").as_str())
        .await
        .expect("#insecure skips verification");
    // The connection works: a read over it answers.
    let read = store.get(Key::new("tls", "evt_1")).await.expect("a read");
    assert!(read.is_none());
}

/// The operator tool opens `rediss://` with the system's roots, which
/// `SSL_CERT_FILE` replaces.
#[cfg(feature = "cli")]
#[tokio::test]
async fn the_tool_trusts_the_ca_that_ssl_cert_file_names() {
    let (Some(url), Some(cas)) = (support::server_url(REDIS), cas()) else {
        return;
    };
    let run = |envs: Vec<(&'static str, String)>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_webhook-guard"));
        cmd.args([
            "inspect",
            "--store",
            &url,
            "--namespace",
            "tls",
            "evt_missing",
        ]);
        cmd.env_remove("SSL_CERT_FILE").env_remove("SSL_CERT_DIR");
        cmd.env_remove("WEBHOOK_GUARD_STORE_URL");
        cmd.envs(envs);
        async move {
            tokio::task::spawn_blocking(move || cmd.output().unwrap())
                .await
                .unwrap()
        }
    };
    let text = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let untrusted = run(vec![]).await;
    assert!(!untrusted.status.success());
    assert!(text(&untrusted).contains(UNTRUSTED), "{}", text(&untrusted));
    let trusted = run(vec![("SSL_CERT_FILE", cas.ca.clone())]).await;
    assert!(!text(&trusted).contains("TLS"), "{}", text(&trusted));
    // Connected: the record is simply not there.
    assert!(
        text(&trusted).contains("no record for `evt_missing`"),
        "{}",
        text(&trusted)
    );
}

// ---------------------------------------------------------------------------
// Redis Cluster over TLS

const CLUSTER_PORTS: [u16; 3] = [7111, 7112, 7113];

/// TLS-only cluster nodes on [`CLUSTER_PORTS`], announcing the host name their
/// certificate holds; shut down on drop.
struct TlsCluster {
    dir: PathBuf,
    ca: String,
}

impl TlsCluster {
    fn cli(&self, port: u16) -> Command {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["--tls", "--cacert", &self.ca, "-h", "localhost"])
            .args(["-p", &port.to_string()]);
        cmd
    }

    fn answers(&self, port: u16, args: &[&str], expect: &str) -> bool {
        self.cli(port)
            .args(args)
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(expect))
    }

    fn start(ca: &str, cert: &str, key: &str) -> Self {
        let dir = std::env::temp_dir().join(unique("wg-tls-cluster"));
        std::fs::create_dir_all(&dir).unwrap();
        let cluster = Self {
            dir,
            ca: ca.to_owned(),
        };
        for port in CLUSTER_PORTS {
            let status = Command::new("redis-server")
                .args(["--daemonize", "yes", "--bind", "127.0.0.1", "--port", "0"])
                .args(["--tls-port", &port.to_string(), "--tls-cluster", "yes"])
                .args(["--tls-cert-file", cert, "--tls-key-file", key])
                .args(["--tls-ca-cert-file", ca, "--tls-auth-clients", "no"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--cluster-announce-hostname", "localhost"])
                .args(["--cluster-preferred-endpoint-type", "hostname"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&cluster.dir)
                .arg("--logfile")
                .arg(cluster.dir.join(format!("{port}.log")))
                .status()
                .expect("redis-server must be on the PATH");
            assert!(status.success(), "TLS node {port} did not start");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !CLUSTER_PORTS
            .iter()
            .all(|&p| cluster.answers(p, &["ping"], "PONG"))
        {
            assert!(Instant::now() < deadline, "a TLS node never answered");
            std::thread::sleep(Duration::from_millis(20));
        }
        let nodes: Vec<String> = CLUSTER_PORTS
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let out = cluster
            .cli(CLUSTER_PORTS[0])
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !CLUSTER_PORTS
            .iter()
            .all(|&p| cluster.answers(p, &["cluster", "info"], "cluster_state:ok"))
        {
            assert!(Instant::now() < deadline, "the TLS cluster never became ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        for port in CLUSTER_PORTS {
            let _ = self.cli(port).args(["shutdown", "nosave"]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_over_verified_tls_passes_the_conformance_suite() {
    let (Some(cas), Some(cert), Some(key)) = (
        cas(),
        support::server_url("WEBHOOK_GUARD_TLS_CERT"),
        support::server_url("WEBHOOK_GUARD_TLS_KEY"),
    ) else {
        return;
    };
    let cluster = TlsCluster::start(&cas.ca, &cert, &key);
    let seeds = |host: &str| -> Vec<String> {
        CLUSTER_PORTS
            .iter()
            .map(|p| format!("rediss://{host}:{p}"))
            .collect()
    };
    // Untrusted by the system's roots, and by name only as `localhost`.
    let e = RedisStore::builder()
        .connect_cluster(seeds("localhost"))
        .await
        .unwrap_err();
    assert_tls(&e, TlsFailure::UntrustedCertificate, UNTRUSTED);
    let e = RedisStore::builder()
        .root_certificates(ca_pem(&cas.ca))
        .connect_cluster(seeds("127.0.0.1"))
        .await
        .unwrap_err();
    assert_tls(&e, TlsFailure::WrongHost, WRONG_HOST);

    let store = RedisStore::builder()
        .prefix(prefix("cluster"))
        .root_certificates(ca_pem(&cas.ca))
        .connect_cluster(seeds("localhost"))
        .await
        .expect("connect to the TLS cluster");
    conformance::run_all(&store).await;
    drop(cluster);
}
