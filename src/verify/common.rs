//! Pieces shared by the provider presets: keyed HMAC states, bounded header reads,
//! fixed-size decoding, the timestamped `key=value` header, the end of a timed
//! verification.
//! Private to the `verify` module.

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::digest::{KeyInit, Output};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{check_tolerance, Encoding, KeyError, Secret, SecretFormat, Verified, VerifyError};
use crate::Headers;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// HMAC-SHA1, which Intercom and Twilio sign with.
pub(crate) type HmacSha1 = Hmac<sha1::Sha1>;

/// Longest signature header any preset reads (8 KiB); longer ones are rejected unread.
pub(crate) const MAX_HEADER_LEN: usize = 8 * 1024;

/// Most entries any preset reads from one signature header.
pub(crate) const MAX_ENTRIES: usize = 32;

/// Precomputed keyed HMAC states of type `M`, one per secret. Each verification
/// clones a state instead of re-deriving the key pads, which keeps verification
/// close to the cost of one bare HMAC.
#[derive(Clone)]
pub(crate) struct MacKeys<M>(Vec<M>);

/// Keyed HMAC-SHA256 states: what most presets sign with.
pub(crate) type Keys = MacKeys<HmacSha256>;

/// Keyed HMAC-SHA1 states.
pub(crate) type Sha1Keys = MacKeys<HmacSha1>;

