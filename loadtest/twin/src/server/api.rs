//! The OpenAI dialect the twin speaks, shaped like vLLM 0.3x with a reasoning parser:
//! `delta.reasoning` for think tokens, `delta.content` for the answer, `usage` with
//! `completion_tokens_details.reasoning_tokens`, optional `logprobs`.

use serde_json::{Value, json};

use crate::engine::Token;

/// What the twin reads from a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct TwinRequest {
    pub chat: bool,
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
    /// vLLM's `stream_options.continuous_usage_stats`: usage in every chunk.
    pub continuous_usage: bool,
    /// The prompt ends a closed thought: generate the answer only.
    pub continues_answer: bool,
    pub prompt_tokens: u32,
    pub max_tokens: Option<u32>,
    pub priority: i32,
    pub think_budget: Option<u32>,
    pub thinking: bool,
    /// `top_logprobs` (chat) or `logprobs` (completions) count; `None` without logprobs.
    pub logprobs: Option<u32>,
}

fn text_tokens(text: &str) -> u32 {
    // ~4 characters per token, as for English BPE vocabularies.
    (text.chars().count() as u32).div_ceil(4)
}

/// An id for `bytes`: FNV-1a, under 2^31 (the engine marks the ids it makes up with the
/// top bit, so they never meet a caller's).
fn id_of(bytes: impl IntoIterator<Item = u8>) -> u32 {
    let hash = bytes.into_iter().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    hash & 0x7fff_ffff
}

/// A text as token ids, one per four characters (the count `text_tokens` makes).
fn text_ids(text: &str, out: &mut Vec<u32>) {
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(4) {
        out.push(id_of(piece.iter().flat_map(|c| u32::from(*c).to_le_bytes())));
    }
}

/// The prompt as token ids, for the prefix cache: per chat message, four ids for its role
/// (the chat template's framing) and its text, as `prompt_tokens` counts them; a
/// completion's text, or the ids it was sent as. The same history gives the same ids, so
/// a conversation's next turn finds its earlier turns' full blocks, as vLLM does.
pub fn prompt_ids(body: &Value, chat: bool) -> Vec<u32> {
    let mut ids = Vec::new();
    if chat {
        for m in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("");
            ids.extend((0u8..4).map(|k| id_of(role.bytes().chain([k]))));
            text_ids(m.get("content").and_then(Value::as_str).unwrap_or(""), &mut ids);
        }
    } else {
        match body.get("prompt") {
            Some(Value::String(s)) => text_ids(s, &mut ids),
            Some(Value::Array(a)) => {
                ids.extend(a.iter().map(|t| t.as_u64().map_or(0, |t| (t & 0x7fff_ffff) as u32)));
            }
            _ => {}
        }
    }
    ids
}

