//! What an event is about: its type, when it was created, and its target object.
//!
//! The ordering guard and reconciliation key by the **target object** (a Stripe
//! `data.object.id`, a Jamm charge `trx-…` or customer `cus-…`), never by the webhook
//! id, and order events by the provider's `created_at`, never by arrival.
//!
//! Where a delivery's **type** is ([`TypeSource`]: a body field, a header, a header
//! and an action) and the type found there ([`EventType`]) are here too: what the
//! [router](crate::route) dispatches on.

mod event_type;

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Datelike as _, Utc};

use crate::json;

pub(crate) use event_type::TypeHeader;
pub use event_type::{EventType, TypeSource, MAX_TYPE_LEN};

/// Facts about an event, read from its body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventMeta {
    /// The provider's event type, such as `charge.succeeded`.
    pub event_type: Option<String>,
    /// When the provider created the event ([`MetaExtractor::extract`] keeps it to the
    /// millisecond).
    pub created_at: Option<DateTime<Utc>>,
    /// The id of the object the event is about, such as `trx-123` or `ch_123`.
    pub object: Option<String>,
    /// The event family the ordering guard keys by, beside the object (by default
    /// [`default_family`] of the type, such as `charge` for `charge.succeeded`).
    pub family: Option<String>,
}

impl EventMeta {
    /// Metadata with the given parts; the family is derived from the type.
    pub fn new(
        event_type: Option<String>,
        created_at: Option<DateTime<Utc>>,
        object: Option<String>,
    ) -> Self {
        let family = event_type.as_deref().map(default_family);
        Self {
            event_type,
            created_at,
            object,
            family,
        }
    }
}

/// The family of an event type: everything before its last `.` (Stripe style,
/// `charge.refund.updated` → `charge.refund`); for `SCREAMING_SNAKE` types with an
/// `EVENT_TYPE_` prefix (Jamm style), the word after the prefix
/// (`EVENT_TYPE_CHARGE_SUCCESS` → `CHARGE`); otherwise the whole type.
pub fn default_family(event_type: &str) -> String {
    if let Some((family, _)) = event_type.rsplit_once('.') {
        return family.to_owned();
    }
    if let Some(rest) = event_type.strip_prefix("EVENT_TYPE_") {
        return rest.split('_').next().unwrap_or(rest).to_owned();
    }
    event_type.to_owned()
}

/// Parses a `created_at` value: Unix seconds, Unix milliseconds (13+ digits), or an
/// RFC 3339 timestamp. Times outside the years 1 to 9999 are refused (numeric ones
/// past 9999, and RFC 3339 ones an offset carries past either end): one such time
/// would make the ordering guard treat every later event of its object as stale.
pub fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let n: i64 = text.parse().ok()?;
        let t = if text.len() >= 13 {
            DateTime::from_timestamp_millis(n)
        } else {
            DateTime::from_timestamp(n, 0)
        };
        return t.filter(|t| t.year() <= 9999);
    }
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
        .filter(|t| (1..=9999).contains(&t.year()))
}

/// A function reading metadata from a raw body.
pub type MetaFn = dyn Fn(&[u8]) -> EventMeta + Send + Sync;

/// Where to find an event's metadata in its JSON body.
///
/// ```
/// use webhook_guard::meta::MetaExtractor;
///
/// let stripe = MetaExtractor::json(&["type"], &["created"], &["data", "object", "id"]);
/// let meta = stripe.extract(br#"{"id":"evt_1","type":"charge.succeeded","created":1700000000,
///     "data":{"object":{"id":"ch_9"}}}"#);
/// assert_eq!(meta.object.as_deref(), Some("ch_9"));
/// assert_eq!(meta.family.as_deref(), Some("charge"));
/// assert_eq!(meta.created_at.unwrap().timestamp(), 1_700_000_000);
/// ```
#[derive(Clone)]
pub struct MetaExtractor(Arc<MetaFn>);