impl<M> Default for MacKeys<M> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<M: Mac + KeyInit + Clone> MacKeys<M> {
    /// Keys from secrets used as their raw bytes, unchecked (for the tests).
    #[cfg(test)]
    pub(crate) fn from_secrets<S: Into<Secret>>(
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Self, KeyError> {
        Self::from_secrets_with(secrets, Ok)
    }

    /// Keys from secrets used as their raw bytes, each checked against `format`
    /// first (see [`SecretFormat`]): what every preset's constructor calls.
    pub(crate) fn checked<S: Into<Secret>>(
        secrets: impl IntoIterator<Item = S>,
        format: &SecretFormat,
    ) -> Result<Self, KeyError> {
        Self::from_secrets_with(secrets, |s| format.check(&s).map(|()| s))
    }

    /// Keys from secrets, each turned into key bytes by `decode` first.
    pub(crate) fn from_secrets_with<S: Into<Secret>>(
        secrets: impl IntoIterator<Item = S>,
        decode: impl Fn(Secret) -> Result<Secret, KeyError>,
    ) -> Result<Self, KeyError> {
        let keys = secrets
            .into_iter()
            .map(|s| {
                let s = decode(s.into())?;
                if s.is_empty() {
                    return Err(KeyError::EmptySecret);
                }
                Ok(<M as KeyInit>::new_from_slice(s.expose())
                    .expect("HMAC takes keys of any length"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(KeyError::EmptySecret);
        }
        Ok(Self(keys))
    }

    /// How many secrets are configured.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The MAC under the first (newest) secret of what `feed` puts in.
    pub(crate) fn first_fed(&self, feed: impl FnOnce(&mut M)) -> Output<M> {
        let mut mac = self.0[0].clone();
        feed(&mut mac);
        mac.finalize().into_bytes()
    }

    /// Whether any secret's MAC of what `feed` puts in equals `tag` (constant-time
    /// comparisons, `Mac::verify_slice`).
    pub(crate) fn any_fed(&self, feed: impl Fn(&mut M), tag: &[u8]) -> bool {
        self.0.iter().any(|key| {
            let mut mac = key.clone();
            feed(&mut mac);
            mac.verify_slice(tag).is_ok()
        })
    }

    /// A copy of `key`'s state fed the concatenation of `parts`.
    fn fed(key: &M, parts: &[&[u8]]) -> M {
        let mut mac = key.clone();
        for part in parts {
            mac.update(part);
        }
        mac
    }
}

impl Keys {
    /// Whether any secret's MAC over the concatenation of `parts` equals any of `tags`.
    /// Each comparison is constant-time (`Mac::verify_slice`).
    pub(crate) fn any_match(&self, parts: &[&[u8]], tags: &[[u8; 32]]) -> bool {
        if tags.is_empty() {
            return false;
        }
        self.0.iter().any(|key| {
            let mac = Self::fed(key, parts);
            match tags {
                [only] => mac.verify_slice(only).is_ok(),
                _ => tags.iter().any(|tag| mac.clone().verify_slice(tag).is_ok()),
            }
        })
    }

    /// [`Keys::any_match`] as a verification step: [`VerifyError::NoMatch`] when
    /// no secret's MAC over `parts` equals any of `tags`.
    pub(crate) fn check(&self, parts: &[&[u8]], tags: &[[u8; 32]]) -> Result<(), VerifyError> {
        if self.any_match(parts, tags) {
            Ok(())
        } else {
            Err(VerifyError::NoMatch)
        }
    }

    /// The MAC of the concatenation of `parts` under the first (newest) secret.
    pub(crate) fn sign_first(&self, parts: &[&[u8]]) -> [u8; 32] {
        self.sign_with(0, parts)
    }

    /// Which secret's MAC over the concatenation of `parts` equals `tag`, if any
    /// (constant-time comparisons): for a scheme that answers with the same secret.
    pub(crate) fn matching(&self, parts: &[&[u8]], tag: &[u8; 32]) -> Option<usize> {
        (self.0.iter()).position(|key| Self::fed(key, parts).verify_slice(tag).is_ok())
    }

    /// The MAC of the concatenation of `parts` under secret number `index`.
    pub(crate) fn sign_with(&self, index: usize, parts: &[&[u8]]) -> [u8; 32] {
        Self::fed(&self.0[index], parts)
            .finalize()
            .into_bytes()
            .into()
    }
}

/// The end of verifying a scheme that signs a time, once the MAC has matched:
/// `signed_at` must lie within `tolerance` of `now`; then `event_id` is read.
pub(crate) fn timed(
    signed_at: DateTime<Utc>,
    now: DateTime<Utc>,
    tolerance: std::time::Duration,
    event_id: impl FnOnce() -> Option<String>,
) -> Result<Verified, VerifyError> {
    check_tolerance(signed_at, now, tolerance)?;
    Ok(Verified {
        event_id: event_id(),
        signed_at: Some(signed_at),
        handshake: None,
    })
}

/// The one MAC of a header value written as `prefix` then the MAC in `encoding`
/// (surrounding whitespace included, as the sender wrote it).
///
/// # Errors
/// [`VerifyError::NoUsableSignature`] without the prefix; a
/// [`VerifyError::MalformedHeader`] naming `header` when the rest does not decode.
// `&Cow`, not `&str`: the error takes the name as it is (a static name stays borrowed).
#[allow(clippy::ptr_arg)]
pub(crate) fn single_tag(
    value: &[u8],
    prefix: &[u8],
    encoding: Encoding,
    header: &Cow<'static, str>,
) -> Result<[u8; 32], VerifyError> {
    let encoded = value
        .strip_prefix(prefix)
        .ok_or(VerifyError::NoUsableSignature)?;
    encoding
        .decode32(encoded)
        .map_err(|reason| VerifyError::MalformedHeader {
            header: header.clone(),
            reason,
        })
}

/// A header that carries one MAC: `prefix`, then the MAC in `encoding` (GitHub's
/// `X-Hub-Signature-256: sha256=<hex>`, Shopify's bare base64). What the MAC covers
/// is the preset's to say.
pub(crate) struct SignatureHeader {
    /// The header's name.
    pub(crate) name: &'static str,
    /// What precedes the MAC (empty for none).
    pub(crate) prefix: &'static str,
    /// How the MAC is written.
    pub(crate) encoding: Encoding,
}

impl SignatureHeader {
    /// The header `name` holding `prefix` and the MAC in `encoding`.
    pub(crate) const fn new(name: &'static str, prefix: &'static str, encoding: Encoding) -> Self {
        Self {
            name,
            prefix,
            encoding,
        }
    }

    /// The MAC of the header, read within [`MAX_HEADER_LEN`].
    ///
    /// # Errors
    /// [`VerifyError::MissingHeader`]; those of [`SignatureHeader::tag_of`].
    pub(crate) fn tag(&self, headers: &dyn Headers) -> Result<[u8; 32], VerifyError> {
        self.tag_of(bounded_header(headers, self.name)?)
    }

    /// The MAC of the header's `value` (see [`single_tag`]).
    pub(crate) fn tag_of(&self, value: &[u8]) -> Result<[u8; 32], VerifyError> {
        single_tag(
            value,
            self.prefix.as_bytes(),
            self.encoding,
            &Cow::Borrowed(self.name),
        )
    }

    /// Verifies that the header's MAC is one of `keys`' over the concatenation of
    /// `parts` ([`VerifyError::NoMatch`] when none is).
    pub(crate) fn check(
        &self,
        keys: &Keys,
        headers: &dyn Headers,
        parts: &[&[u8]],
    ) -> Result<(), VerifyError> {
        keys.check(parts, &[self.tag(headers)?])
    }

    /// The header's value for the concatenation of `parts`, signed with the first
    /// of `keys`.
    pub(crate) fn sign(&self, keys: &Keys, parts: &[&[u8]]) -> String {
        let tag = keys.sign_first(parts);
        format!("{}{}", self.prefix, self.encoding.encode(&tag))
    }
}

/// Slack's scheme, which Zoom shares: `v0=` and the hex MAC over
/// `v0:{timestamp}:{raw body}` in one header, the Unix timestamp in another.
pub(crate) struct V0Header {
    /// The header of the MAC.
    pub(crate) signature: &'static str,
    /// The header of the timestamp.
    pub(crate) timestamp: &'static str,
}

impl V0Header {
    /// The header of the MAC as a [`SignatureHeader`].
    const fn mac(&self) -> SignatureHeader {
        SignatureHeader::new(self.signature, "v0=", Encoding::Hex)
    }

    /// Verifies that a delivery of `body` carries one of `keys`' MAC over
    /// `v0:{timestamp}:{raw body}`, both headers read within [`MAX_HEADER_LEN`]:
    /// when it was signed (for the caller to check against its tolerance), and which
    /// of `keys` signed it (for a handshake answered under the same secret).
    ///
    /// # Errors
    /// [`VerifyError::MissingHeader`] or [`VerifyError::MalformedHeader`] for either
    /// header; [`VerifyError::NoUsableSignature`] without the `v0=` prefix;
    /// [`VerifyError::NoMatch`] when no secret's MAC matches.
    pub(crate) fn check(
        &self,
        keys: &Keys,
        headers: &dyn Headers,
        body: &[u8],
    ) -> Result<(DateTime<Utc>, usize), VerifyError> {
        let value = bounded_header(headers, self.signature)?;
        let ts = bounded_header(headers, self.timestamp)?;
        let signed_at = super::parse_unix_seconds(ts, self.timestamp)?;
        let tag = self.mac().tag_of(value)?;
        let key = keys
            .matching(&[b"v0:", ts, b":", body], &tag)
            .ok_or(VerifyError::NoMatch)?;
        Ok((signed_at, key))
    }

    /// The signature header's value for `body` at `timestamp`, signed with the
    /// first of `keys`.
    pub(crate) fn sign(&self, keys: &Keys, timestamp: i64, body: &[u8]) -> String {
        let t = timestamp.to_string();
        self.mac().sign(keys, &[b"v0:", t.as_bytes(), b":", body])
    }

    /// Both headers a sender puts on `body` at `timestamp`: the timestamp, then the
    /// signature.
    pub(crate) fn sign_headers(
        &self,
        keys: &Keys,
        timestamp: i64,
        body: &[u8],
    ) -> Vec<(&'static str, String)> {
        vec![
            (self.timestamp, timestamp.to_string()),
            (self.signature, self.sign(keys, timestamp, body)),
        ]
    }
}

impl<M> fmt::Debug for MacKeys<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} secret(s), redacted>", self.0.len())
    }
}

/// The public keys of an asymmetric scheme, each read by `parse`: at least one.
///
/// # Errors
/// The first error of `parse`; [`KeyError::EmptySecret`] if no key is given.
#[cfg(any(feature = "ed25519", feature = "sendgrid"))]
pub(crate) fn public_keys<K, P>(
    keys: impl IntoIterator<Item = K>,
    parse: impl FnMut(K) -> Result<P, KeyError>,
) -> Result<Vec<P>, KeyError> {
    let keys = keys.into_iter().map(parse).collect::<Result<Vec<_>, _>>()?;
    if keys.is_empty() {
        return Err(KeyError::EmptySecret);
    }
    Ok(keys)
}

/// The value of header `name`, refusing one longer than [`MAX_HEADER_LEN`].
pub(crate) fn bounded_header<'h>(
    headers: &'h dyn Headers,
    name: &'static str,
) -> Result<&'h [u8], VerifyError> {
    header_within(headers, &Cow::Borrowed(name), MAX_HEADER_LEN)
}

