//! Ending thinking without a hook, by continuation: the proxy cuts the upstream's think
//! stream and continues it past the end-of-thinking delimiter, and the client reads one
//! stream (one id, reasoning then answer, one usage that adds up). Against the engine
//! twin, which answers `continue_final_message` the way vLLM does (the continued text
//! labelled as reasoning, since its parser never sees the end tag).

mod support;

use meridian_proxy::config::MeridianConfig;
use meridian_proxy::config::{ExitSignal, Forcing};
use meridian_sim::server::TwinServer;
use meridian_sim::workload::{EntropySpec, WorkloadSpec};
use serde_json::{Value, json};
use support::*;

async fn proxy(twin: &TwinServer, tweak: impl FnOnce(&mut MeridianConfig)) -> meridian_proxy::Server {
    let mut cfg = config_for(&[twin.url()]);
    tweak(&mut cfg);
    start_proxy(cfg).await
}

fn continuations(proxy: &meridian_proxy::Server, reason: &str) -> f64 {
    sample(&proxy.state.metrics.render(), "meridian_continuations_total", &[("reason", reason)])
        .unwrap_or(-1.0)
}

#[tokio::test]
async fn a_forced_budget_switches_one_stream_from_reasoning_to_the_answer() {
    let twin = twin().await;
    let proxy = proxy(&twin, |c| c.budget.forcing = Forcing::Continuation).await;
    let unforced = stream(&proxy, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!((unforced.reasoning.len(), unforced.content.len()), (40, 6));

    let r =
        stream(&proxy, "/v1/chat/completions", chat(json!({"meridian": {"think_budget_tokens": 5}}))).await;
    assert_eq!(r.reasoning.len(), 5, "thinking cut at the budget");
    assert_eq!(r.content.len(), 6, "the continuation's text arrives as the answer");
    assert!(!r.reasoning_after_answer);
    assert_eq!(r.roles, 1, "one role chunk: the continuation's own is dropped");
    assert_eq!(r.done, 1);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(r.ids.iter().all(|id| *id == r.ids[0]), "one response id: {:?}", r.ids);
    assert_eq!(r.usage.len(), 1, "one usage chunk, as asked");
    let u = &r.usage[0];
    let prompt = unforced.usage[0]["prompt_tokens"].clone();
    assert_eq!(u["prompt_tokens"], prompt, "the client's prompt, not the continuation's");
    assert_eq!(u["completion_tokens"], 11);
    assert_eq!(u["completion_tokens_details"]["reasoning_tokens"], 5);
    assert_eq!(u["total_tokens"], prompt.as_u64().unwrap() + 11);

    // The proxy cut (the engine got no thinking_token_budget to do it itself).
    eventually("counted", || continuations(&proxy, "budget_tokens") == 1.0).await;
}

#[tokio::test]
async fn nothing_the_client_did_not_ask_for_leaks_into_its_stream() {
    let twin = twin().await;
    let proxy = proxy(&twin, |c| c.budget.forcing = Forcing::Continuation).await;
    let mut body = chat(json!({"meridian": {"think_budget_tokens": 3}}));
    body.as_object_mut().unwrap().remove("stream_options");
    let r = stream(&proxy, "/v1/chat/completions", body).await;
    assert_eq!((r.reasoning.len(), r.content.len()), (3, 6));
    assert!(r.usage.is_empty(), "no usage asked for, none relayed (the proxy asked per chunk)");
    // The proxy's own counts are the client's one answer, not the first leg's usage at
    // the cut (3 tokens, all thinking), which stopped describing it there.
    let tokens = |name: &str| sample(&proxy.state.metrics.render(), name, &[]).unwrap_or(-1.0);
    eventually("counted", || tokens("meridian_output_tokens_sum") >= 0.0).await;
    assert_eq!((tokens("meridian_think_tokens_sum"), tokens("meridian_output_tokens_sum")), (3.0, 6.0));
}

#[tokio::test]
async fn completions_are_continued_after_the_prompt() {
    let twin = twin().await;
    let proxy = proxy(&twin, |c| c.budget.forcing = Forcing::Continuation).await;
    let body = json!({"model": "Qwen/Qwen3-8B", "stream": true, "prompt": "Two plus two is",
        "stream_options": {"include_usage": true}, "meridian": {"think_budget_tokens": 4}});
    let r = stream(&proxy, "/v1/completions", body).await;
    // Completions carry everything in `text`: 4 thinking pieces, then the answer's 6.
    assert_eq!(r.content.len(), 10, "{:?}", r.content);
    assert!(
        !r.content.iter().any(|t| t.contains("</think>")),
        "the delimiter went to the engine, not the client"
    );
    assert_eq!(r.usage[0]["completion_tokens"], 10);
    assert_eq!(r.usage[0]["completion_tokens_details"]["reasoning_tokens"], 4);
}

#[tokio::test]
async fn auto_forcing_leaves_token_budgets_to_the_engine_and_cuts_on_time() {
    // Real time: 400 thinking tokens take the twin seconds.
    let twin = twin_with(WorkloadSpec::fixed(20, 400, 6), 1.0).await;
    let proxy = proxy(&twin, |_| {}).await;
    let r =
        stream(&proxy, "/v1/chat/completions", chat(json!({"meridian": {"think_budget_tokens": 4}}))).await;
    assert_eq!((r.reasoning.len(), r.content.len()), (4, 6), "thinking_token_budget in the engine");
    assert_eq!(continuations(&proxy, "budget_tokens"), 0.0);

    let r = stream(&proxy, "/v1/chat/completions", chat(json!({"meridian": {"think_budget_s": 0.05}}))).await;
    assert!(r.reasoning.len() < 400, "cut on time: {} thinking tokens", r.reasoning.len());
    assert_eq!(r.content.len(), 6);
    let u = &r.usage[0];
    assert_eq!(u["completion_tokens_details"]["reasoning_tokens"], r.reasoning.len());
    assert_eq!(u["completion_tokens"], r.reasoning.len() + 6);
    eventually("counted", || continuations(&proxy, "budget_seconds") == 1.0).await;
}

#[tokio::test]
async fn rpdi_from_streamed_logprobs_ends_thinking_at_a_sentence_end() {
    // Entropy that climbs while thinking: the recent window runs above the overall mean.
    let mut workload = WorkloadSpec::fixed(20, 40, 6);
    workload.entropy =
        EntropySpec { start: 0.3, floor: 3.0, converge_frac: 0.6, noise: 0.0, output_level: 0.8 };
    let twin = twin_with(workload, 50.0).await;
    let proxy = proxy(&twin, |c| {
        c.exit.signal = ExitSignal::Rpdi;
        c.exit.min_think_tokens = 8;
        c.exit.rpdi_window = 4;
        c.exit.rpdi_lambda = 1.2;
    })
    .await;
    let r = stream(&proxy, "/v1/chat/completions", chat(json!({}))).await;
    assert!(r.reasoning.len() >= 8 && r.reasoning.len() < 40, "{} thinking tokens", r.reasoning.len());
    let last = r.reasoning.last().unwrap();
    assert!(last.ends_with('.') || last.ends_with('\n'), "cut at a sentence end, not {last:?}");
    assert_eq!(r.content.len(), 6);
    assert!(!r.logprobs_seen, "the logprobs the proxy asked for stay with the proxy");
    eventually("counted", || continuations(&proxy, "rpdi") == 1.0).await;
    let exits = sample(&proxy.state.metrics.render(), "meridian_entropy_exits_total", &[("signal", "rpdi")]);
    assert_eq!(exits, Some(1.0));
}

#[tokio::test]
async fn engine_forcing_never_continues() {
    let twin = twin_with(WorkloadSpec::fixed(20, 40, 6), 1.0).await;
    let proxy = proxy(&twin, |c| c.budget.forcing = Forcing::Engine).await;
    let r = stream(&proxy, "/v1/chat/completions", chat(json!({"meridian": {"think_budget_s": 0.05}}))).await;
    assert_eq!(r.reasoning.len(), 40, "no hook and no continuation: the time budget is not enforced");
    assert_eq!(continuations(&proxy, "budget_seconds"), 0.0);
}

/// The wire, seen from a recording upstream: what each leg asked for, the first leg
/// cancelled at the cut, and a continuation that fails ending the client's stream with an
/// error event instead of a hang.
#[tokio::test]
async fn the_legs_on_the_wire_and_a_failed_continuation() {
    let rig = Rig::with(1, |c| c.budget.forcing = Forcing::Continuation).await;
    // The mock answers continue_final_message requests with one whole JSON body.
    rig.mocks[0].set_probe_logprobs(Some(vec![-0.1]));
    let body = json!({"model": "tiny-qwen3", "stream": true, "max_tokens": 200,
        "messages": [{"role": "user", "content": "What is two plus two?"}],
        "meridian": {"think_budget_tokens": 3}});
    let got = receive(
        rig.client
            .post(rig.url("/v1/chat/completions"))
            .json(&body)
            .header("x-mock-fixture", "qwen3-reasoning")
            .header("x-mock-interval-ms", "5"),
    )
    .await;
    let text = got.text();
    let reasoning = text.matches("\"reasoning\"").count();
    assert_eq!(reasoning, 3, "{text}");
    assert!(text.contains("the continuation came back whole"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");

    let reqs = rig.mocks[0].requests();
    let gens: Vec<_> = reqs.iter().filter(|r| r.path == "/v1/chat/completions").collect();
    assert_eq!(gens.len(), 2, "{gens:?}");
    let first: Value = serde_json::from_str(&gens[0].body).unwrap();
    assert!(first.get("thinking_token_budget").is_none() && first.get("meridian").is_none());
    assert_eq!(first["stream_options"], json!({"include_usage": true, "continuous_usage_stats": true}));
    assert!(!gens[0].completed, "the first leg was cut off at the budget");
    assert!(
        rig.mocks[0].wait_for(std::time::Duration::from_secs(5), |r| r[0].cancelled).await,
        "and cancelled upstream"
    );
    let second: Value = serde_json::from_str(&gens[1].body).unwrap();
    assert_eq!(second["continue_final_message"], true);
    assert_eq!(second["add_generation_prompt"], false);
    let prefill = second["messages"][1]["content"].as_str().unwrap();
    assert!(prefill.starts_with("<think>\n") && prefill.ends_with("\n</think>\n\n"), "{prefill:?}");
    assert!(second["max_tokens"].as_u64().unwrap() < 200, "the answer gets what thinking left");
    let id = gens[0].header("x-request-id").unwrap();
    assert_eq!(gens[1].header("x-request-id"), Some(format!("{id}-continued").as_str()));
    eventually("failure counted", || {
        sample(
            &rig.scrape(),
            "meridian_requests_total",
            &[("route", "chat_completions"), ("outcome", "upstream_error")],
        ) == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn eat_without_a_hook_ends_thinking_by_continuation() {
    // Flat entropy after the probed delimiter: EAT's variance settles after warm-up, long
    // before 400 thinking tokens (seconds, in real time) are through.
    let mut workload = WorkloadSpec::fixed(20, 400, 6);
    workload.entropy.noise = 0.0;
    let twin = twin_with(workload, 1.0).await;
    let proxy = proxy(&twin, |c| {
        c.exit.signal = ExitSignal::Eat;
        c.exit.min_think_tokens = 4;
        c.exit.eat_probe_every_tokens = 2;
        c.exit.eat_warmup_steps = 2;
    })
    .await;
    let r = stream(&proxy, "/v1/chat/completions", chat(json!({}))).await;
    assert!(r.reasoning.len() < 400, "EAT cut thinking: {} tokens", r.reasoning.len());
    assert_eq!(r.content.len(), 6);
    assert!(!r.reasoning_after_answer);
    let u = &r.usage[0];
    assert_eq!(u["completion_tokens_details"]["reasoning_tokens"], r.reasoning.len());
    eventually("counted", || continuations(&proxy, "eat") == 1.0).await;
    let probes = sample(&proxy.state.metrics.render(), "meridian_eat_probes_total", &[("outcome", "ok")]);
    assert!(probes.is_some_and(|n| n >= 2.0), "{probes:?}");
}

/// Lines split anywhere across network reads, in both legs: the cut still falls on an
/// event boundary and the client's stream parses whole.
#[tokio::test]
async fn cuts_and_splices_streams_split_at_any_byte() {
    for split in ["1", "7", "64"] {
        let rig = Rig::with(1, |c| c.budget.forcing = Forcing::Continuation).await;
        let body = json!({"model": "tiny-qwen3", "stream": true,
            "messages": [{"role": "user", "content": "What is two plus two?"}],
            "meridian": {"think_budget_tokens": 3}});
        let got = receive(
            rig.client
                .post(rig.url("/v1/chat/completions"))
                .json(&body)
                .header("x-mock-fixture", "qwen3-reasoning")
                .header("x-mock-split", split),
        )
        .await;
        let text = got.text();
        let mut labels = String::new();
        let mut ids = std::collections::BTreeSet::new();
        for line in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|l| *l != "[DONE]") {
            let v: Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("split {split}: {e}: {line}"));
            ids.insert(v["id"].as_str().unwrap().to_owned());
            let d = &v["choices"][0]["delta"];
            if d["reasoning"].as_str().is_some_and(|s| !s.is_empty()) {
                labels.push('R');
            } else if d["content"].as_str().is_some_and(|s| !s.is_empty()) {
                labels.push('C');
            }
        }
        // The fixture replayed as the continuation: all of it, now the answer.
        assert!(labels.starts_with("RRRC") && !labels[3..].contains('R'), "split {split}: {labels}");
        assert_eq!(ids.len(), 1, "split {split}");
        assert_eq!(text.matches("data: [DONE]").count(), 1, "split {split}");
        // Framed as SSE: every event one `data:` line and its blank line, none merged
        // where a chunk was dropped or the first leg cut.
        assert!(text.ends_with("\n\n"), "split {split}");
        for event in text.split("\n\n").filter(|e| !e.is_empty()) {
            assert_eq!(
                event.lines().filter(|l| l.starts_with("data: ")).count(),
                1,
                "split {split}: {event:?}"
            );
            assert!(!event.contains("\n\n") && !event.starts_with('\n'), "split {split}: {event:?}");
        }
    }
}

/// A first leg that goes quiet while it thinks is cut by the clock, not by its next
/// chunk: with tokens seconds apart, the cut comes after the first thinking token.
#[tokio::test]
async fn a_stalled_think_stream_is_cut_when_its_time_is_up() {
    // Slowed so that each step takes longer than the whole time budget.
    let twin = twin_with(WorkloadSpec::fixed(20, 400, 2), 0.02).await;
    let proxy = proxy(&twin, |_| {}).await;
    let r = stream(&proxy, "/v1/chat/completions", chat(json!({"meridian": {"think_budget_s": 0.1}}))).await;
    assert_eq!(r.reasoning.len(), 1, "cut between the first and the second thinking token");
    assert_eq!(r.content.len(), 2);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    eventually("counted", || continuations(&proxy, "budget_seconds") == 1.0).await;
}
