//! `webhook-guard send`: sign a test event as a provider would and post it to a
//! local endpoint, once, several times (concurrently), or on the provider's retry
//! schedule compressed in time.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use clap::{Args, ValueEnum};
use webhook_guard::store::FencingToken;
use webhook_guard::verify::{
    Discord, GitHub, HubSpot, Jamm, Linear, Meta, Paddle, Provider, Shopify, Slack,
    StandardWebhooks, Stripe, Twilio, Twitch, Zoom,
};
use webhook_guard::RequestHead;

use crate::http::{Reply, Target};
use crate::samples::{random_hex, Extra};
use crate::Fail;

/// Arguments of `send`.
// No `Debug`: it holds the signing secret.
#[derive(Args)]
pub(crate) struct SendArgs {
    /// Whose signing scheme to use: stripe, standard, github, shopify, slack, jamm,
    /// paddle, linear, square, sendgrid, adyen, mailgun, intercom, gitlab, typeform,
    /// calendly, dropbox, zoom, meta, twitch, discord, twilio or hubspot. For discord
    /// the secret is the signing key (hex of its 32-byte seed) whose public key the
    /// receiver holds; twilio and hubspot sign the --url as given.
    #[arg(long, value_name = "PROVIDER")]
    provider: Provider,
    /// The signing secret the receiver is configured with (for sendgrid: the base64
    /// P-256 private key that signs; its public key is printed; for gitlab: the
    /// secret token). Prefer the environment variable or --secret-file: command-line arguments are
    /// visible to other local users.
    #[arg(
        long,
        env = "WEBHOOK_GUARD_SECRET",
        hide_env_values = true,
        value_name = "SECRET",
        required_unless_present = "secret_file"
    )]
    secret: Option<String>,
    /// A file holding the signing secret (one trailing line end is ignored); it
    /// takes precedence over --secret and the environment.
    #[arg(long, value_name = "PATH")]
    secret_file: Option<std::path::PathBuf>,
    /// The endpoint: http://127.0.0.1:PORT/path (loopback only unless --allow-remote).
    #[arg(long, value_name = "URL")]
    url: String,
    /// For square, which signs it: the notification URL the receiver is configured
    /// with, when it differs from --url (a proxy in between). Default: --url.
    #[arg(long, value_name = "URL")]
    notification_url: Option<String>,
    /// The event id (default: a fresh random id in the provider's format).
    #[arg(long, value_name = "ID")]
    event_id: Option<String>,
    /// The body to send instead of the provider's sample event. For jamm: the
    /// `content` object, wrapped in a signed envelope. For stripe, slack and paddle
    /// the event id is the one inside the file.
    #[arg(long, value_name = "FILE")]
    body_file: Option<PathBuf>,
    /// Send the same event N more times (each delivery signed afresh), at most
    /// 100,000.
    #[arg(long, default_value_t = 0, value_name = "N",
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    duplicates: u32,
    /// How many deliveries may be in flight at once.
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=256))]
    concurrency: u32,
    /// Re-send until the first 2xx on a provider's published retry schedule.
    #[arg(long, value_enum, value_name = "SCHEDULE",
          conflicts_with_all = ["duplicates", "concurrency"])]
    retry_schedule: Option<Schedule>,
    /// Time compression of the retry schedule: a factor (3600 turns each hour into
    /// a second) or `<seconds>s/h` (`0.5s/h`).
    #[arg(long, default_value = "3600", value_name = "FACTOR",
          value_parser = parse_compress, requires = "retry_schedule")]
    compress: f64,
    /// How long to wait for each answer, in seconds.
    #[arg(long, default_value_t = 30, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
    /// Allow a non-loopback host (plain HTTP on a trusted network only).
    #[arg(long)]
    allow_remote: bool,
    /// Print each request's headers (signatures, never the secret).
    #[arg(short, long)]
    verbose: bool,
}

/// A provider's published retry schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Schedule {
    /// 20 attempts: 1 h, then doubling, capped at 3 h (about 2¼ days).
    Jamm,
    /// Exponential over 72 hours (Stripe publishes no exact schedule: 1 h doubling,
    /// the last attempt at 72 h; 8 attempts).
    Stripe,
}

