//! Who may use the console ([`Auth`]), who they are ([`Operator`]), and the CSRF
//! token that ties a state-changing form to them.

use std::fmt;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::Route;
use axum::Router;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tower_layer::Layer;
use tower_service::Service;

use super::ConsoleError;

type HmacSha256 = Hmac<Sha256>;

/// The shortest bearer token [`Auth::bearer`] takes, in bytes.
pub const MIN_TOKEN_LEN: usize = 16;
/// The shortest password [`Auth::basic`] takes, in bytes.
pub const MIN_PASSWORD_LEN: usize = 12;

/// How the console authenticates each request. [`router`](super::router) takes
/// one: there is no console without it.
///
/// - [`Auth::bearer`]: `Authorization: Bearer <token>`, for scripts.
/// - [`Auth::basic`]: HTTP Basic credentials, which a browser asks for itself.
/// - [`Auth::host_middleware`]: the host's own tower middleware (its login,
///   sessions, SSO), trusted to refuse whoever may not operate webhooks.
///
/// Credentials are compared in constant time: each is kept as an HMAC under a key
/// drawn at start-up, and a request's credentials are checked with the MAC's
/// constant-time comparison, so neither their content nor their length shows in
/// the time an answer takes. `Debug` shows no credential.
pub struct Auth {
    pub(super) kind: AuthKind,
}

pub(super) enum AuthKind {
    Check(Checker),
    Host(Box<dyn FnOnce(Router) -> Router + Send>),
}

/// The credentials the console checks itself.
pub(super) enum Checker {
    Bearer(Credential),
    Basic {
        user: String,
        credential: Credential,
    },
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            AuthKind::Check(Checker::Bearer(_)) => f.write_str("Auth::Bearer(..)"),
            AuthKind::Check(Checker::Basic { user, .. }) => write!(f, "Auth::Basic({user:?}, ..)"),
            AuthKind::Host(_) => f.write_str("Auth::HostMiddleware(..)"),
        }
    }
}

impl Auth {
    /// Requests must carry `Authorization: Bearer <token>`.
    ///
    /// # Errors
    /// [`ConsoleError::WeakCredential`] for a token shorter than
    /// [`MIN_TOKEN_LEN`] bytes; [`ConsoleError::Random`] when the system has no
    /// randomness to key the comparison.
    pub fn bearer(token: impl AsRef<str>) -> Result<Self, ConsoleError> {
        let token = token.as_ref();
        if token.len() < MIN_TOKEN_LEN {
            return Err(ConsoleError::WeakCredential {
                what: "bearer token",
                min: MIN_TOKEN_LEN,
            });
        }
        Ok(Self {
            kind: AuthKind::Check(Checker::Bearer(Credential::new(token.as_bytes())?)),
        })
    }

    /// Requests must carry HTTP Basic credentials `user:password`; a browser asks
    /// for them. Use it over HTTPS only (Basic credentials travel with every
    /// request), or on loopback.
    ///
    /// # Errors
    /// [`ConsoleError::BadUserName`] for an empty user name or one holding `:`;
    /// [`ConsoleError::WeakCredential`] for a password shorter than
    /// [`MIN_PASSWORD_LEN`] bytes; [`ConsoleError::Random`] as for [`Auth::bearer`].
    pub fn basic(user: impl Into<String>, password: impl AsRef<str>) -> Result<Self, ConsoleError> {
        let user = user.into();
        if user.is_empty() || user.contains(':') {
            return Err(ConsoleError::BadUserName);
        }
        let password = password.as_ref();
        if password.len() < MIN_PASSWORD_LEN {
            return Err(ConsoleError::WeakCredential {
                what: "password",
                min: MIN_PASSWORD_LEN,
            });
        }
        let credential = Credential::new(format!("{user}:{password}").as_bytes())?;
        Ok(Self {
            kind: AuthKind::Check(Checker::Basic { user, credential }),
        })
    }

