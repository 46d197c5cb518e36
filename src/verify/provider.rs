//! Provider presets by name, for configuration files and the `verify` tool.

use std::fmt;
use std::str::FromStr;

use super::{
    Adyen, Calendly, Dropbox, GitHub, GitLab, HubSpot, Intercom, Jamm, KeyError, Linear, Mailgun,
    Meta, Paddle, Secret, Shopify, Slack, Square, StandardWebhooks, Stripe, Twilio, Twitch,
    Typeform, Verifier, Zoom,
};

/// Writes [`Provider`] from one list of the presets: each variant with its doc
/// comment, its configuration name and how its verifier is built, `|secrets| ..`,
/// or `|secrets, url| ..` for a provider that [signs its URL](Provider::signs_url)
/// (given the URL, or refused with [`KeyError::NeedsUrl`]). The list's order is
/// [`Provider::ALL`]'s.
macro_rules! presets {
    (@signs_url $url:ident) => {
        true
    };
    (@signs_url) => {
        false
    };
    (
        $(#[$doc:meta])*
        pub enum Provider {
            $(
                $(#[$variant_doc:meta])*
                $variant:ident = $name:literal
                    => |$secrets:ident $(, $url:ident)?| $build:expr,
            )*
        }
    ) => {
        $(#[$doc])*
        pub enum Provider {
            $($(#[$variant_doc])* $variant,)*
        }

        impl Provider {
            // As long as the list: one name a preset.
            /// Every provider, in a stable order.
            pub const ALL: [Provider; [$($name),*].len()] = [$(Self::$variant),*];

            /// The provider's configuration name.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }

            /// Whether the provider signs the URL it calls, so that its preset needs the
            /// endpoint's public URL ([`Provider::verifier_with_url`]).
            pub fn signs_url(self) -> bool {
                match self {
                    $(Self::$variant => presets!(@signs_url $($url)?),)*
                }
            }

            fn build<S: Into<Secret>>(
                self,
                url: Option<&str>,
                secrets: impl IntoIterator<Item = S>,
            ) -> Result<Box<dyn Verifier>, KeyError> {
                match self {
                    $(Self::$variant => {
                        let $secrets = secrets;
                        $(let $url = url.ok_or(KeyError::NeedsUrl)?;)?
                        $build
                    })*
                }
            }
        }
    };
}

presets! {
    /// A provider with a preset verifier, named as in configuration.
    ///
    /// ```
    /// use webhook_guard::verify::Provider;
    ///
    /// let provider: Provider = "stripe".parse().unwrap();
    /// let verifier = provider.verifier([provider.sample_secret()]).unwrap();
    /// assert_eq!(verifier.retry_window(), Some(std::time::Duration::from_secs(72 * 3600)));
    /// assert!("carrier-pigeon".parse::<Provider>().is_err());
    /// ```
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    #[non_exhaustive]
    pub enum Provider {
        /// [`Stripe`], named `stripe`.
        Stripe = "stripe" => |secrets| boxed(Stripe::new(secrets)),
        /// [`StandardWebhooks`] (and Svix), named `standard`.
        Standard = "standard" => |secrets| boxed(StandardWebhooks::new(secrets)),
        /// [`GitHub`], named `github`.
        GitHub = "github" => |secrets| boxed(GitHub::new(secrets)),
        /// [`Shopify`], named `shopify`.
        Shopify = "shopify" => |secrets| boxed(Shopify::new(secrets)),
        /// [`Slack`], named `slack`.
        Slack = "slack" => |secrets| boxed(Slack::new(secrets)),
        /// [`Jamm`], named `jamm`.
        Jamm = "jamm" => |secrets| boxed(Jamm::new(secrets)),
        /// [`Paddle`], named `paddle`.
        Paddle = "paddle" => |secrets| boxed(Paddle::new(secrets)),
        /// [`Linear`], named `linear`.
        Linear = "linear" => |secrets| boxed(Linear::new(secrets)),
        /// [`Square`], named `square`. Its signature covers the notification URL: build
        /// it with [`Provider::verifier_with_url`].
        Square = "square" => |secrets, url| boxed(Square::new(url, secrets)),
        /// `SendGrid` (feature `sendgrid`), named `sendgrid`. Its "secrets" are the
        /// public verification keys.
        SendGrid = "sendgrid" => |secrets| sendgrid(secrets),
        /// [`Adyen`], named `adyen`.
        Adyen = "adyen" => |secrets| boxed(Adyen::new(secrets)),
        /// [`Mailgun`], named `mailgun`.
        Mailgun = "mailgun" => |secrets| boxed(Mailgun::new(secrets)),
        /// [`Intercom`], named `intercom`.
        Intercom = "intercom" => |secrets| boxed(Intercom::new(secrets)),
        /// [`GitLab`], named `gitlab`. Its "secrets" are the hooks' secret tokens.
        GitLab = "gitlab" => |secrets| boxed(GitLab::new(secrets)),
        /// [`Typeform`], named `typeform`.
        Typeform = "typeform" => |secrets| boxed(Typeform::new(secrets)),
        /// [`Calendly`], named `calendly`.
        Calendly = "calendly" => |secrets| boxed(Calendly::new(secrets)),
        /// [`Dropbox`], named `dropbox`.
        Dropbox = "dropbox" => |secrets| boxed(Dropbox::new(secrets)),
        /// [`Zoom`], named `zoom`.
        Zoom = "zoom" => |secrets| boxed(Zoom::new(secrets)),
        /// [`Meta`] (WhatsApp, Instagram, Messenger), named `meta`. Built from the app
        /// secrets alone, it refuses the subscription check (`GET`): build [`Meta`]
        /// with its verify token to answer it.
        Meta = "meta" => |secrets| boxed(Meta::new(secrets)),
        /// [`Twitch`] EventSub, named `twitch`.
        Twitch = "twitch" => |secrets| boxed(Twitch::new(secrets)),
        /// `Discord` interactions, named `discord`: its "secrets" are the
        /// application's public keys (hex). Needs the crate's `ed25519` feature.
        Discord = "discord" => |secrets| discord(secrets),
        /// [`Twilio`], named `twilio`: it signs its URL (see
        /// [`Provider::verifier_with_url`]).
        Twilio = "twilio" => |secrets, url| boxed(Twilio::new(url, secrets)),
        /// [`HubSpot`] (signature v3), named `hubspot`: it signs its URL (see
        /// [`Provider::verifier_with_url`]).
        HubSpot = "hubspot" => |secrets, url| boxed(HubSpot::new(url, secrets)),
    }
}

/// Other names of senders that use a preset's scheme exactly (same headers, secret
/// format and retry schedule): Svix, and senders that deliver through Svix.
const ALIASES: [(&str, Provider); 3] = [
    ("svix", Provider::Standard),
    ("clerk", Provider::Standard),
    ("resend", Provider::Standard),
];

impl Provider {
    /// The provider's preset, with its default tolerance, keyed with `secrets`.
    ///
    /// # Errors
    /// A [`KeyError`] when no secret is given or one is unusable for the scheme;
    /// [`KeyError::NeedsUrl`] for a provider that [signs its URL](Provider::signs_url);
    /// [`KeyError::NeedsFeature`] for `sendgrid` or `discord` without their features.
    pub fn verifier<S: Into<Secret>>(
        self,
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Box<dyn Verifier>, KeyError> {
        if self.signs_url() {
            return Err(KeyError::NeedsUrl);
        }
        self.build(None, secrets)
    }

    /// [`Provider::verifier`] for a provider that signs the URL it calls (Twilio,
    /// HubSpot): `url` is the endpoint's public URL as configured with the
    /// provider, without query (the query is read from each request). Other
    /// providers ignore it.
    ///
    /// # Errors
    /// As [`Provider::verifier`], and [`KeyError::BadUrl`] for an unusable URL.
    pub fn verifier_with_url<S: Into<Secret>>(
        self,
        url: &str,
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Box<dyn Verifier>, KeyError> {
        self.build(Some(url), secrets)
    }

    /// A made-up secret in the provider's format (its preset's `SECRET_FORMAT`), for
    /// tests and examples: it verifies nothing a real provider sent.
    pub fn sample_secret(self) -> &'static str {
        match self {
            Self::Stripe => "whsec_wRNftLajMZNeslQOP6vEPm4iVx5NlZ6z",
            Self::Standard => "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            Self::Paddle => {
                "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_6h3qd3uFSi9YCD3OLYAShQI90XTI5vEI"
            }
            Self::Adyen => "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
            Self::SendGrid => "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==",
            // RFC 8032's first public key.
            Self::Discord => "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
            _ => "sample-secret-0123456789abcdef-0123456789",
        }
    }
}

/// A preset's verifier, boxed.
fn boxed<V: Verifier + 'static>(built: Result<V, KeyError>) -> Result<Box<dyn Verifier>, KeyError> {
    Ok(Box::new(built?))
}

/// The SendGrid preset, keyed with its public verification keys.
#[cfg(feature = "sendgrid")]
fn sendgrid<S: Into<Secret>>(
    keys: impl IntoIterator<Item = S>,
) -> Result<Box<dyn Verifier>, KeyError> {
    boxed(super::SendGrid::new(keys))
}

#[cfg(not(feature = "sendgrid"))]
fn sendgrid<S: Into<Secret>>(
    _keys: impl IntoIterator<Item = S>,
) -> Result<Box<dyn Verifier>, KeyError> {
    Err(KeyError::NeedsFeature("sendgrid"))
}

/// The Discord preset, keyed with public keys given as text.
#[cfg(feature = "ed25519")]
fn discord<S: Into<Secret>>(
    keys: impl IntoIterator<Item = S>,
) -> Result<Box<dyn Verifier>, KeyError> {
    let keys = keys
        .into_iter()
        .map(|k| {
            String::from_utf8(k.into().expose().to_vec())
                .map_err(|_| KeyError::BadEncoding("hex of a 32-byte ed25519 public key"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    boxed(super::Discord::new(keys))
}

#[cfg(not(feature = "ed25519"))]
fn discord<S: Into<Secret>>(
    _keys: impl IntoIterator<Item = S>,
) -> Result<Box<dyn Verifier>, KeyError> {
    Err(KeyError::NeedsFeature("ed25519"))
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A provider name that no preset answers to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown provider `{0}`; known: {known}", known = known_names())]
pub struct UnknownProvider(pub String);

/// Every name a provider answers to, in [`Provider::ALL`]'s order, its aliases
/// beside it: `stripe, standard (or svix, clerk, resend), github, ...`.
fn known_names() -> String {
    let named = |p: Provider| {
        let aliases: Vec<&str> = (ALIASES.iter())
            .filter(|&&(_, of)| of == p)
            .map(|&(alias, _)| alias)
            .collect();
        if aliases.is_empty() {
            p.name().to_owned()
        } else {
            format!("{} (or {})", p.name(), aliases.join(", "))
        }
    };
    Provider::ALL.map(named).join(", ")
}

impl FromStr for Provider {
    type Err = UnknownProvider;

    fn from_str(s: &str) -> Result<Self, UnknownProvider> {
        Self::ALL
            .into_iter()
            .map(|p| (p.name(), p))
            .chain(ALIASES)
            .find(|(name, _)| name.eq_ignore_ascii_case(s))
            .map(|(_, p)| p)
            .ok_or_else(|| UnknownProvider(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_every_preset_builds() {
        for p in Provider::ALL {
            assert_eq!(p.name().parse::<Provider>().unwrap(), p);
            let secret = p.sample_secret();
            if p.signs_url() {
                assert_eq!(p.verifier([secret]).unwrap_err(), KeyError::NeedsUrl);
            }
            let built = p.verifier_with_url("https://example.com/hook", [secret]);
            if (p == Provider::Discord && cfg!(not(feature = "ed25519")))
                || (p == Provider::SendGrid && cfg!(not(feature = "sendgrid")))
            {
                assert!(matches!(built, Err(KeyError::NeedsFeature(_))), "{p}");
                continue;
            }
            let v = built.unwrap();
            assert!(v.retry_window().is_some(), "{p}");
            // Every preset serves many tenants: it can be keyed anew.
            let rekeyed = v.with_secrets(&[p.sample_secret().into()]);
            assert!(matches!(rekeyed, Some(Ok(_))), "{p} cannot be re-keyed");
            assert!(!format!("{v:?}").contains(&secret[8..]), "{v:?}");
        }
        assert_eq!("GitHub".parse::<Provider>().unwrap(), Provider::GitHub);
        for alias in ["svix", "Clerk", "resend"] {
            assert_eq!(alias.parse::<Provider>().unwrap(), Provider::Standard);
        }
        let unknown = "paypal".parse::<Provider>().unwrap_err().to_string();
        assert!(
            unknown.contains("dropbox") && unknown.contains("clerk"),
            "{unknown}"
        );
        let known = "unknown provider `paypal`; known: stripe, standard (or svix, clerk, resend), ";
        assert!(unknown.starts_with(known), "{unknown}");
        assert!(unknown.ends_with(", twilio, hubspot"), "{unknown}");
        assert_eq!("HubSpot".parse::<Provider>().unwrap(), Provider::HubSpot);
        assert!(Provider::Stripe.verifier(Vec::<String>::new()).is_err());
        assert!(Provider::Twilio
            .verifier_with_url("example.com", ["secret"])
            .is_err());
    }

    /// Each preset reads the event type where its provider puts it.
    #[test]
    fn presets_name_their_event_types() {
        /// A preset, the headers and body of a delivery, the type it names.
        type Case = (
            Provider,
            &'static [(&'static str, &'static str)],
            &'static str,
            &'static str,
        );
        let cases: [Case; 9] = [
            (
                Provider::Square,
                &[],
                r#"{"type":"payment.updated"}"#,
                "payment.updated",
            ),
            (
                Provider::Mailgun,
                &[],
                r#"{"event-data":{"event":"delivered"}}"#,
                "delivered",
            ),
            (
                Provider::Intercom,
                &[],
                r#"{"topic":"conversation.user.created"}"#,
                "conversation.user.created",
            ),
            (Provider::GitLab, &[], r#"{"object_kind":"push"}"#, "push"),
            (
                Provider::Typeform,
                &[],
                r#"{"event_type":"form_response"}"#,
                "form_response",
            ),
            (
                Provider::Calendly,
                &[],
                r#"{"event":"invitee.created"}"#,
                "invitee.created",
            ),
            (
                Provider::Zoom,
                &[],
                r#"{"event":"meeting.started"}"#,
                "meeting.started",
            ),
            (Provider::Meta, &[], r#"{"object":"page"}"#, "page"),
            (
                Provider::Twitch,
                &[("Twitch-Eventsub-Subscription-Type", "channel.follow")],
                "{}",
                "channel.follow",
            ),
        ];
        for (p, headers, body, expected) in cases {
            let v = p
                .verifier_with_url("https://example.com/hook", [p.sample_secret()])
                .unwrap();
            let source = v
                .event_type()
                .unwrap_or_else(|| panic!("{p}: no type source"));
            let found = source.find(&headers, body.as_bytes());
            assert_eq!(
                found.map(|t| t.to_string()).as_deref(),
                Some(expected),
                "{p}"
            );
        }
    }
}
