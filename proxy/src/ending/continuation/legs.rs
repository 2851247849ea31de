//! The bodies of the two requests: the first leg (the client's request, asking for what
//! the watch needs), and the continuation after the forced end of thinking, or after the
//! thought's own end when the answer is handed over to another upstream.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::{Delimiters, Route};
use crate::error::ProxyError;

/// Top logprobs the proxy asks for when it needs entropies and the client asked for
/// none (20 is vLLM's default `--max-logprobs` and OpenAI's maximum).
pub const ENTROPY_TOP_LOGPROBS: u32 = 20;

/// What the client asked to receive; whatever the proxy added on top is taken out of
/// the relayed chunks again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientAsked {
    /// `stream_options.include_usage`: one usage chunk at the end.
    pub usage: bool,
    /// `stream_options.continuous_usage_stats` (vLLM): usage in every chunk.
    pub continuous_usage: bool,
    /// Logprobs of its own.
    pub logprobs: bool,
}

fn invalid(e: impl std::fmt::Display) -> ProxyError {
    ProxyError::bad_request(format!("request body is not a JSON object: {e}"), None, "invalid_json")
}

/// The first leg: the client's request plus usage in every chunk (so the proxy knows
/// the exact token count at the cut) and, when `entropies` are wanted and the client
/// asked for no logprobs, the top logprobs RPDI reads.
pub fn first_leg_body(
    body: &Bytes,
    route: Route,
    entropies: bool,
) -> Result<(Bytes, Map<String, Value>, ClientAsked), ProxyError> {
    let mut map: Map<String, Value> = serde_json::from_slice(body).map_err(invalid)?;
    let options = map.get("stream_options");
    let flag = |k: &str| options.and_then(|o| o.get(k)).and_then(Value::as_bool) == Some(true);
    let logprobs = match route {
        Route::Chat => map.get("logprobs").and_then(Value::as_bool) == Some(true),
        Route::Completions => map.get("logprobs").is_some_and(|v| !v.is_null()),
    };
    let asked = ClientAsked {
        usage: flag("include_usage"),
        continuous_usage: flag("include_usage") && flag("continuous_usage_stats"),
        logprobs,
    };
    set_stream_options(&mut map, true);
    if entropies && !logprobs {
        match route {
            Route::Chat => {
                map.insert("logprobs".into(), true.into());
                map.insert("top_logprobs".into(), ENTROPY_TOP_LOGPROBS.into());
            }
            Route::Completions => {
                map.insert("logprobs".into(), ENTROPY_TOP_LOGPROBS.into());
            }
        }
    }
    let bytes = serde_json::to_vec(&map).map_err(invalid)?;
    Ok((Bytes::from(bytes), map, asked))
}

/// `body` asking for usage in every chunk, as a first leg does: for a hook's body that
/// may be handed over (the cut then knows the server's token count, which the tracker's
/// only approximates where a delta carries several tokens or none).
pub fn with_usage_in_every_chunk(body: &Bytes) -> Result<Bytes, ProxyError> {
    let mut map: Map<String, Value> = serde_json::from_slice(body).map_err(invalid)?;
    set_stream_options(&mut map, true);
    serde_json::to_vec(&map).map(Bytes::from).map_err(invalid)
}

fn set_stream_options(map: &mut Map<String, Value>, continuous: bool) {
    let options = map.entry("stream_options").or_insert_with(|| Value::Object(Map::new()));
    if !options.is_object() {
        *options = Value::Object(Map::new());
    }
    if let Value::Object(o) = options {
        o.insert("include_usage".into(), true.into());
        o.insert("continuous_usage_stats".into(), continuous.into());
    }
}

/// What the first leg produced by the cut.
pub struct SoFar<'a> {
    /// Chat: the reasoning text; completions: all generated text.
    pub text: &'a str,
    /// Completion tokens the first leg generated up to the cut.
    pub tokens: u32,
    /// The thought ended by itself before the cut (a hand-over): chat's `answer` is what
    /// followed it; completions' `text` already holds the delimiter and what followed.
    pub closed: bool,
    /// Chat: the answer the client already has (a hand-over), continued from.
    pub answer: &'a str,
}

