//! Replaying a load test through the twin: the requests of a `meridian-loadtest` report
//! (when each was sent, and the prompt, thinking and answer lengths the real engine
//! reported in its usage) run through the engine under a policy, and each request's
//! predicted timings come out in the load tester's own report shape. A prediction and a
//! measurement are then the same requests, read by the same statistics: the twin's
//! effect of a policy is paired request by request exactly as the measured one is.

use serde_json::{Value, json};

use crate::engine::EngineConfig;
use crate::experiment::{Arrival, ExperimentResult, run_arrivals};
use meridian_core::sched::SchedulingPolicy;

/// A request of the report that can be replayed: its `index` in the report and its arrival.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Replayed {
    pub index: u64,
    pub arrival: Arrival,
}

/// The replayable requests of a load-test report (its first run), in arrival order, the
/// first sent at time 0. Requests that failed, or that carry no usage (the engine never
/// said what it generated), are left out: their lengths are unknown. vLLM's usage counts
/// the end-of-thought delimiter with the answer; the twin adds it after any thought, so
/// the answer replayed is one token shorter.
pub fn requests_of(report: &Value) -> Result<Vec<Replayed>, String> {
    let requests = report
        .pointer("/runs/0/requests")
        .and_then(Value::as_array)
        .ok_or("not a meridian-loadtest report: no runs[0].requests")?;
    let mut out = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let field = |name: &str| r.get(name).and_then(Value::as_u64);
        let ok = r.get("ok").and_then(Value::as_bool).unwrap_or(false);
        let (Some(index), Some(sent)) = (field("index"), r.get("sent_at").and_then(Value::as_f64)) else {
            return Err(format!("request {i}: no index or sent_at"));
        };
        let (Some(prompt), Some(think), Some(output)) =
            (field("prompt_tokens"), field("usage_think_tokens"), field("usage_output_tokens"))
        else {
            continue;
        };
        if !ok {
            continue;
        }
        let narrow = |v: u64| u32::try_from(v).map_err(|_| format!("request {index}: {v} tokens"));
        let (prompt, think, output) = (narrow(prompt)?, narrow(think)?, narrow(output)?);
        let delimiter = u32::from(think > 0);
        let answer = output.saturating_sub(delimiter).max(1);
        out.push(Replayed { index, arrival: Arrival { at_s: sent, prompt, think, answer } });
    }
    out.sort_by(|a, b| a.arrival.at_s.total_cmp(&b.arrival.at_s).then(a.index.cmp(&b.index)));
    let first = out.first().map_or(0.0, |r| r.arrival.at_s);
    for r in &mut out {
        r.arrival.at_s -= first;
    }
    Ok(out)
}

/// Replays `requests` under `policy` and writes the outcome as a load-test report: per
/// request `index`, `sent_at`, `ok`, `ttft`, `ttfo`, `think_to_output`, `e2e`,
/// `output_itl`, `max_output_gap` and the lengths, in seconds as the load tester writes
/// them; beside the run, what the engine did (`makespan_s`, `preemptions`, steps).
pub fn replay(config: EngineConfig, policy: Box<dyn SchedulingPolicy>, requests: &[Replayed]) -> Value {
    let arrivals: Vec<Arrival> = requests.iter().map(|r| r.arrival).collect();
    let policy_name = policy.name().to_owned();
    let res = run_arrivals(config, policy, &arrivals);
    report(&policy_name, requests, &res)
}

