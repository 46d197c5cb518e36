//! The console's read-only routes (overview, list, record), and what every route
//! shares: content negotiation, answers as HTML (views.rs) or JSON, problems. The
//! state-changing ones are in actions.rs.

use std::sync::Arc;

use axum::extract::{FromRequestParts, OriginalUri, Query, State};
use axum::http::header::{ACCEPT, CONTENT_TYPE, LOCATION};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeDelta, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::auth::{csrf_token, Operator};
use super::source::{Count, EscalationMark, Filter, Row, Source, SourceError, StateFilter};
use super::{views, Shared, AUDIT_TARGET};
use crate::inbox::InboxEvent;
use crate::store::{Fingerprint, Record, RecordState};

/// How many ids one requeue by filter takes at most.
pub(super) const REQUEUE_MAX: usize = 1000;
/// How many escalated records the count of open ones reads at most.
pub(super) const COUNT_CAP: usize = 1000;
/// Where the count of open escalations stops: it reads each escalated record's
/// marker (one `get` each).
pub(super) const OPEN_ESCALATIONS_CAP: usize = 200;

pub(super) type Shared_ = State<Arc<Shared>>;

/// `?format=`, which with the `Accept` header says whether to answer JSON.
#[derive(Debug, Default, Deserialize)]
struct Format {
    format: Option<String>,
}

/// What a page's handler starts from: the console's state, the operator asking,
/// the query string read as `Q`, and whether to answer JSON ([`wants_json`] of
/// `?format=` and the `Accept` header).
pub(super) struct Asked<Q> {
    pub(super) shared: Arc<Shared>,
    pub(super) operator: Operator,
    pub(super) query: Q,
    pub(super) json: bool,
}

/// The query of a page that reads nothing from it but `format`.
#[derive(Debug, Deserialize)]
pub(super) struct NoQuery {}

impl<Q> FromRequestParts<Arc<Shared>> for Asked<Q>
where
    Q: DeserializeOwned + Send,
{
    /// The refusal of the extractor that failed: no [`Operator`] (500), a query
    /// string that does not read as `Q` (400).
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        shared: &Arc<Shared>,
    ) -> Result<Self, Self::Rejection> {
        let Extension(operator) = Extension::<Operator>::from_request_parts(parts, shared)
            .await
            .map_err(IntoResponse::into_response)?;
        let Query(query) = Query::<Q>::from_request_parts(parts, shared)
            .await
            .map_err(IntoResponse::into_response)?;
        let Query(Format { format }) = Query::<Format>::from_request_parts(parts, shared)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self {
            shared: Arc::clone(shared),
            operator,
            query,
            json: wants_json(format.as_deref(), &parts.headers),
        })
    }
}

pub(super) fn wants_json(format: Option<&str>, headers: &HeaderMap) -> bool {
    match format {
        Some("json") => return true,
        Some("html") => return false,
        _ => {}
    }
    let accept = headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    accept.contains("application/json") && !accept.contains("text/html")
}

/// The answer: `data` as JSON, or the page `html` renders.
pub(super) fn answer<T: Serialize>(
    json: bool,
    status: StatusCode,
    data: &T,
    html: impl FnOnce(&T) -> maud::Markup,
) -> Response {
    let (body, kind) = if json {
        (
            serde_json::to_string_pretty(data).unwrap_or_else(|_| "{}".to_owned()),
            "application/json",
        )
    } else {
        (html(data).into_string(), "text/html; charset=utf-8")
    };
    let mut response = (status, body).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    response
}

/// An error as a page or as `{"error": ...}`.
#[derive(Debug, Serialize)]
pub(super) struct Problem {
    pub(super) error: String,
    #[serde(skip)]
    pub(super) status: StatusCode,
}

impl Problem {
    pub(super) fn new(status: StatusCode, error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            status,
        }
    }

    pub(super) fn respond(self, json: bool) -> Response {
        answer(json, self.status, &self, views::problem)
    }
}

impl From<SourceError> for Problem {
    fn from(e: SourceError) -> Self {
        match e {
            SourceError::Unsupported(what) => Self::new(StatusCode::NOT_IMPLEMENTED, what),
            SourceError::BadInput(what) => Self::new(StatusCode::BAD_REQUEST, what),
            SourceError::Refused(what) => Self::new(StatusCode::CONFLICT, what),
            SourceError::Store(e) => {
                tracing::warn!(target: AUDIT_TARGET, error = %e, "console: store error");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the store failed: {e}"),
                )
            }
        }
    }
}

