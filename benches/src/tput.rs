//! The throughput harness of the backend and HTTP comparisons: tasks on one
//! 2-worker runtime, rounds of a fixed duration, fresh ids from a shared counter.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use webhook_guard::{Outcome, WebhookGuard};

use crate::harness::{cycle, Ctx, Figure, Report};

/// A 2-worker runtime, like the memory comparisons.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A fresh name for tables and key prefixes: `wgb_<pid>_<nanos>`.
pub(crate) fn fresh_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("wgb_{}_{nanos}", std::process::id())
}

/// How long one throughput round runs, scaled (at least 0.3 s).
pub(crate) fn round_time(ctx: &Ctx) -> Duration {
    Duration::from_secs_f64((2.0 * ctx.scale).clamp(0.3, 2.0))
}

/// Operations per second of `tasks` tasks each calling `op(i)` with fresh `i` from a
/// shared counter, for `dur`. `op` returns whether its operation succeeded as
/// expected; a failure panics.
pub(crate) async fn tput<F, Fut>(tasks: usize, dur: Duration, first: u64, op: F) -> (f64, u64)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    tput_each(tasks, dur, first, 1, op).await
}

/// [`tput`] where one call `op(i)` makes `per` operations, on ids `i..i + per`.
pub(crate) async fn tput_each<F, Fut>(
    tasks: usize,
    dur: Duration,
    first: u64,
    per: u64,
    op: F,
) -> (f64, u64)
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
pub(crate) async fn guard_cycle(guard: &WebhookGuard, prefix: &str, i: u64) -> bool {
    let id = format!("{prefix}{i:020}");
    matches!(cycle(guard, &id).await, Outcome::Processed { .. })
}

/// Interleaved throughput rounds on one runtime: `guard(first)` and
/// `baseline(first)` each return (ops/s, next free index).
pub(crate) fn interleave_tput<G, B, GF, BF>(
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
pub(crate) type RoundFuture = std::pin::Pin<Box<dyn Future<Output = (f64, u64)>>>;

/// [`interleave_tput`] for any number of sides ([`Ctx::interleave_sides`]): each
/// round of a side starts at the index the round before it stopped at, so no two
/// rounds use the same ids. The median ops/s of each side.
pub(crate) fn interleave_tput_sides(
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

pub(crate) fn tput_report(g: f64, b: f64, base_what: &'static str, note: String) -> Report {
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
