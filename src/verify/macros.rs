//! The macros that write what every preset repeats: its `SECRET_FORMAT` when the
//! provider publishes none, its constructor and `tolerance` setter, its
//! [`Verifier`](super::Verifier) methods, and builder setters. Private to the
//! `verify` module.

/// The `SECRET_FORMAT` of a preset whose provider publishes no format for its
/// secret (`$what`): at least 16 bytes as for the generic verifiers, a shorter one
/// accepted when marked, no surrounding whitespace. Its doc comment names both.
macro_rules! unpublished_format {
    ($provider:literal, $what:literal) => {
        #[doc = concat!("What the constructor accepts as a secret: ", $what, ",")]
        #[doc = concat!("for which ", $provider, " publishes")]
        /// no format. As for the generic verifiers, it must hold at least 16 bytes (an
        /// HMAC key shorter than that is weak whatever issued it; mark one with
        /// [`Secret::allow_short`](crate::verify::Secret::allow_short) to accept it) and
        /// no surrounding whitespace (a trailing newline from an environment variable is
        /// refused); its characters are not checked.
        pub const SECRET_FORMAT: $crate::verify::SecretFormat =
            $crate::verify::SecretFormat::new($provider)
                .min_len(16)
                .short_allowed();
    };
}
pub(crate) use unpublished_format;

