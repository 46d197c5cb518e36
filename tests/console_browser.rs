//! The operator console as a person uses it: `examples/console.rs` runs on
//! loopback, signed Stripe deliveries make records in every state, and a headless
//! Chromium, driven through chromedriver (WebDriver), reads and acts on them.
//!
//! Needs `WEBHOOK_GUARD_CHROMEDRIVER_URL` (scripts/services.sh's
//! `wg_start_chromedriver`, which scripts/test.sh runs) and the example built
//! (`cargo test --all-features` builds it; alone: `cargo build --example console
//! --features console`). Without chromedriver the test fails in CI (`CI` set) and
//! is skipped elsewhere, saying so. Screenshots of the overview and of a record
//! go to `target/console-screenshots/`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use webhook_guard::verify::Stripe;

const SECRET: &str = "whsec_consolebrowsertest00000000000000";
const USER: &str = "ops";
const PASSWORD: &str = "correct-horse-battery-staple";
/// What the hostile id would set if any of it ran as script.
const HOSTILE: &str =
    r#"<img src=x onerror="window.__wg_xss=1"><script>window.__wg_xss=2</script>"#;

/// The example, killed on drop; its output collected for the audit lines.
struct Example {
    child: Child,
    addr: String,
    output: Arc<Mutex<String>>,
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn target_dir() -> PathBuf {
    // target/debug/deps/console_browser-<hash>
    let exe = std::env::current_exe().expect("the test's path");
    exe.ancestors().nth(3).expect("target/").to_path_buf()
}

fn start_example() -> Example {
    let exe = std::env::current_exe().expect("the test's path");
    let bin = exe
        .ancestors()
        .nth(2)
        .expect("target/debug")
        .join("examples/console");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build --example console --features console`",
        bin.display()
    );
    let mut child = Command::new(&bin)
        .env("ADDR", "127.0.0.1:0")
        .env("CONSOLE_PASSWORD", PASSWORD)
        .env("STRIPE_WEBHOOK_SECRET", SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the console example");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines
        .next()
        .and_then(Result::ok)
        .expect("the example prints where it listens");
    let addr = first
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_owned();
    let output = Arc::new(Mutex::new(String::new()));
    let sink = output.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let mut out = sink.lock().unwrap();
            out.push_str(&line);
            out.push('\n');
        }
    });
    Example {
        child,
        addr,
        output,
    }
}

/// One HTTP/1.1 request on a fresh connection: (status, headers, body).
async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    (status, head.to_ascii_lowercase(), body.to_owned())
}

fn basic() -> (&'static str, String) {
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    ("Authorization", format!("Basic {pair}"))
}

/// Sends a Stripe-signed event; answers the status and the outcome the body names.
async fn deliver(addr: &str, path: &str, id: &str, kind: &str) -> (u16, String) {
    let body =
        json!({"id": id, "object": "event", "type": kind, "data": {"object": {"id": "pi_1"}}})
            .to_string();
    let stripe = Stripe::new([SECRET]).unwrap();
    let signature = stripe.sign(body.as_bytes(), chrono::Utc::now().timestamp());
    let (status, _, answer) = http(
        addr,
        "POST",
        path,
        &[
            ("Stripe-Signature", signature),
            ("Content-Type", "application/json".to_owned()),
        ],
        body.as_bytes(),
    )
    .await;
    let outcome = serde_json::from_str::<Value>(&answer)
        .ok()
        .and_then(|v| v["outcome"].as_str().map(str::to_owned))
        .unwrap_or(answer);
    (status, outcome)
}

/// The console's JSON for `path` (relative to the mount point).
async fn console_json(addr: &str, path: &str) -> Value {
    let sep = if path.contains('?') { '&' } else { '?' };
    let (status, _, body) = http(
        addr,
        "GET",
        &format!("/admin/webhooks/{path}{sep}format=json"),
        &[basic()],
        b"",
    )
    .await;
    assert!(status == 200 || status == 404, "{path}: {status} {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// Waits (for at most a minute: a deadline for failing, not a measurement) until
/// `check` holds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn chromedriver_url() -> Option<String> {
    match std::env::var("WEBHOOK_GUARD_CHROMEDRIVER_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("WEBHOOK_GUARD_CHROMEDRIVER_URL is not set: CI requires the browser test")
        }
        _ => {
            eprintln!(
                "SKIPPED: WEBHOOK_GUARD_CHROMEDRIVER_URL is not set (scripts/services.sh: \
                 wg_start_chromedriver), so the console's browser test did not run"
            );
            None
        }
    }
}

/// A fresh profile directory for this run's Chromium (removed after the test).
fn profile_dir() -> PathBuf {
    target_dir().join(format!("console-chromium-profile-{}", std::process::id()))
}

async fn browser(webdriver: &str) -> Client {
    let profile = profile_dir();
    let _ = std::fs::remove_dir_all(&profile);
    let chromium =
        std::env::var("WEBHOOK_GUARD_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let mut caps = serde_json::Map::new();
    caps.insert("browserName".into(), json!("chrome"));
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--window-size=1280,1000",
                format!("--user-data-dir={}", profile.display()),
            ]
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(webdriver)
        .await
        .expect("a chromium session from chromedriver")
}

async fn text(client: &Client, css: &str) -> String {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .unwrap()
}

/// Clicks what `css` finds (a link or a submit button) and waits until the page it
/// leads to has loaded.
async fn click(client: &Client, css: &str) {
    click_on(client, Locator::Css(css)).await;
}

async fn click_on(client: &Client, locator: Locator<'_>) {
    let before = client.current_url().await.unwrap();
    client
        .find(locator)
        .await
        .unwrap_or_else(|e| panic!("{locator:?}: {e}"))
        .click()
        .await
        .unwrap();
    eventually("the next page loads", || async {
        let now = client.current_url().await.unwrap();
        let ready = client
            .execute("return document.readyState", vec![])
            .await
            .unwrap();
        now != before && ready == json!("complete")
    })
    .await;
}

async fn xss_marker(client: &Client) -> Value {
    client
        .execute("return typeof window.__wg_xss", vec![])
        .await
        .unwrap()
}

fn save(name: &str, png: &[u8]) {
    let dir = target_dir().join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), png).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reads_and_acts_on_deliveries_in_a_browser() {
    let Some(webdriver) = chromedriver_url() else {
        return;
    };
    let example = start_example();
    let addr = example.addr.as_str();
    let hook = "/webhooks/stripe";
    let inbox = "/webhooks/stripe/inbox";

    // Deliveries in every state.
    assert_eq!(
        deliver(addr, hook, "evt_ok_1", "payment_intent.succeeded").await,
        (200, "processed".into())
    );
    assert_eq!(
        deliver(addr, hook, "evt_ok_2", "payment_intent.succeeded").await,
        (200, "processed".into())
    );
    assert_eq!(deliver(addr, hook, "evt_fail_1", "test.fail").await.0, 500);
    assert_eq!(deliver(addr, hook, HOSTILE, "test.fail").await.0, 500);
    for _ in 0..4 {
        assert_eq!(deliver(addr, hook, "evt_esc_1", "test.fail").await.0, 500);
    }
    assert_eq!(
        deliver(addr, hook, "evt_esc_1", "test.fail").await,
        (200, "escalated".into())
    );
    assert_eq!(
        deliver(addr, hook, "evt_perm_1", "test.permanent").await.1,
        "permanent_failure"
    );
    assert_eq!(
        deliver(addr, inbox, "evt_dead_1", "test.outage").await,
        (200, "accepted".into())
    );
    eventually("evt_dead_1 is a dead letter", || async {
        let page = console_json(addr, "records?state=dead_letter").await;
        page["rows"]
            .as_array()
            .is_some_and(|rows| rows.iter().any(|r| r["id"] == "evt_dead_1"))
    })
    .await;

    // Unauthenticated requests are refused, the page and the action alike.
    let (status, head, _) = http(addr, "GET", "/admin/webhooks/overview", &[], b"").await;
    assert_eq!(status, 401);
    assert!(head.contains("www-authenticate: basic"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'none'"),
        "{head}"
    );
    let wrong =
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:wrong-password-x"));
    let (status, _, _) = http(
        addr,
        "GET",
        "/admin/webhooks/overview",
        &[("Authorization", format!("Basic {wrong}"))],
        b"",
    )
    .await;
    assert_eq!(status, 401);
    let (status, _, _) = http(addr, "POST", "/admin/webhooks/forget", &[], b"id=evt_ok_2").await;
    assert_eq!(status, 401);
    let (status, head, _) = http(addr, "GET", "/admin/webhooks/overview", &[basic()], b"").await;
    assert_eq!(status, 200);
    for header in [
        "content-security-policy: default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        "x-frame-options: deny",
        "referrer-policy: no-referrer",
    ] {
        assert!(head.contains(header), "{header} missing from {head}");
    }

    let client = browser(&webdriver).await;
    let base = format!("http://{addr}/admin/webhooks");
    // Without credentials the browser gets no console page.
    client.goto(&format!("{base}/overview")).await.unwrap();
    assert!(client.find(Locator::Css("#counts")).await.is_err());

    // The mount point redirects to the overview; credentials in the URL once, then
    // the browser keeps sending them.
    client
        .goto(&format!("http://{USER}:{PASSWORD}@{addr}/admin/webhooks"))
        .await
        .unwrap();
    assert_eq!(
        client.current_url().await.unwrap().path(),
        "/admin/webhooks/overview"
    );
    for (cell, n) in [
        ("#count-hour-completed", "2"),
        ("#count-day-completed", "2"),
        ("#count-hour-failed", "2"),
        ("#count-hour-escalated", "1"),
        ("#count-hour-permanent_failure", "1"),
        ("#count-hour-dead_letter", "1"),
        ("#open-escalations", "1"),
        ("#dead-letters", "1"),
    ] {
        assert_eq!(text(&client, cell).await, n, "{cell}");
    }
    assert_eq!(
        text(&client, "#unresolved tbody")
            .await
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>(),
        ["evt_esc_1", "open"]
    );
    assert!(client
        .find(Locator::Css("svg.chart rect.bar-day"))
        .await
        .is_ok());
    save("overview.png", &client.screenshot().await.unwrap());

    // Filtering by state: the failed records, the hostile id among them, as text.
    click(&client, "nav a[href='records']").await;
    client
        .find(Locator::Css("select[name=state]"))
        .await
        .unwrap()
        .select_by_value("failed")
        .await
        .unwrap();
    click(&client, "#filter button").await;
    let mut ids = Vec::new();
    for link in client.find_all(Locator::Css("#rows a.id")).await.unwrap() {
        ids.push(link.text().await.unwrap());
    }
    ids.sort();
    assert_eq!(ids, vec![HOSTILE.to_owned(), "evt_fail_1".to_owned()]);
    save("records-failed.png", &client.screenshot().await.unwrap());
    assert_eq!(xss_marker(&client).await, json!("undefined"));
    let injected = client
        .execute(
            "return document.querySelectorAll('main img, main script').length",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(injected, json!(0), "the hostile id became markup");

    // Its record view: id and handler error (which quotes the id) as text.
    click_on(&client, Locator::LinkText(HOSTILE)).await;
    assert_eq!(text(&client, "#record-id").await, HOSTILE);
    assert!(text(&client, "#history")
        .await
        .contains(&format!("ledger service answered 503 for {HOSTILE}")));
    assert_eq!(xss_marker(&client).await, json!("undefined"));
    assert!(client.source().await.unwrap().contains("&lt;img src=x"));

    // The escalated record's history.
    click(&client, "nav a[href='records?state=escalated']").await;
    click(&client, "#rows a.id").await;
    assert_eq!(text(&client, "#record-id").await, "evt_esc_1");
    assert_eq!(text(&client, "#state").await, "escalated");
    assert_eq!(text(&client, "#attempts").await, "5");
    assert_eq!(text(&client, "#escalation-state").await, "open");
    let history = client
        .find_all(Locator::Css("#history tbody tr"))
        .await
        .unwrap();
    assert_eq!(history.len(), 5);
    assert!(text(&client, "#history")
        .await
        .contains("ledger service answered 503 for evt_esc_1"));
    assert!(client.find(Locator::Css("#fingerprint")).await.is_ok());
    save("record.png", &client.screenshot().await.unwrap());

    // Acknowledging, then resolving the escalation, each with its confirmation.
    click(&client, "#acknowledge").await;
    click(&client, "#confirm-submit").await;
    click(&client, "#done-ids a").await;
    assert_eq!(text(&client, "#escalation-state").await, "acknowledged");
    assert!(text(&client, "#escalation-notes")
        .await
        .contains("acknowledged: by \"ops\""));
    assert!(client.find(Locator::Css("#acknowledge")).await.is_err());
    click(&client, "#resolve").await;
    assert_eq!(text(&client, "#confirm-id").await, "evt_esc_1");
    click(&client, "#confirm-submit").await;
    assert_eq!(
        client
            .find(Locator::Css("#result"))
            .await
            .unwrap()
            .attr("data-result")
            .await
            .unwrap(),
        Some("done".to_owned())
    );
    click(&client, "nav a[href='overview']").await;
    assert_eq!(text(&client, "#open-escalations").await, "0");
    assert!(client.find(Locator::Css("#unresolved")).await.is_err());
    client
        .goto(&format!("{base}/record?id=evt_esc_1"))
        .await
        .unwrap();
    assert_eq!(text(&client, "#escalation-state").await, "resolved");

    // Forgetting a record: before, a redelivery is a duplicate; after, it runs again.
    assert_eq!(
        deliver(addr, hook, "evt_ok_1", "payment_intent.succeeded")
            .await
            .1,
        "duplicate"
    );
    client
        .goto(&format!("{base}/record?id=evt_ok_1"))
        .await
        .unwrap();
    click(&client, "#forget").await;
    click(&client, "#confirm-submit").await;
    assert_eq!(
        client
            .find(Locator::Css("#result"))
            .await
            .unwrap()
            .attr("data-result")
            .await
            .unwrap(),
        Some("done".to_owned())
    );
    assert_eq!(
        deliver(addr, hook, "evt_ok_1", "payment_intent.succeeded")
            .await
            .1,
        "processed"
    );

    // A POST without its CSRF token is refused, and changes nothing.
    client
        .goto(&format!("{base}/record?id=evt_ok_2"))
        .await
        .unwrap();
    click(&client, "#forget").await;
    client
        .execute(
            "document.querySelector('input[name=csrf]').remove()",
            vec![],
        )
        .await
        .unwrap();
    click(&client, "#confirm-submit").await;
    assert!(text(&client, "#problem").await.contains("CSRF token"));
    assert_eq!(
        deliver(addr, hook, "evt_ok_2", "payment_intent.succeeded")
            .await
            .1,
        "duplicate"
    );
    // And a forged token as well (from a script, without the browser).
    let (status, _, _) = http(
        addr,
        "POST",
        "/admin/webhooks/forget",
        &[
            basic(),
            ("Content-Type", "application/x-www-form-urlencoded".into()),
        ],
        b"id=evt_ok_2&csrf=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    )
    .await;
    assert_eq!(status, 403);

    // Requeueing the dead letter by filter: the worker then processes it.
    click(&client, "nav a[href='records?state=dead_letter']").await;
    click(&client, "#requeue-all").await;
    assert_eq!(text(&client, "#matching").await, "evt_dead_1");
    save("confirm-requeue.png", &client.screenshot().await.unwrap());
    click(&client, "#confirm-submit").await;
    assert_eq!(text(&client, "#done-ids").await, "evt_dead_1");
    eventually("the worker processes the requeued event", || async {
        let record = console_json(addr, "record?id=evt_dead_1").await;
        record["inbox"]["state"] == "done"
    })
    .await;
    client
        .goto(&format!("{base}/record?id=evt_dead_1"))
        .await
        .unwrap();
    assert_eq!(text(&client, "#inbox-state").await, "done");
    assert!(text(&client, "#body")
        .await
        .contains("\"type\": \"test.outage\""));
    client.goto(&format!("{base}/overview")).await.unwrap();
    assert_eq!(text(&client, "#dead-letters").await, "0");

    client.close().await.unwrap();
    let _ = std::fs::remove_dir_all(profile_dir());

    // Every action left an audit line naming who did what.
    let output = example.output.lock().unwrap().clone();
    for action in ["forget", "acknowledge", "resolve", "requeue"] {
        assert!(
            output
                .lines()
                .any(|l| l.contains("operator=\"ops\"")
                    && l.contains(&format!("action=\"{action}\""))),
            "no audit line for {action}:\n{output}"
        );
    }
    assert!(output.contains("CSRF check failed"), "{output}");
}
