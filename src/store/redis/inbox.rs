//! The inbox of a [`RedisStore`], each change one Lua script.
//!
//! The key layout, the scripts' shape and the trade-offs are documented with the
//! store, in [`crate::store::redis`].

use std::collections::HashSet;

use ::redis::Value;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::codec::{array, bytes, corrupt, fence, int, millis, text, time};
use super::connection::Eval;
use super::RedisStore;
use crate::inbox::{
    Enqueued, InboxEvent, InboxState, InboxStore, LeaseRequest, NewEvent, RenewLease, Settle,
};
use crate::meta::EventMeta;
use crate::store::{ceil_millis, Fence, FencingToken, Fingerprint, Holder, Key, StoreError};

/// How many events one lease or purge script handles at most.
const BATCH: usize = 256;

pub(super) struct InboxKeys {
    /// The event key prefix: `{…}:e:`.
    pub(super) events: String,
    pub(super) due: String,
    pub(super) settled: String,
    /// The prefix of a lease's receipt: `{…}:lease:`, then the lease's first token.
    receipts: String,
}

impl RedisStore {
    pub(super) fn inbox_keys(&self, namespace: &str) -> InboxKeys {
        // `{`, `}` and `%` escaped: a `}` would end the hash tag early, and the
        // namespace `a}:e:b` would then share keys with the namespace `a` (its id
        // `b}:e:…`). Other namespaces keep their keys as they are.
        let mut escaped = String::with_capacity(namespace.len());
        for c in namespace.chars() {
            match c {
                '%' => escaped.push_str("%25"),
                '{' => escaped.push_str("%7B"),
                '}' => escaped.push_str("%7D"),
                c => escaped.push(c),
            }
        }
        let tag = format!("{{{}:i:{escaped}}}", self.prefix());
        InboxKeys {
            events: format!("{tag}:e:"),
            due: format!("{tag}:due"),
            settled: format!("{tag}:settled"),
            receipts: format!("{tag}:lease:"),
        }
    }

    /// One run of the lease script, handing out events under `tokens` (one per event
    /// wanted): the events, and how many the script leased (those that do not read
    /// included).
    async fn lease_batch(
        &self,
        namespace: &str,
        keys: &InboxKeys,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        tokens: &[u64],
    ) -> Result<(Vec<InboxEvent>, usize), StoreError> {
        let first = tokens.first().copied().unwrap_or_default();
        let mut inv = Eval::new(&SCRIPTS.lease, 2);
        inv.key(&keys.due)
            .key(format!("{}{first}", keys.receipts))
            .arg(millis(now))
            .arg(crate::store::ceil_millis(lease_until))
            .arg(&keys.events);
        for token in tokens {
            inv.arg(*token);
        }
        let answer: Value = self.eval(&inv).await?;
        let answer = array(answer)?;
        let mut out = Vec::with_capacity(answer.len() / 2);
        for pair in answer.chunks(2) {
            let [id, fields] = pair else {
                return Err(corrupt("unexpected lease answer"));
            };
            let id = text(id).ok_or_else(|| corrupt("event id"))?;
            let Value::Array(fields) = fields else {
                return Err(corrupt("unexpected lease answer"));
            };
            // The script has leased every event of its answer: one that does not
            // read must not cost the others their run (they would wait out the
            // lease with an attempt spent). It is left to its lease.
            match event(Key::new(namespace, id), fields) {
                Ok(e) => out.push(e),
                Err(e) => {
                    tracing::warn!(%namespace, %id, error = %e, "a leased event that does not read: skipped");
                }
            }
        }
        Ok((out, answer.len() / 2))
    }

    fn inbox_registry(&self) -> String {
        format!("{{{}:inboxes}}", self.prefix())
    }

    /// Adds `namespace` to the registry `purge_settled` visits, once per process.
    async fn register_inbox(&self, namespace: &str) -> Result<(), StoreError> {
        let known = |set: &HashSet<String>| set.contains(namespace);
        if known(
            &self
                .registered_inboxes()
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        ) {
            return Ok(());
        }
        let _: i64 = self
            .query(
                ::redis::cmd("SADD")
                    .arg(self.inbox_registry())
                    .arg(namespace),
            )
            .await?;
        self.registered_inboxes()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(namespace.to_owned());
        Ok(())
    }
}

fn is_settled_lua() -> &'static str {
    "s == 'done' or s == 'dead' or s == 'skipped'"
}

/// `body` with its `SETTLED` test filled in.
fn settled_test(body: &str) -> String {
    body.replace("SETTLED", is_settled_lua())
}

