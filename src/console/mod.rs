//! The operator console: see, search and act on a guard's deliveries in a browser.
//!
//! [`router`] returns an axum [`Router`] the host mounts where it likes; every link
//! in it is relative, so any mount point (and a proxy that strips a prefix) works:
//!
//! ```no_run
//! use axum::Router;
//! use webhook_guard::console::{self, Auth};
//! use webhook_guard::{verify::Stripe, MemoryStore, WebhookGuard};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let guard = WebhookGuard::builder()
//!     .store(MemoryStore::new())
//!     .verifier(Stripe::new(["whsec_wRNftLajMZNeslQOP6vEPm4iVx5NlZ6z"])?)
//!     .build()?;
//! let password = std::env::var("CONSOLE_PASSWORD")?;
//! let app: Router = Router::new().nest(
//!     "/admin/webhooks",
//!     console::router(guard, Auth::basic("ops", password)?)?,
//! );
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! # Pages
//!
//! - `overview`: how many records reached each state over the last hour and day
//!   (a bar chart drawn as SVG on the server), stuck leases, open escalations,
//!   dead letters. The mount point itself redirects here.
//! - `records?state=&since=&until=&prefix=`: a list, newest change first, a page
//!   at a time (`after=` is the next page's cursor).
//! - `record?id=`: one id: attempts, failure history with the handler's error
//!   text, fingerprint, lease and retention times, escalation marks, and for an
//!   inbox event its state and, when the host enables it
//!   ([`Console::show_bodies`]), its stored body, pretty-printed and cut at
//!   [`Console::body_limit`].
//! - `confirm?action=forget|requeue|acknowledge|resolve&...`: what an action will
//!   do, and the form that does it (`POST forget`, `POST requeue`,
//!   `POST escalation`).
//!
//! Every page answers JSON instead of HTML for `?format=json`, or when the
//! request's `Accept` names `application/json` and not `text/html`; the JSON
//! carries the `csrf_token` a script sends back with an action.
//!
//! # Security
//!
//! - **Authentication** is part of the router's signature ([`Auth`]): a bearer
//!   token or Basic credentials compared in constant time, or the host's own
//!   tower middleware.
//! - **CSRF**: actions are `POST` only and carry a token (form field `csrf`, or the
//!   `X-CSRF-Token` header) that is an HMAC of the operator's name under a key
//!   drawn at start-up ([`Console::csrf_key`] sets one shared by replicas). A
//!   request a browser marks as cross-site (`Sec-Fetch-Site: cross-site`) is
//!   refused whatever it carries.
//! - **Escaping**: pages are maud templates, which escape every value; ids, error
//!   text and bodies from deliveries render as text.
//! - **Headers** on every answer, refusals included: `Content-Security-Policy:
//!   default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';
//!   frame-ancestors 'none'; base-uri 'none'` (no script at all), `X-Frame-Options:
//!   DENY`, `Referrer-Policy: no-referrer`, `X-Content-Type-Options: nosniff`,
//!   `Cache-Control: no-store`.
//! - **Audit**: every action (and every refused request) logs one line at target
//!   `webhook_guard::console::audit`: who, what, which id or filter, the result.
//! - Bodies are shown only when the host enables them; no secret is ever shown
//!   (the guard's verifier is not reachable from here).

mod actions;
mod auth;
mod chart;
mod handlers;
mod source;
mod views;

use std::sync::Arc;

use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::http::HeaderValue;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

pub use auth::{Auth, Operator, MIN_PASSWORD_LEN, MIN_TOKEN_LEN};

use crate::WebhookGuard;
use source::{GuardSource, Source};

/// The tracing target of the console's audit lines.
pub const AUDIT_TARGET: &str = "webhook_guard::console::audit";

/// The body size shown by default, in bytes.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// The content security policy of every answer: no script, styles and images from
/// the console itself, forms posted to it only, never framed.
pub const CONTENT_SECURITY_POLICY_VALUE: &str = "default-src 'none'; style-src 'self'; \
     img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Why a console could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsoleError {
    /// A credential too weak to guard the console.
    #[error("console {what}: at least {min} bytes required")]
    WeakCredential {
        /// Which credential.
        what: &'static str,
        /// The least length it takes.
        min: usize,
    },
    /// A Basic user name that is empty or holds `:` (which ends the name in Basic
    /// credentials).
    #[error("console user name: not empty, and without ':'")]
    BadUserName,
    /// The system's random source failed (keys for the credential comparison and
    /// the CSRF tokens come from it).
    #[error("no system randomness for the console's keys: {0}")]
    Random(String),
    /// A page size outside 1..=500.
    #[error("console page size {0} is outside 1..=500")]
    PageSize(usize),
}

