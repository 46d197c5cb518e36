//! A TCP proxy for fault injection: it sits between a store and its server and can
//! cut, delay and reset connections, while the shared server keeps running.
//!
//! Every forwarded socket has `SO_LINGER = 0`, so a cut or a reset closes it with a
//! TCP RST (what a crashed server or a middlebox dropping state looks like), not a
//! polite FIN.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

#[derive(Default)]
struct State {
    /// While set, new connections are accepted and reset at once.
    cut: AtomicBool,
    /// Latency added before forwarding each chunk, in milliseconds.
    delay_ms: AtomicU64,
    /// The pipes of the open connections.
    pipes: Mutex<Vec<AbortHandle>>,
    /// Connections accepted, for the report.
    accepted: AtomicUsize,
    /// Connections reset by a cut or a reset, for the report.
    killed: AtomicUsize,
}

/// A fault-injecting TCP proxy on `127.0.0.1:<port>` to one upstream address.
pub struct FaultProxy {
    port: u16,
    upstream: SocketAddr,
    state: Arc<State>,
    /// The accepting task; `None` while [`FaultProxy::down`].
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl FaultProxy {
    /// A proxy to `upstream` (`host:port`), listening on an ephemeral local port.
    pub async fn start(upstream: &str) -> Self {
        let upstream: SocketAddr = tokio::net::lookup_host(upstream)
            .await
            .expect("resolve the upstream")
            .next()
            .expect("an upstream address");
        assert!(
            upstream.ip().is_loopback(),
            "faults are injected on 127.0.0.1 only"
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let accept = accept(listener, upstream, state.clone());
        Self {
            port,
            upstream,
            state,
            accept: Mutex::new(Some(accept)),
        }
    }

    /// The local port to connect to instead of the server's.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Cuts the store off: resets every open connection and every new one until
    /// [`FaultProxy::restore`].
    pub fn cut(&self) {
        let mut pipes = self.state.pipes.lock().unwrap();
        self.state.cut.store(true, Ordering::SeqCst);
        self.reset_all(&mut pipes);
    }

    /// Ends a cut: new connections reach the server again.
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// The server is gone, as a killed one is: every open connection is reset and
    /// the port stops listening, so a new connection is refused
    /// (`ECONNREFUSED`: nothing sent) until [`FaultProxy::up`].
    pub async fn down(&self) {
        let accept = self.accept.lock().unwrap().take();
        if let Some(accept) = accept {
            accept.abort();
            let _ = accept.await; // the listener is closed once the task is gone
        }
        self.reset();
    }

    /// Listens again on the same port after [`FaultProxy::down`].
    pub async fn up(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.unwrap();
        let accept = accept(listener, self.upstream, self.state.clone());
        *self.accept.lock().unwrap() = Some(accept);
    }

    /// Resets every open connection once; new connections go through.
    pub fn reset(&self) {
        self.reset_all(&mut self.state.pipes.lock().unwrap());
    }

    fn reset_all(&self, pipes: &mut Vec<AbortHandle>) {
        for pipe in pipes.drain(..) {
            if !pipe.is_finished() {
                self.state.killed.fetch_add(1, Ordering::Relaxed);
            }
            pipe.abort();
        }
    }

    /// Adds `delay` before every chunk forwarded in either direction (zero: none).
    pub fn delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.state.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::Relaxed)
    }

    /// Connections reset by cuts and resets so far.
    pub fn killed(&self) -> usize {
        self.state.killed.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(accept) = self.accept.lock().unwrap().take() {
            accept.abort();
        }
        self.reset();
    }
}

/// Accepts on `listener` and pipes each connection to `upstream`, as `state` says.
fn accept(listener: TcpListener, upstream: SocketAddr, shared: Arc<State>) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            shared.accepted.fetch_add(1, Ordering::Relaxed);
            #[allow(deprecated)] // a zero linger never blocks: it resets
            let _ = inbound.set_linger(Some(Duration::ZERO));
            // Checked and filed under the lock a cut takes: a connection accepted
            // while a cut begins is either refused or reset by it, never missed.
            let mut pipes = shared.pipes.lock().unwrap();
            if shared.cut.load(Ordering::SeqCst) {
                shared.killed.fetch_add(1, Ordering::Relaxed);
                drop(inbound); // RST
                continue;
            }
            let state = shared.clone();
            let pipe = tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(upstream).await else {
                    return;
                };
                #[allow(deprecated)]
                let _ = outbound.set_linger(Some(Duration::ZERO));
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                // Either direction ending ends the connection.
                tokio::select! {
                    _ = pump(ri, wo, state.clone()) => {}
                    _ = pump(ro, wi, state) => {}
                }
            });
            pipes.retain(|p| !p.is_finished());
            pipes.push(pipe.abort_handle());
        }
    })
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<State>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = state.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
