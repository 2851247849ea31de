//! The floor under the relay benchmark: a pass-through proxy on the same stack as
//! `meridian` (axum/hyper server, tokio) that does nothing but forward, so the benchmark
//! can tell what the stack costs per event from what Meridian's own work adds. Two
//! clients, as `--client` says: `reqwest` (what `meridian` uses) or `hyper` (hyper-util's
//! pooled client, without reqwest's layers). Not a product: no errors beyond a 502, no
//! headers but the content type, no limits.
//!
//!   cargo run --release -p meridian-proxy --example bare_relay -- \
//!       --listen 127.0.0.1:9100 --upstream http://127.0.0.1:8000 --client hyper

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

#[derive(Clone)]
enum Upstream {
    Reqwest(reqwest::Client, String),
    Hyper(Box<HyperClient<HttpConnector, Full<Bytes>>>, String),
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let listen: SocketAddr = arg(&args, "--listen").unwrap_or_else(|| "127.0.0.1:0".into()).parse()?;
    let base = arg(&args, "--upstream").ok_or("--upstream URL is required")?;
    let upstream = match arg(&args, "--client").as_deref() {
        Some("hyper") => {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            Upstream::Hyper(Box::new(HyperClient::builder(TokioExecutor::new()).build(connector)), base)
        }
        Some("reqwest") | None => {
            Upstream::Reqwest(reqwest::Client::builder().no_proxy().tcp_nodelay(true).build()?, base)
        }
        Some(other) => return Err(format!("--client {other}: reqwest or hyper").into()),
    };
    let app = Router::new().fallback(relay).with_state(upstream);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    // The benchmark reads the address from the first line, as it does for `meridian`.
    println!("listening on http://{}", listener.local_addr()?);
    // As meridian and nginx do: each small SSE write leaves at once, not held for Nagle.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await?;
    Ok(())
}

/// The request's headers as they go upstream: all but the connection's own.
fn forwarded(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    for h in [header::HOST, header::CONTENT_LENGTH, header::CONNECTION, header::TRANSFER_ENCODING] {
        out.remove(h);
    }
    out
}

async fn relay(State(upstream): State<Upstream>, req: Request) -> Response {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let method = req.method().clone();
    let headers = forwarded(req.headers());
    let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    match upstream {
        Upstream::Reqwest(client, base) => {
            let sent =
                client.request(method, format!("{base}{path}")).headers(headers).body(body).send().await;
            let Ok(resp) = sent else { return StatusCode::BAD_GATEWAY.into_response() };
            let status = resp.status();
            let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
            let mut out = Response::new(Body::from_stream(resp.bytes_stream()));
            *out.status_mut() = status;
            if let Some(ct) = content_type {
                out.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            out
        }
        Upstream::Hyper(client, base) => {
            let Ok(mut req) =
                hyper::Request::builder().method(method).uri(format!("{base}{path}")).body(Full::new(body))
            else {
                return StatusCode::BAD_REQUEST.into_response();
            };
            *req.headers_mut() = headers;
            let Ok(resp) = client.request(req).await else { return StatusCode::BAD_GATEWAY.into_response() };
            let (parts, incoming) = resp.into_parts();
            let mut out = Response::new(Body::new(incoming));
            *out.status_mut() = parts.status;
            if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
                out.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
            }
            out
        }
    }
}
