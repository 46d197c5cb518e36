//! PostgreSQL, MySQL and SQLite: guard cycles against raw insert-if-absent
//! statements on the same pool, and claim latency while the store purges.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use webhook_guard::WebhookGuard;

use crate::harness::{guard_on, p99, Ctx, Figure, Report, Skip, BODY, ID_HEADER};
use crate::tput::{
    fresh_name, guard_cycle, interleave_tput_sides, round_time, runtime, tput, tput_report,
    RoundFuture,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Backend {
    Postgres,
    MySql,
    Sqlite,
}

#[derive(Clone)]
pub(crate) enum Pool {
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

pub(crate) const COLUMNS: &str =
    "namespace, id, state, fingerprint, token, attempts, failures, lease_until, expires_at, created_at, updated_at, history";

/// The baseline statement: one insert-if-absent of a whole record row.
pub(crate) fn raw_insert_sql(backend: Backend, table: &str, state: &str) -> String {
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
pub(crate) fn raw_finish_sql(backend: Backend, table: &str) -> String {
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
pub(crate) struct SqlBench {
    pub(crate) backend: Backend,
    pool: Pool,
    pub(crate) guard: WebhookGuard,
    pub(crate) table: String,
    raw_table: String,
    sqlite_path: Option<std::path::PathBuf>,
}

pub(crate) const SQL_POOL: u32 = 16;
pub(crate) const SQL_TASKS: usize = 16;

pub(crate) fn sql_var(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "WEBHOOK_GUARD_POSTGRES_URL",
        Backend::MySql => "WEBHOOK_GUARD_MYSQL_URL",
        Backend::Sqlite => "",
    }
}

pub(crate) async fn sql_bench(backend: Backend, url: &str) -> SqlBench {
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
    /// Runs `sql` on the bench's pool.
    pub(crate) async fn pool_exec(&self, sql: &str) {
        self.pool.exec(sql).await;
    }

    /// Updates the planner's statistics of the guard's table.
    pub(crate) async fn analyze(&self) {
        let t = &self.table;
        let sql = match self.backend {
            Backend::MySql => format!("ANALYZE TABLE {t}"),
            _ => format!("ANALYZE {t}"),
        };
        self.pool.exec(&sql).await;
    }

    pub(crate) async fn drop_tables(&self) {
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

pub(crate) fn sql_url(ctx: &Ctx, backend: Backend) -> Result<String, Skip> {
    match backend {
        Backend::Sqlite => Ok(String::new()),
        b => ctx.server(sql_var(b)),
    }
}

/// Guard cycles/s, 16 tasks on a pool of 16, vs raw insert-if-absent statements/s
/// of a whole record row, 16 tasks, same pool; a third side, the reference cycle
/// (the same insert, then a fenced update: the least a fenced cycle asks of the
/// database, with no crate code), is reported in a note.
pub(crate) fn sql_cycle_tput(ctx: &Ctx, backend: Backend) -> Result<Report, Skip> {
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

pub(crate) fn postgres_cycle_tput(ctx: &Ctx) -> Result<Report, Skip> {
    sql_cycle_tput(ctx, Backend::Postgres)
}
pub(crate) fn mysql_cycle_tput(ctx: &Ctx) -> Result<Report, Skip> {
    sql_cycle_tput(ctx, Backend::MySql)
}
pub(crate) fn sqlite_cycle_tput(ctx: &Ctx) -> Result<Report, Skip> {
    sql_cycle_tput(ctx, Backend::Sqlite)
}

/// Inserts `n` records that expired long ago (`expires_at` = 1 ms), in chunks.
pub(crate) async fn bulk_insert_expired(bench: &SqlBench, n: usize) {
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
pub(crate) async fn timed_claim(guard: &WebhookGuard, i: u64) -> u64 {
    let id = format!("evt_{i:020}");
    let headers = [(ID_HEADER, id.as_str())];
    let t = Instant::now();
    let begin = guard.begin(&headers, BODY).await;
    let ns = t.elapsed().as_nanos() as u64;
    match begin {
        webhook_guard::guard::Begin::Claimed(c) => {
            c.complete().await;
        }
        _ => panic!("fresh id {id} not claimed"),
    }
    ns
}

/// p99 claim latency while `purge_expired` (batches of 1,000) removes `n` expired
/// records vs p99 claim latency idle, on the same store and table.
pub(crate) fn sql_sweep(ctx: &Ctx, backend: Backend) -> Result<Report, Skip> {
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

pub(crate) fn sweep_claim_p99_sqlite(ctx: &Ctx) -> Result<Report, Skip> {
    sql_sweep(ctx, Backend::Sqlite)
}
pub(crate) fn sweep_claim_p99_postgres(ctx: &Ctx) -> Result<Report, Skip> {
    sql_sweep(ctx, Backend::Postgres)
}
pub(crate) fn sweep_claim_p99_mysql(ctx: &Ctx) -> Result<Report, Skip> {
    sql_sweep(ctx, Backend::MySql)
}
