//! No crash point of an escalation or a permanent failure leaves it unannounced.
//!
//! Once its handler has failed for good, a delivery makes four store calls: (1) its
//! lease renewed, then its object settled failed; (2) the follow-up marker
//! claimed; (3) the record finished `Escalated` / `PermanentFailure`, then the hook
//! called and the reconciler asked; (4) the marker released. [`CrashAt`] stops the
//! "process" at each of these calls, before the store applies it or after (its
//! reply lost with the process), and leaves every later call of that process
//! hanging. A new guard on the same store then plays the provider's redelivery —
//! or first its sweeper — after the leases ran out: the hook has been called, the
//! object is listed by `reconcile_stale`, the record holds the failure, and no
//! handler ran again once the record held it.
//!
//! The process-level test at the bottom does the same with a real SIGKILL of a
//! child process on PostgreSQL and Redis, right after the record was written.

use crate::support;

use std::future::Future;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use support::backends::{self, Backend};
use webhook_guard::clock::ManualClock;
use webhook_guard::hooks::Escalation;
use webhook_guard::meta::MetaExtractor;
use webhook_guard::ordering::{FailedPage, OrderingStore};
use webhook_guard::outcome::OutcomeKind;
use webhook_guard::reconcile::{ReconcileRequest, Reconciler};
use webhook_guard::store::{
    async_trait, BoxError, Claim, ClaimRequest, Deleted, DynProcessedStore, Fence, Finish, Holder,
    Key, ProcessedStore, Record, RecordState, Renew, StoreError,
};
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, HandlerError, Hooks, WebhookGuard};

const T0: i64 = 1_700_000_000;
const LEASE: Duration = Duration::from_secs(60);

fn start() -> DateTime<Utc> {
    DateTime::from_timestamp(T0, 0).unwrap()
}

/// How the handler fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Retryably, at the guard's threshold (1): an escalation.
    Escalation,
    /// Permanently.
    Permanent,
}

impl Kind {
    fn error(self) -> HandlerError {
        match self {
            Self::Escalation => HandlerError::retryable("the ledger is down"),
            Self::Permanent => HandlerError::permanent("unknown account"),
        }
    }

    fn outcome(self) -> OutcomeKind {
        match self {
            Self::Escalation => OutcomeKind::Escalated,
            Self::Permanent => OutcomeKind::PermanentFailure,
        }
    }

    /// The guard's `escalate_after`: 1 for an escalation at the first failure; the
    /// default for a permanent failure (else a claim that takes over a crashed
    /// attempt would escalate it, counting the crash as its one failure).
    fn escalate_after(self) -> u32 {
        match self {
            Self::Escalation => 1,
            Self::Permanent => 5,
        }
    }

    fn state(self) -> RecordState {
        match self {
            Self::Escalation => RecordState::Escalated,
            Self::Permanent => RecordState::PermanentFailure,
        }
    }
}

/// Where the process dies: at the `call`th store call after its handler returned,
/// before the store applies it, or after (`applied`: the reply is lost).
#[derive(Debug, Clone, Copy)]
struct Point {
    call: usize,
    applied: bool,
}

impl Point {
    fn all() -> impl Iterator<Item = Point> {
        (1..=4).flat_map(|call| [false, true].map(|applied| Point { call, applied }))
    }

    /// Whether the record holds the failure for good when the process dies.
    fn recorded(self) -> bool {
        self.call > 3 || (self.call == 3 && self.applied)
    }

    /// Whether the dead process called the hook (it does right after call 3).
    fn announced(self) -> bool {
        self.call == 4
    }

    /// Whether the dead process released its marker: nothing is left owing.
    fn released(self) -> bool {
        self.call == 4 && self.applied
    }
}

/// A store that stops answering at a [`Point`], as a process killed there would:
/// that call and every later one hang forever (a call it lets through first is
/// applied by the real store).
#[derive(Debug)]
struct CrashAt {
    inner: Arc<DynProcessedStore>,
    point: Point,
    armed: AtomicBool,
    calls: AtomicUsize,
    dead: AtomicBool,
    crashed: tokio::sync::Notify,
}

impl CrashAt {
    fn new(inner: Arc<DynProcessedStore>, point: Point) -> Self {
        Self {
            inner,
            point,
            armed: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
            crashed: tokio::sync::Notify::new(),
        }
    }

