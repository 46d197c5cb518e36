//! The ordering ledger of a [`RedisStore`], each change one Lua script.
//!
//! The key layout, the scripts' shape and the trade-offs are documented with the
//! store, in [`crate::store::redis`].

use ::redis::Value;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::codec::{array, bytes, corrupt, int, millis, time};
use super::connection::Eval;
use super::RedisStore;
use crate::ordering::{
    FailedMark, FailedPage, Freshness, ObjectKey, ObjectMark, ObjectRecord, ObjectStatus,
    Observation, OrderingStore,
};
use crate::store::StoreError;

impl RedisStore {
    /// Runs the settle script in `mode`.
    async fn object_status(
        &self,
        key: ObjectKey<'_>,
        created_at: DateTime<Utc>,
        status: ObjectStatus,
        now: DateTime<Utc>,
        mode: Mode,
    ) -> Result<bool, StoreError> {
        let (record, failed, member) = self.object_keys(key);
        let (mode, since) = match mode {
            Mode::Settle => ("settle", 0),
            Mode::Mark => ("mark", 0),
            Mode::IfFailed { failed_since } => ("if_failed", millis(failed_since)),
        };
        let mut inv = Eval::new(&SCRIPTS.settle_object, 2);
        inv.key(record)
            .key(failed)
            .arg(millis(created_at))
            .arg(status.as_str())
            .arg(millis(now))
            .arg(member)
            .arg(mode)
            .arg(since);
        let settled: i64 = self.eval(&inv).await?;
        Ok(settled == 1)
    }

    fn object_keys(&self, key: ObjectKey<'_>) -> (String, String, String) {
        let tag = self.shard_tag(self.shard_for(&[key.namespace, key.object, key.family]));
        let member = object_member(key.object, key.family);
        let records = object_prefix(&tag, key.namespace);
        (
            format!("{records}{member}"),
            format!("{tag}:failed:{}", key.namespace),
            member,
        )
    }
}

fn object_prefix(tag: &str, namespace: &str) -> String {
    format!("{tag}:o:{}:{namespace}", namespace.len())
}

fn object_member(object: &str, family: &str) -> String {
    format!("{}:{object}{family}", object.len())
}

/// Splits [`object_member`].
fn split_member(member: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(member).ok()?;
    let (len, rest) = text.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let object = rest.get(..len)?;
    let family = rest.get(len..)?;
    Some((object.to_owned(), family.to_owned()))
}

/// How the settle script ([`Scripts::settle_object`]) changes an object's status.
#[derive(Clone, Copy)]
enum Mode {
    /// [`OrderingStore::settle_object`].
    Settle,
    /// [`OrderingStore::mark_object`].
    Mark,
    /// [`OrderingStore::mark_object_if_failed`].
    IfFailed { failed_since: DateTime<Utc> },
}

scripts!(Scripts {
    /// Observe: KEYS record, failed; ARGV created_at, now, member. Answers nil (fresh)
    /// or the stored newest (stale). A tie with the stored newest is fresh and changes
    /// nothing.
    observe: include_str!("lua/ordering/observe.lua"),
    /// Settle an object: KEYS record, failed; ARGV created_at, status, now, member, the
    /// mode (`settle`; `mark` to set the status whatever it was; `if_failed` to set it
    /// only over a failure recorded at or before `ARGV[6]`), and that time. Answers 1 when
    /// it set it as the first settle (or a mark); 0 otherwise, having set
    /// `failed` over a status another event of the same time settled first.
    settle_object: include_str!("lua/ordering/settle_object.lua"),
    /// Failed records of one shard and namespace: KEYS failed; ARGV before, limit,
    /// record key prefix. Answers member, newest, updated_at, … oldest failure first.
    failed: include_str!("lua/ordering/failed.lua"),
});

