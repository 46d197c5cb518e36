//! Claims and finishes of concurrent deliveries, sent to the server together.
//!
//! Every claim's `SET NX GET` and every fenced finish goes through one task per
//! store (per shard on a Redis Cluster), which takes whatever has queued up (at most [`MAX_BATCH`]) and sends it as
//! one pipeline: one transaction (`MULTI`) holding the claims' index entries as one
//! `ZADD NX` per shard and their `SET`s, then all finishes as one run of the finish
//! script (or, on a server with a native compare-and-set, one `SET … IFEQ` each). With [`IN_FLIGHT`] batches on the wire at once, the next batch gathers
//! while the server answers. One delivery alone is a batch of one, sent at once;
//! under load the server reads, parses and answers one request, and starts Lua once,
//! for a whole batch instead of for each delivery.
//!
//! On a Redis Cluster each shard has a task of its own, and so its own batches in
//! flight (a pipeline or script stays in one slot there): a node that stops
//! answering holds up the batches of its own shards, not the others'. A standalone
//! server gets one task and one pipeline per batch.
//!
//! A claim whose caller stopped waiting before its batch was sent is dropped, not
//! sent: nobody would run its handler or release its lease. A finish is sent all
//! the same (its handler ran). A caller waits for its answer at most twice the
//! store's response timeout (its batch's turn, then its round trip), then answers an
//! I/O error (the store's `Unavailable`); its job may still be applied later, as
//! when a reply is lost on the wire. Such a wait also marks the task as stalled, so
//! that the store starts a new one: the runtime it runs on may no longer be driven.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::connection::Eval;
use super::scripts::{SCRIPTS, TIDY_BATCH};
use super::{RecordKey, RedisConnection, ShardKeys};

/// The most jobs one batch takes.
const MAX_BATCH: usize = 256;
/// How many batches may await their answers at once.
const IN_FLIGHT: usize = 2;

/// A fresh claim: `SET rec fresh NX GET PX ttl`, the member filed in its
/// shard's due index at `lease` unless it is there already, and `entry` filed in
/// the namespace's `in_progress` listing index `listed` at `now` (the caller drops
/// it again when the record was there before, see [`Batcher::unlist`]).
pub(super) struct ClaimJob {
    pub(super) shard: u16,
    pub(super) rec: RecordKey,
    pub(super) fresh: String,
    pub(super) ttl: i64,
    pub(super) lease: i64,
    pub(super) now: i64,
    pub(super) listed: String,
    pub(super) entry: String,
}

/// How a finish moves a record between listing indexes: `entry` leaves the
/// `in_progress` index `listed`, and `id` enters `target` at `now`.
#[derive(Clone)]
pub(super) struct Relist {
    pub(super) listed: String,
    pub(super) entry: String,
    pub(super) target: String,
    pub(super) id: String,
    pub(super) now: i64,
}

/// A fenced finish: the arguments of one entry of the finish script (see
/// `lua/records/finish.lua`).
pub(super) struct FinishJob {
    pub(super) shard: u16,
    pub(super) rec: RecordKey,
    pub(super) fence: String,
    pub(super) head: String,
    pub(super) tail: String,
    pub(super) ttl: i64,
    pub(super) expires: i64,
    pub(super) relist: Relist,
}

/// A fenced finish on the native path (see the `native` module): `SET rec new IFEQ
/// old PX ttl`, and, when the new expiry is earlier than the stored lease's end, the
/// index entry moved there (`ZADD due LT refile member`), and the listing entry
/// moved, all in one transaction. Answers whether the `SET` was applied.
///
/// The transaction applies the listing move whatever the `SET` answers: the
/// `in_progress` entry it drops names this claim's token, which no record holds
/// once the lease is lost, and an entry it files (or scores again) for a finish
/// that was refused is one the listing finds stale (the record is not in that
/// state at that time), skips and repairs.
pub(super) struct SetJob {
    pub(super) shard: u16,
    pub(super) rec: RecordKey,
    pub(super) new: String,
    pub(super) old: String,
    pub(super) ttl: i64,
    pub(super) refile: Option<i64>,
    pub(super) relist: Relist,
}

/// A claim's listing entry dropped again (`ZREM key member`): the claim met a
/// record it keeps. Nobody waits for it.
pub(super) struct UnlistJob {
    pub(super) shard: u16,
    pub(super) key: String,
    pub(super) member: String,
}

