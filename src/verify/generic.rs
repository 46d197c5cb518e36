//! A configurable HMAC-SHA256 verifier for providers without a preset.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::common::{self, Keys};
use super::macros;
use super::{
    check_tolerance, parse_unix_seconds, Encoding, KeyError, Secret, Verified, Verifier,
    VerifyError,
};
use crate::Headers;

/// What a generic verifier signs: literal text, the body, and header values, in any
/// order.
///
/// Written as text with placeholders: `{body}` (the raw body, exactly once),
/// `{timestamp:Header-Name}` (a Unix-seconds header, checked against the tolerance),
/// `{id:Header-Name}` (a header that is signed and is the event id). Everything else
/// is literal; write `{{` and `}}` for literal braces. Placeholders must not touch
/// (only `{timestamp:...}{body}` may): with no literal between them, bytes moved
/// from one to the other would keep the signature valid. For the same reason a
/// verifier refuses an id holding the byte that separates it from its neighbour
/// (`.` in `{id:X-Id}.{body}`): a sender whose genuine ids hold it cannot be
/// verified safely with such a template.
///
/// ```
/// use webhook_guard::verify::Template;
///
/// let t: Template = "{id:X-Id}.{timestamp:X-Timestamp}.{body}".parse().unwrap();
/// assert!("v0:{timestamp:X-Ts}:{body}".parse::<Template>().is_ok());
/// assert!("{timestamp:X-Ts}".parse::<Template>().is_err()); // no {body}
/// assert!("{id:X-Id}{body}".parse::<Template>().is_err()); // ambiguous
/// # let _ = t;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(Vec<u8>),
    Body,
    Timestamp(String),
    Id(String),
}

/// Why a [`Template`] could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// `{body}` must appear exactly once.
    #[error("a template needs `{{body}}` exactly once")]
    Body,
    /// `{timestamp:...}` or `{id:...}` appears more than once.
    #[error("`{{{0}:...}}` appears more than once")]
    Repeated(&'static str),
    /// A placeholder is not `{body}`, `{timestamp:Name}` or `{id:Name}`.
    #[error("unknown placeholder `{{{0}}}`")]
    Unknown(String),
    /// A `{` without its `}`, or a lone `}`.
    #[error("unbalanced brace; write `{{{{` or `}}}}` for a literal one")]
    Unbalanced,
    /// Two placeholders side by side, with no literal between them (only
    /// `{timestamp:...}{body}` may touch): bytes moved from one to the other would
    /// keep the signature valid, a captured delivery replayed under another id or
    /// with another body.
    #[error(
        "placeholders must be separated by a literal, such as `.` \
         (only `{{timestamp:...}}{{body}}` may touch)"
    )]
    Ambiguous,
}

impl Template {
    /// The raw body alone (`{body}`), the default.
    pub fn body() -> Self {
        Self {
            parts: vec![Part::Body],
        }
    }

