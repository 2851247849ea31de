//! The exit controller: budgets, directives and RPDI, values read at once (vLLM V1) and
//! late (Model Runner V2).

use super::*;

fn controller(signal: &str, budget: Option<u32>) -> ExitController {
    let rpdi = RpdiConfig { window: 4, lambda: 1.5 };
    ExitController::create(vec![465], vec![466], signal, 8, rpdi, budget, Arc::default()).unwrap()
}

/// A controller with no signal or budget, acting on the policy channel's directives.
fn directed(shared: &Arc<Shared>) -> ExitController {
    ExitController::create(vec![465], vec![466], "off", 0, RpdiConfig::default(), None, Arc::clone(shared))
        .unwrap()
}

#[test]
fn budget_forces_the_end_token_once_then_lets_the_answer_run() {
    let mut c = controller("off", None);
    c.add(0, vec![465], None, Some(3)).unwrap();
    c.observe(vec![(0, 0, vec![5, 5])]);
    assert!(c.decide(vec![]).unwrap().is_empty());
    c.observe(vec![(0, 0, vec![5])]);
    assert_eq!(c.decide(vec![]).unwrap(), vec![(0, 466)]);
    assert_eq!(c.shared.counters.get(Counter::ExitBudget), 1);
    assert!(c.observe(vec![(0, 0, vec![466])]).is_empty(), "answering now");
    assert!(c.decide(vec![]).unwrap().is_empty());
    assert_eq!(c.phase(0), Some("output"));
}

#[test]
fn proxy_directive_ends_thinking_by_request_id() {
    let shared = Arc::new(Shared::default());
    let mut c = directed(&shared);
    c.add(3, vec![465], Some("req-9".into()), None).unwrap();
    c.observe(vec![(1, 3, vec![5])]);
    assert!(c.decide(vec![]).unwrap().is_empty());
    shared.directives.lock().unwrap().apply(meridian_core::channel::Directive {
        request_id: "req-9".into(),
        action: meridian_core::channel::Action::EndThinking,
    });
    c.observe(vec![(1, 3, vec![5])]);
    assert_eq!(c.decide(vec![]).unwrap(), vec![(1, 466)]);
    assert_eq!(shared.counters.get(Counter::ExitDirective), 1);
}

#[test]
fn a_directive_arriving_after_a_lookup_still_counts() {
    use meridian_core::channel::{Action, Directive};
    let shared = Arc::new(Shared::default());
    let mut c = directed(&shared);
    c.add(0, vec![465], Some("req-1".into()), None).unwrap();
    let apply = |id: &str, action| {
        shared.directives.lock().unwrap().apply(Directive { request_id: id.into(), action });
    };
    apply("someone-else", Action::EndThinking);
    c.observe(vec![(0, 0, vec![5])]);
    assert!(c.decide(vec![]).unwrap().is_empty(), "looked up: nothing for req-1");
    apply("req-1", Action::ThinkBudget { tokens: 1 });
    c.observe(vec![(0, 0, vec![5])]);
    assert_eq!(c.decide(vec![]).unwrap(), vec![(0, 466)], "the new budget applies at once");
}

#[test]
fn rpdi_fires_only_after_min_tokens_when_recent_entropy_rises() {
    let mut c = controller("rpdi", None);
    c.add(0, vec![465], None, None).unwrap();
    for _ in 0..20 {
        c.observe(vec![(0, 0, vec![5])]);
        assert!(c.decide(vec![0.5]).unwrap().is_empty());
    }
    let mut fired = false;
    for _ in 0..4 {
        c.observe(vec![(0, 0, vec![5])]);
        fired |= !c.decide(vec![3.0]).unwrap().is_empty();
    }
    assert!(fired, "recent mean 3.0 over a long-run mean near 0.5 exceeds lambda 1.5");
    assert_eq!(c.shared.counters.get(Counter::ExitRpdi), 1);
}

#[test]
fn a_forced_token_that_was_thrown_away_is_forced_again() {
    let mut c = controller("off", Some(1));
    c.add(0, vec![465], None, None).unwrap();
    c.observe(vec![(0, 0, vec![5])]);
    assert_eq!(c.decide(vec![]).unwrap(), vec![(0, 466)]);
    c.observe(vec![(0, 0, vec![])]); // the engine discarded that sample
    assert_eq!(c.decide(vec![]).unwrap(), vec![(0, 466)], "still wanted");
    assert_eq!(c.shared.counters.get(Counter::ExitBudget), 1, "counted once");
}

