//! Listing a [`DynamoDbStore`].
//!
//! Records: the `list` global secondary index (see the [store's docs](super)),
//! one `Query` per state and shard newest first, merged by
//! [`walk_indexes`](crate::store::listing::walk_indexes), then a `BatchGetItem`
//! of the page's records.
//!
//! Inbox events have no listing index: a page (or a count) reads the whole table
//! with strongly consistent `Scan` calls filtered by
//! `begins_with(pk, "e/<len>/<namespace>/<id prefix>")`, which read — and bill —
//! every item of the table: at a million items of about 1 KB, about a thousand
//! calls and some 250,000 read units per page.
//!
//! Requeue and purge of a dead letter are one conditional write each
//! (`#state = dead`).

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, Select};
use chrono::{DateTime, Utc};

use super::{
    codec, item_pk, millis, n, s, store_error, DynamoDbStore, Expr, Item, Write, LIST_INDEX,
};
use crate::inbox::InboxState;
use crate::store::listing::{
    walked_listing, Below, EachEvent, Entries, EventQuery, EventScan, Fetched, Fetches, IndexEntry,
    IndexWalk, Walk,
};
use crate::store::{Key, Record, StoreError};

impl DynamoDbStore {
    /// Calls `each` with every item whose `pk` starts with `prefix`, reading the
    /// whole table.
    async fn scan_prefix(
        &self,
        prefix: &str,
        mut each: impl FnMut(&Item),
    ) -> Result<(), StoreError> {
        let mut start: Option<Item> = None;
        loop {
            let mut e = Expr::default();
            let filter = format!("begins_with({}, {})", e.n("pk"), e.v("p", s(prefix)));
            let out = (self.inner.client.scan())
                .table_name(&self.inner.table)
                .filter_expression(filter)
                .set_expression_attribute_names(e.names())
                .set_expression_attribute_values(e.values())
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(store_error)?;
            for item in out.items() {
                each(item);
            }
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => return Ok(()),
            }
        }
    }
}

/// `#state = :dead`.
fn is_dead(e: &mut Expr) -> String {
    e.eq("state", "dead", s(InboxState::Dead.as_str()))
}

impl DynamoDbStore {
    /// The `list` partition of source `i` of `walk`.
    fn list_partition(walk: &Walk<'_>, i: usize) -> String {
        let (shard, state) = walk.source(i);
        codec::list_pk(&walk.query.namespace, state, shard)
    }

    /// `Select=COUNT` queries of one `list` partition from `lo` to `below`, page by
    /// page.
    async fn count_partition(
        &self,
        partition: String,
        lo: i64,
        below: &Below,
    ) -> Result<u64, StoreError> {
        let mut total = 0u64;
        let mut start: Option<Item> = None;
        loop {
            let mut e = Expr::default();
            let condition = Self::list_condition(&mut e, &partition, lo, below);
            let out = (self.index_query(LIST_INDEX, condition, &e))
                .select(Select::Count)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(store_error)?;
            total += u64::try_from(out.count).unwrap_or(0);
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => return Ok(total),
            }
        }
    }

    /// The key condition on one `list` partition from the range's start to
    /// `below` (inclusive: the caller drops the entry at `below` itself).
    fn list_condition(e: &mut Expr, partition: &str, lo: i64, below: &Below) -> String {
        let hi = match &below.id {
            Some(id) => codec::list_at(below.ms, id),
            // Every id at `below.ms`: up to the next millisecond's start.
            None => codec::list_at(below.ms.saturating_add(1), ""),
        };
        format!(
            "{} AND {} BETWEEN {} AND {}",
            e.eq("list_pk", "p", s(partition)),
            e.n("list_at"),
            e.v("lo", s(codec::list_at(lo, ""))),
            e.v("hi", s(hi)),
        )
    }
}

#[async_trait]
impl IndexWalk for DynamoDbStore {
    fn index_shards(&self) -> usize {
        usize::from(self.inner.shards)
    }

