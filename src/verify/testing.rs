//! What the presets' unit tests share: the names they use, and the check of a
//! signed time's window.

pub(crate) use chrono::{DateTime, Utc};

pub(crate) use super::{Verified, VerifyError};

/// Checks the window around a delivery signed at `t` (Unix seconds) that
/// `verify_at(now)` verifies at `now`: accepted `tolerance` seconds either side,
/// refused as too old one second later and as too new one second earlier.
pub(crate) fn window(
    t: i64,
    tolerance: i64,
    verify_at: impl Fn(i64) -> Result<Verified, VerifyError>,
) {
    for now in [t + tolerance, t - tolerance] {
        let verified = verify_at(now);
        assert!(
            verified.is_ok(),
            "signed at {t}, verified at {now}: {verified:?}"
        );
    }
    let late = verify_at(t + tolerance + 1);
    assert!(
        matches!(late, Err(VerifyError::TimestampTooOld { .. })),
        "{late:?}"
    );
    let early = verify_at(t - tolerance - 1);
    assert!(
        matches!(early, Err(VerifyError::TimestampTooNew { .. })),
        "{early:?}"
    );
}
