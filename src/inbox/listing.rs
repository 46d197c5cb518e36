//! Listing an inbox for operators, and acting on its dead letters.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

#[cfg(doc)]
use super::InboxStore;
use super::{InboxEvent, InboxState};
use crate::store::listing::{EventQuery, Page};
use crate::store::{Key, StoreError};

/// Every inbox state, the order [`InboxListing::list_events`] merges them in when
/// a query names none.
pub const ALL_STATES: [InboxState; 5] = [
    InboxState::Pending,
    InboxState::Running,
    InboxState::Dead,
    InboxState::Done,
    InboxState::Skipped,
];

/// Listing of an [`InboxStore`]'s events and the dead-letter actions, reached
/// through [`InboxStore::inbox_listing`]. Order and paging are those of
/// [`store::listing`](crate::store::listing): newest first by `(updated_at, id)`.
///
/// # Contract
/// - **list_events**: the events of `query.namespace` in one of `query.states`
///   (every state when empty), with `since <= updated_at < until`, an id starting
///   with `id_prefix`, strictly older than `after`; newest first, at most
///   `page_size` of them (payloads included); `next` as for records.
/// - **count_events**: how many events `list_events` would list over all its pages.
/// - **requeue_dead**: if the event is `Dead`, make it `Pending`, due at `now`,
///   with `attempts = 0` (the worker's retry policy starts over), `updated_at =
///   now`, its last error kept, and answer `true`; otherwise change nothing and
///   answer `false`.
/// - **purge_dead**: if the event is `Dead`, remove it (its id is then forgotten:
///   a redelivery is accepted again) and answer `true`; otherwise `false`.
#[async_trait]
pub trait InboxListing: Send + Sync {
    /// One page of events.
    async fn list_events(&self, query: &EventQuery) -> Result<Page<InboxEvent>, StoreError>;

    /// How many events match `query`.
    async fn count_events(&self, query: &EventQuery) -> Result<u64, StoreError>;

    /// Puts a dead letter back in the queue, due now.
    async fn requeue_dead(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<bool, StoreError>;

    /// Removes a dead letter.
    async fn purge_dead(&self, key: Key<'_>) -> Result<bool, StoreError>;
}
