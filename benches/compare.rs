//! Side-by-side comparisons: the guard against a baseline, run interleaved in one
//! process.
//!
//! ```text
//! cargo bench --all-features --bench compare                 # everything
//! cargo bench --all-features --bench compare -- memory_cycle # names containing a filter
//! WG_BENCH_SCALE=0.05 WG_BENCH_ROUNDS=3 cargo bench --all-features --bench compare
//! ```
//!
//! Besides a table, every comparison prints one line `ratio <name> <value>`: guard
//! cost ÷ baseline cost (lower is better), or for names ending in `_tput` guard
//! throughput ÷ baseline throughput (higher is better).
//!
//! # Adding a comparison
//!
//! Write one function `fn(&Ctx) -> Result<Report, Skip>` (usually a call to
//! [`Ctx::interleave`] with a guard side and a baseline side) and add one line to
//! [`COMPARISONS`]. A comparison that needs a server takes its URL from
//! [`Ctx::server`], which skips outside CI and fails in CI when it is missing.
//!
//! # Environment
//!
//! - `WG_BENCH_SCALE` (default 1): multiplies every size, for short runs while
//!   developing (the 1,000,000-record figures of the issue need 1).
//! - `WG_BENCH_ROUNDS` (default 7): rounds per side.
//! - `CI`: a comparison whose server is missing fails the run instead of skipping.
//! - `WEBHOOK_GUARD_REDIS_URL`, `WEBHOOK_GUARD_POSTGRES_URL`,
//!   `WEBHOOK_GUARD_MYSQL_URL`: the servers of the backend comparisons (SQLite uses
//!   a file in the temp directory). Each comparison works in fresh tables or under a
//!   fresh key prefix and removes them afterwards.

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::{Arc, Barrier, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use chrono::{TimeDelta, TimeZone, Utc};
use webhook_guard::store::Fingerprint;
use webhook_guard::verify::NoVerification;
use webhook_guard::{
    Clock, EventId, HandlerError, ManualClock, MemoryStore, Outcome, ProcessedStore, WebhookGuard,
};

// ---------------------------------------------------------------------------
// The registry: one line per comparison.
// ---------------------------------------------------------------------------

/// Every comparison, in the order they run.
const COMPARISONS: &[Comparison] = &[
    Comparison::new(
        "memory_bytes_per_record",
        AtMost(1.0),
        memory_bytes_per_record,
    ),
    Comparison::new("memory_cycle", AtMost(3.0), memory_cycle),
    Comparison::new("memory_duplicate", AtMost(2.0), memory_duplicate),
    Comparison::new("memory_cycle_2t_tput", AtLeast(1.6), memory_cycle_2t_tput),
    Comparison::new(
        "memory_cycle_vs_idempotent_tput",
        AtLeast(2.0),
        memory_cycle_vs_idempotent_tput,
    ),
    Comparison::new(
        "memory_cycle_vs_klauthed_tput",
        Peer,
        memory_cycle_vs_klauthed_tput,
    ),
    Comparison::new(
        "sweep_claim_p99_memory",
        AtMost(5.0),
        sweep_claim_p99_memory,
    ),
    Comparison::new("verify_stripe_4k", AtMost(1.15), verify_stripe_4k),
    Comparison::new("verify_standard_4k", AtMost(0.25), verify_standard_4k),
    Comparison::new(
        "verify_standard_vs_hmac_4k",
        AtMost(1.15),
        verify_standard_vs_hmac_4k,
    ),
    Comparison::new("verify_github_4k", AtMost(1.15), verify_github_4k),
    Comparison::new("redis_cycle_tput", AtLeast(0.6), redis_cycle_tput),
    Comparison::new(
        "redis_cycle_vs_idempotent_tput",
        AtLeast(2.0),
        redis_cycle_vs_idempotent_tput,
    ),
    Comparison::new(
        "redis_cycle_vs_klauthed_tput",
        Peer,
        redis_cycle_vs_klauthed_tput,
    ),
    Comparison::new("postgres_cycle_tput", AtLeast(0.42), postgres_cycle_tput),
    Comparison::new("mysql_cycle_tput", AtLeast(0.42), mysql_cycle_tput),
    Comparison::new("sqlite_cycle_tput", AtLeast(0.42), sqlite_cycle_tput),
    Comparison::new("axum_e2e_tput", AtLeast(0.8), axum_e2e_tput),
    Comparison::new(
        "sweep_claim_p99_sqlite",
        AtMost(5.0),
        sweep_claim_p99_sqlite,
    ),
    Comparison::new(
        "sweep_claim_p99_postgres",
        AtMost(5.0),
        sweep_claim_p99_postgres,
    ),
    Comparison::new("sweep_claim_p99_mysql", AtMost(5.0), sweep_claim_p99_mysql),
];

// ---------------------------------------------------------------------------
// The runner.
// ---------------------------------------------------------------------------

struct Comparison {
    name: &'static str,
    target: Target,
    run: fn(&Ctx) -> Result<Report, Skip>,
}

impl Comparison {
    const fn new(
        name: &'static str,
        target: Target,
        run: fn(&Ctx) -> Result<Report, Skip>,
    ) -> Self {
        Self { name, target, run }
    }
}

#[derive(Clone, Copy)]
enum Target {
    AtMost(f64),
    AtLeast(f64),
    /// A peer crate measured for the record: the issue sets no target.
    Peer,
}
use Target::{AtLeast, AtMost, Peer};

impl Target {
    /// The target and whether `ratio` meets it, as the table prints them.
    fn verdict(self, ratio: f64) -> String {
        let met = match self {
            AtMost(t) => ratio <= t,
            AtLeast(t) => ratio >= t,
            Peer => return "no target: a peer".into(),
        };
        format!("target {self}, {}", if met { "met" } else { "MISSED" })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AtMost(t) => write!(f, "<= {t}"),
            AtLeast(t) => write!(f, ">= {t}"),
            Peer => write!(f, "none"),
        }
    }
}

/// What one comparison measured: the ratio and the absolute figures beside it.
struct Report {
    ratio: f64,
    guard: Figure,
    baseline: Figure,
    /// Further absolute figures worth printing (purge time, ...).
    notes: Vec<String>,
}

/// A median with its unit, such as `812 ns/cycle`.
struct Figure {
    what: &'static str,
    value: f64,
    unit: &'static str,
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.value;
        let v = if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        };
        write!(f, "{}: {v} {}", self.what, self.unit)
    }
}

/// Why a comparison did not run (its server is absent).
#[derive(Debug)]
struct Skip(String);

/// What every comparison gets: sizes and rounds.
struct Ctx {
    scale: f64,
    rounds: usize,
}

impl Ctx {
    fn from_env() -> Self {
        let scale = std::env::var("WG_BENCH_SCALE")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .unwrap_or(1.0);
        let rounds = std::env::var("WG_BENCH_ROUNDS")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|r| *r > 0)
            .unwrap_or(7);
        Self { scale, rounds }
    }

    /// `n` scaled by `WG_BENCH_SCALE` (at least 1,000).
    fn n(&self, n: usize) -> usize {
        ((n as f64 * self.scale) as usize).max(1000)
    }

    /// Runs `guard` and `baseline` alternately, `rounds` times each, switching which
    /// goes first every round so slow drift (other processes, thermal) hits both
    /// sides alike. Each side returns its measure of one round; the medians come back.
    fn interleave(
        &self,
        rounds: usize,
        mut guard: impl FnMut() -> f64,
        mut baseline: impl FnMut() -> f64,
    ) -> (f64, f64) {
        let m = self.interleave_sides(rounds, &mut [&mut guard, &mut baseline]);
        (m[0], m[1])
    }

    /// [`Ctx::interleave`] for any number of sides: each round runs every side once,
    /// starting one side later than the round before. The median of each side.
    fn interleave_sides(&self, rounds: usize, sides: &mut [&mut dyn FnMut() -> f64]) -> Vec<f64> {
        let mut runs = vec![Vec::new(); sides.len()];
        for round in 0..rounds {
            for k in 0..sides.len() {
                let side = (round + k) % sides.len();
                runs[side].push(sides[side]());
            }
        }
        runs.into_iter().map(median).collect()
    }

    /// Like [`Ctx::interleave`], and finer: within each round, the two sides take
    /// turns chunk by chunk over the same `n` items (`guard(state, range)` and
    /// `baseline(state, range)`, on a state made fresh by `setup` each round), so
    /// load that comes and goes within a round hits both sides alike. Returns the
    /// median nanoseconds per item of each side.
    fn interleave_chunks<S>(
        &self,
        rounds: usize,
        n: usize,
        mut setup: impl FnMut() -> S,
        mut guard: impl FnMut(&mut S, std::ops::Range<usize>),
        mut baseline: impl FnMut(&mut S, std::ops::Range<usize>),
    ) -> (f64, f64) {
        let chunk = (n / 10).clamp(1000, 10_000);
        let (mut g, mut b) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut state = setup();
            let (mut tg, mut tb) = (Duration::ZERO, Duration::ZERO);
            for (c, start) in (0..n).step_by(chunk).enumerate() {
                let range = start..(start + chunk).min(n);
                for side in [(c + round) % 2, (c + round + 1) % 2] {
                    let t = Instant::now();
                    if side == 0 {
                        guard(&mut state, range.clone());
                        tg += t.elapsed();
                    } else {
                        baseline(&mut state, range.clone());
                        tb += t.elapsed();
                    }
                }
            }
            g.push(ns_per(tg, n));
            b.push(ns_per(tb, n));
        }
        (median(g), median(b))
    }

    /// The URL of a server a comparison needs, from the environment variable `var`.
    /// Missing: fails in CI (`CI` set), skips with a message elsewhere.
    fn server(&self, var: &str) -> Result<String, Skip> {
        match std::env::var(var) {
            Ok(url) if !url.is_empty() => Ok(url),
            _ => Err(Skip(format!("{var} is not set"))),
        }
    }
}

