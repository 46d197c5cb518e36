//! `webhook-guard`: the operator's tool for a webhook-guard store, and a test sender.
//!
//! Build it with `cargo install webhook-guard --features cli`. Exit codes: 0 done,
//! 1 refused, not found or failed, 2 usage error. Secrets and store passwords are
//! never printed.

mod http;
mod listing;
mod samples;
mod send;

use std::fmt::Write as _;
use std::process::ExitCode;

use chrono::{DateTime, TimeDelta, Utc};
use clap::{Args, Parser, Subcommand};
use webhook_guard::store::{Backend, Deleted, Migration, OpenError, OpenedStore, Record, StoreUrl};
use webhook_guard::sweeper::Sweeper;
use webhook_guard::verify::NoVerification;
use webhook_guard::{ConfigError, WebhookGuard};

/// Inspect and repair what webhook-guard remembers about deliveries, and send
/// signed test events to a local endpoint.
// No `Debug`: the arguments hold the store URL (and `send`'s signing secret).
#[derive(Parser)]
#[command(name = "webhook-guard", version, propagate_version = true)]
#[command(after_help = "Exit status: 0 done, 1 refused / not found / failed, 2 usage error.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the record kept for an event id (exit 1 when there is none).
    Inspect {
        #[command(flatten)]
        store: StoreArgs,
        /// The provider's event id.
        id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Forget an event id so its next delivery runs the handler again. Refused
    /// while a delivery holds it under a live lease.
    Forget {
        #[command(flatten)]
        store: StoreArgs,
        /// The provider's event id.
        id: String,
    },
    /// List claims whose lease ran out without completion (crashed or hung handlers).
    Stuck {
        #[command(flatten)]
        store: StoreArgs,
        /// At most this many.
        #[arg(long, default_value_t = 100, value_name = "N")]
        limit: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List records, newest first: by state (in_progress, stuck, failed, completed,
    /// escalated, permanent_failure), time of their last change and id prefix.
    List {
        #[command(flatten)]
        store: StoreArgs,
        /// Only these states (repeat, or separate with commas).
        #[arg(long, value_name = "STATE")]
        state: Vec<String>,
        #[command(flatten)]
        filters: listing::Filters,
    },
    /// The inbox's dead letters: list, requeue or purge them.
    #[command(subcommand, name = "dead-letters")]
    DeadLetters(listing::DeadLetters),
    /// Mark an escalation resolved (or, with --ack, acknowledged), kept in the
    /// store beside the escalated record, which stays escalated.
    Resolve {
        #[command(flatten)]
        store: StoreArgs,
        /// The provider's event id.
        id: String,
        /// Acknowledge (someone is on it) instead of resolving.
        #[arg(long)]
        ack: bool,
        /// Who, and what was done.
        #[arg(long, default_value = "", value_name = "TEXT")]
        note: String,
    },
    /// Purge the records whose retention has run out, now (in every namespace).
    Purge {
        #[command(flatten)]
        store: StoreArgs,
        /// Records removed per store call.
        #[arg(long, default_value_t = 1000, value_name = "N",
              value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch: u32,
    },
    /// Create the store's table and indexes unless they exist (SQL stores, DynamoDB).
    Migrate {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Sign a test event exactly as a provider would and POST it to a local
    /// endpoint: once, several times at once, or on the provider's retry schedule.
    /// A development tool: plain HTTP, loopback hosts only by default.
    Send(send::SendArgs),
}

#[derive(Args)]
pub(crate) struct StoreArgs {
    /// The store: sqlite:PATH, postgres://..., mysql://..., mariadb://...,
    /// redis://..., dynamodb://TABLE?region=... (memory: works but holds nothing).
    /// TLS: ?sslmode=verify-full (&sslrootcert=CA.pem), ?ssl-mode=VERIFY_IDENTITY
    /// (&ssl-ca=CA.pem), rediss:// (SSL_CERT_FILE=CA.pem for a private CA).
    #[arg(
        long,
        env = "WEBHOOK_GUARD_STORE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    store: String,
    /// The namespace the guard was configured with.
    #[arg(
        long,
        env = "WEBHOOK_GUARD_NAMESPACE",
        default_value = "default",
        value_name = "NAME"
    )]
    pub(crate) namespace: String,
    /// The table, for SQL stores not using webhook_guard_records.
    #[arg(long, env = "WEBHOOK_GUARD_TABLE", value_name = "NAME")]
    table: Option<String>,
}

/// Why a command did not succeed.
#[derive(Debug)]
pub(crate) enum Fail {
    /// Bad input: exit 2.
    Usage(String),
    /// Refused, not found or failed: exit 1.
    Failed(String),
}

impl Fail {
    /// An error opening the store: the store's own is a failure (exit 1); anything
    /// else is the options' fault (a table for a store without tables, a bad
    /// table name or parameter), a usage error (exit 2).
    fn open(e: &OpenError) -> Self {
        match e {
            OpenError::Store(_) => Self::store(e),
            _ => Self::Usage(format!("--store: {e}")),
        }
    }

    fn store(e: &(dyn std::error::Error + 'static)) -> Self {
        // The chain: StoreError already shows its source; add deeper causes.
        let mut text = e.to_string();
        let mut cause = e.source().and_then(|s| s.source());
        while let Some(c) = cause {
            let c_text = c.to_string();
            if !text.contains(&c_text) {
                let _ = write!(text, ": {c_text}");
            }
            cause = c.source();
        }
        Self::Failed(text)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("webhook-guard: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(Fail::Usage(message)) => {
            eprintln!("webhook-guard: {message}");
            ExitCode::from(2)
        }
        Err(Fail::Failed(message)) => {
            eprintln!("webhook-guard: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> Result<ExitCode, Fail> {
    match command {
        Command::Inspect { store, id, json } => inspect(&store, &id, json).await,
        Command::Forget { store, id } => forget(&store, &id).await,
        Command::Stuck { store, limit, json } => stuck(&store, limit, json).await,
        Command::Purge { store, batch } => purge(&store, batch as usize).await,
        Command::List {
            store,
            state,
            filters,
        } => listing::list(&store, &state, &filters).await,
        Command::DeadLetters(command) => listing::dead_letters(command).await,
        Command::Resolve {
            store,
            id,
            ack,
            note,
        } => listing::resolve(&store, &id, ack, &note).await,
        Command::Migrate { store } => migrate(&store).await,
        Command::Send(args) => send::run(args).await,
    }
}

/// The parsed URL, with the table option. The URL itself is never echoed: it may
/// hold a password.
fn store_url(args: &StoreArgs) -> Result<StoreUrl, Fail> {
    let url = StoreUrl::parse(&args.store).map_err(|e| Fail::Usage(format!("--store: {e}")))?;
    Ok(match &args.table {
        Some(t) => url.table(t),
        None => url,
    })
}

/// The store, opened for the operator calls (a missing SQLite file is not made).
pub(crate) async fn open_store(args: &StoreArgs) -> Result<OpenedStore, Fail> {
    let url = store_url(args)?.create_if_missing(false);
    url.open()
        .await
        .map_err(|e| match (Fail::open(&e), url.backend()) {
            (Fail::Failed(text), Backend::Sqlite) => Fail::Failed(format!(
                "{text} (a missing file is not created: run `webhook-guard migrate` first)"
            )),
            (fail, _) => fail,
        })
}

/// A guard over the store, for the operator calls (no verification: nothing is
/// received).
pub(crate) async fn guard(args: &StoreArgs) -> Result<WebhookGuard, Fail> {
    let opened = open_store(args).await?;
    WebhookGuard::builder()
        .store(opened.shared())
        .verifier(NoVerification)
        .namespace(args.namespace.as_str())
        .build()
        .map_err(|e| match e {
            ConfigError::BadNamespace => Fail::Usage(format!("--namespace: {e}")),
            e => Fail::Failed(e.to_string()),
        })
}

async fn inspect(args: &StoreArgs, id: &str, json: bool) -> Result<ExitCode, Fail> {
    let guard = guard(args).await?;
    let Some(record) = guard.inspect(id).await.map_err(|e| Fail::store(&e))? else {
        return Err(Fail::Failed(format!(
            "no record for `{id}` in namespace `{}`",
            args.namespace
        )));
    };
    let now = Utc::now();
    let escalation = listing::escalation_line(guard.store().as_ref(), &record, now).await;
    if json {
        let mut value = record_json(&record, now);
        value["escalation"] = escalation.map_or(serde_json::Value::Null, |e| e.into());
        println!("{value:#}");
    } else {
        print!("{}", describe(&record, now));
        if let Some(e) = escalation {
            println!("{:<12} {e}", "escalation");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn forget(args: &StoreArgs, id: &str) -> Result<ExitCode, Fail> {
    let guard = guard(args).await?;
    match guard.forget(id).await.map_err(|e| Fail::store(&e))? {
        Deleted::Removed => {
            println!("forgot `{id}`: its next delivery runs the handler again");
            Ok(ExitCode::SUCCESS)
        }
        Deleted::NotFound => Err(Fail::Failed(format!(
            "no record for `{id}` in namespace `{}`",
            args.namespace
        ))),
        Deleted::LeaseHeld => {
            let until = match guard.inspect(id).await {
                Ok(Some(r)) => format!(" until {}", when(r.lease_until, Utc::now())),
                _ => String::new(),
            };
            Err(Fail::Failed(format!(
                "refused: `{id}` is being processed under a live lease{until}; \
                 forget it once that delivery finishes or its lease runs out"
            )))
        }
    }
}

async fn stuck(args: &StoreArgs, limit: usize, json: bool) -> Result<ExitCode, Fail> {
    let guard = guard(args).await?;
    let records = guard.stuck(limit).await.map_err(|e| Fail::store(&e))?;
    let now = Utc::now();
    if json {
        let list: Vec<_> = records.iter().map(|r| record_json(r, now)).collect();
        println!("{:#}", serde_json::Value::Array(list));
        if records.len() >= limit {
            // On stderr: stdout stays one JSON array.
            eprintln!("the limit of {limit} was reached: more claims may be stuck");
        }
    } else if records.is_empty() {
        println!("no stuck claims");
    } else {
        for r in &records {
            println!(
                "{}/{}  lease ran out {}  attempts {}  failures {}",
                clean(&r.namespace),
                clean(&r.id),
                when(r.lease_until, now),
                r.attempts,
                r.failures
            );
        }
        let more = if records.len() >= limit {
            ", the limit: more may be stuck"
        } else {
            ""
        };
        println!(
            "{} stuck{more} (the next delivery of each takes it over; `forget` with its \
             `--namespace` allows a redelivery from the provider's dashboard)",
            records.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn purge(args: &StoreArgs, batch: usize) -> Result<ExitCode, Fail> {
    let guard = guard(args).await?;
    // Not the guard's own sweeper: this tool has none of the host's hooks or
    // reconciler, so the follow-ups a crashed host owes are left to the host.
    let sweeper = Sweeper::new(
        guard.store().clone(),
        guard.clock().clone(),
        guard.hooks().clone(),
    );
    let report = sweeper
        .batch(batch)
        .max_batches(usize::MAX)
        .sweep()
        .await
        .map_err(|e| Fail::store(&e))?;
    println!("purged {} expired records", report.purged);
    if report.stuck > 0 {
        println!(
            "{} claims are stuck (see `webhook-guard stuck`)",
            report.stuck
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn migrate(args: &StoreArgs) -> Result<ExitCode, Fail> {
    let url = store_url(args)?;
    let backend = url.backend();
    let opened = url.open().await.map_err(|e| Fail::open(&e))?;
    match opened.migrate().await.map_err(|e| Fail::store(&e))? {
        Migration::Applied { table } => println!("{backend}: table `{table}` is ready"),
        _ => println!("{backend} keeps no schema: nothing to migrate"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `T (in 4m12s)` or `T (3m ago)`.
pub(crate) fn when(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let stamp = at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let delta = at - now;
    if delta >= TimeDelta::zero() {
        format!("{stamp} (in {})", span(delta))
    } else {
        format!("{stamp} ({} ago)", span(-delta))
    }
}

fn span(d: TimeDelta) -> String {
    let s = d.num_seconds();
    match (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60) {
        (0, 0, 0, s) => format!("{s}s"),
        (0, 0, m, s) => format!("{m}m{s:02}s"),
        (0, h, m, _) => format!("{h}h{m:02}m"),
        (d, h, _, _) => format!("{d}d{h:02}h"),
    }
}

fn lease_text(r: &Record, now: DateTime<Utc>) -> String {
    if r.state != webhook_guard::store::RecordState::InProgress {
        return "none".into();
    }
    if r.lease_expired(now) {
        format!("ran out {} (stuck)", when(r.lease_until, now))
    } else {
        format!("held until {}", when(r.lease_until, now))
    }
}

fn describe(r: &Record, now: DateTime<Utc>) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| {
        let _ = writeln!(out, "{k:<12} {v}");
    };
    line("id", clean(&r.id));
    line("namespace", clean(&r.namespace));
    let terminal = if r.state.is_terminal() {
        " (terminal: deliveries are answered without running the handler)"
    } else {
        ""
    };
    line("state", format!("{}{terminal}", r.state));
    line("attempts", r.attempts.to_string());
    line("failures", r.failures.to_string());
    line("lease", lease_text(r, now));
    line("expires", when(r.expires_at, now));
    line("created", when(r.created_at, now));
    line("updated", when(r.updated_at, now));
    line("fingerprint", format!("sha256:{}", r.fingerprint.to_hex()));
    if r.history.is_empty() {
        line("last errors", "none".into());
    } else {
        line("last errors", String::new());
        for note in &r.history {
            let _ = writeln!(
                out,
                "  {}  {}",
                note.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                clean(&note.error)
            );
        }
    }
    out
}

pub(crate) fn record_json(r: &Record, now: DateTime<Utc>) -> serde_json::Value {
    serde_json::json!({
        "namespace": r.namespace,
        "id": r.id,
        "state": r.state,
        "terminal": r.state.is_terminal(),
        "attempts": r.attempts,
        "failures": r.failures,
        "lease_until": r.lease_until,
        "lease_live": r.state == webhook_guard::store::RecordState::InProgress
            && !r.lease_expired(now),
        "stuck": r.lease_expired(now),
        "expires_at": r.expires_at,
        "created_at": r.created_at,
        "updated_at": r.updated_at,
        "fingerprint": r.fingerprint.to_hex(),
        "last_errors": r.history,
    })
}

/// `text` as a terminal shows it safely: every control character (escape
/// sequences, carriage returns, newlines, bidi controls...) written as a Rust
/// escape (`\u{1b}`), the backslash doubled, anything else as it is.
pub(crate) fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}');
        if c == '\\' {
            out.push_str("\\\\");
        } else if c.is_control() || bidi {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}
