//! Shared helpers for the integration tests.
#![allow(dead_code, unreachable_pub)]

/// The URL of a live server from the environment variable `var`.
///
/// In CI (`CI` set) a missing variable fails the test: a missing server is a failure,
/// never a skip. Outside CI the test says clearly that it was skipped and returns `None`.
pub fn server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{var} is not set: CI requires every backend's server")
        }
        _ => {
            eprintln!("SKIPPED: {var} is not set, so this test did not run (see README: Testing)");
            None
        }
    }
}

/// A lease that ran out is taken over by the next claim (attempts and failures
/// counted, the new token stored), and the stale holder can neither renew nor
/// finish: the same check on every SQL backend, with explicit times.
pub async fn an_expired_lease_is_taken_over_and_the_stale_token_refused(
    store: &dyn webhook_guard::ProcessedStore,
) {
    use chrono::{TimeDelta, Utc};
    use webhook_guard::store::{
        Claim, ClaimRequest, Fence, FencingToken, Fingerprint, Finish, Holder, Key, RecordState,
        Renew,
    };
    let ms = |t: chrono::DateTime<Utc>| {
        chrono::DateTime::from_timestamp_millis(t.timestamp_millis()).expect("in range")
    };
    let t0 = ms(Utc::now());
    let at = |s: i64| t0 + TimeDelta::seconds(s);
    let key = Key::new("takeover", "evt_1");
    let request = |token: u64, now: i64| ClaimRequest {
        key,
        fingerprint: Fingerprint::of(b"body"),
        token: FencingToken(token),
        now: at(now),
        lease_until: at(now + 30),
        expires_at: at(now + 3600),
    };
    let (old, new) = (FencingToken(u64::MAX - 1), FencingToken(42));
    assert!(matches!(
        store.claim(&request(old.0, 0)).await.unwrap(),
        Claim::Acquired(_)
    ));
    assert!(
        matches!(store.claim(&request(new.0, 29)).await.unwrap(), Claim::Existing(r) if r.token == old),
        "the lease still holds at 29 s"
    );
    let Claim::Acquired(rec) = store.claim(&request(new.0, 30)).await.unwrap() else {
        panic!("the lease ran out at 30 s: the claim must take over");
    };
    assert_eq!((rec.attempts, rec.failures), (2, 1));
    assert_eq!(rec.token, new);
    assert_eq!(rec.lease_until, at(60));
    assert_eq!(rec.created_at, t0);
    let done = Finish {
        state: RecordState::Completed,
        failures: 1,
        history: &[],
        now: at(31),
        expires_at: at(3631),
    };
    assert_eq!(
        store
            .renew(
                Holder::new(key, old),
                &Renew {
                    lease_until: at(90),
                    expires_at: at(3700)
                }
            )
            .await
            .unwrap(),
        Fence::LeaseLost,
        "the stale holder cannot renew"
    );
    assert_eq!(
        store.finish(Holder::new(key, old), &done).await.unwrap(),
        Fence::LeaseLost,
        "the stale holder cannot finish"
    );
    assert_eq!(
        store.finish(Holder::new(key, new), &done).await.unwrap(),
        Fence::Applied
    );
    let rec = store.get(key).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.token, new);
}

