//! Shared pieces for the HTTP integration tests: a guard, signed deliveries, a store
//! that is down, and a server on loopback.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use webhook_guard::store::{
    Claim, ClaimRequest, Deleted, Fence, Finish, Holder, Key, ProcessedStore, Record, Renew,
};
use webhook_guard::verify::HmacSha256Header;
use webhook_guard::{EventId, StoreError, WebhookGuard};

pub const SECRET: &str = "whsec_wRNftLajMZNeslQOP6vEPm4iVx5NlZ6z";
pub const SIGNATURE_HEADER: &str = "X-Signature";
pub const LIMIT: usize = 1024;

pub fn verifier() -> HmacSha256Header {
    HmacSha256Header::new(SIGNATURE_HEADER, [SECRET]).unwrap()
}

/// A guard over `store` with a 1 KiB body limit, ids in the JSON field `id`.
pub fn guard(store: impl ProcessedStore) -> WebhookGuard {
    WebhookGuard::builder()
        .namespace("test")
        .store(store)
        .verifier(verifier())
        .event_id(EventId::json_field(["id"]))
        .max_body(LIMIT)
        .build()
        .unwrap()
}

/// A delivery body for event `id`.
pub fn body(id: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","type":"charge.succeeded"}}"#).into_bytes()
}

/// The signature header value for `body`.
pub fn sign(body: &[u8]) -> String {
    verifier().sign(body)
}

/// Serves `app` on `127.0.0.1:0` in the background and returns its address.
pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A store whose server is down: every call answers `StoreError::Unavailable`. A
/// test double for an outage.
#[derive(Debug)]
pub struct DownStore;

fn down() -> StoreError {
    StoreError::unavailable("connection refused (test double)")
}

#[async_trait]
impl ProcessedStore for DownStore {
    async fn claim(&self, _: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        Err(down())
    }
    async fn finish(&self, _: Holder<'_>, _: &Finish<'_>) -> Result<Fence, StoreError> {
        Err(down())
    }
    async fn renew(&self, _: Holder<'_>, _: &Renew) -> Result<Fence, StoreError> {
        Err(down())
    }
    async fn get(&self, _: Key<'_>) -> Result<Option<Record>, StoreError> {
        Err(down())
    }
    async fn delete(&self, _: Key<'_>, _: DateTime<Utc>) -> Result<Deleted, StoreError> {
        Err(down())
    }
    async fn purge_expired(&self, _: DateTime<Utc>, _: usize) -> Result<u64, StoreError> {
        Err(down())
    }
    async fn stuck(&self, _: DateTime<Utc>, _: usize) -> Result<Vec<Record>, StoreError> {
        Err(down())
    }
}