/// The 1/5/15-minute load averages: a 2-thread figure means little when other
/// processes already keep every CPU busy.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    if let Ok(child) = std::env::var(CHILD_VAR) {
        child_main(&child);
        return;
    }
    // `cargo bench` passes `--bench`; anything else not starting with `-` filters.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let ctx = Ctx::from_env();
    let in_ci = std::env::var_os("CI").is_some();
    println!(
        "webhook-guard comparisons: scale {}, {} rounds per side, {} CPUs, load average {}",
        ctx.scale,
        ctx.rounds,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut failed = false;
    for c in COMPARISONS {
        if !filters.is_empty() && !filters.iter().any(|f| c.name.contains(f.as_str())) {
            continue;
        }
        let t = Instant::now();
        match (c.run)(&ctx) {
            Ok(report) => {
                println!(
                    "{:<34} ratio {:>7.3} ({})  {}  |  {}  [{:.1} s]",
                    c.name,
                    report.ratio,
                    c.target.verdict(report.ratio),
                    report.guard,
                    report.baseline,
                    t.elapsed().as_secs_f64()
                );
                for note in &report.notes {
                    println!("{:<34} {note}", "");
                }
                rows.push((c.name, report.ratio));
            }
            Err(Skip(why)) if in_ci => {
                println!("{:<34} FAILED: {why} (CI requires every server)", c.name);
                failed = true;
            }
            Err(Skip(why)) => println!("{:<34} SKIPPED: {why}", c.name),
        }
    }
    println!(
        "total {:.1} s, load average {}",
        started.elapsed().as_secs_f64(),
        load_average()
    );
    for (name, ratio) in rows {
        println!("ratio {name} {ratio:.3}");
    }
    if failed {
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------
// Shared pieces.
// ---------------------------------------------------------------------------

/// A typical small webhook body (the guard hashes it: conflict detection is on).
const BODY: &[u8] = br#"{"id":"evt_1NDEXAMPLE","object":"event","type":"charge.succeeded","created":1700000000,"livemode":false,"data":{"object":{"id":"ch_3NDEXAMPLE","object":"charge","amount":2000,"currency":"usd","status":"succeeded"}}}"#;

const ID_HEADER: &str = "x-event-id";
/// A SHA-256 in hex, as long as the one a stored record carries.
const FINGERPRINT_HEX: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// `n` distinct 30-byte ids, `evt_` and 26 digits, starting at `from`.
fn ids(from: usize, n: usize) -> Vec<String> {
    (from..from + n).map(|i| format!("evt_{i:026}")).collect()
}

fn guard_on(store: impl ProcessedStore) -> WebhookGuard {
    WebhookGuard::builder()
        .store(store)
        .verifier(NoVerification)
        .event_id(EventId::header(ID_HEADER))
        .build()
        .expect("valid guard")
}

/// Polls a future that the in-memory store completes without waiting.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

/// One full cycle: claim, a no-op handler, complete.
async fn cycle(guard: &WebhookGuard, id: &str) -> Outcome {
    let headers = [(ID_HEADER, id)];
    guard
        .handle(&headers, BODY, |_| async { Ok::<(), HandlerError>(()) })
        .await
}

fn ns_per(elapsed: Duration, n: usize) -> f64 {
    elapsed.as_nanos() as f64 / n as f64
}

/// The bare baseline map: check, then insert.
type BareMap = Mutex<HashMap<String, u64>>;

fn bare_insert(map: &BareMap, id: &str, v: u64) -> bool {
    let mut m = map.lock().unwrap();
    if m.contains_key(id) {
        return false;
    }
    m.insert(id.to_owned(), v);
    true
}

// ---------------------------------------------------------------------------
// The comparisons.
// ---------------------------------------------------------------------------

/// Full guard cycle on `MemoryStore` over 1,000,000 unique ids (the store grows to
/// 1M records) vs check-and-insert of the same ids in a bare `Mutex<HashMap>`,
/// both growing side by side in alternating chunks.
fn memory_cycle(ctx: &Ctx) -> Result<Report, Skip> {
    let n = ctx.n(1_000_000);
    let ids = ids(0, n);
    let (g, b) = ctx.interleave_chunks(
        ctx.rounds.min(5),
        n,
        || (guard_on(MemoryStore::new()), BareMap::default()),
        |(guard, _), range| {
            for id in &ids[range] {
                black_box(ready(cycle(guard, id)));
            }
        },
        |(_, map), range| {
            for i in range {
                black_box(bare_insert(map, &ids[i], i as u64));
            }
        },
    );
    Ok(Report {
        ratio: g / b,
        guard: Figure {
            what: "guard",
            value: g,
            unit: "ns/cycle",
        },
        baseline: Figure {
            what: "Mutex<HashMap>",
            value: b,
            unit: "ns/insert",
        },
        notes: vec![format!("{n} unique ids per round; {:.0} cycles/s", 1e9 / g)],
    })
}

/// The guard on an id it already completed vs a bare map lookup, both holding
/// 1,000,000 ids.
fn memory_duplicate(ctx: &Ctx) -> Result<Report, Skip> {
    let n = ctx.n(1_000_000);
    let ids = ids(0, n);
    let guard = guard_on(MemoryStore::new());
    let map = BareMap::default();
    for (i, id) in ids.iter().enumerate() {
        assert!(matches!(
            ready(cycle(&guard, id)),
            Outcome::Processed { .. }
        ));
        bare_insert(&map, id, i as u64);
    }
    assert!(matches!(
        ready(cycle(&guard, &ids[0])),
        Outcome::Duplicate { .. }
    ));
    // Every 4th id, so a round is short and still walks the whole table.
    let probe: Vec<&String> = ids.iter().step_by(4).collect();
    let (g, b) = ctx.interleave_chunks(
        ctx.rounds,
        probe.len(),
        || (),
        |(), range| {
            for id in &probe[range] {
                black_box(ready(cycle(&guard, id)));
            }
        },
        |(), range| {
            for id in &probe[range] {
                black_box(map.lock().unwrap().get(id.as_str()).copied());
            }
        },
    );
    // What a duplicate cannot skip on top of the lookup: the body's fingerprint.
    let sha = median(
        (0..ctx.rounds)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..probe.len() {
                    black_box(Fingerprint::of(black_box(BODY)));
                }
                ns_per(t.elapsed(), probe.len())
            })
            .collect(),
    );
    Ok(Report {
        ratio: g / b,
        guard: Figure {
            what: "guard",
            value: g,
            unit: "ns/duplicate",
        },
        baseline: Figure {
            what: "Mutex<HashMap>",
            value: b,
            unit: "ns/lookup",
        },
        notes: vec![
            format!("{n} ids held, {} probed per round", probe.len()),
            format!(
                "floor: the bare lookup plus the SHA-256 of the body that conflict detection compares: {:.0} ns, ratio {:.3}",
                b + sha,
                (b + sha) / b
            ),
        ],
    })
}

/// Guard cycles/s with 2 threads sharing one guard vs 1 thread.
fn memory_cycle_2t_tput(ctx: &Ctx) -> Result<Report, Skip> {
    let n = ctx.n(400_000);
    let ids = ids(0, n);
    let run = |threads: usize| {
        let guard = guard_on(MemoryStore::new());
        let barrier = Barrier::new(threads + 1);
        let chunk = n.div_ceil(threads);
        std::thread::scope(|s| {
            for part in ids.chunks(chunk) {
                let (guard, barrier) = (&guard, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    for id in part {
                        black_box(ready(cycle(guard, id)));
                    }
                });
            }
            barrier.wait();
            let t = Instant::now();
            // Leaving the scope joins both threads.
            t
        })
        .elapsed()
    };
    let (g, b) = ctx.interleave(
        ctx.rounds,
        || n as f64 / run(2).as_secs_f64(),
        || n as f64 / run(1).as_secs_f64(),
    );
    Ok(Report {
        ratio: g / b,
        guard: Figure {
            what: "2 threads",
            value: g,
            unit: "cycles/s",
        },
        baseline: Figure {
            what: "1 thread",
            value: b,
            unit: "cycles/s",
        },
        notes: vec![format!("{n} cycles per round")],
    })
}

/// Tasks per side of the in-memory peer comparisons.
const MEMORY_TASKS: usize = 64;

/// Cycles/s of one round on `rt`: [`MEMORY_TASKS`] tasks, task `k` running
/// `task(state, range)` over its share of `n` items.
fn memory_tasks_round<S, Fut>(
    rt: &tokio::runtime::Runtime,
    n: usize,
    state: S,
    task: impl Fn(S, std::ops::Range<usize>) -> Fut,
) -> f64
where
    S: Clone,
    Fut: Future<Output = ()> + Send + 'static,
{
    let chunk = n.div_ceil(MEMORY_TASKS);
    rt.block_on(async {
        let t = Instant::now();
        let tasks: Vec<_> = (0..MEMORY_TASKS)
            .map(|k| tokio::spawn(task(state.clone(), k * chunk..((k + 1) * chunk).min(n))))
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        n as f64 / t.elapsed().as_secs_f64()
    })
}

/// One guard round of the in-memory peer comparisons: cycles/s on a fresh
/// `MemoryStore`, every id new.
fn memory_guard_round(rt: &tokio::runtime::Runtime, ids: &Arc<Vec<String>>) -> f64 {
    let state = (guard_on(MemoryStore::new()), ids.clone());
    memory_tasks_round(rt, ids.len(), state, |(guard, ids), range| async move {
        for id in &ids[range] {
            let outcome = cycle(&guard, id).await;
            debug_assert!(matches!(outcome, Outcome::Processed { .. }));
        }
    })
}

