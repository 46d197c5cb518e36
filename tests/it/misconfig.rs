//! Misconfigurations a new user makes, each refused when the verifier or the guard
//! is built, with an error whose message names the fix; and ids that print as
//! other ids, refused.

use std::time::Duration;

use webhook_guard::outcome::Rejection;
use webhook_guard::verify::{
    GenericHmac, GitHub, HmacSha256Header, Jamm, KeyError, Linear, NoVerification, Paddle,
    Provider, Secret, Shopify, Slack, StandardWebhooks, Stripe,
};
use webhook_guard::{ConfigError, EventId, MemoryStore, Outcome, WebhookGuard};

/// The error of building a Stripe verifier from `secret`, and its message.
fn stripe_error(secret: &str) -> (KeyError, String) {
    let e = Stripe::new([secret]).unwrap_err();
    let text = e.to_string();
    (e, text)
}

#[test]
fn stripe_secrets_that_cannot_be_stripes_are_refused_naming_the_fix() {
    let (e, _) = stripe_error("   ");
    assert_eq!(e, KeyError::EmptySecret);
    let (e, text) = stripe_error("whsec_");
    assert!(
        matches!(
            e,
            KeyError::TooShort {
                len: 0,
                min: 32,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        text.starts_with("the Stripe secret is 0 bytes after `whsec_`, fewer than the 32"),
        "{text}"
    );
    let (e, text) = stripe_error("whsec_x \n");
    assert_eq!(e, KeyError::Whitespace { provider: "Stripe" });
    assert!(
        text.contains("trailing newline") && text.contains("trim it"),
        "{text}"
    );
    let (e, text) = stripe_error("sk_live_51H8s2kLkdIwHu7ixWZ3lR0lXQ2cTn2yJ4k");
    assert!(
        matches!(
            e,
            KeyError::WrongKey {
                what: "a secret API key",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(text.contains("signing secret (`whsec_...`)"), "{text}");
    assert!(!text.contains("51H8s2k"), "the key is never shown: {text}");
    for (key, what) in [
        ("rk_live_0123456789", "a restricted API key"),
        ("pk_live_0123456789", "a publishable key"),
        ("we_1Mr5jULkdIwHu7ix1ibLTM0x", "a webhook endpoint id"),
    ] {
        let (e, _) = stripe_error(key);
        assert!(
            matches!(e, KeyError::WrongKey { what: w, .. } if w == what),
            "{key}: {e:?}"
        );
    }
    // Stripe's own: `whsec_` and 32 letters or digits (Dashboard, API), or 64 hex
    // digits (`stripe listen`). One short, or with a stray character, is refused.
    assert!(Stripe::new(["whsec_wRNftLajMZNeslQOP6vEPm4iVx5NlZ6z"]).is_ok());
    let cli = format!("whsec_{}", "0123456789abcdef".repeat(4));
    assert!(Stripe::new([cli]).is_ok());
    let (e, _) = stripe_error("whsec_wRNftLajMZNeslQOP6vEPm4iVx5NlZ6");
    assert!(
        matches!(
            e,
            KeyError::TooShort {
                len: 31,
                min: 32,
                ..
            }
        ),
        "{e:?}"
    );
    let (e, text) = stripe_error("whsec_wRNftLajMZNeslQOP6vEPm4iVx5Nl=6z");
    assert_eq!(
        e,
        KeyError::BadCharacters {
            provider: "Stripe",
            expected: "letters and digits"
        },
        "{text}"
    );
    let (e, text) = stripe_error("wRNftLajMZNeslQOP6vEPm4iVx5NlZ6z");
    assert!(
        matches!(
            e,
            KeyError::MissingPrefix {
                prefix: "whsec_",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(text.contains("begins with `whsec_`"), "{text}");
    // One bad secret among several is refused too.
    assert!(Stripe::new(["whsec_wRNftLajMZNeslQOP6vEPm4iVx5NlZ6z", "whsec_"]).is_err());
}

#[test]
fn each_preset_refuses_secrets_shorter_than_its_provider_issues() {
    let short = |r: Result<(), KeyError>| matches!(r, Err(KeyError::TooShort { .. }));
    assert!(short(GitHub::new(["fifteen-bytes!!"]).map(drop)));
    assert!(GitHub::new(["sixteen-bytes!!!"]).is_ok());
    assert!(short(
        Shopify::new(["0123456789abcdef0123456789abcde"]).map(drop)
    ));
    assert!(short(
        Slack::new(["8f742231b10e8888abcd99yyyzzz85a"]).map(drop)
    ));
    assert!(short(Linear::new(["lin_wh_short"]).map(drop)));
    assert!(short(Jamm::new(["jamm_secret"]).map(drop)));
    assert!(short(Paddle::new(["pdl_ntfset_01gk"]).map(drop)));
    assert!(matches!(
        Paddle::new(["VALID_SECRET_0123456789abcdef0123456789"]),
        Err(KeyError::MissingPrefix {
            prefix: "pdl_ntfset_",
            ..
        })
    ));
    assert!(matches!(
        Linear::new(["lin_api_0123456789abcdef0123456789abcdef"]),
        Err(KeyError::WrongKey {
            what: "a Linear API key",
            ..
        })
    ));
    // Standard Webhooks: the decoded key, at least 16 bytes ("secret": 6).
    assert!(short(StandardWebhooks::new(["whsec_c2VjcmV0"]).map(drop)));
    assert!(matches!(
        StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"]),
        Err(KeyError::Whitespace { .. })
    ));
    // Every preset accepts the sample in its own format.
    for p in Provider::ALL {
        let built = p.verifier_with_url("https://example.com/hook", [p.sample_secret()]);
        assert!(built.is_ok(), "{p}");
    }
}

#[test]
fn generic_verifiers_want_16_bytes_unless_allowed() {
    let e = HmacSha256Header::new("X-Signature", ["s3cret"]).unwrap_err();
    assert!(
        matches!(
            e,
            KeyError::TooShort {
                len: 6,
                min: 16,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "the HMAC secret is 6 bytes, fewer than the 16 it must hold: copy the whole \
         secret (where no format is published, as for the generic verifiers, use a random \
         secret of 16 bytes or more, or mark a sender's shorter one with \
         `Secret::allow_short`)"
    );
    assert!(matches!(
        GenericHmac::new("X-Signature", ["s3cret"]),
        Err(KeyError::TooShort { .. })
    ));
    let allowed = Secret::from("s3cret").allow_short();
    assert!(HmacSha256Header::new("X-Signature", [allowed.clone()]).is_ok());
    assert!(GenericHmac::new("X-Signature", [allowed]).is_ok());
    // A preset ignores the mark: its provider's format holds.
    assert!(GitHub::new([Secret::from("s3cret").allow_short()]).is_err());
    assert!(matches!(
        HmacSha256Header::new("X-Signature", [" a-random-secret-of-32-characters"]),
        Err(KeyError::Whitespace { .. })
    ));
}

#[test]
fn a_bad_header_name_is_refused() {
    let secret = ["a-random-secret-of-32-characters"];
    let e = HmacSha256Header::new("bad header", secret).unwrap_err();
    assert_eq!(e, KeyError::BadHeaderName("bad header".into()));
    assert!(
        e.to_string().contains("not a valid HTTP header name"),
        "{e}"
    );
    for bad in ["", "X-Sig:", "X-Sig\n", "X-Sïg"] {
        assert!(HmacSha256Header::new(bad, secret).is_err(), "{bad:?}");
        assert!(GenericHmac::new(bad, secret).is_err(), "{bad:?}");
    }
    // Control characters are shown escaped.
    let e = GenericHmac::new("X-Sig\n", secret).unwrap_err();
    assert!(e.to_string().contains("X-Sig\\n"), "{e}");
}

#[test]
fn a_guard_whose_verifier_finds_no_id_is_refused() {
    let verifier =
        HmacSha256Header::new("X-Signature", ["a-random-secret-of-32-characters"]).unwrap();
    let e = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(verifier.clone())
        .build()
        .unwrap_err();
    assert_eq!(e, ConfigError::NoEventIdSource);
    assert!(e.to_string().contains("event_id_header"), "{e}");
    assert!(e.to_string().contains("EventId::header"), "{e}");
    let no_verification = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(NoVerification)
        .build();
    assert_eq!(no_verification.unwrap_err(), ConfigError::NoEventIdSource);
    // Either fix builds.
    assert!(WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(verifier.clone().event_id_header("X-Event-Id"))
        .build()
        .is_ok());
    assert!(WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(verifier)
        .event_id(EventId::json_field(["id"]))
        .build()
        .is_ok());
    let generic = GenericHmac::new("X-Sig", ["a-random-secret-of-32-characters"]).unwrap();
    let e = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(generic.clone())
        .build()
        .unwrap_err();
    assert_eq!(e, ConfigError::NoEventIdSource);
    let signed_id = generic.template("{id:X-Id}.{body}".parse().unwrap());
    assert!(WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(signed_id)
        .build()
        .is_ok());
}

#[test]
fn a_retention_shorter_than_the_retry_window_is_refused_unless_allowed() {
    let stripe = Stripe::new([Provider::Stripe.sample_secret()]).unwrap();
    let hour = Duration::from_secs(3600);
    let e = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(stripe.clone())
        .retention(hour)
        .build()
        .unwrap_err();
    assert_eq!(
        e,
        ConfigError::RetentionBelowRetryWindow {
            retention: hour,
            retry_window: Stripe::RETRY_WINDOW,
        }
    );
    assert!(
        e.to_string().contains("allow_retention_below_retry_window"),
        "{e}"
    );
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(stripe)
        .retention(hour)
        .allow_retention_below_retry_window()
        .build()
        .unwrap();
    assert_eq!(guard.retention(), hour);
}

/// Ids holding format characters (bidi overrides, zero-width), line or paragraph
/// separators are refused as control characters are; an id read from a header is
/// trimmed of ASCII whitespace only, so `msg_1` and `msg_1\u{a0}` are two ids.
#[tokio::test]
async fn ids_that_print_as_others_are_refused_and_unicode_spaces_are_kept() {
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(NoVerification)
        .event_id(EventId::header("X-Id"))
        .build()
        .unwrap();
    for id in [
        "evt\u{202e}1",
        "evt\u{200b}1",
        "evt\u{2028}1",
        "evt\u{2029}1",
        "\u{feff}evt",
    ] {
        let outcome = guard
            .handle(&[("X-Id", id)], b"{}", |_| async { Ok(()) })
            .await;
        assert!(
            matches!(outcome, Outcome::Rejected(Rejection::InvalidId(_))),
            "{id:?}: {outcome:?}"
        );
    }
    // Signed ids (Standard Webhooks signs `webhook-id`): `msg_1\u{a0}` is its own.
    let secret = Provider::Standard.sample_secret();
    let std = StandardWebhooks::new([secret]).unwrap();
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(std.clone())
        .build()
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    let mut runs = 0;
    for id in ["msg_1", "msg_1\u{a0}"] {
        let sig = std.sign(id, now, b"{}");
        let headers = [
            ("webhook-id", id.to_owned()),
            ("webhook-timestamp", now.to_string()),
            ("webhook-signature", sig),
        ];
        let outcome = guard.handle(&headers, b"{}", |_| async { Ok(()) }).await;
        if let Outcome::Processed { id: got } = &outcome {
            assert_eq!(got, id);
            runs += 1;
        }
    }
    assert_eq!(runs, 2, "two ids, two events");
}

/// The SQLite store creates its database file readable and writable by its owner
/// only (and SQLite gives its `-wal` file the same mode).
#[cfg(all(feature = "sqlite", unix))]
#[tokio::test]
async fn a_new_sqlite_file_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!(
        "wg-private-{:x}",
        webhook_guard::store::FencingToken::random().0
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("records.db");
    let store = webhook_guard::store::SqliteStore::open(&path)
        .await
        .unwrap();
    let guard = WebhookGuard::builder()
        .store(store)
        .verifier(NoVerification)
        .event_id(EventId::header("X-Id"))
        .build()
        .unwrap();
    let outcome = guard
        .handle(&[("X-Id", "evt_1")], b"{}", |_| async { Ok(()) })
        .await;
    assert!(matches!(outcome, Outcome::Processed { .. }), "{outcome:?}");
    for file in ["records.db", "records.db-wal"] {
        let mode = std::fs::metadata(dir.join(file))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{file}: {mode:o}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each newer preset's `SECRET_FORMAT`, through `Provider`: a secret it refuses
/// (with the error and the words of its message) and one it accepts.
#[test]
fn each_newer_preset_checks_its_documented_secret_format() {
    /// A provider, a secret refused, the error, words its message holds.
    type Refused<'a> = (Provider, &'a str, KeyError, &'static str);
    let whitespace = |provider| KeyError::Whitespace { provider };
    let short = |provider, len, min| KeyError::TooShort {
        provider,
        len,
        min,
        prefix: "",
    };
    let hex = |provider| KeyError::BadCharacters {
        provider,
        expected: "hexadecimal digits",
    };
    let long_twitch = "t".repeat(101);
    let refused: Vec<Refused<'_>> = vec![
        (
            Provider::Square,
            "Ibxx_5AKakO-3qeNVR61Dw\n",
            whitespace("Square"),
            "trim it",
        ),
        (
            Provider::Mailgun,
            " key-0123456789",
            whitespace("Mailgun"),
            "trim it",
        ),
        (
            Provider::Intercom,
            "ic-9f2c1b\n",
            whitespace("Intercom"),
            "trim it",
        ),
        (
            Provider::Zoom,
            "zoom-secret\r\n",
            whitespace("Zoom"),
            "trim it",
        ),
        (
            Provider::Meta,
            "app-secret\n",
            whitespace("Meta"),
            "trim it",
        ),
        (
            Provider::Dropbox,
            "dbx_app_secret\n",
            whitespace("Dropbox"),
            "trim it",
        ),
        (
            Provider::Twilio,
            "auth-token\n",
            whitespace("Twilio"),
            "trim it",
        ),
        (
            Provider::HubSpot,
            "client-secret\n",
            whitespace("HubSpot"),
            "trim it",
        ),
        (
            Provider::GitLab,
            "short-token",
            short("GitLab", 11, 16),
            "fewer than the 16",
        ),
        (
            Provider::Typeform,
            "tf_secret",
            short("Typeform", 9, 16),
            "fewer than the 16",
        ),
        (
            Provider::Calendly,
            "cal_signing_key",
            short("Calendly", 15, 16),
            "fewer than the 16",
        ),
        (
            Provider::Twitch,
            "nine-char",
            short("Twitch", 9, 10),
            "fewer than the 10",
        ),
        (
            Provider::Twitch,
            long_twitch.as_str(),
            KeyError::TooLong {
                provider: "Twitch",
                len: 101,
                max: 100,
            },
            "more than the 100",
        ),
        (
            Provider::Twitch,
            "sécret-of-ten",
            KeyError::BadCharacters {
                provider: "Twitch",
                expected: "visible ASCII characters",
            },
            "only visible ASCII",
        ),
        (
            Provider::Dropbox,
            "dbx-14-chars-x",
            short("Dropbox", 14, 15),
            "fewer than the 15",
        ),
        (
            Provider::Square,
            "sq-sig-key-15ch",
            short("Square", 15, 16),
            "fewer than the 16",
        ),
        (
            Provider::Mailgun,
            "key-0123",
            short("Mailgun", 8, 16),
            "fewer than the 16",
        ),
        (
            Provider::Intercom,
            "ic-9f2c1b",
            short("Intercom", 9, 16),
            "fewer than the 16",
        ),
        (
            Provider::Zoom,
            "zoom-secret",
            short("Zoom", 11, 16),
            "fewer than the 16",
        ),
        (
            Provider::Meta,
            "app-secret",
            short("Meta", 10, 16),
            "fewer than the 16",
        ),
        (
            Provider::Twilio,
            "auth-token",
            short("Twilio", 10, 16),
            "fewer than the 16",
        ),
        (
            Provider::HubSpot,
            "client-secret",
            short("HubSpot", 13, 16),
            "fewer than the 16",
        ),
        (
            Provider::Adyen,
            "44782DEF547AAA06C910C43932B1EB0Z",
            hex("Adyen"),
            "only hexadecimal digits",
        ),
    ];
    let mut refused = refused;
    if cfg!(feature = "ed25519") {
        let sample = Provider::Discord.sample_secret();
        refused.push((
            Provider::Discord,
            &sample[..62],
            short("Discord", 62, 64),
            "fewer than the 64",
        ));
        refused.push((
            Provider::Discord,
            "not-a-key",
            hex("Discord"),
            "only hexadecimal digits",
        ));
    }
    for (provider, secret, error, words) in refused {
        let e = provider
            .verifier_with_url("https://example.com/hook", [secret])
            .map(drop)
            .unwrap_err();
        assert_eq!(e, error, "{provider} {secret:?}");
        let text = e.to_string();
        assert!(text.contains(words), "{provider}: {text}");
        assert!(
            !secret.trim().is_empty() && !text.contains(secret.trim()),
            "{text}"
        );
    }
    // Accepted: the provider's own formats, at their bounds.
    let accepted: &[(Provider, &str)] = &[
        (Provider::Square, "Ibxx_5AKakO-3qeNVR61Dw"),
        (Provider::Dropbox, "0123456789abcde"),
        (Provider::GitLab, "sixteen-bytes-ok"),
        (Provider::Typeform, "sixteen-bytes-ok"),
        (Provider::Calendly, "sixteen-bytes-ok"),
        (Provider::Twitch, "ten-chars!"),
        (Provider::Twitch, "a secret with spaces, 10 to 100"),
        (
            Provider::Adyen,
            "44782def547aaa06c910c43932b1eb0c71fc68d9d0c057550c48ec2acf6ba056",
        ),
    ];
    for (provider, secret) in accepted {
        assert!(
            provider
                .verifier_with_url("https://example.com/hook", [*secret])
                .is_ok(),
            "{provider} {secret:?}"
        );
    }
    assert!(Provider::Twitch
        .verifier([long_twitch[..100].to_owned()])
        .is_ok());
    // A provider that publishes no format: a short secret marked as meant is taken.
    assert!(webhook_guard::verify::Zoom::new([
        webhook_guard::verify::Secret::new("zoom-secret").allow_short()
    ])
    .is_ok());
    assert!(
        webhook_guard::verify::Dropbox::new([
            webhook_guard::verify::Secret::new("dbx-14-chars-x").allow_short()
        ])
        .is_err(),
        "Dropbox issues 15 characters: no exception"
    );
    // Every preset's sample secret passes its own format.
    for provider in Provider::ALL {
        let built =
            provider.verifier_with_url("https://example.com/hook", [provider.sample_secret()]);
        assert!(
            !matches!(built, Err(ref e) if !matches!(e, KeyError::NeedsFeature(_))),
            "{provider}: {built:?}"
        );
    }
}