/// What the finish script answers for one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Finished {
    Applied,
    LeaseLost,
    Corrupt,
}

enum Job {
    Claim(ClaimJob, oneshot::Sender<RedisResult<Option<String>>>),
    Finish(FinishJob, oneshot::Sender<RedisResult<Finished>>),
    Set(SetJob, oneshot::Sender<RedisResult<bool>>),
    Unlist(UnlistJob),
}

/// The sending side of a store's batching task; the task ends when every clone is
/// dropped.
#[derive(Clone)]
pub(super) struct Batcher {
    /// One task for a standalone server; one per shard on a cluster, so that a
    /// node that stops answering holds up the batches of its own shards only.
    tx: Arc<[mpsc::UnboundedSender<Job>]>,
    /// The longest a caller waits for its answer.
    wait: Duration,
    /// Set when a caller waited that long: the task may not be running at all.
    stalled: Arc<AtomicBool>,
}

/// The error a job answers when the batching task is gone (its runtime shut down).
fn task_gone() -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "webhook-guard: the Redis store's batching task has stopped (was its runtime shut down?)",
    ))
}

/// The error a job answers when its caller waited too long for it.
fn waited_too_long(wait: Duration) -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "webhook-guard: no answer from the Redis store's batch in time",
        format!("waited {} ms", wait.as_millis()),
    ))
}

impl Batcher {
    /// Starts the task on the current tokio runtime; a caller waits at most
    /// `response_timeout` twice (its batch's turn, then its round trip).
    pub(super) fn start(
        connection: RedisConnection,
        keys: Arc<[ShardKeys]>,
        response_timeout: Duration,
    ) -> Self {
        let tasks = match connection {
            RedisConnection::Cluster(_) => keys.len(),
            RedisConnection::Standalone(_) => 1,
        };
        let sender = Sender {
            connection,
            keys: keys.clone(),
            filed: keys.iter().map(|_| AtomicU32::new(0)).collect(),
        };
        let tx = (0..tasks)
            .map(|_| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(run(rx, sender.clone()));
                tx
            })
            .collect();
        Self {
            tx,
            wait: response_timeout.saturating_mul(2),
            stalled: Arc::default(),
        }
    }

    /// The task that sends `shard`'s jobs.
    fn task(&self, shard: u16) -> &mpsc::UnboundedSender<Job> {
        &self.tx[usize::from(shard) % self.tx.len()]
    }

    /// Whether the task has stopped (its runtime shut down) or a caller waited too
    /// long for it: either way the store starts a new one.
    pub(super) fn is_closed(&self) -> bool {
        self.tx.iter().any(mpsc::UnboundedSender::is_closed) || self.stalled.load(Ordering::Relaxed)
    }

    /// Claims through the next batch: the record stored before (`None`: stored now).
    pub(super) async fn claim(&self, job: ClaimJob) -> RedisResult<Option<String>> {
        let (reply, answer) = oneshot::channel();
        self.task(job.shard)
            .send(Job::Claim(job, reply))
            .map_err(|_| task_gone())?;
        self.answer(answer).await
    }

    /// Finishes through the next batch.
    pub(super) async fn finish(&self, job: FinishJob) -> RedisResult<Finished> {
        let (reply, answer) = oneshot::channel();
        self.task(job.shard)
            .send(Job::Finish(job, reply))
            .map_err(|_| task_gone())?;
        self.answer(answer).await
    }

    /// Sets a record if it still is the value expected, through the next batch:
    /// whether it was.
    pub(super) async fn set_if_eq(&self, job: SetJob) -> RedisResult<bool> {
        let (reply, answer) = oneshot::channel();
        self.task(job.shard)
            .send(Job::Set(job, reply))
            .map_err(|_| task_gone())?;
        self.answer(answer).await
    }

    /// Drops a listing entry through the next batch, answering at once (a failure
    /// is logged: the listing skips and repairs an entry whose record does not
    /// carry its token).
    pub(super) fn unlist(&self, job: UnlistJob) {
        let _ = self.task(job.shard).send(Job::Unlist(job));
    }

    /// The job's answer, or an error once the caller has waited `wait`.
    async fn answer<T>(&self, answer: oneshot::Receiver<RedisResult<T>>) -> RedisResult<T> {
        match tokio::time::timeout(self.wait, answer).await {
            Ok(answer) => answer.unwrap_or_else(|_| Err(task_gone())),
            Err(_) => {
                self.stalled.store(true, Ordering::Relaxed);
                Err(waited_too_long(self.wait))
            }
        }
    }
}

