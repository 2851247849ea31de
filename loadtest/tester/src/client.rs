//! Sends one request and measures it as its bytes arrive.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use meridian_core::models::ModelFamily;
use meridian_core::stream::Dialect;
use serde_json::{Value, json};

use crate::dataset::Prompt;
use crate::record::{RecordBuilder, RequestRecord};

/// The API a run speaks, from its endpoint's path: how each request is written and how
/// its answer is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`: `messages` in, `choices[].delta` out.
    Chat,
    /// `/v1/completions` (and any other path, as before): `prompt` in, `choices[].text` out.
    Completions,
    /// `/v1/responses`, OpenAI's Responses API (how gpt-oss is naturally served): `input`
    /// in, typed reasoning and output-text events out.
    Responses,
    /// `/v1/messages`, Anthropic's Messages API as vLLM serves it: thinking blocks.
    Messages,
}

impl Api {
    pub fn of_endpoint(path: &str) -> Api {
        let path = path.split('?').next().unwrap_or_default().trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Api::Chat
        } else if path.ends_with("/responses") {
            Api::Responses
        } else if path.ends_with("/messages") {
            Api::Messages
        } else {
            Api::Completions
        }
    }

    /// How its streamed events (or whole answers) are read.
    pub fn dialect(self) -> Dialect {
        match self {
            Api::Chat | Api::Completions => Dialect::Chat,
            Api::Responses => Dialect::Responses,
            Api::Messages => Dialect::Messages,
        }
    }

    /// Whether a multi-turn run can speak it: chat only, whose `messages` carry the
    /// history and whose answers vLLM's reasoning parser splits from their thinking.
    pub fn converses(self) -> bool {
        self == Api::Chat
    }

    /// Why a run's options cannot be sent on this API, if they cannot: vLLM reads its
    /// `thinking_token_budget` and `ignore_eos` on chat and completions only.
    pub fn refuses(self, think_budgets: bool, ignore_eos: bool) -> Option<String> {
        if matches!(self, Api::Chat | Api::Completions) {
            return None;
        }
        let what = match (think_budgets, ignore_eos) {
            (true, _) => "think budgets (--random-think-len)",
            (false, true) => "--ignore-eos",
            (false, false) => return None,
        };
        Some(format!(
            "{what}: vLLM reads them on /v1/chat/completions and /v1/completions only, not on the {self:?} API"
        ))
    }
}

/// What every request of a run shares.
#[derive(Clone)]
pub struct Target {
    pub client: reqwest::Client,
    /// Full URLs of the endpoint, e.g. `http://host:8000/v1/chat/completions`: one, or one
    /// per replica of a fleet, which requests take in turn by their index, as a Service
    /// spreads new connections.
    pub urls: Arc<[String]>,
    pub model: String,
    pub api: Api,
    pub stream: bool,
    pub api_key: Option<String>,
    /// Extra fields merged into every request body (`--extra-body`).
    pub extra_body: Option<Value>,
    pub family: Option<Arc<ModelFamily>>,
    pub ignore_eos: bool,
}

/// The header a conversation's turns carry its key in (`--session-header`), the one
/// Meridian's prefix-affinity routing reads by default (`upstream.affinity_header`).
pub const SESSION_HEADER: &str = "x-session-id";

impl Target {
    /// The URL request `index` goes to.
    pub fn url(&self, index: usize) -> &str {
        &self.urls[index % self.urls.len().max(1)]
    }

    fn body(&self, prompt: &Prompt) -> Value {
        let messages = json!([{"role": "user", "content": prompt.text}]);
        self.body_with(messages, prompt)
    }