impl MetaExtractor {
    /// Reads the type, creation time and object id from JSON paths.
    pub fn json(event_type: &[&str], created_at: &[&str], object: &[&str]) -> Self {
        let paths: [Vec<String>; 3] =
            [event_type, created_at, object].map(|p| p.iter().map(|s| (*s).to_owned()).collect());
        Self(Arc::new(move |body: &[u8]| {
            // One pass for the three paths: each answer is `json::field(body, path).ok()`.
            let all = [&paths[0][..], &paths[1][..], &paths[2][..]];
            json::fields_with(body, all, |[event_type, created_at, object]| {
                // An empty path reads nothing.
                let read = |i: usize| !paths[i].is_empty();
                EventMeta::new(
                    event_type.filter(|_| read(0)).map(str::to_owned),
                    created_at.filter(|_| read(1)).and_then(parse_time),
                    object.filter(|_| read(2)).map(str::to_owned),
                )
            })
        }))
    }

    /// Stripe events: `type`, `created` (Unix seconds) and `data.object.id`; the family
    /// is the type before its last dot (`charge.refunded` → `charge`).
    pub fn stripe() -> Self {
        Self::json(&["type"], &["created"], &["data", "object", "id"])
    }

    /// Jamm events: `event_type`, `created_at`, and the target object inside
    /// `content`: the first `trx-…` id for charge and refund events (both move one
    /// charge, so both are in family `charge`), the first `cus-…` id for customer and
    /// contract events (family `customer`). Ids are found by their documented prefix,
    /// up to four levels deep in `content`: the shallowest first and, at one depth,
    /// the first the body writes; only under a key that names an id (`id`, one
    /// ending in `_id`, or `charge`, `refund`, `customer`, `contract`), so that a
    /// free-text field (a memo a payer wrote `trx-…` into) never picks the object.
    pub fn jamm() -> Self {
        Self::custom(|body: &[u8]| {
            let field = |path: &[&str]| json::field(body, path).ok();
            let event_type = field(&["event_type"]);
            let created_at = field(&["created_at"]).as_deref().and_then(parse_time);
            let kind = event_type.as_deref().map(default_family);
            let (prefix, family) = match kind.as_deref() {
                Some("CHARGE" | "REFUND") => ("trx-", "charge"),
                Some("CUSTOMER" | "CONTRACT") => ("cus-", "customer"),
                _ => ("", ""),
            };
            let object = (!prefix.is_empty())
                .then(|| jamm_object(body, prefix))
                .flatten();
            let mut meta = EventMeta::new(event_type, created_at, object);
            if !family.is_empty() {
                meta.family = Some(family.to_owned());
            }
            meta
        })
    }

    /// Any function of the body. The guard calls it once a delivery has claimed its
    /// id, when it has an ordering store or a reconciler to use the answer; if it
    /// panics there, the delivery fails as it would had its handler
    /// panicked (retryable, the claim released). [`WebhookGuard::verify`] and
    /// [`WebhookGuard::accept`] call it before touching the store, and let a panic
    /// through.
    ///
    /// [`WebhookGuard::verify`]: crate::WebhookGuard::verify
    /// [`WebhookGuard::accept`]: crate::WebhookGuard::accept
    pub fn custom(f: impl Fn(&[u8]) -> EventMeta + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Reads nothing.
    pub fn none() -> Self {
        Self::custom(|_| EventMeta::default())
    }

    /// Reads the metadata of `body`. Missing or unreadable fields are `None`.
    ///
    /// `created_at` comes out in whole milliseconds (finer digits dropped), the
    /// precision every durable store keeps, so that the ordering guard compares two
    /// events the same way on every store. A NUL in a text field (a JSON
    /// `"\u0000"`) comes out as U+FFFD, which every store can keep.
    pub fn extract(&self, body: &[u8]) -> EventMeta {
        let mut meta = (self.0)(body);
        meta.created_at = meta.created_at.map(whole_millis);
        // A signed `"\u0000"` is valid JSON; a store must still be able to keep it.
        for text in [&mut meta.event_type, &mut meta.object, &mut meta.family]
            .into_iter()
            .flatten()
        {
            if let std::borrow::Cow::Owned(clean) = crate::without_nul(text) {
                *text = clean;
            }
        }
        meta
    }
}

/// `t` without its digits below the millisecond, and a leap second (`…:59:60.5`)
/// as the instant a millisecond count names (the next second's `.5`): what every
/// durable store keeps, so every store compares the same times.
fn whole_millis(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
}

impl Default for MetaExtractor {
    fn default() -> Self {
        Self::none()
    }
}

impl fmt::Debug for MetaExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MetaExtractor(..)")
    }
}

