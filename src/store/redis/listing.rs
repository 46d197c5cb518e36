//! Listing a [`RedisStore`].
//!
//! Records: the listing indexes, a sorted set per shard, namespace and state
//! scored by `updated_at` (see [Listing](crate::store::redis#listing)), walked by
//! [`walk_indexes`](crate::store::listing::walk_indexes) and merged over the
//! shards; the page's records read with one `MGET` per shard and checked against
//! their entries.
//!
//! Inbox events: an event of a namespace is in its `due` or its `settled` sorted
//! set; a page walks both with `ZSCAN` (`MATCH <id prefix>*`) and reads each event
//! with `HGETALL` (payload included), pipelined per step. Requeue and purge of a
//! dead letter are one script each.

use std::collections::{BTreeMap, HashSet};

use ::redis::Value;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::codec::{array, corrupt, millis, record};
use super::connection::{store_error, Eval};
use super::inbox::event;
use super::{list_entry, RedisConnection, RedisStore};
use crate::store::listing::{
    walked_listing, Below, EachEvent, Entries, EventQuery, EventScan, Fetched, Fetches, IndexEntry,
    IndexWalk, Walk,
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
    /// Repair a listing entry found stale: KEYS record, listing index; ARGV the
    /// entry's member, its index's state, its token (in `in_progress`, else empty).
    /// A record in that state (and, in progress, under that claim) has its entry
    /// scored again at its `updated_at` (1); any other entry is removed (0).
    repair: include_str!("lua/listing/repair.lua"),
});

/// A range's lowest score: `-inf` when it has no start.
fn low_score(lo: i64) -> String {
    if lo == i64::MIN {
        "-inf".to_owned()
    } else {
        lo.to_string()
    }
}

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
    /// Repairs a listing entry that does not name its record as it is, atomically
    /// against the record's own writes: scored again at the record's `updated_at`
    /// if the record is in the entry's state (and, in progress, under the entry's
    /// claim), removed otherwise. So an entry a refused native finish moved, one
    /// left by a record the TTL dropped and stored again, and a claim's entry met
    /// before its takeover is applied each end right, and none is listed meanwhile.
    async fn repair(
        &self,
        shard: u16,
        state: RecordState,
        namespace: &str,
        e: &IndexEntry<String>,
    ) -> Result<(), StoreError> {
        let keys = self.keys(shard);
        // In progress, the member is `<id>\0<token>`; in the other states, the id.
        let (member, token) = match state {
            RecordState::InProgress => {
                let token = e.member.rsplit_once('\0').map_or("", |(_, t)| t);
                (e.member.as_str(), token)
            }
            _ => (e.id.as_str(), ""),
        };
        let mut inv = Eval::new(&SCRIPTS.repair, 2);
        inv.key(format!("{}{namespace}\0{}", keys.records, e.id))
            .key(keys.list(state, namespace))
            .arg(member)
            .arg(state.as_str())
            .arg(token);
        let _: i64 = self.eval(&inv).await?;
        Ok(())
    }

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

/// Every event of the query's namespace whose id starts with its prefix, once
/// each (one that does not read is skipped, with a warning).
#[async_trait]
impl EventScan for RedisStore {
    async fn each_event(&self, query: &EventQuery, each: EachEvent<'_>) -> Result<(), StoreError> {
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
}

#[async_trait]
impl IndexWalk for RedisStore {
    fn index_shards(&self) -> usize {
        usize::from(self.shards())
    }

    /// Per index, the entries in the very millisecond of the position (whole) and
    /// up to `count` older ones, all sent at once.
    async fn fetch(&self, walk: &Walk<'_>, want: Vec<(usize, Below)>, count: usize) -> Fetches {
        let lo = low_score(walk.query.millis_range().map_or(i64::MIN, |(lo, _)| lo));
        let mut cmds = Vec::with_capacity(2 * want.len());
        for (source, below) in &want {
            let (shard, state) = walk.source(*source);
            let key = self.keys(shard).list(state, &walk.query.namespace);
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
            let (_, state) = walk.source(source);
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

    /// One `MGET` per shard (its keys share a slot); each stale entry met is then
    /// repaired (see [`RedisStore::repair`]).
    async fn records(&self, walk: &Walk<'_>, page: Entries) -> Result<Vec<Record>, StoreError> {
        let namespace = &walk.query.namespace;
        let mut by_shard: BTreeMap<u16, ::redis::Cmd> = BTreeMap::new();
        for (source, e) in &page {
            let (shard, _) = walk.source(*source);
            let keys = self.keys(shard);
            (by_shard
                .entry(shard)
                .or_insert_with(|| ::redis::cmd("MGET")))
            .arg(format!("{}{namespace}\0{}", keys.records, e.id));
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
        let mut items = Vec::with_capacity(page.len());
        let mut stale = Vec::new();
        for (source, e) in page {
            let (shard, state) = walk.source(source);
            let key = Key::new(namespace, &e.id);
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
                Some(r) if walk.query.matches(&r) => items.push(r),
                Some(_) => {}
                None => stale.push((shard, state, e)),
            }
        }
        for (shard, state, e) in stale {
            if let Err(error) = self.repair(shard, state, namespace, &e).await {
                tracing::debug!(%error, "redis store: repairing a listing entry failed");
            }
        }
        Ok(items)
    }

    /// One `ZCOUNT` per index.
    async fn count_range(&self, walk: &Walk<'_>, lo: i64, hi: i64) -> Result<u64, StoreError> {
        let lo = low_score(lo);
        let mut cmds = Vec::new();
        for shard in 0..self.shards() {
            for state in &walk.states {
                let mut zcount = ::redis::cmd("ZCOUNT");
                zcount
                    .arg(self.keys(shard).list(*state, &walk.query.namespace))
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

walked_listing! {
    RedisStore,
    "redis",
    async fn requeue_dead(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<bool, StoreError> {
        self.dead_letter(&SCRIPTS.requeue, key, Some(now)).await
    }

    async fn purge_dead(&self, key: Key<'_>) -> Result<bool, StoreError> {
        self.dead_letter(&SCRIPTS.purge_dead, key, None).await
    }
}
