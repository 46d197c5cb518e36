//! The ordering guard: per target object and event family, remember the newest
//! `created_at` seen, and hold back an older event that arrives late.
//!
//! Providers retry for hours, so a `charge.pending` can arrive after the
//! `charge.succeeded` that followed it. Applying it would overwrite newer state. The
//! guard asks an [`OrderingStore`] first: an event older than the newest one seen
//! for its object and family is [`Freshness::Stale`] and is skipped (answered 2xx)
//! or handed to the stale hook. Keys are object ids (`trx-…`, `cus-…`, `ch_…`),
//! never webhook ids.
//!
//! Events of one object with the *same* `created_at` (Stripe's `created` is in
//! whole seconds) cannot be ordered by it: each is fresh, but only the first of
//! them to settle settles the object; a later one, applied too, is answered as
//! overtaken, and the guard asks the reconciler to read the object's state from the
//! provider. An object's record is never deleted by any store (one small entry per
//! object and family, for the life of the store), so the ledger grows with the
//! number of objects, not with retention.

use std::fmt;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::meta::EventMeta;
use crate::store::StoreError;

/// Identifies the state of one object for one event family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectKey<'a> {
    /// The namespace (one per provider or endpoint).
    pub namespace: &'a str,
    /// The object id, such as `trx-123`.
    pub object: &'a str,
    /// The event family, such as `charge`.
    pub family: &'a str,
}

impl fmt::Display for ObjectKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.object, self.family)
    }
}

/// Whether an event is the newest seen for its object and family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// No newer event was seen: apply it.
    Fresh,
    /// A newer event was already seen: applying this one would go back in time.
    Stale {
        /// The `created_at` of the newest event seen.
        newest: DateTime<Utc>,
    },
}

/// How the newest event of an object ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ObjectStatus {
    /// Seen, not yet settled.
    Pending,
    /// Applied.
    Applied,
    /// Its processing failed for good (escalated, dead-lettered, permanent failure):
    /// the object needs reconciling through the provider's API.
    Failed,
}

impl ObjectStatus {
    /// The name stores write.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Applied => "applied",
            Self::Failed => "failed",
        }
    }

    /// Parses [`ObjectStatus::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => Self::Pending,
            "applied" => Self::Applied,
            "failed" => Self::Failed,
            _ => return None,
        })
    }
}

/// An event of an object as [`OrderingStore::observe`] records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation<'a> {
    /// The object and family.
    pub key: ObjectKey<'a>,
    /// The `created_at` of the event.
    pub created_at: DateTime<Utc>,
    /// The current time (becomes `updated_at` when the event is newer than the
    /// stored newest or the first one; a tie changes nothing).
    pub now: DateTime<Utc>,
}

/// A change to the status of an object's newest event: see
/// [`OrderingStore::settle_object`] and [`OrderingStore::mark_object`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectMark<'a> {
    /// The object and family.
    pub key: ObjectKey<'a>,
    /// The `created_at` of the event: the change is made only while it is the newest.
    pub created_at: DateTime<Utc>,
    /// The new status.
    pub status: ObjectStatus,
    /// The current time (becomes `updated_at`).
    pub now: DateTime<Utc>,
}

/// A change to the status of an object's newest event that holds only while that
/// event is still a failure recorded at or before `failed_since`: see
/// [`OrderingStore::mark_object_if_failed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailedMark<'a> {
    /// The object and family.
    pub key: ObjectKey<'a>,
    /// The `created_at` of the event: the change is made only while it is the newest.
    pub created_at: DateTime<Utc>,
    /// The latest time the failure may have been recorded at.
    pub failed_since: DateTime<Utc>,
    /// The new status.
    pub status: ObjectStatus,
    /// The current time (becomes `updated_at`).
    pub now: DateTime<Utc>,
}

/// Which page of failed objects [`OrderingStore::failed_objects`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailedPage<'a> {
    /// The namespace whose objects to list.
    pub namespace: &'a str,
    /// Only objects last changed at or before this time.
    pub before: DateTime<Utc>,
    /// How many objects to list at the most.
    pub limit: usize,
}

/// What an [`OrderingStore`] keeps per object and family.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectRecord {
    /// The namespace.
    pub namespace: String,
    /// The object id.
    pub object: String,
    /// The event family.
    pub family: String,
    /// The newest `created_at` seen.
    pub newest: DateTime<Utc>,
    /// How the newest event ended.
    pub status: ObjectStatus,
    /// When the record last changed.
    pub updated_at: DateTime<Utc>,
}

