//! Routing by model name: each upstream gets only the requests for the models it serves,
//! learned from its `/v1/models` (or fixed in the config); a model nobody serves gets
//! OpenAI's 404, and a server whose model list cannot be read keeps working.

mod support;

use meridian_mock_upstream::{MockOptions, MockUpstream};
use meridian_proxy::Server;
use meridian_proxy::config::MeridianConfig;
use support::*;

async fn mock(models: &[&str]) -> MockUpstream {
    MockUpstream::start(MockOptions {
        models: models.iter().map(|m| (*m).to_owned()).collect(),
        ..MockOptions::default()
    })
    .await
    .unwrap()
}

async fn proxy(mocks: &[&MockUpstream], tweak: impl FnOnce(&mut MeridianConfig)) -> Server {
    let urls: Vec<String> = mocks.iter().map(|m| m.url()).collect();
    let mut cfg = config_for(&urls);
    tweak(&mut cfg);
    start_proxy(cfg).await
}

async fn chat(proxy: &Server, model: &str) -> Received {
    let body =
        serde_json::json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    receive(client().post(format!("http://{}/v1/chat/completions", proxy.local_addr)).json(&body)).await
}

/// The `model` of every generation request an upstream received.
fn models_received(m: &MockUpstream) -> Vec<String> {
    m.requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["model"].as_str().unwrap().to_owned()
        })
        .collect()
}

