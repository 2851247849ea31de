//! Reads just what the phase tracker needs from an OpenAI chat or completions chunk
//! (deltas, token ids, usage), borrowing from the payload; everything else in the JSON is
//! skipped, not copied, and the relayed bytes are never re-serialised.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use smallvec::SmallVec;

/// A JSON string, borrowed from the payload unless it contains escapes. (serde borrows a
/// bare `Cow<str>` field, but not one inside an `Option`: hence the wrapper.)
#[derive(Deserialize)]
#[serde(transparent)]
pub(super) struct Text<'a>(#[serde(borrow)] pub(super) Cow<'a, str>);

#[derive(Deserialize)]
struct ChunkView<'a> {
    // Inline storage: the usual one or two choices cost no allocation.
    #[serde(borrow, default)]
    choices: SmallVec<[ChoiceView<'a>; 2]>,
    #[serde(default)]
    usage: Option<UsageView>,
    /// An error event (`{"error": {...}}`, as vLLM and the proxy end a failed stream):
    /// only whether it is there.
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct ChoiceView<'a> {
    #[serde(default)]
    index: usize,
    /// Streaming chat chunks.
    #[serde(borrow, default)]
    delta: Option<MessageView<'a>>,
    /// Non-streaming chat responses.
    #[serde(borrow, default)]
    message: Option<MessageView<'a>>,
    /// Completions.
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
    #[serde(default)]
    token_ids: Option<TokenIds>,
    /// Kept as its JSON text, unread: only an entropy exit over streamed logprobs reads it.
    #[serde(borrow, default)]
    logprobs: Option<&'a RawValue>,
    /// Only whether it is set (`null` while the choice goes on); the value is skipped.
    #[serde(default)]
    finish_reason: Option<serde::de::IgnoredAny>,
}

/// Token ids of one chunk: usually one, a few with stream batching; inline up to 8.
pub type TokenIds = SmallVec<[u32; 8]>;

#[derive(Deserialize, Default)]
struct MessageView<'a> {
    #[serde(borrow, default)]
    content: Option<Text<'a>>,
    #[serde(borrow, default)]
    reasoning: Option<Text<'a>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct UsageView {
    #[serde(default)]
    prompt_tokens: Option<u32>,
    #[serde(default)]
    completion_tokens: Option<u32>,
    #[serde(default)]
    completion_tokens_details: Option<DetailsView>,
    /// vLLM sends it with `--enable-prompt-tokens-details`.
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetailsView>,
}

#[derive(Deserialize)]
struct PromptDetailsView {
    #[serde(default)]
    cached_tokens: Option<u32>,
}

#[derive(Deserialize)]
struct DetailsView {
    #[serde(default)]
    reasoning_tokens: Option<u32>,
}

/// One choice's part of a chunk.
#[derive(Debug, Default, PartialEq)]
pub struct ChoiceDelta<'a> {
    pub index: usize,
    pub reasoning: Option<Cow<'a, str>>,
    pub content: Option<Cow<'a, str>>,
    pub token_ids: Option<TokenIds>,
    /// The choice's `logprobs`, as the JSON text the server sent (chat and completions).
    pub logprobs: Option<&'a str>,
    /// The chunk carries the choice's `finish_reason`: the choice is complete.
    pub finished: bool,
    /// The upstream ended the response with an error event of its own (Responses,
    /// Messages): complete, but failed.
    pub upstream_error: bool,
}

impl ChoiceDelta<'_> {
    /// A whole, unstreamed answer as one finished part: its reasoning and its answer
    /// text (each absent when empty).
    pub fn whole(reasoning: String, content: String) -> Self {
        ChoiceDelta {
            reasoning: Some(Cow::<str>::Owned(reasoning)).filter(|r| !r.is_empty()),
            content: Some(Cow::<str>::Owned(content)).filter(|c| !c.is_empty()),
            finished: true,
            ..ChoiceDelta::default()
        }
    }
}

/// Token counts the server reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub completion_tokens: u32,
    pub reasoning_tokens: Option<u32>,
    /// The prompt as the server tokenized it (a load tester's own count is a guess).
    pub prompt_tokens: Option<u32>,
    /// Of those, the tokens the server's prefix cache held when it took the request up
    /// (vLLM reports them only when started with `--enable-prompt-tokens-details`).
    pub cached_tokens: Option<u32>,
}

