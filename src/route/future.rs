//! The futures a [`Router`](super::Router) answers with: built of the handlers'
//! own futures, nested, never boxed.

use std::future::{Future, Ready};
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::outcome::HandlerError;

pin_project! {
    /// One of two futures: one route's handler's or a route's registered before it;
    /// a route's or the fallback's ([`RouteFuture`]).
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct OneOf<A, B> {
        #[pin]
        inner: Either<A, B>,
    }
}

pin_project! {
    #[project = EitherProj]
    #[derive(Debug)]
    enum Either<A, B> {
        Here { #[pin] future: A },
        Further { #[pin] future: B },
    }
}

impl<A, B> OneOf<A, B> {
    pub(super) fn here(future: A) -> Self {
        Self {
            inner: Either::Here { future },
        }
    }

    pub(super) fn further(future: B) -> Self {
        Self {
            inner: Either::Further { future },
        }
    }
}

impl<A, B> Future for OneOf<A, B>
where
    A: Future<Output = Result<(), HandlerError>>,
    B: Future<Output = Result<(), HandlerError>>,
{
    type Output = Result<(), HandlerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().inner.project() {
            EitherProj::Here { future } => future.poll(cx),
            EitherProj::Further { future } => future.poll(cx),
        }
    }
}

/// The routes' future when no route is registered: never made.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct NoFuture(());

impl Future for NoFuture {
    type Output = Result<(), HandlerError>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(Ok(()))
    }
}

/// What [`Router::dispatch`](super::Router::dispatch) answers: the future of the
/// event's handler (`R`, of the routes) or of the fallback (`F`), or the answer for
/// a payload that did not deserialize, ready at once. It holds no allocation of its
/// own.
pub type RouteFuture<R, F> = OneOf<OneOf<R, F>, Ready<Result<(), HandlerError>>>;

impl<R, F> RouteFuture<R, F> {
    pub(super) fn routed(future: R) -> Self {
        Self::here(OneOf::here(future))
    }

    pub(super) fn fallback(future: F) -> Self {
        Self::here(OneOf::further(future))
    }

    pub(super) fn ready(result: Result<(), HandlerError>) -> Self {
        Self::further(std::future::ready(result))
    }
}
