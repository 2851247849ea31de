//! The policy channel's listener, a plain thread inside vLLM's engine-core process (no
//! async runtime: the engine owns the process). It answers one request at a time: a few
//! a second from each proxy replica for directives and hellos, and with
//! `admission.places = "engine"` two per admitted request (the claim, the release) plus
//! a few dozen a second from each replica whose requests wait for a full engine. Each is
//! a small JSON body and a table update, far below a step's time.

use std::io::Read;
use std::sync::Arc;
use std::thread::JoinHandle;

use meridian_core::channel::{
    self, Accepted, ChannelError, Claim, DISABLED_POLICY, DirectiveBatch, Hello, PROTOCOL_HEADER, SyncRequest,
};
use serde::Serialize;
use tiny_http::{Header, Method, Request, Response, Server};

use super::Shared;
use crate::error::HookError;
use crate::metrics::Counter;

const MAX_BODY: u64 = 1 << 20;

pub struct ChannelServer {
    server: Arc<Server>,
    thread: Option<JoinHandle<()>>,
    pub addr: std::net::SocketAddr,
}

impl ChannelServer {
    pub fn start(listen: &str, secret: String, hello: Hello, shared: Arc<Shared>) -> Result<Self, HookError> {
        let fail = |reason: String| HookError::Listen { addr: listen.to_owned(), reason };
        let server = Server::http(listen).map_err(|e| fail(e.to_string()))?;
        let addr = server.server_addr().to_ip().ok_or_else(|| fail("not an IP listener".into()))?;
        let server = Arc::new(server);
        let worker = Arc::clone(&server);
        let thread = std::thread::Builder::new()
            .name("meridian-channel".into())
            .spawn(move || {
                for request in worker.incoming_requests() {
                    handle(request, &secret, &hello, &shared);
                }
            })
            .map_err(|e| fail(e.to_string()))?;
        Ok(ChannelServer { server, thread: Some(thread), addr })
    }
}

impl Drop for ChannelServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn header<'a>(request: &'a Request, name: &'static str) -> Option<&'a str> {
    request.headers().iter().find(|h| h.field.equiv(name)).map(|h| h.value.as_str())
}

type Reply = Response<std::io::Cursor<Vec<u8>>>;

fn typed(reply: Reply, content_type: &str) -> Reply {
    match Header::from_bytes("Content-Type", content_type) {
        Ok(h) => reply.with_header(h),
        Err(()) => reply,
    }
}

fn json<T: Serialize>(status: u16, body: &T) -> Reply {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    typed(Response::from_data(bytes).with_status_code(status), "application/json")
}

fn error(status: u16, kind: &str, message: String) -> Reply {
    json(status, &serde_json::json!({"error": {"type": kind, "message": message}}))
}

fn handle(mut request: Request, secret: &str, hello: &Hello, shared: &Shared) {
    let path = request.url().split('?').next().unwrap_or("").to_owned();
    let method = request.method().clone();
    let reply = match (&method, path.as_str()) {
        (Method::Get, "/health") => Response::from_string("ok").with_status_code(200),
        (Method::Get, "/metrics") => {
            typed(Response::from_string(shared.counters.render()), "text/plain; version=0.0.4")
        }
        (_, channel::HELLO_PATH | channel::DIRECTIVES_PATH | channel::SYNC_PATH | channel::PLACES_PATH) => {
            authenticated(&mut request, &method, &path, secret, hello, shared)
        }
        _ => error(404, "not_found", format!("no route {path}")),
    };
    if request.respond(reply).is_err() {
        shared.counters.add(Counter::ErrorChannel, 1);
    }
}

fn authenticated(
    request: &mut Request,
    method: &Method,
    path: &str,
    secret: &str,
    hello: &Hello,
    shared: &Shared,
) -> Reply {
    let counters = &shared.counters;
    if let Err(e) = channel::check_bearer(header(request, "Authorization"), secret) {
        counters.add(Counter::ChannelUnauthorized, 1);
        return error(401, "unauthorized", e.to_string());
    }
    if let Err(e) = channel::check_version(header(request, PROTOCOL_HEADER)) {
        counters.add(Counter::ChannelVersion, 1);
        return error(400, "protocol_version", e.to_string());
    }
    let mut body = Vec::new();
    if request.as_reader().take(MAX_BODY + 1).read_to_end(&mut body).is_err() || body.len() as u64 > MAX_BODY
    {
        counters.add(Counter::ChannelBad, 1);
        return error(400, "bad_request", format!("body unreadable or over {MAX_BODY} bytes"));
    }
    let result = match (method, path) {
        (Method::Get, channel::HELLO_PATH) => {
            let mut hello = hello.clone();
            hello.can_end_thinking = shared.can_end_thinking.load(std::sync::atomic::Ordering::Relaxed);
            if shared.disabled.load(std::sync::atomic::Ordering::Relaxed) {
                hello.policy = DISABLED_POLICY.to_owned();
                hello.can_end_thinking = false;
                hello.entropy = false;
            }
            hello.engine = counters.engine_state();
            Ok(json(200, &hello))
        }
        (Method::Post, channel::DIRECTIVES_PATH) => directives(&body, shared),
        (Method::Post, channel::SYNC_PATH) => sync(&body, shared),
        (Method::Post, channel::PLACES_PATH) => places(&body, shared),
        _ => Err(ChannelError::BadMessage(format!("{method} not allowed on {path}"))),
    };
    match result {
        Ok(r) => {
            counters.add(Counter::ChannelOk, 1);
            r
        }
        Err(e) => {
            counters.add(Counter::ChannelBad, 1);
            error(400, "bad_request", e.to_string())
        }
    }
}

fn directives(body: &[u8], shared: &Shared) -> Result<Reply, ChannelError> {
    let batch: DirectiveBatch =
        serde_json::from_slice(body).map_err(|e| ChannelError::BadMessage(e.to_string()))?;
    let accepted = batch.directives.len();
    let mut seq = 0;
    if let Ok(mut table) = shared.directives.lock() {
        for d in batch.directives {
            seq = table.apply(d);
        }
    }
    shared.counters.add(Counter::Directives, accepted as u64);
    Ok(json(200, &Accepted { accepted, seq }))
}

/// A proxy replica claims a place in the engine's limit, or reports its holding. The
/// listener answers one request at a time, so claims are decided in the order they came.
fn places(body: &[u8], shared: &Shared) -> Result<Reply, ChannelError> {
    let claim: Claim = serde_json::from_slice(body).map_err(|e| ChannelError::BadMessage(e.to_string()))?;
    let granted = match shared.places.lock() {
        Ok(mut places) => places.claim(&claim, shared.started.now_s()),
        Err(_) => return Err(ChannelError::BadMessage("place table unavailable".into())),
    };
    let counter = match (claim.want, granted.granted) {
        (0, _) => Counter::PlacesReported,
        (_, true) => Counter::PlacesGranted,
        (_, false) => Counter::PlacesRefused,
    };
    shared.counters.add(counter, 1);
    Ok(json(200, &granted))
}

fn sync(body: &[u8], shared: &Shared) -> Result<Reply, ChannelError> {
    let req: SyncRequest =
        serde_json::from_slice(body).map_err(|e| ChannelError::BadMessage(e.to_string()))?;
    shared.counters.record_remote(&req.worker, req.counters);
    let reply = match shared.directives.lock() {
        Ok(table) => table.since(req.after),
        Err(_) => return Err(ChannelError::BadMessage("directive table unavailable".into())),
    };
    Ok(json(200, &reply))
}
