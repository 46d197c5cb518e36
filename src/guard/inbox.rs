//! Inbox mode: [`WebhookGuard::accept`] stores a verified delivery for later, and
//! [`WebhookGuard::worker`] makes the worker that processes it.

use std::future::Future;

use chrono::{DateTime, Utc};
use tracing::Instrument as _;

use super::{record_on_span, VerifiedDelivery, WebhookGuard};
use crate::inbox::{Enqueued, NewEvent};
use crate::outcome::{Outcome, Rejection};
use crate::store::{Fingerprint, Key, RecordState, StoreError};
use crate::Headers;

impl WebhookGuard {
    /// Persist, then acknowledge: verifies the delivery, deduplicates it and stores
    /// the event (payload, id, type, `created_at`, object) in the inbox in one atomic
    /// step, and returns at once — [`Outcome::Accepted`] (answer 200) whether this
    /// delivery stored it or an earlier one did. A [`Worker`](crate::inbox::Worker)
    /// processes it afterwards. Without an inbox configured the outcome is
    /// [`Outcome::StoreUnavailable`].
    pub fn accept<'s, 'a>(
        &'s self,
        headers: &dyn Headers,
        body: &'a [u8],
    ) -> impl Future<Output = Outcome> + Send + use<'s, 'a> {
        let (span, started, now) = self.start_delivery();
        let verified = span.in_scope(|| self.verify_at(headers, body, now));
        let inner = &self.inner;
        let content_key = (verified.is_ok() && inner.content_namespace.is_some())
            .then(|| inner.verifier.content_key(headers, body))
            .flatten();
        async move {
            let outcome = self.enqueue(verified, content_key, body, now).await;
            self.report(&outcome, None, started, None);
            outcome
        }
        .instrument(span)
    }

    async fn enqueue(
        &self,
        verified: Result<VerifiedDelivery, Rejection>,
        content_key: Option<[u8; 32]>,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Outcome {
        let delivery = match verified {
            Ok(d) => d,
            Err(r) => return Outcome::Rejected(r),
        };
        if let Some(handshake) = delivery.handshake {
            return Outcome::Handshake(handshake);
        }
        record_on_span("webhook.event_id", delivery.id.as_str());
        let inner = &self.inner;
        let Some(inbox) = &inner.inbox else {
            tracing::error!("accept called on a guard without an inbox");
            return Outcome::StoreUnavailable {
                id: Some(delivery.id),
                error: StoreError::backend("no inbox configured on this guard"),
            };
        };
        // As for a claim: the content key first (`content.rs`): a signed content
        // already stored under another id is a duplicate, never stored again; with
        // conflict detection off, the body is not hashed and the event keeps
        // `UNKNOWN`, which no guard compares.
        let content = match self
            .claim_content(&delivery.id, content_key, now, None)
            .await
        {
            Ok(content) => content,
            Err(Outcome::Duplicate { id, .. }) => return Outcome::Accepted { id, new: false },
            Err(outcome) => return outcome,
        };
        let fingerprint = match (inner.fingerprint, content_key) {
            (true, Some(key)) => Fingerprint(key),
            (true, None) => Fingerprint::of(body),
            (false, _) => Fingerprint::UNKNOWN,
        };
        let key = Key::new(&inner.namespace, &delivery.id);
        let event = NewEvent {
            key,
            fingerprint,
            meta: &delivery.meta,
            payload: body,
            now,
            expires_at: crate::later(now, inner.retention_delta),
        };
        let outcome = match inbox.enqueue(&event).await {
            Ok(Enqueued::Inserted) => Outcome::Accepted {
                id: delivery.id,
                new: true,
            },
            Ok(Enqueued::Existing { fingerprint: f, .. })
                if inner.fingerprint && !f.matches(&fingerprint) =>
            {
                inner.safe_hooks.on_conflict(key);
                Outcome::Conflict { id: delivery.id }
            }
            Ok(Enqueued::Existing { .. }) => Outcome::Accepted {
                id: delivery.id,
                new: false,
            },
            Err(error) => Outcome::StoreUnavailable {
                id: Some(delivery.id),
                error,
            },
        };
        if let Some(content) = &content {
            // Stored (by this delivery or an earlier one of its id): the inbox owns
            // it now. A conflict or a store error releases the content.
            let stored = matches!(outcome, Outcome::Accepted { .. });
            let state = if stored {
                RecordState::Completed
            } else {
                RecordState::Failed
            };
            self.end_content(content, state).await;
        }
        outcome
    }

    /// A [`Worker`](crate::inbox::Worker) over this guard's inbox, with its
    /// namespace, ordering store, reconciler, hooks, clock and retention.
    ///
    /// # Errors
    /// [`ConfigError::NoInbox`](crate::ConfigError::NoInbox) when the guard has no inbox.
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn worker(
        &self,
        handler: impl crate::inbox::InboxHandler,
    ) -> Result<crate::inbox::Worker, super::ConfigError> {
        let inner = &self.inner;
        let inbox = inner.inbox.clone().ok_or(super::ConfigError::NoInbox)?;
        // The shortest retention `build` allows: settled events are the dedup
        // horizon of `accept`, so a worker keeps them at least as long.
        let lease = inner.lease_delta.to_std().unwrap_or_default();
        let tolerance = inner.verifier.tolerance().unwrap_or_default();
        let floor = lease.max(tolerance.saturating_mul(2));
        let mut worker = crate::inbox::Worker::new(inbox, inner.namespace.clone(), handler)
            .hooks(inner.hooks.clone())
            .clock(inner.clock.clone())
            .retention_floor(floor)
            .retention(inner.retention);
        if let Some(ordering) = &inner.ordering {
            worker = worker.ordering(ordering.clone());
        }
        if let Some(reconciler) = &inner.reconciler {
            worker = worker.reconciler(reconciler.clone());
        }
        Ok(worker)
    }
}
