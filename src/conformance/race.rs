//! Claims racing on OS threads: what a single task cannot show of a store whose
//! calls never wait.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use futures_util::future::join_all;

use crate::store::{Claim, ProcessedStore, StoreError};

use super::Fixture;

/// How many rounds [`claims_racing_on_threads_have_one_winner`] runs.
const ROUNDS: usize = 200;

/// How many threads claim the same key in one round.
const THREADS: usize = 8;

/// A claim's future, as the trait's `async_trait` methods box it.
type ClaimFuture<'a> = Pin<Box<dyn Future<Output = Result<Claim, StoreError>> + Send + 'a>>;

/// Of claims of one key released together on several OS threads, exactly one is
/// acquired, round after round: a claim must read and write in one atomic step
/// across threads, not only across the tasks of one thread.
///
/// Each thread enters the caller's tokio runtime, if any, and polls its claim
/// once, all released at the same instant; a claim that has not finished by then
/// (one that waits on a server) is finished on the caller's task, as the other
/// checks' concurrent claims are. A store whose calls never wait therefore runs
/// its claims truly in parallel here, and one that reads the record, then writes
/// it, without holding anything between (one lock for the read and another for the
/// write, say) lets two of them win. That shows on a machine with more than one
/// core; on one, the threads take turns.
pub async fn claims_racing_on_threads_have_one_winner(store: &dyn ProcessedStore) {
    let rule =
        "claim is atomic across threads: of claims of one key racing on threads, exactly one wins";
    let f = Fixture::new();
    let runtime = tokio::runtime::Handle::try_current().ok();
    for round in 0..ROUNDS {
        let id = format!("thread_race_{round}");
        let requests: Vec<_> = (0..THREADS).map(|_| f.request(&id, b"same", 0)).collect();
        let ready = AtomicUsize::new(0);
        let polled: Vec<Result<Claim, ClaimFuture<'_>>> = std::thread::scope(|s| {
            let threads: Vec<_> = (requests.iter())
                .map(|request| {
                    let ready = &ready;
                    let runtime = runtime.clone();
                    s.spawn(move || {
                        // A store that needs the caller's runtime (a timer, a
                        // driver's task) finds it here too.
                        let _entered = runtime.as_ref().map(tokio::runtime::Handle::enter);
                        let mut call: ClaimFuture<'_> = store.claim(request);
                        wait_for_all(ready);
                        let mut cx = Context::from_waker(Waker::noop());
                        match call.as_mut().poll(&mut cx) {
                            Poll::Ready(answer) => Ok(answer.expect("claim failed")),
                            Poll::Pending => Err(call),
                        }
                    })
                })
                .collect();
            (threads.into_iter())
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        let mut answers = Vec::with_capacity(THREADS);
        let mut waiting = Vec::new();
        for p in polled {
            match p {
                Ok(answer) => answers.push(answer),
                Err(call) => waiting.push(call),
            }
        }
        answers.extend(
            join_all(waiting)
                .await
                .into_iter()
                .map(|a| a.expect("claim failed")),
        );
        let winners = (answers.iter())
            .filter(|a| matches!(a, Claim::Acquired(_)))
            .count();
        assert_eq!(
            winners, 1,
            "{rule}: {winners} of {THREADS} claims of {id} (round {round}) won"
        );
    }
}

/// Counts this thread in and waits, spinning, until all [`THREADS`] are: released
/// within a moment of each other, closer than a sleeping barrier wakes them.
fn wait_for_all(ready: &AtomicUsize) {
    ready.fetch_add(1, Ordering::SeqCst);
    let mut spins = 0u32;
    while ready.load(Ordering::SeqCst) < THREADS {
        if spins < 10_000 {
            spins += 1;
            std::hint::spin_loop();
        } else {
            // More threads than cores: let the others get here.
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use chrono::{DateTime, Utc};

    use crate::store::{
        Claim, ClaimRequest, Decision, Deleted, Fence, Finish, Holder, Key, MemoryStore,
        ProcessedStore, Record, Renew, StoreError,
    };

    type Answer<T> = Result<T, StoreError>;

    /// A store whose claim reads the record under the lock, lets it go, then takes
    /// the lock again to write: each call is atomic on one thread (it never waits),
    /// but two threads may both read "no record" and both write. Only what the
    /// claim checks call is written.
    #[derive(Debug, Default)]
    struct ReadThenWrite(Mutex<HashMap<String, Record>>);

    #[async_trait]
    impl ProcessedStore for ReadThenWrite {
        async fn claim(&self, request: &ClaimRequest<'_>) -> Answer<Claim> {
            let key = request.key.to_string();
            let existing = self.0.lock().unwrap().get(&key).cloned();
            let next = match (request.decide(existing.as_ref()), existing) {
                (Decision::Keep, Some(record)) => return Ok(Claim::Existing(record)),
                (Decision::TakeOver, Some(record)) => record.taken_over(request),
                _ => Record::claimed(request),
            };
            self.0.lock().unwrap().insert(key, next.clone());
            Ok(Claim::Acquired(next))
        }

        async fn get(&self, key: Key<'_>) -> Answer<Option<Record>> {
            Ok(self.0.lock().unwrap().get(&key.to_string()).cloned())
        }

        async fn finish(&self, _: Holder<'_>, _: &Finish<'_>) -> Answer<Fence> {
            unimplemented!()
        }

        async fn renew(&self, _: Holder<'_>, _: &Renew) -> Answer<Fence> {
            unimplemented!()
        }

        async fn delete(&self, _: Key<'_>, _: DateTime<Utc>) -> Answer<Deleted> {
            unimplemented!()
        }

        async fn purge_expired(&self, _: DateTime<Utc>, _: usize) -> Answer<u64> {
            unimplemented!()
        }

        async fn stuck(&self, _: DateTime<Utc>, _: usize) -> Answer<Vec<Record>> {
            unimplemented!()
        }
    }

    /// The panic message of the race on threads run on `store`, if it panicked.
    async fn failure(store: Arc<dyn ProcessedStore>) -> Option<String> {
        let run = tokio::spawn(async move {
            super::claims_racing_on_threads_have_one_winner(&*store).await;
        });
        let panic = run.await.err()?.into_panic();
        (panic.downcast_ref::<String>().cloned())
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
    }

    /// The concurrent claims on one task let the read-then-write store through;
    /// the race on threads catches it, naming the rule.
    #[tokio::test]
    async fn a_claim_that_reads_then_writes_fails_the_race_on_threads() {
        if std::thread::available_parallelism().map_or(1, usize::from) < 2 {
            // One core: the threads take turns, and no race can show.
            eprintln!("one core: the race on threads cannot show here");
            return;
        }
        let racy = Arc::new(ReadThenWrite::default());
        super::super::concurrent_claims_have_one_winner(&*racy).await;
        let message = failure(racy)
            .await
            .expect("the race on threads fails the store");
        assert!(
            message.contains("claim is atomic across threads"),
            "the failure names the rule: {message}"
        );
    }

    /// The built-in memory store, one lock per shard or one for all, passes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_memory_store_passes_the_race_on_threads() {
        for store in [MemoryStore::new(), MemoryStore::with_shards(1)] {
            assert_eq!(failure(Arc::new(store)).await, None, "memory store");
        }
    }
}