/// Two guards on two stores sharing one backend (two replicas) take 1,000 concurrent
/// deliveries of 10 ids: each handler runs exactly once, every delivery is answered
/// `Processed`, `Duplicate` or `InProgress`.
pub async fn two_replicas_run_each_handler_exactly_once(
    a: impl webhook_guard::ProcessedStore,
    b: impl webhook_guard::ProcessedStore,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use webhook_guard::outcome::OutcomeKind;
    use webhook_guard::{verify::NoVerification, EventId, WebhookGuard};

    let guard = |store: Arc<dyn webhook_guard::ProcessedStore>| {
        WebhookGuard::builder()
            .store(store)
            .verifier(NoVerification)
            .event_id(EventId::header("x-id"))
            .namespace("test")
            .build()
            .expect("valid guard")
    };
    let guards = [guard(Arc::new(a)), guard(Arc::new(b))];
    let runs = Arc::new(AtomicUsize::new(0));
    let started = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000usize {
        let guard = guards[i % 2].clone();
        let runs = runs.clone();
        tasks.spawn(async move {
            let id = format!("evt_{}", i % 10);
            let headers = [("x-id", id.as_str())];
            let body = format!("{{\"id\":\"{id}\"}}");
            guard
                .handle(&headers, body.as_bytes(), |_event| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    Ok(())
                })
                .await
                .kind()
        });
    }
    let mut processed = 0;
    while let Some(kind) = tasks.join_next().await {
        match kind.expect("task") {
            OutcomeKind::Processed => processed += 1,
            OutcomeKind::Duplicate | OutcomeKind::InProgress => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    eprintln!(
        "1,000 deliveries over 10 ids, two replicas: {:?}",
        started.elapsed()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 10, "each handler ran once");
    assert_eq!(processed, 10);
}

/// Loops `purge_expired(now, 5_000)` on one task until it removes nothing, while
/// `tasks` tasks each claim 250 fresh ids `live-<task>-<i>` in namespace `purge`,
/// every one of which must be acquired: the same phase on every SQL backend. Answers
/// how many records the purge removed, and in how many calls.
pub async fn purge_beside_claims<S>(
    store: S,
    now: chrono::DateTime<chrono::Utc>,
    tasks: usize,
) -> (u64, u64)
where
    S: webhook_guard::ProcessedStore + Clone,
{
    use std::time::{Duration, Instant};

    use chrono::TimeDelta;
    use tokio::task::JoinSet;
    use webhook_guard::store::{Claim, ClaimRequest, FencingToken, Fingerprint, Key};

    let started = Instant::now();
    let purger = {
        let store = store.clone();
        tokio::spawn(async move {
            let (mut total, mut calls) = (0, 0);
            loop {
                let n = store.purge_expired(now, 5_000).await.expect("purge");
                total += n;
                calls += 1;
                if n == 0 {
                    return (total, calls);
                }
            }
        })
    };
    let mut claimers = JoinSet::new();
    for task in 0..tasks {
        let store = store.clone();
        claimers.spawn(async move {
            let mut slowest = Duration::ZERO;
            for i in 0..250 {
                let id = format!("live-{task}-{i}");
                let request = ClaimRequest {
                    key: Key::new("purge", &id),
                    fingerprint: Fingerprint::of(id.as_bytes()),
                    token: FencingToken::random(),
                    now,
                    lease_until: now + TimeDelta::minutes(5),
                    expires_at: now + TimeDelta::hours(72),
                };
                let t = Instant::now();
                let claim = store.claim(&request).await.expect("claim during purge");
                slowest = slowest.max(t.elapsed());
                assert!(matches!(claim, Claim::Acquired(_)), "{id} is fresh");
            }
            slowest
        });
    }
    let mut slowest = Duration::ZERO;
    while let Some(s) = claimers.join_next().await {
        slowest = slowest.max(s.expect("claimer"));
    }
    let (purged, calls) = purger.await.expect("purger");
    eprintln!(
        "purged {purged} rows in {calls} calls while {} claims ran: {:?} (slowest claim {slowest:?})",
        tasks * 250,
        started.elapsed()
    );
    (purged, calls)
}

/// `t` to the millisecond, the precision every store keeps.
pub fn ms(t: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap()
}

#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]
pub mod backends;
/// A counting store wrapper that lists nothing.
pub mod counted;
#[cfg(any(feature = "axum", feature = "tower"))]
pub mod http_client;
#[cfg(all(
    feature = "conformance",
    any(feature = "sqlite", feature = "postgres", feature = "mysql")
))]
pub mod inbox;
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]
pub mod proxy;
#[cfg(any(feature = "axum", feature = "tower", feature = "lambda"))]
pub mod web;

