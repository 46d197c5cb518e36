//! Content keys: for GitHub, Shopify, Linear and Jamm, whose delivery id the
//! signature does not cover, a captured delivery replayed under any fresh id is a
//! duplicate and never takes the id, so a genuine, different event later sent under
//! that id still runs. On the memory store, PostgreSQL and Redis.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};
use sha2::{Digest as _, Sha256};
use webhook_guard::clock::{Clock as _, ManualClock};
use webhook_guard::outcome::{HandlerError, OutcomeKind};
use webhook_guard::store::{ClaimRequest, DynProcessedStore, FencingToken, Fingerprint, Key};
use webhook_guard::verify::{GitHub, Jamm, Linear, Provider, Shopify, Verifier};
use webhook_guard::{Outcome, WebhookGuard};

use crate::support::backends::{self, per_backend, Backend};

const NS: &str = "replay";

fn start() -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000, 0).unwrap()
}

/// How one provider's deliveries are made: headers and body of an event whose
/// signed content is `n`, under delivery id `id`, signed at `now`.
#[derive(Clone, Copy, Debug)]
enum Scheme {
    GitHub,
    Shopify,
    Linear,
    Jamm,
}

impl Scheme {
    const ALL: [Self; 4] = [Self::GitHub, Self::Shopify, Self::Linear, Self::Jamm];

    fn provider(self) -> Provider {
        match self {
            Self::GitHub => Provider::GitHub,
            Self::Shopify => Provider::Shopify,
            Self::Linear => Provider::Linear,
            Self::Jamm => Provider::Jamm,
        }
    }

    fn verifier(self) -> Box<dyn Verifier> {
        self.provider()
            .verifier([self.provider().sample_secret()])
            .unwrap()
    }

