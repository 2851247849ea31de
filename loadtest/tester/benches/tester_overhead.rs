//! Two figures, written to docs/src/benchmarks/loadtest.md:
//!
//! 1. The load tester's own cost at the rates it is used at: its CPU time as a fraction of
//!    the run (one core), and how much it adds to the TTFT it reports compared with the
//!    TTFT the server measured itself (the twin's `vllm:time_to_first_token_seconds`).
//! 2. The twin's speed: simulated engine steps per wall-clock second in virtual time.
//!
//!   scripts/bench-loadtest.sh

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use meridian_core::sched::Fcfs;
use meridian_sim::workload::WorkloadSpec;
use meridian_sim::{EngineConfig, experiment};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn start_twin() -> (Proc, String) {
    let mut child = Command::new(target_dir().join("meridian-sim"))
        .args(["serve", "--listen", "127.0.0.1:0", "--profile", "h100-qwen3-8b", "--speed", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("meridian-sim (run scripts/bench-loadtest.sh, which builds it)");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().unwrap().unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (Proc(child), url)
}

fn scrape(url: &str, name: &str) -> f64 {
    let out = Command::new("curl").args(["-s", &format!("{url}/metrics")]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

struct Row {
    rate: f64,
    requests: u64,
    chunks: f64,
    duration: f64,
    cpu: f64,
    client_ttft_ms: f64,
    server_ttft_ms: f64,
}

fn main() {
    let (_twin, url) = start_twin();
    let dir = std::env::temp_dir().join(format!("lt-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rows = Vec::new();
    for rate in [5.0, 10.0, 20.0, 40.0] {
        let n = (rate * 6.0) as u64;
        let (s0, c0) = (
            scrape(&url, "vllm:time_to_first_token_seconds_sum"),
            scrape(&url, "vllm:time_to_first_token_seconds_count"),
        );
        let file = format!("r{rate}.json");
        let status = Command::new(env!("CARGO_BIN_EXE_meridian-loadtest"))
            .args(["--base-url", &url, "--num-prompts", &n.to_string(), "--request-rate", &rate.to_string()])
            .args([
                "--random-input-len",
                "256",
                "--random-output-len",
                "200",
                "--disable-tqdm",
                "--save-result",
            ])
            .args(["--result-dir", dir.to_str().unwrap(), "--result-filename", &file])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let (s1, c1) = (
            scrape(&url, "vllm:time_to_first_token_seconds_sum"),
            scrape(&url, "vllm:time_to_first_token_seconds_count"),
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(&file)).unwrap()).unwrap();
        let run = &v["runs"][0];
        let chunks: f64 = run["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["token_times"].as_array().map_or(0, |t| t.len()) as f64)
            .sum();
        let row = Row {
            rate,
            requests: n,
            chunks,
            duration: run["summary"]["duration_s"].as_f64().unwrap(),
            cpu: run["client_cpu_s"].as_f64().unwrap(),
            client_ttft_ms: run["summary"]["ttft"]["mean_ms"].as_f64().unwrap(),
            server_ttft_ms: (s1 - s0) / (c1 - c0).max(1.0) * 1000.0,
        };
        println!(
            "rate {:>5}/s: tester CPU {:.2}% of one core, {:.1} us/chunk; TTFT client {:.2} ms vs server {:.2} ms",
            row.rate,
            row.cpu / row.duration * 100.0,
            row.cpu / row.chunks.max(1.0) * 1e6,
            row.client_ttft_ms,
            row.server_ttft_ms
        );
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&dir);

    // Twin speed in virtual time, release build, saturating load.
    let cfg = EngineConfig::from(&meridian_sim::profile("h100-qwen3-8b").unwrap());
    let mut speeds = Vec::new();
    let mut last = None;
    for seed in 0..3 {
        let res = experiment::run_poisson(cfg, Box::new(Fcfs), WorkloadSpec::default(), 40.0, 3000, seed);
        speeds.push(res.steps_per_second());
        last = Some(res);
    }
    speeds.sort_by(|a, b| a.total_cmp(b));
    let last = last.unwrap();
    println!(
        "twin: median {:.0} simulated steps/s ({} steps, {:.1} s simulated per run)",
        speeds[1], last.steps, last.makespan_s
    );

    let mut md = String::from(
        "# Load tester and twin speed\n\nGenerated by `scripts/bench-loadtest.sh` (`loadtest/tester/benches/tester_overhead.rs`).\n\n",
    );
    md.push_str("## The load tester's own cost\n\n");
    md.push_str("The tester (release build) against the engine twin (`meridian-sim serve --profile h100-qwen3-8b\n--speed 1`, its own process) on the 2-core development machine; 256-token prompts, up to 200\ngenerated tokens, Poisson arrivals for 6 s at each rate. CPU is the tester's user+system time\nover the run; \"added to TTFT\" compares the mean TTFT the tester reports with the mean the twin\nmeasured inside the engine, so it also contains the HTTP hop.\n\n");
    md.push_str("| rate (req/s) | requests | chunks | tester CPU (% of one core) | CPU per chunk (µs) | TTFT client (ms) | TTFT server (ms) | added |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} | {:.0} | {:.2} | {:.1} | {:.2} | {:.2} | {:.1}% |\n",
            r.rate,
            r.requests,
            r.chunks,
            r.cpu / r.duration * 100.0,
            r.cpu / r.chunks.max(1.0) * 1e6,
            r.client_ttft_ms,
            r.server_ttft_ms,
            (r.client_ttft_ms - r.server_ttft_ms) / r.client_ttft_ms.max(1e-9) * 100.0
        ));
    }
    if let Some(top) = rows.last() {
        let cpu = top.cpu / top.duration * 100.0;
        md.push_str(&format!(
            "\nAt the highest rate used ({} req/s, {:.0} chunks/s) the tester used **{cpu:.2}%** of one core: the 5% target is **{}**.\n",
            top.rate,
            top.chunks / top.duration,
            if cpu < 5.0 { "met" } else { "missed" }
        ));
    }
    md.push_str(&format!(
        "\n## The twin's speed\n\n`experiment::run_poisson`, profile h100-qwen3-8b, FCFS, 3000 requests at 40 req/s (the\ndefault reasoning mix), three seeds: median **{:.0} simulated steps per second** of wall time\n({} steps covering {:.0} s of engine time per run).\n",
        speeds[1], last.steps, last.makespan_s
    ));
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/src/benchmarks/loadtest.md");
    std::fs::write(path, md).unwrap();
    println!("wrote {path}");
}
