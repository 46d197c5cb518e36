//! Persist, then acknowledge: the inbox.
//!
//! In inbox mode the guard does not run your handler inside the provider's request.
//! [`WebhookGuard::accept`](crate::WebhookGuard::accept) verifies the delivery,
//! deduplicates it and stores the event durably in one atomic step, then answers
//! 2xx — fast, whatever processing costs (Stripe gives up after 5 s, Jamm after
//! 2 minutes). A [`Worker`] then processes stored events on your own infrastructure
//! with your own retry policy: the provider's hourly retries are never your job queue.

pub mod listing;
#[cfg(feature = "tokio")]
mod worker;

use std::fmt;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::meta::EventMeta;
use crate::store::{Fence, FencingToken, Fingerprint, Holder, Key, StoreError};

pub use listing::InboxListing;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use worker::{InboxHandler, RetryPolicy, Worker, WorkerHandle};

/// Where an inbox event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, derive_more::Display)]
#[display("{}", self.as_str())]
#[non_exhaustive]
pub enum InboxState {
    /// Stored, waiting for a worker (first run, or a retry at `next_attempt_at`).
    Pending,
    /// A worker holds its lease.
    Running,
    /// Processed. Terminal.
    Done,
    /// Failed its last attempt, or failed permanently. Terminal; reconcile.
    Dead,
    /// Older than an event of its object already seen (whether or not that one was
    /// applied yet). Terminal.
    Skipped,
}

impl InboxState {
    /// The name stores write.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Done => "done",
            Self::Dead => "dead",
            Self::Skipped => "skipped",
        }
    }

    /// Parses [`InboxState::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "done" => Self::Done,
            "dead" => Self::Dead,
            "skipped" => Self::Skipped,
            _ => return None,
        })
    }

    /// Whether no worker will run the event again.
    pub fn is_settled(self) -> bool {
        matches!(self, Self::Done | Self::Dead | Self::Skipped)
    }
}

/// A stored event. Its `Debug` shows the payload's length only.
#[derive(Clone, PartialEq, Eq, derive_more::Debug)]
#[non_exhaustive]
pub struct InboxEvent {
    /// The namespace.
    pub namespace: String,
    /// The event id.
    pub id: String,
    /// The fingerprint of the payload ([`Fingerprint::UNKNOWN`] when the guard that
    /// accepted it detects no conflicts).
    pub fingerprint: Fingerprint,
    /// Type, creation time and target object.
    pub meta: EventMeta,
    /// The raw body, as received and verified.
    #[debug("{:?}", crate::BodyLen(payload.len()))]
    pub payload: Vec<u8>,
    /// Where it stands.
    pub state: InboxState,
    /// How many times a worker leased it, less the leases whose attempt was given
    /// back ([`Settle::attempt_counts`]).
    pub attempts: u32,
    /// The token of the latest lease.
    pub token: FencingToken,
    /// Until when the latest lease holds (meaningful while `Running`).
    pub lease_until: DateTime<Utc>,
    /// When a `Pending` event is due.
    pub next_attempt_at: DateTime<Utc>,
    /// The latest failure.
    pub last_error: Option<String>,
    /// When it was accepted.
    pub received_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// When a settled event may be purged (unsettled events are never purged).
    pub expires_at: DateTime<Utc>,
}

impl InboxEvent {
    /// The event's key.
    pub fn key(&self) -> Key<'_> {
        Key::new(&self.namespace, &self.id)
    }

    /// The event's key with the token of its latest lease: what settles or renews
    /// that lease.
    pub fn holder(&self) -> Holder<'_> {
        Holder::new(self.key(), self.token)
    }

    /// The event's type: its [`meta.event_type`](EventMeta::event_type), whole
    /// (what [`WebhookGuard::accept`](crate::WebhookGuard::accept) stored:
    /// `issues.opened` for GitHub, the name alone with no
    /// [action](crate::meta::EventType::action)).
    pub fn event_type(&self) -> Option<crate::meta::EventType<'_>> {
        let text = self.meta.event_type.as_deref()?;
        Some(crate::meta::EventType::new(text, None))
    }

    /// A freshly accepted event, for store implementations.
    pub fn accepted(new: &NewEvent<'_>) -> Self {
        Self {
            namespace: new.key.namespace.to_owned(),
            id: new.key.id.to_owned(),
            fingerprint: new.fingerprint,
            meta: new.meta.clone(),
            payload: new.payload.to_vec(),
            state: InboxState::Pending,
            attempts: 0,
            token: FencingToken(0),
            lease_until: new.now,
            next_attempt_at: new.now,
            last_error: None,
            received_at: new.now,
            updated_at: new.now,
            expires_at: new.expires_at,
        }
    }
}

