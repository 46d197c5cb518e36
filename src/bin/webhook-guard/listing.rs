//! `list`, `dead-letters` and `resolve`: the operator's listing commands, on the
//! store's listing capability.

use std::fmt::Write as _;
use std::process::ExitCode;

use chrono::{DateTime, TimeDelta, Utc};
use clap::{Args, Subcommand};
use webhook_guard::inbox::{InboxEvent, InboxState};
use webhook_guard::store::escalation::{self, EscalationError, EscalationStatus};
use webhook_guard::store::listing::{Cursor, EventQuery, ListState, Page, RecordQuery};
use webhook_guard::store::{Key, Record};

use crate::{clean, guard, open_store, record_json, when, Fail, StoreArgs};

/// The filters `list` and `dead-letters list` share.
#[derive(Args)]
pub(crate) struct Filters {
    /// Only ids starting with this.
    #[arg(long, value_name = "TEXT")]
    prefix: Option<String>,
    /// Only changed at or after: RFC 3339 (2026-01-31T12:00:00Z) or an age (30m, 2h, 7d).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Only changed before: RFC 3339 or an age.
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
    /// At most this many (1 to 1000).
    #[arg(long, default_value_t = 50, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    limit: u32,
    /// The page after this token (printed at the end of the previous page).
    #[arg(long, value_name = "TOKEN")]
    after: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub(crate) enum DeadLetters {
    /// List the inbox's dead letters, newest first.
    List {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        filters: Filters,
    },
    /// Put dead letters back in the queue, due now, attempts from zero: the ids
    /// given, or with --all every dead letter the filters select.
    Requeue {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        pick: Pick,
    },
    /// Remove dead letters (their ids are forgotten: a redelivery is accepted
    /// again): the ids given, or with --all every one the filters select.
    Purge {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        pick: Pick,
    },
}

/// Which dead letters an action takes.
#[derive(Args)]
pub(crate) struct Pick {
    /// The event ids.
    ids: Vec<String>,
    /// Every dead letter the filters select (instead of ids).
    #[arg(long, conflicts_with = "ids")]
    all: bool,
    /// With --all: only ids starting with this.
    #[arg(long, value_name = "TEXT", requires = "all")]
    prefix: Option<String>,
    /// With --all: only dead since (RFC 3339 or an age).
    #[arg(long, value_name = "TIME", requires = "all")]
    since: Option<String>,
}

/// A time given as RFC 3339 or as an age before `now` (`90s`, `30m`, `2h`, `7d`).
pub(crate) fn parse_time(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, Fail> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let bad = || {
        Fail::Usage(format!(
            "not a time: `{}` (RFC 3339, or an age such as 30m, 2h, 7d)",
            clean(text)
        ))
    };
    let split = text.len().checked_sub(1).ok_or_else(bad)?;
    let (n, unit) = text.split_at(split);
    let n: i64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(secs)
        .and_then(TimeDelta::try_seconds)
        .and_then(|d| now.checked_sub_signed(d))
        .ok_or_else(bad)
}

fn parse_states(text: &[String]) -> Result<Vec<ListState>, Fail> {
    let mut states = Vec::new();
    for name in text.iter().flat_map(|t| t.split(',')) {
        let state = ListState::parse(name.trim()).ok_or_else(|| {
            let all: Vec<_> = ListState::ALL.iter().map(|s| s.as_str()).collect();
            Fail::Usage(format!(
                "--state: `{}` is none of {}",
                clean(name),
                all.join(", ")
            ))
        })?;
        states.push(state);
    }
    Ok(states)
}

fn query<S: Copy + PartialEq>(
    namespace: &str,
    states: Vec<S>,
    f: &Filters,
    now: DateTime<Utc>,
) -> Result<webhook_guard::store::listing::ListQuery<S>, Fail> {
    let mut q = webhook_guard::store::listing::ListQuery::new(namespace, now)
        .states(states)
        .limit(f.limit as usize);
    if let Some(p) = &f.prefix {
        q = q.id_prefix(p.as_str());
    }
    if let Some(t) = &f.since {
        q = q.since(parse_time(t, now)?);
    }
    if let Some(t) = &f.until {
        q = q.until(parse_time(t, now)?);
    }
    if let Some(token) = &f.after {
        let cursor = Cursor::parse(token).map_err(|e| Fail::Usage(format!("--after: {e}")))?;
        q = q.after(Some(cursor));
    }
    Ok(q)
}

fn unsupported(what: &str) -> Fail {
    Fail::Failed(format!("this store cannot list {what}"))
}

/// `list`: records by state, time and id prefix.
pub(crate) async fn list(
    args: &StoreArgs,
    states: &[String],
    f: &Filters,
) -> Result<ExitCode, Fail> {
    let now = Utc::now();
    let q: RecordQuery = query(&args.namespace, parse_states(states)?, f, now)?;
    let guard = guard(args).await?;
    let store = guard.store();
    let listing = store
        .record_listing()
        .ok_or_else(|| unsupported("records"))?;
    let page = listing
        .list_records(&q)
        .await
        .map_err(|e| Fail::store(&e))?;
    if f.json {
        let items: Vec<_> = page.items.iter().map(|r| record_json(r, now)).collect();
        let next = page.next.as_ref().map(Cursor::token);
        println!(
            "{:#}",
            serde_json::json!({ "records": items, "next": next })
        );
        return Ok(ExitCode::SUCCESS);
    }
    for r in &page.items {
        println!("{}", record_line(r, now));
    }
    footer(page.items.len(), "records", &page);
    Ok(ExitCode::SUCCESS)
}

fn record_line(r: &Record, now: DateTime<Utc>) -> String {
    let mut line = format!(
        "{}  {:<17}  {}  attempts {}  failures {}",
        r.updated_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        ListState::of(r, now).as_str(),
        clean(&r.id),
        r.attempts,
        r.failures
    );
    if let Some(last) = r.history.last() {
        let _ = write!(line, "  last error: {}", clean(&last.error));
    }
    line
}

fn footer<T>(n: usize, what: &str, page: &Page<T>) {
    match &page.next {
        Some(next) => println!("{n} {what}; next page: --after {}", next.token()),
        None => println!("{n} {what}; end of the listing"),
    }
}

fn event_json(e: &InboxEvent) -> serde_json::Value {
    serde_json::json!({
        "namespace": e.namespace,
        "id": e.id,
        "state": e.state.as_str(),
        "attempts": e.attempts,
        "last_error": e.last_error,
        "received_at": e.received_at,
        "updated_at": e.updated_at,
        "next_attempt_at": e.next_attempt_at,
        "expires_at": e.expires_at,
        "event_type": e.meta.event_type,
        "payload_bytes": e.payload.len(),
    })
}

/// `dead-letters …`.
pub(crate) async fn dead_letters(command: DeadLetters) -> Result<ExitCode, Fail> {
    match command {
        DeadLetters::List { store, filters } => list_dead(&store, &filters).await,
        DeadLetters::Requeue { store, pick } => act(&store, &pick, true).await,
        DeadLetters::Purge { store, pick } => act(&store, &pick, false).await,
    }
}

async fn list_dead(args: &StoreArgs, f: &Filters) -> Result<ExitCode, Fail> {
    let now = Utc::now();
    let q: EventQuery = query(&args.namespace, vec![InboxState::Dead], f, now)?;
    let inbox = open_store(args).await?.inbox();
    let listing = inbox
        .inbox_listing()
        .ok_or_else(|| unsupported("inbox events"))?;
    let page = listing.list_events(&q).await.map_err(|e| Fail::store(&e))?;
    if f.json {
        let items: Vec<_> = page.items.iter().map(event_json).collect();
        let next = page.next.as_ref().map(Cursor::token);
        println!("{:#}", serde_json::json!({ "events": items, "next": next }));
        return Ok(ExitCode::SUCCESS);
    }
    for e in &page.items {
        println!(
            "{}  {}  {}  attempts {}  last error: {}",
            e.updated_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            clean(&e.id),
            clean(e.meta.event_type.as_deref().unwrap_or("-")),
            e.attempts,
            clean(e.last_error.as_deref().unwrap_or("-"))
        );
    }
    footer(page.items.len(), "dead letters", &page);
    Ok(ExitCode::SUCCESS)
}

/// Requeues (`requeue`) or purges the dead letters `pick` names.
async fn act(args: &StoreArgs, pick: &Pick, requeue: bool) -> Result<ExitCode, Fail> {
    if pick.ids.is_empty() && !pick.all {
        return Err(Fail::Usage("name the event ids, or give --all".into()));
    }
    let now = Utc::now();
    let inbox = open_store(args).await?.inbox();
    let listing = inbox
        .inbox_listing()
        .ok_or_else(|| unsupported("inbox events"))?;
    let mut ids = pick.ids.clone();
    if pick.all {
        let mut q = EventQuery::new(&args.namespace, now)
            .states([InboxState::Dead])
            .limit(1000);
        if let Some(p) = &pick.prefix {
            q = q.id_prefix(p.as_str());
        }
        if let Some(t) = &pick.since {
            q = q.since(parse_time(t, now)?);
        }
        loop {
            let page = listing.list_events(&q).await.map_err(|e| Fail::store(&e))?;
            ids.extend(page.items.into_iter().map(|e| e.id));
            match page.next {
                Some(next) => q.after = Some(next),
                None => break,
            }
        }
    }
    let (verb, mut done, mut missed) = (if requeue { "requeued" } else { "purged" }, 0, 0);
    for id in &ids {
        let key = Key::new(&args.namespace, id);
        let changed = if requeue {
            listing.requeue_dead(key, now).await
        } else {
            listing.purge_dead(key).await
        }
        .map_err(|e| Fail::store(&e))?;
        if changed {
            done += 1;
        } else {
            missed += 1;
            eprintln!("`{}` is not a dead letter: left alone", clean(id));
        }
    }
    println!("{verb} {done} dead letters");
    Ok(if missed > 0 && !pick.all {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `resolve`: marks an escalation resolved (or acknowledged).
pub(crate) async fn resolve(
    args: &StoreArgs,
    id: &str,
    acknowledge: bool,
    note: &str,
) -> Result<ExitCode, Fail> {
    let guard = guard(args).await?;
    let status = if acknowledge {
        EscalationStatus::Acknowledged
    } else {
        EscalationStatus::Resolved
    };
    let key = Key::new(&args.namespace, id);
    match escalation::mark(guard.store().as_ref(), key, status, note, Utc::now()).await {
        Ok(now) => {
            println!("`{}`: escalation {}", clean(id), now.status);
            Ok(ExitCode::SUCCESS)
        }
        Err(EscalationError::Store(e)) => Err(Fail::store(&e)),
        Err(e) => Err(Fail::Failed(format!("`{}`: {e}", clean(id)))),
    }
}

/// The escalation status line `inspect` adds for an escalated record.
pub(crate) async fn escalation_line(
    store: &webhook_guard::store::DynProcessedStore,
    r: &Record,
    now: DateTime<Utc>,
) -> Option<String> {
    if r.state != webhook_guard::store::RecordState::Escalated {
        return None;
    }
    let e = escalation::status(store, r).await.ok()?;
    let mut text = e.status.to_string();
    if let Some(last) = e.notes.last() {
        let _ = write!(text, " ({} {})", when(last.at, now), clean(&last.error));
    }
    Some(text)
}
