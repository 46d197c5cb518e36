//! What happened to a delivery, and what to answer the sender; what a handler
//! returns when it fails.

use std::fmt;
use std::time::Duration;

use http::StatusCode;

use crate::store::{RecordState, StoreError};
use crate::verify::{Handshake, VerifyError};

/// What a handler returns when it fails. Its error's text is kept (in the
/// record's history, the outcome, the log) up to [`MAX_ERROR_LEN`](crate::guard::MAX_ERROR_LEN) bytes.
#[derive(Debug)]
#[non_exhaustive]
pub enum HandlerError {
    /// Worth retrying: the claim is released and the failure counted.
    Retryable(crate::store::BoxError),
    /// Retrying cannot help: answered 200 with the alert hook.
    Permanent(crate::store::BoxError),
}

impl HandlerError {
    /// A retryable failure.
    pub fn retryable(e: impl Into<crate::store::BoxError>) -> Self {
        Self::Retryable(e.into())
    }

    /// A permanent failure.
    pub fn permanent(e: impl Into<crate::store::BoxError>) -> Self {
        Self::Permanent(e.into())
    }
}

/// Any error turns into a retryable failure, so `?` works in handlers. Its text is
/// logged and stored in the record's history: an error that quotes the payload (as
/// serde's do) puts payload contents there too.
impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(e: E) -> Self {
        Self::Retryable(Box::new(e))
    }
}

/// What became of one delivery. Each variant says what the sender should be told:
/// see [`Outcome::kind`] and [`WebhookGuard::answer`](crate::WebhookGuard::answer).
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and succeeded. Answer 200.
    Processed {
        /// The event id.
        id: String,
    },
    /// The id was already completed, escalated or failed permanently. The handler did
    /// not run. Answer 200 so the sender stops retrying.
    Duplicate {
        /// The event id.
        id: String,
        /// The state the id is in.
        state: RecordState,
    },
    /// Another delivery of the id holds a live lease. The handler did not run.
    /// Answer 409 with `Retry-After` (or 200 if configured).
    InProgress {
        /// The event id.
        id: String,
        /// How long until the other delivery's lease runs out, unless it is renewed;
        /// at least a second.
        retry_after: Duration,
    },
    /// The delivery is not acceptable (bad signature, no id, too large, unknown
    /// tenant). Nothing was stored. Answer 400, 401, 403, 404 or 413 with the
    /// reason ([`Rejection::status`]).
    Rejected(Rejection),
    /// The id was first seen with a different body. The handler did not run; the
    /// conflict hook was called. Answer 422.
    Conflict {
        /// The event id.
        id: String,
    },
    /// The handler failed with a retryable error (or panicked): the claim is released
    /// and the failure counted. Answer 500 so the sender retries.
    RetryableFailure {
        /// The event id.
        id: String,
        /// Failures counted for the id so far, this one included (unless another
        /// delivery took the lease over before it could be counted).
        failures: u32,
        /// The handler's error.
        error: String,
    },
    /// The id has now failed `escalate_after` times: the escalation hook ran (once,
    /// unless the store could not record the escalation: see
    /// [`Hooks::on_escalation`](crate::Hooks::on_escalation)) and the id is treated
    /// as done. Answer 200 and reconcile through the provider's API.
    Escalated {
        /// The event id.
        id: String,
        /// Failures counted for the id.
        failures: u32,
    },
    /// The handler reported a permanent failure: the alert hook ran. Answer 200, as
    /// retrying cannot help.
    PermanentFailure {
        /// The event id.
        id: String,
        /// The handler's error.
        error: String,
    },
    /// The handler succeeded but the store could not record it (the lease was taken
    /// over, or the store failed). Answer 200 (the work is done; a retry would repeat
    /// it); the unrecorded hook ran so the host can reconcile. After a store failure
    /// the guard keeps trying to record the completion in the background (fenced, for
    /// at least the lease), so a redelivery once the store is back is a duplicate.
    Unrecorded {
        /// The event id.
        id: String,
        /// Why it was not recorded.
        reason: Unrecorded,
    },
    /// Inbox mode: the event is stored durably (by this delivery when `new`, else by an
    /// earlier one) and a worker will process it. Answer 200.
    Accepted {
        /// The event id.
        id: String,
        /// Whether this delivery stored it.
        new: bool,
    },
    /// The ordering guard found a newer event already seen for the same object and
    /// family: the handler did not run, the stale hook was called. Answer 200.
    Stale {
        /// The event id.
        id: String,
        /// The `created_at` of the newest event seen for the object.
        newest: chrono::DateTime<chrono::Utc>,
    },
    /// The store could not be reached or failed before a handler ran. Answer 503:
    /// the sender retries and nothing is lost.
    StoreUnavailable {
        /// The event id, when it was known.
        id: Option<String>,
        /// The store's error.
        error: StoreError,
    },
    /// The request was the provider's handshake (it verified): the handler did not
    /// run and nothing was stored. Answer the handshake's own status, content type
    /// and body, which every integration does (see [`Handshake`]).
    Handshake(Handshake),
}

