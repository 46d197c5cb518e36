//! The console's pages, as maud templates: every value spliced in is escaped, so
//! ids, error text and bodies from deliveries render as text. Links are relative
//! (every page sits one level below the mount point), and there is no script.

use chrono::{DateTime, SecondsFormat, Utc};
use maud::{html, Markup, DOCTYPE};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

use super::actions::{ConfirmData, Done};
use super::chart;
use super::handlers::{FilterForm, ListData, OverviewData, Problem, RecordData, REQUEUE_MAX};
use super::source::{Count, Row, StateFilter};

/// The stylesheet, served as `style.css` (the CSP allows styles from the console
/// itself only).
pub(super) const STYLE: &str = include_str!("style.css");

/// `name=value&...` with every value percent-encoded; empty values are left out.
pub(super) fn query(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (name, value) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(name);
        out.push('=');
        out.extend(utf8_percent_encode(value, NON_ALPHANUMERIC));
    }
    out
}

fn record_href(id: &str) -> String {
    format!("record?{}", query(&[("id", id)]))
}

fn time(t: DateTime<Utc>) -> Markup {
    let text = t.to_rfc3339_opts(SecondsFormat::Millis, true);
    html! { time datetime=(text) { (text) } }
}

fn count(c: &Count) -> Markup {
    html! { (c.n) @if c.more { "+" } }
}

