//! The store traits of the SQL stores, written once.
//!
//! Every SQL store runs the statements of `Common` (built for its
//! dialect) with the same arguments ([`args`](super::args)) and reads the same rows;
//! what a dialect writes its own way (the claim, the delete and purge, the enqueue
//! and lease, the ordering upsert) each store provides as an inherent method, and
//! [`sql_store_impls!`] expands the one body of each trait for each store.

/// Implements [`ProcessedStore`](crate::store::ProcessedStore),
/// [`InboxStore`](crate::inbox::InboxStore) and
/// [`OrderingStore`](crate::ordering::OrderingStore) for `$store`, a store of the
/// cargo feature `$feature` on the sqlx database `$db`, and gives it `execute`,
/// `fetch_optional` and `fetch_all`, which run one of its statements on its pool.
///
/// `$store` must have the fields `pool` (its sqlx pool) and `sql` (its statements,
/// with `common` the `Common` ones and `queue.purge` the purge of settled events),
/// the constant `SETTLED_PURGE` (how that purge paces itself) and these methods:
/// - `write_gate(&self)`, whose result is held while a write statement runs
///   (SQLite serialises its writes there; PostgreSQL and MySQL hold nothing);
/// - `claim_record`, `delete_record`, `purge_records`, `enqueue_event`,
///   `lease_events` and `observe_object`: the trait methods of those names (less
///   the suffix) as the dialect writes them.
///
/// `$stmt` is the type of its statements (a [`Statement`](crate::store::sql::Statement)
/// of `$db`), `$err` maps a driver error to a [`StoreError`](crate::store::StoreError),
/// and `$run` runs one statement, given the closure that sends its query, and maps
/// its error (MySQL's runs it again after a deadlock).
macro_rules! sql_store_impls {
    ($store:ty, $db:ty, $stmt:ty, $feature:literal, $err:path, $run:path) => {
        const _: () = {
            use ::chrono::{DateTime, Utc};
            use $crate::inbox::{
                Enqueued, InboxEvent, InboxStore, LeaseRequest, NewEvent, RenewLease, Settle,
            };
            use $crate::ordering::{
                FailedMark, FailedPage, Freshness, ObjectKey, ObjectMark, ObjectRecord,
                ObjectStatus, Observation, OrderingStore,
            };
            use $crate::store::sql::{
                self, args, fence, history_text, keyed_record, purge_in_batches, RawEvent,
                RawObject, RawRecord, SqlRow, Statement,
            };
            use $crate::store::{
                Claim, ClaimRequest, Deleted, Fence, Finish, Holder, Key, ProcessedStore, Record,
                Renew, StoreError,
            };

            fn event(row: &impl SqlRow) -> Result<InboxEvent, StoreError> {
                RawEvent::read(row, 0).map_err($err)?.into_event()
            }

            fn object(row: &impl SqlRow) -> Result<ObjectRecord, StoreError> {
                RawObject::read(row, 0).map_err($err)?.into_record()
            }

            type Row = <$db as ::sqlx::Database>::Row;

            impl $store {
                /// Runs the write `stmt` with `args`: the rows it changed.
                async fn execute(
                    &self,
                    stmt: &$stmt,
                    args: &[sql::Arg<'_>],
                ) -> Result<u64, StoreError> {
                    let query = || Statement::<$db>::bind(stmt, args).execute(&self.pool);
                    Ok($run(query).await?.rows_affected())
                }

                /// Runs `stmt` with `args`: its row, if any.
                async fn fetch_optional(
                    &self,
                    stmt: &$stmt,
                    args: &[sql::Arg<'_>],
                ) -> Result<Option<Row>, StoreError> {
                    $run(|| Statement::<$db>::bind(stmt, args).fetch_optional(&self.pool)).await
                }

                /// Runs `stmt` with `args`: all its rows. Read to the end, never
                /// just the first row: SQLite commits an autocommit
                /// `INSERT … RETURNING` only then, and a commit that fails (a
                /// reader's lock past the busy timeout, a full disk) must be an
                /// error, not a row answered as stored and then rolled back.
                async fn fetch_all(
                    &self,
                    stmt: &$stmt,
                    args: &[sql::Arg<'_>],
                ) -> Result<Vec<Row>, StoreError> {
                    $run(|| Statement::<$db>::bind(stmt, args).fetch_all(&self.pool)).await
                }

                /// Sets the status of an object whose newest is `created_at` with
                /// the `UPDATE` `stmt`, binding `failed_since` too (`$7`) when
                /// given: whether it changed a row (the caller holds the write
                /// gate).
                async fn object_update(
                    &self,
                    stmt: &$stmt,
                    key: ObjectKey<'_>,
                    created_at: DateTime<Utc>,
                    status: ObjectStatus,
                    now: DateTime<Utc>,
                    failed_since: Option<DateTime<Utc>>,
                ) -> Result<bool, StoreError> {
                    let args = args::object_status(key, created_at, status, now, failed_since);
                    Ok(self.execute(stmt, &args).await? == 1)
                }

                /// Runs the fenced `UPDATE` `stmt` under the write gate: applied
                /// when it changed the one row it names.
                async fn fenced(
                    &self,
                    stmt: &$stmt,
                    args: &[sql::Arg<'_>],
                ) -> Result<Fence, StoreError> {
                    let _gate = self.write_gate().await?;
                    Ok(fence(self.execute(stmt, args).await?))
                }

                /// Removes up to `limit` rows with `stmt`, a `DELETE` of rows
                /// stale at $1 limited to $2 rows, in paced statements (see
                /// `PurgePace`); the gate is taken per statement, so claims
                /// waiting for it go first.
                async fn purge_paced(
                    &self,
                    stmt: &$stmt,
                    pace: sql::PurgePace,
                    now: DateTime<Utc>,
                    limit: usize,
                ) -> Result<u64, StoreError> {
                    purge_in_batches(limit, pace, |n| async move {
                        let _gate = self.write_gate().await?;
                        self.execute(stmt, &args::until(now, n)).await
                    })
                    .await
                }
            }

            #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
            #[::async_trait::async_trait]
            impl ProcessedStore for $store {
                async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
                    self.claim_record(request).await
                }

                async fn finish(
                    &self,
                    holder: Holder<'_>,
                    finish: &Finish<'_>,
                ) -> Result<Fence, StoreError> {
                    let Holder { key, token } = holder;
                    let history = history_text(finish.history);
                    let args = args::finish(key, token, finish, &history);
                    self.fenced(&self.sql.common.finish, &args).await
                }

                async fn renew(
                    &self,
                    holder: Holder<'_>,
                    renew: &Renew,
                ) -> Result<Fence, StoreError> {
                    let Holder { key, token } = holder;
                    let args = args::renew(key, token, renew.lease_until, Some(renew.expires_at));
                    self.fenced(&self.sql.common.renew, &args).await
                }

                async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
                    let row = self
                        .fetch_optional(&self.sql.common.get, &args::key(key))
                        .await?;
                    row.map(|row| RawRecord::read(&row, 0).map_err($err)?.into_record(key))
                        .transpose()
                }

                async fn delete(
                    &self,
                    key: Key<'_>,
                    now: DateTime<Utc>,
                ) -> Result<Deleted, StoreError> {
                    self.delete_record(key, now).await
                }

                async fn purge_expired(
                    &self,
                    now: DateTime<Utc>,
                    limit: usize,
                ) -> Result<u64, StoreError> {
                    self.purge_records(now, limit).await
                }

                async fn stuck(
                    &self,
                    now: DateTime<Utc>,
                    limit: usize,
                ) -> Result<Vec<Record>, StoreError> {
                    if limit == 0 {
                        return Ok(Vec::new());
                    }
                    let stuck = &self.sql.common.stuck;
                    let rows = self.fetch_all(stuck, &args::until(now, limit)).await?;
                    rows.iter().map(|row| keyed_record(row, $err)).collect()
                }

                fn record_listing(&self) -> Option<&dyn $crate::store::ListingStore> {
                    Some(self)
                }
            }

            #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
            #[::async_trait::async_trait]
            impl InboxStore for $store {
                async fn enqueue(&self, event: &NewEvent<'_>) -> Result<Enqueued, StoreError> {
                    self.enqueue_event(event).await
                }

                async fn lease(
                    &self,
                    request: &LeaseRequest<'_>,
                ) -> Result<Vec<InboxEvent>, StoreError> {
                    if request.limit == 0 {
                        return Ok(Vec::new());
                    }
                    let (namespace, limit) = (request.namespace, request.limit);
                    let rows = self
                        .lease_events(namespace, request.now, request.lease_until, limit)
                        .await?;
                    let mut events = rows.iter().map(event).collect::<Result<Vec<_>, _>>()?;
                    events.sort_by_key(|e| e.next_attempt_at);
                    Ok(events)
                }

                async fn settle_event(&self, settle: &Settle<'_>) -> Result<Fence, StoreError> {
                    let args = args::settle(settle);
                    let done = {
                        let _gate = self.write_gate().await?;
                        self.execute(&self.sql.common.settle, &args).await?
                    };
                    if done == 0 {
                        // The same settle made again (its answer was lost)?
                        let event = self.get_event(settle.holder.key).await?;
                        if event.is_some_and(|e| $crate::inbox::settled_already(&e, settle)) {
                            return Ok(Fence::Applied);
                        }
                    }
                    Ok(fence(done))
                }

                async fn renew_event(&self, renew: &RenewLease<'_>) -> Result<Fence, StoreError> {
                    let Holder { key, token } = renew.holder;
                    let args = args::renew(key, token, renew.lease_until, None);
                    self.fenced(&self.sql.common.renew_event, &args).await
                }

                async fn get_event(&self, key: Key<'_>) -> Result<Option<InboxEvent>, StoreError> {
                    let row = self
                        .fetch_optional(&self.sql.common.get_event, &args::key(key))
                        .await?;
                    row.as_ref().map(event).transpose()
                }

                async fn purge_settled(
                    &self,
                    now: DateTime<Utc>,
                    limit: usize,
                ) -> Result<u64, StoreError> {
                    let purge = &self.sql.queue.purge;
                    self.purge_paced(purge, Self::SETTLED_PURGE, now, limit)
                        .await
                }

                fn inbox_listing(&self) -> Option<&dyn $crate::inbox::InboxListing> {
                    Some(self)
                }
            }

            #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
            #[::async_trait::async_trait]
            impl OrderingStore for $store {
                async fn observe(&self, event: &Observation<'_>) -> Result<Freshness, StoreError> {
                    let (key, created_at, now) = (event.key, event.created_at, event.now);
                    self.observe_object(key, created_at, now).await
                }

                async fn settle_object(&self, mark: &ObjectMark<'_>) -> Result<bool, StoreError> {
                    let _gate = self.write_gate().await?;
                    let c = &self.sql.common;
                    if self
                        .object_update(
                            &c.settle_object,
                            mark.key,
                            mark.created_at,
                            mark.status,
                            mark.now,
                            None,
                        )
                        .await?
                    {
                        return Ok(true);
                    }
                    if mark.status == ObjectStatus::Failed {
                        // Settled first by another event created at the same time: a
                        // failure is never hidden.
                        self.object_update(
                            &c.mark_object,
                            mark.key,
                            mark.created_at,
                            mark.status,
                            mark.now,
                            None,
                        )
                        .await?;
                    }
                    Ok(false)
                }

                async fn mark_object(&self, mark: &ObjectMark<'_>) -> Result<bool, StoreError> {
                    let _gate = self.write_gate().await?;
                    let stmt = &self.sql.common.mark_object;
                    self.object_update(stmt, mark.key, mark.created_at, mark.status, mark.now, None)
                        .await
                }

                async fn mark_object_if_failed(
                    &self,
                    mark: &FailedMark<'_>,
                ) -> Result<bool, StoreError> {
                    let _gate = self.write_gate().await?;
                    let stmt = &self.sql.common.mark_if_failed;
                    self.object_update(
                        stmt,
                        mark.key,
                        mark.created_at,
                        mark.status,
                        mark.now,
                        Some(mark.failed_since),
                    )
                    .await
                }

                async fn get_object(
                    &self,
                    key: ObjectKey<'_>,
                ) -> Result<Option<ObjectRecord>, StoreError> {
                    let args = args::object_key(key);
                    let row = self
                        .fetch_optional(&self.sql.common.get_object, &args)
                        .await?;
                    row.as_ref().map(object).transpose()
                }

                async fn failed_objects(
                    &self,
                    page: &FailedPage<'_>,
                ) -> Result<Vec<ObjectRecord>, StoreError> {
                    let (namespace, before, limit) = (page.namespace, page.before, page.limit);
                    if limit == 0 {
                        return Ok(Vec::new());
                    }
                    let args = args::failed(namespace, before, limit);
                    let rows = self.fetch_all(&self.sql.common.failed, &args).await?;
                    rows.iter().map(object).collect()
                }
            }
        };
        $crate::store::sql::listing::sql_listing_impls!($store, $db, $feature, $err);
    };
}

pub(crate) use sql_store_impls;
