//! The runner's pieces: what a comparison reports, the interleaving of its sides,
//! and what every comparison shares (the body, the ids, a guard on a store).

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use webhook_guard::verify::NoVerification;
use webhook_guard::{EventId, HandlerError, Outcome, ProcessedStore, WebhookGuard};

pub(crate) struct Comparison {
    pub(crate) name: &'static str,
    pub(crate) target: Target,
    pub(crate) run: fn(&Ctx) -> Result<Report, Skip>,
}

impl Comparison {
    pub(crate) const fn new(
        name: &'static str,
        target: Target,
        run: fn(&Ctx) -> Result<Report, Skip>,
    ) -> Self {
        Self { name, target, run }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Target {
    AtMost(f64),
    AtLeast(f64),
    /// A peer crate measured for the record: the issue sets no target.
    Peer,
}
pub(crate) use Target::{AtLeast, AtMost, Peer};

impl Target {
    /// The target and whether `ratio` meets it, as the table prints them.
    pub(crate) fn verdict(self, ratio: f64) -> String {
        let met = match self {
            AtMost(t) => ratio <= t,
            AtLeast(t) => ratio >= t,
            Peer => return "no target: a peer".into(),
        };
        format!("target {self}, {}", if met { "met" } else { "MISSED" })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AtMost(t) => write!(f, "<= {t}"),
            AtLeast(t) => write!(f, ">= {t}"),
            Peer => write!(f, "none"),
        }
    }
}

/// What one comparison measured: the ratio and the absolute figures beside it.
pub(crate) struct Report {
    pub(crate) ratio: f64,
    pub(crate) guard: Figure,
    pub(crate) baseline: Figure,
    /// Further absolute figures worth printing (purge time, ...).
    pub(crate) notes: Vec<String>,
}

/// A median with its unit, such as `812 ns/cycle`.
pub(crate) struct Figure {
    pub(crate) what: &'static str,
    pub(crate) value: f64,
    pub(crate) unit: &'static str,
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.value;
        let v = if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        };
        write!(f, "{}: {v} {}", self.what, self.unit)
    }
}

/// Why a comparison did not run (its server is absent).
#[derive(Debug)]
pub(crate) struct Skip(pub(crate) String);

/// What every comparison gets: sizes and rounds.
pub(crate) struct Ctx {
    pub(crate) scale: f64,
    pub(crate) rounds: usize,
}

