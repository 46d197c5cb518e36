//! One macro that writes the impls passing every call of a trait on to another
//! value: `Arc<T>` and `Box<T>` (with `T: ?Sized`, so `Arc<dyn Trait>` works) for
//! each public trait, and wrappers such as the metrics module's timed store.
//!
//! The trait's methods are listed once, as declared (all `async fn`, for a trait
//! behind `#[async_trait]`, or all plain `fn`). Every method is written out, default
//! ones too, so a wrapped value's own overrides are reached.

/// Writes forwarding impls of a trait.
///
/// - `forward!(Trait { fn ...; })`: `impl<T: Trait + ?Sized> Trait` for `Arc<T>` and
///   `Box<T>`, each method calling the pointee's.
/// - `forward!(impl[..generics..] Trait for Type, via path::to::inner, wrap path::to::wrap { async fn ...; })`:
///   one impl for `Type`, each method calling `inner(self)`'s and awaiting
///   `wrap("method", that_call)` (async traits only; their plain methods, which
///   take no argument, follow the async ones as `sync fn name(&self) -> T;`).
macro_rules! forward {
    ($tr:ident { $($methods:tt)* }) => {
        $crate::forward::forward!(impl[T: $tr + ?Sized] $tr for ::std::sync::Arc<T>,
            via ::std::ops::Deref::deref, wrap $crate::forward::same { $($methods)* });
        $crate::forward::forward!(impl[T: $tr + ?Sized] $tr for ::std::boxed::Box<T>,
            via ::std::ops::Deref::deref, wrap $crate::forward::same { $($methods)* });
    };
    (impl[$($gen:tt)*] $tr:ident for $ty:ty, via $inner:path, wrap $wrap:path {
        $(async fn $name:ident(&self $(, $arg:ident: $argty:ty)* $(,)?) -> $ret:ty;)+
        $(sync fn $sname:ident(&self) -> $sret:ty;)*
    }) => {
        #[deny(clippy::missing_trait_methods)]
        #[::async_trait::async_trait]
        impl<$($gen)*> $tr for $ty {
            $(async fn $name(&self $(, $arg: $argty)*) -> $ret {
                $wrap(stringify!($name), $inner(self).$name($($arg),*)).await
            })+
            $(fn $sname(&self) -> $sret {
                $inner(self).$sname()
            })*
        }
    };
    (impl[$($gen:tt)*] $tr:ident for $ty:ty, via $inner:path, wrap $wrap:path {
        $(fn $name:ident(&self $(, $arg:ident: $argty:ty)* $(,)?) $(-> $ret:ty)?;)+
    }) => {
        #[deny(clippy::missing_trait_methods)]
        impl<$($gen)*> $tr for $ty {
            $(fn $name(&self $(, $arg: $argty)*) $(-> $ret)? {
                $inner(self).$name($($arg),*)
            })+
        }
    };
}

pub(crate) use forward;

/// The `wrap` of a plain forward: the call itself, named for nothing.
pub(crate) fn same<F>(_method: &'static str, call: F) -> F {
    call
}

#[cfg(test)]
mod tests {
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
}