/// The `record` function of
/// [`record_in_leaves_a_live_claim_alone_and_takes_over_an_abandoned_one`] for the
/// SQL store `$store` (each store's `record_in` takes its own transaction type, so
/// this is a macro): one `record_in` at `at`, in a transaction of its own, committed.
#[allow(unused_macros)]
macro_rules! record_in_committed {
    ($store:expr) => {{
        let store = $store.clone();
        move |key, fp, at: chrono::DateTime<chrono::Utc>| {
            let store = store.clone();
            async move {
                let mut tx = store.pool().begin().await.unwrap();
                let recorded = store
                    .record_in(&mut tx, key, fp, at, at + chrono::TimeDelta::hours(1))
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                recorded
            }
        }
    }};
}
#[allow(unused_imports)]
pub(crate) use record_in_committed;

/// `record_in` beside a delivery run by the guard, the same check on every SQL
/// backend: while the delivery's lease is live the transaction must not skip the
/// effect as if it were done (the holder may still fail); once the lease ran out it
/// takes the id over and counts the lost lease, as a claim would; an unknown
/// fingerprint matches any. `record(key, fingerprint, at)` runs `record_in` at `at`
/// in a transaction of its own and commits it.
pub async fn record_in_leaves_a_live_claim_alone_and_takes_over_an_abandoned_one<F, Fut>(
    store: &dyn webhook_guard::ProcessedStore,
    record: F,
) where
    F: Fn(
        webhook_guard::store::Key<'static>,
        webhook_guard::store::Fingerprint,
        chrono::DateTime<chrono::Utc>,
    ) -> Fut,
    Fut: std::future::Future<Output = webhook_guard::store::Recorded>,
{
    use chrono::{DateTime, TimeDelta, Utc};
    use webhook_guard::store::{
        Claim, ClaimRequest, FencingToken, Fingerprint, Key, RecordState, Recorded,
    };
    let fp = Fingerprint::of(b"a");
    let now = DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap();
    let key = Key::new("txn", "held");
    let request = ClaimRequest {
        key,
        fingerprint: fp,
        token: FencingToken::random(),
        now,
        lease_until: now + TimeDelta::seconds(30),
        expires_at: now + TimeDelta::hours(1),
    };
    assert!(matches!(
        store.claim(&request).await.unwrap(),
        Claim::Acquired(_)
    ));
    assert_eq!(record(key, fp, now).await, Recorded::InProgress);
    assert_eq!(
        record(key, Fingerprint::of(b"b"), now).await,
        Recorded::Conflict
    );
    let later = now + TimeDelta::seconds(31);
    assert_eq!(record(key, fp, later).await, Recorded::First);
    let rec = store.get(key).await.unwrap().unwrap();
    assert_eq!(
        (rec.state, rec.attempts, rec.failures),
        (RecordState::Completed, 2, 1)
    );
    assert_eq!(record(key, fp, later).await, Recorded::Duplicate);

    // `Fingerprint::UNKNOWN` (kept by a guard that detects no conflicts) matches any
    // fingerprint, and a record taken over takes the known one.
    assert_eq!(
        record(key, Fingerprint::UNKNOWN, later).await,
        Recorded::Duplicate,
        "an unknown fingerprint is no conflict"
    );
    let unknown = Key::new("txn", "unknown");
    let request = ClaimRequest {
        key: unknown,
        fingerprint: Fingerprint::UNKNOWN,
        token: FencingToken::random(),
        ..request
    };
    assert!(matches!(
        store.claim(&request).await.unwrap(),
        Claim::Acquired(_)
    ));
    assert_eq!(record(unknown, fp, now).await, Recorded::InProgress);
    assert_eq!(record(unknown, fp, later).await, Recorded::First);
    let rec = store.get(unknown).await.unwrap().unwrap();
    assert_eq!(
        (rec.state, rec.attempts, rec.failures, rec.fingerprint),
        (RecordState::Completed, 2, 1, fp)
    );
    assert_eq!(
        record(unknown, Fingerprint::of(b"b"), later).await,
        Recorded::Conflict,
        "the record now has a known fingerprint"
    );
}