    /// All `list` partitions asked for queried at once.
    async fn fetch(&self, walk: &Walk<'_>, want: Vec<(usize, Below)>, count: usize) -> Fetches {
        let lo = (walk.query)
            .millis_range()
            .map_or(i64::MIN, |(lo, _)| lo)
            .max(-LIST_MS_LIMIT);
        let queries = want.iter().map(|(i, below)| {
            let partition = Self::list_partition(walk, *i);
            let mut e = Expr::default();
            let condition = Self::list_condition(&mut e, &partition, lo, below);
            (self.index_query(LIST_INDEX, condition, &e))
                .scan_index_forward(false)
                // One more: the entry at `below` itself may come first.
                .limit(i32::try_from(count + 1).unwrap_or(i32::MAX))
                .send()
        });
        let answers = futures_util::future::join_all(queries).await;
        let mut out = Vec::with_capacity(want.len());
        for ((_, below), answer) in want.iter().zip(answers) {
            let answer = answer.map_err(store_error)?;
            let more = answer
                .last_evaluated_key
                .as_ref()
                .is_some_and(|k| !k.is_empty());
            let entries = (answer.items())
                .iter()
                .filter_map(|item| {
                    let (Some(AttributeValue::S(pk)), Some(AttributeValue::S(at))) =
                        (item.get("pk"), item.get("list_at"))
                    else {
                        return None;
                    };
                    let (ms, id) = codec::list_position(at)?;
                    below.admits(ms, id).then(|| IndexEntry {
                        ms,
                        id: id.to_owned(),
                        member: pk.clone(),
                    })
                })
                .collect();
            out.push(Fetched { entries, more });
        }
        Ok(out)
    }

    /// `Select=COUNT` queries of every `list` partition at once, each page by page.
    async fn count_range(&self, walk: &Walk<'_>, lo: i64, hi: i64) -> Result<u64, StoreError> {
        let (lo, hi) = (lo.max(-LIST_MS_LIMIT), hi.min(LIST_MS_LIMIT));
        let below = Below { ms: hi, id: None };
        let partitions = (0..self.index_shards() * walk.states.len())
            .map(|i| self.count_partition(Self::list_partition(walk, i), lo, &below));
        let counts = futures_util::future::join_all(partitions).await;
        counts.into_iter().sum()
    }

    /// One `BatchGetItem` of the page's records.
    async fn records(&self, walk: &Walk<'_>, page: Entries) -> Result<Vec<Record>, StoreError> {
        let pks: Vec<String> = page.iter().map(|(_, e)| e.member.clone()).collect();
        let mut found: HashMap<String, Record> = HashMap::with_capacity(pks.len());
        for item in self.get_many(&pks).await? {
            match codec::record(&item) {
                Ok((r, _)) => {
                    if let Some(AttributeValue::S(pk)) = item.get("pk") {
                        found.insert(pk.clone(), r);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "a record that does not read: not listed"),
            }
        }
        let mut items = Vec::with_capacity(page.len());
        for (source, e) in page {
            let (_, state) = walk.source(source);
            // An entry names its record only while the record is in the entry's
            // state since the entry's time: the index lags the table a little.
            if let Some(r) = found.remove(&e.member) {
                if r.state == state
                    && r.updated_at.timestamp_millis() == e.ms
                    && walk.query.matches(&r)
                {
                    items.push(r);
                }
            }
        }
        Ok(items)
    }
}

/// The earliest and latest `updated_at` (ms from the epoch) the `list` index
/// spells: a range starting before is read from there.
const LIST_MS_LIMIT: i64 = 9_000_000_000_000_000;

/// Every event the query's namespace and prefix select.
#[async_trait]
impl EventScan for DynamoDbStore {
    async fn each_event(&self, query: &EventQuery, each: EachEvent<'_>) -> Result<(), StoreError> {
        let prefix = item_pk(
            'e',
            Key::new(&query.namespace, query.id_prefix.as_deref().unwrap_or("")),
        )?;
        self.scan_prefix(&prefix, |item| match codec::event(item) {
            Ok(ev) => each(ev),
            Err(e) => tracing::warn!(error = %e, "an event that does not read: not listed"),
        })
        .await
    }
}

walked_listing! {
    DynamoDbStore,
    "dynamodb",
    async fn requeue_dead(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let pk = item_pk('e', key)?;
        let mut e = Expr::default();
        let now = e.v("now", n(millis(now)));
        let update = format!(
            "SET {}, {} = {now}, {}, {} = {now}, {}, {} = {now} REMOVE {}",
            e.eq("state", "pending", s(InboxState::Pending.as_str())),
            e.n("next_attempt_at"),
            e.eq("attempts", "zero", n(0)),
            e.n("updated_at"),
            e.eq("due_pk", "due_pk", s(codec::due_events(key.namespace))),
            e.n("due_at"),
            e.n("ttl"),
        );
        let condition = is_dead(&mut e);
        Ok(matches!(
            self.update_if(&pk, &update, &condition, e).await?,
            Write::Done(_)
        ))
    }

    async fn purge_dead(&self, key: Key<'_>) -> Result<bool, StoreError> {
        let pk = item_pk('e', key)?;
        let mut e = Expr::default();
        let condition = is_dead(&mut e);
        Ok(matches!(
            self.delete_if(&pk, &condition, e).await?,
            Write::Done(_)
        ))
    }
}
