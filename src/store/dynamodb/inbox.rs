//! The inbox of a [`DynamoDbStore`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{codec, item_pk, millis, n, s, DynamoDbStore, Expr, Write};
use crate::inbox::{
    Enqueued, InboxEvent, InboxState, InboxStore, LeaseRequest, NewEvent, RenewLease, Settle,
};
use crate::store::{ceil_millis, Fence, FencingToken, Holder, Key, StoreError};

const SETTLED: [InboxState; 3] = [InboxState::Done, InboxState::Dead, InboxState::Skipped];

/// `#state IN (:done, :dead, :skipped)`.
fn settled_condition(e: &mut Expr) -> String {
    let states: Vec<String> = (SETTLED.iter())
        .map(|state| e.v(state.as_str(), s(state.as_str())))
        .collect();
    format!("{} IN ({})", e.n("state"), states.join(", "))
}

/// `#state = :running AND #token = :token`: the fence of a settle and a renewal.
fn fence(e: &mut Expr, token: FencingToken) -> String {
    format!(
        "{} AND {}",
        e.eq("state", "running", s(InboxState::Running.as_str())),
        e.eq("token", "token", n(token.0)),
    )
}

#[async_trait]
impl InboxStore for DynamoDbStore {
    async fn enqueue(&self, event: &NewEvent<'_>) -> Result<Enqueued, StoreError> {
        let pk = item_pk('e', event.key)?;
        let item = codec::event_item(&InboxEvent::accepted(event), &pk);
        let mut e = Expr::default();
        let settled = settled_condition(&mut e);
        let condition = format!(
            "attribute_not_exists({}) OR ({settled} AND {} <= {})",
            e.n("pk"),
            e.n("expires_at"),
            e.v("now", n(millis(event.now))),
        );
        let sent = match self.put_if(item, &condition, e).await? {
            Write::Done(()) => return Ok(Enqueued::Inserted),
            Write::Refused(sent) => sent,
        };
        let found = match sent {
            Some(item) if !item.is_empty() => Some(item),
            _ => self.get_item(&pk).await?,
        };
        match found {
            Some(item) => {
                let stored = codec::event(&item)?;
                Ok(Enqueued::Existing {
                    fingerprint: stored.fingerprint,
                    state: stored.state,
                })
            }
            // Purged between the write and the read: store it now.
            None => Box::pin(self.enqueue(event)).await,
        }
    }

    async fn lease(&self, request: &LeaseRequest<'_>) -> Result<Vec<InboxEvent>, StoreError> {
        let mut out = Vec::new();
        if request.limit == 0 {
            return Ok(out);
        }
        let due_pk = codec::due_events(request.namespace);
        let now_ms = millis(request.now);
        let lease_ms = ceil_millis(request.lease_until);
        let token = FencingToken::random();
        let mut start = None;
        while out.len() < request.limit {
            let (pks, next) = self
                .due_page(&due_pk, now_ms, request.limit - out.len(), start)
                .await?;
            let takes = pks.iter().map(|pk| async move {
                let mut e = Expr::default();
                let (pending, running) = (InboxState::Pending, InboxState::Running);
                let condition = format!(
                    "({st} = {pending} AND {} <= {now}) OR ({st} = {running} AND {lu} <= {now})",
                    e.n("next_attempt_at"),
                    st = e.n("state"),
                    pending = e.v("pending", s(pending.as_str())),
                    running = e.v("running", s(running.as_str())),
                    lu = e.n("lease_until"),
                    now = e.v("now", n(now_ms)),
                );
                let update = format!(
                    "SET {st} = {running}, {} = {}, {at} = {at} + {one}, {lu} = {lease}, {} = {}, {} = {lease}",
                    e.n("token"),
                    e.v("token", n(token.0)),
                    e.n("updated_at"),
                    e.v("now", n(now_ms)),
                    e.n("due_at"),
                    st = e.n("state"),
                    running = e.v("running", s(running.as_str())),
                    at = e.n("attempts"),
                    one = e.v("one", n(1)),
                    lu = e.n("lease_until"),
                    lease = e.v("lease", n(lease_ms)),
                );
                self.update_if(pk, &update, &condition, e).await
            });
            for taken in futures_util::future::join_all(takes).await {
                // Refused: another lease took it, or it changed since it was listed.
                if let Write::Done(item) = taken? {
                    out.push(codec::event(&item)?);
                }
            }
            match next {
                Some(next) => start = Some(next),
                None => break,
            }
        }
        Ok(out)
    }

