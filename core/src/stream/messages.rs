//! Anthropic's Messages API as vLLM serves it (`POST /v1/messages`): what the phase
//! tracker needs from its stream events and from a whole message.
//!
//! Thinking arrives as a `thinking` content block (`thinking_delta`s), the answer as
//! `text` blocks (`text_delta`s). `message_delta` carries the token counts (vLLM puts the
//! prompt's there too; `message_start`'s are zeros so early, and a stream cut before
//! `message_delta` is counted by the tracker instead), and `message_stop` ends the
//! stream. An `error` event ends it too, as a failure. The API has no `n`: everything
//! is choice 0.

use serde::Deserialize;
use smallvec::SmallVec;

use super::chunk::Text;
use super::{ChoiceDelta, Usage};

#[derive(Deserialize)]
struct View<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
    /// `content_block_delta`'s delta (`message_delta`'s has no type and is skipped).
    #[serde(borrow, default)]
    delta: Option<DeltaView<'a>>,
    /// `message_delta`'s usage, or a whole message's.
    #[serde(default)]
    usage: Option<UsageView>,
    /// A whole message's content blocks.
    #[serde(borrow, default)]
    content: Option<SmallVec<[Block<'a>; 2]>>,
}

#[derive(Deserialize)]
struct DeltaView<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Text<'a>>,
    #[serde(borrow, default)]
    thinking: Option<Text<'a>>,
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
    #[serde(borrow, default)]
    thinking: Option<Text<'a>>,
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct UsageView {
    #[serde(default)]
    input_tokens: Option<u32>,
    #[serde(default)]
    output_tokens: Option<u32>,
    /// Anthropic's name for prompt tokens read from its cache.
    #[serde(default)]
    cache_read_input_tokens: Option<u32>,
}

impl UsageView {
    fn usage(self) -> Option<Usage> {
        Some(Usage {
            completion_tokens: self.output_tokens?,
            reasoning_tokens: None,
            prompt_tokens: self.input_tokens,
            cached_tokens: self.cache_read_input_tokens,
        })
    }
}

/// Parses one stream event's `data:` payload, or a whole message. `None`: not a JSON
/// object of the expected shape (relayed all the same; it tells the tracker nothing).
pub fn parse<'p>(payload: &'p [u8], mut on_choice: impl FnMut(ChoiceDelta<'p>)) -> Option<Option<Usage>> {
    let view: View<'p> = serde_json::from_slice(payload).ok()?;
    match view.kind.0.as_ref() {
        "content_block_delta" => {
            let Some(delta) = view.delta else { return Some(None) };
            match delta.kind.as_ref().map(|k| k.0.as_ref()) {
                Some("thinking_delta") => on_choice(ChoiceDelta {
                    reasoning: delta.thinking.map(|t| t.0),
                    ..ChoiceDelta::default()
                }),
                Some("text_delta") => {
                    on_choice(ChoiceDelta { content: delta.text.map(|t| t.0), ..ChoiceDelta::default() });
                }
                _ => {}
            }
            Some(None)
        }
        "message_delta" => Some(view.usage.and_then(UsageView::usage)),
        "message_stop" => {
            on_choice(ChoiceDelta { finished: true, ..ChoiceDelta::default() });
            Some(None)
        }
        "error" => {
            on_choice(ChoiceDelta { finished: true, upstream_error: true, ..ChoiceDelta::default() });
            Some(None)
        }
        "message" => Some(whole(view.content, view.usage, on_choice)),
        _ => Some(None),
    }
}

/// A whole message: its thinking blocks' text, then its text blocks'.
fn whole<'p>(
    content: Option<SmallVec<[Block<'p>; 2]>>,
    usage: Option<UsageView>,
    mut on_choice: impl FnMut(ChoiceDelta<'p>),
) -> Option<Usage> {
    let mut reasoning = String::new();
    let mut text = String::new();
    for block in content.unwrap_or_default() {
        match block.kind.0.as_ref() {
            "thinking" => reasoning.push_str(block.thinking.as_ref().map_or("", |t| t.0.as_ref())),
            "text" => text.push_str(block.text.as_ref().map_or("", |t| t.0.as_ref())),
            _ => {}
        }
    }
    on_choice(ChoiceDelta::whole(reasoning, text));
    usage.and_then(UsageView::usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::stream::Dialect;
    use crate::stream::dialect::testing::Seen;

    fn read(payload: &str) -> (Seen, Option<Option<Usage>>) {
        let (seen, read) = crate::stream::dialect::testing::read(Dialect::Messages, payload);
        (seen, read.map(|r| r.usage))
    }

    #[test]
    fn thinking_and_text_deltas_are_told_apart() {
        let (c, _) = read(
            r#"{"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"P"},"index":0}"#,
        );
        assert_eq!(c, vec![(Some("P".into()), None, false)]);
        let (c, _) =
            read(r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"4"},"index":1}"#);
        assert_eq!(c, vec![(None, Some("4".into()), false)]);
        // A thinking block's signature is not a token.
        let (c, u) = read(
            r#"{"type":"content_block_delta","delta":{"type":"signature_delta","signature":"12ad"},"index":0}"#,
        );
        assert_eq!((c.len(), u), (0, Some(None)));
    }

    #[test]
    fn usage_comes_with_message_delta_and_message_stop_finishes() {
        let (_, u) = read(
            r#"{"type":"message_start","message":{"id":"m","type":"message","content":[],"usage":{"input_tokens":25,"output_tokens":0}}}"#,
        );
        assert_eq!(u, Some(None), "zeros so early would pass for the final count of a stream cut short");
        let (c, u) = read(
            r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":25,"output_tokens":40}}"#,
        );
        assert!(c.is_empty(), "the stop reason is not the end of the stream");
        assert_eq!(
            u,
            Some(Some(Usage {
                completion_tokens: 40,
                reasoning_tokens: None,
                prompt_tokens: Some(25),
                cached_tokens: None
            }))
        );
        assert_eq!(read(r#"{"type":"message_stop"}"#).0, vec![(None, None, true)]);
        let (c, _) = read(r#"{"type":"error","error":{"type":"api_error","message":"boom"}}"#);
        assert_eq!(c, vec![(None, None, true)], "the upstream's error ends the stream");
    }

    #[test]
    fn a_whole_message_reads_its_blocks() {
        let (c, u) = read(
            r#"{"id":"m","type":"message","role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"4"}],"usage":{"input_tokens":3,"output_tokens":9}}"#,
        );
        assert_eq!(c, vec![(Some("hm".into()), Some("4".into()), true)]);
        assert_eq!(
            u,
            Some(Some(Usage {
                completion_tokens: 9,
                reasoning_tokens: None,
                prompt_tokens: Some(3),
                cached_tokens: None
            }))
        );
        assert_eq!(read(r#"{"no":"type"}"#).1, None);
    }
}
