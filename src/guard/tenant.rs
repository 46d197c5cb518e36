//! A guard serving many tenants (`crate::tenant`): finding a delivery's tenant,
//! its cached guard (the guard's verifier keyed with the tenant's secrets, its
//! records in the tenant's namespace), and the follow-up markers of tenants.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, TimeDelta, Utc};

use super::{Inner, WebhookGuard};
use crate::outcome::{Outcome, Rejection};
use crate::store::{Record, StoreError};
use crate::tenant::{check_tenant, namespace_part, Tenants};
use crate::verify::Verifier;
use crate::Headers;

/// What a tenant's guard serves: its tenant (unknown for one the sweeper made
/// from a hashed namespace) and the namespace of the guard that made it.
#[derive(Debug)]
pub(super) struct Served {
    pub(super) tenant: Option<String>,
    pub(super) namespace: String,
}

/// A guard's tenants: their configuration and the cache of their guards.
pub(super) struct TenantCache {
    config: Tenants,
    ttl: TimeDelta,
    unknown_ttl: TimeDelta,
    cache: quick_cache::sync::Cache<String, Entry>,
}

impl std::fmt::Debug for TenantCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenants")
            .field("resolver", &self.config.resolver)
            .field("source", &self.config.source)
            .field("cached", &self.cache.len())
            .finish_non_exhaustive()
    }
}

/// What the cache keeps of a tenant: its guard, or `None` for a tenant the
/// resolver did not know, until `expires`.
#[derive(Clone)]
struct Entry {
    expires: DateTime<Utc>,
    guard: Option<WebhookGuard>,
}

impl TenantCache {
    /// The cache of `config`, whose durations the builder checked.
    pub(super) fn new(config: Tenants, ttl: TimeDelta, unknown_ttl: TimeDelta) -> Self {
        Self {
            cache: quick_cache::sync::Cache::new(config.capacity),
            config,
            ttl,
            unknown_ttl,
        }
    }
}

