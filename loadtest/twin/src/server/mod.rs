//! The twin as an OpenAI-compatible server, driven in real time (or `speed` times faster):
//! a driver task steps the engine, sleeps each step's simulated duration, and hands the
//! step's tokens to the streams waiting for them. A client that goes away aborts its
//! request in the engine, as vLLM does.

mod api;
mod channel;
mod driver;
mod metrics;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};

pub use api::TwinRequest;

use crate::cost::Profile;
use crate::engine::{Engine, EngineConfig, NewRequest, Token, TokenIds};
use crate::workload::{Workload, WorkloadSpec};
use metrics::TwinMetrics;

/// How to run the twin server.
#[derive(Debug, Clone)]
pub struct TwinOptions {
    pub listen: SocketAddr,
    pub profile: Profile,
    pub workload: WorkloadSpec,
    pub seed: u64,
    /// Simulated seconds per wall second (1 = real time).
    pub speed: f64,
    pub served_model: String,
    /// The prefix cache and its eviction order (`None`: off, as vLLM with
    /// `--no-enable-prefix-caching`). On, prompts are named by ids made from their text
    /// ([`api::prompt_ids`]) and `/metrics` counts queries and hits as vLLM does.
    pub prefix_cache: Option<meridian_core::kv::Eviction>,
    /// The policy channel's shared secret (`None`: no channel served): with it, the twin
    /// answers the hello and grants places of its limit as the hook does
    /// ([`channel`]).
    pub channel_secret: Option<String>,
    /// With the channel served, whether it holds refused replicas' waits for a place
    /// (`/meridian/v1/places/wait`); without, it answers as a hook that predates the
    /// waits (that path not found, no count of openings in its grants), and replicas ask
    /// again on their timer alone. The fleet bench measures the waits against their
    /// absence this way.
    pub place_waits: bool,
    /// How long a refused replica's turn is kept unasked
    /// ([`meridian_core::channel::WAITING_STALE_S`], as the hook): tests over sockets on a
    /// busy machine lengthen it where they are not about turns going stale.
    pub place_turn_kept_s: f64,
}

impl TwinOptions {
    /// A twin on an ephemeral loopback port serving `Qwen/Qwen3-8B`.
    pub fn local(profile: Profile, workload: WorkloadSpec, speed: f64) -> Self {
        TwinOptions {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            profile,
            workload,
            seed: 0,
            speed,
            served_model: "Qwen/Qwen3-8B".into(),
            prefix_cache: None,
            channel_secret: None,
            place_waits: true,
            place_turn_kept_s: meridian_core::channel::WAITING_STALE_S,
        }
    }
}

pub(crate) struct Subscriber {
    tx: mpsc::UnboundedSender<Token>,
    arrival_s: f64,
    last_token_s: Option<f64>,
}

pub(crate) struct Core {
    pub engine: Engine,
    pub workload: Workload,
    pub subs: HashMap<u64, Subscriber>,
    pub metrics: TwinMetrics,
}

pub(crate) struct Shared {
    core: Mutex<Core>,
    wake: Notify,
    opts: TwinOptions,
    started: Instant,
    /// `meridian-twin/<profile>`: the `system_fingerprint` of every answer and the value
    /// of its [`SIMULATED_HEADER`], so nobody mistakes a simulated answer for a model's.
    fingerprint: Arc<str>,
    /// Places granted to proxy replicas, when the channel is served.
    places: Mutex<meridian_core::channel::Places>,
    /// The place table's count of openings, for replicas waiting on it.
    places_freed: tokio::sync::watch::Sender<u64>,
}

/// Response header on everything the twin serves: its answers are simulated.
pub const SIMULATED_HEADER: &str = "x-meridian-simulated";

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock would leave plain counters; keep serving.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Engine time that corresponds to now on the wall clock.
    pub(crate) fn virtual_now(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * self.opts.speed
    }
}

/// A running twin; stops when dropped.
pub struct TwinServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl TwinServer {
    pub async fn start(
        opts: TwinOptions,
        policy: Box<dyn meridian_core::sched::SchedulingPolicy>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(opts.listen).await?;
        let addr = listener.local_addr()?;
        let config = EngineConfig { prefix_cache: opts.prefix_cache, ..EngineConfig::from(&opts.profile) };
        let engine = Engine::new(config, policy);
        let fingerprint: Arc<str> = format!("meridian-twin/{}", opts.profile.name).into();
        let simulated = HeaderValue::from_str(&fingerprint).map_err(std::io::Error::other)?;
        let turn_kept_s = opts.place_turn_kept_s;
        let shared = Arc::new(Shared {
            core: Mutex::new(Core {
                engine,
                workload: Workload::new(opts.workload, opts.seed),
                subs: HashMap::new(),
                metrics: TwinMetrics::default(),
            }),
            wake: Notify::new(),
            opts,
            started: Instant::now(),
            fingerprint,
            places: Mutex::new(meridian_core::channel::Places::keeping_turns_for(turn_kept_s)),
            places_freed: tokio::sync::watch::Sender::new(0),
        });
        let waits = shared.opts.place_waits;
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(completions))
            .route("/v1/models", get(models))
            .route("/health", get(|| async { StatusCode::OK }))
            .route("/metrics", get(metrics_text))
            .route(meridian_core::channel::HELLO_PATH, get(channel::hello))
            .route(meridian_core::channel::PLACES_PATH, post(channel::places))
            .route(
                meridian_core::channel::PLACES_WAIT_PATH,
                if waits { post(channel::place_wait) } else { post(|| async { StatusCode::NOT_FOUND }) },
            )
            .with_state(shared.clone())
            .layer(axum::middleware::map_response(move |mut response: Response| {
                response.headers_mut().insert(SIMULATED_HEADER, simulated.clone());
                std::future::ready(response)
            }));
        let serve = tokio::spawn(async move {
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app).await;
        });
        let drive = tokio::spawn(driver::run(shared.clone()));
        Ok(TwinServer { addr, shared, tasks: vec![serve, drive] })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn policy_name(&self) -> String {
        self.shared.lock().engine.policy_name().to_owned()
    }
}

