//! The store traits of the PostgreSQL and SQLite stores, written once.
//!
//! Both stores run the same statements (built by [`Statements`](super::Statements)
//! for their dialect) with the same binds and read the same rows; only the sqlx
//! database type differs, so [`sql_store_impls!`] expands the one body for each.

/// Implements [`ProcessedStore`](crate::store::ProcessedStore),
/// [`InboxStore`](crate::inbox::InboxStore) and
/// [`OrderingStore`](crate::ordering::OrderingStore) for `$store`, and a private
/// `record_with` that runs the transactional record on a `$conn`.
///
/// `$store` must have the fields `pool` (its sqlx pool) and `sql`
/// (`Arc<Statements>`), and an `async fn write_gate(&self)` whose result is held
/// while a write statement runs (SQLite serialises its writes there; PostgreSQL
/// holds nothing), and must batch its claims
/// ([`ClaimBatch`](crate::store::sql::claim_batch::ClaimBatch)). `$err` maps a driver error to a [`StoreError`](crate::store::StoreError).
macro_rules! sql_store_impls {
    ($store:ty, $conn:ty, $err:path) => {
        const _: () = {
            use ::chrono::{DateTime, Utc};
            use $crate::inbox::{Enqueued, InboxEvent, InboxStore, NewEvent, Settle};
            use $crate::ordering::{
                Freshness, ObjectKey, ObjectRecord, ObjectStatus, OrderingStore,
            };
            use $crate::store::sql::{
                self, ceil_millis, count, fence, history_text, millis, purge_in_batches, vanished,
                RawEvent, RawObject, RawRecord, SqlRow,
            };
            use $crate::store::{
                Claim, ClaimRequest, Decision, Deleted, Fence, FencingToken, Fingerprint, Finish,
                Key, ProcessedStore, Record, RecordState, Recorded, StoreError,
            };

            fn record(row: &impl SqlRow, key: Key<'_>) -> Result<Record, StoreError> {
                RawRecord::read(row, 0).map_err($err)?.into_record(key)
            }

            fn event(row: &impl SqlRow) -> Result<InboxEvent, StoreError> {
                RawEvent::read(row).map_err($err)?.into_event()
            }

            fn object(row: &impl SqlRow) -> Result<ObjectRecord, StoreError> {
                RawObject::read(row).map_err($err)?.into_record()
            }

            impl $store {
                /// One run of the claim statement for `request`: the record when
                /// it claimed the id, `None` when the stored record refused it.
                async fn claim_row(
                    &self,
                    request: &ClaimRequest<'_>,
                ) -> Result<Option<Record>, StoreError> {
                    let key = request.key;
                    let _gate = self.write_gate().await?;
                    ::sqlx::query(&self.sql.claim)
                        .bind(key.namespace)
                        .bind(key.id)
                        .bind(&request.fingerprint.0[..])
                        .bind(request.token.as_i64())
                        .bind(ceil_millis(request.lease_until))
                        .bind(ceil_millis(request.expires_at))
                        .bind(millis(request.now))
                        .bind(&Fingerprint::UNKNOWN.0[..])
                        // Read to the end, never just the first row: SQLite commits
                        // an autocommit `INSERT … RETURNING` only then, and a commit
                        // that fails (a reader's lock past the busy timeout, a full
                        // disk) must be an error, not a row answered as stored and
                        // then rolled back.
                        .fetch_all(&self.pool)
                        .await
                        .map_err($err)?
                        .first()
                        .map(|row| record(row, key))
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

                /// The body of `record_in`.
                async fn record_with(
                    &self,
                    conn: &mut $conn,
                    key: Key<'_>,
                    fingerprint: Fingerprint,
                    now: DateTime<Utc>,
                    expires_at: DateTime<Utc>,
                ) -> Result<Recorded, StoreError> {
                    let q = &self.sql.queue;
                    let inserted = ::sqlx::query(&q.record)
                        .bind(key.namespace)
                        .bind(key.id)
                        .bind(&fingerprint.0[..])
                        .bind(FencingToken::random().as_i64())
                        .bind(millis(now))
                        .bind(ceil_millis(expires_at))
                        .bind(&Fingerprint::UNKNOWN.0[..])
                        // Read to the end (see `claim`).
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

                /// Runs `sql`, an `UPDATE` of the status of an object whose newest is
                /// `created_at`: whether it changed a row (the caller holds the write
                /// gate).
                async fn object_update(
                    &self,
                    sql: &str,
                    key: ObjectKey<'_>,
                    created_at: DateTime<Utc>,
                    status: ObjectStatus,
                    now: DateTime<Utc>,
                ) -> Result<bool, StoreError> {
                    self.object_update_since(sql, key, created_at, status, now, None)
                        .await
                }

                /// [`Self::object_update`], binding `failed_since` too (`$7`) when
                /// given.
                async fn object_update_since(
                    &self,
                    sql: &str,
                    key: ObjectKey<'_>,
                    created_at: DateTime<Utc>,
                    status: ObjectStatus,
                    now: DateTime<Utc>,
                    failed_since: Option<DateTime<Utc>>,
                ) -> Result<bool, StoreError> {
                    let mut query = ::sqlx::query(sql)
                        .bind(key.namespace)
                        .bind(key.object)
                        .bind(key.family)
                        .bind(millis(created_at))
                        .bind(status.as_str())
                        .bind(millis(now));
                    if let Some(since) = failed_since {
                        query = query.bind(millis(since));
                    }
                    let done = query.execute(&self.pool).await.map_err($err)?;
                    Ok(done.rows_affected() == 1)
                }
            }

            #[::async_trait::async_trait]
            impl ProcessedStore for $store {
                async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
                    let key = request.key;
                    // Winning path: one statement. Losing path: the claim changed nothing,
                    // so decide on the record (as the batch read it, or read now); if
                    // it vanished in between (purged or deleted), or changed into one
                    // this claim may take over or replace (its holder failed
                    // meanwhile), claim again.
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

                async fn finish(
                    &self,
                    key: Key<'_>,
                    token: FencingToken,
                    finish: &Finish<'_>,
                ) -> Result<Fence, StoreError> {
                    let _gate = self.write_gate().await?;
                    let done = ::sqlx::query(&self.sql.common.finish)
                        .bind(key.namespace)
                        .bind(key.id)
                        .bind(token.as_i64())
                        .bind(finish.state.as_str())
                        .bind(count(finish.failures))
                        .bind(history_text(finish.history))
                        .bind(millis(finish.now))
                        .bind(ceil_millis(finish.expires_at))
                        .execute(&self.pool)
                        .await
                        .map_err($err)?;
                    Ok(fence(done.rows_affected()))
                }

                async fn renew(
                    &self,
                    key: Key<'_>,
                    token: FencingToken,
                    lease_until: DateTime<Utc>,
                    expires_at: DateTime<Utc>,
                ) -> Result<Fence, StoreError> {
                    let _gate = self.write_gate().await?;
                    let done = ::sqlx::query(&self.sql.common.renew)
                        .bind(key.namespace)
                        .bind(key.id)
                        .bind(token.as_i64())
                        .bind(ceil_millis(lease_until))
                        .bind(ceil_millis(expires_at))
                        .execute(&self.pool)
                        .await
                        .map_err($err)?;
                    Ok(fence(done.rows_affected()))
                }

                async fn get(&self, key: Key<'_>) -> Result<Option<Record>, StoreError> {
                    let row = ::sqlx::query(&self.sql.common.get)
                        .bind(key.namespace)
                        .bind(key.id)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err($err)?;
                    row.map(|row| record(&row, key)).transpose()
                }

                async fn delete(
                    &self,
                    key: Key<'_>,
                    now: DateTime<Utc>,
                ) -> Result<Deleted, StoreError> {
                    for _ in 0..3 {
                        let done = {
                            let _gate = self.write_gate().await?;
                            ::sqlx::query(&self.sql.common.delete)
                                .bind(key.namespace)
                                .bind(key.id)
                                .bind(millis(now))
                                .execute(&self.pool)
                                .await
                                .map_err($err)?
                        };
                        if done.rows_affected() > 0 {
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

                async fn purge_expired(
                    &self,
                    now: DateTime<Utc>,
                    limit: usize,
                ) -> Result<u64, StoreError> {
                    // Small statements, a rest after each (see `PurgePace`); the gate
                    // is taken per statement, so claims waiting for it go first.
                    purge_in_batches(limit, Self::PURGE_PACE, |n| async move {
                        let _gate = self.write_gate().await?;
                        ::sqlx::query(&self.sql.purge)
                            .bind(millis(now))
                            .bind(sql::limit(n))
                            .execute(&self.pool)
                            .await
                            .map(|done| done.rows_affected())
                            .map_err($err)
                    })
                    .await
                }

                async fn stuck(
                    &self,
                    now: DateTime<Utc>,
                    limit: usize,
                ) -> Result<Vec<Record>, StoreError> {
                    if limit == 0 {
                        return Ok(Vec::new());
                    }
                    let rows = ::sqlx::query(&self.sql.common.stuck)
                        .bind(millis(now))
                        .bind(sql::limit(limit))
                        .fetch_all(&self.pool)
                        .await
                        .map_err($err)?;
                    rows.iter()
                        .map(|row| {
                            let namespace = row.text(0).map_err($err)?;
                            let id = row.text(1).map_err($err)?;
                            RawRecord::read(row, 2)
                                .map_err($err)?
                                .into_record(Key::new(&namespace, &id))
                        })
                        .collect()
                }
            }

            #[::async_trait::async_trait]
            impl InboxStore for $store {
                async fn enqueue(&self, event: &NewEvent<'_>) -> Result<Enqueued, StoreError> {
                    let q = &self.sql.queue;
                    let key = event.key;
                    for _ in 0..3 {
                        let inserted = {
                            let _gate = self.write_gate().await?;
                            ::sqlx::query(&q.enqueue)
                                .bind(key.namespace)
                                .bind(key.id)
                                .bind(&event.fingerprint.0[..])
                                .bind(event.meta.event_type.as_deref())
                                .bind(event.meta.created_at.map(millis))
                                .bind(event.meta.object.as_deref())
                                .bind(event.meta.family.as_deref())
                                .bind(event.payload)
                                .bind(millis(event.now))
                                .bind(ceil_millis(event.expires_at))
                                // Read to the end (see `claim`).
                                .fetch_all(&self.pool)
                                .await
                                .map_err($err)?
                        };
                        if !inserted.is_empty() {
                            return Ok(Enqueued::Inserted);
                        }
                        let row = ::sqlx::query(&self.sql.common.existing)
                            .bind(key.namespace)
                            .bind(key.id)
                            .fetch_optional(&self.pool)
                            .await
                            .map_err($err)?;
                        if let Some(row) = row {
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

                async fn lease(
                    &self,
                    namespace: &str,
                    now: DateTime<Utc>,
                    lease_until: DateTime<Utc>,
                    limit: usize,
                ) -> Result<Vec<InboxEvent>, StoreError> {
                    if limit == 0 {
                        return Ok(Vec::new());
                    }
                    let _gate = self.write_gate().await?;
                    let rows = ::sqlx::query(&self.sql.queue.lease)
                        .bind(namespace)
                        .bind(millis(now))
                        .bind(FencingToken::random().as_i64())
                        .bind(ceil_millis(lease_until))
                        .bind(sql::limit(limit))
                        .fetch_all(&self.pool)
                        .await
                        .map_err($err)?;
                    let mut events = rows.iter().map(event).collect::<Result<Vec<_>, _>>()?;
                    events.sort_by_key(|e| e.next_attempt_at);
                    Ok(events)
                }

                async fn settle_event(
                    &self,
                    key: Key<'_>,
                    token: FencingToken,
                    settle: &Settle<'_>,
                ) -> Result<Fence, StoreError> {
                    let _gate = self.write_gate().await?;
                    let done = ::sqlx::query(&self.sql.common.settle)
                        .bind(key.namespace)
                        .bind(key.id)
                        .bind(token.as_i64())
                        .bind(settle.state.as_str())
                        .bind(ceil_millis(settle.next_attempt_at))
                        .bind(settle.error)
                        .bind(millis(settle.now))
                        .bind(ceil_millis(settle.expires_at))
                        .bind(i32::from(!settle.attempt_counts))
                        .execute(&self.pool)
                        .await
                        .map_err($err)?;
                    if done.rows_affected() == 0 {
                        // The same settle made again (its answer was lost)?
                        let event = self.get_event(key).await?;
                        if event.is_some_and(|e| crate::inbox::settled_already(&e, token, settle)) {
                            return Ok(Fence::Applied);
                        }
                    }
                    Ok(fence(done.rows_affected()))
                }

                async fn renew_event(
                    &self,
                    key: Key<'_>,
                    token: FencingToken,
                    lease_until: DateTime<Utc>,
                ) -> Result<Fence, StoreError> {
                    let _gate = self.write_gate().await?;
                    let done = ::sqlx::query(&self.sql.common.renew_event)
                        .bind(key.namespace)
                        .bind(key.id)
                        .bind(token.as_i64())
                        .bind(ceil_millis(lease_until))
                        .execute(&self.pool)
                        .await
                        .map_err($err)?;
                    Ok(fence(done.rows_affected()))
                }

                async fn get_event(&self, key: Key<'_>) -> Result<Option<InboxEvent>, StoreError> {
                    let row = ::sqlx::query(&self.sql.common.get_event)
                        .bind(key.namespace)
                        .bind(key.id)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err($err)?;
                    row.as_ref().map(event).transpose()
                }

                async fn purge_settled(
                    &self,
                    now: DateTime<Utc>,
                    limit: usize,
                ) -> Result<u64, StoreError> {
                    purge_in_batches(limit, sql::SETTLED_PURGE, |n| async move {
                        let _gate = self.write_gate().await?;
                        ::sqlx::query(&self.sql.queue.purge)
                            .bind(millis(now))
                            .bind(sql::limit(n))
                            .execute(&self.pool)
                            .await
                            .map(|done| done.rows_affected())
                            .map_err($err)
                    })
                    .await
                }
            }

            #[::async_trait::async_trait]
            impl OrderingStore for $store {
                async fn observe(
                    &self,
                    key: ObjectKey<'_>,
                    created_at: DateTime<Utc>,
                    now: DateTime<Utc>,
                ) -> Result<Freshness, StoreError> {
                    let q = &self.sql.queue;
                    let fresh = {
                        let _gate = self.write_gate().await?;
                        ::sqlx::query(&q.observe)
                            .bind(key.namespace)
                            .bind(key.object)
                            .bind(key.family)
                            .bind(millis(created_at))
                            .bind(millis(now))
                            // Read to the end (see `claim`).
                            .fetch_all(&self.pool)
                            .await
                            .map_err($err)?
                    };
                    if !fresh.is_empty() {
                        return Ok(Freshness::Fresh);
                    }
                    // Not stored: an event as new or newer is (records are never
                    // deleted, and the newest only grows), so this read finds it.
                    let newest: i64 = ::sqlx::query_scalar(&self.sql.common.newest)
                        .bind(key.namespace)
                        .bind(key.object)
                        .bind(key.family)
                        .fetch_one(&self.pool)
                        .await
                        .map_err($err)?;
                    if newest == millis(created_at) {
                        // A retry, or another event created at the same time.
                        return Ok(Freshness::Fresh);
                    }
                    Ok(Freshness::Stale {
                        newest: sql::time(newest),
                    })
                }

                async fn settle_object(
                    &self,
                    key: ObjectKey<'_>,
                    created_at: DateTime<Utc>,
                    status: ObjectStatus,
                    now: DateTime<Utc>,
                ) -> Result<bool, StoreError> {
                    let _gate = self.write_gate().await?;
                    let c = &self.sql.common;
                    if self
                        .object_update(&c.settle_object, key, created_at, status, now)
                        .await?
                    {
                        return Ok(true);
                    }
                    if status == ObjectStatus::Failed {
                        // Settled first by another event created at the same time: a
                        // failure is never hidden.
                        self.object_update(&c.mark_object, key, created_at, status, now)
                            .await?;
                    }
                    Ok(false)
                }

                async fn mark_object(
                    &self,
                    key: ObjectKey<'_>,
                    created_at: DateTime<Utc>,
                    status: ObjectStatus,
                    now: DateTime<Utc>,
                ) -> Result<bool, StoreError> {
                    let _gate = self.write_gate().await?;
                    let sql = &self.sql.common.mark_object;
                    self.object_update(sql, key, created_at, status, now).await
                }

                async fn mark_object_if_failed(
                    &self,
                    key: ObjectKey<'_>,
                    created_at: DateTime<Utc>,
                    failed_since: DateTime<Utc>,
                    status: ObjectStatus,
                    now: DateTime<Utc>,
                ) -> Result<bool, StoreError> {
                    let _gate = self.write_gate().await?;
                    let sql = &self.sql.common.mark_if_failed;
                    self.object_update_since(sql, key, created_at, status, now, Some(failed_since))
                        .await
                }

                async fn get_object(
                    &self,
                    key: ObjectKey<'_>,
                ) -> Result<Option<ObjectRecord>, StoreError> {
                    let row = ::sqlx::query(&self.sql.common.get_object)
                        .bind(key.namespace)
                        .bind(key.object)
                        .bind(key.family)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err($err)?;
                    row.as_ref().map(object).transpose()
                }

                async fn failed_objects(
                    &self,
                    namespace: &str,
                    before: DateTime<Utc>,
                    limit: usize,
                ) -> Result<Vec<ObjectRecord>, StoreError> {
                    if limit == 0 {
                        return Ok(Vec::new());
                    }
                    let rows = ::sqlx::query(&self.sql.common.failed)
                        .bind(namespace)
                        .bind(millis(before))
                        .bind(sql::limit(limit))
                        .fetch_all(&self.pool)
                        .await
                        .map_err($err)?;
                    rows.iter().map(object).collect()
                }
            }
        };
    };
}

pub(crate) use sql_store_impls;
