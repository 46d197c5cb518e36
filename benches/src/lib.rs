//! Side-by-side comparisons of `webhook-guard`: the guard against a baseline, run
//! interleaved in one process. The bench target `compare` runs them:
//!
//! ```text
//! cargo bench -p webhook-guard-benches --bench compare                 # everything
//! cargo bench -p webhook-guard-benches --bench compare -- memory_cycle # names containing a filter
//! WG_BENCH_SCALE=0.05 WG_BENCH_ROUNDS=3 cargo bench -p webhook-guard-benches --bench compare
//! ```
//!
//! Besides a table, every comparison prints one line `ratio <name> <value>`: guard
//! cost ÷ baseline cost (lower is better), or for names ending in `_tput` guard
//! throughput ÷ baseline throughput (higher is better).
//!
//! # Layout
//!
//! `COMPARISONS` lists every comparison and its target; `main` runs them. The
//! comparisons live by area: `memory`, `verify`, `redis`, `sql` (PostgreSQL, MySQL,
//! SQLite) and `http` (axum end to end). `harness` holds the report types, the
//! interleaving of sides and the shared body, ids and guard; `tput` the throughput
//! rounds of the backend and HTTP comparisons.
//!
//! # Adding a comparison
//!
//! Write one function `fn(&Ctx) -> Result<Report, Skip>` (usually a call to
//! `Ctx::interleave` with a guard side and a baseline side) in the module of its
//! area and add one line to `COMPARISONS`. A comparison that needs a server takes
//! its URL from `Ctx::server`, which skips outside CI and fails in CI when it is
//! missing.
//!
//! # Environment
//!
//! - `WG_BENCH_SCALE` (default 1): multiplies every size, for short runs while
//!   developing (the 1,000,000-record figures need 1).
//! - `WG_BENCH_ROUNDS` (default 7): rounds per side.
//! - `CI`: a comparison whose server is missing fails the run instead of skipping.
//! - `WEBHOOK_GUARD_REDIS_URL`, `WEBHOOK_GUARD_POSTGRES_URL`,
//!   `WEBHOOK_GUARD_MYSQL_URL`: the servers of the backend comparisons (SQLite uses
//!   a file in the temp directory). Each comparison works in fresh tables or under a
//!   fresh key prefix and removes them afterwards.

#![forbid(unsafe_code)]

mod harness;
mod http;
mod listing;
mod memory;
mod redis;
mod sql;
mod tput;
mod verify;

use std::time::Instant;

use self::harness::{load_average, AtLeast, AtMost, Comparison, Ctx, Peer, Skip};
use self::http::axum_e2e_tput;
use self::listing::{
    list_newest_100_mysql, list_newest_100_postgres, list_newest_100_redis, list_newest_100_sqlite,
};
use self::memory::{
    child_main, memory_bytes_per_record, memory_cycle, memory_cycle_2t_tput,
    memory_cycle_vs_idempotent_tput, memory_cycle_vs_klauthed_tput, memory_duplicate,
    sweep_claim_p99_memory, CHILD_VAR,
};
use self::redis::{
    redis_cycle_tput, redis_cycle_vs_ceiling_tput, redis_cycle_vs_idempotent_tput,
    redis_cycle_vs_klauthed_tput, valkey_cycle_vs_ceiling_tput, valkey_cycle_vs_idempotent_tput,
};
use self::sql::{
    mysql_cycle_tput, postgres_cycle_tput, sqlite_cycle_tput, sweep_claim_p99_mysql,
    sweep_claim_p99_postgres, sweep_claim_p99_sqlite,
};
use self::verify::{
    verify_github_4k, verify_standard_4k, verify_standard_vs_hmac_4k, verify_stripe_4k,
};

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
        "redis_cycle_vs_ceiling_tput",
        AtLeast(0.85),
        redis_cycle_vs_ceiling_tput,
    ),
    Comparison::new(
        "redis_cycle_vs_idempotent_tput",
        AtLeast(1.0),
        redis_cycle_vs_idempotent_tput,
    ),
    Comparison::new(
        "valkey_cycle_vs_ceiling_tput",
        AtLeast(0.85),
        valkey_cycle_vs_ceiling_tput,
    ),
    Comparison::new(
        "valkey_cycle_vs_idempotent_tput",
        AtLeast(1.2),
        valkey_cycle_vs_idempotent_tput,
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
    Comparison::new(
        "list_newest_100_postgres",
        AtMost(20.0),
        list_newest_100_postgres,
    ),
    Comparison::new("list_newest_100_mysql", AtMost(20.0), list_newest_100_mysql),
    Comparison::new(
        "list_newest_100_sqlite",
        AtMost(20.0),
        list_newest_100_sqlite,
    ),
    Comparison::new("list_newest_100_redis", AtMost(20.0), list_newest_100_redis),
];

/// Runs every comparison whose name contains one of the arguments (all of them
/// without arguments), prints the table and the `ratio` lines, and exits non-zero
/// when a comparison could not run in CI. Started by itself as a child process
/// (`WG_BENCH_CHILD` set), it measures one memory figure instead.
pub fn main() {
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