/// The value of header `name`, refusing one longer than `max` bytes.
// `&Cow`, not `&str`: the error takes the name as it is (a static name stays borrowed).
#[allow(clippy::ptr_arg)]
pub(crate) fn header_within<'h>(
    headers: &'h dyn Headers,
    name: &Cow<'static, str>,
    max: usize,
) -> Result<&'h [u8], VerifyError> {
    let value = headers
        .get_bytes(name)
        .ok_or_else(|| VerifyError::MissingHeader(name.clone()))?;
    if value.len() > max {
        return Err(VerifyError::MalformedHeader {
            header: name.clone(),
            reason: "header too long",
        });
    }
    Ok(value)
}

/// Refuses a header value longer than [`MAX_HEADER_LEN`].
pub(crate) fn check_len(value: &[u8], name: &'static str) -> Result<(), VerifyError> {
    if value.len() > MAX_HEADER_LEN {
        return Err(malformed(name, "header too long"));
    }
    Ok(())
}

/// Refuses a header value holding more than [`MAX_ENTRIES`] entries separated by `sep`.
pub(crate) fn check_entries(value: &[u8], sep: u8, name: &'static str) -> Result<(), VerifyError> {
    if value.iter().filter(|&&b| b == sep).count() >= MAX_ENTRIES {
        return Err(malformed(name, "too many entries"));
    }
    Ok(())
}

