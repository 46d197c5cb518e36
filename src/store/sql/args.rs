//! The values the SQL stores bind: one [`Arg`] per `$n` of a statement, and the
//! argument lists of the statements every dialect binds alike.

use chrono::{DateTime, Utc};
use sqlx::query::Query;

use super::{ceil_millis, millis};
use crate::inbox::{NewEvent, Settle};
use crate::ordering::{ObjectKey, ObjectStatus};
use crate::store::{ClaimRequest, FencingToken, Fingerprint, Finish, Holder, Key};

/// A value bound into a statement, by its `$n` (the `n - 1`-th of the slice).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Text(&'a str),
    OptText(Option<&'a str>),
    Bytes(&'a [u8]),
    Int(i64),
    OptInt(Option<i64>),
    /// An `INTEGER` count (attempts, failures).
    Count(u32),
    /// A `LIMIT`.
    Limit(u64),
}

/// How a database binds the values whose SQL type differs between dialects.
pub(crate) trait Binds: sqlx::Database {
    /// Binds `arg` as the next value of `query`.
    fn bind<'q>(
        query: Query<'q, Self, Self::Arguments<'q>>,
        arg: Arg<'q>,
    ) -> Query<'q, Self, Self::Arguments<'q>>;
}

/// Implements [`Binds`] for the database `$db`: every value but a count and a
/// limit bound as itself, a count as `$count(n)` and a limit as `$limit(n)`.
macro_rules! binds {
    ($db:ty, $count:expr, $limit:expr) => {
        impl Binds for $db {
            fn bind<'q>(
                query: Query<'q, Self, Self::Arguments<'q>>,
                arg: Arg<'q>,
            ) -> Query<'q, Self, Self::Arguments<'q>> {
                match arg {
                    Arg::Text(v) => query.bind(v),
                    Arg::OptText(v) => query.bind(v),
                    Arg::Bytes(v) => query.bind(v),
                    Arg::Int(v) => query.bind(v),
                    Arg::OptInt(v) => query.bind(v),
                    Arg::Count(n) => query.bind($count(n)),
                    Arg::Limit(n) => query.bind($limit(n)),
                }
            }
        }
    };
}

/// A limit as an SQL `BIGINT` (saturating).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn bigint(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

// PostgreSQL and SQLite bind counts as `INTEGER` and limits as `BIGINT`; MySQL's
// counts are `INT UNSIGNED` and its limits unsigned.
#[cfg(feature = "postgres")]
binds!(sqlx::Postgres, super::count, bigint);
#[cfg(feature = "sqlite")]
binds!(sqlx::Sqlite, super::count, bigint);
#[cfg(feature = "mysql")]
binds!(sqlx::MySql, u32::from, u64::from);

/// The statement `sql`, written with `$n` binds in order (`$1` is `args[0]`), with
/// `args` bound.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn query<'q, DB: Binds>(
    sql: &'q str,
    args: &[Arg<'q>],
) -> Query<'q, DB, DB::Arguments<'q>> {
    args.iter()
        .fold(sqlx::query(sql), |query, &arg| DB::bind(query, arg))
}

/// A statement of a SQL store, as its database runs it with [`Arg`]s bound.
pub(crate) trait Statement<DB: Binds> {
    /// The query with `args` bound, `args[n - 1]` for each `$n`.
    fn bind<'q>(&'q self, args: &[Arg<'q>]) -> Query<'q, DB, DB::Arguments<'q>>;
}

/// A statement whose database reads its `$n` binds in order ([`query`]).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<DB: Binds> Statement<DB> for str {
    fn bind<'q>(&'q self, args: &[Arg<'q>]) -> Query<'q, DB, DB::Arguments<'q>> {
        query(self, args)
    }
}

/// A record's key: $1 namespace, $2 id.
pub(crate) fn key<'a>(key: Key<'a>) -> [Arg<'a>; 2] {
    [Arg::Text(key.namespace), Arg::Text(key.id)]
}

/// A record's key at a time: $1 namespace, $2 id, $3 now.
pub(crate) fn key_at(key: Key<'_>, now: DateTime<Utc>) -> [Arg<'_>; 3] {
    [
        Arg::Text(key.namespace),
        Arg::Text(key.id),
        Arg::Int(millis(now)),
    ]
}

/// An object's key: $1 namespace, $2 object, $3 family.
pub(crate) fn object_key<'a>(key: ObjectKey<'a>) -> [Arg<'a>; 3] {
    [
        Arg::Text(key.namespace),
        Arg::Text(key.object),
        Arg::Text(key.family),
    ]
}

/// A time and a limit: $1 now (or before), $2 limit.
pub(crate) fn until(now: DateTime<Utc>, limit: usize) -> [Arg<'static>; 2] {
    [Arg::Int(millis(now)), Arg::Limit(limit as u64)]
}

/// The claim: $1 namespace, $2 id, $3 fingerprint, $4 token, $5 lease_until,
/// $6 expires_at, $7 now, $8 the unknown fingerprint.
pub(crate) fn claim<'a>(request: &'a ClaimRequest<'a>) -> [Arg<'a>; 8] {
    [
        Arg::Text(request.key.namespace),
        Arg::Text(request.key.id),
        Arg::Bytes(&request.fingerprint.0),
        Arg::Int(request.token.as_i64()),
        Arg::Int(ceil_millis(request.lease_until)),
        Arg::Int(ceil_millis(request.expires_at)),
        Arg::Int(millis(request.now)),
        Arg::Bytes(&Fingerprint::UNKNOWN.0),
    ]
}

