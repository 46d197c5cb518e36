//! The statements of the PostgreSQL and SQLite stores, written once for both dialects.

use super::common::Common;
use super::{TableName, COLUMNS, EVENT_COLUMNS};

/// The contract's fingerprint test ([`Fingerprint::matches`](crate::store::Fingerprint::matches)) in SQL, of the stored
/// row `r` and the inserted one, with `unknown` the parameter holding
/// [`Fingerprint::UNKNOWN`](crate::store::Fingerprint::UNKNOWN).
fn matches(unknown: &str) -> String {
    format!(
        "(r.fingerprint = excluded.fingerprint OR r.fingerprint = {unknown} \
         OR excluded.fingerprint = {unknown})"
    )
}

/// The claim's upsert into table `t`: the new rows come from `rows` (`VALUES` or a
/// `SELECT`), `now` is the claim's time, `unknown` the bind of the unknown
/// fingerprint, and the answered row has `key` (empty, or the columns before the
/// record's: the key's, and SQLite's batch its "claimed" 1) and then the
/// [`COLUMNS`].
/// "Expired" frees the record whatever its body, except from a holder whose lease
/// is still live.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn claim_upsert(
    t: &str,
    greatest: &str,
    rows: &str,
    now: &str,
    unknown: &str,
    key: &str,
) -> String {
    let expired = format!(
        "(r.expires_at <= {now} AND NOT (r.state = 'in_progress' AND r.lease_until > {now}))"
    );
    format!(
        "INSERT INTO {t} AS r (namespace, id, state, fingerprint, token, attempts, failures, \
             lease_until, expires_at, created_at, updated_at, history) \
         {rows} \
         ON CONFLICT (namespace, id) DO UPDATE SET \
             state = 'in_progress', \
             fingerprint = CASE WHEN {expired} OR r.fingerprint = {unknown} \
                 THEN excluded.fingerprint ELSE r.fingerprint END, \
             token = excluded.token, \
             lease_until = excluded.lease_until, \
             updated_at = excluded.updated_at, \
             attempts = CASE WHEN {expired} THEN 1 ELSE r.attempts + 1 END, \
             failures = CASE WHEN {expired} THEN 0 \
                 WHEN r.state = 'in_progress' THEN r.failures + 1 ELSE r.failures END, \
             expires_at = CASE WHEN {expired} THEN excluded.expires_at \
                 ELSE {greatest}(r.expires_at, excluded.expires_at) END, \
             created_at = CASE WHEN {expired} THEN excluded.created_at ELSE r.created_at END, \
             history = CASE WHEN {expired} THEN '' ELSE r.history END \
         WHERE {expired} \
             OR ({matches} \
                 AND (r.state = 'failed' OR (r.state = 'in_progress' AND r.lease_until <= {now}))) \
         RETURNING {key}{COLUMNS}",
        matches = matches(unknown),
    )
}

/// Where a PostgreSQL and an SQLite statement differ.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[cfg_attr(not(all(feature = "postgres", feature = "sqlite")), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    Sqlite,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl Dialect {
    /// The column types: a key column, a byte string, a 64-bit integer.
    fn types(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Postgres => ("TEXT COLLATE \"C\" NOT NULL", "BYTEA", "BIGINT"),
            Self::Sqlite => ("TEXT    NOT NULL", "BLOB", "INTEGER"),
        }
    }

    /// The larger of two values.
    fn greatest(self) -> &'static str {
        match self {
            Self::Postgres => "GREATEST",
            Self::Sqlite => "MAX",
        }
    }

    /// How a bounded `UPDATE` or `DELETE` names the rows its sub-select picked: the
    /// row in the outer statement, the row in the sub-select, and the locking clause
    /// after its `LIMIT`. PostgreSQL skips rows a concurrent statement has locked,
    /// SQLite has one writer.
    fn pick(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Postgres => (
                "(namespace, id)",
                "namespace, id",
                " FOR UPDATE SKIP LOCKED",
            ),
            Self::Sqlite => ("rowid", "rowid", ""),
        }
    }

    /// A statement written with `$n` binds, as this dialect reads it (`?n` on SQLite).
    fn binds(self, statement: &mut String) {
        if self == Self::Sqlite {
            *statement = statement.replace('$', "?");
        }
    }
}

