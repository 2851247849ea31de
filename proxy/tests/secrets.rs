//! Secrets stay secret: the `meridian` binary, logging at `trace`, with an upstream API
//! key and a hook token in its environment, serves streams, upstream refusals, bad
//! requests and a hook that refuses the token, and no secret (those two, the admin token) appears in anything an
//! operator or a client can read (logs, responses, error bodies, metrics) — while both
//! are verifiably in use on the wire.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use meridian_mock_upstream::MockUpstream;

const UPSTREAM_KEY: &str = "sk-upstream-7f3a91c2e5d8";
const HOOK_TOKEN: &str = "hook-token-4b6e0d9a1c73";
const ADMIN_TOKEN: &str = "admin-token-93f1c0b7e25d";

/// A hook that records the authorization it was offered and refuses it.
async fn refusing_hook(seen: Arc<Mutex<Vec<String>>>) -> String {
    let hello = {
        let seen = seen.clone();
        get(move |h: HeaderMap| async move {
            let auth = h.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
            seen.lock().unwrap().push(auth);
            StatusCode::UNAUTHORIZED
        })
    };
    let app = axum::Router::new()
        .route("/meridian/v1/hello", hello)
        .route("/meridian/v1/directives", post(|| async { StatusCode::UNAUTHORIZED }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[test]
fn no_secret_reaches_logs_responses_or_metrics() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mock, hook_addr, hook_seen) = rt.block_on(async {
        let mock = MockUpstream::start(Default::default()).await.unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hook = refusing_hook(seen.clone()).await;
        (mock, hook, seen)
    });
    let endpoints = format!(r#"upstream.endpoints=[{{url = "{}", hook = "{hook_addr}"}}]"#, mock.url());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_meridian"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("MERIDIAN_") || k == "RUST_LOG") {
        cmd.env_remove(k);
    }
    let mut child = cmd
        .args(["serve", "--listen", "127.0.0.1:0", "--log-level", "trace", "--set", &endpoints])
        .args([
            "--set",
            "upstream.api_key_env=\"MERIDIAN_TEST_UPSTREAM_KEY\"",
            "--set",
            "upstream.health_interval_s=0.2",
            "--set",
            "admin.listen=\"127.0.0.1:0\"",
        ])
        .env("MERIDIAN_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("MERIDIAN_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
        .env("MERIDIAN_HOOK_TOKEN", HOOK_TOKEN)
        .current_dir(std::env::temp_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut log = String::new();
    let (mut url, mut admin) = (None, None);
    while url.is_none() || admin.is_none() {
        let line = lines.next().expect("meridian exited").unwrap();
        log.push_str(&line);
        log.push('\n');
        if let Some(rest) = line.split("listening on ").nth(1) {
            url = rest.split_whitespace().next().map(str::to_owned);
        }
        if let Some(rest) = line.split("admin listener on ").nth(1) {
            admin = rest.split_whitespace().next().map(str::to_owned);
        }
    }
    let (url, admin) = (url.unwrap(), admin.unwrap());
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        for line in lines.map_while(Result::ok) {
            s.push_str(&line);
            s.push('\n');
        }
        s
    });

    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let seen_by_client = rt.block_on(async {
        // Health rounds offer the hook the token (refused) while requests go through.
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        let chat = serde_json::json!({"model": "Qwen/Qwen3-8B", "stream": true,
                                      "messages": [{"role": "user", "content": "hi"}]});
        let mut seen = String::new();
        for headers in [vec![], vec![("x-mock-status", "401")], vec![("x-mock-status", "500")]] {
            let mut req = client.post(format!("{url}/v1/chat/completions")).json(&chat);
            for (k, v) in headers {
                req = req.header(k, v);
            }
            let resp = req.send().await.unwrap();
            seen.push_str(&format!("{:?}\n", resp.headers()));
            seen.push_str(&resp.text().await.unwrap());
        }
        for (path, body) in [("/v1/chat/completions", "{not json"), ("/v1/completions", r#"{"model":7}"#)] {
            let resp = client.post(format!("{url}{path}")).body(body).send().await.unwrap();
            seen.push_str(&resp.text().await.unwrap());
        }
        for path in ["/v1/models", "/metrics", "/ready", "/health"] {
            seen.push_str(&client.get(format!("{url}{path}")).send().await.unwrap().text().await.unwrap());
        }
        // The admin listener, refused and answered.
        for token in ["wrong-token", ADMIN_TOKEN] {
            let resp = client.get(&admin).bearer_auth(token).send().await.unwrap();
            seen.push_str(&format!("{} {:?}\n", resp.status(), resp.headers()));
            seen.push_str(&resp.text().await.unwrap());
        }
        seen
    });
    let _ = child.kill();
    let _ = child.wait();
    log.push_str(&out_reader.join().unwrap());
    log.push_str(&err_reader.join().unwrap());

    // The secrets were in use: the upstream got the key, the hook was offered the token.
    let upstream_auth: Vec<String> =
        mock.requests().iter().filter_map(|r| r.headers.get("authorization").cloned()).collect();
    assert!(upstream_auth.iter().any(|a| a == &format!("Bearer {UPSTREAM_KEY}")), "{upstream_auth:?}");
    assert!(hook_seen.lock().unwrap().iter().any(|a| a == &format!("Bearer {HOOK_TOKEN}")));
    assert!(log.contains("TRACE") || log.contains("DEBUG"), "logging at trace: {log}");
    assert!(seen_by_client.contains("meridian_requests_total"), "metrics were read");
    assert!(
        seen_by_client.contains("401 ") && seen_by_client.contains("\"open\""),
        "admin answered: {seen_by_client}"
    );
    for secret in [UPSTREAM_KEY, HOOK_TOKEN, ADMIN_TOKEN] {
        // Any sizeable piece of it, not only the whole (a truncated or quoted copy).
        for piece in secret.as_bytes().windows(12) {
            let piece = std::str::from_utf8(piece).unwrap();
            assert!(!log.contains(piece), "a log line holds part of a secret ({piece}):\n{log}");
            assert!(!seen_by_client.contains(piece), "a response holds part of a secret ({piece})");
        }
    }
}