impl Schedule {
    /// The waits before the 2nd, 3rd, ... attempt.
    fn delays(self) -> Vec<Duration> {
        const H: u64 = 3600;
        match self {
            Self::Jamm => (0..19)
                .map(|i| Duration::from_secs((H << i.min(2)).min(3 * H)))
                .collect(),
            Self::Stripe => {
                let (mut out, mut at, mut wait) = (Vec::new(), 0, H);
                while at < 72 * H {
                    let step = wait.min(72 * H - at);
                    out.push(Duration::from_secs(step));
                    at += step;
                    wait *= 2;
                }
                out
            }
        }
    }
}

fn parse_compress(text: &str) -> Result<f64, String> {
    let factor = match text.strip_suffix("s/h") {
        Some(secs) => secs
            .parse::<f64>()
            .map(|s| 3600.0 / s)
            .map_err(|_| format!("`{text}` is not <seconds>s/h"))?,
        None => text
            .parse::<f64>()
            .map_err(|_| format!("`{text}` is not a factor"))?,
    };
    if factor.is_finite() && factor >= 1.0 {
        Ok(factor)
    } else {
        Err("the compression must make time pass no slower (a factor of at least 1)".into())
    }
}

/// A preset keyed with the secret, to sign with.
enum Signer {
    Stripe(Stripe),
    Standard(StandardWebhooks),
    GitHub(GitHub),
    Shopify(Shopify),
    Slack(Slack),
    Jamm(Jamm),
    Paddle(Paddle),
    Linear(Linear),
    /// Square, SendGrid, Adyen, Mailgun, Intercom, GitLab, Typeform, Calendly, Dropbox.
    Extra(Extra),
    Zoom(Zoom),
    Meta(Meta),
    Twitch(Twitch),
    /// The signing key (hex).
    Discord(String),
    /// The preset and the URL it signs (the one posted to).
    Twilio(Twilio, String),
    HubSpot(HubSpot, String),
}

/// One event: its body (fixed across deliveries, but for the time Linear puts in
/// each one: see [`Signer::delivery`]) and its id.
struct Event {
    id: String,
    body: Vec<u8>,
}

