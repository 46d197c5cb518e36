//! The `webhook-guard` tool, run as a process: the operator commands against
//! SQLite and PostgreSQL, and `send` against an axum server on loopback.

use crate::support;
use crate::support::web;

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use chrono::{DateTime, TimeDelta, Utc};
use webhook_guard::inbox::LeaseRequest;
use webhook_guard::integrations::axum::guarded;
use webhook_guard::store::{
    Claim, ClaimRequest, DynProcessedStore, FailureNote, Fence, FencingToken, Fingerprint, Finish,
    Holder, Key, RecordState, StoreUrl,
};
use webhook_guard::verify::{GitHub, Jamm, StandardWebhooks, Stripe, Verifier};
use webhook_guard::{HandlerError, MemoryStore, OwnedEvent, WebhookGuard};

const BIN: &str = env!("CARGO_BIN_EXE_webhook-guard");

/// Runs the tool with `args` and `envs` (and none of its variables inherited).
async fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for var in [
        "WEBHOOK_GUARD_STORE_URL",
        "WEBHOOK_GUARD_NAMESPACE",
        "WEBHOOK_GUARD_TABLE",
        "WEBHOOK_GUARD_SECRET",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(envs.iter().copied());
    tokio::task::spawn_blocking(move || cmd.output().expect("run webhook-guard"))
        .await
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn assert_code(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{:x}", FencingToken::random().0 >> 16)
}

// ---------------------------------------------------------------------------
// Operator commands
// ---------------------------------------------------------------------------

/// Claims `id` at `now` with a lease until `lease_until` and an expiry at `expires_at`.
async fn claim(
    store: &DynProcessedStore,
    ns: &str,
    id: &str,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    expires_at: DateTime<Utc>,
) -> FencingToken {
    let token = FencingToken::random();
    let request = ClaimRequest {
        key: Key::new(ns, id),
        fingerprint: Fingerprint::of(id.as_bytes()),
        token,
        now,
        lease_until,
        expires_at,
    };
    match store.claim(&request).await.unwrap() {
        Claim::Acquired(_) => token,
        other => panic!("{id}: {other:?}"),
    }
}

#[allow(clippy::too_many_arguments)] // a test helper spelling out each field
async fn finish(
    store: &DynProcessedStore,
    ns: &str,
    id: &str,
    token: FencingToken,
    state: RecordState,
    history: &[FailureNote],
    now: DateTime<Utc>,
    expires_at: DateTime<Utc>,
) {
    let finish = Finish {
        state,
        failures: history.len() as u32,
        history,
        now,
        expires_at,
    };
    let fence = store
        .finish(Holder::new(Key::new(ns, id), token), &finish)
        .await
        .unwrap();
    assert_eq!(fence, Fence::Applied, "{id}");
}

/// The whole operator flow against the store at `url` (in `table`, if given).
async fn operator_flow(url: &str, table: Option<&str>) {
    let ns = unique("cli");
    let mut envs = vec![
        ("WEBHOOK_GUARD_STORE_URL", url),
        ("WEBHOOK_GUARD_NAMESPACE", ns.as_str()),
    ];
    if let Some(t) = table {
        envs.push(("WEBHOOK_GUARD_TABLE", t));
    }

    let out = run(&["migrate"], &envs).await;
    assert_code(&out, 0);
    assert!(stdout(&out).contains("is ready"), "{}", stdout(&out));
    // Idempotent.
    assert_code(&run(&["migrate"], &envs).await, 0);

    let mut parsed = StoreUrl::parse(url).unwrap();
    if let Some(t) = table {
        parsed = parsed.table(t);
    }
    let store = parsed.open().await.unwrap().shared();
    let store = &*store;
    let now = Utc::now();
    let h = TimeDelta::hours;

    // done: completed. failed: one failure with a message. live: held now.
    // stuck: its lease ran out an hour ago. old: completed, retention over.
    let t = claim(store, &ns, "done", now, now + h(1), now + h(2)).await;
    finish(
        store,
        &ns,
        "done",
        t,
        RecordState::Completed,
        &[],
        now,
        now + h(2),
    )
    .await;
    let t = claim(store, &ns, "failed", now, now + h(1), now + h(2)).await;
    let note = FailureNote {
        at: now,
        error: "boom: upstream timed out".into(),
    };
    finish(
        store,
        &ns,
        "failed",
        t,
        RecordState::Failed,
        &[note],
        now,
        now + h(2),
    )
    .await;
    claim(store, &ns, "live", now, now + h(1), now + h(2)).await;
    claim(store, &ns, "stuck", now - h(2), now - h(1), now + h(2)).await;
    let then = now - h(80);
    let t = claim(store, &ns, "old", then, then + h(1), then + h(2)).await;
    finish(
        store,
        &ns,
        "old",
        t,
        RecordState::Completed,
        &[],
        then,
        then + h(2),
    )
    .await;

    // inspect: text, JSON, not found.
    let out = run(&["inspect", "done"], &envs).await;
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("completed (terminal"), "{text}");
    assert!(text.contains(&ns), "{text}");
    assert!(text.contains("attempts     1"), "{text}");

    let out = run(&["inspect", "failed", "--json"], &envs).await;
    assert_code(&out, 0);
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["state"], "failed");
    assert_eq!(json["failures"], 1);
    assert_eq!(json["last_errors"][0]["error"], "boom: upstream timed out");
    assert_eq!(json["terminal"], false);

    let out = run(&["inspect", "live", "--json"], &envs).await;
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        (json["state"].as_str(), json["lease_live"].as_bool()),
        (Some("in_progress"), Some(true))
    );

    let out = run(&["inspect", "never-seen"], &envs).await;
    assert_code(&out, 1);
    assert!(
        stderr(&out).contains("no record for `never-seen`"),
        "{}",
        stderr(&out)
    );

    // stuck: the expired lease only.
    let out = run(&["stuck"], &envs).await;
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(text.contains(&format!("{ns}/stuck ")), "{text}");
    assert!(!text.contains(&format!("{ns}/live")), "{text}");
    let out = run(&["stuck", "--json", "--limit", "1000"], &envs).await;
    let list: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).unwrap();
    let mine: Vec<_> = list
        .iter()
        .filter(|r| r["namespace"] == ns.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "{list:?}");
    assert_eq!(mine[0]["id"], "stuck");
    assert_eq!(mine[0]["stuck"], true);
    assert!(!stderr(&out).contains("limit"), "{}", stderr(&out));
    // At the limit, JSON too says so (on stderr: stdout stays one array).
    let out = run(&["stuck", "--json", "--limit", "1"], &envs).await;
    assert_code(&out, 0);
    let list: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(list.len(), 1);
    assert!(
        stderr(&out).contains("limit of 1 was reached"),
        "{}",
        stderr(&out)
    );

    // forget: refused under a live lease, allowed once the lease ran out.
    let out = run(&["forget", "live"], &envs).await;
    assert_code(&out, 1);
    assert!(stderr(&out).contains("live lease"), "{}", stderr(&out));
    assert_code(&run(&["inspect", "live"], &envs).await, 0);

    let out = run(&["forget", "stuck"], &envs).await;
    assert_code(&out, 0);
    assert!(stdout(&out).contains("forgot `stuck`"));
    assert_code(&run(&["inspect", "stuck"], &envs).await, 1);
    assert_code(&run(&["forget", "stuck"], &envs).await, 1);

    // purge: the record past its retention goes, the others stay.
    assert_code(&run(&["inspect", "old"], &envs).await, 0);
    let out = run(&["purge", "--batch", "2"], &envs).await;
    assert_code(&out, 0);
    let purged: u64 = stdout(&out)
        .strip_prefix("purged ")
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", stdout(&out)));
    assert!(purged >= 1, "{}", stdout(&out));
    assert_code(&run(&["inspect", "old"], &envs).await, 1);
    assert_code(&run(&["inspect", "done"], &envs).await, 0);

    // Another namespace sees none of it.
    let mut other = envs.clone();
    other[1] = ("WEBHOOK_GUARD_NAMESPACE", "someone-else");
    assert_code(&run(&["inspect", "done"], &other).await, 1);
}