impl ObjectRecord {
    /// Builds a record, for store implementations.
    pub fn new(
        key: ObjectKey<'_>,
        newest: DateTime<Utc>,
        status: ObjectStatus,
        updated_at: DateTime<Utc>,
    ) -> Self {
        Self {
            namespace: key.namespace.to_owned(),
            object: key.object.to_owned(),
            family: key.family.to_owned(),
            newest,
            status,
            updated_at,
        }
    }

    /// The record's key.
    pub fn key(&self) -> ObjectKey<'_> {
        ObjectKey {
            namespace: &self.namespace,
            object: &self.object,
            family: &self.family,
        }
    }
}

/// How far past `now` an event's `created_at` may lie and still take part in
/// ordering: 5 minutes of clock skew between the provider and this host. One further
/// ahead (a provider's bug, a test fixture, a unit mistaken for another, or a
/// `created_at` the signature does not cover, rewritten by whoever replays a
/// genuine body) would make every later event of its object stale until that time:
/// such an event is processed unordered, with a warning.
pub const MAX_CLOCK_SKEW: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

/// Whether an event created at `created_at` and received at `received` takes part in
/// ordering (see [`MAX_CLOCK_SKEW`]). Decided by the arrival, not the clock, so that
/// an event's ordering check and its settle agree.
fn orderable(created_at: DateTime<Utc>, received: DateTime<Utc>) -> bool {
    created_at <= crate::later(received, MAX_CLOCK_SKEW)
}

/// The longest object id or family, in bytes, that takes part in ordering: what
/// every built-in ordering store can key on (MySQL's `VARBINARY(255)`).
pub const MAX_OBJECT_LEN: usize = 255;

/// Whether the object id and family of `meta` can key the ordering ledger.
fn keyable(meta: &EventMeta) -> bool {
    let fits = |part: &str| part.len() <= MAX_OBJECT_LEN;
    meta.object.as_deref().is_some_and(fits) && meta.family.as_deref().is_none_or(fits)
}

/// The ordering key and `created_at` of an event with metadata `meta` under
/// `namespace`, received at `received`, when it takes part in ordering: what
/// [`ordered`] decides, without its warnings.
pub(crate) fn ordered_key<'a>(
    namespace: &'a str,
    meta: &'a EventMeta,
    received: DateTime<Utc>,
) -> Option<(ObjectKey<'a>, DateTime<Utc>)> {
    let (key, created_at) = object_key(namespace, meta)?;
    (keyable(meta) && orderable(created_at, received)).then_some((key, created_at))
}

/// Whether the event `id` with metadata `meta`, received at `received`, takes part
/// in ordering: it names an object and an [orderable](orderable) `created_at`. An
/// event about an object that does not is processed unordered, with a warning: its
/// `created_at` is too far ahead, or could not be read (missing, or in a form the
/// extractor does not know), or its object id or family is longer than
/// [`MAX_OBJECT_LEN`] bytes (MySQL's ordering table could not key it, and a
/// refused ordering write would answer 503 at every retry). Called once per
/// delivery, so it warns once.
pub(crate) fn ordered(id: &str, meta: &EventMeta, received: DateTime<Utc>) -> bool {
    // The namespace plays no part in the decision.
    if ordered_key("", meta, received).is_some() {
        return true;
    }
    match (&meta.object, meta.created_at) {
        (Some(_), Some(_)) if !keyable(meta) => {
            tracing::warn!(%id, max = MAX_OBJECT_LEN, "event's object id or family is too long: not ordered");
        }
        (Some(_), Some(created_at)) => {
            tracing::warn!(%id, %created_at, "event created in the future beyond the allowed skew: not ordered");
        }
        (Some(_), None) => {
            tracing::warn!(%id, "event has an object but no readable created_at: not ordered");
        }
        (None, _) => {}
    }
    false
}

