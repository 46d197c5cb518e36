//! Claims of concurrent deliveries, gathered into batches that a SQL store makes in
//! one statement and one commit.
//!
//! A claim's first try queues in its store's [`ClaimBatcher`], and a runner task
//! takes whatever has queued up (at most [`MAX_BATCH`] claims of distinct keys, in
//! byte order of their keys) and hands it to the store's [`ClaimBatch::run`], which
//! answers each claim. At most [`ClaimBatch::RUNNERS`] batches run at once, so the
//! next batch gathers while the server commits one; a claim alone is a batch of
//! one, sent at once. A commit costs a database about as much for eight rows as for one (it waits
//! for the same log flush), so under load a claim costs a fraction of a commit.
//!
//! Each key appears once per batch (a second claim of it waits for the next batch:
//! one statement cannot change a row twice), and the keys come in byte order, so
//! two batches in flight take their row locks in the same order and cannot
//! deadlock each other.
//!
//! A claim whose caller stopped waiting before its batch was taken is dropped, not
//! sent: nobody would run its handler or release its lease. The runner is spawned
//! on the runtime of the claim that starts it; a runner that ends without finishing
//! (its runtime shut down, or it panicked) lets every claim still queued go on
//! alone, as does a claim made outside a tokio runtime.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::{ceil_millis, millis};
use crate::store::{BoxError, ClaimRequest, Fingerprint, Record, StoreError};

/// The most claims one batch takes.
pub(crate) const MAX_BATCH: usize = 64;

/// What a batched claim learnt.
pub(crate) enum Batched {
    /// The statement claimed the id: the record as stored.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    Acquired(Record),
    /// The statement stored the claim as a new record (the record is the request's,
    /// at the store's precision).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Fresh,
    /// The stored record refused the claim.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    Refused,
    /// The claim was not made, and the batch read the stored record (in its
    /// statement, or in a read after it): the record as read (the claim decides
    /// on it, and goes on alone unless it keeps the record).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    Existing(Record),
    /// The batch failed; this is the claim's error.
    Failed(StoreError),
    /// Not decided here: claim alone.
    Alone,
}

impl std::fmt::Debug for Batched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Acquired(_) => "Acquired",
            Self::Fresh => "Fresh",
            Self::Refused => "Refused",
            Self::Existing(_) => "Existing",
            Self::Failed(_) => "Failed",
            Self::Alone => "Alone",
        })
    }
}

/// A store whose claims are batched.
pub(crate) trait ClaimBatch: Clone + Send + Sync + 'static {
    /// How many batches may run at once.
    const RUNNERS: usize;

    /// The store's batcher.
    fn batcher(&self) -> &ClaimBatcher;

    /// How long a claim waits in the queue before it is withdrawn (never made) and
    /// answers `Unavailable`; once taken into a batch it waits for the batch's
    /// statement.
    fn patience(&self) -> std::time::Duration;

    /// Makes the claims of `batch` (distinct keys, in byte order) and answers each
    /// of them.
    fn run(&self, batch: Vec<Waiting>) -> impl Future<Output = ()> + Send;
}

/// The [`ClaimBatch`] items a store on a server's pool (PostgreSQL, MySQL) shares:
/// two runners, its `batcher` field, and a claim waiting in the queue as long as it
/// would wait for a connection of its `pool`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! pooled_claim_batch {
    () => {
        const RUNNERS: usize = 2;

        fn batcher(&self) -> &$crate::store::sql::claim_batch::ClaimBatcher {
            &self.batcher
        }

        /// As long as the claim would wait for a connection of the pool.
        fn patience(&self) -> std::time::Duration {
            self.pool.options().get_acquire_timeout()
        }
    };
}
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use pooled_claim_batch;

/// One queued claim: the claim statement's values, owned.
#[derive(Debug)]
pub(crate) struct Waiting {
    pub(crate) namespace: String,
    pub(crate) id: String,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) token: i64,
    pub(crate) lease_until: i64,
    pub(crate) expires_at: i64,
    pub(crate) now: i64,
    pub(crate) answer: oneshot::Sender<Batched>,
    /// The claim's place in its batcher's queue, unique (what a withdrawal finds).
    ticket: u64,
}

impl Waiting {
    /// `request`'s values, to be answered on `answer` (not yet queued: ticket 0).
    pub(crate) fn new(request: &ClaimRequest<'_>, answer: oneshot::Sender<Batched>) -> Self {
        Self {
            namespace: request.key.namespace.to_owned(),
            id: request.key.id.to_owned(),
            fingerprint: request.fingerprint,
            token: request.token.as_i64(),
            lease_until: ceil_millis(request.lease_until),
            expires_at: ceil_millis(request.expires_at),
            now: millis(request.now),
            answer,
            ticket: 0,
        }
    }

