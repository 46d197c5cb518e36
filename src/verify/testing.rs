//! What the presets' unit tests share: the names they use, the check of a signed
//! time's window, and the checks of a signed delivery (rotation, a tampered body, a
//! missing signature header).

pub(crate) use chrono::{DateTime, Utc};

pub(crate) use super::{KeyError, Secret, Verified, Verifier, VerifyError};

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

/// A delivery signed with a secret its preset's test keys it with.
pub(crate) struct Signed<'a> {
    /// Its headers.
    pub(crate) headers: &'a [(&'a str, &'a str)],
    /// The name of its signature header, as the preset spells it.
    pub(crate) signature: &'static str,
    /// Its body.
    pub(crate) body: &'a [u8],
    /// Its body changed after signing.
    pub(crate) tampered: &'a [u8],
}

impl Signed<'_> {
    /// Checks what a preset does with the delivery at `now`, keyed with its secret
    /// (`keyed`) and with a newer secret before it (`rotated`): both accept it, with
    /// the event id `id`; both refuse the tampered body
    /// ([`VerifyError::NoMatch`]) and the delivery without its signature header
    /// ([`VerifyError::MissingHeader`] naming it). Returns what `keyed` verified.
    pub(crate) fn check(
        &self,
        keyed: &dyn Verifier,
        rotated: &dyn Verifier,
        now: DateTime<Utc>,
        id: Option<&str>,
    ) -> Verified {
        let unsigned: Vec<_> = (self.headers.iter())
            .filter(|(name, _)| !name.eq_ignore_ascii_case(self.signature))
            .copied()
            .collect();
        for (which, verifier) in [("keyed", keyed), ("rotated", rotated)] {
            let verified = verifier.verify(&self.headers, self.body, now);
            let event_id = verified.as_ref().map(|v| v.event_id.as_deref());
            assert_eq!(event_id, Ok(id), "{which}: {verified:?}");
            assert_eq!(
                verifier.verify(&self.headers, self.tampered, now),
                Err(VerifyError::NoMatch),
                "{which}: the tampered body"
            );
            assert_eq!(
                verifier.verify(&unsigned, self.body, now),
                Err(VerifyError::MissingHeader(self.signature.into())),
                "{which}: without {}",
                self.signature
            );
        }
        keyed.verify(&self.headers, self.body, now).unwrap()
    }
}
