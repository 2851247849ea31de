//! Per-model think/output boundaries, loaded from `models/*.toml`.
//!
//! Each reasoning family marks its think phase differently: tag pairs (`<think>`,
//! `<seed:think>`, Granite's "Here is my thought process:"), or gpt-oss harmony channels.
//! A family file names the marker strings, the token ids where they are single tokens, how
//! the chat template starts a generation (already inside a think block or not), and which
//! served model names it applies to. The files ship inside the binary; a directory of extra
//! or overriding files can be added at run time.

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::phase::scanner::{MarkerError, MarkerKind, MarkerSet};

/// The phase a generation is in before any marker has been seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InitialPhase {
    /// The chat template already opened the think block in the prompt (DeepSeek-R1, QwQ):
    /// everything is reasoning until the end marker.
    Think,
    /// The model opens the think block itself, or does not think at all.
    Output,
}

/// A model family file, as written in `models/<name>.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFamilyFile {
    pub name: String,
    pub display_name: String,
    /// Case-insensitive substrings of served model names that select this family.
    #[serde(rename = "match")]
    pub patterns: Vec<String>,
    /// vLLM's `--reasoning-parser` for this family, where it has one.
    pub reasoning_parser: Option<String>,
    pub initial_phase: InitialPhase,
    pub tags: Option<TagBoundary>,
    pub harmony: Option<HarmonyBoundary>,
    pub verification: Verification,
}

/// Think blocks delimited by start and end strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagBoundary {
    pub start: Vec<String>,
    pub end: Vec<String>,
    #[serde(default)]
    pub start_ids: Vec<u32>,
    #[serde(default)]
    pub end_ids: Vec<u32>,
}

/// gpt-oss harmony format: `<|channel|>NAME<|message|>BODY<|end|>`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarmonyBoundary {
    pub think_channels: Vec<String>,
    pub output_channels: Vec<String>,
    pub ids: Option<HarmonyIds>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarmonyIds {
    pub start: u32,
    pub channel: u32,
    pub message: u32,
    pub end: Vec<u32>,
}

/// Where a family's token ids come from, so nobody mistakes a guess for a fact.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verification {
    pub status: VerificationStatus,
    pub source: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerificationStatus {
    /// Checked against a real tokenizer by `core/tests/tokenizer_ids.rs`.
    Tokenizer,
    /// Derived from a real tokenizer's tables by the same test, with one stated assumption.
    Derived,
    /// Widely published figures, not checked here.
    Published,
    /// No ids configured: detection works from text only.
    TextOnly,
}

/// A family compiled for use: markers ready for scanning, ids ready for lookup.
#[derive(Debug)]
pub struct ModelFamily {
    pub file: ModelFamilyFile,
    pub(crate) markers: MarkerSet,
    pub(crate) harmony: bool,
}

/// Errors from loading model family files.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: Box<serde_path_to_error::Error<toml::de::Error>>,
    },
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{path}: {source}")]
    Marker {
        path: String,
        #[source]
        source: MarkerError,
    },
}

const HARMONY_MARKERS: [(&str, MarkerKind); 6] = [
    ("<|start|>", MarkerKind::HarmonyStart),
    ("<|channel|>", MarkerKind::HarmonyChannel),
    ("<|message|>", MarkerKind::HarmonyMessage),
    ("<|end|>", MarkerKind::HarmonyEnd),
    ("<|return|>", MarkerKind::HarmonyEnd),
    ("<|call|>", MarkerKind::HarmonyEnd),
];

impl ModelFamily {
    pub fn parse(path: &str, text: &str) -> Result<Self, ModelError> {
        let de = toml::Deserializer::new(text);
        let file: ModelFamilyFile = serde_path_to_error::deserialize(de)
            .map_err(|e| ModelError::Parse { path: path.to_owned(), source: Box::new(e) })?;
        Self::compile(path, file)
    }

    pub fn compile(path: &str, file: ModelFamilyFile) -> Result<Self, ModelError> {
        let invalid =
            |message: &str| ModelError::Invalid { path: path.to_owned(), message: message.to_owned() };
        if file.patterns.iter().any(|p| p.trim().is_empty()) {
            return Err(invalid("match patterns must not be empty"));
        }
        let markers = match (&file.tags, &file.harmony) {
            (Some(tags), None) => {
                if tags.start.is_empty() || tags.end.is_empty() {
                    return Err(invalid("tags.start and tags.end need at least one string each"));
                }
                let pairs = tags
                    .start
                    .iter()
                    .map(|s| (s.as_str(), MarkerKind::ThinkStart))
                    .chain(tags.end.iter().map(|s| (s.as_str(), MarkerKind::ThinkEnd)));
                MarkerSet::new(pairs)
            }
            (None, Some(h)) => {
                if h.think_channels.is_empty() || h.output_channels.is_empty() {
                    return Err(invalid("harmony needs think_channels and output_channels"));
                }
                MarkerSet::new(HARMONY_MARKERS)
            }
            _ => return Err(invalid("exactly one of [tags] or [harmony] must be given")),
        }
        .map_err(|source| ModelError::Marker { path: path.to_owned(), source })?;
        let harmony = file.harmony.is_some();
        Ok(ModelFamily { file, markers, harmony })
    }