/// A claim of `id` in namespace `test` at `now`: a 30 s lease, an hour's retention,
/// a fresh token.
pub fn fresh_request(
    id: &'static str,
    now: chrono::DateTime<chrono::Utc>,
) -> webhook_guard::store::ClaimRequest<'static> {
    use webhook_guard::store::{ClaimRequest, FencingToken, Fingerprint, Key};
    ClaimRequest {
        key: Key::new("test", id),
        fingerprint: Fingerprint::of(b"{}"),
        token: FencingToken::random(),
        now,
        lease_until: now + chrono::TimeDelta::seconds(30),
        expires_at: now + chrono::TimeDelta::hours(1),
    }
}

/// Claims of `ids` in namespace `batch`, started at once from as many tasks, each
/// id `copies` times (a 30 s lease, an hour's retention); each task answers its id
/// and claim.
pub fn spawn_claims<S>(
    store: &S,
    ids: Vec<String>,
    copies: usize,
) -> tokio::task::JoinSet<(
    String,
    Result<webhook_guard::store::Claim, webhook_guard::StoreError>,
)>
where
    S: webhook_guard::ProcessedStore + Clone + 'static,
{
    use webhook_guard::store::{ClaimRequest, FencingToken, Fingerprint, Key};
    let now = chrono::DateTime::from_timestamp_millis(chrono::Utc::now().timestamp_millis())
        .expect("now");
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(ids.len() * copies));
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids {
        for _ in 0..copies {
            let (store, start, id) = (store.clone(), start.clone(), id.clone());
            tasks.spawn(async move {
                let request = ClaimRequest {
                    key: Key::new("batch", &id),
                    fingerprint: Fingerprint::of(b"{}"),
                    token: FencingToken::random(),
                    now,
                    lease_until: now + chrono::TimeDelta::seconds(30),
                    expires_at: now + chrono::TimeDelta::hours(1),
                };
                start.wait().await;
                let claim = store.claim(&request).await;
                (id, claim)
            });
        }
    }
    tasks
}

/// [`spawn_claims`], every answer collected by id.
pub async fn claim_at_once<S>(
    store: &S,
    ids: Vec<String>,
    copies: usize,
) -> std::collections::BTreeMap<
    String,
    Vec<Result<webhook_guard::store::Claim, webhook_guard::StoreError>>,
>
where
    S: webhook_guard::ProcessedStore + Clone + 'static,
{
    let mut tasks = spawn_claims(store, ids, copies);
    let mut answers: std::collections::BTreeMap<String, Vec<_>> = Default::default();
    while let Some(done) = tasks.join_next().await {
        let (id, claim) = done.expect("claim task");
        answers.entry(id).or_default().push(claim);
    }
    answers
}