/// The first `max` characters of `text`, marked when cut.
fn short(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

fn layout(title: &str, namespace: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · webhook-guard console" }
                link rel="stylesheet" href="style.css";
            }
            body {
                header {
                    nav {
                        a href="overview" { "Overview" }
                        a href="records" { "Records" }
                        a href="records?state=escalated" { "Escalations" }
                        a href="records?state=dead_letter" { "Dead letters" }
                        a href="records?state=stuck" { "Stuck" }
                    }
                    @if !namespace.is_empty() {
                        span.namespace { "namespace " code { (namespace) } }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

pub(super) fn problem(p: &Problem) -> Markup {
    layout(
        p.status.canonical_reason().unwrap_or("Error"),
        "",
        html! { p.problem #problem { (p.error) } },
    )
}

pub(super) fn overview(d: &OverviewData) -> Markup {
    let body = html! {
        @if let Some(why) = &d.listing_unsupported {
            p.notice #listing-unsupported { "No counts: " (why) "." }
        } @else {
            section {
                h2 { "Records by state" }
                (chart::bars(&d.windows))
                table #counts {
                    thead { tr { th { "state" } @for w in &d.windows { th { (w.label) } } } }
                    tbody {
                        @if let Some(first) = d.windows.first() {
                            @for (i, c) in first.counts.iter().enumerate() {
                                tr {
                                    td { (c.label) }
                                    @for (w, window) in d.windows.iter().enumerate() {
                                        @let key = if w == 0 { "hour" } else { "day" };
                                        @let since = if w == 0 { "1h" } else { "1d" };
                                        td.num id={"count-" (key) "-" (c.state)} {
                                            @if let Some(c) = window.counts.get(i) {
                                                a href={"records?" (query(&[("state", c.state), ("since", since)]))} { (count(&c.count)) }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                p.hint { "Counted by the time each record last changed." }
            }
        }
        section.cards {
            div.card {
                h2 { "Open escalations" }
                p.big #open-escalations {
                    @match &d.open_escalations {
                        Some(c) => a href="records?state=escalated" { (count(c)) },
                        None => "–",
                    }
                }
            }
            div.card {
                h2 { "Dead letters" }
                p.big #dead-letters {
                    @match (&d.dead_letters, d.has_inbox) {
                        (Some(c), _) => a href="records?state=dead_letter" { (count(c)) },
                        (None, false) => "no inbox",
                        (None, true) => "–",
                    }
                }
            }
            div.card {
                h2 { "Stuck leases" }
                p.big #stuck-count { a href="records?state=stuck" { (d.stuck.len()) @if d.stuck.len() >= 20 { "+" } } }
            }
        }
        @if !d.unresolved.is_empty() {
            section {
                h2 { "Escalations not resolved" }
                table #unresolved {
                    thead { tr { th { "id" } th { "status" } th { "escalated" } } }
                    tbody {
                        @for e in &d.unresolved {
                            tr {
                                td { a.id href=(record_href(&e.id)) { (e.id) } }
                                td { span class={"state state-escalation-" (e.status)} { (e.status) } }
                                td { (time(e.escalated_at)) }
                            }
                        }
                    }
                }
            }
        }
        @if !d.stuck.is_empty() {
            section {
                h2 { "Stuck leases" }
                (rows(&d.stuck))
            }
        }
        p.hint { "As of " (time(d.now)) "." }
    };
    layout("Overview", &d.namespace, body)
}

fn rows(rows: &[Row]) -> Markup {
    html! {
        table.rows #rows {
            thead { tr { th { "id" } th { "state" } th { "last change" } th.num { "attempts" } th { "last error" } } }
            tbody {
                @for row in rows {
                    tr {
                        td { a.id href=(record_href(&row.id)) { (row.id) } }
                        td { span class={"state state-" (row.state)} { (row.state) } }
                        td { (time(row.updated_at)) }
                        td.num { (row.attempts) }
                        td.error { @if let Some(e) = &row.last_error { (short(e, 120)) } }
                    }
                }
            }
        }
    }
}

fn filter_form(f: &FilterForm, has_inbox: bool) -> Markup {
    html! {
        form.filter #filter method="get" action="records" {
            label { "state "
                select name="state" {
                    option value="" selected[f.state.is_empty()] { "any record" }
                    @for s in StateFilter::ALL {
                        @if !s.is_inbox() || has_inbox {
                            option value=(s.as_str()) selected[f.state == s.as_str()] { (s.label()) }
                        }
                    }
                }
            }
            label { "changed since " input type="text" name="since" value=(f.since) placeholder="1h, 2026-12-01T08:00"; }
            label { "until " input type="text" name="until" value=(f.until) placeholder="15m, 2026-12-02"; }
            label { "id starts with " input type="text" name="prefix" value=(f.prefix); }
            button type="submit" { "Filter" }
        }
    }
}

pub(super) fn list(d: &ListData) -> Markup {
    let body = html! {
        (filter_form(&d.filter, d.has_inbox))
        @if let Some(why) = &d.unsupported {
            p.notice #listing-unsupported { "Cannot list: " (why) "." }
        } @else if d.rows.is_empty() {
            p #empty { "Nothing matches." }
        } @else {
            (rows(&d.rows))
        }
        @if d.filter.state == StateFilter::Dead.as_str() && !d.rows.is_empty() {
            p { a.button #requeue-all href={"confirm?" (query(&[("action", "requeue"), ("since", &d.filter.since), ("until", &d.filter.until), ("prefix", &d.filter.prefix)]))} {
                "Requeue every dead letter this filter selects…"
            } }
        }
        @if let Some(next) = &d.next {
            p { a #next-page href={"records?" (d.filter.query()) "&" (query(&[("after", next)]))} { "Next page →" } }
        }
    };
    layout("Records", &d.namespace, body)
}

fn field(name: &str, value: Markup) -> Markup {
    html! { dt { (name) } dd { (value) } }
}

pub(super) fn record(d: &RecordData) -> Markup {
    let id_query =
        |action: &str| format!("confirm?{}", query(&[("action", action), ("id", &d.id)]));
    let body = html! {
        p { "Event id " code #record-id { (d.id) } }
        @if d.record.is_none() && d.inbox.is_none() {
            p.notice #not-found { "No record and no inbox event under this id." }
        }
        @if let Some(r) = &d.record {
            section #record {
                h2 { "Record" }
                dl {
                    (field("state", html! { span #state class={"state state-" (r.state)} { (r.state) } @if r.stuck { " (stuck: its lease ran out)" } }))
                    (field("attempts", html! { span #attempts { (r.attempts) } }))
                    (field("failures", html! { span #failures { (r.failures) } }))
                    (field("fingerprint", html! { @match &r.fingerprint { Some(fp) => code #fingerprint { (fp) }, None => "not kept (conflict detection off)" } }))
                    (field("first claimed", time(r.created_at)))
                    (field("last change", time(r.updated_at)))
                    @if r.state == "in_progress" { (field("lease until", time(r.lease_until))) }
                    (field("kept until", time(r.expires_at)))
                }
                @if let Some(e) = &d.escalation {
                    p #escalation { "Escalation: " strong #escalation-state { (e.state) } }
                    @if !e.notes.is_empty() {
                        ul #escalation-notes { @for (at, note) in &e.notes { li { (time(*at)) " " (note) } } }
                    }
                }
                h3 { "Failure history" }
                @if r.history.is_empty() {
                    p #no-history { "No failures." }
                } @else {
                    table #history {
                        thead { tr { th { "at" } th { "handler error" } } }
                        tbody { @for n in &r.history { tr { td { (time(n.at)) } td.error { pre { (n.error) } } } } }
                    }
                }
                p.actions {
                    a.button #forget href=(id_query("forget")) { "Forget…" }
                    @if d.escalation.as_ref().is_some_and(|e| e.state != "resolved") {
                        @if d.escalation.as_ref().is_some_and(|e| e.state == "open") {
                            a.button #acknowledge href=(id_query("acknowledge")) { "Acknowledge…" }
                        }
                        a.button #resolve href=(id_query("resolve")) { "Resolve…" }
                    }
                }
            }
        }
        @if let Some(e) = &d.inbox {
            section #inbox-event {
                h2 { "Inbox event" }
                dl {
                    (field("state", html! { span #inbox-state class={"state state-" (e.state)} { (e.state) } }))
                    (field("attempts", html! { (e.attempts) }))
                    (field("type", html! { @if let Some(t) = &e.event_type { code { (t) } } }))
                    (field("object", html! { @if let Some(o) = &e.object { code { (o) } } }))
                    (field("fingerprint", html! { @if let Some(fp) = &e.fingerprint { code { (fp) } } }))
                    (field("received", time(e.received_at)))
                    (field("last change", time(e.updated_at)))
                    @if e.state == "pending" { (field("next attempt", time(e.next_attempt_at))) }
                    @if e.state == "leased" { (field("lease until", time(e.lease_until))) }
                    (field("kept until", time(e.expires_at)))
                    (field("last error", html! { @if let Some(err) = &e.last_error { pre #last-error { (err) } } }))
                }
                @if e.state == "dead_letter" {
                    p.actions { a.button #requeue href=(id_query("requeue")) { "Requeue…" } }
                }
                h3 { "Body" }
                @match &e.body {
                    Some(b) => {
                        p.hint { (b.bytes) " bytes" @if b.json { ", JSON" } @if b.cut { ", cut to the first " (b.text.len()) } }
                        pre #body { (b.text) }
                    }
                    None => p.hint #body-hidden { "Bodies are not shown (the host has not enabled them)." },
                }
            }
        }
    };
    layout("Record", &d.namespace, body)
}

pub(super) fn confirm(d: &ConfirmData) -> Markup {
    let body = html! {
        p #consequence { (d.consequence) }
        @if let Some(id) = &d.id { p { "Event id " code #confirm-id { (id) } } }
        @if d.filter.is_some() {
            p { (d.matching.len()) @if d.more { "+" } " dead letter(s) match now" @if d.more { " (the first shown; at most " (REQUEUE_MAX) " are requeued)" } ":" }
            ul #matching { @for id in &d.matching { li { code { (id) } } } }
        }
        form #confirm method="post" action=(d.post_to) {
            input type="hidden" name="csrf" value=(d.csrf_token);
            @if let Some(id) = &d.id { input type="hidden" name="id" value=(id); }
            @if d.post_to == "escalation" { input type="hidden" name="mark" value=(d.action); }
            @if let Some(f) = &d.filter {
                input type="hidden" name="since" value=(f.since);
                input type="hidden" name="until" value=(f.until);
                input type="hidden" name="prefix" value=(f.prefix);
            }
            button #confirm-submit type="submit" { "Confirm: " (d.action) }
            " "
            @match &d.id {
                Some(id) => a href=(record_href(id)) { "Cancel" },
                None => a href="records?state=dead_letter" { "Cancel" },
            }
        }
    };
    layout(&format!("Confirm: {}", d.action), "", body)
}

pub(super) fn done(d: &Done) -> Markup {
    let body = html! {
        p #result data-result=(d.result) { (d.message) }
        @if !d.ids.is_empty() {
            ul #done-ids { @for id in &d.ids { li { a href=(record_href(id)) { (id) } } } }
        }
        p { a href="overview" { "Back to the overview" } }
    };
    layout(&format!("Done: {}", d.action), "", body)
}