#[tokio::test]
async fn operator_commands_on_sqlite() {
    let path = fresh_sqlite("webhook-guard-cli");
    operator_flow(&format!("sqlite://{}", path.display()), None).await;
    support::backends::remove_sqlite(&path);
}

/// A path for a new SQLite database file in the temp directory.
fn fresh_sqlite(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{}.db", unique(name)))
}

/// The store URL and the signing secret read from files (one trailing newline
/// ignored), and a database file the tool creates readable by its owner only.
#[tokio::test]
async fn secrets_and_store_urls_come_from_files_and_the_sqlite_file_is_private() {
    let dir = std::env::temp_dir().join(unique("webhook-guard-files"));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("records.db");
    let url_file = dir.join("store-url");
    std::fs::write(&url_file, format!("sqlite://{}\n", db.display())).unwrap();
    let url_arg = url_file.to_str().unwrap();
    let out = run(&["migrate", "--store-url-file", url_arg], &[]).await;
    assert_code(&out, 0);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&db).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
    }
    let out = run(&["inspect", "--store-url-file", url_arg, "nothing"], &[]).await;
    assert_code(&out, 1);
    // A missing file is a usage error naming the option, never a value.
    let missing = dir.join("no-such-file");
    let out = run(
        &[
            "inspect",
            "--store-url-file",
            missing.to_str().unwrap(),
            "x",
        ],
        &[],
    )
    .await;
    assert_code(&out, 2);
    assert!(
        stderr(&out).contains("--store-url-file"),
        "{}",
        stderr(&out)
    );

    let server = Server::start().await;
    let url = server.url("stripe");
    let secret_file = dir.join("stripe.secret");
    std::fs::write(&secret_file, format!("{STRIPE_SECRET}\n")).unwrap();
    let args = [
        "send",
        "--provider",
        "stripe",
        "--secret-file",
        secret_file.to_str().unwrap(),
        "--url",
        &url,
    ];
    let out = run(&args, &[]).await;
    assert_code(&out, 0);
    assert_eq!(count(&stdout(&out), "processed"), 1, "{}", stdout(&out));
    // A secret with a stray space is refused by the preset, naming the fix.
    std::fs::write(&secret_file, format!("{STRIPE_SECRET} \n")).unwrap();
    let out = run(&args, &[]).await;
    assert_code(&out, 2);
    assert!(stderr(&out).contains("trim it"), "{}", stderr(&out));
    assert!(!stderr(&out).contains(STRIPE_SECRET));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn operator_commands_on_postgres() {
    let Some(url) = support::server_url("WEBHOOK_GUARD_POSTGRES_URL") else {
        return;
    };
    // A table of its own, so purging never touches other suites' records.
    operator_flow(&url, Some("webhook_guard_cli_test")).await;
}

