use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::fixtures::{Fixture, builtin_fixtures, load_dir};
use crate::plan::DeliveryPlan;
use crate::record::RecordedRequest;

/// Start-up options.
#[derive(Debug, Clone)]
pub struct MockOptions {
    pub listen: SocketAddr,
    /// Model ids listed by `/v1/models`.
    pub models: Vec<String>,
    /// Extra fixture directory.
    pub fixtures_dir: Option<PathBuf>,
    pub default_fixture: String,
    /// Keep each request's body in the record. Tests read it; a benchmark sending
    /// thousands of 220 KB prompts turns it off so the mock's memory stays flat.
    pub keep_bodies: bool,
}

impl Default for MockOptions {
    fn default() -> Self {
        MockOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            models: vec!["Qwen/Qwen3-8B".into()],
            fixtures_dir: None,
            default_fixture: "qwen3-reasoning".into(),
            keep_bodies: true,
        }
    }
}

struct MockState {
    fixtures: BTreeMap<String, Fixture>,
    options: MockOptions,
    requests: Mutex<Vec<RecordedRequest>>,
    healthy: AtomicBool,
    /// What `/v1/models` lists now (starts as `options.models`).
    models: Mutex<Vec<String>>,
    /// `/v1/models` answers 500 while set.
    models_failing: AtomicBool,
    /// What `/metrics` reports as vLLM's `num_requests_waiting` and `kv_cache_usage_perc`.
    engine_load: Mutex<(f64, f64)>,
    /// What `/metrics` reports as vLLM's `num_requests_running` (`None`: not exported).
    engine_running: Mutex<Option<f64>>,
    /// Top logprobs of the one token a probe request (`continue_final_message`) gets.
    probe_logprobs: Mutex<Option<Vec<f64>>>,
}

/// A running mock server; stops when dropped.
pub struct MockUpstream {
    addr: SocketAddr,
    state: Arc<MockState>,
    _stop: oneshot::Sender<()>,
}

