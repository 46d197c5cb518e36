//! The rows the SQL stores read: dedup records, inbox events and ordering records.

use std::fmt;

use super::time;
use crate::inbox::{InboxEvent, InboxState};
use crate::meta::EventMeta;
use crate::ordering::{ObjectRecord, ObjectStatus};
use crate::store::{
    decode_history, FencingToken, Fingerprint, Key, Record, RecordState, StoreError,
};

/// A row as read from the database, before checking: the struct with one field a
/// column, in the columns' order, each with the [`SqlRow`] reader of its column,
/// and `read(row, at)`, which reads them from column `at` on.
macro_rules! raw_row {
    ($(#[$doc:meta])* $name:ident { $($field:ident: $ty:ty = $reader:ident,)* }) => {
        $(#[$doc])*
        pub(crate) struct $name {
            $(pub(crate) $field: $ty,)*
        }

        impl $name {
            /// Reads its columns from column `at` on.
            pub(crate) fn read(row: &impl SqlRow, at: usize) -> Result<Self, sqlx::Error> {
                let mut column = at;
                let mut next = || {
                    column += 1;
                    column - 1
                };
                Ok(Self {
                    $($field: row.$reader(next())?,)*
                })
            }
        }
    };
}

/// The columns every query returns, in this order, after the key.
pub(crate) const COLUMNS: &str = "state, fingerprint, token, attempts, failures, \
     lease_until, expires_at, created_at, updated_at, history";

raw_row! {
    /// One row as read from the database, before checking.
    RawRecord {
        state: String = text,
        fingerprint: Vec<u8> = bytes,
        token: i64 = bigint,
        attempts: i64 = integer,
        failures: i64 = integer,
        lease_until: i64 = bigint,
        expires_at: i64 = bigint,
        created_at: i64 = bigint,
        updated_at: i64 = bigint,
        history: String = text,
    }
}

impl RawRecord {
    pub(crate) fn into_record(self, key: Key<'_>) -> Result<Record, StoreError> {
        let state = RecordState::parse(&self.state)
            .ok_or_else(|| StoreError::Corrupt(format!("{key}: unknown state {:?}", self.state)))?;
        let fingerprint = fingerprint(&self.fingerprint, &key)?;
        Ok(Record::new(
            key,
            state,
            fingerprint,
            FencingToken::from_i64(self.token),
            counter(self.attempts, &key, "attempts")?,
            counter(self.failures, &key, "failures")?,
            time(self.lease_until),
            time(self.expires_at),
            time(self.created_at),
            time(self.updated_at),
            decode_history(&self.history)?,
        ))
    }
}

/// A row of a SQL store, read by column position with the column types the schema
/// gives it.
pub(crate) trait SqlRow {
    fn text(&self, at: usize) -> Result<String, sqlx::Error>;
    fn optional_text(&self, at: usize) -> Result<Option<String>, sqlx::Error>;
    fn bytes(&self, at: usize) -> Result<Vec<u8>, sqlx::Error>;
    /// A 64-bit integer column: times and tokens.
    fn bigint(&self, at: usize) -> Result<i64, sqlx::Error>;
    fn optional_bigint(&self, at: usize) -> Result<Option<i64>, sqlx::Error>;
    /// An `INTEGER` column: attempts and failures.
    fn integer(&self, at: usize) -> Result<i64, sqlx::Error>;
}

/// How a database decodes the columns whose type differs between dialects.
pub(crate) trait Columns: sqlx::Database {
    /// An `INTEGER` column: `INT4` on PostgreSQL, `INT UNSIGNED` on MySQL; SQLite
    /// keeps every integer in 64 bits.
    type Integer: Into<i64> + for<'r> sqlx::Decode<'r, Self> + sqlx::Type<Self>;
    /// A text column as the driver reads it.
    type Text: for<'r> sqlx::Decode<'r, Self> + sqlx::Type<Self>;
    /// The text of column `at`, read as [`Self::Text`].
    fn text(read: Self::Text, at: usize) -> Result<String, sqlx::Error>;
}

#[cfg(feature = "postgres")]
impl Columns for sqlx::Postgres {
    type Integer = i32;
    type Text = String;
    fn text(read: String, _: usize) -> Result<String, sqlx::Error> {
        Ok(read)
    }
}

#[cfg(feature = "sqlite")]
impl Columns for sqlx::Sqlite {
    type Integer = i64;
    type Text = String;
    fn text(read: String, _: usize) -> Result<String, sqlx::Error> {
        Ok(read)
    }
}

impl<R> SqlRow for R
where
    R: sqlx::Row,
    R::Database: Columns,
    usize: sqlx::ColumnIndex<R>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn text(&self, at: usize) -> Result<String, sqlx::Error> {
        <R::Database as Columns>::text(self.try_get(at)?, at)
    }

    fn optional_text(&self, at: usize) -> Result<Option<String>, sqlx::Error> {
        let read: Option<<R::Database as Columns>::Text> = self.try_get(at)?;
        read.map(|read| <R::Database as Columns>::text(read, at))
            .transpose()
    }

    fn bytes(&self, at: usize) -> Result<Vec<u8>, sqlx::Error> {
        self.try_get(at)
    }

    fn bigint(&self, at: usize) -> Result<i64, sqlx::Error> {
        self.try_get(at)
    }

    fn optional_bigint(&self, at: usize) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(at)
    }

    fn integer(&self, at: usize) -> Result<i64, sqlx::Error> {
        self.try_get::<<R::Database as Columns>::Integer, _>(at)
            .map(Into::into)
    }
}

