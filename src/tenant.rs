//! Many tenants behind one guard: a signing secret per tenant, resolved per
//! delivery, and a dedup namespace per tenant.
//!
//! A platform that receives webhooks on behalf of its customers (a Stripe Connect
//! platform, a Shopify app, a SaaS whose customers connect their own accounts)
//! keeps one signing secret per customer — its *tenant* — in its own database. A
//! guard built with [`WebhookGuardBuilder::tenants`] serves them all:
//!
//! 1. [`WebhookGuard::tenant`] finds the delivery's tenant: the one its route
//!    names (`/webhooks/stripe/{tenant}`, which the host passes), the one the
//!    delivery names itself ([`TenantSource`]: a header such as Shopify's
//!    `X-Shopify-Shop-Domain`, a body field such as Stripe Connect's `account`),
//!    or both, which must then agree ([`Rejection::TenantMismatch`]);
//! 2. it asks your [`SecretResolver`] for the tenant's secrets (through a
//!    bounded, time-limited cache; one call per tenant at a time) and answers a
//!    guard for that tenant: the guard's verifier keyed with the tenant's secrets
//!    ([`Verifier::with_secrets`]; several secrets verify during a rotation), its
//!    records in a namespace of the tenant's own;
//! 3. the host runs the delivery through that guard as through any other
//!    (`handle`, `handle_owned`, `handle_spawned`, `begin`).
//!
//! So a delivery signed with tenant A's secret and sent to tenant B's route is
//! rejected (401), and the same event id under A and B is two events. An unknown
//! tenant ([`Rejection::UnknownTenant`], 404) and a mismatch (403) are answered
//! before any store call; a resolver that fails or does not answer within the
//! guard's store timeout is answered [`Outcome::StoreUnavailable`] (503 +
//! `Retry-After`), never 401, so the provider retries.
//!
//! ```
//! use std::collections::HashMap;
//! use webhook_guard::tenant::{TenantSource, Tenants};
//! use webhook_guard::verify::{Secret, Stripe};
//! use webhook_guard::{MemoryStore, Outcome, WebhookGuard};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Your database, in real life: a `SecretResolver` of your own.
//! let secrets = HashMap::from([
//!     ("acct_a".to_owned(), vec![Secret::from("whsec_a0000000000000000000000000000000")]),
//!     ("acct_b".to_owned(), vec![Secret::from("whsec_bnew0000000000000000000000000000"), Secret::from("whsec_bold0000000000000000000000000000")]),
//! ]);
//! let guard = WebhookGuard::builder()
//!     .store(MemoryStore::new())
//!     // The scheme and its settings; each tenant's secrets replace this one's.
//!     .verifier(Stripe::new(["whsec_templateneverused000000000000000"])?)
//!     .tenants(Tenants::new(secrets).source(TenantSource::json_field(["account"])))
//!     .namespace("stripe")
//!     .build()?;
//!
//! let body = br#"{"id":"evt_1","account":"acct_b","type":"charge.succeeded"}"#;
//! let signature = Stripe::new(["whsec_bold0000000000000000000000000000"])?.sign(body, chrono::Utc::now().timestamp());
//! let headers = [("Stripe-Signature", signature.as_str())];
//!
//! // In the handler of `/webhooks/stripe/{tenant}`, with the route's tenant:
//! let outcome = match guard.tenant(Some("acct_b"), &headers, body).await {
//!     Ok(tenant) => tenant.handle(&headers, body, |_event| async { Ok(()) }).await,
//!     Err(outcome) => outcome, // unknown tenant, mismatch, resolver down
//! };
//! assert!(matches!(outcome, Outcome::Processed { .. }));
//!
//! // The same delivery on tenant A's route: a mismatch, before any store call.
//! let outcome = guard.tenant(Some("acct_a"), &headers, body).await.unwrap_err();
//! assert_eq!(guard.answer(&outcome).status, 403);
//! # Ok(())
//! # }
//! ```
//!
//! A tenant's records live in the namespace `"{namespace}/{tenant}"` (a tenant id
//! over [`MAX_TENANT_NAMESPACE_PART`] bytes is written `#` and 16 hex digits of
//! its SHA-256), which [`WebhookGuard::tenant_namespace`] gives for the operator
//! tool's `--namespace`; a guard serving tenants takes a namespace of at most
//! [`MAX_TENANT_GUARD_NAMESPACE`] bytes, so that both fit every store's column.
//!
//! [`WebhookGuardBuilder::tenants`]: crate::WebhookGuardBuilder::tenants
//! [`WebhookGuard::tenant`]: crate::WebhookGuard::tenant
//! [`WebhookGuard::tenant_namespace`]: crate::WebhookGuard::tenant_namespace
//! [`Rejection::TenantMismatch`]: crate::outcome::Rejection::TenantMismatch
//! [`Rejection::UnknownTenant`]: crate::outcome::Rejection::UnknownTenant
//! [`Verifier::with_secrets`]: crate::verify::Verifier::with_secrets
//! [`Outcome::StoreUnavailable`]: crate::Outcome::StoreUnavailable

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sha2::{Digest as _, Sha256};

