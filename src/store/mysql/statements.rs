//! The MySQL dialect of the SQL stores' statements.
//!
//! Statements are written with `$n` binds, as for PostgreSQL and SQLite, and run
//! with `?` in the order of the `$n` ([`positional`]); those every dialect writes
//! alike come from [`Common`]. What MySQL writes its own way stays here: the claim,
//! the transactional record, the enqueue and the ordering upsert decide once with
//! `LAST_INSERT_ID(code)` (MySQL has no `RETURNING`), a lease picks its rows in a
//! transaction, and purges delete with `ORDER BY … LIMIT`.

use sqlx::mysql::{MySql, MySqlArguments};
use sqlx::query::Query;

use super::{quote, QueueSql, Sql};
use crate::store::sql::args::Binds;
use crate::store::sql::{positional, Arg, Common, Statement, TableName, COLUMNS, EVENT_COLUMNS};

/// A statement written with `$n` binds, as MySQL runs it.
#[derive(Debug)]
pub(super) struct Stmt {
    /// The text, with `?` binds.
    pub(super) sql: String,
    /// The `n - 1` of the `$n` each `?` stands for, in order.
    order: Vec<usize>,
}

impl Stmt {
    fn new(statement: &str) -> Self {
        let (sql, order) = positional(statement);
        Self { sql, order }
    }
}

