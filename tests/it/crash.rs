//! A host killed with SIGKILL while it holds a lease.
//!
//! The parent test re-runs this test binary as a child (`WG_CRASH_ROLE` selects the
//! child role in `crash_child`, which is a no-op otherwise). The child claims an event
//! through SQLite or PostgreSQL, prints `CLAIMED` and blocks in its handler; the
//! parent kills it with SIGKILL (no destructor, no release runs) and plays the
//! provider's retries on a manual clock: within the lease they are `InProgress` and
//! run nothing; after it, one of them runs the handler, exactly once.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use support::backends::{self, Backend};
use webhook_guard::clock::ManualClock;
use webhook_guard::inbox::InboxStore as _;
use webhook_guard::outcome::OutcomeKind;
use webhook_guard::store::DynProcessedStore;
use webhook_guard::store::RecordState;
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, MemoryStore, WebhookGuard};

const T0: i64 = 1_700_000_000;
const LEASE: Duration = Duration::from_secs(60);
const BODY: &[u8] = br#"{"id":"evt_crash","type":"order.paid"}"#;

fn guard(store: Arc<DynProcessedStore>, clock: &ManualClock) -> WebhookGuard {
    WebhookGuard::builder()
        .store(store)
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .lease(LEASE)
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn start() -> DateTime<Utc> {
    DateTime::from_timestamp(T0, 0).unwrap()
}

/// The child role: open the store the parent names, claim, say so, block forever.
/// Not a test of its own (ignored): the parent runs it with `--ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child of the crash tests, run by them"]
async fn crash_child() {
    let role = std::env::var("WG_CRASH_ROLE").expect("run by a crash test, with WG_CRASH_ROLE");
    let target = std::env::var("WG_CRASH_TARGET").unwrap();
    let store: Arc<DynProcessedStore> = match role.as_str() {
        "sqlite" => Arc::new(
            webhook_guard::store::SqliteStore::open(&target)
                .await
                .unwrap(),
        ),
        "postgres" => {
            let url = std::env::var("WEBHOOK_GUARD_POSTGRES_URL").unwrap();
            let pool = webhook_guard::store::postgres::sqlx::PgPool::connect(&url)
                .await
                .unwrap();
            Arc::new(webhook_guard::store::PostgresStore::with_table(pool, &target).unwrap())
        }
        "inbox-sqlite" => {
            // The inbox worker's role: lease the stored event, say so, block forever.
            let store = webhook_guard::store::SqliteStore::open(&target)
                .await
                .unwrap();
            let clock = ManualClock::new(start());
            let worker = inbox_guard(store, &clock)
                .worker(|_event| async {
                    println!("LEASED");
                    use std::io::Write as _;
                    std::io::stdout().flush().unwrap();
                    std::future::pending::<()>().await;
                    Ok(())
                })
                .unwrap()
                .lease(LEASE);
            let _ = worker.run_once().await;
            unreachable!("the handler never returns");
        }
        other => panic!("unknown role {other}"),
    };
    let clock = ManualClock::new(start());
    let guard = guard(store, &clock);
    let _ = guard
        .handle(&[("content-type", "application/json")], BODY, |_| async {
            println!("CLAIMED");
            use std::io::Write as _;
            std::io::stdout().flush().unwrap();
            std::future::pending::<()>().await;
            Ok(())
        })
        .await;
    unreachable!("the handler never returns");
}

/// `crash_child`'s name as the test harness lists it: its module path within this
/// test binary.
fn child_test_name() -> String {
    match module_path!().split_once("::") {
        Some((_crate, module)) => format!("{module}::crash_child"),
        None => "crash_child".to_owned(),
    }
}

/// Runs this test binary's `crash_child` in `role` on `target`, waits until it
/// prints `marker`, and kills it with SIGKILL (no destructor, no release runs).
async fn sigkill_child_once(role: &str, target: &str, marker: &'static str) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            child_test_name().as_str(),
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("WG_CRASH_ROLE", role)
        .env("WG_CRASH_TARGET", target)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reached = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.trim_end().ends_with(marker))
    })
    .await
    .unwrap();
    assert!(reached, "the child printed {marker} before being killed");
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success(), "killed, not finished: {status:?}");
}

