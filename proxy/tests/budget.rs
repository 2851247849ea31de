//! Think budgets through the proxy: the request's `meridian.think_budget_tokens` or the
//! configured default becomes vLLM's `thinking_token_budget`, the extension never reaches
//! the engine, and the client's one stream switches from reasoning to the answer there.

mod support;

use serde_json::{Value, json};
use support::*;

/// (reasoning deltas, content deltas, usage.reasoning_tokens)
async fn stream(proxy: &meridian_proxy::Server, extra: Value) -> (usize, usize, u64) {
    let mut body = json!({"model": "Qwen/Qwen3-8B", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let text = client()
        .post(format!("http://{}/v1/chat/completions", proxy.local_addr))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (mut r, mut c, mut usage) = (0, 0, 0);
    let mut seen_content = false;
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|l| *l != "[DONE]") {
        let v: Value = serde_json::from_str(line).unwrap();
        if let Some(u) = v["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64() {
            usage = u;
        }
        for ch in v["choices"].as_array().unwrap() {
            if ch["delta"]["reasoning"].as_str().is_some_and(|s| !s.is_empty()) {
                assert!(!seen_content, "reasoning after the answer started");
                r += 1;
            }
            if ch["delta"]["content"].as_str().is_some_and(|s| !s.is_empty()) {
                seen_content = true;
                c += 1;
            }
        }
    }
    (r, c, usage)
}

#[tokio::test]
async fn request_extension_sets_the_budget() {
    let twin = twin().await;
    let proxy = start_proxy(config_for(&[twin.url()])).await;
    assert_eq!(stream(&proxy, json!({"meridian": {"think_budget_tokens": 3}})).await, (3, 6, 3));
    assert_eq!(stream(&proxy, json!({})).await, (40, 6, 40), "no budget: the model thinks its 40 tokens");
    eventually("counted", || {
        sample(&proxy.state.metrics.render(), "meridian_think_budget_reached_total", &[("family", "qwen3")])
            == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn configured_budgets_apply_per_family_and_the_client_field_is_respected() {
    let twin = twin().await;
    let mut cfg = config_for(&[twin.url()]);
    cfg.budget.think_tokens = Some(9);
    cfg.budget.per_family.insert("qwen3".into(), 5);
    let proxy = start_proxy(cfg).await;
    assert_eq!(stream(&proxy, json!({})).await.0, 5, "the family's budget beats the default");
    assert_eq!(
        stream(&proxy, json!({"thinking_token_budget": 2})).await.0,
        2,
        "the client's own field stands"
    );
    assert_eq!(stream(&proxy, json!({"meridian": {"think_budget_tokens": 4}})).await.0, 4);
}

#[tokio::test]
async fn the_extension_never_reaches_the_engine() {
    let rig = Rig::new(1).await;
    let body = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [], "meridian": {"think_budget_tokens": 11}});
    receive(
        rig.client
            .post(rig.url("/v1/chat/completions"))
            .json(&body)
            .header("x-mock-fixture", "qwen3-reasoning"),
    )
    .await;
    let sent: Value = serde_json::from_str(&rig.mocks[0].requests()[0].body).unwrap();
    assert!(sent.get("meridian").is_none());
    assert_eq!(sent["thinking_token_budget"], 11);
    let bad = json!({"model": "Qwen/Qwen3-8B", "messages": [], "meridian": {"think_budget": 11}});
    let got = receive(rig.client.post(rig.url("/v1/chat/completions")).json(&bad)).await;
    assert_eq!(got.status, 400);
    assert!(got.text().contains("bad meridian extension"), "{}", got.text());
}
