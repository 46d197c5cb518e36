//! Why a TLS connection to a store failed.
//!
//! TLS for the PostgreSQL, MySQL and Redis stores needs the crate's `tls` feature
//! (rustls with the ring provider; the system's trusted roots unless the URL or the
//! builder names a CA). Connecting with a URL that asks for TLS and failing it
//! answers an error whose chain holds a [`TlsError`], found with
//! [`TlsError::find`]: the server's certificate is untrusted or names another
//! host, the server offers no TLS, or refuses a plain-text connection. It is never
//! a panic, and never a fall-back to plain text when the URL requires TLS.
//!
//! | Failure | PostgreSQL | MySQL / MariaDB | Redis |
//! |---|---|---|---|
//! | [`UntrustedCertificate`](TlsFailure::UntrustedCertificate) | `verify-ca`, `verify-full` (or `require` with `sslrootcert`) | `VERIFY_CA`, `VERIFY_IDENTITY` (or `REQUIRED` with `ssl-ca`) | `rediss://` |
//! | [`WrongHost`](TlsFailure::WrongHost) | `verify-full` (and `verify-ca`, see below) | `VERIFY_IDENTITY` (and `VERIFY_CA`) | `rediss://` |
//! | [`NotOffered`](TlsFailure::NotOffered) | `require` and stricter | `REQUIRED` and stricter | — (times out) |
//! | [`Refused`](TlsFailure::Refused) | `disable` (and `allow`, which sqlx reads as `disable`) | — (the server answers "access denied") | — (the server resets the connection) |
//! | [`NotBuilt`](TlsFailure::NotBuilt) | `require` and stricter | `REQUIRED` and stricter | `rediss://` |
//!
//! sqlx 0.8 checks the host name for `verify-ca` and `VERIFY_CA` too (sqlx issue
//! 3793, with the rustls versions since 0.23.24): connect by a name the
//! certificate holds. The failure is on the safe side.
//!
//! The connect functions ([`PostgresStore::connect`](super::PostgresStore::connect),
//! [`MySqlStore::connect`](super::MySqlStore::connect),
//! [`RedisStoreBuilder::connect`](super::redis::RedisStoreBuilder::connect) and
//! [`connect_cluster`](super::redis::RedisStoreBuilder::connect_cluster),
//! [`store::open`](super::open())) put the [`TlsError`] in the chain: a failed
//! handshake is [`StoreError::Unavailable`](super::StoreError::Unavailable) (as
//! any connection that could not be made), a server refusing plain text answers
//! [`StoreError::Backend`](super::StoreError::Backend). Errors of a
//! store already connected (a pool opening a new connection) keep the driver's
//! error as their source, as every other store error does.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use super::BoxError;

/// What went wrong in a TLS connection to a store: see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The server's certificate does not chain to a trusted CA (a wrong CA, a
    /// self-signed certificate, an expired one).
    UntrustedCertificate,
    /// The certificate is trusted but does not name the host the URL connects to.
    WrongHost,
    /// The URL requires TLS and the server does not offer it.
    NotOffered,
    /// The server accepts only TLS connections and the URL turned TLS off.
    Refused,
    /// The URL asks for TLS and this build has none: turn on the `tls` feature.
    NotBuilt,
    /// The TLS handshake failed otherwise (no common protocol version or cipher,
    /// an alert from the server).
    Handshake,
}

impl TlsFailure {
    fn explanation(self) -> &'static str {
        match self {
            Self::UntrustedCertificate => {
                "TLS: the store's certificate is not signed by a trusted CA (name the CA: \
                 sslrootcert= for PostgreSQL, ssl-ca= for MySQL, the Redis builder's \
                 root_certificates or SSL_CERT_FILE)"
            }
            Self::WrongHost => {
                "TLS: the store's certificate does not name the host in the URL (connect \
                 by a name the certificate holds)"
            }
            Self::NotOffered => "TLS: the URL requires TLS and the server does not offer it",
            Self::Refused => {
                "TLS: the server accepts only TLS connections (ask for one in the URL: \
                 sslmode=verify-full for PostgreSQL)"
            }
            Self::NotBuilt => {
                "TLS: the URL asks for TLS and webhook-guard was built without its `tls` feature"
            }
            Self::Handshake => "TLS: the handshake with the store failed",
        }
    }
}

