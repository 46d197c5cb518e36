//! The public conformance suite on the built-in `MemoryStore`.

use webhook_guard::conformance;
use webhook_guard::MemoryStore;

#[tokio::test]
async fn memory_store_passes_the_conformance_suite() {
    conformance::run_all(&MemoryStore::new()).await;
}

#[tokio::test]
async fn a_single_shard_store_passes_too() {
    conformance::run_all(&MemoryStore::with_shards(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suites_can_share_a_store_concurrently() {
    let store = MemoryStore::new();
    let (a, b) = tokio::join!(conformance::run_all(&store), conformance::run_all(&store));
    let ((), ()) = (a, b);
}

#[tokio::test]
async fn memory_store_passes_the_inbox_and_ordering_suites() {
    let store = MemoryStore::new();
    conformance::inbox::run_all(&store).await;
    conformance::ordering::run_all(&store).await;
}
