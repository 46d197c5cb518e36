//! End to end: an axum route guarded with the Stripe preset against the same route
//! unguarded, over loopback HTTP/1.1.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use webhook_guard::{HandlerError, MemoryStore, WebhookGuard};

use crate::harness::{Ctx, Figure, Report, Skip};
use crate::tput::{interleave_tput, round_time, runtime};
use crate::verify::VERIFY_SECRET;

pub(crate) const HTTP_CONNECTIONS: usize = 32;

/// A Stripe-shaped body with id `evt_{i}`.
pub(crate) fn stripe_body(i: u64) -> String {
    format!(
        r#"{{"id":"evt_{i:020}","object":"event","type":"charge.succeeded","created":1700000000,"livemode":false,"data":{{"object":{{"id":"ch_3NDEXAMPLE","object":"charge","amount":2000,"currency":"usd","status":"succeeded"}}}}}}"#
    )
}

/// One signed HTTP/1.1 keep-alive request for event `i`.
pub(crate) fn stripe_request(stripe: &webhook_guard::verify::Stripe, i: u64) -> Vec<u8> {
    let body = stripe_body(i);
    let sig = stripe.sign(body.as_bytes(), Utc::now().timestamp());
    format!(
        "POST /webhooks HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         stripe-signature: {sig}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads one response on a keep-alive connection; its status.
pub(crate) async fn read_response(
    r: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
    line: &mut String,
) -> u16 {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    line.clear();
    r.read_line(line).await.expect("status line");
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let mut len = 0usize;
    loop {
        line.clear();
        r.read_line(line).await.expect("header");
        if line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().expect("content-length");
            }
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).await.expect("body");
    status
}

/// Requests/s of 32 keep-alive connections sending signed Stripe deliveries with
/// fresh ids to `addr` for `dur`.
pub(crate) async fn http_load(
    addr: std::net::SocketAddr,
    stripe: Arc<webhook_guard::verify::Stripe>,
    dur: Duration,
    first: u64,
) -> (f64, u64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::AsyncWriteExt;
    let next = Arc::new(AtomicU64::new(first));
    let mut conns = Vec::new();
    for _ in 0..HTTP_CONNECTIONS {
        let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).unwrap();
        conns.push(s);
    }
    let t = Instant::now();
    let handles: Vec<_> = conns
        .into_iter()
        .map(|s| {
            let (next, stripe) = (next.clone(), stripe.clone());
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut r = tokio::io::BufReader::new(r);
                let mut line = String::new();
                let mut done = 0u64;
                while t.elapsed() < dur {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    w.write_all(&stripe_request(&stripe, i))
                        .await
                        .expect("write");
                    let status = read_response(&mut r, &mut line).await;
                    assert_eq!(status, 200, "delivery {i}");
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut done = 0;
    for h in handles {
        done += h.await.expect("connection");
    }
    (
        done as f64 / t.elapsed().as_secs_f64(),
        next.load(Ordering::Relaxed),
    )
}

/// Requests/s through an axum route guarded with the Stripe preset on
/// `MemoryStore` vs the same route that reads the body and answers 200 without
/// verifying or storing, 32 keep-alive connections over loopback, client and
/// server on one 2-worker runtime.
pub(crate) fn axum_e2e_tput(ctx: &Ctx) -> Result<Report, Skip> {
    use axum::routing::post;
    use webhook_guard::integrations::axum::guarded;
    use webhook_guard::verify::Stripe;

    let rt = runtime();
    let stripe = Arc::new(Stripe::new([VERIFY_SECRET]).expect("secret"));
    let dur = round_time(ctx);
    let (guarded_addr, plain_addr) = rt.block_on(async {
        let guard = WebhookGuard::builder()
            .store(MemoryStore::new())
            .verifier(Stripe::new([VERIFY_SECRET]).expect("secret"))
            .build()
            .expect("guard");
        let guarded_app = axum::Router::new().route(
            "/webhooks",
            guarded(guard, |_event: webhook_guard::OwnedEvent| async {
                Ok::<(), HandlerError>(())
            }),
        );
        let plain_app = axum::Router::new().route(
            "/webhooks",
            post(|body: bytes::Bytes| async move {
                black_box(body);
                axum::http::StatusCode::OK
            }),
        );
        let mut addrs = Vec::new();
        for app in [guarded_app, plain_app] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            addrs.push(listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        }
        (addrs[0], addrs[1])
    });
    let (g, b) = interleave_tput(
        ctx,
        &rt,
        |first| http_load(guarded_addr, stripe.clone(), dur, first),
        |first| http_load(plain_addr, stripe.clone(), dur, first),
    );
    Ok(Report {
        ratio: g / b,
        guard: Figure {
            what: "guarded route",
            value: g,
            unit: "req/s",
        },
        baseline: Figure {
            what: "plain route",
            value: b,
            unit: "req/s",
        },
        notes: vec![format!(
            "{HTTP_CONNECTIONS} keep-alive connections, {:.1} s rounds, ~220-byte Stripe bodies; \
             client signing and server share 2 workers",
            dur.as_secs_f64()
        )],
    })
}