/// A TLS connection to a store failed: [`TlsError::failure`] tells how, the
/// driver's error is the [source](StdError::source).
#[derive(Debug)]
pub struct TlsError {
    failure: TlsFailure,
    source: BoxError,
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.failure.explanation(), self.source)
    }
}

impl StdError for TlsError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

impl TlsError {
    /// How the connection failed.
    pub fn failure(&self) -> TlsFailure {
        self.failure
    }

    /// The [`TlsError`] in `error`'s chain of sources (`error` itself included), if
    /// any: for a [`StoreError`](super::StoreError), an [`OpenError`](super::OpenError) or a
    /// [`RedisStoreError`](super::redis::RedisStoreError).
    ///
    /// ```no_run
    /// use webhook_guard::store::{self, TlsError, TlsFailure};
    ///
    /// # async fn run() {
    /// let url = "postgres://app@db.internal/app?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem";
    /// if let Err(e) = store::open(url).await {
    ///     if TlsError::find(&e).map(TlsError::failure) == Some(TlsFailure::WrongHost) {
    ///         eprintln!("the database's certificate does not name db.internal");
    ///     }
    /// }
    /// # }
    /// ```
    pub fn find<'e>(error: &'e (dyn StdError + 'static)) -> Option<&'e TlsError> {
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(found) = e.downcast_ref::<TlsError>() {
                return Some(found);
            }
            next = e.source();
        }
        None
    }

    /// A `failure` whose driver's error is `source`.
    pub(crate) fn new(failure: TlsFailure, source: BoxError) -> Self {
        Self { failure, source }
    }

    /// `error` as a [`TlsError`] if it is a TLS failure, else `error` unchanged.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn wrap(error: BoxError) -> BoxError {
        match classify(&*error) {
            Some(failure) => Box::new(Self::new(failure, error)),
            None => error,
        }
    }
}

/// `error` with a [`TlsError`] between it and its driver's error when that error
/// is a TLS failure; the variant is kept.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn tls_cause(error: super::StoreError) -> super::StoreError {
    match error {
        super::StoreError::Unavailable { source } => super::StoreError::Unavailable {
            source: TlsError::wrap(source),
        },
        super::StoreError::Backend { source } => super::StoreError::Backend {
            source: TlsError::wrap(source),
        },
        other => other,
    }
}

