//! Steps the engine in (scaled) real time and turns its tokens into OpenAI chunks.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use meridian_core::Phase;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::api::{TwinRequest, logprobs_json, token_text, usage_json};
use super::{AbortOnDrop, Shared};
use crate::engine::Token;
use crate::workload::EntropyTrajectory;

/// The engine loop: step, wait out the step's simulated time, deliver its tokens.
pub(crate) async fn run(shared: Arc<Shared>) {
    loop {
        let report = {
            let mut core = shared.lock();
            if core.engine.has_work() {
                let now = shared.virtual_now();
                core.engine.advance_to(now);
                core.engine.step()
            } else {
                None
            }
        };
        let Some(report) = report else {
            // Idle: wait for an arrival (with a timeout as a safety net).
            let _ = tokio::time::timeout(Duration::from_millis(100), shared.wake.notified()).await;
            continue;
        };
        let wall = report.duration_s / shared.opts.speed;
        if wall.is_finite() && wall > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(wall)).await;
        }
        let mut core = shared.lock();
        for token in report.tokens {
            core.metrics.generation_tokens += 1;
            let Some(sub) = core.subs.get_mut(&token.seq) else { continue };
            let (arrival, last) = (sub.arrival_s, sub.last_token_s.replace(token.at_s));
            let delivered = sub.tx.send(token.clone()).is_ok();
            match last {
                None => core.metrics.ttft.observe(token.at_s - arrival),
                Some(prev) => core.metrics.itl.observe(token.at_s - prev),
            }
            if token.last {
                core.metrics.e2e.observe(token.at_s - arrival);
                core.metrics.finished += 1;
                core.subs.remove(&token.seq);
            } else if !delivered {
                core.subs.remove(&token.seq);
                if core.engine.abort(token.seq) {
                    core.metrics.aborted += 1;
                }
            }
        }
    }
}

/// What a response stream needs to know beyond the tokens.
pub(crate) struct Plan {
    pub think_len: u32,
    pub truncated: bool,
    pub entropy: EntropyTrajectory,
}

pub(crate) struct StreamCtx {
    pub id: String,
    pub model: String,
    pub created: u64,
    /// `system_fingerprint` of every chunk and response: says they are simulated.
    pub fingerprint: Arc<str>,
    pub req: TwinRequest,
    pub plan: Plan,
}

impl StreamCtx {
    fn object(&self, stream: bool) -> &'static str {
        match (self.req.chat, stream) {
            (true, true) => "chat.completion.chunk",
            (true, false) => "chat.completion",
            (false, _) => "text_completion",
        }
    }

    fn finish_reason(&self) -> &'static str {
        if self.plan.truncated { "length" } else { "stop" }
    }

    fn chunk(&self, choice: Value) -> Bytes {
        let v = json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "system_fingerprint": &*self.fingerprint, "choices": [choice]});
        Bytes::from(format!("data: {v}\n\n"))
    }

    /// The chunk of the `generated`-th token. On chat, vLLM's reasoning parser swallows
    /// the end-of-thought delimiter: `None`, unless logprobs were asked for, when (as vLLM
    /// does) a chunk with an empty delta carries its logprobs. It is never a stream's last
    /// token: the engine closes a thought only when an answer follows.
    fn token_chunk(&self, t: &Token, generated: u32) -> Option<Bytes> {
        let text = if t.ends_thought { "</think>\n\n" } else { token_text(t) };
        let mut choice = if self.req.chat && t.ends_thought {
            self.req.logprobs?;
            json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": null})
        } else if self.req.chat {
            let field =
                if t.phase == Phase::Think || self.req.continues_answer { "reasoning" } else { "content" };
            json!({"index": 0, "delta": {field: text}, "logprobs": null, "finish_reason": null})
        } else if t.phase == Phase::Think && t.index == 0 {
            // No reasoning parser on /v1/completions: the raw text carries the tags.
            json!({"index": 0, "text": format!("<think>\n{text}"), "logprobs": null, "finish_reason": null})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": null})
        };
        if let Some(top) = self.req.logprobs {
            choice["logprobs"] = logprobs_json(text, self.plan.entropy.at(t.index), top, self.req.chat);
        }
        if t.last {
            choice["finish_reason"] = json!(self.finish_reason());
        }
        if !self.req.continuous_usage {
            return Some(self.chunk(choice));
        }
        // vLLM's per-chunk usage: the counts so far, without details.
        let mut usage = self.usage(generated);
        if let Some(u) = usage.as_object_mut() {
            u.remove("completion_tokens_details");
        }
        let v = json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "system_fingerprint": &*self.fingerprint, "choices": [choice], "usage": usage});
        Some(Bytes::from(format!("data: {v}\n\n")))
    }

    fn usage(&self, generated: u32) -> Value {
        // A continued answer is all "reasoning" to vLLM's parser, which counts it so.
        let think = if self.req.continues_answer { generated } else { generated.min(self.plan.think_len) };
        usage_json(self.req.prompt_tokens, think, generated - think)
    }
}

