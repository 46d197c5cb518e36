//! What the sqlx-backed stores share: table names, row decoding, error mapping,
//! purging in paced batches, and the statements every dialect writes alike. MySQL
//! is the third dialect: it runs the shared statements with positional binds and
//! writes its own where it must (see `store::mysql`).
// Some helpers serve the PostgreSQL and SQLite stores only.
#![cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]

use std::fmt;

use chrono::{DateTime, Utc};

pub(crate) mod args;
pub(crate) mod claim_batch;
mod common;
pub(crate) mod impls;
pub(crate) mod listing;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) mod returning;
mod rows;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod statements;

use crate::store::{
    encode_history, FailureNote, Fingerprint, Key, RecordState, Recorded, StoreError,
};

#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use args::query;
pub(crate) use args::{Arg, Statement};
#[cfg(feature = "mysql")]
pub(crate) use common::{positional, Common};
#[cfg(feature = "mysql")]
pub(crate) use rows::Columns;
pub(crate) use rows::{
    fingerprint, inbox_state, keyed_record, RawEvent, RawObject, RawRecord, SqlRow, COLUMNS,
    EVENT_COLUMNS, OBJECT_COLUMNS,
};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use statements::{Dialect, Statements};

/// The table the SQL stores use unless told otherwise.
pub const DEFAULT_TABLE: &str = "webhook_guard_records";

/// How a store purges expired rows: how many rows one statement removes at most,
/// and how long the purge rests after each full statement, so that claims running
/// meanwhile find the database (its write lock, its log, its CPU) free about half of
/// the time or more, and wait for at most one statement. The rest follows the
/// last full statement of a call too: the sweeper calls again right away.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PurgePace {
    /// Rows per statement (each statement is its own short transaction).
    pub(crate) rows: usize,
    /// The rest after a full statement, as a multiple of the time it took.
    pub(crate) rest: f64,
}

impl PurgePace {
    /// Rests after a full statement that took `took` (every SQL store runs on tokio,
    /// as sqlx does here).
    pub(crate) async fn rest_after(self, took: std::time::Duration) {
        let pause = took.mul_f64(self.rest);
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

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
        self.derived(suffix).quoted()
    }