/// Every statement of the PostgreSQL and SQLite stores, built once from the
/// validated table name.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) table: TableName,
    /// The whole schema: the dedup table, the inbox and the ordering ledger.
    pub(crate) schema: String,
    pub(crate) claim: String,
    /// The claim of many ids in one statement (PostgreSQL; `None` on SQLite).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) claim_batch: Option<String>,
    pub(crate) purge: String,
    /// The statements every dialect writes alike.
    pub(crate) common: Common,
    pub(crate) queue: QueueSql,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl Statements {
    /// SQLite's claim of `n` ids at once: the claim upsert with one `VALUES` row per
    /// id, bound `?1` … `?{7n}` (namespace, id, fingerprint, token, lease_until,
    /// expires_at, now of each row in turn), then `?{7n + 1}` the unknown
    /// fingerprint; each answered row, all claimed, says so (1), then names its key
    /// before the record's columns.
    #[cfg(feature = "sqlite")]
    pub(crate) fn claim_values(&self, n: usize) -> String {
        let rows: Vec<String> = (0..n)
            .map(|i| {
                let a = 7 * i + 1;
                format!(
                    "(?{a}, ?{}, 'in_progress', ?{}, ?{}, 1, 0, ?{}, ?{}, ?{}, ?{}, '')",
                    a + 1,
                    a + 2,
                    a + 3,
                    a + 4,
                    a + 5,
                    a + 6,
                    a + 6
                )
            })
            .collect();
        claim_upsert(
            &self.table.quoted(),
            Dialect::Sqlite.greatest(),
            &format!("VALUES {}", rows.join(", ")),
            "excluded.updated_at",
            &format!("?{}", 7 * n + 1),
            "1, namespace, id, ",
        )
    }

    pub(crate) fn new(table: TableName, dialect: Dialect) -> Self {
        let t = table.quoted();
        let common = Common::new(
            &t,
            &table.derived("inbox").quoted(),
            &table.derived("objects").quoted(),
            dialect.greatest(),
            true,
        );
        let queue = QueueSql::new(&table, dialect);
        let (key, bytes, int) = dialect.types();
        let mut schema = format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n    \
                 namespace   {key},\n    \
                 id          {key},\n    \
                 state       TEXT    NOT NULL,\n    \
                 fingerprint {bytes:<7} NOT NULL,\n    \
                 token       {int:<7} NOT NULL,\n    \
                 attempts    INTEGER NOT NULL,\n    \
                 failures    INTEGER NOT NULL,\n    \
                 lease_until {int:<7} NOT NULL,\n    \
                 expires_at  {int:<7} NOT NULL,\n    \
                 created_at  {int:<7} NOT NULL,\n    \
                 updated_at  {int:<7} NOT NULL,\n    \
                 history     TEXT    NOT NULL DEFAULT '',\n    \
                 PRIMARY KEY (namespace, id)\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {exp}\n    ON {t} (expires_at);\n\
             CREATE INDEX IF NOT EXISTS {stuck}\n    ON {t} (lease_until) WHERE state = 'in_progress';\n\
             CREATE INDEX IF NOT EXISTS {listing}\n    ON {t} (namespace, state, updated_at, id);\n",
            exp = table.index("expires_at"),
            stuck = table.index("stuck"),
            listing = table.index("listing"),
        );
        schema.push_str(&queue.schema);
        let greatest = dialect.greatest();
        // $1 namespace, $2 id, $3 fingerprint, $4 token, $5 lease_until,
        // $6 expires_at, $7 now, $8 the unknown fingerprint.
        let claim = claim_upsert(
            &t,
            greatest,
            "VALUES ($1, $2, 'in_progress', $3, $4, 1, 0, $5, $6, $7, $7, '')",
            "$7",
            "$8",
            "",
        );
        // The same for many ids at once (PostgreSQL only): $1 … $7 are arrays of the
        // single claim's values, one element per id, `now` read from each inserted
        // row; the rows are inserted in the arrays' order. It waits at most 250 ms
        // for a row lock (`lock_timeout`, set for its own transaction only, before
        // its first row is inserted: the condition names no column, so it is
        // evaluated once, before the scan yields a row). It answers the rows it
        // claimed and, for the keys it did not, the stored rows as its snapshot has
        // them (the snapshot does not see its own changes, hence `NOT EXISTS`);
        // each row says first whether it was claimed (1) or not (0), then names
        // its key. The lookup unnests the keys again rather than sharing the
        // values with the insert through a CTE, whose materialization cost
        // processed claims a few per cent.
        let claim_batch = (dialect == Dialect::Postgres).then(|| {
            let upsert = claim_upsert(
                &t,
                greatest,
                "SELECT ns, id, 'in_progress', fp, tok, 1, 0, lu, ex, nw, nw, '' \
                 FROM unnest($1::text[], $2::text[], $3::bytea[], $4::int8[], $5::int8[], \
                     $6::int8[], $7::int8[]) WITH ORDINALITY AS v(ns, id, fp, tok, lu, ex, nw, n) \
                 WHERE (SELECT set_config('lock_timeout', '250ms', true)) IS NOT NULL \
                 ORDER BY n",
                "excluded.updated_at",
                "$8",
                "namespace, id, ",
            );
            format!(
                "WITH up AS ({upsert}) \
                 SELECT 1, * FROM up \
                 UNION ALL \
                 SELECT 0, r.* FROM unnest($1::text[], $2::text[]) AS k(ns, vid) \
                     CROSS JOIN LATERAL (SELECT namespace, id, {COLUMNS} \
                     FROM {t} WHERE namespace = k.ns AND id = k.vid) AS r \
                 WHERE NOT EXISTS (SELECT 1 FROM up WHERE up.namespace = k.ns AND up.id = k.vid)"
            )
        });
        // Oldest first, through the `expires_at` index (the `ORDER BY` keeps the planner
        // on it even when most of the table is expired: a sequential scan would walk
        // the dead rows of earlier batches again and again).
        let due = "expires_at <= $1 AND NOT (state = 'in_progress' AND lease_until > $1)";
        let purge = match dialect {
            // The picked rows are locked (`SKIP LOCKED`: a row a claim holds is left
            // for the next purge), then deleted by their physical address, which a
            // locked row keeps until the statement ends: no second lookup through
            // the primary key. `set_config(…, true)` turns `synchronous_commit` off
            // for this statement's own transaction only: its commit does not wait
            // for a WAL flush. A purge lost in a crash is redone by the next one, and
            // every later synchronous commit (a claim's) flushes it anyway.
            Dialect::Postgres => format!(
                "DELETE FROM {t} WHERE ctid = ANY(ARRAY(\
                     SELECT ctid FROM {t} WHERE {due} \
                     ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)) \
                 AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL"
            ),
            // One writer at a time: nothing to lock.
            Dialect::Sqlite => format!(
                "DELETE FROM {t} WHERE rowid IN (\
                     SELECT rowid FROM {t} WHERE {due} ORDER BY expires_at LIMIT $2)"
            ),
        };
        let mut sql = Self {
            table,
            schema,
            claim,
            claim_batch,
            purge,
            common: common.map(|mut s| {
                dialect.binds(&mut s);
                s
            }),
            queue,
        };
        for s in [&mut sql.claim, &mut sql.purge] {
            dialect.binds(s);
        }
        sql
    }
}

