//! Claims of concurrent deliveries, made in one statement and one commit.
//!
//! A claim's first try goes through the store's [`ClaimBatcher`]: it queues, and a
//! runner task takes whatever has queued up (at most [`MAX_BATCH`] claims of
//! distinct keys) and runs the claim upsert for all of them at once, fed by arrays
//! (`unnest`). At most [`RUNNERS`] batches run at once, so the next batch gathers
//! while the server commits one; a claim alone is a batch of one, sent at once. A
//! commit costs PostgreSQL about as much for eight rows as for one (it waits for
//! the same WAL flush), so under load a claim costs a fraction of a commit.
//!
//! Each key appears once per batch (a second claim of it waits for the next batch:
//! one statement cannot change a row twice), and a batch inserts its keys in byte
//! order, so two batches in flight take their row locks in the same order and
//! cannot deadlock. A batch of several keys waits at most 250 ms for a row lock
//! (`lock_timeout`, for its own transaction): a key held elsewhere, by an open
//! [`record_in`](PostgresStore::record_in) transaction say, would otherwise hold up
//! the claims of every other key of the batch; past that wait each claim goes on
//! alone, and only the held key's claim waits for its lock.
//!
//! The statement answers the rows it claimed; a key it did not answer was refused
//! by its stored record, and its caller goes on as a refused single claim does
//! (reads the record, and decides). When the statement fails, every caller of the
//! batch is answered `Unavailable` if the server could not be reached, and is
//! otherwise told to claim alone, with the single statement, so that one row the
//! server refuses (a NUL in an id a host passed straight to the store) fails only
//! its own claim, and a lock waited out fails none. A claim whose caller stopped waiting before its batch was taken
//! is dropped, not sent: nobody would run its handler or release its lease.
//!
//! The runner is spawned on the runtime of the claim that starts it; a runner that
//! ends without finishing (its runtime shut down) lets every claim still queued go
//! on alone.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::PostgresStore;
use sqlx::postgres::PgRow;
use sqlx::Row as _;

use crate::store::sql::{ceil_millis, millis, RawRecord};
use crate::store::{BoxError, ClaimRequest, Fingerprint, Key, Record, StoreError};

/// The most claims one batch takes.
const MAX_BATCH: usize = 64;
/// How many batches may run at once.
const RUNNERS: usize = 2;

/// What a batched claim learnt.
pub(super) enum Batched {
    /// The statement claimed the id: the record as stored.
    Acquired(Record),
    /// The stored record refused the claim.
    Refused,
    /// The batch failed; this is the claim's error.
    Failed(StoreError),
    /// Not decided here: claim alone.
    Alone,
}

/// The claims waiting for a batch, and how many runners take them.
#[derive(Debug, Default)]
pub(super) struct ClaimBatcher {
    queue: Mutex<Queue>,
}

#[derive(Debug, Default)]
struct Queue {
    waiting: Vec<Waiting>,
    runners: usize,
}

/// One queued claim: the single statement's values, owned.
#[derive(Debug)]
struct Waiting {
    namespace: String,
    id: String,
    fingerprint: Vec<u8>,
    token: i64,
    lease_until: i64,
    expires_at: i64,
    now: i64,
    answer: oneshot::Sender<Batched>,
}

impl std::fmt::Debug for Batched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Acquired(_) => "Acquired",
            Self::Refused => "Refused",
            Self::Failed(_) => "Failed",
            Self::Alone => "Alone",
        })
    }
}

impl ClaimBatcher {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Every change under the lock is made in one step: a poisoned queue is whole.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `request` for the next batch of `store` and waits for its answer.
    pub(super) async fn claim(&self, store: &PostgresStore, request: &ClaimRequest<'_>) -> Batched {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Batched::Alone;
        };
        let (answer, answered) = oneshot::channel();
        let waiting = Waiting {
            namespace: request.key.namespace.to_owned(),
            id: request.key.id.to_owned(),
            fingerprint: request.fingerprint.0.to_vec(),
            token: request.token.as_i64(),
            lease_until: ceil_millis(request.lease_until),
            expires_at: ceil_millis(request.expires_at),
            now: millis(request.now),
            answer,
        };
        let start = {
            let mut queue = self.lock();
            queue.waiting.push(waiting);
            let start = queue.runners < RUNNERS;
            queue.runners += usize::from(start);
            start
        };
        if start {
            runtime.spawn(run(store.clone()));
        }
        // A runner dropped before answering (its runtime shut down) leaves the claim
        // to be made alone; one it already made is met again as this claim's own.
        answered.await.unwrap_or(Batched::Alone)
    }

    /// The next batch: queued claims of distinct keys, in byte order of their keys,
    /// skipping those whose caller is gone. `None`, with this runner counted out,
    /// when nothing waits.
    fn next_batch(&self) -> Option<Vec<Waiting>> {
        let mut queue = self.lock();
        let mut batch: Vec<Waiting> = Vec::new();
        let mut later = Vec::new();
        for waiting in queue.waiting.drain(..) {
            if waiting.answer.is_closed() {
                continue;
            }
            let repeated = batch
                .iter()
                .any(|b| b.id == waiting.id && b.namespace == waiting.namespace);
            if repeated || batch.len() == MAX_BATCH {
                later.push(waiting);
            } else {
                batch.push(waiting);
            }
        }
        queue.waiting = later;
        if batch.is_empty() {
            queue.runners -= 1;
            return None;
        }
        batch.sort_unstable_by(|a, b| (&a.namespace, &a.id).cmp(&(&b.namespace, &b.id)));
        Some(batch)
    }
}

