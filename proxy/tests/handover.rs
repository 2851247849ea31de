//! Phase-boundary migration by re-prefill (`upstream.endpoints[].role`): a request that
//! thinks goes to a `think` upstream; when its thought ends, by itself or cut by a
//! budget, its answer continues on an `answer` upstream, and the client reads one stream
//! (one id, reasoning then answer, one usage that adds both legs up). A request that
//! does not think goes straight to the answer upstream; an answer with nowhere to go
//! stays where it is. Against two engine twins, which answer `continue_final_message`
//! the way vLLM does.

mod support;

use meridian_core::route::Role;
use meridian_proxy::config::{Forcing, Handover, MeridianConfig, PlacesFrom};
use meridian_sim::server::{TwinOptions, TwinServer};
use meridian_sim::workload::WorkloadSpec;
use serde_json::json;
use support::*;

/// A proxy in front of a `think` twin (first) and an `answer` twin (second).
async fn proxy(
    think: &TwinServer,
    answer: &TwinServer,
    tweak: impl FnOnce(&mut MeridianConfig),
) -> meridian_proxy::Server {
    let mut cfg = config_for(&[think.url(), answer.url()]);
    cfg.upstream.endpoints[0].name = Some("think".into());
    cfg.upstream.endpoints[0].role = Role::Think;
    cfg.upstream.endpoints[1].name = Some("answer".into());
    cfg.upstream.endpoints[1].role = Role::Answer;
    tweak(&mut cfg);
    start_proxy(cfg).await
}

