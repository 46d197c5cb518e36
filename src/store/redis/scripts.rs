//! The Lua scripts of the dedup records, loaded once per server.

/// Shared by every script: `parse` splits a stored record (see [`record`](super::codec::record)) into its
/// ten fields, or answers nothing for one that does not parse, numbers included (a
/// record this crate did not write must not raise a script error: that would fail
/// every other record of a batch or a scan); `ttl` is the time left until `due`, at
/// least 1 ms.
const PRELUDE: &str = include_str!("lua/records/prelude.lua");

/// The claim script, for the rare claim that must decide on a known record (see
/// [`RedisStore::claim`](crate::store::ProcessedStore::claim)): its first lines store the id if the record vanished since
/// the claim's `SET NX GET`; KEYS record, due, the namespace's `in_progress`
/// listing index; ARGV the fresh record, its TTL, member, fingerprint, token, now,
/// lease_until, expires_at, listing key prefix, listing entry `<id>\0<token>`.
/// Answers 0 (stored: the caller knows the record).
const CLAIM_HEAD: &str = include_str!("lua/records/claim_head.lua");

/// Tidies [`TIDY_BATCH`] entries of a shard's due index that are due: drops those
/// whose record is gone (dropped by its TTL), with their listing entries, and
/// re-files finished ones at their expiry. KEYS due; ARGV record key prefix, now,
/// listing key prefix.
pub(super) const TIDY: &str = include_str!("lua/records/tidy.lua");

/// Each time a process has filed this many new records in a shard's due index, it
/// tidies as many of the shard's due entries ([`TIDY`]): gone records dropped,
/// finished ones re-filed at their expiry. With retention by key TTL, the index so
/// stays bounded even when no sweeper runs.
pub(super) const TIDY_BATCH: u32 = 256;

/// The rest of the claim script, deciding on a known record in the same round trip:
/// an expired record is replaced (0), a failed or abandoned one with a matching
/// fingerprint (equal, or either one unknown: all zeros) taken over ({1, record}),
/// keeping a known fingerprint, and anything else answered unchanged ({2, record}),
/// the listing entry the claim's transaction filed removed. A record replaced or
/// taken over leaves its listing index for `in_progress`.
const CLAIM_DECIDE: &str = include_str!("lua/records/claim_decide.lua");

/// `body` after the [`PRELUDE`].
fn with_prelude(body: &str) -> String {
    format!("{PRELUDE}{body}")
}

scripts!(pub(super) Scripts {
    claim: format!("{CLAIM_HEAD}{PRELUDE}{CLAIM_DECIDE}"),
    tidy: with_prelude(&TIDY.replace("TIDY_BATCH", &TIDY_BATCH.to_string())),
    /// Finish, for a batch of records: KEYS record, due, `in_progress` listing index
    /// and the new state's listing index of each; ARGV nine per record: the fence
    /// prefix `in_progress|<token>|`, the new record's head `<state>|<token>|`, its
    /// tail `<failures>|<expires_at>|<now>|<history>`, its TTL, expires_at, member,
    /// listing entry `<id>\0<token>`, id, now. The listing entry moves from
    /// `in_progress` to the new state (scored `now`); a lost lease drops the
    /// claim's own `in_progress` entry, which names a token no record holds. Answers one code per record: 1 (applied), 0 (lease lost) or
    /// -1 (corrupt). Keeps the fields `f|a|l|c` after the fence prefix as they are. The
    /// index entry stays at the lease's end (at or before the new expiry, where purge
    /// and stuck re-file it) unless the new expiry is earlier. Without the prelude:
    /// every line here is paid by every processed delivery.
    finish: include_str!("lua/records/finish.lua"),
    /// Renew: KEYS record, due; ARGV member, token, lease_until, expires_at. Answers
    /// the renewed record as stored, or 0 (lease lost). No `now` is given, so the TTL
    /// moves by as much as the record's due time does.
    renew: with_prelude(include_str!("lua/records/renew.lua")),
    /// Delete: KEYS record, due; ARGV member, now, listing key prefix. Answers 1 (removed), 0 (not found)
    /// or 2 (live lease).
    delete: with_prelude(include_str!("lua/records/delete.lua")),
    /// Purge one batch of a shard: KEYS due; ARGV now, limit, record key prefix,
    /// offset, listing key prefix (a removed record leaves its listing index). Answers {removed, looked at, kept in place}: stuck records whose expiry
    /// has not come stay at the front of the range (for stuck), everything else leaves
    /// it (removed, or re-filed at its next due time).
    purge: with_prelude(include_str!("lua/records/purge.lua")),
    /// Stuck records of one shard: KEYS due; ARGV now, limit, record key prefix,
    /// offset, listing key prefix. Answers {looked at, kept in place, then member and record of each stuck
    /// one}: stuck and expired records stay at the front of the range, everything else
    /// leaves it (dropped if gone, or re-filed at its next due time).
    stuck: with_prelude(include_str!("lua/records/stuck.lua")),
});
