//! Makes two upstream streams read as one: the continuation's chunks take the first
//! leg's id and creation time, its text becomes answer, its role chunk goes (the client
//! has one), and usage adds both legs up. What the proxy asked for on the client's
//! behalf (per-chunk usage, logprobs) is removed before the client sees it.
//!
//! A chunk is rewritten in place, as bytes: its members are read once without building a
//! tree ([`Members`]), the few that change are written anew (the id, `created`, a
//! `delta`'s labels, `logprobs`, `usage`) and every other byte is copied as sent. Most
//! chunks of a first leg need nothing, or only their `usage` removed.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::ClientAsked;
use crate::members::{Edit, Members};

/// What to do with a chunk.
#[derive(Debug, PartialEq)]
pub enum Emit {
    /// Relay the original bytes.
    Same,
    /// Relay this chunk instead.
    Changed(Vec<u8>),
    /// Relay nothing.
    Drop,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
struct LegUsage {
    #[serde(rename = "prompt_tokens")]
    prompt: u64,
    #[serde(rename = "completion_tokens")]
    completion: u64,
}

pub struct Splicer {
    asked: ClientAsked,
    /// The proxy added logprobs the client did not ask for.
    strip_logprobs: bool,
    /// The first leg's id and creation time, as the JSON text it sent.
    id: Option<String>,
    created: Option<String>,
    first_usage: Option<LegUsage>,
    /// Completion tokens of the first leg at the cut.
    first_tokens: u64,
    /// Of those, the answer's (a thought that ended by itself, handed over).
    first_answer: u64,
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
            first_answer: 0,
        }
    }

    /// A chunk (`data:` payload) of the first leg.
    pub fn first_leg(&mut self, payload: &[u8]) -> Emit {
        let Ok(chunk) = serde_json::from_slice::<Members<'_>>(payload) else { return Emit::Same };
        if self.id.is_none() {
            self.id = chunk.get("id").map(|v| v.get().to_owned());
            self.created = chunk.get("created").map(|v| v.get().to_owned());
        }
        if let Some(u) = present(chunk.get("usage")).and_then(|u| serde_json::from_str(u.get()).ok()) {
            self.first_usage = Some(u);
        }
        let mut edits: Vec<(&str, Edit<'_>)> = Vec::new();
        if self.strip_logprobs {
            if let Some(choices) = rewrite_choices(&choices_of(&chunk), false, true) {
                edits.push(("choices", Edit::Set(choices.into())));
            }
        }
        match self.keep_usage(&chunk) {
            Some(true) | None => {}
            Some(false) if no_choices(&chunk) => return Emit::Drop,
            Some(false) => edits.push(("usage", Edit::Remove)),
        }
        if edits.is_empty() { Emit::Same } else { Emit::Changed(chunk.rewrite(&edits, payload.len())) }
    }

    /// The first leg is cut; `counted` is the tracker's token count, used when the
    /// upstream sent no usage with its chunks, and `answered` the tracker's count of the
    /// answer tokens among them (after a thought that ended by itself; the rest are
    /// reasoning). Returns the first leg's tokens.
    pub fn cut(&mut self, counted: u32, answered: u32) -> u32 {
        self.first_tokens = self.first_usage.map_or(u64::from(counted), |u| u.completion);
        self.first_answer = u64::from(answered).min(self.first_tokens);
        u32::try_from(self.first_tokens).unwrap_or(u32::MAX)
    }

    /// A chunk (`data:` payload) of the continuation.
    pub fn second_leg(&mut self, payload: &[u8]) -> Emit {
        let Ok(chunk) = serde_json::from_slice::<Members<'_>>(payload) else { return Emit::Same };
        let choices = choices_of(&chunk);
        if is_role_chunk(&choices) {
            return Emit::Drop;
        }
        let mut edits: Vec<(&str, Edit<'_>)> = Vec::new();
        if let Some(id) = &self.id {
            edits.push(("id", Edit::Set(id.as_str().into())));
        }
        if let Some(created) = &self.created {
            edits.push(("created", Edit::Set(created.as_str().into())));
        }
        if let Some(choices) = rewrite_choices(&choices, true, self.strip_logprobs) {
            edits.push(("choices", Edit::Set(choices.into())));
        }
        match self.keep_usage(&chunk) {
            Some(true) => {
                if let Some(usage) = chunk.get("usage").and_then(|u| self.merge_usage(u)) {
                    edits.push(("usage", Edit::Set(usage.into())));
                }
            }
            Some(false) if no_choices(&chunk) => return Emit::Drop,
            Some(false) => edits.push(("usage", Edit::Remove)),
            None => {}
        }
        Emit::Changed(chunk.rewrite(&edits, payload.len()))
    }

    /// `Some(keep)` when the chunk carries usage: the final usage chunk (no choices) if
    /// the client asked for usage, per-chunk usage if it asked for that.
    fn keep_usage(&self, chunk: &Members<'_>) -> Option<bool> {
        present(chunk.get("usage"))?;
        Some(if no_choices(chunk) { self.asked.usage } else { self.asked.continuous_usage })
    }

    /// The continuation's usage, as the client's one request: its prompt is the first
    /// leg's, its completion both legs', and its reasoning the first leg's. `None`: not
    /// an object (relayed as it came).
    fn merge_usage(&self, usage: &RawValue) -> Option<String> {
        let mut usage: serde_json::Map<String, serde_json::Value> = serde_json::from_str(usage.get()).ok()?;
        let count = |u: &serde_json::Map<String, serde_json::Value>, k: &str| {
            u.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0)
        };
        let second = LegUsage {
            prompt: count(&usage, "prompt_tokens"),
            completion: count(&usage, "completion_tokens"),
        };
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
        let details = usage
            .entry("completion_tokens_details")
            .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
        if !details.is_object() {
            *details = serde_json::Value::Object(serde_json::Map::new());
        }
        if let serde_json::Value::Object(d) = details {
            d.insert("reasoning_tokens".into(), (self.first_tokens - self.first_answer).into());
        }
        serde_json::to_string(&usage).ok()
    }
}

