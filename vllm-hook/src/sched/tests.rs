//! The scheduler core on rows given by hand (no vLLM objects).

use super::*;

fn row(id: &str, arrival: f64, new_tokens: Vec<u32>) -> RunningRow {
    RunningRow(id.into(), arrival, 0, 0, new_tokens)
}

#[test]
fn answering_requests_run_first_and_a_thinker_is_the_victim() {
    let mut core = SchedulerCore::create("output-first", vec![465], vec![466], Arc::default()).unwrap();
    for id in ["early-thinker", "late-answerer", "mid-thinker"] {
        core.track(id.into(), vec![1, 465]);
    }
    let rows = vec![
        row("early-thinker", 1.0, vec![5]),
        row("late-answerer", 3.0, vec![466, 7]),
        row("mid-thinker", 2.0, vec![5]),
    ];
    let order = core.order_rows(&rows);
    assert_eq!(order[0], 1, "the answering request gets the budget first");
    assert_ne!(*order.last().unwrap(), 1, "the answering request is never the victim");
    assert_eq!(core.phase("late-answerer"), "output");
    assert_eq!(core.shared.counters.get(Counter::Reorders), 1);
    assert_eq!(core.preempted("mid-thinker"), "think-active");
}

#[test]
fn fcfs_keeps_vllm_order() {
    let mut core = SchedulerCore::create("fcfs", vec![465], vec![466], Arc::default()).unwrap();
    core.track("a".into(), vec![465]);
    core.track("b".into(), vec![465]);
    let order = core.order_rows(&[row("a", 1.0, vec![466]), row("b", 2.0, vec![])]);
    assert_eq!(order, vec![0, 1]);
    assert_eq!(core.shared.counters.get(Counter::Reorders), 0);
}

#[test]
fn kv_tiers_split_answering_requests_at_their_thought() {
    let mut core = SchedulerCore::create("output-first", vec![465], vec![466], Arc::default()).unwrap();
    core.track("ans".into(), vec![465]);
    core.track("think".into(), vec![465]);
    let mut tokens = vec![5; 40];
    tokens.push(466);
    core.order_rows(&[row("ans", 1.0, tokens), row("think", 1.0, vec![5; 3])]);
    // 41 thinking tokens = 2 full blocks of 16 are a finished thought.
    assert_eq!(core.account_kv(vec![("ans".into(), 5), ("think".into(), 2)], 16), [2, 2, 3]);
}

#[test]
fn a_priority_directive_arriving_after_a_lookup_still_counts() {
    use meridian_core::channel::{Action, Directive};
    let shared = Arc::new(Shared::default());
    let mut core = SchedulerCore::create("priority", vec![465], vec![466], Arc::clone(&shared)).unwrap();
    let apply = |id: &str, priority| {
        let action = Action::Priority { priority };
        shared.directives.lock().unwrap().apply(Directive { request_id: id.into(), action });
    };
    let rows = || vec![row("a", 1.0, vec![]), row("b", 2.0, vec![])];
    apply("someone-else", 5);
    assert_eq!(core.order_rows(&rows()), vec![0, 1]);
    apply("b", -1);
    assert_eq!(core.order_rows(&rows()), vec![1, 0], "b's new priority counts at once");
}

#[test]
fn unknown_policy_is_a_config_error() {
    assert!(matches!(
        SchedulerCore::create("lifo", vec![], vec![], Arc::default()),
        Err(HookError::Config(_))
    ));
}