/// An event to store: see [`InboxStore::enqueue`]. Its `Debug` shows the payload's
/// length only.
#[derive(Clone, Copy, derive_more::Debug)]
pub struct NewEvent<'a> {
    /// The event's key.
    pub key: Key<'a>,
    /// The payload's fingerprint.
    pub fingerprint: Fingerprint,
    /// Its metadata.
    pub meta: &'a EventMeta,
    /// The raw body.
    #[debug("{:?}", crate::BodyLen(payload.len()))]
    pub payload: &'a [u8],
    /// The current time.
    pub now: DateTime<Utc>,
    /// The dedup horizon: the id is remembered at least until then.
    pub expires_at: DateTime<Utc>,
}

/// The answer to [`InboxStore::enqueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Stored: a worker will process it.
    Inserted,
    /// The id is already stored (or processed within retention).
    Existing {
        /// The stored payload's fingerprint (a different one is a conflict).
        fingerprint: Fingerprint,
        /// Where the stored event stands.
        state: InboxState,
    },
}

/// A request to lease due events: see [`InboxStore::lease`].
#[derive(Debug, Clone, Copy)]
pub struct LeaseRequest<'a> {
    /// The namespace whose events to lease.
    pub namespace: &'a str,
    /// The current time: events due at or before it are leased.
    pub now: DateTime<Utc>,
    /// Until when the leases hold.
    pub lease_until: DateTime<Utc>,
    /// How many events to lease at the most.
    pub limit: usize,
}

/// A request to extend a leased event's lease: see [`InboxStore::renew_event`].
#[derive(Debug, Clone, Copy)]
pub struct RenewLease<'a> {
    /// The lease to extend ([`InboxEvent::holder`]).
    pub holder: Holder<'a>,
    /// Until when the lease now holds.
    pub lease_until: DateTime<Utc>,
}

/// How a worker settles a leased event: see [`InboxStore::settle_event`].
#[derive(Debug, Clone, Copy)]
pub struct Settle<'a> {
    /// The lease to settle: the event's key and the token it was leased with
    /// ([`InboxEvent::holder`]).
    pub holder: Holder<'a>,
    /// `Done`, `Dead`, `Skipped`, or `Pending` for a retry.
    pub state: InboxState,
    /// For a retry: when it is due.
    pub next_attempt_at: DateTime<Utc>,
    /// The failure, if any.
    pub error: Option<&'a str>,
    /// The current time.
    pub now: DateTime<Utc>,
    /// When a settled event may be purged.
    pub expires_at: DateTime<Utc>,
    /// Whether the lease's attempt counts. `false` gives it back (`attempts - 1`,
    /// never below 0): the worker's own ordering store failed before the handler
    /// ran, so the event is retried without coming nearer to its dead letter. The
    /// worker gives an attempt back only with a `Pending` settle; a settle made
    /// again (see the contract) changes nothing, as for any state but `Running`.
    pub attempt_counts: bool,
}

/// Whether `event` already holds `settle`: the same settle made again under its
/// token (times compared to the millisecond, as the durable stores keep them).
pub(crate) fn settled_already(event: &InboxEvent, settle: &Settle<'_>) -> bool {
    settle.state != InboxState::Running
        && event.token == settle.holder.token
        && event.state == settle.state
        && event.updated_at.timestamp_millis() == settle.now.timestamp_millis()
}

