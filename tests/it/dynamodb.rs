//! The DynamoDB store against a DynamoDB-compatible server at
//! `WEBHOOK_GUARD_DYNAMODB_URL` (an endpoint URL; `scripts/services.sh` starts
//! `moto` in server mode there). Each test works in a table of its own, which it
//! deletes at the end. Credentials come from the SDK's chain (the scripts set
//! dummy ones in the environment).

use crate::support;

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use webhook_guard::conformance;
use webhook_guard::inbox::{InboxStore, NewEvent};
use webhook_guard::meta::EventMeta;
use webhook_guard::store::dynamodb::aws_sdk_dynamodb::types::{AttributeValue, TimeToLiveStatus};
use webhook_guard::store::dynamodb::{DynamoDbStoreError, DUE_INDEX, LIST_INDEX, TTL_ATTRIBUTE};
use webhook_guard::store::{
    Backend, Claim, ClaimRequest, Deleted, DynamoDbStore, Fence, FencingToken, Fingerprint, Finish,
    Holder, Key, Migration, ProcessedStore, RecordState, StoreError,
};

const URL_VAR: &str = "WEBHOOK_GUARD_DYNAMODB_URL";
const REGION: &str = "us-east-1";

fn endpoint() -> Option<String> {
    support::server_url(URL_VAR)
}

fn unique_table(test: &str) -> String {
    format!("wg_test_{test}_{:016x}", FencingToken::random().0)
}

/// A store on a new table (created), with `shards` shards.
async fn store_with(endpoint: &str, test: &str, shards: u16) -> DynamoDbStore {
    let store = DynamoDbStore::builder(unique_table(test))
        .endpoint_url(endpoint)
        .region(REGION)
        .shards(shards)
        .connect()
        .await
        .expect("build the DynamoDB store");
    store.create_table().await.expect("create the table");
    store
}

async fn store(endpoint: &str, test: &str) -> DynamoDbStore {
    store_with(endpoint, test, 4).await
}

async fn drop_table(store: &DynamoDbStore) {
    (store.client().delete_table())
        .table_name(store.table())
        .send()
        .await
        .expect("delete the test table");
}

/// The raw item of `pk`, as DynamoDB holds it.
async fn raw_item(
    store: &DynamoDbStore,
    pk: &str,
) -> Option<std::collections::HashMap<String, AttributeValue>> {
    (store.client().get_item())
        .table_name(store.table())
        .key("pk", AttributeValue::S(pk.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
}

fn number(item: &std::collections::HashMap<String, AttributeValue>, name: &str) -> i64 {
    match item.get(name) {
        Some(AttributeValue::N(n)) => n.parse().unwrap(),
        other => panic!("{name}: {other:?}"),
    }
}

fn text<'i>(item: &'i std::collections::HashMap<String, AttributeValue>, name: &str) -> &'i str {
    match item.get(name) {
        Some(AttributeValue::S(s)) => s,
        other => panic!("{name}: {other:?}"),
    }
}