#[tokio::test]
async fn store_errors_are_clear_and_never_show_the_url() {
    // A missing SQLite file is not created by an operator command.
    let path = std::env::temp_dir().join(format!("{}.db", unique("missing")));
    let url = format!("sqlite:{}", path.display());
    let out = run(&["inspect", "--store", &url, "x"], &[]).await;
    assert_code(&out, 1);
    assert!(stderr(&out).contains("migrate"), "{}", stderr(&out));
    assert!(!path.exists());

    // An unknown scheme is a usage error; a password in the URL is never printed.
    let out = run(
        &["inspect", "--store", "mongodb://u:hunter2@h/db", "x"],
        &[],
    )
    .await;
    assert_code(&out, 2);
    assert!(stderr(&out).contains("unknown store scheme `mongodb`"));
    assert!(!stderr(&out).contains("hunter2"));
    let out = run(&["inspect", "--store", "postgres:u:hunter2@h", "x"], &[]).await;
    assert_code(&out, 2);
    assert!(!stderr(&out).contains("hunter2"), "{}", stderr(&out));

    // A missing --store is clap's usage error, and so is a missing id.
    assert_code(&run(&["inspect", "x"], &[]).await, 2);
    assert_code(&run(&["inspect", "--store", "memory:"], &[]).await, 2);
}