/// A random (version 4) UUID, hyphenated and lowercase, as GitHub, Shopify and
/// Linear write their delivery ids.
fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl Signer {
    /// The signer of `provider` keyed with `secret`; `url` is the notification URL
    /// (Square signs it).
    fn new(provider: Provider, secret: &str, url: &str) -> Result<Self, String> {
        if let Some(extra) = Extra::new(provider, secret, url) {
            return extra.map(Self::Extra);
        }
        let key = |e: webhook_guard::verify::KeyError| format!("--secret: {e}");
        let s = [secret];
        // The public URL these presets are configured with: the URL without query.
        let base = url.split(['?', '#']).next().unwrap_or(url);
        let bad_url = |e: webhook_guard::verify::KeyError| format!("--url: {e}");
        Ok(match provider {
            Provider::Stripe => Self::Stripe(Stripe::new(s).map_err(key)?),
            Provider::Standard => Self::Standard(StandardWebhooks::new(s).map_err(key)?),
            Provider::GitHub => Self::GitHub(GitHub::new(s).map_err(key)?),
            Provider::Shopify => Self::Shopify(Shopify::new(s).map_err(key)?),
            Provider::Slack => Self::Slack(Slack::new(s).map_err(key)?),
            Provider::Jamm => Self::Jamm(Jamm::new(s).map_err(key)?),
            Provider::Paddle => Self::Paddle(Paddle::new(s).map_err(key)?),
            Provider::Linear => Self::Linear(Linear::new(s).map_err(key)?),
            Provider::Zoom => Self::Zoom(Zoom::new(s).map_err(key)?),
            Provider::Meta => Self::Meta(Meta::new(s).map_err(key)?),
            Provider::Twitch => Self::Twitch(Twitch::new(s).map_err(key)?),
            Provider::Discord => {
                Discord::public_key(secret).map_err(key)?;
                Self::Discord(secret.to_owned())
            }
            Provider::Twilio => {
                Self::Twilio(Twilio::new(base, s).map_err(bad_url)?, url.to_owned())
            }
            Provider::HubSpot => {
                Self::HubSpot(HubSpot::new(base, s).map_err(bad_url)?, url.to_owned())
            }
            _ => return Err(format!("`send` does not know how {provider} signs yet")),
        })
    }

    /// The body field holding the event id, for providers that put it there.
    fn id_field(&self) -> Option<&'static str> {
        match self {
            Self::Stripe(_) | Self::Discord(_) => Some("id"),
            Self::Slack(_) | Self::Paddle(_) => Some("event_id"),
            Self::Extra(extra) => extra.id_field(),
            _ => None,
        }
    }

    /// Whether the receiver's id is a digest of the body (the provider sends none).
    fn derives_id(&self) -> bool {
        matches!(self, Self::Zoom(_) | Self::Meta(_) | Self::HubSpot(..))
    }

    /// The id the receiving preset finds in a delivery of `body`: what the
    /// signer's own preset (keyed as the receiver is) verifies it to, signed now.
    fn receiver_id(&self, body: &[u8]) -> Option<String> {
        let now = Utc::now();
        let event = Event {
            id: String::new(),
            body: body.to_vec(),
        };
        let (headers, body) = self.delivery(&event, now.timestamp(), 0);
        let (verifier, target): (&dyn webhook_guard::verify::Verifier, &str) = match self {
            Self::Zoom(z) => (z, "/"),
            Self::Meta(m) => (m, "/"),
            Self::HubSpot(h, url) => (h, target_of(url)),
            _ => return None,
        };
        let head = RequestHead::new(&headers[..], "POST", target);
        verifier.verify(&head, &body, now).ok()?.event_id
    }

    /// The event to send: the file's body or a sample, with its id.
    fn event(&self, id: Option<String>, file: Option<Vec<u8>>) -> Result<Event, String> {
        if let (Self::Extra(extra), Some(_)) = (self, &file) {
            if let Some(why) = extra.refuses_body_file() {
                return Err(format!("--body-file: {why}"));
            }
        }
        if self.derives_id() {
            if id.is_some() {
                return Err(
                    "--event-id cannot be used here: this provider sends no id, and the \
                     receiver's id is a digest of the body"
                        .into(),
                );
            }
            let mut event = self.sample(String::new(), file)?;
            event.id = self
                .receiver_id(&event.body)
                .unwrap_or_else(|| "(no id for this body)".into());
            return Ok(event);
        }
        self.sample_or_file(id, file)
    }

    /// [`Signer::event`] for a provider that sends its own id.
    fn sample_or_file(&self, id: Option<String>, file: Option<Vec<u8>>) -> Result<Event, String> {
        if let (Some(field), Some(body)) = (self.id_field(), &file) {
            if id.is_some() {
                return Err(format!(
                    "--event-id cannot be used with --body-file here: the id is the \
                     body's `{field}` field; edit the file instead"
                ));
            }
            let id = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.get(field)?.as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("(no `{field}` field in the body)"));
            return Ok(Event {
                id,
                body: body.clone(),
            });
        }
        if let Self::Extra(extra) = self {
            let (id, body) = extra.event(id, file);
            return Ok(Event { id, body });
        }
        let id = id.unwrap_or_else(|| match self {
            Self::Stripe(_) => format!("evt_test_{}", random_hex(24)),
            Self::Standard(_) => format!("msg_{}", random_hex(27)),
            Self::GitHub(_) | Self::Shopify(_) | Self::Linear(_) => uuid(),
            Self::Slack(_) => format!("Ev{}", random_hex(10).to_uppercase()),
            Self::Jamm(_) => format!("mwh-{}", uuid()),
            Self::Paddle(_) => format!("evt_{}", random_hex(26)),
            Self::Extra(_) => unreachable!("answered above"),
            Self::Twitch(_) | Self::Twilio(..) => uuid(),
            Self::Discord(_) => snowflake(),
            Self::Zoom(_) | Self::Meta(_) | Self::HubSpot(..) => String::new(),
        });
        self.sample(id, file)
    }

    /// The file's body, or the provider's sample event carrying `id`.
    fn sample(&self, id: String, file: Option<Vec<u8>>) -> Result<Event, String> {
        let now = Utc::now();
        let secs = now.timestamp();
        let rfc = now.to_rfc3339_opts(SecondsFormat::Secs, true);
        let q = |s: &str| serde_json::to_string(s).expect("strings serialize");
        let body = match (self, file) {
            (Self::Jamm(jamm), content) => {
                let content = match content {
                    Some(c) => String::from_utf8(c)
                        .map_err(|_| "--body-file: jamm content must be UTF-8 JSON")?,
                    None => r#"{"charge":{"id":"trx-test","status":"SUCCESS","amount":2000,"currency":"JPY"}}"#
                        .to_owned(),
                };
                jamm.envelope(&id, "EVENT_TYPE_CHARGE_SUCCESS", content.trim(), &rfc)
                    .into_bytes()
            }
            (_, Some(body)) => body,
            (Self::Stripe(_), None) => format!(
                r#"{{"id":{},"object":"event","api_version":"2024-06-20","created":{secs},"livemode":false,"type":"payment_intent.succeeded","data":{{"object":{{"id":"pi_test","object":"payment_intent","amount":2000,"currency":"usd","status":"succeeded"}}}}}}"#,
                q(&id)
            )
            .into_bytes(),
            (Self::Standard(_), None) => format!(
                r#"{{"type":"invoice.paid","timestamp":{},"data":{{"id":"inv_test","amount":2000,"currency":"usd"}}}}"#,
                q(&rfc)
            )
            .into_bytes(),
            (Self::GitHub(_), None) => br#"{"action":"opened","issue":{"number":1,"title":"Test issue"},"repository":{"full_name":"octo-org/hello-world"},"sender":{"login":"octocat"}}"#
                .to_vec(),
            (Self::Shopify(_), None) => br#"{"id":820982911946154508,"email":"jon@example.com","total_price":"20.00","currency":"USD","financial_status":"paid"}"#
                .to_vec(),
            (Self::Slack(_), None) => format!(
                r#"{{"token":"test","team_id":"T0001","api_app_id":"A0001","event":{{"type":"app_mention","user":"U0001","text":"hello","ts":"{secs}.000100"}},"type":"event_callback","event_id":{},"event_time":{secs}}}"#,
                q(&id)
            )
            .into_bytes(),
            (Self::Paddle(_), None) => format!(
                r#"{{"event_id":{},"event_type":"transaction.completed","occurred_at":{},"notification_id":"ntf_test","data":{{"id":"txn_test","status":"completed"}}}}"#,
                q(&id),
                q(&rfc)
            )
            .into_bytes(),
            (Self::Extra(_), None) => unreachable!("answered above"),
            (Self::Linear(_), None) => format!(
                r#"{{"action":"create","type":"Issue","data":{{"id":"issue-test","title":"Test issue"}},"createdAt":{},"webhookTimestamp":{},"webhookId":"webhook-test"}}"#,
                q(&rfc),
                now.timestamp_millis()
            )
            .into_bytes(),
            (Self::Zoom(_), None) => format!(
                r#"{{"event":"meeting.started","event_ts":{},"payload":{{"account_id":"test","object":{{"id":"{}","uuid":"{}","topic":"Test meeting"}}}}}}"#,
                now.timestamp_millis(),
                10_000_000_000u64 + FencingToken::random().0 % 80_000_000_000,
                random_hex(22)
            )
            .into_bytes(),
            (Self::Meta(_), None) => format!(
                r#"{{"object":"whatsapp_business_account","entry":[{{"id":"0","changes":[{{"field":"messages","value":{{"messaging_product":"whatsapp","messages":[{{"id":"wamid.{}","from":"15550001111","timestamp":"{secs}","type":"text","text":{{"body":"hello"}}}}]}}}}]}}]}}"#,
                random_hex(32)
            )
            .into_bytes(),
            (Self::Twitch(_), None) => format!(
                r#"{{"subscription":{{"id":{},"status":"enabled","type":"channel.follow","version":"2","condition":{{"broadcaster_user_id":"1337","moderator_user_id":"1337"}},"transport":{{"method":"webhook","callback":"https://example.com/twitch"}},"created_at":{}}},"event":{{"user_id":"1234","user_login":"cool_user","user_name":"Cool_User","broadcaster_user_id":"1337","broadcaster_user_login":"cooler_user","broadcaster_user_name":"Cooler_User","followed_at":{}}}}}"#,
                q(&uuid()),
                q(&rfc),
                q(&rfc)
            )
            .into_bytes(),
            (Self::Discord(_), None) => format!(
                r#"{{"id":{},"type":2,"application_id":"1","token":"test-token","version":1,"data":{{"id":"1","name":"test","type":1}}}}"#,
                q(&id)
            )
            .into_bytes(),
            (Self::Twilio(..), None) => format!(
                "MessageSid=SM{}&AccountSid=AC{}&From=%2B15005550006&To=%2B15005550010&Body=Hello+from+webhook-guard&NumMedia=0",
                random_hex(32),
                random_hex(32)
            )
            .into_bytes(),
            (Self::HubSpot(..), None) => format!(
                r#"[{{"eventId":{},"subscriptionId":1,"portalId":1,"appId":1,"occurredAt":{},"subscriptionType":"contact.creation","attemptNumber":0,"objectId":{},"changeFlag":"CREATED","changeSource":"CRM"}}]"#,
                FencingToken::random().0 % 4_000_000_000,
                now.timestamp_millis(),
                FencingToken::random().0 % 100_000_000
            )
            .into_bytes(),
        };
        Ok(Event { id, body })
    }

    /// One delivery of `event` at `now` (Unix seconds): its headers, signed, and its
    /// body. Linear puts the time of each delivery in its body (`webhookTimestamp`,
    /// checked against a 60 s tolerance): a body that has one gets it anew. `retry`
    /// counts earlier attempts (Slack announces retries).
    fn delivery<'e>(
        &self,
        event: &'e Event,
        now: i64,
        retry: u32,
    ) -> (Vec<(String, String)>, std::borrow::Cow<'e, [u8]>) {
        let body = match self {
            Self::Linear(_) => linear_body(&event.body, now),
            Self::Extra(extra) => extra.body(&event.body, now),
            _ => std::borrow::Cow::Borrowed(&event.body[..]),
        };
        let headers = self.headers(&event.id, &body, now, retry);
        (headers, body)
    }

    fn headers(&self, id: &str, body: &[u8], now: i64, retry: u32) -> Vec<(String, String)> {
        let id = id.to_owned();
        let own = |v: Vec<(&'static str, String)>| {
            v.into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<Vec<_>>()
        };
        let mut headers = match self {
            Self::Stripe(s) => own(vec![
                ("Stripe-Signature", s.sign(body, now)),
                ("User-Agent", "Stripe/1.0 (webhook-guard send)".into()),
            ]),
            Self::Standard(s) => own(s.sign_headers(&id, now, body)),
            Self::GitHub(s) => own(vec![
                ("X-GitHub-Event", "issues".into()),
                ("X-GitHub-Delivery", id),
                ("X-GitHub-Hook-ID", "1".into()),
                ("X-Hub-Signature-256", s.sign(body)),
                ("User-Agent", "GitHub-Hookshot/webhook-guard".into()),
            ]),
            Self::Shopify(s) => own(vec![
                ("X-Shopify-Topic", "orders/create".into()),
                ("X-Shopify-Hmac-Sha256", s.sign(body)),
                ("X-Shopify-Shop-Domain", "example.myshopify.com".into()),
                ("X-Shopify-Webhook-Id", id),
                (
                    "X-Shopify-Triggered-At",
                    chrono::DateTime::from_timestamp(now, 0)
                        .unwrap_or_default()
                        .to_rfc3339_opts(SecondsFormat::Secs, true),
                ),
            ]),
            Self::Slack(s) => {
                let mut h = s.sign_headers(now, body);
                if retry > 0 {
                    h.push(("X-Slack-Retry-Num", retry.to_string()));
                    h.push(("X-Slack-Retry-Reason", "http_error".into()));
                }
                own(h)
            }
            Self::Jamm(_) => Vec::new(),
            Self::Paddle(s) => own(vec![("Paddle-Signature", s.sign(now, body))]),
            Self::Linear(s) => own(vec![
                ("Linear-Signature", s.sign(body)),
                ("Linear-Delivery", id),
                ("Linear-Event", "Issue".into()),
            ]),
            Self::Extra(extra) => extra.headers(&id, body, now),
            Self::Zoom(s) => own(s.sign_headers(now, body)),
            Self::Meta(s) => own(vec![("X-Hub-Signature-256", s.sign(body))]),
            Self::Twitch(s) => {
                let at = chrono::DateTime::from_timestamp(now, 0)
                    .unwrap_or_default()
                    .to_rfc3339_opts(SecondsFormat::Nanos, true);
                let mut h = s.sign_headers(&id, &at, "notification", body);
                h.push(("Twitch-Eventsub-Subscription-Type", "channel.follow".into()));
                h.push(("Twitch-Eventsub-Subscription-Version", "2".into()));
                own(h)
            }
            Self::Discord(key) => {
                own(Discord::sign_headers(key, now, body).expect("the key was checked at start"))
            }
            Self::Twilio(s, url) => own(vec![
                ("X-Twilio-Signature", s.sign(url, body)),
                ("I-Twilio-Idempotency-Token", id),
            ]),
            Self::HubSpot(s, url) => {
                own(s.sign_headers("POST", url, body, now.saturating_mul(1000)))
            }
        };
        let content_type = match self {
            Self::Twilio(..) => "application/x-www-form-urlencoded",
            _ => "application/json",
        };
        headers.push(("Content-Type".into(), content_type.into()));
        headers
    }
}