/// Marks the object `key` applied after the reconciler settled it, for an event
/// created at `created_at` that had settled it failed no later than
/// `failed_since`: only while the object is still that failure, not one another
/// event created at the same time settled since (whose own reconcile, should it
/// fail, must stay listed for `reconcile_stale`). One conditional change in the
/// store ([`OrderingStore::mark_object_if_failed`]), so no failure lands between a
/// check and the mark.
pub(crate) async fn mark_reconciled(
    ordering: &dyn OrderingStore,
    key: ObjectKey<'_>,
    created_at: DateTime<Utc>,
    failed_since: DateTime<Utc>,
    now: DateTime<Utc>,
) {
    let status = ObjectStatus::Applied;
    let mark = FailedMark {
        key,
        created_at,
        failed_since,
        status,
        now,
    };
    let cleared = ordering.mark_object_if_failed(&mark).await;
    if let Err(e) = cleared {
        tracing::warn!(error = %e, "could not mark a reconciled object applied; reconcile_stale may ask again");
    }
}

/// Settles the object of event `id` (`object`: its key and `created_at`, if it is
/// ordered) with `status`, for the guard and the worker alike; `false` only when the
/// ordering store answers that a newer event of the object was seen since, or that
/// another one created at the same time settled it first (not on an error, nor
/// without an ordering store or object). A `Failed` status the store did not take is
/// settled again in the background ([`settle_failed_later`]): a failure must reach
/// the ledger, or `reconcile_stale` never lists the object should the reconciler
/// fail too.
pub(crate) async fn settle_object(
    ordering: Option<&std::sync::Arc<dyn OrderingStore>>,
    clock: &std::sync::Arc<dyn crate::clock::Clock>,
    object: Option<(ObjectKey<'_>, DateTime<Utc>)>,
    status: ObjectStatus,
    id: &str,
) -> bool {
    let (Some(ordering), Some((key, created_at))) = (ordering, object) else {
        return true;
    };
    let now = clock.now();
    match ordering
        .settle_object(&ObjectMark {
            key,
            created_at,
            status,
            now,
        })
        .await
    {
        Ok(settled) => settled,
        Err(e) => {
            tracing::warn!(%id, error = %e, "could not settle object state");
            if status == ObjectStatus::Failed {
                settle_failed_later(ordering.clone(), clock.clone(), key, created_at, id);
            }
            true
        }
    }
}

/// Settles the object `key` failed for an event created at `created_at` (event `id`,
/// for the logs) in the background, again at doubling intervals (at most a second
/// apart) for a minute, until the ordering store answers: a failure must reach the
/// ledger, or `reconcile_stale` never lists the object should its reconcile fail.
fn settle_failed_later(
    ordering: std::sync::Arc<dyn OrderingStore>,
    clock: std::sync::Arc<dyn crate::clock::Clock>,
    key: ObjectKey<'_>,
    created_at: DateTime<Utc>,
    id: &str,
) {
    #[cfg(feature = "tokio")]
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let (namespace, object, family, id) = (
            key.namespace.to_owned(),
            key.object.to_owned(),
            key.family.to_owned(),
            id.to_owned(),
        );
        rt.spawn(async move {
            let key = ObjectKey {
                namespace: &namespace,
                object: &object,
                family: &family,
            };
            let (first, cap) = (std::time::Duration::from_millis(50), std::time::Duration::from_secs(1));
            let mut backoff = crate::runtime::Backoff::new(first, cap, std::time::Duration::from_secs(60));
            while backoff.wait().await {
                let now = clock.now();
                let status = ObjectStatus::Failed;
                match ordering.settle_object(&ObjectMark { key, created_at, status, now }).await {
                    Ok(_) => return,
                    Err(e) => tracing::debug!(%id, error = %e, "settling the object failed again"),
                }
            }
            tracing::warn!(%id, "the object's failure was not recorded; reconcile_stale will not list it");
        });
        return;
    }
    #[cfg(not(feature = "tokio"))]
    let _ = (ordering, clock, key, created_at);
    tracing::warn!(%id, "no runtime to record the object's failure in the background");
}

/// The ordering key of an event with metadata `meta` under `namespace`, and its
/// `created_at`, if it names both (whether it takes part is [`ordered`]).
pub(crate) fn object_key<'a>(
    namespace: &'a str,
    meta: &'a EventMeta,
) -> Option<(ObjectKey<'a>, DateTime<Utc>)> {
    let key = ObjectKey {
        namespace,
        object: meta.object.as_deref()?,
        family: meta.family.as_deref().unwrap_or(""),
    };
    Some((key, meta.created_at?))
}