impl TwinRequest {
    pub fn parse(body: &Value, chat: bool) -> Result<Self, String> {
        let obj = body.as_object().ok_or("request body must be a JSON object")?;
        let model = obj.get("model").and_then(Value::as_str).ok_or("model must be a string")?.to_owned();
        let prompt_tokens = if chat {
            let msgs = obj.get("messages").and_then(Value::as_array).ok_or("messages must be an array")?;
            msgs.iter()
                .map(|m| 4 + m.get("content").and_then(Value::as_str).map_or(0, text_tokens))
                .sum::<u32>()
                .max(1)
        } else {
            match obj.get("prompt") {
                Some(Value::String(s)) => text_tokens(s).max(1),
                Some(Value::Array(a)) => (a.len() as u32).max(1),
                _ => return Err("prompt must be a string or a list of token ids".into()),
            }
        };
        // The last thought in the text is closed: a continuation past a forced end, or an
        // answer handed over with what the client already has after the end tag.
        let closed = |text: &str| match (text.rfind(THINK_START), text.rfind(THINK_END)) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(open), Some(close)) => close > open,
        };
        let continues_answer = if chat {
            let last = obj.get("messages").and_then(Value::as_array).and_then(|m| m.last());
            obj.get("continue_final_message").and_then(Value::as_bool) == Some(true)
                && last.is_some_and(|m| {
                    m.get("role").and_then(Value::as_str) == Some("assistant")
                        && m.get("content").and_then(Value::as_str).is_some_and(closed)
                })
        } else {
            obj.get("prompt").and_then(Value::as_str).is_some_and(closed)
        };
        let option = |k: &str| {
            obj.get("stream_options").and_then(|o| o.get(k)).and_then(Value::as_bool).unwrap_or(false)
        };
        let uint = |k: &str| obj.get(k).and_then(Value::as_u64).map(|v| v.min(u64::from(u32::MAX)) as u32);
        let logprobs = if chat {
            match obj.get("logprobs").and_then(Value::as_bool) {
                Some(true) => Some(uint("top_logprobs").unwrap_or(0)),
                _ => None,
            }
        } else {
            uint("logprobs")
        };
        Ok(TwinRequest {
            chat,
            model,
            stream: obj.get("stream").and_then(Value::as_bool).unwrap_or(false),
            include_usage: option("include_usage"),
            continuous_usage: option("include_usage") && option("continuous_usage_stats"),
            continues_answer,
            prompt_tokens,
            max_tokens: uint("max_completion_tokens").or_else(|| uint("max_tokens")),
            priority: obj.get("priority").and_then(Value::as_i64).unwrap_or(0) as i32,
            think_budget: uint("thinking_token_budget"),
            thinking: obj
                .get("chat_template_kwargs")
                .and_then(|k| k.get("enable_thinking"))
                .and_then(Value::as_bool)
                .unwrap_or(true),
            logprobs,
        })
    }
}

/// The think tags of the models the twin imitates (Qwen3).
const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

const THINK_WORDS: [&str; 16] = [
    "Let", " me", " think", " about", " this", ".", " First", ",", " check", " the", " numbers", " again",
    " so", " that", " works", "\n",
];
const ANSWER_WORDS: [&str; 12] =
    ["The", " answer", " is", " four", ".", " Here", " is", " why", ":", " two", " plus", " two"];

/// The text of a token: deterministic, readable filler.
pub fn token_text(token: &Token) -> &'static str {
    let i = (token.seq as usize).wrapping_mul(7).wrapping_add(token.index as usize);
    match token.phase {
        meridian_core::Phase::Think => THINK_WORDS[i % THINK_WORDS.len()],
        _ => ANSWER_WORDS[i % ANSWER_WORDS.len()],
    }
}

/// Logprobs for a token whose distribution has entropy `h`: modelled as uniform over
/// `n = round(e^h)` candidates, so the entropy of what is reported is `ln n ≈ h`.
pub fn logprobs_json(text: &str, h: f64, top: u32, chat: bool) -> Value {
    let n = h.exp().round().max(1.0);
    let lp = -n.ln();
    let top_n = (top as usize).min(n as usize);
    if chat {
        let mut alts = vec![json!({"token": text, "logprob": lp, "bytes": text.as_bytes()})];
        for k in 1..top_n {
            let alt = format!("<alt{k}>");
            alts.push(json!({"token": alt, "logprob": lp, "bytes": alt.as_bytes()}));
        }
        json!({"content": [{"token": text, "logprob": lp, "bytes": text.as_bytes(), "top_logprobs": alts}]})
    } else {
        let mut top_map = serde_json::Map::new();
        top_map.insert(text.to_owned(), json!(lp));
        for k in 1..top_n {
            top_map.insert(format!("<alt{k}>"), json!(lp));
        }
        json!({"tokens": [text], "token_logprobs": [lp], "top_logprobs": [top_map], "text_offset": [0]})
    }
}

