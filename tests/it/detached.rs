//! Handlers that outlive their request: a handler slower than the provider's
//! timeout, and a drain at shutdown. (A client that hangs up mid-handler is one of
//! the scenarios every integration shares, in `web_cases`.)

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use support::http_client::post;
use support::web::{body, serve, sign, SIGNATURE_HEADER};
use webhook_guard::integrations::axum::guarded;
use webhook_guard::store::RecordState;
use webhook_guard::{EventId, MemoryStore, OwnedEvent, WebhookGuard};

fn guard(store: MemoryStore, deadline: Option<Duration>) -> WebhookGuard {
    let builder = WebhookGuard::builder()
        .namespace("test")
        .store(store)
        .verifier(support::web::verifier())
        .event_id(EventId::json_field(["id"]));
    match deadline {
        Some(deadline) => builder.answer_deadline(deadline),
        None => builder.no_answer_deadline(),
    }
    .build()
    .unwrap()
}

/// Waits (at most 10 s) until `id`'s record is in `state`.
async fn reaches(guard: &WebhookGuard, id: &str, state: RecordState) -> bool {
    for _ in 0..200 {
        let now = guard.inspect(id).await.unwrap().map(|r| r.state);
        if now == Some(state) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// A handler slower than the answer deadline: the provider is answered 409
/// (`InProgress`, with `Retry-After`) before its timeout while the handler runs
/// on; the retry after it ended is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_the_deadline_is_answered_in_progress_and_runs_on() {
    let guard = guard(MemoryStore::new(), Some(Duration::from_millis(300)));
    let release = Arc::new(tokio::sync::Notify::new());
    let finished = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (release, finished) = (release.clone(), finished.clone());
        move |_event: OwnedEvent| {
            let (release, finished) = (release.clone(), finished.clone());
            async move {
                release.notified().await;
                finished.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }
    };
    let addr = serve(Router::new().route("/webhooks", guarded(guard.clone(), handler))).await;
    let body = body("evt_slow");
    let sig = sign(&body);

    let first = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &body).await;
    assert_eq!(first.status, 409, "{first:?}");
    assert_eq!(first.json()["outcome"], "in_progress");
    assert!(first.header("retry-after").is_some());
    assert_eq!(finished.load(Ordering::SeqCst), 0, "answered while it runs");

    release.notify_one();
    assert!(reaches(&guard, "evt_slow", RecordState::Completed).await);
    let retry = post(addr, "/webhooks", &[(SIGNATURE_HEADER, &sig)], &body).await;
    assert_eq!(retry.json()["outcome"], "duplicate", "{retry:?}");
    assert_eq!(finished.load(Ordering::SeqCst), 1);
}

/// The Stripe preset's default deadline is four fifths of Stripe's 5 s.
#[test]
fn the_stripe_preset_knows_its_providers_timeout() {
    use webhook_guard::verify::{Stripe, Verifier};
    let stripe = Stripe::new([webhook_guard::verify::Provider::Stripe.sample_secret()]).unwrap();
    assert_eq!(stripe.answer_timeout(), Some(Duration::from_secs(5)));
}