/// Guard cycles/s on `MemoryStore` with 64 tasks vs the `idempotent` crate 0.3's
/// `MemoryStore` claim + complete with 64 tasks, on the same 2-worker runtime.
fn memory_cycle_vs_idempotent_tput(ctx: &Ctx) -> Result<Report, Skip> {
    use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
    use idempotent::store::{IdempotencyStore, InsertResult};
    use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};

    let n = ctx.n(200_000);
    let ids = Arc::new(ids(0, n));
    let rt = runtime();
    let idempotent_round = || {
        // Its store starts a cleanup task on the runtime it is made in.
        let _in_runtime = rt.enter();
        let store = Arc::new(idempotent::store::memory::MemoryStore::new(
            1024,
            Duration::from_secs(3600),
        ));
        memory_tasks_round(
            &rt,
            n,
            (store, ids.clone()),
            |(store, ids), range| async move {
                let ttl = Duration::from_secs(72 * 3600);
                for id in &ids[range] {
                    let key = IdempotencyKey::new(id.as_str()).expect("key");
                    let fp = DefaultFingerprintStrategy.compute("POST /webhooks", BODY);
                    let entry = IdempotencyEntry::new(fp, ttl);
                    let claim = store.try_insert(&key, entry.clone()).await;
                    let Ok(InsertResult::Claimed { fencing_token }) = claim else {
                        panic!("fresh key not claimed");
                    };
                    black_box(()); // the no-op handler
                    let response = CachedResponse {
                        status_code: 200,
                        metadata: Metadata::default(),
                        body: bytes::Bytes::new(),
                    };
                    store
                        .complete(&key, entry.complete(response), fencing_token)
                        .await
                        .expect("complete");
                }
            },
        )
    };
    let (g, b) = ctx.interleave(
        ctx.rounds,
        || memory_guard_round(&rt, &ids),
        idempotent_round,
    );
    Ok(memory_peer_report(g, b, "idempotent 0.3", n))
}

/// Guard cycles/s on `MemoryStore` with 64 tasks vs the `klauthed-data` crate 1.0's
/// `InMemoryIdempotencyStore` `begin` + `complete` with 64 tasks (one map behind one
/// mutex, no fingerprint, no fencing, no expiry), on the same 2-worker runtime.
fn memory_cycle_vs_klauthed_tput(ctx: &Ctx) -> Result<Report, Skip> {
    use klauthed_data::idempotency::{
        IdempotencyStore, InMemoryIdempotencyStore, Outcome as KOutcome,
    };

    let n = ctx.n(200_000);
    let ids = Arc::new(ids(0, n));
    let rt = runtime();
    let klauthed_round = || {
        let store = Arc::new(InMemoryIdempotencyStore::new());
        memory_tasks_round(
            &rt,
            n,
            (store, ids.clone()),
            |(store, ids), range| async move {
                for id in &ids[range] {
                    let begun = store.begin(id).await.expect("begin");
                    assert_eq!(begun, KOutcome::New, "fresh key not claimed");
                    black_box(()); // the no-op handler
                    store
                        .complete(id, serde_json::Value::Null)
                        .await
                        .expect("complete");
                }
            },
        )
    };
    let (g, b) = ctx.interleave(ctx.rounds, || memory_guard_round(&rt, &ids), klauthed_round);
    Ok(memory_peer_report(g, b, "klauthed-data 1.0", n))
}

fn memory_peer_report(g: f64, b: f64, peer: &'static str, n: usize) -> Report {
    Report {
        ratio: g / b,
        guard: Figure {
            what: "guard",
            value: g,
            unit: "cycles/s",
        },
        baseline: Figure {
            what: peer,
            value: b,
            unit: "cycles/s",
        },
        notes: vec![format!(
            "{n} cycles per round, {MEMORY_TASKS} tasks, 2 tokio workers"
        )],
    }
}

/// p99 claim latency while a concurrent loop purges 1,000,000 expired records vs
/// p99 claim latency with nothing else running. Each round refills the store, then
/// samples idle claims, then claims during the purge.
fn sweep_claim_p99_memory(ctx: &Ctx) -> Result<Report, Skip> {
    const PURGE_BATCH: usize = 1000; // the sweeper's default batch
    let n = ctx.n(1_000_000);
    let idle_samples = ctx.n(100_000);
    let old = ids(0, n);
    let rounds = ctx.rounds.min(5);
    let (mut idle, mut busy, mut purge_ms, mut busy_samples) = (vec![], vec![], vec![], vec![]);
    let mut fresh = n; // ids claimed during measurement, never reused
    for _ in 0..rounds {
        let t0 = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let clock = ManualClock::new(t0);
        let store = MemoryStore::new();
        let guard = WebhookGuard::builder()
            .store(store.clone())
            .verifier(NoVerification)
            .event_id(EventId::header(ID_HEADER))
            .clock(clock.clone())
            .build()
            .expect("valid guard");
        for id in &old {
            ready(cycle(&guard, id));
        }
        // Past the retention: every record is now expired.
        clock.set(t0 + TimeDelta::from_std(guard.retention()).unwrap() + TimeDelta::seconds(1));
        let claim = |id: &str| {
            let headers = [(ID_HEADER, id)];
            let t = Instant::now();
            let begin = ready(guard.begin(&headers, BODY));
            let ns = t.elapsed().as_nanos() as u64;
            if let webhook_guard::Begin::Claimed(c) = begin {
                ready(c.complete());
            }
            ns
        };
        // Idle.
        let mut lat = Vec::with_capacity(idle_samples);
        for id in ids(fresh, idle_samples) {
            lat.push(claim(&id));
        }
        fresh += idle_samples;
        idle.push(p99(&mut lat));
        // During the purge: claim fresh ids until the purger is done.
        let mut lat = Vec::with_capacity(4 * idle_samples);
        let now = clock.now();
        let mut id = String::with_capacity(30);
        let purge_time = std::thread::scope(|s| {
            let purger = s.spawn(|| {
                let t = Instant::now();
                let mut total = 0;
                loop {
                    let k = ready(store.purge_expired(now, PURGE_BATCH)).expect("purge");
                    total += k;
                    if k == 0 {
                        break;
                    }
                }
                (t.elapsed(), total)
            });
            while !purger.is_finished() {
                use std::fmt::Write;
                id.clear();
                write!(id, "evt_{fresh:026}").unwrap();
                fresh += 1;
                lat.push(claim(&id));
            }
            purger.join().expect("purger")
        });
        assert!(purge_time.1 >= n as u64, "purged {} of {n}", purge_time.1);
        busy_samples.push(lat.len() as f64);
        busy.push(p99(&mut lat));
        purge_ms.push(purge_time.0.as_secs_f64() * 1e3);
    }
    let (g, b) = (median(busy), median(idle));
    Ok(Report {
        ratio: g / b,
        guard: Figure { what: "p99 claim during purge", value: g, unit: "ns" },
        baseline: Figure { what: "p99 claim idle", value: b, unit: "ns" },
        notes: vec![format!(
            "purge of {n} expired records (batches of {PURGE_BATCH}): {:.0} ms; {:.0} claims sampled during it",
            median(purge_ms),
            median(busy_samples)
        )],
    })
}

fn p99(lat: &mut [u64]) -> f64 {
    assert!(!lat.is_empty(), "no latency sampled");
    lat.sort_unstable();
    lat[(lat.len() * 99 / 100).min(lat.len() - 1)] as f64
}

/// RSS growth ÷ records at 1,000,000 records with 30-byte ids, as a ratio to 200 B.
///
/// Measured in a child process of this binary: a fresh heap, so neither earlier
/// comparisons' freed memory (which the allocator would reuse, hiding growth) nor
/// their fragmentation blurs the figure. The child also measures a bare
/// `HashMap<String, [u8; 24]>` for reference.
fn memory_bytes_per_record(ctx: &Ctx) -> Result<Report, Skip> {
    let n = ctx.n(1_000_000);
    let guard = run_child("memory_store", n);
    let bare = run_child("bare_map", n);
    Ok(Report {
        ratio: guard / 200.0,
        guard: Figure {
            what: "MemoryStore",
            value: guard,
            unit: "B/record",
        },
        baseline: Figure {
            what: "HashMap<String, [u8; 24]>",
            value: bare,
            unit: "B/entry",
        },
        notes: vec![format!("{n} records of 30-byte ids; ratio is to 200 B")],
    })
}

const CHILD_VAR: &str = "WG_BENCH_CHILD";