/// The path and query of `url` (`/` without one).
fn target_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.find('/').map_or("/", |at| &rest[at..])
}

/// A random id in the shape of a Discord snowflake (19 digits).
fn snowflake() -> String {
    (1_000_000_000_000_000_000u64 + FencingToken::random().0 % 8_000_000_000_000_000_000)
        .to_string()
}

struct Sender {
    signer: Signer,
    event: Event,
    target: Target,
    timeout: Duration,
    verbose: bool,
}

/// `body` with its `webhookTimestamp` set to `now` (in milliseconds), if it is a
/// JSON object that has one; else `body` as it is.
fn linear_body(body: &[u8], now: i64) -> std::borrow::Cow<'_, [u8]> {
    let Ok(serde_json::Value::Object(mut fields)) = serde_json::from_slice(body) else {
        return std::borrow::Cow::Borrowed(body);
    };
    match fields.get_mut("webhookTimestamp") {
        Some(t) => *t = now.saturating_mul(1000).into(),
        None => return std::borrow::Cow::Borrowed(body),
    }
    std::borrow::Cow::Owned(serde_json::to_vec(&fields).expect("a JSON object serializes"))
}

impl Sender {
    async fn deliver(&self, retry: u32) -> (Vec<(String, String)>, Result<Reply, String>) {
        let (headers, body) = self
            .signer
            .delivery(&self.event, Utc::now().timestamp(), retry);
        let reply = self.target.post(&headers, &body, self.timeout).await;
        (headers, reply)
    }

