//! Makes two upstream streams read as one: the continuation's chunks take the first
//! leg's id and creation time, its text becomes answer, its role chunk goes (the client
//! has one), and usage adds both legs up. What the proxy asked for on the client's
//! behalf (per-chunk usage, logprobs) is removed before the client sees it.

use serde_json::{Map, Value};

use super::ClientAsked;

/// What to do with a chunk.
#[derive(Debug, PartialEq)]
pub enum Emit {
    /// Relay the original bytes.
    Same,
    /// Relay this chunk instead.
    Changed,
    /// Relay nothing.
    Drop,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LegUsage {
    prompt: u64,
    completion: u64,
}

pub struct Splicer {
    asked: ClientAsked,
    /// The proxy added logprobs the client did not ask for.
    strip_logprobs: bool,
    id: Option<Value>,
    created: Option<Value>,
    first_usage: Option<LegUsage>,
    /// Completion tokens of the first leg at the cut.
    first_tokens: u64,
}

impl Splicer {
    pub fn new(asked: ClientAsked, added_logprobs: bool) -> Self {
        Splicer {
            asked,
            strip_logprobs: added_logprobs,
            id: None,
            created: None,
            first_usage: None,
            first_tokens: 0,
        }
    }

    /// A chunk of the first leg.
    pub fn first_leg(&mut self, chunk: &mut Value) -> Emit {
        let Some(obj) = chunk.as_object_mut() else { return Emit::Same };
        if self.id.is_none() {
            self.id = obj.get("id").cloned();
            self.created = obj.get("created").cloned();
        }
        if let Some(u) = obj.get("usage").and_then(read_usage) {
            self.first_usage = Some(u);
        }
        let mut changed = false;
        if self.strip_logprobs {
            changed |= null_logprobs(obj);
        }
        match self.keep_usage(obj) {
            Some(true) => {}
            Some(false) if no_choices(obj) => return Emit::Drop,
            Some(false) => changed |= obj.remove("usage").is_some(),
            None => {}
        }
        if changed { Emit::Changed } else { Emit::Same }
    }

    /// The first leg is cut; `counted` is the tracker's token count, used when the
    /// upstream sent no usage with its chunks. Returns the first leg's tokens.
    pub fn cut(&mut self, counted: u32) -> u32 {
        self.first_tokens = self.first_usage.map_or(u64::from(counted), |u| u.completion);
        u32::try_from(self.first_tokens).unwrap_or(u32::MAX)
    }

    /// A chunk of the continuation.
    pub fn second_leg(&mut self, chunk: &mut Value) -> Emit {
        let Some(obj) = chunk.as_object_mut() else { return Emit::Same };
        if is_role_chunk(obj) {
            return Emit::Drop;
        }
        if let Some(id) = &self.id {
            obj.insert("id".into(), id.clone());
        }
        if let Some(created) = &self.created {
            obj.insert("created".into(), created.clone());
        }
        for choice in obj.get_mut("choices").and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) {
                relabel_as_answer(delta);
            }
        }
        if self.strip_logprobs {
            null_logprobs(obj);
        }
        match self.keep_usage(obj) {
            Some(true) => {
                if let Some(Value::Object(u)) = obj.get_mut("usage") {
                    self.merge_usage(u);
                }
            }
            Some(false) if no_choices(obj) => return Emit::Drop,
            Some(false) => {
                obj.remove("usage");
            }
            None => {}
        }
        Emit::Changed
    }

    /// `Some(keep)` when the chunk carries usage: the final usage chunk (no choices) if
    /// the client asked for usage, per-chunk usage if it asked for that.
    fn keep_usage(&self, obj: &Map<String, Value>) -> Option<bool> {
        match obj.get("usage") {
            None | Some(Value::Null) => None,
            Some(_) if no_choices(obj) => Some(self.asked.usage),
            Some(_) => Some(self.asked.continuous_usage),
        }
    }

    /// The continuation's usage, as the client's one request: its prompt is the first
    /// leg's, its completion both legs', and its reasoning the first leg's.
    fn merge_usage(&self, usage: &mut Map<String, Value>) {
        let count = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
        let second = LegUsage { prompt: count("prompt_tokens"), completion: count("completion_tokens") };
        let prompt = match self.first_usage {
            Some(u) => u.prompt,
            // Without usage from the first leg: the continuation's prompt held the
            // reasoning, which was not the client's prompt.
            None => second.prompt.saturating_sub(self.first_tokens),
        };
        let completion = self.first_tokens + second.completion;
        usage.insert("prompt_tokens".into(), prompt.into());
        usage.insert("completion_tokens".into(), completion.into());
        usage.insert("total_tokens".into(), (prompt + completion).into());
        let details = usage.entry("completion_tokens_details").or_insert_with(|| Value::Object(Map::new()));
        if !details.is_object() {
            *details = Value::Object(Map::new());
        }
        if let Value::Object(d) = details {
            d.insert("reasoning_tokens".into(), self.first_tokens.into());
        }
    }
}

