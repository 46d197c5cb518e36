//! The statements every SQL dialect writes alike: PostgreSQL and SQLite run them
//! with their `$n` binds (`?n` on SQLite), MySQL with `?` in the order of the `$n`
//! (see [`positional`]).

use super::{COLUMNS, EVENT_COLUMNS, OBJECT_COLUMNS};

/// The statements written once for every dialect, on the quoted dedup table, inbox
/// and ordering table. Each comment names its binds.
#[derive(Debug)]
pub(crate) struct Common<S = String> {
    /// $1 namespace, $2 id: the record's [`COLUMNS`].
    pub(crate) get: S,
    /// $1 namespace, $2 id, $3 token, $4 state, $5 failures, $6 history, $7 now,
    /// $8 expires_at.
    pub(crate) finish: S,
    /// $1 namespace, $2 id, $3 token, $4 lease_until, $5 expires_at.
    pub(crate) renew: S,
    /// $1 namespace, $2 id, $3 now: removes the record unless a live lease holds it.
    pub(crate) delete: S,
    /// $1 now, $2 limit: the key and the [`COLUMNS`] of each stuck record.
    pub(crate) stuck: S,
    /// $1 namespace, $2 id: the stored fingerprint and state of an event.
    pub(crate) existing: S,
    /// $1 namespace, $2 id, $3 token, $4 state, $5 next_attempt_at, $6 error, $7 now,
    /// $8 expires_at, $9 1 to give the attempt back, else 0.
    pub(crate) settle: S,
    /// $1 namespace, $2 id, $3 token, $4 lease_until.
    pub(crate) renew_event: S,
    /// $1 namespace, $2 id: the event's [`EVENT_COLUMNS`].
    pub(crate) get_event: S,
    /// $1 namespace, $2 object, $3 family: the object's newest `created_at`.
    pub(crate) newest: S,
    /// $1 namespace, $2 object, $3 family, $4 created_at, $5 status, $6 now: sets
    /// the status of a `pending` object whose newest is `created_at`.
    pub(crate) settle_object: S,
    /// As `settle_object`, whatever the status.
    pub(crate) mark_object: S,
    /// As `settle_object`, over a failure recorded at or before $7.
    pub(crate) mark_if_failed: S,
    /// $1 namespace, $2 object, $3 family: the object's [`OBJECT_COLUMNS`].
    pub(crate) get_object: S,
    /// $1 namespace, $2 before, $3 limit: failed objects, oldest failure first.
    pub(crate) failed: S,
    /// $1 namespace, $2 id: the stored fingerprint and state of a record.
    pub(crate) recorded: S,
    /// $1 namespace, $2 state, $3 lowest updated_at, $4 highest updated_at, $5 the
    /// cursor's id at $4 (or NULL), $6 lease_until above, $7 lease_until at most,
    /// $8 limit: the key and the [`COLUMNS`] of a page of records, newest first
    /// (the `…_listing` index). The `_prefix` form adds $9 the prefix's length and
    /// $10 the prefix (a separate statement: an opaque condition would make the
    /// planner expect few rows and sort instead of walking the index).
    pub(crate) list_records: S,
    pub(crate) list_records_prefix: S,
    /// $1 to $4 as `list_records`, $5 and $6 its $6 and $7: how many match (with
    /// $7 and $8 the prefix's length and the prefix in the `_prefix` form).
    pub(crate) count_records: S,
    pub(crate) count_records_prefix: S,
    /// $1 to $5 as `list_records`, $6 limit: the [`EVENT_COLUMNS`] of a page of
    /// events, newest first (`_prefix`: $7 the prefix's length, $8 the prefix).
    pub(crate) list_events: S,
    pub(crate) list_events_prefix: S,
    /// $1 to $4 as `list_events`: how many match (`_prefix`: $5, $6).
    pub(crate) count_events: S,
    pub(crate) count_events_prefix: S,
    /// $1 namespace, $2 id, $3 now: a dead letter made pending, due now.
    pub(crate) requeue_dead: S,
    /// $1 namespace, $2 id: removes a dead letter.
    pub(crate) purge_dead: S,
    /// Whether the prefix's length ($8 of `list_records`) counts characters (the
    /// dialect's `substr` on text) rather than bytes (MySQL's on `VARBINARY`).
    pub(crate) prefix_in_chars: bool,
}

