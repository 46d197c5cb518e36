//! The dedup records of a [`DynamoDbStore`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{codec, item_pk, millis, n, s, DynamoDbStore, Expr, Item, Write, PAGE};
use crate::store::{
    ceil_millis, encode_history, Claim, ClaimRequest, Decision, Deleted, Fence, Finish, Holder,
    Key, ProcessedStore, Record, RecordState, Renew, StoreError,
};

/// How many times a claim or renewal decides again after the record changed under
/// it before it gives up (each round means another writer got there first).
const ROUNDS: usize = 16;

/// What a write of a record is conditioned on.
#[derive(Clone, Copy)]
enum Expect {
    /// No item under the key.
    Absent,
    /// The item at this version.
    Version(u64),
}

fn conflict() -> StoreError {
    StoreError::unavailable(std::io::Error::other(
        "webhook-guard: the DynamoDB record kept changing under the claim",
    ))
}

impl DynamoDbStore {
    /// Puts `record` at version `v` if the stored item is as `expect` says: the
    /// stored form of `record` when written, or the item found instead.
    async fn put_record(
        &self,
        pk: &str,
        record: &Record,
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Result<Write<Record>, StoreError> {
        let v = match expect {
            Expect::Absent => 1,
            Expect::Version(v) => v + 1,
        };
        let shard = self.shard_of(pk);
        let item = codec::record_item(record, pk, v, shard, millis(now));
        let mut expr = Expr::default();
        let condition = match expect {
            Expect::Absent => format!("attribute_not_exists({})", expr.n("pk")),
            Expect::Version(v) => expr.eq("v", "v", n(v)),
        };
        let (written, _) = codec::record(&item)?;
        Ok(match self.put_if(item, &condition, expr).await? {
            Write::Done(()) => Write::Done(written),
            Write::Refused(found) => Write::Refused(found),
        })
    }

    /// The item found by a refused write: the one DynamoDB sent back, or read
    /// again when it sent none.
    async fn found(&self, pk: &str, sent: Option<Item>) -> Result<Option<Item>, StoreError> {
        match sent {
            Some(item) if !item.is_empty() => Ok(Some(item)),
            _ => self.get_item(pk).await,
        }
    }
}

#[async_trait]
impl ProcessedStore for DynamoDbStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let pk = item_pk('r', request.key)?;
        let mut next = Record::claimed(request);
        let mut expect = Expect::Absent;
        for _ in 0..ROUNDS {
            let sent = match self.put_record(&pk, &next, expect, request.now).await? {
                Write::Done(written) => return Ok(Claim::Acquired(written)),
                Write::Refused(sent) => sent,
            };
            let Some(item) = self.found(&pk, sent).await? else {
                // Deleted since: claim afresh.
                (next, expect) = (Record::claimed(request), Expect::Absent);
                continue;
            };
            let (existing, v) = codec::record(&item)?;
            // This very claim, sent again by the SDK after a lost reply.
            if request.made(&existing) {
                return Ok(Claim::Acquired(existing));
            }
            next = match request.decide(Some(&existing)) {
                Decision::Keep => return Ok(Claim::Existing(existing)),
                Decision::TakeOver => existing.taken_over(request),
                Decision::Replace => Record::claimed(request),
            };
            expect = Expect::Version(v);
        }
        Err(conflict())
    }

    async fn finish(&self, holder: Holder<'_>, finish: &Finish<'_>) -> Result<Fence, StoreError> {
        let Holder { key, token } = holder;
        let pk = item_pk('r', key)?;
        let expires = ceil_millis(finish.expires_at);
        let now = millis(finish.now);
        let mut e = Expr::default();
        let mut set = vec![
            e.eq("state", "state", s(finish.state.as_str())),
            e.eq("failures", "failures", n(finish.failures)),
            e.eq("expires_at", "expires", n(expires)),
            e.eq("updated_at", "now", n(now)),
            format!("{} = {} + {}", e.n("v"), e.n("v"), e.v("one", n(1))),
            e.eq("ttl", "ttl", n(super::ttl_secs(expires, now))),
        ];
        let shard = self.shard_of(&pk);
        let (due_pk, due_at) = if finish.state == RecordState::InProgress {
            // Not a finish the guard makes; kept listed as a claim would be.
            (format!("r/lease/{shard}"), None)
        } else {
            (format!("r/expiry/{shard}"), Some(expires))
        };
        set.push(e.eq("due_pk", "due_pk", s(due_pk)));
        set.push(format!(
            "{}, {}",
            e.eq(
                "list_pk",
                "list_pk",
                s(codec::list_pk(key.namespace, finish.state, shard))
            ),
            e.eq("list_at", "list_at", s(codec::list_at(now, key.id))),
        ));
        if let Some(due_at) = due_at {
            set.push(e.eq("due_at", "due_at", n(due_at)));
        }
        let mut update = format!("SET {}", set.join(", "));
        if finish.history.is_empty() {
            update.push_str(&format!(" REMOVE {}", e.n("history")));
        } else {
            let history = encode_history(finish.history);
            if history.len() > super::MAX_ITEM_BYTES / 2 {
                return Err(StoreError::backend(
                    super::DynamoDbStoreError::ItemTooLarge {
                        bytes: history.len(),
                    },
                ));
            }
            update = format!("{update}, {}", e.eq("history", "history", s(history)));
        }
        let condition = format!(
            "{} AND {}",
            e.eq("state", "ip", s(RecordState::InProgress.as_str())),
            e.eq("token", "token", n(token.0)),
        );
        Ok(match self.update_if(&pk, &update, &condition, e).await? {
            Write::Done(_) => Fence::Applied,
            Write::Refused(_) => Fence::LeaseLost,
        })
    }

    async fn renew(&self, holder: Holder<'_>, renew: &Renew) -> Result<Fence, StoreError> {
        let Holder { key, token } = holder;
        let pk = item_pk('r', key)?;
        for _ in 0..ROUNDS {
            let Some(item) = self.get_item(&pk).await? else {
                return Ok(Fence::LeaseLost);
            };
            let (mut record, v) = codec::record(&item)?;
            if record.apply_renew(token, renew) == Fence::LeaseLost {
                return Ok(Fence::LeaseLost);
            }
            // No `now` is given: the TTL is measured from the record's last change.
            match self
                .put_record(&pk, &record, Expect::Version(v), record.updated_at)
                .await?
            {
                Write::Done(_) => return Ok(Fence::Applied),
                Write::Refused(_) => continue,
            }
        }
        Err(conflict())
    }

    async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
        let pk = item_pk('r', key)?;
        let item = self.get_item(&pk).await?;
        item.map(|item| codec::record(&item).map(|(r, _)| r))
            .transpose()
    }

    async fn delete(&self, key: Key<'_>, now: DateTime<Utc>) -> Result<Deleted, StoreError> {
        let pk = item_pk('r', key)?;
        for _ in 0..ROUNDS {
            let mut e = Expr::default();
            let condition = format!(
                "attribute_exists({}) AND ({} <> {} OR {} <= {})",
                e.n("pk"),
                e.n("state"),
                e.v("ip", s(RecordState::InProgress.as_str())),
                e.n("lease_until"),
                e.v("now", n(millis(now))),
            );
            let sent = match self.delete_if(&pk, &condition, e).await? {
                Write::Done(()) => return Ok(Deleted::Removed),
                Write::Refused(sent) => sent,
            };
            match self.found(&pk, sent).await? {
                Some(item) if codec::record(&item)?.0.lease_live(now) => {
                    return Ok(Deleted::LeaseHeld)
                }
                // Changed since the delete was refused: try again.
                Some(_) => continue,
                None => return Ok(Deleted::NotFound),
            }
        }
        Err(conflict())
    }

    /// Removes records expired at `now` through the `due` index, each with a
    /// conditional delete (a record changed since it was listed is left alone).
    async fn purge_expired(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let now_ms = millis(now);
        let condition = |e: &mut Expr| {
            format!(
                "{} <= {} AND ({} <> {} OR {} <= {})",
                e.n("expires_at"),
                e.v("now", n(now_ms)),
                e.n("state"),
                e.v("ip", s(RecordState::InProgress.as_str())),
                e.n("lease_until"),
                e.v("now", n(now_ms)),
            )
        };
        let mut removed = 0;
        for shard in 0..self.inner.shards {
            for part in ["expiry", "lease"] {
                if removed >= limit {
                    return Ok(removed as u64);
                }
                let due_pk = format!("r/{part}/{shard}");
                removed += self
                    .purge_partition(&due_pk, now_ms, limit - removed, &condition)
                    .await?;
            }
        }
        Ok(removed as u64)
    }

    /// Up to `limit` stuck records of each shard, read from its `due` partition
    /// oldest first and checked on the table; then the `limit` longest-expired.
    async fn stuck(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Record>, StoreError> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let now_ms = millis(now);
        for shard in 0..self.inner.shards {
            let due_pk = format!("r/lease/{shard}");
            let mut found = 0;
            let mut start = None;
            while found < limit {
                let (pks, next) = self
                    .due_page(&due_pk, now_ms, (limit - found).min(PAGE), start)
                    .await?;
                for item in self.get_many(&pks).await? {
                    match codec::record(&item) {
                        Ok((record, _)) if record.lease_expired(now) && found < limit => {
                            out.push(record);
                            found += 1;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "a stuck record that does not read: skipped");
                        }
                    }
                }
                match next {
                    Some(next) => start = Some(next),
                    None => break,
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
