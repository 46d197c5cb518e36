//! The integration tests in one binary: a module per area, all sharing [`support`].
//!
//! Each module is built when the features it needs are on, so any feature set
//! builds this binary (`cargo test --all-features` runs every module). Two tests
//! are binaries of their own because they install process-wide state: `allocations`
//! (a counting global allocator) and `tracing` (it reads the delivery span through
//! its own subscriber; [`support::statements_run`] installs a global one here).

// The guard's flow on the memory store.
#[cfg(feature = "conformance")]
mod conformance_memory;
#[cfg(feature = "tokio")]
mod guard;
#[cfg(feature = "tokio")]
mod inbox;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "tokio")]
mod routing;
mod store_calls;
// Many tenants behind one guard, on the memory store, PostgreSQL and through axum.
#[cfg(feature = "axum")]
mod tenants;

// Signatures and hostile input.
#[cfg(feature = "tokio")]
mod forgery;
mod fuzz_regressions;
#[cfg(feature = "tokio")]
mod misconfig;
mod providers_b;
#[cfg(feature = "tokio")]
mod replay;
// Deliveries signed by the providers' own SDKs (scripts/sdk_vectors.sh).
#[cfg(feature = "ed25519")]
mod sdk_vectors;
mod verify_providers;
mod verify_tool;

// Recovering missed events through the providers' list APIs.
#[cfg(all(
    feature = "stripe-catch-up",
    feature = "svix-catch-up",
    feature = "sqlite",
    feature = "postgres"
))]
mod catch_up;

// Web integrations and the operator tool.
#[cfg(feature = "actix")]
mod actix;
#[cfg(all(feature = "cli", feature = "axum"))]
mod cli;
#[cfg(feature = "console")]
mod console;
#[cfg(feature = "axum")]
mod detached;
// Every preset's handshake through the web integrations.
#[cfg(feature = "axum")]
mod handshakes;
#[cfg(feature = "lambda")]
mod lambda;
#[cfg(feature = "tower")]
mod tower;
// axum, tower and actix-web through real HTTP, from one list of scenarios.
#[cfg(any(feature = "axum", feature = "tower", feature = "actix"))]
mod web_cases;

// Each store backend against its live server.
#[cfg(all(feature = "dynamodb", feature = "conformance"))]
mod dynamodb;
#[cfg(all(feature = "mysql", feature = "conformance"))]
mod mysql;
#[cfg(all(feature = "postgres", feature = "conformance"))]
mod postgres;
#[cfg(all(feature = "redis", feature = "conformance"))]
mod redis;
#[cfg(all(feature = "sqlite", feature = "conformance"))]
mod sqlite;
#[cfg(all(
    feature = "tls",
    feature = "conformance",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]
mod tls;
#[cfg(all(feature = "redis", feature = "conformance"))]
mod valkey;

// Reliability: faults, crashes, load and retry schedules across backends.
#[cfg(all(feature = "tokio", feature = "sqlite", feature = "postgres"))]
mod crash;
#[cfg(all(feature = "postgres", feature = "mysql", feature = "redis"))]
mod faults;
#[cfg(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]
mod followup;
#[cfg(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]
mod load;
#[cfg(all(feature = "postgres", feature = "mysql", feature = "redis"))]
mod outage_answers;
#[cfg(feature = "tokio")]
mod schedules;
#[cfg(all(
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    feature = "sqlite"
))]
mod settle_faults;

mod support;
