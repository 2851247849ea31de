//! The load tester on every streaming API vLLM serves, against the mock upstream's
//! recordings from vLLM 0.32: `/v1/responses` (OpenAI Responses) and `/v1/messages`
//! (Anthropic Messages), measured as chat is: thinking and answer told apart, TTFO after
//! TTFT, the server's token counts.

use std::process::Command;

use meridian_mock_upstream::{MockOptions, MockUpstream};
use serde_json::Value;

fn loadtest(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_meridian-loadtest"))
        .args(args)
        .arg("--disable-tqdm")
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into())
}

fn fixture(name: &str) -> String {
    let path = format!("{}/../../mock-upstream/fixtures/{name}.sse", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One API: its path, the recording the mock answers it with, how to count the
/// recording's thinking and answer deltas, and the server's thinking and answer tokens.
struct Case {
    endpoint: &'static str,
    recording: &'static str,
    think_marker: &'static str,
    answer_marker: &'static str,
    /// `usage`: reasoning tokens (`None`: the server does not count them) and all output.
    usage: (Option<u64>, u64),
}

const CASES: [Case; 2] = [
    Case {
        endpoint: "/v1/responses",
        recording: "responses-reasoning",
        think_marker: "\"type\":\"response.reasoning_text.delta\"}",
        answer_marker: "\"type\":\"response.output_text.delta\"}",
        usage: (Some(9), 24),
    },
    Case {
        endpoint: "/v1/messages",
        recording: "messages-thinking",
        think_marker: "thinking_delta",
        answer_marker: "text_delta",
        usage: (None, 40),
    },
];

#[tokio::test(flavor = "multi_thread")]
async fn responses_and_messages_are_measured_as_thinking_then_answer() {
    let mock = MockUpstream::start(MockOptions::default()).await.unwrap();
    for case in CASES {
        let recording = fixture(case.recording);
        let think = recording.matches(case.think_marker).count() as u64;
        let answer = recording.matches(case.answer_marker).count() as u64;
        assert!(think > 0 && answer > 0, "{}", case.recording);
        let dir = std::env::temp_dir().join(format!("lt-apis-{}-{}", std::process::id(), case.recording));
        std::fs::create_dir_all(&dir).unwrap();
        let url = mock.url();
        let (code, err) = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || {
                loadtest(&[
                    "--base-url",
                    &url,
                    "--endpoint",
                    case.endpoint,
                    "--num-prompts",
                    "3",
                    "--save-result",
                    "--result-dir",
                    dir.to_str().unwrap(),
                    "--result-filename",
                    "r.json",
                ])
            }
        })
        .await
        .unwrap();
        assert_eq!(code, 0, "{}: {err}", case.endpoint);
        let v: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
        let run = &v["runs"][0];
        assert_eq!(run["summary"]["completed"], 3, "{}", case.endpoint);
        for r in run["requests"].as_array().unwrap() {
            assert_eq!(
                (r["client_think_tokens"].as_u64(), r["client_output_tokens"].as_u64()),
                (Some(think), Some(answer)),
                "{}: one token per delta of each kind",
                case.endpoint
            );
            assert!(r["ttfo"].as_f64().unwrap() > r["ttft"].as_f64().unwrap(), "{}", case.endpoint);
        }
        // The server's counts win; without a reasoning count the client's stands in.
        let (reasoning, output) = case.usage;
        let think_tokens = reasoning.unwrap_or(think);
        assert_eq!(run["summary"]["think_tokens"], 3 * think_tokens, "{}", case.endpoint);
        assert_eq!(run["summary"]["output_tokens"], 3 * (output - think_tokens), "{}", case.endpoint);
        // Each request was written in the API's own shape.
        let sent = mock.requests();
        let last = sent.last().unwrap();
        assert_eq!(last.path, case.endpoint);
        let body: Value = serde_json::from_str(&last.body).unwrap();
        let (prompt, limit) = match case.endpoint {
            "/v1/responses" => ("input", "max_output_tokens"),
            _ => ("messages", "max_tokens"),
        };
        assert!(body[prompt].is_string() || body[prompt].is_array(), "{body}");
        assert!(body[limit].is_u64() && body["stream"] == true, "{body}");
        assert!(body.get("stream_options").is_none(), "a chat-only field: {body}");
    }
}

#[test]
fn options_the_api_cannot_carry_are_refused_up_front() {
    for endpoint in ["/v1/responses", "/v1/messages"] {
        let (code, err) = loadtest(&[
            "--base-url",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--endpoint",
            endpoint,
            "--random-think-len",
            "16",
        ]);
        assert_ne!(code, 0, "{endpoint}");
        assert!(err.contains("think budgets") && err.contains("chat/completions"), "{endpoint}: {err}");
    }
}