/// A signature header of `key=value` entries that carries one timestamp and any
/// number of hex MACs (Stripe's `t=..,v1=..`, Paddle's `ts=..;h1=..`). Entries of
/// other keys are ignored, never a downgrade path.
pub(crate) struct TimedHeader {
    /// The header's name, for errors.
    pub(crate) name: &'static str,
    /// The byte between entries.
    pub(crate) separator: u8,
    /// The key of the timestamp.
    pub(crate) timestamp: &'static [u8],
    /// The key of each MAC.
    pub(crate) signature: &'static [u8],
    /// What the MAC covers between the timestamp and the body.
    pub(crate) joiner: &'static [u8],
    /// Why a repeated timestamp is refused.
    pub(crate) repeated: &'static str,
    /// Why an empty timestamp is refused.
    pub(crate) empty: &'static str,
    /// Why a header without a timestamp is refused.
    pub(crate) missing: &'static str,
}

/// The MACs of a header, decoded in place: a header holds at most [`MAX_ENTRIES`]
/// entries, so reading one allocates nothing.
pub(crate) type Tags = [[u8; 32]; MAX_ENTRIES];

impl TimedHeader {
    /// Stripe's `t=<unix>,v1=<hex>,...` over `{t}.{raw body}`, named `name`: only
    /// `v1` entries are read.
    pub(crate) const fn t_v1(name: &'static str) -> Self {
        Self {
            name,
            separator: b',',
            timestamp: b"t",
            signature: b"v1",
            joiner: b".",
            repeated: "more than one timestamp",
            empty: "empty timestamp",
            missing: "no timestamp",
        }
    }