/// Counts a runner out if it ends before [`ClaimBatcher::next_batch`] did (its
/// task was dropped), and lets the claims still queued go on alone: no runner may
/// be left to take them.
struct RunnerExit<'a> {
    batcher: &'a ClaimBatcher,
    done: bool,
}

impl Drop for RunnerExit<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut queue = self.batcher.lock();
            queue.runners -= 1;
            queue.waiting.clear();
        }
    }
}

/// A runner: claims batches until none waits.
async fn run(store: PostgresStore) {
    let batcher = &*store.batcher;
    let mut exit = RunnerExit {
        batcher,
        done: false,
    };
    loop {
        let Some(batch) = batcher.next_batch() else {
            exit.done = true;
            return;
        };
        claim_batch(&store, batch).await;
    }
}

/// Runs the batched claim for `batch` and answers each of its callers.
async fn claim_batch(store: &PostgresStore, batch: Vec<Waiting>) {
    let statement = store
        .sql
        .claim_batch
        .as_deref()
        .expect("PostgreSQL statements have a batched claim");
    let mut columns = Columns::with_capacity(batch.len());
    let mut answers = Vec::with_capacity(batch.len());
    for w in batch {
        answers.push(w.answer);
        columns.namespace.push(w.namespace);
        columns.id.push(w.id);
        columns.fingerprint.push(w.fingerprint);
        columns.token.push(w.token);
        columns.lease_until.push(w.lease_until);
        columns.expires_at.push(w.expires_at);
        columns.now.push(w.now);
    }
    let rows = sqlx::query(statement)
        .bind(&columns.namespace)
        .bind(&columns.id)
        .bind(&columns.fingerprint)
        .bind(&columns.token)
        .bind(&columns.lease_until)
        .bind(&columns.expires_at)
        .bind(&columns.now)
        .bind(&Fingerprint::UNKNOWN.0[..])
        .fetch_all(&store.pool)
        .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => return failed(answers, super::err(e)),
    };
    let mut claimed: Vec<Option<&PgRow>> = vec![None; answers.len()];
    for row in &rows {
        // Each answered row names its key after the record's columns.
        let key = row
            .try_get::<&str, _>(RawRecord::WIDTH)
            .and_then(|ns| Ok((ns, row.try_get::<&str, _>(RawRecord::WIDTH + 1)?)));
        let at = key.ok().and_then(|(ns, id)| {
            (0..answers.len()).find(|&i| columns.namespace[i] == ns && columns.id[i] == id)
        });
        match at {
            Some(i) => claimed[i] = Some(row),
            None => {
                let error =
                    StoreError::Corrupt("a batched claim answered a key it was not given".into());
                return failed(answers, error);
            }
        }
    }
    for (i, (answer, row)) in answers.into_iter().zip(claimed).enumerate() {
        let key = Key::new(&columns.namespace[i], &columns.id[i]);
        let batched = match row {
            Some(row) => match RawRecord::read(row, 0)
                .map_err(super::err)
                .and_then(|raw| raw.into_record(key))
            {
                Ok(record) => Batched::Acquired(record),
                Err(e) => Batched::Failed(e),
            },
            None => Batched::Refused,
        };
        // A caller gone meanwhile: the guard's drop guard releases its claim.
        let _ = answer.send(batched);
    }
}

/// Answers every caller of a failed batch: the server's unavailability to each,
/// or else a claim alone (one row may have failed them all, or a lock held past
/// the batch's wait, which a claim alone waits out).
fn failed(mut answers: Vec<oneshot::Sender<Batched>>, error: StoreError) {
    let StoreError::Unavailable { source } = error else {
        for answer in answers {
            let _ = answer.send(Batched::Alone);
        }
        return;
    };
    if answers.len() == 1 {
        if let Some(answer) = answers.pop() {
            let _ = answer.send(Batched::Failed(StoreError::Unavailable { source }));
        }
        return;
    }
    let shared: Arc<dyn std::error::Error + Send + Sync> = Arc::from(source);
    for answer in answers {
        let source: BoxError = Box::new(Shared(shared.clone()));
        let _ = answer.send(Batched::Failed(StoreError::Unavailable { source }));
    }
}

/// One driver error shown to every caller of a batch.
#[derive(Debug)]
struct Shared(Arc<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Shared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// The batch's values, one array per column of the single claim.
struct Columns {
    namespace: Vec<String>,
    id: Vec<String>,
    fingerprint: Vec<Vec<u8>>,
    token: Vec<i64>,
    lease_until: Vec<i64>,
    expires_at: Vec<i64>,
    now: Vec<i64>,
}

impl Columns {
    fn with_capacity(n: usize) -> Self {
        Self {
            namespace: Vec::with_capacity(n),
            id: Vec::with_capacity(n),
            fingerprint: Vec::with_capacity(n),
            token: Vec::with_capacity(n),
            lease_until: Vec::with_capacity(n),
            expires_at: Vec::with_capacity(n),
            now: Vec::with_capacity(n),
        }
    }
}
