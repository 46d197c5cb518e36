//! Redis: the guard on `RedisStore` against raw commands of the same `redis` crate
//! (with the reference cycle and the ceiling in the same rounds) and against the
//! Redis stores of peer crates.

use std::future::Future;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::{guard_on, median, Ctx, Report, Skip, BODY, FINGERPRINT_HEX};
use crate::tput::{
    fresh_name, guard_cycle, interleave_tput_sides, round_time, runtime, tput, tput_each,
    tput_report, RoundFuture,
};

pub(crate) async fn redis_store(url: &str, prefix: &str) -> webhook_guard::store::RedisStore {
    webhook_guard::store::RedisStore::builder()
        .prefix(prefix)
        .connect(url)
        .await
        .expect("redis store")
}

/// Deletes every key matching `pattern`.
pub(crate) async fn redis_cleanup(url: &str, pattern: &str) {
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

pub(crate) const REDIS_TASKS: usize = 64;

/// `SET key value NX PX 600000`, one round trip: whether it stored the key.
pub(crate) async fn set_nx_px(
    conn: &mut redis::aio::ConnectionManager,
    key: &str,
    value: &[u8],
) -> bool {
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
pub(crate) const CEILING_TASKS: usize = 4;
pub(crate) const CEILING_BATCH: u64 = 64;

/// The fenced rewrite of the ceiling side: KEYS the records; ARGV two per record,
/// the token prefix it must start with and the new record. One 1 or 0 per record.
pub(crate) const CEILING_FINISH: &str = "local out = {} \
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
/// `ZADD NX` filing them in a due index, then the fenced rewrites: one script that
/// reads each record, compares its token prefix and writes the whole new record
/// (the store's finish also keeps fields of the stored record, which this one is
/// handed instead), or, `native`, one pipeline of `SET k new IFEQ old PX` (what the
/// store sends on a server with a native compare-and-set). Whether every claim
/// found its id new and every rewrite was applied.
pub(crate) async fn ceiling_cycles(
    conn: &mut redis::aio::ConnectionManager,
    prefix: &str,
    i0: u64,
    finish: &redis::Script,
    native: bool,
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
    let claimed =
        filed && stored.len() == keys.len() && stored.iter().all(|v| *v == redis::Value::Nil);
    if native {
        let mut sets = redis::pipe();
        for (i, key) in ids.zip(&keys) {
            sets.cmd("SET")
                .arg(key)
                .arg(format!(
                    "completed|{i}|{FINGERPRINT_HEX}|1|{lease}|{now}|0|{expires}|{now}|"
                ))
                .arg("IFEQ")
                .arg(format!(
                    "in_progress|{i}|{FINGERPRINT_HEX}|1|{lease}|{now}|0|{expires}|{now}|"
                ))
                .arg("PX")
                .arg(600_000);
        }
        let applied: Vec<redis::Value> = sets.query_async(conn).await.expect("SET IFEQ");
        return claimed
            && applied.len() == keys.len()
            && applied.iter().all(|v| *v == redis::Value::Okay);
    }
    let mut run = finish.prepare_invoke();
    for (i, key) in ids.zip(&keys) {
        run.key(key).arg(format!("in_progress|{i}|")).arg(format!(
            "completed|{i}|{FINGERPRINT_HEX}|1|{lease}|{now}|0|{expires}|{now}|"
        ));
    }
    let applied: Vec<i64> = run.invoke_async(conn).await.expect("finish script");
    claimed && applied.len() == keys.len() && applied.iter().all(|&a| a == 1)
}

/// CPU seconds the server's main thread (the one that runs commands) has used, from
/// `INFO cpu`.
pub(crate) async fn server_main_cpu(conn: &mut redis::aio::ConnectionManager) -> f64 {
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

/// A round of the ceiling side ([`ceiling_cycles`], `native` or not) on `conn`, keys
/// under `prefix`.
/// Each round also pushes to `busy` the share of its time the server's main thread
/// was busy (1.0: a full core, all a Redis server runs commands on).
pub(crate) fn ceiling_side(
    conn: &redis::aio::ConnectionManager,
    prefix: &str,
    dur: Duration,
    busy: Arc<Mutex<Vec<f64>>>,
    native: bool,
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
                async move { ceiling_cycles(&mut conn, &prefix, i0, &finish, native).await }
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
pub(crate) fn redis_cycle_tput(ctx: &Ctx) -> Result<Report, Skip> {
    let url = ctx.server("WEBHOOK_GUARD_REDIS_URL")?;
    let rt = runtime();
    let prefix = fresh_name();
    let dur = round_time(ctx);
    let (guard, conn, native) = rt.block_on(async {
        let store = redis_store(&url, &prefix).await;
        let native = store.uses_native_compare_and_set();
        let guard = guard_on(store);
        let conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection_manager()
            .await
            .expect("connect");
        (guard, conn, native)
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
    let ceiling_side = ceiling_side(&conn, &format!("{raw_prefix}c:"), dur, busy.clone(), native);
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
pub(crate) fn redis_vs_peer<P, C, CF, F, Fut>(
    ctx: &Ctx,
    url_var: &str,
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
    let url = ctx.server(url_var)?;
    let rt = runtime();
    let prefix = fresh_name();
    let peer_prefix = format!("{prefix}_peer");
    let dur = round_time(ctx);
    let (guard, peer, native) = rt.block_on(async {
        let store = redis_store(&url, &prefix).await;
        let native = store.uses_native_compare_and_set();
        let guard = guard_on(store);
        let peer = connect(url.clone(), peer_prefix.clone()).await;
        (guard, Arc::new(peer), native)
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
        let ceiling_side = ceiling_side(&conn, &ceiling_prefix, dur, busy.clone(), native);
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
            "ceiling, same run: the store's server work for a cycle as raw commands (as in redis_cycle_tput; fenced rewrite {}): {c:.0} cycles/s, {:.3} of the peer, the server's command thread busy {:.0} % of those rounds; guard {:.3} of it",
            if native { "by SET IFEQ" } else { "by script" },
            c / b,
            median(busy.lock().unwrap().clone()) * 100.0,
            g / c
        ));
    }
    Ok(report)
}

/// Guard cycles/s on Redis vs the `idempotent` crate 0.3's `ValkeyStore`
/// `try_insert` + `complete`, 64 tasks each.
pub(crate) fn redis_cycle_vs_idempotent_tput(ctx: &Ctx) -> Result<Report, Skip> {
    cycle_vs_idempotent_tput(ctx, "WEBHOOK_GUARD_REDIS_URL")
}

/// [`redis_cycle_vs_idempotent_tput`] on Valkey 9 (`WEBHOOK_GUARD_VALKEY_URL`),
/// where the store finishes by `SET … IFEQ`.
pub(crate) fn valkey_cycle_vs_idempotent_tput(ctx: &Ctx) -> Result<Report, Skip> {
    cycle_vs_idempotent_tput(ctx, "WEBHOOK_GUARD_VALKEY_URL")
}

/// Guard cycles/s vs the `idempotent` crate's `ValkeyStore` on the server of
/// `url_var`, with the ceiling side in the same rounds.
fn cycle_vs_idempotent_tput(ctx: &Ctx, url_var: &str) -> Result<Report, Skip> {
    use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
    use idempotent::store::valkey::ValkeyStore;
    use idempotent::store::{IdempotencyStore, InsertResult};
    use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};

    redis_vs_peer(
        ctx,
        url_var,
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
pub(crate) fn redis_cycle_vs_klauthed_tput(ctx: &Ctx) -> Result<Report, Skip> {
    use klauthed_data::idempotency::redis::RedisIdempotencyStore;
    use klauthed_data::idempotency::{IdempotencyStore, Outcome as KOutcome};

    redis_vs_peer(
        ctx,
        "WEBHOOK_GUARD_REDIS_URL",
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

/// Guard cycles/s on `RedisStore` (64 tasks) vs the ceiling side (the store's own
/// server work for a cycle as raw commands, batched, no crate code; the fenced
/// rewrite by `SET … IFEQ` where the store uses it) on Redis 7
/// (`WEBHOOK_GUARD_REDIS_URL`), interleaved.
pub(crate) fn redis_cycle_vs_ceiling_tput(ctx: &Ctx) -> Result<Report, Skip> {
    cycle_vs_ceiling_tput(ctx, "WEBHOOK_GUARD_REDIS_URL")
}

/// [`redis_cycle_vs_ceiling_tput`] on Valkey 9 (`WEBHOOK_GUARD_VALKEY_URL`).
pub(crate) fn valkey_cycle_vs_ceiling_tput(ctx: &Ctx) -> Result<Report, Skip> {
    cycle_vs_ceiling_tput(ctx, "WEBHOOK_GUARD_VALKEY_URL")
}

/// CPU seconds this process has used (all threads), from `/proc/self/stat`.
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are the
    // 12th and 13th, in clock ticks (100 a second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let mut fields = rest.split_whitespace().skip(11);
    let ticks = |f: Option<&str>| f.and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(fields.next()) + ticks(fields.next())) / 100.0
}

/// `side` with the CPU time per cycle of the server's command thread and of this
/// process pushed to `cpu` (µs, µs) after each round.
fn with_cpu<'a>(
    side: &'a dyn Fn(u64) -> RoundFuture,
    conn: &redis::aio::ConnectionManager,
    cpu: Arc<Mutex<Vec<(f64, f64)>>>,
) -> impl Fn(u64) -> RoundFuture + 'a {
    let conn = conn.clone();
    move |first| {
        let (mut conn, cpu, round) = (conn.clone(), cpu.clone(), side(first));
        Box::pin(async move {
            let (server, client, t) = (server_main_cpu(&mut conn).await, own_cpu(), Instant::now());
            let (rate, next) = round.await;
            let cycles = rate * t.elapsed().as_secs_f64();
            let server = server_main_cpu(&mut conn).await - server;
            let client = own_cpu() - client;
            cpu.lock()
                .unwrap()
                .push((server / cycles * 1e6, client / cycles * 1e6));
            (rate, next)
        })
    }
}

fn cycle_vs_ceiling_tput(ctx: &Ctx, url_var: &str) -> Result<Report, Skip> {
    let url = ctx.server(url_var)?;
    let rt = runtime();
    let prefix = fresh_name();
    let ceiling_prefix = format!("{prefix}_ceiling:");
    let dur = round_time(ctx);
    let (guard, conn, native) = rt.block_on(async {
        let store = redis_store(&url, &prefix).await;
        let native = store.uses_native_compare_and_set();
        let conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection_manager()
            .await
            .expect("connect");
        (guard_on(store), conn, native)
    });
    let guard_side = |first| -> RoundFuture {
        let guard = guard.clone();
        Box::pin(tput(REDIS_TASKS, dur, first, move |i| {
            let guard = guard.clone();
            async move { guard_cycle(&guard, "evt_", i).await }
        }))
    };
    let busy = Arc::new(Mutex::new(Vec::new()));
    let ceiling = ceiling_side(&conn, &ceiling_prefix, dur, busy.clone(), native);
    let (guard_cpu, ceiling_cpu) = (Arc::default(), Arc::default());
    let guard_measured = with_cpu(&guard_side, &conn, Arc::clone(&guard_cpu));
    let ceiling_measured = with_cpu(&ceiling, &conn, Arc::clone(&ceiling_cpu));
    let sides: [&dyn Fn(u64) -> RoundFuture; 2] = [&guard_measured, &ceiling_measured];
    let rounds = (ctx.rounds.min(6) / sides.len()).max(1) * sides.len();
    let m = interleave_tput_sides(ctx, &rt, rounds, &sides);
    rt.block_on(async {
        redis_cleanup(&url, &format!("{{{prefix}:*")).await;
        redis_cleanup(&url, &format!("{ceiling_prefix}*")).await;
    });
    let (g, c) = (m[0], m[1]);
    let mut report = tput_report(
        g,
        c,
        "ceiling",
        format!(
            "{REDIS_TASKS} tasks on the guard side, {CEILING_TASKS} tasks of {CEILING_BATCH} batched cycles on the ceiling side, {:.1} s rounds; fenced rewrite {}",
            dur.as_secs_f64(),
            if native { "by SET IFEQ" } else { "by script" }
        ),
    );
    report.notes.push(format!(
        "the server's command thread busy {:.0} % of the ceiling rounds",
        median(busy.lock().unwrap().clone()) * 100.0
    ));
    let per_cycle = |cpu: &Mutex<Vec<(f64, f64)>>| {
        let cpu = cpu.lock().unwrap();
        (
            median(cpu.iter().map(|c| c.0).collect()),
            median(cpu.iter().map(|c| c.1).collect()),
        )
    };
    let ((gs, gc), (cs, cc)) = (per_cycle(&guard_cpu), per_cycle(&ceiling_cpu));
    report.notes.push(format!(
        "CPU a cycle (medians; server: its command thread, client: this process): guard server {gs:.2} µs, client {gc:.2} µs; ceiling server {cs:.2} µs, client {cc:.2} µs"
    ));
    Ok(report)
}
