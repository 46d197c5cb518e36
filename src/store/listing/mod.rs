//! Listing what a store keeps, for operators: paged, newest first, filtered by
//! state, time range and id prefix ([`ListingStore`] for records,
//! [`InboxListing`](crate::inbox::InboxListing) for inbox events).
//!
//! # Order and paging
//!
//! A page holds records (or events) of one namespace ordered by
//! `(updated_at, id)`, newest first. `updated_at` is when the record last changed
//! state (a claim, a take-over, a finish; a lease renewal does not change it), so
//! the newest failed records are the ones that failed last. The pair is unique in a
//! namespace, so the order is total and a [`Cursor`] — the position of the last
//! item a page showed — names exactly where the next page starts: strictly older
//! than the cursor. Paging is stable: an item that does not change while pages are
//! read appears exactly once; one that changes meanwhile moves to the top (newer
//! than every cursor) and is not met again by later pages.
//!
//! A page may hold fewer than `limit` items and still have a `next` cursor (a
//! backend whose walk of its index has a budget per call stops there): read on
//! while [`Page::next`] is `Some`.
//!
//! # Why a capability, not more required methods
//!
//! Listing is optional: [`ProcessedStore::record_listing`] (and
//! [`InboxStore::inbox_listing`](crate::inbox::InboxStore::inbox_listing)) answer
//! `None` unless a store provides it (defaulted methods answering an "unsupported"
//! error were the other choice: a typed `None` lets a console say "this store
//! cannot list" before calling anything), so a custom store written against the core
//! contract compiles and works unchanged, and a console shows "this store cannot
//! list" instead of failing. It is a trait of its own, reached from the store
//! object the guard already holds, so a caller needs no second object beside it.
//!
//! # Which stores list, and at what cost
//!
//! - **PostgreSQL, MySQL/MariaDB, SQLite**: an index on
//!   `(namespace, state, updated_at, id)` (records and inbox; `migrate` adds it).
//!   A page is one backward index walk per state listed, stopping at the page's
//!   limit, merged; no sort, no scan of the table. A count is an index range count.
//!   An id prefix is checked on the entries of that walk: a rare prefix walks the
//!   whole range of its states.
//! - **Memory**: no index (it would cost every claim); a page scans every record
//!   of the store, tens of milliseconds at a million records.
//! - **Redis** (standalone and cluster): a sorted set per shard, namespace and
//!   state scored by `updated_at`, kept in the same transaction or script as the
//!   record (see [`store::redis`](crate::store::redis)). A page is, per shard and
//!   state, a `ZRANGE … BYSCORE REV LIMIT` (one pipeline on a standalone server,
//!   one per shard at once on a cluster), merged, then one `MGET` per shard of
//!   the page's records: `O(shards × log n + page)`, about 0.6 ms for the newest
//!   100 failed of a million (`benches/README.md`); the upkeep (a `ZADD` per
//!   claim, a `ZREM` and a `ZADD` per finish) costs about a fifth to a quarter of
//!   the guard's cycle rate on Redis there. Counts of finished states are
//!   `ZCOUNT`s. Inbox events have no such index: `ZSCAN` of the namespace's `due`
//!   and `settled` sets and an `HGETALL` per event, a cost that grows with the
//!   namespace's inbox.
//! - **DynamoDB**: a sparse global secondary index `list` keyed by
//!   `(namespace/state/shard, updated_at/id)`, written by the record's own
//!   conditional writes (see [`store::dynamodb`](crate::store::dynamodb)). A page
//!   is one `Query` newest first per state and shard, merged, then a
//!   `BatchGetItem` of the page's records. Inbox events: a `Scan` of the table.
//! - On Redis and DynamoDB an id prefix is checked on the index entries a page
//!   walks (the index is ordered by time, not id), at most 20 pages' worth of
//!   entries per call (then the page ends early, with a cursor); a count with an
//!   id prefix, or of in-progress or stuck records (a lease tells them apart, not
//!   the index), reads page by page.
//! - Requeue and purge of a dead letter are one atomic step on every backend (a
//!   script on Redis, a conditional write on DynamoDB, a conditional `UPDATE` /
//!   `DELETE` on SQL).

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::ProcessedStore;
use super::{Record, RecordState, StoreError};
use crate::inbox::{InboxEvent, InboxState};

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod merge;
#[cfg(any(feature = "redis", feature = "dynamodb"))]
mod walk;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) use merge::{merged, Chunk};
#[cfg(any(feature = "redis", feature = "dynamodb"))]
pub(crate) use walk::*;

