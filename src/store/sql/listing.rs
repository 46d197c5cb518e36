//! Listing on the SQL stores: one walk of the `…_listing` index
//! `(namespace, state, updated_at, id)` per state, merged (see
//! [`merged`](crate::store::listing)).

use crate::store::listing::{Cursor, ListQuery, ListState};
use crate::store::sql::Arg;

/// The binds common to a page and a count: namespace, state, the `updated_at`
/// range, and the prefix's length and text (`None` when the range is empty).
pub(crate) struct Walk<'a> {
    namespace: &'a str,
    state: &'a str,
    lo: i64,
    hi: i64,
    /// The cursor's id when the cursor sits at `hi`.
    at_hi: Option<&'a str>,
    prefix: &'a str,
    prefix_len: u32,
}

impl<'a> Walk<'a> {
    pub(crate) fn new<S>(
        query: &'a ListQuery<S>,
        state: &'a str,
        prefix_in_chars: bool,
    ) -> Option<Self>
    where
        S: Copy + PartialEq,
    {
        let (lo, hi) = query.millis_range()?;
        let at_hi = query
            .after
            .as_ref()
            .filter(|c: &&Cursor| c.at.timestamp_millis() == hi)
            .map(|c| c.id.as_str());
        let prefix = query.id_prefix.as_deref().unwrap_or("");
        let len = if prefix_in_chars {
            prefix.chars().count()
        } else {
            prefix.len()
        };
        Some(Self {
            namespace: &query.namespace,
            state,
            lo,
            hi,
            at_hi,
            prefix,
            prefix_len: u32::try_from(len).unwrap_or(u32::MAX),
        })
    }

    /// Whether the walk checks an id prefix (the `_prefix` statements).
    pub(crate) fn has_prefix(&self) -> bool {
        !self.prefix.is_empty()
    }

    /// `prefixed` when the walk has a prefix, else `plain`: which of a listing's two
    /// statements runs.
    pub(crate) fn pick<'s, S: ?Sized>(&self, prefixed: &'s S, plain: &'s S) -> &'s S {
        if self.has_prefix() {
            prefixed
        } else {
            plain
        }
    }

    /// `binds`, then the prefix's length and the prefix when there is one.
    fn with_prefix(&self, mut binds: Vec<Arg<'a>>) -> Vec<Arg<'a>> {
        if self.has_prefix() {
            binds.extend([Arg::Count(self.prefix_len), Arg::Text(self.prefix)]);
        }
        binds
    }

    fn page(&self) -> [Arg<'a>; 4] {
        [
            Arg::Text(self.namespace),
            Arg::Text(self.state),
            Arg::Int(self.lo),
            Arg::Int(self.hi),
        ]
    }

    /// The binds of `list_records`.
    pub(crate) fn records(&self, lease: (i64, i64), limit: usize) -> Vec<Arg<'a>> {
        let mut binds = self.page().to_vec();
        binds.extend([
            Arg::OptText(self.at_hi),
            Arg::Int(lease.0),
            Arg::Int(lease.1),
            Arg::Limit(limit as u64),
        ]);
        self.with_prefix(binds)
    }

    /// The binds of `count_records`.
    pub(crate) fn count_records(&self, lease: (i64, i64)) -> Vec<Arg<'a>> {
        let mut binds = self.page().to_vec();
        binds.extend([Arg::Int(lease.0), Arg::Int(lease.1)]);
        self.with_prefix(binds)
    }

    /// The binds of `list_events`.
    pub(crate) fn events(&self, limit: usize) -> Vec<Arg<'a>> {
        let mut binds = self.page().to_vec();
        binds.extend([Arg::OptText(self.at_hi), Arg::Limit(limit as u64)]);
        self.with_prefix(binds)
    }

    /// The binds of `count_events`.
    pub(crate) fn count_events(&self) -> Vec<Arg<'a>> {
        self.with_prefix(self.page().to_vec())
    }
}

/// The bounds on `lease_until` of a listed state, exclusive below and inclusive
/// above: a live lease ends after `now`, a stuck one at or before it.
pub(crate) fn lease_bounds(state: ListState, now_ms: i64) -> (i64, i64) {
    match state {
        ListState::InProgress => (now_ms, i64::MAX),
        ListState::Stuck => (i64::MIN, now_ms),
        _ => (i64::MIN, i64::MAX),
    }
}