/// The mount point redirects to `overview`, relative to where it was reached.
pub(super) async fn root(OriginalUri(uri): OriginalUri) -> Response {
    let path = uri.path();
    let location = if path.ends_with('/') {
        "overview".to_owned()
    } else {
        // `/admin/webhooks` resolves `overview` against `/admin/`.
        let last = path.rsplit('/').next().unwrap_or_default();
        format!("{last}/overview")
    };
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(LOCATION, value);
    }
    response
}

pub(super) async fn style() -> Response {
    let mut response = views::STYLE.into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/css"));
    response
}

/// One state's count in one window.
#[derive(Debug, Serialize)]
pub(super) struct StateCount {
    pub(super) state: &'static str,
    pub(super) label: &'static str,
    #[serde(flatten)]
    pub(super) count: Count,
}

/// The counts of one window.
#[derive(Debug, Serialize)]
pub(super) struct Window {
    pub(super) label: &'static str,
    pub(super) since: DateTime<Utc>,
    pub(super) counts: Vec<StateCount>,
}

#[derive(Debug, Serialize)]
pub(super) struct OverviewData {
    pub(super) namespace: String,
    pub(super) now: DateTime<Utc>,
    pub(super) csrf_token: String,
    /// Why counts are missing, when the store does not list.
    pub(super) listing_unsupported: Option<String>,
    pub(super) windows: Vec<Window>,
    pub(super) stuck: Vec<Row>,
    pub(super) open_escalations: Option<Count>,
    /// The newest escalations not resolved (at most 10), with where each stands.
    pub(super) unresolved: Vec<Unresolved>,
    pub(super) dead_letters: Option<Count>,
    pub(super) has_inbox: bool,
}

/// The states an overview counts.
const COUNTED: [StateFilter; 6] = [
    StateFilter::Record(RecordState::Completed),
    StateFilter::Record(RecordState::Failed),
    StateFilter::Record(RecordState::Escalated),
    StateFilter::Record(RecordState::PermanentFailure),
    StateFilter::Record(RecordState::InProgress),
    StateFilter::Dead,
];

pub(super) async fn overview(
    Asked {
        shared,
        operator,
        json,
        ..
    }: Asked<NoQuery>,
) -> Response {
    match overview_data(&shared, &operator).await {
        Ok(data) => answer(json, StatusCode::OK, &data, views::overview),
        Err(problem) => problem.respond(json),
    }
}