use crate::store::BoxError;
use crate::verify::Secret;
use crate::Headers;

/// The longest tenant id, in bytes.
pub const MAX_TENANT_LEN: usize = 255;

/// The longest tenant id written as it is in its namespace; a longer one is
/// written `#` and 16 hex digits of its SHA-256.
pub const MAX_TENANT_NAMESPACE_PART: usize = 37;

/// The longest namespace of a guard serving tenants: with `/` and a tenant's part
/// it stays within the 64 bytes every store keeps.
pub const MAX_TENANT_GUARD_NAMESPACE: usize = 64 - 1 - MAX_TENANT_NAMESPACE_PART;

/// Where a tenant's signing secrets come from: your database, a secrets manager.
///
/// The guard calls it through its cache ([`Tenants::cache`]), at most once at a
/// time per tenant, and waits for it no longer than the guard's
/// [store timeout](crate::WebhookGuardBuilder::store_timeout).
///
/// # Contract
///
/// - `Ok(Some(secrets))`: the tenant's current secrets, newest first. During a
///   rotation give every secret still in use: a delivery signed with any of them
///   verifies. An empty list, or a secret the scheme cannot use, is answered 503
///   (the operator's data to fix; the provider retries meanwhile).
/// - `Ok(None)`: no such tenant. Its deliveries are rejected
///   ([`Rejection::UnknownTenant`](crate::outcome::Rejection::UnknownTenant), 404),
///   and the answer is cached for [`Tenants::unknown_ttl`].
/// - `Err(_)`: the secrets could not be read (the database is down). Answered 503
///   with `Retry-After`; never cached.
///
/// ```
/// use webhook_guard::tenant::{ResolveError, SecretResolver};
/// use webhook_guard::verify::Secret;
///
/// #[derive(Debug)]
/// struct FromEnv;
///
/// #[webhook_guard::store::async_trait]
/// impl SecretResolver for FromEnv {
///     async fn secrets(&self, tenant: &str) -> Result<Option<Vec<Secret>>, ResolveError> {
///         let var = format!("WEBHOOK_SECRET_{}", tenant.to_uppercase());
///         Ok(std::env::var(var).ok().map(|s| vec![Secret::from(s)]))
///     }
/// }
/// ```
#[async_trait]
#[auto_impl::auto_impl(Arc, Box)]
pub trait SecretResolver: fmt::Debug + Send + Sync + 'static {
    /// The secrets of `tenant` (a valid tenant id: see [`check_tenant`]), or `None`
    /// for a tenant it does not know.
    ///
    /// # Errors
    /// A [`ResolveError`] when the secrets could not be read.
    async fn secrets(&self, tenant: &str) -> Result<Option<Vec<Secret>>, ResolveError>;
}

/// A fixed table of tenants and their secrets: for tests, and for a handful of
/// tenants known at start-up.
#[async_trait]
impl SecretResolver for HashMap<String, Vec<Secret>> {
    async fn secrets(&self, tenant: &str) -> Result<Option<Vec<Secret>>, ResolveError> {
        Ok(self.get(tenant).cloned())
    }
}

/// A [`SecretResolver`] could not read a tenant's secrets.
#[derive(Debug, thiserror::Error)]
#[error("secret resolver failed: {source}")]
pub struct ResolveError {
    #[source]
    source: BoxError,
}

impl ResolveError {
    /// A failure caused by `source` (the database's error).
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

/// Where a delivery names its own tenant, besides its route.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TenantSource {
    /// Nowhere: the route names the tenant (the default).
    #[default]
    Route,
    /// A request header, such as Shopify's `X-Shopify-Shop-Domain`.
    Header(Cow<'static, str>),
    /// A string field of the JSON body, as a path of object keys, such as Stripe
    /// Connect's `["account"]`.
    JsonField(Vec<String>),
}

impl TenantSource {
    /// The tenant in header `name`.
    pub fn header(name: impl Into<Cow<'static, str>>) -> Self {
        Self::Header(name.into())
    }

    /// The tenant at `path` in the JSON body, such as `["account"]`.
    pub fn json_field<S: Into<String>>(path: impl IntoIterator<Item = S>) -> Self {
        Self::JsonField(path.into_iter().map(Into::into).collect())
    }