    /// `query` with this claim's values bound, borrowed, in the order of a claim
    /// row of the SQLite and MySQL batch statements: namespace, id, fingerprint,
    /// token, end of lease, expiry, now.
    #[cfg(any(feature = "sqlite", feature = "mysql"))]
    pub(crate) fn bind_row<'q, DB: sqlx::Database>(
        &'q self,
        query: sqlx::query::Query<'q, DB, DB::Arguments<'q>>,
    ) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
    where
        &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        &'q [u8]: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        query
            .bind(self.namespace.as_str())
            .bind(self.id.as_str())
            .bind(&self.fingerprint.0[..])
            .bind(self.token)
            .bind(self.lease_until)
            .bind(self.expires_at)
            .bind(self.now)
    }
}

/// The claims waiting for a batch, and how many runners take them.
#[derive(Debug, Default)]
pub(crate) struct ClaimBatcher {
    queue: Mutex<Queue>,
}

#[derive(Debug, Default)]
struct Queue {
    waiting: Vec<Waiting>,
    runners: usize,
    /// The ticket of the next claim queued.
    next_ticket: u64,
}

impl ClaimBatcher {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Every change under the lock is made in one step: a poisoned queue is whole.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `request` for the next batch of `store` and waits for its answer.
    pub(crate) async fn claim<S: ClaimBatch>(store: &S, request: &ClaimRequest<'_>) -> Batched {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Batched::Alone;
        };
        let (answer, answered) = oneshot::channel();
        let mut waiting = Waiting::new(request, answer);
        let (start, ticket) = {
            let mut queue = store.batcher().lock();
            let ticket = queue.next_ticket;
            queue.next_ticket += 1;
            waiting.ticket = ticket;
            queue.waiting.push(waiting);
            let start = queue.runners < S::RUNNERS;
            queue.runners += usize::from(start);
            (start, ticket)
        };
        if start {
            let runner = Runner {
                store: store.clone(),
                done: false,
            };
            runtime.spawn(run(runner));
        }
        // A runner dropped before answering leaves the claim to be made alone; one
        // it already made is met again as this claim's own.
        let mut answered = answered;
        if let Ok(answer) = tokio::time::timeout(store.patience(), &mut answered).await {
            return answer.unwrap_or(Batched::Alone);
        }
        // Still queued: withdrawn, never made. Taken into a batch meanwhile: its
        // statement answers.
        {
            let mut queue = store.batcher().lock();
            let queued = queue.waiting.iter().position(|w| w.ticket == ticket);
            if let Some(at) = queued {
                queue.waiting.remove(at);
                return Batched::Failed(StoreError::unavailable(
                    "the claim waited in the store's queue past its limit: \
                     the statements ahead of it did not finish in time",
                ));
            }
        }
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

/// A runner, counted in its batcher from before its task is spawned: a task the
/// runtime drops, polled or not (it shut down, or the runner panicked), counts
/// itself out and lets the claims still queued go on alone, so that no claim waits
/// for a runner that is gone.
struct Runner<S: ClaimBatch> {
    store: S,
    done: bool,
}

impl<S: ClaimBatch> Drop for Runner<S> {
    fn drop(&mut self) {
        if !self.done {
            let mut queue = self.store.batcher().lock();
            queue.runners -= 1;
            queue.waiting.clear();
        }
    }
}

/// A runner's task: runs batches until none waits.
async fn run<S: ClaimBatch>(mut runner: Runner<S>) {
    loop {
        let Some(batch) = runner.store.batcher().next_batch() else {
            runner.done = true;
            return;
        };
        runner.store.run(batch).await;
    }
}

/// Answers every caller of a failed batch: the server's unavailability to each,
/// or else a claim alone (one row may have failed them all, or a lock held past
/// the batch's wait, which a claim alone waits out).
pub(crate) fn failed(mut answers: Vec<oneshot::Sender<Batched>>, error: StoreError) {
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

/// Answers every caller of a batch whose statement failed with the driver's
/// error `e` (read by `map`), as [`failed`] does; each caller's `Unavailable` keeps
/// a driver error of its own as its source where one can be made alike (an I/O
/// error, a pool timed out or closed, a protocol error), and shares `e` otherwise.
pub(crate) fn failed_driver(
    answers: Vec<oneshot::Sender<Batched>>,
    e: sqlx::Error,
    map: fn(sqlx::Error) -> StoreError,
) {
    let twins: Option<Vec<sqlx::Error>> = (1..answers.len()).map(|_| twin(&e)).collect();
    let error = map(e);
    match twins {
        Some(twins) if error.is_unavailable() => {
            let errors = std::iter::once(error).chain(twins.into_iter().map(map));
            for (answer, error) in answers.into_iter().zip(errors) {
                let _ = answer.send(Batched::Failed(error));
            }
        }
        _ => failed(answers, error),
    }
}

/// A driver error alike to `e`, for one more caller, where one can be made.
fn twin(e: &sqlx::Error) -> Option<sqlx::Error> {
    Some(match e {
        sqlx::Error::Io(io) => sqlx::Error::Io(std::io::Error::new(io.kind(), io.to_string())),
        sqlx::Error::PoolTimedOut => sqlx::Error::PoolTimedOut,
        sqlx::Error::PoolClosed => sqlx::Error::PoolClosed,
        sqlx::Error::WorkerCrashed => sqlx::Error::WorkerCrashed,
        sqlx::Error::Protocol(text) => sqlx::Error::Protocol(text.clone()),
        _ => return None,
    })
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
    /// The driver's error itself, one step down the chain.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// Answers the claims of a batch whose statement answered `rows`: whether the
/// statement claimed the row (an integer, 1 or 0), namespace, id, then the
/// record's [`COLUMNS`](super::COLUMNS). A claim whose key came back claimed
/// has its record; one whose key came back unclaimed was refused by that record;
/// the others were refused by a record the statement did not read. `keys` are the
/// batch's, in the order of `answers`; `map` reads a driver error.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn answer_upserted<R: super::SqlRow>(
    keys: &[(String, String)],
    answers: Vec<oneshot::Sender<Batched>>,
    rows: &[R],
    map: fn(sqlx::Error) -> StoreError,
) {
    use super::RawRecord;

    let mut answered: Vec<Option<&R>> = vec![None; answers.len()];
    for row in rows {
        let key = row.text(1).and_then(|ns| Ok((ns, row.text(2)?)));
        let at = key
            .ok()
            .and_then(|(ns, id)| keys.iter().position(|k| k.0 == ns && k.1 == id));
        match at {
            Some(i) => answered[i] = Some(row),
            None => {
                let error =
                    StoreError::Corrupt("a batched claim answered a key it was not given".into());
                return failed(answers, error);
            }
        }
    }
    for ((answer, row), (namespace, id)) in answers.into_iter().zip(answered).zip(keys) {
        let batched = match row {
            None => Batched::Refused,
            Some(row) => {
                let read = row
                    .integer(0)
                    .and_then(|claimed| Ok((claimed == 1, RawRecord::read(row, 3)?)));
                match read.map_err(map).and_then(|(claimed, raw)| {
                    Ok((
                        claimed,
                        raw.into_record(crate::store::Key::new(namespace, id))?,
                    ))
                }) {
                    Ok((true, record)) => Batched::Acquired(record),
                    Ok((false, record)) => Batched::Existing(record),
                    Err(e) => Batched::Failed(e),
                }
            }
        };
        // A caller gone meanwhile: the guard's drop guard releases its claim.
        let _ = answer.send(batched);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn callers(
        n: usize,
    ) -> (
        Vec<oneshot::Sender<Batched>>,
        Vec<oneshot::Receiver<Batched>>,
    ) {
        (0..n).map(|_| oneshot::channel()).unzip()
    }

    fn unavailable(e: sqlx::Error) -> StoreError {
        StoreError::unavailable(e)
    }

    /// The error each caller was answered, checked to be `Unavailable`.
    fn unavailable_answers(answered: Vec<oneshot::Receiver<Batched>>) -> Vec<StoreError> {
        answered
            .into_iter()
            .map(|mut answered| {
                let Ok(Batched::Failed(error)) = answered.try_recv() else {
                    panic!("not failed")
                };
                assert!(error.is_unavailable());
                error
            })
            .collect()
    }

    /// Each caller of a batch that could not reach the server keeps a driver error
    /// of its own where one can be made alike: a host may downcast it.
    #[test]
    fn each_caller_of_an_unreachable_batch_keeps_a_driver_error() {
        let (answers, answered) = callers(3);
        failed_driver(answers, sqlx::Error::PoolTimedOut, unavailable);
        for error in unavailable_answers(answered) {
            let source = std::error::Error::source(&error).expect("a source");
            assert!(matches!(
                source.downcast_ref::<sqlx::Error>(),
                Some(sqlx::Error::PoolTimedOut)
            ));
        }
    }

    /// A driver error that cannot be made again is shared by the callers, each
    /// showing its text.
    #[test]
    fn an_error_that_cannot_be_made_again_is_shared() {
        let (answers, answered) = callers(2);
        failed_driver(answers, sqlx::Error::RowNotFound, unavailable);
        for error in unavailable_answers(answered) {
            assert_eq!(
                error.to_string(),
                format!("store unavailable: {}", sqlx::Error::RowNotFound)
            );
            // The driver's error is one step down the chain.
            let shared = std::error::Error::source(&error).expect("a source");
            let driver = shared.source().expect("the driver's error");
            assert!(matches!(
                driver.downcast_ref::<sqlx::Error>(),
                Some(sqlx::Error::RowNotFound)
            ));
        }
    }

    /// A batch the server refused (not unreachable) sends each caller on alone.
    #[test]
    fn a_refused_batch_sends_each_caller_on_alone() {
        let (answers, mut answered) = callers(2);
        failed_driver(answers, sqlx::Error::PoolTimedOut, StoreError::backend);
        for answered in &mut answered {
            assert!(matches!(answered.try_recv(), Ok(Batched::Alone)));
        }
    }
}
