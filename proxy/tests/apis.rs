//! The Responses API (`/v1/responses`) and Anthropic's Messages API (`/v1/messages`)
//! through the proxy, replaying streams recorded from vLLM 0.32 (see
//! `mock-upstream/fixtures/README.md`): relayed byte for byte, tracked phase by phase
//! like chat, given priorities, refused with a clear error when malformed, and ended
//! with the API's own error event when the upstream breaks.

mod support;

use meridian_mock_upstream::{MockOptions, MockUpstream};
use serde_json::{Value, json};
use support::*;

/// One API: its path, the fixture the mock replays on it, and a request body.
struct Api {
    path: &'static str,
    route: &'static str,
    fixture: &'static str,
}

const RESPONSES: Api = Api { path: "/v1/responses", route: "responses", fixture: "responses-reasoning" };
const MESSAGES: Api = Api { path: "/v1/messages", route: "messages", fixture: "messages-thinking" };

impl Api {
    fn body(&self, stream: bool) -> Value {
        match self.route {
            "responses" => json!({"model": "tiny-qwen3", "input": "What is two plus two?", "stream": stream}),
            _ => json!({"model": "tiny-qwen3", "max_tokens": 40, "stream": stream,
                        "messages": [{"role": "user", "content": "What is two plus two?"}]}),
        }
    }
}

