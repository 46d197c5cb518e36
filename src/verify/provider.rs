//! Provider presets by name, for configuration files and the `verify` tool.

use std::fmt;
use std::str::FromStr;

use super::{
    GitHub, Jamm, KeyError, Linear, Paddle, Secret, Shopify, Slack, StandardWebhooks, Stripe,
    Verifier,
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
}

impl Provider {
    /// Every provider, in a stable order.
    pub const ALL: [Provider; 8] = [
        Self::Stripe,
        Self::Standard,
        Self::GitHub,
        Self::Shopify,
        Self::Slack,
        Self::Jamm,
        Self::Paddle,
        Self::Linear,
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
        }
    }

    /// The provider's preset, with its default tolerance, keyed with `secrets`.
    ///
    /// # Errors
    /// A [`KeyError`] when no secret is given or one is unusable for the scheme.
    pub fn verifier<S: Into<Secret>>(
        self,
        secrets: impl IntoIterator<Item = S>,
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
            #[allow(unreachable_patterns)]
            _ => "sample-secret-0123456789abcdef-0123456789",
        }
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
    "unknown provider `{0}`; known: stripe, standard, github, shopify, slack, jamm, paddle, linear"
)]
pub struct UnknownProvider(pub String);

impl FromStr for Provider {
    type Err = UnknownProvider;

    fn from_str(s: &str) -> Result<Self, UnknownProvider> {
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
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
            let v = p.verifier([secret]).unwrap();
            assert!(v.retry_window().is_some(), "{p}");
            assert!(!format!("{v:?}").contains(&secret[8..]), "{v:?}");
        }
        assert_eq!("GitHub".parse::<Provider>().unwrap(), Provider::GitHub);
        assert!(Provider::Stripe.verifier(Vec::<String>::new()).is_err());
    }
}