/// A value unless it is absent or `null`.
fn present(v: Option<&RawValue>) -> Option<&RawValue> {
    v.filter(|v| v.get() != "null")
}

/// The chunk has no choices (a usage chunk): `choices` absent, `null`, not an array, or
/// empty.
fn no_choices(chunk: &Members<'_>) -> bool {
    present(chunk.get("choices")).is_none_or(|c| {
        let text = c.get();
        !text.starts_with('[') || text[1..].trim_start().starts_with(']')
    })
}

/// A chunk's choices, each as sent and, when it is an object, read into its members
/// (once, for both the role check and the rewrite); none when absent or not an array.
fn choices_of<'a>(chunk: &Members<'a>) -> Vec<(&'a RawValue, Option<Members<'a>>)> {
    let Some(raw) = present(chunk.get("choices")) else { return Vec::new() };
    let Ok(list) = serde_json::from_str::<Vec<&'a RawValue>>(raw.get()) else { return Vec::new() };
    list.into_iter().map(|c| (c, serde_json::from_str(c.get()).ok())).collect()
}

/// The `choices` written again, each choice's `delta` relabelled as answer (when
/// `relabel`) and its `logprobs` nulled (when `strip_logprobs`), every other choice and
/// member copied as sent; `None` when nothing in them changes.
fn rewrite_choices(
    choices: &[(&RawValue, Option<Members<'_>>)],
    relabel: bool,
    strip_logprobs: bool,
) -> Option<String> {
    let mut changed = false;
    let mut out = Vec::with_capacity(choices.iter().map(|(raw, _)| raw.get().len() + 1).sum::<usize>() + 16);
    out.push(b'[');
    for (i, (raw, choice)) in choices.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let rewritten = choice.as_ref().and_then(|choice| {
            let delta = choice.get("delta").filter(|_| relabel).and_then(relabel_as_answer);
            let mut edits: Vec<(&str, Edit<'_>)> = Vec::new();
            if let Some(d) = &delta {
                edits.push(("delta", Edit::Set(d.as_str().into())));
            }
            if strip_logprobs && present(choice.get("logprobs")).is_some() {
                edits.push(("logprobs", Edit::Set("null".into())));
            }
            (!edits.is_empty()).then(|| choice.rewrite(&edits, raw.get().len()))
        });
        match rewritten {
            Some(bytes) => {
                changed = true;
                out.extend_from_slice(&bytes);
            }
            None => out.extend_from_slice(raw.get().as_bytes()),
        }
    }
    out.push(b']');
    if !changed {
        return None;
    }
    // Valid UTF-8: JSON text joined with ASCII punctuation.
    String::from_utf8(out).ok()
}

/// The chunk that only announces the assistant role (the first of a chat stream).
fn is_role_chunk(choices: &[(&RawValue, Option<Members<'_>>)]) -> bool {
    let [(_, Some(choice))] = choices else { return false };
    let Some(delta) = choice.get("delta").and_then(|d| serde_json::from_str::<Members<'_>>(d.get()).ok())
    else {
        return false;
    };
    let empty = |k: &str| delta.get(k).is_none_or(|v| matches!(v.get(), "null" | "\"\""));
    delta.contains("role") && empty("content") && empty("reasoning") && empty("reasoning_content")
}

/// A `delta` with the text the server labelled as reasoning moved into `content`, the
/// labels gone; `None` when it has no label. A lone reasoning string moves as the JSON
/// text it was sent in; with an answer already there (rare), the two are joined,
/// reasoning first.
fn relabel_as_answer(delta: &RawValue) -> Option<String> {
    const LABELS: [&str; 2] = ["reasoning", "reasoning_content"];
    let members: Members<'_> = serde_json::from_str(delta.get()).ok()?;
    if !LABELS.iter().any(|k| members.contains(k)) {
        return None;
    }
    let text = |k: &str| {
        present(members.get(k))
            .and_then(|v| serde_json::from_str::<Cow<'_, str>>(v.get()).ok().map(|s| (v, s)))
    };
    let labelled: Vec<_> = LABELS.into_iter().filter_map(text).filter(|(_, s)| !s.is_empty()).collect();
    let mut edits = vec![("reasoning", Edit::Remove), ("reasoning_content", Edit::Remove)];
    let content = match (labelled.as_slice(), text("content")) {
        ([], _) => None,
        ([(raw, _)], None) => Some(Cow::Borrowed(raw.get())),
        (labelled, existing) => {
            let mut joined: String = labelled.iter().map(|(_, s)| s.as_ref()).collect();
            joined.push_str(existing.as_ref().map_or("", |(_, s)| s.as_ref()));
            Some(Cow::Owned(serde_json::to_string(&joined).ok()?))
        }
    };
    if let Some(c) = content {
        edits.push(("content", Edit::Set(c)));
    }
    String::from_utf8(members.rewrite(&edits, delta.get().len())).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn asked(usage: bool, continuous: bool) -> ClientAsked {
        ClientAsked { usage, continuous_usage: continuous, logprobs: false }
    }

    /// Feeds `chunk` to a leg; returns what the splicer did, with the chunk the client
    /// gets (the same one unless changed).
    fn feed(leg: impl FnOnce(&[u8]) -> Emit, chunk: &Value) -> (&'static str, Value) {
        let bytes = serde_json::to_vec(chunk).unwrap();
        match leg(&bytes) {
            Emit::Same => ("same", chunk.clone()),
            Emit::Changed(b) => ("changed", serde_json::from_slice(&b).expect("a rewritten chunk is JSON")),
            Emit::Drop => ("drop", Value::Null),
        }
    }

    #[test]
    fn first_leg_usage_is_read_then_hidden_unless_asked_for() {
        let mut s = Splicer::new(asked(false, false), false);
        let c = json!({"id": "chatcmpl-1", "created": 5, "choices": [{"index": 0, "delta": {"reasoning": "a"}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}});
        let (what, out) = feed(|b| s.first_leg(b), &c);
        assert_eq!(what, "changed");
        assert_eq!(
            out,
            json!({"id": "chatcmpl-1", "created": 5, "choices": [{"index": 0, "delta": {"reasoning": "a"}}]})
        );
        let plain = json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"reasoning": "b"}}]});
        assert_eq!(feed(|b| s.first_leg(b), &plain).0, "same");
        let last = json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2}});
        assert_eq!(feed(|b| s.first_leg(b), &last).0, "drop", "the client asked for no usage chunk");
        assert_eq!(s.cut(99, 0), 2, "the server's count beats the tracker's");
    }

    #[test]
    fn continuation_reads_as_the_same_answer() {
        let mut s = Splicer::new(asked(true, false), false);
        let first = json!({"id": "chatcmpl-1", "created": 5, "choices": [{"index": 0, "delta": {"reasoning": "a"}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7}});
        feed(|b| s.first_leg(b), &first);
        assert_eq!(s.cut(7, 0), 7);
        let role = json!({"id": "chatcmpl-2", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]});
        assert_eq!(feed(|b| s.second_leg(b), &role).0, "drop");
        let tok = json!({"id": "chatcmpl-2", "created": 9, "choices": [{"index": 0, "delta": {"reasoning": "The \"x\""}}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 1}});
        let (what, out) = feed(|b| s.second_leg(b), &tok);
        assert_eq!(what, "changed");
        assert_eq!(
            out,
            json!({"id": "chatcmpl-1", "created": 5, "choices": [{"index": 0, "delta": {"content": "The \"x\""}}]})
        );
        let usage = json!({"id": "chatcmpl-2", "choices": [],
            "usage": {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34,
                      "completion_tokens_details": {"reasoning_tokens": 4}}});
        let (what, out) = feed(|b| s.second_leg(b), &usage);
        assert_eq!(what, "changed");
        assert_eq!(
            out["usage"],
            json!({"prompt_tokens": 12, "completion_tokens": 11, "total_tokens": 23,
                   "completion_tokens_details": {"reasoning_tokens": 7}})
        );
    }

    #[test]
    fn without_first_leg_usage_the_tracker_counts() {
        let mut s = Splicer::new(asked(true, false), true);
        let first = json!({"id": "x", "choices": [{"index": 0, "delta": {"reasoning": "a"},
            "logprobs": {"content": []}}]});
        let (what, out) = feed(|b| s.first_leg(b), &first);
        assert_eq!(what, "changed", "logprobs the proxy added are hidden");
        assert_eq!(out["choices"][0]["logprobs"], Value::Null);
        assert_eq!(out["choices"][0]["delta"], json!({"reasoning": "a"}), "the first leg keeps its labels");
        assert_eq!(s.cut(5, 0), 5);
        let usage = json!({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 3}});
        let (_, out) = feed(|b| s.second_leg(b), &usage);
        assert_eq!(out["usage"]["prompt_tokens"], 35);
        assert_eq!(out["usage"]["completion_tokens"], 8);
    }

    #[test]
    fn answer_text_keeps_its_order_and_labels_go() {
        let relabel = |d: Value| -> Value {
            let raw = RawValue::from_string(d.to_string()).unwrap();
            relabel_as_answer(&raw).map_or(Value::Null, |s| serde_json::from_str(&s).unwrap())
        };
        assert_eq!(relabel(json!({"reasoning_content": "a", "content": "b"})), json!({"content": "ab"}));
        assert_eq!(relabel(json!({"reasoning": "a", "content": null})), json!({"content": "a"}));
        assert_eq!(
            relabel(json!({"reasoning": "", "content": "b"})),
            json!({"content": "b"}),
            "an empty label goes too"
        );
        assert_eq!(relabel(json!({"content": "b"})), Value::Null, "nothing to relabel");
    }

    #[test]
    fn members_the_splicer_does_not_touch_pass_byte_for_byte() {
        let mut s = Splicer::new(asked(false, false), false);
        let first = br#"{"id":"chatcmpl-1","created":5,"choices":[{"index":0,"delta":{"reasoning":"a"}}]}"#;
        assert_eq!(s.first_leg(first), Emit::Same);
        s.cut(1, 0);
        let second = br#"{"id":"chatcmpl-2","object":"chat.completion.chunk","created":9,"model":"m \u00e9","choices":[{"index":0,"delta":{"reasoning":"x\ny"},"logprobs":null,"finish_reason":null,"token_ids":[1, 2]}]}"#;
        let Emit::Changed(out) = s.second_leg(second) else { panic!("not rewritten") };
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m \u00e9","choices":[{"index":0,"delta":{"content":"x\ny"},"logprobs":null,"finish_reason":null,"token_ids":[1, 2]}]}"#
        );
    }
}