async fn listed(proxy: &Server) -> Vec<String> {
    let v: serde_json::Value = client()
        .get(format!("http://{}/v1/models", proxy.local_addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut ids: Vec<String> =
        v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn two_models_behind_one_proxy_each_reach_only_their_engine() {
    let (a, b) = (mock(&["model-a"]).await, mock(&["model-b"]).await);
    let p = proxy(&[&a, &b], |_| {}).await;
    // Known from the first health round, before any traffic.
    assert_eq!(p.state.pool.all()[0].serves("model-a"), Some(true));
    for i in 0..8 {
        let model = if i % 2 == 0 { "model-a" } else { "model-b" };
        let got = chat(&p, model).await;
        assert_eq!(got.status, 200, "{model}: {}", got.text());
        assert!(got.text().ends_with("data: [DONE]\n\n"));
    }
    assert_eq!(models_received(&a), vec!["model-a"; 4]);
    assert_eq!(models_received(&b), vec!["model-b"; 4]);
    assert_eq!(listed(&p).await, vec!["model-a", "model-b"]);
}

#[tokio::test]
async fn a_model_no_upstream_serves_gets_openai_404() {
    let (a, b) = (mock(&["model-a"]).await, mock(&["model-b"]).await);
    let p = proxy(&[&a, &b], |_| {}).await;
    let got = chat(&p, "gpt-5").await;
    assert_eq!(got.status, 404);
    let v = got.json();
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["param"], "model");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("gpt-5"), "{message}");
    // Nothing about the pool: no upstream names, addresses or other models.
    for secret in [a.url(), b.url(), "model-a".into(), "model-b".into(), a.addr().to_string()] {
        assert!(!got.text().contains(&secret), "{secret} leaked: {}", got.text());
    }
    assert!(got.headers.contains_key("x-request-id"));
    assert!(models_received(&a).is_empty() && models_received(&b).is_empty());
    eventually("counted", || {
        sample(&p.state.metrics.render(), "meridian_requests_total", &[("outcome", "model_not_found")])
            == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn the_models_only_server_down_is_503_not_404() {
    let (a, b) = (mock(&["model-a"]).await, mock(&["model-b"]).await);
    let p = proxy(&[&a, &b], |_| {}).await;
    b.set_healthy(false);
    eventually("b out of rotation", || !p.state.pool.all()[1].is_healthy()).await;
    let got = chat(&p, "model-b").await;
    assert_eq!(got.status, 503);
    assert_eq!(got.json()["error"]["code"], "no_healthy_upstream");
    assert!(models_received(&a).is_empty());
}

#[tokio::test]
async fn discovery_failure_keeps_the_last_list_and_unknown_lists_stay_eligible() {
    let (a, b) = (mock(&["model-a"]).await, mock(&["model-b"]).await);
    b.set_models_failing(true);
    let p = proxy(&[&a, &b], |_| {}).await;
    let ub = p.state.pool.all()[1].clone();
    // B's list is unknown: B may serve anything, so a name A does not list goes to B.
    assert_eq!(ub.serves("model-b"), None);
    assert_eq!(chat(&p, "model-b").await.status, 200);
    assert_eq!(chat(&p, "anything").await.status, 200);
    assert_eq!(models_received(&b), vec!["model-b", "anything"]);
    assert!(models_received(&a).is_empty());
    // The proxy's own listing keeps working with what it has.
    assert_eq!(listed(&p).await, vec!["model-a"]);

    // Learned on the next round.
    b.set_models_failing(false);
    eventually("b's list learned", || ub.serves("model-b") == Some(true)).await;
    assert_eq!(chat(&p, "anything").await.status, 404);

    // Broken again (and changed behind the failure): the last good list stays.
    b.set_models(vec!["model-c".into()]);
    b.set_models_failing(true);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(ub.serves("model-b"), Some(true));
    assert_eq!(chat(&p, "model-b").await.status, 200);
    assert_eq!(listed(&p).await, vec!["model-a", "model-b"], "cached names when the live list fails");

    // Refreshed every round once it answers again.
    b.set_models_failing(false);
    eventually("b's new list", || ub.serves("model-c") == Some(true)).await;
    assert_eq!(chat(&p, "model-b").await.status, 404);
    assert_eq!(chat(&p, "model-c").await.status, 200);
}

#[tokio::test]
async fn configured_models_override_discovery() {
    let (a, b) = (mock(&["model-a", "hidden"]).await, mock(&["model-b"]).await);
    let p = proxy(&[&a, &b], |c| {
        c.upstream.endpoints[0].models = Some(vec!["model-a".into(), "alias".into()]);
        c.upstream.endpoints[1].models = Some(vec!["model-b".into()]);
    })
    .await;
    assert_eq!(chat(&p, "alias").await.status, 200);
    assert_eq!(chat(&p, "hidden").await.status, 404, "not in A's configured list");
    assert_eq!(models_received(&a), vec!["alias"]);
    // A's own metadata for the names it lists, a bare entry for the configured alias.
    assert_eq!(listed(&p).await, vec!["alias", "model-a", "model-b"]);
}

/// A stream the mock stops and keeps open, `answering` (after its first visible token) or
/// not (after its first event, before any token): it stays in that phase until dropped.
async fn open_stream(rig: &Rig, answering: bool) -> reqwest::Response {
    let fixture = rig.mocks[0].fixture("qwen3-reasoning").unwrap();
    let ends = fixture.event_ends();
    let text = String::from_utf8_lossy(&fixture.body).into_owned();
    let cut = if answering {
        let first_content =
            text.match_indices("\"content\":\"").find(|(i, m)| !text[i + m.len()..].starts_with('"'));
        let at = first_content.unwrap().0;
        *ends.iter().find(|e| **e > at).unwrap()
    } else {
        ends[0]
    };
    let b = serde_json::json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let resp = rig
        .client
        .post(rig.url("/v1/chat/completions"))
        .header("x-mock-hang-after-bytes", cut.to_string())
        .json(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

#[tokio::test]
async fn among_servers_of_a_model_the_one_with_fewest_answering_streams_wins() {
    let rig = Rig::with(2, |c| c.upstream.idle_timeout_s = 30.0).await;
    let pool = rig.proxy.state.pool.clone();
    let answering = open_stream(&rig, true).await;
    eventually("one stream answering", || pool.all().iter().map(|u| u.output_streams()).sum::<usize>() == 1)
        .await;
    let x = pool.all().iter().position(|u| u.output_streams() == 1).unwrap();
    let y = 1 - x;
    // Two thinking streams: both go to Y, the one without an answering stream, although
    // the second finds Y busier (2 in flight against X's 1).
    let _t1 = open_stream(&rig, false).await;
    let _t2 = open_stream(&rig, false).await;
    assert_eq!((pool.all()[x].in_flight(), pool.all()[y].in_flight()), (1, 2));
    assert_eq!(rig.mocks[y].requests().len(), 2);
    let got = receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[])).await;
    assert_eq!(got.status, 200);
    assert_eq!((rig.mocks[x].requests().len(), rig.mocks[y].requests().len()), (1, 3));
    // The answer ends: X has the fewest in flight again and takes the next one.
    drop(answering);
    eventually("answer closed", || pool.all()[x].output_streams() == 0 && pool.all()[x].in_flight() == 0)
        .await;
    assert_eq!(receive(rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[])).await.status, 200);
    assert_eq!(rig.mocks[x].requests().len(), 2);
}

/// The upstream that received each generation request, by its `x-session-id`.
fn sessions_received(mocks: &[&MockUpstream]) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (i, m) in mocks.iter().enumerate() {
        for r in m.requests().iter().filter(|r| r.path == "/v1/chat/completions") {
            out.push((r.header("x-session-id").unwrap_or("-").to_owned(), i));
        }
    }
    out.sort();
    out
}

async fn chat_in(proxy: &Server, session: Option<&str>) -> Received {
    let body =
        serde_json::json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let mut req = client().post(format!("http://{}/v1/chat/completions", proxy.local_addr)).json(&body);
    if let Some(s) = session {
        req = req.header("x-session-id", s);
    }
    receive(req).await
}

#[tokio::test]
async fn under_prefix_affinity_every_turn_of_a_session_reaches_one_engine() {
    let (a, b, c) = (mock(&["m"]).await, mock(&["m"]).await, mock(&["m"]).await);
    let p =
        proxy(&[&a, &b, &c], |cfg| cfg.upstream.routing = meridian_core::route::RoutingKind::PrefixAffinity)
            .await;
    assert_eq!(p.state.pool.routing(), "prefix-affinity");
    let sessions: Vec<String> = (0..8).map(|s| format!("chat-{s}")).collect();
    for turn in 0..3 {
        for s in &sessions {
            let got = chat_in(&p, Some(s)).await;
            assert_eq!(got.status, 200, "{s} turn {turn}: {}", got.text());
        }
    }
    let seen = sessions_received(&[&a, &b, &c]);
    assert_eq!(seen.len(), 24);
    let mut home = std::collections::BTreeMap::new();
    for (session, engine) in &seen {
        let first = *home.entry(session.clone()).or_insert(*engine);
        assert_eq!(first, *engine, "{session} reached engines {first} and {engine}");
    }
    let engines: std::collections::BTreeSet<_> = home.values().collect();
    assert!(engines.len() >= 2, "8 sessions on one engine: {home:?}");
}

#[tokio::test]
async fn round_robin_takes_each_engine_in_turn() {
    let (a, b) = (mock(&["m"]).await, mock(&["m"]).await);
    let p =
        proxy(&[&a, &b], |cfg| cfg.upstream.routing = meridian_core::route::RoutingKind::RoundRobin).await;
    assert_eq!(p.state.pool.routing(), "round-robin");
    for _ in 0..6 {
        assert_eq!(chat_in(&p, None).await.status, 200);
    }
    let seen = sessions_received(&[&a, &b]);
    assert_eq!(seen.iter().filter(|(_, e)| *e == 0).count(), 3);
    assert_eq!(seen.iter().filter(|(_, e)| *e == 1).count(), 3);
}
