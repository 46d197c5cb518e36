//! Time, injectable so tests move it without sleeping.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};

/// A source of the current time.
///
/// The guard, the verifiers and the sweeper read time only through a `Clock`, so a
/// test can replace it with a [`ManualClock`] and move time without sleeping.
#[auto_impl::auto_impl(Arc, Box)]
pub trait Clock: fmt::Debug + Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that only moves when told to. Clones share the same time.
///
/// ```
/// use chrono::{TimeDelta, TimeZone, Utc};
/// use webhook_guard::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new(Utc.timestamp_opt(1_700_000_000, 0).unwrap());
/// clock.advance(TimeDelta::hours(1));
/// assert_eq!(clock.now().timestamp(), 1_700_003_600);
/// ```
#[derive(Clone)]
pub struct ManualClock {
    micros: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock stopped at `at`.
    pub fn new(at: DateTime<Utc>) -> Self {
        Self {
            micros: Arc::new(AtomicI64::new(at.timestamp_micros())),
        }
    }

    /// Moves the clock to `at`.
    pub fn set(&self, at: DateTime<Utc>) {
        self.micros.store(at.timestamp_micros(), Ordering::SeqCst);
    }

    /// Moves the clock forward (or back, for a negative delta) by `by`, saturating
    /// at the ends of time.
    pub fn advance(&self, by: TimeDelta) {
        // Kept within chrono's range, so that moving back from an end of time
        // starts from that end; a delta too large for microseconds goes to the end.
        let (min, max) = (
            DateTime::<Utc>::MIN_UTC.timestamp_micros(),
            DateTime::<Utc>::MAX_UTC.timestamp_micros(),
        );
        let step = by.num_microseconds();
        self.micros
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |m| {
                Some(match step {
                    Some(step) => m.saturating_add(step).clamp(min, max),
                    None if by < TimeDelta::zero() => min,
                    None => max,
                })
            })
            .ok();
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.now())
            .finish()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        let micros = self.micros.load(Ordering::SeqCst);
        // The clamped ends read as the ends of time themselves.
        if micros >= DateTime::<Utc>::MAX_UTC.timestamp_micros() {
            return DateTime::<Utc>::MAX_UTC;
        }
        DateTime::from_timestamp_micros(micros).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_saturates_both_ways() {
        let start = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let clock = ManualClock::new(start);
        clock.advance(TimeDelta::days(-200_000_000));
        assert!(clock.now() < start);
        assert_eq!(clock.now(), DateTime::<Utc>::MIN_UTC);
        clock.set(start);
        clock.advance(TimeDelta::days(200_000_000));
        assert_eq!(clock.now(), DateTime::<Utc>::MAX_UTC);
        // Back from an end of time: from that end.
        clock.advance(TimeDelta::days(-1));
        let max_micros = DateTime::<Utc>::MAX_UTC.timestamp_micros();
        let max = DateTime::from_timestamp_micros(max_micros).unwrap();
        assert_eq!(clock.now(), max - TimeDelta::days(1));
        clock.advance(TimeDelta::days(-200_000_000));
        clock.advance(TimeDelta::days(1));
        assert_eq!(clock.now(), DateTime::<Utc>::MIN_UTC + TimeDelta::days(1));
    }
}
