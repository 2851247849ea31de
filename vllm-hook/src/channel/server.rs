//! The policy channel's listener, a plain thread inside vLLM's engine-core process (no
//! async runtime: the engine owns the process, the channel only needs a few requests a
//! second). A follower's sync that finds nothing new is held on a thread of its own
//! until a directive arrives or its wait runs out (a long poll), so the listener's
//! thread stays free for the proxy's directives that end the wait.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use meridian_core::channel::{
    self, Accepted, ChannelError, DirectiveBatch, Hello, PROTOCOL_HEADER, SyncRequest,
};
use serde::Serialize;
use tiny_http::{Header, Method, Request, Response, Server};

use super::Shared;
use crate::error::HookError;
use crate::metrics::Counter;

const MAX_BODY: u64 = 1 << 20;
/// The longest a sync is held, whatever it asks for.
const MAX_HOLD: Duration = Duration::from_secs(5);
/// Syncs held at once; past it a sync is answered at once (a follower then waits a
/// little before asking again). A vLLM engine has one follower per worker process.
const MAX_HELD: usize = 64;

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
                let held = Arc::new(AtomicUsize::new(0));
                for request in worker.incoming_requests() {
                    handle(request, &secret, &hello, &shared, &held);
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

/// What the listener does with an authenticated request.
enum Answer {
    Now(Reply),
    /// A sync with nothing new yet, to be answered when a directive arrives or after
    /// this long.
    Hold { after: u64, wait: Duration },
}

fn handle(mut request: Request, secret: &str, hello: &Hello, shared: &Arc<Shared>, held: &Arc<AtomicUsize>) {
    let path = request.url().split('?').next().unwrap_or("").to_owned();
    let method = request.method().clone();
    let reply = match (&method, path.as_str()) {
        (Method::Get, "/health") => Response::from_string("ok").with_status_code(200),
        (Method::Get, "/metrics") => {
            typed(Response::from_string(shared.counters.render()), "text/plain; version=0.0.4")
        }
        (_, channel::HELLO_PATH | channel::DIRECTIVES_PATH | channel::SYNC_PATH) => {
            match authenticated(&mut request, &method, &path, secret, hello, shared) {
                Answer::Now(reply) => reply,
                Answer::Hold { after, wait } => match hold(request, after, wait, shared, held) {
                    None => return,
                    // No thread to hold it on: answer at once.
                    Some(back) => {
                        request = back;
                        sync_reply(shared, after, Duration::ZERO)
                    }
                },
            }
        }
        _ => error(404, "not_found", format!("no route {path}")),
    };
    if request.respond(reply).is_err() {
        shared.counters.add(Counter::ErrorChannel, 1);
    }
}

/// Answers a sync on a thread of its own once `after` is overtaken or `wait` ends;
/// gives the request back (`Some`) when no thread can take it.
fn hold(
    request: Request,
    after: u64,
    wait: Duration,
    shared: &Arc<Shared>,
    held: &Arc<AtomicUsize>,
) -> Option<Request> {
    if held.fetch_add(1, Ordering::AcqRel) >= MAX_HELD {
        held.fetch_sub(1, Ordering::AcqRel);
        return Some(request);
    }
    // The request moves into the thread; kept here only until the spawn has succeeded.
    let slot = Arc::new(std::sync::Mutex::new(Some(request)));
    let (shared_, held_, slot_) = (Arc::clone(shared), Arc::clone(held), Arc::clone(&slot));
    let spawned = std::thread::Builder::new().name("meridian-sync".into()).spawn(move || {
        let request = slot_.lock().ok().and_then(|mut r| r.take());
        if let Some(request) = request {
            let reply = sync_reply(&shared_, after, wait);
            if request.respond(reply).is_err() {
                shared_.counters.add(Counter::ErrorChannel, 1);
            }
        }
        held_.fetch_sub(1, Ordering::AcqRel);
    });
    if spawned.is_err() {
        held.fetch_sub(1, Ordering::AcqRel);
        return slot.lock().ok().and_then(|mut r| r.take());
    }
    None
}

fn sync_reply(shared: &Shared, after: u64, wait: Duration) -> Reply {
    match shared.directives_after(after, wait) {
        Some(reply) => json(200, &reply),
        None => error(500, "internal", "directive table unavailable".into()),
    }
}

fn authenticated(
    request: &mut Request,
    method: &Method,
    path: &str,
    secret: &str,
    hello: &Hello,
    shared: &Shared,
) -> Answer {
    let counters = &shared.counters;
    if let Err(e) = channel::check_bearer(header(request, "Authorization"), secret) {
        counters.add(Counter::ChannelUnauthorized, 1);
        return Answer::Now(error(401, "unauthorized", e.to_string()));
    }
    if let Err(e) = channel::check_version(header(request, PROTOCOL_HEADER)) {
        counters.add(Counter::ChannelVersion, 1);
        return Answer::Now(error(400, "protocol_version", e.to_string()));
    }
    let mut body = Vec::new();
    if request.as_reader().take(MAX_BODY + 1).read_to_end(&mut body).is_err() || body.len() as u64 > MAX_BODY
    {
        counters.add(Counter::ChannelBad, 1);
        return Answer::Now(error(400, "bad_request", format!("body unreadable or over {MAX_BODY} bytes")));
    }
    let result = match (method, path) {
        (Method::Get, channel::HELLO_PATH) => {
            let mut hello = hello.clone();
            hello.can_end_thinking = shared.can_end_thinking.load(Ordering::Relaxed);
            Ok(Answer::Now(json(200, &hello)))
        }
        (Method::Post, channel::DIRECTIVES_PATH) => directives(&body, shared).map(Answer::Now),
        (Method::Post, channel::SYNC_PATH) => sync(&body, shared),
        _ => Err(ChannelError::BadMessage(format!("{method} not allowed on {path}"))),
    };
    match result {
        Ok(answer) => {
            counters.add(Counter::ChannelOk, 1);
            answer
        }
        Err(e) => {
            counters.add(Counter::ChannelBad, 1);
            Answer::Now(error(400, "bad_request", e.to_string()))
        }
    }
}

fn directives(body: &[u8], shared: &Shared) -> Result<Reply, ChannelError> {
    let batch: DirectiveBatch =
        serde_json::from_slice(body).map_err(|e| ChannelError::BadMessage(e.to_string()))?;
    let accepted = batch.directives.len();
    let seq = shared.apply_directives(batch.directives).unwrap_or(0);
    shared.counters.add(Counter::Directives, accepted as u64);
    Ok(json(200, &Accepted { accepted, seq }))
}

/// Takes a follower's counters; answers at once when there is something after its
/// `after` (or it asked not to wait), else holds the reply.
fn sync(body: &[u8], shared: &Shared) -> Result<Answer, ChannelError> {
    let req: SyncRequest =
        serde_json::from_slice(body).map_err(|e| ChannelError::BadMessage(e.to_string()))?;
    shared.counters.record_remote(&req.worker, req.counters);
    let wait = Duration::from_millis(req.wait_ms).min(MAX_HOLD);
    let newer = shared
        .directives
        .lock()
        .map_err(|_| ChannelError::BadMessage("directive table unavailable".into()))?
        .seq()
        > req.after;
    if newer || wait.is_zero() {
        return Ok(Answer::Now(sync_reply(shared, req.after, Duration::ZERO)));
    }
    Ok(Answer::Hold { after: req.after, wait })
}
