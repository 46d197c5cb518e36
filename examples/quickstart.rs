//! A simulated provider sends signed deliveries to a guarded handler on the in-memory
//! store, and each delivery's outcome and HTTP answer is printed as a table.
//!
//! Run it with `cargo run --example quickstart`: no server, no configuration.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use webhook_guard::hooks::Escalation;
use webhook_guard::store::Record;
use webhook_guard::store::{
    Claim, ClaimRequest, Deleted, Fence, Finish, Holder, Key, Renew, StoreError,
};
use webhook_guard::verify::Stripe;
use webhook_guard::{
    EventId, HandlerError, Hooks, MemoryStore, Outcome, ProcessedStore, WebhookGuard,
};

const SECRET: &str = "whsec_quickstartdemo0123456789abcdefgh";
const FORGED: &str = "whsec_guessedbyanattacker0123456789abc";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(Switchable::new(MemoryStore::new()));
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(signer())
        .event_id(EventId::FromVerifier) // the Stripe preset reads the body's `id`
        .namespace("quickstart")
        .hooks(Alerts)
        .build()?;
    let provider = Provider::new(guard.clone());

    println!(
        "{:<3} {:<34} {:<10} {:<18} {:>4}  detail",
        "#", "delivery", "event", "outcome", "http"
    );
    println!("{}", "-".repeat(96));

    provider
        .send("first delivery", "evt_1001", Handler::Ok)
        .await;
    provider
        .send("provider retries (duplicate)", "evt_1001", Handler::Ok)
        .await;

    // Two deliveries of one event at the same moment: exactly one runs the handler.
    let (a, b) = tokio::join!(
        provider.send("concurrent delivery A", "evt_1002", Handler::Slow),
        provider.send("concurrent delivery B", "evt_1002", Handler::Slow),
    );
    assert_eq!(a + b, 1, "exactly one concurrent delivery runs the handler");

    provider
        .send("transient failure", "evt_1003", Handler::Fail)
        .await;
    provider
        .send("retry succeeds", "evt_1003", Handler::Ok)
        .await;

    for attempt in 1..=5 {
        provider
            .send(
                &format!("failing handler, attempt {attempt}"),
                "evt_1004",
                Handler::Fail,
            )
            .await;
    }
    provider
        .send("after escalation", "evt_1004", Handler::Ok)
        .await;

    provider
        .send("permanent failure", "evt_1005", Handler::Permanent)
        .await;
    provider.send_forged("forged signature", "evt_1006").await;
    provider
        .send_replayed("replay of evt_1001, 10 min old", "evt_1001")
        .await;

    store.unplug();
    provider.send("store outage", "evt_1007", Handler::Ok).await;
    store.plug();
    provider
        .send("provider retries after outage", "evt_1007", Handler::Ok)
        .await;

    println!("{}", "-".repeat(96));
    println!("handler runs: {}", provider.runs.load(Ordering::SeqCst));
    Ok(())
}

fn signer() -> Stripe {
    Stripe::new([SECRET]).expect("non-empty secret")
}

#[derive(Clone, Copy)]
enum Handler {
    Ok,
    Slow,
    Fail,
    Permanent,
}

struct Provider {
    guard: WebhookGuard,
    signer: Stripe,
    row: AtomicU32,
    runs: AtomicU32,
}

impl Provider {
    fn new(guard: WebhookGuard) -> Self {
        Self {
            guard,
            signer: signer(),
            row: AtomicU32::new(1),
            runs: AtomicU32::new(0),
        }
    }

