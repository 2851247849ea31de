use std::collections::BTreeMap;

use serde::Serialize;

/// What the mock saw of one request.
#[derive(Debug, Clone, Serialize)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body: String,
    /// The client (the proxy) went away before the response was complete.
    pub cancelled: bool,
    /// The whole response was handed to the connection.
    pub completed: bool,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}