/// The transactional record, under a fresh token: $1 namespace, $2 id,
/// $3 fingerprint, $4 token, $5 now, $6 expires_at, $7 the unknown fingerprint.
pub(crate) fn record<'a>(
    key: Key<'a>,
    fingerprint: &'a Fingerprint,
    now: DateTime<Utc>,
    expires_at: DateTime<Utc>,
) -> [Arg<'a>; 7] {
    [
        Arg::Text(key.namespace),
        Arg::Text(key.id),
        Arg::Bytes(&fingerprint.0),
        Arg::Int(FencingToken::random().as_i64()),
        Arg::Int(millis(now)),
        Arg::Int(ceil_millis(expires_at)),
        Arg::Bytes(&Fingerprint::UNKNOWN.0),
    ]
}

/// A fenced finish, with `history` the stored text of `finish.history`: $1
/// namespace, $2 id, $3 token, $4 state, $5 failures, $6 history, $7 now,
/// $8 expires_at.
pub(crate) fn finish<'a>(
    key: Key<'a>,
    token: FencingToken,
    finish: &Finish<'_>,
    history: &'a str,
) -> [Arg<'a>; 8] {
    [
        Arg::Text(key.namespace),
        Arg::Text(key.id),
        Arg::Int(token.as_i64()),
        Arg::Text(finish.state.as_str()),
        Arg::Count(finish.failures),
        Arg::Text(history),
        Arg::Int(millis(finish.now)),
        Arg::Int(ceil_millis(finish.expires_at)),
    ]
}

/// A fenced renewal: $1 namespace, $2 id, $3 token, $4 lease_until, and $5
/// expires_at when given (a record's; an event's lease has none).
pub(crate) fn renew<'a>(
    key: Key<'a>,
    token: FencingToken,
    lease_until: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
) -> Vec<Arg<'a>> {
    let mut args = vec![
        Arg::Text(key.namespace),
        Arg::Text(key.id),
        Arg::Int(token.as_i64()),
        Arg::Int(ceil_millis(lease_until)),
    ];
    args.extend(expires_at.map(|at| Arg::Int(ceil_millis(at))));
    args
}

/// A new inbox event: $1 namespace, $2 id, $3 fingerprint, $4 event_type,
/// $5 created_at, $6 object, $7 family, $8 payload, $9 now, $10 expires_at.
pub(crate) fn enqueue<'a>(event: &'a NewEvent<'a>) -> [Arg<'a>; 10] {
    [
        Arg::Text(event.key.namespace),
        Arg::Text(event.key.id),
        Arg::Bytes(&event.fingerprint.0),
        Arg::OptText(event.meta.event_type.as_deref()),
        Arg::OptInt(event.meta.created_at.map(millis)),
        Arg::OptText(event.meta.object.as_deref()),
        Arg::OptText(event.meta.family.as_deref()),
        Arg::Bytes(event.payload),
        Arg::Int(millis(event.now)),
        Arg::Int(ceil_millis(event.expires_at)),
    ]
}

/// A fenced settle of an event: $1 namespace, $2 id, $3 token, $4 state,
/// $5 next_attempt_at, $6 error, $7 now, $8 expires_at, $9 1 to give the attempt
/// back, else 0.
pub(crate) fn settle<'a>(settle: &Settle<'a>) -> [Arg<'a>; 9] {
    let Holder { key, token } = settle.holder;
    [
        Arg::Text(key.namespace),
        Arg::Text(key.id),
        Arg::Int(token.as_i64()),
        Arg::Text(settle.state.as_str()),
        Arg::Int(ceil_millis(settle.next_attempt_at)),
        Arg::OptText(settle.error),
        Arg::Int(millis(settle.now)),
        Arg::Int(ceil_millis(settle.expires_at)),
        Arg::Count(u32::from(!settle.attempt_counts)),
    ]
}

/// An object seen: $1 namespace, $2 object, $3 family, $4 created_at, $5 now.
pub(crate) fn observe<'a>(
    key: ObjectKey<'a>,
    created_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> [Arg<'a>; 5] {
    let [namespace, object, family] = object_key(key);
    [
        namespace,
        object,
        family,
        Arg::Int(millis(created_at)),
        Arg::Int(millis(now)),
    ]
}

/// An object's status set: $1 namespace, $2 object, $3 family, $4 created_at,
/// $5 status, $6 now, and $7 failed_since when given.
pub(crate) fn object_status<'a>(
    key: ObjectKey<'a>,
    created_at: DateTime<Utc>,
    status: ObjectStatus,
    now: DateTime<Utc>,
    failed_since: Option<DateTime<Utc>>,
) -> Vec<Arg<'a>> {
    let mut args = object_key(key).to_vec();
    args.extend([
        Arg::Int(millis(created_at)),
        Arg::Text(status.as_str()),
        Arg::Int(millis(now)),
    ]);
    args.extend(failed_since.map(|since| Arg::Int(millis(since))));
    args
}

/// Failed objects: $1 namespace, $2 before, $3 limit.
pub(crate) fn failed(namespace: &str, before: DateTime<Utc>, limit: usize) -> [Arg<'_>; 3] {
    let [before, limit] = until(before, limit);
    [Arg::Text(namespace), before, limit]
}
