//! Listing on the stores without a query planner (Redis, DynamoDB): walks of
//! ordered indexes merged over shards and states, and scans of inbox events.

use std::future::Future;

use super::*;

/// What a scan calls with each event it meets.
pub(crate) type EachEvent<'a> = &'a mut (dyn FnMut(InboxEvent) + Send);

/// A store that lists inbox events by scanning them (Redis, DynamoDB).
#[async_trait::async_trait]
pub(crate) trait EventScan: Sync {
    /// Calls `each` with every event of the query's namespace whose id starts
    /// with its prefix, once each.
    async fn each_event(&self, query: &EventQuery, each: EachEvent<'_>) -> Result<(), StoreError>;
}

/// A page of `query` from a scan of every candidate event.
pub(crate) async fn scanned_events(
    store: &impl EventScan,
    query: &EventQuery,
) -> Result<Page<InboxEvent>, StoreError> {
    if query.millis_range().is_none() {
        return Ok(Page::default());
    }
    let mut newest = Newest::new(query.page_size());
    let mut keep = |e: InboxEvent| {
        if query.matches(&e) {
            newest.push(e);
        }
    };
    store.each_event(query, &mut keep).await?;
    Ok(newest.page())
}

/// How many events match `query`, from a scan of every candidate.
pub(crate) async fn scanned_event_count(
    store: &impl EventScan,
    query: &EventQuery,
) -> Result<u64, StoreError> {
    let mut all = query.clone();
    all.after = None;
    if all.millis_range().is_none() {
        return Ok(0);
    }
    let mut n = 0u64;
    let mut count = |e: InboxEvent| n += u64::from(all.matches(&e));
    store.each_event(&all, &mut count).await?;
    Ok(n)
}

/// The newest items a scan has met so far: at most a few pages' worth kept
/// between cuts.
struct Newest<T> {
    found: Vec<T>,
    limit: usize,
}

impl<T: Listed> Newest<T> {
    /// Keeps the `limit` newest (and one more, which tells a next page).
    fn new(limit: usize) -> Self {
        Self {
            found: Vec::new(),
            limit,
        }
    }

    /// Adds `item` (a match of the query).
    fn push(&mut self, item: T) {
        self.found.push(item);
        if self.found.len() >= 4 * self.limit + 4 {
            let kept = page_of_scan(std::mem::take(&mut self.found).into_iter(), self.limit + 1);
            self.found = kept.items;
        }
    }

