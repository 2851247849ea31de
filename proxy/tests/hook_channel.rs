//! The proxy's side of the policy channel, against a stand-in hook that speaks the
//! protocol (the real hook inside vLLM is tested end to end in tests/python): the hello
//! check decides whether requests go through the hook, budgets travel in `vllm_xargs`,
//! and a thinking-time budget makes the proxy send `end_thinking` for that request.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use meridian_core::channel::{DirectiveBatch, Hello, PROTOCOL_VERSION};
use serde_json::{Value, json};
use support::*;

#[derive(Clone, Default)]
struct FakeHook {
    directives: Arc<Mutex<Vec<Value>>>,
}

const SECRET: &str = "test-secret";

fn authorized(h: &HeaderMap) -> bool {
    h.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {SECRET}"))
        && h.get("meridian-protocol").and_then(|v| v.to_str().ok()) == Some("1")
}

async fn start_fake_hook() -> (String, FakeHook) {
    let hook = FakeHook::default();
    let recorded = hook.clone();
    let app = axum::Router::new()
        .route(
            "/meridian/v1/hello",
            get(|headers: HeaderMap| async move {
                if !authorized(&headers) {
                    return Err(StatusCode::UNAUTHORIZED);
                }
                Ok(Json(Hello {
                    protocol: PROTOCOL_VERSION,
                    min_protocol: PROTOCOL_VERSION,
                    hook_version: "test".into(),
                    policy: "output-first".into(),
                    entropy: false,
                    can_end_thinking: true,
                    engine: None,
                }))
            }),
        )
        .route(
            "/meridian/v1/directives",
            post(move |headers: HeaderMap, Json(batch): Json<DirectiveBatch>| {
                let recorded = recorded.clone();
                async move {
                    if !authorized(&headers) {
                        return Err(StatusCode::UNAUTHORIZED);
                    }
                    let n = batch.directives.len();
                    for d in batch.directives {
                        recorded.directives.lock().unwrap().push(serde_json::to_value(d).unwrap());
                    }
                    Ok(Json(json!({"accepted": n, "seq": 1})))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, hook)
}

/// A proxy whose one upstream has a hook at `hook_addr`, its secret in env var `var`.
async fn rig_with_hook(hook_addr: &str, var: &'static str, secret: &str) -> Rig {
    rig_with_hook_and(hook_addr, var, secret, |_| {}).await
}

async fn rig_with_hook_and(
    hook_addr: &str,
    var: &'static str,
    secret: &str,
    tweak: impl FnOnce(&mut meridian_proxy::config::MeridianConfig),
) -> Rig {
    // SAFETY: each test uses its own variable name, set before anything reads it.
    unsafe { std::env::set_var(var, secret) };
    let addr = hook_addr.to_owned();
    Rig::with(1, move |cfg| {
        cfg.upstream.endpoints[0].hook = Some(addr);
        cfg.upstream.health_interval_s = 0.2;
        cfg.hook.token_env = var.into();
        tweak(cfg);
    })
    .await
}

async fn hook_ready(rig: &Rig) -> f64 {
    let text = rig.scrape();
    text.lines()
        .find(|l| l.starts_with("meridian_upstream_hook_ready{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1.0)
}

async fn wait_ready(rig: &Rig, want: f64) {
    for _ in 0..50 {
        if hook_ready(rig).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("meridian_upstream_hook_ready never became {want}");
}

#[tokio::test]
async fn budgets_go_through_a_ready_hook_in_vllm_xargs() {
    let (addr, _hook) = start_fake_hook().await;
    let rig = rig_with_hook(&addr, "MERIDIAN_TEST_HOOK_SECRET_A", SECRET).await;
    wait_ready(&rig, 1.0).await;
    let body = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [], "meridian": {"think_budget_tokens": 5}});
    let req = rig.client.post(rig.url("/v1/chat/completions")).json(&body);
    let got =
        receive(req.header("x-mock-fixture", "qwen3-reasoning").header("x-request-id", "via-hook")).await;
    assert_eq!(got.status, 200);
    let stream_id = got.headers["x-meridian-stream-id"].to_str().unwrap().to_owned();
    assert!(stream_id.starts_with("mrd_"), "{stream_id}");
    let sent: Value = serde_json::from_str(&rig.mocks[0].requests()[0].body).unwrap();
    assert_eq!(sent["vllm_xargs"], json!({"meridian_request_id": stream_id, "meridian_think_budget": 5}));
    assert_eq!(
        rig.mocks[0].requests()[0].headers["x-request-id"],
        "via-hook",
        "the client's id still goes upstream"
    );
    assert!(sent.get("thinking_token_budget").is_none(), "the hook enforces it, not vLLM's field");
    assert!(sent.get("meridian").is_none());
}

#[tokio::test]
async fn a_hook_that_refuses_the_secret_is_not_used() {
    let (addr, _hook) = start_fake_hook().await;
    let rig = rig_with_hook(&addr, "MERIDIAN_TEST_HOOK_SECRET_B", "wrong-secret").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(hook_ready(&rig).await, 0.0);
    let body = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [], "meridian": {"think_budget_tokens": 5}});
    let req = rig.client.post(rig.url("/v1/chat/completions")).json(&body);
    assert_eq!(receive(req.header("x-mock-fixture", "qwen3-reasoning")).await.status, 200);
    let sent: Value = serde_json::from_str(&rig.mocks[0].requests()[0].body).unwrap();
    assert_eq!(sent["thinking_token_budget"], 5, "falls back to vLLM's own budget field");
    assert!(sent.get("vllm_xargs").is_none());
}

#[tokio::test]
async fn thinking_time_budget_sends_end_thinking_for_that_request() {
    let (addr, hook) = start_fake_hook().await;
    let rig = rig_with_hook(&addr, "MERIDIAN_TEST_HOOK_SECRET_C", SECRET).await;
    wait_ready(&rig, 1.0).await;
    let body = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [], "meridian": {"think_budget_s": 0.1}});
    let req =
        rig.client.post(rig.url("/v1/chat/completions")).json(&body).header("x-request-id", "slow-thinker");
    let got =
        receive(req.header("x-mock-fixture", "qwen3-reasoning").header("x-mock-interval-ms", "40")).await;
    assert_eq!(got.status, 200);
    let stream_id = got.headers["x-meridian-stream-id"].to_str().unwrap().to_owned();
    for _ in 0..20 {
        if !hook.directives.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = hook.directives.lock().unwrap().clone();
    assert_eq!(
        sent,
        vec![
            json!({"request_id": stream_id, "action": "end_thinking"}),
            json!({"request_id": stream_id, "action": "forget"}),
        ],
        "once, by the stream's id, then forgotten when the stream ends"
    );

    // A request that stops thinking before its budget is never told to.
    let quick = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [], "meridian": {"think_budget_s": 30.0}});
    let req = rig.client.post(rig.url("/v1/chat/completions")).json(&quick).header("x-request-id", "quick");
    assert_eq!(receive(req.header("x-mock-fixture", "qwen3-reasoning")).await.status, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let actions: Vec<Value> = hook.directives.lock().unwrap().iter().map(|d| d["action"].clone()).collect();
    assert!(!actions[2..].contains(&json!("end_thinking")), "{actions:?}");
}

