//! What the PostgreSQL and SQLite stores write alike beyond the shared contract
//! ([`sql_store_impls!`](super::impls::sql_store_impls)): statements that answer
//! with `RETURNING`, run with the same binds on either database.

/// Implements, for `$store` (a store of the cargo feature `$feature`) on the sqlx
/// database `$db`, the methods that
/// [`sql_store_impls!`](crate::store::sql::impls::sql_store_impls) asks of a store,
/// with its statements run once each, and expands that macro for it; and the
/// transactional `record_in` on a `$conn` (its docs the attributes after
/// `record_in:`), the constructors `new` and `with_table` (`$table_note`, when
/// given, ends the latter's docs) and the accessors `schema_sql`, `table` and `pool`.
///
/// `$store` must have the fields `pool` (its sqlx pool) and `sql`
/// (`Arc<Statements>`), a `fn build(pool, TableName) -> Self`, an
/// `async fn write_gate(&self)` and the constant `PURGE_PACE`, and must batch its
/// claims ([`ClaimBatch`](crate::store::sql::claim_batch::ClaimBatch)). `$err` maps
/// a driver error to a [`StoreError`](crate::store::StoreError).
macro_rules! returning_ops {
    (
        $store:ty, $db:ty, $conn:ty, $feature:literal, $err:path,
        $(with_table: $table_note:literal,)?
        record_in: $(#[$record_in_doc:meta])*
    ) => {
        impl $store {
            $(#[$record_in_doc])*
            pub async fn record_in(
                &self,
                conn: &mut $conn,
                key: $crate::store::Key<'_>,
                fingerprint: $crate::store::Fingerprint,
                now: ::chrono::DateTime<::chrono::Utc>,
                expires_at: ::chrono::DateTime<::chrono::Utc>,
            ) -> Result<$crate::store::Recorded, $crate::store::StoreError> {
                self.record_with(conn, key, fingerprint, now, expires_at)
                    .await
            }

            /// A store on `pool`, in the table `webhook_guard_records`. Does not
            /// create the table: see [`migrate`](Self::migrate).
            pub fn new(pool: ::sqlx::Pool<$db>) -> Self {
                let table = $crate::store::sql::TableName::new($crate::store::sql::DEFAULT_TABLE);
                Self::build(pool, table.expect("valid default"))
            }

            /// A store on `pool`, in the table `table`.
            ///
            /// The store also uses `<table>_inbox` and `<table>_objects` (and indexes
            /// named after `table`): stores sharing a database need names that none
            /// of these repeat (`t` and `t_inbox` would meet).
            ///
            /// # Errors
            /// [`InvalidTableName`](crate::store::InvalidTableName) unless
            /// `table` matches `[A-Za-z_][A-Za-z0-9_]{0,62}`.
            $(#[doc = $table_note])?
            pub fn with_table(
                pool: ::sqlx::Pool<$db>,
                table: &str,
            ) -> Result<Self, $crate::store::sql::InvalidTableName> {
                Ok(Self::build(pool, $crate::store::sql::TableName::new(table)?))
            }

            /// The SQL that creates this store's table and indexes, for teams that
            /// apply schema changes with their own tooling. Shown for the default
            /// table in the module docs.
            pub fn schema_sql(&self) -> String {
                self.sql.schema.clone()
            }

            /// The table name.
            pub fn table(&self) -> &str {
                self.sql.table.as_str()
            }

            /// The statement of one state's page of the record listing, with the
            /// dialect's binds (for review and for `EXPLAIN`).
            pub fn list_sql(&self) -> &str {
                &self.sql.common.list_records
            }

            /// The connection pool.
            pub fn pool(&self) -> &::sqlx::Pool<$db> {
                &self.pool
            }
        }

        const _: () = {
            use ::chrono::{DateTime, Utc};
            use $crate::inbox::{Enqueued, NewEvent};
            use $crate::ordering::{Freshness, ObjectKey};
            use $crate::store::sql::{self, args, millis, vanished, Arg, RawRecord, SqlRow};
            use $crate::store::{
                Claim, ClaimRequest, Decision, Deleted, Fingerprint, Key, ProcessedStore, Record,
                RecordState, Recorded, StoreError,
            };

            type Row = <$db as ::sqlx::Database>::Row;

            impl $store {
                /// How the inbox purges its settled events.
                const SETTLED_PURGE: sql::PurgePace = sql::SETTLED_PURGE;

                /// Runs one statement, the query `run` sends, once.
                async fn run_once<T, Fut>(run: impl FnOnce() -> Fut) -> Result<T, StoreError>
                where
                    Fut: ::std::future::Future<Output = Result<T, ::sqlx::Error>>,
                {
                    run().await.map_err($err)
                }

                /// Runs the write `stmt`, one that answers with `RETURNING`, with
                /// `args` under the write gate: the rows it answers (read to the
                /// end, see `fetch_all`).
                async fn write_returning(
                    &self,
                    stmt: &str,
                    args: &[Arg<'_>],
                ) -> Result<Vec<Row>, StoreError> {
                    let _gate = self.write_gate().await?;
                    self.fetch_all(stmt, args).await
                }

                /// One run of the claim statement for `request`: the record when
                /// it claimed the id, `None` when the stored record refused it.
                async fn claim_row(
                    &self,
                    request: &ClaimRequest<'_>,
                ) -> Result<Option<Record>, StoreError> {
                    let claim = &self.sql.claim;
                    let rows = self.write_returning(claim, &args::claim(request)).await?;
                    rows.first()
                        .map(|row| {
                            RawRecord::read(row, 0)
                                .map_err($err)?
                                .into_record(request.key)
                        })
                        .transpose()
                }

                /// A claim's first try: in a batch with the claims of concurrent
                /// deliveries (one statement, one commit; see the store's module
                /// docs), else alone with [`Self::claim_row`]. `Ok(record)` when
                /// it claimed the id; when the stored record refused it,
                /// `Err(Some(record))` if the statement read that record, else
                /// `Err(None)`.
                async fn claim_first(
                    &self,
                    request: &ClaimRequest<'_>,
                ) -> Result<Result<Record, Option<Record>>, StoreError> {
                    use $crate::store::sql::claim_batch::{Batched, ClaimBatcher};
                    Ok(match ClaimBatcher::claim(self, request).await {
                        Batched::Acquired(record) => Ok(record),
                        Batched::Existing(record) => Err(Some(record)),
                        Batched::Refused => Err(None),
                        Batched::Failed(error) => return Err(error),
                        Batched::Alone | Batched::Fresh => {
                            self.claim_row(request).await?.ok_or(None)
                        }
                    })
                }

                /// The claim. Winning path: one statement. Losing path: the claim
                /// changed nothing, so decide on the record (as the batch read it,
                /// or read now); if it vanished in between (purged or deleted), or
                /// changed into one this claim may take over or replace (its
                /// holder failed meanwhile), claim again.
                async fn claim_record(
                    &self,
                    request: &ClaimRequest<'_>,
                ) -> Result<Claim, StoreError> {
                    let key = request.key;
                    for attempt in 0..3 {
                        let claimed = match attempt {
                            0 => self.claim_first(request).await?,
                            _ => self.claim_row(request).await?.ok_or(None),
                        };
                        let seen = match claimed {
                            Ok(record) => return Ok(Claim::Acquired(record)),
                            Err(Some(seen)) => Some(seen),
                            Err(None) => self.get(key).await?,
                        };
                        if let Some(existing) = seen {
                            if request.decide_on(&existing) == Decision::Keep {
                                return Ok(Claim::Existing(existing));
                            }
                        }
                    }
                    Err(vanished(key))
                }

                /// The body of `record_in`.
                async fn record_with(
                    &self,
                    conn: &mut $conn,
                    key: Key<'_>,
                    fingerprint: Fingerprint,
                    now: DateTime<Utc>,
                    expires_at: DateTime<Utc>,
                ) -> Result<Recorded, StoreError> {
                    let args = args::record(key, &fingerprint, now, expires_at);
                    let inserted = sql::query::<$db>(&self.sql.queue.record, &args)
                        // Read to the end (see `fetch_all` in `sql_store_impls!`).
                        .fetch_all(&mut *conn)
                        .await
                        .map_err($err)?;
                    if !inserted.is_empty() {
                        return Ok(Recorded::First);
                    }
                    let stored: Option<(Vec<u8>, String)> =
                        ::sqlx::query_as(&self.sql.common.recorded)
                            .bind(key.namespace)
                            .bind(key.id)
                            .fetch_optional(&mut *conn)
                            .await
                            .map_err($err)?;
                    let (stored, state) = stored.ok_or_else(|| vanished(key))?;
                    sql::recorded(&stored, state.as_bytes(), fingerprint, key)
                }

                /// The delete: removed unless a live lease holds the record, read
                /// again to tell why not.
                async fn delete_record(
                    &self,
                    key: Key<'_>,
                    now: DateTime<Utc>,
                ) -> Result<Deleted, StoreError> {
                    let args = args::key_at(key, now);
                    for _ in 0..3 {
                        let done = {
                            let _gate = self.write_gate().await?;
                            self.execute(&self.sql.common.delete, &args).await?
                        };
                        if done > 0 {
                            return Ok(Deleted::Removed);
                        }
                        match self.get(key).await? {
                            None => return Ok(Deleted::NotFound),
                            Some(r)
                                if r.state == RecordState::InProgress && r.lease_until > now =>
                            {
                                return Ok(Deleted::LeaseHeld)
                            }
                            Some(_) => {} // changed in between: try again
                        }
                    }
                    Err(vanished(key))
                }

                /// The purge: small statements, a rest after each.
                async fn purge_records(
                    &self,
                    now: DateTime<Utc>,
                    limit: usize,
                ) -> Result<u64, StoreError> {
                    self.purge_paced(&self.sql.purge, Self::PURGE_PACE, now, limit)
                        .await
                }

                /// The enqueue: inserted, or the stored event's fingerprint and
                /// state (enqueued again when it was purged in between).
                async fn enqueue_event(
                    &self,
                    event: &NewEvent<'_>,
                ) -> Result<Enqueued, StoreError> {
                    let key = event.key;
                    let args = args::enqueue(event);
                    for _ in 0..3 {
                        let enqueue = &self.sql.queue.enqueue;
                        if !self.write_returning(enqueue, &args).await?.is_empty() {
                            return Ok(Enqueued::Inserted);
                        }
                        let existing = &self.sql.common.existing;
                        if let Some(row) = self.fetch_optional(existing, &args[..2]).await? {
                            let fingerprint = row.bytes(0).map_err($err)?;
                            let state = row.text(1).map_err($err)?;
                            return Ok(Enqueued::Existing {
                                fingerprint: sql::fingerprint(&fingerprint, &key)?,
                                state: sql::inbox_state(&state, &key)?,
                            });
                        }
                        // Purged in between: enqueue again.
                    }
                    Err(vanished(key))
                }

                /// The lease: one statement that marks due events running and
                /// answers them.
                async fn lease_events(
                    &self,
                    namespace: &str,
                    now: DateTime<Utc>,
                    lease_until: DateTime<Utc>,
                    limit: usize,
                ) -> Result<Vec<Row>, StoreError> {
                    let args = [
                        Arg::Text(namespace),
                        Arg::Int(millis(now)),
                        Arg::Int($crate::store::FencingToken::random().as_i64()),
                        Arg::Int(sql::ceil_millis(lease_until)),
                        Arg::Limit(limit as u64),
                    ];
                    self.write_returning(&self.sql.queue.lease, &args).await
                }

                /// The ordering upsert: stored when `created_at` is the newest,
                /// else compared with the newest stored.
                async fn observe_object(
                    &self,
                    key: ObjectKey<'_>,
                    created_at: DateTime<Utc>,
                    now: DateTime<Utc>,
                ) -> Result<Freshness, StoreError> {
                    let args = args::observe(key, created_at, now);
                    let observe = &self.sql.queue.observe;
                    if !self.write_returning(observe, &args).await?.is_empty() {
                        return Ok(Freshness::Fresh);
                    }
                    // Not stored: an event as new or newer is (records are never
                    // deleted, and the newest only grows), so this read finds it.
                    let newest = &self.sql.common.newest;
                    let row = self.fetch_optional(newest, &args[..3]).await?;
                    let newest = row
                        .ok_or(::sqlx::Error::RowNotFound)
                        .and_then(|row| row.bigint(0))
                        .map_err($err)?;
                    if newest == millis(created_at) {
                        // A retry, or another event created at the same time.
                        return Ok(Freshness::Fresh);
                    }
                    Ok(Freshness::Stale {
                        newest: sql::time(newest),
                    })
                }
            }
        };

        $crate::store::sql::impls::sql_store_impls!(
            $store, $db, str, $feature, $err, Self::run_once
        );
    };
}

pub(crate) use returning_ops;