/// The first string starting with `prefix` inside the body's `content`, breadth
/// first, in the order the body writes its fields (whatever order a
/// `serde_json::Map` would keep them in: that depends on a cargo feature of
/// serde_json that any crate in a build may turn on).
fn jamm_object(body: &[u8], prefix: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        content: Node,
    }
    let envelope: Envelope = serde_json::from_slice(body).ok()?;
    let mut level = vec![envelope.content];
    for _ in 0..4 {
        let mut next = Vec::new();
        for node in level {
            match node {
                Node::Text(s) if s.starts_with(prefix) => return Some(s),
                Node::Nested(items) | Node::List(items) => next.extend(items),
                _ => {}
            }
        }
        level = next;
    }
    None
}

/// A JSON value as [`jamm_object`] walks it: a string, the values of an object or
/// array in document order, or anything else.
enum Node {
    Text(String),
    /// An object's values; a text value only under a key that names an id.
    Nested(Vec<Node>),
    /// An array's items.
    List(Vec<Node>),
    Other,
}

/// Whether a key of a Jamm `content` object names an id, so that its text value
/// may be the event's object.
fn names_an_id(key: &str) -> bool {
    key == "id"
        || key.ends_with("_id")
        || matches!(key, "charge" | "refund" | "customer" | "contract")
}

impl Node {
    /// The value under a key that names no id: its text, and the text items of an
    /// array, count for nothing (objects inside are walked, their own keys decide).
    fn under_plain_key(self) -> Self {
        match self {
            Node::Text(_) => Node::Other,
            Node::List(items) => Node::List(
                items
                    .into_iter()
                    .map(|item| match item {
                        Node::Text(_) => Node::Other,
                        other => other,
                    })
                    .collect(),
            ),
            other => other,
        }
    }
}