scripts!(Scripts {
    /// Enqueue: KEYS event, due, settled; ARGV id, now, then the fresh event's hash as
    /// field-value pairs. Answers 1 (inserted) or {state, fingerprint} (existing).
    enqueue: settled_test(include_str!("lua/inbox/enqueue.lua")),
    /// Lease: KEYS due, receipt; ARGV now, lease_until, event key prefix, then one fresh
    /// token per event wanted. Answers id, event hash, id, event hash, … Each taken event
    /// is re-scored at `lease_until`; index entries of events that are gone or settled
    /// are dropped. The ids taken are kept in the receipt (named after the first token)
    /// for as long as the lease, so the same script run again (a cluster connection resends
    /// after a lost reply) answers the events of its first run that it still holds,
    /// instead of leasing others.
    lease: settled_test(include_str!("lua/inbox/lease.lua")),
    /// Settle: KEYS event, due, settled; ARGV id, token, state, next_attempt_at, now,
    /// expires_at, TTL (ms) for a settled state, `0` to give the attempt back (else
    /// `1`), and the error if any. Answers 1 (applied) or 0 (lease lost). Run again (a
    /// cluster connection resends after a lost reply), it finds its own change (state,
    /// token and time) and answers 1 again.
    settle: settled_test(include_str!("lua/inbox/settle.lua")),
    /// Renew: KEYS event, due; ARGV id, token, lease_until. Answers 1 or 0.
    renew: settled_test(include_str!("lua/inbox/renew.lua")),
    /// Purge one batch of a namespace: KEYS settled; ARGV now, limit, event key prefix.
    /// Answers {removed, looked at}. Every entry looked at leaves the range: removed
    /// (with its event, or because the TTL already dropped the event) or re-filed.
    purge: settled_test(include_str!("lua/inbox/purge.lua")),
});

/// An event from its hash, as `HGETALL` answers it (field, value, …).
pub(super) fn event(key: Key<'_>, fields: &[Value]) -> Result<InboxEvent, StoreError> {
    let mut state = None;
    let mut token = None;
    let mut fingerprint = None;
    let (mut attempts, mut lease, mut next, mut received, mut updated, mut expires) =
        (None, None, None, None, None, None);
    let mut last_error = None;
    let mut payload = None;
    let mut meta = EventMeta::default();
    let string = |v: &Value| text(v).map(str::to_owned).ok_or_else(|| corrupt("text"));
    let ms = |v: &Value, name: &str| int(v).map(time).ok_or_else(|| corrupt(name));
    for pair in fields.chunks(2) {
        let [name, value] = pair else {
            return Err(corrupt("odd hash"));
        };
        match bytes(name).unwrap_or_default() {
            b"s" => state = text(value).and_then(InboxState::parse),
            b"t" => token = text(value).and_then(|t| t.parse().ok()).map(FencingToken),
            b"f" => fingerprint = text(value).and_then(Fingerprint::from_hex),
            b"a" => attempts = int(value).and_then(|a| u32::try_from(a).ok()),
            b"l" => lease = Some(ms(value, "lease_until")?),
            b"n" => next = Some(ms(value, "next_attempt_at")?),
            b"r" => received = Some(ms(value, "received_at")?),
            b"u" => updated = Some(ms(value, "updated_at")?),
            b"x" => expires = Some(ms(value, "expires_at")?),
            b"e" => last_error = Some(string(value)?),
            b"p" => payload = bytes(value).map(<[u8]>::to_vec),
            b"mt" => meta.event_type = Some(string(value)?),
            b"mc" => meta.created_at = Some(ms(value, "created_at")?),
            b"mo" => meta.object = Some(string(value)?),
            b"mf" => meta.family = Some(string(value)?),
            _ => {}
        }
    }
    let missing = |name| corrupt(&format!("inbox event without {name}"));
    Ok(InboxEvent {
        namespace: key.namespace.to_owned(),
        id: key.id.to_owned(),
        fingerprint: fingerprint.ok_or_else(|| missing("fingerprint"))?,
        meta,
        payload: payload.ok_or_else(|| missing("payload"))?,
        state: state.ok_or_else(|| missing("state"))?,
        attempts: attempts.ok_or_else(|| missing("attempts"))?,
        token: token.ok_or_else(|| missing("token"))?,
        lease_until: lease.ok_or_else(|| missing("lease_until"))?,
        next_attempt_at: next.ok_or_else(|| missing("next_attempt_at"))?,
        last_error,
        received_at: received.ok_or_else(|| missing("received_at"))?,
        updated_at: updated.ok_or_else(|| missing("updated_at"))?,
        expires_at: expires.ok_or_else(|| missing("expires_at"))?,
    })
}

