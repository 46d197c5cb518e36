//! The guard makes only the store round trips the semantics need: claim + complete
//! for a processed delivery, a single claim for a duplicate.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::support::counted::Counted;
use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, HandlerError, MemoryStore, Outcome, WebhookGuard};

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

#[test]
fn processed_takes_two_round_trips_and_a_duplicate_one() {
    let store = Arc::new(Counted::<MemoryStore>::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(NoVerification)
        .event_id(EventId::header("x-event-id"))
        .build()
        .unwrap();
    let headers = [("x-event-id", "evt_1")];
    let deliver = || ready(guard.handle(&headers, b"{}", |_| async { Ok::<(), HandlerError>(()) }));

    let outcome = deliver();
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(store.take(), 2, "claim + complete");

    let outcome = deliver();
    assert!(matches!(outcome, Outcome::Duplicate { .. }), "{outcome:?}");
    assert_eq!(store.take(), 1, "a single claim");
}
