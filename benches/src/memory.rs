//! In-memory comparisons: the guard on `MemoryStore` against a bare map, one thread
//! against two, the in-memory stores of peer crates, a purge under load, and the
//! bytes a record costs.

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use chrono::{TimeDelta, TimeZone, Utc};
use webhook_guard::clock::{Clock, ManualClock};
use webhook_guard::store::Fingerprint;
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, MemoryStore, Outcome, ProcessedStore, WebhookGuard};

use crate::harness::{
    cycle, guard_on, ids, median, ns_per, p99, ready, Ctx, Figure, Report, Skip, BODY, ID_HEADER,
};
use crate::tput::runtime;

/// The bare baseline map: check, then insert.
pub(crate) type BareMap = Mutex<HashMap<String, u64>>;

pub(crate) fn bare_insert(map: &BareMap, id: &str, v: u64) -> bool {
    let mut m = map.lock().unwrap();
    if m.contains_key(id) {
        return false;
    }
    m.insert(id.to_owned(), v);
    true
}

/// Full guard cycle on `MemoryStore` over 1,000,000 unique ids (the store grows to
/// 1M records) vs check-and-insert of the same ids in a bare `Mutex<HashMap>`,
/// both growing side by side in alternating chunks.
pub(crate) fn memory_cycle(ctx: &Ctx) -> Result<Report, Skip> {
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
pub(crate) fn memory_duplicate(ctx: &Ctx) -> Result<Report, Skip> {
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
pub(crate) fn memory_cycle_2t_tput(ctx: &Ctx) -> Result<Report, Skip> {
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
pub(crate) const MEMORY_TASKS: usize = 64;

/// Cycles/s of one round on `rt`: [`MEMORY_TASKS`] tasks, task `k` running
/// `task(state, range)` over its share of `n` items.
pub(crate) fn memory_tasks_round<S, Fut>(
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
pub(crate) fn memory_guard_round(rt: &tokio::runtime::Runtime, ids: &Arc<Vec<String>>) -> f64 {
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
pub(crate) fn memory_cycle_vs_idempotent_tput(ctx: &Ctx) -> Result<Report, Skip> {
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
pub(crate) fn memory_cycle_vs_klauthed_tput(ctx: &Ctx) -> Result<Report, Skip> {
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

pub(crate) fn memory_peer_report(g: f64, b: f64, peer: &'static str, n: usize) -> Report {
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
pub(crate) fn sweep_claim_p99_memory(ctx: &Ctx) -> Result<Report, Skip> {
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
            if let webhook_guard::guard::Begin::Claimed(c) = begin {
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

/// RSS growth ÷ records at 1,000,000 records with 30-byte ids, as a ratio to 200 B.
///
/// Measured in a child process of this binary: a fresh heap, so neither earlier
/// comparisons' freed memory (which the allocator would reuse, hiding growth) nor
/// their fragmentation blurs the figure. The child also measures a bare
/// `HashMap<String, [u8; 24]>` for reference.
pub(crate) fn memory_bytes_per_record(ctx: &Ctx) -> Result<Report, Skip> {
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

pub(crate) const CHILD_VAR: &str = "WG_BENCH_CHILD";

pub(crate) fn run_child(what: &str, n: usize) -> f64 {
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

pub(crate) fn child_main(spec: &str) {
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
pub(crate) fn rss() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: i64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}