    /// Counts the calls from now on (the handler calls this as it returns).
    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    async fn gate<T>(&self, call: impl Future<Output = T>) -> T {
        if self.dead.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        if !self.armed.load(Ordering::SeqCst) {
            return call.await;
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n < self.point.call {
            return call.await;
        }
        if self.point.applied {
            drop(call.await);
        }
        self.dead.store(true, Ordering::SeqCst);
        self.crashed.notify_one();
        std::future::pending().await
    }
}

#[async_trait]
impl ProcessedStore for CrashAt {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.gate(self.inner.claim(request)).await
    }
    async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError> {
        self.gate(self.inner.finish(holder, finish)).await
    }
    async fn renew(&self, holder: Holder<'_>, renew: &Renew) -> Result<Fence, StoreError> {
        self.gate(self.inner.renew(holder, renew)).await
    }
    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        self.gate(self.inner.get(key)).await
    }
    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        self.gate(self.inner.delete(key, now)).await
    }
    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        self.gate(self.inner.purge_expired(now, limit)).await
    }
    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.gate(self.inner.stuck(now, limit)).await
    }
}

/// What one process's hooks were told.
#[derive(Debug, Default)]
struct Announced {
    /// Per escalation: the id, whether it was resumed, the body's length.
    escalations: Mutex<Vec<(String, bool, usize)>>,
    /// Per permanent failure: the id and the error.
    permanent: Mutex<Vec<(String, String)>>,
}

impl Announced {
    fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Escalation => self.escalations.lock().unwrap().len(),
            Kind::Permanent => self.permanent.lock().unwrap().len(),
        }
    }
}

impl Hooks for Announced {
    fn on_escalation(&self, e: &Escalation<'_>) {
        let seen = (e.key.id.to_owned(), e.resumed, e.body.len());
        self.escalations.lock().unwrap().push(seen);
    }
    fn on_permanent_failure(&self, key: Key<'_>, error: &str) {
        let seen = (key.id.to_owned(), error.to_owned());
        self.permanent.lock().unwrap().push(seen);
    }
}

/// A reconciler whose provider API is down: the objects stay listed for
/// `reconcile_stale`, and the calls are counted.
#[derive(Debug, Default)]
struct Refusing(AtomicUsize);

#[async_trait]
impl Reconciler for Refusing {
    async fn reconcile(&self, _: &ReconcileRequest) -> Result<(), BoxError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err("the provider's API is down".into())
    }
}

/// One process: its guard and what its hooks and reconciler saw.
struct Process {
    guard: WebhookGuard,
    hooks: Arc<Announced>,
    reconciler: Arc<Refusing>,
}

fn process(
    store: Arc<DynProcessedStore>,
    ordering: Arc<dyn OrderingStore>,
    clock: &ManualClock,
    kind: Kind,
) -> Process {
    let hooks = Arc::new(Announced::default());
    let reconciler = Arc::new(Refusing::default());
    let guard = WebhookGuard::builder()
        .store(store)
        .ordering(ordering)
        .reconciler(reconciler.clone())
        .event_meta(MetaExtractor::stripe())
        .verifier(NoVerification)
        .event_id(EventId::json_field(["id"]))
        .escalate_after(kind.escalate_after())
        .lease(LEASE)
        .clock(clock.clone())
        .hooks(hooks.clone())
        .build()
        .unwrap();
    Process {
        guard,
        hooks,
        reconciler,
    }
}

/// A Stripe-shaped event of object `in_<n>`, created before [`start`].
fn body(n: usize) -> Vec<u8> {
    let created = T0 - 10;
    format!(
        r#"{{"id":"evt_{n}","type":"invoice.payment_failed","created":{created},"data":{{"object":{{"id":"in_{n}"}}}}}}"#
    )
    .into_bytes()
}

/// Delivers `body` to `guard` with a handler that counts its runs in `runs` and
/// fails as `kind`, calling `before` as it returns.
async fn deliver(
    guard: &WebhookGuard,
    body: &[u8],
    kind: Kind,
    runs: &AtomicUsize,
    before: impl FnOnce(),
) -> OutcomeKind {
    let headers = [("content-type", "application/json")];
    let outcome = guard
        .handle(&headers, body, |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            before();
            Err(kind.error())
        })
        .await;
    outcome.kind()
}