    /// The page of the `limit` newest items pushed.
    fn page(self) -> Page<T> {
        page_of_scan(self.found.into_iter(), self.limit)
    }
}

/// A position in an index walk: `(updated_at` in milliseconds, id`).
pub(crate) type Position = (i64, String);

/// Where the walk of one index goes on: entries with `ms` before `at.0`, or at
/// `at.0` with an id before `at.1` (every id at `at.0` when `None`).
#[derive(Debug, Clone)]
pub(crate) struct Below {
    pub(crate) ms: i64,
    pub(crate) id: Option<String>,
}

impl Below {
    /// Whether `(ms, id)` lies below this position (the walk is yet to meet it).
    pub(crate) fn admits(&self, ms: i64, id: &str) -> bool {
        ms < self.ms || (ms == self.ms && self.id.as_deref().is_none_or(|b| id < b))
    }
}

/// An entry of a listing index: the position of the record it names, and what
/// else the index holds for it (`M`).
#[derive(Debug, Clone)]
pub(crate) struct IndexEntry<M> {
    pub(crate) ms: i64,
    pub(crate) id: String,
    pub(crate) member: M,
}

/// What one fetch from one index answered: entries newest first, all below the
/// position asked for and at or after the range's start, and whether the index
/// may hold more.
pub(crate) struct Fetched<M> {
    pub(crate) entries: Vec<IndexEntry<M>>,
    pub(crate) more: bool,
}

/// The most index entries one page looks at (an id prefix is checked on each):
/// a walk stops there with a cursor.
const WALK_BUDGET: usize = 20 * MAX_PAGE;

/// The entries of one page of `query` over `sources` ordered indexes (a shard of
/// one state, say), merged newest first, and where the next page starts.
///
/// `fetch` answers, for each `(source, below)` asked, up to `count` entries newest
/// first below that position (and within the query's time range), as one round
/// trip for all of them. The first round asks every source for a share of the page
/// (one and a half times the page over the sources, and three more: 14 of each of
/// 16 shards for a page of 100, so that a second round is rare); later rounds ask, for twice
/// as many, only the sources that may still hold an entry newer than the page's
/// last: a page costs `O(sources × log n + page)` index reads, not a walk of the
/// index. The id prefix is checked on each entry met, up to [`WALK_BUDGET`]
/// entries a page; a walk that stops at that budget answers a cursor where it
/// stopped.
pub(crate) async fn walk_indexes<S, M, F, Fut>(
    query: &ListQuery<S>,
    sources: usize,
    mut fetch: F,
) -> Result<(Vec<(usize, IndexEntry<M>)>, Option<Cursor>), StoreError>
where
    S: Copy + PartialEq,
    F: FnMut(Vec<(usize, Below)>, usize) -> Fut,
    Fut: Future<Output = Result<Vec<Fetched<M>>, StoreError>>,
{
    let limit = query.page_size();
    let Some((_, hi)) = query.millis_range() else {
        return Ok((Vec::new(), None));
    };
    let start = Below {
        ms: hi,
        id: query
            .after
            .as_ref()
            .filter(|c| c.at.timestamp_millis() == hi)
            .map(|c| c.id.clone()),
    };
    let prefix = query.id_prefix.as_deref().unwrap_or("");
    // Per source, where its walk goes on (`None`: at its end).
    let mut at: Vec<Option<Below>> = vec![Some(start); sources];
    let mut found: Vec<(usize, IndexEntry<M>)> = Vec::new();
    let mut count = ((limit.div_ceil(sources.max(1)) * 3).div_ceil(2) + 3).min(limit);
    let mut looked = 0;
    let newest = |a: &(usize, IndexEntry<M>), b: &(usize, IndexEntry<M>)| {
        (b.1.ms, &b.1.id).cmp(&(a.1.ms, &a.1.id))
    };
    while looked < WALK_BUDGET {
        // The page's last entry so far: a source whose walk is past it has
        // nothing the page needs.
        found.sort_by(newest);
        let last = found.get(limit - 1).map(|(_, e)| (e.ms, e.id.clone()));
        let want: Vec<(usize, Below)> = at
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let b = b.as_ref()?;
                let needed = last.as_ref().is_none_or(|(ms, id)| b.admits(*ms, id));
                needed.then(|| (i, b.clone()))
            })
            .collect();
        if want.is_empty() {
            break;
        }
        let answers = fetch(want.clone(), count).await?;
        for ((i, _), got) in want.into_iter().zip(answers) {
            looked += got.entries.len();
            if let Some(e) = got.entries.last() {
                at[i] = Some(Below {
                    ms: e.ms,
                    id: Some(e.id.clone()),
                });
            }
            if !got.more || got.entries.is_empty() {
                at[i] = None;
            }
            found.extend(
                got.entries
                    .into_iter()
                    .filter(|e| e.id.as_bytes().starts_with(prefix.as_bytes()))
                    .map(|e| (i, e)),
            );
        }
        count = (count * 2).min(MAX_PAGE);
    }
    // The newest position below which some walk has not looked.
    let bound: Option<Position> = at
        .iter()
        .flatten()
        .map(|b| (b.ms, b.id.clone().unwrap_or_default()))
        .max();
    found.sort_by(newest);
    if let Some((ms, id)) = &bound {
        // Older entries may be preceded by entries a walk has not reached yet.
        found.retain(|(_, e)| (e.ms, &e.id) >= (*ms, id));
    }
    let more = found.len() > limit;
    found.truncate(limit);
    let next = if found.len() == limit && (more || bound.is_some()) {
        found.last().map(|(_, e)| (e.ms, e.id.clone()))
    } else {
        bound
    };
    let next = next.map(|(ms, id)| Cursor {
        at: DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC),
        id,
    });
    Ok((found, next))
}

