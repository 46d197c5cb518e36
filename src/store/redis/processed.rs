//! The [`ProcessedStore`] of a [`RedisStore`].

use ::redis::{FromRedisValue, Script, ToRedisArgs, Value};
use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::batch;
use super::codec::{
    corrupt, fence, fresh_record, int, millis, own_claim, record, sized, stored_record, text, time,
    ttl,
};
use super::connection::{store_error, Eval};
use super::native;
use super::scripts::SCRIPTS;
use super::{list_entry, RedisStore, BATCH};
use crate::store::{
    ceil_millis, encode_history, Claim, ClaimRequest, Decision, Deleted, Fence, Finish, Holder,
    Key, ProcessedStore, Record, RecordState, Renew, StoreError,
};

#[async_trait]
impl ProcessedStore for RedisStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let (rec, shard) = self.locate_shard(request.key);
        let (now, lease, expires) = (
            millis(request.now),
            ceil_millis(request.lease_until),
            ceil_millis(request.expires_at),
        );
        let (fresh, fresh_ttl) = fresh_record(request);
        // What a finish on the native path expects to find, if this claim stores it.
        let native = &self.inner.native;
        let remembered = native.enabled().then(|| fresh.clone());
        // The record as stored: times in whole milliseconds.
        let acquired = || {
            Claim::Acquired(Record::new(
                request.key,
                RecordState::InProgress,
                request.fingerprint,
                request.token,
                1,
                0,
                time(lease),
                time(expires),
                time(now),
                time(now),
                Vec::new(),
            ))
        };

        // One round trip for a new id and for a duplicate: a native `SET NX GET`
        // stores a new id or answers the record, and the due index learns the member
        // in the same transaction (`ZADD NX`: a duplicate's entry stays as it is),
        // sent with the other claims and finishes of its batch.
        let listed = self
            .keys(shard)
            .list(RecordState::InProgress, request.key.namespace);
        let entry = list_entry(request.key.id, RecordState::InProgress, request.token.0);
        let batcher = self.batcher();
        let stored = batcher
            .claim(batch::ClaimJob {
                shard,
                rec,
                fresh,
                ttl: fresh_ttl,
                lease,
                now,
                listed: listed.clone(),
                entry: entry.clone(),
            })
            .await
            .map_err(store_error)?;
        let Some(stored) = stored else {
            if let Some(fresh) = remembered {
                native.remember(request.token.0, fresh);
            }
            return Ok(acquired());
        };
        let existing = record(request.key, &stored)?;
        if own_claim(&existing, request) {
            if native.enabled() {
                native.remember(request.token.0, stored);
            }
            return Ok(Claim::Acquired(existing));
        }
        if request.decide_on(&existing) == Decision::Keep {
            // The transaction filed this claim's listing entry: no record carries its
            // token.
            batcher.unlist(batch::UnlistJob {
                shard,
                key: listed,
                member: entry,
            });
            return Ok(Claim::Existing(existing));
        }

        // A known record this claim may replace or take over: the script decides
        // again, atomically (the record may have changed since). Rare, so the keys
        // and the fresh record, moved into the batch, are built again.
        let (rec, shard) = self.locate_shard(request.key);
        let (fresh, fresh_ttl) = fresh_record(request);
        let mut inv = Eval::new(&SCRIPTS.claim, 3);
        inv.key(rec.rec())
            .key(&self.keys(shard).due)
            .key(&listed)
            .arg(&fresh)
            .arg(fresh_ttl)
            .arg(rec.member())
            .arg(request.fingerprint.to_hex())
            .arg(request.token.0)
            .arg(now)
            .arg(lease)
            .arg(expires)
            .arg(&self.keys(shard).lists)
            .arg(&entry);
        let answer: Value = self.eval(&inv).await?;
        let remember = |r: &Value| {
            if let (true, Some(r)) = (native.enabled(), text(r)) {
                native.remember(request.token.0, r.to_owned());
            }
        };
        match answer {
            Value::Int(0) => {
                if native.enabled() {
                    native.remember(request.token.0, fresh);
                }
                Ok(acquired())
            }
            Value::Array(v) => match v.as_slice() {
                [Value::Int(1), r] => {
                    let taken = stored_record(request.key, r)?;
                    remember(r);
                    Ok(Claim::Acquired(taken))
                }
                [Value::Int(2), r] => {
                    let existing = stored_record(request.key, r)?;
                    Ok(if own_claim(&existing, request) {
                        remember(r);
                        Claim::Acquired(existing)
                    } else {
                        Claim::Existing(existing)
                    })
                }
                _ => Err(corrupt("unexpected claim answer")),
            },
            _ => Err(corrupt("unexpected claim answer")),
        }
    }

    async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError> {
        let Holder { key, token } = holder;
        let (rec, shard) = self.locate_shard(key);
        let history = if finish.history.is_empty() {
            String::new()
        } else {
            encode_history(finish.history)
        };
        let token = token.0;
        let (now, expires) = (millis(finish.now), ceil_millis(finish.expires_at));
        let state = finish.state.as_str();
        let keys = self.keys(shard);
        let relist = batch::Relist {
            listed: keys.list(RecordState::InProgress, key.namespace),
            entry: list_entry(key.id, RecordState::InProgress, token),
            target: keys.list(finish.state, key.namespace),
            id: key.id.to_owned(),
            now,
        };
        let job = batch::FinishJob {
            shard,
            rec,
            fence: sized(33, format_args!("in_progress|{token}|")),
            head: sized(state.len() + 22, format_args!("{state}|{token}|")),
            tail: sized(
                54 + history.len(),
                format_args!("{}|{expires}|{now}|{history}", finish.failures),
            ),
            ttl: ttl(expires, now),
            expires,
            relist,
        };
        if self.inner.native.enabled() {
            return self.finish_native(token, job).await;
        }
        let finished = self.batcher().finish(job).await.map_err(store_error)?;
        match finished {
            batch::Finished::Applied => Ok(Fence::Applied),
            batch::Finished::LeaseLost => Ok(Fence::LeaseLost),
            batch::Finished::Corrupt => Err(corrupt("record")),
        }
    }

    async fn renew(&self, holder: Holder<'_>, renew: &Renew) -> Result<Fence, StoreError> {
        let Holder { key, token } = holder;
        let (rec, keys) = self.locate(key);
        let mut inv = Eval::new(&SCRIPTS.renew, 2);
        inv.key(rec.rec())
            .key(&keys.due)
            .arg(rec.member())
            .arg(token.0)
            .arg(ceil_millis(renew.lease_until))
            .arg(ceil_millis(renew.expires_at));
        // The renewed record as stored, or 0 (lease lost).
        let answer: Value = self.eval(&inv).await?;
        match answer {
            Value::Int(applied) => Ok(fence(applied)),
            renewed => {
                let renewed = text(&renewed).ok_or_else(|| corrupt("unexpected renew answer"))?;
                if self.inner.native.enabled() {
                    self.inner.native.remember(token.0, renewed.to_owned());
                }
                Ok(Fence::Applied)
            }
        }
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        let (rec, _) = self.locate(key);
        let stored: Option<String> = self.query(::redis::cmd("GET").arg(rec.rec())).await?;
        stored.map(|s| record(key, &s)).transpose()
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        let (rec, keys) = self.locate(key);
        let mut inv = Eval::new(&SCRIPTS.delete, 2);
        inv.key(rec.rec())
            .key(&keys.due)
            .arg(rec.member())
            .arg(millis(now))
            .arg(&keys.lists);
        let answer: i64 = self.eval(&inv).await?;
        Ok(match answer {
            1 => Deleted::Removed,
            2 => Deleted::LeaseHeld,
            _ => Deleted::NotFound,
        })
    }

    /// Removes records expired at `now` through the shards' indexes, at most 256
    /// per script. Records the TTL already dropped count as removed (their index
    /// entries are cleared).
    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let now = millis(now);
        let mut removed = 0;
        for shard in 0..self.inner.shards {
            let mut offset = 0;
            loop {
                let want = (limit - removed).min(BATCH);
                if want == 0 {
                    return Ok(removed as u64);
                }
                let (n, seen, kept): (usize, usize, usize) = self
                    .scan_due(&SCRIPTS.purge, shard, now, want, offset)
                    .await?;
                removed += n.min(want);
                offset += kept;
                if seen < want {
                    break;
                }
            }
        }
        Ok(removed as u64)
    }

    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        // Up to `limit` of each shard, each shard's in the order of its due index;
        // then the `limit` longest-expired of them all.
        let now = millis(now);
        let mut out = Vec::new();
        for shard in 0..self.inner.shards {
            let mut offset = 0;
            let mut found_here = 0;
            loop {
                let want = (limit - found_here).min(BATCH);
                if want == 0 {
                    break;
                }
                let answer: Vec<Value> = self
                    .scan_due(&SCRIPTS.stuck, shard, now, want, offset)
                    .await?;
                let [seen, kept, found @ ..] = answer.as_slice() else {
                    return Err(corrupt("unexpected stuck answer"));
                };
                let seen = int(seen).ok_or_else(|| corrupt("stuck answer"))?;
                offset += int(kept).ok_or_else(|| corrupt("stuck answer"))?;
                for pair in found.chunks(2) {
                    let [m, r] = pair else {
                        return Err(corrupt("unexpected stuck answer"));
                    };
                    let m = text(m).ok_or_else(|| corrupt("member"))?;
                    let key = Key::split_joined(m);
                    if found_here < limit {
                        // One record this crate cannot read fails no scan (the
                        // scripts keep such records in place, for the purge).
                        match stored_record(key, r) {
                            Ok(record) => out.push(record),
                            Err(e) => {
                                tracing::warn!(namespace = %key.namespace, id = %key.id, error = %e, "a stuck record that does not read: skipped");
                            }
                        }
                        found_here += 1;
                    }
                }
                if seen < want as i64 {
                    break;
                }
            }
        }
        out.sort_by_key(|r| r.lease_until);
        out.truncate(limit);
        Ok(out)
    }

    fn record_listing(&self) -> Option<&dyn crate::store::ListingStore> {
        Some(self)
    }
}