/// The continuation: the first leg's request with the thought so far closed by the
/// delimiter (and, after a thought that ended by itself, the answer so far), to be
/// continued from there. `None` when the request leaves no room
/// (`max_tokens` spent) or has a shape that cannot be continued.
pub fn second_leg_body(
    first: &Map<String, Value>,
    route: Route,
    delimiters: &Delimiters,
    so_far: SoFar<'_>,
    asked: ClientAsked,
) -> Option<Value> {
    let mut body = first.clone();
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(max) = body.get(key).and_then(Value::as_u64) {
            let left = max.checked_sub(u64::from(so_far.tokens)).filter(|n| *n > 0)?;
            body.insert(key.into(), left.into());
        }
    }
    if let Some(min) = body.get("min_tokens").and_then(Value::as_u64) {
        body.insert("min_tokens".into(), min.saturating_sub(u64::from(so_far.tokens)).into());
    }
    for key in ["thinking_token_budget", "n", "best_of", "echo"] {
        body.remove(key);
    }
    if !asked.logprobs {
        body.remove("logprobs");
        body.remove("top_logprobs");
    }
    set_stream_options(&mut body, asked.continuous_usage);
    match route {
        Route::Chat => {
            let messages = body.get_mut("messages")?.as_array_mut()?;
            let thought = so_far.text.trim_matches('\n');
            let answer = so_far.answer.trim_start_matches('\n');
            let prefill = format!("{}\n{thought}\n{}\n\n{answer}", delimiters.open, delimiters.close);
            messages.push(serde_json::json!({"role": "assistant", "content": prefill}));
            body.insert("add_generation_prompt".into(), false.into());
            body.insert("continue_final_message".into(), true.into());
        }
        Route::Completions => {
            let Some(Value::String(prompt)) = body.get_mut("prompt") else { return None };
            prompt.push_str(so_far.text);
            if so_far.closed {
                return Some(Value::Object(body));
            }
            if !so_far.text.ends_with('\n') {
                prompt.push('\n');
            }
            prompt.push_str(&delimiters.close);
            prompt.push_str("\n\n");
        }
    }
    Some(Value::Object(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tags() -> Delimiters {
        Delimiters { open: "<think>".into(), close: "</think>".into() }
    }

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn first_leg_asks_for_usage_in_every_chunk_and_remembers_what_the_client_asked() {
        let body = Bytes::from(
            json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "messages": []})
                .to_string(),
        );
        let (out, _, asked) = first_leg_body(&body, Route::Chat, false).unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(out["stream_options"], json!({"include_usage": true, "continuous_usage_stats": true}));
        assert_eq!(asked, ClientAsked { usage: true, continuous_usage: false, logprobs: false });
        assert!(out.get("logprobs").is_none(), "no entropies wanted, no logprobs added");
    }

    #[test]
    fn first_leg_adds_logprobs_for_entropies_unless_the_client_has_its_own() {
        let body = Bytes::from(json!({"model": "m", "stream": true, "messages": []}).to_string());
        let (out, _, asked) = first_leg_body(&body, Route::Chat, true).unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!((out["logprobs"].clone(), out["top_logprobs"].clone()), (json!(true), json!(20)));
        assert!(!asked.logprobs && !asked.usage);
        let own = Bytes::from(
            json!({"model": "m", "logprobs": true, "top_logprobs": 5, "messages": []}).to_string(),
        );
        let (out, _, asked) = first_leg_body(&own, Route::Chat, true).unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(out["top_logprobs"], 5);
        assert!(asked.logprobs);
        let completions = Bytes::from(json!({"model": "m", "prompt": "p"}).to_string());
        let (out, _, _) = first_leg_body(&completions, Route::Completions, true).unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap()["logprobs"], 20);
    }

    #[test]
    fn chat_continuation_prefills_the_closed_thought() {
        let first = map(json!({"model": "m", "stream": true, "max_tokens": 100, "thinking_token_budget": 9,
            "logprobs": true, "top_logprobs": 20, "messages": [{"role": "user", "content": "hi"}]}));
        let so_far = SoFar { text: "\nLet me see.\n", tokens: 30, closed: false, answer: "" };
        let body = second_leg_body(&first, Route::Chat, &tags(), so_far, ClientAsked::default()).unwrap();
        assert_eq!(
            body["messages"][1],
            json!({"role": "assistant", "content": "<think>\nLet me see.\n</think>\n\n"})
        );
        assert_eq!(body["continue_final_message"], true);
        assert_eq!(body["add_generation_prompt"], false);
        assert_eq!(body["max_tokens"], 70, "the answer gets what the thought left");
        assert!(body.get("thinking_token_budget").is_none() && body.get("logprobs").is_none());
        assert_eq!(body["stream_options"], json!({"include_usage": true, "continuous_usage_stats": false}));
    }

    #[test]
    fn completions_continuation_appends_to_the_prompt() {
        let first = map(json!({"model": "m", "stream": true, "prompt": "Q: 2+2?\n<think>\n", "echo": true}));
        let so_far = SoFar { text: "Two and two", tokens: 3, closed: false, answer: "" };
        let body =
            second_leg_body(&first, Route::Completions, &tags(), so_far, ClientAsked::default()).unwrap();
        assert_eq!(body["prompt"], "Q: 2+2?\n<think>\nTwo and two\n</think>\n\n");
        assert!(body.get("echo").is_none());
    }

    #[test]
    fn a_handed_over_answer_continues_from_what_the_client_has() {
        let first = map(json!({"model": "m", "stream": true, "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}]}));
        let so_far = SoFar { text: "Let me see.", tokens: 12, closed: true, answer: "\n\nFour" };
        let body = second_leg_body(&first, Route::Chat, &tags(), so_far, ClientAsked::default()).unwrap();
        assert_eq!(
            body["messages"][1],
            json!({"role": "assistant", "content": "<think>\nLet me see.\n</think>\n\nFour"}),
            "the thought closed once, then the answer the client already read"
        );
        assert_eq!(body["max_tokens"], 88);
        let first = map(json!({"model": "m", "stream": true, "prompt": "Q?\n<think>\n"}));
        let so_far = SoFar { text: "Hm.\n</think>\n\nFo", tokens: 5, closed: true, answer: "" };
        let body =
            second_leg_body(&first, Route::Completions, &tags(), so_far, ClientAsked::default()).unwrap();
        assert_eq!(body["prompt"], "Q?\n<think>\nHm.\n</think>\n\nFo", "no second delimiter");
    }

    #[test]
    fn no_continuation_without_room_or_shape() {
        let first = map(json!({"model": "m", "max_completion_tokens": 30, "messages": []}));
        let so_far = || SoFar { text: "x", tokens: 30, closed: false, answer: "" };
        assert!(second_leg_body(&first, Route::Chat, &tags(), so_far(), ClientAsked::default()).is_none());
        let first = map(json!({"model": "m", "prompt": [1, 2]}));
        assert!(
            second_leg_body(&first, Route::Completions, &tags(), so_far(), ClientAsked::default()).is_none()
        );
    }
}
