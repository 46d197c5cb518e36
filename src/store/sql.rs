//! What the sqlx-backed stores share: table names, row decoding, error mapping.

use std::fmt;

use chrono::{DateTime, Utc};

use super::{decode_history, encode_history, FailureNote, FencingToken, Fingerprint, Key, Record};
use super::{RecordState, StoreError};

/// The table the SQL stores use unless told otherwise.
pub const DEFAULT_TABLE: &str = "webhook_guard_records";

/// How many rows one purge statement removes at most, so that it holds its locks
/// (row locks on PostgreSQL, the write lock on SQLite) only briefly.
pub(crate) const PURGE_BATCH: usize = 1000;

/// A table name refused by a SQL store: it must match `[A-Za-z_][A-Za-z0-9_]{0,62}`.
///
/// Table names are written into the SQL the store prepares, so only plain identifiers
/// are accepted; nothing else is ever interpolated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid table name {name:?}: expected 1 to 63 ASCII letters, digits or '_', not starting with a digit")]
pub struct InvalidTableName {
    name: String,
}

impl InvalidTableName {
    /// The refused name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A validated table name.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct TableName(String);

impl TableName {
    pub(crate) fn new(name: &str) -> Result<Self, InvalidTableName> {
        let bytes = name.as_bytes();
        let ok = !bytes.is_empty()
            && bytes.len() <= 63
            && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'_');
        if ok {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidTableName {
                name: name.to_owned(),
            })
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The table name quoted, so that reserved words work too.
    pub(crate) fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// A quoted index name derived from the table name that fits in 63 bytes
    /// (PostgreSQL silently truncates longer identifiers, which could make two
    /// indexes collide): long table names are shortened and tagged with a hash.
    pub(crate) fn index(&self, suffix: &str) -> String {
        let plain = format!("{}_{suffix}", self.0);
        if plain.len() <= 63 {
            return format!("\"{plain}\"");
        }
        let keep = 63 - 1 - suffix.len() - 9;
        format!("\"{}_{:08x}_{suffix}\"", &self.0[..keep], fnv1a(&self.0))
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Milliseconds since the epoch, as the SQL stores keep times.
pub(crate) fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A count as an SQL `INTEGER` (saturating).
pub(crate) fn count(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A limit as an SQL `BIGINT` (saturating).
pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The history as stored: empty text for no failures (most records), else JSON.
pub(crate) fn history_text(history: &[FailureNote]) -> String {
    if history.is_empty() {
        String::new()
    } else {
        encode_history(history)
    }
}

/// The columns every query returns, in this order, after the key.
pub(crate) const COLUMNS: &str = "state, fingerprint, token, attempts, failures, \
     lease_until, expires_at, created_at, updated_at, history";

/// One row as read from the database, before checking.
pub(crate) struct RawRecord {
    pub(crate) state: String,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) token: i64,
    pub(crate) attempts: i64,
    pub(crate) failures: i64,
    pub(crate) lease_until: i64,
    pub(crate) expires_at: i64,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) history: String,
}

impl RawRecord {
    pub(crate) fn into_record(self, key: Key<'_>) -> Result<Record, StoreError> {
        let state = RecordState::parse(&self.state)
            .ok_or_else(|| StoreError::Corrupt(format!("{key}: unknown state {:?}", self.state)))?;
        let fingerprint = <[u8; 32]>::try_from(self.fingerprint.as_slice())
            .map(Fingerprint)
            .map_err(|_| {
                StoreError::Corrupt(format!(
                    "{key}: fingerprint of {} bytes",
                    self.fingerprint.len()
                ))
            })?;
        let counter = |name: &str, v: i64| {
            u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{key}: {name} = {v}")))
        };
        Ok(Record::new(
            key,
            state,
            fingerprint,
            FencingToken::from_i64(self.token),
            counter("attempts", self.attempts)?,
            counter("failures", self.failures)?,
            time(self.lease_until),
            time(self.expires_at),
            time(self.created_at),
            time(self.updated_at),
            decode_history(&self.history)?,
        ))
    }
}

/// Maps a driver error: unreachable (I/O, TLS, pool exhausted or closed, broken
/// protocol stream, or a database code that `db_unavailable` recognises) becomes
/// [`StoreError::Unavailable`], anything else [`StoreError::Backend`]. The driver's
/// error is kept as the source either way.
pub(crate) fn map_error(
    error: sqlx::Error,
    db_unavailable: fn(&dyn sqlx::error::DatabaseError) -> bool,
) -> StoreError {
    let unavailable = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db_unavailable(db.as_ref()),
        _ => false,
    };
    if unavailable {
        StoreError::unavailable(error)
    } else {
        StoreError::backend(error)
    }
}

/// A record that vanished between a refused claim and the read that follows it,
/// three times in a row (a purge or delete racing with the claim).
pub(crate) fn vanished(key: Key<'_>) -> StoreError {
    StoreError::backend(format!(
        "{key}: the record changed under three claim attempts in a row"
    ))
}

/// Runs `batch(n)` with `n <= PURGE_BATCH` until `limit` rows are gone or a batch
/// comes back short. Every batch is its own short statement (autocommit).
pub(crate) async fn purge_in_batches<F, Fut>(limit: usize, mut batch: F) -> Result<u64, StoreError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<u64, StoreError>>,
{
    let mut removed = 0u64;
    let mut left = limit;
    while left > 0 {
        let n = left.min(PURGE_BATCH);
        let done = batch(n).await?;
        removed += done;
        left -= usize::try_from(done).unwrap_or(n).min(n);
        if done < n as u64 {
            break;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["t", "_t", "webhook_guard_records", "T9_x", &"a".repeat(63)] {
            assert!(TableName::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "9t",
            "a-b",
            "a b",
            "a\"b",
            "a;drop",
            "é",
            "s.t",
            &"a".repeat(64),
        ] {
            let err = TableName::new(bad).unwrap_err();
            assert_eq!(err.name(), bad);
        }
    }

    #[test]
    fn index_names_fit_and_differ() {
        let short = TableName::new("records").unwrap();
        assert_eq!(short.index("expires_at"), "\"records_expires_at\"");
        let a = TableName::new(&format!("{}a", "x".repeat(62))).unwrap();
        let b = TableName::new(&format!("{}b", "x".repeat(62))).unwrap();
        let (ia, ib) = (a.index("expires_at"), b.index("expires_at"));
        assert!(ia.len() <= 65 && ib.len() <= 65, "{ia}");
        assert_ne!(ia, ib);
        assert_ne!(a.index("expires_at"), a.index("stuck"));
    }
}