/// The most items one page holds; a larger `limit` is lowered to it.
pub const MAX_PAGE: usize = 1000;

/// A state to list records by: a [`RecordState`], with `InProgress` split in two
/// by the time of the query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, derive_more::Display)]
#[display("{}", self.as_str())]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ListState {
    /// `InProgress` under a live lease (`lease_until > now`).
    InProgress,
    /// `InProgress` whose lease ran out (`lease_until <= now`): a crashed or hung
    /// handler.
    Stuck,
    /// The last attempt failed; the next delivery may claim it.
    Failed,
    /// Processed.
    Completed,
    /// Escalated to the host (see [`escalation`](super::escalation) for
    /// acknowledging and resolving one).
    Escalated,
    /// Failed permanently.
    PermanentFailure,
}

impl ListState {
    /// Every state, in this order.
    pub const ALL: [Self; 6] = [
        Self::InProgress,
        Self::Stuck,
        Self::Failed,
        Self::Completed,
        Self::Escalated,
        Self::PermanentFailure,
    ];

    /// The name, such as `"stuck"` (a [`RecordState`]'s name for the others).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stuck => "stuck",
            other => other.record_state().as_str(),
        }
    }

    /// Parses [`ListState::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// The record state it lists (`InProgress` for both of its halves).
    pub fn record_state(self) -> RecordState {
        match self {
            Self::InProgress | Self::Stuck => RecordState::InProgress,
            Self::Failed => RecordState::Failed,
            Self::Completed => RecordState::Completed,
            Self::Escalated => RecordState::Escalated,
            Self::PermanentFailure => RecordState::PermanentFailure,
        }
    }

    /// The state `record` is listed under at `now`.
    pub fn of(record: &Record, now: DateTime<Utc>) -> Self {
        match record.state {
            RecordState::InProgress if record.lease_until <= now => Self::Stuck,
            RecordState::InProgress => Self::InProgress,
            RecordState::Failed => Self::Failed,
            RecordState::Completed => Self::Completed,
            RecordState::Escalated => Self::Escalated,
            RecordState::PermanentFailure => Self::PermanentFailure,
        }
    }
}

/// Where a page ended: the `(updated_at, id)` of the last item it showed (or the
/// last index entry a backend looked at). The next page holds what is strictly
/// older.
///
/// [`Cursor::token`] spells it as URL-safe text for a "next page" link, and
/// [`Cursor::parse`] reads it back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cursor {
    /// The `updated_at` of the position, to the millisecond.
    pub at: DateTime<Utc>,
    /// The id of the position.
    pub id: String,
}

/// A page token that [`Cursor::parse`] cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a page token")]
pub struct BadCursor;

impl Cursor {
    /// The position `(at, id)`, `at` cut to the millisecond.
    pub fn new(at: DateTime<Utc>, id: impl Into<String>) -> Self {
        Self {
            at: to_millis(at),
            id: id.into(),
        }
    }

    /// The position of `record`.
    pub fn of_record(record: &Record) -> Self {
        Self::new(record.updated_at, &record.id)
    }

    /// The position of `event`.
    pub fn of_event(event: &InboxEvent) -> Self {
        Self::new(event.updated_at, &event.id)
    }

    /// `<milliseconds>.<hex of the id>`: digits, `-`, `.` and hex only.
    pub fn token(&self) -> String {
        format!("{}.{}", self.at.timestamp_millis(), hex::encode(&self.id))
    }