/// The constructor `new` of a preset keyed with secrets used as their raw bytes,
/// each checked against the preset's `SECRET_FORMAT` (fields `keys`, and
/// `tolerance` starting at the preset's `DEFAULT_TOLERANCE`),
/// and the `tolerance` setter of a preset that signs a time. `new(url);` writes the
/// constructor of a preset that signs the public URL it is called at: `new(url,
/// secrets)`, the URL parsed into its field `url`. The doc comments given are the
/// preset's own.
macro_rules! keyed {
    ($(#[$new:meta])* new $(($url:ident))?; $(#[$tolerance:meta])* tolerance;) => {
        $crate::verify::macros::keyed!(
            @new $(#[$new])* $(($url))? tolerance: Self::DEFAULT_TOLERANCE
        );
        $crate::verify::macros::keyed!($(#[$tolerance])* tolerance;);
    };
    ($(#[$new:meta])* new $(($url:ident))?;) => {
        $crate::verify::macros::keyed!(@new $(#[$new])* $(($url))?);
    };
    ($(#[$tolerance:meta])* tolerance;) => {
        $(#[$tolerance])*
        #[must_use]
        pub fn tolerance(mut self, tolerance: std::time::Duration) -> Self {
            self.tolerance = tolerance;
            self
        }
    };
    (@new $(#[$new:meta])* (url) $($field:ident: $value:expr)?) => {
        $(#[$new])*
        ///
        /// # Errors
        /// [`KeyError::BadUrl`](crate::verify::KeyError::BadUrl) for a URL that is not
        /// `http(s)://host/path`;
        /// [`KeyError::EmptySecret`](crate::verify::KeyError::EmptySecret) if no
        /// secret is given or one is empty; the other
        /// [`KeyError`](crate::verify::KeyError)s of [`Self::SECRET_FORMAT`] (a
        /// secret with surrounding whitespace, too short, another kind of key),
        /// each naming the fix.
        pub fn new<S: Into<$crate::verify::Secret>>(
            url: &str,
            secrets: impl IntoIterator<Item = S>,
        ) -> Result<Self, $crate::verify::KeyError> {
            Ok(Self {
                url: $crate::verify::request::PublicUrl::parse(url)?,
                keys: $crate::verify::common::MacKeys::checked(secrets, &Self::SECRET_FORMAT)?,
                $($field: $value,)?
            })
        }
    };
    (@new $(#[$new:meta])* $($field:ident: $value:expr)?) => {
        $(#[$new])*
        ///
        /// # Errors
        /// [`KeyError::EmptySecret`](crate::verify::KeyError::EmptySecret) if no
        /// secret is given or one is empty; the other
        /// [`KeyError`](crate::verify::KeyError)s of [`Self::SECRET_FORMAT`] (a
        /// secret with surrounding whitespace, too short, another kind of key),
        /// each naming the fix.
        pub fn new<S: Into<$crate::verify::Secret>>(
            secrets: impl IntoIterator<Item = S>,
        ) -> Result<Self, $crate::verify::KeyError> {
            Ok(Self {
                keys: $crate::verify::common::MacKeys::checked(secrets, &Self::SECRET_FORMAT)?,
                $($field: $value,)?
            })
        }
    };
}
pub(crate) use keyed;

/// The [`Verifier`](super::Verifier) methods that state a preset's published
/// limits, in this order, each optional: `tolerance` (the preset's `tolerance`
/// field), `retry_window` (its `RETRY_WINDOW`), `answer_timeout: SECONDS` and
/// `deliveries: N` (with its doc comment).
macro_rules! limits {
    (answer_timeout: $secs:literal; $($rest:tt)*) => {
        fn answer_timeout(&self) -> Option<std::time::Duration> {
            Some(std::time::Duration::from_secs($secs))
        }
        $crate::verify::macros::limits!($($rest)*);
    };
    (tolerance; $($rest:tt)*) => {
        fn tolerance(&self) -> Option<std::time::Duration> {
            Some(self.tolerance)
        }
        $crate::verify::macros::limits!($($rest)*);
    };
    (retry_window; $($rest:tt)*) => {
        fn retry_window(&self) -> Option<std::time::Duration> {
            Some(Self::RETRY_WINDOW)
        }
        $crate::verify::macros::limits!($($rest)*);
    };
    ($(#[$doc:meta])* deliveries: $n:literal;) => {
        $(#[$doc])*
        fn deliveries(&self) -> Option<u32> {
            Some($n)
        }
    };
    () => {};
}
pub(crate) use limits;

/// A preset's [`Verifier`](super::Verifier) methods from a description of them,
/// each entry optional, the limits of [`limits!`] last:
/// - `rekeyed;` (or `rekeyed(by new);`, `rekeyed(format: F);`): `with_secrets`, as
///   [`rekeyed!`] writes it;
/// - `verify |self, headers, body, now| { .. }`: `verify`, the names its parameters
///   take and its body;
/// - `content_key: sha256;`: `content_key`, the SHA-256 of the body (for a scheme
///   that signs the raw body and no id);
/// - `event_type: json ["field", ..];`, `event_type: header "Name";`, `event_type: NAME;` (a
///   [`TypeSource`](crate::meta::TypeSource) constructor) or `event_type: EXPR;`;
/// - `event_meta: json [type path], [time path], [object path];` (a
///   [`MetaExtractor::json`](crate::meta::MetaExtractor::json)) or `event_meta: EXPR;`;
/// - `body_changes_on_retry;`: `body_changes_on_retry`, true.
///
/// The doc comment before an entry is its method's.
macro_rules! verifier {
    (rekeyed $(($($how:tt)*))?; $($rest:tt)*) => {
        $crate::verify::macros::rekeyed!($($($how)*)?);
        $crate::verify::macros::verifier!($($rest)*);
    };
    ($(#[$doc:meta])*
     verify |$self_:ident, $headers:ident, $body:ident, $now:ident| $block:block $($rest:tt)*) => {
        $(#[$doc])*
        fn verify(
            &$self_,
            $headers: &dyn $crate::Headers,
            $body: &[u8],
            $now: chrono::DateTime<chrono::Utc>,
        ) -> Result<$crate::verify::Verified, $crate::verify::VerifyError> $block
        $crate::verify::macros::verifier!($($rest)*);
    };
    ($(#[$doc:meta])* content_key: sha256; $($rest:tt)*) => {
        $(#[$doc])*
        fn content_key(&self, _headers: &dyn $crate::Headers, body: &[u8]) -> Option<[u8; 32]> {
            Some($crate::verify::common::sha256(body))
        }
        $crate::verify::macros::verifier!($($rest)*);
    };
    ($(#[$doc:meta])* event_type: json [$($field:literal),+]; $($rest:tt)*) => {
        $crate::verify::macros::verifier! {
            $(#[$doc])* event_type: $crate::meta::TypeSource::json([$($field),+]); $($rest)*
        }
    };
    ($(#[$doc:meta])* event_type: header $name:literal; $($rest:tt)*) => {
        $crate::verify::macros::verifier! {
            $(#[$doc])* event_type: $crate::meta::TypeSource::header($name); $($rest)*
        }
    };
    ($(#[$doc:meta])* event_type: $source:ident; $($rest:tt)*) => {
        $crate::verify::macros::verifier! {
            $(#[$doc])* event_type: $crate::meta::TypeSource::$source(); $($rest)*
        }
    };
    ($(#[$doc:meta])* event_type: $source:expr; $($rest:tt)*) => {
        $(#[$doc])*
        fn event_type(&self) -> Option<$crate::meta::TypeSource> {
            Some($source)
        }
        $crate::verify::macros::verifier!($($rest)*);
    };
    ($(#[$doc:meta])*
     event_meta: json [$($ty:literal),*], [$($at:literal),*], [$($object:literal),*];
     $($rest:tt)*) => {
        $crate::verify::macros::verifier! {
            $(#[$doc])*
            event_meta: $crate::meta::MetaExtractor::json(
                &[$($ty),*],
                &[$($at),*],
                &[$($object),*],
            );
            $($rest)*
        }
    };
    ($(#[$doc:meta])* event_meta: $meta:expr; $($rest:tt)*) => {
        $(#[$doc])*
        fn event_meta(&self) -> Option<$crate::meta::MetaExtractor> {
            Some($meta)
        }
        $crate::verify::macros::verifier!($($rest)*);
    };
    ($(#[$doc:meta])* body_changes_on_retry; $($rest:tt)*) => {
        $(#[$doc])*
        fn body_changes_on_retry(&self) -> bool {
            true
        }
        $crate::verify::macros::verifier!($($rest)*);
    };
    ($($limits:tt)*) => {
        $crate::verify::macros::limits!($($limits)*);
    };
}
pub(crate) use verifier;

/// Builder methods that each set one field: `name(arg: Type) => field = value;`
/// writes `pub fn name(mut self, arg: Type) -> Self` (`#[must_use]`), which sets
/// `field` to `value`. The doc comments given are the methods' own.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($arg:ident: $ty:ty) => $field:ident = $value:expr;)*) => {
        $(
            $(#[$doc])*
            #[must_use]
            pub fn $name(mut self, $arg: $ty) -> Self {
                self.$field = $value;
                self
            }
        )*
    };
}
pub(crate) use setters;

/// [`Verifier::with_secrets`](super::Verifier::with_secrets) for a verifier whose
/// `keys` field holds secrets used as their raw bytes, its other settings cloned:
/// each secret checked against the preset's `SECRET_FORMAT` (or the `format:`
/// given) as its constructor checks them, so that a tenant's malformed secret is
/// refused with the same [`KeyError`](super::KeyError); `rekeyed!(by new)` for one
/// whose `new(secrets)` is its only setting.
macro_rules! rekeyed {
    () => {
        $crate::verify::macros::rekeyed!(format: Self::SECRET_FORMAT);
    };
    // A verifier whose only setting is its keys: made anew by its `new`.
    (by new) => {
        fn with_secrets(
            &self,
            secrets: &[$crate::verify::Secret],
        ) -> Option<Result<Box<dyn $crate::verify::Verifier>, $crate::verify::KeyError>> {
            Some(
                Self::new(secrets.iter().cloned())
                    .map(|verifier| Box::new(verifier) as Box<dyn $crate::verify::Verifier>),
            )
        }
    };
    (format: $format:expr) => {
        fn with_secrets(
            &self,
            secrets: &[$crate::verify::Secret],
        ) -> Option<Result<Box<dyn $crate::verify::Verifier>, $crate::verify::KeyError>> {
            let keys =
                $crate::verify::common::MacKeys::checked(secrets.iter().cloned(), &$format);
            Some(keys.map(|keys| {
                let mut verifier = self.clone();
                verifier.keys = keys;
                Box::new(verifier) as Box<dyn $crate::verify::Verifier>
            }))
        }
    };
}
pub(crate) use rekeyed;