fn run_child(what: &str, n: usize) -> f64 {
    let out = std::process::Command::new(std::env::current_exe().expect("own path"))
        .env(CHILD_VAR, format!("{what}:{n}"))
        .output()
        .expect("child ran");
    assert!(out.status.success(), "child {what} failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("child prints bytes per record")
}

fn child_main(spec: &str) {
    let (what, n) = spec.split_once(':').expect("what:n");
    let n: usize = n.parse().expect("n");
    let per = match what {
        "memory_store" => {
            let guard = guard_on(MemoryStore::new());
            let mut id = String::with_capacity(30);
            let mut make = |i: usize| {
                use std::fmt::Write;
                id.clear();
                write!(id, "evt_{i:026}").unwrap();
                ready(cycle(&guard, &id));
            };
            make(usize::MAX / 2); // warm-up: runtime structures, first shard growth
            let before = rss();
            for i in 0..n {
                make(i);
            }
            (rss() - before) as f64 / n as f64
        }
        "bare_map" => {
            let mut map: HashMap<String, [u8; 24]> = HashMap::new();
            map.insert("warm-up".into(), [0; 24]);
            let before = rss();
            for i in 0..n {
                map.insert(format!("evt_{i:026}"), [i as u8; 24]);
            }
            black_box(&map);
            (rss() - before) as f64 / n as f64
        }
        other => panic!("unknown child {other}"),
    };
    println!("{per}");
}

/// Resident set size in bytes, from `/proc/self/statm` (pages of 4 KiB).
fn rss() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: i64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

// ---------------------------------------------------------------------------
// Signature verification: 4 KiB bodies.
// ---------------------------------------------------------------------------

const VERIFY_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A 4,096-byte Stripe-shaped JSON event, `id` first.
fn body_4k() -> Vec<u8> {
    let head = br#"{"id":"evt_1NDEXAMPLE4K","object":"event","type":"charge.succeeded","created":1700000000,"data":{"object":{"id":"ch_3NDEXAMPLE","amount":2000,"currency":"usd","description":""#;
    let tail = br#""}}}"#;
    let mut body = head.to_vec();
    body.resize(4096 - tail.len(), b'x');
    body.extend_from_slice(tail);
    assert_eq!(body.len(), 4096);
    body
}

/// What a naive user writes: key the HMAC on every call, MAC the signed bytes,
/// compare in constant time.
fn bare_hmac(secret: &[u8], parts: &[&[u8]], tag: &[u8; 32]) -> bool {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    for part in parts {
        mac.update(part);
    }
    mac.verify_slice(tag).is_ok()
}

/// `guard` vs `baseline`, each one verification, in alternating chunks.
fn verify_pair(
    ctx: &Ctx,
    guard_what: &'static str,
    base_what: &'static str,
    n: usize,
    mut guard: impl FnMut() -> bool,
    mut baseline: impl FnMut() -> bool,
) -> Report {
    assert!(guard(), "guard side rejects a valid delivery");
    assert!(baseline(), "baseline rejects a valid delivery");
    let n = ctx.n(n);
    let (g, b) = ctx.interleave_chunks(
        ctx.rounds,
        n,
        || (),
        |(), range| {
            for _ in range {
                black_box(guard());
            }
        },
        |(), range| {
            for _ in range {
                black_box(baseline());
            }
        },
    );
    Report {
        ratio: g / b,
        guard: Figure {
            what: guard_what,
            value: g,
            unit: "ns/verification",
        },
        baseline: Figure {
            what: base_what,
            value: b,
            unit: "ns/verification",
        },
        notes: vec![format!(
            "4,096-byte body, {n} verifications per side per round"
        )],
    }
}

fn verify_stripe_4k(ctx: &Ctx) -> Result<Report, Skip> {
    use webhook_guard::verify::{Stripe, Verifier};
    let body = body_4k();
    let stripe = Stripe::new([VERIFY_SECRET]).expect("secret");
    let now = Utc::now();
    let t = now.timestamp();
    let header = stripe.sign(&body, t);
    let headers = [("stripe-signature", header.as_str())];
    let tag: [u8; 32] = hex::decode(&header[header.find("v1=").unwrap() + 3..])
        .unwrap()
        .try_into()
        .unwrap();
    let ts = t.to_string();
    Ok(verify_pair(
        ctx,
        "verify::Stripe",
        "bare HMAC-SHA256",
        40_000,
        || {
            stripe
                .verify(black_box(&headers), black_box(&body), now)
                .is_ok()
        },
        || {
            bare_hmac(
                VERIFY_SECRET.as_bytes(),
                &[ts.as_bytes(), b".", black_box(&body)],
                &tag,
            )
        },
    ))
}

/// The three Standard Webhooks headers for the 4 KiB body, signed now.
fn standard_input(
    body: &[u8],
) -> (
    webhook_guard::verify::StandardWebhooks,
    Vec<(&'static str, String)>,
    i64,
) {
    let v = webhook_guard::verify::StandardWebhooks::new([VERIFY_SECRET]).expect("secret");
    let t = Utc::now().timestamp();
    let headers = v.sign_headers("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", t, body);
    (v, headers, t)
}

fn verify_standard_4k(ctx: &Ctx) -> Result<Report, Skip> {
    use webhook_guard::verify::Verifier;
    let body = body_4k();
    let (v, headers, _) = standard_input(&body);
    let mut map = http::HeaderMap::new();
    for (name, value) in &headers {
        map.insert(*name, value.parse().unwrap());
    }
    let peer = standardwebhooks::Webhook::new(VERIFY_SECRET).expect("secret");
    // Both sides read the clock: the peer crate does so inside `verify`.
    Ok(verify_pair(
        ctx,
        "verify::StandardWebhooks",
        "standardwebhooks 1 Webhook::verify",
        10_000,
        || {
            v.verify(black_box(&map), black_box(&body), Utc::now())
                .is_ok()
        },
        || peer.verify(black_box(&body), black_box(&map)).is_ok(),
    ))
}

fn verify_standard_vs_hmac_4k(ctx: &Ctx) -> Result<Report, Skip> {
    use base64::Engine as _;
    use webhook_guard::verify::Verifier;
    let body = body_4k();
    let (v, headers, t) = standard_input(&body);
    let now = Utc::now();
    let sig = &headers[2].1;
    let tag: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(&sig[3..])
        .unwrap()
        .try_into()
        .unwrap();
    let key = base64::engine::general_purpose::STANDARD
        .decode(&VERIFY_SECRET[6..])
        .unwrap();
    let (id, ts) = (headers[0].1.clone(), t.to_string());
    Ok(verify_pair(
        ctx,
        "verify::StandardWebhooks",
        "bare HMAC-SHA256",
        40_000,
        || v.verify(black_box(&headers), black_box(&body), now).is_ok(),
        || {
            bare_hmac(
                &key,
                &[id.as_bytes(), b".", ts.as_bytes(), b".", black_box(&body)],
                &tag,
            )
        },
    ))
}

fn verify_github_4k(ctx: &Ctx) -> Result<Report, Skip> {
    use webhook_guard::verify::{GitHub, Verifier};
    let body = body_4k();
    let gh = GitHub::new([VERIFY_SECRET]).expect("secret");
    let sig = gh.sign(&body);
    let headers = [
        ("x-hub-signature-256", sig.as_str()),
        ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
    ];
    let tag: [u8; 32] = hex::decode(&sig[7..]).unwrap().try_into().unwrap();
    let now = Utc::now();
    Ok(verify_pair(
        ctx,
        "verify::GitHub",
        "bare HMAC-SHA256",
        40_000,
        || {
            gh.verify(black_box(&headers), black_box(&body), now)
                .is_ok()
        },
        || bare_hmac(VERIFY_SECRET.as_bytes(), &[black_box(&body)], &tag),
    ))
}

// ---------------------------------------------------------------------------
// Backends: Redis, PostgreSQL, MySQL, SQLite.
// ---------------------------------------------------------------------------

/// A 2-worker runtime, like the memory comparisons.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A fresh name for tables and key prefixes: `wgb_<pid>_<nanos>`.
fn fresh_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("wgb_{}_{nanos}", std::process::id())
}

/// How long one throughput round runs, scaled (at least 0.3 s).
fn round_time(ctx: &Ctx) -> Duration {
    Duration::from_secs_f64((2.0 * ctx.scale).clamp(0.3, 2.0))
}

/// Operations per second of `tasks` tasks each calling `op(i)` with fresh `i` from a
/// shared counter, for `dur`. `op` returns whether its operation succeeded as
/// expected; a failure panics.
async fn tput<F, Fut>(tasks: usize, dur: Duration, first: u64, op: F) -> (f64, u64)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    tput_each(tasks, dur, first, 1, op).await
}