#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[async_trait]
impl InboxStore for RedisStore {
    async fn enqueue(&self, event: &NewEvent<'_>) -> Result<Enqueued, StoreError> {
        self.register_inbox(event.key.namespace).await?;
        let keys = self.inbox_keys(event.key.namespace);
        let now = millis(event.now);
        let mut inv = Eval::new(&SCRIPTS.enqueue, 3);
        inv.key(format!("{}{}", keys.events, event.key.id))
            .key(&keys.due)
            .key(&keys.settled)
            .arg(event.key.id)
            .arg(now);
        let fields: [(&str, Vec<u8>); 10] = [
            ("s", InboxState::Pending.as_str().into()),
            ("t", b"0".to_vec()),
            ("f", event.fingerprint.to_hex().into_bytes()),
            ("a", b"0".to_vec()),
            ("l", now.to_string().into_bytes()),
            ("n", now.to_string().into_bytes()),
            ("r", now.to_string().into_bytes()),
            ("u", now.to_string().into_bytes()),
            ("x", ceil_millis(event.expires_at).to_string().into_bytes()),
            ("p", event.payload.to_vec()),
        ];
        for (name, value) in fields {
            inv.arg(name).arg(value);
        }
        let meta = event.meta;
        let optional = [
            ("mt", meta.event_type.clone()),
            ("mc", meta.created_at.map(|t| millis(t).to_string())),
            ("mo", meta.object.clone()),
            ("mf", meta.family.clone()),
        ];
        for (name, value) in optional {
            if let Some(value) = value {
                inv.arg(name).arg(value);
            }
        }
        let answer: Value = self.eval(&inv).await?;
        match answer {
            Value::Int(1) => Ok(Enqueued::Inserted),
            Value::Array(v) => match v.as_slice() {
                [s, f] => Ok(Enqueued::Existing {
                    state: text(s)
                        .and_then(InboxState::parse)
                        .ok_or_else(|| corrupt("state"))?,
                    fingerprint: text(f)
                        .and_then(Fingerprint::from_hex)
                        .ok_or_else(|| corrupt("fingerprint"))?,
                }),
                _ => Err(corrupt("unexpected enqueue answer")),
            },
            _ => Err(corrupt("unexpected enqueue answer")),
        }
    }

    async fn lease(&self, request: &LeaseRequest<'_>) -> Result<Vec<InboxEvent>, StoreError> {
        let keys = self.inbox_keys(request.namespace);
        let mut out = Vec::new();
        let mut taken = 0;
        while taken < request.limit {
            let want = (request.limit - taken).min(BATCH);
            let tokens: Vec<u64> = (0..want).map(|_| FencingToken::random().0).collect();
            let (batch, got) = match self
                .lease_batch(
                    request.namespace,
                    &keys,
                    request.now,
                    request.lease_until,
                    &tokens,
                )
                .await
            {
                Ok(batch) => batch,
                // The events of the batches before are leased: handed out, not lost
                // to their leases (fewer than the limit is a lease like any other).
                Err(e) if !out.is_empty() => {
                    tracing::warn!(error = %e, leased = out.len(), "an inbox lease failed part way: handing out what it took");
                    break;
                }
                Err(e) => return Err(e),
            };
            taken += got;
            out.extend(batch);
            if got < want {
                break;
            }
        }
        Ok(out)
    }

    async fn settle_event(&self, settle: &Settle<'_>) -> Result<Fence, StoreError> {
        let Holder { key, token } = settle.holder;
        let keys = self.inbox_keys(key.namespace);
        let now = millis(settle.now);
        let expires = ceil_millis(settle.expires_at);
        let mut inv = Eval::new(&SCRIPTS.settle, 3);
        inv.key(format!("{}{}", keys.events, key.id))
            .key(&keys.due)
            .key(&keys.settled)
            .arg(key.id)
            .arg(token.0)
            .arg(settle.state.as_str())
            .arg(ceil_millis(settle.next_attempt_at))
            .arg(now)
            .arg(expires)
            .arg(expires.saturating_sub(now).max(1))
            .arg(u8::from(settle.attempt_counts));
        if let Some(error) = settle.error {
            inv.arg(error);
        }
        let applied: i64 = self.eval(&inv).await?;
        Ok(fence(applied))
    }

