//! What the console reads and changes, behind one small interface ([`Source`]), so
//! that the pages know nothing of how a store lists its records.
//!
//! [`GuardSource`] is the one implementation: a guard's processed store and inbox.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::inbox::{InboxEvent, InboxListing, InboxState, InboxStore};
use crate::store::escalation::{self, EscalationError, EscalationStatus};
use crate::store::listing::{Cursor, ListQuery, ListState};
use crate::store::{
    Deleted, DynProcessedStore, Key, ListingStore, Record, RecordState, StoreError,
};
use crate::WebhookGuard;

/// Which records a list shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateFilter {
    /// Records of the processed store in one state.
    Record(RecordState),
    /// `InProgress` records whose lease ran out.
    Stuck,
    /// Inbox events waiting for a worker.
    Pending,
    /// Inbox events a worker holds.
    Leased,
    /// Inbox events that failed for good: the dead letters.
    Dead,
}

impl StateFilter {
    /// Every filter, in the order the list's menu offers them.
    pub(crate) const ALL: [Self; 9] = [
        Self::Record(RecordState::Completed),
        Self::Record(RecordState::InProgress),
        Self::Record(RecordState::Failed),
        Self::Record(RecordState::Escalated),
        Self::Record(RecordState::PermanentFailure),
        Self::Stuck,
        Self::Pending,
        Self::Leased,
        Self::Dead,
    ];

    /// The name in a URL (`?state=`) and in JSON.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Record(state) => state.as_str(),
            Self::Stuck => "stuck",
            Self::Pending => "pending",
            Self::Leased => "leased",
            Self::Dead => "dead_letter",
        }
    }

    /// What a person reads.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Record(RecordState::Completed) => "completed",
            Self::Record(RecordState::InProgress) => "in progress",
            Self::Record(RecordState::Failed) => "failed (will retry)",
            Self::Record(RecordState::Escalated) => "escalated",
            Self::Record(RecordState::PermanentFailure) => "permanent failure",
            Self::Stuck => "stuck lease",
            Self::Pending => "inbox: pending",
            Self::Leased => "inbox: leased",
            Self::Dead => "inbox: dead letter",
        }
    }

    /// Parses [`StateFilter::as_str`].
    pub(crate) fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == text)
    }

    /// Whether the filter lists inbox events rather than records.
    pub(crate) fn is_inbox(self) -> bool {
        matches!(self, Self::Pending | Self::Leased | Self::Dead)
    }
}

/// A list's filter: state, a window of last changes, an id prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    /// `None`: records in every state.
    pub(crate) state: Option<StateFilter>,
    /// Changed at or after.
    pub(crate) since: Option<DateTime<Utc>>,
    /// Changed before.
    pub(crate) until: Option<DateTime<Utc>>,
    /// Ids starting with this (empty: any).
    pub(crate) prefix: String,
}

/// One line of a list: a record or an inbox event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Row {
    /// The event id.
    pub(crate) id: String,
    /// The state's name.
    pub(crate) state: &'static str,
    /// Whether it is an inbox event.
    pub(crate) inbox: bool,
    /// When it last changed.
    pub(crate) updated_at: DateTime<Utc>,
    /// Handler runs (or worker leases).
    pub(crate) attempts: u32,
    /// The latest handler error.
    pub(crate) last_error: Option<String>,
}

impl Row {
    pub(crate) fn of_record(record: &Record, now: DateTime<Utc>) -> Self {
        let stuck = record.state == RecordState::InProgress && record.lease_until <= now;
        Self {
            id: record.id.clone(),
            state: if stuck {
                "stuck"
            } else {
                record.state.as_str()
            },
            inbox: false,
            updated_at: record.updated_at,
            attempts: record.attempts,
            last_error: record.history.last().map(|note| note.error.clone()),
        }
    }

    pub(crate) fn of_event(event: &InboxEvent) -> Self {
        Self {
            id: event.id.clone(),
            state: match event.state {
                InboxState::Dead => "dead_letter",
                InboxState::Running => "leased",
                other => other.as_str(),
            },
            inbox: true,
            updated_at: event.updated_at,
            attempts: event.attempts,
            last_error: event.last_error.clone(),
        }
    }
}

/// A page of a list, and where the next one starts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Page {
    pub(crate) rows: Vec<Row>,
    /// An opaque cursor for the next page, if there is one.
    pub(crate) next: Option<String>,
}

/// A count, exact unless `more` (then at least `n`: a count that stops where
/// reading on would cost too much).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Count {
    pub(crate) n: usize,
    /// Whether there are more than `n`.
    pub(crate) more: bool,
}

/// What an operator did about an escalation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// Seen; someone is on it.
    Acknowledge,
    /// Handled; no longer open.
    Resolve,
}

impl Mark {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Acknowledge => "acknowledge",
            Self::Resolve => "resolve",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "acknowledge" => Some(Self::Acknowledge),
            "resolve" => Some(Self::Resolve),
            _ => None,
        }
    }
}