    fn report(&self, label: &str, headers: &[(String, String)], reply: &Result<Reply, String>) {
        if self.verbose {
            for (k, v) in headers {
                println!("{label} > {k}: {v}");
            }
        }
        match reply {
            Ok(r) => {
                let body: String = r.body.trim().chars().take(300).collect();
                println!("{label} {} {}  {body}", r.status, r.reason);
            }
            Err(e) => println!("{label} failed: {e}"),
        }
    }
}

/// The outcome word of a guard's JSON answer, or the status alone.
fn outcome_of(reply: &Result<Reply, String>) -> String {
    match reply {
        Ok(r) => {
            let outcome = serde_json::from_str::<serde_json::Value>(&r.body)
                .ok()
                .and_then(|v| v.get("outcome")?.as_str().map(str::to_owned));
            match outcome {
                Some(o) => format!("{} {o}", r.status),
                None => r.status.to_string(),
            }
        }
        Err(_) => "no answer".into(),
    }
}

fn is_success(reply: &Result<Reply, String>) -> bool {
    matches!(reply, Ok(r) if (200..300).contains(&r.status))
}

/// Runs `send`.
pub(crate) async fn run(args: SendArgs) -> Result<ExitCode, Fail> {
    let secret = crate::files::value_or_file(
        args.secret.as_deref(),
        args.secret_file.as_deref(),
        "secret",
    )?;
    let notification_url = args.notification_url.as_deref().unwrap_or(&args.url);
    let signer = Signer::new(args.provider, &secret, notification_url).map_err(Fail::Usage)?;
    if let Signer::Extra(extra) = &signer {
        if let Some(note) = extra.note() {
            println!("{note}");
        }
    }
    let file = match &args.body_file {
        Some(path) => Some(
            std::fs::read(path)
                .map_err(|e| Fail::Usage(format!("--body-file {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let event = signer.event(args.event_id, file).map_err(Fail::Usage)?;
    let target = Target::resolve(&args.url, args.allow_remote)
        .await
        .map_err(Fail::Usage)?;
    println!(
        "{} event {} ({} bytes) -> POST {}",
        args.provider,
        event.id,
        event.body.len(),
        target.url
    );
    let sender = Arc::new(Sender {
        signer,
        event,
        target,
        timeout: Duration::from_secs(args.timeout),
        verbose: args.verbose,
    });
    let accepted = match args.retry_schedule {
        Some(schedule) => retry(&sender, schedule, args.compress).await,
        None => burst(&sender, args.duplicates, args.concurrency).await,
    };
    Ok(if accepted {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Sends `1 + duplicates` deliveries, `concurrency` at a time. True if any got a 2xx.
async fn burst(sender: &Arc<Sender>, duplicates: u32, concurrency: u32) -> bool {
    let total = duplicates + 1;
    let width = total.to_string().len();
    let deliver = |n: u32| {
        let sender = sender.clone();
        async move {
            let (headers, reply) = sender.deliver(0).await;
            sender.report(&format!("[{n:>width$}/{total}]"), &headers, &reply);
            (outcome_of(&reply), is_success(&reply))
        }
    };
    let mut results = Vec::new();
    if concurrency == 1 {
        for n in 1..=total {
            results.push(deliver(n).await);
        }
    } else {
        let gate = Arc::new(tokio::sync::Semaphore::new(concurrency as usize));
        let mut tasks = tokio::task::JoinSet::new();
        for n in 1..=total {
            let permit = gate.clone().acquire_owned().await.expect("never closed");
            let delivery = deliver(n);
            tasks.spawn(async move {
                let result = delivery.await;
                drop(permit);
                result
            });
        }
        while let Some(done) = tasks.join_next().await {
            results.push(done.expect("send task"));
        }
    }
    let mut tally: BTreeMap<String, u32> = BTreeMap::new();
    let mut accepted = false;
    for (outcome, ok) in results {
        *tally.entry(outcome).or_default() += 1;
        accepted |= ok;
    }
    if total > 1 {
        let parts: Vec<String> = tally.iter().map(|(k, v)| format!("{v} × {k}")).collect();
        println!("{total} deliveries: {}", parts.join(", "));
    }
    accepted
}

/// Sends on `schedule`, compressed `compress` times, until the first 2xx.
async fn retry(sender: &Sender, schedule: Schedule, compress: f64) -> bool {
    let delays = schedule.delays();
    let attempts = delays.len() + 1;
    let mut elapsed = Duration::ZERO;
    for attempt in 1..=attempts {
        if attempt > 1 {
            let wait = delays[attempt - 2];
            elapsed += wait;
            let real = wait.div_f64(compress);
            println!(
                "waiting {} ({:.3}s compressed); next attempt at +{}",
                human(wait),
                real.as_secs_f64(),
                human(elapsed)
            );
            tokio::time::sleep(real).await;
        }
        let retry = u32::try_from(attempt - 1).unwrap_or(u32::MAX);
        let (headers, reply) = sender.deliver(retry).await;
        sender.report(&format!("[attempt {attempt}/{attempts}]"), &headers, &reply);
        if is_success(&reply) {
            println!("accepted on attempt {attempt} of {attempts}");
            return true;
        }
    }
    println!("gave up after {attempts} attempts over {}", human(elapsed));
    false
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s % 3600 / 60) {
        (0, m) => format!("{m}m"),
        (h, 0) => format!("{h}h"),
        (h, m) => format!("{h}h{m:02}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_match_the_providers() {
        let jamm = Schedule::Jamm.delays();
        assert_eq!(jamm.len() + 1, 20);
        assert_eq!(jamm[0].as_secs(), 3600);
        assert_eq!(jamm[1].as_secs(), 7200);
        assert!(jamm[2..].iter().all(|d| d.as_secs() == 3 * 3600));
        let stripe = Schedule::Stripe.delays();
        let total: u64 = stripe.iter().map(Duration::as_secs).sum();
        assert_eq!(total, 72 * 3600);
        assert!(stripe.windows(2).take(5).all(|w| w[1] == w[0] * 2));
    }

    #[test]
    fn compression() {
        assert_eq!(parse_compress("3600").unwrap(), 3600.0);
        assert_eq!(parse_compress("0.5s/h").unwrap(), 7200.0);
        assert!(parse_compress("0").is_err());
        assert!(parse_compress("fast").is_err());
    }

    #[test]
    fn jamm_sample_has_its_target_object() {
        let signer = Signer::new(Provider::Jamm, Provider::Jamm.sample_secret(), URL).unwrap();
        let event = signer.event(None, None).unwrap();
        let meta = webhook_guard::meta::MetaExtractor::jamm().extract(&event.body);
        assert_eq!(meta.object.as_deref(), Some("trx-test"));
        assert_eq!(meta.family.as_deref(), Some("charge"));
        assert!(meta.created_at.is_some());
    }

    const URL: &str = "http://127.0.0.1:3000/hook";
    /// RFC 8032's first key pair's seed: `send` signs with it, the receiver holds
    /// its public key.
    const SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";

    /// The secret `send` signs with, and the one the receiver verifies with.
    fn secrets(provider: Provider) -> (String, String) {
        let same = |s: &str| (s.to_owned(), s.to_owned());
        match provider {
            Provider::Standard => same(provider.sample_secret()),
            Provider::Adyen => {
                same("44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056")
            }
            #[cfg(feature = "ed25519")]
            Provider::Discord => (SEED.to_owned(), Discord::public_key(SEED).unwrap()),
            Provider::SendGrid => {
                let private = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";
                let public = webhook_guard::verify::SendGrid::public_key_of(private).unwrap();
                (private.to_owned(), public)
            }
            _ => same(provider.sample_secret()),
        }
    }

    #[test]
    fn every_provider_signs_a_sample_its_preset_accepts() {
        const URL: &str = "http://127.0.0.1:9/hooks/in?tenant=a%3Ab";
        // RFC 8032's first key pair.
        for provider in Provider::ALL {
            let (signing, verifying) = secrets(provider);
            let signer = Signer::new(provider, &signing, URL).unwrap();
            let event = signer.event(None, None).unwrap();
            let now = Utc::now();
            let (headers, body) = signer.delivery(&event, now.timestamp(), 0);
            // Square signs the notification URL as posted; Twilio and HubSpot the
            // endpoint's URL with the request's own query.
            let endpoint = match provider {
                Provider::Square => URL,
                _ => "http://127.0.0.1:9/hooks/in",
            };
            let verifier = provider
                .verifier_with_url(endpoint, [verifying.as_str()])
                .unwrap();
            let head = RequestHead::new(&headers[..], "POST", "/hooks/in?tenant=a%3Ab");
            let verified = verifier
                .verify(&head, &body, now)
                .unwrap_or_else(|e| panic!("{provider}: {e}"));
            assert_eq!(verified.handshake, None, "{provider}");
            let id = verified
                .event_id
                .unwrap_or_else(|| panic!("{provider}: no id"));
            assert!(!event.id.is_empty(), "{provider}");
            match provider {
                // An id per delivery: Mailgun's token, Dropbox's time and MAC.
                Provider::Mailgun | Provider::Dropbox => {
                    let later = now + chrono::TimeDelta::seconds(1);
                    let (headers, body) = signer.delivery(&event, later.timestamp(), 1);
                    let again = verifier.verify(&headers, &body, later).unwrap();
                    assert_ne!(again.event_id.as_deref(), Some(id.as_str()), "{provider}");
                }
                _ => assert_eq!(id, event.id, "{provider}"),
            }
        }
    }

    #[test]
    fn square_signs_the_notification_url_and_adyen_refuses_a_body_file() {
        let signer = Signer::new(
            Provider::Square,
            "Ibxx_5AKakO-3qeNVR61Dw",
            "https://example.com/sq",
        )
        .unwrap();
        let event = signer.event(None, None).unwrap();
        let now = Utc::now();
        let (headers, body) = signer.delivery(&event, now.timestamp(), 0);
        let at = |url| {
            Provider::Square
                .verifier_with_url(url, ["Ibxx_5AKakO-3qeNVR61Dw"])
                .unwrap()
                .verify(&headers, &body, now)
        };
        assert!(at("https://example.com/sq").is_ok());
        assert!(at("https://example.com/other").is_err());
        let adyen = Signer::new(Provider::Adyen, &secrets(Provider::Adyen).0, URL).unwrap();
        let err = adyen.event(None, Some(b"{}".to_vec())).err().unwrap();
        assert!(err.contains("adyen"), "{err}");
        assert!(Signer::new(Provider::SendGrid, "not a key", URL).is_err());
    }

    #[test]
    fn derived_ids_refuse_an_event_id() {
        for provider in [Provider::Zoom, Provider::Meta, Provider::HubSpot] {
            let signer =
                Signer::new(provider, provider.sample_secret(), "http://127.0.0.1:9/h").unwrap();
            assert!(signer.event(Some("x".into()), None).is_err(), "{provider}");
        }
        assert!(Signer::new(Provider::Discord, "not hex", "http://127.0.0.1:9/h").is_err());
        assert!(Signer::new(
            Provider::Twilio,
            Provider::Twilio.sample_secret(),
            "127.0.0.1:9/h"
        )
        .is_err());
    }

    /// Linear's tolerance is 60 s on the time in the body: a later delivery of the
    /// same event carries its own time, and verifies then.
    #[test]
    fn a_linear_redelivery_carries_its_own_time() {
        let signer = Signer::new(Provider::Linear, Provider::Linear.sample_secret(), URL).unwrap();
        let event = signer.event(None, None).unwrap();
        let later = Utc::now() + chrono::TimeDelta::seconds(120);
        let (headers, body) = signer.delivery(&event, later.timestamp(), 1);
        Provider::Linear
            .verifier([Provider::Linear.sample_secret()])
            .unwrap()
            .verify(&headers, &body, later)
            .expect("verifies at its own time");
    }
}