/// A record read with its key: the namespace and the id, then the [`COLUMNS`];
/// `err` maps a driver error.
pub(crate) fn keyed_record(
    row: &impl SqlRow,
    err: fn(sqlx::Error) -> StoreError,
) -> Result<Record, StoreError> {
    let namespace = row.text(0).map_err(err)?;
    let id = row.text(1).map_err(err)?;
    RawRecord::read(row, 2)
        .map_err(err)?
        .into_record(Key::new(&namespace, &id))
}

/// The inbox columns every inbox read returns, in this order.
pub(crate) const EVENT_COLUMNS: &str = "namespace, id, fingerprint, event_type, created_at, \
     object, family, payload, state, attempts, token, lease_until, next_attempt_at, last_error, \
     received_at, updated_at, expires_at";

raw_row! {
    /// One inbox row as read from the database ([`EVENT_COLUMNS`]), before checking.
    RawEvent {
        namespace: String = text,
        id: String = text,
        fingerprint: Vec<u8> = bytes,
        event_type: Option<String> = optional_text,
        created_at: Option<i64> = optional_bigint,
        object: Option<String> = optional_text,
        family: Option<String> = optional_text,
        payload: Vec<u8> = bytes,
        state: String = text,
        attempts: i64 = integer,
        token: i64 = bigint,
        lease_until: i64 = bigint,
        next_attempt_at: i64 = bigint,
        last_error: Option<String> = optional_text,
        received_at: i64 = bigint,
        updated_at: i64 = bigint,
        expires_at: i64 = bigint,
    }
}

/// A stored fingerprint, checked to be 32 bytes.
pub(crate) fn fingerprint(
    bytes: &[u8],
    what: &dyn fmt::Display,
) -> Result<Fingerprint, StoreError> {
    <[u8; 32]>::try_from(bytes)
        .map(Fingerprint)
        .map_err(|_| StoreError::Corrupt(format!("{what}: fingerprint of {} bytes", bytes.len())))
}

/// A stored count (`name` of `what`), checked to fit a `u32`.
fn counter(v: i64, what: &dyn fmt::Display, name: &str) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{what}: {name} = {v}")))
}

/// A stored inbox state name.
pub(crate) fn inbox_state(text: &str, what: &dyn fmt::Display) -> Result<InboxState, StoreError> {
    InboxState::parse(text)
        .ok_or_else(|| StoreError::Corrupt(format!("{what}: unknown inbox state {text:?}")))
}

impl RawEvent {
    pub(crate) fn into_event(self) -> Result<InboxEvent, StoreError> {
        let what = Key::new(&self.namespace, &self.id).to_string();
        let fingerprint = fingerprint(&self.fingerprint, &what)?;
        let state = inbox_state(&self.state, &what)?;
        let attempts = counter(self.attempts, &what, "attempts")?;
        Ok(InboxEvent {
            namespace: self.namespace,
            id: self.id,
            fingerprint,
            meta: EventMeta {
                event_type: self.event_type,
                created_at: self.created_at.map(time),
                object: self.object,
                family: self.family,
            },
            payload: self.payload,
            state,
            attempts,
            token: FencingToken::from_i64(self.token),
            lease_until: time(self.lease_until),
            next_attempt_at: time(self.next_attempt_at),
            last_error: self.last_error,
            received_at: time(self.received_at),
            updated_at: time(self.updated_at),
            expires_at: time(self.expires_at),
        })
    }
}

/// The ordering columns every object read returns, in this order.
pub(crate) const OBJECT_COLUMNS: &str = "namespace, object, family, newest, status, updated_at";

raw_row! {
    /// One ordering row as read from the database ([`OBJECT_COLUMNS`]), before checking.
    RawObject {
        namespace: String = text,
        object: String = text,
        family: String = text,
        newest: i64 = bigint,
        status: String = text,
        updated_at: i64 = bigint,
    }
}

impl RawObject {
    pub(crate) fn into_record(self) -> Result<ObjectRecord, StoreError> {
        let status = ObjectStatus::parse(&self.status).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "{}/{}/{}: unknown object status {:?}",
                self.namespace, self.object, self.family, self.status
            ))
        })?;
        Ok(ObjectRecord {
            namespace: self.namespace,
            object: self.object,
            family: self.family,
            newest: time(self.newest),
            status,
            updated_at: time(self.updated_at),
        })
    }
}
