//! Graceful drain of the `meridian` binary on SIGTERM, with 200 streams in flight: no
//! stream is lost. Each either completes or, when the grace runs out first, ends with a
//! `server_shutting_down` error event; readiness fails at once, no new request is taken,
//! and the process exits.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use meridian_mock_upstream::MockUpstream;

mod support;

const STREAMS: usize = 200;

struct Meridian {
    child: Child,
    url: String,
}

impl Meridian {
    fn start(upstream: &str, grace_s: f64) -> Meridian {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_meridian"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("MERIDIAN_") || k == "RUST_LOG") {
            cmd.env_remove(k);
        }
        let mut child = cmd
            .args(["serve", "--listen", "127.0.0.1:0", "--log-level", "warn", "--upstream", upstream])
            .args(["--set", &format!("server.shutdown_grace_s={grace_s}")])
            .args(["--set", "upstream.idle_timeout_s=60"])
            .current_dir(std::env::temp_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("meridian exited").unwrap();
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap().to_owned();
            }
        };
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        Meridian { child, url }
    }

    fn sigterm(&self) {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, at most `within`.
    fn exited_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Meridian {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a stream ended, as its client saw it.
#[derive(Debug, PartialEq)]
enum Ending {
    Completed,
    ShuttingDown,
    Lost(String),
}

/// Opens `STREAMS` streamed chats with these mock headers and returns, once every one
/// has had its first bytes, the tasks that read each to its end.
async fn open_streams(
    client: &reqwest::Client,
    url: &str,
    mock: &'static [(&'static str, &'static str)],
) -> Vec<tokio::task::JoinHandle<Ending>> {
    let (started_tx, mut started_rx) = tokio::sync::mpsc::channel::<()>(STREAMS);
    let body = serde_json::json!({"model": "Qwen/Qwen3-8B", "stream": true,
                                  "messages": [{"role": "user", "content": "hi"}]});
    let tasks: Vec<_> = (0..STREAMS)
        .map(|_| {
            let mut req = client.post(format!("{url}/v1/chat/completions")).json(&body);
            for (k, v) in mock {
                req = req.header(*k, *v);
            }
            let started = started_tx.clone();
            tokio::spawn(async move {
                let resp = match req.send().await {
                    Ok(r) => r,
                    Err(e) => return Ending::Lost(format!("request: {e}")),
                };
                let mut stream = resp.bytes_stream();
                let mut text = Vec::new();
                let mut first = true;
                while let Some(chunk) = stream.next().await {
                    match chunk {
                        Ok(b) => text.extend_from_slice(&b),
                        Err(e) => return Ending::Lost(format!("cut: {e}")),
                    }
                    if std::mem::take(&mut first) {
                        let _ = started.send(()).await;
                    }
                }
                let text = String::from_utf8_lossy(&text);
                if !text.ends_with("data: [DONE]\n\n") {
                    Ending::Lost(format!("no [DONE]: {}", &text[text.len().saturating_sub(200)..]))
                } else if text.contains(r#""code":"server_shutting_down""#) {
                    Ending::ShuttingDown
                } else if text.contains(r#""error""#) {
                    Ending::Lost(format!("another error: {text}"))
                } else {
                    Ending::Completed
                }
            })
        })
        .collect();
    for _ in 0..STREAMS {
        tokio::time::timeout(Duration::from_secs(30), started_rx.recv()).await.expect("every stream started");
    }
    tasks
}

/// Readiness and new requests fail once the drain began: refused connections, or 503.
async fn refuses_new_work(client: &reqwest::Client, url: &str) -> bool {
    let ready = client.get(format!("{url}/ready")).send().await;
    let chat = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&serde_json::json!({"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await;
    [ready, chat].into_iter().all(|r| r.map_or(true, |r| r.status() == 503))
}

fn fresh_client() -> reqwest::Client {
    // A new connection per request: what a load balancer's probe or a new client opens.
    reqwest::Client::builder().no_proxy().pool_max_idle_per_host(0).build().unwrap()
}

#[test]
fn sigterm_lets_200_open_streams_finish() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockUpstream::start(Default::default())).unwrap();
    let mut meridian = Meridian::start(&mock.url(), 20.0);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    rt.block_on(async {
        // Each stream takes about 1.5 s: one event every 50 ms.
        let tasks = open_streams(&client, &meridian.url, &[("x-mock-interval-ms", "50")]).await;
        let sent = Instant::now();
        meridian.sigterm();
        let probe = fresh_client();
        let mut refused = false;
        while !refused && sent.elapsed() < Duration::from_millis(500) {
            refused = refuses_new_work(&probe, &meridian.url).await;
        }
        assert!(refused, "readiness still passed or a new request was taken 500 ms after SIGTERM");
        let endings: Vec<Ending> =
            futures::future::join_all(tasks).await.into_iter().map(Result::unwrap).collect();
        let completed = endings.iter().filter(|e| **e == Ending::Completed).count();
        assert_eq!(completed, STREAMS, "every stream completes within the grace: {endings:?}");
    });
    assert!(meridian.exited_within(Duration::from_secs(5)), "the process exits once its streams are done");
}

#[test]
fn streams_open_when_the_grace_runs_out_end_with_an_error_event() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(MockUpstream::start(Default::default())).unwrap();
    let mut meridian = Meridian::start(&mock.url(), 1.0);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let sent = rt.block_on(async {
        // Streams the upstream never finishes.
        let tasks = open_streams(&client, &meridian.url, &[("x-mock-hang-after-bytes", "600")]).await;
        let sent = Instant::now();
        meridian.sigterm();
        let endings: Vec<Ending> =
            futures::future::join_all(tasks).await.into_iter().map(Result::unwrap).collect();
        let ended = endings.iter().filter(|e| **e == Ending::ShuttingDown).count();
        assert_eq!(ended, STREAMS, "every stream ends with the shutdown error event: {endings:?}");
        assert!(sent.elapsed() >= Duration::from_millis(900), "not before the grace: {:?}", sent.elapsed());
        sent
    });
    assert!(meridian.exited_within(Duration::from_secs(4)), "exits soon after the grace");
    assert!(sent.elapsed() < Duration::from_secs(5));
    // The proxy gave up its upstream requests, so the engine stops generating for them.
    assert!(
        rt.block_on(
            mock.wait_for(Duration::from_secs(2), |r| r.iter().filter(|r| r.cancelled).count() == STREAMS)
        ),
        "upstream requests cancelled"
    );
}

#[tokio::test]
async fn readiness_says_draining_once_the_drain_began() {
    let rig = support::Rig::new(1).await;
    assert_eq!(rig.client.get(rig.url("/ready")).send().await.unwrap().status(), 200);
    rig.proxy.state.drain.begin();
    let resp = rig.client.get(rig.url("/ready")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.json::<serde_json::Value>().await.unwrap()["status"], "draining");
    let chat = rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[]).send().await.unwrap();
    assert_eq!(chat.status(), 503, "a request that still arrives is refused");
    let body: serde_json::Value = chat.json().await.unwrap();
    assert_eq!(body["error"]["code"], "server_shutting_down");
}