impl RedisStore {
    /// A finish on the native path (see the `native` module): `SET … IFEQ` the
    /// record this process stored for `token`, or, when it has none or the record
    /// changed since, the record as read now, if it carries the fence.
    async fn finish_native(&self, token: u64, job: batch::FinishJob) -> Result<Fence, StoreError> {
        let mut expected = self.inner.native.take(token);
        for _ in 0..native::MAX_TRIES {
            let old = match expected.take() {
                Some(old) => old,
                None => {
                    let stored: Option<String> =
                        self.query(::redis::cmd("GET").arg(job.rec.rec())).await?;
                    match stored {
                        Some(old) => old,
                        None => return Ok(Fence::LeaseLost),
                    }
                }
            };
            let Some((new, lease)) = native::finished(&old, &job.fence, &job.head, &job.tail)
                .map_err(|()| corrupt("record"))?
            else {
                return Ok(Fence::LeaseLost);
            };
            let set = batch::SetJob {
                shard: job.shard,
                rec: job.rec.clone(),
                new,
                old,
                ttl: job.ttl,
                refile: (job.expires < lease).then_some(job.expires),
                relist: job.relist.clone(),
            };
            if self.batcher().set_if_eq(set).await.map_err(store_error)? {
                return Ok(Fence::Applied);
            }
        }
        Err(StoreError::backend(format!(
            "redis record: changed between its read and the finish's SET IFEQ, {} times in a row",
            native::MAX_TRIES
        )))
    }

    /// One batch of a scan of `shard`'s due index by the purge or the stuck script:
    /// KEYS due; ARGV now, how many to look for, record key prefix, offset.
    async fn scan_due<T: FromRedisValue>(
        &self,
        script: &Script,
        shard: u16,
        now: i64,
        want: usize,
        offset: impl ToRedisArgs,
    ) -> Result<T, StoreError> {
        let keys = self.keys(shard);
        let mut inv = Eval::new(script, 1);
        inv.key(&keys.due)
            .arg(now)
            .arg(want)
            .arg(&keys.records)
            .arg(offset)
            .arg(&keys.lists);
        self.eval(&inv).await
    }
}
