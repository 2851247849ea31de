//! One phase rule for every reader: the proxy's router (streamed text) and the hook's
//! tracker (token ids inside vLLM) agree on the phase after every token of any sequence
//! of think markers and content, and on the token that ends thinking.

use std::sync::Arc;

use meridian_core::models::ModelFamily;
use meridian_core::phase::{PhaseTracker, ThinkMarkers, phase_after};
use meridian_core::{Delta, ModelRegistry, Phase, PhaseEvent, PhaseRouter};
use proptest::prelude::*;

fn qwen3() -> Arc<ModelFamily> {
    ModelRegistry::builtin().unwrap().get("qwen3").unwrap().clone()
}

/// Qwen3's think delimiters, as text and as ids (models/qwen3.toml).
const START: (&str, u32) = ("<think>", 151667);
const END: (&str, u32) = ("</think>", 151668);

/// A generated token: 0 the start marker, 1 the end marker, anything else a word.
fn piece(kind: u8) -> (&'static str, u32) {
    match kind {
        0 => START,
        1 => END,
        2 => ("\n", 198),
        3 => (" so", 773),
        _ => ("Answer", 16141),
    }
}

proptest! {
    #[test]
    fn router_and_tracker_agree_token_by_token(kinds in proptest::collection::vec(0u8..5, 0..40)) {
        let family = qwen3();
        let markers = ThinkMarkers::new(vec![START.1], vec![END.1]).unwrap();
        let mut router = PhaseRouter::new(Some(family));
        let mut tracker = PhaseTracker::new(&markers, &[]);
        let mut generated = Vec::new();
        for (i, &k) in kinds.iter().enumerate() {
            let (text, id) = piece(k);
            generated.push(id);
            let exited = router
                .observe(Delta { content: Some(text), ..Delta::default() })
                .iter()
                .any(|e| matches!(e, PhaseEvent::ExitThink { .. }));
            let ended = tracker.push(id, &markers);
            prop_assert_eq!(router.phase(), tracker.phase(), "after token {} of {:?}", i, kinds);
            prop_assert_eq!(exited, ended, "the token that ends thinking, {} of {:?}", i, kinds);
            prop_assert_eq!(phase_after(&markers, &[], &generated), tracker.phase());
        }
    }
}

#[test]
fn a_template_that_opened_the_block_reads_the_same_from_text_and_from_the_prompt() {
    // DeepSeek-R1's template opens <think> in the prompt: the router knows it from the
    // family file, the tracker from the prompt's ids; both read the first words as thought.
    let markers = ThinkMarkers::new(vec![START.1], vec![END.1]).unwrap();
    let mut router = PhaseRouter::new(Some(qwen3())).with_initial_phase(Phase::Think);
    let mut tracker = PhaseTracker::new(&markers, &[9, START.1, 198]);
    for (text, id) in [(" so", 773), ("</think>", END.1), ("Answer", 16141)] {
        router.observe(Delta { content: Some(text), ..Delta::default() });
        tracker.push(id, &markers);
        assert_eq!(router.phase(), tracker.phase());
    }
    assert_eq!(tracker.phase(), Phase::Output);
}