#[tokio::test]
async fn two_clients_with_the_same_request_id_never_touch_each_others_thinking() {
    let (addr, hook) = start_fake_hook().await;
    let rig = rig_with_hook(&addr, "MERIDIAN_TEST_HOOK_SECRET_F", SECRET).await;
    wait_ready(&rig, 1.0).await;
    // Both send `X-Request-Id: shared` at once; only the first has a thinking-time budget
    // short enough to be ended.
    let send = |budget_s: f64| {
        let body = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [],
                          "meridian": {"think_budget_s": budget_s}});
        receive(
            rig.client
                .post(rig.url("/v1/chat/completions"))
                .json(&body)
                .header("x-request-id", "shared")
                .header("x-mock-fixture", "qwen3-reasoning")
                .header("x-mock-interval-ms", "40"),
        )
    };
    let (short, long) = tokio::join!(send(0.1), send(30.0));
    assert_eq!((short.status.as_u16(), long.status.as_u16()), (200, 200));
    let stream_of = |got: &Received| got.headers["x-meridian-stream-id"].to_str().unwrap().to_owned();
    let (short_id, long_id) = (stream_of(&short), stream_of(&long));
    assert_ne!(short_id, long_id);
    assert_eq!(short.headers["x-request-id"], "shared");
    assert_eq!(long.headers["x-request-id"], "shared");

    // Upstream, each carries its own stream id for the hook; both keep the client's id.
    let mut sent_ids: Vec<String> = rig.mocks[0]
        .requests()
        .iter()
        .map(|r| {
            assert_eq!(r.headers["x-request-id"], "shared");
            let body: Value = serde_json::from_str(&r.body).unwrap();
            body["vllm_xargs"]["meridian_request_id"].as_str().unwrap().to_owned()
        })
        .collect();
    sent_ids.sort();
    let mut want = vec![short_id.clone(), long_id.clone()];
    want.sort();
    assert_eq!(sent_ids, want);

    // The hook is told to end the first stream's thinking, by its stream id alone.
    let mut directives = Vec::new();
    for _ in 0..40 {
        directives = hook.directives.lock().unwrap().clone();
        if directives.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ended: Vec<&Value> = directives.iter().filter(|d| d["action"] == "end_thinking").collect();
    assert_eq!(ended, vec![&json!({"request_id": short_id, "action": "end_thinking"})], "{directives:?}");
    assert!(directives.iter().all(|d| d["request_id"] != "shared"), "{directives:?}");
    let mut forgotten: Vec<&str> = directives
        .iter()
        .filter(|d| d["action"] == "forget")
        .map(|d| d["request_id"].as_str().unwrap())
        .collect();
    forgotten.sort();
    let mut both = vec![short_id.as_str(), long_id.as_str()];
    both.sort();
    assert_eq!(forgotten, both, "each stream forgotten by its own id: {directives:?}");
}