    /// The host's own middleware authenticates: `layer` wraps every console route
    /// (as [`Router::layer`] would), and must refuse whoever may not operate the
    /// console. It names the operator for the audit log and the CSRF token by
    /// inserting an [`Operator`] into the request's extensions; without one the
    /// operator is `"host-authenticated"`.
    ///
    /// ```
    /// use axum::extract::Request;
    /// use axum::http::StatusCode;
    /// use axum::middleware::{from_fn, Next};
    /// use axum::response::{IntoResponse, Response};
    /// use webhook_guard::console::{Auth, Operator};
    ///
    /// // The host's own check (its session store, its SSO); here a stand-in.
    /// async fn operators_only(mut request: Request, next: Next) -> Response {
    ///     let user = request
    ///         .headers()
    ///         .get("x-authenticated-user")
    ///         .and_then(|v| v.to_str().ok())
    ///         .map(str::to_owned);
    ///     match user {
    ///         Some(user) => {
    ///             request.extensions_mut().insert(Operator::new(user));
    ///             next.run(request).await
    ///         }
    ///         None => StatusCode::FORBIDDEN.into_response(),
    ///     }
    /// }
    ///
    /// let auth = Auth::host_middleware(from_fn(operators_only));
    /// # let _ = auth;
    /// ```
    pub fn host_middleware<L>(layer: L) -> Self
    where
        L: Layer<Route> + Clone + Send + Sync + 'static,
        L::Service: Service<Request> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request>>::Response: IntoResponse + 'static,
        <L::Service as Service<Request>>::Error: Into<std::convert::Infallible> + 'static,
        <L::Service as Service<Request>>::Future: Send + 'static,
    {
        Self {
            kind: AuthKind::Host(Box::new(move |router: Router| router.layer(layer))),
        }
    }
}

/// Who is operating the console: the Basic user name, `"bearer"` for a bearer
/// token, or what the host's middleware inserted into the request's extensions
/// ([`Auth::host_middleware`]). Named in every audit line, and keys the CSRF token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator(String);

impl Operator {
    /// An operator named `name` (for a host middleware to insert).
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Debug-escaped: a name a host took from a request holds no control
        // characters by the time it reaches a log line.
        write!(f, "{:?}", self.0)
    }
}

/// A secret kept as its HMAC under a random key.
pub(super) struct Credential {
    key: [u8; 32],
    tag: [u8; 32],
}

impl Credential {
    fn new(secret: &[u8]) -> Result<Self, ConsoleError> {
        let key = random_key()?;
        let tag = mac(&key, secret).finalize().into_bytes().into();
        Ok(Self { key, tag })
    }

    /// Whether `candidate` is the secret, in constant time.
    fn matches(&self, candidate: &[u8]) -> bool {
        mac(&self.key, candidate).verify_slice(&self.tag).is_ok()
    }
}

fn mac(key: &[u8], data: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(data);
    mac
}

/// 32 bytes from the system's random source.
pub(super) fn random_key() -> Result<[u8; 32], ConsoleError> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| ConsoleError::Random(e.to_string()))?;
    Ok(key)
}

/// The CSRF token of `operator` under `key`: HMAC-SHA256 of a fixed label and the
/// operator's name, base64url. An attacker's page can neither read it (the
/// same-origin policy) nor compute it (the key never leaves the process).
pub(super) fn csrf_token(key: &[u8; 32], operator: &Operator) -> String {
    let tag = csrf_mac(key, operator).finalize().into_bytes();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag)
}

/// Whether `token` is the CSRF token of `operator`, compared in constant time.
pub(super) fn csrf_ok(key: &[u8; 32], operator: &Operator, token: &str) -> bool {
    let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token.trim()) else {
        return false;
    };
    csrf_mac(key, operator).verify_slice(&bytes).is_ok()
}

fn csrf_mac(key: &[u8; 32], operator: &Operator) -> HmacSha256 {
    let mut mac = mac(key, b"webhook-guard console csrf v1\0");
    mac.update(operator.0.as_bytes());
    mac
}