/// How many items of `query` a store lists, counted page by page (for what its
/// indexes cannot count: an id prefix, a lease to tell live from stuck).
pub(crate) async fn count_by_pages(
    store: &dyn ListingStore,
    query: &RecordQuery,
) -> Result<u64, StoreError> {
    let mut q = query.clone().limit(MAX_PAGE);
    q.after = None;
    let mut n = 0;
    loop {
        let page = store.list_records(&q).await?;
        n += page.items.len() as u64;
        match page.next {
            Some(next) => q.after = Some(next),
            None => return Ok(n),
        }
    }
}

/// One listing of records over ordered indexes, one per shard and state.
pub(crate) struct Walk<'a> {
    /// What is listed (or counted).
    pub(crate) query: &'a RecordQuery,
    /// The states listed: source `i` is the index of shard `i / states.len()`
    /// and state `states[i % states.len()]`.
    pub(crate) states: Vec<RecordState>,
}

impl Walk<'_> {
    /// The shard and state of source `i`.
    pub(crate) fn source(&self, i: usize) -> (u16, RecordState) {
        let shard = u16::try_from(i / self.states.len()).unwrap_or(u16::MAX);
        (shard, self.states[i % self.states.len()])
    }
}

/// What a walk fetched: per index asked, its entries (see [`walk_indexes`]).
pub(crate) type Fetches = Result<Vec<Fetched<String>>, StoreError>;

/// The entries of a page, each with the source it came from.
pub(crate) type Entries = Vec<(usize, IndexEntry<String>)>;

/// A store whose records are listed by walking ordered indexes, one per shard
/// and state (Redis, DynamoDB).
#[async_trait::async_trait]
pub(crate) trait IndexWalk: Sync {
    /// How many shards the index of each state is cut into.
    fn index_shards(&self) -> usize;

