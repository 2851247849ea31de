//! The shipped `models/*.toml`: every family the project promises is there, resolves from
//! realistic served model names, and compiles.

use meridian_core::ModelRegistry;
use meridian_core::models::{BUILTIN_MODEL_FILES, ModelFamily};

#[test]
fn every_file_in_models_dir_is_built_in() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut built_in: Vec<String> = BUILTIN_MODEL_FILES.iter().map(|(n, _)| n.to_string()).collect();
    built_in.sort();
    assert_eq!(on_disk, built_in);
}

#[test]
fn served_names_resolve_to_the_right_family() {
    let reg = ModelRegistry::builtin().unwrap();
    for (served, family) in [
        ("deepseek-ai/DeepSeek-R1", "deepseek-r1"),
        ("deepseek-ai/DeepSeek-R1-0528", "deepseek-r1"),
        ("Qwen/Qwen3-8B", "qwen3"),
        ("Qwen/Qwen3-30B-A3B-Thinking-2507", "qwen3-thinking-2507"),
        ("Qwen/Qwen3.5-27B", "qwen3.5"),
        ("Qwen/QwQ-32B", "qwq"),
        ("zai-org/GLM-4.5-Air", "glm45"),
        ("moonshotai/Kimi-K2-Thinking", "kimi-k2"),
        ("MiniMaxAI/MiniMax-M2", "minimax-m2"),
        ("ByteDance-Seed/Seed-OSS-36B-Instruct", "seed-oss"),
        ("openai/gpt-oss-120b", "gpt-oss"),
        ("ibm-granite/granite-3.2-8b-instruct", "granite"),
    ] {
        assert_eq!(reg.resolve(served).map(|f| f.name()), Some(family), "{served}");
    }
    assert!(reg.resolve("meta-llama/Llama-3.1-8B").is_none());
}

#[test]
fn a_file_needs_exactly_one_boundary_kind() {
    let text = r#"name = "x"
display_name = "X"
match = ["x"]
initial_phase = "output"
[verification]
status = "text_only"
source = "t"
"#;
    let err = ModelFamily::parse("x.toml", text).unwrap_err().to_string();
    assert!(err.contains("exactly one of [tags] or [harmony]"), "{err}");
    let err = ModelFamily::parse("x.toml", "name = 1").unwrap_err().to_string();
    assert!(err.starts_with("x.toml: name:"), "{err}");
}
