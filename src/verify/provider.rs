//! Provider presets by name, for configuration files and the `verify` tool.

use std::fmt;
use std::str::FromStr;

use super::{
    Adyen, Calendly, Dropbox, GitHub, GitLab, HubSpot, Intercom, Jamm, KeyError, Linear, Mailgun,
    Meta, Paddle, Secret, Shopify, Slack, Square, StandardWebhooks, Stripe, Twilio, Twitch,
    Typeform, Verifier, Zoom,
};

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
    Stripe,
    /// [`StandardWebhooks`] (and Svix), named `standard`.
    Standard,
    /// [`GitHub`], named `github`.
    GitHub,
    /// [`Shopify`], named `shopify`.
    Shopify,
    /// [`Slack`], named `slack`.
    Slack,
    /// [`Jamm`], named `jamm`.
    Jamm,
    /// [`Paddle`], named `paddle`.
    Paddle,
    /// [`Linear`], named `linear`.
    Linear,
    /// [`Square`], named `square`. Its signature covers the notification URL: build
    /// it with [`Provider::verifier_with_url`].
    Square,
    /// `SendGrid` (feature `sendgrid`), named `sendgrid`. Its "secrets" are the
    /// public verification keys.
    SendGrid,
    /// [`Adyen`], named `adyen`.
    Adyen,
    /// [`Mailgun`], named `mailgun`.
    Mailgun,
    /// [`Intercom`], named `intercom`.
    Intercom,
    /// [`GitLab`], named `gitlab`. Its "secrets" are the hooks' secret tokens.
    GitLab,
    /// [`Typeform`], named `typeform`.
    Typeform,
    /// [`Calendly`], named `calendly`.
    Calendly,
    /// [`Dropbox`], named `dropbox`.
    Dropbox,
    /// [`Zoom`], named `zoom`.
    Zoom,
    /// [`Meta`] (WhatsApp, Instagram, Messenger), named `meta`. Built from the app
    /// secrets alone, it refuses the subscription check (`GET`): build [`Meta`]
    /// with its verify token to answer it.
    Meta,
    /// [`Twitch`] EventSub, named `twitch`.
    Twitch,
    /// `Discord` interactions, named `discord`: its "secrets" are the
    /// application's public keys (hex). Needs the crate's `ed25519` feature.
    Discord,
    /// [`Twilio`], named `twilio`: it signs its URL (see
    /// [`Provider::verifier_with_url`]).
    Twilio,
    /// [`HubSpot`] (signature v3), named `hubspot`: it signs its URL (see
    /// [`Provider::verifier_with_url`]).
    HubSpot,
}

/// Other names of senders that use a preset's scheme exactly (same headers, secret
/// format and retry schedule): Svix, and senders that deliver through Svix.
const ALIASES: [(&str, Provider); 3] = [
    ("svix", Provider::Standard),
    ("clerk", Provider::Standard),
    ("resend", Provider::Standard),
];

impl Provider {
    /// Every provider, in a stable order.
    pub const ALL: [Provider; 23] = [
        Self::Stripe,
        Self::Standard,
        Self::GitHub,
        Self::Shopify,
        Self::Slack,
        Self::Jamm,
        Self::Paddle,
        Self::Linear,
        Self::Square,
        Self::SendGrid,
        Self::Adyen,
        Self::Mailgun,
        Self::Intercom,
        Self::GitLab,
        Self::Typeform,
        Self::Calendly,
        Self::Dropbox,
        Self::Zoom,
        Self::Meta,
        Self::Twitch,
        Self::Discord,
        Self::Twilio,
        Self::HubSpot,
    ];

    /// The provider's configuration name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Stripe => "stripe",
            Self::Standard => "standard",
            Self::GitHub => "github",
            Self::Shopify => "shopify",
            Self::Slack => "slack",
            Self::Jamm => "jamm",
            Self::Paddle => "paddle",
            Self::Linear => "linear",
            Self::Square => "square",
            Self::SendGrid => "sendgrid",
            Self::Adyen => "adyen",
            Self::Mailgun => "mailgun",
            Self::Intercom => "intercom",
            Self::GitLab => "gitlab",
            Self::Typeform => "typeform",
            Self::Calendly => "calendly",
            Self::Dropbox => "dropbox",
            Self::Zoom => "zoom",
            Self::Meta => "meta",
            Self::Twitch => "twitch",
            Self::Discord => "discord",
            Self::Twilio => "twilio",
            Self::HubSpot => "hubspot",
        }
    }

    /// Whether the provider signs the URL it calls, so that its preset needs the
    /// endpoint's public URL ([`Provider::verifier_with_url`]).
    pub fn signs_url(self) -> bool {
        matches!(self, Self::Square | Self::Twilio | Self::HubSpot)
    }

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

    fn build<S: Into<Secret>>(
        self,
        url: Option<&str>,
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Box<dyn Verifier>, KeyError> {
        let url = || url.ok_or(KeyError::NeedsUrl);
        Ok(match self {
            Self::Stripe => Box::new(Stripe::new(secrets)?),
            Self::Standard => Box::new(StandardWebhooks::new(secrets)?),
            Self::GitHub => Box::new(GitHub::new(secrets)?),
            Self::Shopify => Box::new(Shopify::new(secrets)?),
            Self::Slack => Box::new(Slack::new(secrets)?),
            Self::Jamm => Box::new(Jamm::new(secrets)?),
            Self::Paddle => Box::new(Paddle::new(secrets)?),
            Self::Linear => Box::new(Linear::new(secrets)?),
            Self::Square => Box::new(Square::new(url()?, secrets)?),
            #[cfg(feature = "sendgrid")]
            Self::SendGrid => Box::new(super::SendGrid::new(secrets)?),
            #[cfg(not(feature = "sendgrid"))]
            Self::SendGrid => return Err(KeyError::NeedsFeature("sendgrid")),
            Self::Adyen => Box::new(Adyen::new(secrets)?),
            Self::Mailgun => Box::new(Mailgun::new(secrets)?),
            Self::Intercom => Box::new(Intercom::new(secrets)?),
            Self::GitLab => Box::new(GitLab::new(secrets)?),
            Self::Typeform => Box::new(Typeform::new(secrets)?),
            Self::Calendly => Box::new(Calendly::new(secrets)?),
            Self::Dropbox => Box::new(Dropbox::new(secrets)?),
            Self::Zoom => Box::new(Zoom::new(secrets)?),
            Self::Meta => Box::new(Meta::new(secrets)?),
            Self::Twitch => Box::new(Twitch::new(secrets)?),
            Self::Discord => discord(secrets)?,
            Self::Twilio => Box::new(Twilio::new(url()?, secrets)?),
            Self::HubSpot => Box::new(HubSpot::new(url()?, secrets)?),
        })
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
    Ok(Box::new(super::Discord::new(keys)?))
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
#[error(
    "unknown provider `{0}`; known: stripe, standard (or svix, clerk, resend), github, shopify, \
     slack, jamm, paddle, linear, square, sendgrid, adyen, mailgun, intercom, gitlab, typeform, \
     calendly, dropbox, zoom, meta, twitch, discord, twilio, hubspot"
)]
pub struct UnknownProvider(pub String);

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
