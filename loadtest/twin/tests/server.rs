//! The twin as a client meets it: vLLM's streaming dialect, usage, budgets, priorities,
//! aborts, and vLLM's metric names.

use meridian_core::sched::Fcfs;
use meridian_sim::server::{TwinOptions, TwinServer};
use meridian_sim::workload::WorkloadSpec;
use serde_json::{Value, json};

async fn twin(think: u32, answer: u32) -> TwinServer {
    let opts = TwinOptions {
        seed: 1,
        ..TwinOptions::local(
            meridian_sim::profile("h100-qwen3-8b").unwrap(),
            WorkloadSpec::fixed(100, think, answer),
            100.0,
        )
    };
    TwinServer::start(opts, Box::new(Fcfs)).await.unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// (field, text) of each delta, and the usage object if sent.
fn deltas(sse: &str) -> (Vec<(String, String)>, Option<Value>) {
    let mut out = Vec::new();
    let mut usage = None;
    for line in sse.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|l| *l != "[DONE]") {
        let v: Value = serde_json::from_str(line).unwrap();
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
        for c in v["choices"].as_array().unwrap() {
            for field in ["reasoning", "content"] {
                if let Some(t) = c["delta"][field].as_str().filter(|t| !t.is_empty()) {
                    out.push((field.to_owned(), t.to_owned()));
                }
            }
        }
    }
    (out, usage)
}

