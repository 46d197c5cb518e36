//! Listing a [`DynamoDbStore`]: a `Scan` of the table, filtered by `pk` prefix.
//!
//! The table has no index by namespace, state and `updated_at` (the `due` index
//! files records by shard and lease end or expiry, not by change time), so a page
//! (or a count) reads the whole table with strongly consistent `Scan` calls
//! filtered by `begins_with(pk, "r/<len>/<namespace>/<id prefix>")` (`e/…` for
//! inbox events), keeps the matches newest first and answers the page. A `Scan`
//! reads — and bills — every item of the table, whatever the filter: at a million
//! records of about 1 KB, about a thousand calls (1 MB each) and some 250,000 read
//! units per page (strongly consistent), seconds to minutes depending on the
//! table's capacity. Fine for a small table or an occasional look; a console over a
//! large table wants a listing index (a sparse global secondary index keyed by
//! `(namespace#state, updated_at#id)`) that this store does not have.
//!
//! Requeue and purge of a dead letter are one conditional write each
//! (`#state = dead`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{codec, item_pk, millis, n, s, store_error, DynamoDbStore, Expr, Item, Write};
use crate::inbox::{InboxEvent, InboxListing, InboxState};
use crate::store::listing::{EventQuery, ListingStore, Newest, Page, RecordQuery};
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

    /// Calls `each` with every record the query's namespace and prefix select (one
    /// that does not read is skipped, with a warning).
    async fn scan_records(
        &self,
        query: &RecordQuery,
        mut each: impl FnMut(Record),
    ) -> Result<(), StoreError> {
        let prefix = item_pk(
            'r',
            Key::new(&query.namespace, query.id_prefix.as_deref().unwrap_or("")),
        )?;
        self.scan_prefix(&prefix, |item| match codec::record(item) {
            Ok((r, _)) => each(r),
            Err(e) => tracing::warn!(error = %e, "a record that does not read: not listed"),
        })
        .await
    }

    /// Calls `each` with every event the query's namespace and prefix select.
    async fn scan_events(
        &self,
        query: &EventQuery,
        mut each: impl FnMut(InboxEvent),
    ) -> Result<(), StoreError> {
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

/// `#state = :dead`.
fn is_dead(e: &mut Expr) -> String {
    format!(
        "{} = {}",
        e.n("state"),
        e.v("dead", s(InboxState::Dead.as_str()))
    )
}

#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
#[async_trait]
impl ListingStore for DynamoDbStore {
    async fn list_records(&self, query: &RecordQuery) -> Result<Page<Record>, StoreError> {
        if query.millis_range().is_none() {
            return Ok(Page::default());
        }
        let mut newest = Newest::new(query.page_size());
        self.scan_records(query, |r| {
            if query.matches(&r) {
                newest.push(r);
            }
        })
        .await?;
        Ok(newest.page())
    }

    async fn count_records(&self, query: &RecordQuery) -> Result<u64, StoreError> {
        let mut all = query.clone();
        all.after = None;
        if all.millis_range().is_none() {
            return Ok(0);
        }
        let mut count = 0u64;
        self.scan_records(&all, |r| count += u64::from(all.matches(&r)))
            .await?;
        Ok(count)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
#[async_trait]
impl InboxListing for DynamoDbStore {
    async fn list_events(&self, query: &EventQuery) -> Result<Page<InboxEvent>, StoreError> {
        if query.millis_range().is_none() {
            return Ok(Page::default());
        }
        let mut newest = Newest::new(query.page_size());
        self.scan_events(query, |e| {
            if query.matches(&e) {
                newest.push(e);
            }
        })
        .await?;
        Ok(newest.page())
    }

    async fn count_events(&self, query: &EventQuery) -> Result<u64, StoreError> {
        let mut all = query.clone();
        all.after = None;
        if all.millis_range().is_none() {
            return Ok(0);
        }
        let mut count = 0u64;
        self.scan_events(&all, |e| count += u64::from(all.matches(&e)))
            .await?;
        Ok(count)
    }

    async fn requeue_dead(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let pk = item_pk('e', key)?;
        let mut e = Expr::default();
        let now = e.v("now", n(millis(now)));
        let update = format!(
            "SET {} = {}, {} = {now}, {} = {}, {} = {now}, {} = {}, {} = {now} REMOVE {}",
            e.n("state"),
            e.v("pending", s(InboxState::Pending.as_str())),
            e.n("next_attempt_at"),
            e.n("attempts"),
            e.v("zero", n(0)),
            e.n("updated_at"),
            e.n("due_pk"),
            e.v("due_pk", s(codec::due_events(key.namespace))),
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
