//! The rest of the API surface: model listing, pass-through, operational endpoints.

mod support;

use support::*;

#[tokio::test]
async fn models_are_listed_from_every_healthy_upstream_without_duplicates() {
    let a = meridian_mock_upstream::MockUpstream::start(meridian_mock_upstream::MockOptions {
        models: vec!["Qwen/Qwen3-8B".into(), "shared".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let b = meridian_mock_upstream::MockUpstream::start(meridian_mock_upstream::MockOptions {
        models: vec!["openai/gpt-oss-20b".into(), "shared".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let proxy = start_proxy(config_for(&[a.url(), b.url()])).await;
    let v: serde_json::Value = client()
        .get(format!("http://{}/v1/models", proxy.local_addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut ids: Vec<&str> =
        v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, vec!["Qwen/Qwen3-8B", "openai/gpt-oss-20b", "shared"]);
    assert_eq!(v["object"], "list");
}

#[tokio::test]
async fn other_v1_routes_pass_through_unchanged() {
    let rig = Rig::new(1).await;
    let resp = rig
        .client
        .post(rig.url("/v1/embeddings?x=1"))
        .header("x-end-to-end", "kept")
        .body(r#"{"model":"e","input":"hi"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-mock-echo"], "1");
    assert!(resp.headers().contains_key("x-request-id"));
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["path"], "/v1/embeddings");
    assert_eq!(v["query"], "x=1");
    assert_eq!(v["body"], r#"{"model":"e","input":"hi"}"#);
    assert_eq!(v["method"], "POST");
    let del = rig.client.delete(rig.url("/v1/files/abc")).send().await.unwrap();
    assert_eq!(del.status(), 200);
    assert_eq!(rig.mocks[0].requests()[1].method, "DELETE");
}

#[tokio::test]
async fn unknown_non_api_paths_are_404_in_openai_shape() {
    let rig = Rig::new(1).await;
    let resp = rig.client.get(rig.url("/admin")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "not_found");
    assert!(rig.mocks[0].requests().is_empty());
}

#[tokio::test]
async fn metrics_endpoint_serves_prometheus_text_with_every_family() {
    let rig = Rig::new(1).await;
    receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[])).await;
    eventually("recorded", || {
        sample(&rig.scrape(), "meridian_requests_total", &[("outcome", "ok")]) == Some(1.0)
    })
    .await;
    let resp = rig.client.get(rig.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    let text = resp.text().await.unwrap();
    for name in [
        "meridian_time_to_first_token_seconds_bucket",
        "meridian_time_to_first_output_token_seconds_bucket",
        "meridian_think_to_output_gap_seconds_bucket",
        "meridian_think_tokens_bucket",
        "meridian_output_tokens_bucket",
        "meridian_open_streams",
        "meridian_upstream_in_flight",
        "meridian_upstream_healthy",
        "meridian_relayed_chunks_total",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    // Prometheus text format 0.0.4: counters typed under their `_total` name.
    assert!(text.contains("# TYPE meridian_relayed_chunks_total counter\n"), "{text}");
}

#[tokio::test]
async fn every_response_carries_the_request_id_decided_once() {
    let rig = Rig::new(1).await;
    for path in ["/health", "/ready", "/metrics", "/v1/models", "/not-v1", "/v1/files"] {
        let got = receive(rig.client.get(rig.url(path)).header("x-request-id", "probe-7")).await;
        assert_eq!(got.headers["x-request-id"], "probe-7", "{path} ({})", got.status);
    }
    // An id that cannot be one (a space in it) is replaced by a fresh one, the same one
    // the client and the engine see.
    let got = receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-request-id", "not an id")])).await;
    let minted = got.headers["x-request-id"].to_str().unwrap().to_owned();
    assert_ne!(minted, "not an id");
    assert_eq!(rig.mocks[0].requests().last().unwrap().header("x-request-id"), Some(minted.as_str()));
    // A head too large is refused before any handler, with an id all the same.
    let got = receive(rig.client.get(rig.url("/health")).header("x-big", "a".repeat(70_000))).await;
    assert_eq!(got.status, 431);
    assert!(got.headers.contains_key("x-request-id"));
}

#[tokio::test]
async fn every_request_is_counted_once_by_its_route_and_outcome() {
    let rig = Rig::with(1, |c| c.server.max_body_bytes = 4096).await;
    for path in ["/health", "/ready", "/metrics"] {
        assert_eq!(receive(rig.client.get(rig.url(path))).await.status, 200);
    }
    // Refused by the body limit before any handler: still counted under its route.
    let big = format!(
        r#"{{"model":"Qwen/Qwen3-8B","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(8000)
    );
    assert_eq!(receive(rig.client.post(rig.url("/v1/chat/completions")).body(big)).await.status, 413);
    assert_eq!(receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[])).await.status, 200);
    assert_eq!(receive(rig.client.get(rig.url("/v1/models"))).await.status, 200);
    eventually("each counted", || {
        let text = rig.scrape();
        let n = |route, outcome| {
            sample(&text, "meridian_requests_total", &[("route", route), ("outcome", outcome)])
        };
        n("chat_completions", "bad_request") == Some(1.0)
            && n("chat_completions", "ok") == Some(1.0)
            && n("models", "ok") == Some(1.0)
    })
    .await;
    let text = rig.scrape();
    let counted: f64 = text
        .lines()
        .filter(|l| l.starts_with("meridian_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(counted, 3.0, "health, readiness and metrics are not counted; the rest once each:\n{text}");
}