/// A durable queue of accepted events, deduplicated by key.
///
/// # Contract
/// Every method is atomic per key across all processes sharing the store; times come
/// from the caller.
/// - **enqueue**: if no event is stored under the key, or the stored one is settled
///   and `expires_at <= now`, store a fresh [`InboxEvent::accepted`] and answer
///   [`Enqueued::Inserted`]; otherwise change nothing and answer `Existing`.
/// - **lease**: atomically take up to the [`LeaseRequest`]'s `limit` events of its
///   `namespace` that are due — `Pending` with `next_attempt_at <= now`, or
///   `Running` with `lease_until <= now` (a dead worker's event) — oldest due first;
///   set each `Running`, a fresh random token (one lease may give all its events the
///   same one: fencing is per event), `attempts + 1`, `lease_until`,
///   `updated_at = now`, and return them. Two concurrent leases never return the
///   same event.
/// - **settle_event**: if the event under the [`Settle`]'s `holder` key is
///   `Running` with its `token`, set state, `next_attempt_at`, `last_error` (when given),
///   `updated_at` and `expires_at`, take one from `attempts` (unless 0) when the
///   attempt does not count, and answer [`Fence::Applied`]. If it already carries
///   `token`, the settle's state (other than `Running`) and `updated_at = now` (to
///   the millisecond) — the same settle made again, as a transport may resend it
///   after a lost reply — change nothing and answer `Applied`. Otherwise
///   [`Fence::LeaseLost`].
/// - **renew_event**: the same fence; sets `lease_until`.
/// - **get_event**: the event or `None`.
/// - **purge_settled**: removes up to `limit` settled events with `expires_at <= now`.
#[async_trait]
#[auto_impl::auto_impl(Arc, Box)]
pub trait InboxStore: fmt::Debug + Send + Sync + 'static {
    /// Stores an accepted event unless its id is known.
    async fn enqueue(&self, event: &NewEvent<'_>) -> Result<Enqueued, StoreError>;

    /// Leases due events as `request` says.
    async fn lease(&self, request: &LeaseRequest<'_>) -> Result<Vec<InboxEvent>, StoreError>;

    /// Settles the event leased by `settle`'s holder.
    async fn settle_event(&self, settle: &Settle<'_>) -> Result<Fence, StoreError>;

    /// Extends the lease of `renew`'s holder until its `lease_until`.
    async fn renew_event(&self, renew: &RenewLease<'_>) -> Result<Fence, StoreError>;

    /// The event under `key`.
    async fn get_event(&self, key: Key<'_>) -> Result<Option<InboxEvent>, StoreError>;

    /// Removes up to `limit` settled, expired events.
    async fn purge_settled(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError>;

    /// The inbox's listing and dead-letter actions for operators, if the store
    /// has them (every built-in store does); `None` by default, so a custom inbox
    /// need not list.
    fn inbox_listing(&self) -> Option<&dyn InboxListing> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload reaches `Debug` as its length only, never as text or as numbers.
    #[test]
    fn debug_shows_a_payload_by_its_length() {
        let payload = b"PAYLOAD-MARKER";
        let as_numbers = format!("{:?}", &payload[..]);
        let as_numbers = &as_numbers[1..as_numbers.len() - 1];
        let now = DateTime::UNIX_EPOCH;
        let meta = EventMeta::default();
        let new = NewEvent {
            key: Key::new("ns", "evt_1"),
            fingerprint: Fingerprint::UNKNOWN,
            meta: &meta,
            payload,
            now,
            expires_at: now,
        };
        let stored = InboxEvent {
            namespace: "ns".into(),
            id: "evt_1".into(),
            fingerprint: Fingerprint::UNKNOWN,
            meta: meta.clone(),
            payload: payload.to_vec(),
            state: InboxState::Pending,
            attempts: 0,
            token: FencingToken::from_i64(1),
            lease_until: now,
            next_attempt_at: now,
            last_error: None,
            received_at: now,
            updated_at: now,
            expires_at: now,
        };
        for text in [format!("{new:?}"), format!("{stored:?}")] {
            assert!(text.contains("evt_1"), "{text}");
            assert!(text.contains("payload: <14 bytes>"), "{text}");
            assert!(!text.contains("PAYLOAD-MARKER"), "{text}");
            assert!(!text.contains(as_numbers), "{text}");
        }
    }
}
