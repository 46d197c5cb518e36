//! Items: records, inbox events and ordering records as DynamoDB stores them.

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use super::{corrupt, millis, n, s, time, Item};
use crate::inbox::{InboxEvent, InboxState};
use crate::meta::EventMeta;
use crate::ordering::{ObjectRecord, ObjectStatus};
use crate::store::{
    ceil_millis, decode_history, encode_history, FencingToken, Fingerprint, Key, Record,
    RecordState, StoreError,
};

/// An upper bound of the size DynamoDB counts for `item`: attribute names plus
/// values (a number counts at most 21 bytes).
pub(super) fn item_size(item: &Item) -> usize {
    item.iter()
        .map(|(name, value)| {
            name.len()
                + match value {
                    AttributeValue::S(text) => text.len(),
                    AttributeValue::N(_) => 21,
                    AttributeValue::B(bytes) => bytes.as_ref().len(),
                    _ => 1,
                }
        })
        .sum::<usize>()
        // Room for DynamoDB's own per-item overhead.
        + 100
}

pub(super) fn text<'i>(item: &'i Item, name: &str) -> Result<&'i str, StoreError> {
    match item.get(name) {
        Some(AttributeValue::S(text)) => Ok(text),
        _ => Err(corrupt(name)),
    }
}

fn opt_text(item: &Item, name: &str) -> Result<Option<String>, StoreError> {
    match item.get(name) {
        None | Some(AttributeValue::Null(_)) => Ok(None),
        Some(AttributeValue::S(text)) => Ok(Some(text.clone())),
        Some(_) => Err(corrupt(name)),
    }
}

pub(super) fn int(item: &Item, name: &str) -> Result<i64, StoreError> {
    match item.get(name) {
        Some(AttributeValue::N(number)) => number.parse().map_err(|_| corrupt(name)),
        _ => Err(corrupt(name)),
    }
}

fn small(item: &Item, name: &str) -> Result<u32, StoreError> {
    u32::try_from(int(item, name)?).map_err(|_| corrupt(name))
}

fn token(item: &Item) -> Result<FencingToken, StoreError> {
    match item.get("token") {
        Some(AttributeValue::N(number)) => {
            Ok(FencingToken(number.parse().map_err(|_| corrupt("token"))?))
        }
        _ => Err(corrupt("token")),
    }
}

fn fingerprint(item: &Item) -> Result<Fingerprint, StoreError> {
    Fingerprint::from_hex(text(item, "fp")?).ok_or_else(|| corrupt("fp"))
}

fn at(item: &Item, name: &str) -> Result<chrono::DateTime<chrono::Utc>, StoreError> {
    Ok(time(int(item, name)?))
}

// ---------------------------------------------------------------------------
// Records

/// The item of `record` under `pk`, with version `v`, filed in the `due` index of
/// `shard`, its `ttl` measured from `now_ms`.
pub(super) fn record_item(record: &Record, pk: &str, v: u64, shard: u16, now_ms: i64) -> Item {
    let lease = ceil_millis(record.lease_until);
    let expires = ceil_millis(record.expires_at);
    let mut item = Item::with_capacity(18);
    item.insert("pk".into(), s(pk));
    item.insert("ns".into(), s(&record.namespace));
    item.insert("id".into(), s(&record.id));
    item.insert("state".into(), s(record.state.as_str()));
    item.insert("token".into(), n(record.token.0));
    item.insert("fp".into(), s(record.fingerprint.to_hex()));
    item.insert("attempts".into(), n(record.attempts));
    item.insert("failures".into(), n(record.failures));
    item.insert("lease_until".into(), n(lease));
    item.insert("expires_at".into(), n(expires));
    item.insert("created_at".into(), n(millis(record.created_at)));
    item.insert("updated_at".into(), n(millis(record.updated_at)));
    if !record.history.is_empty() {
        item.insert("history".into(), s(encode_history(&record.history)));
    }
    item.insert("v".into(), n(v));
    let in_progress = record.state == RecordState::InProgress;
    let (due_pk, due_at) = if in_progress {
        (format!("r/lease/{shard}"), lease)
    } else {
        (format!("r/expiry/{shard}"), expires)
    };
    item.insert("due_pk".into(), s(due_pk));
    item.insert("due_at".into(), n(due_at));
    item.insert(
        "list_pk".into(),
        s(list_pk(&record.namespace, record.state, shard)),
    );
    item.insert(
        "list_at".into(),
        s(list_at(millis(record.updated_at), &record.id)),
    );
    let keep = if in_progress {
        expires.max(lease)
    } else {
        expires
    };
    item.insert("ttl".into(), n(super::ttl_secs(keep, now_ms)));
    item
}

/// What `list_at` adds to `updated_at`, so that every time since the year -314,000
/// spells 17 digits (and sorts as text).
const LIST_AT_OFFSET: i64 = 10_000_000_000_000_000;

/// The `list` index partition of the records of `namespace` in `state` in
/// `shard`: `r/<len>/<namespace>/<state>/<shard>`.
pub(super) fn list_pk(namespace: &str, state: RecordState, shard: u16) -> String {
    format!(
        "r/{}/{namespace}/{}/{shard}",
        namespace.len(),
        state.as_str()
    )
}

/// The `list` index sort key: `<updated_at + 10^16, 17 digits>/<id>`.
pub(super) fn list_at(updated_ms: i64, id: &str) -> String {
    format!(
        "{:017}/{id}",
        updated_ms.saturating_add(LIST_AT_OFFSET).max(0)
    )
}

