//! Where a delivery's event type is ([`TypeSource`]) and the type found there
//! ([`EventType`]): what [`route::Router`](crate::route::Router) dispatches on.

use std::borrow::Cow;
use std::fmt;

use smallvec::SmallVec;

use crate::json;
use crate::Headers;

/// The longest event type taken, in bytes: a longer one counts as absent.
pub const MAX_TYPE_LEN: usize = 255;

/// One place a type may be: a request header, or a string field of the JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    Header(Cow<'static, str>),
    Json(Vec<Cow<'static, str>>),
}

/// Where a delivery's event type is: the first present of one or more places
/// (request headers, string fields of the JSON body), and optionally an *action*
/// field of the body, appended after a dot (GitHub's `issues` + `opened` is
/// `issues.opened`).
///
/// Each preset knows its provider's ([`Verifier::event_type`]); set another with
/// [`WebhookGuardBuilder::event_type`]. A header is read when the delivery is
/// verified (the headers are gone by the time the handler runs), and kept with the
/// claim without allocating when it is at most 48 bytes; body fields are read when
/// [`Event::event_type`] is asked, borrowed from the body.
///
/// A value that is empty, longer than [`MAX_TYPE_LEN`] bytes or holds a control
/// character counts as absent, as does a field that is not a string.
///
/// ```
/// use webhook_guard::meta::TypeSource;
///
/// let github = TypeSource::header("X-GitHub-Event").with_action(["action"]);
/// let body = br#"{"action":"opened","issue":{"number":1}}"#;
/// let found = github.find(&[("X-GitHub-Event", "issues")], body).unwrap();
/// assert_eq!(found, "issues.opened");
/// assert_eq!(found.name(), "issues");
/// assert_eq!(found.action(), Some("opened"));
///
/// let slack = TypeSource::json(["event", "type"]).or_json(["type"]);
/// let challenge = br#"{"type":"url_verification","challenge":"c"}"#;
/// let no_headers = http::HeaderMap::new();
/// assert_eq!(slack.find(&no_headers, challenge).unwrap(), "url_verification");
/// ```
///
/// [`Verifier::event_type`]: crate::verify::Verifier::event_type
/// [`WebhookGuardBuilder::event_type`]: crate::WebhookGuardBuilder::event_type
/// [`Event::event_type`]: crate::Event::event_type
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeSource {
    name: Vec<Place>,
    action: Option<Vec<Cow<'static, str>>>,
}

fn path<S: Into<Cow<'static, str>>>(path: impl IntoIterator<Item = S>) -> Vec<Cow<'static, str>> {
    path.into_iter().map(Into::into).collect()
}

impl TypeSource {
    /// Most places a source's name is looked for in.
    pub const MAX_PLACES: usize = json::MAX_STRINGS - 1;

