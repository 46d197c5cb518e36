//! What the console reads and changes, behind one small interface ([`Source`]), so
//! that the pages know nothing of how a store lists its records.
//!
//! [`GuardSource`] is the one implementation: a guard's processed store and inbox.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::inbox::{InboxEvent, InboxState, InboxStore};
use crate::store::{Deleted, Record, RecordState, StoreError};
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

/// A count that stops at a cap (a store lists pages; counting all of a million
/// records is not what an overview should cost).
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
    /// Who marked it, if anyone did.
    pub(crate) by: Option<String>,
    /// When.
    pub(crate) at: Option<DateTime<Utc>>,
}

/// Why the console could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    /// The store does not offer this (a custom store without listing, a guard
    /// without an inbox).
    #[error("{0}")]
    Unsupported(&'static str),
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
    /// How many the list `filter` selects, up to `cap`.
    async fn count(&self, filter: &Filter, cap: usize) -> Result<Count, SourceError> {
        let mut n = 0;
        let mut cursor: Option<String> = None;
        loop {
            let page = self.page(filter, cursor.as_deref(), 100).await?;
            n += page.rows.len();
            if n > cap {
                return Ok(Count { n: cap, more: true });
            }
            match page.next {
                Some(next) if !page.rows.is_empty() => cursor = Some(next),
                _ => return Ok(Count { n, more: false }),
            }
        }
    }
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
    /// Up to `limit` stuck leases, the longest-expired first.
    async fn stuck(&self, limit: usize) -> Result<Vec<Record>, SourceError>;
}

/// A guard's processed store and inbox.
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

    fn inbox(&self) -> Result<&dyn InboxStore, SourceError> {
        self.inbox
            .as_deref()
            .ok_or(SourceError::Unsupported("this guard has no inbox"))
    }
}

/// What the console says while the store contract has no listing.
const NO_LISTING: &str = "this store does not list records";

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
        _cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page, SourceError> {
        if filter.state == Some(StateFilter::Stuck) {
            // Every store lists stuck leases (one page, the longest-expired first).
            let now = self.now();
            let rows = self
                .guard
                .stuck(limit)
                .await?
                .iter()
                .filter(|r| r.id.starts_with(&filter.prefix))
                .filter(|r| filter.since.is_none_or(|t| r.updated_at >= t))
                .filter(|r| filter.until.is_none_or(|t| r.updated_at < t))
                .map(|r| Row::of_record(r, now))
                .collect();
            return Ok(Page { rows, next: None });
        }
        Err(SourceError::Unsupported(NO_LISTING))
    }

    async fn record(&self, id: &str) -> Result<Option<Record>, SourceError> {
        Ok(self.guard.inspect(id).await?)
    }

    async fn event(&self, id: &str) -> Result<Option<InboxEvent>, SourceError> {
        match &self.inbox {
            None => Ok(None),
            Some(inbox) => Ok(inbox
                .get_event(crate::store::Key::new(self.namespace(), id))
                .await?),
        }
    }

    async fn escalation(&self, id: &str) -> Result<Option<EscalationMark>, SourceError> {
        let record = self.record(id).await?;
        Ok(record
            .filter(|r| r.state == RecordState::Escalated)
            .map(|_| EscalationMark {
                state: "open",
                by: None,
                at: None,
            }))
    }

    async fn forget(&self, id: &str) -> Result<Deleted, SourceError> {
        Ok(self.guard.forget(id).await?)
    }

    async fn requeue(&self, _id: &str) -> Result<bool, SourceError> {
        self.inbox()?;
        Err(SourceError::Unsupported(
            "this store cannot requeue dead letters",
        ))
    }

    async fn mark(&self, _id: &str, _mark: Mark, _operator: &str) -> Result<bool, SourceError> {
        Err(SourceError::Unsupported(
            "this store does not record escalation marks",
        ))
    }

    async fn stuck(&self, limit: usize) -> Result<Vec<Record>, SourceError> {
        Ok(self.guard.stuck(limit).await?)
    }
}
