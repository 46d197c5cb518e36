//! The guard's hot path allocates only what it needs: counted with a counting global
//! allocator around `System`, per thread (tests run in parallel threads).
//!
//! The bounds are the counts measured on `MemoryStore` with verification off and
//! the id in a header (the Stripe preset, which reads the id and the metadata from
//! the body, is held to the same bound); a change that adds an allocation per
//! delivery fails here.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, HandlerError, MemoryStore, Outcome, WebhookGuard};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to `System`; the counter is a
// const-initialised thread-local `Cell`, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCS.with(Cell::get);
    let out = f();
    (out, ALLOCS.with(Cell::get) - before)
}

/// The memory store answers without waiting: one poll completes the flow.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

const BODY: &[u8] = br#"{"id":"evt_1","type":"charge.succeeded"}"#;

fn deliver(guard: &WebhookGuard, id: &str) -> Outcome {
    let headers = [("x-event-id", id)];
    ready(guard.handle(&headers, BODY, |_| async { Ok::<(), HandlerError>(()) }))
}

/// Allocations per processed delivery (claim, no-op handler, complete), as measured:
/// the id read from the header (the outcome carries it), the boxed future of each of
/// the two store calls (`async_trait`), the `Record` the claim answers (namespace and
/// id strings), and the claim shared with the handler's `Event`. The stored record
/// takes a slot of its shard's slab (its key inline): no allocation while the slab
/// has a free slot.
const PROCESSED_MAX: u64 = 6;
/// New records per slab chunk: a store that is still growing also allocates one
/// chunk per this many new records.
const SLAB_CHUNK: u64 = 8;
/// Allocations per duplicate, as measured: the id, the boxed claim future, and the
/// `Record` the claim answers (namespace and id strings).
const DUPLICATE_MAX: u64 = 4;

#[test]
fn hot_path_allocations_are_bounded() {
    let guard = WebhookGuard::builder()
        .store(MemoryStore::with_shards(1))
        .verifier(NoVerification)
        .event_id(EventId::header("x-event-id"))
        .build()
        .unwrap();
    // Warm-up: grow the shard's table past the ids below (no resize is counted), and
    // leave unused slots in the slab's last chunk (slots 1001 to 1007), so the single
    // deliveries measured first count the hot path alone.
    let ids: Vec<String> = (0..2000).map(|i| format!("evt_{i:026}")).collect();
    for id in &ids[..1001] {
        deliver(&guard, id);
    }

    let (outcome, processed) = allocations(|| deliver(&guard, &ids[1001]));
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    let (outcome, duplicate) = allocations(|| deliver(&guard, &ids[1001]));
    assert!(matches!(outcome, Outcome::Duplicate { .. }), "{outcome:?}");
    // Then a run of 64 new ids: the slab grows by 8 chunks meanwhile.
    let run = &ids[1002..1066];
    let ((), growing) = allocations(|| {
        for id in run {
            assert!(matches!(deliver(&guard, id), Outcome::Processed { .. }));
        }
    });
    println!("allocations: processed {processed}, duplicate {duplicate}, {growing} for 64 new ids");

    assert!(
        processed <= PROCESSED_MAX,
        "a processed delivery allocated {processed} times (bound {PROCESSED_MAX})"
    );
    assert!(
        duplicate <= DUPLICATE_MAX,
        "a duplicate allocated {duplicate} times (bound {DUPLICATE_MAX})"
    );
    // The slab's list of chunks (126 long before the run) doubles once meanwhile.
    let bound = 64 * PROCESSED_MAX + 64 / SLAB_CHUNK + 1;
    assert!(
        growing <= bound,
        "64 new ids on a growing store allocated {growing} times (bound {bound})"
    );
}

/// A preset that reads the event's id and metadata from the body (Stripe) allocates
/// no more than the id in a header does: the metadata is not read for a guard
/// without an ordering store or a reconciler (reading it cost three `String`s: the
/// type, the object and the family).
#[test]
fn a_preset_reading_the_body_allocates_no_more() {
    use webhook_guard::verify::Stripe;
    let secret = "whsec_allocations0123456789abcdefghijk";
    let guard = WebhookGuard::builder()
        .store(MemoryStore::with_shards(1))
        .verifier(Stripe::new([secret]).unwrap())
        .build()
        .unwrap();
    let signer = Stripe::new([secret]).unwrap();
    let now = chrono::Utc::now().timestamp();
    let deliveries: Vec<(String, String)> = (0..1002)
        .map(|i| {
            let body = format!(
                r#"{{"id":"evt_{i:026}","type":"charge.succeeded","created":1700000000,"data":{{"object":{{"id":"ch_{i}"}}}}}}"#
            );
            let signature = signer.sign(body.as_bytes(), now);
            (body, signature)
        })
        .collect();
    let deliver = |(body, signature): &(String, String)| {
        let headers = [("stripe-signature", signature.as_str())];
        ready(guard.handle(&headers, body.as_bytes(), |_| async {
            Ok::<(), HandlerError>(())
        }))
    };
    // Warm-up as in `hot_path_allocations_are_bounded`.
    for delivery in &deliveries[..1001] {
        assert!(matches!(deliver(delivery), Outcome::Processed { .. }));
    }
    let (outcome, processed) = allocations(|| deliver(&deliveries[1001]));
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    println!("allocations with the Stripe preset: processed {processed}");
    assert!(
        processed <= PROCESSED_MAX,
        "a processed Stripe delivery allocated {processed} times (bound {PROCESSED_MAX})"
    );
}