/// What every batch needs: the connection and the shards' keys.
#[derive(Clone)]
struct Sender {
    connection: RedisConnection,
    keys: Arc<[ShardKeys]>,
    /// Per shard, how many new index entries this process filed since it last
    /// tidied the shard's index.
    filed: Arc<[AtomicU32]>,
}

async fn run(mut rx: mpsc::UnboundedReceiver<Job>, sender: Sender) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut jobs = Vec::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        if rx.recv_many(&mut jobs, MAX_BATCH).await == 0 {
            return; // the store is gone
        }
        // One pipeline: a standalone server's task, or one shard's on a cluster
        // (where a pipeline and a script stay in one slot).
        let (batch, sender) = (std::mem::take(&mut jobs), sender.clone());
        tokio::spawn(async move {
            sender.send(batch).await;
            drop(slot);
        });
    }
}

impl Sender {
    /// Sends one pipeline and answers each job; then tidies the index of a shard
    /// that has had [`TIDY_BATCH`] new entries since its last tidy.
    async fn send(&self, jobs: Vec<Job>) {
        let mut claims = Vec::new();
        let mut finishes = Vec::new();
        let mut sets = Vec::new();
        let mut unlists = Vec::new();
        for job in jobs {
            match job {
                // The caller is gone: nobody would run the handler or release the
                // lease, so the claim is not made.
                Job::Claim(_, r) if r.is_closed() => {}
                Job::Claim(j, r) => claims.push((j, r)),
                Job::Finish(j, r) => finishes.push((j, r)),
                Job::Set(j, r) => sets.push((j, r)),
                Job::Unlist(j) => unlists.push(j),
            }
        }
        if claims.is_empty() && finishes.is_empty() && sets.is_empty() && unlists.is_empty() {
            return;
        }

        // The claims in one transaction, so that no tidy runs between a record's
        // index entry and its `SET` (and finds the entry of a record not yet there).
        // Per shard: the new index entries (score, member), and the latest `now`.
        type Entries<'j> = (Vec<(i64, &'j str)>, i64);
        let mut entries: BTreeMap<u16, Entries<'_>> = BTreeMap::new();
        // Per listing index, the claims' entries (score, member).
        let mut listed: BTreeMap<&str, Vec<(i64, &str)>> = BTreeMap::new();
        for (j, _) in &claims {
            let (members, now) = entries.entry(j.shard).or_default();
            members.push((j.lease, j.rec.member()));
            *now = (*now).max(j.now);
            listed
                .entry(j.listed.as_str())
                .or_default()
                .push((j.now, j.entry.as_str()));
        }
        let mut pipe = ::redis::Pipeline::with_capacity(
            entries.len() + listed.len() + claims.len() + 5 * sets.len() + unlists.len() + 5,
        );
        pipe.ignore_errors();
        if !claims.is_empty() {
            pipe.cmd("MULTI");
            for (shard, (members, _)) in &entries {
                pipe.cmd("ZADD")
                    .arg(&self.keys[usize::from(*shard)].due)
                    .arg("NX")
                    .arg(members);
            }
            for (j, _) in &claims {
                // Sized once: a command's buffer grows argument by argument otherwise.
                let mut set =
                    ::redis::Cmd::with_capacity(7, j.rec.rec().len() + j.fresh.len() + 32);
                set.arg("SET")
                    .arg(j.rec.rec())
                    .arg(&j.fresh)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(j.ttl);
                pipe.add_command(set);
            }
            for (key, members) in &listed {
                pipe.cmd("ZADD").arg(*key).arg(members);
            }
            pipe.cmd("EXEC");
        }
        let entries: Vec<(u16, i64)> = entries.into_iter().map(|(s, (_, now))| (s, now)).collect();
        // The finish script's command moves into the pipeline; the rare run again
        // after `NOSCRIPT` builds it again rather than every batch copying it.
        let finish = !finishes.is_empty();
        if finish {
            pipe.add_command(finish_script(&self.keys, &finishes).cmd);
        }
        // The finishes on the native path in one transaction: each `SET … IFEQ` with
        // its listing move (see `SetJob`).
        let mut set_commands = 0;
        if !sets.is_empty() {
            pipe.cmd("MULTI");
        }
        for (j, _) in &sets {
            let mut set =
                ::redis::Cmd::with_capacity(7, j.rec.rec().len() + j.new.len() + j.old.len() + 32);
            set.arg("SET")
                .arg(j.rec.rec())
                .arg(&j.new)
                .arg("IFEQ")
                .arg(&j.old)
                .arg("PX")
                .arg(j.ttl);
            pipe.add_command(set);
            if let Some(refile) = j.refile {
                pipe.cmd("ZADD")
                    .arg(&self.keys[usize::from(j.shard)].due)
                    .arg("LT")
                    .arg(refile)
                    .arg(j.rec.member());
            }
            let r = &j.relist;
            pipe.cmd("ZREM").arg(&r.listed).arg(&r.entry);
            pipe.cmd("ZADD").arg(&r.target).arg(r.now).arg(&r.id);
            set_commands += 3 + usize::from(j.refile.is_some());
        }
        if !sets.is_empty() {
            pipe.cmd("EXEC");
        }
        for j in &unlists {
            pipe.cmd("ZREM").arg(&j.key).arg(&j.member);
        }

        let answers = match self
            .connection
            .query_pipe::<Vec<RedisResult<Value>>>(&pipe)
            .await
        {
            Ok(answers) if answers.len() == pipe.len() => answers,
            Ok(_) => return fail(claims, finishes, sets, &unexpected("pipeline")),
            Err(e) => {
                if !unlists.is_empty() {
                    tracing::debug!(error = %e, "redis store: dropping listing entries failed");
                }
                return fail(claims, finishes, sets, &e);
            }
        };
        let mut answers = answers.into_iter();
        let mut added = Vec::new();
        if !claims.is_empty() {
            // `MULTI`, then one `QUEUED` per command, then what `EXEC` answers.
            let queued: Vec<_> = answers
                .by_ref()
                .take(1 + entries.len() + claims.len() + listed.len())
                .collect();
            let exec = answers.next();
            match exec {
                Some(Ok(Value::Array(results)))
                    if results.len() == entries.len() + claims.len() + listed.len() =>
                {
                    let mut results = results.into_iter();
                    added.extend(results.by_ref().take(entries.len()));
                    for ((_, reply), result) in claims.into_iter().zip(results) {
                        let answer = match result {
                            Value::ServerError(e) => Err(e.into()),
                            v => ::redis::from_redis_value(v).map_err(Into::into),
                        };
                        let _ = reply.send(answer);
                    }
                }
                // `EXECABORT`: a command was refused as it was queued (a server
                // loading its data, a replica after a fail-over): its error says why.
                Some(Err(e)) => {
                    let cause = queued.into_iter().find_map(Result::err);
                    fail(claims, Vec::new(), Vec::new(), cause.as_ref().unwrap_or(&e));
                }
                _ => fail(claims, Vec::new(), Vec::new(), &unexpected("transaction")),
            }
        }
        if finish {
            let mut answer = answers.next().unwrap_or(Ok(Value::Nil));
            if matches!(&answer, Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript))
            {
                // The server lost its scripts (a restart, `SCRIPT FLUSH`): the script
                // did not run; `eval` loads it and runs it again.
                let inv = finish_script(&self.keys, &finishes);
                answer = self.connection.eval(&inv).await;
            }
            answer_finishes(finishes, answer);
        }
        if !sets.is_empty() {
            // `MULTI`, one `QUEUED` per command, then what `EXEC` answers: per job its
            // `SET`, then its `ZADD LT` (if any) and listing move, which only an
            // early or stale entry can come of (scans re-file the one, the listing
            // skips and repairs the other).
            let queued: Vec<_> = answers.by_ref().take(1 + set_commands).collect();
            match answers.next() {
                Some(Ok(Value::Array(results))) if results.len() == set_commands => {
                    let mut results = results.into_iter();
                    for (j, reply) in sets {
                        let set = results.next().unwrap_or(Value::Nil);
                        for _ in 0..2 + usize::from(j.refile.is_some()) {
                            if let Some(Value::ServerError(e)) = results.next() {
                                tracing::debug!(error = ?e, "redis store: moving a finished record's index entries failed");
                            }
                        }
                        let _ = reply.send(match set {
                            Value::Nil => Ok(false),
                            Value::Okay => Ok(true),
                            Value::SimpleString(s) if s == "OK" => Ok(true),
                            Value::ServerError(e) => Err(e.into()),
                            _ => Err(unexpected("SET IFEQ")),
                        });
                    }
                }
                Some(Err(e)) => {
                    let cause = queued.into_iter().find_map(Result::err);
                    fail(Vec::new(), Vec::new(), sets, cause.as_ref().unwrap_or(&e));
                }
                _ => fail(Vec::new(), Vec::new(), sets, &unexpected("transaction")),
            }
        }
        for _ in &unlists {
            if let Some(Err(e)) = answers.next() {
                tracing::debug!(error = %e, "redis store: dropping a listing entry failed");
            }
        }

        for ((shard, now), n) in entries.into_iter().zip(added) {
            let Value::Int(n) = n else { continue };
            let filed = &self.filed[usize::from(shard)];
            let n = u32::try_from(n).unwrap_or(0);
            // Whoever takes a full count off the counter tidies, once per count.
            if filed.fetch_add(n, Ordering::Relaxed) + n >= TIDY_BATCH
                && filed.swap(0, Ordering::Relaxed) >= TIDY_BATCH
            {
                tidy(&self.connection, &self.keys[usize::from(shard)], now).await;
            }
        }
    }
}

