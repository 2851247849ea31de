//! The policy channel's listener, a plain thread inside vLLM's engine-core process (no
//! async runtime: the engine owns the process). It answers one request at a time: a few
//! a second from each proxy replica for directives and hellos, and with
//! `admission.places = "engine"` two per admitted request (the claim, the release), a
//! wait from each replica refused a place, and a few a second from each replica whose
//! requests wait for a full engine. Each is a small JSON body and a table update, far
//! below a step's time.
//!
//! A wait for a place is not answered at once: the listener holds it (its connection
//! stays open) and answers when the count of openings moves from the one the replica saw,
//! looking after every message and, while it holds waits, every [`TIDY_EVERY`] (a lease
//! that lapses, a waiter that stopped asking, frees a place with no message at all).

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use meridian_core::channel::{
    self, Accepted, ChannelError, Claim, DISABLED_POLICY, DirectiveBatch, Hello, PROTOCOL_HEADER,
    PlacesFreed, PlacesWait, SyncRequest,
};
use serde::Serialize;
use tiny_http::{Header, Method, Request, Response, Server};

use super::Shared;
use crate::error::HookError;
use crate::metrics::Counter;

const MAX_BODY: u64 = 1 << 20;
/// While waits are held, how often the listener looks at the place table with no message
/// to prompt it (lapsed leases, stale waiters): well inside the replicas' own retry.
const TIDY_EVERY: Duration = Duration::from_millis(20);
/// With no wait held, how long the listener sleeps between looks at its stop flag.
const IDLE_EVERY: Duration = Duration::from_secs(1);
/// The most waits held at once (each an open connection, which tiny_http serves from a
/// thread of its own); beyond, a wait is answered at once, its count unchanged, and its
/// replica waits out its retry before it waits again.
const MAX_WAITS: usize = 256;

pub struct ChannelServer {
    server: Arc<Server>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub addr: std::net::SocketAddr,
}

impl ChannelServer {
    pub fn start(listen: &str, secret: String, hello: Hello, shared: Arc<Shared>) -> Result<Self, HookError> {
        let fail = |reason: String| HookError::Listen { addr: listen.to_owned(), reason };
        let server = Server::http(listen).map_err(|e| fail(e.to_string()))?;
        let addr = server.server_addr().to_ip().ok_or_else(|| fail("not an IP listener".into()))?;
        let server = Arc::new(server);
        let stop = Arc::new(AtomicBool::new(false));
        let (worker, stopped) = (Arc::clone(&server), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("meridian-channel".into())
            .spawn(move || serve(&worker, &stopped, &secret, &hello, &shared))
            .map_err(|e| fail(e.to_string()))?;
        Ok(ChannelServer { server, stop, thread: Some(thread), addr })
    }
}

impl Drop for ChannelServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The listener's loop: one message at a time, and the waits it holds answered as places
/// free or their time runs out; on stop, every wait still held is answered.
fn serve(server: &Server, stop: &AtomicBool, secret: &str, hello: &Hello, shared: &Shared) {
    let mut waits = Waits::default();
    while !stop.load(Ordering::Acquire) {
        match server.recv_timeout(waits.next_look(Instant::now())) {
            Ok(Some(request)) => {
                if let Some(held) = handle(request, secret, hello, shared) {
                    waits.hold(held, shared);
                }
            }
            Ok(None) => {}
            // The accept thread's error (a connection it could not take): the listener
            // goes on with the next.
            Err(_) => shared.counters.add(Counter::ErrorChannel, 1),
        }
        waits.answer(shared, Instant::now(), false);
    }
    waits.answer(shared, Instant::now(), true);
}

/// A replica's wait for a place, held open.
struct HeldWait {
    request: Request,
    wait: PlacesWait,
    until: Instant,
}

/// The waits the listener holds.
#[derive(Default)]
struct Waits {
    held: Vec<HeldWait>,
}

impl Waits {
    /// How long the listener may sleep before it must look at the waits again.
    fn next_look(&self, now: Instant) -> Duration {
        match self.held.iter().map(|w| w.until).min() {
            Some(first) => first.saturating_duration_since(now).min(TIDY_EVERY),
            None => IDLE_EVERY,
        }
    }

    /// Holds a wait, unless too many are held already (then it is answered at once).
    fn hold(&mut self, wait: HeldWait, shared: &Shared) {
        if self.held.len() >= MAX_WAITS {
            shared.counters.add(Counter::PlacesWaitTurnedAway, 1);
            let freed = freed_now(shared);
            respond(wait.request, json(200, &PlacesFreed { freed, woken: Some(false) }), shared);
            return;
        }
        self.held.push(wait);
    }

