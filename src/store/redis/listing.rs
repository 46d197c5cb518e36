//! Listing a [`RedisStore`]: a `ZSCAN` of the indexes the store keeps anyway.
//!
//! Records: every record of a shard has an entry `<namespace>\0<id>` in the
//! shard's due index (see [`crate::store::redis`]). A page (or a count) walks the
//! due index of every shard with `ZSCAN … MATCH <namespace>\0<id prefix>* COUNT
//! 1000`, reads the records it names with one pipeline of `GET`s per step, and
//! keeps the newest matches. There is no index by `updated_at`: every entry of
//! every shard is visited per page, whatever the page size. At a million records
//! (16 shards) that is about a thousand `ZSCAN` round trips, each entry of the
//! namespace read whole (`GET`), a few seconds of server time spread over many
//! short commands (no command holds the server for long). The claim and finish
//! paths are unchanged.
//!
//! Inbox events: an event of a namespace is in its `due` or its `settled` sorted
//! set; a page walks both with `ZSCAN` (`MATCH <id prefix>*`) and reads each event
//! with `HGETALL` (payload included), pipelined per step. Requeue and purge of a
//! dead letter are one script each.

use std::collections::HashSet;

use ::redis::Value;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::codec::{array, millis, record};
use super::connection::{store_error, Eval};
use super::inbox::event;
use super::RedisStore;
use crate::inbox::{InboxEvent, InboxListing};
use crate::store::listing::{EventQuery, ListingStore, Newest, Page, RecordQuery};
use crate::store::{Key, Record, StoreError};

/// How many index entries one `ZSCAN` step asks for.
const SCAN_COUNT: usize = 1000;

scripts!(Scripts {
    /// Requeue a dead letter: KEYS event, due, settled; ARGV id, now. Answers 1
    /// (requeued) or 0 (not dead).
    requeue: include_str!("lua/listing/requeue.lua"),
    /// Purge a dead letter: KEYS event, due, settled; ARGV id. Answers 1 (removed)
    /// or 0 (not dead).
    purge_dead: include_str!("lua/listing/purge_dead.lua"),
});

/// Appends `text` to a `MATCH` pattern, its glob characters escaped.
fn push_literal(pattern: &mut String, text: &str) {
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
}

impl RedisStore {
    /// One `ZSCAN` step of `index`: the next cursor and the members.
    async fn zscan(
        &self,
        index: &str,
        cursor: &str,
        pattern: &str,
    ) -> Result<(String, Vec<String>), StoreError> {
        let (next, entries): (String, Vec<String>) = self
            .query(
                ::redis::cmd("ZSCAN")
                    .arg(index)
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT),
            )
            .await?;
        // Member, score, member, score, …
        let members = entries.into_iter().step_by(2).collect();
        Ok((next, members))
    }

    /// Calls `each` with every record of the query's namespace whose id starts with
    /// its prefix (once each; a record that does not read is skipped, with a
    /// warning).
    async fn scan_records(
        &self,
        query: &RecordQuery,
        mut each: impl FnMut(Record),
    ) -> Result<(), StoreError> {
        let mut pattern = String::new();
        push_literal(&mut pattern, &query.namespace);
        pattern.push('\0');
        push_literal(&mut pattern, query.id_prefix.as_deref().unwrap_or(""));
        pattern.push('*');
        for shard in 0..self.shards() {
            let keys = self.keys(shard);
            let mut seen = HashSet::new();
            let mut cursor = "0".to_owned();
            loop {
                let (next, members) = self.zscan(&keys.due, &cursor, &pattern).await?;
                let members: Vec<String> = members
                    .into_iter()
                    .filter(|m| seen.insert(m.clone()))
                    .collect();
                if !members.is_empty() {
                    let mut pipe = ::redis::pipe();
                    for m in &members {
                        pipe.cmd("GET").arg(format!("{}{m}", keys.records));
                    }
                    let values: Vec<Option<String>> = self
                        .connection()
                        .query_pipe(&pipe)
                        .await
                        .map_err(store_error)?;
                    for (m, v) in members.iter().zip(values) {
                        let Some(v) = v else { continue };
                        let key = Key::split_joined(m);
                        match record(key, &v) {
                            Ok(r) => each(r),
                            Err(e) => {
                                tracing::warn!(namespace = %key.namespace, id = %key.id, error = %e, "a record that does not read: not listed");
                            }
                        }
                    }
                }
                if next == "0" {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
    }

    /// Calls `each` with every event of the query's namespace whose id starts with
    /// its prefix (once each; one that does not read is skipped, with a warning).
    async fn scan_events(
        &self,
        query: &EventQuery,
        mut each: impl FnMut(InboxEvent),
    ) -> Result<(), StoreError> {
        let keys = self.inbox_keys(&query.namespace);
        let mut pattern = String::new();
        push_literal(&mut pattern, query.id_prefix.as_deref().unwrap_or(""));
        pattern.push('*');
        let mut seen = HashSet::new();
        for index in [&keys.due, &keys.settled] {
            let mut cursor = "0".to_owned();
            loop {
                let (next, ids) = self.zscan(index, &cursor, &pattern).await?;
                let ids: Vec<String> = ids.into_iter().filter(|m| seen.insert(m.clone())).collect();
                if !ids.is_empty() {
                    let mut pipe = ::redis::pipe();
                    for id in &ids {
                        pipe.cmd("HGETALL").arg(format!("{}{id}", keys.events));
                    }
                    let values: Vec<Value> = self
                        .connection()
                        .query_pipe(&pipe)
                        .await
                        .map_err(store_error)?;
                    for (id, v) in ids.iter().zip(values) {
                        let fields = match v {
                            Value::Map(map) => map.into_iter().flat_map(|(k, v)| [k, v]).collect(),
                            other => array(other)?,
                        };
                        if fields.is_empty() {
                            continue;
                        }
                        match event(Key::new(&query.namespace, id), &fields) {
                            Ok(e) => each(e),
                            Err(e) => {
                                tracing::warn!(namespace = %query.namespace, %id, error = %e, "an event that does not read: not listed");
                            }
                        }
                    }
                }
                if next == "0" {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
    }

    /// Runs a dead-letter script on `key`'s event.
    async fn dead_letter(
        &self,
        script: &::redis::Script,
        key: Key<'_>,
        now: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError> {
        let keys = self.inbox_keys(key.namespace);
        let mut inv = Eval::new(script, 3);
        inv.key(format!("{}{}", keys.events, key.id))
            .key(&keys.due)
            .key(&keys.settled)
            .arg(key.id);
        if let Some(now) = now {
            inv.arg(millis(now));
        }
        let done: i64 = self.eval(&inv).await?;
        Ok(done == 1)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[async_trait]
impl ListingStore for RedisStore {
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
        let mut n = 0u64;
        self.scan_records(&all, |r| n += u64::from(all.matches(&r)))
            .await?;
        Ok(n)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[async_trait]
impl InboxListing for RedisStore {
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
        let mut n = 0u64;
        self.scan_events(&all, |e| n += u64::from(all.matches(&e)))
            .await?;
        Ok(n)
    }

    async fn requeue_dead(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<bool, StoreError> {
        self.dead_letter(&SCRIPTS.requeue, key, Some(now)).await
    }

    async fn purge_dead(&self, key: Key<'_>) -> Result<bool, StoreError> {
        self.dead_letter(&SCRIPTS.purge_dead, key, None).await
    }
}