/// Waits (at most 10 s) until the background reconciles of `process` reach `n`.
async fn reconciled(process: &Process, n: usize) -> usize {
    for _ in 0..1000 {
        if process.reconciler.0.load(Ordering::SeqCst) >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    process.reconciler.0.load(Ordering::SeqCst)
}

/// One crash: the handler of event `n` fails as `kind`, the process dies at `point`;
/// a new process on the same store, after the leases, sweeps first when
/// `via_sweeper`, then is redelivered the event twice.
async fn crash_once(
    backend: Backend,
    store: &Arc<DynProcessedStore>,
    ordering: &Arc<dyn OrderingStore>,
    (kind, point, via_sweeper): (Kind, Point, bool),
    n: usize,
) {
    let (id, body) = (format!("evt_{n}"), body(n));
    let case = format!(
        "{kind:?} crash at call {} (applied: {}), sweeper: {via_sweeper}",
        point.call, point.applied
    );
    let clock = ManualClock::new(start());

    // The process that dies.
    let crash = Arc::new(CrashAt::new(store.clone(), point));
    let dying = process(crash.clone(), ordering.clone(), &clock, kind);
    let runs_before = Arc::new(AtomicUsize::new(0));
    let delivery = {
        let (guard, crash, body, runs) = (
            dying.guard.clone(),
            crash.clone(),
            body.clone(),
            runs_before.clone(),
        );
        tokio::spawn(async move { deliver(&guard, &body, kind, &runs, || crash.arm()).await })
    };
    let died = tokio::time::timeout(Duration::from_secs(10), crash.crashed.notified()).await;
    assert!(died.is_ok(), "{case}: the process reached its crash point");
    assert_eq!(runs_before.load(Ordering::SeqCst), 1, "{case}");
    // Whatever it had spawned may still run; nothing it does reaches the store.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        !delivery.is_finished(),
        "{case}: the dead process answered nothing"
    );
    delivery.abort();

    // After its leases (the record's and the marker's), a new process.
    clock.advance(TimeDelta::from_std(LEASE * 2).unwrap() + TimeDelta::seconds(1));
    let new = process(store.clone(), ordering.clone(), &clock, kind);
    let runs_after = AtomicUsize::new(0);
    if via_sweeper {
        let report = new.guard.sweeper().sweep().await.unwrap();
        let owed = point.recorded() && !point.released();
        assert_eq!(report.followed_up, usize::from(owed), "{case}: {report:?}");
        assert_eq!(
            report.stuck,
            usize::from(!point.recorded()),
            "{case}: {report:?}"
        );
    }
    let first = deliver(&new.guard, &body, kind, &runs_after, || {}).await;
    let expected = if point.recorded() {
        OutcomeKind::Duplicate
    } else {
        kind.outcome()
    };
    assert_eq!(first, expected, "{case}");
    let again = deliver(&new.guard, &body, kind, &runs_after, || {}).await;
    assert_eq!(again, OutcomeKind::Duplicate, "{case}");

    // The handler ran again only where the failure was not recorded and is not an
    // escalation (which a claim reaches again without running it).
    let rerun = !point.recorded() && kind == Kind::Permanent;
    assert_eq!(
        runs_after.load(Ordering::SeqCst),
        usize::from(rerun),
        "{case}: handler runs after the crash"
    );
    // The hook: by the dead process right after the record, by the new one where
    // the dead one left its marker held (again, if it had called it: at least once).
    assert_eq!(
        dying.hooks.count(kind),
        usize::from(point.announced()),
        "{case}"
    );
    assert_eq!(
        new.hooks.count(kind),
        usize::from(!point.released()),
        "{case}"
    );
    if kind == Kind::Escalation && !point.released() {
        let (seen_id, resumed, len) = new.hooks.escalations.lock().unwrap()[0].clone();
        assert_eq!(seen_id, id, "{case}");
        assert_eq!(resumed, point.recorded(), "{case}: resumed");
        let from_sweeper = via_sweeper && point.recorded();
        assert_eq!(
            len,
            if from_sweeper { 0 } else { body.len() },
            "{case}: the hook's body"
        );
    }
    // The reconciler was asked, and the object is listed for `reconcile_stale` (the
    // reconciler refuses, so it stays listed).
    let asked = reconciled(&new, usize::from(!point.released())).await
        + reconciled(&dying, usize::from(point.announced())).await;
    assert!(asked >= 1, "{case}: the reconciler was asked");
    let later = start() + TimeDelta::days(1);
    let failed = ordering
        .failed_objects(&FailedPage {
            namespace: new.guard.namespace(),
            before: later,
            limit: 1000,
        })
        .await
        .unwrap();
    let object = format!("in_{n}");
    assert!(
        failed.iter().any(|o| o.object == object),
        "{case}: {object} listed as failed"
    );
    let record = new.guard.inspect(&id).await.unwrap().unwrap();
    assert_eq!(record.state, kind.state(), "{case}");
    let stuck = new.guard.stuck(1000).await.unwrap();
    assert!(
        !stuck.iter().any(|r| r.id == id),
        "{case}: nothing left stuck: {stuck:?}"
    );
    println!(
        "RESULT backend={} scenario=followup_crash kind={kind:?} call={} applied={} via={} hooks={}+{} handler_reruns={} listed=yes",
        backend.name(),
        point.call,
        point.applied,
        if via_sweeper { "sweeper" } else { "redelivery" },
        dying.hooks.count(kind),
        new.hooks.count(kind),
        usize::from(rerun),
    );
}