    /// Reads `value`: the timestamp's digits, and how many MACs were decoded into
    /// `tags`. Bounded: refuses more than [`MAX_HEADER_LEN`] bytes or
    /// [`MAX_ENTRIES`] entries before reading any.
    ///
    /// # Errors
    /// [`VerifyError::MalformedHeader`] for an entry without `=`, a repeated, empty
    /// or missing timestamp, too long a header or too many entries;
    /// [`VerifyError::NoUsableSignature`] when no MAC is 64 hex digits.
    pub(crate) fn parse<'a>(
        &self,
        value: &'a [u8],
        tags: &mut Tags,
    ) -> Result<(&'a [u8], usize), VerifyError> {
        check_len(value, self.name)?;
        check_entries(value, self.separator, self.name)?;
        let mut timestamp = None;
        let mut count = 0;
        for entry in value.split(|&b| b == self.separator) {
            let (key, val) =
                split_pair(entry).ok_or_else(|| malformed(self.name, "entry is not key=value"))?;
            if key == self.timestamp {
                if timestamp.is_some() {
                    return Err(malformed(self.name, self.repeated));
                }
                if val.is_empty() {
                    return Err(malformed(self.name, self.empty));
                }
                timestamp = Some(val);
            } else if key == self.signature {
                // An unreadable MAC next to a readable one is ignored, as the
                // providers' SDKs do. (`check_entries` leaves at most MAX_ENTRIES.)
                if let Some(tag) = hex32(val) {
                    tags[count] = tag;
                    count += 1;
                }
            }
        }
        let timestamp = timestamp.ok_or_else(|| malformed(self.name, self.missing))?;
        if count == 0 {
            return Err(VerifyError::NoUsableSignature);
        }
        Ok((timestamp, count))
    }

    /// Verifies a delivery whose MAC, under one of `keys`, covers
    /// `{timestamp}{joiner}{raw body}`, signed within `tolerance` of `now`; then
    /// reads its `event_id`.
    pub(crate) fn verify(
        &self,
        keys: &Keys,
        headers: &dyn Headers,
        body: &[u8],
        now: DateTime<Utc>,
        tolerance: std::time::Duration,
        event_id: impl FnOnce() -> Option<String>,
    ) -> Result<Verified, VerifyError> {
        let value = bounded_header(headers, self.name)?;
        let mut tags = [[0u8; 32]; MAX_ENTRIES];
        let (timestamp, count) = self.parse(value, &mut tags)?;
        let signed_at = super::parse_unix_seconds(timestamp, self.name)?;
        keys.check(&[timestamp, self.joiner, body], &tags[..count])?;
        timed(signed_at, now, tolerance, event_id)
    }

    /// The header value a sender puts on `body` at `timestamp` (Unix seconds):
    /// the timestamp, then the MAC under the first of `keys`, in hex.
    pub(crate) fn sign(&self, keys: &Keys, timestamp: i64, body: &[u8]) -> String {
        let t = timestamp.to_string();
        let tag = keys.sign_first(&[t.as_bytes(), self.joiner, body]);
        let text = |key| String::from_utf8_lossy(key);
        format!(
            "{}={t}{}{}={}",
            text(self.timestamp),
            char::from(self.separator),
            text(self.signature),
            hex::encode(tag)
        )
    }

    /// [`TimedHeader::parse`] with the MACs returned.
    pub(crate) fn parse_owned<'a>(
        &self,
        value: &'a [u8],
    ) -> Result<(&'a [u8], Vec<[u8; 32]>), VerifyError> {
        let mut tags = [[0u8; 32]; MAX_ENTRIES];
        let (timestamp, count) = self.parse(value, &mut tags)?;
        Ok((timestamp, tags[..count].to_vec()))
    }
}

/// A [`VerifyError::MalformedHeader`].
pub(crate) fn malformed(header: &'static str, reason: &'static str) -> VerifyError {
    VerifyError::MalformedHeader {
        header: Cow::Borrowed(header),
        reason,
    }
}

/// The first header among `names` that is present and non-empty, as UTF-8.
pub(crate) fn id_header(headers: &dyn Headers, names: &[&str]) -> Option<String> {
    names
        .iter()
        .filter_map(|n| headers.get_bytes(n))
        .find_map(id_value)
}

/// A header value as an event id: UTF-8, trimmed of ASCII whitespace only (as HTTP
/// trims a header's value), not empty. A Unicode space is part of the id: the
/// signed ids `msg_1\u{a0}` and `msg_1` are two events, never one.
pub(crate) fn id_value(value: &[u8]) -> Option<String> {
    std::str::from_utf8(value.trim_ascii())
        .ok()
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
}

/// A JSON body field, if the body is JSON and has it.
pub(crate) fn body_field(body: &[u8], name: &str) -> Option<String> {
    // Called only once the signature over the body has matched: stop at the field.
    crate::json::first_field(body, &[name]).ok()
}

/// The SHA-256 of `bytes`: the content key of a scheme that signs the raw body and
/// no id ([`Verifier::content_key`](super::Verifier::content_key)).
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    Sha256::digest(bytes).into()
}

/// A JSON body's value at `path`, if the body is JSON and has it (read up to it).
pub(crate) fn first_path(body: &[u8], path: &[&str]) -> Option<String> {
    crate::json::first_field(body, path).ok()
}

