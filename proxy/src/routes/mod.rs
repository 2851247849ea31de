//! HTTP routes: the OpenAI-compatible API and the operational endpoints.

mod body;
mod fields;
mod generate;

mod models;
mod ops;
mod passthrough;

pub use body::{GenerationRequest, hook_body, upstream_body};

/// The label a path's requests are counted under, for a refusal before its handler runs
/// (a layer's); `None` for the operational routes, which are not counted.
pub fn label_of_path(path: &str) -> Option<&'static str> {
    match path {
        "/v1/chat/completions" => Some("chat_completions"),
        "/v1/completions" => Some("completions"),
        "/v1/responses" => Some("responses"),
        "/v1/messages" => Some("messages"),
        "/v1/models" => Some("models"),
        _ => Some("passthrough"),
    }
    .filter(|_| path.starts_with("/v1/"))
}

/// The API a path speaks, for answers given before its handler runs (a layer's refusal).
pub fn dialect_of_path(path: &str) -> meridian_core::stream::Dialect {
    match path {
        "/v1/responses" => meridian_core::stream::Dialect::Responses,
        "/v1/messages" => meridian_core::stream::Dialect::Messages,
        _ => meridian_core::stream::Dialect::Chat,
    }
}
pub use generate::{chat_completions, completions, messages, responses};
pub use models::list_models;
pub use ops::{health, metrics, ready};
pub use passthrough::passthrough;