/// The `usage` object.
pub fn usage_json(prompt: u32, think: u32, answer: u32) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": think + answer,
        "total_tokens": prompt + think + answer,
        "completion_tokens_details": {"reasoning_tokens": think},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_fields_vllm_reads() {
        let body = json!({
            "model": "m", "stream": true, "messages": [{"role": "user", "content": "12345678"}],
            "max_tokens": 50, "priority": -3, "thinking_token_budget": 7,
            "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 5,
            "chat_template_kwargs": {"enable_thinking": false},
        });
        let r = TwinRequest::parse(&body, true).unwrap();
        assert_eq!((r.prompt_tokens, r.max_tokens, r.priority, r.think_budget), (6, Some(50), -3, Some(7)));
        assert!(r.stream && r.include_usage && !r.thinking);
        assert_eq!(r.logprobs, Some(5));
        assert!(!r.continues_answer && !r.continuous_usage);
        assert!(TwinRequest::parse(&json!({"model": "m"}), true).is_err());
        assert!(TwinRequest::parse(&json!([1]), false).is_err());
    }

    #[test]
    fn a_later_turns_prompt_begins_with_the_earlier_turns_ids() {
        let turn = |messages: Value| json!({"model": "m", "messages": messages});
        let first =
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]);
        let mut second = first.clone();
        second.as_array_mut().unwrap().extend([
            json!({"role": "assistant", "content": "Four."}),
            json!({"role": "user", "content": "And 3+3?"}),
        ]);
        let (a, b) = (prompt_ids(&turn(first.clone()), true), prompt_ids(&turn(second), true));
        assert_eq!(a.len() as u32, TwinRequest::parse(&turn(first), true).unwrap().prompt_tokens);
        assert!(b.len() > a.len() && b[..a.len()] == a[..], "the history's ids come first");
        assert!(b.iter().all(|&id| id < 1 << 31), "never an id the engine makes up");
        let other = prompt_ids(&turn(json!([{"role": "user", "content": "What is 2+3?"}])), true);
        assert_ne!(other, a[4 + 3..], "another text, other ids");
        assert_eq!(prompt_ids(&json!({"model": "m", "prompt": [5, 6, 7]}), false), [5, 6, 7]);
    }

    #[test]
    fn a_closed_thought_is_continued_with_the_answer() {
        let prefill = json!({"model": "m", "continue_final_message": true, "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\n"}],
            "stream_options": {"include_usage": true, "continuous_usage_stats": true}});
        let r = TwinRequest::parse(&prefill, true).unwrap();
        assert!(r.continues_answer && r.continuous_usage);
        let mut open = prefill.clone();
        open["messages"][1]["content"] = json!("<think>\nhm");
        assert!(!TwinRequest::parse(&open, true).unwrap().continues_answer);
        let completions = json!({"model": "m", "prompt": "Q\n<think>\nhm\n</think>\n\n"});
        assert!(TwinRequest::parse(&completions, false).unwrap().continues_answer);
        let mut handed_over = prefill.clone();
        handed_over["messages"][1]["content"] = json!("<think>\nhm\n</think>\n\nThe answer");
        assert!(TwinRequest::parse(&handed_over, true).unwrap().continues_answer, "an answer begun");
        let reopened = json!({"model": "m", "prompt": "<think>a</think> Q2\n<think>\nhm"});
        assert!(!TwinRequest::parse(&reopened, false).unwrap().continues_answer, "a later thought is open");
        let plain = json!({"model": "m", "prompt": "Q"});
        assert!(!TwinRequest::parse(&plain, false).unwrap().continues_answer);
    }

    #[test]
    fn reported_logprobs_carry_the_entropy() {
        let v = logprobs_json("x", 2.0, 20, true);
        let top = v["content"][0]["top_logprobs"].as_array().unwrap();
        let n = top.len() as f64; // round(e^2) = 7 candidates, all reported
        let h: f64 =
            top.iter().map(|t| -t["logprob"].as_f64().unwrap() * t["logprob"].as_f64().unwrap().exp()).sum();
        assert_eq!(n, 7.0);
        assert!((h - 7f64.ln()).abs() < 1e-9);
    }
}
