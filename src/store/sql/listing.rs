//! Listing on the SQL stores: one walk of the `…_listing` index
//! `(namespace, state, updated_at, id)` per state, merged (see
//! [`merged`](crate::store::listing)).

use crate::inbox::listing::ALL_STATES;
use crate::inbox::InboxState;
use crate::store::listing::{Cursor, ListQuery, ListState};
use crate::store::sql::common::Common;
use crate::store::sql::Arg;

/// The states a SQL listing walks, one table's: the records' [`ListState`] or the
/// inbox's [`InboxState`].
pub(crate) trait Walked: Copy + PartialEq + 'static {
    /// Every state, in the order a query that names none merges them.
    const ALL: &'static [Self];
    /// The state's name in the `state` column.
    fn column(self) -> &'static str;
    /// The bounds on `lease_until` of the state's rows at `now_ms`, exclusive below
    /// and inclusive above; `None` where rows are not told apart by their lease.
    fn lease(self, now_ms: i64) -> Option<(i64, i64)>;
    /// The statements of a page.
    fn list<S>(c: &Common<S>) -> Listing<'_, S>;
    /// The statements of a count.
    fn count<S>(c: &Common<S>) -> Listing<'_, S>;
}

impl Walked for ListState {
    const ALL: &'static [Self] = &Self::ALL;

    fn column(self) -> &'static str {
        self.record_state().as_str()
    }

    /// A live lease ends after `now`, a stuck one at or before it.
    fn lease(self, now_ms: i64) -> Option<(i64, i64)> {
        Some(match self {
            Self::InProgress => (now_ms, i64::MAX),
            Self::Stuck => (i64::MIN, now_ms),
            _ => (i64::MIN, i64::MAX),
        })
    }

    fn list<S>(c: &Common<S>) -> Listing<'_, S> {
        Listing(&c.list_records, &c.list_records_prefix)
    }

    fn count<S>(c: &Common<S>) -> Listing<'_, S> {
        Listing(&c.count_records, &c.count_records_prefix)
    }
}

impl Walked for InboxState {
    const ALL: &'static [Self] = &ALL_STATES;

    fn column(self) -> &'static str {
        self.as_str()
    }

    fn lease(self, _: i64) -> Option<(i64, i64)> {
        None
    }

    fn list<S>(c: &Common<S>) -> Listing<'_, S> {
        Listing(&c.list_events, &c.list_events_prefix)
    }

    fn count<S>(c: &Common<S>) -> Listing<'_, S> {
        Listing(&c.count_events, &c.count_events_prefix)
    }
}

/// A listing statement in its two forms: without the condition on the id prefix,
/// and with it (see [`Common`]).
pub(crate) struct Listing<'s, S>(&'s S, &'s S);

/// One state's walk of a query: its binds (namespace, state, the `updated_at`
/// range, the lease bounds where the state has them, and the prefix's length and
/// text) and which form of a [`Listing`] it runs.
pub(crate) struct Walk<'a> {
    namespace: &'a str,
    state: &'static str,
    lo: i64,
    hi: i64,
    /// The cursor's id when the cursor sits at `hi`.
    at_hi: Option<&'a str>,
    lease: Option<(i64, i64)>,
    prefix: &'a str,
    prefix_len: u32,
}

impl<'a> Walk<'a> {
    /// The walk of `state`'s rows that `query` lists (`None` when its range is
    /// empty), with the prefix's length in characters or in bytes.
    pub(crate) fn new<S: Walked>(
        query: &'a ListQuery<S>,
        state: S,
        prefix_in_chars: bool,
    ) -> Option<Self> {
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
            state: state.column(),
            lo,
            hi,
            at_hi,
            lease: state.lease(query.now.timestamp_millis()),
            prefix,
            prefix_len: u32::try_from(len).unwrap_or(u32::MAX),
        })
    }

    /// The form of `listing` the walk runs: the prefixed one when it has a prefix.
    pub(crate) fn pick<'s, S>(&self, listing: Listing<'s, S>) -> &'s S {
        let Listing(plain, prefixed) = listing;
        if self.prefix.is_empty() {
            plain
        } else {
            prefixed
        }
    }

    /// The binds of a page: namespace, state, the range, the cursor's id at `hi`,
    /// the lease bounds, `limit` and the prefix's (as they apply).
    pub(crate) fn page(&self, limit: usize) -> Vec<Arg<'a>> {
        let mut binds = self.range();
        binds.push(Arg::OptText(self.at_hi));
        binds.extend(self.lease_bounds());
        binds.push(Arg::Limit(limit as u64));
        self.with_prefix(binds)
    }

    /// The binds of a count: as a page's, without the cursor and the limit.
    pub(crate) fn count(&self) -> Vec<Arg<'a>> {
        let mut binds = self.range();
        binds.extend(self.lease_bounds());
        self.with_prefix(binds)
    }

    fn range(&self) -> Vec<Arg<'a>> {
        vec![
            Arg::Text(self.namespace),
            Arg::Text(self.state),
            Arg::Int(self.lo),
            Arg::Int(self.hi),
        ]
    }

    fn lease_bounds(&self) -> impl Iterator<Item = Arg<'a>> {
        self.lease
            .into_iter()
            .flat_map(|(above, upto)| [Arg::Int(above), Arg::Int(upto)])
    }

    /// `binds`, then the prefix's length and the prefix when there is one.
    fn with_prefix(&self, mut binds: Vec<Arg<'a>>) -> Vec<Arg<'a>> {
        if !self.prefix.is_empty() {
            binds.extend([Arg::Count(self.prefix_len), Arg::Text(self.prefix)]);
        }
        binds
    }
}

