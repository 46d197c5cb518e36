//! What the presets' unit tests share: the names they use, and the checks every
//! preset keyed with secrets must pass (rotation, a tampered body, a missing
//! header).

pub(crate) use chrono::{DateTime, Utc};

pub(crate) use super::common::at;
pub(crate) use super::{Verified, Verifier, VerifyError};