/// A twin's own count of the requests it finished (`stop`) and aborted.
async fn served(twin: &TwinServer) -> (f64, f64) {
    let text = client().get(format!("{}/metrics", twin.url())).send().await.unwrap().text().await.unwrap();
    let count = |reason: &str| {
        text.lines()
            .filter(|l| {
                l.starts_with("vllm:request_success_total")
                    && l.contains(&format!("finished_reason=\"{reason}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    (count("stop"), count("abort"))
}

fn handovers(proxy: &meridian_proxy::Server, outcome: &str) -> f64 {
    let text = proxy.state.metrics.render();
    sample(&text, "meridian_handovers_total", &[("outcome", outcome)]).unwrap_or(-1.0)
}

fn in_flight(proxy: &meridian_proxy::Server) -> Vec<usize> {
    proxy.state.pool.all().iter().map(|u| u.in_flight()).collect()
}

#[tokio::test]
async fn a_finished_thought_hands_its_answer_to_the_answer_upstream() {
    let (think, answer) = (twin().await, twin().await);
    let proxy = proxy(&think, &answer, |_| {}).await;
    let r = stream(&proxy, "/v1/chat/completions", chat(json!({}))).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.reasoning.len(), 40, "the whole thought, from the think upstream");
    assert!(r.content.len() >= 6, "the answer, from the answer upstream: {:?}", r.content);
    assert!(!r.reasoning_after_answer);
    assert_eq!((r.roles, r.done), (1, 1), "one stream: one role chunk, one [DONE]");
    assert!(r.ids.iter().all(|id| *id == r.ids[0]), "one response id: {:?}", r.ids);
    assert_eq!(r.usage.len(), 1, "one usage chunk, as asked");
    let u = &r.usage[0];
    // The first leg's 40 thinking tokens (41 with its end tag), its first answer token and
    // the answer upstream's 6.
    let reasoning = u["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
    assert!((40..=41).contains(&reasoning), "the first leg's thought: {u}");
    assert_eq!(u["completion_tokens"], 48, "both legs' counts added up: {u}");

    eventually("the answer finished on the answer upstream", || handovers(&proxy, "moved") == 1.0).await;
    let (done_there, _) = served(&answer).await;
    assert_eq!(done_there, 1.0, "the answer upstream finished the answer");
    let (done_here, aborted_here) = served(&think).await;
    assert_eq!(done_here, 0.0, "the think upstream did not answer");
    if aborted_here < 1.0 {
        // The twin notices the first leg's dropped connection a moment later.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert_eq!(served(&think).await.1, 1.0, "the first leg was aborted on the think upstream");
    }
    eventually("both places free", || in_flight(&proxy) == [0, 0]).await;
    assert_eq!(
        sample(&proxy.state.metrics.render(), "meridian_requests_total", &[("outcome", "ok")]),
        Some(1.0),
        "one request, answered"
    );
}

#[tokio::test]
async fn a_budget_cut_on_a_think_upstream_answers_on_the_answer_upstream() {
    let (think, answer) = (twin().await, twin().await);
    let proxy = proxy(&think, &answer, |c| c.budget.forcing = Forcing::Continuation).await;
    let r =
        stream(&proxy, "/v1/chat/completions", chat(json!({"meridian": {"think_budget_tokens": 5}}))).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!((r.reasoning.len(), r.content.len()), (5, 6), "cut at the budget, answered elsewhere");
    assert_eq!(r.usage[0]["completion_tokens"], 11);
    eventually("moved", || handovers(&proxy, "moved") == 1.0).await;
    assert_eq!(served(&answer).await.0, 1.0);
    assert_eq!(served(&think).await.0, 0.0);
}

#[tokio::test]
async fn by_connector_the_think_upstream_exports_first_and_the_answer_still_reads_as_one() {
    let (think, answer) = (twin().await, twin().await);
    let proxy = proxy(&think, &answer, |c| c.upstream.handover = Handover::Connector).await;
    let r = stream(&proxy, "/v1/chat/completions", chat(json!({}))).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.reasoning.len(), 40);
    assert!(r.content.len() >= 6 && !r.reasoning_after_answer && r.done == 1, "{r:?}");
    eventually("moved", || handovers(&proxy, "moved") == 1.0).await;
    let exports = |outcome: &str| {
        sample(&proxy.state.metrics.render(), "meridian_handover_kv_exports_total", &[("outcome", outcome)])
    };
    assert_eq!((exports("ok"), exports("failed")), (Some(1.0), Some(0.0)));
    // The export is a one-token request the think upstream finishes; the answer finishes
    // on the answer upstream.
    assert_eq!((served(&think).await.0, served(&answer).await.0), (1.0, 1.0));
}

#[tokio::test]
async fn a_request_that_does_not_think_goes_to_the_answer_upstream() {
    let (think, answer) = (twin().await, twin().await);
    let proxy = proxy(&think, &answer, |_| {}).await;
    let r = stream(
        &proxy,
        "/v1/chat/completions",
        chat(json!({"chat_template_kwargs": {"enable_thinking": false}})),
    )
    .await;
    assert!(r.errors.is_empty() && r.reasoning.is_empty() && r.content.len() == 6, "{r:?}");
    assert_eq!((served(&answer).await.0, served(&think).await.0), (1.0, 0.0));
    assert_eq!(handovers(&proxy, "moved") + handovers(&proxy, "no_room"), 0.0, "nothing to hand over");
}

#[tokio::test]
async fn an_answer_with_no_upstream_to_go_to_stays_where_it_is() {
    let (think, answer) = (twin().await, twin().await);
    // The answer upstream is full: admission lets one request hold each engine.
    let proxy = proxy(&think, &answer, |c| {
        c.admission.enabled = true;
        c.admission.max_streams = Some(1);
    })
    .await;
    let busy = proxy.state.pool.all()[1].clone();
    let held = proxy
        .state
        .pool
        .pick(
            meridian_proxy::upstream::Want::model(None),
            &[proxy.state.pool.all()[0].clone()],
            &proxy.state.metrics,
        )
        .unwrap();
    assert!(std::sync::Arc::ptr_eq(held.upstream(), &busy));
    let r = stream(&proxy, "/v1/chat/completions", chat(json!({}))).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(
        (r.reasoning.len(), r.content.len()),
        (40, 6),
        "thought and answer, all from the think upstream"
    );
    assert_eq!(handovers(&proxy, "no_room"), 1.0);
    assert_eq!((served(&think).await.0, served(&answer).await.0), (1.0, 0.0));
    drop(held);
}

const PLACES_TOKEN_ENV: &str = "MERIDIAN_TEST_HANDOVER_PLACES_TOKEN";

/// As [`twin`], serving the policy channel's places with the test's secret.
async fn twin_granting_places() -> TwinServer {
    twin_granting_places_of(WorkloadSpec::fixed(20, 40, 6), 50.0).await
}

/// A twin of `workload` at `speed` times real time, serving the policy channel's places
/// with the test's secret.
async fn twin_granting_places_of(workload: WorkloadSpec, speed: f64) -> TwinServer {
    // SAFETY: every test here sets the same value before anything reads it.
    unsafe { std::env::set_var(PLACES_TOKEN_ENV, "handover-secret") };
    let opts = TwinOptions {
        channel_secret: Some("handover-secret".into()),
        ..TwinOptions::local(meridian_sim::profile("h100-qwen3-8b").unwrap(), workload, speed)
    };
    TwinServer::start(opts, Box::new(meridian_core::sched::Fcfs)).await.unwrap()
}

/// A claim on `twin`'s only place, sent as another proxy replica would.
async fn other_replica_holds(twin: &TwinServer, held: u32, want: u32) -> bool {
    claim_as_replica(twin, PLACES_TOKEN_ENV, "other", held, want).await.granted
}

/// [`proxy`] asking both engines for places, each limited to one stream.
async fn proxy_granted_places(
    think: &TwinServer,
    answer: &TwinServer,
    tweak: impl FnOnce(&mut MeridianConfig),
) -> meridian_proxy::Server {
    proxy(think, answer, |c| {
        for (endpoint, twin) in c.upstream.endpoints.iter_mut().zip([think, answer]) {
            endpoint.hook = Some(twin.addr.to_string());
        }
        c.hook.token_env = PLACES_TOKEN_ENV.into();
        c.admission.enabled = true;
        c.admission.max_streams = Some(1);
        c.admission.places = PlacesFrom::Engine;
        // Probes that time out on a busy machine would take a twin out of rotation.
        c.upstream.health_interval_s = 1.0;
        tweak(c);
    })
    .await
}

fn place_claims(proxy: &meridian_proxy::Server, outcome: &str) -> f64 {
    let text = proxy.state.metrics.render();
    sample(&text, "meridian_admission_place_claims_total", &[("outcome", outcome)]).unwrap_or(0.0)
}

#[tokio::test]
async fn with_places_from_the_engine_an_answer_moves_only_to_a_place_the_answer_engine_grants() {
    let (think, answer) = (twin_granting_places().await, twin_granting_places().await);
    let proxy = proxy_granted_places(&think, &answer, |_| {}).await;
    // Another replica holds the answer engine's only place: this replica has room there
    // by its own count, but the engine refuses the answer, which stays.
    assert!(other_replica_holds(&answer, 0, 1).await);
    let r = stream(&proxy, "/v1/chat/completions", chat(json!({}))).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!((r.reasoning.len(), r.content.len()), (40, 6), "all from the think upstream");
    assert_eq!((handovers(&proxy, "moved"), handovers(&proxy, "no_room")), (0.0, 1.0));
    assert_eq!(place_claims(&proxy, "refused"), 1.0, "the answer engine was asked, and refused");
    assert_eq!((served(&think).await.0, served(&answer).await.0), (1.0, 0.0));

    // The other replica's request ends: the next answer claims the place, and moves,
    // read as one stream as ever.
    assert!(other_replica_holds(&answer, 0, 0).await);
    let granted = place_claims(&proxy, "granted");
    let r = stream(&proxy, "/v1/chat/completions", chat(json!({}))).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.reasoning.len(), 40);
    assert!(r.content.len() >= 6 && !r.reasoning_after_answer && r.done == 1, "{r:?}");
    eventually("moved", || handovers(&proxy, "moved") == 1.0).await;
    assert_eq!(place_claims(&proxy, "granted"), granted + 2.0, "a place at each engine, in turn");
    assert_eq!((served(&think).await.0, served(&answer).await.0), (1.0, 1.0));
    // Both places went back: the other replica may take the answer engine's again.
    eventually("both places free", || in_flight(&proxy) == [0, 0]).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !other_replica_holds(&answer, 0, 1).await {
        assert!(std::time::Instant::now() < deadline, "the answer's place was never given back");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_budget_cut_refused_a_place_at_the_answer_engine_answers_where_it_thought() {
    let (think, answer) = (twin_granting_places().await, twin_granting_places().await);
    let proxy = proxy_granted_places(&think, &answer, |c| c.budget.forcing = Forcing::Continuation).await;
    assert!(other_replica_holds(&answer, 0, 1).await);
    let r =
        stream(&proxy, "/v1/chat/completions", chat(json!({"meridian": {"think_budget_tokens": 5}}))).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(r.content.len() == 6 && !r.reasoning_after_answer && r.done == 1, "{r:?}");
    // The thought ran on while the answer engine was asked (a round trip's worth of
    // tokens past the budget; on a busy machine, at fifty times real time, maybe to its
    // own end, after which the answer simply stays).
    assert!((5..=40).contains(&r.reasoning.len()), "{}", r.reasoning.len());
    assert_eq!((handovers(&proxy, "moved"), handovers(&proxy, "no_room")), (0.0, 1.0));
    assert_eq!(place_claims(&proxy, "refused"), 1.0);
    // The continuation went back to the think upstream, which still held the place.
    assert_eq!((served(&think).await.0, served(&answer).await.0), (1.0, 0.0));
}

#[tokio::test]
async fn an_answer_that_finishes_while_its_place_is_claimed_is_counted_as_ended_where_it_was() {
    let (think, answer) = (twin_granting_places().await, twin_granting_places().await);
    let silent = silent_hook().await;
    let proxy = proxy_granted_places(&think, &answer, |c| {
        c.upstream.endpoints[1].hook = Some(silent.to_string());
        // Far longer than the answer takes at fifty times real time, even on a busy machine.
        c.hook.timeout_s = 5.0;
    })
    .await;
    let r = stream(&proxy, "/v1/chat/completions", chat(json!({}))).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    // The claim on the answer engine's place was never answered: the answer went on
    // where it thought and finished there, neither moved nor refused a place.
    assert_eq!((r.reasoning.len(), r.content.len()), (40, 6), "all from the think upstream");
    eventually("the hand-over counted", || handovers(&proxy, "ended") == 1.0).await;
    assert_eq!((handovers(&proxy, "moved"), handovers(&proxy, "no_room")), (0.0, 0.0));
    assert_eq!((served(&think).await.0, served(&answer).await.0), (1.0, 0.0));
}

#[tokio::test]
async fn an_answer_handed_to_an_engine_whose_hook_is_away_counts_there_once_it_answers_again() {
    // Answers of 1,500 tokens in real time: the moved answer runs for seconds.
    let slow = || twin_granting_places_of(WorkloadSpec::fixed(20, 40, 1500), 1.0);
    let (think, answer) = (slow().await, slow().await);
    let relay = HookRelay::start(answer.addr).await;
    relay.cut();
    let proxy = proxy_granted_places(&think, &answer, |c| {
        c.upstream.endpoints[1].hook = Some(relay.addr.to_string())
    })
    .await;
    // The answer engine's renewals go unanswered: after three (a second apart) this
    // replica decides that engine's room alone, and answers go there without a claim.
    let engine = std::sync::Arc::clone(&proxy.state.pool.all()[1]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while !engine.places.alone() {
        assert!(std::time::Instant::now() < deadline, "the replica never decided the answer engine alone");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The response is held unread: the answer stays open at the answer engine.
    let held = client()
        .post(format!("http://{}/v1/chat/completions", proxy.local_addr))
        .json(&chat(json!({})))
        .send()
        .await
        .unwrap();
    eventually("the answer moved", || handovers(&proxy, "moved") == 1.0).await;
    assert_eq!(
        places_counted(&answer, PLACES_TOKEN_ENV).await,
        0,
        "the answer engine heard of no answer yet"
    );
    relay.mend();
    // The renewal that finds the hook answering again states the moved answer.
    let within = std::time::Duration::from_secs(5);
    counts_places(&answer, PLACES_TOKEN_ENV, 1, within, "the answer moved while the hook was away").await;
    assert!(!other_replica_holds(&answer, 0, 1).await, "another replica was granted the answer's place");
    drop(held);
    counts_places(&answer, PLACES_TOKEN_ENV, 0, within, "the answer ended").await;
}

#[test]
fn think_upstreams_need_somewhere_to_hand_answers_to() {
    let mut cfg = config_for(&["http://127.0.0.1:1".into()]);
    cfg.upstream.endpoints[0].role = Role::Think;
    let errs = cfg.validate(&registry()).unwrap_err();
    assert!(errs.iter().any(|e| e.path == "upstream.endpoints[0].role"), "{errs:?}");
    cfg.upstream.endpoints.push(cfg.upstream.endpoints[0].clone());
    cfg.upstream.endpoints[1].role = Role::Both;
    assert!(cfg.validate(&registry()).is_ok(), "a `both` server takes answers");
}
