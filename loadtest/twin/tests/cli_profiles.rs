//! `meridian-sim --profile-file`: which profile a run uses, and that its report names that
//! one (a report that names another profile's hardware misleads whoever reads it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn profile_table(name: &str, per_token_s: f64) -> String {
    format!(
        "[[profile]]\nname = {name:?}\ngpu = \"test\"\nmodel = \"test\"\nfixed_s = 5e-3\n\
         per_token_s = {per_token_s:e}\nper_context_token_s = 1e-6\nper_decode_request_s = 1e-4\n\
         per_prefill_attention_s = 1e-7\nweight_read_tokens = 0\nkv_blocks = 100000\nblock_size = 16\n\
         max_num_seqs = 32\nmax_num_batched_tokens = 512\nderivation = \"written by the test\"\n"
    )
}

fn two_profiles(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("a temp dir");
    let path = dir.join("profiles.toml");
    let text = format!("{}\n{}", profile_table("first", 1e-4), profile_table("second", 2e-4));
    std::fs::write(&path, text).expect("the profile file is written");
    path
}

fn run(file: &Path, profile: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_meridian-sim"));
    cmd.args(["run", "--request-rate", "2", "--num-prompts", "8", "--profile-file"]).arg(file);
    if let Some(name) = profile {
        cmd.args(["--profile", name]);
    }
    cmd.output().expect("meridian-sim runs")
}

#[test]
fn a_profile_file_run_reports_the_profile_it_used() {
    let dir = std::env::temp_dir().join(format!("meridian-sim-profiles-{}", std::process::id()));
    let file = two_profiles(&dir);

    let first = run(&file, None);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let text = String::from_utf8_lossy(&first.stdout);
    assert!(text.starts_with("profile first,"), "no --profile: the file's first profile; got {text}");

    let second = run(&file, Some("second"));
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
    let text = String::from_utf8_lossy(&second.stdout);
    assert!(text.starts_with("profile second,"), "--profile picks from the file; got {text}");

    let missing = run(&file, Some("h100-qwen3-8b"));
    assert!(!missing.status.success(), "a name the file lacks must not fall back to another profile");
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("h100-qwen3-8b") && err.contains("first, second"),
        "the error names what is there: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
