//! The console's state-changing routes: the confirmation pages and the POST
//! actions (forget, requeue, acknowledge or resolve an escalation), each checked
//! for its CSRF token and logged as an audit line.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Form};
use serde::{Deserialize, Serialize};

use super::auth::{csrf_ok, csrf_token, Operator};
use super::handlers::{answer, text, wants_json, Asked, FilterForm, Problem, Shared_, REQUEUE_MAX};
use super::source::{Filter, Mark, Source, SourceError, StateFilter};
use super::{views, Shared, AUDIT_TARGET};
use crate::store::Deleted;

/// How many ids a confirmation page names.
const CONFIRM_SHOWN: usize = 100;

/// What a confirmation page asks about.
#[derive(Debug, Deserialize)]
pub(super) struct ConfirmQuery {
    action: Option<String>,
    id: Option<String>,
    since: Option<String>,
    until: Option<String>,
    prefix: Option<String>,
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
    Asked {
        shared,
        operator,
        query,
        json,
    }: Asked<ConfirmQuery>,
) -> Response {
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
