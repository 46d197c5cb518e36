//! The guard behind a bare hyper 1 server: no framework, the crate's own pieces.
//! `cargo run --example hyper_server`, then POST a Stripe-signed delivery to port 3000.

use http_body_util::{BodyExt, Full, Limited};
use hyper::{server::conn::http1, service::service_fn, Request, Response};
use webhook_guard::{verify::Stripe, MemoryStore, WebhookGuard};

type Answer = http::Result<Response<Full<hyper::body::Bytes>>>;

async fn receive(guard: WebhookGuard, request: Request<hyper::body::Incoming>) -> Answer {
    let (parts, body) = request.into_parts();
    // At most max_body bytes are read: a larger body is refused, unread.
    let Ok(body) = Limited::new(body, guard.max_body()).collect().await else {
        return Response::builder().status(413).body(Full::default());
    };
    let delivery = guard.handle_spawned(&parts, body.to_bytes(), |event| async move {
        println!("{}", event.id()); // your side effects: once per event id, on a task
        Ok(())
    });
    Ok(guard.respond(delivery.await).into_http())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let guard = WebhookGuard::builder()
        .store(MemoryStore::new())
        .verifier(Stripe::new(["whsec_wRNftLajMZNeslQOP6vEPm4iVx5NlZ6z"])?) // answered within Stripe's 5 s
        .build()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let (io, guard) = (hyper_util::rt::TokioIo::new(stream), guard.clone());
        let service = service_fn(move |request| receive(guard.clone(), request));
        tokio::spawn(http1::Builder::new().serve_connection(io, service));
    }
}
