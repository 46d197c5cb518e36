//! Acknowledging and resolving an escalation, recorded in the store.
//!
//! An [`Escalated`](RecordState::Escalated) record stays escalated: that is what
//! keeps the provider's next delivery from running the handler again. What an
//! operator did about it is kept beside it, as a *marker record* under the same
//! id in a namespace of its own, `"\u{1}escalation:"` and 16 hex digits of a hash
//! of the record's namespace (as the guard's follow-up markers are). A marker is
//! written with the [`ProcessedStore`] contract's own calls (a claim, then a
//! finish), so it works on every store, a custom one included, with no schema
//! change: `Failed` means acknowledged, `Completed` resolved, and its history
//! keeps each step's time and note (at most [`HISTORY_LIMIT`]). It expires with
//! the escalated record.
//!
//! A marker counts for the escalation it was made for: one made before the
//! record's `updated_at` (the id was forgotten and escalated again since) is
//! stale, and the escalation is open again.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use chrono::Utc;
//! use webhook_guard::store::escalation::{self, EscalationStatus};
//! use webhook_guard::store::{Key, MemoryStore};
//!
//! let store = MemoryStore::new();
//! let key = Key::new("stripe", "evt_1");
//! // Nothing escalated under that key: refused.
//! let refused = escalation::mark(&store, key, EscalationStatus::Resolved, "", Utc::now()).await;
//! assert!(refused.is_err());
//! # }
//! ```

use chrono::{DateTime, TimeDelta, Utc};
use sha2::{Digest, Sha256};

use super::{
    Claim, ClaimRequest, Deleted, FailureNote, Fence, FencingToken, Fingerprint, Finish, Holder,
    Key, ProcessedStore, Record, RecordState, StoreError, HISTORY_LIMIT,
};

/// Where an escalation stands for the operators.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    derive_more::Display,
)]
#[display("{}", self.as_str())]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EscalationStatus {
    /// Nobody has acknowledged it.
    Open,
    /// Someone is on it.
    Acknowledged,
    /// Handled.
    Resolved,
}

impl EscalationStatus {
    /// `"open"`, `"acknowledged"` or `"resolved"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Acknowledged => "acknowledged",
            Self::Resolved => "resolved",
        }
    }
}

/// An escalation's status and the notes of its steps, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escalation {
    /// Where it stands.
    pub status: EscalationStatus,
    /// Each acknowledgement and resolution: when, and the operator's note.
    pub notes: Vec<FailureNote>,
}

/// Why [`mark`] refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EscalationError {
    /// No record under the key.
    #[error("no record under this key")]
    NotFound,
    /// The record is not escalated.
    #[error("the record is {0}, not escalated")]
    NotEscalated(RecordState),
    /// It is resolved already; it cannot go back to acknowledged.
    #[error("the escalation is resolved already")]
    AlreadyResolved,
    /// Another operator is marking it at this very moment: try again.
    #[error("another change of this escalation is under way")]
    Busy,
    /// `Open` is not a step an operator takes.
    #[error("an escalation is marked acknowledged or resolved, not open")]
    NotAStep,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The namespace of the escalation markers of `namespace`.
pub fn marker_namespace(namespace: &str) -> String {
    let digest = Sha256::digest(namespace.as_bytes());
    format!("\u{1}escalation:{}", hex::encode(&digest[..8]))
}

/// The escalation of `record`: [`EscalationStatus::Open`] with no notes unless a
/// current marker says otherwise (one `get`). A record that is not escalated is
/// answered `Open` too.
///
/// # Errors
/// The store's error.
pub async fn status(store: &dyn ProcessedStore, record: &Record) -> Result<Escalation, StoreError> {
    let marker_ns = marker_namespace(&record.namespace);
    let marker = store.get(Key::new(&marker_ns, &record.id)).await?;
    Ok(from_marker(marker.as_ref(), record))
}

fn from_marker(marker: Option<&Record>, record: &Record) -> Escalation {
    let current = marker.filter(|m| m.created_at >= record.updated_at);
    let status = match current.map(|m| m.state) {
        Some(RecordState::Failed) => EscalationStatus::Acknowledged,
        Some(RecordState::Completed) => EscalationStatus::Resolved,
        _ => EscalationStatus::Open,
    };
    Escalation {
        status,
        notes: current.map(|m| m.history.clone()).unwrap_or_default(),
    }
}

/// Marks the escalation under `key` acknowledged or resolved at `now`, with the
/// operator's `note` (who, and what was done; kept as given, at most 1,000
/// bytes). Acknowledging an acknowledged escalation adds a note; resolving a
/// resolved one changes nothing. Answers the escalation as it now stands.
///
/// # Errors
/// [`EscalationError`]: no such record, not escalated, resolved already (for an
/// acknowledgement), a concurrent change, or the store's error.
pub async fn mark(
    store: &dyn ProcessedStore,
    key: Key<'_>,
    status: EscalationStatus,
    note: &str,
    now: DateTime<Utc>,
) -> Result<Escalation, EscalationError> {
    let state = match status {
        EscalationStatus::Acknowledged => RecordState::Failed,
        EscalationStatus::Resolved => RecordState::Completed,
        EscalationStatus::Open => return Err(EscalationError::NotAStep),
    };
    let record = store.get(key).await?.ok_or(EscalationError::NotFound)?;
    if record.state != RecordState::Escalated {
        return Err(EscalationError::NotEscalated(record.state));
    }
    let marker_ns = marker_namespace(key.namespace);
    let marker_key = Key::new(&marker_ns, key.id);
    let old = store.get(marker_key).await?;
    let current = from_marker(old.as_ref(), &record);
    match (current.status, status) {
        (EscalationStatus::Resolved, EscalationStatus::Resolved) => return Ok(current),
        (EscalationStatus::Resolved, _) => return Err(EscalationError::AlreadyResolved),
        _ => {}
    }
    if old.is_some() && current.status == EscalationStatus::Open {
        // A marker of an earlier escalation of the id (or one a crash left
        // unfinished): out of the way first.
        if store.delete(marker_key, now).await? == Deleted::LeaseHeld {
            return Err(EscalationError::Busy);
        }
    }
    let request = ClaimRequest {
        key: marker_key,
        fingerprint: Fingerprint::UNKNOWN,
        token: FencingToken::random(),
        now,
        lease_until: now + TimeDelta::seconds(30),
        expires_at: record.expires_at.max(now + TimeDelta::seconds(31)),
    };
    let claimed = match store.claim(&request).await? {
        Claim::Acquired(marker) => marker,
        Claim::Existing(_) => return Err(EscalationError::Busy),
    };
    let mut history = if current.status == EscalationStatus::Open {
        Vec::new()
    } else {
        claimed.history
    };
    history.push(FailureNote {
        at: now,
        error: format!("{status}: {}", clip(note, 1000)),
    });
    let cut = history.len().saturating_sub(HISTORY_LIMIT);
    history.drain(..cut);
    let finish = Finish {
        state,
        failures: 0,
        history: &history,
        now,
        expires_at: request.expires_at,
    };
    match store
        .finish(Holder::new(marker_key, request.token), &finish)
        .await?
    {
        Fence::Applied => Ok(Escalation {
            status,
            notes: history,
        }),
        Fence::LeaseLost => Err(EscalationError::Busy),
    }
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn clip(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