impl Drop for TwinServer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    let kind = if status.is_client_error() { "BadRequestError" } else { "InternalServerError" };
    (
        status,
        axum::Json(
            json!({"error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}}),
        ),
    )
        .into_response()
}

async fn chat(State(s): State<Arc<Shared>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    generate(s, headers, body, true).await
}

async fn completions(State(s): State<Arc<Shared>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    generate(s, headers, body, false).await
}

/// Aborts the request in the engine if its response is dropped before the end.
struct AbortOnDrop {
    shared: Arc<Shared>,
    seq: u64,
    done: bool,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if !self.done {
            let mut core = self.shared.lock();
            if core.engine.abort(self.seq) {
                core.metrics.aborted += 1;
            }
            core.subs.remove(&self.seq);
        }
    }
}

async fn generate(shared: Arc<Shared>, headers: HeaderMap, body: axum::body::Bytes, chat: bool) -> Response {
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("invalid JSON: {e}")),
    };
    let req = match TwinRequest::parse(&value, chat) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    if req.model != shared.opts.served_model {
        return error(StatusCode::NOT_FOUND, &format!("The model `{}` does not exist.", req.model));
    }
    let base_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| value.get("request_id").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>()));
    let id = format!("{}-{base_id}", if chat { "chatcmpl" } else { "cmpl" });

    let (tx, rx) = mpsc::unbounded_channel();
    let (seq, plan) = {
        let mut core = shared.lock();
        let shape = core.workload.next_shape();
        // The budget ends thinking early; max_tokens then caps thinking plus answer, as
        // in vLLM, where the model goes on answering after a forced end of thinking.
        let natural = if req.thinking && !req.continues_answer { shape.think } else { 0 };
        let think = req.think_budget.map_or(natural, |b| natural.min(b));
        // The end-of-thought delimiter is a generated token too.
        let delimiter = u32::from(think > 0 && shape.answer > 0);
        let (think, answer, truncated, budget) = match req.max_tokens {
            Some(max) if think + delimiter + shape.answer > max => {
                let t = think.min(max);
                // After a thought, the delimiter takes one of what is left, when anything is.
                (t, (max - t).saturating_sub(u32::from(t > 0)), true, None)
            }
            // The engine applies the budget itself, so it sees a forced end coming.
            _ => (natural, shape.answer, false, req.think_budget),
        };
        let now = shared.virtual_now();
        core.engine.advance_to(now);
        let ids = shared.opts.prefix_cache.is_some().then(|| TokenIds {
            prompt: Arc::from(api::prompt_ids(&value, chat)),
            answer: Arc::from(Vec::new()),
        });
        let submitted = core.engine.submit(NewRequest {
            id: id.clone(),
            prompt_tokens: req.prompt_tokens,
            think_tokens: think,
            answer_tokens: answer,
            priority: req.priority,
            think_budget: budget,
            ids,
            ..NewRequest::default()
        });
        let seq = match submitted {
            Ok(seq) => seq,
            Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
        };
        core.metrics.prompt_tokens += u64::from(req.prompt_tokens);
        let held = core.engine.num_running() + core.engine.num_waiting();
        core.metrics.requests_peak = core.metrics.requests_peak.max(held);
        // Metrics count from when the request really arrived: the engine clock may run
        // ahead by the step that is being slept out.
        let arrival_s = shared.virtual_now();
        core.subs.insert(seq, Subscriber { tx, arrival_s, last_token_s: None });
        let think_len = budget.map_or(think, |b| think.min(b));
        (seq, driver::Plan { think_len, truncated, entropy: shape.entropy })
    };
    shared.wake.notify_one();
    let guard = AbortOnDrop { shared: shared.clone(), seq, done: false };
    let created =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let fingerprint = Arc::clone(&shared.fingerprint);
    let ctx = driver::StreamCtx { id, model: req.model.clone(), created, fingerprint, req, plan };
    if ctx.req.stream {
        let body = driver::sse_body(ctx, rx, guard);
        return Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
            .header("x-request-id", base_id)
            .body(Body::from_stream(body))
            .unwrap_or_else(|e| error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()));
    }
    let json = driver::collect(ctx, rx, guard).await;
    ([("x-request-id", base_id)], axum::Json(json)).into_response()
}

async fn models(State(s): State<Arc<Shared>>) -> Response {
    let p = &s.opts.profile;
    axum::Json(json!({"object": "list", "data": [{
        "id": s.opts.served_model, "object": "model", "created": 0, "owned_by": "meridian-sim",
        "root": s.opts.served_model, "max_model_len": p.kv_blocks * p.block_size,
    }]}))
    .into_response()
}

async fn metrics_text(State(s): State<Arc<Shared>>) -> Response {
    let core = s.lock();
    let gauges = metrics::EngineGauges {
        running: core.engine.num_running(),
        waiting: core.engine.num_waiting(),
        kv_usage: core.engine.kv_usage(),
        preemptions: core.engine.preemptions(),
        output_critical_preemptions: core.engine.output_critical_preemptions(),
        steps: core.engine.steps(),
        virtual_s: core.engine.now(),
        prefix: s.opts.prefix_cache.map(|_| core.engine.prefix_counters()),
    };
    let text = metrics::render(&core.metrics, &gauges, &s.opts.served_model, core.engine.policy_name());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
