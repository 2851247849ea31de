//! Clients that leave: whenever a client's connection closes (mid-stream, while its
//! request waits for admission, or while the upstream has not answered yet), the proxy
//! notices within 100 ms, gives up the request's place or its upstream request, and
//! counts the outcome `client_disconnected`.

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use support::*;
use tokio::io::AsyncWriteExt;

/// The most a departure may take to be noticed (the issue's bound; loopback and a
/// dropped handler normally take well under a millisecond).
const NOTICED_WITHIN: Duration = Duration::from_millis(100);

/// Opens a raw connection and sends a streamed chat request on it, so the test decides
/// the instant the client goes (dropping the socket closes it at once).
async fn raw_request(rig: &Rig, extra_headers: &str) -> tokio::net::TcpStream {
    let body =
        r#"{"model": "Qwen/Qwen3-8B", "stream": true, "messages": [{"role": "user", "content": "hi"}]}"#;
    let mut sock = tokio::net::TcpStream::connect(rig.proxy.local_addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: meridian\r\ncontent-type: application/json\r\n\
         x-mock-fixture: qwen3-reasoning\r\n{extra_headers}content-length: {}\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(body.as_bytes()).await.unwrap();
    sock
}

/// How long after `since` the condition first held, polling every millisecond; panics
/// after two seconds.
async fn held_after(since: Instant, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    while !cond() {
        assert!(since.elapsed() < Duration::from_secs(2), "never: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    since.elapsed()
}

fn disconnects(rig: &Rig) -> f64 {
    sample(&rig.scrape(), "meridian_requests_total", &[("outcome", "client_disconnected")]).unwrap_or(0.0)
}

#[tokio::test]
async fn client_disconnect_mid_stream_cancels_upstream() {
    let rig = Rig::new(1).await;
    let resp =
        rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-interval-ms", "50")]).send().await.unwrap();
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    drop(stream);
    assert!(
        rig.mocks[0].wait_for(Duration::from_secs(2), |r| r.len() == 1 && r[0].cancelled).await,
        "upstream saw the cancel: {:?}",
        rig.mocks[0].requests()
    );
    eventually("disconnect counted", || {
        sample(&rig.scrape(), "meridian_requests_total", &[("outcome", "client_disconnected")]) == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn a_client_that_leaves_before_the_upstream_answers_aborts_it_at_once() {
    // The engine sends its headers with the first token, five seconds away.
    let rig = Rig::new(1).await;
    let sock = raw_request(&rig, "x-mock-first-byte-ms: 5000\r\n").await;
    held_after(Instant::now(), "request upstream", || rig.mocks[0].requests().len() == 1).await;
    let left = Instant::now();
    drop(sock);
    let took = held_after(left, "upstream request cancelled", || rig.mocks[0].requests()[0].cancelled).await;
    assert!(took < NOTICED_WITHIN, "the upstream request was aborted {took:?} after the client left");
    held_after(left, "departure counted", || disconnects(&rig) == 1.0).await;
}

#[tokio::test]
async fn a_client_that_leaves_while_queued_leaves_the_queue_at_once() {
    let rig = Rig::with(1, |c| {
        c.admission.enabled = true;
        c.admission.max_streams = Some(1);
        c.admission.queue_timeout_s = 30.0;
        c.upstream.idle_timeout_s = 30.0;
    })
    .await;
    // One stream the mock never finishes holds the only slot.
    let held = rig
        .chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-hang-after-bytes", "10")])
        .send()
        .await
        .unwrap();
    let queued = || sample(&rig.scrape(), "meridian_admission_queued", &[("class", "interactive")]);
    let sock = raw_request(&rig, "").await;
    held_after(Instant::now(), "request queued", || queued() == Some(1.0)).await;
    let left = Instant::now();
    drop(sock);
    let took = held_after(left, "queue empty", || queued() == Some(0.0)).await;
    assert!(took < NOTICED_WITHIN, "the request left the queue {took:?} after its client");
    held_after(left, "departure counted", || disconnects(&rig) == 1.0).await;
    assert_eq!(rig.mocks[0].requests().len(), 1, "the departed request never went upstream");
    drop(held);
}

#[tokio::test]
async fn a_client_that_hangs_up_after_its_answers_end_is_counted_answered() {
    // The engine sends the whole stream, `[DONE]` included, and then keeps its body open
    // a while, as a busy server may before it closes; the client (like the `openai`
    // client) hangs up as soon as it reads `[DONE]`. It had its whole answer.
    let rig = Rig::new(1).await;
    let whole = meridian_mock_upstream::builtin_fixtures()["qwen3-reasoning"].body.len().to_string();
    let resp = rig
        .chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-hang-after-bytes", whole.as_str())])
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("data: [DONE]") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
        seen.extend_from_slice(&chunk.expect("the stream reached [DONE]").unwrap().unwrap());
    }
    drop(stream);
    let answered = || sample(&rig.scrape(), "meridian_requests_total", &[("outcome", "ok")]) == Some(1.0);
    held_after(Instant::now(), "the answer counted ok", answered).await;
    assert_eq!(disconnects(&rig), 0.0, "an answer read to its end is not a departure");
}
