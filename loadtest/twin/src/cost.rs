//! How long one engine step takes, and the named GPU/model profiles that say so.

use serde::Deserialize;

/// Step time = fixed + per scheduled token + per context token attended in decode.
///
/// The fixed part is what a step costs regardless of batch (reading the weights once,
/// launch and sampling overhead); the per-token part is the matmul work every scheduled
/// token (prefill or decode) adds; the per-context-token part is attention reading the
/// KV cache of each decoding request. Prefill attention is folded into the per-token part,
/// which holds for prompts well below ~8k tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct CostModel {
    pub fixed_s: f64,
    pub per_token_s: f64,
    pub per_context_token_s: f64,
}

impl CostModel {
    /// Seconds for a step that schedules `tokens` tokens while `decode_context` tokens of
    /// KV cache are read by decoding requests.
    pub fn step_seconds(&self, tokens: u64, decode_context: u64) -> f64 {
        self.fixed_s + self.per_token_s * tokens as f64 + self.per_context_token_s * decode_context as f64
    }
}

/// A named GPU/model pair: cost model plus the engine limits that go with it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    pub gpu: String,
    pub model: String,
    pub fixed_s: f64,
    pub per_token_s: f64,
    pub per_context_token_s: f64,
    pub kv_blocks: u32,
    pub block_size: u32,
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
    /// Where the numbers come from.
    pub derivation: String,
}

impl Profile {
    pub fn cost(&self) -> CostModel {
        CostModel {
            fixed_s: self.fixed_s,
            per_token_s: self.per_token_s,
            per_context_token_s: self.per_context_token_s,
        }
    }
}

#[derive(Deserialize)]
struct ProfilesFile {
    profile: Vec<Profile>,
}

/// Why a profile could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("profiles.toml: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("no profile named {name:?}; known: {known}")]
    Unknown { name: String, known: String },
}

const BUILTIN: &str = include_str!("../profiles.toml");

/// The profiles shipped in `loadtest/twin/profiles.toml`.
pub fn builtin_profiles() -> Result<Vec<Profile>, ProfileError> {
    Ok(toml::from_str::<ProfilesFile>(BUILTIN)?.profile)
}

pub fn profile(name: &str) -> Result<Profile, ProfileError> {
    let all = builtin_profiles()?;
    let known = all.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
    all.into_iter().find(|p| p.name == name).ok_or(ProfileError::Unknown { name: name.to_owned(), known })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_profiles_parse_and_are_sane() {
        let all = builtin_profiles().unwrap();
        assert!(all.len() >= 3);
        for p in &all {
            assert!(p.fixed_s > 0.0 && p.per_token_s > 0.0 && p.per_context_token_s >= 0.0, "{}", p.name);
            assert!(p.kv_blocks > 0 && p.block_size > 0 && p.max_num_batched_tokens >= p.block_size);
            assert!(!p.derivation.trim().is_empty());
        }
    }

    #[test]
    fn step_time_by_hand() {
        let c = profile("tiny-test").unwrap().cost();
        // 10 ms + 5 tokens x 1 ms + 100 context tokens x 0.1 ms
        assert!((c.step_seconds(5, 100) - 0.025).abs() < 1e-12);
    }

    #[test]
    fn h100_decode_step_is_in_the_measured_range() {
        // One Qwen3-8B request decoding at 1k context on an H100: vLLM users see ~6-7 ms ITL.
        let c = profile("h100-qwen3-8b").unwrap().cost();
        let t = c.step_seconds(1, 1024);
        assert!((0.005..0.008).contains(&t), "{t}");
    }

    #[test]
    fn unknown_profile_lists_the_known_ones() {
        let err = profile("a100-nope").unwrap_err().to_string();
        assert!(err.contains("h100-qwen3-8b"), "{err}");
    }
}
