//! Listing: the newest 100 failed records among 1,000,000 on each SQL backend,
//! against one `get` of a record on the same store.

use std::time::Instant;

use chrono::Utc;
use webhook_guard::store::listing::{ListState, RecordQuery};
use webhook_guard::store::Key;

use crate::harness::{median, Ctx, Figure, Report, Skip};
use crate::sql::{sql_bench, sql_url, Backend, SqlBench, COLUMNS};
use crate::tput::runtime;

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
    let (list, get) = rt.block_on(async {
        let store = bench.guard.store().clone();
        let listing = store.record_listing().expect("the SQL stores list");
        let query = RecordQuery::new("default", Utc::now())
            .states([ListState::Failed])
            .limit(100);
        let (mut lists, mut gets) = (Vec::new(), Vec::new());
        for round in 0..(20 * ctx.rounds) {
            let t = Instant::now();
            let page = listing.list_records(&query).await.expect("list");
            lists.push(t.elapsed().as_secs_f64());
            assert_eq!(page.items.len(), 100.min(n / 10));
            let id = format!("evt_{}", (round * 7919) % n);
            let t = Instant::now();
            let got = store.get(Key::new("default", &id)).await.expect("get");
            gets.push(t.elapsed().as_secs_f64());
            assert!(got.is_some(), "{id}");
        }
        (median(lists), median(gets))
    });
    rt.block_on(bench.drop_tables());
    Ok(Report {
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
            "{n} records, one in ten failed; bulk insert took {insert_s:.1} s"
        )],
    })
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