    async fn settle_event(&self, settle: &Settle<'_>) -> Result<Fence, StoreError> {
        let Holder { key, token } = settle.holder;
        let pk = item_pk('e', key)?;
        let next = ceil_millis(settle.next_attempt_at);
        let expires = ceil_millis(settle.expires_at);
        let now = millis(settle.now);
        let mut e = Expr::default();
        let mut set = vec![
            e.eq("state", "state", s(settle.state.as_str())),
            e.eq("next_attempt_at", "next", n(next)),
            e.eq("updated_at", "now", n(now)),
            e.eq("expires_at", "expires", n(expires)),
        ];
        if let Some(error) = settle.error {
            set.push(e.eq("last_error", "error", s(error)));
        }
        if !settle.attempt_counts {
            // A `Running` event was leased, so it holds at least one attempt.
            let at = e.n("attempts");
            set.push(format!("{at} = {at} - {}", e.v("one", n(1))));
        }
        let mut remove = None;
        if settle.state.is_settled() {
            let shard = self.shard_of(&pk);
            let due_pk = format!("e/settled/{shard}");
            set.push(e.eq("due_pk", "due_pk", s(due_pk)));
            set.push(e.eq("due_at", "expires", n(expires)));
            let ttl = super::ttl_secs(expires, now);
            set.push(e.eq("ttl", "ttl", n(ttl)));
        } else {
            let due_at = if settle.state == InboxState::Running {
                e.n("lease_until")
            } else {
                e.v("next", n(next))
            };
            set.push(format!("{} = {due_at}", e.n("due_at")));
            remove = Some(format!(" REMOVE {}", e.n("ttl")));
        }
        let update = format!("SET {}{}", set.join(", "), remove.unwrap_or_default());
        let condition = fence(&mut e, token);
        match self.update_if(&pk, &update, &condition, e).await? {
            Write::Done(_) => Ok(Fence::Applied),
            Write::Refused(sent) => {
                // The same settle made again (its answer was lost) finds its own change.
                let found = match sent {
                    Some(item) if !item.is_empty() => Some(item),
                    _ => self.get_item(&pk).await?,
                };
                let again = match found {
                    Some(item) => crate::inbox::settled_already(&codec::event(&item)?, settle),
                    None => false,
                };
                Ok(if again {
                    Fence::Applied
                } else {
                    Fence::LeaseLost
                })
            }
        }
    }

    async fn renew_event(&self, renew: &RenewLease<'_>) -> Result<Fence, StoreError> {
        let Holder { key, token } = renew.holder;
        let pk = item_pk('e', key)?;
        let mut e = Expr::default();
        let lease = e.v("lease", n(ceil_millis(renew.lease_until)));
        let update = format!(
            "SET {} = {lease}, {} = {lease}",
            e.n("lease_until"),
            e.n("due_at")
        );
        let condition = fence(&mut e, token);
        Ok(match self.update_if(&pk, &update, &condition, e).await? {
            Write::Done(_) => Fence::Applied,
            Write::Refused(_) => Fence::LeaseLost,
        })
    }

    async fn get_event(&self, key: Key<'_>) -> Result<Option<InboxEvent>, StoreError> {
        let pk = item_pk('e', key)?;
        let item = self.get_item(&pk).await?;
        item.map(|item| codec::event(&item)).transpose()
    }

    async fn purge_settled(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let now_ms = millis(now);
        let condition = |e: &mut Expr| {
            let settled = settled_condition(e);
            format!(
                "{settled} AND {} <= {}",
                e.n("expires_at"),
                e.v("now", n(now_ms))
            )
        };
        let mut removed = 0;
        for shard in 0..self.inner.shards {
            if removed >= limit {
                break;
            }
            let due_pk = format!("e/settled/{shard}");
            removed += self
                .purge_partition(&due_pk, now_ms, limit - removed, &condition)
                .await?;
        }
        Ok(removed as u64)
    }

    fn inbox_listing(&self) -> Option<&dyn crate::inbox::InboxListing> {
        Some(self)
    }
}
