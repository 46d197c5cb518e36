//! Many tenants behind one guard (`webhook_guard::tenant`): secrets resolved per
//! delivery through a cache, a dedup namespace per tenant, unknown tenants and
//! mismatches rejected before the store, a resolver outage answered 503. The
//! scenario runs on the memory store (the resolver a table in memory) and on
//! PostgreSQL (the resolver a table in the same PostgreSQL, cut by a proxy for the
//! outage); one test runs it through axum.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use webhook_guard::clock::ManualClock;
use webhook_guard::outcome::Rejection;
use webhook_guard::store::{DynProcessedStore, Key, ProcessedStore};
use webhook_guard::tenant::{ResolveError, SecretResolver, TenantSource, Tenants};
use webhook_guard::verify::{Secret, Stripe};
use webhook_guard::{HandlerError, Hooks, MemoryStore, Outcome, WebhookGuard};

const A: &str = "acct_a";
const B: &str = "acct_b";

/// Counts the store calls (a tenant rejected must make none), and can refuse to
/// release follow-up markers.
type Counted = crate::support::counted::Counted<Arc<DynProcessedStore>>;

/// Where the tenants' secrets are kept, as an application keeps them.
enum Keeper {
    /// A table in memory, with a switch standing for its database going down.
    Memory {
        table: Mutex<HashMap<String, Vec<String>>>,
        down: AtomicBool,
    },
    /// A table in PostgreSQL, read through a fault proxy that can cut it off.
    #[cfg(feature = "postgres")]
    Postgres {
        pool: webhook_guard::store::postgres::sqlx::PgPool,
        table: String,
        proxy: crate::support::proxy::FaultProxy,
        cleanup: Mutex<Option<crate::support::backends::Cleanup>>,
    },
}

/// The application's resolver over a [`Keeper`], counting its calls.
struct Resolver {
    keeper: Keeper,
    calls: AtomicUsize,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resolver")
    }
}

#[async_trait]
impl SecretResolver for Resolver {
    async fn secrets(&self, tenant: &str) -> Result<Option<Vec<Secret>>, ResolveError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match &self.keeper {
            Keeper::Memory { table, down } => {
                if down.load(Ordering::SeqCst) {
                    return Err(ResolveError::new("connection refused (the table is down)"));
                }
                let table = table.lock().unwrap();
                Ok(table
                    .get(tenant)
                    .map(|s| s.iter().map(|s| Secret::from(s.as_str())).collect()))
            }
            #[cfg(feature = "postgres")]
            Keeper::Postgres { pool, table, .. } => {
                use webhook_guard::store::postgres::sqlx;
                let rows: Vec<(String,)> = sqlx::query_as(&format!(
                    "SELECT secret FROM \"{table}\" WHERE tenant = $1 ORDER BY position"
                ))
                .bind(tenant)
                .fetch_all(pool)
                .await
                .map_err(ResolveError::new)?;
                Ok((!rows.is_empty())
                    .then(|| rows.into_iter().map(|(s,)| Secret::from(s)).collect()))
            }
        }
    }
}

impl Resolver {
    fn memory() -> Arc<Self> {
        Arc::new(Self {
            keeper: Keeper::Memory {
                table: Mutex::default(),
                down: AtomicBool::new(false),
            },
            calls: AtomicUsize::new(0),
        })
    }

