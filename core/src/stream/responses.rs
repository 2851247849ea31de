//! OpenAI's Responses API (`POST /v1/responses`, how gpt-oss is naturally served): what
//! the phase tracker needs from its stream events and from a whole response.
//!
//! A stream is a sequence of typed events; the tracker reads the two that carry tokens
//! (`response.reasoning_text.delta`, `response.output_text.delta`), the terminal ones
//! (`response.completed`, `.incomplete`, `.failed`), whose `response.usage` holds the
//! token counts, and `error` (vLLM's failure mid-stream, the end too), and skips the
//! rest. The API has no `n`: everything is choice 0.

use serde::Deserialize;
use serde_json::value::RawValue;
use smallvec::SmallVec;

use super::chunk::Text;
use super::{ChoiceDelta, Read, Usage};

#[derive(Deserialize)]
struct View<'a> {
    /// The event's type; absent in a whole (unstreamed) response.
    #[serde(borrow, default, rename = "type")]
    kind: Option<Text<'a>>,
    /// A text delta; raw, since other events' deltas need not be strings.
    #[serde(borrow, default)]
    delta: Option<&'a RawValue>,
    /// The response an event carries (its `usage` only; the rest is skipped).
    #[serde(default)]
    response: Option<Wrapped>,
    /// A whole response's items.
    #[serde(borrow, default)]
    output: Option<SmallVec<[Item<'a>; 2]>>,
    #[serde(default)]
    usage: Option<UsageView>,
    /// The event's place in the stream (every streamed event has one).
    #[serde(default)]
    sequence_number: Option<u64>,
}

#[derive(Deserialize)]
struct Wrapped {
    #[serde(default)]
    usage: Option<UsageView>,
}

#[derive(Deserialize)]
struct Item<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
    #[serde(borrow, default)]
    content: Option<SmallVec<[Part<'a>; 1]>>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct UsageView {
    #[serde(default)]
    input_tokens: Option<u32>,
    #[serde(default)]
    output_tokens: Option<u32>,
    #[serde(default)]
    output_tokens_details: Option<Details>,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Option<u32>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    reasoning_tokens: Option<u32>,
}

impl UsageView {
    fn usage(self) -> Option<Usage> {
        Some(Usage {
            completion_tokens: self.output_tokens?,
            reasoning_tokens: self.output_tokens_details.and_then(|d| d.reasoning_tokens),
            prompt_tokens: self.input_tokens,
            cached_tokens: self.input_tokens_details.and_then(|d| d.cached_tokens),
        })
    }
}