/// [`tput`] where one call `op(i)` makes `per` operations, on ids `i..i + per`.
async fn tput_each<F, Fut>(tasks: usize, dur: Duration, first: u64, per: u64, op: F) -> (f64, u64)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    use std::sync::atomic::{AtomicU64, Ordering};
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(first));
    let done = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (op, next, done) = (op.clone(), next.clone(), done.clone());
            tokio::spawn(async move {
                while t.elapsed() < dur {
                    let i = next.fetch_add(per, Ordering::Relaxed);
                    assert!(op(i).await, "operations {i}.. failed");
                    done.fetch_add(per, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("task");
    }
    let secs = t.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    (n as f64 / secs, next.load(Ordering::Relaxed))
}

/// A guard on `store` whose cycle of id `i` is claim + no-op + complete.
async fn guard_cycle(guard: &WebhookGuard, prefix: &str, i: u64) -> bool {
    let id = format!("{prefix}{i:020}");
    matches!(cycle(guard, &id).await, Outcome::Processed { .. })
}

/// Interleaved throughput rounds on one runtime: `guard(first)` and
/// `baseline(first)` each return (ops/s, next free index).
fn interleave_tput<G, B, GF, BF>(
    ctx: &Ctx,
    rt: &tokio::runtime::Runtime,
    guard: G,
    baseline: B,
) -> (f64, f64)
where
    G: Fn(u64) -> GF,
    B: Fn(u64) -> BF,
    GF: Future<Output = (f64, u64)> + 'static,
    BF: Future<Output = (f64, u64)> + 'static,
{
    let m = interleave_tput_sides(
        ctx,
        rt,
        ctx.rounds.min(5),
        &[&|first| Box::pin(guard(first)), &|first| {
            Box::pin(baseline(first))
        }],
    );
    (m[0], m[1])
}

/// One throughput round of one side: (ops/s, next free index).
type RoundFuture = std::pin::Pin<Box<dyn Future<Output = (f64, u64)>>>;

/// [`interleave_tput`] for any number of sides ([`Ctx::interleave_sides`]): each
/// round of a side starts at the index the round before it stopped at, so no two
/// rounds use the same ids. The median ops/s of each side.
fn interleave_tput_sides(
    ctx: &Ctx,
    rt: &tokio::runtime::Runtime,
    rounds: usize,
    sides: &[&dyn Fn(u64) -> RoundFuture],
) -> Vec<f64> {
    let next = std::cell::Cell::new(0u64);
    let mut runs: Vec<_> = sides
        .iter()
        .map(|side| {
            let next = &next;
            move || {
                let (v, n) = rt.block_on(side(next.get()));
                next.set(n);
                v
            }
        })
        .collect();
    let mut runs: Vec<&mut dyn FnMut() -> f64> = runs
        .iter_mut()
        .map(|run| run as &mut dyn FnMut() -> f64)
        .collect();
    ctx.interleave_sides(rounds, &mut runs)
}

fn tput_report(g: f64, b: f64, base_what: &'static str, note: String) -> Report {
    Report {
        ratio: g / b,
        guard: Figure {
            what: "guard",
            value: g,
            unit: "cycles/s",
        },
        baseline: Figure {
            what: base_what,
            value: b,
            unit: "ops/s",
        },
        notes: vec![note],
    }
}

async fn redis_store(url: &str, prefix: &str) -> webhook_guard::store::RedisStore {
    webhook_guard::store::RedisStore::builder()
        .prefix(prefix)
        .connect(url)
        .await
        .expect("redis store")
}

/// Deletes every key matching `pattern`.
async fn redis_cleanup(url: &str, pattern: &str) {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_connection_manager().await.expect("connect");
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("scan");
        if !keys.is_empty() {
            let _: () = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .expect("unlink");
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

const REDIS_TASKS: usize = 64;

/// `SET key value NX PX 600000`, one round trip: whether it stored the key.
async fn set_nx_px(conn: &mut redis::aio::ConnectionManager, key: &str, value: &[u8]) -> bool {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(600_000)
        .query_async(conn)
        .await
        .expect("SET");
    set.is_some()
}

/// Tasks and cycles per batch of the ceiling side: 4 × 64, so 256 cycles under way,
/// four times the 64 of the guard's side (more in flight only raises the ceiling).
const CEILING_TASKS: usize = 4;
const CEILING_BATCH: u64 = 64;

/// The fenced rewrite of the ceiling side: KEYS the records; ARGV two per record,
/// the token prefix it must start with and the new record. One 1 or 0 per record.
const CEILING_FINISH: &str = "local out = {} \
    for i = 1, #KEYS do \
      local v, fence = redis.call('GET', KEYS[i]), ARGV[2 * i - 1] \
      if v and string.sub(v, 1, #fence) == fence then \
        redis.call('SET', KEYS[i], ARGV[2 * i], 'PX', 600000) out[i] = 1 \
      else out[i] = 0 end \
    end \
    return out";

/// The ceiling: what the guard's store asks of the server for `CEILING_BATCH`
/// cycles (ids `i0..`, keys under `prefix`), at its least and batched as well as a
/// client can, with no crate code: one `MULTI` of their `SET NX GET PX` and one
/// `ZADD NX` filing them in a due index, then one script that reads each record,
/// compares its token prefix and writes the whole new record (the store's finish
/// also keeps fields of the stored record, which this one is handed instead).
/// Whether every claim found its id new and every rewrite was applied.
async fn ceiling_cycles(
    conn: &mut redis::aio::ConnectionManager,
    prefix: &str,
    i0: u64,
    finish: &redis::Script,
) -> bool {
    let ids = i0..i0 + CEILING_BATCH;
    let keys: Vec<String> = ids
        .clone()
        .map(|i| format!("{prefix}evt_{i:020}"))
        .collect();
    let (now, lease, expires) = (
        1_700_000_000_000u64,
        1_700_000_060_000u64,
        1_700_000_600_000u64,
    );
    let mut claims = redis::pipe();
    claims.atomic();
    let mut index = redis::cmd("ZADD");
    index.arg(format!("{prefix}due")).arg("NX");
    for (i, key) in ids.clone().zip(&keys) {
        let record =
            format!("in_progress|{i}|{FINGERPRINT_HEX}|1|{lease}|{now}|0|{expires}|{now}|");
        claims
            .cmd("SET")
            .arg(key)
            .arg(record)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(600_000);
        index.arg(lease).arg(key);
    }
    claims.add_command(index);
    let mut stored: Vec<redis::Value> = claims.query_async(conn).await.expect("claims");
    let filed = stored.pop() == Some(redis::Value::Int(CEILING_BATCH as i64));
    let mut run = finish.prepare_invoke();
    for (i, key) in ids.zip(&keys) {
        run.key(key).arg(format!("in_progress|{i}|")).arg(format!(
            "completed|{i}|{FINGERPRINT_HEX}|1|{lease}|{now}|0|{expires}|{now}|"
        ));
    }
    let applied: Vec<i64> = run.invoke_async(conn).await.expect("finish script");
    filed
        && stored.len() == keys.len()
        && stored.iter().all(|v| *v == redis::Value::Nil)
        && applied.len() == keys.len()
        && applied.iter().all(|&a| a == 1)
}

/// CPU seconds the server's main thread (the one that runs commands) has used, from
/// `INFO cpu`.
async fn server_main_cpu(conn: &mut redis::aio::ConnectionManager) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO cpu");
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO cpu has no {name}"))
    };
    field("used_cpu_user_main_thread") + field("used_cpu_sys_main_thread")
}

/// A round of the ceiling side ([`ceiling_cycles`]) on `conn`, keys under `prefix`.
/// Each round also pushes to `busy` the share of its time the server's main thread
/// was busy (1.0: a full core, all a Redis server runs commands on).
fn ceiling_side(
    conn: &redis::aio::ConnectionManager,
    prefix: &str,
    dur: Duration,
    busy: Arc<Mutex<Vec<f64>>>,
) -> impl Fn(u64) -> RoundFuture {
    let finish = Arc::new(redis::Script::new(CEILING_FINISH));
    let (conn, prefix) = (conn.clone(), prefix.to_owned());
    move |first| {
        let (conn, prefix, finish, busy) =
            (conn.clone(), prefix.clone(), finish.clone(), busy.clone());
        Box::pin(async move {
            let mut probe = conn.clone();
            let (cpu, t) = (server_main_cpu(&mut probe).await, Instant::now());
            let round = tput_each(CEILING_TASKS, dur, first, CEILING_BATCH, move |i0| {
                let (mut conn, prefix, finish) = (conn.clone(), prefix.clone(), finish.clone());
                async move { ceiling_cycles(&mut conn, &prefix, i0, &finish).await }
            })
            .await;
            let share = (server_main_cpu(&mut probe).await - cpu) / t.elapsed().as_secs_f64();
            busy.lock().unwrap().push(share);
            round
        })
    }
}

/// Guard cycles/s on `RedisStore`, 64 tasks, vs raw `SET k v NX PX` round trips/s on
/// a `ConnectionManager` of the same `redis` crate, 64 tasks; a third side, the
/// reference cycle, runs in the same rounds.
fn redis_cycle_tput(ctx: &Ctx) -> Result<Report, Skip> {
    let url = ctx.server("WEBHOOK_GUARD_REDIS_URL")?;
    let rt = runtime();
    let prefix = fresh_name();
    let dur = round_time(ctx);
    let (guard, conn) = rt.block_on(async {
        let guard = guard_on(redis_store(&url, &prefix).await);
        let conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection_manager()
            .await
            .expect("connect");
        (guard, conn)
    });
    let raw_prefix = format!("{prefix}_raw:");
    let guard_side = |first| -> RoundFuture {
        let guard = guard.clone();
        Box::pin(tput(REDIS_TASKS, dur, first, move |i| {
            let guard = guard.clone();
            async move { guard_cycle(&guard, "evt_", i).await }
        }))
    };
    let set_side = |first| -> RoundFuture {
        let (conn, raw_prefix) = (conn.clone(), raw_prefix.clone());
        Box::pin(tput(REDIS_TASKS, dur, first, move |i| {
            let (mut conn, key) = (conn.clone(), format!("{raw_prefix}evt_{i:020}"));
            async move { set_nx_px(&mut conn, &key, &BODY[..32]).await }
        }))
    };
    // The reference: the least a fenced cycle asks of the server, sent the plain way
    // (each command its own request, pipelined only by the multiplexed connection):
    // `SET NX PX` of a record, then a script that checks the token and rewrites it.
    // No index, no batching.
    let fenced = Arc::new(redis::Script::new(
        "local v = redis.call('GET', KEYS[1]) \
         if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then \
           redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0",
    ));
    let reference_side = |first| -> RoundFuture {
        let (conn, raw_prefix, fenced) = (conn.clone(), raw_prefix.clone(), fenced.clone());
        Box::pin(tput(REDIS_TASKS, dur, first, move |i| {
            let (mut conn, fenced) = (conn.clone(), fenced.clone());
            let key = format!("{raw_prefix}evt_{i:020}");
            let fence = format!("in_progress|{i:016x}|");
            async move {
                let record = format!("{fence}{FINGERPRINT_HEX}");
                let claimed = set_nx_px(&mut conn, &key, record.as_bytes()).await;
                let done: i64 = fenced
                    .key(&key)
                    .arg(&fence)
                    .arg(format!("completed|{i:016x}|{FINGERPRINT_HEX}"))
                    .arg(600_000)
                    .invoke_async(&mut conn)
                    .await
                    .expect("EVALSHA");
                claimed && done == 1
            }
        }))
    };
    // The bound of any guard here: the server work of a cycle, batched, no crate code.
    let busy = Arc::new(Mutex::new(Vec::new()));
    let ceiling_side = ceiling_side(&conn, &format!("{raw_prefix}c:"), dur, busy.clone());
    let sides: [&dyn Fn(u64) -> RoundFuture; 4] =
        [&guard_side, &set_side, &reference_side, &ceiling_side];
    // Rounds in whole turns, so that each side goes first equally often.
    let rounds = ctx.rounds.div_ceil(sides.len()).min(2) * sides.len();
    let m = interleave_tput_sides(ctx, &rt, rounds, &sides);
    let (g, b, r, c) = (m[0], m[1], m[2], m[3]);
    let busy = median(busy.lock().unwrap().clone());
    rt.block_on(async {
        redis_cleanup(&url, &format!("{{{prefix}:*")).await;
        redis_cleanup(&url, &format!("{raw_prefix}*")).await;
    });
    let mut report = tput_report(
        g,
        b,
        "SET NX PX",
        format!("{REDIS_TASKS} tasks, one multiplexed connection each side, {:.1} s rounds; a cycle is 2 round trips", dur.as_secs_f64()),
    );
    report.notes.push(format!(
        "reference, same run: SET NX PX + fenced EVALSHA rewrite, unbatched, no index: {r:.0} cycles/s, {:.3} of SET NX PX; guard {:.3} of it",
        r / b,
        g / r
    ));
    report.notes.push(format!(
        "ceiling, same run: the store's server work for a cycle as raw commands, {CEILING_TASKS} tasks of {CEILING_BATCH} cycles batched (MULTI of SET NX GET PX + one ZADD NX, then one fenced-rewrite script): {c:.0} cycles/s, {:.3} of SET NX PX, the server's command thread busy {:.0} % of those rounds; guard {:.3} of it",
        c / b,
        busy * 100.0,
        g / c
    ));
    Ok(report)
}

/// Guard cycles/s on Redis against a peer crate's claim + complete on the same
/// server, 64 tasks each. `connect(url, prefix)` builds the peer, its keys starting
/// with `prefix`; `cycle(peer, i)` claims and completes fresh key `i` and says
/// whether both succeeded.
fn redis_vs_peer<P, C, CF, F, Fut>(
    ctx: &Ctx,
    peer_name: &'static str,
    with_ceiling: bool,
    connect: C,
    cycle: F,
) -> Result<Report, Skip>
where
    P: Send + Sync + 'static,
    C: FnOnce(String, String) -> CF,
    CF: Future<Output = P>,
    F: Fn(Arc<P>, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    let url = ctx.server("WEBHOOK_GUARD_REDIS_URL")?;
    let rt = runtime();
    let prefix = fresh_name();
    let peer_prefix = format!("{prefix}_peer");
    let dur = round_time(ctx);
    let (guard, peer) = rt.block_on(async {
        let guard = guard_on(redis_store(&url, &prefix).await);
        let peer = connect(url.clone(), peer_prefix.clone()).await;
        (guard, Arc::new(peer))
    });
    let guard_side = |first| -> RoundFuture {
        let guard = guard.clone();
        Box::pin(tput(REDIS_TASKS, dur, first, move |i| {
            let guard = guard.clone();
            async move { guard_cycle(&guard, "evt_", i).await }
        }))
    };
    let peer_side = |first| -> RoundFuture {
        let (peer, cycle) = (peer.clone(), cycle.clone());
        Box::pin(tput(REDIS_TASKS, dur, first, move |i| {
            cycle(peer.clone(), i)
        }))
    };
    let ceiling_prefix = format!("{prefix}_ceiling:");
    let busy = Arc::new(Mutex::new(Vec::new()));
    let m = if with_ceiling {
        let conn = rt.block_on(async {
            redis::Client::open(url.as_str())
                .unwrap()
                .get_connection_manager()
                .await
                .expect("connect")
        });
        let ceiling_side = ceiling_side(&conn, &ceiling_prefix, dur, busy.clone());
        let sides: [&dyn Fn(u64) -> RoundFuture; 3] = [&guard_side, &peer_side, &ceiling_side];
        // Rounds in whole turns, so that each side goes first equally often.
        let rounds = (ctx.rounds.min(6) / sides.len()).max(1) * sides.len();
        interleave_tput_sides(ctx, &rt, rounds, &sides)
    } else {
        interleave_tput_sides(ctx, &rt, ctx.rounds.min(5), &[&guard_side, &peer_side])
    };
    rt.block_on(async {
        redis_cleanup(&url, &format!("{{{prefix}:*")).await;
        redis_cleanup(&url, &format!("{peer_prefix}*")).await;
        if with_ceiling {
            redis_cleanup(&url, &format!("{ceiling_prefix}*")).await;
        }
    });
    let (g, b) = (m[0], m[1]);
    let mut report = tput_report(
        g,
        b,
        peer_name,
        format!(
            "{REDIS_TASKS} tasks each side, {:.1} s rounds",
            dur.as_secs_f64()
        ),
    );
    if let Some(c) = m.get(2) {
        report.notes.push(format!(
            "ceiling, same run: the store's server work for a cycle as raw commands (as in redis_cycle_tput): {c:.0} cycles/s, {:.3} of the peer, the server's command thread busy {:.0} % of those rounds; guard {:.3} of it",
            c / b,
            median(busy.lock().unwrap().clone()) * 100.0,
            g / c
        ));
    }
    Ok(report)
}

/// Guard cycles/s on Redis vs the `idempotent` crate 0.3's `ValkeyStore`
/// `try_insert` + `complete`, 64 tasks each.
fn redis_cycle_vs_idempotent_tput(ctx: &Ctx) -> Result<Report, Skip> {
    use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
    use idempotent::store::valkey::ValkeyStore;
    use idempotent::store::{IdempotencyStore, InsertResult};
    use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};

    redis_vs_peer(
        ctx,
        "idempotent 0.3 ValkeyStore",
        true,
        |url, prefix| async move {
            let client = redis::Client::open(url.as_str()).unwrap();
            ValkeyStore::with_prefix(client, Some(&prefix))
                .await
                .expect("valkey store")
        },
        |peer: Arc<ValkeyStore>, i| async move {
            let key = IdempotencyKey::new(format!("evt_{i:020}")).expect("key");
            let fp = DefaultFingerprintStrategy.compute("POST /webhooks", BODY);
            let entry = IdempotencyEntry::new(fp, Duration::from_secs(600));
            let Ok(InsertResult::Claimed { fencing_token }) =
                peer.try_insert(&key, entry.clone()).await
            else {
                return false;
            };
            black_box(()); // the no-op handler
            let response = CachedResponse {
                status_code: 200,
                metadata: Metadata::default(),
                body: bytes::Bytes::new(),
            };
            peer.complete(&key, entry.complete(response), fencing_token)
                .await
                .is_ok()
        },
    )
}

/// Guard cycles/s on Redis vs the `klauthed-data` crate 1.0's
/// `RedisIdempotencyStore` `begin` + `complete`, 64 tasks each: a `SET NX PX` of a
/// JSON record, then a `GET` and a `SET` (three round trips, no fencing).
fn redis_cycle_vs_klauthed_tput(ctx: &Ctx) -> Result<Report, Skip> {
    use klauthed_data::idempotency::redis::RedisIdempotencyStore;
    use klauthed_data::idempotency::{IdempotencyStore, Outcome as KOutcome};

    redis_vs_peer(
        ctx,
        "klauthed-data 1.0 RedisIdempotencyStore",
        false,
        |url, prefix| async move {
            let client = redis::Client::open(url.as_str()).unwrap();
            let conn = client.get_connection_manager().await.expect("connect");
            (
                RedisIdempotencyStore::with_ttl_ms(conn, 600_000),
                format!("{prefix}:evt_"),
            )
        },
        |peer: Arc<(RedisIdempotencyStore, String)>, i| async move {
            let (store, keys) = &*peer;
            let key = format!("{keys}{i:020}");
            if store.begin(&key).await.ok() != Some(KOutcome::New) {
                return false;
            }
            black_box(()); // the no-op handler
            store.complete(&key, serde_json::Value::Null).await.is_ok()
        },
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    Postgres,
    MySql,
    Sqlite,
}

#[derive(Clone)]
enum Pool {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

/// Runs `$e` with `$p` bound to the pool inside `$pool`, whichever database it is.
macro_rules! on_pool {
    ($pool:expr, $p:ident => $e:expr) => {
        match $pool {
            Pool::Pg($p) => $e,
            Pool::My($p) => $e,
            Pool::Lite($p) => $e,
        }
    };
}

impl Pool {
    async fn exec(&self, sql: &str) {
        on_pool!(self, p => sqlx::raw_sql(sql).execute(p).await.map(drop))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// One raw insert-if-absent of a full record row into `sql` (the statement of
    /// [`raw_insert_sql`]); whether a row was inserted.
    async fn insert(&self, sql: &str, id: &str) -> bool {
        let now = Utc::now().timestamp_millis();
        self.insert_with(sql, id, now ^ 0x5bd1_e995, now).await
    }

    /// [`Pool::insert`] with the row's token and time given.
    async fn insert_with(&self, sql: &str, id: &str, token: i64, now: i64) -> bool {
        const FP: [u8; 32] = [7; 32];
        let expires = now + 72 * 3600 * 1000;
        let n = on_pool!(self, p => sqlx::query(sql)
            .bind("default")
            .bind(id)
            .bind(&FP[..])
            .bind(token)
            .bind(now)
            .bind(expires)
            .bind(now)
            .bind(now)
            .execute(p)
            .await
            .expect("raw insert")
            .rows_affected());
        n == 1
    }

    /// The reference cycle on `id`: the insert-if-absent of an `in_progress` row
    /// (`insert`, from [`raw_insert_sql`]), then the fenced update a finish makes
    /// (`finish`, from [`raw_finish_sql`]); whether both changed a row.
    async fn reference_cycle(&self, insert: &str, finish: &str, id: &str) -> bool {
        let now = Utc::now().timestamp_millis();
        let token = now ^ 0x5bd1_e995;
        if !self.insert_with(insert, id, token, now).await {
            return false;
        }
        let done = Utc::now().timestamp_millis();
        let n = on_pool!(self, p => sqlx::query(finish)
            .bind(done)
            .bind(done + 72 * 3600 * 1000)
            .bind("default")
            .bind(id)
            .bind(token)
            .execute(p)
            .await
            .expect("raw finish")
            .rows_affected());
        n == 1
    }
}

const COLUMNS: &str =
    "namespace, id, state, fingerprint, token, attempts, failures, lease_until, expires_at, created_at, updated_at, history";

/// The baseline statement: one insert-if-absent of a whole record row.
fn raw_insert_sql(backend: Backend, table: &str, state: &str) -> String {
    match backend {
        Backend::Postgres => format!(
            "INSERT INTO {table} ({COLUMNS}) VALUES ($1, $2, '{state}', $3, $4, 1, 0, $5, $6, $7, $8, '') ON CONFLICT DO NOTHING"
        ),
        Backend::MySql => format!(
            "INSERT IGNORE INTO {table} ({COLUMNS}) VALUES (?, ?, '{state}', ?, ?, 1, 0, ?, ?, ?, ?, '')"
        ),
        Backend::Sqlite => format!(
            "INSERT INTO {table} ({COLUMNS}) VALUES (?, ?, '{state}', ?, ?, 1, 0, ?, ?, ?, ?, '') ON CONFLICT DO NOTHING"
        ),
    }
}

/// The fenced update of the reference cycle: by key and token, an `in_progress`
/// row becomes `completed` with a new expiry (binds: now, expiry, namespace, id,
/// token), the columns a store's finish sets.
fn raw_finish_sql(backend: Backend, table: &str) -> String {
    let set = "state = 'completed', failures = 0, history = ''";
    match backend {
        Backend::Postgres => format!(
            "UPDATE {table} SET {set}, updated_at = $1, expires_at = $2 \
             WHERE namespace = $3 AND id = $4 AND state = 'in_progress' AND token = $5"
        ),
        Backend::MySql | Backend::Sqlite => format!(
            "UPDATE {table} SET {set}, updated_at = ?, expires_at = ? \
             WHERE namespace = ? AND id = ? AND state = 'in_progress' AND token = ?"
        ),
    }
}

/// A pool, a guard on a store in the fresh table `table` (created), and a store in
/// `{table}_raw` (created, for the baseline). `drop_sql` removes both.
struct SqlBench {
    backend: Backend,
    pool: Pool,
    guard: WebhookGuard,
    table: String,
    raw_table: String,
    sqlite_path: Option<std::path::PathBuf>,
}

const SQL_POOL: u32 = 16;
const SQL_TASKS: usize = 16;

fn sql_var(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "WEBHOOK_GUARD_POSTGRES_URL",
        Backend::MySql => "WEBHOOK_GUARD_MYSQL_URL",
        Backend::Sqlite => "",
    }
}

async fn sql_bench(backend: Backend, url: &str) -> SqlBench {
    use webhook_guard::store::{MySqlStore, PostgresStore, SqliteStore};
    let table = fresh_name();
    let raw_table = format!("{table}_raw");
    let mut sqlite_path = None;
    let (pool, guard) = match backend {
        Backend::Postgres => {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(SQL_POOL)
                .connect(url)
                .await
                .expect("postgres");
            let store = PostgresStore::with_table(pool.clone(), &table).unwrap();
            store.migrate().await.expect("migrate");
            let raw = PostgresStore::with_table(pool.clone(), &raw_table).unwrap();
            raw.migrate().await.expect("migrate");
            (Pool::Pg(pool), guard_on(store))
        }
        Backend::MySql => {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(SQL_POOL)
                .connect(url)
                .await
                .expect("mysql");
            let store = MySqlStore::new(pool.clone()).with_table(&table).unwrap();
            store.migrate().await.expect("migrate");
            let raw = MySqlStore::new(pool.clone())
                .with_table(&raw_table)
                .unwrap();
            raw.migrate().await.expect("migrate");
            (Pool::My(pool), guard_on(store))
        }
        Backend::Sqlite => {
            let path = std::env::temp_dir().join(format!("{table}.db"));
            // The store's own pool and settings (`SqliteStore::open`).
            let store = SqliteStore::open(&path).await.expect("sqlite");
            let pool = store.pool().clone();
            let store = SqliteStore::with_table(pool.clone(), &table).unwrap();
            store.migrate().await.expect("migrate");
            let raw = SqliteStore::with_table(pool.clone(), &raw_table).unwrap();
            raw.migrate().await.expect("migrate");
            sqlite_path = Some(path);
            (Pool::Lite(pool), guard_on(store))
        }
    };
    SqlBench {
        backend,
        pool,
        guard,
        table,
        raw_table,
        sqlite_path,
    }
}

impl SqlBench {
    async fn drop_tables(&self) {
        if let Some(path) = &self.sqlite_path {
            if let Pool::Lite(p) = &self.pool {
                p.close().await;
            }
            for ext in ["", "-wal", "-shm"] {
                let mut p = path.clone().into_os_string();
                p.push(ext);
                let _ = std::fs::remove_file(p);
            }
            return;
        }
        for t in [&self.table, &self.raw_table] {
            for suffix in ["", "_inbox", "_objects"] {
                self.pool
                    .exec(&format!("DROP TABLE IF EXISTS {t}{suffix}"))
                    .await;
            }
        }
    }
}

fn sql_url(ctx: &Ctx, backend: Backend) -> Result<String, Skip> {
    match backend {
        Backend::Sqlite => Ok(String::new()),
        b => ctx.server(sql_var(b)),
    }
}

/// Guard cycles/s, 16 tasks on a pool of 16, vs raw insert-if-absent statements/s
/// of a whole record row, 16 tasks, same pool; a third side, the reference cycle
/// (the same insert, then a fenced update: the least a fenced cycle asks of the
/// database, with no crate code), is reported in a note.
fn sql_cycle_tput(ctx: &Ctx, backend: Backend) -> Result<Report, Skip> {
    let url = sql_url(ctx, backend)?;
    let rt = runtime();
    // Shorter rounds than the other backends': three sides here, and the whole run
    // stays under 10 minutes.
    let dur = round_time(ctx).mul_f64(2.0 / 3.0);
    let bench = rt.block_on(sql_bench(backend, &url));
    let insert = Arc::new(raw_insert_sql(backend, &bench.raw_table, "completed"));
    let claim = Arc::new(raw_insert_sql(backend, &bench.raw_table, "in_progress"));
    let finish = Arc::new(raw_finish_sql(backend, &bench.raw_table));
    let guard_side = |first| -> RoundFuture {
        let guard = bench.guard.clone();
        Box::pin(tput(SQL_TASKS, dur, first, move |i| {
            let guard = guard.clone();
            async move { guard_cycle(&guard, "evt_", i).await }
        }))
    };
    let insert_side = |first| -> RoundFuture {
        let (pool, insert) = (bench.pool.clone(), insert.clone());
        Box::pin(tput(SQL_TASKS, dur, first, move |i| {
            let (pool, insert) = (pool.clone(), insert.clone());
            async move { pool.insert(&insert, &format!("evt_{i:020}")).await }
        }))
    };
    let reference_side = |first| -> RoundFuture {
        let (pool, claim, finish) = (bench.pool.clone(), claim.clone(), finish.clone());
        Box::pin(tput(SQL_TASKS, dur, first, move |i| {
            let (pool, claim, finish) = (pool.clone(), claim.clone(), finish.clone());
            async move {
                pool.reference_cycle(&claim, &finish, &format!("ref_{i:020}"))
                    .await
            }
        }))
    };
    // Rounds in whole turns of three, so that each side goes first equally often.
    let rounds = (ctx.rounds.min(6) / 3).max(1) * 3;
    let m = interleave_tput_sides(
        ctx,
        &rt,
        rounds,
        &[&guard_side, &insert_side, &reference_side],
    );
    let (g, b, r) = (m[0], m[1], m[2]);
    rt.block_on(bench.drop_tables());
    let pool = if backend == Backend::Sqlite {
        "the store's own pool (SqliteStore::open, 4 connections)".to_owned()
    } else {
        format!("pool of {SQL_POOL}")
    };
    let mut report = tput_report(
        g,
        b,
        match backend {
            Backend::MySql => "INSERT IGNORE",
            _ => "INSERT .. ON CONFLICT DO NOTHING",
        },
        format!(
            "{SQL_TASKS} tasks, {pool}, {:.1} s rounds; a cycle commits twice, an insert once",
            dur.as_secs_f64()
        ),
    );
    report.notes.push(format!(
        "reference, same run: the insert then a fenced UPDATE, no crate code: {r:.0} cycles/s, {:.3} of the insert; guard {:.3} of it",
        r / b,
        g / r
    ));
    Ok(report)
}

fn postgres_cycle_tput(ctx: &Ctx) -> Result<Report, Skip> {
    sql_cycle_tput(ctx, Backend::Postgres)
}
fn mysql_cycle_tput(ctx: &Ctx) -> Result<Report, Skip> {
    sql_cycle_tput(ctx, Backend::MySql)
}
fn sqlite_cycle_tput(ctx: &Ctx) -> Result<Report, Skip> {
    sql_cycle_tput(ctx, Backend::Sqlite)
}

/// Inserts `n` records that expired long ago (`expires_at` = 1 ms), in chunks.
async fn bulk_insert_expired(bench: &SqlBench, n: usize) {
    const CHUNK: usize = 100_000;
    let t = &bench.table;
    for start in (0..n).step_by(CHUNK) {
        let k = CHUNK.min(n - start);
        let sql = match bench.backend {
            Backend::Postgres => format!(
                "INSERT INTO {t} ({COLUMNS}) SELECT 'default', 'old_' || g, 'completed', \
                 decode(repeat('00', 32), 'hex'), 0, 1, 0, 0, 1, 0, 0, '' \
                 FROM generate_series({start}, {}) g",
                start + k - 1
            ),
            Backend::MySql => {
                let digits = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
                              UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
                format!(
                    "INSERT INTO {t} ({COLUMNS}) SELECT 'default', CONCAT('old_', {start} + n), 'completed', \
                     UNHEX(REPEAT('00', 32)), 0, 1, 0, 0, 1, 0, 0, '' FROM \
                     (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n \
                      FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f) s WHERE n < {k}"
                )
            }
            Backend::Sqlite => format!(
                "WITH RECURSIVE s(n) AS (SELECT {start} UNION ALL SELECT n + 1 FROM s WHERE n < {}) \
                 INSERT INTO {t} ({COLUMNS}) SELECT 'default', 'old_' || n, 'completed', zeroblob(32), \
                 0, 1, 0, 0, 1, 0, 0, '' FROM s",
                start + k - 1
            ),
        };
        bench.pool.exec(&sql).await;
    }
}

/// One timed claim (`WebhookGuard::begin`) of a fresh id, then its completion.
async fn timed_claim(guard: &WebhookGuard, i: u64) -> u64 {
    let id = format!("evt_{i:020}");
    let headers = [(ID_HEADER, id.as_str())];
    let t = Instant::now();
    let begin = guard.begin(&headers, BODY).await;
    let ns = t.elapsed().as_nanos() as u64;
    match begin {
        webhook_guard::Begin::Claimed(c) => {
            c.complete().await;
        }
        _ => panic!("fresh id {id} not claimed"),
    }
    ns
}

/// p99 claim latency while `purge_expired` (batches of 1,000) removes `n` expired
/// records vs p99 claim latency idle, on the same store and table.
fn sql_sweep(ctx: &Ctx, backend: Backend) -> Result<Report, Skip> {
    const PURGE_BATCH: usize = 1000;
    let url = sql_url(ctx, backend)?;
    let n = ctx.n(1_000_000);
    let rt = runtime();
    let bench = rt.block_on(sql_bench(backend, &url));
    let t = Instant::now();
    rt.block_on(bulk_insert_expired(&bench, n));
    let insert_s = t.elapsed().as_secs_f64();
    let (idle, busy, samples, purge_s, purged) = rt.block_on(async {
        let guard = &bench.guard;
        let mut i = 0u64;
        // Warm-up, then idle for about as long as a short purge.
        for _ in 0..50 {
            timed_claim(guard, i).await;
            i += 1;
        }
        let mut lat = Vec::new();
        let t = Instant::now();
        while lat.len() < 200 || (t.elapsed() < Duration::from_secs(3) && lat.len() < 20_000) {
            lat.push(timed_claim(guard, i).await);
            i += 1;
        }
        let idle = p99(&mut lat);
        let store = guard.store().clone();
        let purger = tokio::spawn(async move {
            let t = Instant::now();
            let now = Utc::now();
            let mut total = 0;
            loop {
                let k = store.purge_expired(now, PURGE_BATCH).await.expect("purge");
                total += k;
                if k == 0 {
                    break;
                }
            }
            (t.elapsed().as_secs_f64(), total)
        });
        let mut lat = Vec::new();
        while !purger.is_finished() {
            lat.push(timed_claim(guard, i).await);
            i += 1;
        }
        let (purge_s, purged) = purger.await.expect("purger");
        let samples = lat.len();
        (idle, p99(&mut lat), samples, purge_s, purged)
    });
    rt.block_on(bench.drop_tables());
    assert!(purged >= n as u64, "purged {purged} of {n}");
    Ok(Report {
        ratio: busy / idle,
        guard: Figure { what: "p99 claim during purge", value: busy / 1e3, unit: "µs" },
        baseline: Figure { what: "p99 claim idle", value: idle / 1e3, unit: "µs" },
        notes: vec![format!(
            "purge of {n} expired records (batches of {PURGE_BATCH}): {purge_s:.1} s ({:.0} records/s); \
             {samples} claims sampled during it; bulk insert took {insert_s:.1} s",
            n as f64 / purge_s
        )],
    })
}

fn sweep_claim_p99_sqlite(ctx: &Ctx) -> Result<Report, Skip> {
    sql_sweep(ctx, Backend::Sqlite)
}
fn sweep_claim_p99_postgres(ctx: &Ctx) -> Result<Report, Skip> {
    sql_sweep(ctx, Backend::Postgres)
}
fn sweep_claim_p99_mysql(ctx: &Ctx) -> Result<Report, Skip> {
    sql_sweep(ctx, Backend::MySql)
}

// ---------------------------------------------------------------------------
// End to end: axum over loopback HTTP.
// ---------------------------------------------------------------------------

const HTTP_CONNECTIONS: usize = 32;

/// A Stripe-shaped body with id `evt_{i}`.
fn stripe_body(i: u64) -> String {
    format!(
        r#"{{"id":"evt_{i:020}","object":"event","type":"charge.succeeded","created":1700000000,"livemode":false,"data":{{"object":{{"id":"ch_3NDEXAMPLE","object":"charge","amount":2000,"currency":"usd","status":"succeeded"}}}}}}"#
    )
}

/// One signed HTTP/1.1 keep-alive request for event `i`.
fn stripe_request(stripe: &webhook_guard::verify::Stripe, i: u64) -> Vec<u8> {
    let body = stripe_body(i);
    let sig = stripe.sign(body.as_bytes(), Utc::now().timestamp());
    format!(
        "POST /webhooks HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         stripe-signature: {sig}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads one response on a keep-alive connection; its status.
async fn read_response(
    r: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
    line: &mut String,
) -> u16 {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    line.clear();
    r.read_line(line).await.expect("status line");
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let mut len = 0usize;
    loop {
        line.clear();
        r.read_line(line).await.expect("header");
        if line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().expect("content-length");
            }
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).await.expect("body");
    status
}

/// Requests/s of 32 keep-alive connections sending signed Stripe deliveries with
/// fresh ids to `addr` for `dur`.
async fn http_load(
    addr: std::net::SocketAddr,
    stripe: Arc<webhook_guard::verify::Stripe>,
    dur: Duration,
    first: u64,
) -> (f64, u64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::AsyncWriteExt;
    let next = Arc::new(AtomicU64::new(first));
    let mut conns = Vec::new();
    for _ in 0..HTTP_CONNECTIONS {
        let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).unwrap();
        conns.push(s);
    }
    let t = Instant::now();
    let handles: Vec<_> = conns
        .into_iter()
        .map(|s| {
            let (next, stripe) = (next.clone(), stripe.clone());
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut r = tokio::io::BufReader::new(r);
                let mut line = String::new();
                let mut done = 0u64;
                while t.elapsed() < dur {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    w.write_all(&stripe_request(&stripe, i))
                        .await
                        .expect("write");
                    let status = read_response(&mut r, &mut line).await;
                    assert_eq!(status, 200, "delivery {i}");
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut done = 0;
    for h in handles {
        done += h.await.expect("connection");
    }
    (
        done as f64 / t.elapsed().as_secs_f64(),
        next.load(Ordering::Relaxed),
    )
}

/// Requests/s through an axum route guarded with the Stripe preset on
/// `MemoryStore` vs the same route that reads the body and answers 200 without
/// verifying or storing, 32 keep-alive connections over loopback, client and
/// server on one 2-worker runtime.
fn axum_e2e_tput(ctx: &Ctx) -> Result<Report, Skip> {
    use axum::routing::post;
    use webhook_guard::integrations::axum::guarded;
    use webhook_guard::verify::Stripe;

    let rt = runtime();
    let stripe = Arc::new(Stripe::new([VERIFY_SECRET]).expect("secret"));
    let dur = round_time(ctx);
    let (guarded_addr, plain_addr) = rt.block_on(async {
        let guard = WebhookGuard::builder()
            .store(MemoryStore::new())
            .verifier(Stripe::new([VERIFY_SECRET]).expect("secret"))
            .build()
            .expect("guard");
        let guarded_app = axum::Router::new().route(
            "/webhooks",
            guarded(guard, |_event: webhook_guard::OwnedEvent| async {
                Ok::<(), HandlerError>(())
            }),
        );
        let plain_app = axum::Router::new().route(
            "/webhooks",
            post(|body: bytes::Bytes| async move {
                black_box(body);
                axum::http::StatusCode::OK
            }),
        );
        let mut addrs = Vec::new();
        for app in [guarded_app, plain_app] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            addrs.push(listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        }
        (addrs[0], addrs[1])
    });
    let (g, b) = interleave_tput(
        ctx,
        &rt,
        |first| http_load(guarded_addr, stripe.clone(), dur, first),
        |first| http_load(plain_addr, stripe.clone(), dur, first),
    );
    Ok(Report {
        ratio: g / b,
        guard: Figure {
            what: "guarded route",
            value: g,
            unit: "req/s",
        },
        baseline: Figure {
            what: "plain route",
            value: b,
            unit: "req/s",
        },
        notes: vec![format!(
            "{HTTP_CONNECTIONS} keep-alive connections, {:.1} s rounds, ~220-byte Stripe bodies; \
             client signing and server share 2 workers",
            dur.as_secs_f64()
        )],
    })
}
