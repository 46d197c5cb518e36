//! A page of a query from one walk per state on the SQL stores, each walk
//! answering from one ordered index: merged newest first.

use std::future::Future;

use super::{cursor_of, newest_first, Cursor, ListQuery, Listed, Page};
use crate::store::StoreError;

/// What a store's walk of one state's index answered: the items it found, and,
/// when it stopped before the end of the range, the last position it looked at.
#[derive(Debug)]
pub(crate) struct Chunk<T> {
    pub(crate) items: Vec<T>,
    pub(crate) stopped: Option<Cursor>,
}

impl<T> Chunk<T> {
    /// Items found by a walk that went to the end of its range (or to its limit).
    pub(crate) fn whole(items: Vec<T>) -> Self {
        Self {
            items,
            stopped: None,
        }
    }
}

/// A page of `query` from one walk per state, each answering up to `page_size`
/// items newest first from one ordered index: merged, newest first, cut where
/// some walk may still hold older items.
pub(crate) async fn merged<S, T, F, Fut>(
    query: &ListQuery<S>,
    all: &[S],
    mut walk: F,
) -> Result<Page<T>, StoreError>
where
    S: Copy + PartialEq,
    T: Listed,
    F: FnMut(S) -> Fut,
    Fut: Future<Output = Result<Chunk<T>, StoreError>>,
{
    let limit = query.page_size();
    if query.millis_range().is_none() {
        return Ok(Page::default());
    }
    let mut items = Vec::new();
    // The newest position below which some walk has not looked.
    let mut bound: Option<Cursor> = None;
    for state in query.states_or(all) {
        let chunk = walk(state).await?;
        let edge = match (&chunk.stopped, chunk.items.len() >= limit) {
            (Some(stop), _) => Some(stop.clone()),
            (None, true) => chunk.items.last().map(cursor_of),
            (None, false) => None,
        };
        if let Some(edge) = edge {
            bound = Some(bound.map_or(edge.clone(), |b| b.max(edge)));
        }
        items.extend(chunk.items);
    }
    items.sort_by(newest_first);
    if let Some(b) = &bound {
        // Keep what is at or newer than the bound: older items may be preceded by
        // items a walk has not reached yet.
        items.retain(|i| {
            let (at, id) = i.position();
            !b.precedes(at, id)
        });
    }
    let more = items.len() > limit;
    items.truncate(limit);
    let next = if items.len() == limit && (more || bound.is_some()) {
        items.last().map(cursor_of)
    } else {
        bound
    };
    Ok(Page { items, next })
}