/// A new worker on `guard`'s inbox: nothing is leased again within the 60 s lease of
/// the dead one; right after it, the event is processed, exactly once.
async fn finish_after_the_lease(guard: &WebhookGuard, clock: &ManualClock) {
    let done = Arc::new(AtomicUsize::new(0));
    let second = {
        let done = done.clone();
        guard
            .worker(move |_event| {
                let done = done.clone();
                async move {
                    done.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .unwrap()
            .lease(LEASE)
    };
    clock.advance(TimeDelta::seconds(30));
    assert_eq!(
        second.run_once().await.unwrap(),
        0,
        "nothing leased within the lease"
    );
    clock.advance(TimeDelta::seconds(31));
    assert_eq!(second.run_once().await.unwrap(), 1);
    assert_eq!(second.run_once().await.unwrap(), 0);
    assert_eq!(done.load(Ordering::SeqCst), 1, "finished exactly once");
}

async fn killed_holder(backend: Backend) {
    let Some((store, cleanup)) = backends::store(backend, 2, None).await else {
        return;
    };
    let (role, target) = match &cleanup {
        backends::Cleanup::File(path) => ("sqlite", path.display().to_string()),
        backends::Cleanup::Table { table, .. } => ("postgres", table.clone()),
        other => panic!("{other:?}"),
    };
    sigkill_child_once(role, &target, "CLAIMED").await;

    let clock = ManualClock::new(start());
    let guard = guard(store, &clock);
    let runs = AtomicUsize::new(0);
    let deliver = || async {
        guard
            .handle(&[("content-type", "application/json")], BODY, |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .await
            .kind()
    };
    let rec = guard
        .inspect("evt_crash")
        .await
        .unwrap()
        .expect("the claim survived");
    assert_eq!(rec.state, RecordState::InProgress);
    // Retries inside the lease: the dead holder still owns it.
    clock.advance(TimeDelta::seconds(30));
    assert_eq!(deliver().await, OutcomeKind::InProgress);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(guard.stuck(10).await.unwrap().len(), 0);
    // After it: listed as stuck, then taken over and processed once.
    clock.advance(TimeDelta::seconds(31));
    assert_eq!(guard.stuck(10).await.unwrap().len(), 1);
    assert_eq!(deliver().await, OutcomeKind::Processed);
    assert_eq!(deliver().await, OutcomeKind::Duplicate);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "exactly once after the crash"
    );
    let rec = guard.inspect("evt_crash").await.unwrap().unwrap();
    assert_eq!(
        (rec.state, rec.attempts, rec.failures),
        (RecordState::Completed, 2, 1),
        "the crashed attempt is counted as a failure"
    );
    println!(
        "RESULT backend={} scenario=sigkill_holder deliveries=4 duplicates=3 faults=SIGKILL handler_runs=1(+1 killed) lost=0 twice=0",
        backend.name()
    );
    cleanup.run().await;
}

backends::per_backend!(killed_holder:
    sigkill_while_holding_a_lease_sqlite => Sqlite,
    sigkill_while_holding_a_lease_postgres => Postgres,
);

fn inbox_guard(store: webhook_guard::store::SqliteStore, clock: &ManualClock) -> WebhookGuard {
    WebhookGuard::builder()
        .store(store.clone())
        .inbox(store)
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// The inbox worker's analogue, a real process kill: the event is accepted into an
/// inbox on SQLite, a child process's worker leases it and blocks in the handler, the
/// parent kills the child with SIGKILL; after the lease a new worker finishes the
/// event, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_sigkill_is_finished_by_another_after_the_lease() {
    let path = std::env::temp_dir().join(format!(
        "wg-crash-inbox-{:016x}.db",
        webhook_guard::store::FencingToken::random().0
    ));
    let store = webhook_guard::store::SqliteStore::open(&path)
        .await
        .unwrap();
    let clock = ManualClock::new(start());
    let guard = inbox_guard(store.clone(), &clock);
    let o = guard
        .accept(&[("content-type", "application/json")], BODY)
        .await;
    assert_eq!(o.kind(), OutcomeKind::Accepted);

    sigkill_child_once("inbox-sqlite", &path.display().to_string(), "LEASED").await;

    let key = webhook_guard::store::Key::new("default", "evt_crash");
    let ev = store.get_event(key).await.unwrap().unwrap();
    assert_eq!(
        ev.state,
        webhook_guard::inbox::InboxState::Running,
        "the dead worker's lease"
    );
    finish_after_the_lease(&guard, &clock).await;
    let ev = store.get_event(key).await.unwrap().unwrap();
    assert_eq!(ev.state, webhook_guard::inbox::InboxState::Done);
    assert_eq!(ev.attempts, 2);
    drop((guard, store));
    crate::support::backends::remove_sqlite(&path);
}

/// The same with the worker task aborted mid-handler in process (the memory inbox,
/// which a process kill would erase): its futures are dropped without settling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_handler_is_finished_by_another_after_the_lease() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(start());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .clock(clock.clone())
        .build()
        .unwrap();
    let o = guard
        .accept(&[("content-type", "application/json")], BODY)
        .await;
    assert_eq!(o.kind(), OutcomeKind::Accepted);

    let entered = Arc::new(tokio::sync::Notify::new());
    let blocked = {
        let entered = entered.clone();
        guard
            .worker(move |_event| {
                let entered = entered.clone();
                async move {
                    entered.notify_one();
                    std::future::pending::<()>().await;
                    Ok(())
                }
            })
            .unwrap()
            .lease(LEASE)
            .poll_interval(Duration::from_millis(10))
            .spawn()
    };
    entered.notified().await;
    blocked.abort(); // the worker dies holding the event

    finish_after_the_lease(&guard, &clock).await;
    let key = webhook_guard::store::Key::new("default", "evt_crash");
    let ev = webhook_guard::inbox::InboxStore::get_event(&store, key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev.state, webhook_guard::inbox::InboxState::Done);
    assert_eq!(ev.attempts, 2);
}