    #[cfg(feature = "postgres")]
    async fn postgres(url: &str) -> Arc<Self> {
        use crate::support::backends::{host_port, unique, via, Cleanup};
        use webhook_guard::store::postgres::sqlx::{self, postgres::PgPoolOptions};
        let proxy = crate::support::proxy::FaultProxy::start(&host_port(url)).await;
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(std::time::Duration::from_secs(1))
            .connect(&via(url, &proxy.addr()))
            .await
            .expect("connect to PostgreSQL");
        let table = unique("wg_tenants");
        sqlx::query(&format!(
            "CREATE TABLE \"{table}\" (tenant TEXT NOT NULL, position INT NOT NULL, secret TEXT NOT NULL, PRIMARY KEY (tenant, position))"
        ))
        .execute(&pool)
        .await
        .expect("create the tenants table");
        let cleanup = Cleanup::Table {
            url: url.to_owned(),
            table: table.clone(),
        };
        Arc::new(Self {
            keeper: Keeper::Postgres {
                pool,
                table,
                proxy,
                cleanup: Mutex::new(Some(cleanup)),
            },
            calls: AtomicUsize::new(0),
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Gives `tenant` these secrets, newest first.
    async fn set(&self, tenant: &str, secrets: &[&str]) {
        match &self.keeper {
            Keeper::Memory { table, .. } => {
                let secrets = secrets.iter().map(|s| (*s).to_owned()).collect();
                table.lock().unwrap().insert(tenant.to_owned(), secrets);
            }
            #[cfg(feature = "postgres")]
            Keeper::Postgres { pool, table, .. } => {
                use webhook_guard::store::postgres::sqlx;
                sqlx::query(&format!("DELETE FROM \"{table}\" WHERE tenant = $1"))
                    .bind(tenant)
                    .execute(pool)
                    .await
                    .unwrap();
                for (position, secret) in secrets.iter().enumerate() {
                    sqlx::query(&format!("INSERT INTO \"{table}\" VALUES ($1, $2, $3)"))
                        .bind(tenant)
                        .bind(position as i32)
                        .bind(*secret)
                        .execute(pool)
                        .await
                        .unwrap();
                }
            }
        }
    }

    /// The secrets' database goes down (`true`) or comes back.
    fn down(&self, down: bool) {
        match &self.keeper {
            Keeper::Memory { down: flag, .. } => flag.store(down, Ordering::SeqCst),
            #[cfg(feature = "postgres")]
            Keeper::Postgres { proxy, .. } => {
                if down {
                    proxy.cut();
                } else {
                    proxy.restore();
                }
            }
        }
    }

    async fn cleanup(&self) {
        #[cfg(feature = "postgres")]
        if let Keeper::Postgres { cleanup, .. } = &self.keeper {
            let cleanup = cleanup.lock().unwrap().take();
            if let Some(cleanup) = cleanup {
                cleanup.run().await;
            }
        }
    }
}

/// The permanent failures announced, with their namespaces, and the namespace
/// and tenant each processed delivery was reported under.
#[derive(Debug, Default)]
struct Announced(Mutex<Vec<String>>, Mutex<Vec<(String, Option<String>)>>);

impl Hooks for Announced {
    fn on_permanent_failure(&self, key: Key<'_>, _error: &str) {
        self.0.lock().unwrap().push(key.namespace.to_owned());
    }

    fn on_outcome(&self, report: &webhook_guard::hooks::DeliveryReport<'_>) {
        if let Outcome::Processed { .. } = report.outcome {
            let tenant = report.tenant.map(str::to_owned);
            self.1
                .lock()
                .unwrap()
                .push((report.namespace.to_owned(), tenant));
        }
    }
}

fn at_start() -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000, 0).unwrap()
}

/// A Stripe Connect delivery of event `id` for `account` (none: the platform's own).
fn body(id: &str, account: Option<&str>) -> Vec<u8> {
    match account {
        Some(account) => {
            format!(r#"{{"id":"{id}","account":"{account}","type":"charge.succeeded"}}"#)
        }
        None => format!(r#"{{"id":"{id}","type":"charge.succeeded"}}"#),
    }
    .into_bytes()
}

/// The `Stripe-Signature` of `body` under `secret` at `now`.
fn sign(secret: &str, body: &[u8], now: DateTime<Utc>) -> Vec<(&'static str, String)> {
    let header = Stripe::new([secret]).unwrap().sign(body, now.timestamp());
    vec![("Stripe-Signature", header)]
}

struct Setup {
    guard: WebhookGuard,
    store: Arc<Counted>,
    resolver: Arc<Resolver>,
    clock: ManualClock,
    hooks: Arc<Announced>,
}

async fn setup(store: Arc<DynProcessedStore>, resolver: Arc<Resolver>) -> Setup {
    resolver
        .set(A, &["whsec_a0000000000000000000000000000000"])
        .await;
    resolver
        .set(
            B,
            &[
                "whsec_bnew0000000000000000000000000000",
                "whsec_bold0000000000000000000000000000",
            ],
        )
        .await;
    let store = Arc::new(Counted::new(store));
    let clock = ManualClock::new(at_start());
    let hooks = Arc::new(Announced::default());
    let guard = WebhookGuard::builder()
        .store(store.clone())
        .verifier(Stripe::new(["whsec_template000000000000000000000000"]).unwrap())
        .tenants(
            Tenants::new(resolver.clone())
                .source(TenantSource::json_field(["account"]))
                .cache(100, std::time::Duration::from_secs(60))
                .unknown_ttl(std::time::Duration::from_secs(10)),
        )
        .namespace("stripe")
        .clock(clock.clone())
        .hooks(hooks.clone())
        .build()
        .unwrap();
    Setup {
        guard,
        store,
        resolver,
        clock,
        hooks,
    }
}

impl Setup {
    /// Delivers `body` signed with `secret` on the route of `route` (if any): the
    /// outcome, and whether the handler ran (with the tenant it saw).
    async fn deliver(
        &self,
        route: Option<&str>,
        secret: &str,
        body: &[u8],
    ) -> (Outcome, Option<String>) {
        let headers = sign(secret, body, self.clock.now_utc());
        let tenant = match self.guard.tenant(route, &headers, body).await {
            Ok(tenant) => tenant,
            Err(outcome) => return (outcome, None),
        };
        let ran = Arc::new(Mutex::new(None));
        let seen = ran.clone();
        let outcome = tenant
            .handle(&headers, body, |event| async move {
                *seen.lock().unwrap() = Some(event.tenant().unwrap_or("").to_owned());
                Ok(())
            })
            .await;
        let ran = ran.lock().unwrap().take();
        (outcome, ran)
    }
}

trait NowUtc {
    fn now_utc(&self) -> DateTime<Utc>;
}

impl NowUtc for ManualClock {
    fn now_utc(&self) -> DateTime<Utc> {
        webhook_guard::clock::Clock::now(self)
    }
}

fn rejected(outcome: &Outcome) -> &Rejection {
    match outcome {
        Outcome::Rejected(r) => r,
        other => panic!("not rejected: {other:?}"),
    }
}

/// The whole scenario on one store and one keeper of secrets.
async fn two_tenants(store: Arc<DynProcessedStore>, resolver: Arc<Resolver>) {
    let s = setup(store, resolver).await;
    let (guard, store, resolver) = (&s.guard, &s.store, &s.resolver);

    // A's delivery sent to B's route (the platform's own event: no `account` to
    // tell): verified with B's secrets, rejected; the store never asked.
    let a_only = body("evt_platform", None);
    let (outcome, ran) = s
        .deliver(Some(B), "whsec_a0000000000000000000000000000000", &a_only)
        .await;
    assert_eq!(
        rejected(&outcome).code(),
        "signature_mismatch",
        "{outcome:?}"
    );
    assert_eq!(guard.answer(&outcome).status, 401);
    assert_eq!(ran, None);
    assert_eq!(
        store.calls(),
        0,
        "a forged tenant delivery reaches no store"
    );
    assert_eq!(resolver.calls(), 1, "B resolved");

    // The same event id under A and under B: two events, each run once.
    let (outcome, ran) = s
        .deliver(
            Some(A),
            "whsec_a0000000000000000000000000000000",
            &body("evt_1", Some(A)),
        )
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(ran.as_deref(), Some(A));
    let (outcome, ran) = s
        .deliver(
            Some(B),
            "whsec_bnew0000000000000000000000000000",
            &body("evt_1", Some(B)),
        )
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(ran.as_deref(), Some(B));
    let (outcome, ran) = s
        .deliver(
            Some(A),
            "whsec_a0000000000000000000000000000000",
            &body("evt_1", Some(A)),
        )
        .await;
    assert!(matches!(outcome, Outcome::Duplicate { .. }), "{outcome:?}");
    assert_eq!(ran, None);
    // Each in its tenant's namespace, none in the guard's own.
    for tenant in [A, B] {
        let namespace = guard.tenant_namespace(tenant).unwrap();
        assert_eq!(namespace, format!("stripe/{tenant}"));
        let record = store.get(Key::new(&namespace, "evt_1")).await.unwrap();
        assert!(record.is_some(), "{tenant}'s record");
    }
    assert!(guard.inspect("evt_1").await.unwrap().is_none());
    // Reported under the guard's namespace, the tenant apart (one metrics series
    // per guard, not per tenant).
    let reported = s.hooks.1.lock().unwrap().clone();
    let expected = [A, B].map(|t| ("stripe".to_owned(), Some(t.to_owned())));
    assert_eq!(reported, expected);
    // A body naming its tenant needs no route.
    let (outcome, _) = s
        .deliver(
            None,
            "whsec_a0000000000000000000000000000000",
            &body("evt_2", Some(A)),
        )
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(resolver.calls(), 2, "A resolved once, then cached");

    // Unknown tenant, mismatch, no tenant at all: rejected with their own codes,
    // before any store call.
    let calls = store.calls();
    let (outcome, _) = s
        .deliver(
            Some("acct_zz"),
            "whsec_a0000000000000000000000000000000",
            &body("evt_3", None),
        )
        .await;
    assert_eq!(rejected(&outcome), &Rejection::UnknownTenant);
    assert_eq!(guard.answer(&outcome).status, 404);
    assert_eq!(guard.answer(&outcome).reason, "unknown_tenant");
    assert_eq!(resolver.calls(), 3);
    let (outcome, _) = s
        .deliver(
            Some("acct_zz"),
            "whsec_a0000000000000000000000000000000",
            &body("evt_3", None),
        )
        .await;
    assert_eq!(rejected(&outcome), &Rejection::UnknownTenant);
    assert_eq!(resolver.calls(), 3, "unknown tenants are cached too");
    let (outcome, _) = s
        .deliver(
            Some("a/b"),
            "whsec_a0000000000000000000000000000000",
            &body("evt_3", None),
        )
        .await;
    assert_eq!(rejected(&outcome), &Rejection::UnknownTenant);
    let (outcome, _) = s
        .deliver(
            Some(B),
            "whsec_a0000000000000000000000000000000",
            &body("evt_4", Some(A)),
        )
        .await;
    assert_eq!(rejected(&outcome), &Rejection::TenantMismatch);
    assert_eq!(guard.answer(&outcome).status, 403);
    assert_eq!(guard.answer(&outcome).reason, "tenant_mismatch");
    let (outcome, _) = s
        .deliver(
            None,
            "whsec_a0000000000000000000000000000000",
            &body("evt_4", None),
        )
        .await;
    assert_eq!(rejected(&outcome), &Rejection::MissingTenant);
    assert_eq!(guard.answer(&outcome).reason, "missing_tenant");
    assert_eq!(resolver.calls(), 3, "a mismatch asks no resolver");
    // The guard itself verifies nothing: its template's secret is never used.
    let template = body("evt_5", None);
    let headers = sign(
        "whsec_template000000000000000000000000",
        &template,
        s.clock.now_utc(),
    );
    let outcome = guard
        .handle(&headers, &template, |_| async { Ok(()) })
        .await;
    assert_eq!(rejected(&outcome), &Rejection::MissingTenant);
    assert_eq!(store.calls(), calls, "no rejected tenant reached the store");

    // The secrets' database down: a cached tenant is served, a new one is 503.
    resolver.down(true);
    let (outcome, _) = s
        .deliver(
            Some(A),
            "whsec_a0000000000000000000000000000000",
            &body("evt_6", Some(A)),
        )
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    let calls = store.calls();
    let (outcome, _) = s
        .deliver(
            Some("acct_c"),
            "whsec_c0000000000000000000000000000000",
            &body("evt_7", None),
        )
        .await;
    assert!(
        matches!(outcome, Outcome::StoreUnavailable { id: None, .. }),
        "{outcome:?}"
    );
    let answer = guard.answer(&outcome);
    assert_eq!(answer.status, 503, "not 401");
    assert!(answer.retry_after.is_some());
    assert_eq!(store.calls(), calls);
    resolver.down(false);
    resolver
        .set("acct_c", &["whsec_c0000000000000000000000000000000"])
        .await;
    let (outcome, _) = s
        .deliver(
            Some("acct_c"),
            "whsec_c0000000000000000000000000000000",
            &body("evt_7", None),
        )
        .await;
    assert!(
        matches!(outcome, Outcome::Processed { .. }),
        "the failure was not cached: {outcome:?}"
    );

    // Rotation: B's two secrets both verify; B's secrets change to a third one,
    // which takes over once the cache entry expired, the old ones then refused.
    let resolved = resolver.calls();
    let (outcome, _) = s
        .deliver(
            Some(B),
            "whsec_bold0000000000000000000000000000",
            &body("evt_8", Some(B)),
        )
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    resolver
        .set(B, &["whsec_bnewer00000000000000000000000000"])
        .await;
    let (outcome, _) = s
        .deliver(
            Some(B),
            "whsec_bnew0000000000000000000000000000",
            &body("evt_9", Some(B)),
        )
        .await;
    assert!(
        matches!(outcome, Outcome::Processed { .. }),
        "still cached: {outcome:?}"
    );
    assert_eq!(resolver.calls(), resolved, "cache hits ask no resolver");
    s.clock.advance(TimeDelta::seconds(61));
    let (outcome, _) = s
        .deliver(
            Some(B),
            "whsec_bnew0000000000000000000000000000",
            &body("evt_10", Some(B)),
        )
        .await;
    assert_eq!(
        rejected(&outcome).code(),
        "signature_mismatch",
        "{outcome:?}"
    );
    assert_eq!(resolver.calls(), resolved + 1, "expired: asked again");
    let (outcome, _) = s
        .deliver(
            Some(B),
            "whsec_bnewer00000000000000000000000000",
            &body("evt_10", Some(B)),
        )
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(resolver.calls(), resolved + 1);
    // `forget_tenant` takes a change up at once.
    resolver
        .set(B, &["whsec_bfourth0000000000000000000000000"])
        .await;
    guard.forget_tenant(B);
    let (outcome, _) = s
        .deliver(
            Some(B),
            "whsec_bfourth0000000000000000000000000",
            &body("evt_11", Some(B)),
        )
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(resolver.calls(), resolved + 2);

    // A tenant's permanent failure whose marker a dead process kept is announced
    // by the guard's sweeper, in the tenant's namespace.
    store.keep_markers.store(true, Ordering::SeqCst);
    let fails = body("evt_12", Some(A));
    let headers = sign(
        "whsec_a0000000000000000000000000000000",
        &fails,
        s.clock.now_utc(),
    );
    let tenant = guard.tenant(Some(A), &headers, &fails).await.unwrap();
    let outcome = tenant
        .handle(&headers, &fails, |_| async {
            Err(HandlerError::permanent("no such customer"))
        })
        .await;
    assert!(
        matches!(outcome, Outcome::PermanentFailure { .. }),
        "{outcome:?}"
    );
    store.keep_markers.store(false, Ordering::SeqCst);
    assert_eq!(*s.hooks.0.lock().unwrap(), ["stripe/acct_a"]);
    s.clock.advance(TimeDelta::minutes(6));
    let report = guard.sweeper().sweep().await.unwrap();
    assert_eq!(report.followed_up, 1, "{report:?}");
    assert_eq!(
        *s.hooks.0.lock().unwrap(),
        ["stripe/acct_a", "stripe/acct_a"]
    );
    let report = guard.sweeper().sweep().await.unwrap();
    assert_eq!(report.followed_up, 0, "the marker was released: {report:?}");

    s.resolver.cleanup().await;
}

#[tokio::test]
async fn two_tenants_on_the_memory_store() {
    let store: Arc<DynProcessedStore> = Arc::new(MemoryStore::new());
    two_tenants(store, Resolver::memory()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_on_postgres() {
    use crate::support::backends::{store, Backend};
    let Some(url) = crate::support::server_url("WEBHOOK_GUARD_POSTGRES_URL") else {
        return;
    };
    let (store, cleanup) = store(Backend::Postgres, 4, None).await.unwrap();
    two_tenants(store, Resolver::postgres(&url).await).await;
    cleanup.run().await;
}

/// Shopify names the shop in a header; a long tenant id is hashed into its
/// namespace, which fits MariaDB's 64-byte column.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_shop_domain_fits_mariadb() {
    use crate::support::backends::{store, Backend};
    use webhook_guard::verify::Shopify;
    let Some((store, cleanup)) = store(Backend::MySql, 2, None).await else {
        return;
    };
    let shop = "a-very-long-shop-name-for-a-test.myshopify.com";
    let secrets = HashMap::from([(
        shop.to_owned(),
        vec![Secret::from("shpss_10000000000000000000000000000000")],
    )]);
    let guard = WebhookGuard::builder()
        .store(store)
        .verifier(Shopify::new(["template0000000000000000000000000"]).unwrap())
        .tenants(Tenants::new(secrets).source(TenantSource::header("X-Shopify-Shop-Domain")))
        .namespace("shopify")
        .build()
        .unwrap();
    let body = br#"{"id":1}"#;
    let headers = [
        (
            "X-Shopify-Hmac-Sha256",
            Shopify::new(["shpss_10000000000000000000000000000000"])
                .unwrap()
                .sign(body),
        ),
        ("X-Shopify-Shop-Domain", shop.to_owned()),
        ("X-Shopify-Webhook-Id", "wh_1".to_owned()),
    ];
    let tenant = guard.tenant(None, &headers, body).await.unwrap();
    assert_eq!(tenant.namespace().len(), "shopify/#".len() + 16);
    let outcome = tenant.handle(&headers, body, |_| async { Ok(()) }).await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    let again = tenant.handle(&headers, body, |_| async { Ok(()) }).await;
    assert!(matches!(again, Outcome::Duplicate { .. }), "{again:?}");
    cleanup.run().await;
}

/// Through axum: the tenant from the route's `Path`, answered over HTTP.
#[tokio::test]
async fn through_axum_the_route_names_the_tenant() {
    use axum::extract::{Path, Request};
    use axum::routing::post;
    use webhook_guard::integrations::axum::handle_tenant_request;

    let resolver = Resolver::memory();
    resolver
        .set(A, &["whsec_a0000000000000000000000000000000"])
        .await;
    resolver
        .set(B, &["whsec_b0000000000000000000000000000000"])
        .await;
    let ran = Arc::new(Mutex::new(Vec::new()));
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(Stripe::new(["whsec_template000000000000000000000000"]).unwrap())
        .tenants(Tenants::new(resolver.clone()).source(TenantSource::json_field(["account"])))
        .namespace("stripe")
        .build()
        .unwrap();
    let seen = ran.clone();
    let app = axum::Router::new().route(
        "/webhooks/stripe/{tenant}",
        post(move |Path(tenant): Path<String>, request: Request| {
            let (guard, seen) = (guard.clone(), seen.clone());
            async move {
                handle_tenant_request(&guard, Some(&tenant), request, move |event| async move {
                    let who = format!("{}:{}", event.tenant().unwrap(), event.id());
                    seen.lock().unwrap().push(who);
                    Ok(())
                })
                .await
            }
        }),
    );
    let addr = crate::support::web::serve(app).await;
    let post = |tenant: &'static str, secret: &'static str, body: Vec<u8>| async move {
        let (name, value) = sign(secret, &body, Utc::now()).remove(0);
        let path = format!("/webhooks/stripe/{tenant}");
        crate::support::http_client::post(addr, &path, &[(name, &value)], &body).await
    };

    let reply = post(
        A,
        "whsec_a0000000000000000000000000000000",
        body("evt_1", None),
    )
    .await;
    assert_eq!(
        (reply.status, reply.json()["outcome"].as_str()),
        (200, Some("processed"))
    );
    let reply = post(
        B,
        "whsec_b0000000000000000000000000000000",
        body("evt_1", None),
    )
    .await;
    assert_eq!(
        (reply.status, reply.json()["outcome"].as_str()),
        (200, Some("processed"))
    );
    let reply = post(
        B,
        "whsec_a0000000000000000000000000000000",
        body("evt_2", None),
    )
    .await;
    assert_eq!(
        (reply.status, reply.json()["reason"].as_str()),
        (401, Some("signature_mismatch"))
    );
    let reply = post(
        "acct_zz",
        "whsec_a0000000000000000000000000000000",
        body("evt_2", None),
    )
    .await;
    assert_eq!(
        (reply.status, reply.json()["reason"].as_str()),
        (404, Some("unknown_tenant"))
    );
    let reply = post(
        B,
        "whsec_a0000000000000000000000000000000",
        body("evt_2", Some(A)),
    )
    .await;
    assert_eq!(
        (reply.status, reply.json()["reason"].as_str()),
        (403, Some("tenant_mismatch"))
    );
    resolver.down(true);
    let reply = post(
        "acct_new",
        "whsec_a0000000000000000000000000000000",
        body("evt_2", None),
    )
    .await;
    assert_eq!(reply.status, 503);
    assert!(reply.header("retry-after").is_some());
    assert_eq!(*ran.lock().unwrap(), ["acct_a:evt_1", "acct_b:evt_1"]);
}

/// A tenant whose resolver gives a secret that cannot be the provider's (too
/// short for a Stripe signing secret): refused as that tenant's configuration
/// error (503, the store untouched, the handler not run), the message naming the
/// tenant and the fix but not the secret, and not cached: once the resolver gives
/// a good secret, the tenant is served.
#[tokio::test]
async fn a_tenant_secret_in_the_wrong_format_is_refused_not_cached() {
    use hmac::{Hmac, Mac};
    let s = setup(Arc::new(MemoryStore::new()), Resolver::memory()).await;
    let bad = "whsec_tooShort9";
    s.resolver.set("acct_bad", &[bad]).await;
    let body = body("evt_bad_1", None);
    let now = s.clock.now_utc().timestamp();
    // Signed with the malformed secret's bytes: what a verifier keyed with it
    // unchecked would accept.
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(bad.as_bytes()).unwrap();
    mac.update(format!("{now}.").as_bytes());
    mac.update(&body);
    let header = format!("t={now},v1={}", hex::encode(mac.finalize().into_bytes()));
    let headers = [("Stripe-Signature", header)];
    let calls = s.store.calls();
    let tenant = s.guard.tenant(Some("acct_bad"), &headers, &body).await;
    let outcome = match tenant {
        Ok(tenant) => {
            tenant
                .handle(&headers, &body, |_| async { panic!("the handler ran") })
                .await
        }
        Err(outcome) => outcome,
    };
    let Outcome::StoreUnavailable { error, .. } = &outcome else {
        panic!("not refused as the tenant's configuration: {outcome:?}");
    };
    let text = error.to_string();
    assert!(
        text.contains("acct_bad") && text.contains("Stripe") && text.contains("fewer than"),
        "{text}"
    );
    assert!(
        !text.contains(bad) && !format!("{outcome:?}").contains(bad),
        "{text}"
    );
    assert_eq!(s.guard.answer(&outcome).status, 503);
    assert_eq!(s.store.calls(), calls, "the store was not touched");

    // Fixed at the resolver: served at once (the refusal was not cached).
    let good = "whsec_fixed000000000000000000000000000";
    s.resolver.set("acct_bad", &[good]).await;
    let (outcome, ran) = s.deliver(Some("acct_bad"), good, &body).await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    assert_eq!(ran.as_deref(), Some("acct_bad"));
}
