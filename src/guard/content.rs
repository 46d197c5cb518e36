//! Content keys: a second dedup key, derived from the signed bytes, for schemes
//! whose event id the signature does not cover (GitHub, Shopify, Linear, Jamm:
//! [`Verifier::content_key`](crate::verify::Verifier::content_key)).
//!
//! A delivery with a content key claims it first, under the guard's content
//! namespace (a control character, which no guard's namespace holds, and a hash of
//! the namespace), with an unknown fingerprint and the guard's lease and retention;
//! then its id, as any delivery does. The content's record follows the id's:
//!
//! - its claim answered with a finished record (completed, escalated, failed
//!   permanently): the signed content was delivered before, under this id or any
//!   other: `Duplicate`, and the id is never claimed (a replay cannot take an id
//!   the provider will use later);
//! - answered held by a live lease: `InProgress`, the id never claimed;
//! - granted (fresh, or taken over from a failed or abandoned one): the id is
//!   claimed. The id's answer ends the content's claim with the id's state
//!   (`Duplicate` of a finished id: that state; in progress, a conflict, a store
//!   error: released as failed), and a claim that runs the handler ends it as its
//!   record ends (`record.rs`, `state.rs`), its lease renewed with the id's.
//!
//! A crash, a dropped delivery or a store error between the claims leaves the
//! content's claim to run out its lease, as an id's: its redelivery after the
//! lease takes it over (a genuine event is never suppressed for longer than a
//! lease). A content whose handler failed is released, so that the provider's
//! retry runs it, or a copy under another id does if it comes first (the
//! content runs once either way for a provider that resends the same content;
//! Linear re-signs each retry, so a copy replayed inside its 60 s tolerance after a
//! failure and Linear's retry may both run).

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};

use super::{store, WebhookGuard};
use crate::outcome::Outcome;
use crate::store::{
    Claim, ClaimRequest, Deleted, Fence, FencingToken, Fingerprint, Finish, Holder, Key,
    RecordState, Renew, StoreError,
};

/// The namespace of the content keys of the guard in `namespace`.
pub(super) fn content_namespace(namespace: &str) -> String {
    let digest = Sha256::digest(namespace.as_bytes());
    format!("\u{1}content:{}", hex::encode(&digest[..8]))
}

/// A content key this delivery holds: its name in the content namespace and the
/// claim's token.
#[derive(Debug, Clone)]
pub(super) struct ContentClaim {
    pub(super) hex: String,
    pub(super) token: FencingToken,
}

impl WebhookGuard {
    /// Claims the content key `key` for the delivery of `id` at `now`: `Ok(Some)`
    /// when granted, `Ok(None)` when the guard keeps no content keys, `Err` with
    /// the outcome to answer (the content delivered or in progress, the store
    /// unreachable) when the id must not be claimed.
    pub(super) async fn claim_content(
        &self,
        id: &str,
        key: Option<[u8; 32]>,
        now: DateTime<Utc>,
        lease_cap: Option<DateTime<Utc>>,
    ) -> Result<Option<ContentClaim>, Outcome> {
        let inner = &self.inner;
        let (Some(namespace), Some(key)) = (inner.content_namespace.as_deref(), key) else {
            return Ok(None);
        };
        let hex = hex::encode(key);
        let request = ClaimRequest {
            key: Key::new(namespace, &hex),
            fingerprint: Fingerprint::UNKNOWN,
            token: FencingToken::random(),
            now,
            lease_until: super::capped(crate::later(now, inner.lease_delta), lease_cap, now),
            expires_at: crate::later(now, inner.retention_delta),
        };
        let claimed = crate::runtime::within(inner.store_timeout, store(inner).claim(&request))
            .await
            .unwrap_or_else(|| Err(self.store_timed_out()));
        let record = match claimed {
            Ok(Claim::Acquired(_)) => None,
            Ok(Claim::Existing(record)) if request.made(&record) => None,
            Ok(Claim::Existing(record)) => Some(record),
            Err(error) => {
                return Err(Outcome::StoreUnavailable {
                    id: Some(id.to_owned()),
                    error,
                })
            }
        };
        let token = request.token;
        let Some(record) = record else {
            return Ok(Some(ContentClaim { hex, token }));
        };
        let id = id.to_owned();
        match record.state {
            // A failed record is taken over by any claim (its fingerprint is
            // unknown): held here only by a live lease, as an in-progress one.
            RecordState::InProgress | RecordState::Failed => {
                let left = (record.lease_until - now).to_std().unwrap_or_default();
                Err(Outcome::InProgress {
                    id,
                    retry_after: left.max(std::time::Duration::from_secs(1)),
                })
            }
            state => {
                tracing::info!(%id, %state, "signed content already delivered (under this id or another): duplicate");
                Err(Outcome::Duplicate { id, state })
            }
        }
    }

