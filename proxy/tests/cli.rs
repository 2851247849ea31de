//! The `meridian` binary as an operator meets it: config mistakes are reported with their
//! dotted paths before anything starts, and overrides from flags and the environment work.

use std::process::Command;

fn meridian(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_meridian"));
    cmd.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("MERIDIAN_")) {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp_config(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("meridian-cli-{}-{name}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn shipped_config_checks_ok() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../meridian.toml");
    let (code, out, err) = meridian(&["check", "--config", shipped], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("configuration ok"), "{out}");
}

#[test]
fn invalid_values_are_listed_with_dotted_paths() {
    let p = temp_config("invalid", "[upstream]\nmax_attempts = 0\nidle_timeout_s = 0\n");
    let (code, _, err) = meridian(&["check", "--config", p.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("upstream.max_attempts must be in [1, 10]; got 0"), "{err}");
    assert!(err.contains("upstream.idle_timeout_s must be a positive number of seconds; got 0"), "{err}");
}

#[test]
fn unknown_fields_are_rejected() {
    let p = temp_config("unknown", "[server]\nlisten = \"127.0.0.1:1\"\nlistne = 3\n");
    let (code, _, err) = meridian(&["check", "--config", p.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown field `listne`"), "{err}");
}

#[test]
fn environment_and_flags_override_the_file() {
    let p = temp_config("env", "[upstream]\nmax_attempts = 2\n");
    let path = p.to_str().unwrap();
    let (code, _, err) = meridian(&["check", "--config", path], &[("MERIDIAN_UPSTREAM__MAX_ATTEMPTS", "0")]);
    assert_eq!(code, 2);
    assert!(
        err.contains("environment variable MERIDIAN_UPSTREAM__MAX_ATTEMPTS")
            || err.contains("upstream.max_attempts"),
        "{err}"
    );
    let (code, out, err) = meridian(
        &["check", "--config", path, "--upstream", "http://a:8000", "--upstream", "http://b:8000"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2 upstream(s)"), "{out}");
    let (code, out, _) = meridian(
        &["check", "--config", path],
        &[("MERIDIAN_UPSTREAMS", "http://a:8000,http://b:8000,http://c:8000")],
    );
    assert_eq!(code, 0);
    assert!(out.contains("3 upstream(s)"), "{out}");
    let (code, _, err) = meridian(&["check", "--config", path, "--set", "server.listen=nonsense"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("server.listen must be an address"), "{err}");
}

#[test]
fn bad_upstream_url_is_reported_by_index() {
    let (code, _, err) = meridian(&["check", "--upstream", "vllm:8000"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("upstream.endpoints[0].url must be an http:// or https:// URL"), "{err}");
}

#[test]
fn serve_without_upstream_or_twin_refuses_to_start_and_names_the_settings() {
    let (code, _, err) = meridian(&["serve", "--listen", "127.0.0.1:0"], &[]);
    assert_eq!(code, 2, "{err}");
    for setting in ["upstream.endpoints", "--upstream", "MERIDIAN_UPSTREAMS", "--twin", "twin.enabled"] {
        assert!(err.contains(setting), "the error names {setting}: {err}");
    }
    let (code, out, err) = meridian(&["check"], &[]);
    assert_eq!(code, 0, "a config that flags will complete still checks: {err}");
    assert!(out.contains("no upstream configured"), "check says serve would refuse: {out}");
}

#[test]
fn the_twin_is_refused_beside_real_upstreams() {
    let (code, _, err) = meridian(&["check", "--twin", "--upstream", "http://vllm:8000"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("twin.enabled"), "{err}");
    let (code, _, err) =
        meridian(&["check", "--upstream", "http://vllm:8000"], &[("MERIDIAN_TWIN__ENABLED", "true")]);
    assert_eq!(code, 2);
    assert!(err.contains("twin.enabled"), "{err}");
}

/// `meridian serve --twin` with `extra` arguments, running: the child, its URL, and
/// whether it said it serves simulated answers before it listened.
fn serve_twin(extra: &[&str]) -> (std::process::Child, String, bool) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(["serve", "--twin", "--listen", "127.0.0.1:0", "--set", "twin.speed=50", "--log-level", "warn"])
        .args(extra)
        .current_dir(std::env::temp_dir())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut said_simulated = false;
    let url = loop {
        let line = lines.next().expect("meridian exited").unwrap();
        said_simulated |= line.contains("serving simulated answers");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.trim().to_owned();
        }
    };
    (child, url, said_simulated)
}

#[test]
fn serve_twin_answers_say_they_are_simulated() {
    let (mut child, url, said_simulated) = serve_twin(&[]);
    assert!(said_simulated);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = reqwest::Client::builder().no_proxy().build().unwrap();
    let (streamed, whole) = rt.block_on(async {
        let mut body = serde_json::json!({
            "model": "Qwen/Qwen3-8B", "stream": true, "max_tokens": 40,
            "messages": [{"role": "user", "content": "hi"}],
        });
        let streamed = c.post(format!("{url}/v1/chat/completions")).json(&body).send().await.unwrap();
        body["stream"] = false.into();
        let whole = c.post(format!("{url}/v1/chat/completions")).json(&body).send().await.unwrap();
        (streamed, whole)
    });
    let _ = child.kill();
    for response in [&streamed, &whole] {
        let header = response.headers().get("x-meridian-simulated").map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(header.as_deref(), Some("meridian-twin/h100-qwen3-8b"), "{:?}", response.headers());
    }
    let text = rt.block_on(streamed.text()).unwrap();
    let whole: serde_json::Value = rt.block_on(whole.json()).unwrap();
    let _ = child.wait();
    assert!(text.contains("\"reasoning\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let chunks: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(!chunks.is_empty());
    for chunk in chunks.iter().chain([&whole]) {
        assert_eq!(chunk["system_fingerprint"], "meridian-twin/h100-qwen3-8b", "{chunk}");
    }
}

#[test]
fn a_missing_twin_workload_file_is_reported_before_serving() {
    let (code, _, err) = meridian(
        &["serve", "--twin", "--listen", "127.0.0.1:0", "--set", "twin.workload=/nonexistent/wl.toml"],
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.contains("twin.workload: cannot read /nonexistent/wl.toml"), "{err}");
}

#[test]
fn the_twin_steps_on_a_measured_profile_from_a_file() {
    let measured =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/benchmarks/gpu-step-curve/fitted-profile.toml");
    let file = format!("twin.profile_file={measured}");
    let (mut child, url, _) = serve_twin(&["--set", &file, "--set", "twin.profile=h100-qwen3-8b-pytorch"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answer = rt.block_on(async {
        let body = serde_json::json!({"model": "Qwen/Qwen3-8B", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}]});
        let c = reqwest::Client::builder().no_proxy().build().unwrap();
        c.post(format!("{url}/v1/chat/completions")).json(&body).send().await.unwrap()
    });
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(answer.status(), 200);
    let header = answer.headers().get("x-meridian-simulated").map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(header.as_deref(), Some("meridian-twin/h100-qwen3-8b-pytorch"));
    // A name the file does not hold is refused before serving, with what it does hold.
    let (code, _, err) = meridian(
        &[
            "serve",
            "--twin",
            "--listen",
            "127.0.0.1:0",
            "--set",
            &file,
            "--set",
            "twin.profile=h100-qwen3-8b",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("twin.profile: \"h100-qwen3-8b\" is not in"), "{err}");
    assert!(err.contains("it has: h100-qwen3-8b-pytorch"), "{err}");
}