    /// Answers each wait whose place is there for it (`Places::wakes`), or whose time is
    /// up (every wait, with `all`).
    fn answer(&mut self, shared: &Shared, now: Instant, all: bool) {
        if self.held.is_empty() {
            return;
        }
        // One look at the table for every wait; a poisoned table wakes them all (they
        // ask again, and their claims are refused with the table's error).
        let (freed, woken): (u64, Vec<bool>) = match shared.places.lock() {
            Ok(mut places) => {
                places.tidy(shared.started.now_s());
                (places.freed(), self.held.iter().map(|w| places.wakes(&w.wait)).collect())
            }
            Err(_) => (0, vec![true; self.held.len()]),
        };
        let mut kept = Vec::with_capacity(self.held.len());
        for (w, woken) in std::mem::take(&mut self.held).into_iter().zip(woken) {
            if !(all || woken || now >= w.until) {
                kept.push(w);
                continue;
            }
            let counter = if woken { Counter::PlacesWaitWoken } else { Counter::PlacesWaitExpired };
            shared.counters.add(counter, 1);
            respond(w.request, json(200, &PlacesFreed { freed, woken: Some(woken) }), shared);
        }
        self.held = kept;
    }
}

/// The engine's count of openings, its lapsed leases and stale waiters counted first.
fn freed_now(shared: &Shared) -> u64 {
    match shared.places.lock() {
        Ok(mut places) => {
            places.tidy(shared.started.now_s());
            places.freed()
        }
        Err(_) => 0,
    }
}

fn respond(request: Request, reply: Reply, shared: &Shared) {
    if request.respond(reply).is_err() {
        shared.counters.add(Counter::ErrorChannel, 1);
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

/// What a message gets: its reply now, or (a wait for a place) held until a place frees.
enum Answer {
    Now(Reply),
    Hold { wait: PlacesWait, until: Instant },
}

/// Answers one message, or hands back a wait to hold.
fn handle(mut request: Request, secret: &str, hello: &Hello, shared: &Shared) -> Option<HeldWait> {
    let path = request.url().split('?').next().unwrap_or("").to_owned();
    let method = request.method().clone();
    let answer = match (&method, path.as_str()) {
        (Method::Get, "/health") => Answer::Now(Response::from_string("ok").with_status_code(200)),
        (Method::Get, "/metrics") => {
            Answer::Now(typed(Response::from_string(shared.counters.render()), "text/plain; version=0.0.4"))
        }
        (
            _,
            channel::HELLO_PATH
            | channel::DIRECTIVES_PATH
            | channel::SYNC_PATH
            | channel::PLACES_PATH
            | channel::PLACES_WAIT_PATH,
        ) => authenticated(&mut request, &method, &path, secret, hello, shared),
        _ => Answer::Now(error(404, "not_found", format!("no route {path}"))),
    };
    match answer {
        Answer::Now(reply) => {
            respond(request, reply, shared);
            None
        }
        Answer::Hold { wait, until } => Some(HeldWait { request, wait, until }),
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
    if (method, path) == (&Method::Post, channel::PLACES_WAIT_PATH) {
        return match place_wait(&body, shared) {
            Ok(answer) => {
                counters.add(Counter::ChannelOk, 1);
                answer
            }
            Err(e) => {
                counters.add(Counter::ChannelBad, 1);
                Answer::Now(error(400, "bad_request", e.to_string()))
            }
        };
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
            Answer::Now(r)
        }
        Err(e) => {
            counters.add(Counter::ChannelBad, 1);
            Answer::Now(error(400, "bad_request", e.to_string()))
        }
    }
}

/// A refused replica waits for a place: answered at once when the place is there for it
/// already (`Places::wakes`: one freed for it since, or this engine started again), or
/// it asks to wait no time; otherwise held.
fn place_wait(body: &[u8], shared: &Shared) -> Result<Answer, ChannelError> {
    let wait: PlacesWait =
        serde_json::from_slice(body).map_err(|e| ChannelError::BadMessage(e.to_string()))?;
    let (freed, woken) = match shared.places.lock() {
        Ok(mut places) => {
            places.tidy(shared.started.now_s());
            (places.freed(), places.wakes(&wait))
        }
        Err(_) => return Err(ChannelError::BadMessage("place table unavailable".into())),
    };
    let held_s = wait.held_s();
    if woken || held_s <= 0.0 {
        return Ok(Answer::Now(json(200, &PlacesFreed { freed, woken: Some(woken) })));
    }
    Ok(Answer::Hold { wait, until: Instant::now() + Duration::from_secs_f64(held_s) })
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