fn unexpected(what: &str) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "webhook-guard: unexpected answer",
        what.to_owned(),
    ))
}

type Claims = Vec<(ClaimJob, oneshot::Sender<RedisResult<Option<String>>>)>;
type Finishes = Vec<(FinishJob, oneshot::Sender<RedisResult<Finished>>)>;
type Sets = Vec<(SetJob, oneshot::Sender<RedisResult<bool>>)>;

/// One run of the finish script for every finish of the pipeline.
fn finish_script<'s>(keys: &[ShardKeys], finishes: &Finishes) -> Eval<'s> {
    let mut inv = Eval::new(&SCRIPTS.finish, 4 * finishes.len());
    for (j, _) in finishes {
        inv.key(j.rec.rec())
            .key(&keys[usize::from(j.shard)].due)
            .key(&j.relist.listed)
            .key(&j.relist.target);
    }
    for (j, _) in finishes {
        inv.arg(&j.fence)
            .arg(&j.head)
            .arg(&j.tail)
            .arg(j.ttl)
            .arg(j.expires)
            .arg(j.rec.member())
            .arg(&j.relist.entry)
            .arg(&j.relist.id)
            .arg(j.relist.now);
    }
    inv
}

fn answer_finishes(finishes: Finishes, answer: RedisResult<Value>) {
    let codes = match answer {
        Ok(Value::Array(codes)) if codes.len() == finishes.len() => codes,
        Ok(_) => return fail(Vec::new(), finishes, Vec::new(), &unexpected("finish")),
        Err(e) => return fail(Vec::new(), finishes, Vec::new(), &e),
    };
    for ((_, reply), code) in finishes.into_iter().zip(codes) {
        let _ = reply.send(Ok(match code {
            Value::Int(1) => Finished::Applied,
            Value::Int(0) => Finished::LeaseLost,
            _ => Finished::Corrupt,
        }));
    }
}

/// Answers every job with `e`.
fn fail(claims: Claims, finishes: Finishes, sets: Sets, e: &RedisError) {
    for (_, reply) in claims {
        let _ = reply.send(Err(e.clone()));
    }
    for (_, reply) in finishes {
        let _ = reply.send(Err(e.clone()));
    }
    for (_, reply) in sets {
        let _ = reply.send(Err(e.clone()));
    }
}

/// Tidies part of a shard's due index (see [`TIDY`](super::scripts::TIDY)). A failure is only logged:
/// the claims it follows stand, and a later batch tries again.
async fn tidy(connection: &RedisConnection, keys: &ShardKeys, now: i64) {
    let mut inv = Eval::new(&SCRIPTS.tidy, 1);
    inv.key(&keys.due)
        .arg(&keys.records)
        .arg(now)
        .arg(&keys.lists);
    if let Err(e) = connection.eval::<i64>(&inv).await {
        tracing::debug!(error = %e, "redis store: tidying the due index failed");
    }
}