/// The `(updated_at, id)` a `list_at` spells.
pub(super) fn list_position(list_at: &str) -> Option<(i64, &str)> {
    let (ms, id) = list_at.split_at_checked(17)?;
    let ms: i64 = ms.parse().ok()?;
    Some((ms - LIST_AT_OFFSET, id.strip_prefix('/')?))
}

/// The record an item holds, and its version.
pub(super) fn record(item: &Item) -> Result<(Record, u64), StoreError> {
    let key = Key::new(text(item, "ns")?, text(item, "id")?);
    let history = match item.get("history") {
        None => Vec::new(),
        Some(AttributeValue::S(h)) => decode_history(h)?,
        Some(_) => return Err(corrupt("history")),
    };
    let record = Record::new(
        key,
        RecordState::parse(text(item, "state")?).ok_or_else(|| corrupt("state"))?,
        fingerprint(item)?,
        token(item)?,
        small(item, "attempts")?,
        small(item, "failures")?,
        at(item, "lease_until")?,
        at(item, "expires_at")?,
        at(item, "created_at")?,
        at(item, "updated_at")?,
        history,
    );
    let v = u64::try_from(int(item, "v")?).map_err(|_| corrupt("v"))?;
    Ok((record, v))
}

// ---------------------------------------------------------------------------
// Inbox events

/// The `due` partition of `namespace`'s unsettled events.
pub(super) fn due_events(namespace: &str) -> String {
    format!("e/due/{namespace}")
}

/// The item of a freshly accepted `event` ([`InboxEvent::accepted`]) under `pk`.
pub(super) fn event_item(event: &InboxEvent, pk: &str) -> Item {
    let mut item = Item::with_capacity(20);
    item.insert("pk".into(), s(pk));
    item.insert("ns".into(), s(&event.namespace));
    item.insert("id".into(), s(&event.id));
    item.insert("fp".into(), s(event.fingerprint.to_hex()));
    item.insert("state".into(), s(event.state.as_str()));
    item.insert("attempts".into(), n(event.attempts));
    item.insert("token".into(), n(event.token.0));
    item.insert("lease_until".into(), n(ceil_millis(event.lease_until)));
    // Due in the very instant it was accepted (its `now`, rounded down as every
    // lease's `now` is); a retry's time is rounded up (see `settle_event`).
    let next = millis(event.next_attempt_at);
    item.insert("next_attempt_at".into(), n(next));
    item.insert("received_at".into(), n(millis(event.received_at)));
    item.insert("updated_at".into(), n(millis(event.updated_at)));
    item.insert("expires_at".into(), n(ceil_millis(event.expires_at)));
    item.insert(
        "payload".into(),
        AttributeValue::B(Blob::new(event.payload.clone())),
    );
    if let Some(error) = &event.last_error {
        item.insert("last_error".into(), s(error));
    }
    let meta = &event.meta;
    if let Some(t) = &meta.event_type {
        item.insert("event_type".into(), s(t));
    }
    if let Some(t) = meta.created_at {
        item.insert("event_created_at".into(), n(millis(t)));
    }
    if let Some(o) = &meta.object {
        item.insert("object".into(), s(o));
    }
    if let Some(f) = &meta.family {
        item.insert("family".into(), s(f));
    }
    item.insert("due_pk".into(), s(due_events(&event.namespace)));
    item.insert("due_at".into(), n(next));
    item
}

/// The inbox event an item holds.
pub(super) fn event(item: &Item) -> Result<InboxEvent, StoreError> {
    let payload = match item.get("payload") {
        Some(AttributeValue::B(bytes)) => bytes.as_ref().to_vec(),
        None => Vec::new(),
        Some(_) => return Err(corrupt("payload")),
    };
    let meta = EventMeta {
        event_type: opt_text(item, "event_type")?,
        created_at: match item.get("event_created_at") {
            None => None,
            Some(_) => Some(at(item, "event_created_at")?),
        },
        object: opt_text(item, "object")?,
        family: opt_text(item, "family")?,
    };
    Ok(InboxEvent {
        namespace: text(item, "ns")?.to_owned(),
        id: text(item, "id")?.to_owned(),
        fingerprint: fingerprint(item)?,
        meta,
        payload,
        state: InboxState::parse(text(item, "state")?).ok_or_else(|| corrupt("state"))?,
        attempts: small(item, "attempts")?,
        token: token(item)?,
        lease_until: at(item, "lease_until")?,
        next_attempt_at: at(item, "next_attempt_at")?,
        last_error: opt_text(item, "last_error")?,
        received_at: at(item, "received_at")?,
        updated_at: at(item, "updated_at")?,
        expires_at: at(item, "expires_at")?,
    })
}

// ---------------------------------------------------------------------------
// Ordering records

/// The item of an ordering `record` under `pk` (never `Failed`: not in the index).
pub(super) fn object_item(record: &ObjectRecord, pk: &str) -> Item {
    let mut item = Item::with_capacity(7);
    item.insert("pk".into(), s(pk));
    item.insert("ns".into(), s(&record.namespace));
    item.insert("object".into(), s(&record.object));
    item.insert("family".into(), s(&record.family));
    item.insert("newest".into(), n(millis(record.newest)));
    item.insert("status".into(), s(record.status.as_str()));
    item.insert("updated_at".into(), n(millis(record.updated_at)));
    item
}

/// The ordering record an item holds.
pub(super) fn object(item: &Item) -> Result<ObjectRecord, StoreError> {
    let key = crate::ordering::ObjectKey {
        namespace: text(item, "ns")?,
        object: text(item, "object")?,
        family: text(item, "family")?,
    };
    Ok(ObjectRecord::new(
        key,
        at(item, "newest")?,
        ObjectStatus::parse(text(item, "status")?).ok_or_else(|| corrupt("status"))?,
        at(item, "updated_at")?,
    ))
}
