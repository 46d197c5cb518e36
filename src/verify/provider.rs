//! Provider presets by name, for configuration files and the `verify` tool.

use std::fmt;
use std::str::FromStr;

use super::{
    Adyen, Calendly, Dropbox, GitHub, GitLab, Intercom, Jamm, KeyError, Linear, Mailgun, Paddle,
    Secret, Shopify, Slack, Square, StandardWebhooks, Stripe, Typeform, Verifier,
};

/// A provider with a preset verifier, named as in configuration.
///
/// ```
/// use webhook_guard::verify::Provider;
///
/// let provider: Provider = "stripe".parse().unwrap();
/// let verifier = provider.verifier(["whsec_test"]).unwrap();
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
    pub const ALL: [Provider; 17] = [
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
        }
    }

    /// Whether the provider's signature covers the URL it posts to, which
    /// [`Provider::verifier_with_url`] then needs.
    pub fn signs_url(self) -> bool {
        matches!(self, Self::Square)
    }

    /// The provider's preset, with its default tolerance, keyed with `secrets`.
    ///
    /// # Errors
    /// A [`KeyError`] when no secret is given or one is unusable for the scheme;
    /// [`KeyError::MissingUrl`] for a provider that [signs the URL](Provider::signs_url);
    /// [`KeyError::FeatureDisabled`] for `sendgrid` without its feature.
    pub fn verifier<S: Into<Secret>>(
        self,
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Box<dyn Verifier>, KeyError> {
        self.build(secrets, None)
    }

    /// [`Provider::verifier`], with the URL the provider posts to (exactly as
    /// configured at the provider), for those whose signature covers it; the others
    /// ignore it.
    ///
    /// # Errors
    /// As [`Provider::verifier`]; [`KeyError::MissingUrl`] if the URL is empty.
    pub fn verifier_with_url<S: Into<Secret>>(
        self,
        secrets: impl IntoIterator<Item = S>,
        url: &str,
    ) -> Result<Box<dyn Verifier>, KeyError> {
        self.build(secrets, Some(url))
    }

    fn build<S: Into<Secret>>(
        self,
        secrets: impl IntoIterator<Item = S>,
        url: Option<&str>,
    ) -> Result<Box<dyn Verifier>, KeyError> {
        Ok(match self {
            Self::Stripe => Box::new(Stripe::new(secrets)?),
            Self::Standard => Box::new(StandardWebhooks::new(secrets)?),
            Self::GitHub => Box::new(GitHub::new(secrets)?),
            Self::Shopify => Box::new(Shopify::new(secrets)?),
            Self::Slack => Box::new(Slack::new(secrets)?),
            Self::Jamm => Box::new(Jamm::new(secrets)?),
            Self::Paddle => Box::new(Paddle::new(secrets)?),
            Self::Linear => Box::new(Linear::new(secrets)?),
            Self::Square => Box::new(Square::new(url.ok_or(KeyError::MissingUrl)?, secrets)?),
            #[cfg(feature = "sendgrid")]
            Self::SendGrid => Box::new(super::SendGrid::new(secrets)?),
            #[cfg(not(feature = "sendgrid"))]
            Self::SendGrid => return Err(KeyError::FeatureDisabled("sendgrid")),
            Self::Adyen => Box::new(Adyen::new(secrets)?),
            Self::Mailgun => Box::new(Mailgun::new(secrets)?),
            Self::Intercom => Box::new(Intercom::new(secrets)?),
            Self::GitLab => Box::new(GitLab::new(secrets)?),
            Self::Typeform => Box::new(Typeform::new(secrets)?),
            Self::Calendly => Box::new(Calendly::new(secrets)?),
            Self::Dropbox => Box::new(Dropbox::new(secrets)?),
        })
    }
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
     calendly, dropbox"
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

    /// A secret in the format each preset takes.
    fn secret_for(p: Provider) -> &'static str {
        match p {
            Provider::Standard => "whsec_c2VjcmV0",
            Provider::Adyen => "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
            Provider::SendGrid => "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==",
            _ => "secret",
        }
    }

    #[test]
    fn names_round_trip_and_every_preset_builds() {
        for p in Provider::ALL {
            assert_eq!(p.name().parse::<Provider>().unwrap(), p);
            let secret = secret_for(p);
            #[cfg(not(feature = "sendgrid"))]
            if p == Provider::SendGrid {
                assert_eq!(
                    p.verifier([secret]).unwrap_err(),
                    KeyError::FeatureDisabled("sendgrid")
                );
                continue;
            }
            if p.signs_url() {
                assert_eq!(p.verifier([secret]).unwrap_err(), KeyError::MissingUrl);
            }
            let v = p
                .verifier_with_url([secret], "https://example.com/hook")
                .unwrap();
            assert!(v.retry_window().is_some(), "{p}");
            // Every preset serves many tenants: it can be keyed anew.
            let rekeyed = v.with_secrets(&[secret_for(p).into()]);
            assert!(matches!(rekeyed, Some(Ok(_))), "{p} cannot be re-keyed");
            assert!(!format!("{v:?}").contains("secret\""), "{v:?}");
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
        assert!(Provider::Stripe.verifier(Vec::<String>::new()).is_err());
    }
}
