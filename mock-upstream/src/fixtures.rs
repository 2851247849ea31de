use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;

/// One recorded response body.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub name: String,
    /// The body exactly as recorded.
    pub body: Bytes,
    /// The same request's answer recorded unstreamed (`NAME.json`), where there is one;
    /// otherwise a non-streaming request gets the stream's chunks folded into one.
    pub whole: Option<Bytes>,
}

impl Fixture {
    pub fn new(name: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Fixture { name: name.into(), body: body.into(), whole: None }
    }

    /// Byte offsets where each SSE event ends (after its blank line).
    pub fn event_ends(&self) -> Vec<usize> {
        let b = &self.body[..];
        let mut ends = Vec::new();
        let mut i = 0;
        while i + 1 < b.len() {
            if b[i] == b'\n' && b[i + 1] == b'\n' {
                ends.push(i + 2);
                i += 2;
            } else {
                i += 1;
            }
        }
        if ends.last() != Some(&b.len()) && !b.is_empty() {
            ends.push(b.len());
        }
        ends
    }

    /// The JSON payloads of the `data:` lines, `[DONE]` excluded.
    pub fn data_payloads(&self) -> impl Iterator<Item = serde_json::Value> + '_ {
        std::str::from_utf8(&self.body)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .filter_map(|d| serde_json::from_str(d).ok())
    }
}

macro_rules! embed {
    ($($name:literal),* $(,)?) => {
        [$(($name, include_bytes!(concat!("../fixtures/", $name, ".sse")) as &[u8])),*]
    };
}

macro_rules! embed_whole {
    ($($name:literal),* $(,)?) => {
        [$(($name, include_bytes!(concat!("../fixtures/", $name, ".json")) as &[u8])),*]
    };
}

/// The fixtures compiled into the crate.
pub fn builtin_fixtures() -> BTreeMap<String, Fixture> {
    let mut fixtures: BTreeMap<String, Fixture> = embed!(
        "qwen3-reasoning",
        "qwen3-reasoning-content",
        "qwen3-inline-tags",
        "qwen3-token-ids",
        "gpt-oss-harmony",
        "qwen3-token-ids-stripped",
        "completions-inline-tags",
        "qwen3-reasoning-usage",
        "responses-reasoning",
        "messages-thinking",
    )
    .into_iter()
    .map(|(name, body)| (name.to_owned(), Fixture::new(name, Bytes::from_static(body))))
    .collect();
    for (name, whole) in embed_whole!("responses-reasoning", "messages-thinking") {
        if let Some(f) = fixtures.get_mut(name) {
            f.whole = Some(Bytes::from_static(whole));
        }
    }
    fixtures
}

/// Adds every `*.sse` file in `dir` (replacing built-ins of the same name).
pub fn load_dir(dir: &Path, into: &mut BTreeMap<String, Fixture>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "sse") {
            let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
            let body = std::fs::read(&path)?;
            into.insert(name.clone(), Fixture::new(name, body));
        }
    }
    Ok(())
}
