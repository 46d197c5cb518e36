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
}

impl Common<String> {
    /// The statements on the dedup table `t`, the inbox `i` and the ordering table
    /// `o` (all quoted), with `greatest` the dialect's larger-of-two function.
    pub(crate) fn new(t: &str, i: &str, o: &str, greatest: &str) -> Self {
        let fence = "namespace = $1 AND id = $2 AND state = 'in_progress' AND token = $3";
        let running = "namespace = $1 AND id = $2 AND state = 'running' AND token = $3";
        let object_key = "namespace = $1 AND object = $2 AND family = $3";
        let mark_object = format!(
            "UPDATE {o} SET status = $5, updated_at = $6 WHERE {object_key} AND newest = $4"
        );
        Self {
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