/// Many tenants: see [`crate::tenant`].
impl WebhookGuard {
    /// The guard of the delivery's tenant, to run the delivery through
    /// (`handle`, `handle_owned`, `handle_spawned`, `begin`), or the outcome to
    /// answer instead (already logged and reported to the outcome hook):
    ///
    /// - [`Rejection::TenantMismatch`] (403) when the delivery names a tenant (see
    ///   [`Tenants::source`]) other than `route_tenant`;
    /// - [`Rejection::MissingTenant`] (400) when neither names one;
    /// - [`Rejection::UnknownTenant`] (404) for a tenant id that is not valid
    ///   ([`check_tenant`]) or that the resolver does not know, and from a guard
    ///   built without tenants;
    /// - [`Rejection::BodyTooLarge`] (413) for a body over the guard's limit;
    /// - [`Outcome::StoreUnavailable`] (503 + `Retry-After`) when the resolver
    ///   failed, did not answer within the guard's store timeout, or gave secrets
    ///   the verifier cannot use.
    ///
    /// None of these touches the store. `route_tenant` is the tenant the host's
    /// route names (`/webhooks/stripe/{tenant}`), if any. The headers and body are
    /// read before the returned future first runs; it awaits the resolver only
    /// when the tenant is not cached. Each tenant's guard is cached (see
    /// [`Tenants::cache`]) and shares everything with this one — store, hooks,
    /// limits, the handlers [`drain`](WebhookGuard::drain) waits for — but its
    /// verifier and its namespace ([`WebhookGuard::tenant_namespace`]).
    pub fn tenant<'s>(
        &'s self,
        route_tenant: Option<&str>,
        headers: &dyn Headers,
        body: &[u8],
    ) -> impl Future<Output = Result<WebhookGuard, Outcome>> + Send + use<'s> {
        let started = Instant::now();
        let now = self.inner.clock.now();
        let named = self.tenant_named(route_tenant, headers, body);
        async move {
            let (cache, tenant) = match named {
                Ok(named) => named,
                Err(rejection) => return Err(self.rejected_early(rejection, started)),
            };
            let budget = self.inner.store_timeout;
            let found = crate::runtime::within(budget, self.cached(cache, &tenant, now))
                .await
                .unwrap_or_else(|| Err(self.store_timed_out()));
            let outcome = match found {
                Ok(Some(guard)) => return Ok(guard),
                Ok(None) => Outcome::Rejected(Rejection::UnknownTenant),
                Err(error) => Outcome::StoreUnavailable { id: None, error },
            };
            self.report(&outcome, None, started, None);
            Err(outcome)
        }
    }

    /// The namespace the records of `tenant` live in, under this guard: what the
    /// operator tool's `--namespace` takes to inspect them. `None` for an invalid
    /// tenant id ([`check_tenant`]).
    pub fn tenant_namespace(&self, tenant: &str) -> Option<String> {
        check_tenant(tenant).then(|| format!("{}/{}", self.inner.namespace, namespace_part(tenant)))
    }

    /// Drops what the cache holds of `tenant`, so that its next delivery asks the
    /// resolver again: after rotating its secrets, or creating a tenant that was
    /// answered unknown. Deliveries already running keep the secrets they had.
    pub fn forget_tenant(&self, tenant: &str) {
        if let Some(tenants) = &self.inner.tenants {
            tenants.cache.remove(tenant);
        }
    }

    /// The tenant `route_tenant` and the delivery name (checked), with the cache.
    fn tenant_named(
        &self,
        route_tenant: Option<&str>,
        headers: &dyn Headers,
        body: &[u8],
    ) -> Result<(&TenantCache, String), Rejection> {
        let inner = &self.inner;
        let Some(tenants) = inner.tenants.as_deref() else {
            return Err(Rejection::UnknownTenant);
        };
        if body.len() > inner.max_body {
            return Err(Rejection::BodyTooLarge {
                size: body.len(),
                limit: inner.max_body,
            });
        }
        let tenant = match (route_tenant, tenants.config.source.read(headers, body)) {
            (Some(route), Some(named)) if route != named => {
                return Err(Rejection::TenantMismatch);
            }
            (Some(route), _) => route.to_owned(),
            (None, Some(named)) => named,
            (None, None) => return Err(Rejection::MissingTenant),
        };
        if !check_tenant(&tenant) {
            return Err(Rejection::UnknownTenant);
        }
        Ok((tenants, tenant))
    }

    /// The guard of `tenant` (a valid id), `None` for an unknown one: from the
    /// cache while fresh at `now`, else from the resolver (one call at a time per
    /// tenant: the others wait for its answer).
    async fn cached(
        &self,
        tenants: &TenantCache,
        tenant: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<WebhookGuard>, StoreError> {
        let cache = &tenants.cache;
        // Twice at most: a stale entry is dropped, then loaded again.
        for _ in 0..2 {
            match cache.get_value_or_guard_async(tenant).await {
                Ok(entry) if entry.expires > now => return Ok(entry.guard),
                Ok(_) => {
                    cache.remove_if(tenant, |entry| entry.expires <= now);
                }
                Err(placeholder) => {
                    // A failure drops the placeholder unfilled: nothing is cached,
                    // and the next waiter asks the resolver itself.
                    let entry = self.resolve(tenants, tenant, now).await?;
                    let _ = placeholder.insert(entry.clone());
                    return Ok(entry.guard);
                }
            }
        }
        // Entries made stale as fast as they are loaded (a clock far ahead of
        // `now`): ask the resolver, and leave the cache alone.
        Ok(self.resolve(tenants, tenant, now).await?.guard)
    }

    /// Asks the resolver for `tenant` and makes its cache entry.
    async fn resolve(
        &self,
        tenants: &TenantCache,
        tenant: &str,
        now: DateTime<Utc>,
    ) -> Result<Entry, StoreError> {
        let secrets = tenants
            .config
            .resolver
            .secrets(tenant)
            .await
            .map_err(StoreError::unavailable)?;
        let Some(secrets) = secrets else {
            return Ok(Entry {
                expires: crate::later(now, tenants.unknown_ttl),
                guard: None,
            });
        };
        let verifier = match self.inner.verifier.with_secrets(&secrets) {
            Some(Ok(verifier)) => Arc::from(verifier),
            Some(Err(e)) => {
                return Err(StoreError::backend(format!(
                    "the secrets of tenant {tenant:?} are unusable: {e}"
                )))
            }
            None => unreachable!("the builder refuses tenants with a verifier it cannot key"),
        };
        Ok(Entry {
            expires: crate::later(now, tenants.ttl),
            guard: Some(self.view(&namespace_part(tenant), Some(tenant), verifier)),
        })
    }

    /// The guard of the tenant written `part` in its namespace (`tenant`, when
    /// known), verifying with `verifier`: this guard's own configuration and shared
    /// state otherwise.
    fn view(&self, part: &str, tenant: Option<&str>, verifier: Arc<dyn Verifier>) -> WebhookGuard {
        let inner = &self.inner;
        WebhookGuard {
            inner: Arc::new(Inner {
                store: inner.store.clone(),
                verifier,
                clock: inner.clock.clone(),
                hooks: inner.hooks.clone(),
                safe_hooks: inner.safe_hooks.clone(),
                namespace: format!("{}/{part}", inner.namespace),
                // A tenant's contents are its own: one body under two tenants is two.
                content_namespace: (inner.content_namespace.as_ref()).map(|_| {
                    super::content::content_namespace(&format!("{}/{part}", inner.namespace))
                }),
                followup_namespace: format!("{}/{part}", inner.followup_namespace),
                event_id: inner.event_id.clone(),
                lease: inner.lease,
                lease_delta: inner.lease_delta,
                store_timeout: inner.store_timeout,
                answer_deadline: inner.answer_deadline,
                detached: inner.detached.clone(),
                retention: inner.retention,
                retention_delta: inner.retention_delta,
                escalate_after: inner.escalate_after,
                max_body: inner.max_body,
                in_progress: inner.in_progress,
                fingerprint: inner.fingerprint,
                status: inner.status,
                inbox: None,
                ordering: inner.ordering.clone(),
                reconciler: inner.reconciler.clone(),
                meta: inner.meta.clone(),
                event_type: inner.event_type.clone(),
                type_headers: inner.type_headers,
                lost_searches: inner.lost_searches.clone(),
                dropped_searches: inner.dropped_searches.clone(),
                tenants: None,
                served: Some(Box::new(Served {
                    tenant: tenant.map(str::to_owned),
                    namespace: inner.namespace.clone(),
                })),
            }),
        }
    }

    /// The part after this guard's follow-up namespace and `/` of a tenant's
    /// follow-up marker, when this guard serves tenants and `record` is one.
    pub(super) fn tenant_marker_part<'r>(&self, record: &'r Record) -> Option<&'r str> {
        self.inner.tenants.as_ref()?;
        let part = record
            .namespace
            .strip_prefix(self.inner.followup_namespace.as_str())?
            .strip_prefix('/')?;
        (!part.is_empty()).then_some(part)
    }

    /// The guard whose follow-up marker `record` is, if it is one: this guard, or
    /// one of its tenants' (for the sweeper, which pays their debts too; no
    /// delivery is verified through it).
    pub(super) fn marker_owner(&self, record: &Record) -> Option<WebhookGuard> {
        if record.namespace == self.inner.followup_namespace {
            return Some(self.clone());
        }
        let part = self.tenant_marker_part(record)?;
        let tenant = (!part.starts_with('#')).then_some(part);
        Some(self.view(part, tenant, self.inner.verifier.clone()))
    }
}
