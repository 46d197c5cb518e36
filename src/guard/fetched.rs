//! An event fetched from the provider's API rather than delivered to the endpoint:
//! the same claim, run and record as a delivery, without the signature check.

use std::future::Future;

use bytes::Bytes;
use tracing::Instrument as _;

use super::event::{check_id, Checked, Early};
use super::{run_owned, OwnedEvent, WebhookGuard};
use crate::outcome::{HandlerError, Outcome, Rejection};
use crate::store::Fingerprint;

impl WebhookGuard {
    /// Runs an event fetched from the provider's own API (a list of events it
    /// failed to deliver, say) through the delivery flow: the same namespace,
    /// claim, handler run, record, hooks and escalation as a delivery of that id,
    /// so an event that arrives both ways runs `handler` once.
    ///
    /// There is no signature to check: the API call that fetched the event
    /// authenticated it (over TLS, with your API key). **Never pass a body that
    /// came to your endpoint**: use [`WebhookGuard::handle_owned`] for those. The
    /// body limit and the id's checks apply ([`Outcome::Rejected`] otherwise).
    ///
    /// The id is claimed without a body fingerprint: the API renders an event with
    /// other bytes than its delivery (whitespace, key order, counters such as
    /// Stripe's `pending_webhooks`), so a comparison would call one event a
    /// conflict with itself. A delivery of the same id is answered `Duplicate`
    /// whichever came first. The `catch_up` module (feature `catch-up`) drives
    /// this for each event of a provider's list of undelivered events.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use webhook_guard::{verify::Stripe, MemoryStore, Outcome, WebhookGuard};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let guard = WebhookGuard::builder()
    ///     .store(MemoryStore::new())
    ///     .verifier(Stripe::new(["whsec_test0000000000000000000000000000"]).unwrap())
    ///     .namespace("stripe")
    ///     .build()
    ///     .unwrap();
    /// // An event as `GET /v1/events` lists it.
    /// let body = Bytes::from_static(br#"{"id":"evt_1","object":"event","type":"charge.succeeded"}"#);
    /// let outcome = guard.handle_fetched("evt_1", body.clone(), |_event| async { Ok(()) }).await;
    /// assert!(matches!(outcome, Outcome::Processed { .. }));
    /// let again = guard.handle_fetched("evt_1", body, |_event| async { unreachable!() }).await;
    /// assert!(matches!(again, Outcome::Duplicate { .. }));
    /// # }
    /// ```
    pub fn handle_fetched<'s, F, Fut>(
        &'s self,
        id: &str,
        body: Bytes,
        handler: F,
    ) -> impl Future<Output = Outcome> + use<'s, F, Fut>
    where
        F: FnOnce(OwnedEvent) -> Fut,
        Fut: Future<Output = Result<(), HandlerError>>,
    {
        let (span, started, now) = self.start_delivery();
        let limit = self.inner.max_body;
        let checked = (if body.len() > limit {
            Err(Rejection::BodyTooLarge {
                size: body.len(),
                limit,
            })
        } else {
            check_id(id).map(|()| Checked::new(id.to_owned(), None, None))
        })
        .map_err(Early::from);
        async move {
            let unknown = Fingerprint::UNKNOWN;
            let claim = self.claim_as(checked, &body, unknown, started, now, None);
            run_owned(claim.await, &body, handler).await
        }
        .instrument(span)
    }
}