// ---------------------------------------------------------------------------
// send
// ---------------------------------------------------------------------------

const STRIPE_SECRET: &str = "whsec_clitest0123456789abcdefghijklmno";
const STANDARD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const GITHUB_SECRET: &str = "It's a Secret to Everybody";
const JAMM_SECRET: &str = "jamm_client_secret_0123456789";

/// A route guarded by `verifier`, whose handler counts its runs, sleeps 50 ms, and
/// fails (retryably) its first `fail_first` attempts.
fn route(
    app: Router,
    path: &str,
    verifier: impl Verifier,
    fail_first: u32,
) -> (Router, Arc<AtomicUsize>) {
    let guard = WebhookGuard::builder()
        .namespace(path.trim_start_matches('/'))
        .store(MemoryStore::new())
        .verifier(verifier)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = app.route(
        path,
        guarded(guard, move |event: OwnedEvent| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                if event.attempt() <= fail_first {
                    return Err(HandlerError::retryable(std::io::Error::other("not yet")));
                }
                Ok(())
            }
        }),
    );
    (app, runs)
}

struct Server {
    addr: SocketAddr,
    runs: Vec<(&'static str, Arc<AtomicUsize>)>,
}

impl Server {
    async fn start() -> Self {
        let app = Router::new();
        let (app, stripe) = route(app, "/stripe", Stripe::new([STRIPE_SECRET]).unwrap(), 0);
        let (app, standard) = route(
            app,
            "/standard",
            StandardWebhooks::new([STANDARD_SECRET]).unwrap(),
            0,
        );
        let (app, github) = route(app, "/github", GitHub::new([GITHUB_SECRET]).unwrap(), 0);
        let (app, jamm) = route(app, "/jamm", Jamm::new([JAMM_SECRET]).unwrap(), 2);
        let addr = web::serve(app).await;
        Self {
            addr,
            runs: vec![
                ("stripe", stripe),
                ("standard", standard),
                ("github", github),
                ("jamm", jamm),
            ],
        }
    }

    fn url(&self, provider: &str) -> String {
        format!("http://{}/{provider}", self.addr)
    }