/// Implements [`ListingStore`](crate::store::ListingStore) and
/// [`InboxListing`](crate::inbox::InboxListing) for `$store` (as
/// `sql_store_impls!` takes it), on the statements of its `sql.common`.
macro_rules! sql_listing_impls {
    ($store:ty, $feature:literal, $err:path) => {
        const _: () = {
            use ::chrono::{DateTime, Utc};
            use $crate::inbox::listing::ALL_STATES;
            use $crate::inbox::{InboxEvent, InboxListing};
            use $crate::store::listing::{
                merged, Chunk, EventQuery, ListState, ListingStore, Page, RecordQuery,
            };
            use $crate::store::sql::listing::{lease_bounds, Walk};
            use $crate::store::sql::{args, keyed_record, RawEvent, SqlRow};
            use $crate::store::{Key, Record, StoreError};

            fn count_of(row: Option<impl SqlRow>) -> Result<u64, StoreError> {
                let n = match row {
                    Some(row) => row.bigint(0).map_err($err)?,
                    None => 0,
                };
                Ok(u64::try_from(n).unwrap_or(0))
            }

            #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
            #[::async_trait::async_trait]
            impl ListingStore for $store {
                async fn list_records(
                    &self,
                    query: &RecordQuery,
                ) -> Result<Page<Record>, StoreError> {
                    let c = &self.sql.common;
                    let now = query.now.timestamp_millis();
                    let limit = query.page_size();
                    merged(query, &ListState::ALL, |state| async move {
                        let name = state.record_state().as_str();
                        let Some(walk) = Walk::new(query, name, c.prefix_in_chars) else {
                            return Ok(Chunk::whole(Vec::new()));
                        };
                        let binds = walk.records(lease_bounds(state, now), limit);
                        let stmt = walk.pick(&c.list_records_prefix, &c.list_records);
                        let rows = self.fetch_all(stmt, &binds).await?;
                        let records = rows.iter().map(|row| keyed_record(row, $err));
                        Ok(Chunk::whole(records.collect::<Result<_, _>>()?))
                    })
                    .await
                }

                async fn count_records(&self, query: &RecordQuery) -> Result<u64, StoreError> {
                    let c = &self.sql.common;
                    let now = query.now.timestamp_millis();
                    let mut all = query.clone();
                    all.after = None;
                    let mut n = 0;
                    for state in all.states_or(&ListState::ALL) {
                        let name = state.record_state().as_str();
                        let Some(walk) = Walk::new(&all, name, c.prefix_in_chars) else {
                            return Ok(0);
                        };
                        let binds = walk.count_records(lease_bounds(state, now));
                        let stmt = walk.pick(&c.count_records_prefix, &c.count_records);
                        n += count_of(self.fetch_optional(stmt, &binds).await?)?;
                    }
                    Ok(n)
                }
            }

            #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
            #[::async_trait::async_trait]
            impl InboxListing for $store {
                async fn list_events(
                    &self,
                    query: &EventQuery,
                ) -> Result<Page<InboxEvent>, StoreError> {
                    let c = &self.sql.common;
                    let limit = query.page_size();
                    merged(query, &ALL_STATES, |state| async move {
                        let Some(walk) = Walk::new(query, state.as_str(), c.prefix_in_chars) else {
                            return Ok(Chunk::whole(Vec::new()));
                        };
                        let stmt = walk.pick(&c.list_events_prefix, &c.list_events);
                        let rows = self.fetch_all(stmt, &walk.events(limit)).await?;
                        let events = rows
                            .iter()
                            .map(|row| RawEvent::read(row, 0).map_err($err)?.into_event());
                        Ok(Chunk::whole(events.collect::<Result<_, _>>()?))
                    })
                    .await
                }

                async fn count_events(&self, query: &EventQuery) -> Result<u64, StoreError> {
                    let c = &self.sql.common;
                    let mut all = query.clone();
                    all.after = None;
                    let mut n = 0;
                    for state in all.states_or(&ALL_STATES) {
                        let Some(walk) = Walk::new(&all, state.as_str(), c.prefix_in_chars) else {
                            return Ok(0);
                        };
                        let binds = walk.count_events();
                        let stmt = walk.pick(&c.count_events_prefix, &c.count_events);
                        n += count_of(self.fetch_optional(stmt, &binds).await?)?;
                    }
                    Ok(n)
                }

                async fn requeue_dead(
                    &self,
                    key: Key<'_>,
                    now: DateTime<Utc>,
                ) -> Result<bool, StoreError> {
                    let _gate = self.write_gate().await?;
                    let binds = args::key_at(key, now);
                    Ok(self.execute(&self.sql.common.requeue_dead, &binds).await? == 1)
                }

                async fn purge_dead(&self, key: Key<'_>) -> Result<bool, StoreError> {
                    let _gate = self.write_gate().await?;
                    let binds = args::key(key);
                    Ok(self.execute(&self.sql.common.purge_dead, &binds).await? == 1)
                }
            }
        };
    };
}

pub(crate) use sql_listing_impls;