    /// Parses a template; see the type's documentation.
    ///
    /// # Errors
    /// A [`TemplateError`] saying what is wrong.
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut literal = Vec::new();
        let mut rest = text;
        let (mut bodies, mut ts, mut id) = (0, 0, 0);
        while let Some(c) = rest.chars().next() {
            if rest.starts_with("{{") || rest.starts_with("}}") {
                literal.push(rest.as_bytes()[0]);
                rest = &rest[2..];
            } else if c == '}' {
                return Err(TemplateError::Unbalanced);
            } else if c == '{' {
                let end = rest.find('}').ok_or(TemplateError::Unbalanced)?;
                let inner = &rest[1..end];
                if !literal.is_empty() {
                    parts.push(Part::Literal(std::mem::take(&mut literal)));
                }
                let named = |prefix: &str| inner.strip_prefix(prefix).filter(|n| valid_name(n));
                if inner == "body" {
                    bodies += 1;
                    parts.push(Part::Body);
                } else if let Some(name) = named("timestamp:") {
                    ts += 1;
                    parts.push(Part::Timestamp(name.to_owned()));
                } else if let Some(name) = named("id:") {
                    id += 1;
                    parts.push(Part::Id(name.to_owned()));
                } else {
                    return Err(TemplateError::Unknown(inner.to_owned()));
                }
                rest = &rest[end + 1..];
            } else {
                literal.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                rest = &rest[c.len_utf8()..];
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        if bodies != 1 {
            return Err(TemplateError::Body);
        }
        if ts > 1 {
            return Err(TemplateError::Repeated("timestamp"));
        }
        if id > 1 {
            return Err(TemplateError::Repeated("id"));
        }
        // A timestamp is digits and must fall in the tolerance, so bytes moved
        // between its end and the body's start change it far out of it; every other
        // pair can trade bytes (an id any text, a leading zero of a timestamp).
        let adjacent = parts.windows(2).any(|pair| match pair {
            [Part::Timestamp(_), Part::Body] => false,
            [a, b] => !matches!(a, Part::Literal(_)) && !matches!(b, Part::Literal(_)),
            _ => false,
        });
        if adjacent {
            return Err(TemplateError::Ambiguous);
        }
        Ok(Self { parts })
    }

    fn id_header(&self) -> Option<&str> {
        self.parts.iter().find_map(|p| match p {
            Part::Id(name) => Some(name.as_str()),
            _ => None,
        })
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl FromStr for Template {
    type Err = TemplateError;

    fn from_str(s: &str) -> Result<Self, TemplateError> {
        Self::parse(s)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            match part {
                Part::Literal(l) => {
                    let text = String::from_utf8_lossy(l);
                    f.write_str(&text.replace('{', "{{").replace('}', "}}"))?;
                }
                Part::Body => f.write_str("{body}")?,
                Part::Timestamp(n) => write!(f, "{{timestamp:{n}}}")?,
                Part::Id(n) => write!(f, "{{id:{n}}}")?,
            }
        }
        Ok(())
    }
}

/// An HMAC-SHA256 verifier configured by data, so that a provider without a preset
/// needs no code: the signature header, a prefix before each MAC, the encoding
/// (hex or base64), an optional separator between several signatures, and a
/// [`Template`] of what is signed.
///
/// ```
/// use webhook_guard::verify::{Encoding, GenericHmac, Verifier};
///
/// // A provider that sends `X-Sig: v1=<hex>` over `{timestamp}.{body}`.
/// let v = GenericHmac::new("X-Sig", ["a-random-secret-of-32-characters"])
///     .unwrap()
///     .prefix("v1=")
///     .encoding(Encoding::Hex)
///     .template("{timestamp:X-Timestamp}.{body}".parse().unwrap())
///     .id_header("X-Event-Id");
/// let body = br#"{"ok":true}"#;
/// let headers = [
///     ("X-Sig", v.sign(&[("X-Timestamp", "1700000000")], body).unwrap()),
///     ("X-Timestamp", "1700000000".to_owned()),
///     ("X-Event-Id", "e-1".to_owned()),
/// ];
/// let now = chrono::DateTime::from_timestamp(1_700_000_100, 0).unwrap();
/// assert_eq!(v.verify(&headers, body, now).unwrap().event_id.as_deref(), Some("e-1"));
/// ```
#[derive(Debug, Clone)]
pub struct GenericHmac {
    header: Cow<'static, str>,
    prefix: Cow<'static, str>,
    encoding: Encoding,
    separator: Option<u8>,
    template: Template,
    id_header: Option<Cow<'static, str>>,
    tolerance: Duration,
    retry_window: Option<Duration>,
    keys: Keys,
}

impl GenericHmac {
    /// Default tolerance for a signed timestamp: 300 seconds.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

    /// A verifier reading `header`, hex without prefix over `{body}`, keyed with
    /// `secrets` used as their raw bytes (each at least 16 bytes, unless marked with
    /// [`Secret::allow_short`]).
    ///
    /// # Errors
    /// [`KeyError::BadHeaderName`] if `header` is not a valid header name;
    /// [`KeyError::EmptySecret`] if no secret is given or one is empty; the
    /// [`SecretFormat::GENERIC`](super::SecretFormat::GENERIC) errors
    /// ([`KeyError::TooShort`], [`KeyError::Whitespace`]).
    pub fn new<S: Into<Secret>>(
        header: impl Into<Cow<'static, str>>,
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Self, KeyError> {
        Ok(Self {
            header: super::hmac_header::header_name(header)?,
            prefix: Cow::Borrowed(""),
            encoding: Encoding::Hex,
            separator: None,
            template: Template::body(),
            id_header: None,
            tolerance: Self::DEFAULT_TOLERANCE,
            retry_window: None,
            keys: Keys::checked(secrets, &super::SecretFormat::GENERIC)?,
        })
    }

    macros::setters! {
        /// Text before each encoded MAC, such as `sha256=` or `v1,`.
        prefix(prefix: impl Into<Cow<'static, str>>) => prefix = prefix.into();
        /// How each MAC is encoded (hex, or standard padded base64).
        encoding(encoding: Encoding) => encoding = encoding;
        /// The byte between several signature entries in the header (such as `b' '` or
        /// `b','`); entries without the prefix or that do not decode are skipped.
        separator(separator: u8) => separator = Some(separator);
        /// What is signed (default `{body}`).
        template(template: Template) => template = template;
        /// A header holding the event id, when the template has no `{id:...}` (a signed
        /// id in the template always wins).
        ///
        /// The signature does not cover this header: a captured delivery resent inside
        /// the tolerance under a *new* id runs again (SECURITY.md, known limits). When
        /// the sender signs its id, name it in the template (`{id:X-Event-Id}`) instead.
        id_header(name: impl Into<Cow<'static, str>>) => id_header = Some(name.into());
    }

    macros::keyed! {
        /// How far a signed `{timestamp:...}` may be from `now`, either way (default 300 s).
        tolerance;
    }

    macros::setters! {
        /// How long the provider retries one event, if you know it.
        retry_window(window: Duration) => retry_window = Some(window);
    }

    /// The signature header value for `body`, signed with the first secret; the
    /// template's header values come from `headers`.
    ///
    /// # Errors
    /// [`VerifyError::MissingHeader`] if `headers` lacks a header the template names.
    pub fn sign(&self, headers: &dyn Headers, body: &[u8]) -> Result<String, VerifyError> {
        let (parts, _) = self.signed_parts(headers, body)?;
        let tag = self.keys.sign_first(&parts);
        Ok(format!("{}{}", self.prefix, self.encoding.encode(&tag)))
    }

    fn signed_parts<'a>(
        &'a self,
        headers: &'a dyn Headers,
        body: &'a [u8],
    ) -> Result<SignedParts<'a>, VerifyError> {
        let mut signed_at = None;
        let template = &self.template.parts;
        let mut parts = Vec::with_capacity(template.len());
        for (i, part) in template.iter().enumerate() {
            parts.push(match part {
                Part::Literal(l) => l.as_slice(),
                Part::Body => body,
                Part::Id(name) => {
                    let value = read(headers, name)?;
                    // An id holding the byte that separates it from its neighbour
                    // could be moved across the separator: the same signed bytes
                    // split differently (another id, another body).
                    let before = i.checked_sub(1).and_then(|j| literal(template, j)?.last());
                    let after = literal(template, i + 1).and_then(|l| l.first());
                    if value.iter().any(|b| Some(b) == before || Some(b) == after) {
                        return Err(VerifyError::MalformedHeader {
                            header: Cow::Owned(name.clone()),
                            reason: "holds the template's separator next to it",
                        });
                    }
                    value
                }
                Part::Timestamp(name) => {
                    let value = read(headers, name)?;
                    signed_at =
                        Some(parse_unix_seconds(value, "timestamp").map_err(|e| match e {
                            VerifyError::MalformedHeader { reason, .. } => {
                                VerifyError::MalformedHeader {
                                    header: Cow::Owned(name.clone()),
                                    reason,
                                }
                            }
                            other => other,
                        })?);
                    value
                }
            });
        }
        Ok((parts, signed_at))
    }

    fn tags(&self, value: &[u8]) -> Result<Vec<[u8; 32]>, VerifyError> {
        let entries: Vec<&[u8]> = match self.separator {
            Some(sep) => {
                if value.iter().filter(|&&b| b == sep).count() >= common::MAX_ENTRIES {
                    return Err(VerifyError::MalformedHeader {
                        header: self.header.clone(),
                        reason: "too many entries",
                    });
                }
                value.split(|&b| b == sep).collect()
            }
            None => vec![value],
        };
        let tags: Vec<[u8; 32]> = entries
            .into_iter()
            .filter_map(|e| e.trim_ascii().strip_prefix(self.prefix.as_bytes()))
            .filter_map(|e| self.encoding.decode32(e).ok())
            .collect();
        if tags.is_empty() {
            return Err(VerifyError::NoUsableSignature);
        }
        Ok(tags)
    }
}

/// The literal at `i` of a template, if that part is one.
fn literal(parts: &[Part], i: usize) -> Option<&[u8]> {
    match parts.get(i)? {
        Part::Literal(l) => Some(l),
        _ => None,
    }
}

/// The pieces that are signed, and the signed timestamp if the template has one.
type SignedParts<'a> = (Vec<&'a [u8]>, Option<DateTime<Utc>>);

fn read<'h>(headers: &'h dyn Headers, name: &str) -> Result<&'h [u8], VerifyError> {
    let value = headers
        .get_bytes(name)
        .ok_or_else(|| VerifyError::MissingHeader(Cow::Owned(name.to_owned())))?;
    if value.len() > common::MAX_HEADER_LEN {
        return Err(VerifyError::MalformedHeader {
            header: Cow::Owned(name.to_owned()),
            reason: "header too long",
        });
    }
    Ok(value)
}