#[tokio::test]
async fn bad_time_budget_is_a_client_error() {
    let rig = Rig::new(1).await;
    let body = json!({"model": "Qwen/Qwen3-8B", "messages": [], "meridian": {"think_budget_s": -1}});
    let got = receive(rig.client.post(rig.url("/v1/chat/completions")).json(&body)).await;
    assert_eq!(got.status, 400);
    assert!(got.text().contains("meridian.think_budget_s"), "{}", got.text());
}

#[tokio::test]
async fn eat_probes_end_thinking_once_the_entropy_settles() {
    let (addr, hook) = start_fake_hook().await;
    let rig = rig_with_hook_and(&addr, "MERIDIAN_TEST_HOOK_SECRET_D", SECRET, |cfg| {
        cfg.exit.signal = meridian_proxy::config::ExitSignal::Eat;
        cfg.exit.min_think_tokens = 1;
        cfg.exit.eat_probe_every_tokens = 1;
        cfg.exit.eat_warmup_steps = 2;
        cfg.exit.eat_delta = 1e-3;
    })
    .await;
    wait_ready(&rig, 1.0).await;
    // Every probe sees the same two-way split: the variance settles at once.
    let half = 0.5f64.ln();
    rig.mocks[0].set_probe_logprobs(Some(vec![half, half]));
    let body =
        json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [{"role": "user", "content": "q"}]});
    let req = rig.client.post(rig.url("/v1/chat/completions")).json(&body).header("x-request-id", "eat-1");
    let got =
        receive(req.header("x-mock-fixture", "qwen3-reasoning").header("x-mock-interval-ms", "60")).await;
    assert_eq!(got.status, 200);
    let stream_id = got.headers["x-meridian-stream-id"].to_str().unwrap().to_owned();
    for _ in 0..20 {
        if !hook.directives.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ends: Vec<Value> =
        hook.directives.lock().unwrap().iter().filter(|d| d["action"] == "end_thinking").cloned().collect();
    assert_eq!(ends, vec![json!({"request_id": stream_id, "action": "end_thinking"})]);
    let probes: Vec<Value> = rig.mocks[0]
        .requests()
        .iter()
        .filter_map(|r| serde_json::from_str::<Value>(&r.body).ok())
        .filter(|b| b["continue_final_message"] == json!(true))
        .collect();
    assert!(probes.len() >= 3, "warm-up of 2, then the stop: {} probes", probes.len());
    let p = &probes[0];
    assert_eq!(
        (p["max_tokens"].clone(), p["top_logprobs"].clone(), p["add_generation_prompt"].clone()),
        (json!(1), json!(20), json!(false))
    );
    let prefill = p["messages"][1]["content"].as_str().unwrap();
    assert!(prefill.starts_with("<think>\n") && prefill.ends_with("\n</think>\n\n"), "{prefill:?}");
    assert!(p.get("stream").is_none());
    let text = rig.scrape();
    assert!(text.contains("meridian_entropy_exits_total{signal=\"eat\"} 1"), "{text}");
}