impl Common<String> {
    /// The statements on the dedup table `t`, the inbox `i` and the ordering table
    /// `o` (all quoted), with `greatest` the dialect's larger-of-two function.
    pub(crate) fn new(t: &str, i: &str, o: &str, greatest: &str, prefix_in_chars: bool) -> Self {
        let fence = "namespace = $1 AND id = $2 AND state = 'in_progress' AND token = $3";
        let running = "namespace = $1 AND id = $2 AND state = 'running' AND token = $3";
        let object_key = "namespace = $1 AND object = $2 AND family = $3";
        let mark_object = format!(
            "UPDATE {o} SET status = $5, updated_at = $6 WHERE {object_key} AND newest = $4"
        );
        // The walk of one state's listing index, newest first from the cursor.
        let page = "namespace = $1 AND state = $2 AND updated_at >= $3 AND updated_at <= $4";
        let after = "(updated_at < $4 OR $5 IS NULL OR id < $5)";
        let newest = "ORDER BY updated_at DESC, id DESC";
        Self {
            list_records: format!(
                "SELECT namespace, id, {COLUMNS} FROM {t} WHERE {page} AND {after} \
                 AND lease_until > $6 AND lease_until <= $7 {newest} LIMIT $8"
            ),
            list_records_prefix: format!(
                "SELECT namespace, id, {COLUMNS} FROM {t} WHERE {page} AND {after} \
                 AND lease_until > $6 AND lease_until <= $7 AND substr(id, 1, $9) = $10 \
                 {newest} LIMIT $8"
            ),
            count_records: format!(
                "SELECT COUNT(*) FROM {t} WHERE {page} AND lease_until > $5 AND lease_until <= $6"
            ),
            count_records_prefix: format!(
                "SELECT COUNT(*) FROM {t} WHERE {page} \
                 AND lease_until > $5 AND lease_until <= $6 AND substr(id, 1, $7) = $8"
            ),
            list_events: format!(
                "SELECT {EVENT_COLUMNS} FROM {i} WHERE {page} AND {after} {newest} LIMIT $6"
            ),
            list_events_prefix: format!(
                "SELECT {EVENT_COLUMNS} FROM {i} WHERE {page} AND {after} \
                 AND substr(id, 1, $7) = $8 {newest} LIMIT $6"
            ),
            count_events: format!("SELECT COUNT(*) FROM {i} WHERE {page}"),
            count_events_prefix: format!(
                "SELECT COUNT(*) FROM {i} WHERE {page} AND substr(id, 1, $5) = $6"
            ),
            requeue_dead: format!(
                "UPDATE {i} SET state = 'pending', next_attempt_at = $3, due_at = $3, \
                     attempts = 0, updated_at = $3 \
                 WHERE namespace = $1 AND id = $2 AND state = 'dead'"
            ),
            purge_dead: format!(
                "DELETE FROM {i} WHERE namespace = $1 AND id = $2 AND state = 'dead'"
            ),
            prefix_in_chars,
            get: format!("SELECT {COLUMNS} FROM {t} WHERE namespace = $1 AND id = $2"),
            finish: format!(
                "UPDATE {t} SET state = $4, failures = $5, history = $6, updated_at = $7, \
                     expires_at = $8 WHERE {fence}"
            ),
            renew: format!(
                "UPDATE {t} SET lease_until = $4, expires_at = {greatest}(expires_at, $5) \
                 WHERE {fence}"
            ),
            delete: format!(
                "DELETE FROM {t} WHERE namespace = $1 AND id = $2 \
                     AND NOT (state = 'in_progress' AND lease_until > $3)"
            ),
            stuck: format!(
                "SELECT namespace, id, {COLUMNS} FROM {t} \
                 WHERE state = 'in_progress' AND lease_until <= $1 \
                 ORDER BY lease_until LIMIT $2"
            ),
            existing: format!(
                "SELECT fingerprint, state FROM {i} WHERE namespace = $1 AND id = $2"
            ),
            settle: format!(
                "UPDATE {i} SET state = $4, next_attempt_at = $5, \
                     due_at = CASE $4 WHEN 'pending' THEN $5 WHEN 'running' THEN lease_until END, \
                     last_error = COALESCE($6, last_error), updated_at = $7, expires_at = $8, \
                     attempts = attempts - CASE WHEN attempts > 0 THEN $9 ELSE 0 END \
                 WHERE {running}"
            ),
            renew_event: format!("UPDATE {i} SET lease_until = $4, due_at = $4 WHERE {running}"),
            get_event: format!("SELECT {EVENT_COLUMNS} FROM {i} WHERE namespace = $1 AND id = $2"),
            newest: format!("SELECT newest FROM {o} WHERE {object_key}"),
            settle_object: format!("{mark_object} AND status = 'pending'"),
            mark_if_failed: format!("{mark_object} AND status = 'failed' AND updated_at <= $7"),
            mark_object,
            get_object: format!("SELECT {OBJECT_COLUMNS} FROM {o} WHERE {object_key}"),
            failed: format!(
                "SELECT {OBJECT_COLUMNS} FROM {o} \
                 WHERE namespace = $1 AND status = 'failed' AND updated_at <= $2 \
                 ORDER BY updated_at LIMIT $3"
            ),
            recorded: format!(
                "SELECT fingerprint, state FROM {t} WHERE namespace = $1 AND id = $2"
            ),
        }
    }
}