    /// The tenant the delivery names, if it names one here. Read before the
    /// signature is checked: the tenant's secrets decide whether it verifies.
    pub(crate) fn read(&self, headers: &dyn Headers, body: &[u8]) -> Option<String> {
        match self {
            Self::Route => None,
            Self::Header(name) => headers.get_str(name).map(str::to_owned),
            Self::JsonField(path) => {
                let path: Vec<&str> = path.iter().map(String::as_str).collect();
                crate::json::field(body, &path).ok()
            }
        }
    }
}

/// The default number of tenants the cache holds.
pub const DEFAULT_CACHE_CAPACITY: usize = 10_000;
/// The default time a tenant's secrets are cached: a rotated secret is taken up
/// within it (or at once, with [`WebhookGuard::forget_tenant`](crate::WebhookGuard::forget_tenant)).
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(5 * 60);
/// The default time an unknown tenant is remembered as unknown.
pub const DEFAULT_UNKNOWN_TTL: Duration = Duration::from_secs(30);

/// How a guard serves many tenants: its [`SecretResolver`], where deliveries name
/// their tenant, and its cache. Given to
/// [`WebhookGuardBuilder::tenants`](crate::WebhookGuardBuilder::tenants).
#[must_use]
#[derive(Debug, Clone)]
pub struct Tenants {
    pub(crate) resolver: Arc<dyn SecretResolver>,
    pub(crate) source: TenantSource,
    pub(crate) capacity: usize,
    pub(crate) ttl: Duration,
    pub(crate) unknown_ttl: Duration,
}

impl Tenants {
    /// Tenants whose secrets `resolver` gives, named by their route only, cached
    /// ([`DEFAULT_CACHE_CAPACITY`] tenants, each for [`DEFAULT_CACHE_TTL`]; unknown
    /// ones for [`DEFAULT_UNKNOWN_TTL`]).
    pub fn new(resolver: impl SecretResolver) -> Self {
        Self {
            resolver: Arc::new(resolver),
            source: TenantSource::Route,
            capacity: DEFAULT_CACHE_CAPACITY,
            ttl: DEFAULT_CACHE_TTL,
            unknown_ttl: DEFAULT_UNKNOWN_TTL,
        }
    }

    /// Where a delivery names its tenant itself. When its route names one too, the
    /// two must be equal (byte for byte), or the delivery is rejected
    /// ([`Rejection::TenantMismatch`](crate::outcome::Rejection::TenantMismatch));
    /// a delivery that names none takes its route's.
    pub fn source(mut self, source: TenantSource) -> Self {
        self.source = source;
        self
    }

    /// At most `capacity` tenants are cached (the least used are dropped first),
    /// each for `ttl` from the time its secrets were read (by the guard's clock).
    pub fn cache(mut self, capacity: usize, ttl: Duration) -> Self {
        self.capacity = capacity;
        self.ttl = ttl;
        self
    }

    /// How long a tenant the resolver did not know is answered unknown without
    /// asking it again.
    pub fn unknown_ttl(mut self, ttl: Duration) -> Self {
        self.unknown_ttl = ttl;
        self
    }
}

/// Whether `tenant` is a valid tenant id: 1 to [`MAX_TENANT_LEN`] bytes, no
/// control character, no `/`, not starting with `#`. A delivery for any other is
/// rejected as an unknown tenant without asking the resolver.
pub fn check_tenant(tenant: &str) -> bool {
    !tenant.is_empty()
        && tenant.len() <= MAX_TENANT_LEN
        && !tenant.starts_with('#')
        && !tenant.contains('/')
        && !tenant.chars().any(char::is_control)
}

/// How a valid `tenant` is written in its namespace: as it is, or `#` and 16 hex
/// digits of its SHA-256 when longer than [`MAX_TENANT_NAMESPACE_PART`] (`#` starts
/// no valid tenant id, so the two forms never meet).
pub(crate) fn namespace_part(tenant: &str) -> Cow<'_, str> {
    if tenant.len() <= MAX_TENANT_NAMESPACE_PART {
        Cow::Borrowed(tenant)
    } else {
        let digest = Sha256::digest(tenant.as_bytes());
        Cow::Owned(format!("#{}", hex::encode(&digest[..8])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids_are_checked() {
        for good in [
            "acct_1",
            "shop.myshopify.com",
            "é",
            &"a".repeat(MAX_TENANT_LEN),
        ] {
            assert!(check_tenant(good), "{good}");
        }
        for bad in [
            "",
            "#x",
            "a/b",
            "a\nb",
            "a\u{7f}",
            &"a".repeat(MAX_TENANT_LEN + 1),
        ] {
            assert!(!check_tenant(bad), "{bad:?}");
        }
    }

    #[test]
    fn long_tenants_are_hashed_into_their_namespace() {
        let exact = "a".repeat(MAX_TENANT_NAMESPACE_PART);
        assert_eq!(namespace_part(&exact), exact.as_str());
        let long = "a".repeat(MAX_TENANT_NAMESPACE_PART + 1);
        let part = namespace_part(&long);
        assert_eq!(part.len(), 17);
        assert!(part.starts_with('#'));
        assert_ne!(
            part,
            namespace_part(&"a".repeat(MAX_TENANT_NAMESPACE_PART + 2))
        );
        assert_eq!(
            MAX_TENANT_GUARD_NAMESPACE + 1 + MAX_TENANT_NAMESPACE_PART,
            64
        );
    }
}
