//! Bad input, tabulated: each test is one row of the book's table
//! (docs/src/bad-input.md), which a docs test keeps in step with this file. Every row
//! gets an OpenAI-style 4xx/5xx or error event, the proxy keeps serving, and no upstream
//! connection is left open.

mod support;

use std::time::{Duration, Instant};

use support::*;

const MODEL: &str = "Qwen/Qwen3-8B";

fn error_of(v: &serde_json::Value) -> (&str, &str, Option<&str>) {
    let e = &v["error"];
    (e["type"].as_str().unwrap_or(""), e["code"].as_str().unwrap_or(""), e["param"].as_str())
}

/// Sends `body` as a chat request; returns what came back.
async fn post(rig: &Rig, body: impl Into<reqwest::Body>) -> Received {
    receive(
        rig.client
            .post(rig.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body),
    )
    .await
}

/// The proxy still answers a good request, and nothing bad went upstream before it.
async fn still_serving(rig: &Rig) {
    assert!(rig.mocks[0].requests().is_empty(), "nothing bad reaches the upstream");
    let got = receive(rig.chat(MODEL, "qwen3-reasoning", &[])).await;
    assert_eq!(got.status, 200);
    assert!(got.text().ends_with("data: [DONE]\n\n"));
}

/// A 400 in OpenAI's shape with this code and param, and the request id to quote.
fn assert_400(got: &Received, code: &str, param: Option<&str>, what: &str) {
    assert_eq!(got.status, 400, "{what}: {}", got.text());
    let v = got.json();
    assert_eq!(error_of(&v), ("invalid_request_error", code, param), "{what}: {v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.len() > 10), "{what}: {v}");
    assert!(got.headers.contains_key("x-request-id"), "{what}");
}

#[tokio::test]
async fn request_body_that_is_not_json() {
    let rig = Rig::new(1).await;
    // The last one ends inside a string, right after a backslash (the request_body fuzz
    // target found it panicking the nesting check).
    for body in ["{not json", "[1,2,3]", "", "null", r#"{"model":"m""#, r#"{"model":"m\"#] {
        assert_400(&post(&rig, body).await, "invalid_json", None, body);
    }
    still_serving(&rig).await;
}

#[tokio::test]
async fn invalid_utf8_in_the_request_body() {
    let rig = Rig::new(1).await;
    // In a field the proxy reads, in one it never reads (which it would otherwise relay
    // verbatim), and outside any string.
    for body in [
        &b"{\"model\":\"Qwen/Qwen3-8B\xff\",\"messages\":[]}"[..],
        b"{\"model\":\"Qwen/Qwen3-8B\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}",
        b"{\"model\":\"Qwen/Qwen3-8B\",\xc3\x28:1}",
    ] {
        let got = post(&rig, body.to_vec()).await;
        assert_400(&got, "invalid_json", None, &String::from_utf8_lossy(body));
        assert!(got.json()["error"]["message"].as_str().unwrap().contains("UTF-8"), "{}", got.text());
    }
    still_serving(&rig).await;
}

#[tokio::test]
async fn deeply_nested_json() {
    let rig = Rig::new(1).await;
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    // Far past serde_json's recursion limit, in a field the proxy reads and in one it
    // skips: a 400, not a stack overflow.
    for (field, n) in [("model", 100_000), ("messages", 100_000), ("x_unknown", 100_000), ("x_unknown", 129)]
    {
        let body = format!(r#"{{"model":"{MODEL}","{field}":{}}}"#, deep(n));
        let body = if field == "model" { format!(r#"{{"model":{}}}"#, deep(n)) } else { body };
        let got = post(&rig, body).await;
        assert_eq!(got.status, 400, "{field} nested {n} deep: {}", got.text());
        assert_eq!(error_of(&got.json()).0, "invalid_request_error");
    }
    still_serving(&rig).await;
}

#[tokio::test]
async fn wrong_types_in_known_fields() {
    let rig = Rig::new(1).await;
    for (field, value, code) in [
        ("model", "42", "invalid_model"),
        ("stream", r#""yes""#, "invalid_type"),
        ("max_tokens", r#""ten""#, "invalid_type"),
        ("max_tokens", "12.5", "invalid_type"),
        ("max_completion_tokens", "[1]", "invalid_type"),
        ("messages", "5", "invalid_type"),
        ("messages", r#""hi""#, "invalid_type"),
        ("prompt", "{}", "invalid_type"),
        ("chat_template_kwargs", r#""off""#, "invalid_type"),
        ("chat_template_kwargs", r#"{"enable_thinking":"no"}"#, "invalid_type"),
        ("thinking_token_budget", "-1", "invalid_type"),
        ("priority", r#""high""#, "invalid_type"),
        ("meridian", r#"{"class":"urgent"}"#, "invalid_json"),
        ("meridian", r#"{"think_budget":100}"#, "invalid_json"),
    ] {
        let body = if field == "model" {
            format!(r#"{{"model":{value},"messages":[]}}"#)
        } else {
            format!(r#"{{"model":"{MODEL}","messages":[],"{field}":{value}}}"#)
        };
        let body = body.replacen(r#","messages":[],"messages""#, r#","messages""#, 1);
        assert_400(&post(&rig, body).await, code, Some(field), &format!("{field} = {value}"));
    }
    still_serving(&rig).await;
}

#[tokio::test]
async fn negative_zero_or_huge_max_tokens() {
    let rig = Rig::new(1).await;
    for field in ["max_tokens", "max_completion_tokens"] {
        for value in ["-1", "0", "4294967296", "99999999999999999999999999999999", "-99999999999999999999"] {
            let body = format!(r#"{{"model":"{MODEL}","messages":[],"{field}":{value}}}"#);
            let got = post(&rig, body).await;
            assert_400(&got, "invalid_value", Some(field), &format!("{field} = {value}"));
        }
    }
    still_serving(&rig).await;
    // The largest accepted value goes upstream as sent.
    let body = format!(r#"{{"model":"{MODEL}","stream":true,"messages":[],"max_tokens":4294967295}}"#);
    assert_eq!(post(&rig, body.clone()).await.status, 200);
    assert_eq!(rig.mocks[0].requests()[1].body, body);
}

#[tokio::test]
async fn unknown_model() {
    let rig = Rig::new(1).await;
    let long = "x".repeat(5000);
    for model in ["no-such-model", long.as_str()] {
        let got = post(&rig, format!(r#"{{"model":"{model}","messages":[]}}"#)).await;
        assert_eq!(got.status, 404);
        let v = got.json();
        assert_eq!(error_of(&v), ("invalid_request_error", "model_not_found", Some("model")));
        assert!(v["error"]["message"].as_str().unwrap().len() < 400, "a long name is shortened: {v}");
    }
    still_serving(&rig).await;
}

#[tokio::test]
async fn oversized_body_declared_or_streamed() {
    let rig = Rig::with(1, |c| c.server.max_body_bytes = 4096).await;
    let big =
        format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"{}"}}]}}"#, "x".repeat(8000));
    let got = post(&rig, big.clone()).await;
    assert_eq!(got.status, 413);
    assert_eq!(error_of(&got.json()), ("invalid_request_error", "request_too_large", None));
    // Without a Content-Length (chunked upload) the limit still holds.
    let pieces: Vec<_> = big.into_bytes().chunks(1000).map(|c| Ok::<_, std::io::Error>(c.to_vec())).collect();
    let got = post(&rig, reqwest::Body::wrap_stream(futures::stream::iter(pieces))).await;
    assert_eq!(got.status, 413);
    still_serving(&rig).await;
}

#[tokio::test]
async fn slow_drip_request_body() {
    let rig = Rig::with(1, |c| c.server.request_body_timeout_s = 0.5).await;
    let body = format!(r#"{{"model":"{MODEL}","messages":[]}}"#).into_bytes();
    // One byte every 100 ms: the whole body would take over 3 s.
    let drip = futures::stream::unfold(0usize, move |i| {
        let body = body.clone();
        async move {
            if i == body.len() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            Some((Ok::<_, std::io::Error>(vec![body[i]]), i + 1))
        }
    });
    let started = Instant::now();
    let got = post(&rig, reqwest::Body::wrap_stream(drip)).await;
    assert_eq!(got.status, 408, "{}", got.text());
    assert_eq!(error_of(&got.json()), ("invalid_request_error", "request_timeout", None));
    assert!(started.elapsed() < Duration::from_secs(2), "refused at the deadline, not at the end");
    eventually("counted", || {
        sample(&rig.scrape(), "meridian_requests_total", &[("outcome", "bad_request")]) == Some(1.0)
    })
    .await;
    still_serving(&rig).await;
}

#[tokio::test]
async fn oversized_request_headers() {
    let rig = Rig::new(1).await;
    // Past server.max_header_bytes (64 KiB): the proxy's own 431, in OpenAI's shape.
    let huge = "a".repeat(128 * 1024);
    let got = receive(rig.chat(MODEL, "qwen3-reasoning", &[("x-huge", huge.as_str())])).await;
    assert_eq!(got.status, 431, "{}", got.text());
    assert_eq!(error_of(&got.json()), ("invalid_request_error", "request_headers_too_large", None));
    assert!(got.headers.contains_key("x-request-id"));
    // Past hyper's read buffer, or past its 100 header fields, hyper answers 431 itself,
    // without a body, before any handler runs.
    let enormous = "a".repeat(1024 * 1024);
    let got = receive(rig.chat(MODEL, "qwen3-reasoning", &[("x-huge", enormous.as_str())])).await;
    assert_eq!(got.status, 431);
    let names: Vec<String> = (0..150).map(|i| format!("x-many-{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    let got = receive(rig.chat(MODEL, "qwen3-reasoning", &many)).await;
    assert_eq!(got.status, 431);
    still_serving(&rig).await;
}

#[tokio::test]
async fn slow_request_headers() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rig = Rig::with(1, |c| c.server.header_read_timeout_s = 0.5).await;
    // Half a request head, then nothing: the connection is closed at the deadline
    // instead of being held (with its file descriptor) for as long as the client likes.
    let mut sock = tokio::net::TcpStream::connect(rig.proxy.local_addr).await.unwrap();
    sock.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: app").await.unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "still open after 5 s");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(2),
        "closed after {waited:?}"
    );
    let said = String::from_utf8_lossy(&buf);
    assert!(said.is_empty() || said.starts_with("HTTP/1.1 408"), "{said}");
    still_serving(&rig).await;
}

// --- what upstreams send -------------------------------------------------------------

const CHUNK: &str = r#"data: {"id":"c1","object":"chat.completion.chunk","model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"Four"},"finish_reason":null}]}"#;
const LAST: &str = r#"data: {"id":"c1","object":"chat.completion.chunk","model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"."},"finish_reason":"stop"}]}"#;

/// An HTTP/1.1 response with a `connection: close` head and a length, so the proxy, not
/// the upstream, ends the connection.
fn response(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// A streamed (or not) chat request through a proxy in front of `upstream`.
async fn through(
    upstream: &Scripted,
    stream: bool,
    tweak: impl FnOnce(&mut meridian_proxy::config::MeridianConfig),
) -> (Received, meridian_proxy::Server) {
    let mut cfg = config_for(std::slice::from_ref(&upstream.url));
    tweak(&mut cfg);
    let proxy = start_proxy(cfg).await;
    let got = receive(client().post(format!("http://{}/v1/chat/completions", proxy.local_addr)).json(
        &serde_json::json!({"model": MODEL, "stream": stream, "messages": [{"role": "user", "content": "2+2?"}]}),
    ))
    .await;
    (got, proxy)
}

/// The upstream connection was let go, and the outcome counted.
async fn released_and_counted(upstream: &Scripted, proxy: &meridian_proxy::Server, outcome: &str) {
    assert_eq!(upstream.posts(), 1, "one attempt");
    eventually("the upstream connection is closed", || upstream.open_connections() == 0).await;
    eventually(outcome, || {
        sample(&proxy.state.metrics.render(), "meridian_requests_total", &[("outcome", outcome)]) == Some(1.0)
    })
    .await;
}

/// The last `data:` event before `[DONE]`, parsed.
fn error_event(text: &str) -> serde_json::Value {
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let last = text.rsplit("\n\n").filter(|e| !e.trim().is_empty()).nth(1).unwrap();
    serde_json::from_str(last.trim_start().strip_prefix("data: ").unwrap()).unwrap()
}

#[tokio::test]
async fn invalid_utf8_in_an_upstream_chunk() {
    let mut events = format!("{CHUNK}\n\n").into_bytes();
    events.extend_from_slice(
        b"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xff\xfe\"}}]}\n\n",
    );
    events.extend_from_slice(format!("{LAST}\n\ndata: [DONE]\n\n").as_bytes());
    let up = Scripted::start(response("200 OK", "text/event-stream", &events), Close::Proxy).await;
    let (got, proxy) = through(&up, true, |_| {}).await;
    let text = got.text();
    assert!(text.starts_with(&format!("{CHUNK}\n\n")), "what came before is relayed: {text}");
    assert!(!got.body().contains(&0xff), "the bad bytes are not");
    let err = error_event(&text);
    assert_eq!(error_of(&err), ("server_error", "upstream_error", None));
    assert!(err["error"]["message"].as_str().unwrap().contains("not UTF-8"), "{err}");
    released_and_counted(&up, &proxy, "upstream_error").await;
}

#[tokio::test]
async fn ten_thousand_line_sse_event() {
    // One event whose data is a chunk pretty-printed over 10,000 `data:` lines (legal
    // SSE: a client joins them with newlines). It is relayed byte for byte.
    let mut big = String::from("data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[\n");
    for _ in 0..9_998 {
        big.push_str("data:  \n");
    }
    big.push_str("data: {\"index\":0,\"delta\":{\"content\":\" is\"},\"finish_reason\":null}]}\n\n");
    assert_eq!(big.lines().filter(|l| l.starts_with("data:")).count(), 10_000);
    let events = format!("{CHUNK}\n\n{big}{LAST}\n\ndata: [DONE]\n\n");
    let up = Scripted::start(response("200 OK", "text/event-stream", events.as_bytes()), Close::Proxy).await;
    let (got, proxy) = through(&up, true, |_| {}).await;
    assert_eq!(got.text(), events, "relayed untouched");
    released_and_counted(&up, &proxy, "ok").await;

    // A single line past upstream.max_response_bytes ends the stream instead of growing
    // the proxy's memory without bound.
    let line = format!("data: {{\"id\":\"c1\",\"choices\":[],\"pad\":\"{}\"}}\n\n", "x".repeat(200_000));
    let events = format!("{CHUNK}\n\n{line}{LAST}\n\ndata: [DONE]\n\n");
    let up = Scripted::start(response("200 OK", "text/event-stream", events.as_bytes()), Close::Proxy).await;
    let (got, proxy) = through(&up, true, |c| c.upstream.max_response_bytes = 65_536).await;
    let text = got.text();
    assert!(text.starts_with(&format!("{CHUNK}\n\n")), "{}", &text[..200.min(text.len())]);
    let err = error_event(&text);
    assert!(err["error"]["message"].as_str().unwrap().contains("max_response_bytes"), "{err}");
    assert!(text.len() < 10_000, "the long line is not relayed");
    released_and_counted(&up, &proxy, "upstream_error").await;
}

#[tokio::test]
async fn upstream_answers_html() {
    let page = b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>nginx</body>\r\n</html>\r\n";
    for (status, stream) in
        [("200 OK", true), ("200 OK", false), ("500 Internal Server Error", true), ("404 Not Found", false)]
    {
        let up = Scripted::start(response(status, "text/html", page), Close::Proxy).await;
        let (got, proxy) = through(&up, stream, |_| {}).await;
        assert_eq!(got.status, 502, "{status}: {}", got.text());
        let v = got.json();
        assert_eq!(error_of(&v), ("server_error", "upstream_error", None), "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("not JSON") && message.contains("text/html"), "{message}");
        assert!(
            message.contains("<title>502 Bad Gateway</title>"),
            "quotes what the upstream said: {message}"
        );
        released_and_counted(&up, &proxy, "upstream_error").await;
    }
}

#[tokio::test]
async fn upstream_answers_garbage() {
    // Not HTTP at all.
    let up = Scripted::start(b"\x00\x01garbage that is not HTTP\r\n\r\n".to_vec(), Close::Upstream).await;
    let (got, proxy) = through(&up, true, |c| c.upstream.max_attempts = 1).await;
    assert_eq!(got.status, 502, "{}", got.text());
    assert_eq!(error_of(&got.json()).1, "upstream_error");
    released_and_counted(&up, &proxy, "upstream_error").await;

    // JSON's content type, not JSON's bytes; and an empty error.
    for (status, body) in
        [("200 OK", &b"{\"id\": \"c1\", \"choices\": [tru"[..]), ("503 Service Unavailable", b"")]
    {
        let up = Scripted::start(response(status, "application/json", body), Close::Proxy).await;
        let (got, proxy) = through(&up, false, |c| c.upstream.max_attempts = 1).await;
        assert_eq!(got.status, 502, "{status}: {}", got.text());
        assert_eq!(error_of(&got.json()).1, "upstream_error");
        released_and_counted(&up, &proxy, "upstream_error").await;
    }

    // An event stream of lines that are not events: relayed as sent, and since it never
    // finishes, it ends with upstream_truncated rather than passing for a whole answer.
    let noise = "\u{1}\u{2} what\n???\ndata: {{{{\n\n";
    let up = Scripted::start(response("200 OK", "text/event-stream", noise.as_bytes()), Close::Proxy).await;
    let (got, proxy) = through(&up, true, |_| {}).await;
    let text = got.text();
    assert!(text.starts_with(noise), "{text}");
    assert_eq!(error_of(&error_event(&text)).1, "upstream_truncated");
    released_and_counted(&up, &proxy, "upstream_truncated").await;
}

#[tokio::test]
async fn oversized_whole_answer() {
    let body = format!(r#"{{"id":"c1","choices":[],"pad":"{}"}}"#, "x".repeat(100_000));
    let up = Scripted::start(response("200 OK", "application/json", body.as_bytes()), Close::Proxy).await;
    let (got, proxy) = through(&up, false, |c| c.upstream.max_response_bytes = 65_536).await;
    assert_eq!(got.status, 502, "{}", got.text());
    let v = got.json();
    assert_eq!(error_of(&v).1, "upstream_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("max_response_bytes"), "{v}");
    released_and_counted(&up, &proxy, "upstream_error").await;
}

#[tokio::test]
async fn an_oversized_body_is_refused_before_any_route_in_its_apis_shape() {
    let rig = Rig::with(1, |c| c.server.max_body_bytes = 4096).await;
    let big = "x".repeat(8000);
    // A route the proxy only passes through gets the limit too.
    let got = receive(rig.client.post(rig.url("/v1/embeddings")).body(big.clone())).await;
    assert_eq!(got.status, 413);
    assert_eq!(error_of(&got.json()), ("invalid_request_error", "request_too_large", None));
    let got = receive(rig.client.post(rig.url("/v1/messages")).body(big)).await;
    assert_eq!(got.status, 413);
    let error = got.json();
    assert_eq!(
        (&error["type"], &error["error"]["type"]),
        (&serde_json::json!("error"), &serde_json::json!("invalid_request_error")),
        "Anthropic's shape"
    );
    assert!(rig.mocks[0].requests().is_empty(), "nothing reached the engine");
}

#[tokio::test]
async fn upstream_error_event_mid_stream() {
    let dir = std::env::temp_dir().join(format!("meridian-apis-chat-err-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let recorded = meridian_mock_upstream::builtin_fixtures()["qwen3-reasoning"].body.clone();
    let text = String::from_utf8(recorded.to_vec()).unwrap();
    // Some reasoning, then what vLLM 0.32 sends when generation fails mid-stream
    // (`create_streaming_error_response`), then its end marker.
    let events: Vec<&str> = text.split_inclusive("\n\n").collect();
    let failing = format!(
        "{}data: {{\"error\":{{\"message\":\"Internal server error\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}}}\n\ndata: [DONE]\n\n",
        events[..4].concat()
    );
    std::fs::write(dir.join("chat-failing.sse"), failing).unwrap();
    let mock = meridian_mock_upstream::MockUpstream::start(meridian_mock_upstream::MockOptions {
        fixtures_dir: Some(dir.clone()),
        ..mock_options()
    })
    .await
    .unwrap();
    let proxy = start_proxy(config_for(&[mock.url()])).await;
    let url = format!("http://{}/v1/chat/completions", proxy.local_addr);
    let body =
        serde_json::json!({"model": MODEL, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let got = receive(client().post(url).json(&body).header("x-mock-fixture", "chat-failing")).await;
    let text = got.text();
    assert!(text.contains("Internal server error") && text.trim_end().ends_with("data: [DONE]"), "{text}");
    let state = proxy.state.clone();
    eventually("counted as the upstream's failure, not ok", || {
        let text = state.render_metrics();
        let count = |outcome| {
            sample(&text, "meridian_requests_total", &[("route", "chat_completions"), ("outcome", outcome)])
        };
        count("upstream_error") == Some(1.0) && count("ok").is_none()
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}
