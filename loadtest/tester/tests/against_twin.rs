//! The load tester against the engine twin: reports, SLO gate, sweeps and A/B, run as the
//! binary a user runs.

use std::process::Command;

use meridian_core::sched::Fcfs;
use meridian_sim::server::{TwinOptions, TwinServer};
use meridian_sim::workload::WorkloadSpec;
use serde_json::Value;

async fn twin(think: u32, answer: u32) -> TwinServer {
    let opts = TwinOptions {
        seed: 1,
        ..TwinOptions::local(
            meridian_sim::profile("h100-qwen3-8b").unwrap(),
            WorkloadSpec::fixed(50, think, answer),
            20.0,
        )
    };
    TwinServer::start(opts, Box::new(Fcfs)).await.unwrap()
}

fn loadtest(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_meridian-loadtest"))
        .args(args)
        .arg("--disable-tqdm")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("lt-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test(flavor = "multi_thread")]
async fn json_report_carries_every_metric_and_matches_the_twin() {
    let t = twin(20, 10).await;
    let dir = tmp("json");
    let url = t.url();
    let (code, out, err) = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || {
            loadtest(&[
                "--base-url",
                &url,
                "--num-prompts",
                "12",
                "--request-rate",
                "30",
                "--random-input-len",
                "64",
                "--random-output-len",
                "100",
                "--save-result",
                "--result-dir",
                dir.to_str().unwrap(),
                "--result-filename",
                "r.json",
                "--csv",
                dir.join("r.csv").to_str().unwrap(),
                "--html",
                dir.join("r.html").to_str().unwrap(),
            ])
        }
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("TTFO (first output token)"), "{out}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    assert_eq!(v["schema"], "meridian-loadtest/2");
    let run = &v["runs"][0];
    let s = &run["summary"];
    assert_eq!(s["completed"], 12);
    assert_eq!(s["think_tokens"], 12 * 20, "usage: 20 think tokens each");
    // 10 visible answer tokens, and the end-of-thought delimiter, which vLLM's usage
    // counts with the answer although no delta shows it.
    assert_eq!(s["output_tokens"], 12 * 11);
    assert_eq!(s["think_to_output"]["count"], 12);
    for m in ["ttft", "ttfo", "think_to_output", "itl", "output_itl", "tpot", "e2el"] {
        assert!(s[m]["p99_ms"].as_f64().unwrap() > 0.0, "{m}");
    }
    let r0 = &run["requests"][0];
    assert_eq!(r0["client_think_tokens"], 20, "client-side count agrees with usage");
    assert!(r0["ttfo"].as_f64().unwrap() > r0["ttft"].as_f64().unwrap());
    let csv = std::fs::read_to_string(dir.join("r.csv")).unwrap();
    assert_eq!(csv.lines().count(), 13);
    let html = std::fs::read_to_string(dir.join("r.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("CDF of time to first output token"));
}

#[tokio::test(flavor = "multi_thread")]
async fn slo_gate_fails_with_status_3() {
    let t = twin(30, 5).await;
    let url = t.url();
    let (code, _, err) = tokio::task::spawn_blocking(move || {
        loadtest(&[
            "--base-url",
            &url,
            "--num-prompts",
            "5",
            "--goodput",
            "ttfo:0.001",
            "--slo-min-fraction",
            "0.5",
        ])
    })
    .await
    .unwrap();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("SLO gate failed"));
}

#[tokio::test(flavor = "multi_thread")]
async fn ab_and_sweep_runs_are_side_by_side() {
    let a = twin(10, 5).await;
    let b = twin(10, 5).await;
    let (ua, ub) = (a.url(), b.url());
    let dir = tmp("ab");
    let (code, out, err) = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || {
            loadtest(&[
                "--base-url",
                &ua,
                "--compare-base-url",
                &ub,
                "--label",
                "direct",
                "--compare-label",
                "other",
                "--num-prompts",
                "6",
                "--sweep-rates",
                "10,40",
                "--save-result",
                "--result-dir",
                dir.to_str().unwrap(),
                "--result-filename",
                "ab.json",
            ])
        }
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    let header = out.lines().next().unwrap();
    for label in ["direct@10", "other@10", "direct@40", "other@40"] {
        assert!(header.contains(label), "{header}");
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("ab.json")).unwrap()).unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 4);
}

#[test]
fn bad_flags_are_reported() {
    let (code, _, err) =
        loadtest(&["--base-url", "http://127.0.0.1:1", "--model", "m", "--request-rate", "fast"]);
    assert_eq!(code, 2);
    assert!(err.contains("--request-rate"), "{err}");
    let (code, _, err) = loadtest(&["--model", "m", "--goodput", "ttft"]);
    assert_eq!(code, 2);
    assert!(err.contains("METRIC:MILLISECONDS"), "{err}");
}

#[test]
fn an_unreachable_server_fails_every_request_not_the_tool() {
    let (code, out, err) =
        loadtest(&["--base-url", "http://127.0.0.1:1", "--model", "m", "--num-prompts", "3"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("0 / 3"), "{out}");
    assert!(err.contains("request failed"), "{err}");
}

/// The whole-request SLO: a run one at a time is the reference; the same workload sent
/// at once is judged against it, request by request.
#[tokio::test(flavor = "multi_thread")]
async fn the_whole_request_slo_judges_each_request_against_itself_alone() {
    let t = twin(20, 10).await;
    let dir = tmp("whole");
    let url = t.url();
    let run = move |prompts: &str, extra: Vec<String>| {
        let url = url.clone();
        let dir = dir.clone();
        let prompts = prompts.to_owned();
        move || {
            let mut args: Vec<String> = [
                "--base-url",
                &url,
                "--num-prompts",
                &prompts,
                "--random-input-len",
                "64",
                "--random-output-len",
                "100",
                "--stall-threshold-ms",
                "100000",
                "--result-dir",
                dir.to_str().unwrap(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(extra.into_iter().map(|a| a.replace("DIR", dir.to_str().unwrap())));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            loadtest(&args)
        }
    };
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (code, _, err) = tokio::task::spawn_blocking(run(
        "12",
        s(&["--max-concurrency", "1", "--save-result", "--result-filename", "alone.json"]),
    ))
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    let judged = |factor: &str, allowance: &str, name: &str| {
        run(
            "12",
            s(&[
                "--slo-reference",
                "DIR/alone.json",
                "--slo-start-factor",
                factor,
                "--slo-start-allowance-ms",
                allowance,
                "--save-result",
                "--result-filename",
                name,
            ]),
        )
    };
    let (code, out, err) = tokio::task::spawn_blocking(judged("1000", "0", "loose.json")).await.unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("whole-request SLO"), "{out}");
    let read = |name: &str| -> Value {
        let text = std::fs::read_to_string(tmp("whole").join(name)).unwrap();
        serde_json::from_str::<Value>(&text).unwrap()["runs"][0]["summary"].clone()
    };
    let loose = read("loose.json");
    assert_eq!(loose["whole_request_slo"]["judged"], 12);
    assert_eq!(loose["whole_request_slo"]["met"], 12, "{loose}");
    assert_eq!(loose["answer_only_slo"]["met"], 12);
    // Twelve prompts at once share their first steps: not all can start as fast as alone.
    let (code, _, err) = tokio::task::spawn_blocking(judged("1", "0", "tight.json")).await.unwrap();
    assert_eq!(code, 0, "{err}");
    let tight = read("tight.json");
    assert_eq!(tight["whole_request_slo"]["judged"], 12);
    assert!(tight["whole_request_slo"]["met"].as_u64().unwrap() < 12, "{tight}");
    assert_eq!(tight["answer_only_slo"]["met"], 12, "the answer-only SLO does not see the start");
    // A reference of another workload is refused.
    let (code, _, err) =
        tokio::task::spawn_blocking(run("5", s(&["--slo-reference", "DIR/alone.json"]))).await.unwrap();
    assert_ne!(code, 0);
    assert!(err.contains("holds 12 requests"), "{err}");
}