impl<S> Common<S> {
    /// Every statement turned into what a dialect runs.
    pub(crate) fn map<T>(self, mut f: impl FnMut(S) -> T) -> Common<T> {
        Common {
            get: f(self.get),
            finish: f(self.finish),
            renew: f(self.renew),
            delete: f(self.delete),
            stuck: f(self.stuck),
            existing: f(self.existing),
            settle: f(self.settle),
            renew_event: f(self.renew_event),
            get_event: f(self.get_event),
            newest: f(self.newest),
            settle_object: f(self.settle_object),
            mark_object: f(self.mark_object),
            mark_if_failed: f(self.mark_if_failed),
            get_object: f(self.get_object),
            failed: f(self.failed),
            recorded: f(self.recorded),
            list_records: f(self.list_records),
            list_records_prefix: f(self.list_records_prefix),
            count_records: f(self.count_records),
            count_records_prefix: f(self.count_records_prefix),
            list_events: f(self.list_events),
            list_events_prefix: f(self.list_events_prefix),
            count_events: f(self.count_events),
            count_events_prefix: f(self.count_events_prefix),
            requeue_dead: f(self.requeue_dead),
            purge_dead: f(self.purge_dead),
            prefix_in_chars: self.prefix_in_chars,
        }
    }
}

/// A statement written with `$n` binds as a dialect with positional `?` binds runs
/// it: the text with each `$n` replaced by `?`, and the `n - 1` of each `?` in
/// order (a bind named twice is bound twice).
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn positional(statement: &str) -> (String, Vec<usize>) {
    let mut text = String::with_capacity(statement.len());
    let mut order = Vec::new();
    let mut rest = statement;
    while let Some(at) = rest.find('$') {
        text.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - at - 1);
        let n: usize = rest[at + 1..at + 1 + digits]
            .parse()
            .unwrap_or_else(|_| panic!("a `$` without a bind number in {statement}"));
        assert!(n > 0, "bind $0 in {statement}");
        text.push('?');
        order.push(n - 1);
        rest = &rest[at + 1 + digits..];
    }
    text.push_str(rest);
    (text, order)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_binds_become_positional_ones() {
        let (text, order) = positional("SET a = $2, b = $10 WHERE c = $1 AND d = $2");
        assert_eq!(text, "SET a = ?, b = ? WHERE c = ? AND d = ?");
        assert_eq!(order, [1, 9, 0, 1]);
        assert_eq!(positional("SELECT 1"), ("SELECT 1".to_owned(), vec![]));
    }
}
