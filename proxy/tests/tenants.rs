//! Tenants through the proxy (`[tenants]`), against mock engines: who may come in (API
//! key digests, a trusted header, a default tenant), what each tenant is held to (streams
//! open at once, generated tokens a minute: 429 with `Retry-After`), what it may not do
//! (set its own vLLM priority), its think budget as default and ceiling, and its fair
//! share of the admission queue against a tenant that floods it.

mod support;

use std::time::Duration;

use meridian_proxy::config::{IdentifyBy, MeridianConfig, TenantConfig};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::*;

fn digest(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn tenant(name: &str, key: &str) -> TenantConfig {
    TenantConfig { name: name.into(), api_key_sha256: vec![digest(key)], ..TenantConfig::default() }
}

fn with_tenants(list: Vec<TenantConfig>) -> impl FnOnce(&mut MeridianConfig) {
    move |c| {
        c.upstream.idle_timeout_s = 30.0;
        c.tenants.enabled = true;
        c.tenants.tenant = list;
    }
}

fn chat(extra: Value) -> Value {
    let mut b =
        json!({"model": "Qwen/Qwen3-8B", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn post(rig: &Rig, body: Value, headers: &[(&str, &str)]) -> reqwest::RequestBuilder {
    let mut req = rig.client.post(rig.url("/v1/chat/completions")).json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

fn error_code(got: &Received) -> String {
    got.json()["error"]["code"].as_str().unwrap_or_default().to_owned()
}

/// Opens a stream the mock never finishes; it holds its tenant's slot until dropped.
async fn hold(rig: &Rig, key: &str) -> reqwest::Response {
    let auth = bearer(key);
    let resp = post(rig, chat(json!({})), &[("authorization", &auth), ("x-mock-hang-after-bytes", "10")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

#[tokio::test]
async fn a_request_without_a_known_key_gets_401_and_never_reaches_the_engine() {
    let rig = Rig::with(1, with_tenants(vec![tenant("search", "sk-search")])).await;
    for headers in
        [vec![], vec![("authorization", "Bearer sk-unknown")], vec![("authorization", "Basic c2s=")]]
    {
        let got = receive(post(&rig, chat(json!({})), &headers)).await;
        assert_eq!(got.status, 401, "{headers:?}: {}", got.text());
        assert_eq!(error_code(&got), "invalid_api_key");
        assert_eq!(got.json()["error"]["type"], "invalid_request_error");
    }
    // Anthropic's clients get Anthropic's shape.
    let messages =
        json!({"model": "Qwen/Qwen3-8B", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let got =
        receive(rig.client.post(rig.url("/v1/messages")).json(&messages).header("x-api-key", "sk-no")).await;
    assert_eq!(got.status, 401, "{}", got.text());
    assert_eq!(
        (got.json()["type"].as_str(), got.json()["error"]["type"].as_str()),
        (Some("error"), Some("authentication_error"))
    );
    assert!(rig.mocks[0].requests().is_empty(), "nothing went upstream");
    let text = rig.scrape();
    assert_eq!(
        sample(
            &text,
            "meridian_requests_total",
            &[("route", "chat_completions"), ("outcome", "unauthorized")]
        ),
        Some(3.0)
    );

    // Its key, as OpenAI's clients send it and as Anthropic's do.
    let got = receive(post(&rig, chat(json!({})), &[("authorization", "Bearer sk-search")])).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(got.text().ends_with("data: [DONE]\n\n"));
    let got = receive(post(&rig, chat(json!({})), &[("x-api-key", "sk-search")])).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(sample(&rig.scrape(), "meridian_tenant_admitted_total", &[("tenant", "search")]), Some(2.0));
}

#[tokio::test]
async fn requests_naming_no_tenant_share_the_default_tenants_limits() {
    let mut anonymous = tenant("anonymous", "sk-unused");
    anonymous.max_streams = Some(1);
    let rig = Rig::with(1, |c| {
        with_tenants(vec![tenant("search", "sk-search"), anonymous])(c);
        c.tenants.default_tenant = Some("anonymous".into());
    })
    .await;
    let _held = {
        let resp = post(&rig, chat(json!({})), &[("x-mock-hang-after-bytes", "10")]).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp
    };
    let got = receive(post(&rig, chat(json!({})), &[("authorization", "Bearer sk-who-knows")])).await;
    assert_eq!(got.status, 429, "an unknown key is the default tenant's too: {}", got.text());
    let got = receive(post(&rig, chat(json!({})), &[("authorization", "Bearer sk-search")])).await;
    assert_eq!(got.status, 200, "a named tenant has its own: {}", got.text());
}

#[tokio::test]
async fn a_tenant_at_its_stream_limit_gets_429_with_retry_after_until_one_ends() {
    let mut search = tenant("search", "sk-search");
    search.max_streams = Some(2);
    let rig = Rig::with(1, with_tenants(vec![search, tenant("chat", "sk-chat")])).await;
    let first = hold(&rig, "sk-search").await;
    let _second = hold(&rig, "sk-search").await;
    eventually("two open", || {
        sample(&rig.scrape(), "meridian_tenant_open_streams", &[("tenant", "search")]) == Some(2.0)
    })
    .await;

    let got = receive(post(&rig, chat(json!({})), &[("authorization", "Bearer sk-search")])).await;
    assert_eq!(got.status, 429, "{}", got.text());
    assert_eq!(error_code(&got), "rate_limit_exceeded");
    assert_eq!(got.json()["error"]["type"], "requests");
    assert_eq!(got.headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    assert_eq!(rig.mocks[0].requests().len(), 2, "the refused one never went upstream");
    // Another tenant is not held to this one's limit.
    let other = receive(post(&rig, chat(json!({})), &[("authorization", "Bearer sk-chat")])).await;
    assert_eq!(other.status, 200, "{}", other.text());

    drop(first);
    eventually("a slot freed", || {
        sample(&rig.scrape(), "meridian_tenant_open_streams", &[("tenant", "search")]) == Some(1.0)
    })
    .await;
    let got = receive(post(&rig, chat(json!({})), &[("authorization", "Bearer sk-search")])).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let text = rig.scrape();
    assert_eq!(
        sample(&text, "meridian_tenant_refused_total", &[("tenant", "search"), ("limit", "max_streams")]),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "meridian_requests_total",
            &[("route", "chat_completions"), ("outcome", "rate_limited")]
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_tenant_that_spent_its_tokens_waits_for_the_bucket_to_refill() {
    let mut small = tenant("small", "sk-small");
    small.tokens_per_minute = Some(5);
    let rig = Rig::with(1, with_tenants(vec![small])).await;
    let got = receive(post(&rig, chat(json!({})), &[("authorization", "Bearer sk-small")])).await;
    assert_eq!(got.status, 200, "a full bucket lets the first in: {}", got.text());
    // The recorded answer is far more than 5 tokens: charged at its end, it empties the bucket.
    eventually("the answer's tokens charged", || {
        sample(&rig.scrape(), "meridian_tenant_generated_tokens_total", &[("tenant", "small")])
            .is_some_and(|n| n > 5.0)
    })
    .await;
    let spent =
        sample(&rig.scrape(), "meridian_tenant_generated_tokens_total", &[("tenant", "small")]).unwrap();

    let got = receive(post(&rig, chat(json!({})), &[("authorization", "Bearer sk-small")])).await;
    assert_eq!(got.status, 429, "{}", got.text());
    assert_eq!(got.json()["error"]["type"], "tokens");
    let retry: f64 = got.headers["retry-after"].to_str().unwrap().parse().unwrap();
    // The debt (spent - 5) refills at 5 a minute: about 12 s per token owed.
    let owed_s = (spent - 5.0) * 12.0;
    assert!(retry >= owed_s - 1.0 && retry <= owed_s + 13.0, "Retry-After {retry} for {spent} tokens");
    assert_eq!(
        sample(
            &rig.scrape(),
            "meridian_tenant_refused_total",
            &[("tenant", "small"), ("limit", "tokens_per_minute")]
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_clients_own_priority_is_dropped_unless_its_tenant_is_allowed_one() {
    let mut trusted = tenant("trusted", "sk-trusted");
    trusted.allow_priority = true;
    let rig = Rig::with(1, with_tenants(vec![tenant("plain", "sk-plain"), trusted])).await;
    let own = chat(json!({"priority": -100}));
    for key in ["sk-plain", "sk-trusted"] {
        let auth = bearer(key);
        let got =
            receive(post(&rig, own.clone(), &[("authorization", &auth), ("x-vllm-priority", "-100")])).await;
        assert_eq!(got.status, 200, "{}", got.text());
    }
    let sent = rig.mocks[0].requests();
    let plain: Value = serde_json::from_str(&sent[0].body).unwrap();
    assert!(plain.get("priority").is_none(), "the body's priority was taken out: {plain}");
    assert_eq!(sent[0].header("x-vllm-priority"), None, "and the header");
    let trusted: Value = serde_json::from_str(&sent[1].body).unwrap();
    assert_eq!(trusted["priority"], -100);
    assert_eq!(sent[1].header("x-vllm-priority"), Some("-100"));
}

#[tokio::test]
async fn with_priorities_on_a_tenant_not_allowed_its_own_gets_its_class_priority() {
    let rig = Rig::with(1, |c| {
        with_tenants(vec![tenant("plain", "sk-plain")])(c);
        c.priority.enabled = true;
    })
    .await;
    let got = receive(post(
        &rig,
        chat(json!({"priority": -100})),
        &[("authorization", "Bearer sk-plain"), ("x-vllm-priority", "-100")],
    ))
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let sent = &rig.mocks[0].requests()[0];
    assert_eq!(sent.header("x-vllm-priority"), Some("0"), "the interactive class's, not its own");
    assert!(serde_json::from_str::<Value>(&sent.body).unwrap().get("priority").is_none());
}

#[tokio::test]
async fn a_tenants_think_budget_is_its_requests_default_and_ceiling() {
    let mut capped = tenant("capped", "sk-capped");
    capped.think_budget_tokens = Some(64);
    let rig = Rig::with(1, with_tenants(vec![capped])).await;
    for (asked, want) in [(None, 64), (Some(4000), 64), (Some(16), 16)] {
        let extra = asked.map_or(json!({}), |n| json!({"meridian": {"think_budget_tokens": n}}));
        let got = receive(post(&rig, chat(extra), &[("authorization", "Bearer sk-capped")])).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let sent: Value = serde_json::from_str(&rig.mocks[0].requests().last().unwrap().body).unwrap();
        assert_eq!(sent["thinking_token_budget"], want, "asked {asked:?}");
    }
}

#[tokio::test]
async fn a_tenant_named_by_a_trusted_header_and_no_other() {
    let rig = Rig::with(1, |c| {
        with_tenants(vec![tenant("search", "sk-search")])(c);
        c.tenants.identify_by = IdentifyBy::Header;
    })
    .await;
    let got = receive(post(&rig, chat(json!({})), &[("x-meridian-tenant", "search")])).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let got = receive(post(&rig, chat(json!({})), &[("x-meridian-tenant", "nobody")])).await;
    assert_eq!(got.status, 401, "{}", got.text());
    let got = receive(post(&rig, chat(json!({})), &[("authorization", "Bearer sk-search")])).await;
    assert_eq!(got.status, 401, "a key names nobody when the header is what counts: {}", got.text());
}

#[tokio::test]
async fn a_flooding_tenant_does_not_hold_another_back_in_the_admission_queue() {
    let rig = Rig::with(1, |c| {
        with_tenants(vec![tenant("flood", "sk-flood"), tenant("victim", "sk-victim")])(c);
        c.admission.enabled = true;
        c.admission.max_streams = Some(1);
        c.admission.queue_timeout_s = 20.0;
    })
    .await;
    let held = hold(&rig, "sk-flood").await;
    let queued = || sample(&rig.scrape(), "meridian_admission_queued", &[("class", "interactive")]);
    let mut waiting = Vec::new();
    for i in 0..4 {
        let req =
            post(&rig, chat(json!({"user": format!("flood-{i}")})), &[("authorization", "Bearer sk-flood")]);
        waiting.push(tokio::spawn(receive(req)));
        eventually("the flood queued", || queued() == Some(f64::from(i + 1))).await;
    }
    let req = post(&rig, chat(json!({"user": "victim"})), &[("authorization", "Bearer sk-victim")]);
    waiting.push(tokio::spawn(receive(req)));
    eventually("the victim queued", || queued() == Some(5.0)).await;

    drop(held);
    for w in waiting {
        let got = w.await.unwrap();
        assert_eq!(got.status, 200, "{}", got.text());
    }
    let order: Vec<String> = rig.mocks[0]
        .requests()
        .iter()
        .skip(1)
        .map(|r| serde_json::from_str::<Value>(&r.body).unwrap()["user"].as_str().unwrap().to_owned())
        .collect();
    // The flood's first waiter arrived before the victim's and goes first; the victim's
    // goes next, not behind the whole flood; the flood keeps its own order.
    assert_eq!(order, ["flood-0", "victim", "flood-1", "flood-2", "flood-3"]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(queued(), Some(0.0));
}

#[tokio::test]
async fn a_flood_that_fills_the_queue_makes_room_for_another_tenant() {
    let rig = Rig::with(1, |c| {
        with_tenants(vec![tenant("flood", "sk-flood"), tenant("victim", "sk-victim")])(c);
        c.admission.enabled = true;
        c.admission.max_streams = Some(1);
        c.admission.max_queued = 3;
        c.admission.queue_timeout_s = 20.0;
    })
    .await;
    let held = hold(&rig, "sk-flood").await;
    let queued = || sample(&rig.scrape(), "meridian_admission_queued", &[("class", "interactive")]);
    let mut flood = Vec::new();
    for i in 0..3 {
        let req =
            post(&rig, chat(json!({"user": format!("flood-{i}")})), &[("authorization", "Bearer sk-flood")]);
        flood.push(tokio::spawn(receive(req)));
        eventually("the flood queued", || queued() == Some(f64::from(i + 1))).await;
    }
    let more = receive(post(&rig, chat(json!({})), &[("authorization", "Bearer sk-flood")])).await;
    assert_eq!((more.status.as_u16(), error_code(&more).as_str()), (503, "admission_queue_full"));

    let victim = tokio::spawn(receive(post(
        &rig,
        chat(json!({"user": "victim"})),
        &[("authorization", "Bearer sk-victim")],
    )));
    // The flood's last waiter gave its place up.
    let gave_way = flood.pop().unwrap().await.unwrap();
    assert_eq!((gave_way.status.as_u16(), error_code(&gave_way).as_str()), (503, "admission_queue_full"));
    drop(held);
    assert_eq!(victim.await.unwrap().status, 200);
    for w in flood {
        assert_eq!(w.await.unwrap().status, 200);
    }
}

#[tokio::test]
async fn every_route_to_an_engine_asks_who_is_calling() {
    let mut one = tenant("search", "sk-search");
    one.max_streams = Some(1);
    let rig = Rig::with(1, with_tenants(vec![one])).await;
    let embed = json!({"model": "Qwen/Qwen3-8B", "input": "hi"});
    let got = receive(rig.client.post(rig.url("/v1/embeddings")).json(&embed)).await;
    assert_eq!((got.status.as_u16(), error_code(&got).as_str()), (401, "invalid_api_key"));
    let got = receive(rig.client.get(rig.url("/v1/models"))).await;
    assert_eq!(got.status, 401, "{}", got.text());
    assert!(rig.mocks[0].requests().iter().all(|r| r.path != "/v1/embeddings"), "nothing went upstream");

    let got = receive(rig.client.post(rig.url("/v1/embeddings")).json(&embed).bearer_auth("sk-search")).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let got = receive(rig.client.get(rig.url("/v1/models")).bearer_auth("sk-search")).await;
    assert_eq!(got.status, 200, "{}", got.text());
    // A pass-through request holds its tenant's slot like any other.
    let _held = hold(&rig, "sk-search").await;
    let got = receive(rig.client.post(rig.url("/v1/embeddings")).json(&embed).bearer_auth("sk-search")).await;
    assert_eq!(got.status, 429, "{}", got.text());
}

#[tokio::test]
async fn replicas_told_their_number_together_hold_a_tenant_to_its_stream_limit() {
    // Three streams over two replicas: replica 0 lets in two, replica 1 one.
    let at = |index: u32| {
        let mut search = tenant("search", "sk-search");
        search.max_streams = Some(3);
        let tenants = with_tenants(vec![search]);
        move |c: &mut MeridianConfig| {
            tenants(c);
            c.admission.replicas = 2;
            c.admission.replica_index = Some(index);
        }
    };
    let (first, second) = (Rig::with(1, at(0)).await, Rig::with(1, at(1)).await);
    let _held =
        [hold(&first, "sk-search").await, hold(&first, "sk-search").await, hold(&second, "sk-search").await];
    for rig in [&first, &second] {
        let got = receive(post(rig, chat(json!({})), &[("authorization", "Bearer sk-search")])).await;
        assert_eq!(got.status, 429, "the tenant has its three streams: {}", got.text());
    }
    assert_eq!(first.mocks[0].requests().len() + second.mocks[0].requests().len(), 3);
}

#[test]
fn a_tenant_limit_too_small_to_split_over_the_replicas_is_refused_at_start() {
    let mut cfg = config_for(&["http://127.0.0.1:1".into()]);
    let mut search = tenant("search", "sk-search");
    search.max_streams = Some(1);
    with_tenants(vec![search])(&mut cfg);
    cfg.admission.replicas = 2;
    let errs = cfg.validate(&registry()).unwrap_err();
    assert!(errs.iter().any(|e| e.path == "tenants.tenant[0].max_streams"), "{errs:?}");
    cfg.admission.replicas = 1;
    assert!(cfg.validate(&registry()).is_ok());
}
