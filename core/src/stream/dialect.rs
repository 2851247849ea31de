//! Which streaming API a response speaks, and so which parser reads its payloads.

use super::{ChoiceDelta, Usage, chunk, messages, responses};

/// What one payload told the tracker besides its choices' parts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Read {
    /// The token counts it reported.
    pub usage: Option<Usage>,
    /// Its place in the stream, where the API numbers its events (the Responses API's
    /// `sequence_number`), so that an event the proxy adds can take the next number.
    pub sequence: Option<u64>,
}

/// The event formats of the generation APIs vLLM serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    /// OpenAI's chat completions and completions: `choices[]` chunks, ended by `[DONE]`.
    #[default]
    Chat,
    /// OpenAI's Responses API: typed events, ended by `response.completed`.
    Responses,
    /// Anthropic's Messages API: content-block events, ended by `message_stop`.
    Messages,
}

impl Dialect {
    /// Reads one `data:` payload (or a whole unstreamed body) of this dialect: calls
    /// `on_choice` for each choice's part of it and returns the rest of what it reports
    /// (token counts, its sequence number). `None`: not a payload of the expected shape,
    /// which tells the tracker nothing (and is relayed all the same).
    pub fn parse<'p>(self, payload: &'p [u8], on_choice: impl FnMut(ChoiceDelta<'p>)) -> Option<Read> {
        let usage_only = |usage| Read { usage, sequence: None };
        match self {
            Dialect::Chat => chunk::parse_payload(payload, on_choice).map(usage_only),
            Dialect::Responses => responses::parse(payload, on_choice),
            Dialect::Messages => messages::parse(payload, on_choice).map(usage_only),
        }
    }
}

#[cfg(test)]
pub(super) mod testing {
    use super::{Dialect, Read};

    /// What a parser told the tracker: each choice part as (reasoning, content, finished).
    pub type Seen = Vec<(Option<String>, Option<String>, bool)>;

    pub fn read(dialect: Dialect, payload: &str) -> (Seen, Option<Read>) {
        let mut seen = Vec::new();
        let usage = dialect.parse(payload.as_bytes(), |c| {
            seen.push((c.reasoning.map(|s| s.into_owned()), c.content.map(|s| s.into_owned()), c.finished))
        });
        (seen, usage)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::read;
    use super::*;

    /// Every event of a recording from vLLM 0.32, as its API's parser reads it: thinking
    /// parts, answer parts, whether the last event finished the stream, the last usage.
    fn replay(dialect: Dialect, recording: &str) -> (usize, usize, bool, Option<Usage>) {
        let (mut think, mut answer, mut finished, mut usage) = (0, 0, false, None);
        for (i, payload) in recording.lines().filter_map(|l| l.strip_prefix("data: ")).enumerate() {
            let (seen, u) = read(dialect, payload);
            assert!(u.is_some(), "{dialect:?} refused a payload vLLM sent: {payload}");
            // vLLM numbers a Responses stream's events from 0, one by one: the proxy's
            // own error event takes the number after the last it relayed.
            let sequence = u.and_then(|r| r.sequence);
            let expected = (dialect == Dialect::Responses).then_some(i as u64);
            assert_eq!(sequence, expected, "{dialect:?} event {i}: {payload}");
            for (r, c, f) in seen {
                think += usize::from(r.is_some());
                answer += usize::from(c.is_some());
                finished = f;
            }
            usage = u.and_then(|r| r.usage).or(usage);
        }
        (think, answer, finished, usage)
    }

    #[test]
    fn the_recorded_vllm_streams_read_as_thinking_then_answer() {
        let responses = include_str!("../../../mock-upstream/fixtures/responses-reasoning.sse");
        let (think, answer, finished, usage) = replay(Dialect::Responses, responses);
        let count = |kind: &str| responses.matches(&format!("\"type\":\"{kind}\"}}")).count();
        assert_eq!(
            (think, answer),
            (count("response.reasoning_text.delta"), count("response.output_text.delta"))
        );
        assert!(think > 0 && answer > 0 && finished);
        assert!(usage.is_some_and(|u| u.reasoning_tokens.is_some() && u.prompt_tokens.is_some()));

        let messages = include_str!("../../../mock-upstream/fixtures/messages-thinking.sse");
        let (think, answer, finished, usage) = replay(Dialect::Messages, messages);
        assert_eq!(
            (think, answer),
            (messages.matches("thinking_delta").count(), messages.matches("text_delta").count())
        );
        assert!(think > 0 && answer > 0 && finished);
        assert!(usage.is_some_and(|u| u.completion_tokens > 0 && u.prompt_tokens.is_some()));
        // Another API's stream tells a parser nothing.
        assert_eq!(replay(Dialect::Chat, messages).0 + replay(Dialect::Chat, messages).1, 0);
    }

    #[test]
    fn whole_recorded_answers_read_as_both_phases() {
        for (dialect, whole) in [
            (Dialect::Responses, include_str!("../../../mock-upstream/fixtures/responses-reasoning.json")),
            (Dialect::Messages, include_str!("../../../mock-upstream/fixtures/messages-thinking.json")),
        ] {
            let (seen, usage) = read(dialect, whole);
            assert_eq!(seen.len(), 1, "{dialect:?}");
            let (r, c, finished) = &seen[0];
            assert!(r.as_ref().is_some_and(|r| !r.is_empty()) && c.is_some() && *finished, "{dialect:?}");
            assert!(usage.and_then(|r| r.usage).is_some(), "{dialect:?}");
        }
    }
}
