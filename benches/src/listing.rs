//! Listing: the newest 100 failed records among 1,000,000 on each SQL backend and
//! Redis, against one `get` of a record on the same store.
//!
//! The SQL tables are filled by bulk `INSERT … SELECT` of the schema's rows; the
//! Redis store through its own `claim` and `finish` (512 at once), so its keys,
//! due index and listing indexes are exactly what the store keeps.

use std::time::Instant;

use chrono::{DateTime, TimeDelta, Utc};
use webhook_guard::store::listing::{ListState, RecordQuery};
use webhook_guard::store::{
    ClaimRequest, FencingToken, Fingerprint, Finish, Key, ProcessedStore, RecordState,
};

use crate::harness::{median, Ctx, Figure, Report, Skip};
use crate::redis::{redis_cleanup, redis_store};
use crate::sql::{sql_bench, sql_url, Backend, SqlBench, COLUMNS};
use crate::tput::{fresh_name, runtime};

/// Inserts `n` records of namespace `default`, one in ten failed (the others
/// completed), `updated_at` = their number, in chunks.
async fn bulk_insert_listed(bench: &SqlBench, n: usize) {
    const CHUNK: usize = 100_000;
    let t = &bench.table;
    let far = 9_000_000_000_000i64;
    for start in (0..n).step_by(CHUNK) {
        let k = CHUNK.min(n - start);
        let sql = match bench.backend {
            Backend::Postgres => format!(
                "INSERT INTO {t} ({COLUMNS}) SELECT 'default', 'evt_' || g, \
                 CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'completed' END, \
                 decode(repeat('00', 32), 'hex'), 0, 1, 0, g, {far}, g, g, '' \
                 FROM generate_series({start}, {}) g",
                start + k - 1
            ),
            Backend::MySql => {
                let digits = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
                              UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
                format!(
                    "INSERT INTO {t} ({COLUMNS}) SELECT 'default', CONCAT('evt_', {start} + n), \
                     IF(({start} + n) % 10 = 0, 'failed', 'completed'), \
                     UNHEX(REPEAT('00', 32)), 0, 1, 0, {start} + n, {far}, {start} + n, {start} + n, '' FROM \
                     (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n \
                      FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f) s WHERE n < {k}"
                )
            }
            Backend::Sqlite => format!(
                "WITH RECURSIVE s(n) AS (SELECT {start} UNION ALL SELECT n + 1 FROM s WHERE n < {}) \
                 INSERT INTO {t} ({COLUMNS}) SELECT 'default', 'evt_' || n, \
                 CASE WHEN n % 10 = 0 THEN 'failed' ELSE 'completed' END, zeroblob(32), \
                 0, 1, 0, n, {far}, n, n, '' FROM s",
                start + k - 1
            ),
        };
        bench.pool_exec(&sql).await;
    }
}

/// The median time of a page of the newest 100 failed records vs the median time
/// of one `get`, each repeated, on a table of `n` records.
fn list_newest_100(ctx: &Ctx, backend: Backend) -> Result<Report, Skip> {
    let url = sql_url(ctx, backend)?;
    let n = ctx.n(1_000_000);
    let rt = runtime();
    let bench = rt.block_on(sql_bench(backend, &url));
    let t = Instant::now();
    rt.block_on(bulk_insert_listed(&bench, n));
    let insert_s = t.elapsed().as_secs_f64();
    rt.block_on(bench.analyze());
    let store = bench.guard.store().clone();
    let (list, get) = rt.block_on(list_vs_get(ctx, &*store, n, Utc::now()));
    rt.block_on(bench.drop_tables());
    Ok(report(list, get, n, insert_s, "bulk insert"))
}