    /// Ends the content claim `content` in `state` (a finished id's state, or
    /// `Failed` to release it). Fenced by its token; a store error is logged and
    /// the claim left to run out its lease.
    pub(super) async fn end_content(&self, content: &ContentClaim, state: RecordState) {
        let inner = &self.inner;
        let Some(namespace) = inner.content_namespace.as_deref() else {
            return;
        };
        let now = inner.clock.now();
        let finish = Finish {
            state,
            failures: 0,
            history: &[],
            now,
            expires_at: crate::later(now, inner.retention_delta),
        };
        let holder = Holder::new(Key::new(namespace, &content.hex), content.token);
        match store(inner).finish(holder, &finish).await {
            Ok(Fence::Applied) => {}
            Ok(Fence::LeaseLost) => {
                tracing::debug!(content = %content.hex, "a content key was taken over before its end");
            }
            Err(e) => {
                tracing::warn!(content = %content.hex, error = %e, "could not end a content key's claim; its lease will run out");
            }
        }
    }

    /// Extends the lease of the content claim `content` with its id's.
    pub(super) async fn renew_content(
        &self,
        content: &ContentClaim,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) {
        let Some(namespace) = self.inner.content_namespace.as_deref() else {
            return;
        };
        let holder = Holder::new(Key::new(namespace, &content.hex), content.token);
        let renew = Renew {
            lease_until,
            expires_at,
        };
        if let Err(e) = store(&self.inner).renew(holder, &renew).await {
            tracing::debug!(content = %content.hex, error = %e, "could not renew a content key's lease");
        }
    }

    /// The end of a content claim when its id's claim was not granted: the state
    /// of the id's finished record for a duplicate, else released.
    pub(super) async fn content_after(&self, content: Option<&ContentClaim>, outcome: &Outcome) {
        let Some(content) = content else { return };
        let state = match outcome {
            Outcome::Duplicate { state, .. } => *state,
            _ => RecordState::Failed,
        };
        self.end_content(content, state).await;
    }

    /// [`WebhookGuard::forget`]: removes `id`'s record and, with content keys, the
    /// content key kept as its fingerprint (Linear's records keep none: its
    /// redelivery is a new body anyway), so that a redelivery of the same content
    /// runs again.
    pub(super) async fn forget_id(&self, id: &str) -> Result<Deleted, StoreError> {
        let inner = &self.inner;
        let (now, key) = (inner.clock.now(), Key::new(&inner.namespace, id));
        let Some(namespace) = inner.content_namespace.as_deref() else {
            return store(inner).delete(key, now).await;
        };
        let record = store(inner).get(key).await?;
        let deleted = store(inner).delete(key, now).await?;
        let Some(record) = record.filter(|_| deleted == Deleted::Removed) else {
            return Ok(deleted);
        };
        let fingerprint = record.fingerprint;
        if fingerprint == Fingerprint::UNKNOWN {
            return Ok(deleted);
        }
        let hex = fingerprint.to_hex();
        if let Err(e) = store(inner).delete(Key::new(namespace, &hex), now).await {
            tracing::warn!(content = %hex, error = %e, "could not forget a content key");
        }
        Ok(deleted)
    }
}