/// The SSE body: role chunk, one chunk per token, optional usage chunk, `[DONE]`.
pub(crate) fn sse_body(
    ctx: StreamCtx,
    rx: mpsc::UnboundedReceiver<Token>,
    guard: AbortOnDrop,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + Send {
    enum Stage {
        Start,
        Tokens,
        Done,
    }
    let state = (ctx, rx, guard, Stage::Start, 0u32);
    futures::stream::unfold(state, |(ctx, mut rx, mut guard, stage, mut generated)| async move {
        match stage {
            Stage::Start => {
                let first = if ctx.req.chat {
                    ctx.chunk(json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}))
                } else {
                    Bytes::new()
                };
                Some((Ok(first), (ctx, rx, guard, Stage::Tokens, generated)))
            }
            Stage::Tokens => loop {
                let t = rx.recv().await?;
                generated += 1;
                let Some(chunk) = ctx.token_chunk(&t, generated) else { continue };
                if !t.last {
                    return Some((Ok(chunk), (ctx, rx, guard, Stage::Tokens, generated)));
                }
                guard.done = true;
                let mut out = chunk.to_vec();
                if ctx.req.include_usage {
                    let v = json!({"id": ctx.id, "object": ctx.object(true), "created": ctx.created, "model": ctx.model,
                        "system_fingerprint": &*ctx.fingerprint, "choices": [], "usage": ctx.usage(generated)});
                    out.extend_from_slice(format!("data: {v}\n\n").as_bytes());
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                return Some((Ok(Bytes::from(out)), (ctx, rx, guard, Stage::Done, generated)));
            },
            Stage::Done => None,
        }
    })
}

/// The non-streaming answer, once every token is in.
pub(crate) async fn collect(
    ctx: StreamCtx,
    mut rx: mpsc::UnboundedReceiver<Token>,
    mut guard: AbortOnDrop,
) -> Value {
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut generated = 0;
    // Per-token logprobs entries (chat: `content` items; completions: one per field).
    let mut logprobs: Vec<Value> = Vec::new();
    while let Some(t) = rx.recv().await {
        generated += 1;
        if t.ends_thought {
            // Swallowed by the reasoning parser on chat; completions' text carries no tags
            // here either. Counted in usage all the same.
            if t.last {
                guard.done = true;
                break;
            }
            continue;
        }
        let text = token_text(&t);
        let into =
            if t.phase == Phase::Think || ctx.req.continues_answer { &mut reasoning } else { &mut content };
        into.push_str(text);
        if let Some(top) = ctx.req.logprobs {
            logprobs.push(logprobs_json(text, ctx.plan.entropy.at(t.index), top, ctx.req.chat));
        }
        if t.last {
            guard.done = true;
            break;
        }
    }
    let logprobs = ctx.req.logprobs.map_or(Value::Null, |_| merge_logprobs(&logprobs, ctx.req.chat));
    let choice = if ctx.req.chat {
        let mut message = json!({"role": "assistant", "content": content});
        if !reasoning.is_empty() {
            message["reasoning"] = json!(reasoning);
        }
        json!({"index": 0, "message": message, "finish_reason": ctx.finish_reason(), "logprobs": logprobs})
    } else {
        json!({"index": 0, "text": format!("{reasoning}{content}"), "finish_reason": ctx.finish_reason(), "logprobs": logprobs})
    };
    json!({"id": ctx.id, "object": ctx.object(false), "created": ctx.created, "model": ctx.model,
        "system_fingerprint": &*ctx.fingerprint, "choices": [choice], "usage": ctx.usage(generated)})
}

/// One response's logprobs from the per-token objects of [`logprobs_json`].
fn merge_logprobs(per_token: &[Value], chat: bool) -> Value {
    let field = |k: &str| -> Vec<Value> {
        per_token.iter().flat_map(|v| v[k].as_array().cloned().unwrap_or_default()).collect()
    };
    if chat {
        json!({"content": field("content")})
    } else {
        let tokens = field("tokens");
        let offsets: Vec<usize> = tokens
            .iter()
            .scan(0, |at, t| {
                let start = *at;
                *at += t.as_str().map_or(0, str::len);
                Some(start)
            })
            .collect();
        json!({"tokens": tokens, "token_logprobs": field("token_logprobs"),
               "top_logprobs": field("top_logprobs"), "text_offset": offsets})
    }
}