    /// Reads a [`Cursor::token`].
    ///
    /// # Errors
    /// [`BadCursor`] for anything else.
    pub fn parse(token: &str) -> Result<Self, BadCursor> {
        let (ms, id) = token.split_once('.').ok_or(BadCursor)?;
        let at = ms.parse().ok().and_then(DateTime::from_timestamp_millis);
        let id = hex::decode(id).ok().and_then(|b| String::from_utf8(b).ok());
        match (at, id) {
            (Some(at), Some(id)) => Ok(Self { at, id }),
            _ => Err(BadCursor),
        }
    }

    /// Whether the item at `(at, id)` comes after this position (is older).
    pub fn precedes(&self, at: DateTime<Utc>, id: &str) -> bool {
        let at = to_millis(at);
        at < self.at || (at == self.at && id < self.id.as_str())
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.token())
    }
}

fn to_millis(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
}

/// What to list: one namespace, optionally some states, a time range on
/// `updated_at`, an id prefix, and where the previous page ended. `S` is
/// [`ListState`] for records ([`RecordQuery`]) and [`InboxState`] for inbox events
/// ([`EventQuery`]).
///
/// ```
/// use chrono::{TimeDelta, Utc};
/// use webhook_guard::store::listing::{ListState, RecordQuery};
///
/// let now = Utc::now();
/// let query = RecordQuery::new("stripe", now)
///     .states([ListState::Failed, ListState::Escalated])
///     .since(now - TimeDelta::hours(1))
///     .id_prefix("evt_1N")
///     .limit(50);
/// assert_eq!(query.limit, 50);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListQuery<S> {
    /// The namespace listed.
    pub namespace: String,
    /// The states listed; empty lists every state.
    pub states: Vec<S>,
    /// Only items with `updated_at >= since`.
    pub since: Option<DateTime<Utc>>,
    /// Only items with `updated_at < until`.
    pub until: Option<DateTime<Utc>>,
    /// Only ids that start with these bytes.
    pub id_prefix: Option<String>,
    /// Only items strictly older than this position (the previous page's
    /// [`Page::next`]).
    pub after: Option<Cursor>,
    /// The most items in the page (1 to [`MAX_PAGE`]).
    pub limit: usize,
    /// The current time (tells a live lease from a stuck one).
    pub now: DateTime<Utc>,
}

/// A listing of records: see [`ListQuery`].
pub type RecordQuery = ListQuery<ListState>;
/// A listing of inbox events: see [`ListQuery`].
pub type EventQuery = ListQuery<InboxState>;

impl<S: Copy + PartialEq> ListQuery<S> {
    /// Every item of `namespace`, newest first, 100 a page.
    pub fn new(namespace: impl Into<String>, now: DateTime<Utc>) -> Self {
        Self {
            namespace: namespace.into(),
            states: Vec::new(),
            since: None,
            until: None,
            id_prefix: None,
            after: None,
            limit: 100,
            now,
        }
    }

    /// Only these states.
    #[must_use]
    pub fn states(mut self, states: impl IntoIterator<Item = S>) -> Self {
        self.states = states.into_iter().collect();
        self
    }

    /// Only items changed at or after `since`.
    #[must_use]
    pub fn since(mut self, since: DateTime<Utc>) -> Self {
        self.since = Some(since);
        self
    }

    /// Only items changed before `until`.
    #[must_use]
    pub fn until(mut self, until: DateTime<Utc>) -> Self {
        self.until = Some(until);
        self
    }