    async fn renew_event(&self, renew: &RenewLease<'_>) -> Result<Fence, StoreError> {
        let Holder { key, token } = renew.holder;
        let keys = self.inbox_keys(key.namespace);
        let mut inv = Eval::new(&SCRIPTS.renew, 2);
        inv.key(format!("{}{}", keys.events, key.id))
            .key(&keys.due)
            .arg(key.id)
            .arg(token.0)
            .arg(ceil_millis(renew.lease_until));
        let applied: i64 = self.eval(&inv).await?;
        Ok(fence(applied))
    }

    async fn get_event(&self, key: Key<'_>) -> Result<Option<InboxEvent>, StoreError> {
        let keys = self.inbox_keys(key.namespace);
        let answer: Value = self
            .query(::redis::cmd("HGETALL").arg(format!("{}{}", keys.events, key.id)))
            .await?;
        let fields = match answer {
            Value::Map(map) => map.into_iter().flat_map(|(k, v)| [k, v]).collect(),
            other => array(other)?,
        };
        if fields.is_empty() {
            return Ok(None);
        }
        event(key, &fields).map(Some)
    }

    /// Visits every namespace in the registry, at most 256 events per script.
    async fn purge_settled(&self, now: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let namespaces: Vec<String> = self
            .query(::redis::cmd("SMEMBERS").arg(self.inbox_registry()))
            .await?;
        let now = millis(now);
        let mut removed = 0usize;
        for namespace in namespaces {
            let keys = self.inbox_keys(&namespace);
            loop {
                let want = (limit - removed).min(BATCH);
                if want == 0 {
                    return Ok(removed as u64);
                }
                let mut inv = Eval::new(&SCRIPTS.purge, 1);
                inv.key(&keys.settled).arg(now).arg(want).arg(&keys.events);
                let (n, seen): (usize, usize) = self.eval(&inv).await?;
                removed += n.min(want);
                if seen < want {
                    break;
                }
            }
        }
        Ok(removed as u64)
    }

    fn inbox_listing(&self) -> Option<&dyn crate::inbox::InboxListing> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease script run twice with the same tokens (as a cluster connection
    /// resends it after a lost reply) answers its first run's events again, and
    /// leases nothing else.
    #[tokio::test]
    async fn a_lease_run_again_answers_its_own_events() {
        let Some(url) = crate::test_server_url("WEBHOOK_GUARD_REDIS_URL") else {
            return;
        };
        let prefix = format!("wg-test-receipt-{:016x}", FencingToken::random().0);
        let store = RedisStore::builder()
            .prefix(&prefix)
            .connect(url.as_str())
            .await
            .expect("connect to Redis");
        let now = DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap();
        let meta = EventMeta::default();
        for id in ["evt_1", "evt_2", "evt_3"] {
            let new = NewEvent {
                key: Key::new("ns", id),
                fingerprint: Fingerprint::of(id.as_bytes()),
                meta: &meta,
                payload: id.as_bytes(),
                now,
                expires_at: now + chrono::TimeDelta::hours(1),
            };
            assert_eq!(store.enqueue(&new).await.unwrap(), Enqueued::Inserted);
        }
        let keys = store.inbox_keys("ns");
        let until = now + chrono::TimeDelta::minutes(5);
        let tokens = [11, 12];
        let (first, taken) = store
            .lease_batch("ns", &keys, now, until, &tokens)
            .await
            .unwrap();
        assert_eq!(taken, 2);
        let (again, _) = store
            .lease_batch("ns", &keys, now, until, &tokens)
            .await
            .unwrap();
        let ids = |events: &[InboxEvent]| -> Vec<(String, u64)> {
            events.iter().map(|e| (e.id.clone(), e.token.0)).collect()
        };
        assert_eq!(first.len(), 2);
        assert_eq!(ids(&again), ids(&first), "the first run's events, again");
        assert_eq!(again.iter().map(|e| e.attempts).max(), Some(1));
        // The third event is still there for the next lease.
        let next = store
            .lease(&LeaseRequest {
                namespace: "ns",
                now,
                lease_until: until,
                limit: 10,
            })
            .await
            .unwrap();
        assert_eq!(next.len(), 1);
        assert!(!ids(&first).iter().any(|(id, _)| *id == next[0].id));

        let pattern = format!("*{prefix}*");
        let stored: Vec<String> = store
            .connection()
            .query(::redis::cmd("KEYS").arg(&pattern))
            .await
            .unwrap();
        assert!(stored.iter().any(|k| k.contains(":lease:11")), "{stored:?}");
        let _: i64 = store
            .connection()
            .query(::redis::cmd("DEL").arg(&stored))
            .await
            .unwrap();
    }
}
