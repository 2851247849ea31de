//! The requests a run sends: synthetic prompts of given lengths, or conversations from a
//! ShareGPT-format JSON file. Seeded, so two runs (or the two sides of an A/B) send the
//! same requests.

use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub text: String,
    /// Approximate prompt tokens (4 characters per token for synthetic text).
    pub input_tokens: u32,
    pub max_tokens: u32,
    /// Thinking tokens this request may spend (sent as vLLM's `thinking_token_budget`);
    /// `max_tokens` then covers the thought and the answer.
    pub think_budget: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is not a ShareGPT JSON list: {source}")]
    Parse { path: String, source: serde_json::Error },
    #[error("{path} has no usable conversation (a human turn followed by a reply)")]
    Empty { path: String },
}

const WORDS: [&str; 24] = [
    "the", "model", "reasons", "about", "prime", "numbers", "and", "checks", "each", "step", "before", "it",
    "answers", "a", "question", "on", "graph", "theory", "with", "care", "so", "that", "users", "wait",
];

/// A synthetic prompt of about `tokens` tokens (one word ~ one token).
pub(crate) fn synthetic_text(rng: &mut StdRng, tokens: u32) -> String {
    let mut s = String::with_capacity(tokens as usize * 6);
    for i in 0..tokens.max(1) {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    s
}

/// Lengths of a synthetic workload, each drawn uniformly in
/// `[len * (1 - range_ratio), len * (1 + range_ratio)]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomLengths {
    pub input: u32,
    /// The answer (all of `max_tokens` when `think` is unset).
    pub output: u32,
    /// Thinking tokens per request, as a think budget; `None` leaves thinking to the model.
    pub think: Option<u32>,
    pub range_ratio: f64,
}

/// `vllm bench serve --dataset-name random`, plus an optional think budget per request:
/// a random-weight reasoning model never ends its thought by itself, so a reasoning
/// workload with known think and answer lengths needs the budget to say where the
/// thought ends (and `--ignore-eos` for where the answer does).
pub fn random(n: usize, lengths: RandomLengths, seed: u64) -> Vec<Prompt> {
    let RandomLengths { input: input_len, output: output_len, think, range_ratio } = lengths;
    let mut rng = StdRng::seed_from_u64(seed);
    let span = |len: u32, rng: &mut StdRng| {
        let r = range_ratio.clamp(0.0, 1.0);
        let lo = (f64::from(len) * (1.0 - r)).round().max(1.0) as u32;
        let hi = (f64::from(len) * (1.0 + r)).round().max(f64::from(lo)) as u32;
        rng.random_range(lo..=hi)
    };
    (0..n)
        .map(|_| {
            let input = span(input_len, &mut rng);
            let output = span(output_len, &mut rng);
            let think_budget = think.map(|t| span(t, &mut rng));
            let text = synthetic_text(&mut rng, input);
            let max_tokens = output + think_budget.unwrap_or(0);
            Prompt { text, input_tokens: input, max_tokens, think_budget }
        })
        .collect()
}

#[derive(Deserialize)]
struct Conversation {
    conversations: Vec<Turn>,
}

#[derive(Deserialize)]
struct Turn {
    from: String,
    value: String,
}

/// `--dataset-name sharegpt`: the first human turn of each conversation as the prompt,
/// the length of the reply (in ~4-character tokens) as `max_tokens` unless overridden.
pub fn sharegpt(
    path: &Path,
    n: usize,
    output_len: Option<u32>,
    seed: u64,
) -> Result<Vec<Prompt>, DatasetError> {
    let shown = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|source| DatasetError::Read { path: shown.clone(), source })?;
    let convs: Vec<Conversation> =
        serde_json::from_str(&text).map_err(|source| DatasetError::Parse { path: shown.clone(), source })?;
    let mut usable: Vec<Prompt> = convs
        .into_iter()
        .filter_map(|c| {
            let human = c.conversations.iter().position(|t| t.from == "human")?;
            let reply = c.conversations.get(human + 1)?;
            let prompt = &c.conversations[human].value;
            let approx = |s: &str| (s.chars().count() as u32).div_ceil(4).max(1);
            Some(Prompt {
                text: prompt.clone(),
                input_tokens: approx(prompt),
                max_tokens: output_len.unwrap_or_else(|| approx(&reply.value)),
                think_budget: None,
            })
        })
        .collect();
    if usable.is_empty() {
        return Err(DatasetError::Empty { path: shown });
    }
    // Seeded shuffle, then cycle to n.
    let mut rng = StdRng::seed_from_u64(seed);
    for i in (1..usable.len()).rev() {
        usable.swap(i, rng.random_range(0..=i));
    }
    Ok((0..n).map(|i| usable[i % usable.len()].clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_prompts_are_seeded_and_within_range() {
        let lengths = RandomLengths { input: 100, output: 20, think: None, range_ratio: 0.5 };
        let a = random(50, lengths, 3);
        assert_eq!(a, random(50, lengths, 3));
        assert_ne!(a, random(50, lengths, 4));
        for p in &a {
            assert!((50..=150).contains(&p.input_tokens));
            assert!((10..=30).contains(&p.max_tokens));
            assert_eq!(p.think_budget, None);
            assert_eq!(p.text.split(' ').count() as u32, p.input_tokens);
        }
    }

    #[test]
    fn a_think_budget_adds_to_max_tokens() {
        let lengths = RandomLengths { input: 10, output: 20, think: Some(300), range_ratio: 0.5 };
        for p in random(50, lengths, 9) {
            let think = p.think_budget.expect("every request gets a budget");
            assert!((150..=450).contains(&think), "{think}");
            assert!((think + 10..=think + 30).contains(&p.max_tokens), "{p:?}");
        }
    }

    #[test]
    fn sharegpt_takes_human_turns_and_reply_lengths() {
        let dir = std::env::temp_dir().join(format!("lt-sharegpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.json");
        std::fs::write(
            &path,
            r#"[{"conversations":[{"from":"human","value":"What is 2+2?"},{"from":"gpt","value":"It is four, since two and two make four."}]},
                {"conversations":[{"from":"gpt","value":"orphan"}]}]"#,
        )
        .unwrap();
        let p = sharegpt(&path, 3, None, 1).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].text, "What is 2+2?");
        assert_eq!(p[0].max_tokens, 10, "40 characters of reply");
        std::fs::write(&path, "[]").unwrap();
        assert!(matches!(sharegpt(&path, 1, None, 1), Err(DatasetError::Empty { .. })));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