/// Keeps the newest `created_at` per object and family.
///
/// # Contract
/// Keys are at most [`MAX_OBJECT_LEN`] bytes of object id and of family (the guard
/// and the worker order no event with a longer one), so a store may hold them in
/// columns of that size.
///
/// - **observe**: atomically, if there is no record for the [`Observation`]'s key or
///   its `created_at` is after the stored newest, store `created_at` as the newest
///   with status `Pending` and `updated_at = now` and answer [`Freshness::Fresh`]; if
///   it equals the stored newest (a retry, or another event created at the same
///   time), change nothing and answer `Fresh`; otherwise change nothing and answer
///   [`Freshness::Stale`] with the stored newest.
/// - **settle_object**: if the stored newest equals the [`ObjectMark`]'s
///   `created_at` and its status is `Pending`, set the status and `updated_at` and
///   answer `true`. If the newest equals `created_at` but was settled already — by
///   another event created at the same time, whose order against this one nobody
///   knows — answer `false`, and set the status to `Failed` (with `updated_at`) when
///   `status` is `Failed`, so a failure is never hidden. Otherwise (a newer event
///   came since, or there is no record) change nothing and answer `false`.
/// - **mark_object**: if the stored newest equals `created_at`, set the status and
///   `updated_at`, whatever the status was, and answer `true` (a host's own
///   reconcile); otherwise change nothing and answer `false`.
/// - **mark_object_if_failed**: atomically, if the stored newest equals the
///   [`FailedMark`]'s `created_at`, its status is `Failed` and its `updated_at` is at
///   or before `failed_since` (both at the precision the store keeps times in), set
///   the status and `updated_at = now` and answer `true`; otherwise change nothing
///   and answer `false`. The guard marks an object `Applied` with it once a reconcile of its
///   failure succeeded (a failure settled since, by another event created at the
///   same time, stays listed, for its own reconcile), and `Failed` again, to the
///   back of the list, when that reconcile failed (one cleared meanwhile stays
///   cleared).
/// - **get_object**: the record or `None`.
/// - **failed_objects**: up to the [`FailedPage`]'s `limit` records of its `namespace`
///   with status `Failed` and `updated_at <= before`, the oldest `updated_at` first.
#[async_trait]
#[auto_impl::auto_impl(Arc, Box)]
pub trait OrderingStore: fmt::Debug + Send + Sync + 'static {
    /// Records the `created_at` of `event` for its key if it is the newest seen.
    async fn observe(&self, event: &Observation<'_>) -> Result<Freshness, StoreError>;

    /// Settles the newest event of `mark.key`, if it is still the one created at
    /// `mark.created_at` and nothing settled it yet: whether it was (`false` when a
    /// newer event came since, or another event created at the same time was
    /// settled first).
    async fn settle_object(&self, mark: &ObjectMark<'_>) -> Result<bool, StoreError>;

    /// Sets the status of `mark.key` whatever it was, if its newest event is still
    /// the one created at `mark.created_at`.
    async fn mark_object(&self, mark: &ObjectMark<'_>) -> Result<bool, StoreError>;

    /// Sets the status of `mark.key` if its newest event (created at
    /// `mark.created_at`) is still the newest and still failed, its failure recorded
    /// at or before `mark.failed_since`: whether it was set.
    async fn mark_object_if_failed(&self, mark: &FailedMark<'_>) -> Result<bool, StoreError>;

    /// The record under `key`.
    async fn get_object(&self, key: ObjectKey<'_>) -> Result<Option<ObjectRecord>, StoreError>;

    /// Objects of `page.namespace` whose newest event failed for good, last changed at
    /// or before `page.before`.
    async fn failed_objects(&self, page: &FailedPage<'_>) -> Result<Vec<ObjectRecord>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_too_long_to_key_is_not_ordered() {
        let now = Utc::now();
        let meta = |object: &str, family: Option<&str>| {
            let mut meta = EventMeta::new(None, Some(now), Some(object.to_owned()));
            meta.family = family.map(str::to_owned);
            meta
        };
        let longest = "t".repeat(MAX_OBJECT_LEN);
        assert!(ordered("e", &meta("trx-1", Some("charge")), now));
        assert!(ordered("e", &meta(&longest, Some(&longest)), now));
        let too_long = "t".repeat(MAX_OBJECT_LEN + 1);
        assert!(!ordered("e", &meta(&too_long, Some("charge")), now));
        assert!(!ordered("e", &meta("trx-1", Some(&too_long)), now));
        assert!(ordered("e", &meta("trx-1", None), now));
    }
}
