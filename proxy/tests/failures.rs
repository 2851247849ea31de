//! What clients see when things go wrong: slow, dead or truncating upstreams, clients that
//! leave (bad input has its own table: bad_input.rs). Every failure is an OpenAI-style error or a terminated stream, never a hang.

mod support;

use std::time::Duration;

use meridian_proxy::Server;
use support::*;

fn error_code(v: &serde_json::Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn no_healthy_upstream_gets_503_and_not_ready() {
    let rig = Rig::new(1).await;
    rig.mocks[0].set_healthy(false);
    eventually("upstream marked unhealthy", || !rig.proxy.state.pool.any_healthy()).await;
    let got = receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[])).await;
    assert_eq!(got.status, 503);
    assert_eq!(error_code(&got.json()), "no_healthy_upstream");
    assert_eq!(rig.client.get(rig.url("/ready")).send().await.unwrap().status(), 503);
    assert_eq!(rig.client.get(rig.url("/health")).send().await.unwrap().status(), 200);
    rig.mocks[0].set_healthy(true);
    eventually("upstream back", || rig.proxy.state.pool.any_healthy()).await;
    assert_eq!(rig.client.get(rig.url("/ready")).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn slow_first_byte_past_the_timeout_gets_504() {
    let rig = Rig::with(1, |c| c.upstream.first_byte_timeout_s = 0.3).await;
    let got =
        receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-first-byte-ms", "2000")])).await;
    assert_eq!(got.status, 504);
    assert_eq!(error_code(&got.json()), "upstream_timeout");
    assert!(
        rig.mocks[0].wait_for(Duration::from_secs(2), |r| r.len() == 1 && r[0].cancelled).await,
        "the timed-out request is cancelled upstream"
    );
}

#[tokio::test]
async fn slow_first_byte_within_the_timeout_streams_normally() {
    let rig = Rig::new(1).await;
    let got = receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-first-byte-ms", "300")])).await;
    assert_eq!(got.status, 200);
    assert!(got.text().ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn upstream_death_mid_stream_ends_with_an_error_event() {
    let rig = Rig::new(1).await;
    // Cut in the middle of an event, so the client's parser must also be resynchronised.
    let got = receive(rig.chat(
        "Qwen/Qwen3-8B",
        "qwen3-reasoning",
        &[("x-mock-die-after-bytes", "1500"), ("x-mock-split", "100")],
    ))
    .await;
    assert_eq!(got.status, 200);
    let text = got.text();
    let fixture = rig.mocks[0].fixture("qwen3-reasoning").unwrap().body.clone();
    // Everything up to the last whole line before the failure arrives; the half line does
    // not, so the stream stays well-formed.
    let whole = fixture[..1500].iter().rposition(|b| *b == b'\n').unwrap() + 1;
    assert_eq!(text.as_bytes()[..whole], fixture[..whole]);
    let tail = &text[whole..];
    assert!(tail.starts_with("data: {\"error\"") || tail.starts_with("\ndata: {\"error\""), "{tail}");
    assert!(tail.ends_with("data: [DONE]\n\n"));
    let err: serde_json::Value =
        serde_json::from_str(tail.trim_start().strip_prefix("data: ").unwrap().lines().next().unwrap())
            .unwrap();
    assert_eq!(error_code(&err), "upstream_error");
    // Every event the client can parse is valid JSON.
    for line in text.lines().filter(|l| l.starts_with("data: {")) {
        serde_json::from_str::<serde_json::Value>(&line[6..]).unwrap();
    }
    eventually("counted", || {
        sample(&rig.scrape(), "meridian_requests_total", &[("outcome", "upstream_error")]) == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn silent_upstream_is_cut_after_the_idle_timeout() {
    let rig = Rig::with(1, |c| c.upstream.idle_timeout_s = 0.3).await;
    let started = std::time::Instant::now();
    let got =
        receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-hang-after-bytes", "1000")])).await;
    assert!(started.elapsed() < Duration::from_secs(3));
    let text = got.text();
    assert!(text.contains("\"code\":\"upstream_timeout\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert!(rig.mocks[0].wait_for(Duration::from_secs(2), |r| r[0].cancelled).await);
}

#[tokio::test]
async fn refused_attempt_moves_to_another_upstream_before_the_first_byte() {
    let rig = Rig::new(2).await;
    // Whichever upstream is picked first answers 503 once; the retry lands on the other.
    let got = receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-status", "503")])).await;
    // Both mocks honour the header, so the final attempt's 503 reaches the client as is.
    assert_eq!(got.status, 503);
    let total: usize = rig.mocks.iter().map(|m| m.requests().len()).sum();
    assert_eq!(total, 2, "one attempt per upstream");
    assert_eq!(sample(&rig.scrape(), "meridian_upstream_retries_total", &[]), Some(1.0));
}

#[tokio::test]
async fn dead_upstream_is_skipped_by_retry_and_health_checks() {
    // One upstream that refuses connections (a port nothing listens on), one that works.
    let mock = meridian_mock_upstream::MockUpstream::start(Default::default()).await.unwrap();
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let dead_name = dead.trim_start_matches("http://").to_owned();
    let mut cfg = config_for(&[dead, mock.url()]);
    cfg.upstream.unhealthy_after = 1;
    let proxy = start_proxy(cfg).await;
    let client = client();
    for _ in 0..4 {
        let got = receive(
            client
                .post(format!("http://{}/v1/chat/completions", proxy.local_addr))
                .json(&serde_json::json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": []})),
        )
        .await;
        assert_eq!(got.status, 200);
    }
    assert_eq!(mock.requests().len(), 4);
    let text = proxy.state.metrics.render();
    assert_eq!(sample(&text, "meridian_upstream_healthy", &[("upstream", &dead_name)]), Some(0.0), "{text}");
    let live_name = mock.url().trim_start_matches("http://").to_owned();
    assert_eq!(sample(&text, "meridian_upstream_healthy", &[("upstream", &live_name)]), Some(1.0), "{text}");
}

#[tokio::test]
async fn request_id_is_kept_or_minted_and_sent_upstream() {
    let rig = Rig::new(1).await;
    let got =
        receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-request-id", "client-chosen-42")])).await;
    assert_eq!(got.headers["x-request-id"], "client-chosen-42");
    let got2 = receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[])).await;
    let minted = got2.headers["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(minted.len(), 32);
    let reqs = rig.mocks[0].requests();
    assert_eq!(reqs[0].header("x-request-id"), Some("client-chosen-42"));
    assert_eq!(reqs[1].header("x-request-id"), Some(minted.as_str()));
}

#[tokio::test]
async fn authorization_and_hop_by_hop_headers_stay_at_the_proxy() {
    let rig = Rig::new(1).await;
    receive(rig.chat(
        "Qwen/Qwen3-8B",
        "qwen3-reasoning",
        &[
            ("authorization", "Bearer client-secret"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("x-end-to-end", "yes"),
        ],
    ))
    .await;
    let r = &rig.mocks[0].requests()[0];
    assert_eq!(r.header("authorization"), None);
    assert_eq!(r.header("x-hop"), None);
    assert_eq!(r.header("x-end-to-end"), Some("yes"));

    let rig = Rig::with(1, |c| c.upstream.forward_authorization = true).await;
    receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("authorization", "Bearer client-secret")])).await;
    assert_eq!(rig.mocks[0].requests()[0].header("authorization"), Some("Bearer client-secret"));
}

#[tokio::test]
async fn request_body_reaches_upstream_unchanged() {
    let rig = Rig::new(1).await;
    let body = r#"{"model":"Qwen/Qwen3-8B","stream":true,"messages":[],"vllm_xargs":{"k":1},"unknown_field":[1,{"x":null}]}"#;
    receive(
        rig.client
            .post(rig.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body),
    )
    .await;
    assert_eq!(rig.mocks[0].requests()[0].body, body);
}

const CHUNK: &str = r#"data: {"id":"c1","object":"chat.completion.chunk","model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"Four"},"finish_reason":null}]}"#;
const LAST: &str = r#"data: {"id":"c1","object":"chat.completion.chunk","model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"."},"finish_reason":"stop"}]}"#;

/// What the client gets from a streamed chat request to an upstream answering `response`.
async fn through_proxy(response: String) -> (String, Server) {
    let upstream = Scripted::start(response, Close::Upstream).await;
    let proxy = start_proxy(config_for(std::slice::from_ref(&upstream.url))).await;
    let got = receive(client().post(format!("http://{}/v1/chat/completions", proxy.local_addr)).json(
        &serde_json::json!({
            "model": "Qwen/Qwen3-8B", "stream": true, "messages": [{"role": "user", "content": "2+2?"}],
        }),
    ))
    .await;
    assert_eq!(got.status, 200);
    (got.text(), proxy)
}

#[tokio::test]
async fn a_stream_that_just_stops_is_never_passed_off_as_complete() {
    let sse = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n";
    // A close-delimited body (no length, not chunked) that ends in a clean FIN after a
    // whole event; and a chunked body properly ended, but with no terminator in it.
    let close_delimited = format!("{sse}connection: close\r\n\r\n{CHUNK}\n\n{CHUNK}\n\n");
    let events = format!("{CHUNK}\n\n");
    let chunked =
        format!("{sse}transfer-encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n0\r\n\r\n", events.len());
    for response in [close_delimited, chunked] {
        let (text, proxy) = through_proxy(response).await;
        assert!(text.starts_with(CHUNK), "what came is relayed: {text}");
        let tail = text.rsplit("\n\n").filter(|e| !e.is_empty()).nth(1).unwrap();
        let err: serde_json::Value = serde_json::from_str(tail.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(error_code(&err), "upstream_truncated", "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        eventually("counted", || {
            sample(
                &proxy.state.metrics.render(),
                "meridian_requests_total",
                &[("outcome", "upstream_truncated")],
            ) == Some(1.0)
        })
        .await;
    }
}

#[tokio::test]
async fn a_chunked_body_cut_short_ends_with_an_error_event() {
    let events = format!("{CHUNK}\n\n");
    // The last chunk (`0\r\n\r\n`) never comes: the connection closes after a whole event.
    let cut = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n",
        events.len()
    );
    let (text, proxy) = through_proxy(cut).await;
    assert!(text.starts_with(CHUNK), "{text}");
    assert!(text.contains("\"code\":\"upstream_error\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    eventually("counted", || {
        sample(&proxy.state.metrics.render(), "meridian_requests_total", &[("outcome", "upstream_error")])
            == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn a_stream_finished_by_finish_reason_or_done_ends_normally() {
    let sse = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    // Some OpenAI-compatible servers send no [DONE]: a finish_reason for every choice is
    // complete too.
    for response in [format!("{sse}{CHUNK}\n\n{LAST}\n\n"), format!("{sse}{CHUNK}\n\ndata: [DONE]\n\n")] {
        let (text, proxy) = through_proxy(response).await;
        assert!(!text.contains("\"error\""), "{text}");
        eventually("counted", || {
            sample(&proxy.state.metrics.render(), "meridian_requests_total", &[("outcome", "ok")])
                == Some(1.0)
        })
        .await;
    }
}