/// Every crash point of both paths, each found by the redelivery and by the
/// sweeper, on `backend`.
async fn every_crash_point(backend: Backend) {
    let Some((store, ordering, cleanup)) = backends::ordered(backend, 4).await else {
        return;
    };
    let mut n = 0;
    for kind in [Kind::Escalation, Kind::Permanent] {
        for point in Point::all() {
            for via_sweeper in [false, true] {
                n += 1;
                crash_once(backend, &store, &ordering, (kind, point, via_sweeper), n).await;
            }
        }
    }
    cleanup.run().await;
}

backends::per_backend!(every_crash_point:
    a_crash_at_any_step_of_a_failure_for_good_leaves_it_announced_memory => Memory,
    a_crash_at_any_step_of_a_failure_for_good_leaves_it_announced_sqlite => Sqlite,
    a_crash_at_any_step_of_a_failure_for_good_leaves_it_announced_postgres => Postgres,
    a_crash_at_any_step_of_a_failure_for_good_leaves_it_announced_mariadb => MySql,
    a_crash_at_any_step_of_a_failure_for_good_leaves_it_announced_redis => Redis,
);

#[cfg(feature = "dynamodb")]
backends::per_backend!(every_crash_point:
    a_crash_at_any_step_of_a_failure_for_good_leaves_it_announced_dynamodb => DynamoDb,
);

// ---- A real process kill -------------------------------------------------------

/// A store that, once a record of the guard's namespace is finished failed for
/// good, prints `RECORDED` and hangs: the child's parent kills it there.
#[derive(Debug)]
struct StopAfterRecord(Arc<DynProcessedStore>);

#[async_trait]
impl ProcessedStore for StopAfterRecord {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.0.claim(request).await
    }
    async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError> {
        let fence = self.0.finish(holder, finish).await;
        let for_good = matches!(
            finish.state,
            RecordState::Escalated | RecordState::PermanentFailure
        );
        if for_good && holder.key.namespace == "default" {
            println!("RECORDED {fence:?}");
            std::io::stdout().flush().unwrap();
            std::future::pending::<()>().await;
        }
        fence
    }
    async fn renew(&self, holder: Holder<'_>, renew: &Renew) -> Result<Fence, StoreError> {
        self.0.renew(holder, renew).await
    }
    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        self.0.get(key).await
    }
    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        self.0.delete(key, now).await
    }
    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        self.0.purge_expired(now, limit).await
    }
    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.0.stuck(now, limit).await
    }
}

/// Opens the store the parent names: `postgres` (a table) or `redis` (a prefix).
async fn open_both(role: &str, target: &str) -> (Arc<DynProcessedStore>, Arc<dyn OrderingStore>) {
    match role {
        "postgres" => {
            let url = std::env::var("WEBHOOK_GUARD_POSTGRES_URL").unwrap();
            let pool = webhook_guard::store::postgres::sqlx::PgPool::connect(&url)
                .await
                .unwrap();
            let store =
                Arc::new(webhook_guard::store::PostgresStore::with_table(pool, target).unwrap());
            (store.clone(), store)
        }
        "redis" => {
            let url = std::env::var("WEBHOOK_GUARD_REDIS_URL").unwrap();
            let store = webhook_guard::store::RedisStore::builder()
                .prefix(target)
                .connect(url.as_str())
                .await
                .unwrap();
            let store = Arc::new(store);
            (store.clone(), store)
        }
        other => panic!("unknown role {other}"),
    }
}

/// The child: its handler fails as the parent says; its store hangs right after
/// the record of the failure is written. Run by the parent with `--ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child of the follow-up kill tests, run by them"]
async fn followup_child() {
    let role = std::env::var("WG_FOLLOWUP_ROLE").expect("run by a follow-up kill test");
    let target = std::env::var("WG_FOLLOWUP_TARGET").unwrap();
    let kind = match std::env::var("WG_FOLLOWUP_KIND").unwrap().as_str() {
        "escalation" => Kind::Escalation,
        _ => Kind::Permanent,
    };
    let (store, ordering) = open_both(&role, &target).await;
    let clock = ManualClock::new(start());
    let child = process(Arc::new(StopAfterRecord(store)), ordering, &clock, kind);
    let runs = AtomicUsize::new(0);
    deliver(&child.guard, &body(1), kind, &runs, || {}).await;
    unreachable!("the store hangs after the record");
}

