use std::sync::Arc;

use crate::config::ExitConfig;
use axum::http::HeaderValue;
use meridian_core::signals::{Eat, entropy_from_top_logprobs};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::EndThinking;
use super::continuation::Delimiters;
use crate::ctx::RequestCtx;
use crate::relay::watch::{Event, Watcher};
use crate::telemetry::Metrics;

/// Where and how one stream's probes go.
pub struct ProbeTarget {
    pub client: reqwest::Client,
    /// Upstream base URL (no `/v1`).
    pub base_url: String,
    pub auth: Option<HeaderValue>,
    /// The request probed: its body is the conversation the probes extend, its
    /// `X-Request-Id` the root of their ids (for logs), its stream id what a forced exit
    /// names at the hook.
    pub ctx: Arc<RequestCtx>,
    /// The text tags that open and close a thought for this model.
    pub delimiters: Delimiters,
    /// How to end thinking.
    pub end: EndThinking,
    pub metrics: Arc<Metrics>,
}

/// Feeds reasoning snapshots of one stream to a background task that probes and decides.
pub struct EatProber {
    tx: mpsc::UnboundedSender<String>,
    every: u32,
    min_tokens: u32,
    next_at: u32,
}

impl EatProber {
    pub fn start(cfg: &ExitConfig, target: ProbeTarget) -> Option<Self> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = mpsc::unbounded_channel();
        rt.spawn(run(Eat::new(cfg.eat()), target, rx));
        let every = cfg.eat_probe_every_tokens.max(1);
        Some(EatProber {
            tx,
            every,
            min_tokens: cfg.min_think_tokens,
            next_at: cfg.min_think_tokens.max(every),
        })
    }

    /// Called as thinking grows; takes a snapshot for a probe at every probe point.
    pub fn on_thinking(&mut self, think_tokens: u32, reasoning: &str) {
        if think_tokens < self.next_at.max(self.min_tokens) {
            return;
        }
        self.next_at = think_tokens + self.every;
        // The task may have finished (it decided): then nobody listens, which is fine.
        let _ = self.tx.send(reasoning.to_owned());
    }
}

/// Feeds a stream's reasoning to its prober as it grows (the first choice's: a probe
/// continues one conversation).
pub struct EatFeed {
    prober: EatProber,
    reasoning: String,
}

impl EatFeed {
    pub fn new(prober: EatProber) -> Self {
        EatFeed { prober, reasoning: String::new() }
    }
}

impl Watcher for EatFeed {
    fn on_event(&mut self, event: &Event<'_>) {
        for part in event.parts.iter().filter(|p| p.choice == 0 && p.thinking) {
            self.reasoning.push_str(part.reasoning.as_deref().unwrap_or_default());
            self.prober.on_thinking(part.choice_think_tokens, &self.reasoning);
        }
    }
}

/// The probe request: the conversation so far plus the assistant's thought closed by the
/// delimiter, continued for one token with its top logprobs.
fn probe_body(original: &Value, target: &ProbeTarget, reasoning: &str) -> Option<Value> {
    let mut body = original.as_object()?.clone();
    let messages = body.get_mut("messages")?.as_array_mut()?;
    let prefill =
        format!("{}\n{}\n{}\n\n", target.delimiters.open, reasoning.trim(), target.delimiters.close);
    messages.push(json!({"role": "assistant", "content": prefill}));
    for key in [
        "stream",
        "stream_options",
        "meridian",
        "vllm_xargs",
        "thinking_token_budget",
        "n",
        "max_completion_tokens",
    ] {
        body.remove(key);
    }
    body.insert("max_tokens".into(), 1.into());
    body.insert("logprobs".into(), true.into());
    body.insert("top_logprobs".into(), 20.into());
    body.insert("add_generation_prompt".into(), false.into());
    body.insert("continue_final_message".into(), true.into());
    Some(Value::Object(body))
}

/// The lower bound on the next token's entropy the probe's top logprobs allow.
fn probe_entropy(reply: &Value) -> Option<f64> {
    let top = reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"].as_array()?;
    let logprobs: Vec<f64> = top.iter().filter_map(|t| t["logprob"].as_f64()).collect();
    (!logprobs.is_empty()).then(|| entropy_from_top_logprobs(&logprobs, usize::MAX).lower)
}

async fn run(mut eat: Eat, target: ProbeTarget, mut rx: mpsc::UnboundedReceiver<String>) {
    let Ok(original) = serde_json::from_slice::<Value>(&target.ctx.body) else { return };
    let url = format!("{}/v1/chat/completions", target.base_url);
    let mut probes = 0u32;
    while let Some(mut reasoning) = rx.recv().await {
        // Only the latest snapshot matters if the engine answered slower than it thinks.
        while let Ok(newer) = rx.try_recv() {
            reasoning = newer;
        }
        let Some(body) = probe_body(&original, &target, &reasoning) else { return };
        probes += 1;
        let mut req = target
            .client
            .post(&url)
            .header("x-request-id", format!("{}-eat-{probes}", target.ctx.request_id()))
            .json(&body);
        if let Some(auth) = &target.auth {
            req = req.header(reqwest::header::AUTHORIZATION, auth.clone());
        }
        let reply = match req.send().await {
            Ok(r) if r.status().is_success() => r.json::<Value>().await.ok(),
            Ok(r) => {
                tracing::debug!(status = %r.status(), "EAT probe refused");
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "EAT probe failed");
                None
            }
        };
        let Some(x) = reply.as_ref().and_then(probe_entropy) else {
            target.metrics.count_eat_probe("failed");
            continue;
        };
        target.metrics.count_eat_probe("ok");
        if eat.update(x).stop {
            target.end.now(target.ctx.stream_id());
            target.metrics.count_entropy_exit("eat");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_comes_from_the_first_tokens_top_logprobs() {
        let reply = json!({"choices": [{"logprobs": {"content": [{"top_logprobs": [
            {"token": "a", "logprob": (0.5f64).ln()}, {"token": "b", "logprob": (0.5f64).ln()}]}]}}]});
        let h = probe_entropy(&reply).unwrap();
        assert!((h - std::f64::consts::LN_2).abs() < 1e-12, "{h}");
        assert_eq!(probe_entropy(&json!({"choices": []})), None);
    }
}
