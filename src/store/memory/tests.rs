//! Tests of the sharded record table of a [`MemoryStore`](super::MemoryStore).

use chrono::TimeDelta;

use super::*;

#[test]
fn ids_that_differ_only_in_a_counter_spread_evenly_over_the_shards() {
    let store = MemoryStore::with_shards(1024);
    for width in [3, 10, 26] {
        let mut load = vec![0u32; 1024];
        for i in 0..100_000u32 {
            let id = format!("evt_{i:0width$}");
            load[store.shard_index(store.hash(Key::new("stripe", &id)))] += 1;
        }
        let mean = 100_000 / 1024;
        let (min, max) = (load.iter().min().unwrap(), load.iter().max().unwrap());
        assert!(
            *max < mean * 2 && *min > mean / 2,
            "{min}..{max} around {mean}"
        );
    }
}

fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => unreachable!("the memory store never waits"),
    }
}

fn request(id: &str, now: DateTime<Utc>) -> ClaimRequest<'_> {
    ClaimRequest::fresh(Key::new("ns", id), now)
}

/// A purge whose limit runs out goes on, next time, after where it stopped: records
/// that keep expiring in the first shards do not starve the later ones.
#[test]
fn shard_counts_are_kept_in_range() {
    assert_eq!(MemoryStore::with_shards(0).inner.shards.len(), 1);
    assert_eq!(MemoryStore::with_shards(3).inner.shards.len(), 4);
    // Past 2^63 `next_power_of_two` wraps to 0 in release builds: no shard.
    assert_eq!(
        MemoryStore::with_shards(usize::MAX).inner.shards.len(),
        MAX_SHARDS
    );
}

#[test]
fn purges_go_round_the_shards() {
    let store = MemoryStore::with_shards(2);
    let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let shard_of = |id: &str| store.shard_index(store.hash(Key::new("ns", id)));
    let ids = |shard: usize, n: usize, tag: &str| -> Vec<String> {
        (0..)
            .map(|i| format!("{tag}{i}"))
            .filter(|id| shard_of(id) == shard)
            .take(n)
            .collect()
    };
    let expired = |id: &str| {
        let mut r = request(id, t0);
        r.lease_until = t0;
        r.expires_at = t0 + TimeDelta::seconds(1);
        ready(store.claim(&r)).unwrap();
    };
    let later = t0 + TimeDelta::seconds(10);
    let starved = ids(1, 10, "late-");
    for id in &starved {
        expired(id);
    }
    // Each round, 5 more expire in shard 0, and a purge may remove 5.
    for round in 0..20 {
        for id in ids(0, 5, &format!("r{round}-")) {
            expired(&id);
        }
        ready(store.purge_expired(later, 5)).unwrap();
    }
    let left = starved
        .iter()
        .filter(|id| ready(store.get(Key::new("ns", id))).unwrap().is_some())
        .count();
    assert_eq!(left, 0, "shard 1 was purged too");
}

/// The side table of failure notes and the per-shard counters follow every change.
#[test]
fn history_and_shard_counters_follow_the_records() {
    let store = MemoryStore::with_shards(1);
    let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    // One guard at a time: (in-progress count, notes kept).
    let counts = || {
        let shard = lock(&store.inner.shards[0]);
        (shard.in_progress, shard.history.len())
    };
    let note = [FailureNote {
        at: t0,
        error: "boom".into(),
    }];
    let finish = |state, history: &'static [FailureNote], at| Finish {
        state,
        failures: history.len() as u32,
        history,
        now: at,
        expires_at: at + TimeDelta::seconds(3600),
    };
    let note: &'static [FailureNote] = Box::leak(Box::new(note));

    let first = request("a", t0);
    ready(store.claim(&first)).unwrap();
    assert_eq!(counts().0, 1);
    let failed = finish(RecordState::Failed, note, t0);
    let fence = ready(store.finish(first.holder(), &failed)).unwrap();
    assert_eq!(fence, Fence::Applied);
    assert_eq!(counts(), (0, 1));
    let rec = ready(store.get(first.key)).unwrap().unwrap();
    assert_eq!(rec.history, note);

    // A retry takes the failed record over and keeps its notes.
    let retry = request("a", t0 + TimeDelta::seconds(1));
    let Claim::Acquired(rec) = ready(store.claim(&retry)).unwrap() else {
        panic!("a failed record is claimed again");
    };
    assert_eq!((rec.attempts, rec.history.as_slice()), (2, note));
    assert_eq!(counts().0, 1);
    let done = finish(RecordState::Completed, &[], t0 + TimeDelta::seconds(2));
    let fence = ready(store.finish(retry.holder(), &done)).unwrap();
    assert_eq!(fence, Fence::Applied);
    assert_eq!(counts(), (0, 0));

    // An abandoned claim is stuck, then purged with its notes once expired.
    let b = request("b", t0);
    ready(store.claim(&b)).unwrap();
    let renewed = ready(store.renew(
        b.holder(),
        &Renew {
            lease_until: t0,
            expires_at: t0,
        },
    ))
    .unwrap();
    assert_eq!(renewed, Fence::Applied);
    let stuck = ready(store.stuck(t0 + TimeDelta::seconds(61), 10)).unwrap();
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].key(), b.key);
    let later = t0 + TimeDelta::seconds(7200);
    assert_eq!(ready(store.purge_expired(later, 1)).unwrap(), 1);
    assert_eq!(ready(store.purge_expired(later, 10)).unwrap(), 1);
    assert_eq!(ready(store.purge_expired(later, 10)).unwrap(), 0);
    let shard = lock(&store.inner.shards[0]);
    assert!(shard.table.is_empty() && shard.history.is_empty());
    assert_eq!(
        shard.free.len(),
        shard.nodes.len(),
        "every slot is free again"
    );
    assert_eq!(
        (shard.in_progress, shard.next_due),
        (0, DateTime::<Utc>::MAX_UTC)
    );
    let slots = shard.nodes.len();
    drop(shard);

    // New records take the freed slots: the slab does not grow.
    for id in ["c", "d"] {
        let req = request(id, later);
        assert!(matches!(
            ready(store.claim(&req)).unwrap(),
            Claim::Acquired(_)
        ));
        assert_eq!(ready(store.get(req.key)).unwrap().unwrap().id, id);
    }
    let shard = lock(&store.inner.shards[0]);
    assert_eq!(shard.nodes.len(), slots, "freed slots are reused");
    assert_eq!(shard.free.len(), slots - 2);
}