/// The middleware of [`Auth::bearer`] and [`Auth::basic`]: an authenticated request
/// goes on with its [`Operator`]; any other is answered 401 with a challenge.
pub(super) async fn check(
    State(auth): State<std::sync::Arc<Checker>>,
    mut request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let operator = match (&*auth, given) {
        (Checker::Bearer(credential), Some(value)) => strip_scheme(value, "Bearer")
            .filter(|token| credential.matches(token.as_bytes()))
            .map(|_| Operator::new("bearer")),
        (Checker::Basic { user, credential }, Some(value)) => strip_scheme(value, "Basic")
            .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
            .filter(|pair| credential.matches(pair))
            .map(|_| Operator::new(user.clone())),
        _ => None,
    };
    match operator {
        Some(operator) => {
            request.extensions_mut().insert(operator);
            next.run(request).await
        }
        None => {
            tracing::warn!(
                target: super::AUDIT_TARGET,
                action = "authenticate",
                path = %request.uri().path(),
                credentials_given = given.is_some(),
                "console request refused: not authenticated"
            );
            let challenge = match &*auth {
                Checker::Basic { .. } => r#"Basic realm="webhook-guard console", charset="UTF-8""#,
                Checker::Bearer(_) => r#"Bearer realm="webhook-guard console""#,
            };
            let mut response = Response::new(Body::from("authentication required\n"));
            *response.status_mut() = StatusCode::UNAUTHORIZED;
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
            response
        }
    }
}

/// For [`Auth::host_middleware`]: names the operator `"host-authenticated"` when
/// the host's middleware did not.
pub(super) async fn default_operator(mut request: Request, next: Next) -> Response {
    if request.extensions().get::<Operator>().is_none() {
        request
            .extensions_mut()
            .insert(Operator::new("host-authenticated"));
    }
    next.run(request).await
}

/// The credentials after `scheme ` (the scheme matched case-insensitively).
fn strip_scheme<'a>(value: &'a str, scheme: &str) -> Option<&'a str> {
    let (given, rest) = value.split_once(' ')?;
    given
        .eq_ignore_ascii_case(scheme)
        .then(|| rest.trim_start_matches(' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_match_only_themselves() {
        let c = Credential::new(b"correct horse battery").unwrap();
        assert!(c.matches(b"correct horse battery"));
        assert!(!c.matches(b"correct horse batterY"));
        assert!(!c.matches(b"correct horse battery "));
        assert!(!c.matches(b""));
    }

    #[test]
    fn csrf_tokens_are_per_operator_and_key() {
        let key = random_key().unwrap();
        let alice = Operator::new("alice");
        let token = csrf_token(&key, &alice);
        assert!(csrf_ok(&key, &alice, &token));
        assert!(!csrf_ok(&key, &Operator::new("bob"), &token));
        assert!(!csrf_ok(&random_key().unwrap(), &alice, &token));
        assert!(!csrf_ok(&key, &alice, ""));
        assert!(!csrf_ok(&key, &alice, &token[1..]));
    }

    #[test]
    fn weak_credentials_are_refused_and_debug_shows_none() {
        assert!(Auth::bearer("short").is_err());
        assert!(Auth::basic("", "long enough password").is_err());
        assert!(Auth::basic("a:b", "long enough password").is_err());
        assert!(Auth::basic("ops", "short").is_err());
        let auth = Auth::basic("ops", "long enough password").unwrap();
        assert!(!format!("{auth:?}").contains("password"));
        let auth = Auth::bearer("0123456789abcdef-token").unwrap();
        assert!(!format!("{auth:?}").contains("token"));
    }

    #[test]
    fn schemes_are_matched_case_insensitively() {
        assert_eq!(strip_scheme("Bearer abc", "Bearer"), Some("abc"));
        assert_eq!(strip_scheme("bearer abc", "Bearer"), Some("abc"));
        assert_eq!(strip_scheme("Basic abc", "Bearer"), None);
        assert_eq!(strip_scheme("Bearerabc", "Bearer"), None);
    }
}