    /// The body for `prompt`, its messages given (the whole history on a later turn).
    fn body_with(&self, messages: Value, prompt: &Prompt) -> Value {
        let (model, max) = (&self.model, prompt.max_tokens);
        let mut body = match self.api {
            Api::Chat => json!({"model": model, "messages": messages, "max_tokens": max}),
            Api::Completions => json!({"model": model, "prompt": prompt.text, "max_tokens": max}),
            Api::Responses => json!({"model": model, "input": prompt.text, "max_output_tokens": max}),
            Api::Messages => json!({"model": model, "messages": messages, "max_tokens": max}),
        };
        if self.stream {
            body["stream"] = json!(true);
            // The Responses and Messages streams end with their usage unasked.
            if matches!(self.api, Api::Chat | Api::Completions) {
                body["stream_options"] = json!({"include_usage": true});
            }
        }
        if self.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        if let Some(budget) = prompt.think_budget {
            body["thinking_token_budget"] = json!(budget);
        }
        if let (Some(extra), Some(obj)) =
            (self.extra_body.as_ref().and_then(Value::as_object), body.as_object_mut())
        {
            for (k, v) in extra {
                obj.insert(k.clone(), v.clone());
            }
        }
        body
    }

    /// Sends `prompt` as request `index`; `sent_at` is its offset in the run.
    pub async fn send(&self, index: usize, sent_at: f64, prompt: &Prompt) -> RequestRecord {
        let builder = RecordBuilder::new(index, sent_at, self.family.clone(), self.api.dialect());
        self.send_body(builder, self.url(index), &self.body(prompt), prompt.input_tokens, None).await.0
    }

    /// Sends one turn of a conversation: `history` its messages so far, the new one
    /// last, sampled with `seed` when given, with the conversation's `session` header
    /// (name, key) when given. Returns the answer's text beside its record, for the next
    /// turn. Only chat speaks in messages: the caller checks (`Api::converses`).
    pub async fn send_turn(
        &self,
        index: usize,
        sent_at: f64,
        history: &[Value],
        prompt: &Prompt,
        seed: Option<u64>,
        session: Option<(&str, &str)>,
    ) -> (RequestRecord, String) {
        let builder =
            RecordBuilder::new(index, sent_at, self.family.clone(), self.api.dialect()).keep_answer();
        let mut body = self.body_with(Value::Array(history.to_vec()), prompt);
        if let Some(seed) = seed {
            body["seed"] = json!(seed);
        }
        // A guess, as for a synthetic prompt; the server's count from `usage` wins.
        let chars: usize = history.iter().filter_map(|m| m["content"].as_str()).map(str::len).sum();
        let estimate = u32::try_from(chars.div_ceil(4)).unwrap_or(u32::MAX);
        self.send_body(builder, self.url(index), &body, estimate, session).await
    }

    async fn send_body(
        &self,
        mut b: RecordBuilder,
        url: &str,
        body: &Value,
        estimated_prompt: u32,
        session: Option<(&str, &str)>,
    ) -> (RequestRecord, String) {
        let start = Instant::now();
        let mut req = self.client.post(url).json(body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        if let Some((name, key)) = session {
            req = req.header(name, key);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                return b
                    .finish_with_answer(start.elapsed().as_secs_f64(), Some(format!("request failed: {e}")));
            }
        };
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            b.answered_error(status.as_u16(), text.as_bytes());
            let detail: String = text.chars().take(300).collect();
            return b
                .finish_with_answer(start.elapsed().as_secs_f64(), Some(format!("HTTP {status}: {detail}")));
        }
        let (mut r, answer) = if self.stream {
            let mut stream = resp.bytes_stream();
            let mut error = None;
            while let Some(chunk) = stream.next().await {
                // The arrival time is taken before anything is parsed.
                let at = start.elapsed().as_secs_f64();
                match chunk {
                    Ok(bytes) => b.on_chunk(at, &bytes),
                    Err(e) => {
                        error = Some(format!("stream broke: {e}"));
                        break;
                    }
                }
            }
            b.finish_with_answer(start.elapsed().as_secs_f64(), error)
        } else {
            match resp.bytes().await {
                Ok(body) => {
                    let at = start.elapsed().as_secs_f64();
                    b.on_body(at, &body);
                    b.finish_with_answer(at, None)
                }
                Err(e) => {
                    b.finish_with_answer(start.elapsed().as_secs_f64(), Some(format!("body failed: {e}")))
                }
            }
        };
        // The server's count (from `usage`) wins over the estimate.
        r.prompt_tokens.get_or_insert(estimated_prompt);
        (r, answer)
    }
}
