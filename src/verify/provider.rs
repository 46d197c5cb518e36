//! Provider presets by name, for configuration files and the `verify` tool.

use std::fmt;
use std::str::FromStr;

use super::{
    GitHub, HubSpot, Jamm, KeyError, Linear, Meta, Paddle, Secret, Shopify, Slack,
    StandardWebhooks, Stripe, Twilio, Twitch, Verifier, Zoom,
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

impl Provider {
    /// Every provider, in a stable order.
    pub const ALL: [Provider; 14] = [
        Self::Stripe,
        Self::Standard,
        Self::GitHub,
        Self::Shopify,
        Self::Slack,
        Self::Jamm,
        Self::Paddle,
        Self::Linear,
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
        matches!(self, Self::Twilio | Self::HubSpot)
    }

    /// The provider's preset, with its default tolerance, keyed with `secrets`.
    ///
    /// # Errors
    /// A [`KeyError`] when no secret is given or one is unusable for the scheme;
    /// [`KeyError::NeedsUrl`] for a provider that [signs its URL](Provider::signs_url);
    /// [`KeyError::NeedsFeature`] for `discord` without the `ed25519` feature.
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
            Self::Zoom => Box::new(Zoom::new(secrets)?),
            Self::Meta => Box::new(Meta::new(secrets)?),
            Self::Twitch => Box::new(Twitch::new(secrets)?),
            Self::Discord => discord(secrets)?,
            Self::Twilio => Box::new(Twilio::new(url()?, secrets)?),
            Self::HubSpot => Box::new(HubSpot::new(url()?, secrets)?),
        })
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
    "unknown provider `{0}`; known: stripe, standard, github, shopify, slack, jamm, paddle, linear, zoom, meta, twitch, discord, twilio, hubspot"
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
            let secret = match p {
                Provider::Standard => "whsec_c2VjcmV0",
                // RFC 8032's first public key.
                Provider::Discord => {
                    "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
                }
                _ => "secret",
            };
            let built = if p.signs_url() {
                assert_eq!(p.verifier([secret]).unwrap_err(), KeyError::NeedsUrl);
                p.verifier_with_url("https://example.com/hook", [secret])
            } else {
                p.verifier([secret])
            };
            if p == Provider::Discord && cfg!(not(feature = "ed25519")) {
                assert_eq!(built.unwrap_err(), KeyError::NeedsFeature("ed25519"));
                continue;
            }
            let v = built.unwrap();
            assert!(v.retry_window().is_some(), "{p}");
            assert!(!format!("{v:?}").contains("secret\""), "{v:?}");
        }
        assert_eq!("GitHub".parse::<Provider>().unwrap(), Provider::GitHub);
        assert_eq!("HubSpot".parse::<Provider>().unwrap(), Provider::HubSpot);
        assert!(Provider::Stripe.verifier(Vec::<String>::new()).is_err());
        assert!(Provider::Twilio
            .verifier_with_url("example.com", ["secret"])
            .is_err());
    }
}
