//! Persist, then acknowledge, against a simulated Jamm-style provider.
//!
//! The provider charges 40 customers. Its webhooks (`mwh-…` ids; charges `trx-…`,
//! customers `cus-…`) arrive out of order and duplicated; some are lost for good; for
//! the first three hours the endpoint is down (503), so the provider retries on its
//! published schedule (20 attempts, 1 h doubling to a 3 h cap), compressed in time.
//! Every delivery is verified and stored in an inbox at once; a worker applies the
//! events with its own retries (the handler fails transiently now and then), the
//! ordering guard keeps a late event from overwriting newer state, and a reconciler
//! asks the provider's API (`GetCharge`) about charges no webhook settled.
//!
//! The dedup records, the inbox and the ordering ledger live in one SQLite file (a
//! temporary one, removed at the end): `cargo run --example jamm_inbox --features
//! sqlite`.
//!
//! The last line is `charges: N, correct: N, applied twice: 0, lost: 0`; the program
//! exits non-zero if any charge ends wrong.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use webhook_guard::clock::{Clock, ManualClock};
use webhook_guard::inbox::{InboxEvent, RetryPolicy};
use webhook_guard::meta::EventMeta;
use webhook_guard::ordering::{ObjectKey, ObjectMark, ObjectStatus, Observation, OrderingStore};
use webhook_guard::reconcile::{ReconcileRequest, Reconciler};
use webhook_guard::store::{BoxError, SqliteStore};
use webhook_guard::verify::Jamm;
use webhook_guard::{HandlerError, Outcome, WebhookGuard};

const CHARGES: usize = 40;
const SECRET: &str = "jamm-client-secret-0123456789";

/// What the provider knows: the truth its API answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Success,
    Failure,
    Refunded,
}

impl Status {
    fn of(event_type: &str) -> Option<Self> {
        match event_type {
            "EVENT_TYPE_CHARGE_SUCCESS" => Some(Self::Success),
            "EVENT_TYPE_CHARGE_FAIL" => Some(Self::Failure),
            "EVENT_TYPE_REFUND_SUCCEEDED" => Some(Self::Refunded),
            _ => None,
        }
    }
}

/// A tiny deterministic generator, so every run tells the same story.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

#[derive(Debug, Clone)]
struct Webhook {
    body: Vec<u8>,
    attempts: u32,
    due: DateTime<Utc>,
}

/// The host's own state: charge status per `trx-…`, applied by webhooks or the API.
#[derive(Debug, Default)]
struct Local {
    charges: Mutex<HashMap<String, Status>>,
    applied: Mutex<HashMap<String, u32>>,
    reconciled: AtomicU64,
}

/// Counts events the ordering guard held back.
#[derive(Debug, Default)]
struct StaleCount(AtomicU64);

