//! The catch-up cursor, kept as one record of the guard's store (see the module
//! docs of [`catch_up`](super)): claimed for a pass, its cursor in the last
//! history note, finished `Failed` (claimable again) with the next one.

use chrono::{DateTime, TimeDelta, Utc};
use sha2::{Digest as _, Sha256};

use crate::store::{
    Claim, ClaimRequest, FailureNote, Fence, FencingToken, Fingerprint, Finish, Holder, Key,
    RecordState, Renew, StoreError,
};
use crate::WebhookGuard;

/// The longest cursor kept, in bytes.
pub const MAX_CURSOR_LEN: usize = 1024;

/// How long a cursor record is kept after its last pass: past the longest
/// retention a guard is given in practice; an expired one only makes the next
/// pass start at the retention's edge.
const KEPT: TimeDelta = TimeDelta::days(400);

/// The namespace of the catch-up cursors of the guard in `namespace`: a control
/// character (which no guard's namespace holds) and a hash of `namespace`, so it
/// fits every store's namespace column whatever the namespace's length. The
/// cursor of a source is the record under the source's name there.
///
/// ```
/// let ns = webhook_guard::catch_up::cursor_namespace("stripe");
/// assert!(ns.starts_with("\u{1}catch-up:"));
/// assert_eq!(ns.len(), 26);
/// ```
pub fn cursor_namespace(namespace: &str) -> String {
    let digest = Sha256::digest(namespace.as_bytes());
    format!("\u{1}catch-up:{}", hex::encode(&digest[..8]))
}

/// Whether `cursor` may be kept: printable ASCII, at most [`MAX_CURSOR_LEN`] bytes.
pub(super) fn valid(cursor: &str) -> bool {
    cursor.len() <= MAX_CURSOR_LEN && cursor.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// A cursor record this pass holds: its claim's token and the cursor it read.
#[derive(Debug)]
pub(super) struct Held {
    guard: WebhookGuard,
    namespace: String,
    name: String,
    token: FencingToken,
    /// The stored cursor, `None` at the first pass.
    pub(super) cursor: Option<String>,
    /// When the lease was last taken or renewed.
    renewed_at: DateTime<Utc>,
}

/// Claims the cursor record of `name` for the guard at `now`: `None` when another
/// pass holds it.
///
/// # Errors
/// The store's error, or [`StoreError::Corrupt`] for a record this module did not
/// write (a terminal state, a cursor that is not printable ASCII).
pub(super) async fn claim(
    guard: &WebhookGuard,
    name: &str,
    now: DateTime<Utc>,
) -> Result<Option<Held>, StoreError> {
    let namespace = cursor_namespace(guard.namespace());
    let request = ClaimRequest {
        key: Key::new(&namespace, name),
        fingerprint: Fingerprint::UNKNOWN,
        token: FencingToken::random(),
        now,
        lease_until: lease_until(guard, now),
        expires_at: crate::later(now, KEPT),
    };
    let record = match guard.store().claim(&request).await? {
        Claim::Acquired(record) => record,
        Claim::Existing(record) if request.made(&record) => record,
        Claim::Existing(record) if record.state == RecordState::InProgress => return Ok(None),
        Claim::Existing(record) => {
            return Err(StoreError::Corrupt(format!(
                "the catch-up cursor record {} is {}, which catch-up never writes",
                request.key, record.state
            )))
        }
    };
    let cursor = record.history.last().map(|note| note.error.clone());
    if let Some(text) = &cursor {
        if !valid(text) {
            return Err(StoreError::Corrupt(format!(
                "the catch-up cursor record {} holds no cursor",
                request.key
            )));
        }
    }
    Ok(Some(Held {
        guard: guard.clone(),
        name: name.to_owned(),
        token: request.token,
        cursor,
        renewed_at: now,
        namespace,
    }))
}

fn lease_until(guard: &WebhookGuard, now: DateTime<Utc>) -> DateTime<Utc> {
    let lease = TimeDelta::from_std(guard.lease()).unwrap_or(TimeDelta::MAX);
    crate::later(now, lease)
}

impl Held {
    fn holder(&self) -> Holder<'_> {
        Holder::new(Key::new(&self.namespace, &self.name), self.token)
    }

    /// Renews the lease once half of it has passed: `false` when another pass
    /// took the record over.
    ///
    /// # Errors
    /// The store's error.
    pub(super) async fn keep(&mut self, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let half = TimeDelta::from_std(self.guard.lease() / 2).unwrap_or(TimeDelta::MAX);
        if now - self.renewed_at < half {
            return Ok(true);
        }
        let renew = Renew {
            lease_until: lease_until(&self.guard, now),
            expires_at: crate::later(now, KEPT),
        };
        match self.guard.store().renew(self.holder(), &renew).await? {
            Fence::Applied => {
                self.renewed_at = now;
                Ok(true)
            }
            Fence::LeaseLost => Ok(false),
        }
    }

    /// Ends the pass's claim keeping `cursor` (the stored one, or the page's next):
    /// [`Fence::LeaseLost`] when another pass took the record over, which then
    /// keeps its own.
    ///
    /// # Errors
    /// The store's error (the record stays held until its lease runs out, and the
    /// stored cursor is the one read at the claim).
    pub(super) async fn release(
        self,
        cursor: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Fence, StoreError> {
        let history: Vec<FailureNote> = cursor
            .map(|cursor| FailureNote {
                at: now,
                error: cursor.to_owned(),
            })
            .into_iter()
            .collect();
        let finish = Finish {
            state: RecordState::Failed,
            failures: 0,
            history: &history,
            now,
            expires_at: crate::later(now, KEPT),
        };
        self.guard.store().finish(self.holder(), &finish).await
    }
}
