//! A client's view of one streamed answer, as the continuation and hand-over tests read
//! it: what came as reasoning and as answer, the ids, roles, usage and errors.

use serde_json::{Value, json};

use super::{client, receive};

/// What a client read from one stream.
#[derive(Debug, Default)]
pub struct Read {
    pub reasoning: Vec<String>,
    pub content: Vec<String>,
    pub ids: Vec<String>,
    pub roles: usize,
    pub usage: Vec<Value>,
    pub logprobs_seen: bool,
    pub reasoning_after_answer: bool,
    pub done: usize,
    pub errors: Vec<Value>,
}

/// Streams `body` to the proxy at `path` and reads what the client gets.
pub async fn stream(proxy: &meridian_proxy::Server, path: &str, body: Value) -> Read {
    let text = receive(client().post(format!("http://{}{path}", proxy.local_addr)).json(&body)).await.text();
    let mut r = Read::default();
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            r.done += 1;
            continue;
        }
        let v: Value = serde_json::from_str(line).unwrap();
        if v.get("error").is_some() {
            r.errors.push(v);
            continue;
        }
        r.ids.push(v["id"].as_str().unwrap_or_default().to_owned());
        if !v["usage"].is_null() {
            r.usage.push(v["usage"].clone());
        }
        for ch in v["choices"].as_array().unwrap() {
            r.logprobs_seen |= !ch["logprobs"].is_null();
            if ch["delta"]["role"].is_string() {
                r.roles += 1;
            }
            let reasoning = ch["delta"]["reasoning"].as_str().filter(|s| !s.is_empty());
            let content = ch["delta"]["content"].as_str().or(ch["text"].as_str()).filter(|s| !s.is_empty());
            if let Some(s) = reasoning {
                r.reasoning_after_answer |= !r.content.is_empty();
                r.reasoning.push(s.to_owned());
            }
            if let Some(s) = content {
                r.content.push(s.to_owned());
            }
        }
    }
    r
}

/// A streamed chat asking for usage, with `extra`'s members set on it.
pub fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "Qwen/Qwen3-8B", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "What is two plus two?"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}
