//! Sends one request and measures it as its bytes arrive.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use meridian_core::models::ModelFamily;
use serde_json::{Value, json};

use crate::dataset::Prompt;
use crate::record::{RecordBuilder, RequestRecord};

/// What every request of a run shares.
#[derive(Clone)]
pub struct Target {
    pub client: reqwest::Client,
    /// Full URL of the endpoint, e.g. `http://host:8000/v1/chat/completions`.
    pub url: String,
    pub model: String,
    pub chat: bool,
    pub stream: bool,
    pub api_key: Option<String>,
    /// Extra fields merged into every request body (`--extra-body`).
    pub extra_body: Option<Value>,
    pub family: Option<Arc<ModelFamily>>,
    pub ignore_eos: bool,
}

impl Target {
    fn body(&self, prompt: &Prompt) -> Value {
        let mut body = if self.chat {
            json!({"model": self.model, "messages": [{"role": "user", "content": prompt.text}], "max_tokens": prompt.max_tokens})
        } else {
            json!({"model": self.model, "prompt": prompt.text, "max_tokens": prompt.max_tokens})
        };
        if self.stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
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
        let mut b = RecordBuilder::new(index, sent_at, self.family.clone());
        let start = Instant::now();
        let mut req = self.client.post(&self.url).json(&self.body(prompt));
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return b.finish(start.elapsed().as_secs_f64(), Some(format!("request failed: {e}"))),
        };
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            let detail: String = text.chars().take(300).collect();
            return b.finish(start.elapsed().as_secs_f64(), Some(format!("HTTP {status}: {detail}")));
        }
        let mut r = if self.stream {
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
            b.finish(start.elapsed().as_secs_f64(), error)
        } else {
            match resp.bytes().await {
                Ok(body) => {
                    let at = start.elapsed().as_secs_f64();
                    b.on_body(at, &body);
                    b.finish(at, None)
                }
                Err(e) => b.finish(start.elapsed().as_secs_f64(), Some(format!("body failed: {e}"))),
            }
        };
        // The server's count (from `usage`) wins over the estimate.
        r.prompt_tokens.get_or_insert(prompt.input_tokens);
        r
    }
}