#[tokio::test]
async fn responses_and_messages_get_the_same_hook_budgets_and_directives() {
    let (addr, hook) = start_fake_hook().await;
    let rig = rig_with_hook(&addr, "MERIDIAN_TEST_HOOK_SECRET_G", SECRET).await;
    wait_ready(&rig, 1.0).await;
    let apis = [
        ("/v1/responses", json!({"model": "tiny-qwen3", "input": "2+2?", "stream": true})),
        (
            "/v1/messages",
            json!({"model": "tiny-qwen3", "max_tokens": 40, "stream": true,
                                "messages": [{"role": "user", "content": "2+2?"}]}),
        ),
    ];
    for (n, (path, mut body)) in apis.into_iter().enumerate() {
        body["meridian"] = json!({"think_budget_tokens": 6, "think_budget_s": 0.1});
        // Slow enough that the recorded thinking (9 and 20 deltas) outlasts 0.1 s.
        let req = rig.client.post(rig.url(path)).json(&body).header("x-mock-interval-ms", "30");
        let got = receive(req).await;
        assert_eq!(got.status, 200, "{path}: {}", got.text());
        let stream_id = got.headers["x-meridian-stream-id"].to_str().unwrap().to_owned();
        let sent: Value = serde_json::from_str(&rig.mocks[0].requests()[n].body).unwrap();
        assert_eq!(
            sent["vllm_xargs"],
            json!({"meridian_request_id": stream_id, "meridian_think_budget": 6}),
            "{path}: the budget travels to the hook"
        );
        let ended = json!({"request_id": stream_id, "action": "end_thinking"});
        for _ in 0..40 {
            if hook.directives.lock().unwrap().contains(&ended) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            hook.directives.lock().unwrap().contains(&ended),
            "{path}: the tracked thinking time ran past the budget, so the hook was told"
        );
    }
    assert_eq!(
        sample(&rig.scrape(), "meridian_think_budget_unenforced_total", &[("route", "responses")]),
        Some(0.0)
    );
}

#[tokio::test]
async fn a_request_that_waited_for_admission_tells_the_hook_how_long() {
    // The hook's start target (ADR 0012) counts a start's wait; with admission on, starts
    // wait here, not in vLLM's queue, so the proxy says how long in `vllm_xargs`.
    let (addr, _hook) = start_fake_hook().await;
    let rig = rig_with_hook_and(&addr, "MERIDIAN_TEST_HOOK_SECRET_Q", SECRET, |c| {
        c.upstream.idle_timeout_s = 30.0;
        c.admission.enabled = true;
        c.admission.max_streams = Some(1);
        c.admission.queue_timeout_s = 30.0;
    })
    .await;
    wait_ready(&rig, 1.0).await;
    let chat = |extra: Value| {
        let mut body = json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [],
                              "vllm_xargs": {"meridian_queued_ms": 60000}});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        rig.client
            .post(rig.url("/v1/chat/completions"))
            .json(&body)
            .header("x-mock-fixture", "qwen3-reasoning")
    };
    // One stream the mock never finishes holds the only slot.
    let held = chat(json!({})).header("x-mock-hang-after-bytes", "10").send().await.unwrap();
    assert_eq!(held.status(), 200);
    let queued = tokio::spawn(receive(chat(json!({}))));
    let waiting =
        || sample(&rig.scrape(), "meridian_admission_queued", &[("class", "interactive")]) == Some(1.0);
    eventually("the second request queued", waiting).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(held);
    assert_eq!(queued.await.unwrap().status, 200);
    let sent: Vec<Value> =
        rig.mocks[0].requests().iter().map(|r| serde_json::from_str(&r.body).unwrap()).collect();
    assert_eq!(sent.len(), 2);
    assert!(
        sent[0]["vllm_xargs"].get("meridian_queued_ms").is_none(),
        "admitted at once, and a client's own is dropped"
    );
    let waited =
        sent[1]["vllm_xargs"]["meridian_queued_ms"].as_u64().expect("the queued request says how long");
    assert!((300..30_000).contains(&waited), "waited about as long as the slot was held: {waited} ms");
}
