//! How a dedup record is stored in Redis, and reading Redis values back.

use std::fmt;
use std::fmt::Write as _;

use ::redis::Value;
use chrono::{DateTime, Utc};

use crate::store::{
    ceil_millis, decode_history, ClaimRequest, Fence, FencingToken, Fingerprint, Key, Record,
    RecordState, StoreError,
};

pub(super) fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub(super) fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Milliseconds from `now` until `due`, at least 1 (a TTL).
pub(super) fn ttl(due: i64, now: i64) -> i64 {
    due.saturating_sub(now).max(1)
}

/// A fenced script's answer: 1 applied, anything else the lease lost.
pub(super) fn fence(applied: i64) -> Fence {
    if applied == 1 {
        Fence::Applied
    } else {
        Fence::LeaseLost
    }
}

pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("redis record: {what}"))
}

pub(super) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => text(v)?.parse().ok(),
    }
}

pub(super) fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// The texts of an `INFO` answer, one per server (a cluster answers a map or an
/// array of them).
pub(super) fn info_texts(info: &Value) -> Vec<&str> {
    let mut texts = Vec::new();
    let mut values = vec![info];
    while let Some(v) = values.pop() {
        match v {
            Value::Map(pairs) => values.extend(pairs.iter().map(|(_, v)| v)),
            Value::Array(items) => values.extend(items),
            Value::VerbatimString { text, .. } => texts.push(text.as_str()),
            v => texts.extend(text(v)),
        }
    }
    texts
}

/// A record from its stored form: `s|t|f|a|l|c|x|e|u|h` — state, token (decimal
/// u64), fingerprint (hex), attempts, lease_until, created_at, failures,
/// expires_at, updated_at (times in ms since the epoch) and the history (JSON, empty
/// when there is none; last, so it may hold `|`). A finish keeps `t|f|a|l|c` and
/// rewrites the rest.
pub(super) fn record(key: Key<'_>, stored: &str) -> Result<Record, StoreError> {
    let mut fields = [""; 10];
    let mut parts = stored.splitn(10, '|');
    for field in &mut fields {
        *field = parts.next().ok_or_else(|| corrupt("wrong field count"))?;
    }
    let [s, t, f, a, l, c, x, e, u, h] = fields;
    let num = |v: &str, name: &str| v.parse::<i64>().map_err(|_| corrupt(name));
    let small = |v: &str, name: &str| v.parse::<u32>().map_err(|_| corrupt(name));
    Ok(Record::new(
        key,
        RecordState::parse(s).ok_or_else(|| corrupt("state"))?,
        Fingerprint::from_hex(f).ok_or_else(|| corrupt("fingerprint"))?,
        FencingToken(t.parse().map_err(|_| corrupt("token"))?),
        small(a, "attempts")?,
        small(x, "failures")?,
        time(num(l, "lease_until")?),
        time(num(e, "expires_at")?),
        time(num(c, "created_at")?),
        time(num(u, "updated_at")?),
        decode_history(h)?,
    ))
}

/// Whether `existing` is this very claim's own write, read back: `InProgress` with
/// the request's token. Tokens are random per claim, so only a repeated run of the
/// same round trip (a Redis Cluster connection sends a pipeline again after a
/// redirect or a lost reply, and the first run may have applied) meets one; the
/// claim was granted, so it is answered as granted.
pub(super) fn own_claim(existing: &Record, request: &ClaimRequest<'_>) -> bool {
    request.made(existing)
}

/// The stored form of the record a fresh `claim` creates (see [`record`]), and its
/// TTL: until its expiry or the end of its lease, whichever is later.
pub(super) fn fresh_record(request: &ClaimRequest<'_>) -> (String, i64) {
    let now = millis(request.now);
    let lease = ceil_millis(request.lease_until);
    let expires = ceil_millis(request.expires_at);
    // Written into one buffer of its final size (at most 158 bytes while times
    // have 13 digits): the claim of every delivery builds it.
    let mut fresh = String::with_capacity(160);
    let _ = write!(fresh, "in_progress|{}|", request.token.0);
    request.fingerprint.push_hex(&mut fresh);
    let _ = write!(fresh, "|1|{lease}|{now}|0|{expires}|{now}|");
    (fresh, ttl(expires.max(lease), now))
}

/// `args` written into a string made with capacity `cap`, at least their length
/// (a finish's fields are bounded: a `u64` token has at most 20 digits, an `i64`
/// time 20 characters), so the string never grows, as a `format!` of them would
/// several times.
pub(super) fn sized(cap: usize, args: fmt::Arguments<'_>) -> String {
    let mut text = String::with_capacity(cap);
    let _ = text.write_fmt(args);
    text
}

pub(super) fn stored_record(key: Key<'_>, v: &Value) -> Result<Record, StoreError> {
    record(key, text(v).ok_or_else(|| corrupt("not text"))?)
}

/// The bytes of a string value.
pub(super) fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// The items of an array value.
pub(super) fn array(v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        _ => Err(corrupt("expected an array")),
    }
}