/// A shard that grows over many slab chunks and table resizes (which file each
/// record again under its kept hash) still finds every record, with its own
/// fields, and refills freed slots before it grows again.
#[test]
fn records_stay_found_while_a_shard_grows() {
    let store = MemoryStore::with_shards(1);
    let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let ids: Vec<String> = (0..1000).map(|i| format!("evt_{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let mut req = request(id, t0);
        req.expires_at = t0 + TimeDelta::seconds(i64::try_from(i).unwrap() + 1);
        assert!(matches!(
            ready(store.claim(&req)).unwrap(),
            Claim::Acquired(_)
        ));
    }
    let check = |ids: &[String]| {
        for id in ids {
            let rec = ready(store.get(Key::new("ns", id))).unwrap();
            assert_eq!(rec.map(|r| r.id), Some(id.clone()));
        }
    };
    check(&ids);
    assert_eq!(store.len(), 1000);
    // The first 500 expire and are purged; 500 new ids take their slots.
    let purged = ready(store.purge_expired(t0 + TimeDelta::seconds(500), 10_000));
    assert_eq!(purged.unwrap(), 500);
    let later: Vec<String> = (1000..1500).map(|i| format!("evt_{i}")).collect();
    for id in &later {
        ready(store.claim(&request(id, t0))).unwrap();
    }
    check(&ids[500..]);
    check(&later);
    for id in &ids[..500] {
        assert!(ready(store.get(Key::new("ns", id))).unwrap().is_none());
    }
    {
        let shard = lock(&store.inner.shards[0]);
        assert_eq!((shard.nodes.len(), shard.free.len()), (1000, 0));
    }
    // Enough new ids to resize the table again, which files the records of the
    // reused slots under the hashes kept there.
    let more: Vec<String> = (1500..4000).map(|i| format!("evt_{i}")).collect();
    for id in &more {
        ready(store.claim(&request(id, t0))).unwrap();
    }
    check(&ids[500..]);
    check(&later);
    check(&more);
    assert_eq!(store.len(), 3500);
}

/// Keys too long to sit inside the record live on the heap and work the same;
/// keys too long to be hashed in one write (over 64 bytes with the namespace
/// `ns` and its NUL) hash to what the one write would give, and work the same.
#[test]
fn long_keys_round_trip() {
    let store = MemoryStore::with_shards(1);
    let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    for id in [
        "a".repeat(INLINE_KEY - 3),
        "b".repeat(INLINE_KEY - 2),
        "c".repeat(61),
        "d".repeat(62),
        "é".repeat(100),
    ] {
        let req = request(&id, t0);
        let mut one_write = store.inner.hasher.build_hasher();
        one_write.write(map_key(req.key).as_bytes());
        assert_eq!(
            store.hash(req.key),
            one_write.finish(),
            "{} bytes",
            id.len()
        );
        assert!(matches!(
            ready(store.claim(&req)).unwrap(),
            Claim::Acquired(_)
        ));
        assert!(matches!(
            ready(store.claim(&req)).unwrap(),
            Claim::Existing(_)
        ));
        let rec = ready(store.get(req.key)).unwrap().unwrap();
        assert_eq!(rec.id, id);
        let stuck = ready(store.stuck(t0 + TimeDelta::seconds(61), 10)).unwrap();
        assert!(stuck.iter().any(|r| r.id == id));
        let done = Finish {
            state: RecordState::Completed,
            failures: 0,
            history: &[],
            now: t0,
            expires_at: req.expires_at,
        };
        assert_eq!(
            ready(store.finish(req.holder(), &done)).unwrap(),
            Fence::Applied
        );
        let rec = ready(store.get(req.key)).unwrap().unwrap();
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(ready(store.delete(req.key, t0)).unwrap(), Deleted::Removed);
        assert!(ready(store.get(req.key)).unwrap().is_none());
    }
}
