//! Whether the server keeps what it acknowledged: read from `INFO persistence` at
//! connect, warned about when it does not (a restart would forget every record,
//! and events already processed would run again).

use ::redis::Value;

use super::codec::info_texts;
use super::RedisStore;

/// What one server keeps on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Persistence {
    /// `aof_enabled:1` in `INFO persistence`.
    aof: bool,
    /// RDB snapshots: a `save` rule (from `CONFIG GET save`, `save_rule`), or,
    /// where `CONFIG` is refused (managed servers), a snapshot taken since start.
    rdb: bool,
}

/// The persistence an `INFO persistence` text reports, if it reports any;
/// `save_rule` is whether `CONFIG GET save` showed a rule, when it could be read.
fn persistence(info: &str, save_rule: Option<bool>) -> Option<Persistence> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let aof = field("aof_enabled")? == "1";
    let rdb = save_rule.unwrap_or_else(|| {
        field("rdb_saves").is_some_and(|n| n != "0")
            || field("rdb_last_bgsave_time_sec").is_some_and(|t| t != "-1")
    });
    Some(Persistence { aof, rdb })
}

impl RedisStore {
    /// Logs a warning when a server of the store keeps nothing on disk: neither AOF
    /// nor RDB snapshots. Managed servers that refuse `CONFIG` allow `INFO`; a
    /// server whose `INFO` says nothing of it (a proxy) is let be.
    pub(super) async fn warn_without_persistence(&self) {
        let save: Result<Vec<String>, _> = self
            .query(::redis::cmd("CONFIG").arg("GET").arg("save"))
            .await;
        // `["save", "<rules>"]`; refused or shaped otherwise (a cluster): unknown.
        let save_rule = match save {
            Ok(reply) if reply.len() == 2 => Some(!reply[1].trim().is_empty()),
            _ => None,
        };
        let info: Value = match self.query(::redis::cmd("INFO").arg("persistence")).await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(error = %e, "could not read INFO persistence");
                return;
            }
        };
        let without = info_texts(&info)
            .into_iter()
            .filter(|text| persistence(text, save_rule).is_some_and(|p| !p.aof && !p.rdb))
            .count();
        if without > 0 {
            tracing::warn!(
                servers = without,
                "the Redis server keeps nothing on disk (no AOF, no RDB snapshots): a restart \
                 forgets every record, and events already processed run again; turn on \
                 appendonly (appendfsync everysec or always)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistence_is_read_from_info_and_the_save_rule() {
        let none =
            "# Persistence\r\nrdb_saves:0\r\nrdb_last_bgsave_time_sec:-1\r\naof_enabled:0\r\n";
        let nothing = Persistence {
            aof: false,
            rdb: false,
        };
        assert_eq!(persistence(none, Some(false)), Some(nothing));
        assert_eq!(persistence(none, None), Some(nothing));
        // A save rule that has not fired yet still counts.
        assert_eq!(persistence(none, Some(true)).map(|p| p.rdb), Some(true));
        let aof = "aof_enabled:1\r\nrdb_saves:0\r\n";
        assert_eq!(persistence(aof, Some(false)).map(|p| p.aof), Some(true));
        // Without CONFIG: a snapshot taken since start tells.
        let saved = "aof_enabled:0\r\nrdb_saves:3\r\n";
        assert_eq!(persistence(saved, None).map(|p| p.rdb), Some(true));
        assert_eq!(
            persistence("# Server\r\nredis_version:7.0.15\r\n", None),
            None
        );
    }
}