/// Decodes exactly 64 hex digits (either case) into 32 bytes.
pub(crate) fn hex32(text: &[u8]) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).ok().map(|()| out)
}

/// Decodes standard base64 (padded) of exactly 32 bytes.
pub(crate) fn base64_32(text: &[u8]) -> Option<[u8; 32]> {
    // 32 bytes are 44 base64 characters with padding; refuse anything else before decoding.
    if text.len() != 44 {
        return None;
    }
    let mut out = [0u8; 48];
    let n = base64::engine::general_purpose::STANDARD
        .decode_slice(text, &mut out)
        .ok()?;
    (n == 32).then(|| out[..32].try_into().expect("32 bytes"))
}

/// Encodes bytes as standard padded base64.
pub(crate) fn base64_encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Splits `key=value` at the first `=`.
pub(crate) fn split_pair(entry: &[u8]) -> Option<(&[u8], &[u8])> {
    let eq = entry.iter().position(|&b| b == b'=')?;
    Some((&entry[..eq], &entry[eq + 1..]))
}

/// The time `secs` seconds after the Unix epoch, for the presets' tests.
#[cfg(test)]
pub(crate) fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs, 0).expect("a time in range")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_id_header_gives_way_to_the_next_name() {
        let headers = [("X-Shopify-Webhook-Id", " "), ("Shopify-Webhook-Id", "abc")];
        let names = ["X-Shopify-Webhook-Id", "Shopify-Webhook-Id"];
        assert_eq!(id_header(&headers, &names).as_deref(), Some("abc"));
        assert_eq!(id_header(&[headers[0]], &names), None);
        assert_eq!(
            id_header(&[("Shopify-Webhook-Id", "x")], &names).as_deref(),
            Some("x")
        );
    }

    #[test]
    fn ids_are_trimmed_of_ascii_whitespace_only() {
        assert_eq!(id_value(b" \tmsg_1\r\n").as_deref(), Some("msg_1"));
        let nbsp = "msg_1\u{a0}";
        assert_eq!(id_value(nbsp.as_bytes()).as_deref(), Some(nbsp));
        assert_eq!(
            id_value("\u{2003}msg_1".as_bytes()).as_deref(),
            Some("\u{2003}msg_1")
        );
        assert_eq!(id_value(b" \t "), None);
    }

    #[test]
    fn keys_match_any_tag_and_refuse_empty_secrets() {
        let keys = Keys::from_secrets(["new", "old"]).unwrap();
        let old = Keys::from_secrets(["old"]).unwrap();
        let tag = old.sign_first(&[b"a", b"b"]);
        assert!(keys.any_match(&[b"ab"], &[[0; 32], tag]));
        assert!(!keys.any_match(&[b"ab"], &[]));
        assert!(!keys.any_match(&[b"ac"], &[tag]));
        assert_eq!(Keys::from_secrets([""]).unwrap_err(), KeyError::EmptySecret);
        assert!(!format!("{keys:?}").contains("old"));
    }

    #[test]
    fn hex32_accepts_what_the_hex_crate_accepts() {
        let digits = b"0123456789abcdefABCDEF";
        for i in 0..=255u8 {
            let mut text = [b'7'; 64];
            text[usize::from(i) % 64] = i;
            let mut want = [0u8; 32];
            let want = hex::decode_to_slice(text, &mut want).ok().map(|()| want);
            assert_eq!(hex32(&text), want, "byte {i}");
            assert_eq!(want.is_some(), digits.contains(&i));
        }
        let mixed = b"00ff7Aa9B0c1D2e3F4567890abcdefABCDEF0123456789aAbBcCdDeEfF012345";
        let mut want = [0u8; 32];
        hex::decode_to_slice(mixed, &mut want).unwrap();
        assert_eq!(hex32(mixed), Some(want));
    }

    #[test]
    fn decoders_want_exact_lengths() {
        assert!(hex32(&[b'a'; 64]).is_some());
        assert!(hex32(&[b'a'; 63]).is_none());
        assert!(hex32(&[b'g'; 64]).is_none());
        let b64 = base64_encode(&[7; 32]);
        assert_eq!(base64_32(b64.as_bytes()), Some([7; 32]));
        assert!(base64_32(base64_encode(&[7; 31]).as_bytes()).is_none());
    }
}
