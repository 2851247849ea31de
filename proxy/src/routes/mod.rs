//! HTTP routes: the OpenAI-compatible API and the operational endpoints.

mod generate;
mod models;
mod ops;
mod passthrough;

use meridian_core::stream::Dialect;

pub use generate::{chat_completions, completions, messages, responses};
pub use models::list_models;
pub use ops::{health, metrics, ready};
pub use passthrough::passthrough;

/// The label a path's requests are counted under, for a refusal before its handler runs
/// (a layer's); `None` for the operational routes, which are not counted.
pub fn label_of_path(path: &str) -> Option<&'static str> {
    match crate::ctx::Route::of_path(path) {
        Some(route) => Some(route.as_str()),
        None if path == "/v1/models" => Some("models"),
        None if path.starts_with("/v1/") => Some("passthrough"),
        None => None,
    }
}

/// The API a path speaks, for answers given before its handler runs (a layer's refusal).
pub fn dialect_of_path(path: &str) -> Dialect {
    crate::ctx::Route::of_path(path).map_or(Dialect::Chat, crate::ctx::Route::dialect)
}
