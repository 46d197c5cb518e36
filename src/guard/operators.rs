//! The guard's configuration and its records, for operators: the accessors, and
//! `inspect`, `forget` and `stuck` on the guard's namespace.

use std::sync::Arc;
use std::time::Duration;

use super::{store, WebhookGuard};
use crate::clock::Clock;
use crate::hooks::Hooks;
use crate::store::{Deleted, DynProcessedStore, Key, Record, StoreError};

/// The guard's configuration and its records, for operators.
impl WebhookGuard {
    /// The store.
    pub fn store(&self) -> &Arc<DynProcessedStore> {
        &self.inner.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The hooks, as given to the builder (the guard calls them panic-safe).
    pub fn hooks(&self) -> &Arc<dyn Hooks> {
        &self.inner.hooks
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The tenant this guard serves, for a tenant's guard
    /// ([`WebhookGuard::tenant`]).
    pub fn tenant_id(&self) -> Option<&str> {
        self.inner.served.as_ref()?.tenant.as_deref()
    }

    /// The inbox, if the guard has one (the operator console reads it).
    #[cfg(feature = "console")]
    pub(crate) fn inbox_store(&self) -> Option<&Arc<dyn crate::inbox::InboxStore>> {
        self.inner.inbox.as_ref()
    }

    /// The lease duration.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The retention.
    pub fn retention(&self) -> Duration {
        self.inner.retention
    }

    /// The largest body accepted, in bytes: integrations stop reading a body past it.
    pub fn max_body(&self) -> usize {
        self.inner.max_body
    }

    /// The record kept for `id`, for operators.
    ///
    /// # Errors
    /// The store's error.
    pub async fn inspect(&self, id: &str) -> Result<Option<Record>, StoreError> {
        store(&self.inner)
            .get(Key::new(&self.inner.namespace, id))
            .await
    }

    /// Forgets `id` so its next delivery runs the handler again (the "resend from the
    /// provider's dashboard" workflow), with the content key its record was claimed
    /// with ([`content_keys`](super::WebhookGuardBuilder::content_keys)). Refused
    /// while a live lease holds the id.
    ///
    /// # Errors
    /// The store's error.
    pub async fn forget(&self, id: &str) -> Result<Deleted, StoreError> {
        self.forget_id(id).await
    }

    /// Claims whose lease ran out without completion (crashed or hung holders).
    ///
    /// # Errors
    /// The store's error.
    pub async fn stuck(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        store(&self.inner)
            .stuck(self.inner.clock.now(), limit)
            .await
    }
}