#[test]
fn replayed_tokens_restore_a_resumed_requests_phase() {
    let mut c = controller("off", Some(3));
    c.add(0, vec![465], None, None).unwrap();
    c.replay(0, vec![5, 466, 9, 9]);
    assert_eq!(c.phase(0), Some("output"));
    assert!(c.observe(vec![(0, 0, vec![9])]).is_empty());
    assert!(c.decide(vec![]).unwrap().is_empty(), "an answering request is never forced");
}

#[test]
fn multi_token_delimiter_is_forced_token_by_token() {
    let mut c =
        ExitController::create(vec![1], vec![7, 8], "off", 0, RpdiConfig::default(), Some(1), Arc::default())
            .unwrap();
    c.add(0, vec![1], None, None).unwrap();
    c.observe(vec![(0, 0, vec![5])]);
    assert_eq!(c.decide(vec![]).unwrap(), vec![(0, 7)]);
    c.observe(vec![(0, 0, vec![7])]);
    assert_eq!(c.decide(vec![]).unwrap(), vec![(0, 8)]);
    assert!(c.observe(vec![(0, 0, vec![8])]).is_empty());
}

/// Model Runner V2 with one request in slot 4, its prompt `[465]` (thinking): the
/// step that feeds its `n`-th generated token.
fn step_v2(c: &mut ExitController, n: i64) -> Option<Vec<usize>> {
    c.observe_rows(vec![4], vec![1 + n], vec![1], vec![1])
}

#[test]
fn late_tokens_keep_the_budget_exact_and_ask_for_a_read_only_at_the_exit() {
    let mut c = controller("off", None);
    c.add(4, vec![465], None, Some(3)).unwrap();
    assert_eq!(step_v2(&mut c, 0), Some(vec![]), "first sample: nothing fed yet");
    assert_eq!(c.decide(vec![]), Some(vec![]));
    for n in 1..3 {
        assert_eq!(step_v2(&mut c, n), Some(vec![0]), "token {n} counted, unread");
        assert_eq!(c.decide(vec![]), Some(vec![]), "below the budget even counting the unread token");
        if n == 2 {
            c.observe_late(vec![5]).unwrap(); // token 1 lands a step late
        }
    }
    assert_eq!(step_v2(&mut c, 3), Some(vec![0]));
    assert_eq!(c.decide(vec![]), None, "the budget is reached only if the unread tokens were thinking");
    assert_eq!(c.shared.counters.get(Counter::ExitBudget), 0, "nothing counted before the read");
    c.observe_late(vec![5]).unwrap();
    c.observe_late(vec![5]).unwrap();
    c.thinking_rows();
    assert_eq!(c.decide(vec![]), Some(vec![(0, 466)]), "3 thinking tokens: forced");
    assert_eq!(step_v2(&mut c, 4), Some(vec![0]));
    assert_eq!(c.decide(vec![]), None, "was the forced token sampled? read it before forcing again");
    c.observe_late(vec![466]).unwrap();
    assert!(c.thinking_rows().is_empty(), "answering now");
    assert_eq!(c.decide(vec![]), Some(vec![]));
    assert_eq!(c.shared.counters.get(Counter::ExitBudget), 1);
}

#[test]
fn a_natural_end_still_in_flight_is_not_forced_again() {
    let mut c = controller("off", Some(2));
    c.add(4, vec![465], None, None).unwrap();
    step_v2(&mut c, 0);
    step_v2(&mut c, 1);
    c.observe_late(vec![5]).unwrap();
    step_v2(&mut c, 2); // the model ended its thought itself: token 2 is `</think>`
    assert_eq!(c.decide(vec![]), None);
    c.observe_late(vec![466]).unwrap();
    assert!(c.thinking_rows().is_empty());
    assert_eq!(c.decide(vec![]), Some(vec![]), "no second end-of-thinking token");
    assert_eq!(c.phase(4), Some("output"));
}

#[test]
fn late_values_for_a_slot_that_changed_hands_are_dropped() {
    let mut c = controller("off", None);
    c.add(4, vec![465], None, None).unwrap();
    step_v2(&mut c, 0);
    step_v2(&mut c, 1);
    c.remove(4);
    c.add(4, vec![1, 2], None, None).unwrap(); // a new request without a thought in its prompt
    c.observe_late(vec![465]).unwrap(); // the old occupant's token: not the new one's
    assert_eq!(c.phase(4), Some("pending"));
    assert!(c.observe_late(vec![5]).is_err(), "nothing else is waiting");
}