fn now_ms() -> DateTime<Utc> {
    support::ms(Utc::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite() {
    let Some(endpoint) = endpoint() else { return };
    let store = store(&endpoint, "conformance").await;
    store
        .create_table()
        .await
        .expect("create_table is idempotent");
    let started = Instant::now();
    conformance::run_all(&store).await;
    conformance::listing::run_all(&store).await;
    eprintln!("dynamodb conformance: {:?}", started.elapsed());
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_inbox_and_ordering_suites() {
    let Some(endpoint) = endpoint() else { return };
    let store = store(&endpoint, "inbox").await;
    let started = Instant::now();
    conformance::inbox::run_all(&store).await;
    conformance::ordering::run_all(&store).await;
    conformance::listing::run_inbox(&store).await;
    eprintln!(
        "dynamodb inbox and ordering conformance: {:?}",
        started.elapsed()
    );
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_finish_is_refused_by_the_server() {
    let Some(endpoint) = endpoint() else { return };
    let store = store(&endpoint, "fence").await;
    support::an_expired_lease_is_taken_over_and_the_stale_token_refused(&store).await;

    // The fence is the server's condition: the item keeps the new holder's token
    // and state, and its version did not move, after the stale finish.
    let t0 = now_ms();
    let key = Key::new("fence", "evt_2");
    let claim = |token: u64, at: i64| ClaimRequest {
        key,
        fingerprint: Fingerprint::of(b"body"),
        token: FencingToken(token),
        now: t0 + TimeDelta::seconds(at),
        lease_until: t0 + TimeDelta::seconds(at + 10),
        expires_at: t0 + TimeDelta::seconds(at + 3600),
    };
    assert!(matches!(
        store.claim(&claim(1, 0)).await.unwrap(),
        Claim::Acquired(_)
    ));
    assert!(
        matches!(store.claim(&claim(2, 11)).await.unwrap(), Claim::Acquired(r) if r.token == FencingToken(2))
    );
    let pk = "r/5/fence/evt_2";
    let before = raw_item(&store, pk).await.expect("the record's item");
    let done = Finish {
        state: RecordState::Completed,
        failures: 0,
        history: &[],
        now: t0 + TimeDelta::seconds(12),
        expires_at: t0 + TimeDelta::seconds(7200),
    };
    assert_eq!(
        store
            .finish(Holder::new(key, FencingToken(1)), &done)
            .await
            .unwrap(),
        Fence::LeaseLost
    );
    let after = raw_item(&store, pk).await.unwrap();
    assert_eq!(before, after, "a refused finish changes nothing");
    assert_eq!(text(&after, "state"), "in_progress");
    assert_eq!(number(&after, "token"), 2);
    assert_eq!(
        store
            .finish(Holder::new(key, FencingToken(2)), &done)
            .await
            .unwrap(),
        Fence::Applied
    );
    let finished = raw_item(&store, pk).await.unwrap();
    assert_eq!(text(&finished, "state"), "completed");
    assert_eq!(number(&finished, "v"), number(&after, "v") + 1);
    // Finished: filed at its expiry for the purge, no longer among the leases.
    assert!(text(&finished, "due_pk").starts_with("r/expiry/"));
    assert_eq!(
        number(&finished, "due_at"),
        (done.expires_at).timestamp_millis()
    );
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_expired_items_without_waiting_for_the_ttl() {
    let Some(endpoint) = endpoint() else { return };
    let store = store(&endpoint, "purge").await;
    let t0 = now_ms();
    let request = |id: &'static str, token: u64| ClaimRequest {
        key: Key::new("purge", id),
        fingerprint: Fingerprint::of(id.as_bytes()),
        token: FencingToken(token),
        now: t0,
        lease_until: t0 + TimeDelta::seconds(30),
        expires_at: t0 + TimeDelta::seconds(60),
    };
    for (i, id) in ["a", "b", "c", "d"].into_iter().enumerate() {
        assert!(matches!(
            store.claim(&request(id, i as u64 + 1)).await.unwrap(),
            Claim::Acquired(_)
        ));
    }
    // a, b completed (expire at +60 s); c stays in progress (lease to +30 s, expiry
    // +60 s); d completed with a day's retention.
    let done = |expires: i64| Finish {
        state: RecordState::Completed,
        failures: 0,
        history: &[],
        now: t0 + TimeDelta::seconds(1),
        expires_at: t0 + TimeDelta::seconds(expires),
    };
    for (id, token) in [("a", 1), ("b", 2)] {
        let key = Key::new("purge", id);
        assert_eq!(
            store
                .finish(Holder::new(key, FencingToken(token)), &done(60))
                .await
                .unwrap(),
            Fence::Applied
        );
    }
    let d = Key::new("purge", "d");
    assert_eq!(
        store
            .finish(Holder::new(d, FencingToken(4)), &done(86_400))
            .await
            .unwrap(),
        Fence::Applied
    );

    // The TTL attribute: the later of expiry and lease, in real seconds.
    let item = raw_item(&store, "r/5/purge/c").await.unwrap();
    let ttl = number(&item, TTL_ATTRIBUTE);
    let expected = (t0 + TimeDelta::seconds(60)).timestamp();
    assert!(
        (expected - 5..=expected + 5).contains(&ttl),
        "ttl {ttl}, expected about {expected}"
    );

    assert_eq!(
        store
            .purge_expired(t0 + TimeDelta::seconds(59), 100)
            .await
            .unwrap(),
        0,
        "nothing expired yet"
    );
    let at = t0 + TimeDelta::seconds(60);
    assert_eq!(
        store.purge_expired(at, 1).await.unwrap(),
        1,
        "the limit is kept"
    );
    assert_eq!(
        store.purge_expired(at, 100).await.unwrap(),
        2,
        "the other two expired records"
    );
    for id in ["a", "b", "c"] {
        assert!(
            raw_item(&store, &format!("r/5/purge/{id}")).await.is_none(),
            "{id} is gone"
        );
    }
    assert!(
        store.get(d).await.unwrap().is_some(),
        "an unexpired record stays"
    );
    assert_eq!(store.purge_expired(at, 100).await.unwrap(), 0);
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_lists_expired_leases_across_shards_longest_expired_first() {
    let Some(endpoint) = endpoint() else { return };
    let store = store_with(&endpoint, "stuck", 8).await;
    let t0 = now_ms();
    let ids: Vec<String> = (0..12).map(|i| format!("evt_{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let i = i as i64;
        let request = ClaimRequest {
            key: Key::new("stuck", id),
            fingerprint: Fingerprint::of(b"b"),
            token: FencingToken(i as u64 + 1),
            now: t0,
            // Leases ending in the reverse order of the ids.
            lease_until: t0 + TimeDelta::seconds(100 - i),
            expires_at: t0 + TimeDelta::hours(1),
        };
        assert!(matches!(
            store.claim(&request).await.unwrap(),
            Claim::Acquired(_)
        ));
    }
    // The even ones finish.
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        let done = Finish {
            state: RecordState::Completed,
            failures: 0,
            history: &[],
            now: t0 + TimeDelta::seconds(1),
            expires_at: t0 + TimeDelta::hours(1),
        };
        let key = Key::new("stuck", id);
        assert_eq!(
            store
                .finish(Holder::new(key, FencingToken(i as u64 + 1)), &done)
                .await
                .unwrap(),
            Fence::Applied
        );
    }
    assert!(store
        .stuck(t0 + TimeDelta::seconds(50), 100)
        .await
        .unwrap()
        .is_empty());
    // At +95 s the leases of evt_5 .. evt_11 have run out; the odd ones are stuck.
    let stuck = store.stuck(t0 + TimeDelta::seconds(95), 100).await.unwrap();
    let names: Vec<&str> = stuck.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(names, ["evt_11", "evt_9", "evt_7", "evt_5"]);
    let first = store.stuck(t0 + TimeDelta::seconds(95), 2).await.unwrap();
    let names: Vec<&str> = first.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(
        names,
        ["evt_11", "evt_9"],
        "a page holds the longest-expired"
    );
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_sets_the_schema_and_the_ttl() {
    let Some(endpoint) = endpoint() else { return };
    let store = store(&endpoint, "schema").await;
    store.create_table().await.expect("again: idempotent");
    let ttl = (store.client().describe_time_to_live())
        .table_name(store.table())
        .send()
        .await
        .unwrap();
    let description = ttl.time_to_live_description().unwrap();
    assert_eq!(description.attribute_name(), Some(TTL_ATTRIBUTE));
    assert!(matches!(
        description.time_to_live_status(),
        Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
    ));
    let table = (store.client().describe_table())
        .table_name(store.table())
        .send()
        .await
        .unwrap();
    let indexes = table.table().unwrap().global_secondary_indexes();
    let mut names: Vec<_> = indexes.iter().filter_map(|i| i.index_name()).collect();
    names.sort_unstable();
    assert_eq!(names, [DUE_INDEX, LIST_INDEX], "the due and list indexes");
    drop_table(&store).await;

    // A table of the same name without the index is refused, not used.
    use webhook_guard::store::dynamodb::aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    (store.client().create_table())
        .table_name(store.table())
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
    let err = store.create_table().await.unwrap_err();
    let schema = match &err {
        StoreError::Backend { source } => source.downcast_ref::<DynamoDbStoreError>(),
        _ => None,
    };
    assert!(
        matches!(schema, Some(DynamoDbStoreError::Schema(_))),
        "{err}"
    );
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_too_large_for_an_item_is_refused_with_a_typed_error() {
    let Some(endpoint) = endpoint() else { return };
    let store = store(&endpoint, "size").await;
    let meta = EventMeta::default();
    let now = now_ms();
    let event = |payload: &'static [u8], id: &'static str| NewEvent {
        key: Key::new("size", id),
        fingerprint: Fingerprint::of(payload),
        meta: &meta,
        payload,
        now,
        expires_at: now + TimeDelta::hours(1),
    };
    let big: &'static [u8] = vec![b'x'; 420 * 1024].leak();
    let err = store.enqueue(&event(big, "big")).await.unwrap_err();
    let source = match &err {
        StoreError::Backend { source } => source.downcast_ref::<DynamoDbStoreError>(),
        _ => None,
    };
    assert!(
        matches!(source, Some(DynamoDbStoreError::ItemTooLarge { bytes }) if *bytes > 420 * 1024),
        "{err}"
    );
    assert!(store
        .get_event(Key::new("size", "big"))
        .await
        .unwrap()
        .is_none());
    // One that fits is stored whole.
    let fits: &'static [u8] = vec![b'y'; 300 * 1024].leak();
    store.enqueue(&event(fits, "fits")).await.unwrap();
    let stored = store
        .get_event(Key::new("size", "fits"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.payload.len(), 300 * 1024);

    // A key past DynamoDB's 2048 bytes is refused with its own error.
    let long = "k".repeat(2100);
    let request = support::fresh_request("x", now);
    let request = ClaimRequest {
        key: Key::new("size", &long),
        ..request
    };
    let err = store.claim(&request).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Backend { source } if matches!(source.downcast_ref::<DynamoDbStoreError>(), Some(DynamoDbStoreError::KeyTooLong { limit: 2048, .. }))),
        "{err}"
    );

    // A record's id must also fit the `list` index's sort key (18 bytes + the id,
    // at most 1024): 1007 bytes is refused before any write, 1006 is stored.
    for (len, fits) in [(1007, false), (1006, true)] {
        let id = "i".repeat(len);
        let request = ClaimRequest {
            key: Key::new("size", &id),
            ..support::fresh_request("x", now)
        };
        let answer = store.claim(&request).await;
        if fits {
            assert!(
                matches!(answer, Ok(Claim::Acquired(_))),
                "{len}: {answer:?}"
            );
        } else {
            let err = answer.unwrap_err();
            assert!(
                matches!(&err, StoreError::Backend { source } if matches!(source.downcast_ref::<DynamoDbStoreError>(), Some(DynamoDbStoreError::KeyTooLong { bytes: 1025, limit: 1024 }))),
                "{len}: {err}"
            );
        }
    }
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_unavailable() {
    // Gated like the other tests, though it needs no server: nothing listens on
    // port 9 of the loopback.
    let Some(_) = endpoint() else { return };
    let store = DynamoDbStore::builder("wg_unreachable")
        .endpoint_url("http://127.0.0.1:9")
        .region(REGION)
        .connect_timeout(Duration::from_millis(200))
        .attempt_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let err = store.get(Key::new("x", "y")).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    // A refused connection sent nothing: the guard looks for no claim after it.
    assert!(
        matches!(err, webhook_guard::StoreError::NotSent { .. }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opens_from_a_store_url_and_migrates() {
    let Some(endpoint) = endpoint() else { return };
    let table = unique_table("url");
    let encoded: String = endpoint.replace(':', "%3A").replace('/', "%2F");
    let url = format!("dynamodb://{table}?region={REGION}&endpoint={encoded}&shards=2");
    let opened = webhook_guard::store::open(&url).await.expect("open");
    assert_eq!(opened.backend(), Backend::DynamoDb);
    assert_eq!(
        opened.migrate().await.unwrap(),
        Migration::Applied {
            table: table.clone()
        }
    );
    let store = opened.shared();
    let now = now_ms();
    let request = support::fresh_request("via_url", now);
    assert!(matches!(
        store.claim(&request).await.unwrap(),
        Claim::Acquired(_)
    ));
    assert_eq!(
        store.delete(request.key, now).await.unwrap(),
        Deleted::LeaseHeld
    );
    let again = webhook_guard::store::open(&url).await.unwrap();
    assert!(
        matches!(again.shared().claim(&request).await.unwrap(), Claim::Acquired(r) if r.token == request.token),
        "the claim's own record"
    );
    let direct = DynamoDbStore::builder(&table)
        .endpoint_url(&endpoint)
        .region(REGION)
        .connect()
        .await
        .unwrap();
    drop_table(&direct).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_processes_once_on_dynamodb() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use webhook_guard::verify::NoVerification;
    use webhook_guard::{EventId, Outcome, WebhookGuard};

    let Some(endpoint) = endpoint() else { return };
    let store = store(&endpoint, "guard").await;
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-id"))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let runs = runs.clone();
        let outcome = guard
            .handle(&[("x-id", "evt_guard_1")], b"{}", |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .await;
        outcomes.push(outcome);
    }
    assert!(
        matches!(outcomes[0], Outcome::Processed { .. }),
        "{outcomes:?}"
    );
    assert!(
        outcomes[1..]
            .iter()
            .all(|o| matches!(o, Outcome::Duplicate { .. })),
        "{outcomes:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "one run for three deliveries"
    );
    drop_table(&store).await;
}

/// Records dated 2001 keep a TTL measured from the caller's clock: they are not
/// handed to DynamoDB's TTL as long expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ttl_is_measured_from_the_callers_clock() {
    let Some(endpoint) = endpoint() else { return };
    let store = store(&endpoint, "ttl").await;
    let then = Utc.with_ymd_and_hms(2001, 1, 1, 0, 0, 0).unwrap();
    let request = ClaimRequest {
        key: Key::new("ttl", "old"),
        fingerprint: Fingerprint::of(b"b"),
        token: FencingToken(7),
        now: then,
        lease_until: then + TimeDelta::seconds(30),
        expires_at: then + TimeDelta::hours(2),
    };
    assert!(matches!(
        store.claim(&request).await.unwrap(),
        Claim::Acquired(_)
    ));
    let item = raw_item(&store, "r/3/ttl/old").await.unwrap();
    let ttl = number(&item, TTL_ATTRIBUTE);
    let expected = (Utc::now() + TimeDelta::hours(2)).timestamp();
    assert!(
        (expected - 60..=expected + 5).contains(&ttl),
        "ttl {ttl}, expected about {expected}"
    );
    drop_table(&store).await;
}