    fn body(id: &str) -> Vec<u8> {
        format!(r#"{{"id":"{id}","object":"event","type":"charge.succeeded","data":{{"object":{{"id":"ch_1","amount":980}}}}}}"#).into_bytes()
    }

    /// Delivers a correctly signed event; returns how many times the handler ran.
    async fn send(&self, label: &str, id: &str, handler: Handler) -> u32 {
        let body = Self::body(id);
        let signature = self.signer.sign(&body, chrono::Utc::now().timestamp());
        self.deliver(label, &body, &signature, handler).await
    }

    async fn send_forged(&self, label: &str, id: &str) -> u32 {
        let body = Self::body(id);
        let forged = Stripe::new([FORGED]).expect("non-empty secret");
        let signature = forged.sign(&body, chrono::Utc::now().timestamp());
        self.deliver(label, &body, &signature, Handler::Ok).await
    }

    /// A captured delivery sent again after Stripe's 5-minute tolerance.
    async fn send_replayed(&self, label: &str, id: &str) -> u32 {
        let body = Self::body(id);
        let old = chrono::Utc::now().timestamp() - 600;
        let signature = self.signer.sign(&body, old);
        self.deliver(label, &body, &signature, Handler::Ok).await
    }

    async fn deliver(&self, label: &str, body: &[u8], signature: &str, handler: Handler) -> u32 {
        let ran = AtomicU32::new(0);
        let headers = [("Stripe-Signature", signature)];
        let outcome = self
            .guard
            .handle(&headers, body, |event| {
                ran.fetch_add(1, Ordering::SeqCst);
                self.runs.fetch_add(1, Ordering::SeqCst);
                let _ = event.id();
                async move {
                    match handler {
                        Handler::Ok => Ok(()),
                        Handler::Slow => {
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            Ok(())
                        }
                        Handler::Fail => Err(HandlerError::retryable("payment API timed out")),
                        Handler::Permanent => Err(HandlerError::permanent("unknown customer")),
                    }
                }
            })
            .await;
        let answer = self.guard.answer(&outcome);
        let retry = answer
            .retry_after
            .map(|s| format!(" (Retry-After: {s})"))
            .unwrap_or_default();
        println!(
            "{:<3} {:<34} {:<10} {:<18} {:>4}  {}{retry}",
            self.row.fetch_add(1, Ordering::SeqCst),
            label,
            outcome.id().unwrap_or("-"),
            outcome.kind().as_str(),
            answer.status.as_u16(),
            detail(&outcome),
        );
        ran.load(Ordering::SeqCst)
    }
}

fn detail(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Processed { .. } => "handler ran".into(),
        Outcome::Duplicate { state, .. } => format!("already {state}; handler skipped"),
        Outcome::InProgress { .. } => "another delivery holds the lease".into(),
        Outcome::RetryableFailure { failures, .. } => {
            format!("failure #{failures}, provider retries")
        }
        Outcome::Escalated { failures, .. } => format!("{failures} failures: alert + reconcile"),
        other => other.to_string(),
    }
}

/// The escalation and alert hooks: here they print; a real host pages and reconciles.
#[derive(Debug)]
struct Alerts;

impl Hooks for Alerts {
    fn on_escalation(&self, e: &Escalation<'_>) {
        println!(
            "    ALERT escalated {} after {} failures: reconcile through the provider's API",
            e.key, e.failures
        );
    }
    fn on_permanent_failure(&self, key: Key<'_>, error: &str) {
        println!("    ALERT permanent failure on {key}: {error}");
    }
}

/// A store that can be unplugged, to show an outage. Not for production use.
#[derive(Debug)]
struct Switchable<S> {
    inner: S,
    down: AtomicBool,
}

impl<S: ProcessedStore> Switchable<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            down: AtomicBool::new(false),
        }
    }
    fn unplug(&self) {
        self.down.store(true, Ordering::SeqCst);
    }
    fn plug(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
    fn up(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            let refused =
                std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
            return Err(StoreError::unavailable(refused));
        }
        Ok(())
    }
}

#[async_trait]
impl<S: ProcessedStore> ProcessedStore for Switchable<S> {
    async fn claim(&self, r: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.up()?;
        self.inner.claim(r).await
    }
    async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError> {
        self.up()?;
        self.inner.finish(holder, finish).await
    }
    async fn renew(&self, holder: Holder<'_>, renew: &Renew) -> Result<Fence, StoreError> {
        self.up()?;
        self.inner.renew(holder, renew).await
    }
    async fn get(&self, k: Key<'_>) -> Result<Option<Record>, StoreError> {
        self.up()?;
        self.inner.get(k).await
    }
    async fn delete(&self, k: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        self.up()?;
        self.inner.delete(k, now).await
    }
    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        self.up()?;
        self.inner.purge_expired(now, limit).await
    }
    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.up()?;
        self.inner.stuck(now, limit).await
    }
}