    /// Only ids starting with `prefix`.
    #[must_use]
    pub fn id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.id_prefix = Some(prefix.into());
        self
    }

    /// The page after `cursor`.
    #[must_use]
    pub fn after(mut self, cursor: Option<Cursor>) -> Self {
        self.after = cursor;
        self
    }

    /// At most `limit` items (kept between 1 and [`MAX_PAGE`]).
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// The page size a store uses: `limit` kept between 1 and [`MAX_PAGE`].
    pub fn page_size(&self) -> usize {
        self.limit.clamp(1, MAX_PAGE)
    }

    /// The states to list: those given, or `all` when none are.
    pub fn states_or<'a>(&'a self, all: &'a [S]) -> Vec<S> {
        let given = if self.states.is_empty() {
            all
        } else {
            &self.states
        };
        let mut out: Vec<S> = Vec::with_capacity(given.len());
        for s in given {
            if !out.contains(s) {
                out.push(*s);
            }
        }
        out
    }

    /// The bounds on `updated_at` in milliseconds, inclusive: from `since`, to
    /// the earlier of `until` less a millisecond and the cursor's time. `None`
    /// when the range is empty.
    pub fn millis_range(&self) -> Option<(i64, i64)> {
        let lo = self.since.map_or(i64::MIN, |t| t.timestamp_millis());
        let mut hi = self.until.map_or(i64::MAX, |t| {
            // `until` is exclusive: the last millisecond before it.
            let ms = t.timestamp_millis();
            if to_millis(t) == t {
                ms.saturating_sub(1)
            } else {
                ms
            }
        });
        if let Some(c) = &self.after {
            hi = hi.min(c.at.timestamp_millis());
        }
        (lo <= hi).then_some((lo, hi))
    }

    /// Whether an item at `(updated_at, id)` passes the time range, the prefix and
    /// the cursor (not the state: see [`ListQuery::states_or`]).
    pub fn admits(&self, updated_at: DateTime<Utc>, id: &str) -> bool {
        let ms = updated_at.timestamp_millis();
        self.millis_range()
            .is_some_and(|(lo, hi)| lo <= ms && ms <= hi)
            && self
                .after
                .as_ref()
                .is_none_or(|c| c.precedes(updated_at, id))
            && self
                .id_prefix
                .as_deref()
                .is_none_or(|p| id.as_bytes().starts_with(p.as_bytes()))
    }
}

impl RecordQuery {
    /// The record states listed (stuck and live claims are both `InProgress`),
    /// each once.
    pub fn record_states(&self) -> Vec<RecordState> {
        let mut out = Vec::new();
        for s in self.states_or(&ListState::ALL) {
            let s = s.record_state();
            if !out.contains(&s) {
                out.push(s);
            }
        }
        out
    }

    /// Whether `record` is listed by this query (namespace, state, range, prefix
    /// and cursor), for a store that scans.
    pub fn matches(&self, record: &Record) -> bool {
        record.namespace == self.namespace
            && (self.states.is_empty() || self.states.contains(&ListState::of(record, self.now)))
            && self.admits(record.updated_at, &record.id)
    }
}

impl EventQuery {
    /// Whether `event` is listed by this query, for a store that scans.
    pub fn matches(&self, event: &InboxEvent) -> bool {
        event.namespace == self.namespace
            && (self.states.is_empty() || self.states.contains(&event.state))
            && self.admits(event.updated_at, &event.id)
    }
}

/// One page of a listing, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Where the next page starts, or `None` at the end of the listing.
    pub next: Option<Cursor>,
}

impl<T> Default for Page<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            next: None,
        }
    }
}

/// What can be listed: records and inbox events, by their position.
pub trait Listed {
    /// The item's `(updated_at, id)`.
    fn position(&self) -> (DateTime<Utc>, &str);
}

impl Listed for Record {
    fn position(&self) -> (DateTime<Utc>, &str) {
        (self.updated_at, &self.id)
    }
}

impl Listed for InboxEvent {
    fn position(&self) -> (DateTime<Utc>, &str) {
        (self.updated_at, &self.id)
    }
}

fn cursor_of<T: Listed>(item: &T) -> Cursor {
    let (at, id) = item.position();
    Cursor::new(at, id)
}

fn newest_first<T: Listed>(a: &T, b: &T) -> std::cmp::Ordering {
    let (pa, pb) = (a.position(), b.position());
    (to_millis(pb.0), pb.1).cmp(&(to_millis(pa.0), pa.1))
}