#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[async_trait]
impl OrderingStore for RedisStore {
    async fn observe(&self, event: &Observation<'_>) -> Result<Freshness, StoreError> {
        let (key, created_at, now) = (event.key, event.created_at, event.now);
        let (record, failed, member) = self.object_keys(key);
        let mut inv = Eval::new(&SCRIPTS.observe, 2);
        inv.key(record)
            .key(failed)
            .arg(millis(created_at))
            .arg(millis(now))
            .arg(member);
        let newest: Option<i64> = self.eval(&inv).await?;
        Ok(match newest {
            None => Freshness::Fresh,
            Some(ms) => Freshness::Stale { newest: time(ms) },
        })
    }

    async fn settle_object(&self, mark: &ObjectMark<'_>) -> Result<bool, StoreError> {
        self.object_status(
            mark.key,
            mark.created_at,
            mark.status,
            mark.now,
            Mode::Settle,
        )
        .await
    }

    async fn mark_object(&self, mark: &ObjectMark<'_>) -> Result<bool, StoreError> {
        self.object_status(mark.key, mark.created_at, mark.status, mark.now, Mode::Mark)
            .await
    }

    async fn mark_object_if_failed(&self, mark: &FailedMark<'_>) -> Result<bool, StoreError> {
        let mode = Mode::IfFailed {
            failed_since: mark.failed_since,
        };
        self.object_status(mark.key, mark.created_at, mark.status, mark.now, mode)
            .await
    }

    async fn get_object(&self, key: ObjectKey<'_>) -> Result<Option<ObjectRecord>, StoreError> {
        let (record, _, _) = self.object_keys(key);
        let (newest, status, updated): (Option<i64>, Option<String>, Option<i64>) = self
            .query(::redis::cmd("HMGET").arg(record).arg("n").arg("s").arg("u"))
            .await?;
        let Some(newest) = newest else {
            return Ok(None);
        };
        let status = status
            .as_deref()
            .and_then(ObjectStatus::parse)
            .ok_or_else(|| corrupt("object status"))?;
        let updated = updated.ok_or_else(|| corrupt("object updated_at"))?;
        Ok(Some(ObjectRecord::new(
            key,
            time(newest),
            status,
            time(updated),
        )))
    }

    /// Visits every shard (one round trip each); answers the oldest failures first.
    async fn failed_objects(&self, page: &FailedPage<'_>) -> Result<Vec<ObjectRecord>, StoreError> {
        let (namespace, before, limit) = (page.namespace, page.before, page.limit);
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        for shard in 0..self.shards() {
            let tag = self.shard_tag(shard);
            let mut inv = Eval::new(&SCRIPTS.failed, 1);
            // Bounded so that the script's number prints as an integer (a limit
            // such as `usize::MAX` would reach the server as `9.2e+18`, refused).
            inv.key(format!("{tag}:failed:{namespace}"))
                .arg(millis(before))
                .arg(limit.min(i32::MAX as usize))
                .arg(object_prefix(&tag, namespace));
            let answer: Value = self.eval(&inv).await?;
            for triple in array(answer)?.chunks(3) {
                let [m, n, u] = triple else {
                    return Err(corrupt("unexpected failed answer"));
                };
                let (object, family) = bytes(m)
                    .and_then(split_member)
                    .ok_or_else(|| corrupt("object member"))?;
                let newest = int(n).ok_or_else(|| corrupt("object newest"))?;
                let updated = int(u).ok_or_else(|| corrupt("object updated_at"))?;
                let key = ObjectKey {
                    namespace,
                    object: &object,
                    family: &family,
                };
                out.push(ObjectRecord::new(
                    key,
                    time(newest),
                    ObjectStatus::Failed,
                    time(updated),
                ));
            }
        }
        out.sort_by_key(|r| r.updated_at);
        out.truncate(limit);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_members_split_unambiguously() {
        for (o, f) in [("trx-1", "charge"), ("a:b", "c"), ("", "x"), ("12:3", "")] {
            let m = object_member(o, f);
            assert_eq!(split_member(m.as_bytes()), Some((o.into(), f.into())));
        }
        assert_ne!(object_member("ab", "c"), object_member("a", "bc"));
    }
}