/// The `data:` payloads of an SSE body.
fn events(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// How many events of the recorded stream carry thinking, and how many answer text.
fn recorded_deltas(api: &Api, body: &[u8]) -> (usize, usize) {
    let events = events(body);
    let count = |pred: &dyn Fn(&Value) -> bool| events.iter().filter(|e| pred(e)).count();
    match api.route {
        "responses" => (
            count(&|e| e["type"] == "response.reasoning_text.delta"),
            count(&|e| e["type"] == "response.output_text.delta"),
        ),
        _ => (
            count(&|e| e["delta"]["type"] == "thinking_delta"),
            count(&|e| e["delta"]["type"] == "text_delta"),
        ),
    }
}

async fn counted_ok_once(rig: &Rig, route: &str) {
    eventually("the request is counted", || {
        sample(&rig.scrape(), "meridian_requests_total", &[("route", route), ("outcome", "ok")]) == Some(1.0)
    })
    .await;
}

fn histogram(text: &str, name: &str, family: &str, part: &str) -> f64 {
    sample(text, &format!("{name}_{part}"), &[("family", family)]).unwrap_or(0.0)
}

#[tokio::test]
async fn streams_are_relayed_unchanged_and_tracked_from_think_to_output() {
    let rig = Rig::new(1).await;
    for (n, api) in [RESPONSES, MESSAGES].iter().enumerate() {
        let got = receive(rig.client.post(rig.url(api.path)).json(&api.body(true))).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let recorded = rig.mocks[0].fixture(api.fixture).unwrap().body.clone();
        assert_eq!(got.body(), recorded.to_vec(), "{}: every byte as the engine sent it", api.route);
        assert!(got.headers.contains_key("x-meridian-stream-id"));
        counted_ok_once(&rig, api.route).await;
        let text = rig.scrape();
        // The phase switch was seen: time to first visible output and the think-to-output
        // gap are recorded for the model's family, as for chat.
        let seen = (n + 1) as f64;
        assert_eq!(histogram(&text, "meridian_time_to_first_output_token_seconds", "tiny", "count"), seen);
        assert_eq!(
            histogram(&text, "meridian_think_to_output_gap_seconds", "tiny", "count"),
            seen,
            "{}",
            api.route
        );
        assert!(histogram(&text, "meridian_output_inter_token_latency_seconds", "tiny", "count") > 0.0);
    }
    // Think tokens: the Responses API reports them (usage.output_tokens_details); the
    // Messages API reports only the total, which the tracker splits by what it saw.
    let responses = rig.mocks[0].fixture(RESPONSES.fixture).unwrap().body.clone();
    let usage = events(&responses).last().unwrap()["response"]["usage"].clone();
    let messages = rig.mocks[0].fixture(MESSAGES.fixture).unwrap().body.clone();
    let (thinking, _) = recorded_deltas(&MESSAGES, &messages);
    let think_sum = histogram(&rig.scrape(), "meridian_think_tokens", "tiny", "sum");
    assert_eq!(
        think_sum,
        usage["output_tokens_details"]["reasoning_tokens"].as_f64().unwrap() + thinking as f64
    );
}

#[tokio::test]
async fn whole_answers_are_read_once_and_tracked() {
    let rig = Rig::new(1).await;
    for api in [RESPONSES, MESSAGES] {
        let got = receive(rig.client.post(rig.url(api.path)).json(&api.body(false))).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let whole = rig.mocks[0].fixture(api.fixture).unwrap().whole.clone().unwrap();
        assert_eq!(got.body(), whole.to_vec(), "{}", api.route);
        counted_ok_once(&rig, api.route).await;
    }
    // Both answers carry thinking and text: the tracker saw both phases in each.
    let text = rig.scrape();
    assert_eq!(histogram(&text, "meridian_time_to_first_output_token_seconds", "tiny", "count"), 2.0);
    // Think tokens: the Responses API counts them; a whole Messages answer is one delta,
    // so its total is split by the text's share.
    let whole = |api: &Api| -> Value {
        serde_json::from_slice(rig.mocks[0].fixture(api.fixture).unwrap().whole.as_ref().unwrap()).unwrap()
    };
    let responses = whole(&RESPONSES)["usage"]["output_tokens_details"]["reasoning_tokens"].as_f64().unwrap();
    let message = whole(&MESSAGES);
    let chars = |kind: &str, field: &str| -> f64 {
        message["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["type"] == kind)
            .map(|b| b[field].as_str().unwrap().chars().count() as f64)
            .sum()
    };
    let (r, a) = (chars("thinking", "thinking"), chars("text", "text"));
    let messages = (message["usage"]["output_tokens"].as_f64().unwrap() * r / (r + a)).round();
    assert_eq!(histogram(&text, "meridian_think_tokens", "tiny", "sum"), responses + messages);
}

/// A mock with one more fixture: `name`, the recorded stream of `api` cut before its
/// last event (the API's terminator), ending cleanly.
async fn mock_with_cut_stream(api: &Api, dir: &std::path::Path, name: &str) -> MockUpstream {
    let recorded = meridian_mock_upstream::builtin_fixtures()[api.fixture].body.clone();
    let text = String::from_utf8(recorded.to_vec()).unwrap();
    let last_event = text.trim_end().rfind("\n\n").unwrap() + 2;
    std::fs::write(dir.join(format!("{name}.sse")), &text[..last_event]).unwrap();
    MockUpstream::start(MockOptions { fixtures_dir: Some(dir.to_owned()), ..mock_options() }).await.unwrap()
}

#[tokio::test]
async fn a_stream_without_its_terminator_ends_in_the_apis_own_error_event() {
    let dir = std::env::temp_dir().join(format!("meridian-apis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for api in [RESPONSES, MESSAGES] {
        let mock = mock_with_cut_stream(&api, &dir, &format!("{}-cut", api.route)).await;
        let proxy = start_proxy(config_for(&[mock.url()])).await;
        let url = format!("http://{}{}", proxy.local_addr, api.path);
        let req =
            client().post(url).json(&api.body(true)).header("x-mock-fixture", format!("{}-cut", api.route));
        let got = receive(req).await;
        assert_eq!(got.status, 200);
        let text = got.text();
        let (last_event, last_data) = {
            let mut lines = text.trim_end().lines().rev();
            let data = lines.next().unwrap().to_owned();
            (lines.next().unwrap().to_owned(), data)
        };
        assert_eq!(last_event, "event: error", "{}: {text}", api.route);
        let error: Value = serde_json::from_str(last_data.strip_prefix("data: ").unwrap()).unwrap();
        match api.route {
            "responses" => {
                // Numbered after the upstream's last event (vLLM counts from 0), as
                // every event of the API is.
                let relayed = text.lines().filter(|l| l.starts_with("data: ")).count() - 1;
                assert_eq!(
                    (&error["type"], &error["code"], &error["sequence_number"]),
                    (&json!("error"), &json!("upstream_truncated"), &json!(relayed)),
                    "OpenAI's error event"
                )
            }
            _ => assert_eq!(
                (&error["type"], &error["error"]["type"]),
                (&json!("error"), &json!("api_error")),
                "Anthropic's error event"
            ),
        }
        assert!(!text.lines().any(|l| l == "data: [DONE]"), "neither API ends its stream with [DONE]");
        let route = api.route;
        let metrics = proxy.state.clone();
        eventually("counted as truncated", || {
            sample(
                &metrics.render_metrics(),
                "meridian_requests_total",
                &[("route", route), ("outcome", "upstream_truncated")],
            ) == Some(1.0)
        })
        .await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn priorities_follow_the_class_on_every_api() {
    let rig = Rig::with(1, |cfg| cfg.priority.enabled = true).await;
    let sent = |n: usize| rig.mocks[0].requests()[n].header("x-vllm-priority").map(str::to_owned);
    let got = receive(rig.client.post(rig.url("/v1/responses")).json(&RESPONSES.body(true))).await;
    assert_eq!(got.status, 200);
    assert_eq!(sent(0).as_deref(), Some("0"), "a thinking request is interactive");
    let mut off = MESSAGES.body(true);
    off["thinking"] = json!({"type": "disabled"});
    let got = receive(rig.client.post(rig.url("/v1/messages")).json(&off)).await;
    assert_eq!(got.status, 200);
    assert_eq!(sent(1).as_deref(), Some("-10"), "thinking switched off: the output class");
}

#[tokio::test]
async fn a_budget_nothing_can_enforce_is_counted_not_dropped_silently() {
    let rig = Rig::new(1).await;
    let mut body = RESPONSES.body(true);
    body["meridian"] = json!({"think_budget_tokens": 4});
    let got = receive(rig.client.post(rig.url("/v1/responses")).json(&body)).await;
    assert_eq!(got.status, 200);
    let sent: Value = serde_json::from_str(&rig.mocks[0].requests()[0].body).unwrap();
    assert!(sent.get("meridian").is_none(), "the extension never reaches the engine");
    assert!(sent.get("thinking_token_budget").is_none(), "vLLM ignores it on this API");
    let text = rig.scrape();
    assert_eq!(sample(&text, "meridian_think_budget_unenforced_total", &[("route", "responses")]), Some(1.0));
    assert_eq!(sample(&text, "meridian_think_budget_unenforced_total", &[("route", "messages")]), Some(0.0));
    // A client's own Messages budget is vLLM's to enforce: nothing is missing.
    let mut own = MESSAGES.body(true);
    own["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    own["max_tokens"] = json!(2048);
    assert_eq!(receive(rig.client.post(rig.url("/v1/messages")).json(&own)).await.status, 200);
    assert_eq!(
        sample(&rig.scrape(), "meridian_think_budget_unenforced_total", &[("route", "messages")]),
        Some(0.0)
    );
}

#[tokio::test]
async fn malformed_bodies_are_refused_naming_the_field() {
    let rig = Rig::new(1).await;
    for (path, body, param) in [
        ("/v1/responses", json!({"model": "tiny-qwen3", "input": 7}), "input"),
        (
            "/v1/responses",
            json!({"model": "tiny-qwen3", "input": "x", "max_output_tokens": -1}),
            "max_output_tokens",
        ),
        (
            "/v1/messages",
            json!({"model": "tiny-qwen3", "max_tokens": 8, "messages": [], "thinking": true}),
            "thinking",
        ),
    ] {
        let got = receive(rig.client.post(rig.url(path)).json(&body)).await;
        assert_eq!(got.status, 400, "{path}: {}", got.text());
        let error = got.json();
        if path == "/v1/messages" {
            // Anthropic's shape, as vLLM answers on this route.
            assert_eq!(
                (&error["type"], &error["error"]["type"]),
                (&json!("error"), &json!("invalid_request_error"))
            );
            assert!(error["error"]["message"].as_str().unwrap().starts_with(param), "{error}");
        } else {
            assert_eq!(error["error"]["param"], param);
        }
    }
    assert!(rig.mocks[0].requests().is_empty(), "nothing reached the engine");
}

#[tokio::test]
async fn an_upstream_error_event_ends_the_stream_as_the_upstream_said() {
    let dir = std::env::temp_dir().join(format!("meridian-apis-err-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let recorded = meridian_mock_upstream::builtin_fixtures()[MESSAGES.fixture].body.clone();
    let text = String::from_utf8(recorded.to_vec()).unwrap();
    // vLLM's Anthropic converter ends a failed generation with an error event.
    let cut = text.find("event: content_block_stop").unwrap();
    let failing = format!(
        "{}event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"api_error\",\"message\":\"boom\"}}}}\n\n",
        &text[..cut]
    );
    std::fs::write(dir.join("messages-failing.sse"), failing).unwrap();
    let mock =
        MockUpstream::start(MockOptions { fixtures_dir: Some(dir.clone()), ..mock_options() }).await.unwrap();
    let proxy = start_proxy(config_for(&[mock.url()])).await;
    let url = format!("http://{}/v1/messages", proxy.local_addr);
    let got =
        receive(client().post(url).json(&MESSAGES.body(true)).header("x-mock-fixture", "messages-failing"))
            .await;
    let body = got.text();
    assert_eq!(body.matches("event: error").count(), 1, "the upstream's error, and no second one: {body}");
    assert!(body.trim_end().ends_with(r#""message":"boom"}}"#));
    let state = proxy.state.clone();
    eventually("counted as the upstream's failure", || {
        let text = state.render_metrics();
        sample(&text, "meridian_requests_total", &[("route", "messages"), ("outcome", "upstream_error")]) == Some(1.0)
            // Cut before its usage, the stream's thinking is still counted, by the tracker.
            && histogram(&text, "meridian_think_tokens", "tiny", "sum") > 0.0
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}