impl Statement<MySql> for Stmt {
    fn bind<'q>(&'q self, args: &[Arg<'q>]) -> Query<'q, MySql, MySqlArguments> {
        self.order
            .iter()
            .fold(sqlx::query(&self.sql), |query, &at| {
                MySql::bind(query, args[at])
            })
    }
}

/// A record written into `table` in `state` as one decide-once upsert: a new key
/// is inserted; on a known one the first assignment computes the decision once,
/// from the row as it was, and stores it with `LAST_INSERT_ID(code)`: 2 when the
/// record expired and no live lease holds it (claimed as if new), 3 when a matching
/// fingerprint (equal, or either one unknown) meets a failed record or one whose
/// holder's lease ran out (taken over), 1 otherwise (nothing changes). Binds $1
/// namespace, $2 id, $3 fingerprint, $4 token, $6 expires_at, and `lease`, `now`
/// and `unknown` as named.
fn upsert(table: &str, state: &str, lease: &str, now: &str, unknown: &str) -> String {
    let fresh =
        format!("(expires_at <= {now} AND NOT (state = 'in_progress' AND lease_until > {now}))");
    let take = format!(
        "((fingerprint = $3 OR fingerprint = {unknown} OR $3 = {unknown}) \
AND (state = 'failed' \
OR (state = 'in_progress' AND lease_until <= {now})))"
    );
    format!(
        "INSERT INTO {table} \
(namespace, id, state, fingerprint, token, attempts, failures, \
lease_until, expires_at, created_at, updated_at, history) \
VALUES ($1, $2, '{state}', $3, $4, 1, 0, {lease}, $6, {now}, {now}, '') \
ON DUPLICATE KEY UPDATE \
token = IF(LAST_INSERT_ID(IF({fresh}, 2, IF({take}, 3, 1))) = 1, token, $4), \
attempts = IF(LAST_INSERT_ID() = 2, 1, \
IF(LAST_INSERT_ID() = 3, LEAST(attempts, 4294967294) + 1, attempts)), \
failures = IF(LAST_INSERT_ID() = 2, 0, \
IF(LAST_INSERT_ID() = 3 AND state = 'in_progress', LEAST(failures, 4294967294) + 1, failures)), \
history = IF(LAST_INSERT_ID() = 2, '', history), \
created_at = IF(LAST_INSERT_ID() = 2, {now}, created_at), \
updated_at = IF(LAST_INSERT_ID() = 1, updated_at, {now}), \
expires_at = IF(LAST_INSERT_ID() = 2, $6, \
IF(LAST_INSERT_ID() = 3, GREATEST(expires_at, $6), expires_at)), \
lease_until = IF(LAST_INSERT_ID() = 1, lease_until, {lease}), \
fingerprint = IF(LAST_INSERT_ID() = 1 OR (LAST_INSERT_ID() = 3 AND fingerprint <> {unknown}), \
fingerprint, $3), \
state = IF(LAST_INSERT_ID() = 1, state, '{state}')"
    )
}

/// Stores a new event; on a known id, the first assignment decides once whether the
/// stored event is settled and expired (2: replaced by the new one) or not (1:
/// nothing changes), as the claim does.
fn enqueue(inbox: &str) -> String {
    format!(
        "INSERT INTO {inbox} \
(namespace, id, fingerprint, event_type, created_at, object, family, payload, state, attempts, \
token, lease_until, next_attempt_at, due_at, last_error, received_at, updated_at, expires_at) \
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', 0, 0, \
$9, $9, $9, NULL, $9, $9, $10) \
ON DUPLICATE KEY UPDATE \
state = IF(LAST_INSERT_ID(IF(due_at IS NULL AND expires_at <= $9, 2, 1)) = 2, 'pending', state), \
fingerprint = IF(LAST_INSERT_ID() = 2, $3, fingerprint), \
event_type = IF(LAST_INSERT_ID() = 2, $4, event_type), \
created_at = IF(LAST_INSERT_ID() = 2, $5, created_at), \
object = IF(LAST_INSERT_ID() = 2, $6, object), \
family = IF(LAST_INSERT_ID() = 2, $7, family), \
payload = IF(LAST_INSERT_ID() = 2, $8, payload), \
attempts = IF(LAST_INSERT_ID() = 2, 0, attempts), \
token = IF(LAST_INSERT_ID() = 2, 0, token), \
lease_until = IF(LAST_INSERT_ID() = 2, $9, lease_until), \
next_attempt_at = IF(LAST_INSERT_ID() = 2, $9, next_attempt_at), \
last_error = IF(LAST_INSERT_ID() = 2, NULL, last_error), \
received_at = IF(LAST_INSERT_ID() = 2, $9, received_at), \
updated_at = IF(LAST_INSERT_ID() = 2, $9, updated_at), \
expires_at = IF(LAST_INSERT_ID() = 2, $10, expires_at), \
due_at = IF(LAST_INSERT_ID() = 2, $9, due_at)"
    )
}

/// Records the newest `created_at` of an object: 2 when it is after the stored one
/// (stored), 3 when it equals it (a tie: nothing changes, fresh), 1 otherwise
/// (nothing changes, stale).
fn observe(objects: &str) -> String {
    format!(
        "INSERT INTO {objects} \
(namespace, object, family, newest, status, updated_at) \
VALUES ($1, $2, $3, $4, 'pending', $5) \
ON DUPLICATE KEY UPDATE \
newest = IF(LAST_INSERT_ID(IF($4 > newest, 2, IF($4 = newest, 3, 1))) = 2, \
$4, newest), \
status = IF(LAST_INSERT_ID() = 2, 'pending', status), \
updated_at = IF(LAST_INSERT_ID() = 2, $5, updated_at)"
    )
}

impl Sql {
    pub(super) fn new(name: &str) -> Self {
        let table = TableName::new(name).expect("validated by MySqlStore::with_table");
        let inbox = table.derived("inbox").as_str().to_owned();
        let objects = table.derived("objects").as_str().to_owned();
        let (t, i, o) = (&quote(name), &quote(&inbox), &quote(&objects));
        let common = Common::new(t, i, o, "GREATEST", false);
        let live = "(state = 'in_progress' AND lease_until > $1)";
        let queue = QueueSql {
            enqueue: Stmt::new(&enqueue(i)),
            pick: Stmt::new(&format!(
                "SELECT id FROM {i} WHERE namespace = $1 AND due_at <= $2 \
                 ORDER BY due_at LIMIT $3 FOR UPDATE SKIP LOCKED"
            )),
            take: format!(
                "UPDATE {i} SET state = 'running', token = ?, attempts = attempts + 1, \
                 lease_until = ?, due_at = ?, updated_at = ? WHERE namespace = ? AND id IN"
            ),
            taken: format!("SELECT {EVENT_COLUMNS} FROM {i} WHERE namespace = ? AND id IN"),
            purge: Stmt::new(&format!(
                "DELETE FROM {i} WHERE due_at IS NULL AND expires_at <= $1 \
                 ORDER BY due_at, expires_at LIMIT $2"
            )),
            observe: Stmt::new(&observe(o)),
            record: Stmt::new(&upsert(t, "completed", "$5", "$5", "$7")),
            recorded: Stmt::new(&format!("{} FOR UPDATE", common.recorded)),
            inbox,
            objects,
        };
        Self {
            claim: Stmt::new(&upsert(t, "in_progress", "$5", "$7", "$8")),
            probe: Stmt::new(&format!(
                "SELECT CAST(state = 'in_progress' AND lease_until > $3 AS SIGNED) FROM {t} \
                 WHERE namespace = $1 AND id = $2"
            )),
            purge: Stmt::new(&format!(
                "DELETE FROM {t} WHERE expires_at <= $1 AND NOT {live} \
                 ORDER BY expires_at LIMIT $2"
            )),
            common: common.map(|s| Stmt::new(&s)),
            queue,
            table: t.clone(),
        }
    }