    /// A delivery of content `n` under `id`, signed at `now` (Linear signs the time
    /// in its body: a retry at another time is another body).
    fn delivery(self, n: u32, id: &str, now: DateTime<Utc>) -> (Vec<(String, String)>, Vec<u8>) {
        let secret = [self.provider().sample_secret()];
        let h = |name: &str, value: String| (name.to_owned(), value);
        match self {
            Self::GitHub => {
                let body = format!(r#"{{"action":"opened","number":{n}}}"#).into_bytes();
                let sig = GitHub::new(secret).unwrap().sign(&body);
                let headers = vec![
                    h("X-Hub-Signature-256", sig),
                    h("X-GitHub-Delivery", id.into()),
                ];
                (headers, body)
            }
            Self::Shopify => {
                let body = format!(r#"{{"id":{n},"total_price":"10.00"}}"#).into_bytes();
                let sig = Shopify::new(secret).unwrap().sign(&body);
                let headers = vec![
                    h("X-Shopify-Hmac-Sha256", sig),
                    h("X-Shopify-Webhook-Id", id.into()),
                ];
                (headers, body)
            }
            Self::Linear => {
                let ms = now.timestamp_millis();
                let body = format!(
                    r#"{{"action":"create","data":{{"id":"{n}"}},"webhookTimestamp":{ms}}}"#
                )
                .into_bytes();
                let sig = Linear::new(secret).unwrap().sign(&body);
                let headers = vec![h("Linear-Signature", sig), h("Linear-Delivery", id.into())];
                (headers, body)
            }
            Self::Jamm => {
                let content = format!(r#"{{"charge":{{"id":"trx-{n}","amount":100}}}}"#);
                let jamm = Jamm::new(secret).unwrap();
                let body = jamm.envelope(
                    id,
                    "EVENT_TYPE_CHARGE_SUCCESS",
                    &content,
                    "2024-01-01T00:00:00Z",
                );
                (Vec::new(), body.into_bytes())
            }
        }
    }
}

fn guard(store: Arc<DynProcessedStore>, scheme: Scheme, clock: &ManualClock) -> WebhookGuard {
    WebhookGuard::builder()
        .store(store)
        .verifier(scheme.verifier())
        .namespace(NS)
        .clock(clock.clone())
        // GitHub delivers once, so escalates at the first failure by default: the
        // release of a failed content is shown with retries.
        .escalate_after(5)
        .build()
        .unwrap()
}

/// Delivers, running a handler that counts its runs in `runs` (and fails when
/// `fail`): the outcome's kind.
async fn deliver(
    guard: &WebhookGuard,
    (headers, body): &(Vec<(String, String)>, Vec<u8>),
    runs: &AtomicUsize,
    fail: bool,
) -> OutcomeKind {
    let outcome = guard
        .handle(&headers.as_slice(), body, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            if fail {
                Err(HandlerError::retryable(std::io::Error::other("down")))
            } else {
                Ok(())
            }
        })
        .await;
    outcome.kind()
}

/// The whole scenario for one scheme on one store.
async fn replays_and_squats(store: Arc<DynProcessedStore>, scheme: Scheme) {
    let clock = ManualClock::new(start());
    let g = guard(store.clone(), scheme, &clock);
    let runs = AtomicUsize::new(0);
    let run = |n| runs.load(Ordering::SeqCst) == n;
    let a = scheme.delivery(1, "delivery-a", clock.now());
    assert_eq!(
        deliver(&g, &a, &runs, false).await,
        OutcomeKind::Processed,
        "{scheme:?}"
    );
    // The provider's retry: same id, same content (Linear: re-signed, a new body).
    clock.advance(TimeDelta::seconds(30));
    let retry = scheme.delivery(1, "delivery-a", clock.now());
    assert_eq!(
        deliver(&g, &retry, &runs, false).await,
        OutcomeKind::Duplicate,
        "{scheme:?}"
    );
    assert!(run(1), "{scheme:?}");
    // A replay of the captured delivery under a fresh id: a duplicate, and the
    // fresh id is never claimed.
    let mut replay = a.clone();
    if let Scheme::Jamm = scheme {
        replay.1 = String::from_utf8(a.1.clone())
            .unwrap()
            .replace("delivery-a", "squatted-b")
            .into_bytes();
    } else {
        replay.0.last_mut().unwrap().1 = "squatted-b".into();
    }
    assert_eq!(
        deliver(&g, &replay, &runs, false).await,
        OutcomeKind::Duplicate,
        "{scheme:?}"
    );
    // The re-signed retry replayed under a fresh id is one too (Linear).
    let mut replayed_retry = retry.clone();
    if !matches!(scheme, Scheme::Jamm) {
        replayed_retry.0.last_mut().unwrap().1 = "squatted-c".into();
        assert_eq!(
            deliver(&g, &replayed_retry, &runs, false).await,
            OutcomeKind::Duplicate,
            "{scheme:?}"
        );
        assert!(
            g.inspect("squatted-c").await.unwrap().is_none(),
            "{scheme:?}"
        );
    }
    assert!(run(1), "{scheme:?}: a replay ran the handler");
    assert!(
        g.inspect("squatted-b").await.unwrap().is_none(),
        "{scheme:?}: the replay took the id"
    );
    // The genuine, different event sent under that id later runs.
    let b = scheme.delivery(2, "squatted-b", clock.now());
    assert_eq!(
        deliver(&g, &b, &runs, false).await,
        OutcomeKind::Processed,
        "{scheme:?}"
    );
    assert!(run(2), "{scheme:?}");
    // A content whose handler failed is released with its id: the retry runs it.
    let c = scheme.delivery(3, "delivery-c", clock.now());
    let failed = deliver(&g, &c, &runs, true).await;
    assert_eq!(failed, OutcomeKind::RetryableFailure, "{scheme:?}");
    let c_again = scheme.delivery(3, "delivery-c", clock.now());
    assert_eq!(
        deliver(&g, &c_again, &runs, false).await,
        OutcomeKind::Processed,
        "{scheme:?}"
    );
    assert!(run(4), "{scheme:?}");
    // Forgotten by an operator, the id and its content run again when redelivered
    // (Linear keeps no content in the id's record: its retry is a new body anyway).
    if !matches!(scheme, Scheme::Linear) {
        g.forget("delivery-a").await.unwrap();
        assert_eq!(
            deliver(&g, &a, &runs, false).await,
            OutcomeKind::Processed,
            "{scheme:?}"
        );
        assert!(run(5), "{scheme:?}");
    }
}

/// The content namespace a guard in `namespace` keeps its content keys in.
fn content_namespace(namespace: &str) -> String {
    let digest = Sha256::digest(namespace.as_bytes());
    format!("\u{1}content:{}", hex::encode(&digest[..8]))
}

/// A process that crashed after claiming a delivery's content and before its id:
/// the content's lease runs out, and the redelivery then runs the handler (the
/// genuine event is held up for a lease, never lost). Meanwhile the redelivery is
/// answered in progress, and the id is not claimed.
async fn a_crash_between_the_claims_loses_nothing(store: Arc<DynProcessedStore>) {
    let clock = ManualClock::new(start());
    let g = guard(store.clone(), Scheme::GitHub, &clock);
    let d = Scheme::GitHub.delivery(7, "delivery-crash", clock.now());
    let key = hex::encode(Sha256::digest(&d.1));
    let ns = content_namespace(NS);
    let request = ClaimRequest {
        key: Key::new(&ns, &key),
        fingerprint: Fingerprint::UNKNOWN,
        token: FencingToken::random(),
        now: clock.now(),
        lease_until: clock.now() + TimeDelta::seconds(300),
        expires_at: clock.now() + TimeDelta::hours(72),
    };
    store.claim(&request).await.unwrap();
    let runs = AtomicUsize::new(0);
    clock.advance(TimeDelta::seconds(10));
    assert_eq!(deliver(&g, &d, &runs, false).await, OutcomeKind::InProgress);
    assert!(g.inspect("delivery-crash").await.unwrap().is_none());
    clock.advance(TimeDelta::seconds(300));
    assert_eq!(deliver(&g, &d, &runs, false).await, OutcomeKind::Processed);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Copies of one delivery under 16 ids at once: the handler runs once.
async fn racing_copies_run_once(store: Arc<DynProcessedStore>) {
    let clock = ManualClock::new(start());
    let g = guard(store, Scheme::Shopify, &clock);
    let runs = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (g, runs) = (g.clone(), runs.clone());
            let d = Scheme::Shopify.delivery(9, &format!("copy-{i}"), clock.now());
            tokio::spawn(async move {
                let outcome = g
                    .handle_owned(&d.0.as_slice(), d.1.into(), move |_| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        Ok(())
                    })
                    .await;
                outcome.kind()
            })
        })
        .collect();
    let mut kinds = Vec::new();
    for t in tasks {
        kinds.push(t.await.unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{kinds:?}");
    let processed = kinds
        .iter()
        .filter(|k| **k == OutcomeKind::Processed)
        .count();
    assert_eq!(processed, 1, "{kinds:?}");
    assert!(kinds.iter().all(|k| matches!(
        k,
        OutcomeKind::Processed | OutcomeKind::Duplicate | OutcomeKind::InProgress
    )));
}

async fn scenario(backend: Backend) {
    for scheme in Scheme::ALL {
        let Some((store, cleanup)) = backends::store(backend, 4, None).await else {
            return;
        };
        replays_and_squats(store, scheme).await;
        cleanup.run().await;
    }
    let Some((store, cleanup)) = backends::store(backend, 4, None).await else {
        return;
    };
    a_crash_between_the_claims_loses_nothing(store.clone()).await;
    racing_copies_run_once(store).await;
    cleanup.run().await;
}

per_backend!(scenario: replay_and_squatting_memory => Memory);
#[cfg(feature = "postgres")]
per_backend!(scenario: replay_and_squatting_postgres => Postgres);
#[cfg(feature = "redis")]
per_backend!(scenario: replay_and_squatting_redis => Redis);

/// Without content keys (turned off), the replay runs again: the behaviour the
/// keys change, shown so a mutant that never claims them fails above.
#[tokio::test]
async fn without_content_keys_a_replay_under_a_fresh_id_runs() {
    let clock = ManualClock::new(start());
    let g = WebhookGuard::builder()
        .store(webhook_guard::MemoryStore::new())
        .verifier(Scheme::GitHub.verifier())
        .clock(clock.clone())
        .content_keys(false)
        .build()
        .unwrap();
    let runs = AtomicUsize::new(0);
    let a = Scheme::GitHub.delivery(1, "a", clock.now());
    let mut replay = a.clone();
    replay.0[1].1 = "b".into();
    assert_eq!(deliver(&g, &a, &runs, false).await, OutcomeKind::Processed);
    assert_eq!(
        deliver(&g, &replay, &runs, false).await,
        OutcomeKind::Processed
    );
}

/// Jamm: the same `content` in a padded envelope under a fresh id is the same
/// content key; an envelope larger than 4 KiB around the content is refused.
#[tokio::test]
async fn a_padded_jamm_envelope_is_a_duplicate_and_a_huge_one_is_refused() {
    let clock = ManualClock::new(start());
    let g = guard(
        Arc::new(webhook_guard::MemoryStore::new()),
        Scheme::Jamm,
        &clock,
    );
    let runs = AtomicUsize::new(0);
    let a = Scheme::Jamm.delivery(1, "mwh-a", clock.now());
    assert_eq!(deliver(&g, &a, &runs, false).await, OutcomeKind::Processed);
    let text = String::from_utf8(a.1.clone()).unwrap();
    let padded = text.replacen(
        "{\"id\":\"mwh-a\"",
        "{\"pad\":\"xxxxxxxxxxxxxxxx\",\"id\":\"mwh-b\"",
        1,
    );
    let padded = (Vec::new(), padded.into_bytes());
    assert_eq!(
        deliver(&g, &padded, &runs, false).await,
        OutcomeKind::Duplicate
    );
    let huge = text.replacen(
        "{\"id\":\"mwh-a\"",
        &format!("{{\"pad\":\"{}\",\"id\":\"mwh-c\"", "x".repeat(5000)),
        1,
    );
    match g
        .handle(&[("", ""); 0], huge.as_bytes(), |_| async { Ok(()) })
        .await
    {
        Outcome::Rejected(r) => assert_eq!(r.code(), "malformed_body"),
        other => panic!("{other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Inbox mode: the signed content stored under one id and replayed under another
/// is answered accepted (200) and never stored again; a genuine event later sent
/// under that id is stored.
#[tokio::test]
async fn an_inbox_stores_a_replayed_content_once() {
    use webhook_guard::inbox::InboxStore as _;
    let clock = ManualClock::new(start());
    let store = webhook_guard::MemoryStore::new();
    let g = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .verifier(Scheme::Jamm.verifier())
        .namespace(NS)
        .clock(clock.clone())
        .build()
        .unwrap();
    let a = Scheme::Jamm.delivery(1, "mwh-a", clock.now());
    let accept = |body: Vec<u8>| {
        let g = g.clone();
        async move { g.accept(&[("", ""); 0], &body).await }
    };
    assert!(matches!(
        accept(a.1.clone()).await,
        Outcome::Accepted { new: true, .. }
    ));
    let replay = String::from_utf8(a.1.clone())
        .unwrap()
        .replace("mwh-a", "mwh-b");
    let outcome = accept(replay.into_bytes()).await;
    assert!(
        matches!(outcome, Outcome::Accepted { new: false, .. }),
        "{outcome:?}"
    );
    assert!(store
        .get_event(Key::new(NS, "mwh-b"))
        .await
        .unwrap()
        .is_none());
    let b = Scheme::Jamm.delivery(2, "mwh-b", clock.now());
    assert!(matches!(
        accept(b.1).await,
        Outcome::Accepted { new: true, .. }
    ));
    assert!(store
        .get_event(Key::new(NS, "mwh-b"))
        .await
        .unwrap()
        .is_some());
}