impl webhook_guard::Hooks for StaleCount {
    fn on_stale(&self, _: webhook_guard::store::Key<'_>, _: &EventMeta) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The provider's API, as the reconciler sees it: `GetCharge` answers the status and
/// when it last changed.
#[derive(Debug)]
struct Api {
    truth: BTreeMap<String, (Status, DateTime<Utc>)>,
    local: Arc<Local>,
    ordering: Arc<dyn OrderingStore>,
    clock: ManualClock,
}

#[async_trait]
impl Reconciler for Api {
    async fn reconcile(&self, request: &ReconcileRequest) -> Result<(), BoxError> {
        let trx = request
            .meta
            .object
            .as_deref()
            .ok_or("no object to reconcile")?;
        let (status, changed_at) = *self.truth.get(trx).ok_or("GetCharge: not found")?;
        // Record the API's answer in the ordering ledger too, so that a webhook older
        // than it, arriving later, cannot overwrite it.
        let key = ObjectKey {
            namespace: "jamm",
            object: trx,
            family: "charge",
        };
        let now = self.clock.now();
        self.ordering
            .observe(&Observation {
                key,
                created_at: changed_at,
                now,
            })
            .await?;
        self.ordering
            .mark_object(&ObjectMark {
                key,
                created_at: changed_at,
                status: ObjectStatus::Applied,
                now,
            })
            .await?;
        self.local
            .charges
            .lock()
            .unwrap()
            .insert(trx.to_owned(), status);
        self.local.reconciled.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let start = Utc.with_ymd_and_hms(2026, 4, 1, 9, 0, 0).unwrap();
    let clock = ManualClock::new(start);
    let mut rng = Rng(0x5eed_cafe);

    // The provider's side: charges, their events, and the API's truth.
    // Jamm signs the `content` object and puts the signature in the body itself.
    let signer = Jamm::new([SECRET])?;
    let mut truth = BTreeMap::new();
    let mut outbox = Vec::new();
    for n in 0..CHARGES {
        let trx = format!("trx-{:04}", n + 1);
        let cus = format!("cus-{:04}", n % 7 + 1);
        let mut at = start + TimeDelta::minutes(n as i64);
        let mut events = vec![if rng.chance(80) {
            "EVENT_TYPE_CHARGE_SUCCESS"
        } else {
            "EVENT_TYPE_CHARGE_FAIL"
        }];
        if events[0] == "EVENT_TYPE_CHARGE_SUCCESS" && rng.chance(30) {
            events.push("EVENT_TYPE_REFUND_SUCCEEDED");
        }
        for ty in events {
            truth.insert(trx.clone(), (Status::of(ty).expect("known type"), at));
            let id = format!("mwh-{:016x}", rng.next());
            // The signed content differs per event, as Jamm's does (the charge's
            // state): the guard keys Jamm deliveries on it, since the envelope's id
            // and type are not signed.
            let state = ty.trim_start_matches("EVENT_TYPE_");
            let content =
                format!(r#"{{"charge":{{"id":"{trx}","customer":"{cus}","state":"{state}"}}}}"#);
            let body = signer.envelope(&id, ty, &content, &at.to_rfc3339());
            at += TimeDelta::seconds(30);
            let lost = rng.chance(8);
            if !lost {
                outbox.push(Webhook {
                    body: body.into_bytes(),
                    attempts: 0,
                    due: at,
                });
                if rng.chance(25) {
                    let dup = outbox.last().cloned().expect("just pushed");
                    outbox.push(Webhook {
                        due: dup.due + TimeDelta::seconds(5),
                        ..dup
                    });
                }
            }
        }
    }
    // Deliveries race each other: shuffle the order within the first hour.
    for w in &mut outbox {
        w.due += TimeDelta::seconds((rng.next() % 3600) as i64);
    }

    // The receiver: a guard with an inbox, an ordering guard keyed by charge, and a worker.
    let path = std::env::temp_dir().join(format!("jamm-inbox-{}.db", std::process::id()));
    let store = SqliteStore::open(&path).await?;
    let local = Arc::new(Local::default());
    let stale = Arc::new(StaleCount::default());
    let api = Arc::new(Api {
        truth: truth.clone(),
        local: local.clone(),
        ordering: Arc::new(store.clone()),
        clock: clock.clone(),
    });
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .inbox(store.clone())
        .ordering(store.clone())
        .reconciler(api.clone())
        // The Jamm preset reads the id (`mwh-…`), and the type, `created_at` and target
        // charge (`trx-…`, family `charge` for charge and refund events) from the body.
        .verifier(signer.clone())
        .namespace("jamm")
        .retention(Duration::from_secs(3 * 86_400))
        .clock(clock.clone())
        .hooks(stale.clone())
        .build()?;
    let worker = {
        let local = local.clone();
        let flaky = Arc::new(Mutex::new(Rng(0xf1a7)));
        guard
            .worker(move |event: InboxEvent| {
                let local = local.clone();
                let fail = flaky.lock().unwrap().chance(20);
                async move {
                    if fail {
                        return Err(HandlerError::retryable("database deadlock, try again"));
                    }
                    let trx = event
                        .meta
                        .object
                        .clone()
                        .ok_or(HandlerError::permanent("no charge id"))?;
                    let ty = event.meta.event_type.as_deref().unwrap_or_default();
                    let status =
                        Status::of(ty).ok_or(HandlerError::permanent("unknown event type"))?;
                    local.charges.lock().unwrap().insert(trx, status);
                    *local
                        .applied
                        .lock()
                        .unwrap()
                        .entry(event.id.clone())
                        .or_default() += 1;
                    Ok(())
                }
            })?
            .retry_policy(RetryPolicy::exponential(
                10,
                Duration::from_secs(60),
                Duration::from_secs(600),
            ))
            .concurrency(8)
    };

    // Play the timeline in 10-minute steps over three days.
    let down_until = start + TimeDelta::hours(3);
    let (mut delivered, mut answered_503, mut duplicates) = (0u32, 0u32, 0u32);
    let end = start + TimeDelta::days(3);
    while clock.now() < end {
        let now = clock.now();
        for w in outbox
            .iter_mut()
            .filter(|w| w.attempts < 20 && w.due <= now)
        {
            w.attempts += 1;
            delivered += 1;
            let headers = [("Content-Type", "application/json")];
            let status = if now < down_until {
                503 // the endpoint is down: Jamm will retry
            } else {
                let outcome = guard.accept(&headers, &w.body).await;
                if matches!(outcome, Outcome::Accepted { new: false, .. }) {
                    duplicates += 1;
                }
                guard.answer(&outcome).status.as_u16()
            };
            if (200..300).contains(&status) {
                w.attempts = u32::MAX; // acknowledged: Jamm stops
            } else {
                answered_503 += 1;
                let backoff = TimeDelta::hours(1) * 2i32.pow(w.attempts.saturating_sub(1).min(2));
                w.due = now + backoff.min(TimeDelta::hours(3));
            }
        }
        while worker.run_once().await? > 0 {}
        // The host knows the charges it created; any that no webhook settled after six
        // hours is looked up through the API (GetCharge) instead of waiting.
        if now > start + TimeDelta::hours(6) {
            let unsettled: Vec<String> = {
                let charges = local.charges.lock().unwrap();
                truth
                    .keys()
                    .filter(|trx| !charges.contains_key(*trx))
                    .cloned()
                    .collect()
            };
            for trx in unsettled {
                let meta = EventMeta::new(None, None, Some(trx));
                let request = ReconcileRequest::new(
                    "jamm",
                    None,
                    meta,
                    webhook_guard::reconcile::ReconcileReason::StaleFailure,
                );
                api.reconcile(&request).await?;
            }
        }
        clock.advance(TimeDelta::minutes(10));
    }

    store.pool().close().await;
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }

    // Report.
    let charges = local.charges.lock().unwrap();
    let applied = local.applied.lock().unwrap();
    println!("{:<10} {:<9} {:<9} ok", "charge", "provider", "local");
    let mut correct = 0;
    for (trx, (want, _)) in &truth {
        let got = charges.get(trx);
        let ok = got == Some(want);
        correct += usize::from(ok);
        println!(
            "{trx:<10} {:<9} {:<9} {}",
            format!("{want:?}"),
            got.map_or("-".into(), |s| format!("{s:?}")),
            if ok { "yes" } else { "NO" }
        );
    }
    let twice = applied.values().filter(|n| **n > 1).count();
    let lost = truth
        .keys()
        .filter(|trx| !charges.contains_key(*trx))
        .count();
    println!(
        "deliveries: {delivered} ({answered_503} answered 503 while down, {duplicates} duplicates acknowledged), late events held back: {}, reconciled via API: {}",
        stale.0.load(Ordering::SeqCst),
        local.reconciled.load(Ordering::SeqCst)
    );
    println!(
        "charges: {}, correct: {correct}, applied twice: {twice}, lost: {lost}",
        truth.len()
    );
    if correct != truth.len() || twice > 0 || lost > 0 {
        std::process::exit(1);
    }
    Ok(())
}