    pub fn name(&self) -> &str {
        &self.file.name
    }

    /// What a boundary token id means for this family, if anything.
    pub(crate) fn marker_for_id(&self, id: u32) -> Option<MarkerKind> {
        if let Some(tags) = &self.file.tags {
            if tags.start_ids.contains(&id) {
                return Some(MarkerKind::ThinkStart);
            }
            if tags.end_ids.contains(&id) {
                return Some(MarkerKind::ThinkEnd);
            }
            return None;
        }
        let ids = self.file.harmony.as_ref()?.ids.as_ref()?;
        if id == ids.start {
            Some(MarkerKind::HarmonyStart)
        } else if id == ids.channel {
            Some(MarkerKind::HarmonyChannel)
        } else if id == ids.message {
            Some(MarkerKind::HarmonyMessage)
        } else if ids.end.contains(&id) {
            Some(MarkerKind::HarmonyEnd)
        } else {
            None
        }
    }

    /// Whether token ids can drive this family's state machine.
    pub(crate) fn has_ids(&self) -> bool {
        match (&self.file.tags, &self.file.harmony) {
            (Some(t), _) => !t.start_ids.is_empty() || !t.end_ids.is_empty(),
            (_, Some(h)) => h.ids.is_some(),
            _ => false,
        }
    }

    /// The phase a harmony channel name selects; `None` for a channel this family does not
    /// list (treated as output, since an unknown channel is more likely meant for a reader).
    pub(crate) fn channel_is_think(&self, name: &[u8]) -> bool {
        let Some(h) = &self.file.harmony else {
            return false;
        };
        let word =
            name.split(|b| b.is_ascii_whitespace() || *b == b'<').find(|w| !w.is_empty()).unwrap_or_default();
        h.think_channels.iter().any(|c| c.as_bytes() == word)
    }
}

/// The families Meridian knows, in match order.
#[derive(Debug, Clone, Default)]
pub struct ModelRegistry {
    families: Vec<Arc<ModelFamily>>,
}

macro_rules! builtin_files {
    ($($name:literal),* $(,)?) => {
        [$(($name, include_str!(concat!("../../models/", $name, ".toml")))),*]
    };
}

/// The family files compiled into every build.
pub const BUILTIN_MODEL_FILES: [(&str, &str); 11] = builtin_files!(
    "deepseek-r1",
    "qwen3",
    "qwen3-thinking-2507",
    "qwen3_5",
    "qwq",
    "glm45",
    "kimi-k2",
    "minimax-m2",
    "seed-oss",
    "gpt-oss",
    "granite",
);

impl ModelRegistry {
    /// The families shipped in `models/`.
    pub fn builtin() -> Result<Self, ModelError> {
        let mut reg = ModelRegistry::default();
        for (name, text) in BUILTIN_MODEL_FILES {
            reg.insert(ModelFamily::parse(&format!("models/{name}.toml"), text)?);
        }
        Ok(reg)
    }

    /// Adds every `*.toml` in `dir`; a file whose `name` matches a known family replaces it.
    pub fn load_dir(&mut self, dir: &Path) -> Result<(), ModelError> {
        let io_err = |source| ModelError::Io { path: dir.display().to_string(), source };
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .map_err(io_err)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        paths.sort();
        for path in paths {
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(&path)
                .map_err(|source| ModelError::Io { path: shown.clone(), source })?;
            self.insert(ModelFamily::parse(&shown, &text)?);
        }
        Ok(())
    }

    pub fn insert(&mut self, family: ModelFamily) {
        self.families.retain(|f| f.name() != family.name());
        self.families.push(Arc::new(family));
    }

    pub fn get(&self, name: &str) -> Option<&Arc<ModelFamily>> {
        self.families.iter().find(|f| f.name() == name)
    }

    pub fn families(&self) -> impl Iterator<Item = &Arc<ModelFamily>> {
        self.families.iter()
    }

    /// The family for a served model name: the one with the longest matching pattern, so
    /// `qwq` beats `qwen` and a distill-specific file beats its base family.
    pub fn resolve(&self, served_model: &str) -> Option<&Arc<ModelFamily>> {
        let lower = served_model.to_ascii_lowercase();
        self.families
            .iter()
            .filter_map(|f| {
                f.file
                    .patterns
                    .iter()
                    .filter(|p| lower.contains(&p.to_ascii_lowercase()))
                    .map(|p| p.len())
                    .max()
                    .map(|len| (len, f))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, f)| f)
    }
}
