//! In-process test rig: mock upstreams replaying recorded vLLM streams, a real proxy in
//! front of them, and a client that keeps every chunk with its arrival time.
#![allow(dead_code)]

mod scripted;
mod streams;
mod twins;
#[allow(unused_imports)]
pub use scripted::{Close, Scripted};
#[allow(unused_imports)]
pub use streams::{Read, chat, stream};
#[allow(unused_imports)]
pub use twins::{HookRelay, claim_as_replica, counts_places, places_counted, silent_hook, twin, twin_with};

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use meridian_core::ModelRegistry;
use meridian_core::models::ModelFamily;
use meridian_mock_upstream::{MockOptions, MockUpstream};
use meridian_proxy::config::EndpointConfig;
use meridian_proxy::config::MeridianConfig;
use meridian_proxy::{AppState, Metrics, Server};

/// The tiny recorded model's boundary ids (scripts/make_tiny_model.py).
pub const TINY_FAMILY: &str = r#"
name = "tiny"
display_name = "Tiny Qwen3 (test model)"
match = ["tiny-qwen3"]
initial_phase = "think"
[tags]
start = ["<think>"]
end = ["</think>"]
start_ids = [465]
end_ids = [466]
[verification]
status = "text_only"
source = "built by scripts/make_tiny_model.py"
"#;

pub struct Rig {
    pub mocks: Vec<MockUpstream>,
    pub proxy: Server,
    pub client: reqwest::Client,
}

pub fn registry() -> ModelRegistry {
    let mut reg = ModelRegistry::builtin().unwrap();
    reg.insert(ModelFamily::parse("tiny.toml", TINY_FAMILY).unwrap());
    reg
}

pub fn config_for(urls: &[String]) -> MeridianConfig {
    let mut cfg = MeridianConfig::default();
    cfg.server.listen = "127.0.0.1:0".into();
    cfg.upstream.endpoints = urls
        .iter()
        .map(|u| EndpointConfig {
            url: u.clone(),
            name: None,
            hook: None,
            models: None,
            role: Default::default(),
        })
        .collect();
    cfg.upstream.health_interval_s = 0.2;
    cfg.upstream.first_byte_timeout_s = 5.0;
    cfg.upstream.idle_timeout_s = 5.0;
    cfg
}

impl Rig {
    pub async fn new(n_upstreams: usize) -> Rig {
        Self::with(n_upstreams, |_| {}).await
    }

    pub async fn with(n_upstreams: usize, tweak: impl FnOnce(&mut MeridianConfig)) -> Rig {
        let mut mocks = Vec::new();
        for _ in 0..n_upstreams {
            mocks.push(MockUpstream::start(mock_options()).await.unwrap());
        }
        let urls: Vec<String> = mocks.iter().map(|m| m.url()).collect();
        let mut cfg = config_for(&urls);
        tweak(&mut cfg);
        let proxy = start_proxy(cfg).await;
        Rig { mocks, proxy, client: client() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.proxy.local_addr, path)
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.proxy.state.metrics
    }

    pub fn scrape(&self) -> String {
        self.proxy.state.render_metrics()
    }

    /// Open streamed responses in `phase`, as `meridian_open_streams` reports them.
    pub fn open_streams(&self, phase: meridian_core::Phase) -> u64 {
        self.proxy.state.streams.streams_by_phase()[meridian_proxy::ctx::phase_slot(phase)]
    }

    /// A chat request for `model` replaying `fixture`, with extra mock headers.
    pub fn chat(&self, model: &str, fixture: &str, headers: &[(&str, &str)]) -> reqwest::RequestBuilder {
        self.generate("/v1/chat/completions", model, fixture, headers)
    }

    pub fn generate(
        &self,
        path: &str,
        model: &str,
        fixture: &str,
        headers: &[(&str, &str)],
    ) -> reqwest::RequestBuilder {
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "What is two plus two?"}],
            "stream": true,
        });
        let mut req = self.client.post(self.url(path)).json(&body).header("x-mock-fixture", fixture);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req
    }
}

/// The model names the fixtures were recorded from, which the tests request.
pub const FIXTURE_MODELS: [&str; 4] =
    ["Qwen/Qwen3-8B", "Qwen/Qwen3-4B-Thinking-2507", "openai/gpt-oss-20b", "tiny-qwen3"];

/// A mock that lists every fixture model (the proxy routes by model name).
pub fn mock_options() -> MockOptions {
    MockOptions { models: FIXTURE_MODELS.iter().map(|m| (*m).to_owned()).collect(), ..MockOptions::default() }
}

pub async fn start_proxy(cfg: MeridianConfig) -> Server {
    let state = AppState::new(cfg, registry(), Arc::new(Metrics::new())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    Server::start(state, listener).await.unwrap()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().tcp_nodelay(true).build().unwrap()
}

/// A response body as chunks with the time each arrived.
pub struct Received {
    pub status: reqwest::StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub chunks: Vec<(Instant, Bytes)>,
    pub error: Option<String>,
}

impl Received {
    pub fn body(&self) -> Vec<u8> {
        self.chunks.iter().flat_map(|(_, c)| c.iter().copied()).collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body()).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body()).unwrap()
    }
}

pub async fn receive(req: reqwest::RequestBuilder) -> Received {
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let mut stream = resp.bytes_stream();
    let mut chunks = Vec::new();
    let mut error = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(b) => chunks.push((Instant::now(), b)),
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    Received { status, headers, chunks, error }
}

/// The value of one sample in Prometheus text, e.g.
/// `sample(&text, "meridian_open_streams", &[("phase", "think")])`.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
        if metric != name {
            return None;
        }
        let rest = rest.trim_end_matches('}');
        let all = labels.iter().all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
        if all { value.parse().ok() } else { None }
    })
}

/// Waits until `read` gives `want`, for at most `within`; the failure names `what` and
/// the last reading.
pub async fn reaches<T, F>(what: &str, want: T, within: Duration, mut read: impl FnMut() -> F)
where
    T: PartialEq + std::fmt::Display,
    F: std::future::Future<Output = T>,
{
    let deadline = Instant::now() + within;
    loop {
        let now = read().await;
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {now}, not {want}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `cond` until it holds (metrics are updated when bodies drop, a moment after the
/// client saw the last byte).
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