fn read_usage(u: &Value) -> Option<LegUsage> {
    Some(LegUsage { prompt: u["prompt_tokens"].as_u64()?, completion: u["completion_tokens"].as_u64()? })
}

fn no_choices(obj: &Map<String, Value>) -> bool {
    obj.get("choices").and_then(Value::as_array).is_none_or(Vec::is_empty)
}

fn null_logprobs(obj: &mut Map<String, Value>) -> bool {
    let mut changed = false;
    for choice in obj.get_mut("choices").and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(lp) = choice.get_mut("logprobs").filter(|lp| !lp.is_null()) {
            *lp = Value::Null;
            changed = true;
        }
    }
    changed
}

/// The chunk that only announces the assistant role (the first of a chat stream).
fn is_role_chunk(obj: &Map<String, Value>) -> bool {
    let Some([choice]) = obj.get("choices").and_then(Value::as_array).map(Vec::as_slice) else {
        return false;
    };
    let Some(delta) = choice["delta"].as_object() else { return false };
    let empty = |k: &str| delta.get(k).is_none_or(|v| v.is_null() || v.as_str() == Some(""));
    delta.contains_key("role") && empty("content") && empty("reasoning") && empty("reasoning_content")
}

/// Moves text the server labelled as reasoning into `content`.
fn relabel_as_answer(delta: &mut Map<String, Value>) {
    let mut text = String::new();
    for key in ["reasoning", "reasoning_content"] {
        if let Some(Value::String(s)) = delta.remove(key) {
            text.push_str(&s);
        }
    }
    if text.is_empty() {
        return;
    }
    if let Some(Value::String(existing)) = delta.get("content") {
        text.push_str(existing);
    }
    delta.insert("content".into(), text.into());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn asked(usage: bool, continuous: bool) -> ClientAsked {
        ClientAsked { usage, continuous_usage: continuous, logprobs: false }
    }

    #[test]
    fn first_leg_usage_is_read_then_hidden_unless_asked_for() {
        let mut s = Splicer::new(asked(false, false), false);
        let mut c = json!({"id": "chatcmpl-1", "created": 5, "choices": [{"index": 0, "delta": {"reasoning": "a"}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}});
        assert_eq!(s.first_leg(&mut c), Emit::Changed);
        assert!(c.get("usage").is_none());
        let mut plain = json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"reasoning": "b"}}]});
        assert_eq!(s.first_leg(&mut plain), Emit::Same);
        let mut last = json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2}});
        assert_eq!(s.first_leg(&mut last), Emit::Drop, "the client asked for no usage chunk");
        assert_eq!(s.cut(99), 2, "the server's count beats the tracker's");
    }

    #[test]
    fn continuation_reads_as_the_same_answer() {
        let mut s = Splicer::new(asked(true, false), false);
        let mut first = json!({"id": "chatcmpl-1", "created": 5, "choices": [{"index": 0, "delta": {"reasoning": "a"}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7}});
        s.first_leg(&mut first);
        assert_eq!(s.cut(7), 7);
        let mut role = json!({"id": "chatcmpl-2", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]});
        assert_eq!(s.second_leg(&mut role), Emit::Drop);
        let mut tok = json!({"id": "chatcmpl-2", "created": 9, "choices": [{"index": 0, "delta": {"reasoning": "The"}}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 1}});
        assert_eq!(s.second_leg(&mut tok), Emit::Changed);
        assert_eq!(
            tok,
            json!({"id": "chatcmpl-1", "created": 5, "choices": [{"index": 0, "delta": {"content": "The"}}]})
        );
        let mut usage = json!({"id": "chatcmpl-2", "choices": [],
            "usage": {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34,
                      "completion_tokens_details": {"reasoning_tokens": 4}}});
        assert_eq!(s.second_leg(&mut usage), Emit::Changed);
        assert_eq!(
            usage["usage"],
            json!({"prompt_tokens": 12, "completion_tokens": 11, "total_tokens": 23,
                   "completion_tokens_details": {"reasoning_tokens": 7}})
        );
    }

    #[test]
    fn without_first_leg_usage_the_tracker_counts() {
        let mut s = Splicer::new(asked(true, false), true);
        let mut first = json!({"id": "x", "choices": [{"index": 0, "delta": {"reasoning": "a"},
            "logprobs": {"content": []}}]});
        assert_eq!(s.first_leg(&mut first), Emit::Changed, "logprobs the proxy added are hidden");
        assert_eq!(first["choices"][0]["logprobs"], Value::Null);
        assert_eq!(s.cut(5), 5);
        let mut usage = json!({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 3}});
        s.second_leg(&mut usage);
        assert_eq!(usage["usage"]["prompt_tokens"], 35);
        assert_eq!(usage["usage"]["completion_tokens"], 8);
    }

    #[test]
    fn answer_text_keeps_its_order() {
        let mut d = json!({"reasoning_content": "a", "content": "b"}).as_object().cloned().unwrap();
        relabel_as_answer(&mut d);
        assert_eq!(Value::Object(d), json!({"content": "ab"}));
    }
}