/// Listing of a [`ProcessedStore`]'s records, reached through
/// [`ProcessedStore::record_listing`]. See the [module docs](self) for the order
/// and paging.
///
/// # Contract
/// - **list_records**: the records of `query.namespace` in one of `query.states`
///   (every state when empty; [`ListState::of`] at `query.now`), with
///   `since <= updated_at < until`, an id starting with `id_prefix`, strictly older
///   than `after`; newest first by `(updated_at, id)`, at most
///   [`ListQuery::page_size`] of them. `next` is `None` only when no further
///   record matches; otherwise it is the position the page ended at.
/// - **count_records**: how many records `list_records` would list over all its
///   pages from the first (`after` and `limit` are ignored).
#[async_trait::async_trait]
pub trait ListingStore: Send + Sync {
    /// One page of records.
    async fn list_records(&self, query: &RecordQuery) -> Result<Page<Record>, StoreError>;

    /// How many records match `query`.
    async fn count_records(&self, query: &RecordQuery) -> Result<u64, StoreError>;
}

/// A page of `query` over every item a store holds, for a store that scans: the
/// `page_size` newest of those `matches` admits.
pub(crate) fn page_of_scan<T: Listed>(matching: impl Iterator<Item = T>, limit: usize) -> Page<T> {
    let mut items: Vec<T> = Vec::new();
    let mut more = false;
    for item in matching {
        items.push(item);
        if items.len() >= 2 * limit + 2 {
            items.sort_by(newest_first);
            items.truncate(limit + 1);
            more = true;
        }
    }
    items.sort_by(newest_first);
    more |= items.len() > limit;
    items.truncate(limit);
    let next = if more {
        items.last().map(cursor_of)
    } else {
        None
    };
    Page { items, next }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::InboxState;
    use crate::outcome::OutcomeKind;
    use crate::store::escalation::EscalationStatus;

    /// Each state's and outcome's `Display` is its name, as stores and logs write it.
    #[test]
    fn states_display_as_their_names() {
        for state in ListState::ALL {
            assert_eq!(state.to_string(), state.as_str());
            let record = state.record_state();
            assert_eq!(record.to_string(), record.as_str());
        }
        assert_eq!(
            RecordState::PermanentFailure.to_string(),
            "permanent_failure"
        );
        assert_eq!(ListState::Stuck.to_string(), "stuck");
        for kind in OutcomeKind::ALL {
            assert_eq!(kind.to_string(), kind.as_str());
        }
        for status in [
            EscalationStatus::Open,
            EscalationStatus::Acknowledged,
            EscalationStatus::Resolved,
        ] {
            assert_eq!(status.to_string(), status.as_str());
        }
        for state in [
            InboxState::Pending,
            InboxState::Running,
            InboxState::Done,
            InboxState::Dead,
        ] {
            assert_eq!(state.to_string(), state.as_str());
        }
        assert_eq!(InboxState::Dead.to_string(), "dead");
    }

    #[test]
    fn tokens_read_back_and_refuse_anything_else() {
        let c = Cursor::new(Utc::now(), "evt_<1>/é");
        assert_eq!(Cursor::parse(&c.token()), Ok(c.clone()));
        assert!(c
            .token()
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'.' || b == b'-'));
        for bad in ["", "12", "x.00", "12.zz", "12.ff"] {
            assert_eq!(Cursor::parse(bad), Err(BadCursor), "{bad}");
        }
    }

    #[test]
    fn list_states_spell_and_parse() {
        for s in ListState::ALL {
            assert_eq!(ListState::parse(s.as_str()), Some(s));
        }
        assert_eq!(
            ListState::parse("permanent_failure"),
            Some(ListState::PermanentFailure)
        );
        assert_eq!(ListState::parse("nope"), None);
    }

    #[test]
    fn the_range_ends_before_until_and_at_the_cursor() {
        let t = DateTime::from_timestamp_millis(10_000).unwrap();
        let q = RecordQuery::new("n", t)
            .since(t)
            .until(t + chrono::TimeDelta::seconds(1));
        assert_eq!(q.millis_range(), Some((10_000, 10_999)));
        let q = q.after(Some(Cursor::new(t, "b")));
        assert_eq!(q.millis_range(), Some((10_000, 10_000)));
        assert!(q.admits(t, "a") && !q.admits(t, "b") && !q.admits(t, "c"));
        let q = q.since(t + chrono::TimeDelta::milliseconds(1));
        assert_eq!(q.millis_range(), None);
    }
}