/// The median time of a page of the newest 100 failed records of namespace
/// `default` and of one `get` of record `evt_<i>`, timed in turn, `20 × rounds`
/// of each.
async fn list_vs_get(
    ctx: &Ctx,
    store: &dyn ProcessedStore,
    n: usize,
    now: DateTime<Utc>,
) -> (f64, f64) {
    let listing = store.record_listing().expect("the store lists");
    let query = RecordQuery::new("default", now)
        .states([ListState::Failed])
        .limit(100);
    let (mut lists, mut gets) = (Vec::new(), Vec::new());
    for round in 0..(20 * ctx.rounds) {
        let id = format!("evt_{}", (round * 7919) % n);
        let list_first = round % 2 == 0;
        for side in [list_first, !list_first] {
            if side {
                let t = Instant::now();
                let page = listing.list_records(&query).await.expect("list");
                lists.push(t.elapsed().as_secs_f64());
                assert_eq!(page.items.len(), 100.min(n / 10));
                assert!(page.items.iter().all(|r| r.state == RecordState::Failed));
            } else {
                let t = Instant::now();
                let got = store.get(Key::new("default", &id)).await.expect("get");
                gets.push(t.elapsed().as_secs_f64());
                assert!(got.is_some(), "{id}");
            }
        }
    }
    (median(lists), median(gets))
}

fn report(list: f64, get: f64, n: usize, fill_s: f64, how: &str) -> Report {
    Report {
        ratio: list / get,
        guard: Figure {
            what: "newest 100 failed",
            value: list * 1e6,
            unit: "µs",
        },
        baseline: Figure {
            what: "one get",
            value: get * 1e6,
            unit: "µs",
        },
        notes: vec![format!(
            "{n} records, one in ten failed; {how} took {fill_s:.1} s"
        )],
    }
}

/// Claims and finishes records `evt_0..n` of namespace `default` through the
/// store, 512 at once: record `i` claimed and finished at `base + i` ms, one in
/// ten failed, the others completed.
async fn fill_through_store(
    store: &webhook_guard::store::RedisStore,
    n: usize,
    base: DateTime<Utc>,
) {
    const TASKS: usize = 512;
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..TASKS {
        let store = store.clone();
        tasks.spawn(async move {
            let keep = Utc::now() + TimeDelta::days(30);
            for i in (k..n).step_by(TASKS) {
                let id = format!("evt_{i}");
                let at = base + TimeDelta::milliseconds(i as i64);
                let request = ClaimRequest {
                    key: Key::new("default", &id),
                    fingerprint: Fingerprint::of(id.as_bytes()),
                    token: FencingToken::random(),
                    now: at,
                    lease_until: at + TimeDelta::seconds(60),
                    expires_at: keep,
                };
                store.claim(&request).await.expect("claim");
                let finish = Finish {
                    state: if i % 10 == 0 {
                        RecordState::Failed
                    } else {
                        RecordState::Completed
                    },
                    failures: u32::from(i % 10 == 0),
                    history: &[],
                    now: at,
                    expires_at: keep,
                };
                let fence = store
                    .finish(request.holder(), &finish)
                    .await
                    .expect("finish");
                assert_eq!(fence, webhook_guard::store::Fence::Applied);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("fill task");
    }
}

/// The newest 100 failed of `n` records in a Redis store (16 shards), against a
/// `get`.
pub(crate) fn list_newest_100_redis(ctx: &Ctx) -> Result<Report, Skip> {
    let url = ctx.server("WEBHOOK_GUARD_REDIS_URL")?;
    let n = ctx.n(1_000_000);
    let rt = runtime();
    let prefix = fresh_name();
    let (list, get, fill_s) = rt.block_on(async {
        let store = redis_store(&url, &prefix).await;
        let base = Utc::now() - TimeDelta::milliseconds(n as i64) - TimeDelta::hours(1);
        let t = Instant::now();
        fill_through_store(&store, n, base).await;
        let fill_s = t.elapsed().as_secs_f64();
        let (list, get) = list_vs_get(ctx, &store, n, Utc::now()).await;
        redis_cleanup(&url, &format!("{{{prefix}:*")).await;
        (list, get, fill_s)
    });
    Ok(report(
        list,
        get,
        n,
        fill_s,
        "claim and finish through the store",
    ))
}

pub(crate) fn list_newest_100_postgres(ctx: &Ctx) -> Result<Report, Skip> {
    list_newest_100(ctx, Backend::Postgres)
}
pub(crate) fn list_newest_100_mysql(ctx: &Ctx) -> Result<Report, Skip> {
    list_newest_100(ctx, Backend::MySql)
}
pub(crate) fn list_newest_100_sqlite(ctx: &Ctx) -> Result<Report, Skip> {
    list_newest_100(ctx, Backend::Sqlite)
}
