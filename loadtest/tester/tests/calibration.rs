//! The calibration path end to end through the real tools: load-test a twin whose true
//! cost model is known with the `meridian-loadtest` binary, fit the model back from its
//! report, and check the fit lands near the truth. The twin runs in wall-clock time on a
//! shared machine, where scheduling noise grows with the batch, so the bounds are wide;
//! exact recovery from exact timings is tested in `meridian_sim::calibrate`.

use std::process::Command;

use meridian_core::sched::Fcfs;
use meridian_sim::calibrate::{fit, samples_from_report};
use meridian_sim::server::{TwinOptions, TwinServer};
use meridian_sim::workload::{LengthDist, WorkloadSpec};

#[tokio::test(flavor = "multi_thread")]
async fn fitting_a_load_test_of_the_twin_recovers_its_cost_model() {
    let mut profile = meridian_sim::profile("tiny-test").unwrap();
    // Big enough steps that timer jitter is noise, not signal: 20 ms + 2 ms per token.
    profile.fixed_s = 0.020;
    profile.per_token_s = 0.002;
    profile.per_context_token_s = 0.0;
    profile.kv_blocks = 4096;
    profile.max_num_seqs = 64;
    profile.max_num_batched_tokens = 2048;
    let workload = WorkloadSpec {
        prompt: LengthDist::Fixed { value: 20 },
        think: LengthDist::Fixed { value: 8 },
        answer: LengthDist::Fixed { value: 8 },
        entropy: Default::default(),
    };
    let opts = TwinOptions { served_model: "m".into(), ..TwinOptions::local(profile, workload, 1.0) };
    let twin = TwinServer::start(opts, Box::new(Fcfs)).await.unwrap();
    let dir = std::env::temp_dir().join(format!("calib-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut samples = Vec::new();
    for conc in ["1", "4", "12"] {
        let url = twin.url();
        let out = dir.clone();
        let conc = conc.to_owned();
        let status = tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_meridian-loadtest"))
                .args([
                    "--base-url",
                    &url,
                    "--num-prompts",
                    "24",
                    "--max-concurrency",
                    &conc,
                    "--random-input-len",
                    "20",
                ])
                .args([
                    "--save-result",
                    "--result-dir",
                    out.to_str().unwrap(),
                    "--result-filename",
                    &format!("c{conc}.json"),
                ])
                .arg("--disable-tqdm")
                .status()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(status.success());
    }
    for conc in ["1", "4", "12"] {
        let text = std::fs::read_to_string(dir.join(format!("c{conc}.json"))).unwrap();
        samples.extend(samples_from_report(&text).unwrap());
    }
    let f = fit(&samples).unwrap();
    eprintln!("{f:?}");
    assert!((f.cost.fixed_s - 0.020).abs() < 0.006, "fixed {}", f.cost.fixed_s);
    assert!((0.001..0.005).contains(&f.cost.per_token_s), "per token {}", f.cost.per_token_s);
    assert!(f.median_abs_pct_error < 30.0, "{}", f.median_abs_pct_error);
    std::fs::remove_dir_all(dir).unwrap();
}