/// Parses one stream event's `data:` payload, or a whole response. `None`: not a JSON
/// object of the expected shape (relayed all the same; it tells the tracker nothing).
pub fn parse<'p>(payload: &'p [u8], mut on_choice: impl FnMut(ChoiceDelta<'p>)) -> Option<Read> {
    let view: View<'p> = serde_json::from_slice(payload).ok()?;
    let sequence = view.sequence_number;
    let Some(kind) = view.kind else {
        // Neither an event nor a response (`[]` reads as an empty struct, too).
        let output = view.output?;
        return Some(Read { usage: whole(output, view.usage, on_choice), sequence });
    };
    let text = || view.delta.and_then(|d| serde_json::from_str::<Text<'_>>(d.get()).ok()).map(|t| t.0);
    let mut usage = None;
    match kind.0.as_ref() {
        "response.reasoning_text.delta" => {
            on_choice(ChoiceDelta { reasoning: Some(text()?), ..ChoiceDelta::default() });
        }
        "response.output_text.delta" => {
            on_choice(ChoiceDelta { content: Some(text()?), ..ChoiceDelta::default() });
        }
        "response.completed" | "response.incomplete" => {
            on_choice(ChoiceDelta { finished: true, ..ChoiceDelta::default() });
            usage = view.response.and_then(|r| r.usage).and_then(UsageView::usage);
        }
        "response.failed" | "error" => {
            on_choice(ChoiceDelta { finished: true, upstream_error: true, ..ChoiceDelta::default() });
            usage = view.response.and_then(|r| r.usage).and_then(UsageView::usage);
        }
        _ => {}
    }
    Some(Read { usage, sequence })
}

/// A whole response: its reasoning items' text, then its messages' output text.
fn whole<'p>(
    output: SmallVec<[Item<'p>; 2]>,
    usage: Option<UsageView>,
    mut on_choice: impl FnMut(ChoiceDelta<'p>),
) -> Option<Usage> {
    let mut reasoning = String::new();
    let mut content = String::new();
    for item in output {
        let into = match item.kind.0.as_ref() {
            "reasoning" => &mut reasoning,
            "message" => &mut content,
            _ => continue,
        };
        for part in item.content.unwrap_or_default() {
            if matches!(part.kind.0.as_ref(), "reasoning_text" | "output_text") {
                into.push_str(part.text.as_ref().map_or("", |t| t.0.as_ref()));
            }
        }
    }
    on_choice(ChoiceDelta::whole(reasoning, content));
    usage.and_then(UsageView::usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::stream::Dialect;
    use crate::stream::dialect::testing::Seen;

    fn read(payload: &str) -> (Seen, Option<Option<Usage>>) {
        let (seen, read) = crate::stream::dialect::testing::read(Dialect::Responses, payload);
        (seen, read.map(|r| r.usage))
    }

    #[test]
    fn each_event_tells_its_sequence_number() {
        let sequence = |payload: &str| {
            crate::stream::dialect::testing::read(Dialect::Responses, payload).1.and_then(|r| r.sequence)
        };
        assert_eq!(sequence(r#"{"type":"response.created","sequence_number":0,"response":{}}"#), Some(0));
        assert_eq!(
            sequence(r#"{"type":"response.output_text.delta","delta":"a","sequence_number":41}"#),
            Some(41)
        );
        assert_eq!(sequence(r#"{"type":"response.in_progress"}"#), None);
    }

    #[test]
    fn reasoning_and_output_deltas_are_told_apart() {
        let (c, u) = read(
            r#"{"content_index":0,"delta":" way","item_id":"rs_1","output_index":0,"sequence_number":4,"type":"response.reasoning_text.delta"}"#,
        );
        assert_eq!((c, u), (vec![(Some(" way".into()), None, false)], Some(None)));
        let (c, _) = read(
            r#"{"content_index":0,"delta":"four\n","logprobs":[],"output_index":1,"type":"response.output_text.delta"}"#,
        );
        assert_eq!(c, vec![(None, Some("four\n".into()), false)]);
        // Other events, and other events' deltas, are not tokens.
        let (c, u) = read(r#"{"type":"response.function_call_arguments.delta","delta":"{\"a\""}"#);
        assert_eq!((c.len(), u), (0, Some(None)));
        let (c, _) =
            read(r#"{"type":"response.output_item.added","output_index":1,"item":{"type":"message"}}"#);
        assert!(c.is_empty());
    }

    #[test]
    fn the_terminal_event_finishes_and_carries_usage() {
        let (c, u) = read(
            r#"{"type":"response.completed","response":{"id":"r","output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}],"usage":{"input_tokens":25,"output_tokens":24,"output_tokens_details":{"reasoning_tokens":15}}}}"#,
        );
        assert_eq!(
            c,
            vec![(None, None, true)],
            "the whole output in the terminal event is not counted again"
        );
        assert_eq!(
            u,
            Some(Some(Usage {
                completion_tokens: 24,
                reasoning_tokens: Some(15),
                prompt_tokens: Some(25),
                cached_tokens: None
            }))
        );
        let (c, _) = read(r#"{"type":"response.incomplete","response":{"usage":null}}"#);
        assert_eq!(c, vec![(None, None, true)]);
        let mut errored = false;
        parse(br#"{"type":"error","code":"x","message":"boom","sequence_number":9}"#, |c| {
            errored = c.upstream_error
        });
        assert!(errored, "vLLM's error event ends the stream as a failure");
    }

    #[test]
    fn a_whole_response_reads_its_items() {
        let (c, u) = read(
            r#"{"object":"response","output":[{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"hm"}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"4","annotations":[]}]}],"usage":{"input_tokens":3,"output_tokens":9}}"#,
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
        assert_eq!(read("[]").1, None);
        assert_eq!(read(r#"{"type":7}"#).1, None);
    }
}
