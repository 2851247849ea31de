//! The engine's own count of its requests, as its hook reports it in the hello: admission
//! limits hold per engine however many proxy replicas send to it, and routing sees the
//! answers other replicas stream there. The hook here is a stand-in that speaks the
//! hello; the real one's counts are held to vLLM's in tests/python/test_hook_e2e.py.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::routing::get;
use meridian_core::channel::{EngineState, Hello, PROTOCOL_VERSION};
use serde_json::json;
use support::*;

/// A hook that answers the hello with whatever engine state the test sets.
#[derive(Clone, Default)]
struct ReportingHook {
    engine: Arc<Mutex<Option<EngineState>>>,
}

impl ReportingHook {
    async fn start() -> (String, ReportingHook) {
        let hook = ReportingHook::default();
        let state = hook.engine.clone();
        let app = axum::Router::new().route(
            "/meridian/v1/hello",
            get(move || {
                let engine = state.lock().unwrap().clone();
                async move {
                    Json(Hello {
                        protocol: PROTOCOL_VERSION,
                        min_protocol: PROTOCOL_VERSION,
                        hook_version: "test".into(),
                        policy: "slo-driven".into(),
                        entropy: false,
                        can_end_thinking: true,
                        engine,
                    })
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (addr, hook)
    }

    /// The engine holds `requests` from other replicas, `answering` of them answering.
    fn reports(&self, requests: u32, answering: u32) {
        let state =
            EngineState { thinking: requests - answering, answering, steps: 1, ..EngineState::default() };
        *self.engine.lock().unwrap() = Some(state);
    }
}

fn chat(rig: &Rig) -> reqwest::RequestBuilder {
    let body =
        json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    rig.client.post(rig.url("/v1/chat/completions")).json(&body)
}

/// A proxy whose upstreams have the given hooks (the secret in env var `var`).
async fn rig_with_hooks(
    hooks: &[&str],
    var: &'static str,
    tweak: impl FnOnce(&mut meridian_proxy::config::MeridianConfig),
) -> Rig {
    // SAFETY: each test uses its own variable name, set before anything reads it.
    unsafe { std::env::set_var(var, "secret") };
    let hooks: Vec<String> = hooks.iter().map(|h| (*h).to_owned()).collect();
    Rig::with(hooks.len(), move |cfg| {
        for (ep, hook) in cfg.upstream.endpoints.iter_mut().zip(hooks) {
            ep.hook = Some(hook);
        }
        cfg.upstream.health_interval_s = 0.1;
        cfg.hook.token_env = var.into();
        tweak(cfg);
    })
    .await
}

#[tokio::test]
async fn max_streams_counts_the_requests_other_replicas_sent_to_the_engine() {
    let (addr, hook) = ReportingHook::start().await;
    hook.reports(2, 0);
    let rig = rig_with_hooks(&[&addr], "MERIDIAN_TEST_ENGINE_STATE_A", |c| {
        c.admission.enabled = true;
        c.admission.max_streams = Some(2);
        c.admission.queue_timeout_s = 10.0;
    })
    .await;
    let upstream = rig.proxy.state.pool.all()[0].clone();
    eventually("the engine's count read", || upstream.engine.now().is_some_and(|n| n.requests == 2)).await;
    // This replica has nothing open there, but the engine holds two: the request waits.
    let waiting = tokio::spawn(receive(chat(&rig)));
    eventually("queued", || {
        sample(&rig.scrape(), "meridian_admission_queued", &[("class", "interactive")]) == Some(1.0)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        rig.mocks[0].requests().iter().all(|r| r.path != "/v1/chat/completions"),
        "held while the engine is full"
    );
    // The other replicas' requests end: the next reading frees the slot.
    hook.reports(1, 0);
    let got = waiting.await.unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(got.text().ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn routing_sees_the_answers_other_replicas_stream_on_an_engine() {
    let (busy_addr, busy) = ReportingHook::start().await;
    let (idle_addr, idle) = ReportingHook::start().await;
    // Engine 0 streams five answers for other replicas; engine 1 is idle. Both read
    // empty to this replica, which would send half of its requests to engine 0.
    busy.reports(5, 5);
    idle.reports(0, 0);
    let rig = rig_with_hooks(&[&busy_addr, &idle_addr], "MERIDIAN_TEST_ENGINE_STATE_B", |_| {}).await;
    let pool = rig.proxy.state.pool.clone();
    eventually("both engines read", || pool.all().iter().all(|u| u.engine.now().is_some())).await;
    for _ in 0..6 {
        let got = receive(chat(&rig)).await;
        assert_eq!(got.status, 200, "{}", got.text());
    }
    let sent = |i: usize| rig.mocks[i].requests().iter().filter(|r| r.path == "/v1/chat/completions").count();
    assert_eq!((sent(0), sent(1)), (0, 6), "every request went where no answer streams");
    // A hook that stops reporting leaves this replica's own count, and the two share again.
    *busy.engine.lock().unwrap() = None;
    eventually("engine 0's count dropped", || pool.all()[0].engine.now().is_none()).await;
    for _ in 0..6 {
        assert_eq!(receive(chat(&rig)).await.status, 200);
    }
    assert!(sent(0) >= 2, "engine 0 gets requests again: {} of 6", sent(0));
}

#[tokio::test]
async fn without_a_hook_vllms_own_gauges_count_every_replicas_requests() {
    let rig = Rig::with(1, |c| {
        c.upstream.health_interval_s = 0.1;
        c.admission.enabled = true;
        c.admission.max_streams = Some(2);
        c.admission.queue_timeout_s = 10.0;
    })
    .await;
    // Other replicas keep two requests running on the engine, which reports them.
    rig.mocks[0].set_engine_running(Some(2.0));
    let upstream = rig.proxy.state.pool.all()[0].clone();
    eventually("vLLM's count read", || upstream.engine.now().is_some_and(|n| n.requests == 2)).await;
    let waiting = tokio::spawn(receive(chat(&rig)));
    eventually("queued", || {
        sample(&rig.scrape(), "meridian_admission_queued", &[("class", "interactive")]) == Some(1.0)
    })
    .await;
    rig.mocks[0].set_engine_running(Some(1.0));
    let got = waiting.await.unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    // A server whose /metrics stops saying leaves this replica's own count.
    rig.mocks[0].set_engine_running(None);
    eventually("the count dropped", || upstream.engine.now().is_none()).await;
    assert_eq!(receive(chat(&rig)).await.status, 200);
}
