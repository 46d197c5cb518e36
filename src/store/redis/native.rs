//! The native compare-and-set path of the dedup records: on a server whose `SET`
//! takes `IFEQ` (Valkey 8.1 or later, Redis 8.4 or later), a fenced finish is a
//! `SET <record> <new> IFEQ <old> PX <ttl>` instead of a run of the finish script.
//!
//! `IFEQ` compares the whole stored value, so a finish must know the record exactly
//! as it is stored. The fence of the script path — the record is `InProgress` with
//! the finish's token — holds for any expected value `old` that starts with
//! `in_progress|<token>|`: `IFEQ old` applies the change only while the record is
//! still `old`, and so still `InProgress` with that token. A stale holder's finish
//! is refused (the record carries another token, or is finished, or is gone, so it
//! is not equal to any value carrying the stale fence), and a change made between
//! reading `old` and the `SET` makes `IFEQ` fail. Where `old` comes from is a matter
//! of speed only:
//!
//! - the process remembers, by token, the record each claim of its own stored (or
//!   took over, or renewed), so a finish usually sends one command, in the batch of
//!   its store, as the script path does;
//! - otherwise (the claim was made by another process, the record changed since, or
//!   the memory was full and cleared), the finish reads the record (`GET`), checks
//!   the fence itself and sends `SET … IFEQ` with what it read, again after a
//!   change it did not expect, a few times at most.
//!
//! The new record keeps the stored `fingerprint|attempts|lease_until|created_at`,
//! as the finish script does; its index entry moves only when its new expiry is
//! earlier than the lease's end, by a `ZADD … LT`, which never moves an entry later
//! (an early entry is re-filed when a purge or a stuck scan meets it).
//!
//! Renew, delete, the rare claim that decides on a known record, purge, stuck and
//! tidy keep their scripts on every server: a renew moves the key's TTL by as much
//! as the record's due time, which needs the key's `PTTL` read and rewritten in one
//! step (no native command adds to a TTL); the others read the record and decide
//! on its fields, with no value known beforehand, so a native form would cost a
//! round trip more, and they are off the hot path of a delivery.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The most records one store remembers; when full, it forgets them all (their
/// finishes read the record first).
const MAX_REMEMBERED: usize = 1 << 16;

/// How many times a finish reads the record again after its `IFEQ` met a change.
pub(super) const MAX_TRIES: usize = 4;

/// Whether a store uses the native path, and the records its claims stored.
#[derive(Default)]
pub(super) struct Native {
    enabled: AtomicBool,
    /// The stored form of records this process claimed, by token.
    stored: Mutex<HashMap<u64, String>>,
}

impl Native {
    /// Uses the native path from now on.
    pub(super) fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Remembers `stored`, the record of the claim with `token` as stored now.
    pub(super) fn remember(&self, token: u64, stored: String) {
        let mut map = self
            .stored
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= MAX_REMEMBERED {
            map.clear();
        }
        map.insert(token, stored);
    }

    /// The record remembered for `token`, forgotten.
    pub(super) fn take(&self, token: u64) -> Option<String> {
        self.stored
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&token)
    }
}

/// Whether the server whose `INFO server` text is `info` takes `SET … IFEQ`:
/// Valkey 8.1 or later (`valkey_version`), or Redis 8.4 or later (`redis_version`,
/// from a server that does not call itself anything else).
pub(super) fn has_ifeq(info: &str) -> bool {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let at_least = |version: &str, want: (u32, u32)| {
        let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
        match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), Some(minor)) => (major, minor) >= want,
            _ => false,
        }
    };
    if let Some(version) = field("valkey_version") {
        return at_least(version, (8, 1));
    }
    match field("server_name") {
        Some(name) if !name.eq_ignore_ascii_case("redis") => false,
        _ => field("redis_version").is_some_and(|v| at_least(v, (8, 4))),
    }
}

/// Whether `text` is an integer as the scripts read one (`-?[0-9]+`).
fn is_int(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// The finished record, from `old` as stored: `head`, then the stored
/// `fingerprint|attempts|lease_until|created_at|`, then `tail`, and the stored
/// lease_until. `Ok(None)` when `old` does not carry `fence` (the lease is lost),
/// `Err(())` when it does but the fields after it do not read.
pub(super) fn finished(
    old: &str,
    fence: &str,
    head: &str,
    tail: &str,
) -> Result<Option<(String, i64)>, ()> {
    let Some(rest) = old.strip_prefix(fence) else {
        return Ok(None);
    };
    let mut fields = rest.splitn(5, '|');
    let (Some(f), Some(a), Some(l), Some(c), Some(_)) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Err(());
    };
    if !is_int(l) {
        return Err(());
    }
    let lease = l.parse::<i64>().map_err(|_| ())?;
    let kept = f.len() + a.len() + l.len() + c.len() + 4;
    let mut new = String::with_capacity(head.len() + kept + tail.len());
    new.push_str(head);
    new.push_str(&rest[..kept]);
    new.push_str(tail);
    Ok(Some((new, lease)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_keeps_the_stored_fields_and_checks_the_fence() {
        let old = "in_progress|42|abcd|3|1700|1600|1|1900|1650|[]";
        let (new, lease) = finished(old, "in_progress|42|", "completed|42|", "1|2000|1800|")
            .unwrap()
            .unwrap();
        assert_eq!(new, "completed|42|abcd|3|1700|1600|1|2000|1800|");
        assert_eq!(lease, 1700);
        assert_eq!(
            finished(old, "in_progress|43|", "completed|43|", "0|1|1|"),
            Ok(None)
        );
        assert_eq!(
            finished(
                "completed|42|abcd|3|1700|1600|1|1900|1650|",
                "in_progress|42|",
                "x",
                "y"
            ),
            Ok(None)
        );
        assert_eq!(
            finished(
                "in_progress|42|abcd|3|soon|1600|",
                "in_progress|42|",
                "x",
                "y"
            ),
            Err(())
        );
        assert_eq!(
            finished("in_progress|42|abcd|3", "in_progress|42|", "x", "y"),
            Err(())
        );
    }

    #[test]
    fn ifeq_is_found_from_the_server_version() {
        let valkey = |v: &str| {
            format!(
                "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:{v}\r\n"
            )
        };
        assert!(has_ifeq(&valkey("9.1.2")));
        assert!(has_ifeq(&valkey("8.1.0")));
        assert!(!has_ifeq(&valkey("8.0.2")));
        assert!(!has_ifeq(&valkey("7.2.4")));
        assert!(has_ifeq("redis_version:8.4.0\r\n"));
        assert!(has_ifeq("redis_version:8.4.0\r\nserver_name:redis\r\n"));
        assert!(!has_ifeq("redis_version:8.2.1\r\n"));
        assert!(!has_ifeq("redis_version:7.0.15\r\n"));
        assert!(!has_ifeq("redis_version:9.0.0\r\nserver_name:keydb\r\n"));
        assert!(!has_ifeq(""));
    }
}