/// Claims queued behind batches that hang are withdrawn, never made. `lock` locks
/// the store's table from another session (each statement on it then waits), and
/// `blocked` counts the statements waiting on that lock. The claims of `evt_0`
/// and `evt_1` go first, the second once the first waits, so that each runner of
/// the store takes one and waits on the lock; four more claims queue behind them.
/// Each of the four answers `Unavailable` once the store's patience (its pool's
/// acquire timeout) is over, while the two are still waiting. `unlock` releases
/// the table: the two are made, the four ids are not stored, and a new claim of
/// each is acquired as a first attempt.
pub async fn claims_queued_behind_hung_batches_are_withdrawn<S, H, Lock, Unlock, Done, B, BFut>(
    store: &S,
    lock: Lock,
    unlock: Unlock,
    blocked: B,
) where
    S: webhook_guard::ProcessedStore + Clone + 'static,
    Lock: std::future::Future<Output = H>,
    Unlock: FnOnce(H) -> Done,
    Done: std::future::Future<Output = ()>,
    B: Fn() -> BFut,
    BFut: std::future::Future<Output = usize>,
{
    use std::time::Duration;
    use webhook_guard::store::{Claim, Key};
    let until_blocked = |n: usize| {
        let blocked = &blocked;
        async move {
            let waited = tokio::time::timeout(Duration::from_secs(30), async {
                while blocked().await < n {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            waited.await.expect("claims waiting on the locked table");
        }
    };
    let locked = lock.await;
    let mut hung = spawn_claims(store, vec!["evt_0".into()], 1);
    until_blocked(1).await;
    let mut second = spawn_claims(store, vec!["evt_1".into()], 1);
    until_blocked(2).await;
    let queued: Vec<String> = (2..6).map(|i| format!("evt_{i}")).collect();
    let mut withdrawn = spawn_claims(store, queued.clone(), 1);
    while let Some(done) = tokio::time::timeout(Duration::from_secs(30), withdrawn.join_next())
        .await
        .expect("a queued claim waited past the store's patience")
    {
        let (id, claim) = done.expect("claim task");
        let error = claim.expect_err("a queued claim behind hung batches");
        assert!(error.is_unavailable(), "{id}: {error:?}");
    }
    // The two hung claims still wait on the lock.
    assert!(hung.try_join_next().is_none() && second.try_join_next().is_none());
    unlock(locked).await;
    while let Some(done) = hung.join_next().await {
        let (id, claim) = done.expect("claim task");
        assert!(matches!(claim, Ok(Claim::Acquired(_))), "{id}: {claim:?}");
    }
    while let Some(done) = second.join_next().await {
        let (id, claim) = done.expect("claim task");
        assert!(matches!(claim, Ok(Claim::Acquired(_))), "{id}: {claim:?}");
    }
    for id in &queued {
        let stored = store.get(Key::new("batch", id)).await.expect("get");
        assert!(
            stored.is_none(),
            "{id} was withdrawn, yet stored: {stored:?}"
        );
    }
    for (id, claim) in claim_at_once(store, queued, 1).await {
        match &claim[..] {
            [Ok(Claim::Acquired(record))] => assert_eq!(record.attempts, 1, "{id}"),
            other => panic!("{id}: {other:?}"),
        }
    }
}

/// The id `batch`/`evt_held` is held (its row locked) by an open transaction
/// while claims of it and of 15 other ids run: each other claim is made while the
/// transaction is still open (a bound on liveness, not on speed: a claim batch
/// waits a short while for a row lock, then each claim goes on alone). With
/// `alone`, two claims of the held id go first, a batch each, so that both
/// runners wait on its lock; else it is one of the 16 claims started together.
/// `hold` opens the transaction and records the id in it; `release` rolls it
/// back, after which the held id's claims are made (one of them claims it).
pub async fn a_held_key_holds_up_no_other_claim<S, H, Hold, Release, Done>(
    store: &S,
    alone: bool,
    hold: Hold,
    release: Release,
) where
    S: webhook_guard::ProcessedStore + Clone + 'static,
    Hold: std::future::Future<Output = H>,
    Release: FnOnce(H) -> Done,
    Done: std::future::Future<Output = ()>,
{
    use webhook_guard::store::Claim;
    let held = hold.await;
    let others: Vec<String> = (0..15).map(|i| format!("evt_{i}")).collect();
    let (mut waiting, mut others) = if alone {
        let waiting = spawn_claims(store, vec!["evt_held".into()], 2);
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        (waiting, spawn_claims(store, others, 1))
    } else {
        let mut ids = others;
        ids.insert(7, "evt_held".into());
        (tokio::task::JoinSet::new(), spawn_claims(store, ids, 1))
    };
    for _ in 0..15 {
        let next = tokio::time::timeout(std::time::Duration::from_secs(20), others.join_next());
        let (id, claim) = next
            .await
            .expect("a claim held up behind the held key")
            .expect("a task")
            .expect("claim task");
        assert_ne!(id, "evt_held", "{claim:?}");
        assert!(matches!(claim, Ok(Claim::Acquired(_))), "{id}: {claim:?}");
    }
    release(held).await;
    // What is left: the held id's claims (in `others` when it went with them).
    let mut acquired = 0;
    for tasks in [&mut waiting, &mut others] {
        while let Some(done) = tasks.join_next().await {
            let (id, claim) = done.expect("claim task");
            assert_eq!(id, "evt_held");
            acquired += usize::from(matches!(claim.expect("claim"), Claim::Acquired(_)));
        }
    }
    assert_eq!(acquired, 1);
}

/// Of claims of each id at once ([`claim_at_once`]): exactly one per id acquired
/// it, and every other met that claim's record (same token); no claim failed.
pub fn each_id_claimed_once(
    answers: &std::collections::BTreeMap<
        String,
        Vec<Result<webhook_guard::store::Claim, webhook_guard::StoreError>>,
    >,
) {
    use webhook_guard::store::Claim;
    for (id, claims) in answers {
        let acquired: Vec<_> = claims
            .iter()
            .filter_map(|c| match c {
                Ok(Claim::Acquired(r)) => Some(r.token),
                _ => None,
            })
            .collect();
        assert_eq!(acquired.len(), 1, "{id}: {claims:?}");
        for claim in claims {
            match claim {
                Ok(Claim::Acquired(_)) => {}
                Ok(Claim::Existing(r)) => assert_eq!(r.token, acquired[0], "{id}"),
                Err(e) => panic!("{id}: {e}"),
            }
        }
    }
}

/// The text of every statement sqlx ran in this process since the first call: a
/// global tracing subscriber of sqlx's `sqlx::query` events (the batch's runner
/// runs on any worker thread).
pub fn statements_run() -> &'static std::sync::Mutex<Vec<String>> {
    use std::sync::{Mutex, OnceLock};
    use tracing::field::{Field, Visit};
    use tracing::{span, Event, Metadata, Subscriber};

    static RUN: OnceLock<&'static Mutex<Vec<String>>> = OnceLock::new();
    struct Statements(&'static Mutex<Vec<String>>);
    struct Text<'a>(&'a mut Option<String>);
    impl Visit for Text<'_> {
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "db.statement" {
                *self.0 = Some(value.to_owned());
            }
        }
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "db.statement" {
                *self.0 = Some(format!("{value:?}"));
            }
        }
    }
    impl Subscriber for Statements {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            metadata.target() == "sqlx::query"
        }
        fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
            span::Id::from_u64(1)
        }
        fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
        fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut text = None;
            event.record(&mut Text(&mut text));
            self.0.lock().unwrap().extend(text);
        }
        fn enter(&self, _: &span::Id) {}
        fn exit(&self, _: &span::Id) {}
    }
    RUN.get_or_init(|| {
        let run: &'static Mutex<Vec<String>> = Box::leak(Box::default());
        tracing::subscriber::set_global_default(Statements(run)).expect("the only subscriber");
        run
    })
}