/// Why a successful handler run could not be recorded.
#[derive(Debug)]
#[non_exhaustive]
pub enum Unrecorded {
    /// Another delivery took the lease over while the handler ran: the handler may
    /// have run twice.
    LeaseLost,
    /// The store failed when asked to record the completion.
    Store(StoreError),
}

impl fmt::Display for Unrecorded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LeaseLost => f.write_str("lease lost while the handler ran"),
            Self::Store(e) => write!(f, "completion not recorded: {e}"),
        }
    }
}

/// Why a delivery was rejected before anything was stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The signature or its timestamp did not verify.
    #[error("verification failed: {0}")]
    Verify(#[from] VerifyError),
    /// The body is larger than the guard's limit.
    #[error("body too large: {size} bytes, limit {limit}")]
    BodyTooLarge {
        /// The body's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// No event id was found where the guard looks for it.
    #[error("event id missing: {0}")]
    MissingId(String),
    /// The event id is empty, too long (over 255 bytes) or holds control characters.
    #[error("event id invalid: {0}")]
    InvalidId(&'static str),
    /// A guard serving tenants found no tenant for the delivery: neither its route
    /// nor the delivery itself names one (see [`crate::tenant`]), or it was handed
    /// the delivery directly instead of through
    /// [`WebhookGuard::tenant`](crate::WebhookGuard::tenant). Answered 400.
    #[error("no tenant named by the route or the delivery")]
    MissingTenant,
    /// The tenant is not one the secret resolver knows, or its id is not a valid
    /// tenant id (see [`tenant::check_tenant`](crate::tenant::check_tenant)).
    /// Answered 404. Nothing was stored.
    #[error("unknown tenant")]
    UnknownTenant,
    /// The delivery names a tenant (in a header or its body) other than the one its
    /// route names. Answered 403. Nothing was stored.
    #[error("the delivery's tenant is not its route's")]
    TenantMismatch,
}

impl Rejection {
    /// A short machine-readable reason, stable across releases.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Verify(e) => e.code(),
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::MissingId(_) => "missing_event_id",
            Self::InvalidId(_) => "invalid_event_id",
            Self::MissingTenant => "missing_tenant",
            Self::UnknownTenant => "unknown_tenant",
            Self::TenantMismatch => "tenant_mismatch",
        }
    }

    /// 413 Payload Too Large for a body over the limit, 401 for a delivery that
    /// failed verification, 404 for an unknown tenant, 403 for a tenant mismatch,
    /// 400 for everything else.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BodyTooLarge { .. } | Self::Verify(VerifyError::BodyTooLarge { .. }) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::Verify(_) => StatusCode::UNAUTHORIZED,
            Self::UnknownTenant => StatusCode::NOT_FOUND,
            Self::TenantMismatch => StatusCode::FORBIDDEN,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// The kind of an [`Outcome`], without its data: the key of the answer mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, derive_more::Display)]
#[display("{}", self.as_str())]
#[non_exhaustive]
pub enum OutcomeKind {
    /// See [`Outcome::Processed`].
    Processed,
    /// See [`Outcome::Duplicate`].
    Duplicate,
    /// See [`Outcome::InProgress`].
    InProgress,
    /// See [`Outcome::Rejected`].
    Rejected,
    /// See [`Outcome::Conflict`].
    Conflict,
    /// See [`Outcome::RetryableFailure`].
    RetryableFailure,
    /// See [`Outcome::Escalated`].
    Escalated,
    /// See [`Outcome::PermanentFailure`].
    PermanentFailure,
    /// See [`Outcome::Unrecorded`].
    Unrecorded,
    /// See [`Outcome::StoreUnavailable`].
    StoreUnavailable,
    /// See [`Outcome::Accepted`].
    Accepted,
    /// See [`Outcome::Stale`].
    Stale,
    /// See [`Outcome::Handshake`].
    Handshake,
}

impl OutcomeKind {
    /// Every kind, in declaration order.
    pub const ALL: [OutcomeKind; 13] = [
        Self::Processed,
        Self::Duplicate,
        Self::InProgress,
        Self::Rejected,
        Self::Conflict,
        Self::RetryableFailure,
        Self::Escalated,
        Self::PermanentFailure,
        Self::Unrecorded,
        Self::StoreUnavailable,
        Self::Accepted,
        Self::Stale,
        Self::Handshake,
    ];

    /// The name used in logs and metrics, such as `"processed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processed => "processed",
            Self::Duplicate => "duplicate",
            Self::InProgress => "in_progress",
            Self::Rejected => "rejected",
            Self::Conflict => "conflict",
            Self::RetryableFailure => "retryable_failure",
            Self::Escalated => "escalated",
            Self::PermanentFailure => "permanent_failure",
            Self::Unrecorded => "unrecorded",
            Self::StoreUnavailable => "store_unavailable",
            Self::Accepted => "accepted",
            Self::Stale => "stale",
            Self::Handshake => "handshake",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The default HTTP status for this kind (rejections carry their own: 400, 401 or
    /// 413; a handshake carries its own, 200 for every preset's).
    pub fn default_status(self) -> StatusCode {
        match self {
            Self::Processed
            | Self::Duplicate
            | Self::Escalated
            | Self::PermanentFailure
            | Self::Unrecorded
            | Self::Accepted
            | Self::Stale
            | Self::Handshake => StatusCode::OK,
            Self::InProgress => StatusCode::CONFLICT,
            Self::Rejected => StatusCode::BAD_REQUEST,
            Self::Conflict => StatusCode::UNPROCESSABLE_ENTITY,
            Self::RetryableFailure => StatusCode::INTERNAL_SERVER_ERROR,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl Outcome {
    /// The kind of this outcome.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Self::Processed { .. } => OutcomeKind::Processed,
            Self::Duplicate { .. } => OutcomeKind::Duplicate,
            Self::InProgress { .. } => OutcomeKind::InProgress,
            Self::Rejected(_) => OutcomeKind::Rejected,
            Self::Conflict { .. } => OutcomeKind::Conflict,
            Self::RetryableFailure { .. } => OutcomeKind::RetryableFailure,
            Self::Escalated { .. } => OutcomeKind::Escalated,
            Self::PermanentFailure { .. } => OutcomeKind::PermanentFailure,
            Self::Unrecorded { .. } => OutcomeKind::Unrecorded,
            Self::StoreUnavailable { .. } => OutcomeKind::StoreUnavailable,
            Self::Accepted { .. } => OutcomeKind::Accepted,
            Self::Stale { .. } => OutcomeKind::Stale,
            Self::Handshake(_) => OutcomeKind::Handshake,
        }
    }

    /// The event id, when one was extracted.
    pub fn id(&self) -> Option<&str> {
        match self {
            Self::Processed { id }
            | Self::Duplicate { id, .. }
            | Self::InProgress { id, .. }
            | Self::Conflict { id }
            | Self::RetryableFailure { id, .. }
            | Self::Escalated { id, .. }
            | Self::PermanentFailure { id, .. }
            | Self::Unrecorded { id, .. }
            | Self::Accepted { id, .. }
            | Self::Stale { id, .. } => Some(id),
            Self::StoreUnavailable { id, .. } => id.as_deref(),
            Self::Rejected(_) | Self::Handshake(_) => None,
        }
    }

    /// The handshake to answer, for [`Outcome::Handshake`]: its status, content
    /// type and body.
    pub fn handshake(&self) -> Option<&Handshake> {
        match self {
            Self::Handshake(handshake) => Some(handshake),
            _ => None,
        }
    }

    /// A short machine-readable reason: the kind, or the rejection's code.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Rejected(r) => r.code(),
            other => other.kind().as_str(),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rejected(r) => write!(f, "rejected: {r}"),
            Self::RetryableFailure {
                error, failures, ..
            } => {
                write!(f, "retryable failure #{failures}: {error}")
            }
            Self::PermanentFailure { error, .. } => write!(f, "permanent failure: {error}"),
            Self::Unrecorded { reason, .. } => write!(f, "unrecorded: {reason}"),
            Self::StoreUnavailable { error, .. } => write!(f, "{error}"),
            Self::Duplicate { state, .. } => write!(f, "duplicate ({state})"),
            Self::Handshake(h) => write!(f, "handshake ({})", h.name),
            other => f.write_str(other.kind().as_str()),
        }
    }
}

/// What to send back to the webhook sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Answer {
    /// The HTTP status.
    pub status: StatusCode,
    /// The `Retry-After` header's value, in whole seconds, when there is one.
    pub retry_after: Option<u64>,
    /// A short machine-readable reason for the body.
    pub reason: &'static str,
}

impl Answer {
    /// The answer to `outcome` with `status`: a `Retry-After` for a retry asked for
    /// (never on a 2xx), and the outcome's reason.
    pub(crate) fn with_status(outcome: &Outcome, status: StatusCode) -> Self {
        let retry_after = match outcome {
            _ if status.is_success() => None,
            Outcome::InProgress { retry_after, .. } => Some(crate::retry_after_secs(*retry_after)),
            Outcome::StoreUnavailable { .. } => Some(5),
            _ => None,
        };
        Self {
            status,
            retry_after,
            reason: outcome.reason(),
        }
    }
}