impl<'de> serde::Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, s: &str) -> Result<Node, E> {
                Ok(Node::Text(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<Node, E> {
                Ok(Node::Text(s))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Other)
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Other)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::List(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some((key, value)) =
                    map.next_entry::<std::borrow::Cow<'de, str>, Node>()?
                {
                    items.push(if names_an_id(&key) {
                        value
                    } else {
                        value.under_plain_key()
                    });
                }
                Ok(Node::Nested(items))
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `trx-…` a payer wrote into a free-text field is not the object: only a key
    /// that names an id counts.
    #[test]
    fn a_jamm_object_is_never_read_from_free_text() {
        let memo = MetaExtractor::jamm().extract(
            br#"{"event_type":"EVENT_TYPE_CHARGE_SUCCESS","content":{"memo":"trx-victim","charge":{"memo":"trx-victim","notes":["trx-victim"],"id":"trx-1"}}}"#,
        );
        assert_eq!(memo.object.as_deref(), Some("trx-1"));
        let named = MetaExtractor::jamm().extract(
            br#"{"event_type":"EVENT_TYPE_CUSTOMER_ACTIVATED","content":{"customer":"cus-7"}}"#,
        );
        assert_eq!(named.object.as_deref(), Some("cus-7"));
    }

    /// A leap second comes out as the instant a millisecond count names, and an
    /// offset cannot carry a time past the year 9999 or before the year 1.
    #[test]
    fn odd_times_come_out_as_every_store_keeps_them() {
        let extractor = MetaExtractor::json(&["type"], &["at"], &["id"]);
        let at = |text: &str| {
            let body = format!(r#"{{"type":"a.b","id":"o_1","at":"{text}"}}"#);
            extractor.extract(body.as_bytes()).created_at
        };
        let leap = at("2016-12-31T23:59:60.500Z").unwrap();
        assert_eq!(
            DateTime::from_timestamp_millis(leap.timestamp_millis()),
            Some(leap)
        );
        assert_eq!(leap, at("2017-01-01T00:00:00.500Z").unwrap());
        assert!(parse_time("9999-12-31T23:59:59-01:00").is_none());
        assert!(parse_time("0000-01-01T00:00:00+01:00").is_none());
        assert!(parse_time("9999-12-31T23:59:59Z").is_some());
    }

    #[test]
    fn families_follow_provider_conventions() {
        assert_eq!(default_family("charge.succeeded"), "charge");
        assert_eq!(
            default_family("customer.subscription.updated"),
            "customer.subscription"
        );
        assert_eq!(default_family("EVENT_TYPE_CHARGE_SUCCESS"), "CHARGE");
        assert_eq!(default_family("EVENT_TYPE_REFUND_SUCCEEDED"), "REFUND");
        assert_eq!(default_family("ping"), "ping");
    }

    #[test]
    fn created_at_is_kept_to_the_millisecond() {
        let extractor = MetaExtractor::json(&["type"], &["occurred_at"], &["id"]);
        let at = |text: &str| {
            let body = format!(r#"{{"type":"a.b","id":"o_1","occurred_at":"{text}"}}"#);
            extractor.extract(body.as_bytes()).created_at.unwrap()
        };
        // Paddle-style microseconds: both fall in one millisecond, as a durable
        // store sees them.
        let later = at("2026-01-01T10:18:49.621900Z");
        let earlier = at("2026-01-01T10:18:49.621100Z");
        assert_eq!(later, earlier);
        assert_eq!(later.timestamp_subsec_nanos(), 621_000_000);
        assert_eq!(at("2026-01-01T10:18:49Z").timestamp_subsec_nanos(), 0);
    }

    #[test]
    fn times_parse_in_three_forms() {
        assert_eq!(parse_time("1700000000").unwrap().timestamp(), 1_700_000_000);
        assert_eq!(
            parse_time("1700000000123").unwrap().timestamp_millis(),
            1_700_000_000_123
        );
        assert_eq!(
            parse_time("2026-01-02T03:04:05+09:00").unwrap().timestamp(),
            parse_time("2026-01-01T18:04:05Z").unwrap().timestamp()
        );
        assert!(parse_time("yesterday").is_none());
        assert!(parse_time("").is_none());
        assert!(parse_time("99999999999999999999999").is_none());
    }

    #[test]
    fn presets_find_the_target_object() {
        let stripe = MetaExtractor::stripe().extract(
            br#"{"id":"evt_1","type":"charge.refunded","created":1700000000,"data":{"object":{"id":"ch_1","customer":"cus_9"}}}"#,
        );
        assert_eq!(stripe.object.as_deref(), Some("ch_1"));
        assert_eq!(stripe.family.as_deref(), Some("charge"));
        let jamm = MetaExtractor::jamm();
        let refund = jamm.extract(
            br#"{"id":"mwh-1","event_type":"EVENT_TYPE_REFUND_SUCCEEDED","created_at":"2026-01-01T00:00:00Z","content":{"customer":"cus-7","refund":{"charge_id":"trx-42","amount":100}}}"#,
        );
        assert_eq!(refund.object.as_deref(), Some("trx-42"));
        assert_eq!(refund.family.as_deref(), Some("charge"));
        let customer = jamm.extract(
            br#"{"id":"mwh-2","event_type":"EVENT_TYPE_CUSTOMER_ACTIVATED","created_at":"2026-01-01T00:00:00Z","content":{"customer":{"id":"cus-7","activated":true}}}"#,
        );
        assert_eq!(customer.object.as_deref(), Some("cus-7"));
        assert_eq!(customer.family.as_deref(), Some("customer"));
        assert!(jamm.extract(b"{}").object.is_none());
        // Two ids at one depth: the first the body writes (not the first by name).
        let both = jamm.extract(
            br#"{"event_type":"EVENT_TYPE_REFUND_SUCCEEDED","content":{"refund":{"charge_id":"trx-1"},"charge":{"id":"trx-2"},"n":[1,{"x":null}]}}"#,
        );
        assert_eq!(both.object.as_deref(), Some("trx-1"));
        // Shallower first: the nested id loses to one at the top of `content`.
        let shallow = jamm.extract(
            br#"{"event_type":"EVENT_TYPE_CHARGE_SUCCESS","content":{"a":{"id":"trx-deep"},"id":"trx-top"}}"#,
        );
        assert_eq!(shallow.object.as_deref(), Some("trx-top"));
    }

    #[test]
    fn jamm_style_nested_content_is_read() {
        let jamm = MetaExtractor::json(
            &["event_type"],
            &["created_at"],
            &["content", "charge", "id"],
        );
        let meta = jamm.extract(
            br#"{"id":"mwh-1","event_type":"EVENT_TYPE_CHARGE_SUCCESS","created_at":"2026-01-01T00:00:00Z","content":{"charge":{"id":"trx-9"}}}"#,
        );
        assert_eq!(meta.object.as_deref(), Some("trx-9"));
        assert_eq!(meta.family.as_deref(), Some("CHARGE"));
        assert!(jamm.extract(b"not json").object.is_none());
    }
}