/// A claim of an id the store holds, completed, costs `statements` statements
/// naming `table` (each one round trip once prepared), counted with
/// [`statements_run`], and is answered with the stored record.
pub async fn a_duplicate_claim_costs<S>(store: &S, table: &str, statements: usize)
where
    S: webhook_guard::ProcessedStore + Clone + 'static,
{
    use webhook_guard::store::{Claim, Fence, Finish, Holder, Key, RecordState};
    let run = statements_run();
    let claimed = claim_at_once(store, vec!["evt_known".into()], 1).await;
    let Some([Ok(Claim::Acquired(record))]) = claimed.get("evt_known").map(Vec::as_slice) else {
        panic!("{claimed:?}")
    };
    let now = chrono::Utc::now();
    let done = Finish {
        state: RecordState::Completed,
        failures: 0,
        history: &[],
        now,
        expires_at: now + chrono::TimeDelta::hours(1),
    };
    let key = Key::new("batch", "evt_known");
    let fence = store
        .finish(Holder::new(key, record.token), &done)
        .await
        .expect("finish");
    assert_eq!(fence, Fence::Applied);
    let from = run.lock().unwrap().len();
    let answers = claim_at_once(store, vec!["evt_known".into()], 1).await;
    let ran: Vec<String> = run.lock().unwrap()[from..]
        .iter()
        .filter(|s| s.contains(table))
        .cloned()
        .collect();
    let Some([Ok(Claim::Existing(existing))]) = answers.get("evt_known").map(Vec::as_slice) else {
        panic!("{answers:?}")
    };
    assert_eq!(existing.state, RecordState::Completed);
    assert_eq!(existing.token, record.token);
    assert_eq!(ran.len(), statements, "{ran:#?}");
}