impl Verifier for GenericHmac {
    macros::verifier! {
        rekeyed(format: super::SecretFormat::GENERIC);
        verify |self, headers, body, now| {
            let value = common::header_within(headers, &self.header, common::MAX_HEADER_LEN)?;
            let tags = self.tags(value)?;
            let (parts, signed_at) = self.signed_parts(headers, body)?;
            self.keys.check(&parts, &tags)?;
            if let Some(at) = signed_at {
                check_tolerance(at, now, self.tolerance)?;
            }
            // The signed id first: an unsigned header could be replaced by a replayer.
            let id_name = self.template.id_header().or(self.id_header.as_deref());
            Ok(Verified {
                event_id: id_name.and_then(|n| common::id_header(headers, &[n])),
                signed_at,
                handshake: None,
            })
        }
    }

    fn tolerance(&self) -> Option<Duration> {
        let signs_a_time = (self.template.parts.iter()).any(|p| matches!(p, Part::Timestamp(_)));
        signs_a_time.then_some(self.tolerance)
    }

    fn retry_window(&self) -> Option<Duration> {
        self.retry_window
    }

    fn finds_event_id(&self) -> bool {
        self.template.id_header().is_some() || self.id_header.is_some()
    }
}

/// Parses a template, for the fuzz targets.
#[doc(hidden)]
pub fn parse_template(text: &str) -> Result<Template, TemplateError> {
    Template::parse(text)
}