    /// The insert of `n` new `in_progress` records, each bound as namespace, id,
    /// fingerprint, token, lease_until, expires_at, created_at, updated_at; a key
    /// already stored is left as it is. `prefix` goes before the `INSERT` (MariaDB's
    /// `SET STATEMENT … FOR`, or nothing).
    pub(super) fn claim_batch(&self, n: usize, prefix: &str) -> String {
        let row = "(?, ?, 'in_progress', ?, ?, 1, 0, ?, ?, ?, ?, '')";
        format!(
            "{prefix}INSERT IGNORE INTO {} (namespace, id, state, fingerprint, token, attempts, \
             failures, lease_until, expires_at, created_at, updated_at, history) VALUES {}",
            self.table,
            vec![row; n].join(", ")
        )
    }

    /// The key and the record of `n` keys, each bound as namespace, id.
    pub(super) fn claim_batch_read(&self, n: usize) -> String {
        format!(
            "SELECT namespace, id, {COLUMNS} FROM {} WHERE (namespace, id) IN ({})",
            self.table,
            vec!["(?, ?)"; n].join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement binds values the callers pass (the highest `$n` of each is
    /// the length of its callers' arguments), and holds no placeholder left.
    #[test]
    fn statements_bind_what_their_callers_pass() {
        let sql = Sql::new("t");
        let (c, q) = (&sql.common, &sql.queue);
        for (stmt, args) in [
            (&sql.claim, 8),
            (&c.get, 2),
            (&c.finish, 8),
            (&c.renew, 5),
            (&c.delete, 3),
            (&sql.probe, 3),
            (&sql.purge, 2),
            (&c.stuck, 2),
            (&q.enqueue, 10),
            (&c.existing, 2),
            (&q.pick, 3),
            (&c.settle, 9),
            (&c.renew_event, 4),
            (&c.get_event, 2),
            (&q.purge, 2),
            (&q.observe, 5),
            (&c.newest, 3),
            (&c.settle_object, 6),
            (&c.mark_object, 6),
            (&c.mark_if_failed, 7),
            (&c.get_object, 3),
            (&c.failed, 3),
            (&q.record, 7),
            (&q.recorded, 2),
        ] {
            let text = &stmt.sql;
            assert_eq!(text.matches('?').count(), stmt.order.len(), "{text}");
            assert_eq!(stmt.order.iter().max().map(|n| n + 1), Some(args), "{text}");
            assert!(!text.contains(['$', ':', '{', '"']), "{text}");
        }
        assert!(q.enqueue.sql.starts_with("INSERT INTO `t_inbox` "));
        assert!(q.observe.sql.starts_with("INSERT INTO `t_objects` "));
        assert!(q.record.sql.starts_with("INSERT INTO `t` "));
    }
}
