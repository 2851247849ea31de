//! Which streaming API a response speaks, and so which parser reads its payloads.

use super::{ChoiceDelta, Usage, chunk, messages, responses};

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
    /// `on_choice` for each choice's part of it and returns the token counts it
    /// reports. `None`: not a payload of the expected shape, which tells the tracker
    /// nothing (and is relayed all the same).
    pub fn parse(self, payload: &[u8], on_choice: impl FnMut(ChoiceDelta<'_>)) -> Option<Option<Usage>> {
        match self {
            Dialect::Chat => chunk::parse_payload(payload, on_choice),
            Dialect::Responses => responses::parse(payload, on_choice),
            Dialect::Messages => messages::parse(payload, on_choice),
        }
    }
}