impl MockUpstream {
    pub async fn start(options: MockOptions) -> std::io::Result<Self> {
        let mut fixtures = builtin_fixtures();
        if let Some(dir) = &options.fixtures_dir {
            load_dir(dir, &mut fixtures)?;
        }
        let listener = TcpListener::bind(options.listen).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(MockState {
            fixtures,
            models: Mutex::new(options.models.clone()),
            options,
            requests: Mutex::new(Vec::new()),
            healthy: AtomicBool::new(true),
            models_failing: AtomicBool::new(false),
            engine_load: Mutex::new((0.0, 0.0)),
            engine_running: Mutex::new(None),
            probe_logprobs: Mutex::new(None),
        });
        let app = router(state.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(MockUpstream { addr, state, _stop: stop })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, without `/v1`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn fixture(&self, name: &str) -> Option<&Fixture> {
        self.state.fixtures.get(name)
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.state.healthy.store(healthy, Ordering::SeqCst);
    }

    /// Replaces the model ids `/v1/models` lists.
    pub fn set_models(&self, models: Vec<String>) {
        *self.state.models.lock().unwrap_or_else(|e| e.into_inner()) = models;
    }

    /// Makes `/v1/models` answer 500 (a server without the route, or a broken one).
    pub fn set_models_failing(&self, failing: bool) {
        self.state.models_failing.store(failing, Ordering::SeqCst);
    }

    /// Sets the load `/metrics` reports, as vLLM's `vllm:num_requests_waiting` and
    /// `vllm:kv_cache_usage_perc` (0-1).
    pub fn set_engine_load(&self, waiting: f64, kv_usage: f64) {
        *self.state.engine_load.lock().unwrap_or_else(|e| e.into_inner()) = (waiting, kv_usage);
    }

    /// Sets what `/metrics` reports as vLLM's `vllm:num_requests_running` (`None`: the
    /// gauge is left out).
    pub fn set_engine_running(&self, running: Option<f64>) {
        *self.state.engine_running.lock().unwrap_or_else(|e| e.into_inner()) = running;
    }

    /// Makes one-token continuation requests (`"continue_final_message": true`, what an
    /// EAT probe sends) answer with these top logprobs; `None`: replay fixtures as usual.
    pub fn set_probe_logprobs(&self, logprobs: Option<Vec<f64>>) {
        *self.state.probe_logprobs.lock().unwrap_or_else(|e| e.into_inner()) = logprobs;
    }

    /// Waits until `pred` holds for the recorded requests, or the timeout passes.
    pub async fn wait_for(&self, timeout: Duration, pred: impl Fn(&[RecordedRequest]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if pred(&self.requests()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn router(state: Arc<MockState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(generate))
        .route("/v1/completions", post(generate))
        .route("/v1/responses", post(generate))
        .route("/v1/messages", post(generate))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(engine_metrics))
        .route("/mock/requests", get(recorded))
        .fallback(echo)
        .with_state(state)
}

/// Marks its request cancelled if dropped before the response finished.
struct Completion {
    state: Arc<MockState>,
    index: usize,
    done: bool,
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Ok(mut reqs) = self.state.requests.lock() {
            if let Some(r) = reqs.get_mut(self.index) {
                r.completed = self.done;
                r.cancelled = !self.done;
            }
        }
    }
}

fn record(state: &Arc<MockState>, method: &str, path: &str, headers: &HeaderMap, body: &[u8]) -> Completion {
    let headers = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let mut reqs = state.requests.lock().unwrap_or_else(|e| e.into_inner());
    reqs.push(RecordedRequest {
        method: method.to_owned(),
        path: path.to_owned(),
        headers,
        body: if state.options.keep_bodies {
            String::from_utf8_lossy(body).into_owned()
        } else {
            String::new()
        },
        cancelled: false,
        completed: false,
    });
    Completion { state: state.clone(), index: reqs.len() - 1, done: false }
}

fn error_response(status: StatusCode, message: &str) -> Response {
    let body =
        json!({"error": {"message": message, "type": "mock_error", "param": null, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

async fn generate(State(state): State<Arc<MockState>>, headers: HeaderMap, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    let body = match axum::body::to_bytes(req.into_body(), 64 << 20).await {
        Ok(b) => b,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let mut completion = record(&state, "POST", &path, &headers, &body);
    let plan = DeliveryPlan::from_headers(&headers);
    if !plan.first_byte_delay.is_zero() {
        // Dropped here if the client goes away during "prefill": recorded as cancelled.
        tokio::time::sleep(plan.first_byte_delay).await;
    }
    if let Some(code) = plan.status {
        completion.done = true;
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error_response(status, "mock error status");
    }
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let probe = state.probe_logprobs.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(logprobs) = probe.filter(|_| request["continue_final_message"] == Value::Bool(true)) {
        completion.done = true;
        return axum::Json(probe_reply(&logprobs)).into_response();
    }
    let name = plan.fixture.clone().unwrap_or_else(|| match path.as_str() {
        // Each API streams in its own event format: its own recording by default.
        "/v1/responses" => "responses-reasoning".to_owned(),
        "/v1/messages" => "messages-thinking".to_owned(),
        _ => state.options.default_fixture.clone(),
    });
    let Some(fixture) = state.fixtures.get(&name).cloned() else {
        completion.done = true;
        return error_response(StatusCode::NOT_FOUND, &format!("no fixture {name:?}"));
    };
    if request.get("stream").and_then(Value::as_bool) != Some(true) {
        completion.done = true;
        if let Some(whole) = fixture.whole {
            return ([(header::CONTENT_TYPE, "application/json")], whole).into_response();
        }
        let chat = path.ends_with("/chat/completions");
        return axum::Json(aggregate(&fixture, chat)).into_response();
    }
    stream_fixture(fixture, plan, completion)
}

fn stream_fixture(fixture: Fixture, plan: DeliveryPlan, mut completion: Completion) -> Response {
    let body = fixture.body.clone();
    let cuts = plan.cuts(body.len(), &fixture.event_ends());
    let stream = async_stream(move |tx| async move {
        let mut start = 0;
        for (n, end) in cuts.into_iter().enumerate() {
            if n > 0 && !plan.interval.is_zero() {
                tokio::time::sleep(plan.interval).await;
            }
            let mut piece_end = end;
            let stop_at = plan.die_after_bytes.or(plan.hang_after_bytes);
            if let Some(limit) = stop_at {
                if end > limit {
                    piece_end = limit.max(start);
                }
            }
            if piece_end > start && tx.send(Ok(body.slice(start..piece_end))).await.is_err() {
                return;
            }
            start = piece_end;
            if let Some(limit) = stop_at {
                if start >= limit {
                    if plan.die_after_bytes.is_some() {
                        let _ = tx.send(Err(std::io::Error::other("mock upstream died"))).await;
                        return;
                    }
                    // Hang: keep the connection open and silent until the client leaves.
                    tx.closed().await;
                    return;
                }
            }
        }
        completion.done = true;
        drop(completion);
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| error_response(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))
}

type Item = Result<Bytes, std::io::Error>;

/// A body stream fed by a task, so the producer notices (through `tx`) when the client
/// stops reading, and its state (the completion marker) is dropped with it.
fn async_stream<F, Fut>(produce: F) -> impl futures::Stream<Item = Item> + Send
where
    F: FnOnce(tokio::sync::mpsc::Sender<Item>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Item>(1);
    let task = tokio::spawn(produce(tx));
    let abort = AbortOnDrop(task);
    futures::stream::unfold((rx, abort), |(mut rx, abort)| async move {
        rx.recv().await.map(|item| (item, (rx, abort)))
    })
    .boxed()
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A one-token chat completion whose token carries these top logprobs.
fn probe_reply(logprobs: &[f64]) -> Value {
    let top: Vec<Value> =
        logprobs.iter().enumerate().map(|(i, l)| json!({"token": format!("t{i}"), "logprob": l})).collect();
    json!({
        "id": "chatcmpl-probe",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "t0"}, "finish_reason": "length",
            "logprobs": {"content": [{"token": "t0", "logprob": logprobs.first().copied().unwrap_or(0.0), "top_logprobs": top}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    })
}

/// Builds the non-streaming response a server would have sent for this stream.
fn aggregate(fixture: &Fixture, chat: bool) -> Value {
    let mut reasoning = String::new();
    let mut content = String::new();
    let mut first: Option<Value> = None;
    let mut usage = Value::Null;
    let mut finish = Value::Null;
    for chunk in fixture.data_payloads() {
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            usage = u.clone();
        }
        if let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) {
            let delta = choice.get("delta").unwrap_or(choice);
            let text = |field: &str| delta.get(field).and_then(Value::as_str).unwrap_or_default();
            reasoning.push_str(text("reasoning"));
            reasoning.push_str(text("reasoning_content"));
            content.push_str(text("content"));
            content.push_str(text("text"));
            if let Some(f) = choice.get("finish_reason").filter(|f| !f.is_null()) {
                finish = f.clone();
            }
        }
        first.get_or_insert(chunk);
    }
    let first = first.unwrap_or(Value::Null);
    let choice = if chat {
        let mut message = json!({"role": "assistant", "content": content});
        if !reasoning.is_empty() {
            message["reasoning"] = Value::String(reasoning);
        }
        json!({"index": 0, "message": message, "finish_reason": finish, "logprobs": null})
    } else {
        json!({"index": 0, "text": content, "finish_reason": finish, "logprobs": null})
    };
    json!({
        "id": first.get("id").cloned().unwrap_or(Value::Null),
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": first.get("created").cloned().unwrap_or(Value::Null),
        "model": first.get("model").cloned().unwrap_or(Value::Null),
        "choices": [choice],
        "usage": usage,
    })
}

async fn models(State(state): State<Arc<MockState>>) -> Response {
    if state.models_failing.load(Ordering::SeqCst) {
        return error_response(StatusCode::INTERNAL_SERVER_ERROR, "mock models failure");
    }
    let models = state.models.lock().map(|m| m.clone()).unwrap_or_default();
    let data: Vec<Value> = models
        .iter()
        .map(
            |m| json!({"id": m, "object": "model", "created": 0, "owned_by": "vllm", "max_model_len": 32768}),
        )
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// vLLM's load gauges in Prometheus text, labelled as vLLM labels them.
async fn engine_metrics(State(state): State<Arc<MockState>>) -> Response {
    let (waiting, kv) = *state.engine_load.lock().unwrap_or_else(|e| e.into_inner());
    let running = *state.engine_running.lock().unwrap_or_else(|e| e.into_inner());
    let model = state.models.lock().ok().and_then(|m| m.first().cloned()).unwrap_or_default();
    let labels = format!("engine=\"0\",model_name={model:?}");
    let mut text = format!(
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{{labels}}} {waiting}\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{{labels}}} {kv}\n"
    );
    if let Some(running) = running {
        text.push_str(&format!(
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
             # TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{{labels}}} {running}\n"
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn health(State(state): State<Arc<MockState>>) -> StatusCode {
    if state.healthy.load(Ordering::SeqCst) { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
}

async fn recorded(State(state): State<Arc<MockState>>) -> Response {
    let reqs = state.requests.lock().map(|r| r.clone()).unwrap_or_default();
    axum::Json(reqs).into_response()
}

/// Any other route: answer with what was received, so pass-through can be checked.
async fn echo(State(state): State<Arc<MockState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 64 << 20).await.unwrap_or_default();
    let mut completion = record(&state, parts.method.as_str(), parts.uri.path(), &parts.headers, &body);
    completion.done = true;
    let echo = json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "body": String::from_utf8_lossy(&body),
    });
    (StatusCode::OK, [("x-mock-echo", "1")], axum::Json(echo)).into_response()
}