/// Where an escalation stands, as recorded in the store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct EscalationMark {
    /// `"open"`, `"acknowledged"` or `"resolved"`.
    pub(crate) state: &'static str,
    /// Each step: when, and what was noted (who did it).
    pub(crate) notes: Vec<(DateTime<Utc>, String)>,
}

/// Why the console could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    /// The store does not offer this (a custom store without listing, a guard
    /// without an inbox).
    #[error("{0}")]
    Unsupported(&'static str),
    /// The request names something the console cannot read (a page cursor).
    #[error("{0}")]
    BadInput(String),
    /// The store refused the change as it stands (an escalation resolved already,
    /// another change under way).
    #[error("{0}")]
    Refused(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The console's view of a guard's stores.
#[async_trait]
pub(crate) trait Source: Send + Sync + 'static {
    /// The guard's namespace.
    fn namespace(&self) -> &str;
    /// Whether the guard has an inbox.
    fn has_inbox(&self) -> bool;
    /// The current time, from the guard's clock.
    fn now(&self) -> DateTime<Utc>;
    /// A page of the list `filter` selects, newest change first.
    async fn page(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page, SourceError>;
    /// How many the list `filter` selects.
    async fn count(&self, filter: &Filter) -> Result<Count, SourceError>;
    /// The record of `id`.
    async fn record(&self, id: &str) -> Result<Option<Record>, SourceError>;
    /// The inbox event of `id`.
    async fn event(&self, id: &str) -> Result<Option<InboxEvent>, SourceError>;
    /// Where the escalation of `id` stands (`None`: not escalated).
    async fn escalation(&self, id: &str) -> Result<Option<EscalationMark>, SourceError>;
    /// Forgets the record of `id`.
    async fn forget(&self, id: &str) -> Result<Deleted, SourceError>;
    /// Puts the dead letter `id` back in the queue; `false` when it is not one.
    async fn requeue(&self, id: &str) -> Result<bool, SourceError>;
    /// Marks the escalation of `id`; `false` when it is not escalated.
    async fn mark(&self, id: &str, mark: Mark, operator: &str) -> Result<bool, SourceError>;
    /// Up to `limit` stuck leases of this namespace.
    async fn stuck(&self, limit: usize) -> Result<Vec<Record>, SourceError>;
}

/// A guard's processed store and inbox, through the store contract's listing
/// capabilities ([`ProcessedStore::record_listing`](crate::ProcessedStore::record_listing),
/// [`InboxStore::inbox_listing`]) and escalation markers
/// ([`escalation`](crate::store::escalation)).
#[derive(Debug, Clone)]
pub(crate) struct GuardSource {
    guard: WebhookGuard,
    inbox: Option<Arc<dyn InboxStore>>,
}

impl GuardSource {
    pub(crate) fn new(guard: WebhookGuard) -> Self {
        let inbox = guard.inbox_store().cloned();
        Self { guard, inbox }
    }

    fn store(&self) -> &DynProcessedStore {
        &**self.guard.store()
    }

    fn records(&self) -> Result<&dyn ListingStore, SourceError> {
        self.store()
            .record_listing()
            .ok_or(SourceError::Unsupported("this store does not list records"))
    }

    fn events(&self) -> Result<&dyn InboxListing, SourceError> {
        self.inbox
            .as_deref()
            .ok_or(SourceError::Unsupported("this guard has no inbox"))?
            .inbox_listing()
            .ok_or(SourceError::Unsupported("this inbox does not list events"))
    }

    fn query<S: Copy + PartialEq>(
        &self,
        filter: &Filter,
        states: Vec<S>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ListQuery<S>, SourceError> {
        let after = cursor
            .map(Cursor::parse)
            .transpose()
            .map_err(|_| SourceError::BadInput("not a page cursor of this console".to_owned()))?;
        let mut query = ListQuery::new(self.namespace(), self.now())
            .states(states)
            .after(after)
            .limit(limit);
        query.since = filter.since;
        query.until = filter.until;
        if !filter.prefix.is_empty() {
            query.id_prefix = Some(filter.prefix.clone());
        }
        Ok(query)
    }
}

/// The listing state of a record filter (`None`: every state).
fn list_state(filter: StateFilter) -> Option<ListState> {
    Some(match filter {
        StateFilter::Record(RecordState::InProgress) => ListState::InProgress,
        StateFilter::Record(RecordState::Failed) => ListState::Failed,
        StateFilter::Record(RecordState::Completed) => ListState::Completed,
        StateFilter::Record(RecordState::Escalated) => ListState::Escalated,
        StateFilter::Record(RecordState::PermanentFailure) => ListState::PermanentFailure,
        StateFilter::Stuck => ListState::Stuck,
        _ => return None,
    })
}

/// The inbox state of an inbox filter.
fn inbox_state(filter: StateFilter) -> Option<InboxState> {
    match filter {
        StateFilter::Pending => Some(InboxState::Pending),
        StateFilter::Leased => Some(InboxState::Running),
        StateFilter::Dead => Some(InboxState::Dead),
        _ => None,
    }
}

#[async_trait]
impl Source for GuardSource {
    fn namespace(&self) -> &str {
        self.guard.namespace()
    }

    fn has_inbox(&self) -> bool {
        self.inbox.is_some()
    }

    fn now(&self) -> DateTime<Utc> {
        self.guard.clock().now()
    }

    async fn page(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page, SourceError> {
        if let Some(state) = filter.state.and_then(inbox_state) {
            let query = self.query(filter, vec![state], cursor, limit)?;
            let page = self.events()?.list_events(&query).await?;
            return Ok(Page {
                rows: page.items.iter().map(Row::of_event).collect(),
                next: page.next.map(|c| c.token()),
            });
        }
        let states = filter.state.and_then(list_state).into_iter().collect();
        let query = self.query(filter, states, cursor, limit)?;
        let listing = match self.records() {
            Ok(listing) => listing,
            Err(_) if filter.state == Some(StateFilter::Stuck) => {
                // Every store lists stuck leases, if not as a page.
                let rows = self
                    .stuck(limit)
                    .await?
                    .iter()
                    .filter(|r| query.admits(r.updated_at, &r.id))
                    .map(|r| Row::of_record(r, query.now))
                    .collect();
                return Ok(Page { rows, next: None });
            }
            Err(unsupported) => return Err(unsupported),
        };
        let page = listing.list_records(&query).await?;
        Ok(Page {
            rows: page
                .items
                .iter()
                .map(|r| Row::of_record(r, query.now))
                .collect(),
            next: page.next.map(|c| c.token()),
        })
    }

    async fn count(&self, filter: &Filter) -> Result<Count, SourceError> {
        let n = if let Some(state) = filter.state.and_then(inbox_state) {
            let query = self.query(filter, vec![state], None, 1)?;
            self.events()?.count_events(&query).await?
        } else {
            let states = filter.state.and_then(list_state).into_iter().collect();
            let query = self.query(filter, states, None, 1)?;
            self.records()?.count_records(&query).await?
        };
        Ok(Count {
            n: usize::try_from(n).unwrap_or(usize::MAX),
            more: false,
        })
    }

    async fn record(&self, id: &str) -> Result<Option<Record>, SourceError> {
        Ok(self.guard.inspect(id).await?)
    }

    async fn event(&self, id: &str) -> Result<Option<InboxEvent>, SourceError> {
        match &self.inbox {
            None => Ok(None),
            Some(inbox) => Ok(inbox.get_event(Key::new(self.namespace(), id)).await?),
        }
    }

    async fn escalation(&self, id: &str) -> Result<Option<EscalationMark>, SourceError> {
        let Some(record) = self.record(id).await? else {
            return Ok(None);
        };
        if record.state != RecordState::Escalated {
            return Ok(None);
        }
        let status = escalation::status(self.store(), &record).await?;
        Ok(Some(EscalationMark {
            state: status.status.as_str(),
            notes: status.notes.into_iter().map(|n| (n.at, n.error)).collect(),
        }))
    }

    async fn forget(&self, id: &str) -> Result<Deleted, SourceError> {
        Ok(self.guard.forget(id).await?)
    }

    async fn requeue(&self, id: &str) -> Result<bool, SourceError> {
        let key = Key::new(self.namespace(), id);
        Ok(self.events()?.requeue_dead(key, self.now()).await?)
    }

    async fn mark(&self, id: &str, mark: Mark, operator: &str) -> Result<bool, SourceError> {
        let status = match mark {
            Mark::Acknowledge => EscalationStatus::Acknowledged,
            Mark::Resolve => EscalationStatus::Resolved,
        };
        let key = Key::new(self.namespace(), id);
        let note = format!("by {operator:?} in the console");
        match escalation::mark(self.store(), key, status, &note, self.now()).await {
            Ok(_) => Ok(true),
            Err(EscalationError::NotFound | EscalationError::NotEscalated(_)) => Ok(false),
            Err(EscalationError::Store(e)) => Err(e.into()),
            Err(e) => Err(SourceError::Refused(e.to_string())),
        }
    }

    async fn stuck(&self, limit: usize) -> Result<Vec<Record>, SourceError> {
        if let Ok(listing) = self.records() {
            let query = ListQuery::new(self.namespace(), self.now())
                .states([ListState::Stuck])
                .limit(limit);
            return Ok(listing.list_records(&query).await?.items);
        }
        // The store-wide list holds every namespace's: this guard's only.
        let mut stuck = self.guard.stuck(limit).await?;
        stuck.retain(|r| r.namespace == self.namespace());
        Ok(stuck)
    }
}