/// The TLS failure `error` (or an error in its chain) is, if any.
pub(crate) fn classify(error: &(dyn StdError + 'static)) -> Option<TlsFailure> {
    classify_chain(error).or_else(|| classify_text(error))
}

/// A Redis Cluster's first connections report rustls's error as text only:
/// `invalid peer certificate: …`.
fn classify_text(error: &(dyn StdError + 'static)) -> Option<TlsFailure> {
    #[cfg(feature = "redis")]
    if error.is::<::redis::RedisError>() {
        let text = error.to_string().to_ascii_lowercase();
        let (_, why) = text.split_once("invalid peer certificate: ")?;
        return Some(
            if why.contains("not valid for name") || why.contains("notvalidforname") {
                TlsFailure::WrongHost
            } else {
                TlsFailure::UntrustedCertificate
            },
        );
    }
    let _ = error;
    None
}

fn classify_chain(error: &(dyn StdError + 'static)) -> Option<TlsFailure> {
    let mut next = Some(error);
    // A chain is short; the bound only guards against a cycle.
    for _ in 0..32 {
        let e = next?;
        if let Some(failure) = classify_one(e) {
            return Some(failure);
        }
        // An `io::Error` and an `Arc` of an error report the *source* of the error
        // they wrap, skipping that error itself: look inside.
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(failure) = classify_chain(inner) {
                return Some(failure);
            }
        }
        if let Some(inner) = e.downcast_ref::<Arc<dyn StdError + Send + Sync>>() {
            if let Some(failure) = classify_chain(&**inner) {
                return Some(failure);
            }
        }
        next = e.source();
    }
    None
}

fn classify_one(e: &(dyn StdError + 'static)) -> Option<TlsFailure> {
    #[cfg(feature = "tls")]
    if let Some(e) = e.downcast_ref::<rustls::Error>() {
        use rustls::CertificateError as C;
        return Some(match e {
            rustls::Error::InvalidCertificate(
                C::NotValidForName | C::NotValidForNameContext { .. },
            ) => TlsFailure::WrongHost,
            rustls::Error::InvalidCertificate(_) => TlsFailure::UntrustedCertificate,
            _ => TlsFailure::Handshake,
        });
    }
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    if let Some(e) = e.downcast_ref::<sqlx::Error>() {
        match e {
            // The drivers' own words (sqlx 0.8): there is no typed form of these.
            sqlx::Error::Tls(inner) => {
                let text = inner.to_string();
                if text.contains("does not support TLS") {
                    return Some(TlsFailure::NotOffered);
                }
                if text.contains("without TLS support") {
                    return Some(TlsFailure::NotBuilt);
                }
            }
            // PostgreSQL: `no pg_hba.conf entry for host …, no encryption`.
            sqlx::Error::Database(db)
                if db.code().as_deref() == Some("28000")
                    && db.message().ends_with("no encryption") =>
            {
                return Some(TlsFailure::Refused);
            }
            _ => {}
        }
    }
    #[cfg(feature = "redis")]
    if let Some(e) = e.downcast_ref::<::redis::RedisError>() {
        // The driver's words (redis 1.x) when built without TLS.
        let text = e.to_string();
        if text.contains("with TLS") && text.contains("feature") {
            return Some(TlsFailure::NotBuilt);
        }
    }
    None
}

/// Makes ring's rustls provider the process default unless one is installed: the
/// Redis driver builds its TLS configuration from the process default, and rustls
/// cannot pick one by itself when the build holds two (ring and aws-lc-rs).
#[cfg(all(feature = "tls", feature = "redis"))]
pub(crate) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one first: that one is then kept.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The drivers' errors as they make them (their words, and the wrappers that
    /// hide the rustls error from `source`).
    #[test]
    fn driver_errors_are_classified() {
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        {
            let not_built = sqlx::Error::Tls(
                "TLS upgrade required by connect options \
                 but SQLx was built without TLS support enabled"
                    .into(),
            );
            assert_eq!(classify(&not_built), Some(TlsFailure::NotBuilt));
            let not_offered = sqlx::Error::Tls("server does not support TLS".into());
            assert_eq!(classify(&not_offered), Some(TlsFailure::NotOffered));
            assert_eq!(classify(&sqlx::Error::PoolTimedOut), None);
        }
        #[cfg(feature = "redis")]
        {
            use ::redis::{ErrorKind, RedisError};
            let not_built = RedisError::from((
                ErrorKind::InvalidClientConfig,
                "can't connect with TLS, the feature is not enabled",
            ));
            assert_eq!(classify(&not_built), Some(TlsFailure::NotBuilt));
            let refused =
                RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
            assert_eq!(classify(&refused), None);
        }
        #[cfg(feature = "tls")]
        {
            use rustls::CertificateError as C;
            let io = |e: C| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    rustls::Error::InvalidCertificate(e),
                )
            };
            // An `io::Error` wrapping rustls's, as sqlx reports a handshake.
            assert_eq!(
                classify(&io(C::UnknownIssuer)),
                Some(TlsFailure::UntrustedCertificate)
            );
            assert_eq!(
                classify(&io(C::Expired)),
                Some(TlsFailure::UntrustedCertificate)
            );
            assert_eq!(
                classify(&io(C::NotValidForName)),
                Some(TlsFailure::WrongHost)
            );
            // The same inside a RedisError, which holds it in an `Arc`.
            #[cfg(feature = "redis")]
            {
                let redis = ::redis::RedisError::from(io(C::NotValidForName));
                assert_eq!(classify(&redis), Some(TlsFailure::WrongHost));
            }
            let alert = rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure);
            assert_eq!(classify(&alert), Some(TlsFailure::Handshake));
        }
    }

    #[test]
    fn find_walks_the_chain_and_the_text_explains() {
        let tls = TlsError::new(
            TlsFailure::WrongHost,
            "certificate not valid for name \"10.0.0.5\"".into(),
        );
        let text = tls.to_string();
        assert!(text.starts_with("TLS: the store's certificate does not name the host"));
        assert!(
            text.ends_with("certificate not valid for name \"10.0.0.5\""),
            "{text}"
        );
        let wrapped = super::super::StoreError::unavailable(tls);
        assert_eq!(
            TlsError::find(&wrapped).map(TlsError::failure),
            Some(TlsFailure::WrongHost)
        );
        let plain = super::super::StoreError::unavailable("connection refused");
        assert!(TlsError::find(&plain).is_none());
    }
}
