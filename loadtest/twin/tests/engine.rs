//! The twin's step loop on cases small enough to work out by hand, and invariants on
//! random workloads.

use meridian_core::Phase;
use meridian_core::sched::{Fcfs, ReasoningFirst, RequestView, SchedulingPolicy};
use meridian_sim::engine::SubmitError;
use meridian_sim::{Engine, EngineConfig, NewRequest, profile};
use proptest::prelude::*;

fn tiny() -> EngineConfig {
    EngineConfig::from(&profile("tiny-test").unwrap())
}

fn req(id: &str, prompt: u32, think: u32, answer: u32) -> NewRequest {
    NewRequest {
        id: id.into(),
        prompt_tokens: prompt,
        think_tokens: think,
        answer_tokens: answer,
        priority: 0,
        think_budget: None,
        ids: None,
        ..NewRequest::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn one_request_step_by_step() {
    // tiny-test: 10 ms fixed, 1 ms per token, 0.1 ms per decode context token.
    let mut e = Engine::new(tiny(), Box::new(Fcfs));
    e.submit(req("a", 10, 2, 1)).unwrap();
    let s1 = e.step().unwrap();
    assert_eq!(s1.scheduled, vec![(0, 10)]);
    assert!(close(s1.duration_s, 0.020), "prefill: 10 + 10 x 1 ms");
    assert_eq!((s1.tokens[0].index, s1.tokens[0].phase), (0, Phase::Think));
    let s2 = e.step().unwrap();
    assert!(close(s2.duration_s, 0.0121), "decode at context 11: 10 + 1 + 1.1 ms");
    assert_eq!(s2.tokens[0].phase, Phase::Think);
    let s3 = e.step().unwrap();
    assert!(close(s3.duration_s, 0.0122));
    // The end-of-thought delimiter: a step of its own, still thinking, seen by no client.
    assert_eq!((s3.tokens[0].phase, s3.tokens[0].ends_thought), (Phase::Think, true));
    let s4 = e.step().unwrap();
    assert!(close(s4.duration_s, 0.0123));
    assert_eq!(
        (s4.tokens[0].phase, s4.tokens[0].ends_thought, s4.tokens[0].last),
        (Phase::Output, false, true)
    );
    assert!(close(e.now(), 0.0566));
    assert!(e.step().is_none());
    assert_eq!(e.kv_usage(), 0.0, "blocks returned");
}

/// Every step's duration over its fitted time, for one request decoding alone.
fn step_factors(config: EngineConfig) -> Vec<f64> {
    let fitted = tiny();
    let mut e = Engine::new(EngineConfig { kv_blocks: 1000, ..config }, Box::new(Fcfs));
    e.submit(req("a", 1, 400, 0)).unwrap();
    let mut out = Vec::new();
    let mut context = 0u64;
    while let Some(step) = e.step() {
        let shape = meridian_sim::StepShape::decode(1, context + 1);
        if context > 0 {
            out.push(step.duration_s / fitted.cost.step_seconds(&shape));
        }
        context += 1;
    }
    out
}

#[test]
fn steps_vary_around_the_fit_as_the_profile_measured_them_the_same_way_every_replay() {
    let mut spread_profile = profile("tiny-test").unwrap();
    assert!(spread_profile.step_spread.is_none(), "tiny-test varies nothing");
    assert!(step_factors(tiny()).iter().all(|f| close(*f, 1.0)), "without a spread every step is the fit's");

    // Measured steps from 0.8x to 1x of the fit evenly (half of them under 0.9x), and
    // one in a hundred at 3x, in an order where no step is like the one before.
    let measured = (0..1000u32).map(|i| match (i * 617) % 1000 {
        k if k < 990 => (0.8 + f64::from(k) * 0.0002, 1.0),
        _ => (3.0, 1.0),
    });
    spread_profile.step_spread = Some(meridian_sim::spread::StepSpread::of(measured).unwrap());
    let varied = step_factors(EngineConfig::from(&spread_profile));
    assert_eq!(varied, step_factors(EngineConfig::from(&spread_profile)), "another replay drew otherwise");
    let slow = varied.iter().filter(|f| **f >= 2.0).count();
    assert!((1..=12).contains(&slow), "{slow} of {} steps at 2x or more", varied.len());
    let fast = varied.iter().filter(|f| **f < 0.9).count() as f64 / varied.len() as f64;
    assert!((0.4..0.6).contains(&fast), "{fast} of the steps under 0.9x");
}

#[test]
fn kv_that_came_with_a_request_is_held_not_computed() {
    let mut e = Engine::new(tiny(), Box::new(Fcfs));
    e.submit(NewRequest { preloaded: 10, ..req("a", 10, 0, 2) }).unwrap();
    let s1 = e.step().unwrap();
    assert_eq!(s1.scheduled, vec![(0, 1)], "only the last prompt token is computed, to sample");
    assert_eq!((s1.tokens[0].phase, s1.tokens[0].index), (Phase::Output, 0));
    assert!(e.kv_usage() > 0.0, "the whole prompt's blocks are held");
    let mut plain = Engine::new(tiny(), Box::new(Fcfs));
    plain.submit(req("b", 10, 0, 2)).unwrap();
    assert_eq!(plain.step().unwrap().scheduled, vec![(0, 10)]);
    assert_eq!(plain.kv_usage(), e.kv_usage(), "the same blocks either way");
    let mut more = Engine::new(tiny(), Box::new(Fcfs));
    more.submit(NewRequest { preloaded: 99, ..req("c", 10, 0, 1) }).unwrap();
    assert_eq!(more.step().unwrap().scheduled, vec![(0, 1)], "never more than the prompt");
}

#[test]
fn long_prompts_are_prefilled_in_chunks_under_the_token_budget() {
    let mut e = Engine::new(tiny(), Box::new(Fcfs));
    e.submit(req("a", 40, 0, 1)).unwrap();
    let s1 = e.step().unwrap();
    assert_eq!(s1.scheduled, vec![(0, 32)]);
    assert!(s1.tokens.is_empty(), "no token until the prompt is in");
    assert!(close(s1.duration_s, 0.042));
    let s2 = e.step().unwrap();
    assert_eq!(s2.scheduled, vec![(0, 8)]);
    assert_eq!(s2.tokens.len(), 1);
}

#[test]
fn budget_is_shared_in_running_order_and_new_requests_wait() {
    let mut e = Engine::new(tiny(), Box::new(Fcfs));
    e.submit(req("a", 20, 5, 0)).unwrap();
    e.submit(req("b", 20, 5, 0)).unwrap();
    let s1 = e.step().unwrap();
    // a takes 20 of 32; b gets the remaining 12 as its first chunk.
    assert_eq!(s1.scheduled, vec![(0, 20), (1, 12)]);
    let s2 = e.step().unwrap();
    assert_eq!(s2.scheduled, vec![(0, 1), (1, 8)]);
}

#[test]
fn the_victim_is_served_last_as_the_hook_hands_it_to_vllm() {
    // Reasoning-first ranks a request computing its prompt before the answering ones, but
    // its victim is the newest arrival, and the hook puts the victim last in vLLM's running
    // list, which vLLM serves in order: the answers keep their token each step while the
    // newcomer's prompt takes the rest of the budget (checked on vLLM's own scheduler:
    // tests/hook/test_scheduler.py). Without that, the prompt's chunks took the whole
    // budget and the answers stalled for as long as it computed.
    let mut e = Engine::new(tiny(), Box::new(ReasoningFirst::default()));
    for id in ["a0", "a1", "a2"] {
        e.submit(req(id, 4, 1, 60)).unwrap();
    }
    let mut answering = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let s = e.step().unwrap();
        answering.extend(s.tokens.iter().filter(|t| t.phase == Phase::Output).map(|t| t.seq));
        if answering.len() == 3 {
            break;
        }
    }
    assert_eq!(answering.len(), 3, "all three answer");
    let long = e.submit(req("long", 200, 5, 5)).unwrap();
    for _ in 0..4 {
        let s = e.step().unwrap();
        assert_eq!(
            s.scheduled,
            vec![(0, 1), (1, 1), (2, 1), (long, 29)],
            "the answers first, the prompt last"
        );
    }
}

fn tight() -> EngineConfig {
    EngineConfig { kv_blocks: 6, block_size: 4, max_num_seqs: 8, max_num_batched_tokens: 32, ..tiny() }
}

#[test]
fn stock_victim_is_the_last_running_request_and_it_recomputes() {
    let mut e = Engine::new(tight(), Box::new(Fcfs));
    e.submit(req("a", 8, 8, 0)).unwrap();
    e.submit(req("b", 8, 8, 0)).unwrap();
    let mut tokens: Vec<Vec<u32>> = vec![vec![], vec![]];
    let mut preempted = Vec::new();
    while let Some(s) = e.step() {
        preempted.extend(s.preempted.iter().copied());
        for t in &s.tokens {
            tokens[t.seq as usize].push(t.index);
        }
    }
    // Both hold 3 blocks after their 9th token; a needs a 4th at 13 tokens: b goes.
    assert_eq!(preempted[0], 1, "b, the last admitted, is the victim");
    assert!(!preempted.contains(&0), "a is never preempted");
    assert_eq!(tokens[0], (0..8).collect::<Vec<_>>());
    assert_eq!(tokens[1], (0..8).collect::<Vec<_>>(), "b resumes where it was, no token twice");
    assert_eq!(e.preemptions(), preempted.len() as u64);
    assert_eq!(e.kv_usage(), 0.0);
}

/// A policy that protects the last request and gives up the first.
struct FirstIsVictim;

impl SchedulingPolicy for FirstIsVictim {
    fn name(&self) -> &str {
        "first-is-victim"
    }
    fn order_running(&mut self, _: &mut Vec<RequestView>, _: f64) {}
    fn order_waiting(&mut self, _: &mut Vec<RequestView>, _: f64) {}
    fn pick_victim(&mut self, _: &[RequestView], _: f64) -> usize {
        0
    }
}

#[test]
fn the_policy_picks_the_victim() {
    let mut e = Engine::new(tight(), Box::new(FirstIsVictim));
    e.submit(req("a", 8, 8, 0)).unwrap();
    e.submit(req("b", 8, 8, 0)).unwrap();
    let mut preempted = Vec::new();
    while let Some(s) = e.step() {
        preempted.extend(s.preempted.iter().copied());
    }
    assert_eq!(preempted[0], 0, "the policy gave up a, which was growing");
    assert_eq!(e.policy_name(), "first-is-victim");
}

#[test]
fn ending_thinking_early_switches_the_next_token_to_output() {
    let mut e = Engine::new(tiny(), Box::new(Fcfs));
    let seq = e.submit(req("a", 4, 100, 2)).unwrap();
    let mut phases = Vec::new();
    for _ in 0..3 {
        phases.extend(e.step().unwrap().tokens.iter().map(|t| t.phase));
    }
    assert!(e.end_thinking(seq));
    while let Some(s) = e.step() {
        phases.extend(s.tokens.iter().map(|t| t.phase));
    }
    // Three thoughts, the forced delimiter, then the answer.
    assert_eq!(
        phases,
        vec![Phase::Think, Phase::Think, Phase::Think, Phase::Think, Phase::Output, Phase::Output]
    );
    assert!(!e.end_thinking(seq), "finished requests are gone");
}

#[test]
fn think_budget_caps_reasoning() {
    let mut e = Engine::new(tiny(), Box::new(Fcfs));
    e.submit(NewRequest { think_budget: Some(3), ..req("a", 4, 50, 2) }).unwrap();
    let mut tokens = Vec::new();
    while let Some(s) = e.step() {
        tokens.extend(s.tokens);
    }
    let visible_thoughts = tokens.iter().filter(|t| t.phase == Phase::Think && !t.ends_thought).count();
    assert_eq!(visible_thoughts, 3);
    assert_eq!(tokens.iter().filter(|t| t.ends_thought).count(), 1, "the forced delimiter");
    assert_eq!(tokens.len(), 6);
}

#[test]
fn requests_larger_than_the_cache_are_refused_and_aborts_free_blocks() {
    let mut e = Engine::new(tight(), Box::new(Fcfs));
    assert!(matches!(e.submit(req("x", 20, 10, 0)), Err(SubmitError::TooLong { .. })));
    assert_eq!(e.submit(req("x", 1, 0, 0)), Err(SubmitError::Empty));
    let seq = e.submit(req("a", 8, 8, 0)).unwrap();
    e.step().unwrap();
    assert!(e.kv_usage() > 0.0);
    assert!(e.abort(seq));
    assert_eq!(e.kv_usage(), 0.0);
    assert!(!e.has_work());
}

proptest! {
    /// Whatever the mix: every request gets exactly its tokens, in order, once; no step
    /// exceeds the token budget or the sequence limit; all blocks come back.
    #[test]
    fn random_workloads_keep_the_invariants(
        reqs in proptest::collection::vec((1u32..40, 0u32..30, 0u32..20, 0u32..3), 1..20),
        blocks in 20u32..80,
    ) {
        let cfg = EngineConfig { kv_blocks: blocks, max_num_seqs: 4, ..tiny() };
        let mut e = Engine::new(cfg, Box::new(Fcfs));
        let mut expected = std::collections::HashMap::new();
        let mut pending: Vec<_> = reqs.iter().enumerate().collect();
        let mut got: std::collections::HashMap<u64, Vec<(u32, Phase, bool)>> = Default::default();
        let mut last_clock = 0.0;
        let mut guard = 0;
        loop {
            // Arrivals interleave with steps.
            if let Some((i, (p, t, a, _))) = pending.pop() {
                if let Ok(seq) = e.submit(req(&i.to_string(), *p, *t, (*a).max(u32::from(*t == 0)))) {
                    expected.insert(seq, (*t, (*a).max(u32::from(*t == 0))));
                }
            }
            match e.step() {
                Some(s) => {
                    let scheduled: u32 = s.scheduled.iter().map(|(_, n)| n).sum();
                    prop_assert!(scheduled <= cfg.max_num_batched_tokens);
                    prop_assert!(e.num_running() <= cfg.max_num_seqs as usize);
                    prop_assert!(e.now() > last_clock);
                    last_clock = e.now();
                    for t in s.tokens {
                        got.entry(t.seq).or_default().push((t.index, t.phase, t.ends_thought));
                    }
                }
                None if pending.is_empty() => break,
                None => {}
            }
            guard += 1;
            prop_assert!(guard < 100_000, "no progress");
        }
        for (seq, (think, answer)) in expected {
            let toks = &got[&seq];
            // A thought followed by an answer closes with the delimiter, one more token.
            let delimiter = u32::from(think > 0 && answer > 0);
            prop_assert_eq!(toks.len() as u32, think + delimiter + answer);
            for (i, (index, phase, ends_thought)) in toks.iter().enumerate() {
                let i = i as u32;
                prop_assert_eq!(*index, i);
                prop_assert_eq!(*phase, if i < think + delimiter { Phase::Think } else { Phase::Output });
                prop_assert_eq!(*ends_thought, delimiter == 1 && i == think);
            }
        }
        prop_assert_eq!(e.kv_usage(), 0.0);
    }
}

#[test]
fn priority_policy_admits_lower_values_first_and_evicts_the_highest() {
    use meridian_core::sched::Priority;
    let cfg = EngineConfig { max_num_seqs: 1, ..tiny() };
    let mut e = Engine::new(cfg, Box::new(Priority));
    e.submit(NewRequest { priority: 5, ..req("low", 4, 1, 1) }).unwrap();
    e.submit(NewRequest { priority: -1, ..req("high", 4, 1, 1) }).unwrap();
    let first = e.step().unwrap();
    assert_eq!(e.id_of(first.scheduled[0].0), Some("high"));

    let mut e = Engine::new(tight(), Box::new(Priority));
    e.submit(NewRequest { priority: 0, ..req("a", 8, 8, 0) }).unwrap();
    e.submit(NewRequest { priority: -5, ..req("b", 8, 8, 0) }).unwrap();
    let mut preempted = Vec::new();
    while let Some(s) = e.step() {
        preempted.extend(s.preempted.iter().copied());
    }
    assert_eq!(preempted.first(), Some(&0), "a has the larger priority value, so it goes");
}

#[test]
fn step_limits_cap_prefill_and_think_decodes_while_someone_answers() {
    use meridian_core::sched::OutputFirst;
    let policy =
        OutputFirst { output_prefill_cap: Some(4), think_decode_cap: Some(1), ..OutputFirst::default() };
    let mut e = Engine::new(EngineConfig { max_num_batched_tokens: 64, ..tiny() }, Box::new(policy));
    // a answers right away; b and c think for a long time; d arrives with a long prompt.
    e.submit(req("a", 2, 0, 20)).unwrap();
    e.submit(req("b", 2, 20, 5)).unwrap();
    e.submit(req("c", 2, 20, 5)).unwrap();
    e.step().unwrap(); // all three prefill (nobody is answering yet)
    e.submit(req("d", 30, 1, 1)).unwrap();
    let s = e.step().unwrap();
    let by_id: Vec<(String, u32)> =
        s.scheduled.iter().map(|(q, n)| (e.id_of(*q).unwrap().to_owned(), *n)).collect();
    // a (answering) decodes, one of b/c thinks, d gets a 4-token prefill chunk.
    assert_eq!(by_id, vec![("a".into(), 1), ("b".into(), 1), ("d".into(), 4)]);
}

#[test]
fn answering_victims_are_counted_as_output_critical() {
    // a answers from its first token; b thinks. Stock FCFS evicts b (the last), so no
    // output-critical preemption; a policy that evicts the first request hits a.
    let mut e = Engine::new(tight(), Box::new(Fcfs));
    e.submit(req("a", 8, 0, 8)).unwrap();
    e.submit(req("b", 8, 8, 0)).unwrap();
    while e.step().is_some() {}
    assert!(e.preemptions() > 0);
    assert_eq!(e.output_critical_preemptions(), 0);
    let mut e = Engine::new(tight(), Box::new(FirstIsVictim));
    e.submit(req("a", 8, 0, 8)).unwrap();
    e.submit(req("b", 8, 8, 0)).unwrap();
    while e.step().is_some() {}
    assert!(e.output_critical_preemptions() > 0);
}

#[test]
fn slo_driven_stops_capping_prompts_once_a_queued_start_has_waited_past_the_target() {
    // tiny-test's steps take 10 ms and more, over a 5 ms answer target: slo-driven protects
    // the answering request, capping each step's prompt tokens at 16 (half of 32). Two
    // long prompts arrive: the first goes in at the cap, the second waits in the queue.
    let run = |target: &str| {
        let spec = format!("slo-driven:output_itl_target_ms=5,express=0,start_wait_target_s={target}");
        let policy = meridian_core::sched::policy_by_name(&spec).unwrap();
        let mut e = Engine::new(EngineConfig { kv_blocks: 1000, ..tiny() }, policy);
        e.submit(req("answering", 4, 0, 400)).unwrap();
        for _ in 0..5 {
            e.step();
        }
        let first = e.submit(req("first", 320, 1, 1)).unwrap();
        let queued = e.submit(req("queued", 320, 1, 1)).unwrap();
        let sent = e.now();
        let mut queued_ttft = None;
        let mut chunks = Vec::new();
        while let Some(s) = e.step() {
            chunks.extend(s.scheduled.iter().filter(|&&(seq, n)| seq == first && n > 1).map(|&(_, n)| n));
            if queued_ttft.is_none() && s.tokens.iter().any(|t| t.seq == queued) {
                queued_ttft = Some(e.now() - sent);
            }
        }
        (chunks, queued_ttft.unwrap())
    };
    let (chunks_always, ttft_always) = run("inf");
    let (chunks_guarded, ttft_guarded) = run("0.1");
    assert!(chunks_always.iter().all(|&n| n <= 16), "320 prompt tokens at 16 a step: {chunks_always:?}");
    let capped = chunks_guarded.iter().filter(|&&n| n <= 16).count();
    assert!(capped <= 6, "capped only until the queued start had waited 0.1 s: {chunks_guarded:?}");
    assert!(ttft_guarded < 0.95 * ttft_always, "it starts sooner: {ttft_guarded} s against {ttft_always} s");
}

#[test]
fn a_paced_answer_runs_on_once_the_pool_has_no_block_to_spare_as_the_hook_lets_it() {
    // a answers after one thought token, paced to a reader who reads nothing (a lead of 2
    // tokens); b thinks for 12 tokens. The hook holds a paced answer out of a step
    // only while every request it keeps has a free block to grow into: with the pool full,
    // vLLM would have to preempt, so a runs on (and frees its blocks sooner).
    let answer_tokens_while_b_thinks = |kv_blocks: u32| {
        let config =
            EngineConfig { kv_blocks, block_size: 4, max_num_seqs: 8, max_num_batched_tokens: 32, ..tiny() };
        let pacer = ReasoningFirst { reader_tokens_per_s: 0.0, lead_tokens: 2.0 };
        let mut e = Engine::new(config, Box::new(pacer));
        let a = e.submit(req("a", 3, 1, 8)).unwrap();
        let b = e.submit(req("b", 3, 12, 1)).unwrap();
        let mut answered = 0;
        for _ in 0..200 {
            let Some(s) = e.step() else { break };
            if !s.preempted.is_empty() {
                break;
            }
            answered += s.tokens.iter().filter(|t| t.seq == a && t.phase == Phase::Output).count();
            if s.tokens.iter().any(|t| t.seq == b && t.phase == Phase::Output) {
                break; // b's thought is over
            }
        }
        answered
    };
    assert_eq!(answer_tokens_while_b_thinks(1000), 2, "blocks to spare: a waits for its reader");
    assert!(answer_tokens_while_b_thinks(5) > 2, "none to spare once b grows: a runs on");
}

#[test]
fn a_waiting_request_goes_in_only_with_room_for_its_whole_sequence_as_vllm_admits() {
    // 6 blocks of 4 tokens, 8 tokens a step. a (8 + 4 tokens) holds 3 blocks once it
    // decodes; b's 16-token prompt would start with a chunk of 2 blocks, which fit, but
    // vLLM (`scheduler_reserve_full_isl`, its default) admits it only with room for all 4:
    // it waits for a instead of going in, running short and being preempted.
    let mut e = Engine::new(EngineConfig { max_num_batched_tokens: 8, ..tight() }, Box::new(Fcfs));
    let a = e.submit(req("a", 8, 4, 0)).unwrap();
    let b = e.submit(req("b", 16, 1, 0)).unwrap();
    let (mut a_done, mut b_started, mut step) = (None, None, 0);
    while let Some(s) = e.step() {
        step += 1;
        assert!(s.preempted.is_empty(), "step {step} preempted {:?}", s.preempted);
        if s.tokens.iter().any(|t| t.seq == a && t.last) {
            a_done = Some(step);
        }
        if b_started.is_none() && s.scheduled.iter().any(|&(seq, _)| seq == b) {
            b_started = Some(step);
        }
    }
    assert!(b_started > a_done, "b went in at step {b_started:?}, a finished at {a_done:?}");
}