async fn overview_data(shared: &Shared, operator: &Operator) -> Result<OverviewData, Problem> {
    let source = &*shared.source;
    let now = source.now();
    let mut unsupported = None;
    let mut windows = Vec::new();
    for (label, ago) in [
        ("last hour", TimeDelta::hours(1)),
        ("last day", TimeDelta::days(1)),
    ] {
        let since = now - ago;
        let mut counts = Vec::new();
        for state in COUNTED {
            if state.is_inbox() && !source.has_inbox() {
                continue;
            }
            let filter = Filter {
                state: Some(state),
                since: Some(since),
                ..Filter::default()
            };
            match source.count(&filter).await {
                Ok(count) => counts.push(StateCount {
                    state: state.as_str(),
                    label: state.label(),
                    count,
                }),
                Err(SourceError::Unsupported(why)) => unsupported = Some(why.to_owned()),
                Err(e) => return Err(e.into()),
            }
        }
        windows.push(Window {
            label,
            since,
            counts,
        });
    }
    let stuck = source
        .stuck(20)
        .await?
        .iter()
        .map(|r| Row::of_record(r, now))
        .collect();
    let (open_escalations, unresolved) = match open_escalations(source).await {
        Ok((count, rows)) => (Some(count), rows),
        Err(SourceError::Unsupported(_)) => (None, Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let dead_letters = if source.has_inbox() {
        let filter = Filter {
            state: Some(StateFilter::Dead),
            ..Filter::default()
        };
        optional(source.count(&filter).await)?
    } else {
        None
    };
    Ok(OverviewData {
        namespace: source.namespace().to_owned(),
        now,
        csrf_token: csrf_token(&shared.csrf_key, operator),
        listing_unsupported: unsupported,
        windows,
        stuck,
        open_escalations,
        unresolved,
        dead_letters,
        has_inbox: source.has_inbox(),
    })
}

/// `Ok(None)` for what the store does not support.
fn optional<T>(result: Result<T, SourceError>) -> Result<Option<T>, Problem> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(SourceError::Unsupported(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// An escalation not resolved yet, as the overview lists it.
#[derive(Debug, Serialize)]
pub(super) struct Unresolved {
    pub(super) id: String,
    pub(super) status: &'static str,
    pub(super) escalated_at: DateTime<Utc>,
}

/// Escalated records not yet resolved: how many (at least `n` when `more`: it
/// stops at [`OPEN_ESCALATIONS_CAP`] unresolved ones, or after reading
/// [`COUNT_CAP`] escalated records), and the newest ten.
async fn open_escalations(source: &dyn Source) -> Result<(Count, Vec<Unresolved>), SourceError> {
    let filter = Filter {
        state: Some(StateFilter::Record(RecordState::Escalated)),
        ..Filter::default()
    };
    let (mut n, mut read) = (0, 0);
    let mut newest = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = source.page(&filter, cursor.as_deref(), 100).await?;
        for row in &page.rows {
            let mark = source.escalation(&row.id).await?;
            if let Some(mark) = mark.filter(|mark| mark.state != "resolved") {
                n += 1;
                if newest.len() < 10 {
                    newest.push(Unresolved {
                        id: row.id.clone(),
                        status: mark.state,
                        escalated_at: row.updated_at,
                    });
                }
            }
            read += 1;
            if n >= OPEN_ESCALATIONS_CAP || read >= COUNT_CAP {
                return Ok((Count { n, more: true }, newest));
            }
        }
        match page.next {
            Some(next) if !page.rows.is_empty() => cursor = Some(next),
            _ => return Ok((Count { n, more: false }, newest)),
        }
    }
}

/// A list's query string.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    state: Option<String>,
    since: Option<String>,
    until: Option<String>,
    prefix: Option<String>,
    after: Option<String>,
}

/// A filter as a form shows it back.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct FilterForm {
    pub(super) state: String,
    pub(super) since: String,
    pub(super) until: String,
    pub(super) prefix: String,
}

impl FilterForm {
    /// The filter's query string (without the leading `?`).
    pub(super) fn query(&self) -> String {
        views::query(&[
            ("state", &self.state),
            ("since", &self.since),
            ("until", &self.until),
            ("prefix", &self.prefix),
        ])
    }

    pub(super) fn parse(&self, now: DateTime<Utc>) -> Result<Filter, Problem> {
        let state = match self.state.as_str() {
            "" | "all" => None,
            text => Some(StateFilter::parse(text).ok_or_else(|| {
                Problem::new(StatusCode::BAD_REQUEST, format!("unknown state {text:?}"))
            })?),
        };
        Ok(Filter {
            state,
            since: parse_time(&self.since, now)?,
            until: parse_time(&self.until, now)?,
            prefix: self.prefix.clone(),
        })
    }
}

pub(super) fn text(value: Option<String>) -> String {
    value.map(|v| v.trim().to_owned()).unwrap_or_default()
}

/// A time in a filter: `15m`, `2h`, `7d` (that long ago), RFC 3339, or
/// `YYYY-MM-DDTHH:MM[:SS]` / `YYYY-MM-DD` in UTC.
pub(super) fn parse_time(text: &str, now: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, Problem> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let bad = || {
        Problem::new(
            StatusCode::BAD_REQUEST,
            format!("time {text:?}: use 15m, 2h, 7d, RFC 3339 or YYYY-MM-DD[THH:MM[:SS]] (UTC)"),
        )
    };
    if let Some(unit) = text.chars().last().filter(|c| "smhd".contains(*c)) {
        if let Ok(n) = text[..text.len() - 1].parse::<i64>() {
            let ago = match unit {
                's' => TimeDelta::try_seconds(n),
                'm' => TimeDelta::try_minutes(n),
                'h' => TimeDelta::try_hours(n),
                _ => TimeDelta::try_days(n),
            };
            return ago
                .and_then(|ago| now.checked_sub_signed(ago))
                .map(Some)
                .ok_or_else(bad);
        }
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    for format in ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(text, format) {
            return Ok(Some(t.and_utc()));
        }
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| Some(t.and_utc()))
        .ok_or_else(bad)
}

#[derive(Debug, Serialize)]
pub(super) struct ListData {
    pub(super) namespace: String,
    pub(super) filter: FilterForm,
    pub(super) rows: Vec<Row>,
    /// The cursor of the next page.
    pub(super) next: Option<String>,
    pub(super) csrf_token: String,
    pub(super) has_inbox: bool,
    /// Why there are no rows, when the store does not list.
    pub(super) unsupported: Option<String>,
}

pub(super) async fn records(
    Asked {
        shared,
        operator,
        query,
        json,
    }: Asked<ListQuery>,
) -> Response {
    let form = FilterForm {
        state: text(query.state),
        since: text(query.since),
        until: text(query.until),
        prefix: query.prefix.unwrap_or_default(),
    };
    let source = &*shared.source;
    let filter = match form.parse(source.now()) {
        Ok(filter) => filter,
        Err(problem) => return problem.respond(json),
    };
    let mut data = ListData {
        namespace: source.namespace().to_owned(),
        filter: form,
        rows: Vec::new(),
        next: None,
        csrf_token: csrf_token(&shared.csrf_key, &operator),
        has_inbox: source.has_inbox(),
        unsupported: None,
    };
    let page = source
        .page(&filter, query.after.as_deref(), shared.page_size)
        .await;
    let status = match page {
        Ok(page) => {
            data.rows = page.rows;
            data.next = page.next;
            StatusCode::OK
        }
        Err(SourceError::Unsupported(why)) => {
            data.unsupported = Some(why.to_owned());
            StatusCode::NOT_IMPLEMENTED
        }
        Err(e) => return Problem::from(e).respond(json),
    };
    answer(json, status, &data, views::list)
}

#[derive(Debug, Deserialize)]
pub(super) struct IdQuery {
    id: Option<String>,
}

#[derive(Debug, Serialize)]
pub(super) struct Note {
    pub(super) at: DateTime<Utc>,
    pub(super) error: String,
}

#[derive(Debug, Serialize)]
pub(super) struct RecordFields {
    pub(super) state: &'static str,
    pub(super) stuck: bool,
    pub(super) attempts: u32,
    pub(super) failures: u32,
    pub(super) fingerprint: Option<String>,
    pub(super) lease_until: DateTime<Utc>,
    pub(super) expires_at: DateTime<Utc>,
    pub(super) created_at: DateTime<Utc>,
    pub(super) updated_at: DateTime<Utc>,
    pub(super) history: Vec<Note>,
}

impl RecordFields {
    fn of(record: &Record, now: DateTime<Utc>) -> Self {
        Self {
            state: record.state.as_str(),
            stuck: record.state == RecordState::InProgress && record.lease_until <= now,
            attempts: record.attempts,
            failures: record.failures,
            fingerprint: fingerprint(record.fingerprint),
            lease_until: record.lease_until,
            expires_at: record.expires_at,
            created_at: record.created_at,
            updated_at: record.updated_at,
            history: record
                .history
                .iter()
                .map(|n| Note {
                    at: n.at,
                    error: n.error.clone(),
                })
                .collect(),
        }
    }
}

fn fingerprint(fp: Fingerprint) -> Option<String> {
    (fp != Fingerprint::UNKNOWN).then(|| fp.to_hex())
}

/// A stored body as shown: pretty-printed JSON or text, cut at the limit.
#[derive(Debug, Serialize)]
pub(super) struct BodyView {
    pub(super) text: String,
    pub(super) json: bool,
    pub(super) bytes: usize,
    pub(super) cut: bool,
}

impl BodyView {
    pub(super) fn of(payload: &[u8], limit: usize) -> Self {
        let parsed = serde_json::from_slice::<serde_json::Value>(payload)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok());
        let json = parsed.is_some();
        let mut text = parsed.unwrap_or_else(|| String::from_utf8_lossy(payload).into_owned());
        let cut = text.len() > limit;
        if cut {
            let mut end = limit;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        Self {
            text,
            json,
            bytes: payload.len(),
            cut,
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct EventFields {
    pub(super) state: &'static str,
    pub(super) attempts: u32,
    pub(super) event_type: Option<String>,
    pub(super) object: Option<String>,
    pub(super) fingerprint: Option<String>,
    pub(super) received_at: DateTime<Utc>,
    pub(super) updated_at: DateTime<Utc>,
    pub(super) next_attempt_at: DateTime<Utc>,
    pub(super) lease_until: DateTime<Utc>,
    pub(super) expires_at: DateTime<Utc>,
    pub(super) last_error: Option<String>,
    /// `None` when the host hides bodies.
    pub(super) body: Option<BodyView>,
}

impl EventFields {
    fn of(event: &InboxEvent, bodies: Option<usize>) -> Self {
        let row = Row::of_event(event);
        Self {
            state: row.state,
            attempts: event.attempts,
            event_type: event.meta.event_type.clone(),
            object: event.meta.object.clone(),
            fingerprint: fingerprint(event.fingerprint),
            received_at: event.received_at,
            updated_at: event.updated_at,
            next_attempt_at: event.next_attempt_at,
            lease_until: event.lease_until,
            expires_at: event.expires_at,
            last_error: event.last_error.clone(),
            body: bodies.map(|limit| BodyView::of(&event.payload, limit)),
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct RecordData {
    pub(super) namespace: String,
    pub(super) id: String,
    pub(super) csrf_token: String,
    pub(super) record: Option<RecordFields>,
    pub(super) escalation: Option<EscalationMark>,
    pub(super) inbox: Option<EventFields>,
    pub(super) bodies_shown: bool,
}

pub(super) async fn record(
    Asked {
        shared,
        operator,
        query,
        json,
    }: Asked<IdQuery>,
) -> Response {
    let Some(id) = query.id.filter(|id| !id.is_empty()) else {
        return Problem::new(StatusCode::BAD_REQUEST, "no id given").respond(json);
    };
    match record_data(&shared, &operator, id).await {
        Ok(data) if data.record.is_none() && data.inbox.is_none() => {
            answer(json, StatusCode::NOT_FOUND, &data, views::record)
        }
        Ok(data) => answer(json, StatusCode::OK, &data, views::record),
        Err(problem) => problem.respond(json),
    }
}

async fn record_data(
    shared: &Shared,
    operator: &Operator,
    id: String,
) -> Result<RecordData, Problem> {
    let source = &*shared.source;
    let now = source.now();
    let record = source.record(&id).await?;
    let escalation = match &record {
        Some(r) if r.state == RecordState::Escalated => {
            optional(source.escalation(&id).await)?.flatten()
        }
        _ => None,
    };
    let event = source.event(&id).await?;
    let bodies = shared.show_bodies.then_some(shared.body_limit);
    Ok(RecordData {
        namespace: source.namespace().to_owned(),
        csrf_token: csrf_token(&shared.csrf_key, operator),
        record: record.as_ref().map(|r| RecordFields::of(r, now)),
        escalation,
        inbox: event.as_ref().map(|e| EventFields::of(e, bodies)),
        bodies_shown: shared.show_bodies,
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_every_documented_form() {
        let now = DateTime::parse_from_rfc3339("2026-12-05T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let at = |s: &str| parse_time(s, now).unwrap().unwrap().to_rfc3339();
        assert_eq!(at("2h"), "2026-12-05T10:00:00+00:00");
        assert_eq!(at("15m"), "2026-12-05T11:45:00+00:00");
        assert_eq!(at("1d"), "2026-12-04T12:00:00+00:00");
        assert_eq!(at("2026-12-01T08:30"), "2026-12-01T08:30:00+00:00");
        assert_eq!(at("2026-12-01"), "2026-12-01T00:00:00+00:00");
        assert_eq!(at("2026-12-01T08:30:00+01:00"), "2026-12-01T07:30:00+00:00");
        assert!(parse_time("", now).unwrap().is_none());
        assert!(parse_time("yesterday", now).is_err());
        assert!(parse_time("99999999999999d", now).is_err());
    }

    #[test]
    fn json_is_asked_for_by_format_or_accept() {
        let mut headers = HeaderMap::new();
        assert!(!wants_json(None, &headers));
        assert!(wants_json(Some("json"), &headers));
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        assert!(wants_json(None, &headers));
        assert!(!wants_json(Some("html"), &headers));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("text/html,application/json;q=0.9"),
        );
        assert!(!wants_json(None, &headers));
    }

    #[test]
    fn bodies_are_pretty_printed_and_cut_on_a_character() {
        let body = BodyView::of(br#"{"id":"evt_1","n":[1,2]}"#, 1000);
        assert!(body.json && !body.cut);
        assert!(body.text.contains("\n  \"id\": \"evt_1\""));
        let body = BodyView::of("ééééé".as_bytes(), 3);
        assert!(!body.json && body.cut);
        assert_eq!(body.text, "é");
        assert_eq!(body.bytes, 10);
    }
}
