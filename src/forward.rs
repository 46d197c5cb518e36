//! The `Arc<T>` and `Box<T>` impls of the public traits (written by `auto_impl` on
//! each trait): they hold for trait objects, and reach the pointee's overrides.

use std::sync::Arc;

use async_trait::async_trait;

use crate::clock::{Clock, SystemClock};
use crate::hooks::{Hooks, NoHooks};
use crate::inbox::InboxStore;
use crate::ordering::OrderingStore;
use crate::reconcile::{ReconcileRequest, Reconciler};
use crate::store::{BoxError, MemoryStore, ProcessedStore};
use crate::verify::{NoVerification, Verifier};

#[derive(Debug)]
struct Nothing;

#[async_trait]
impl Reconciler for Nothing {
    async fn reconcile(&self, _: &ReconcileRequest) -> Result<(), BoxError> {
        Ok(())
    }
}

fn store(_: impl ProcessedStore + InboxStore + OrderingStore) {}
fn dyn_store(_: impl ProcessedStore) {}
fn inbox(_: impl InboxStore) {}
fn ordering(_: impl OrderingStore) {}
fn verifier(_: impl Verifier) {}
fn reconciler(_: impl Reconciler) {}
fn hooks(_: impl Hooks) {}
fn clock(_: impl Clock) {}

/// Every public trait holds for `Arc` and `Box` of an implementation and of a
/// trait object.
#[test]
fn arc_and_box_of_a_trait_object_implement_the_trait() {
    store(Arc::new(MemoryStore::new()));
    store(Box::new(MemoryStore::new()));
    dyn_store(Arc::new(MemoryStore::new()) as Arc<dyn ProcessedStore>);
    dyn_store(Box::new(MemoryStore::new()) as Box<dyn ProcessedStore>);
    inbox(Arc::new(MemoryStore::new()) as Arc<dyn InboxStore>);
    inbox(Box::new(MemoryStore::new()) as Box<dyn InboxStore>);
    ordering(Arc::new(MemoryStore::new()) as Arc<dyn OrderingStore>);
    ordering(Box::new(MemoryStore::new()) as Box<dyn OrderingStore>);
    verifier(Arc::new(NoVerification) as Arc<dyn Verifier>);
    verifier(Box::new(NoVerification) as Box<dyn Verifier>);
    reconciler(Arc::new(Nothing) as Arc<dyn Reconciler>);
    reconciler(Box::new(Nothing) as Box<dyn Reconciler>);
    hooks(Arc::new(NoHooks) as Arc<dyn Hooks>);
    hooks(Box::new(NoHooks) as Box<dyn Hooks>);
    clock(Arc::new(SystemClock) as Arc<dyn Clock>);
    clock(Box::new(SystemClock) as Box<dyn Clock>);
}

/// A forwarded call reaches the pointee's own override of a default method.
#[test]
fn a_forwarded_default_method_reaches_the_override() {
    let clock = crate::clock::ManualClock::new(chrono::DateTime::UNIX_EPOCH);
    let boxed: Box<dyn Clock> = Box::new(clock);
    assert_eq!(Arc::new(boxed).now(), chrono::DateTime::UNIX_EPOCH);
    let stripe = crate::verify::Stripe::new([crate::verify::Provider::Stripe.sample_secret()])
        .expect("a key");
    let shared: Arc<dyn Verifier> = Arc::new(stripe);
    assert!(Box::new(shared).retry_window().is_some());
}