    /// Up to `count` entries of each index asked for, newest first, below the
    /// position asked for and within the query's range (see [`walk_indexes`]).
    async fn fetch(&self, walk: &Walk<'_>, want: Vec<(usize, Below)>, count: usize) -> Fetches;

    /// The records a page's entries name, in the entries' order: those in their
    /// entry's state since the entry's time (an index lags or keeps stale
    /// entries) and matching the query.
    async fn records(&self, walk: &Walk<'_>, page: Entries) -> Result<Vec<Record>, StoreError>;

    /// How many entries the indexes of the walk's states in its namespace hold
    /// from `lo` to `hi` (milliseconds, both included).
    async fn count_range(&self, walk: &Walk<'_>, lo: i64, hi: i64) -> Result<u64, StoreError>;
}

/// A page of `query` from a walk of the store's indexes.
pub(crate) async fn walked_records(
    store: &impl IndexWalk,
    query: &RecordQuery,
) -> Result<Page<Record>, StoreError> {
    let walk = Walk {
        query,
        states: query.record_states(),
    };
    let sources = store.index_shards() * walk.states.len();
    let (entries, next) = walk_indexes(query, sources, |want, count| {
        store.fetch(&walk, want, count)
    })
    .await?;
    let items = store.records(&walk, entries).await?;
    Ok(Page { items, next })
}

/// How many records match `query`: a count of index entries, or page by page
/// where the indexes cannot tell (an id prefix, a lease to tell live from
/// stuck).
pub(crate) async fn walked_count(
    store: &(impl IndexWalk + ListingStore),
    query: &RecordQuery,
) -> Result<u64, StoreError> {
    let mut all = query.clone();
    all.after = None;
    let Some((lo, hi)) = all.millis_range() else {
        return Ok(0);
    };
    let walk = Walk {
        query: &all,
        states: all.record_states(),
    };
    if all.id_prefix.is_some() || walk.states.contains(&RecordState::InProgress) {
        return count_by_pages(store, &all).await;
    }
    store.count_range(&walk, lo, hi).await
}

/// The [`ListingStore`] and [`InboxListing`](crate::inbox::InboxListing) impls of
/// a store that walks indexes for records ([`IndexWalk`]) and scans inbox events
/// ([`EventScan`]); the tokens after the feature are its `requeue_dead` and
/// `purge_dead`.
macro_rules! walked_listing {
    ($store:ty, $feature:literal, $($dead_letters:tt)*) => {
        $crate::store::listing::walked_listing!(@impl $feature, $store,
            $crate::store::listing::ListingStore, $crate::store::listing::RecordQuery,
            $crate::store::Record, list_records, walked_records, count_records, walked_count,);
        $crate::store::listing::walked_listing!(@impl $feature, $store,
            $crate::inbox::InboxListing, $crate::store::listing::EventQuery,
            $crate::inbox::InboxEvent, list_events, scanned_events, count_events,
            scanned_event_count, $($dead_letters)*);
    };
    // One listing trait: a page and a count of its query, and the tokens after.
    (@impl $feature:literal, $store:ty, $listing:path, $query:ty, $item:ty,
        $list:ident, $lister:ident, $count:ident, $counter:ident, $($more:tt)*) => {
        #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
        #[async_trait::async_trait]
        impl $listing for $store {
            async fn $list(
                &self,
                query: &$query,
            ) -> Result<$crate::store::listing::Page<$item>, $crate::store::StoreError> {
                $crate::store::listing::$lister(self, query).await
            }

            async fn $count(&self, query: &$query) -> Result<u64, $crate::store::StoreError> {
                $crate::store::listing::$counter(self, query).await
            }

            $($more)*
        }
    };
}
pub(crate) use walked_listing;

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of any size over several ordered sources read every entry once,
    /// newest first (ties by id), and an id prefix keeps only its entries.
    #[test]
    fn walks_of_several_indexes_merge_into_stable_pages() {
        // Three sources, ties within and across them.
        let sources: Vec<Vec<(i64, String)>> = vec![
            vec![
                (9, "a".into()),
                (5, "c".into()),
                (5, "b".into()),
                (1, "x".into()),
            ],
            vec![(7, "m".into()), (5, "d".into()), (2, "n".into())],
            vec![(5, "a".into()), (3, "y".into())],
        ];
        let mut all: Vec<(i64, String)> = sources.iter().flatten().cloned().collect();
        all.sort_by(|a, b| b.cmp(a));
        let fetch = |want: Vec<(usize, Below)>, count: usize| {
            let out = want
                .into_iter()
                .map(|(i, below)| {
                    let below_all: Vec<_> = sources[i]
                        .iter()
                        .filter(|(ms, id)| below.admits(*ms, id))
                        .collect();
                    let entries: Vec<IndexEntry<()>> = below_all
                        .iter()
                        .take(count)
                        .map(|(ms, id)| IndexEntry {
                            ms: *ms,
                            id: id.clone(),
                            member: (),
                        })
                        .collect();
                    Fetched {
                        more: below_all.len() > entries.len(),
                        entries,
                    }
                })
                .collect();
            std::future::ready(Ok(out))
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let now = DateTime::from_timestamp_millis(100).unwrap();
        for limit in 1..=10 {
            let mut query = RecordQuery::new("n", now).limit(limit);
            let mut seen = Vec::new();
            for _ in 0..100 {
                let (entries, next) = rt
                    .block_on(walk_indexes(&query, sources.len(), fetch))
                    .unwrap();
                assert!(entries.len() <= limit);
                seen.extend(entries.into_iter().map(|(_, e)| (e.ms, e.id)));
                match next {
                    Some(c) => query.after = Some(c),
                    None => break,
                }
            }
            assert_eq!(seen, all, "pages of {limit}");
        }
        let query = RecordQuery::new("n", now).id_prefix("a");
        let (entries, next) = rt
            .block_on(walk_indexes(&query, sources.len(), fetch))
            .unwrap();
        let ids: Vec<_> = entries.into_iter().map(|(i, e)| (i, e.ms, e.id)).collect();
        assert_eq!(ids, [(0, 9, "a".to_owned()), (2, 5, "a".to_owned())]);
        assert_eq!(next, None);
    }
}