/// A router adds no allocation of its own: a Stripe delivery routed to a handler
/// whose payload type borrows the body (so it allocates nothing either) allocates
/// exactly as many times as one given to a plain handler; likewise a GitHub one,
/// whose type is its `X-GitHub-Event` header (kept inline from verification) and its
/// body's `action`, and an `OwnedEvent` routed to a payload of numbers only.
#[test]
fn a_router_allocates_nothing_beyond_the_payload() {
    use bytes::Bytes;
    use webhook_guard::route::Router;
    use webhook_guard::verify::{GitHub, Stripe};
    use webhook_guard::{Event, OwnedEvent};

    #[derive(serde::Deserialize)]
    struct Intent<'a> {
        #[serde(borrow)]
        data: Data<'a>,
    }
    #[derive(serde::Deserialize)]
    struct Data<'a> {
        #[serde(borrow)]
        object: Object<'a>,
    }
    #[derive(serde::Deserialize)]
    struct Object<'a> {
        id: &'a str,
    }
    #[derive(serde::Deserialize)]
    struct Issue {
        issue: Number,
    }
    #[derive(serde::Deserialize)]
    struct Number {
        number: u64,
    }

    let secret = "whsec_allocations000000000000000000000";
    let stripe = Stripe::new([secret]).unwrap();
    let guard = WebhookGuard::builder()
        .store(MemoryStore::with_shards(1))
        .verifier(stripe.clone())
        .build()
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    let deliveries: Vec<(String, String)> = (0..1004)
        .map(|i| {
            let body = format!(
                r#"{{"id":"evt_{i:026}","type":"charge.succeeded","data":{{"object":{{"id":"ch_{i}"}}}}}}"#
            );
            let signature = stripe.sign(body.as_bytes(), now);
            (body, signature)
        })
        .collect();
    let plain = |(body, signature): &(String, String)| {
        let headers = [("stripe-signature", signature.as_str())];
        ready(guard.handle(&headers, body.as_bytes(), |_| async {
            Ok::<(), HandlerError>(())
        }))
    };
    let routed = |(body, signature): &(String, String)| {
        let headers = [("stripe-signature", signature.as_str())];
        let router = Router::new()
            .on("charge.succeeded", |charge: Intent<'_>, _: Event<'_>| {
                assert!(charge.data.object.id.starts_with("ch_"));
                async { Ok(()) }
            })
            .on("charge.refunded", |_: Intent<'_>, _: Event<'_>| async {
                Ok(())
            })
            .fallback(|_: Event<'_>| async { Err(HandlerError::permanent("unrouted")) });
        ready(guard.handle(&headers, body.as_bytes(), |event| router.dispatch(event)))
    };
    for delivery in &deliveries[..1001] {
        assert!(matches!(plain(delivery), Outcome::Processed { .. }));
    }
    let (outcome, without) = allocations(|| plain(&deliveries[1001]));
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    let (outcome, with) = allocations(|| routed(&deliveries[1002]));
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    println!("allocations with the Stripe preset: plain handler {without}, router {with}");
    assert_eq!(with, without, "the router allocated");

    // GitHub: the type from a header and the body's action.
    let github = GitHub::new([secret]).unwrap();
    // One body under many ids: keyed on the id alone (content keys would answer
    // the copies `Duplicate`).
    let guard = WebhookGuard::builder()
        .store(MemoryStore::with_shards(1))
        .verifier(github.clone())
        .content_keys(false)
        .build()
        .unwrap();
    let body = br#"{"action":"opened","issue":{"number":7}}"#;
    let signature = github.sign(body);
    let ids: Vec<String> = (0..1004).map(|i| format!("d-{i:026}")).collect();
    let deliver = |id: &str, routed: bool| {
        let headers = [
            ("x-hub-signature-256", signature.as_str()),
            ("x-github-delivery", id),
            ("x-github-event", "issues"),
        ];
        let bytes = Bytes::from_static(body);
        if routed {
            let handler = Router::new()
                .on("issues.opened", |issue: Issue, _: OwnedEvent| {
                    assert_eq!(issue.issue.number, 7);
                    async { Ok(()) }
                })
                .on("issues.closed", |_: Issue, _: OwnedEvent| async { Ok(()) });
            ready(guard.handle_owned(&headers, bytes, |event| handler.dispatch(event)))
        } else {
            ready(guard.handle_owned(&headers, bytes, |_| async { Ok::<(), HandlerError>(()) }))
        }
    };
    for id in &ids[..1001] {
        assert!(matches!(deliver(id, false), Outcome::Processed { .. }));
    }
    let (outcome, without) = allocations(|| deliver(&ids[1001], false));
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    let (outcome, with) = allocations(|| deliver(&ids[1002], true));
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    println!("allocations with the GitHub preset: plain handler {without}, router {with}");
    assert_eq!(with, without, "the router allocated");
    assert!(
        without <= PROCESSED_MAX,
        "a processed GitHub delivery allocated {without} times (bound {PROCESSED_MAX})"
    );
}