/// Implements [`ListingStore`](crate::store::ListingStore) and
/// [`InboxListing`](crate::inbox::InboxListing) for `$store` on the sqlx database
/// `$db` (as `sql_store_impls!` takes them), on the statements of its `sql.common`.
macro_rules! sql_listing_impls {
    ($store:ty, $db:ty, $feature:literal, $err:path) => {
        const _: () = {
            use ::chrono::{DateTime, Utc};
            use $crate::inbox::{InboxEvent, InboxListing};
            use $crate::store::listing::{
                merged, Chunk, EventQuery, ListQuery, Listed, ListingStore, Page, RecordQuery,
            };
            use $crate::store::sql::listing::{Walk, Walked};
            use $crate::store::sql::{args, keyed_record, RawEvent, SqlRow};
            use $crate::store::{Key, Record, StoreError};

            type Row = <$db as ::sqlx::Database>::Row;

            fn count_of(row: Option<impl SqlRow>) -> Result<u64, StoreError> {
                let n = match row {
                    Some(row) => row.bigint(0).map_err($err)?,
                    None => 0,
                };
                Ok(u64::try_from(n).unwrap_or(0))
            }

            impl $store {
                /// A page of `query`: one walk per state, merged, each row read
                /// with `read`.
                async fn walk_page<S: Walked, T: Listed>(
                    &self,
                    query: &ListQuery<S>,
                    read: fn(&Row) -> Result<T, StoreError>,
                ) -> Result<Page<T>, StoreError> {
                    let c = &self.sql.common;
                    let limit = query.page_size();
                    merged(query, S::ALL, |state| async move {
                        let Some(walk) = Walk::new(query, state, c.prefix_in_chars) else {
                            return Ok(Chunk::whole(Vec::new()));
                        };
                        let sql = walk.pick(S::list(c));
                        let rows = self.fetch_all(sql, &walk.page(limit)).await?;
                        let items = rows.iter().map(read).collect::<Result<_, _>>()?;
                        Ok(Chunk::whole(items))
                    })
                    .await
                }

                /// How many items `query` lists over all its pages: each state's
                /// count, summed.
                async fn walk_count<S: Walked>(
                    &self,
                    query: &ListQuery<S>,
                ) -> Result<u64, StoreError> {
                    let c = &self.sql.common;
                    let mut all = query.clone();
                    all.after = None;
                    let mut n = 0;
                    for state in all.states_or(S::ALL) {
                        let Some(walk) = Walk::new(&all, state, c.prefix_in_chars) else {
                            return Ok(0);
                        };
                        let sql = walk.pick(S::count(c));
                        n += count_of(self.fetch_optional(sql, &walk.count()).await?)?;
                    }
                    Ok(n)
                }
            }

            #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
            #[::async_trait::async_trait]
            impl ListingStore for $store {
                async fn list_records(
                    &self,
                    query: &RecordQuery,
                ) -> Result<Page<Record>, StoreError> {
                    self.walk_page(query, |row| keyed_record(row, $err)).await
                }

                async fn count_records(&self, query: &RecordQuery) -> Result<u64, StoreError> {
                    self.walk_count(query).await
                }
            }

            #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
            #[::async_trait::async_trait]
            impl InboxListing for $store {
                async fn list_events(
                    &self,
                    query: &EventQuery,
                ) -> Result<Page<InboxEvent>, StoreError> {
                    self.walk_page(query, |row| {
                        RawEvent::read(row, 0).map_err($err)?.into_event()
                    })
                    .await
                }

                async fn count_events(&self, query: &EventQuery) -> Result<u64, StoreError> {
                    self.walk_count(query).await
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