fn report(policy: &str, requests: &[Replayed], res: &ExperimentResult) -> Value {
    let mut out: Vec<Value> = requests
        .iter()
        .map(|r| {
            json!({"index": r.index, "sent_at": r.arrival.at_s, "ok": false,
                   "error": "the twin refused it (it cannot fit in the KV cache)"})
        })
        .collect();
    for rec in &res.records {
        let Some(slot) = out.get_mut(rec.index) else { continue };
        let req = &requests[rec.index];
        *slot = json!({
            "index": req.index,
            "sent_at": req.arrival.at_s,
            "ok": rec.e2e.is_some(),
            "ttft": rec.ttft,
            "ttfo": rec.ttfo,
            "think_to_output": rec.think_to_output,
            "e2e": rec.e2e,
            "output_itl": rec.output_itl,
            "max_output_gap": rec.largest_answer_gap(),
            "prompt_tokens": rec.prompt_tokens,
            "usage_think_tokens": rec.think_tokens,
            "usage_output_tokens": rec.output_tokens,
        });
    }
    json!({
        "replayed_by": "meridian-sim replay",
        "policy": policy,
        "makespan_s": res.makespan_s,
        "steps": res.steps,
        "preemptions": res.preemptions,
        "output_critical_preemptions": res.output_critical_preemptions,
        "prefill_capped_steps": res.prefill_capped_steps,
        "request_steps": {"running": res.request_steps.running, "sat_out": res.request_steps.sat_out},
        "total_token_throughput": res.total_token_throughput(),
        "runs": [{"requests": out}],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::sched::{Fcfs, policy_by_name};

    fn tiny() -> EngineConfig {
        EngineConfig::from(&crate::profile("tiny-test").expect("tiny-test profile"))
    }

    fn report_of(requests: &[(u64, f64, u32, u32, u32)]) -> Value {
        let rs: Vec<Value> = requests
            .iter()
            .map(|&(index, sent, prompt, think, output)| {
                json!({"index": index, "sent_at": sent, "ok": true, "prompt_tokens": prompt,
                       "usage_think_tokens": think, "usage_output_tokens": output})
            })
            .collect();
        json!({"runs": [{"requests": rs}]})
    }

    #[test]
    fn a_lone_request_replays_as_the_twin_runs_it() {
        // As experiment's hand-worked request: 10-token prompt, 2 thinking tokens, 2
        // answer tokens (usage: 3, the delimiter counted with the answer).
        let reqs = requests_of(&report_of(&[(7, 100.0, 10, 2, 3)])).expect("a report");
        assert_eq!(
            reqs,
            vec![Replayed { index: 7, arrival: Arrival { at_s: 0.0, prompt: 10, think: 2, answer: 2 } }]
        );
        let out = replay(tiny(), Box::new(Fcfs), &reqs);
        let r = &out["runs"][0]["requests"][0];
        assert_eq!(r["index"], 7);
        assert!((r["ttft"].as_f64().expect("ttft") - 0.020).abs() < 1e-9);
        assert!((r["ttfo"].as_f64().expect("ttfo") - 0.0566).abs() < 1e-9);
        assert_eq!(r["usage_output_tokens"], 3, "the usage the engine would report");
        assert_eq!(r["output_itl"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn requests_keep_their_report_index_and_failed_ones_are_left_out() {
        let mut rep = report_of(&[(0, 5.0, 10, 4, 5), (1, 5.5, 10, 4, 5), (2, 5.2, 10, 0, 3)]);
        rep["runs"][0]["requests"][1]["ok"] = json!(false);
        let reqs = requests_of(&rep).expect("a report");
        assert_eq!(reqs.iter().map(|r| r.index).collect::<Vec<_>>(), vec![0, 2], "in arrival order");
        assert!((reqs[1].arrival.at_s - 0.2).abs() < 1e-9);
        assert_eq!(reqs[1].arrival.answer, 3, "no thought, no delimiter");
        let out = replay(tiny(), policy_by_name("output-first").expect("policy"), &reqs);
        let indices: Vec<u64> = out["runs"][0]["requests"]
            .as_array()
            .expect("requests")
            .iter()
            .filter_map(|r| r["index"].as_u64())
            .collect();
        assert_eq!(indices, vec![0, 2]);
        assert_eq!(out["policy"], "output-first");
    }

    #[test]
    fn the_replay_counts_the_steps_a_policy_capped_prefill_in() {
        // One request answers for 20 steps while a second one's prompt arrives: output-
        // first caps prefill in the steps someone answers; vLLM's order never does.
        let reqs = requests_of(&report_of(&[(0, 0.0, 4, 1, 21), (1, 0.2, 30, 2, 3)])).expect("a report");
        let stock = replay(tiny(), Box::new(Fcfs), &reqs);
        assert_eq!(stock["prefill_capped_steps"], 0);
        let hooked = replay(tiny(), policy_by_name("output-first").expect("policy"), &reqs);
        let capped = hooked["prefill_capped_steps"].as_u64().expect("a count");
        let steps = hooked["steps"].as_u64().expect("a count");
        assert!(capped >= 10 && capped <= steps, "{capped} of {steps} steps capped");
    }

    #[test]
    fn the_replay_counts_the_request_steps_a_paced_answer_sat_out() {
        // One request answers 40 tokens, paced to a reader of 10 tokens/s after a 5-token
        // lead; tiny-test's steps take about 10 ms, so it sits out most steps while a
        // second request thinks. vLLM's order lets every running request compute.
        let reqs = requests_of(&report_of(&[(0, 0.0, 4, 1, 40), (1, 0.0, 4, 60, 1)])).expect("a report");
        let sat_out = |policy: &str| {
            let out = replay(tiny(), policy_by_name(policy).expect("policy"), &reqs);
            let steps = &out["request_steps"];
            (steps["sat_out"].as_u64().expect("a count"), steps["running"].as_u64().expect("a count"))
        };
        assert_eq!(sat_out("fcfs").0, 0);
        let (paced, running) = sat_out("reasoning-first:reader_tokens_per_s=10,lead_tokens=5");
        assert!(paced >= 30 && paced < running, "{paced} of {running} request-steps sat out");
    }

    #[test]
    fn a_report_without_requests_is_an_error() {
        assert!(requests_of(&json!({"runs": []})).is_err());
        assert!(requests_of(&json!({"runs": [{"requests": [{"ok": true}]}]})).is_err());
    }
}