async fn chat(t: &TwinServer, extra: Value) -> String {
    let mut body = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [{"role": "user", "content": "hi"}],
        "stream_options": {"include_usage": true}});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    client()
        .post(format!("{}/v1/chat/completions", t.url()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn streams_reasoning_then_content_with_usage() {
    let t = twin(6, 4).await;
    let (d, usage) = deltas(&chat(&t, json!({})).await);
    let fields: Vec<&str> = d.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, [vec!["reasoning"; 6], vec!["content"; 4]].concat());
    let u = usage.unwrap();
    // vLLM counts the end-of-thought delimiter, which no delta shows, with the answer.
    assert_eq!(u["completion_tokens"], 11);
    assert_eq!(u["completion_tokens_details"]["reasoning_tokens"], 6);
}

#[tokio::test]
async fn thinking_budget_max_tokens_and_thinking_off() {
    let t = twin(50, 5).await;
    let (d, u) = deltas(&chat(&t, json!({"thinking_token_budget": 3})).await);
    assert_eq!(d.iter().filter(|(f, _)| f == "reasoning").count(), 3);
    assert_eq!(u.unwrap()["completion_tokens"], 9, "3 thinking, the forced delimiter, 5 answering");
    let (d, _) = deltas(&chat(&t, json!({"max_tokens": 10})).await);
    assert_eq!(d.len(), 10);
    let (d, _) = deltas(&chat(&t, json!({"chat_template_kwargs": {"enable_thinking": false}})).await);
    assert!(d.iter().all(|(f, _)| f == "content") && d.len() == 5);
    // A limit past the thought: the delimiter takes one token of it, unseen.
    let (d, u) = deltas(&chat(&t, json!({"max_tokens": 52})).await);
    assert_eq!(d.iter().filter(|(f, _)| f == "content").count(), 1);
    assert_eq!(u.unwrap()["completion_tokens"], 52);
    // No thought, no delimiter: the whole limit is answer (the EAT prober asks so).
    let off = json!({"max_tokens": 1, "chat_template_kwargs": {"enable_thinking": false}});
    let (d, _) = deltas(&chat(&t, off).await);
    assert_eq!(d.len(), 1);
}

#[tokio::test]
async fn request_id_and_errors_follow_vllm() {
    let t = twin(2, 2).await;
    let resp = client()
        .post(format!("{}/v1/chat/completions", t.url()))
        .header("x-request-id", "abc")
        .json(&json!({"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["id"], "chatcmpl-abc");
    assert!(!v["choices"][0]["message"]["reasoning"].as_str().unwrap().is_empty());
    let resp = client()
        .post(format!("{}/v1/chat/completions", t.url()))
        .json(&json!({"model": "other", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn client_that_leaves_aborts_the_request() {
    let t = twin(100_000, 10).await;
    let resp = client()
        .post(format!("{}/v1/chat/completions", t.url()))
        .json(&json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let mut s = resp.bytes_stream();
    use futures::StreamExt;
    s.next().await.unwrap().unwrap();
    s.next().await.unwrap().unwrap();
    drop(s);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let m = client().get(format!("{}/metrics", t.url())).send().await.unwrap().text().await.unwrap();
        if m.contains("finished_reason=\"abort\"} 1")
            && m.contains("vllm:num_requests_running{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 0")
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{m}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn metrics_use_vllm_names() {
    let t = twin(3, 3).await;
    chat(&t, json!({})).await;
    let m = client().get(format!("{}/metrics", t.url())).send().await.unwrap().text().await.unwrap();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
        "vllm:generation_tokens_total",
        "meridian_sim_output_critical_preemptions_total",
    ] {
        assert!(m.contains(name), "{name}");
    }
    assert!(m.contains("vllm:generation_tokens_total{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 7"));
    assert!(
        m.contains("meridian_sim_requests_peak{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 1"),
        "one at a time"
    );
}

#[tokio::test]
async fn the_peak_counts_every_request_held_at_once() {
    let t = twin(50, 50).await;
    let sends: Vec<_> = (0..5).map(|_| chat(&t, json!({}))).collect();
    futures::future::join_all(sends).await;
    let m = client().get(format!("{}/metrics", t.url())).send().await.unwrap().text().await.unwrap();
    assert!(m.contains("meridian_sim_requests_peak{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 5"), "{m}");
}

#[tokio::test]
async fn logprobs_are_reported_when_asked() {
    let t = twin(3, 1).await;
    let body = chat(&t, json!({"logprobs": true, "top_logprobs": 5})).await;
    let line = body.lines().find(|l| l.contains("\"reasoning\"")).unwrap();
    let v: Value = serde_json::from_str(&line[6..]).unwrap();
    let top = v["choices"][0]["logprobs"]["content"][0]["top_logprobs"].as_array().unwrap();
    assert!(!top.is_empty() && top.len() <= 5);
    // As vLLM: the delimiter's chunk has an empty delta and its logprobs; without
    // logprobs asked for there is no chunk for it at all.
    let chunks: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &Value| v["choices"][0]["logprobs"].is_object())
        .collect();
    assert_eq!(chunks.len(), 5, "3 thinking, the delimiter, 1 answering");
    assert_eq!(chunks[3]["choices"][0]["delta"], json!({}));
    let plain = chat(&t, json!({})).await;
    let empty = plain.lines().filter(|l| l.contains("\"delta\":{}")).count();
    assert_eq!(empty, 0);
}

#[tokio::test]
async fn with_its_prefix_cache_on_a_conversations_next_turn_hits_the_history_and_metrics_count_it() {
    let opts = TwinOptions {
        seed: 1,
        prefix_cache: Some(meridian_sim::engine::Eviction::Lru),
        ..TwinOptions::local(
            meridian_sim::profile("h100-qwen3-8b").unwrap(),
            WorkloadSpec::fixed(100, 8, 8),
            100.0,
        )
    };
    let t = TwinServer::start(opts, Box::new(Fcfs)).await.unwrap();
    let counter = |text: &str, name: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    let scrape =
        || async { client().get(format!("{}/metrics", t.url())).send().await.unwrap().text().await.unwrap() };
    // A system prompt and a question long enough for several full blocks.
    let system = "You answer questions about arithmetic with care. ".repeat(60);
    let first =
        json!([{"role": "system", "content": system}, {"role": "user", "content": "What is two plus two?"}]);
    chat(&t, json!({"messages": first})).await;
    let before = scrape().await;
    let queried_first =
        counter(&before, "vllm:prefix_cache_queries_total").expect("counted while the cache is on");
    assert_eq!(
        counter(&before, "vllm:prefix_cache_hits_total"),
        Some(0.0),
        "nothing cached before the first turn"
    );
    let mut second = first.clone();
    second.as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": "Four."}),
        json!({"role": "user", "content": "And three plus three?"}),
    ]);
    chat(&t, json!({"messages": second})).await;
    let after = scrape().await;
    let hits = counter(&after, "vllm:prefix_cache_hits_total").unwrap();
    let queried = counter(&after, "vllm:prefix_cache_queries_total").unwrap() - queried_first;
    assert!(
        hits >= queried_first * 0.8 && hits < queried,
        "the second turn found the first turn's prompt: {hits} of {queried}"
    );

    // Off (the default), no such counters, as for an engine without a prefix cache.
    let off = twin(8, 8).await;
    let text = client().get(format!("{}/metrics", off.url())).send().await.unwrap().text().await.unwrap();
    assert!(!text.contains("prefix_cache"), "{text}");
}

#[tokio::test]
async fn with_a_channel_secret_it_answers_the_hello_and_grants_places_as_the_hook_does() {
    let plain = twin(50, 5).await;
    let hello = |t: &TwinServer, bearer: &str| {
        client()
            .get(format!("{}/meridian/v1/hello", t.url()))
            .header("authorization", format!("Bearer {bearer}"))
            .header("meridian-protocol", "1")
            .send()
    };
    assert_eq!(hello(&plain, "s").await.unwrap().status(), 404, "no secret, no channel");

    let opts = TwinOptions {
        channel_secret: Some("s3cret".into()),
        // Turns going stale are the table's own tests' (core); here the wall clock between
        // two asks on a busy machine must not decide who is woken.
        place_turn_kept_s: 30.0,
        ..TwinOptions::local(
            meridian_sim::profile("h100-qwen3-8b").unwrap(),
            WorkloadSpec::fixed(100, 2000, 5),
            1.0,
        )
    };
    let twin = TwinServer::start(opts, Box::new(Fcfs)).await.unwrap();
    assert_eq!(hello(&twin, "wrong").await.unwrap().status(), 401);
    // A thinking request in flight shows in the hello's engine state.
    let running = client()
        .post(format!("{}/v1/chat/completions", twin.url()))
        .json(&json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(running.status(), 200);
    let said: Value = hello(&twin, "s3cret").await.unwrap().json().await.unwrap();
    assert_eq!(said["can_end_thinking"], false, "it takes no directives");
    let engine = &said["engine"];
    let held = ["prefilling", "thinking", "answering", "waiting"].map(|k| engine[k].as_u64().unwrap());
    assert_eq!(held.iter().sum::<u64>(), 1, "{engine}");

    let places = || {
        client()
            .post(format!("{}/meridian/v1/places", twin.url()))
            .header("authorization", "Bearer s3cret")
            .header("meridian-protocol", "1")
    };
    // Each replica's request states how long it has waited, as a replica's does: b's
    // longer than c's, so b's goes first however the two interleave.
    let claim = |holder: &str, held: u32| {
        let waited_s = if holder == "b" { 10.0 } else { 5.0 };
        let body = json!({"holder": holder, "held": held, "want": 1, "limit": 1, "lease_s": 5.0, "waited_s": waited_s});
        places().json(&body).send()
    };
    let first: Value = claim("a", 0).await.unwrap().json().await.unwrap();
    assert_eq!(first["granted"], true);
    let second: Value = claim("b", 0).await.unwrap().json().await.unwrap();
    assert_eq!((second["granted"].as_bool(), second["total"].as_u64()), (Some(false), Some(1)));
    let bad = places().body("{\"holder\": \"c\"}").send().await.unwrap();
    assert_eq!(bad.status(), 400);

    // b, then c, wait for a place; a's report that its request ended wakes b, whose
    // turn the place is kept for, and not c.
    let after = second["freed"].as_u64().unwrap();
    let c_refused: Value = claim("c", 0).await.unwrap().json().await.unwrap();
    assert_eq!((c_refused["granted"].as_bool(), c_refused["ahead"].as_u64()), (Some(false), Some(1)));
    let wait = |holder: &str, after: u64| {
        let wait = client()
            .post(format!("{}/meridian/v1/places/wait", twin.url()))
            .header("authorization", "Bearer s3cret")
            .header("meridian-protocol", "1")
            .json(&json!({"after": after, "wait_s": 4.0, "holder": holder}))
            .send();
        tokio::spawn(async move { wait.await.unwrap().json::<Value>().await.unwrap() })
    };
    let (b_waiting, c_waiting) = (wait("b", after), wait("c", after));
    // Nothing frees meanwhile; b and c ask again, as a replica does, which keeps their
    // turns.
    for _ in 0..2 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        for holder in ["b", "c"] {
            let again: Value = claim(holder, 0).await.unwrap().json().await.unwrap();
            assert_eq!(again["granted"], false);
        }
    }
    assert!(!b_waiting.is_finished() && !c_waiting.is_finished(), "answered before any place freed");
    let report = places().json(&json!({"holder": "a", "held": 0, "want": 0, "limit": 1, "lease_s": 5.0}));
    assert_eq!(report.send().await.unwrap().status(), 200);
    let woken = tokio::time::timeout(std::time::Duration::from_secs(3), b_waiting).await.unwrap().unwrap();
    assert!(woken["freed"].as_u64().unwrap() > after, "{woken}");
    assert_eq!(woken["woken"], true, "{woken}");
    let third: Value = claim("b", 0).await.unwrap().json().await.unwrap();
    assert_eq!(third["granted"], true);
    // The place was b's: c, still waiting, was not woken to be refused.
    assert!(!c_waiting.is_finished(), "c woken for a place kept for b");
    // b's request ends: now the place is c's.
    let report = places().json(&json!({"holder": "b", "held": 0, "want": 0, "limit": 1, "lease_s": 5.0}));
    assert_eq!(report.send().await.unwrap().status(), 200);
    let woken = tokio::time::timeout(std::time::Duration::from_secs(3), c_waiting).await.unwrap().unwrap();
    assert_eq!(woken["woken"], true, "{woken}");
    assert_eq!(claim("c", 0).await.unwrap().json::<Value>().await.unwrap()["granted"], true);
    drop(running);
}

#[tokio::test]
async fn without_place_waits_it_grants_places_and_answers_a_wait_as_an_older_hook_does() {
    let opts = TwinOptions {
        channel_secret: Some("s3cret".into()),
        place_waits: false,
        ..TwinOptions::local(
            meridian_sim::profile("h100-qwen3-8b").unwrap(),
            WorkloadSpec::fixed(100, 8, 5),
            1.0,
        )
    };
    let twin = TwinServer::start(opts, Box::new(Fcfs)).await.unwrap();
    let post = |path: &str, body: Value| {
        client()
            .post(format!("{}{path}", twin.url()))
            .header("authorization", "Bearer s3cret")
            .header("meridian-protocol", "1")
            .json(&body)
            .send()
    };
    let claim = json!({"holder": "a", "held": 0, "want": 1, "limit": 1, "lease_s": 5.0});
    let granted: Value = post("/meridian/v1/places", claim).await.unwrap().json().await.unwrap();
    assert_eq!(granted["granted"], true, "places as before");
    let gave_back = json!({"holder": "a", "held": 0, "want": 0, "limit": 1, "lease_s": 5.0});
    let report: Value = post("/meridian/v1/places", gave_back).await.unwrap().json().await.unwrap();
    assert_eq!(
        report["freed"].as_u64().unwrap_or(0),
        0,
        "no count of openings, which would say it holds waits"
    );
    let wait = post("/meridian/v1/places/wait", json!({"after": 0, "wait_s": 1.0})).await.unwrap();
    assert_eq!(
        wait.status(),
        404,
        "no waits held: a replica asks again on its timer, as against an older hook"
    );
}
