//! vLLM priorities through the proxy: with `[priority]` on, each request carries
//! `X-Vllm-Priority` for its class; a client's own priority is never overwritten.

mod support;

use serde_json::json;
use support::*;

async fn sent_priority(rig: &Rig, body: serde_json::Value, headers: &[(&str, &str)]) -> Option<String> {
    let mut req = rig
        .client
        .post(rig.url("/v1/chat/completions"))
        .json(&body)
        .header("x-mock-fixture", "qwen3-reasoning");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let got = receive(req).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let recorded = rig.mocks[0].requests();
    recorded.last().and_then(|r| r.header("x-vllm-priority").map(str::to_owned))
}

#[tokio::test]
async fn each_class_gets_its_priority_and_client_values_stand() {
    let rig = Rig::with(1, |cfg| cfg.priority.enabled = true).await;
    let plain = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": []});
    assert_eq!(sent_priority(&rig, plain.clone(), &[]).await.as_deref(), Some("0"));
    let no_thinking = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [],
        "chat_template_kwargs": {"enable_thinking": false}});
    assert_eq!(sent_priority(&rig, no_thinking, &[]).await.as_deref(), Some("-10"));
    let batch =
        json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [], "meridian": {"class": "batch"}});
    assert_eq!(sent_priority(&rig, batch, &[]).await.as_deref(), Some("10"));
    assert_eq!(sent_priority(&rig, plain.clone(), &[("x-vllm-priority", "3")]).await.as_deref(), Some("3"));
    let own = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [], "priority": 5});
    assert_eq!(sent_priority(&rig, own, &[]).await, None, "the body's own priority is vLLM's to read");
}

#[tokio::test]
async fn off_by_default() {
    let rig = Rig::new(1).await;
    let plain = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": []});
    assert_eq!(sent_priority(&rig, plain, &[]).await, None);
}