/// At shutdown, `drain` waits for the handlers whose requests are gone: every one
/// ends and is recorded; with no grace, it says how many still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_the_handlers_whose_requests_are_gone() {
    let guard = guard(MemoryStore::new(), None);
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let mut requests = Vec::new();
    for i in 0..5 {
        let (guard, release, finished) = (guard.clone(), release.clone(), finished.clone());
        let body = bytes::Bytes::from(body(&format!("evt_drain_{i}")));
        let headers = [(SIGNATURE_HEADER.to_owned(), sign(&body))];
        requests.push(tokio::spawn(async move {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            guard
                .handle_spawned(&headers, body, move |_event| async move {
                    let _permit = release.acquire().await.unwrap();
                    finished.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
                .await
        }));
    }
    // Every delivery is claimed and its handler waiting; then the requests go.
    for i in 0..5 {
        assert!(reaches(&guard, &format!("evt_drain_{i}"), RecordState::InProgress).await);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for request in &requests {
        request.abort();
    }
    assert_eq!(guard.drain(Duration::ZERO).await, 5, "five still run");
    release.add_permits(5);
    assert_eq!(guard.drain(Duration::from_secs(10)).await, 0);
    assert_eq!(finished.load(Ordering::SeqCst), 5);
    for i in 0..5 {
        let record = guard
            .inspect(&format!("evt_drain_{i}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.state, RecordState::Completed);
    }
}

/// The shutdown test's guard: SQLite at `path`, ids in the body, answered at a
/// 100 ms deadline.
#[cfg(feature = "sqlite")]
async fn shutdown_guard(path: &str) -> WebhookGuard {
    let store = webhook_guard::store::SqliteStore::open(path).await.unwrap();
    WebhookGuard::builder()
        .store(store)
        .verifier(webhook_guard::verify::NoVerification)
        .event_id(EventId::json_field(["id"]))
        .answer_deadline(Duration::from_millis(100))
        .build()
        .unwrap()
}

/// The child of the shutdown test: an axum server whose handlers take a second and
/// log their run to a file; on SIGTERM it stops taking requests, drains the
/// running handlers and exits. Run by the parent with `--ignored`.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child of the shutdown test, run by it"]
async fn shutdown_child() {
    use std::io::Write as _;
    let db = std::env::var("WG_SHUTDOWN_DB").expect("run by the shutdown test");
    let log = std::env::var("WG_SHUTDOWN_LOG").unwrap();
    let guard = shutdown_guard(&db).await;
    let handler = move |event: OwnedEvent| {
        let log = log.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap();
            // One write per line: `writeln!` writes the id and the newline apart, and
            // two handlers ending together would interleave them.
            file.write_all(format!("{}\n", event.id()).as_bytes())
                .unwrap();
            Ok(())
        }
    };
    let app = Router::new().route("/webhooks", guarded(guard.clone(), handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("LISTENING {}", listener.local_addr().unwrap());
    std::io::stdout().flush().unwrap();
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            term.recv().await;
        })
        .await
        .unwrap();
    let running = guard.drain(Duration::from_secs(20)).await;
    println!("DRAINED {running}");
    std::io::stdout().flush().unwrap();
}

/// SIGTERM while ten handlers run, after each delivery was already answered at
/// the deadline: the process drains them before it exits, so every event ran once
/// and is recorded; after a restart each redelivery is a duplicate.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_handlers_run_loses_and_doubles_nothing() {
    use std::io::BufRead as _;
    let unique = webhook_guard::store::FencingToken::random().0;
    let db = std::env::temp_dir().join(format!("wg-shutdown-{unique:016x}.db"));
    let log = std::env::temp_dir().join(format!("wg-shutdown-{unique:016x}.log"));
    let name = match module_path!().split_once("::") {
        Some((_crate, module)) => format!("{module}::shutdown_child"),
        None => "shutdown_child".to_owned(),
    };
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            &name,
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("WG_SHUTDOWN_DB", &db)
        .env("WG_SHUTDOWN_LOG", &log)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let said = |word: &str| -> String {
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("the child did not say {word}"));
            if let Some((_, rest)) = line.split_once(word) {
                return rest.trim().to_owned();
            }
        }
    };
    let addr: std::net::SocketAddr = said("LISTENING ").parse().unwrap();

    let ids: Vec<String> = (0..10).map(|i| format!("evt_term_{i}")).collect();
    let answers = futures_util::future::join_all(
        ids.iter()
            .map(|id| async move { post(addr, "/webhooks", &[], &body(id)).await.status }),
    )
    .await;
    assert!(
        answers.iter().all(|&s| s == 409),
        "answered at the deadline: {answers:?}"
    );
    let ran = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        ran().lines().count() < 10,
        "the handlers still run: {}",
        ran()
    );

    let term = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    assert_eq!(said("DRAINED "), "0", "every handler ended before the exit");
    assert!(child.wait().unwrap().success());
    let mut logged: Vec<String> = ran().lines().map(str::to_owned).collect();
    logged.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(logged, expected, "each event ran exactly once");

    // A new process on the same database: every redelivery is a duplicate.
    let guard = shutdown_guard(db.to_str().unwrap()).await;
    for id in &ids {
        let outcome = guard
            .handle(
                &[("content-type", "application/json")],
                &body(id),
                |_| async { Ok(()) },
            )
            .await;
        assert_eq!(
            outcome.kind(),
            webhook_guard::outcome::OutcomeKind::Duplicate,
            "{id}"
        );
    }
    assert_eq!(ran().lines().count(), 10, "nothing ran again");
    println!("RESULT scenario=sigterm_during_handlers events=10 answered_409=10 drained=10 ran_once=10 lost=0 twice=0");
    drop(guard);
    for path in [log.clone(), db.clone()] {
        let _ = std::fs::remove_file(path);
    }
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
}