#[test]
fn late_entropies_drive_rpdi_like_prompt_ones() {
    let mut c = controller("rpdi", None);
    c.add(4, vec![465], None, None).unwrap();
    let mut fired_at = None;
    for n in 0..40 {
        step_v2(&mut c, n);
        if n > 0 {
            c.observe_late(vec![5]).unwrap();
            c.thinking_rows();
        }
        if n > 1 {
            c.entropies_arrived(vec![if n < 30 { 0.5 } else { 3.0 }]).unwrap();
        }
        assert_eq!(c.entropies_later(), vec![0]);
        if let Some(forced) = c.decide(vec![]) {
            if !forced.is_empty() {
                fired_at = Some(n);
                break;
            }
        }
    }
    let n = fired_at.expect("rising entropy ends the thought");
    assert!((30..34).contains(&n), "fires within a few steps of the rise; at {n}");
    assert_eq!(c.shared.counters.get(Counter::ExitRpdi), 1);
}

/// Native-endian int64 columns laid one after the other, as `v2_batch` packs them.
fn packed(columns: &[&[i64]]) -> Vec<u8> {
    columns.iter().flat_map(|c| c.iter().flat_map(|v| v.to_ne_bytes())).collect()
}

#[test]
fn packed_columns_and_whole_row_values_read_as_the_lists_do() {
    // Two controllers, the same three-row batch (slot 2 still prefilling, slots 4 and 7
    // sampling), one fed by lists, the other by packed bytes and every row's values.
    let (mut lists, mut bytes) = (controller("rpdi", Some(2)), controller("rpdi", Some(2)));
    for c in [&mut lists, &mut bytes] {
        c.add(2, vec![1, 2, 3], None, None).unwrap();
        c.add(4, vec![465], None, None).unwrap();
        c.add(7, vec![465], None, None).unwrap();
    }
    for n in 0..3i64 {
        let cols: [&[i64]; 4] = [&[2, 4, 7], &[1, 1 + n, 1 + n], &[3, 1, 1], &[3, 1, 1]];
        let fresh =
            lists.observe_rows(cols[0].to_vec(), cols[1].to_vec(), cols[2].to_vec(), cols[3].to_vec());
        let count = bytes.observe_batch(&packed(&cols)).unwrap();
        assert_eq!(fresh.as_ref().map(Vec::len), count, "step {n}: the same rows counted");
        if let Some(rows) = fresh.filter(|r| !r.is_empty()) {
            assert_eq!(rows, vec![1, 2], "the prefilling row is never fresh");
            lists.observe_late(vec![5, 5]).unwrap();
            // Every row's fed token; the prefilling row's is garbage that must be ignored.
            bytes.observe_late_fed(&packed(&[&[999, 5, 5]])).unwrap();
        }
        for c in [&mut lists, &mut bytes] {
            c.thinking_rows();
        }
        assert_eq!(lists.entropies_later(), bytes.entropies_later());
        lists.entropies_arrived(vec![0.5, 0.5]).unwrap();
        let all: Vec<u8> = [9.0f64, 0.5, 0.5].iter().flat_map(|h| h.to_ne_bytes()).collect();
        bytes.entropies_arrived_all(&all).unwrap();
        assert_eq!(lists.decide(vec![]), bytes.decide(vec![]), "step {n}: the same decision");
    }
    assert_eq!(lists.think_tokens(4), Some(2));
    assert_eq!(bytes.think_tokens(4), Some(2));
    assert_eq!(
        bytes.shared.counters.get(Counter::ExitBudget),
        lists.shared.counters.get(Counter::ExitBudget)
    );
}

#[test]
fn packed_values_of_the_wrong_shape_are_errors() {
    let mut c = controller("off", None);
    c.add(4, vec![465], None, None).unwrap();
    assert!(c.observe_batch(&[0u8; 31]).is_err(), "not four int64 columns");
    c.observe_batch(&packed(&[&[4], &[1], &[1], &[1]])).unwrap();
    c.observe_batch(&packed(&[&[4], &[2], &[1], &[1]])).unwrap(); // token 1 fed: unread, row 0
    assert!(c.observe_late_fed(&[]).is_err(), "row 0 was counted: its value must be there");
    assert!(c.observe_late_fed(&packed(&[&[5]])).is_err(), "that batch was dropped with the error");
}

#[test]
fn a_slot_past_the_table_is_refused_not_allocated() {
    let mut c = controller("off", None);
    assert!(c.add(slots::MAX_SLOTS, vec![465], None, None).is_err());
    assert_eq!(c.phase(slots::MAX_SLOTS), None);
    c.add(slots::MAX_SLOTS - 1, vec![465], None, None).unwrap();
    assert_eq!(c.phase(slots::MAX_SLOTS - 1), Some("think"));
}