    /// The type is the string at `path` in the JSON body, such as `["type"]`.
    pub fn json<S: Into<Cow<'static, str>>>(path_keys: impl IntoIterator<Item = S>) -> Self {
        Self {
            name: vec![Place::Json(path(path_keys))],
            action: None,
        }
    }

    /// The type is the value of header `name`, such as `X-Shopify-Topic`.
    pub fn header(name: impl Into<Cow<'static, str>>) -> Self {
        Self {
            name: vec![Place::Header(name.into())],
            action: None,
        }
    }

    /// Where the places given so far are all absent, the string at `path` in the
    /// JSON body.
    ///
    /// # Panics
    /// When the source already has [`TypeSource::MAX_PLACES`] places.
    pub fn or_json<S: Into<Cow<'static, str>>>(
        self,
        path_keys: impl IntoIterator<Item = S>,
    ) -> Self {
        self.or(Place::Json(path(path_keys)))
    }

    /// Where the places given so far are all absent, the value of header `name`.
    ///
    /// # Panics
    /// When the source already has [`TypeSource::MAX_PLACES`] places.
    pub fn or_header(self, name: impl Into<Cow<'static, str>>) -> Self {
        self.or(Place::Header(name.into()))
    }

    fn or(mut self, place: Place) -> Self {
        assert!(
            self.name.len() < Self::MAX_PLACES,
            "a TypeSource holds at most {} places",
            Self::MAX_PLACES
        );
        self.name.push(place);
        self
    }

    /// The string at `path` in the JSON body, when present, is appended to the
    /// type after a dot: `issues` and `opened` make `issues.opened`.
    pub fn with_action<S: Into<Cow<'static, str>>>(
        mut self,
        path_keys: impl IntoIterator<Item = S>,
    ) -> Self {
        self.action = Some(path(path_keys));
        self
    }

    /// Stripe: the body's `type` (`payment_intent.succeeded`).
    pub fn stripe() -> Self {
        Self::json(["type"])
    }

    /// Standard Webhooks: the body's `type` (`invoice.paid`), as the specification
    /// recommends for the payload.
    pub fn standard_webhooks() -> Self {
        Self::json(["type"])
    }

    /// GitHub: the `X-GitHub-Event` header and the body's `action` when it has one
    /// (`issues.opened`, `pull_request.closed`; `push`, `ping`).
    pub fn github() -> Self {
        Self::header("X-GitHub-Event").with_action(["action"])
    }

    /// Shopify: the `X-Shopify-Topic` header (`orders/create`), or `Shopify-Topic`.
    pub fn shopify() -> Self {
        Self::header("X-Shopify-Topic").or_header("Shopify-Topic")
    }

    /// Slack's Events API: the inner event's type (`event.type`, such as
    /// `app_mention`), else the envelope's (`url_verification`,
    /// `app_rate_limited`).
    pub fn slack() -> Self {
        Self::json(["event", "type"]).or_json(["type"])
    }

    /// Jamm: the body's `event_type` (`EVENT_TYPE_CHARGE_SUCCESS`).
    pub fn jamm() -> Self {
        Self::json(["event_type"])
    }

    /// Paddle Billing: the body's `event_type` (`transaction.completed`).
    pub fn paddle() -> Self {
        Self::json(["event_type"])
    }

    /// Linear: the body's `type` and `action` (`Issue.create`, `Comment.update`).
    pub fn linear() -> Self {
        Self::json(["type"]).with_action(["action"])
    }

    /// Whether any place is a header.
    pub(crate) fn reads_headers(&self) -> bool {
        self.name.iter().any(|p| matches!(p, Place::Header(_)))
    }

    /// The first header place present in `headers`, kept for the claim.
    pub(crate) fn capture(&self, headers: &dyn Headers) -> Option<TypeHeader> {
        self.name
            .iter()
            .enumerate()
            .find_map(|(i, place)| match place {
                Place::Header(name) => headers
                    .get_str(name)
                    .map(str::trim)
                    .filter(|v| plausible(v))
                    .map(|v| TypeHeader {
                        place: i,
                        text: SmallVec::from_slice(v.as_bytes()),
                    }),
                Place::Json(_) => None,
            })
    }

    /// The type of a delivery whose header places were captured as `captured`.
    pub(crate) fn read<'a>(
        &self,
        captured: Option<&'a TypeHeader>,
        body: &'a [u8],
    ) -> Option<EventType<'a>> {
        self.read_with(
            |i| captured.filter(|c| c.place == i).and_then(TypeHeader::text),
            body,
        )
    }

    /// The type of the delivery made of `headers` and `body`, for a flow of your
    /// own (the guard's handlers ask [`Event::event_type`](crate::Event::event_type)).
    pub fn find<'a>(&self, headers: &'a dyn Headers, body: &'a [u8]) -> Option<EventType<'a>> {
        self.read_with(
            |i| match &self.name[i] {
                Place::Header(name) => headers.get_str(name).map(str::trim),
                Place::Json(_) => None,
            },
            body,
        )
    }

    /// The type, with the value of the header place at index `i` given by `header`.
    fn read_with<'a>(
        &self,
        header: impl Fn(usize) -> Option<&'a str>,
        body: &'a [u8],
    ) -> Option<EventType<'a>> {
        let mut paths: [&[Cow<'static, str>]; json::MAX_STRINGS] = [&[]; json::MAX_STRINGS];
        let mut count = 0;
        for place in &self.name {
            if let Place::Json(p) = place {
                paths[count] = p;
                count += 1;
            }
        }
        let action_at = self.action.as_ref().map(|p| {
            paths[count] = p;
            count += 1;
            count - 1
        });
        let mut strings = if count == 0 {
            None
        } else {
            json::strings(body, &paths[..count])
        };
        let mut take = |i: usize| -> Option<Cow<'a, str>> {
            strings.as_mut()?[i].take().filter(|v| plausible(v))
        };
        let mut json_index = 0;
        let mut name = None;
        for (i, place) in self.name.iter().enumerate() {
            let found = match place {
                Place::Header(_) => header(i).filter(|v| plausible(v)).map(Cow::Borrowed),
                Place::Json(_) => {
                    json_index += 1;
                    take(json_index - 1)
                }
            };
            if found.is_some() {
                name = found;
                break;
            }
        }
        let name = name?;
        let action = action_at.and_then(take);
        Some(EventType { name, action })
    }
}

/// Whether `value` may be an event type: not empty, at most [`MAX_TYPE_LEN`] bytes,
/// no control character.
fn plausible(value: &str) -> bool {
    !value.is_empty() && value.len() <= MAX_TYPE_LEN && !value.chars().any(char::is_control)
}

/// The value of a header place, kept with a claim: inline up to 48 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TypeHeader {
    place: usize,
    text: SmallVec<[u8; 48]>,
}

impl TypeHeader {
    fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.text).ok()
    }
}

