//! Streams relayed through the proxy arrive exactly as the upstream sent them, and the
//! phase tracker sees the think → output switch in every form a server can express it.

mod support;

use support::*;

/// (fixture, model the client asks for, family the metrics are labelled with)
const FORMS: &[(&str, &str, &str)] = &[
    ("qwen3-reasoning", "Qwen/Qwen3-8B", "qwen3"),
    ("qwen3-reasoning-content", "Qwen/Qwen3-8B", "qwen3"),
    ("qwen3-inline-tags", "Qwen/Qwen3-4B-Thinking-2507", "qwen3-thinking-2507"),
    ("qwen3-token-ids", "tiny-qwen3", "tiny"),
    ("qwen3-token-ids-stripped", "tiny-qwen3", "tiny"),
    ("gpt-oss-harmony", "openai/gpt-oss-20b", "gpt-oss"),
];

#[tokio::test]
async fn every_form_is_relayed_byte_for_byte_and_tracked() {
    let rig = Rig::new(1).await;
    for (fixture, model, family) in FORMS {
        let path = if fixture.starts_with("gpt-oss") { "/v1/completions" } else { "/v1/chat/completions" };
        let got = receive(rig.generate(path, model, fixture, &[])).await;
        assert_eq!(got.status, 200, "{fixture}");
        assert_eq!(got.error, None, "{fixture}");
        let expected = rig.mocks[0].fixture(fixture).unwrap().body.clone();
        assert_eq!(got.body(), expected.to_vec(), "{fixture}: bytes differ");
        assert!(got.headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        eventually(&format!("{fixture} recorded"), || {
            sample(&rig.scrape(), "meridian_think_to_output_gap_seconds_count", &[("family", family)])
                .is_some()
        })
        .await;
    }
    let text = rig.scrape();
    for (fixture, _, family) in FORMS {
        let ttfo = sample(&text, "meridian_time_to_first_output_token_seconds_count", &[("family", family)]);
        assert!(ttfo.unwrap_or(0.0) >= 1.0, "{fixture}: no first output token recorded\n{text}");
        let think = sample(&text, "meridian_think_tokens_sum", &[("family", family)]).unwrap_or(0.0);
        assert!(think >= 5.0, "{fixture}: think tokens {think}");
    }
    assert_eq!(
        sample(&text, "meridian_requests_total", &[("route", "chat_completions"), ("outcome", "ok")]),
        Some(5.0)
    );
}

#[tokio::test]
async fn completions_with_inline_tags_are_tracked() {
    let rig = Rig::new(1).await;
    let got = receive(rig.generate("/v1/completions", "tiny-qwen3", "completions-inline-tags", &[])).await;
    assert_eq!(got.body(), rig.mocks[0].fixture("completions-inline-tags").unwrap().body.to_vec());
    eventually("ttot recorded", || {
        sample(&rig.scrape(), "meridian_think_to_output_gap_seconds_count", &[("family", "tiny")])
            == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn usage_from_the_server_wins_over_client_side_counts() {
    let rig = Rig::new(1).await;
    let got = receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning-usage", &[])).await;
    assert!(got.text().contains("\"top_logprobs\""), "unknown fields kept");
    eventually("usage recorded", || {
        let t = rig.scrape();
        sample(&t, "meridian_think_tokens_sum", &[("family", "qwen3")]) == Some(9.0)
            && sample(&t, "meridian_output_tokens_sum", &[("family", "qwen3")]) == Some(23.0)
    })
    .await;
}

#[tokio::test]
async fn output_inter_token_latency_is_the_gap_between_visible_chunks() {
    let rig = Rig::new(1).await;
    let got = receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-interval-ms", "20")])).await;
    assert_eq!(got.status, 200);
    let itl = "meridian_output_inter_token_latency_seconds";
    eventually("request recorded", || {
        sample(&rig.scrape(), "meridian_requests_total", &[("outcome", "ok")]) == Some(1.0)
    })
    .await;
    let text = rig.scrape();
    let output_tokens = sample(&text, "meridian_output_tokens_sum", &[("family", "qwen3")]).unwrap();
    let count = sample(&text, &format!("{itl}_count"), &[("family", "qwen3")]).unwrap();
    let sum = sample(&text, &format!("{itl}_sum"), &[("family", "qwen3")]).unwrap();
    // One gap between each pair of visible chunks (one token each in this recording),
    // none across the thinking: those are TTOT's.
    assert!(output_tokens >= 5.0, "{text}");
    assert_eq!(count, output_tokens - 1.0, "{text}");
    // The upstream paused 20 ms between writes; reads that coalesce give smaller gaps.
    assert!(sum >= count * 0.010, "{sum} s over {count} gaps");
}

#[tokio::test]
async fn open_stream_gauges_follow_the_phase() {
    let rig = Rig::new(1).await;
    let req = rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-interval-ms", "40")]);
    let resp = req.send().await.unwrap();
    let mut stream = resp.bytes_stream();
    use futures::StreamExt;
    let mut seen = String::new();
    let mut saw_think = false;
    let mut saw_output = false;
    while let Some(chunk) = stream.next().await {
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        let non_empty_content =
            seen.matches("\"content\":\"").count() - seen.matches("\"content\":\"\"").count();
        if seen.contains("\"reasoning\"") && non_empty_content == 0 {
            saw_think |= rig.open_streams(meridian_core::Phase::Think) == 1
                && support::sample(&rig.scrape(), "meridian_open_streams", &[("phase", "think")])
                    == Some(1.0);
        }
        if non_empty_content > 0 {
            saw_output |= rig.open_streams(meridian_core::Phase::Output) == 1
                && support::sample(&rig.scrape(), "meridian_open_streams", &[("phase", "output")])
                    == Some(1.0);
        }
    }
    assert!(saw_think && saw_output, "think {saw_think} output {saw_output}");
    eventually("stream closed", || {
        [meridian_core::Phase::Pending, meridian_core::Phase::Think, meridian_core::Phase::Output]
            .iter()
            .all(|p| rig.open_streams(*p) == 0)
    })
    .await;
}

#[tokio::test]
async fn chunks_are_forwarded_as_they_arrive_not_buffered() {
    let rig = Rig::new(1).await;
    let got = receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-interval-ms", "30")])).await;
    let events = rig.mocks[0].fixture("qwen3-reasoning").unwrap().event_ends().len();
    assert!(got.chunks.len() >= events - 1, "{} chunks for {events} events", got.chunks.len());
    let span = got.chunks.last().unwrap().0 - got.chunks[0].0;
    assert!(span.as_millis() >= 30 * (events as u128 - 2), "chunks arrived together: {span:?}");
}

#[tokio::test]
async fn non_streaming_answers_are_relayed_and_measured() {
    let rig = Rig::new(1).await;
    let body = serde_json::json!({"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "hi"}]});
    let got = receive(
        rig.client
            .post(rig.url("/v1/chat/completions"))
            .json(&body)
            .header("x-mock-fixture", "qwen3-reasoning"),
    )
    .await;
    assert_eq!(got.status, 200);
    let v = got.json();
    assert!(v["choices"][0]["message"]["reasoning"].as_str().unwrap().len() > 5);
    eventually("non-streaming recorded", || {
        sample(&rig.scrape(), "meridian_time_to_first_output_token_seconds_count", &[("family", "qwen3")])
            == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn thinking_disabled_requests_start_in_output() {
    let rig = Rig::new(1).await;
    let body = serde_json::json!({
        "model": "Qwen/Qwen3-4B-Thinking-2507", "stream": true,
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": false},
    });
    // The fixture still contains a </think>, but as answer text it must not count as a
    // think phase: the request asked for none. (It does end the "think block" the
    // template never opened, so no TTOT is recorded either way.)
    let req = rig
        .client
        .post(rig.url("/v1/chat/completions"))
        .json(&body)
        .header("x-mock-fixture", "qwen3-inline-tags");
    let got = receive(req).await;
    assert_eq!(got.status, 200);
    eventually("recorded", || {
        sample(&rig.scrape(), "meridian_requests_total", &[("route", "chat_completions"), ("outcome", "ok")])
            == Some(1.0)
    })
    .await;
    let t = rig.scrape();
    let ttfo =
        sample(&t, "meridian_time_to_first_output_token_seconds_sum", &[("family", "qwen3-thinking-2507")])
            .unwrap();
    let ttft =
        sample(&t, "meridian_time_to_first_token_seconds_sum", &[("family", "qwen3-thinking-2507")]).unwrap();
    assert_eq!(ttfo, ttft, "the first token was already output");
}