impl Ctx {
    pub(crate) fn from_env() -> Self {
        let scale = std::env::var("WG_BENCH_SCALE")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .unwrap_or(1.0);
        let rounds = std::env::var("WG_BENCH_ROUNDS")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|r| *r > 0)
            .unwrap_or(7);
        Self { scale, rounds }
    }

    /// `n` scaled by `WG_BENCH_SCALE` (at least 1,000).
    pub(crate) fn n(&self, n: usize) -> usize {
        ((n as f64 * self.scale) as usize).max(1000)
    }

    /// Runs `guard` and `baseline` alternately, `rounds` times each, switching which
    /// goes first every round so slow drift (other processes, thermal) hits both
    /// sides alike. Each side returns its measure of one round; the medians come back.
    pub(crate) fn interleave(
        &self,
        rounds: usize,
        mut guard: impl FnMut() -> f64,
        mut baseline: impl FnMut() -> f64,
    ) -> (f64, f64) {
        let m = self.interleave_sides(rounds, &mut [&mut guard, &mut baseline]);
        (m[0], m[1])
    }

    /// [`Ctx::interleave`] for any number of sides: each round runs every side once,
    /// starting one side later than the round before. The median of each side.
    pub(crate) fn interleave_sides(
        &self,
        rounds: usize,
        sides: &mut [&mut dyn FnMut() -> f64],
    ) -> Vec<f64> {
        let mut runs = vec![Vec::new(); sides.len()];
        for round in 0..rounds {
            for k in 0..sides.len() {
                let side = (round + k) % sides.len();
                runs[side].push(sides[side]());
            }
        }
        runs.into_iter().map(median).collect()
    }

    /// Like [`Ctx::interleave`], and finer: within each round, the two sides take
    /// turns chunk by chunk over the same `n` items (`guard(state, range)` and
    /// `baseline(state, range)`, on a state made fresh by `setup` each round), so
    /// load that comes and goes within a round hits both sides alike. Returns the
    /// median nanoseconds per item of each side.
    pub(crate) fn interleave_chunks<S>(
        &self,
        rounds: usize,
        n: usize,
        mut setup: impl FnMut() -> S,
        mut guard: impl FnMut(&mut S, std::ops::Range<usize>),
        mut baseline: impl FnMut(&mut S, std::ops::Range<usize>),
    ) -> (f64, f64) {
        let chunk = (n / 10).clamp(1000, 10_000);
        let (mut g, mut b) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut state = setup();
            let (mut tg, mut tb) = (Duration::ZERO, Duration::ZERO);
            for (c, start) in (0..n).step_by(chunk).enumerate() {
                let range = start..(start + chunk).min(n);
                for side in [(c + round) % 2, (c + round + 1) % 2] {
                    let t = Instant::now();
                    if side == 0 {
                        guard(&mut state, range.clone());
                        tg += t.elapsed();
                    } else {
                        baseline(&mut state, range.clone());
                        tb += t.elapsed();
                    }
                }
            }
            g.push(ns_per(tg, n));
            b.push(ns_per(tb, n));
        }
        (median(g), median(b))
    }

    /// The URL of a server a comparison needs, from the environment variable `var`.
    /// Missing: fails in CI (`CI` set), skips with a message elsewhere.
    pub(crate) fn server(&self, var: &str) -> Result<String, Skip> {
        match std::env::var(var) {
            Ok(url) if !url.is_empty() => Ok(url),
            _ => Err(Skip(format!("{var} is not set"))),
        }
    }
}

/// The 1/5/15-minute load averages: a 2-thread figure means little when other
/// processes already keep every CPU busy.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A typical small webhook body (the guard hashes it: conflict detection is on).
pub(crate) const BODY: &[u8] = br#"{"id":"evt_1NDEXAMPLE","object":"event","type":"charge.succeeded","created":1700000000,"livemode":false,"data":{"object":{"id":"ch_3NDEXAMPLE","object":"charge","amount":2000,"currency":"usd","status":"succeeded"}}}"#;

pub(crate) const ID_HEADER: &str = "x-event-id";
/// A SHA-256 in hex, as long as the one a stored record carries.
pub(crate) const FINGERPRINT_HEX: &str =
    "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// `n` distinct 30-byte ids, `evt_` and 26 digits, starting at `from`.
pub(crate) fn ids(from: usize, n: usize) -> Vec<String> {
    (from..from + n).map(|i| format!("evt_{i:026}")).collect()
}

pub(crate) fn guard_on(store: impl ProcessedStore) -> WebhookGuard {
    WebhookGuard::builder()
        .store(store)
        .verifier(NoVerification)
        .event_id(EventId::header(ID_HEADER))
        .build()
        .expect("valid guard")
}

/// Polls a future that the in-memory store completes without waiting.
pub(crate) fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

/// One full cycle: claim, a no-op handler, complete.
pub(crate) async fn cycle(guard: &WebhookGuard, id: &str) -> Outcome {
    let headers = [(ID_HEADER, id)];
    guard
        .handle(&headers, BODY, |_| async { Ok::<(), HandlerError>(()) })
        .await
}

pub(crate) fn ns_per(elapsed: Duration, n: usize) -> f64 {
    elapsed.as_nanos() as f64 / n as f64
}

pub(crate) fn p99(lat: &mut [u64]) -> f64 {
    assert!(!lat.is_empty(), "no latency sampled");
    lat.sort_unstable();
    lat[(lat.len() * 99 / 100).min(lat.len() - 1)] as f64
}