#[cfg(test)]
mod tests {
    use super::common::at;
    use super::*;
    use crate::verify::testing::*;

    #[test]
    fn templates_parse_and_print() {
        for text in [
            "{body}",
            "v0:{timestamp:X-Ts}:{body}",
            "{id:Id}.{timestamp:T}.{body}",
            "{{x}}{body}",
        ] {
            assert_eq!(Template::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(Template::parse("{timestamp:T}"), Err(TemplateError::Body));
        assert_eq!(Template::parse("{body}{body}"), Err(TemplateError::Body));
        for ambiguous in [
            "{id:X-Id}{body}",
            "{body}{id:X-Id}",
            "v1:{id:X-Id}{body}",
            "{id:X-Id}{timestamp:X-Ts}.{body}",
            "{timestamp:X-Ts}{id:X-Id}.{body}",
            "{body}{timestamp:X-Ts}",
        ] {
            assert_eq!(
                Template::parse(ambiguous),
                Err(TemplateError::Ambiguous),
                "{ambiguous}"
            );
        }
        assert!(Template::parse("{id:X-Id}.{body}").is_ok());
        assert!(Template::parse("{timestamp:X-Ts}{body}").is_ok());
        assert_eq!(
            Template::parse("{id:A}{id:B}{body}"),
            Err(TemplateError::Repeated("id"))
        );
        assert_eq!(
            Template::parse("{nope}{body}"),
            Err(TemplateError::Unknown("nope".into()))
        );
        assert_eq!(
            Template::parse("{timestamp:}{body}"),
            Err(TemplateError::Unknown("timestamp:".into()))
        );
        assert_eq!(Template::parse("{body"), Err(TemplateError::Unbalanced));
        assert_eq!(Template::parse("}{body}"), Err(TemplateError::Unbalanced));
    }

    #[test]
    fn reproduces_the_slack_vector_without_code() {
        // Slack's published example, configured as data.
        let body = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        let v = GenericHmac::new("X-Slack-Signature", ["8f742231b10e8888abcd99yyyzzz85a5"])
            .unwrap()
            .prefix("v0=")
            .template(
                "v0:{timestamp:X-Slack-Request-Timestamp}:{body}"
                    .parse()
                    .unwrap(),
            );
        let h = [
            (
                "X-Slack-Signature",
                "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
            ),
            ("X-Slack-Request-Timestamp", "1531420618"),
        ];
        let verified = v.verify(&h, body.as_bytes(), at(1_531_420_618)).unwrap();
        assert_eq!(verified.signed_at, Some(at(1_531_420_618)));
        window(1_531_420_618, 300, |now| {
            v.verify(&h, body.as_bytes(), at(now))
        });
    }

    #[test]
    fn reproduces_the_standard_webhooks_shape_with_a_list() {
        let v = GenericHmac::new("sig", ["k1-0123456789abcdef", "k2-0123456789abcdef"])
            .unwrap()
            .prefix("v1,")
            .encoding(Encoding::Base64)
            .separator(b' ')
            .template("{id:msg-id}.{timestamp:ts}.{body}".parse().unwrap());
        let mut h = vec![("msg-id", "m1".to_owned()), ("ts", "100".to_owned())];
        let sig = GenericHmac::new("sig", ["k2-0123456789abcdef"])
            .unwrap()
            .prefix("v1,")
            .encoding(Encoding::Base64)
            .template("{id:msg-id}.{timestamp:ts}.{body}".parse().unwrap())
            .sign(&h, b"{}")
            .unwrap();
        h.push(("sig", format!("v2,zzz {sig}")));
        let verified = v.verify(&h, b"{}", at(100)).unwrap();
        assert_eq!(verified.event_id.as_deref(), Some("m1"));
        h[1].1 = "101".into();
        assert_eq!(v.verify(&h, b"{}", at(100)), Err(VerifyError::NoMatch));
        h.remove(1);
        assert_eq!(
            v.verify(&h, b"{}", at(100)),
            Err(VerifyError::MissingHeader("ts".into()))
        );
    }

    #[test]
    fn the_signed_id_wins_over_an_id_header() {
        let template: Template = "{id:X-Id}.{body}".parse().unwrap();
        let v = GenericHmac::new("sig", ["k-0123456789abcdef"])
            .unwrap()
            .template(template.clone())
            .id_header("X-Delivery");
        let mut h = vec![("X-Id", "signed-1".to_owned())];
        let sig = GenericHmac::new("sig", ["k-0123456789abcdef"])
            .unwrap()
            .template(template)
            .sign(&h, b"{}")
            .unwrap();
        h.push(("sig", sig));
        // A replayer sets a fresh, unsigned delivery header: the id stays the signed one.
        h.push(("X-Delivery", "fresh-2".to_owned()));
        let verified = v.verify(&h, b"{}", at(100)).unwrap();
        assert_eq!(verified.event_id.as_deref(), Some("signed-1"));
    }

    #[test]
    fn an_id_cannot_take_bytes_across_its_separator() {
        let body = br#"{"type":"invoice.paid"}"#;
        for text in ["{id:X-Id}.{body}", "{body}.{id:X-Id}"] {
            let v = GenericHmac::new("sig", ["k-0123456789abcdef"])
                .unwrap()
                .template(text.parse().unwrap());
            let genuine = [("X-Id", "evt_1")];
            let sig = v.sign(&genuine, body).unwrap();
            let verified = v.verify(&[genuine[0], ("sig", &sig)], body, at(0));
            assert_eq!(verified.unwrap().event_id.as_deref(), Some("evt_1"));
            // The same signed bytes, split at the body's own `.` instead.
            let (id, rest) = if text.starts_with("{id") {
                (r#"evt_1.{"type":"invoice"#, &br#"paid"}"#[..])
            } else {
                (r#"paid"}.evt_1"#, &br#"{"type":"invoice"#[..])
            };
            let moved = [("X-Id", id), ("sig", &sig)];
            assert!(
                matches!(
                    v.verify(&moved, rest, at(0)),
                    Err(VerifyError::MalformedHeader {
                        reason: "holds the template's separator next to it",
                        ..
                    })
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn hostile_signature_headers_are_bounded() {
        let v = GenericHmac::new("sig", ["k-0123456789abcdef"])
            .unwrap()
            .separator(b',');
        let many = vec!["00"; 100].join(",");
        assert!(matches!(
            v.verify(&[("sig", many.as_str())], b"", at(0)),
            Err(VerifyError::MalformedHeader {
                reason: "too many entries",
                ..
            })
        ));
        let huge = "0".repeat(1 << 20);
        assert!(matches!(
            v.verify(&[("sig", huge.as_str())], b"", at(0)),
            Err(VerifyError::MalformedHeader {
                reason: "header too long",
                ..
            })
        ));
    }
}
