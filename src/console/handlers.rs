//! The console's routes: each reads or changes through [`Source`] and answers the
//! same data as HTML (views.rs) or JSON.

use std::sync::Arc;

use axum::extract::{OriginalUri, Query, State};
use axum::http::header::{ACCEPT, CONTENT_TYPE, LOCATION};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use super::auth::{csrf_ok, csrf_token, Operator};
use super::source::{Count, EscalationMark, Filter, Mark, Row, Source, SourceError, StateFilter};
use super::{views, Shared, AUDIT_TARGET};
use crate::inbox::InboxEvent;
use crate::store::{Deleted, Fingerprint, Record, RecordState};

/// How many ids one requeue by filter takes at most.
pub(super) const REQUEUE_MAX: usize = 1000;
/// How many escalated records the count of open ones reads at most.
pub(super) const COUNT_CAP: usize = 1000;
/// Where the count of open escalations stops: it reads each escalated record's
/// marker (one `get` each).
pub(super) const OPEN_ESCALATIONS_CAP: usize = 200;
/// How many ids a confirmation page names.
const CONFIRM_SHOWN: usize = 100;

type Shared_ = State<Arc<Shared>>;

/// `?format=` and the `Accept` header: whether to answer JSON.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Format {
    format: Option<String>,
}

fn wants_json(format: Option<&str>, headers: &HeaderMap) -> bool {
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
fn answer<T: Serialize>(
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
    fn new(status: StatusCode, error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            status,
        }
    }

    fn respond(self, json: bool) -> Response {
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
    State(shared): Shared_,
    Extension(operator): Extension<Operator>,
    Query(format): Query<Format>,
    headers: HeaderMap,
) -> Response {
    let json = wants_json(format.format.as_deref(), &headers);
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
    let open_escalations = optional(open_escalations(source).await)?;
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

/// Escalated records not yet resolved: at least `n` when `more` (it stops at
/// [`OPEN_ESCALATIONS_CAP`] open ones, or after reading [`COUNT_CAP`] escalated
/// records).
async fn open_escalations(source: &dyn Source) -> Result<Count, SourceError> {
    let filter = Filter {
        state: Some(StateFilter::Record(RecordState::Escalated)),
        ..Filter::default()
    };
    let (mut n, mut read) = (0, 0);
    let mut cursor: Option<String> = None;
    loop {
        let page = source.page(&filter, cursor.as_deref(), 100).await?;
        for row in &page.rows {
            let open = source
                .escalation(&row.id)
                .await?
                .is_some_and(|mark| mark.state != "resolved");
            n += usize::from(open);
            read += 1;
            if n >= OPEN_ESCALATIONS_CAP || read >= COUNT_CAP {
                return Ok(Count { n, more: true });
            }
        }
        match page.next {
            Some(next) if !page.rows.is_empty() => cursor = Some(next),
            _ => return Ok(Count { n, more: false }),
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
    format: Option<String>,
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

    fn parse(&self, now: DateTime<Utc>) -> Result<Filter, Problem> {
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

fn text(value: Option<String>) -> String {
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
    State(shared): Shared_,
    Extension(operator): Extension<Operator>,
    Query(query): Query<ListQuery>,
    headers: HeaderMap,
) -> Response {
    let json = wants_json(query.format.as_deref(), &headers);
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
    format: Option<String>,
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
    State(shared): Shared_,
    Extension(operator): Extension<Operator>,
    Query(query): Query<IdQuery>,
    headers: HeaderMap,
) -> Response {
    let json = wants_json(query.format.as_deref(), &headers);
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

/// What a confirmation page asks about.
#[derive(Debug, Deserialize)]
pub(super) struct ConfirmQuery {
    action: Option<String>,
    id: Option<String>,
    state: Option<String>,
    since: Option<String>,
    until: Option<String>,
    prefix: Option<String>,
    format: Option<String>,
}

#[derive(Debug, Serialize)]
pub(super) struct ConfirmData {
    pub(super) action: &'static str,
    /// Where the form posts.
    pub(super) post_to: &'static str,
    /// What the action will do.
    pub(super) consequence: String,
    /// The one id acted on.
    pub(super) id: Option<String>,
    /// For a requeue by filter: the filter, and the dead letters it selects now.
    pub(super) filter: Option<FilterForm>,
    pub(super) matching: Vec<String>,
    pub(super) more: bool,
    pub(super) csrf_token: String,
}

pub(super) async fn confirm(
    State(shared): Shared_,
    Extension(operator): Extension<Operator>,
    Query(query): Query<ConfirmQuery>,
    headers: HeaderMap,
) -> Response {
    let json = wants_json(query.format.as_deref(), &headers);
    let source = &*shared.source;
    let id = query.id.filter(|id| !id.is_empty());
    let mut data = ConfirmData {
        action: "",
        post_to: "",
        consequence: String::new(),
        id: id.clone(),
        filter: None,
        matching: Vec::new(),
        more: false,
        csrf_token: csrf_token(&shared.csrf_key, &operator),
    };
    let needs_id = || Problem::new(StatusCode::BAD_REQUEST, "no id given");
    match query.action.as_deref().unwrap_or("") {
        "forget" => {
            if id.is_none() {
                return needs_id().respond(json);
            }
            data.action = "forget";
            data.post_to = "forget";
            data.consequence = "The record is removed: the provider's next delivery of this id \
                 (a retry, or a resend from its dashboard) runs the handler again."
                .to_owned();
        }
        action @ ("acknowledge" | "resolve") => {
            if id.is_none() {
                return needs_id().respond(json);
            }
            let mark = Mark::parse(action).unwrap_or(Mark::Acknowledge);
            data.action = mark.as_str();
            data.post_to = "escalation";
            data.consequence = match mark {
                Mark::Acknowledge => "The escalation is marked acknowledged: someone is on it.",
                Mark::Resolve => "The escalation is marked resolved and no longer counts as open.",
            }
            .to_owned();
        }
        "requeue" => {
            data.action = "requeue";
            data.post_to = "requeue";
            if id.is_some() {
                data.consequence =
                    "The dead letter goes back to the queue: a worker runs it again.".to_owned();
            } else {
                let form = FilterForm {
                    state: StateFilter::Dead.as_str().to_owned(),
                    since: text(query.since),
                    until: text(query.until),
                    prefix: query.prefix.unwrap_or_default(),
                };
                let _ = query.state;
                let mut filter = match form.parse(source.now()) {
                    Ok(filter) => filter,
                    Err(problem) => return problem.respond(json),
                };
                filter.state = Some(StateFilter::Dead);
                match dead_letters(source, &filter, CONFIRM_SHOWN).await {
                    Ok((ids, more)) => {
                        data.matching = ids;
                        data.more = more;
                    }
                    Err(e) => return Problem::from(e).respond(json),
                }
                data.consequence = format!(
                    "Every dead letter this filter selects when you confirm (at most {REQUEUE_MAX}) \
                     goes back to the queue: a worker runs each again."
                );
                data.filter = Some(form);
            }
        }
        other => {
            return Problem::new(StatusCode::BAD_REQUEST, format!("unknown action {other:?}"))
                .respond(json)
        }
    }
    answer(json, StatusCode::OK, &data, views::confirm)
}

/// Up to `limit` ids of dead letters `filter` selects, and whether there are more.
async fn dead_letters(
    source: &dyn Source,
    filter: &Filter,
    limit: usize,
) -> Result<(Vec<String>, bool), SourceError> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = source.page(filter, cursor.as_deref(), 100).await?;
        for row in page.rows {
            if ids.len() == limit {
                return Ok((ids, true));
            }
            ids.push(row.id);
        }
        match page.next {
            Some(next) if ids.len() < limit => cursor = Some(next),
            Some(_) => return Ok((ids, true)),
            None => return Ok((ids, false)),
        }
    }
}

/// The outcome of an action.
#[derive(Debug, Serialize)]
pub(super) struct Done {
    pub(super) action: &'static str,
    /// `"done"`, or why nothing (or not everything) was done.
    pub(super) result: &'static str,
    pub(super) message: String,
    /// The ids acted on.
    pub(super) ids: Vec<String>,
    #[serde(skip)]
    pub(super) status: StatusCode,
}

/// A state-changing request's form, once its CSRF token checked out.
struct Checked {
    fields: Vec<(String, String)>,
    json: bool,
}

impl Checked {
    fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }
}

/// Refuses a POST whose CSRF token is missing or wrong, or that a browser marks as
/// cross-site; logs the refusal.
fn check_post(
    shared: &Shared,
    operator: &Operator,
    headers: &HeaderMap,
    action: &'static str,
    fields: Vec<(String, String)>,
) -> Result<Checked, Box<Response>> {
    let json = wants_json(
        fields
            .iter()
            .find(|(k, _)| k == "format")
            .map(|(_, v)| v.as_str()),
        headers,
    );
    let cross_site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|site| site != "same-origin" && site != "none");
    let token = fields
        .iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.as_str())
        .or_else(|| headers.get("x-csrf-token").and_then(|v| v.to_str().ok()));
    let valid = token.is_some_and(|t| csrf_ok(&shared.csrf_key, operator, t));
    if cross_site || !valid {
        tracing::warn!(
            target: AUDIT_TARGET,
            operator = %operator,
            action,
            cross_site,
            token_given = token.is_some(),
            "console action refused: CSRF check failed"
        );
        let why = if cross_site {
            "refused: a cross-site request"
        } else {
            "refused: the form's CSRF token is missing or wrong (reload the page and try again)"
        };
        return Err(Box::new(
            Problem::new(StatusCode::FORBIDDEN, why).respond(json),
        ));
    }
    Ok(Checked { fields, json })
}

fn done(json: bool, done: Done) -> Response {
    answer(json, done.status, &done, views::done)
}

pub(super) async fn forget(
    State(shared): Shared_,
    Extension(operator): Extension<Operator>,
    headers: HeaderMap,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let form = match check_post(&shared, &operator, &headers, "forget", fields) {
        Ok(form) => form,
        Err(refused) => return *refused,
    };
    let Some(id) = form.get("id").map(str::to_owned) else {
        return Problem::new(StatusCode::BAD_REQUEST, "no id given").respond(form.json);
    };
    let source = &*shared.source;
    let forgotten = source.forget(&id).await;
    let (result, status, message) = match &forgotten {
        Ok(Deleted::Removed) => (
            "done",
            StatusCode::OK,
            "Forgotten: the next delivery of this id runs the handler again.",
        ),
        Ok(Deleted::NotFound) => ("not_found", StatusCode::NOT_FOUND, "There was no record."),
        Ok(Deleted::LeaseHeld) => (
            "lease_held",
            StatusCode::CONFLICT,
            "Not forgotten: a delivery holds it under a live lease. Try again once it ends.",
        ),
        Err(_) => ("store_error", StatusCode::SERVICE_UNAVAILABLE, ""),
    };
    tracing::info!(
        target: AUDIT_TARGET,
        operator = %operator,
        action = "forget",
        namespace = source.namespace(),
        id = ?id,
        result,
        "console action"
    );
    if let Err(e) = forgotten {
        return Problem::from(e).respond(form.json);
    }
    done(
        form.json,
        Done {
            action: "forget",
            result,
            message: message.to_owned(),
            ids: vec![id],
            status,
        },
    )
}

pub(super) async fn requeue(
    State(shared): Shared_,
    Extension(operator): Extension<Operator>,
    headers: HeaderMap,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let form = match check_post(&shared, &operator, &headers, "requeue", fields) {
        Ok(form) => form,
        Err(refused) => return *refused,
    };
    let source = &*shared.source;
    let mut ids: Vec<String> = form
        .fields
        .iter()
        .filter(|(k, v)| k == "id" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect();
    let by_filter = ids.is_empty();
    let filter_form = FilterForm {
        state: StateFilter::Dead.as_str().to_owned(),
        since: form.get("since").unwrap_or("").to_owned(),
        until: form.get("until").unwrap_or("").to_owned(),
        prefix: form.get("prefix").unwrap_or("").to_owned(),
    };
    if by_filter {
        let filter = match filter_form.parse(source.now()) {
            Ok(filter) => filter,
            Err(problem) => return problem.respond(form.json),
        };
        match dead_letters(source, &filter, REQUEUE_MAX).await {
            Ok((found, _)) => ids = found,
            Err(e) => return Problem::from(e).respond(form.json),
        }
    }
    ids.truncate(REQUEUE_MAX);
    let mut requeued = Vec::new();
    let mut failure = None;
    for id in &ids {
        match source.requeue(id).await {
            Ok(true) => requeued.push(id.clone()),
            Ok(false) => {}
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    tracing::info!(
        target: AUDIT_TARGET,
        operator = %operator,
        action = "requeue",
        namespace = source.namespace(),
        ids = ?requeued,
        filter = by_filter.then(|| filter_form.query()),
        asked = ids.len(),
        requeued = requeued.len(),
        failed = failure.as_ref().map(|e| e.to_string()),
        "console action"
    );
    if let Some(e) = failure {
        if requeued.is_empty() {
            return Problem::from(e).respond(form.json);
        }
    }
    let skipped = ids.len() - requeued.len();
    done(
        form.json,
        Done {
            action: "requeue",
            result: if skipped == 0 { "done" } else { "partly" },
            message: format!(
                "Requeued {} dead letter(s); a worker runs them again.{}",
                requeued.len(),
                if skipped > 0 {
                    format!(" {skipped} were not dead letters (any more) and were left alone.")
                } else {
                    String::new()
                }
            ),
            ids: requeued,
            status: StatusCode::OK,
        },
    )
}

pub(super) async fn escalation(
    State(shared): Shared_,
    Extension(operator): Extension<Operator>,
    headers: HeaderMap,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let form = match check_post(&shared, &operator, &headers, "escalation", fields) {
        Ok(form) => form,
        Err(refused) => return *refused,
    };
    let (Some(id), Some(mark)) = (form.get("id"), form.get("mark").and_then(Mark::parse)) else {
        return Problem::new(
            StatusCode::BAD_REQUEST,
            "an id and a mark (acknowledge or resolve) are needed",
        )
        .respond(form.json);
    };
    let source = &*shared.source;
    let result = source.mark(id, mark, operator.name()).await;
    tracing::info!(
        target: AUDIT_TARGET,
        operator = %operator,
        action = mark.as_str(),
        namespace = source.namespace(),
        id = ?id,
        result = match &result {
            Ok(true) => "done",
            Ok(false) => "not_escalated",
            Err(_) => "error",
        },
        "console action"
    );
    match result {
        Ok(true) => done(
            form.json,
            Done {
                action: mark.as_str(),
                result: "done",
                message: match mark {
                    Mark::Acknowledge => "Escalation acknowledged.",
                    Mark::Resolve => "Escalation resolved.",
                }
                .to_owned(),
                ids: vec![id.to_owned()],
                status: StatusCode::OK,
            },
        ),
        Ok(false) => done(
            form.json,
            Done {
                action: mark.as_str(),
                result: "not_escalated",
                message: "This id is not escalated: nothing was marked.".to_owned(),
                ids: vec![id.to_owned()],
                status: StatusCode::CONFLICT,
            },
        ),
        Err(e) => Problem::from(e).respond(form.json),
    }
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