    /// The name `<table>_<suffix>` for a companion table or an index, shortened and
    /// tagged with a hash of the whole name when it would not fit in 63 bytes.
    pub(crate) fn derived(&self, suffix: &str) -> Self {
        let plain = format!("{}_{suffix}", self.0);
        if plain.len() <= 63 {
            return Self(plain);
        }
        let keep = 63 - 1 - suffix.len() - 9;
        Self(format!(
            "{}_{:08x}_{suffix}",
            &self.0[..keep],
            fnv1a(&self.0)
        ))
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

pub(crate) use super::ceil_millis;

pub(crate) fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A count as an SQL `INTEGER` (saturating).
pub(crate) fn count(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The history as stored: empty text for no failures (most records), else JSON.
pub(crate) fn history_text(history: &[FailureNote]) -> String {
    if history.is_empty() {
        String::new()
    } else {
        encode_history(history)
    }
}

/// A fenced update's outcome: it applied when it changed the one row it names.
pub(crate) fn fence(rows_affected: u64) -> super::Fence {
    if rows_affected == 1 {
        super::Fence::Applied
    } else {
        super::Fence::LeaseLost
    }
}

/// What a store whose database orders concurrent writes itself holds while it
/// writes: nothing.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct Ungated;

/// `options`, set by `verify_ca` to check the server's certificate against the CA
/// given when they ask for TLS without checking it (`tls_unchecked`) and name a
/// CA (the connection URL's query parameter `ca_param`).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn given_ca_checked<O: sqlx::ConnectOptions>(
    options: O,
    tls_unchecked: bool,
    ca_param: &str,
    verify_ca: impl FnOnce(O) -> O,
) -> O {
    let has_ca = |o: &O| {
        o.to_url_lossy()
            .query_pairs()
            .any(|(name, _)| name == ca_param)
    };
    if tls_unchecked && has_ca(&options) {
        verify_ca(options)
    } else {
        options
    }
}

/// Maps a driver error: no connection to send on (pool timed out or closed, a
/// refused connection) becomes [`StoreError::NotSent`]; unreachable (other I/O,
/// TLS, broken protocol stream, or a database code that `db_unavailable`
/// recognises) [`StoreError::Unavailable`]; anything else [`StoreError::Backend`]. The driver's
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
    // No connection to send on: the pool had none (refused, or all busy), or the
    // server refused one.
    let not_sent = match &error {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        sqlx::Error::Io(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        _ => false,
    };
    if not_sent {
        StoreError::not_sent(error)
    } else if unavailable {
        StoreError::unavailable(error)
    } else {
        StoreError::backend(error)
    }
}

/// The answer of a transactional record refused by the stored record with
/// `stored` fingerprint in `state`: a refused record is either finished or held by
/// a live lease (an expired, failed or abandoned one is taken over).
pub(crate) fn recorded(
    stored: &[u8],
    state: &[u8],
    fp: Fingerprint,
    key: Key<'_>,
) -> Result<Recorded, StoreError> {
    Ok(if !fingerprint(stored, &key)?.matches(&fp) {
        Recorded::Conflict
    } else if state == RecordState::InProgress.as_str().as_bytes() {
        Recorded::InProgress
    } else {
        Recorded::Duplicate
    })
}

/// A record that vanished or changed between a refused claim and the read that
/// follows it, three times in a row (a purge, delete or finish racing with the
/// claim).
pub(crate) fn vanished(key: Key<'_>) -> StoreError {
    StoreError::backend(format!(
        "{key}: the record changed under three claim attempts in a row"
    ))
}

/// How the inbox purges its settled events: statements of up to 1,000 rows, back
/// to back.
pub(crate) const SETTLED_PURGE: PurgePace = PurgePace {
    rows: 1000,
    rest: 0.0,
};

/// Runs `batch(n)` with `n <= pace.rows` until `limit` rows are gone or a batch
/// comes back short. Every batch is its own short statement (autocommit); after
/// each full one the purge rests (see [`PurgePace`]).
pub(crate) async fn purge_in_batches<F, Fut>(
    limit: usize,
    pace: PurgePace,
    mut batch: F,
) -> Result<u64, StoreError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<u64, StoreError>>,
{
    let mut removed = 0u64;
    let mut left = limit;
    while left > 0 {
        let n = left.min(pace.rows.max(1));
        let started = std::time::Instant::now();
        let done = match batch(n).await {
            Ok(done) => done,
            // What earlier statements removed is gone: say so (the next call goes
            // on from there); with nothing removed yet, the error.
            Err(e) if removed > 0 => {
                tracing::warn!(error = %e, removed, "a purge statement failed; answering what the earlier ones removed");
                break;
            }
            Err(e) => return Err(e),
        };
        removed += done;
        left -= usize::try_from(done).unwrap_or(n).min(n);
        if done < n as u64 {
            break;
        }
        pace.rest_after(started.elapsed()).await;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A purge whose later statement fails answers what the earlier ones removed
    /// (they are gone); one whose first statement fails answers the error.
    #[tokio::test]
    async fn a_purge_failing_part_way_answers_what_it_removed() {
        let pace = PurgePace {
            rows: 10,
            rest: 0.0,
        };
        let calls = std::cell::Cell::new(0);
        let batch = |n: usize| {
            calls.set(calls.get() + 1);
            let call = calls.get();
            async move {
                match call {
                    1 | 2 => Ok(n as u64),
                    _ => Err(StoreError::unavailable("connection reset")),
                }
            }
        };
        assert_eq!(purge_in_batches(100, pace, batch).await.unwrap(), 20);
        let failing = |_: usize| async { Err::<u64, _>(StoreError::unavailable("down")) };
        assert!(purge_in_batches(100, pace, failing).await.is_err());
    }

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
            "`t`",
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
