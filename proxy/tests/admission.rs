//! Admission control against mock engines: requests wait in the proxy while their
//! upstreams are saturated (by the proxy's own stream count or the engine's gauges), are
//! let through highest class first, and leave the queue on timeout or disconnect.

mod support;

use std::time::{Duration, Instant};

use meridian_proxy::config::MeridianConfig;
use serde_json::{Value, json};
use support::*;

fn body(extra: Value) -> Value {
    let mut b =
        json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn post(rig: &Rig, b: Value, headers: &[(&str, &str)]) -> reqwest::RequestBuilder {
    let mut req = rig.client.post(rig.url("/v1/chat/completions")).json(&b);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req
}

fn admission(max_streams: u32, timeout_s: f64) -> impl FnOnce(&mut MeridianConfig) {
    move |c| {
        c.upstream.idle_timeout_s = 30.0;
        c.admission.enabled = true;
        c.admission.max_streams = Some(max_streams);
        c.admission.queue_timeout_s = timeout_s;
    }
}

fn queued(rig: &Rig, class: &str) -> f64 {
    sample(&rig.scrape(), "meridian_admission_queued", &[("class", class)]).unwrap_or(-1.0)
}

/// Opens a stream the mock never finishes; it holds its upstream until dropped.
async fn hold(rig: &Rig) -> reqwest::Response {
    let resp = post(rig, body(json!({})), &[("x-mock-hang-after-bytes", "10")]).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

#[tokio::test]
async fn a_queued_output_phase_request_goes_before_an_earlier_batch_one() {
    let rig = Rig::with(1, admission(1, 10.0)).await;
    let held = hold(&rig).await;

    let batch = tokio::spawn(receive(post(&rig, body(json!({"meridian": {"class": "batch"}})), &[])));
    eventually("batch queued", || queued(&rig, "batch") == 1.0).await;
    let answer_now = body(json!({"chat_template_kwargs": {"enable_thinking": false}}));
    let output = tokio::spawn(receive(post(&rig, answer_now, &[])));
    eventually("output queued", || queued(&rig, "output") == 1.0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rig.mocks[0].requests().len(), 1, "nothing passes while the upstream is full");

    drop(held);
    let (output, batch) = (output.await.unwrap(), batch.await.unwrap());
    assert_eq!((output.status.as_u16(), batch.status.as_u16()), (200, 200));
    assert!(output.text().ends_with("data: [DONE]\n\n") && batch.text().ends_with("data: [DONE]\n\n"));
    let order: Vec<String> = rig.mocks[0].requests().iter().map(|r| r.body.clone()).collect();
    assert_eq!(order.len(), 3);
    assert!(order[1].contains("enable_thinking"), "the output-phase request went second: {order:?}");
    assert!(!order[2].contains("meridian"), "the batch one last, its extension stripped: {order:?}");
    let text = rig.scrape();
    assert_eq!(sample(&text, "meridian_admission_admitted_total", &[("class", "output")]), Some(1.0));
    assert_eq!(sample(&text, "meridian_admission_admitted_total", &[("class", "batch")]), Some(1.0));
    assert_eq!(sample(&text, "meridian_admission_admitted_total", &[("class", "interactive")]), Some(1.0));
    assert_eq!(sample(&text, "meridian_admission_wait_seconds_count", &[("class", "batch")]), Some(1.0));
    assert!(sample(&text, "meridian_admission_wait_seconds_sum", &[("class", "batch")]).unwrap() > 0.1);
}

#[tokio::test]
async fn a_replica_told_it_is_one_of_two_holds_its_part_of_each_engines_limit() {
    // A limit of 5 shared by two replicas: 3 for replica 0 (the odd place), 2 for this one.
    let rig = Rig::with(1, |c| {
        admission(5, 10.0)(c);
        c.upstream.health_interval_s = 0.1;
        c.admission.replicas = 2;
        c.admission.replica_index = Some(1);
    })
    .await;
    // The engine reports only what this replica sends it: the other replica is idle.
    rig.mocks[0].set_engine_running(Some(0.0));
    let upstream = rig.proxy.state.pool.all()[0].clone();
    eventually("the engine's count read", || upstream.engine.now().is_some()).await;
    let _first = hold(&rig).await;
    let second = hold(&rig).await;
    let third = tokio::spawn(receive(post(&rig, body(json!({})), &[])));
    eventually("the third queued", || queued(&rig, "interactive") == 1.0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        rig.mocks[0].requests().len(),
        2,
        "held at its part, the engine's other places left to replica 0"
    );
    // One of its own ends: its place is free at once, with no reading needed.
    drop(second);
    let got = third.await.unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(got.text().ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn a_request_that_waits_too_long_gets_503_admission_timeout() {
    let rig = Rig::with(1, admission(1, 0.3)).await;
    let _held = hold(&rig).await;
    let started = Instant::now();
    let got = receive(post(&rig, body(json!({})), &[])).await;
    let waited = started.elapsed();
    assert_eq!(got.status, 503);
    let v = got.json();
    assert_eq!(v["error"]["code"], "admission_timeout");
    assert_eq!(v["error"]["type"], "server_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("0.3s"), "{v}");
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(3), "{waited:?}");
    assert_eq!(rig.mocks[0].requests().len(), 1);
    let text = rig.scrape();
    assert_eq!(sample(&text, "meridian_admission_timed_out_total", &[("class", "interactive")]), Some(1.0));
    assert_eq!(queued(&rig, "interactive"), 0.0);
    assert_eq!(sample(&text, "meridian_requests_total", &[("outcome", "admission_timeout")]), Some(1.0));
}

#[tokio::test]
async fn a_full_queue_refuses_at_once_or_makes_a_batch_request_give_way() {
    let rig = Rig::with(1, |c| {
        admission(1, 10.0)(c);
        c.admission.max_queued = 1;
    })
    .await;
    let held = hold(&rig).await;
    let first_batch = tokio::spawn(receive(post(&rig, body(json!({"meridian": {"class": "batch"}})), &[])));
    eventually("batch queued", || queued(&rig, "batch") == 1.0).await;

    let started = Instant::now();
    let refused = receive(post(&rig, body(json!({"meridian": {"class": "batch"}})), &[])).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.json()["error"]["code"], "admission_queue_full");
    assert!(started.elapsed() < Duration::from_secs(1), "refused at once");

    // An interactive request takes the batch one's place; the batch one is refused.
    let interactive = tokio::spawn(receive(post(&rig, body(json!({})), &[])));
    let evicted = first_batch.await.unwrap();
    assert_eq!(evicted.status, 503);
    assert_eq!(evicted.json()["error"]["code"], "admission_queue_full");
    eventually("interactive queued", || queued(&rig, "interactive") == 1.0 && queued(&rig, "batch") == 0.0)
        .await;
    drop(held);
    assert_eq!(interactive.await.unwrap().status, 200);
    assert_eq!(sample(&rig.scrape(), "meridian_admission_rejected_total", &[("class", "batch")]), Some(2.0));
}

#[tokio::test]
async fn a_client_that_leaves_while_queued_leaves_the_queue() {
    let rig = Rig::with(1, admission(1, 10.0)).await;
    let held = hold(&rig).await;
    let gone = post(&rig, body(json!({})), &[]).timeout(Duration::from_millis(300)).send().await;
    assert!(gone.is_err(), "the client gave up");
    eventually("queue empty again", || queued(&rig, "interactive") == 0.0).await;
    drop(held);
    // The next request is let through at once, and the one that left never went upstream.
    let got = receive(post(&rig, body(json!({})), &[])).await;
    assert_eq!(got.status, 200);
    assert_eq!(rig.mocks[0].requests().len(), 2);
    assert_eq!(
        sample(&rig.scrape(), "meridian_admission_admitted_total", &[("class", "interactive")]),
        Some(2.0)
    );
}

#[tokio::test]
async fn the_engines_own_gauges_saturate_it() {
    // Two engines; admission on the engines' gauges only.
    let rig = Rig::with(2, |c| {
        c.admission.enabled = true;
        c.admission.max_waiting = Some(2);
        c.admission.max_kv_usage = Some(0.9);
        c.admission.queue_timeout_s = 10.0;
    })
    .await;
    let [a, b] = [&rig.proxy.state.pool.all()[0], &rig.proxy.state.pool.all()[1]];
    // A's KV cache is nearly full: everything goes to B.
    rig.mocks[0].set_engine_load(0.0, 0.95);
    eventually("A's gauges read", || a.engine_load() == (Some(0.0), Some(0.95))).await;
    for _ in 0..3 {
        assert_eq!(receive(post(&rig, body(json!({})), &[])).await.status, 200);
    }
    assert_eq!((rig.mocks[0].requests().len(), rig.mocks[1].requests().len()), (0, 3));

    // B has a queue of its own now (waiting 3 > 2): both saturated, requests wait here.
    rig.mocks[1].set_engine_load(3.0, 0.2);
    eventually("B's gauges read", || b.engine_load() == (Some(3.0), Some(0.2))).await;
    let waiting = tokio::spawn(receive(post(&rig, body(json!({})), &[])));
    eventually("queued", || queued(&rig, "interactive") == 1.0).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(queued(&rig, "interactive"), 1.0, "still waiting after two health rounds");

    // A's cache drains: the next health round lets the request through, to A.
    rig.mocks[0].set_engine_load(0.0, 0.5);
    let got = waiting.await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!((rig.mocks[0].requests().len(), rig.mocks[1].requests().len()), (1, 3));
}

#[tokio::test]
async fn off_by_default_and_never_scrapes() {
    let rig = Rig::new(1).await;
    rig.mocks[0].set_engine_load(100.0, 1.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.proxy.state.pool.all()[0].engine_load(), (None, None));
    assert_eq!(receive(post(&rig, body(json!({})), &[])).await.status, 200);
    assert_eq!(
        sample(&rig.scrape(), "meridian_admission_admitted_total", &[("class", "interactive")]),
        Some(0.0)
    );
}
