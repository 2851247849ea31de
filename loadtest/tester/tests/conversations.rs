//! Multi-turn runs as a server sees them: each turn sends the conversation's history with
//! the earlier answers' text and none of their thinking, a seed of its own, and the
//! report sums the run by turn.

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

/// The recording's answer and thinking, as a client reading `delta.content` and
/// `delta.reasoning` puts them together.
fn fixture_texts(mock: &MockUpstream, name: &str) -> (String, String) {
    let (mut answer, mut thought) = (String::new(), String::new());
    for p in mock.fixture(name).unwrap().data_payloads() {
        let delta = &p["choices"][0]["delta"];
        answer += delta["content"].as_str().unwrap_or("");
        thought += delta["reasoning"].as_str().or(delta["reasoning_content"].as_str()).unwrap_or("");
    }
    (answer, thought)
}

#[tokio::test(flavor = "multi_thread")]
async fn each_turn_sends_the_history_without_the_thinking() {
    let mock = MockUpstream::start(MockOptions::default()).await.unwrap();
    let (answer, thought) = fixture_texts(&mock, "qwen3-reasoning");
    assert!(!answer.trim().is_empty() && !thought.trim().is_empty(), "the recording thinks, then answers");
    let dir = std::env::temp_dir().join(format!("lt-conversations-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = mock.url();
    let (code, err) = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || {
            loadtest(&[
                "--base-url",
                &url,
                "--dataset-name",
                "conversations",
                "--num-prompts",
                "2",
                "--turns",
                "3",
                "--system-prompt-len",
                "7",
                "--think-time",
                "0.01",
                "--sample-seeds",
                "--random-input-len",
                "5",
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
    assert_eq!(code, 0, "{err}");

    let bodies: Vec<Value> = mock
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| serde_json::from_str(&r.body).unwrap())
        .collect();
    assert_eq!(bodies.len(), 6, "two conversations of three turns");
    let mut by_length: Vec<&Value> = bodies.iter().collect();
    by_length.sort_by_key(|b| b["messages"].as_array().unwrap().len());
    let lengths: Vec<usize> = by_length.iter().map(|b| b["messages"].as_array().unwrap().len()).collect();
    assert_eq!(lengths, vec![2, 2, 4, 4, 6, 6], "system, then a user message and an answer per turn before");
    let system = &by_length[0]["messages"][0];
    for body in &bodies {
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(&messages[0], system, "one system prompt shared by every conversation");
        assert_eq!(system["content"].as_str().unwrap().split(' ').count(), 7);
        for (i, m) in messages.iter().enumerate().skip(1) {
            let role = if i % 2 == 1 { "user" } else { "assistant" };
            assert_eq!(m["role"], role, "{body}");
            if role == "assistant" {
                assert_eq!(m["content"], answer.as_str(), "the answer as the server sent it");
                assert!(
                    !m["content"].as_str().unwrap().contains(thought.trim()),
                    "no thinking in the history"
                );
            }
        }
        assert!(body["seed"].is_u64(), "{body}");
    }
    let seeds: std::collections::HashSet<u64> = bodies.iter().map(|b| b["seed"].as_u64().unwrap()).collect();
    assert_eq!(seeds.len(), 6, "every turn samples with its own seed");
    // A later turn's history is the earlier turn's, extended: what a prefix cache can hit.
    let first = by_length[2]["messages"].as_array().unwrap();
    let extends = |b: &&&Value| {
        let m = b["messages"].as_array().unwrap();
        m.len() == 6 && m[..4] == first[..4]
    };
    assert!(by_length.iter().any(|b| extends(&b)), "turn 3 extends turn 2");

    let v: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    let summary = &v["runs"][0]["summary"];
    let turns = summary["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 3);
    for (k, t) in turns.iter().enumerate() {
        assert_eq!((t["turn"].as_u64(), t["completed"].as_u64()), (Some(k as u64), Some(2)), "{t}");
        assert!(t["ttft"]["p95_ms"].is_f64(), "{t}");
        assert!(t["hit_rate"].is_null(), "the mock reports no cached tokens: unknown, not zero: {t}");
    }
    assert_eq!(summary["later_turns"]["requests"], 4);
    assert!(summary.get("prefix_cache").is_none(), "the mock's /metrics has no prefix-cache counters");
    let requests = v["runs"][0]["requests"].as_array().unwrap();
    let mut seen: Vec<(u64, u64)> =
        requests.iter().map(|r| (r["conversation"].as_u64().unwrap(), r["turn"].as_u64().unwrap())).collect();
    seen.sort();
    assert_eq!(seen, vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_conversation_needs_the_chat_api() {
    let (code, err) = loadtest(&[
        "--base-url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--endpoint",
        "/v1/completions",
        "--dataset-name",
        "agent",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("chat/completions"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fleets_replicas_take_the_turns_in_turn_each_carrying_its_conversations_key() {
    // Two replicas behind one list of base URLs, as a Service spreads new connections:
    // every turn names its conversation in `x-session-id`, so replicas that route by it
    // (Meridian's prefix affinity) keep a conversation's turns on one engine.
    let replicas = [
        MockUpstream::start(MockOptions::default()).await.unwrap(),
        MockUpstream::start(MockOptions::default()).await.unwrap(),
    ];
    let urls = format!("{},{}", replicas[0].url(), replicas[1].url());
    let (code, err) = tokio::task::spawn_blocking(move || {
        loadtest(&[
            "--base-url",
            &urls,
            "--dataset-name",
            "conversations",
            "--num-prompts",
            "2",
            "--turns",
            "3",
            "--think-time",
            "0.01",
            "--random-input-len",
            "5",
            "--seed",
            "7",
        ])
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    let mut keys: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
    for (i, replica) in replicas.iter().enumerate() {
        let turns: Vec<_> =
            replica.requests().into_iter().filter(|r| r.path == "/v1/chat/completions").collect();
        assert_eq!(turns.len(), 3, "replica {i} took every other request");
        for t in turns {
            keys.entry(t.headers["x-session-id"].clone()).or_default().push(i);
        }
    }
    assert_eq!(keys.keys().collect::<Vec<_>>(), ["conv-7-0", "conv-7-1"], "one key per conversation");
    assert!(keys.values().all(|r| r.len() == 3), "each conversation's three turns carry its key: {keys:?}");

    // `--session-header ""` sends none.
    let url = replicas[0].url();
    let (code, err) = tokio::task::spawn_blocking(move || {
        loadtest(&[
            "--base-url",
            &url,
            "--dataset-name",
            "conversations",
            "--num-prompts",
            "1",
            "--turns",
            "2",
            "--think-time",
            "0.01",
            "--random-input-len",
            "5",
            "--session-header",
            "",
        ])
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    let last = replicas[0].requests().into_iter().last().unwrap();
    assert!(!last.headers.contains_key("x-session-id"), "{:?}", last.headers);
}