/// An event's type, as its provider gives it: a name, and an action where the
/// provider splits them (GitHub's `issues` + `opened`, Linear's `Issue` +
/// `create`). It compares equal to the text `name.action` (or `name` alone
/// without an action), without building it:
///
/// ```
/// use webhook_guard::meta::TypeSource;
///
/// let body = br#"{"type":"Issue","action":"create"}"#;
/// let no_headers = http::HeaderMap::new();
/// let found = TypeSource::linear().find(&no_headers, body).unwrap();
/// assert_eq!(found, "Issue.create");
/// assert_ne!(found, "Issue");
/// assert_eq!(found.to_string(), "Issue.create");
/// ```
///
/// Both parts are borrowed from the delivery where they need no unescaping. Its
/// `Debug` escapes them; its `Display` writes them as they are.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EventType<'a> {
    name: Cow<'a, str>,
    action: Option<Cow<'a, str>>,
}

impl<'a> EventType<'a> {
    /// A type made of `name` and, when given, `action`.
    pub fn new(name: impl Into<Cow<'a, str>>, action: Option<Cow<'a, str>>) -> Self {
        Self {
            name: name.into(),
            action,
        }
    }

    /// The name: the whole type for a provider that does not split it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The action, for a provider that gives one apart.
    pub fn action(&self) -> Option<&str> {
        self.action.as_deref()
    }

    /// Whether the type is `text` (`name.action`, or `name` without an action).
    pub fn is(&self, text: &str) -> bool {
        match &self.action {
            None => *self.name == *text,
            Some(action) => text
                .strip_prefix(&*self.name)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|rest| rest == action),
        }
    }

    /// The same type, owning its text.
    pub fn into_owned(self) -> EventType<'static> {
        EventType {
            name: Cow::Owned(self.name.into_owned()),
            action: self.action.map(|a| Cow::Owned(a.into_owned())),
        }
    }
}

impl PartialEq<str> for EventType<'_> {
    fn eq(&self, other: &str) -> bool {
        self.is(other)
    }
}

impl PartialEq<&str> for EventType<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.is(other)
    }
}

impl fmt::Display for EventType<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if let Some(action) = &self.action {
            write!(f, ".{action}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for EventType<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventType(\"{}", self.name.escape_debug())?;
        if let Some(action) = &self.action {
            write!(f, ".{}", action.escape_debug())?;
        }
        f.write_str("\")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_tried_in_order_and_odd_values_count_as_absent() {
        let shopify = TypeSource::shopify();
        let body = b"{}";
        assert_eq!(
            shopify
                .find(&[("Shopify-Topic", "orders/paid")], body)
                .unwrap(),
            "orders/paid"
        );
        let both = [
            ("X-Shopify-Topic", "orders/create"),
            ("Shopify-Topic", "orders/paid"),
        ];
        assert_eq!(shopify.find(&both, body).unwrap(), "orders/create");
        assert!(shopify.find(&[("X-Shopify-Topic", "")], body).is_none());
        let long = "a".repeat(MAX_TYPE_LEN + 1);
        assert!(shopify
            .find(&[("X-Shopify-Topic", long.as_str())], body)
            .is_none());
        let source = TypeSource::json(["type"]);
        assert!(source.find(&[("", "")], br#"{"type":"a\nb"}"#).is_none());
        assert!(source.find(&[("", "")], br#"{"type":{"a":1}}"#).is_none());
        assert!(source.find(&[("", "")], b"not json").is_none());
        // A header captured at verification reads the same as one found directly.
        let captured = shopify.capture(&both);
        assert_eq!(
            shopify.read(captured.as_ref(), body).unwrap(),
            "orders/create"
        );
        assert!(shopify.capture(&[("Other", "x")]).is_none());
    }

    #[test]
    fn a_github_type_without_an_action_is_its_name() {
        let github = TypeSource::github();
        let ping = github
            .find(&[("X-GitHub-Event", "ping")], br#"{"zen":"z"}"#)
            .unwrap();
        assert_eq!(ping, "ping");
        assert_eq!(ping.action(), None);
        let opened = github
            .find(&[("X-GitHub-Event", "issues")], br#"{"action":"opened"}"#)
            .unwrap();
        for other in [
            "issues",
            "issues.",
            "issues.opene",
            "issuesXopened",
            ".opened",
            "issues.openedx",
        ] {
            assert_ne!(opened, other);
        }
        assert_eq!(format!("{opened:?}"), r#"EventType("issues.opened")"#);
    }

    #[test]
    fn debug_escapes_what_display_writes_as_is() {
        let t = EventType::new("a\"b", Some(Cow::Borrowed("c\u{7f}")));
        assert_eq!(format!("{t:?}"), r#"EventType("a\"b.c\u{7f}")"#);
        assert_eq!(t.to_string(), "a\"b.c\u{7f}");
    }

    #[test]
    #[should_panic(expected = "at most 7 places")]
    fn too_many_places_are_refused() {
        let mut source = TypeSource::json(["a"]);
        for _ in 0..TypeSource::MAX_PLACES {
            source = source.or_json(["b"]);
        }
    }
}
