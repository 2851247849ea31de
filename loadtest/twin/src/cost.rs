//! How long one engine step takes, and the named GPU/model profiles that say so.

use serde::Deserialize;

/// What one engine step carries, as far as its cost goes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepShape {
    /// Tokens scheduled: prompt chunks plus one per decoding request.
    pub tokens: f64,
    /// Requests decoding one token each.
    pub decode_reqs: f64,
    /// KV-cache tokens the decoding requests attend to.
    pub decode_context: f64,
    /// Attention work of the prefill chunks: for each chunk of `n` tokens after `c`
    /// already computed, `n * (c + n / 2)` (each new token attends to the context and,
    /// causally, to half the chunk on average).
    pub prefill_attention: f64,
}

impl StepShape {
    /// A step of `decode_reqs` one-token decodes over `decode_context` cached tokens.
    pub fn decode(decode_reqs: u64, decode_context: u64) -> Self {
        StepShape {
            tokens: decode_reqs as f64,
            decode_reqs: decode_reqs as f64,
            decode_context: decode_context as f64,
            prefill_attention: 0.0,
        }
    }

    /// Adds a prefill chunk of `n` tokens after `computed` tokens of its request.
    pub fn add_prefill(&mut self, n: u64, computed: u64) {
        let n = n as f64;
        self.tokens += n;
        self.prefill_attention += n * (computed as f64 + n / 2.0);
    }
}

/// Step time = fixed + per scheduled token (at least `weight_read_tokens` of them) + per
/// decoding request + per context token a decoder attends to + per unit of prefill
/// attention.
///
/// The fixed part is what a step costs regardless of batch (reading the weights once,
/// launch and scheduling overhead); the per-token part is the matmul work every scheduled
/// token (prefill or decode) adds; the per-request part is what each decoding request
/// adds beyond its token (sampling, the LM head, per-request bookkeeping: large on a CPU
/// engine, small on a GPU); the per-context-token part is attention reading the KV cache
/// of each decoding request; the prefill-attention part is a prompt chunk attending to
/// itself and to what came before it, which grows with the square of long prompts. The
/// per-request and prefill-attention parts default to zero; a datasheet profile that
/// leaves prefill attention out folds it into the per-token part, fair only for prompts
/// well below ~8k tokens (on an H100 an 8192-token chunk after 16k computed tokens took
/// 1.85x as long as one after none: docs/src/benchmarks/gpu-step-curve.md).
///
/// The floor under the per-token part is a GPU's: a step's matmuls read every weight
/// once whatever the batch, so below some number of tokens they are bound by that read,
/// not by arithmetic, and a step of one token costs as much as one of
/// `weight_read_tokens`. Zero (no floor) suits a CPU engine, compute-bound at any batch.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct CostModel {
    pub fixed_s: f64,
    pub per_token_s: f64,
    pub per_context_token_s: f64,
    #[serde(default)]
    pub per_decode_request_s: f64,
    #[serde(default)]
    pub per_prefill_attention_s: f64,
    #[serde(default)]
    pub weight_read_tokens: f64,
}

impl CostModel {
    /// The datasheet form: fixed, per token and per decode-context token only.
    pub fn linear(fixed_s: f64, per_token_s: f64, per_context_token_s: f64) -> Self {
        CostModel {
            fixed_s,
            per_token_s,
            per_context_token_s,
            per_decode_request_s: 0.0,
            per_prefill_attention_s: 0.0,
            weight_read_tokens: 0.0,
        }
    }

    /// Seconds for a step of this shape.
    pub fn step_seconds(&self, s: &StepShape) -> f64 {
        self.fixed_s
            + self.per_token_s * s.tokens.max(self.weight_read_tokens)
            + self.per_decode_request_s * s.decode_reqs
            + self.per_context_token_s * s.decode_context
            + self.per_prefill_attention_s * s.prefill_attention
    }

    /// The formula with its coefficients, for reports.
    pub fn describe(&self) -> String {
        let tokens = if self.weight_read_tokens > 0.0 {
            format!("max(tokens, {:.0})", self.weight_read_tokens)
        } else {
            "tokens".to_owned()
        };
        format!(
            "step = {:.3} ms + {:.2} us x {tokens} + {:.2} us x decoding requests + {:.3} ns x decode context + {:.4} ns x prefill attention",
            self.fixed_s * 1e3,
            self.per_token_s * 1e6,
            self.per_decode_request_s * 1e6,
            self.per_context_token_s * 1e9,
            self.per_prefill_attention_s * 1e9,
        )
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
    #[serde(default)]
    pub per_decode_request_s: f64,
    #[serde(default)]
    pub per_prefill_attention_s: f64,
    #[serde(default)]
    pub weight_read_tokens: f64,
    pub kv_blocks: u32,
    pub block_size: u32,
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
    /// How a step's time varies around the fit (`measured / fitted` at
    /// [`crate::spread::PROBABILITIES`]); none: every step takes the fitted time.
    #[serde(default)]
    pub step_spread: Option<crate::spread::StepSpread>,
    /// Where the numbers come from.
    pub derivation: String,
}

impl Profile {
    pub fn cost(&self) -> CostModel {
        CostModel {
            fixed_s: self.fixed_s,
            per_token_s: self.per_token_s,
            per_context_token_s: self.per_context_token_s,
            per_decode_request_s: self.per_decode_request_s,
            per_prefill_attention_s: self.per_prefill_attention_s,
            weight_read_tokens: self.weight_read_tokens,
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

/// Profiles from a TOML file of `[[profile]]` tables (say, one `meridian-sim calibrate
/// --profile-out` wrote).
pub fn profiles_from_file(path: &std::path::Path) -> Result<Vec<Profile>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    toml::from_str::<ProfilesFile>(&text).map(|f| f.profile).map_err(|e| format!("{}: {e}", path.display()))
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
        assert!((c.step_seconds(&StepShape::decode(5, 100)) - 0.025).abs() < 1e-12);
        let full = CostModel { per_decode_request_s: 0.002, per_prefill_attention_s: 1e-6, ..c };
        let mut shape = StepShape::decode(2, 100);
        shape.add_prefill(10, 20); // 10 x (20 + 5) = 250 units of prefill attention
        // 10 + 12 x 1 + 2 x 2 + 100 x 0.1 + 250 x 0.001 ms
        assert!((full.step_seconds(&shape) - 0.03625).abs() < 1e-12, "{}", full.step_seconds(&shape));
    }

    #[test]
    fn h100_decode_step_is_in_the_measured_range() {
        // One Qwen3-8B request decoding at 1k context on an H100: vLLM users see ~6-7 ms ITL.
        let c = profile("h100-qwen3-8b").unwrap().cost();
        let t = c.step_seconds(&StepShape::decode(1, 1024));
        assert!((0.005..0.008).contains(&t), "{t}");
    }

    #[test]
    fn unknown_profile_lists_the_known_ones() {
        let err = profile("a100-nope").unwrap_err().to_string();
        assert!(err.contains("h100-qwen3-8b"), "{err}");
    }
}
