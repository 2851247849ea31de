//! Heartbeats through an intermediary that closes idle connections, as cloud load
//! balancers do after 60 s: a reasoning stream silent for longer (queued, prefilling a
//! long prompt, thinking without streaming) survives only because the proxy sends SSE
//! comments. Times are scaled down: the intermediary cuts after 1 s of silence, the proxy
//! beats every 250 ms.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const IDLE_CUT: Duration = Duration::from_millis(1000);

fn heartbeat(every_s: f64) -> impl FnOnce(&mut meridian_proxy::config::MeridianConfig) {
    move |c| {
        c.server.sse_heartbeat_s = every_s;
        c.upstream.idle_timeout_s = 30.0;
    }
}

/// A TCP relay to `target` that closes both sides of a connection on which no byte
/// moved either way for `idle`.
async fn idle_cutting_intermediary(target: SocketAddr, idle: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(target).await else { return };
                let (mut up, mut down) = ([0u8; 16384], [0u8; 16384]);
                loop {
                    let moved = tokio::time::timeout(idle, async {
                        tokio::select! {
                            n = client.read(&mut up) => match n {
                                Ok(n) if n > 0 => server.write_all(&up[..n]).await.is_ok(),
                                _ => false,
                            },
                            n = server.read(&mut down) => match n {
                                Ok(n) if n > 0 => client.write_all(&down[..n]).await.is_ok(),
                                _ => false,
                            },
                        }
                    })
                    .await;
                    if moved != Ok(true) {
                        return; // idle, or a side closed: both connections drop
                    }
                }
            });
        }
    });
    addr
}

fn chat_via(rig: &Rig, via: SocketAddr, mock: &[(&str, &str)]) -> reqwest::RequestBuilder {
    let body = serde_json::json!({
        "model": "Qwen/Qwen3-8B",
        "messages": [{"role": "user", "content": "What is two plus two?"}],
        "stream": true,
    });
    let mut req = rig.client.post(format!("http://{via}/v1/chat/completions")).json(&body);
    for (k, v) in mock {
        req = req.header(*k, *v);
    }
    req
}

/// A slow prefill (1.5 s before the upstream's headers), then the answer in three writes
/// 1.5 s apart, cut mid-line: silences longer than the intermediary allows.
const SILENT_UPSTREAM: [(&str, &str); 3] =
    [("x-mock-first-byte-ms", "1500"), ("x-mock-split", "700,1400"), ("x-mock-interval-ms", "1500")];

#[tokio::test]
async fn a_stream_silent_longer_than_the_idle_timeout_survives_on_heartbeats() {
    let rig = Rig::with(1, heartbeat(0.25)).await;
    let via = idle_cutting_intermediary(rig.proxy.local_addr, IDLE_CUT).await;
    let got = receive(chat_via(&rig, via, &SILENT_UPSTREAM)).await;
    assert_eq!(got.status, 200);
    assert!(got.error.is_none(), "{:?}", got.error);
    let text = got.text();
    assert!(text.ends_with("data: [DONE]\n\n"), "the whole answer arrived: {text}");
    assert!(text.starts_with(": keep-alive\n\n"), "headers went early, then a heartbeat: {text:.80}");
    assert!(text.matches(": keep-alive\n").count() >= 8, "beats through every silence: {text}");
    assert!(got.headers.contains_key("x-meridian-stream-id"), "the early head names the stream");
    // Stripped of heartbeats, the client saw exactly what the upstream sent.
    let fixture = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../mock-upstream/fixtures/qwen3-reasoning.sse"
    ))
    .unwrap();
    let data = |s: &str| s.lines().filter(|l| l.starts_with("data:")).map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(data(&text), data(&fixture));
    eventually("counted as ok", || {
        sample(&rig.scrape(), "meridian_requests_total", &[("outcome", "ok")]) == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn without_heartbeats_the_intermediary_cuts_the_same_stream() {
    let rig = Rig::with(1, heartbeat(0.0)).await;
    let via = idle_cutting_intermediary(rig.proxy.local_addr, IDLE_CUT).await;
    match chat_via(&rig, via, &SILENT_UPSTREAM).send().await {
        Err(_) => {} // cut before the headers
        Ok(resp) => {
            let body = resp.bytes().await;
            assert!(
                body.is_err() || !String::from_utf8_lossy(&body.unwrap()).contains("[DONE]"),
                "the stream should have been cut"
            );
        }
    }
}

#[tokio::test]
async fn a_failure_after_early_headers_arrives_as_an_error_event() {
    let rig = Rig::with(1, heartbeat(0.25)).await;
    let got = receive(rig.chat(
        "Qwen/Qwen3-8B",
        "qwen3-reasoning",
        &[("x-mock-first-byte-ms", "800"), ("x-mock-status", "500")],
    ))
    .await;
    assert_eq!(got.status, 200, "headers went before the upstream answered");
    let text = got.text();
    let event = text.lines().find_map(|l| l.strip_prefix("data: {")).expect("an error event");
    let error: serde_json::Value = serde_json::from_str(&format!("{{{event}")).unwrap();
    assert_eq!(error["error"]["message"], "mock error status", "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    eventually("counted as the upstream's status", || {
        sample(&rig.scrape(), "meridian_requests_total", &[("outcome", "upstream_status")]) == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn a_failure_within_one_interval_keeps_its_status() {
    let rig = Rig::with(1, heartbeat(0.5)).await;
    let got = receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-status", "500")])).await;
    assert_eq!(got.status, 500);
    assert!(!got.text().contains("keep-alive"));
}

#[tokio::test]
async fn a_request_that_does_not_stream_gets_no_early_headers() {
    let rig = Rig::with(1, heartbeat(0.25)).await;
    let body = serde_json::json!({"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "hi"}]});
    let req = rig
        .client
        .post(rig.url("/v1/chat/completions"))
        .json(&body)
        .header("x-mock-first-byte-ms", "800")
        .header("x-mock-status", "400");
    let got = receive(req).await;
    assert_eq!(got.status, 400, "its status stays the upstream's");
}

#[tokio::test]
async fn a_request_queued_for_admission_gets_heartbeats_then_its_answer() {
    let rig = Rig::with(1, |c| {
        heartbeat(0.25)(c);
        c.admission.enabled = true;
        c.admission.max_streams = Some(1);
        c.admission.queue_timeout_s = 30.0;
    })
    .await;
    let via = idle_cutting_intermediary(rig.proxy.local_addr, IDLE_CUT).await;
    // The one slot is busy for ~2.5 s (the fixture in writes 500 ms apart).
    let busy = tokio::spawn(receive(rig.chat(
        "Qwen/Qwen3-8B",
        "qwen3-reasoning",
        &[("x-mock-split", "1500,3000,4500,5500"), ("x-mock-interval-ms", "500")],
    )));
    eventually("the slot taken", || {
        sample(&rig.scrape(), "meridian_upstream_in_flight", &[]).unwrap_or(0.0) >= 1.0
    })
    .await;
    let queued = receive(chat_via(&rig, via, &[])).await;
    assert_eq!(queued.status, 200);
    let text = queued.text();
    assert!(text.starts_with(": keep-alive\n\n"), "{text:.80}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(busy.await.unwrap().text().ends_with("data: [DONE]\n\n"));
}
