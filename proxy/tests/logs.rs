//! Logs fit where they go: written to a file or a pipe, they carry no terminal colour
//! codes (an escape sequence in a log file is noise to every reader and parser).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ESC: u8 = 0x1b;

fn meridian(stdout: Stdio, stderr: Stdio) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_meridian"));
    cmd.args(["serve", "--twin", "--listen", "127.0.0.1:0", "--set", "twin.speed=50", "--log-level", "info"])
        .current_dir(std::env::temp_dir())
        .stdout(stdout)
        .stderr(stderr);
    for (k, _) in
        std::env::vars().filter(|(k, _)| k.starts_with("MERIDIAN_") || k == "RUST_LOG" || k == "NO_COLOR")
    {
        cmd.env_remove(k);
    }
    cmd.spawn().unwrap()
}

/// One streamed request, so a request-path line with fields (`request finished`) is logged.
fn one_request(url: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = reqwest::Client::builder().no_proxy().build().unwrap();
    let text = rt.block_on(async {
        let body = serde_json::json!({
            "model": "Qwen/Qwen3-8B", "stream": true, "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
        });
        c.post(format!("{url}/v1/chat/completions")).json(&body).send().await.unwrap().text().await.unwrap()
    });
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

fn url_in(log: &str) -> Option<String> {
    Some(log.split("listening on ").nth(1)?.split_whitespace().next()?.to_owned())
}

fn assert_plain(log: &[u8]) {
    let text = String::from_utf8_lossy(log);
    assert!(text.contains("INFO") && text.contains("listening on"), "{text}");
    assert!(text.contains("request finished"), "no request-path line was logged:\n{text}");
    assert!(!log.contains(&ESC), "escape sequences in the log:\n{text:?}");
}

#[test]
fn logs_written_to_a_file_carry_no_colour_codes() {
    let path = std::env::temp_dir().join(format!("meridian-logs-{}.log", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    let mut child = meridian(Stdio::from(file.try_clone().unwrap()), Stdio::from(file));
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = loop {
        let log = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(url) = url_in(&log) {
            break url;
        }
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "meridian did not start:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    one_request(&url);
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_plain(&log);
}

#[test]
fn logs_written_to_a_pipe_carry_no_colour_codes() {
    let mut child = meridian(Stdio::piped(), Stdio::null());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut log = Vec::new();
    let url = loop {
        let mut line = Vec::new();
        let n = out.read_until(b'\n', &mut line).unwrap();
        assert!(n > 0, "meridian exited:\n{}", String::from_utf8_lossy(&log));
        log.extend_from_slice(&line);
        if let Some(url) = url_in(&String::from_utf8_lossy(&line)) {
            break url;
        }
    };
    one_request(&url);
    let _ = child.kill();
    let _ = out.read_to_end(&mut log);
    let _ = child.wait();
    assert_plain(&log);
}