/// `followup_child`'s name as the test harness lists it.
fn child_test_name() -> String {
    match module_path!().split_once("::") {
        Some((_crate, module)) => format!("{module}::followup_child"),
        None => "followup_child".to_owned(),
    }
}

async fn killed_after_the_record(backend: Backend, kind: Kind) {
    let Some((store, ordering, cleanup)) = backends::ordered(backend, 2).await else {
        return;
    };
    let (role, target) = match &cleanup {
        backends::Cleanup::Table { table, .. } => ("postgres", table.clone()),
        backends::Cleanup::Prefix { prefix, .. } => ("redis", prefix.clone()),
        other => panic!("{other:?}"),
    };
    let kind_name = match kind {
        Kind::Escalation => "escalation",
        Kind::Permanent => "permanent",
    };
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            child_test_name().as_str(),
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("WG_FOLLOWUP_ROLE", role)
        .env("WG_FOLLOWUP_TARGET", &target)
        .env("WG_FOLLOWUP_KIND", kind_name)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| Some(l.split_once("RECORDED ")?.1.trim_end().to_owned()))
    });
    let Ok(line) = tokio::time::timeout(Duration::from_secs(60), reader).await else {
        child.kill().unwrap();
        panic!("the child did not record the failure within 60 s");
    };
    let line = line.unwrap();
    // The test harness may print its own text before the child's on that line.
    assert_eq!(
        line.as_deref(),
        Some("Ok(Applied)"),
        "the child recorded the failure"
    );
    child.kill().unwrap(); // SIGKILL: no destructor, no background task runs
    assert!(!child.wait().unwrap().success());

    // What the dead process left: the record says failed for good, the marker is
    // held, the hook and the reconciler were never reached.
    let clock = ManualClock::new(start());
    let new = process(store.clone(), ordering.clone(), &clock, kind);
    let record = new.guard.inspect("evt_1").await.unwrap().unwrap();
    assert_eq!(record.state, kind.state());
    // Within the marker's lease, a redelivery is a duplicate and waits for it.
    let runs = AtomicUsize::new(0);
    clock.advance(TimeDelta::seconds(30));
    assert_eq!(
        deliver(&new.guard, &body(1), kind, &runs, || {}).await,
        OutcomeKind::Duplicate
    );
    assert_eq!(
        new.hooks.count(kind),
        0,
        "the dead process's marker is still leased"
    );
    // After it, the redelivery announces it: the hook, the object, the reconciler.
    clock.advance(TimeDelta::seconds(31));
    assert_eq!(
        deliver(&new.guard, &body(1), kind, &runs, || {}).await,
        OutcomeKind::Duplicate
    );
    assert_eq!(new.hooks.count(kind), 1, "the hook ran after the crash");
    assert_eq!(reconciled(&new, 1).await, 1, "the reconciler was asked");
    let later = start() + TimeDelta::days(1);
    let failed = ordering
        .failed_objects(&FailedPage {
            namespace: "default",
            before: later,
            limit: 10,
        })
        .await
        .unwrap();
    assert!(
        failed.iter().any(|o| o.object == "in_1"),
        "listed for reconcile_stale: {failed:?}"
    );
    assert_eq!(
        deliver(&new.guard, &body(1), kind, &runs, || {}).await,
        OutcomeKind::Duplicate
    );
    assert_eq!(new.hooks.count(kind), 1, "announced once after the crash");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no handler ran again");
    println!(
        "RESULT backend={} scenario=followup_sigkill kind={kind_name} faults=SIGKILL-after-record hooks=1 handler_reruns=0 listed=yes",
        backend.name()
    );
    cleanup.run().await;
}

async fn killed_escalation(backend: Backend) {
    killed_after_the_record(backend, Kind::Escalation).await;
}

async fn killed_permanent_failure(backend: Backend) {
    killed_after_the_record(backend, Kind::Permanent).await;
}

backends::per_backend!(killed_escalation:
    sigkill_after_recording_an_escalation_postgres => Postgres,
    sigkill_after_recording_an_escalation_redis => Redis,
);

backends::per_backend!(killed_permanent_failure:
    sigkill_after_recording_a_permanent_failure_postgres => Postgres,
    sigkill_after_recording_a_permanent_failure_redis => Redis,
);
