//! Listing a [`RedisStore`].
//!
//! Records: the listing indexes, a sorted set per shard, namespace and state
//! scored by `updated_at` (see [Listing](crate::store::redis#listing)), walked by
//! [`walk_indexes`] and merged over the shards; the page's records read with one
//! `MGET` per shard and checked against their entries.
//!
//! Inbox events: an event of a namespace is in its `due` or its `settled` sorted
//! set; a page walks both with `ZSCAN` (`MATCH <id prefix>*`) and reads each event
//! with `HGETALL` (payload included), pipelined per step. Requeue and purge of a
//! dead letter are one script each.

use std::collections::{BTreeMap, HashSet};

use ::redis::Value;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::batch::UnlistJob;
use super::codec::{array, corrupt, millis, record};
use super::connection::{store_error, Eval};
use super::inbox::event;
use super::{list_entry, RedisConnection, RedisStore};
use crate::inbox::{InboxEvent, InboxListing};
use crate::store::listing::{
    count_by_pages, scanned_event_count, scanned_events, walk_indexes, Below, EventQuery,
    EventScan, Fetched, IndexEntry, ListingStore, Page, RecordQuery,
};
use crate::store::{Key, Record, RecordState, StoreError};

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

    /// Calls `each` with every event of the query's namespace whose id starts with
    /// its prefix (once each; one that does not read is skipped, with a warning).
    async fn scan_events(
        &self,
        query: &EventQuery,
        each: &mut (dyn FnMut(InboxEvent) + Send),
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

impl RedisStore {
    /// Sends `cmds`, each on one shard's keys, answering in order: one pipeline on
    /// a standalone server, one per shard (all at once) on a cluster, where a
    /// pipeline stays in one slot.
    async fn send_all(&self, cmds: Vec<(u16, ::redis::Cmd)>) -> Result<Vec<Value>, StoreError> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        if let RedisConnection::Standalone(_) = self.connection() {
            let mut pipe = ::redis::Pipeline::with_capacity(cmds.len());
            for (_, cmd) in cmds {
                pipe.add_command(cmd);
            }
            return self
                .connection()
                .query_pipe(&pipe)
                .await
                .map_err(store_error);
        }
        let mut by_shard: BTreeMap<u16, (Vec<usize>, ::redis::Pipeline)> = BTreeMap::new();
        let n = cmds.len();
        for (i, (shard, cmd)) in cmds.into_iter().enumerate() {
            let (at, pipe) = by_shard.entry(shard).or_default();
            at.push(i);
            pipe.add_command(cmd);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (at, pipe) in by_shard.into_values() {
            let connection = self.connection().clone();
            tasks.spawn(async move {
                let values: Result<Vec<Value>, _> = connection.query_pipe(&pipe).await;
                values.map(|v| (at, v))
            });
        }
        let mut out = vec![Value::Nil; n];
        while let Some(done) = tasks.join_next().await {
            let (at, values) = done
                .map_err(|e| StoreError::backend(format!("redis listing task: {e}")))?
                .map_err(store_error)?;
            for (i, v) in at.into_iter().zip(values) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// Up to `count` entries of each listing index asked for, newest first (see
    /// [`walk_indexes`]).
    async fn fetch_entries(
        &self,
        query: &RecordQuery,
        states: &[RecordState],
        want: Vec<(usize, Below)>,
        count: usize,
    ) -> Result<Vec<Fetched<String>>, StoreError> {
        let lo = match query.millis_range() {
            Some((lo, _)) if lo > i64::MIN => lo.to_string(),
            _ => "-inf".to_owned(),
        };
        let mut cmds = Vec::with_capacity(2 * want.len());
        for (source, below) in &want {
            let (shard, state) = source_of(*source, states);
            let key = self.keys(shard).list(state, &query.namespace);
            if below.id.is_some() {
                // Those in the very millisecond of the position, whole: few.
                let mut ties = ::redis::cmd("ZRANGE");
                ties.arg(&key)
                    .arg(below.ms)
                    .arg(below.ms)
                    .arg("BYSCORE")
                    .arg("REV")
                    .arg("WITHSCORES");
                cmds.push((shard, ties));
            }
            let top = if below.id.is_some() {
                format!("({}", below.ms)
            } else {
                below.ms.to_string()
            };
            let mut older = ::redis::cmd("ZRANGE");
            older
                .arg(&key)
                .arg(top)
                .arg(&lo)
                .arg("BYSCORE")
                .arg("REV")
                .arg("LIMIT")
                .arg(0)
                .arg(count)
                .arg("WITHSCORES");
            cmds.push((shard, older));
        }
        let mut answers = self.send_all(cmds).await?.into_iter();
        let mut out = Vec::with_capacity(want.len());
        for (source, below) in want {
            let (_, state) = source_of(source, states);
            let mut entries = Vec::new();
            if below.id.is_some() {
                let ties = scored(answers.next(), state)?;
                entries.extend(ties.into_iter().filter(|e| below.admits(e.ms, &e.id)));
            }
            let older = scored(answers.next(), state)?;
            let more = older.len() >= count;
            entries.extend(older);
            out.push(Fetched { entries, more });
        }
        Ok(out)
    }
}

/// The shard and state of source `i` of a listing over `states`.
fn source_of(i: usize, states: &[RecordState]) -> (u16, RecordState) {
    let shard = u16::try_from(i / states.len()).unwrap_or(u16::MAX);
    (shard, states[i % states.len()])
}

/// The entries of a `ZRANGE … WITHSCORES` of the listing index of `state`.
fn scored(
    answer: Option<Value>,
    state: RecordState,
) -> Result<Vec<IndexEntry<String>>, StoreError> {
    let pairs: Vec<(String, f64)> = match answer {
        Some(v) => ::redis::from_redis_value(v).map_err(|e| store_error(e.into()))?,
        None => return Err(corrupt("listing answer")),
    };
    Ok(pairs
        .into_iter()
        .map(|(member, score)| {
            // The member is kept where it is not the id: in `in_progress`.
            let (id, member) = if state == RecordState::InProgress {
                let id = member.split('\0').next().unwrap_or_default().to_owned();
                (id, member)
            } else {
                (member, String::new())
            };
            // Scores are whole milliseconds, well within a double's exact range.
            #[allow(clippy::cast_possible_truncation)]
            let ms = score as i64;
            IndexEntry { ms, id, member }
        })
        .collect())
}

#[async_trait]
impl EventScan for RedisStore {
    async fn each_event(
        &self,
        query: &EventQuery,
        each: &mut (dyn FnMut(InboxEvent) + Send),
    ) -> Result<(), StoreError> {
        self.scan_events(query, each).await
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[async_trait]
impl ListingStore for RedisStore {
    async fn list_records(&self, query: &RecordQuery) -> Result<Page<Record>, StoreError> {
        let states = query.record_states();
        let sources = usize::from(self.shards()) * states.len();
        let (entries, next) = walk_indexes(query, sources, |want, count| {
            self.fetch_entries(query, &states, want, count)
        })
        .await?;
        // The page's records: one `MGET` per shard (its keys share a slot).
        let mut by_shard: BTreeMap<u16, ::redis::Cmd> = BTreeMap::new();
        for (source, e) in &entries {
            let (shard, _) = source_of(*source, &states);
            let keys = self.keys(shard);
            (by_shard
                .entry(shard)
                .or_insert_with(|| ::redis::cmd("MGET")))
            .arg(format!("{}{}\0{}", keys.records, query.namespace, e.id));
        }
        let shards: Vec<u16> = by_shard.keys().copied().collect();
        let mut values: BTreeMap<u16, std::vec::IntoIter<Option<String>>> = BTreeMap::new();
        for (shard, v) in shards
            .into_iter()
            .zip(self.send_all(by_shard.into_iter().collect()).await?)
        {
            let got: Vec<Option<String>> =
                ::redis::from_redis_value(v).map_err(|e| store_error(e.into()))?;
            values.insert(shard, got.into_iter());
        }
        let mut items = Vec::with_capacity(entries.len());
        for (source, e) in entries {
            let (shard, state) = source_of(source, &states);
            let key = Key::new(&query.namespace, &e.id);
            let stored = values.get_mut(&shard).and_then(Iterator::next).flatten();
            let found = match stored.as_deref().map(|v| record(key, v)) {
                Some(Ok(r)) => Some(r),
                Some(Err(err)) => {
                    tracing::warn!(namespace = %key.namespace, id = %key.id, error = %err, "a record that does not read: not listed");
                    None
                }
                None => None,
            };
            // An entry names its record as it is only if the record is in the
            // index's state since the entry's time (and, in progress, under the
            // entry's claim); any other entry is stale: skipped.
            let current = found.filter(|r| {
                r.state == state
                    && r.updated_at.timestamp_millis() == e.ms
                    && (state != RecordState::InProgress
                        || e.member == list_entry(&e.id, state, r.token.0))
            });
            match current {
                Some(r) if query.matches(&r) => items.push(r),
                Some(_) => {}
                None if state == RecordState::InProgress => {
                    // It names a claim no record carries any more (tokens are not
                    // used twice): dropping it cannot drop a live claim's entry.
                    self.batcher().unlist(UnlistJob {
                        shard,
                        key: self.keys(shard).list(state, &query.namespace),
                        member: e.member,
                    });
                }
                None => {}
            }
        }
        Ok(Page { items, next })
    }

    async fn count_records(&self, query: &RecordQuery) -> Result<u64, StoreError> {
        let mut all = query.clone();
        all.after = None;
        let Some((lo, hi)) = all.millis_range() else {
            return Ok(0);
        };
        let states = all.record_states();
        if all.id_prefix.is_some() || states.contains(&RecordState::InProgress) {
            // A lease tells live from stuck, and an id prefix is no index range:
            // counted page by page.
            return count_by_pages(self, &all).await;
        }
        let lo = if lo == i64::MIN {
            "-inf".to_owned()
        } else {
            lo.to_string()
        };
        let mut cmds = Vec::new();
        for shard in 0..self.shards() {
            for state in &states {
                let mut zcount = ::redis::cmd("ZCOUNT");
                zcount
                    .arg(self.keys(shard).list(*state, &all.namespace))
                    .arg(&lo)
                    .arg(hi);
                cmds.push((shard, zcount));
            }
        }
        let mut n = 0u64;
        for v in self.send_all(cmds).await? {
            let c: u64 = ::redis::from_redis_value(v).map_err(|e| store_error(e.into()))?;
            n += c;
        }
        Ok(n)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[async_trait]
impl InboxListing for RedisStore {
    async fn list_events(&self, query: &EventQuery) -> Result<Page<InboxEvent>, StoreError> {
        scanned_events(self, query).await
    }

    async fn count_events(&self, query: &EventQuery) -> Result<u64, StoreError> {
        scanned_event_count(self, query).await
    }

    async fn requeue_dead(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<bool, StoreError> {
        self.dead_letter(&SCRIPTS.requeue, key, Some(now)).await
    }

    async fn purge_dead(&self, key: Key<'_>) -> Result<bool, StoreError> {
        self.dead_letter(&SCRIPTS.purge_dead, key, None).await
    }
}