/// Parses one `data:` payload (or a whole non-streaming body). Returns `None` for
/// anything that is not a JSON object of the expected shape; such payloads are still
/// relayed, they just tell the tracker nothing.
pub fn parse_payload<'p>(
    payload: &'p [u8],
    mut on_choice: impl FnMut(ChoiceDelta<'p>),
) -> Option<Option<Usage>> {
    let chunk: ChunkView<'p> = serde_json::from_slice(payload).ok()?;
    if chunk.error.is_some() {
        // The stream ends here, failed: complete, but not an answer.
        on_choice(ChoiceDelta { finished: true, upstream_error: true, ..ChoiceDelta::default() });
    }
    for c in chunk.choices {
        let m = c.delta.or(c.message).unwrap_or_default();
        on_choice(ChoiceDelta {
            index: c.index,
            reasoning: m.reasoning.or(m.reasoning_content).map(|t| t.0),
            content: m.content.or(c.text).map(|t| t.0),
            token_ids: c.token_ids,
            logprobs: c.logprobs.map(RawValue::get),
            finished: c.finish_reason.is_some(),
            upstream_error: false,
        });
    }
    Some(chunk.usage.and_then(|u| {
        Some(Usage {
            completion_tokens: u.completion_tokens?,
            reasoning_tokens: u.completion_tokens_details.and_then(|d| d.reasoning_tokens),
            prompt_tokens: u.prompt_tokens,
            cached_tokens: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
        })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(payload: &str) -> (Vec<ChoiceDelta<'static>>, Option<Option<Usage>>) {
        let mut out = Vec::new();
        let usage = parse_payload(payload.as_bytes(), |c| {
            out.push(ChoiceDelta {
                index: c.index,
                reasoning: c.reasoning.map(|s| Cow::Owned(s.into_owned())),
                content: c.content.map(|s| Cow::Owned(s.into_owned())),
                token_ids: c.token_ids,
                logprobs: None,
                finished: c.finished,
                upstream_error: c.upstream_error,
            })
        });
        (out, usage)
    }

    #[test]
    fn reads_every_dialect() {
        let (c, _) = first(r#"{"choices":[{"index":0,"delta":{"reasoning":"a\nb"}}]}"#);
        assert_eq!(c[0].reasoning.as_deref(), Some("a\nb"));
        let (c, _) = first(r#"{"choices":[{"index":1,"delta":{"reasoning_content":"x","content":null}}]}"#);
        assert_eq!((c[0].index, c[0].reasoning.as_deref(), c[0].content.as_deref()), (1, Some("x"), None));
        let (c, _) = first(r#"{"choices":[{"text":"<think>","token_ids":[5,6]}],"extra":{"k":[1]}}"#);
        assert_eq!(
            (c[0].content.as_deref(), c[0].token_ids.as_deref()),
            (Some("<think>"), Some(&[5u32, 6][..]))
        );
        let (c, _) = first(r#"{"choices":[{"message":{"role":"assistant","reasoning":"r","content":"c"}}]}"#);
        assert_eq!((c[0].reasoning.as_deref(), c[0].content.as_deref()), (Some("r"), Some("c")));
    }

    #[test]
    fn unescaped_strings_are_borrowed() {
        let payload = br#"{"choices":[{"delta":{"reasoning":"plain","content":"esc\naped"}}]}"#;
        parse_payload(payload, |c| {
            assert!(matches!(c.reasoning, Some(Cow::Borrowed("plain"))));
            assert!(matches!(c.content, Some(Cow::Owned(_))));
        });
    }

    #[test]
    fn reads_usage_and_tolerates_garbage() {
        let (_, u) = first(
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":10,"completion_tokens_details":{"reasoning_tokens":7}}}"#,
        );
        assert_eq!(
            u,
            Some(Some(Usage {
                completion_tokens: 10,
                reasoning_tokens: Some(7),
                prompt_tokens: Some(3),
                cached_tokens: None
            }))
        );
        assert_eq!(first("not json").1, None);
        assert_eq!(first("[1,2]").1, None);
        assert_eq!(first(r#"{"choices":[{"delta":{"content":5}}]}"#).1, None);
    }

    #[test]
    fn reads_the_prompt_tokens_the_prefix_cache_held() {
        // vLLM 0.32 with --enable-prompt-tokens-details, on the final usage chunk.
        let (_, u) = first(
            r#"{"choices":[],"usage":{"prompt_tokens":300,"total_tokens":310,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":256}}}"#,
        );
        assert_eq!(u.flatten().and_then(|u| u.cached_tokens), Some(256));
        let (_, u) = first(
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":null}}"#,
        );
        assert_eq!(u.flatten().map(|u| u.cached_tokens), Some(None), "details off: unknown, not zero");
    }

    #[test]
    fn an_error_event_ends_the_stream_as_a_failure() {
        // vLLM 0.32's `create_streaming_error_response`, which the proxy's own matches.
        let payload = br#"{"error":{"message":"boom","type":"BadRequestError","param":null,"code":400}}"#;
        let mut seen = Vec::new();
        parse_payload(payload, |c| seen.push((c.index, c.finished, c.upstream_error)));
        assert_eq!(seen, vec![(0, true, true)]);
        let mut seen = 0;
        parse_payload(br#"{"choices":[],"error":null}"#, |_| seen += 1);
        assert_eq!(seen, 0, "a null error is none");
    }

    #[test]
    fn logprobs_are_lent_as_sent_and_null_is_none() {
        let payload = br#"{"choices":[{"delta":{"reasoning":"a"},"logprobs":{"content":[{"token":"a","logprob":-0.5}]}},{"index":1,"logprobs":null}]}"#;
        let mut seen = Vec::new();
        parse_payload(payload, |c| seen.push(c.logprobs.map(str::to_owned)));
        assert_eq!(seen, vec![Some(r#"{"content":[{"token":"a","logprob":-0.5}]}"#.to_owned()), None]);
    }

    #[test]
    fn a_finish_reason_marks_its_choice_finished() {
        let (c, _) = first(
            r#"{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null},{"index":1,"text":"b","finish_reason":"length"}]}"#,
        );
        assert_eq!(c.iter().map(|c| c.finished).collect::<Vec<_>>(), vec![false, true]);
        let (c, _) = first(r#"{"choices":[{"index":0,"delta":{}}]}"#);
        assert!(!c[0].finished, "absent is not finished");
    }
}