/// A console over one guard, configured before [`Console::router`] builds it.
#[derive(derive_more::Debug)]
#[must_use]
pub struct Console {
    guard: WebhookGuard,
    show_bodies: bool,
    body_limit: usize,
    /// A secret: `Debug` says only whether it is set.
    #[debug("{}", csrf_key.map_or("None", |_| "Some(<redacted>)"))]
    csrf_key: Option<[u8; 32]>,
    page_size: usize,
}

impl Console {
    /// A console over `guard`'s store and inbox: bodies hidden, 50 rows a page.
    pub fn new(guard: WebhookGuard) -> Self {
        Self {
            guard,
            show_bodies: false,
            body_limit: DEFAULT_BODY_LIMIT,
            csrf_key: None,
            page_size: 50,
        }
    }

    /// Whether the record view shows an inbox event's stored body (default: no;
    /// a payload may hold personal data).
    pub fn show_bodies(mut self, on: bool) -> Self {
        self.show_bodies = on;
        self
    }

    /// The most of a body shown, in bytes (default [`DEFAULT_BODY_LIMIT`]); a
    /// longer one is cut and says so.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The key of the CSRF tokens. By default one is drawn at start-up, so tokens
    /// change when the process restarts; replicas behind one load balancer need
    /// the same key (keep it as secret as a signing secret).
    pub fn csrf_key(mut self, key: [u8; 32]) -> Self {
        self.csrf_key = Some(key);
        self
    }

    /// Rows per list page, 1 to 500 (default 50).
    pub fn page_size(mut self, rows: usize) -> Self {
        self.page_size = rows;
        self
    }

    /// The console's routes, behind `auth`.
    ///
    /// # Errors
    /// [`ConsoleError::PageSize`], or [`ConsoleError::Random`] when no CSRF key
    /// could be drawn.
    pub fn router(self, auth: Auth) -> Result<Router, ConsoleError> {
        if !(1..=500).contains(&self.page_size) {
            return Err(ConsoleError::PageSize(self.page_size));
        }
        let csrf_key = match self.csrf_key {
            Some(key) => key,
            None => auth::random_key()?,
        };
        let shared = Arc::new(Shared {
            source: Box::new(GuardSource::new(self.guard)),
            csrf_key,
            show_bodies: self.show_bodies,
            body_limit: self.body_limit,
            page_size: self.page_size,
        });
        let routes = Router::new()
            .route("/", get(handlers::root))
            .route("/overview", get(handlers::overview))
            .route("/records", get(handlers::records))
            .route("/record", get(handlers::record))
            .route("/confirm", get(actions::confirm))
            .route("/forget", post(actions::forget))
            .route("/requeue", post(actions::requeue))
            .route("/escalation", post(actions::escalation))
            .route("/style.css", get(handlers::style))
            .with_state(shared);
        let guarded = match auth.kind {
            auth::AuthKind::Host(wrap) => {
                wrap(routes.layer(axum::middleware::from_fn(auth::default_operator)))
            }
            auth::AuthKind::Check(checker) => routes.layer(axum::middleware::from_fn_with_state(
                Arc::new(checker),
                auth::check,
            )),
        };
        Ok(guarded.layer(axum::middleware::map_response(security_headers)))
    }
}

/// [`Console::new`]`(guard).router(auth)`: the console with its defaults (bodies
/// hidden).
///
/// # Errors
/// As [`Console::router`].
pub fn router(guard: WebhookGuard, auth: Auth) -> Result<Router, ConsoleError> {
    Console::new(guard).router(auth)
}

/// What every handler shares.
pub(crate) struct Shared {
    pub(crate) source: Box<dyn Source>,
    pub(crate) csrf_key: [u8; 32],
    pub(crate) show_bodies: bool,
    pub(crate) body_limit: usize,
    pub(crate) page_size: usize,
}

async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
    );
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::NoVerification;
    use crate::MemoryStore;

    /// The CSRF key, a secret, never reaches `Debug`: only whether one is set.
    #[test]
    fn debug_hides_the_csrf_key() {
        let guard = WebhookGuard::builder()
            .store(MemoryStore::new())
            .verifier(NoVerification)
            .event_id(crate::EventId::header("X-Event-Id"))
            .build()
            .expect("a guard");
        let console = Console::new(guard.clone());
        assert!(format!("{console:?}").contains("csrf_key: None"));
        let console = Console::new(guard).csrf_key([0xAB; 32]);
        let text = format!("{console:?}");
        assert!(text.contains("csrf_key: Some(<redacted>)"), "{text}");
        assert!(!text.contains("171"), "{text}");
        assert!(!text.to_lowercase().contains("ab, ab"), "{text}");
    }
}