    fn runs(&self, provider: &str) -> usize {
        let (_, runs) = self.runs.iter().find(|(p, _)| *p == provider).unwrap();
        runs.load(Ordering::SeqCst)
    }
}

fn count(text: &str, outcome: &str) -> usize {
    text.matches(&format!(r#""outcome":"{outcome}""#)).count()
}

#[tokio::test]
async fn send_signs_like_each_provider_and_duplicates_are_answered_as_such() {
    let server = Server::start().await;
    for (provider, secret) in [
        ("stripe", STRIPE_SECRET),
        ("standard", STANDARD_SECRET),
        ("github", GITHUB_SECRET),
    ] {
        let url = server.url(provider);
        let args = [
            "send",
            "--provider",
            provider,
            "--secret",
            secret,
            "--url",
            &url,
        ];
        let out = run(&[&args[..], &["--duplicates", "2"]].concat(), &[]).await;
        assert_code(&out, 0);
        let text = stdout(&out);
        assert_eq!(count(&text, "processed"), 1, "{provider}: {text}");
        assert_eq!(count(&text, "duplicate"), 2, "{provider}: {text}");
        assert!(
            text.contains("3 deliveries: 2 × 200 duplicate, 1 × 200 processed"),
            "{text}"
        );
        assert_eq!(server.runs(provider), 1, "{provider}");
        // The first answer is the processed one.
        let first = text.lines().find(|l| l.starts_with('[')).unwrap();
        assert!(
            first.contains(" 200 OK ") && first.contains("processed"),
            "{first}"
        );

        // A wrong secret: 401, exit 1, and no secret printed.
        let wrong = match provider {
            "standard" => "whsec_d3Jvbmcgc2VjcmV0LCAyNCBieXRlcyEh",
            "stripe" => "whsec_wrongsecret0123456789abcdefghijk",
            _ => "wrong-secret-0123456789",
        };
        let out = run(
            &["send", "--provider", provider, "--url", &url],
            &[("WEBHOOK_GUARD_SECRET", wrong)],
        )
        .await;
        assert_code(&out, 1);
        assert!(stdout(&out).contains("] 401 "), "{}", stdout(&out));
        assert!(!stdout(&out).contains(wrong) && !stderr(&out).contains(wrong));
        assert_eq!(server.runs(provider), 1, "{provider}");
    }
}

#[tokio::test]
async fn send_concurrent_duplicates_run_the_handler_once() {
    let server = Server::start().await;
    let url = server.url("stripe");
    let args = [
        "send",
        "--provider",
        "stripe",
        "--secret",
        STRIPE_SECRET,
        "--url",
        &url,
        "--duplicates",
        "7",
        "--concurrency",
        "8",
        "--event-id",
        "evt_concurrent",
    ];
    let out = run(&args, &[]).await;
    assert_code(&out, 0);
    let text = stdout(&out);
    assert_eq!(count(&text, "processed"), 1, "{text}");
    assert_eq!(
        count(&text, "duplicate") + count(&text, "in_progress"),
        7,
        "{text}"
    );
    assert!(text.contains("stripe event evt_concurrent"), "{text}");
    assert_eq!(server.runs("stripe"), 1);
}

#[tokio::test]
async fn send_retries_on_the_compressed_schedule_until_accepted() {
    let server = Server::start().await;
    let url = server.url("jamm");
    // 1 h becomes 0.1 s: attempts at 0, 0.1 s and 0.3 s; the third succeeds.
    let args = [
        "send",
        "--provider",
        "jamm",
        "--secret",
        JAMM_SECRET,
        "--url",
        &url,
        "--retry-schedule",
        "jamm",
        "--compress",
        "36000",
    ];
    let out = run(&args, &[]).await;
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("[attempt 1/20] 500"), "{text}");
    assert!(text.contains("waiting 1h (0.100s compressed)"), "{text}");
    assert!(text.contains("[attempt 3/20] 200"), "{text}");
    assert!(text.contains("accepted on attempt 3 of 20"), "{text}");
    assert_eq!(server.runs("jamm"), 3);
}

#[tokio::test]
async fn send_refuses_remote_hosts_tls_and_bad_input() {
    let base = ["send", "--provider", "stripe", "--secret", STRIPE_SECRET];
    for url in [
        "https://127.0.0.1:1/x",
        "http://192.0.2.1:80/x",
        "127.0.0.1:1",
    ] {
        let out = run(&[&base[..], &["--url", url]].concat(), &[]).await;
        assert_code(&out, 2);
    }
    // --event-id cannot rewrite the id inside a Stripe body file.
    let file = std::env::temp_dir().join(format!("{}.json", unique("body")));
    std::fs::write(&file, br#"{"id":"evt_file"}"#).unwrap();
    let out = run(
        &[
            &base[..],
            &["--url", "http://127.0.0.1:1/x", "--event-id", "x"],
            &["--body-file", file.to_str().unwrap()],
        ]
        .concat(),
        &[],
    )
    .await;
    assert_code(&out, 2);
    let _ = std::fs::remove_file(file);
    // Nobody listening: the delivery fails, exit 1.
    let out = run(
        &[&base[..], &["--url", "http://127.0.0.1:1/x"]].concat(),
        &[],
    )
    .await;
    assert_code(&out, 1);
    assert!(
        stdout(&out).contains("failed: cannot connect"),
        "{}",
        stdout(&out)
    );
    // An unknown provider or a schedule knob without a schedule: clap's usage error.
    let out = run(
        &[
            "send",
            "--provider",
            "pigeon",
            "--secret",
            "s",
            "--url",
            "http://127.0.0.1:1/",
        ],
        &[],
    )
    .await;
    assert_code(&out, 2);
    let out = run(
        &[
            &base[..],
            &["--url", "http://127.0.0.1:1/", "--compress", "10"],
        ]
        .concat(),
        &[],
    )
    .await;
    assert_code(&out, 2);
}

/// Store options that do not fit the store are usage errors (exit 2), like an
/// unknown scheme, and a bad table name sends no one to `migrate`.
#[tokio::test]
async fn store_options_that_do_not_fit_are_usage_errors() {
    let out = run(&["inspect", "--store", "memory:", "--table", "t", "x"], &[]).await;
    assert_code(&out, 2);
    let dir = std::env::temp_dir().join(unique("wg-cli-table"));
    let path = format!("sqlite:{}.db", dir.display());
    let out = run(
        &["inspect", "--store", &path, "--table", "no-dashes", "x"],
        &[],
    )
    .await;
    assert_code(&out, 2);
    assert!(!stderr(&out).contains("migrate"), "{}", stderr(&out));
    let out = run(&["inspect", "--store", "sqlite:a.db?colour=blue", "x"], &[]).await;
    assert_code(&out, 2);
}

// ---------------------------------------------------------------------------
// Listing commands: list, dead-letters, resolve
// ---------------------------------------------------------------------------

/// `list`, `dead-letters` and `resolve` against the store at `url`, and a
/// handler error holding terminal escapes shown escaped.
async fn listing_flow(url: &str, table: Option<&str>) {
    let ns = unique("cli-list");
    let mut envs = vec![
        ("WEBHOOK_GUARD_STORE_URL", url),
        ("WEBHOOK_GUARD_NAMESPACE", ns.as_str()),
    ];
    if let Some(t) = table {
        envs.push(("WEBHOOK_GUARD_TABLE", t));
    }
    assert_code(&run(&["migrate"], &envs).await, 0);
    let mut parsed = StoreUrl::parse(url).unwrap();
    if let Some(t) = table {
        parsed = parsed.table(t);
    }
    let opened = parsed.open().await.unwrap();
    let store = opened.shared();
    let store = &*store;
    let now = Utc::now();
    let (h, s) = (TimeDelta::hours, TimeDelta::seconds);

    // Three failed (one with a hostile error), one completed, one escalated.
    let hostile = "boom \u{1b}[2J\u{1b}]0;pwned\u{7}\r\nforged line";
    for (i, id) in ["fail-a", "fail-b", "evil"].iter().enumerate() {
        let at = now - s(30 - i as i64);
        let t = claim(store, &ns, id, at, at + h(1), at + h(2)).await;
        let note = FailureNote {
            at,
            error: if *id == "evil" { hostile } else { "timeout" }.into(),
        };
        let end = RecordState::Failed;
        finish(store, &ns, id, t, end, &[note], at, at + h(2)).await;
    }
    let t = claim(store, &ns, "done", now, now + h(1), now + h(2)).await;
    finish(
        store,
        &ns,
        "done",
        t,
        RecordState::Completed,
        &[],
        now,
        now + h(2),
    )
    .await;
    let t = claim(store, &ns, "esc", now, now + h(1), now + h(2)).await;
    finish(
        store,
        &ns,
        "esc",
        t,
        RecordState::Escalated,
        &[],
        now,
        now + h(2),
    )
    .await;

    // inspect and list show the hostile error escaped: no ESC, BEL or CR reaches
    // the terminal, and the forged line stays on the error's line.
    let out = run(&["inspect", "evil"], &envs).await;
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(!text.contains(['\u{1b}', '\u{7}', '\r']), "{text:?}");
    assert!(text.contains("boom \\u{1b}[2J"), "{text}");
    assert!(!text.lines().any(|l| l.starts_with("forged")), "{text}");

    let out = run(&["list", "--state", "failed"], &envs).await;
    assert_code(&out, 0);
    let text = stdout(&out);
    let ids: Vec<_> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(ids[..3], ["evil", "fail-b", "fail-a"], "{text}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(text.contains("3 records; end of the listing"), "{text}");

    // Paging with --after, in JSON.
    let out = run(
        &[
            "list",
            "--state",
            "failed,completed",
            "--limit",
            "2",
            "--json",
        ],
        &envs,
    )
    .await;
    assert_code(&out, 0);
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let ids: Vec<_> = page["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(ids, ["done", "evil"]);
    let token = page["next"].as_str().expect("a next page").to_owned();
    let out = run(
        &[
            "list",
            "--state",
            "failed,completed",
            "--after",
            &token,
            "--json",
        ],
        &envs,
    )
    .await;
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let ids: Vec<_> = page["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(ids, ["fail-b", "fail-a"]);
    assert!(page["next"].is_null());
    let out = run(
        &["list", "--prefix", "fail-", "--since", "1h", "--json"],
        &envs,
    )
    .await;
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(page["records"].as_array().unwrap().len(), 2, "{page}");
    assert_code(&run(&["list", "--state", "bogus"], &envs).await, 2);
    assert_code(&run(&["list", "--since", "yesterday"], &envs).await, 2);
    assert_code(&run(&["list", "--after", "not-a-token"], &envs).await, 2);

    // resolve: acknowledged, then resolved, shown by inspect; refused elsewhere.
    let out = run(&["resolve", "esc", "--ack", "--note", "alice"], &envs).await;
    assert_code(&out, 0);
    assert!(
        stdout(&out).contains("escalation acknowledged"),
        "{}",
        stdout(&out)
    );
    assert_code(
        &run(&["resolve", "esc", "--note", "refunded"], &envs).await,
        0,
    );
    let out = run(&["inspect", "esc"], &envs).await;
    assert!(
        stdout(&out).contains("escalation   resolved"),
        "{}",
        stdout(&out)
    );
    let out = run(&["resolve", "done"], &envs).await;
    assert_code(&out, 1);
    assert!(stderr(&out).contains("not escalated"), "{}", stderr(&out));

    // dead-letters: one dead event, listed, requeued, dead again, purged.
    let inbox = opened.inbox();
    let meta = webhook_guard::meta::EventMeta::new(Some("charge.failed".into()), None, None);
    for id in ["dl-1", "ok-1"] {
        let event = webhook_guard::inbox::NewEvent {
            key: Key::new(&ns, id),
            fingerprint: Fingerprint::of(id.as_bytes()),
            meta: &meta,
            payload: b"{}",
            now,
            expires_at: now + h(2),
        };
        inbox.enqueue(&event).await.unwrap();
    }
    let kill = |leased: Vec<webhook_guard::inbox::InboxEvent>| {
        let inbox = inbox.clone();
        let ns = ns.clone();
        async move {
            for e in leased.iter().filter(|e| e.id == "dl-1") {
                let settle = webhook_guard::inbox::Settle {
                    holder: Holder::new(Key::new(&ns, "dl-1"), e.token),
                    state: webhook_guard::inbox::InboxState::Dead,
                    next_attempt_at: now,
                    error: Some("gave up \u{1b}[31mred"),
                    now: Utc::now(),
                    expires_at: now + h(2),
                    attempt_counts: true,
                };
                let fence = inbox.settle_event(&settle).await;
                assert_eq!(fence.unwrap(), Fence::Applied);
            }
        }
    };
    kill(
        inbox
            .lease(&LeaseRequest {
                namespace: &ns,
                now,
                lease_until: now + h(1),
                limit: 10,
            })
            .await
            .unwrap(),
    )
    .await;
    let out = run(&["dead-letters", "list"], &envs).await;
    assert_code(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("dl-1") && !text.contains("ok-1"), "{text}");
    assert!(text.contains("gave up \\u{1b}[31mred"), "{text}");
    assert_code(&run(&["dead-letters", "requeue", "ok-1"], &envs).await, 1);
    let out = run(&["dead-letters", "requeue", "dl-1"], &envs).await;
    assert_code(&out, 0);
    assert!(stdout(&out).contains("requeued 1"), "{}", stdout(&out));
    let e = inbox
        .get_event(Key::new(&ns, "dl-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (e.state, e.attempts),
        (webhook_guard::inbox::InboxState::Pending, 0)
    );
    kill(
        inbox
            .lease(&LeaseRequest {
                namespace: &ns,
                now: Utc::now(),
                lease_until: now + h(1),
                limit: 10,
            })
            .await
            .unwrap(),
    )
    .await;
    let out = run(
        &["dead-letters", "purge", "--all", "--prefix", "dl-"],
        &envs,
    )
    .await;
    assert_code(&out, 0);
    assert!(stdout(&out).contains("purged 1"), "{}", stdout(&out));
    assert!(inbox
        .get_event(Key::new(&ns, "dl-1"))
        .await
        .unwrap()
        .is_none());
    assert!(inbox
        .get_event(Key::new(&ns, "ok-1"))
        .await
        .unwrap()
        .is_some());
    assert_code(&run(&["dead-letters", "requeue"], &envs).await, 2);
}

#[tokio::test]
async fn listing_commands_on_sqlite() {
    let path = fresh_sqlite("webhook-guard-cli-list");
    listing_flow(&format!("sqlite://{}", path.display()), None).await;
    support::backends::remove_sqlite(&path);
}

#[tokio::test]
async fn listing_commands_on_postgres() {
    let Some(url) = support::server_url("WEBHOOK_GUARD_POSTGRES_URL") else {
        return;
    };
    listing_flow(&url, Some("webhook_guard_cli_test")).await;
}

/// `send` signs like each of the presets for Zoom, Meta, Twitch, Discord, Twilio and
/// HubSpot (the last two over the URL it posts to, as the receiver is configured),
/// and its duplicate is answered as one.
#[tokio::test]
async fn send_signs_like_the_newer_presets() {
    use webhook_guard::verify::{Discord, HubSpot, Meta, Twilio, Twitch, Zoom};
    // RFC 8032's first key pair: `send` signs with the seed, the route holds the key.
    const SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let url = |p: &str| format!("http://{addr}/{p}");
    let app = Router::new();
    let (app, zoom) = route(
        app,
        "/zoom",
        Zoom::new(["zoom-secret-token-22ch"]).unwrap(),
        0,
    );
    let (app, meta) = route(
        app,
        "/meta",
        Meta::new(["meta-app-secret-0123"]).unwrap(),
        0,
    );
    let (app, twitch) = route(app, "/twitch", Twitch::new(["twitch-secret"]).unwrap(), 0);
    let discord_key = Discord::public_key(SEED).unwrap();
    let (app, discord) = route(app, "/discord", Discord::new([discord_key]).unwrap(), 0);
    let twilio_verifier = Twilio::new(&url("twilio"), ["twilio-auth-token"]).unwrap();
    let (app, twilio) = route(app, "/twilio", twilio_verifier, 0);
    let hubspot_verifier = HubSpot::new(&url("hubspot"), ["hubspot-client-secret"]).unwrap();
    let (app, hubspot) = route(app, "/hubspot", hubspot_verifier, 0);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    for (provider, secret, runs, query) in [
        ("zoom", "zoom-secret-token-22ch", zoom, ""),
        ("meta", "meta-app-secret-0123", meta, ""),
        ("twitch", "twitch-secret", twitch, ""),
        ("discord", SEED, discord, ""),
        ("twilio", "twilio-auth-token", twilio, "?tenant=a%3Ab"),
        (
            "hubspot",
            "hubspot-client-secret",
            hubspot,
            "?portal=1&x=a%3Ab",
        ),
    ] {
        let target = format!("{}{query}", url(provider));
        let args = [
            "send",
            "--provider",
            provider,
            "--url",
            &target,
            "--duplicates",
            "1",
        ];
        let out = run(&args, &[("WEBHOOK_GUARD_SECRET", secret)]).await;
        let text = stdout(&out);
        assert_code(&out, 0);
        assert_eq!(count(&text, "processed"), 1, "{provider}: {text}");
        assert_eq!(count(&text, "duplicate"), 1, "{provider}: {text}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{provider}");
        let out = run(
            &args,
            &[(
                "WEBHOOK_GUARD_SECRET",
                "0000000000000000000000000000000000000000000000000000000000000001",
            )],
        )
        .await;
        assert_code(&out, 1);
        assert!(
            stdout(&out).contains("] 401 "),
            "{provider}: {}",
            stdout(&out)
        );
    }
}