/// The inbox, ordering and transactional statements of the PostgreSQL and SQLite
/// stores, written once with `$n` binds (SQLite reads them as `?n`).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Debug)]
pub(crate) struct QueueSql {
    /// `CREATE TABLE` and `CREATE INDEX` for the inbox and the ordering ledger.
    pub(crate) schema: String,
    pub(crate) enqueue: String,
    pub(crate) lease: String,
    pub(crate) purge: String,
    pub(crate) observe: String,
    pub(crate) record: String,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl QueueSql {
    /// The statements for the dedup table `table`, its inbox `<table>_inbox` and its
    /// ordering ledger `<table>_objects`.
    pub(crate) fn new(table: &TableName, dialect: Dialect) -> Self {
        let (key, bytes, int) = dialect.types();
        let records = table.quoted();
        let inbox = table.derived("inbox");
        let objects = table.derived("objects");
        let (i, o) = (inbox.quoted(), objects.quoted());
        let schema = format!(
            "CREATE TABLE IF NOT EXISTS {i} (\n    \
                 namespace       {key},\n    \
                 id              {key},\n    \
                 fingerprint     {bytes:<7} NOT NULL,\n    \
                 event_type      TEXT,\n    \
                 created_at      {int},\n    \
                 object          TEXT,\n    \
                 family          TEXT,\n    \
                 payload         {bytes:<7} NOT NULL,\n    \
                 state           TEXT    NOT NULL,\n    \
                 attempts        INTEGER NOT NULL,\n    \
                 token           {int:<7} NOT NULL,\n    \
                 lease_until     {int:<7} NOT NULL,\n    \
                 next_attempt_at {int:<7} NOT NULL,\n    \
                 due_at          {int},\n    \
                 last_error      TEXT,\n    \
                 received_at     {int:<7} NOT NULL,\n    \
                 updated_at      {int:<7} NOT NULL,\n    \
                 expires_at      {int:<7} NOT NULL,\n    \
                 PRIMARY KEY (namespace, id)\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {due}\n    \
                 ON {i} (namespace, due_at) WHERE due_at IS NOT NULL;\n\
             CREATE INDEX IF NOT EXISTS {settled}\n    \
                 ON {i} (expires_at) WHERE due_at IS NULL;\n\
             CREATE INDEX IF NOT EXISTS {listing}\n    \
                 ON {i} (namespace, state, updated_at, id);\n\
             CREATE TABLE IF NOT EXISTS {o} (\n    \
                 namespace  {key},\n    \
                 object     {key},\n    \
                 family     {key},\n    \
                 newest     {int:<7} NOT NULL,\n    \
                 status     TEXT    NOT NULL,\n    \
                 updated_at {int:<7} NOT NULL,\n    \
                 PRIMARY KEY (namespace, object, family)\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {failed}\n    \
                 ON {o} (namespace, status, updated_at);\n",
            due = inbox.index("due"),
            listing = inbox.index("listing"),
            settled = inbox.index("settled"),
            failed = objects.index("status"),
        );
        // $1 namespace, $2 id, $3 fingerprint, $4 event_type, $5 created_at, $6 object,
        // $7 family, $8 payload, $9 now, $10 expires_at. A settled, expired event is
        // replaced; anything else stays and the statement returns no row.
        let enqueue = format!(
            "INSERT INTO {i} AS e (namespace, id, fingerprint, event_type, created_at, object, \
                 family, payload, state, attempts, token, lease_until, next_attempt_at, due_at, \
                 last_error, received_at, updated_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', 0, 0, $9, $9, $9, NULL, $9, $9, $10) \
             ON CONFLICT (namespace, id) DO UPDATE SET \
                 fingerprint = excluded.fingerprint, event_type = excluded.event_type, \
                 created_at = excluded.created_at, object = excluded.object, \
                 family = excluded.family, payload = excluded.payload, state = 'pending', \
                 attempts = 0, token = 0, lease_until = excluded.lease_until, \
                 next_attempt_at = excluded.next_attempt_at, due_at = excluded.due_at, \
                 last_error = NULL, received_at = excluded.received_at, \
                 updated_at = excluded.updated_at, expires_at = excluded.expires_at \
             WHERE e.due_at IS NULL AND e.expires_at <= $9 \
             RETURNING state"
        );
        // $1 namespace, $2 now, $3 token, $4 lease_until, $5 limit. Oldest due first;
        // PostgreSQL skips rows a concurrent lease has locked, SQLite has one writer.
        let (pick, picked, locking) = dialect.pick();
        let lease = format!(
            "UPDATE {i} SET state = 'running', token = $3, attempts = attempts + 1, \
                 lease_until = $4, due_at = $4, updated_at = $2 \
             WHERE {pick} IN (SELECT {picked} FROM {i} \
                 WHERE namespace = $1 AND due_at IS NOT NULL AND due_at <= $2 \
                 ORDER BY due_at LIMIT $5{locking}) \
             RETURNING {EVENT_COLUMNS}"
        );
        // Oldest first: the `ORDER BY` keeps the planner on the partial index
        // `…_settled` even when most of the table has expired (as for the dedup
        // table's purge).
        let purge = format!(
            "DELETE FROM {i} WHERE {pick} IN (SELECT {picked} FROM {i} \
                 WHERE due_at IS NULL AND expires_at <= $1 ORDER BY expires_at LIMIT $2{locking})"
        );
        // $1 namespace, $2 object, $3 family, $4 created_at, $5 now.
        let observe = format!(
            "INSERT INTO {o} AS o (namespace, object, family, newest, status, updated_at) \
             VALUES ($1, $2, $3, $4, 'pending', $5) \
             ON CONFLICT (namespace, object, family) DO UPDATE SET \
                 newest = excluded.newest, status = 'pending', updated_at = excluded.updated_at \
             WHERE excluded.newest > o.newest \
             RETURNING newest"
        );
        // $1 namespace, $2 id, $3 fingerprint, $4 token, $5 now, $6 expires_at, $7 the
        // unknown fingerprint. Inserts a `completed` record; replaces an expired one, or
        // takes over one that failed or whose holder's lease ran out (matching
        // fingerprint); otherwise returns no row.
        let expired =
            "(r.expires_at <= $5 AND NOT (r.state = 'in_progress' AND r.lease_until > $5))";
        let record = format!(
            "INSERT INTO {records} AS r (namespace, id, state, fingerprint, token, attempts, \
                 failures, lease_until, expires_at, created_at, updated_at, history) \
             VALUES ($1, $2, 'completed', $3, $4, 1, 0, $5, $6, $5, $5, '') \
             ON CONFLICT (namespace, id) DO UPDATE SET \
                 state = 'completed', token = excluded.token, \
                 fingerprint = CASE WHEN {expired} OR r.fingerprint = $7 \
                     THEN excluded.fingerprint ELSE r.fingerprint END, \
                 attempts = CASE WHEN {expired} THEN 1 ELSE r.attempts + 1 END, \
                 failures = CASE WHEN {expired} THEN 0 \
                     WHEN r.state = 'in_progress' THEN r.failures + 1 ELSE r.failures END, \
                 lease_until = excluded.lease_until, \
                 expires_at = CASE WHEN {expired} OR r.expires_at < excluded.expires_at \
                     THEN excluded.expires_at ELSE r.expires_at END, \
                 created_at = CASE WHEN {expired} THEN excluded.created_at ELSE r.created_at END, \
                 updated_at = excluded.updated_at, \
                 history = CASE WHEN {expired} THEN '' ELSE r.history END \
             WHERE {expired} \
                 OR ({matches} \
                     AND (r.state = 'failed' OR (r.state = 'in_progress' AND r.lease_until <= $5))) \
             RETURNING state",
            matches = matches("$7"),
        );
        let mut sql = Self {
            schema,
            enqueue,
            lease,
            purge,
            observe,
            record,
        };
        for s in [
            &mut sql.enqueue,
            &mut sql.lease,
            &mut sql.purge,
            &mut sql.observe,
            &mut sql.record,
        ] {
            dialect.binds(s);
        }
        sql
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(feature = "postgres", feature = "sqlite"))]
    #[test]
    fn statements_use_the_table_name() {
        for dialect in [Dialect::Postgres, Dialect::Sqlite] {
            let s = Statements::new(TableName::new("my_hooks").unwrap(), dialect);
            let (c, q) = (&s.common, &s.queue);
            for sql in [
                &s.claim, &c.get, &c.finish, &c.renew, &c.delete, &s.purge, &c.stuck,
            ] {
                assert!(sql.contains("\"my_hooks\""), "{sql}");
            }
            for sql in [
                &q.enqueue,
                &c.existing,
                &q.lease,
                &c.settle,
                &c.renew_event,
                &c.get_event,
                &q.purge,
            ] {
                assert!(sql.contains("\"my_hooks_inbox\""), "{sql}");
            }
            for sql in [
                &q.observe,
                &c.newest,
                &c.settle_object,
                &c.mark_object,
                &c.mark_if_failed,
                &c.get_object,
                &c.failed,
            ] {
                assert!(sql.contains("\"my_hooks_objects\""), "{sql}");
            }
            for sql in [&q.record, &c.recorded] {
                assert!(sql.contains("\"my_hooks\""), "{sql}");
            }
        }
    }

    /// Each store's module docs show the schema of the default table.
    #[test]
    fn module_docs_show_the_default_schema() {
        let stores = [
            #[cfg(feature = "postgres")]
            (include_str!("../postgres/mod.rs"), Dialect::Postgres),
            #[cfg(feature = "sqlite")]
            (include_str!("../sqlite/mod.rs"), Dialect::Sqlite),
        ];
        for (source, dialect) in stores {
            let docs: String = source
                .lines()
                .filter_map(|l| l.strip_prefix("//! "))
                .collect::<Vec<_>>()
                .join("\n");
            let schema = Statements::new(
                TableName::new(super::super::DEFAULT_TABLE).unwrap(),
                dialect,
            )
            .schema;
            assert!(
                docs.contains(schema.trim_end()),
                "update the module docs of {dialect:?}:\n{schema}"
            );
        }
    }
}
