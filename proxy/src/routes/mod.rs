//! HTTP routes: the OpenAI-compatible API and the operational endpoints.

mod body;
mod fields;
mod generate;

mod models;
mod ops;
mod passthrough;

pub use body::{GenerationRequest, hook_body, upstream_body};
pub use generate::{chat_completions, completions, messages, responses};
pub use models::list_models;
pub use ops::{health, metrics, ready};
pub use passthrough::passthrough;
