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

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::{Arc, Barrier, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use chrono::{TimeDelta, TimeZone, Utc};
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
        "sweep_claim_p99_memory",
        AtMost(5.0),
        sweep_claim_p99_memory,
    ),
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
}
use Target::{AtLeast, AtMost};

impl Target {
    fn met(self, ratio: f64) -> bool {
        match self {
            AtMost(t) => ratio <= t,
            AtLeast(t) => ratio >= t,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AtMost(t) => write!(f, "<= {t}"),
            AtLeast(t) => write!(f, ">= {t}"),
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
        let (mut g, mut b) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            if round % 2 == 0 {
                g.push(guard());
                b.push(baseline());
            } else {
                b.push(baseline());
                g.push(guard());
            }
        }
        (median(g), median(b))
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
        const CHUNK: usize = 10_000;
        let (mut g, mut b) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut state = setup();
            let (mut tg, mut tb) = (Duration::ZERO, Duration::ZERO);
            for (c, start) in (0..n).step_by(CHUNK).enumerate() {
                let range = start..(start + CHUNK).min(n);
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
    #[allow(dead_code)] // used by the backend comparisons added after the merge
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
                let met = c.target.met(report.ratio);
                println!(
                    "{:<34} ratio {:>7.3} (target {}, {})  {}  |  {}  [{:.1} s]",
                    c.name,
                    report.ratio,
                    c.target,
                    if met { "met" } else { "MISSED" },
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
        notes: vec![format!("{n} ids held, {} probed per round", probe.len())],
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

/// Guard cycles/s on `MemoryStore` with 64 tasks vs the `idempotent` crate 0.3's
/// `MemoryStore` claim + complete with 64 tasks, on the same 2-worker runtime.
fn memory_cycle_vs_idempotent_tput(ctx: &Ctx) -> Result<Report, Skip> {
    use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
    use idempotent::store::{IdempotencyStore, InsertResult};
    use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};

    const TASKS: usize = 64;
    let n = ctx.n(200_000);
    let ids = Arc::new(ids(0, n));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let chunk = n.div_ceil(TASKS);

    let guard_round = || {
        rt.block_on(async {
            let guard = guard_on(MemoryStore::new());
            let t = Instant::now();
            let tasks: Vec<_> = (0..TASKS)
                .map(|k| {
                    let (guard, ids) = (guard.clone(), ids.clone());
                    tokio::spawn(async move {
                        for id in ids.iter().skip(k * chunk).take(chunk) {
                            let outcome = cycle(&guard, id).await;
                            debug_assert!(matches!(outcome, Outcome::Processed { .. }));
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("task");
            }
            n as f64 / t.elapsed().as_secs_f64()
        })
    };
    let idempotent_round = || {
        rt.block_on(async {
            let store = Arc::new(idempotent::store::memory::MemoryStore::new(
                1024,
                Duration::from_secs(3600),
            ));
            let ttl = Duration::from_secs(72 * 3600);
            let t = Instant::now();
            let tasks: Vec<_> = (0..TASKS)
                .map(|k| {
                    let (store, ids) = (store.clone(), ids.clone());
                    tokio::spawn(async move {
                        for id in ids.iter().skip(k * chunk).take(chunk) {
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
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("task");
            }
            n as f64 / t.elapsed().as_secs_f64()
        })
    };
    let (g, b) = ctx.interleave(ctx.rounds, guard_round, idempotent_round);
    Ok(Report {
        ratio: g / b,
        guard: Figure {
            what: "guard",
            value: g,
            unit: "cycles/s",
        },
        baseline: Figure {
            what: "idempotent 0.3",
            value: b,
            unit: "cycles/s",
        },
        notes: vec![format!(
            "{n} cycles per round, {TASKS} tasks, 2 tokio workers"
        )],
    })
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
