//! The phase state machine, fed every form a user meets: server-labelled reasoning
//! (`delta.reasoning` / `reasoning_content`), inline tags split anywhere, token ids, and
//! gpt-oss harmony channels.

use std::sync::Arc;

use meridian_core::models::ModelFamily;
use meridian_core::{Delta, ModelRegistry, Phase, PhaseEvent, PhaseRouter};
use proptest::prelude::*;

fn family(name: &str) -> Arc<ModelFamily> {
    ModelRegistry::builtin().unwrap().get(name).unwrap().clone()
}

fn content(text: &str) -> Delta<'_> {
    Delta { content: Some(text), ..Delta::default() }
}

/// Feeds content deltas; returns (delta index, event) for every event, finish included.
fn run(router: &mut PhaseRouter, deltas: &[&str]) -> Vec<(usize, PhaseEvent)> {
    let mut out = Vec::new();
    for (i, d) in deltas.iter().enumerate() {
        out.extend(router.observe(content(d)).into_iter().map(|e| (i, e)));
    }
    out.extend(router.finish().into_iter().map(|e| (deltas.len(), e)));
    out
}

fn kinds(events: &[(usize, PhaseEvent)]) -> Vec<&'static str> {
    events
        .iter()
        .map(|(_, e)| match e {
            PhaseEvent::EnterThink => "enter",
            PhaseEvent::ExitThink { .. } => "exit",
            PhaseEvent::FirstOutput { .. } => "output",
            PhaseEvent::ForceBudget { .. } => "budget",
        })
        .collect()
}

#[test]
fn server_labelled_reasoning_then_content() {
    for field in ["reasoning", "reasoning_content"] {
        // Both field names arrive as `Delta::reasoning`; the proxy maps them.
        let _ = field;
        let mut r = PhaseRouter::new(Some(family("qwen3")));
        let mut ev = Vec::new();
        for t in ["Let", " me", " think"] {
            ev.extend(r.observe(Delta { reasoning: Some(t), ..Delta::default() }));
        }
        assert_eq!(r.phase(), Phase::Think);
        ev.extend(r.observe(content("\n\n")));
        ev.extend(r.observe(content("Answer")));
        assert_eq!(
            ev,
            vec![
                PhaseEvent::EnterThink,
                PhaseEvent::ExitThink { think_tokens: 3 },
                PhaseEvent::FirstOutput { think_tokens: 3 },
            ]
        );
        assert_eq!((r.think_tokens(), r.output_tokens()), (3, 2));
    }
}

#[test]
fn unknown_model_without_reasoning_is_all_output() {
    let mut r = PhaseRouter::new(None);
    let ev = run(&mut r, &["<think>", "not parsed", "</think>", "x"]);
    assert_eq!(kinds(&ev), vec!["output"]);
    assert_eq!(r.output_tokens(), 4);
}

#[test]
fn qwen3_inline_tags_fire_each_event_once_in_the_right_delta() {
    let mut r = PhaseRouter::new(Some(family("qwen3")));
    let ev = run(&mut r, &["<think>", "\nOK", " so", "</think>", "\n\n", "Paris", "."]);
    assert_eq!(
        ev,
        vec![
            (0, PhaseEvent::EnterThink),
            (3, PhaseEvent::ExitThink { think_tokens: 3 }),
            (5, PhaseEvent::FirstOutput { think_tokens: 4 }),
        ]
    );
    assert_eq!((r.think_tokens(), r.output_tokens()), (4, 3));
}

#[test]
fn deepseek_r1_starts_inside_the_think_block() {
    let mut r = PhaseRouter::new(Some(family("deepseek-r1")));
    let ev = run(&mut r, &["Hmm", " wait", "</think>", "Yes"]);
    assert_eq!(kinds(&ev), vec!["enter", "exit", "output"]);
    assert_eq!(ev[0].0, 0);
    assert_eq!((r.think_tokens(), r.output_tokens()), (3, 1));
}

#[test]
fn thinking_disabled_request_starts_in_output() {
    let mut r = PhaseRouter::new(Some(family("qwen3-thinking-2507"))).with_initial_phase(Phase::Output);
    let ev = run(&mut r, &["Hello", " there"]);
    assert_eq!(kinds(&ev), vec!["output"]);
}

#[test]
fn end_tag_without_start_still_switches() {
    // Qwen3 hybrid family starts in output; a template that opened <think> in the prompt
    // shows up as an end tag with no start.
    let mut r = PhaseRouter::new(Some(family("qwen3")));
    let ev = run(&mut r, &["</think>", "Hi"]);
    assert_eq!(kinds(&ev), vec!["enter", "exit", "output"]);
}

#[test]
fn think_budget_fires_once_while_thinking() {
    let mut r = PhaseRouter::new(Some(family("deepseek-r1"))).with_think_budget(3);
    let ev = run(&mut r, &["a", "b", "c", "d", "</think>", "x"]);
    assert_eq!(
        ev.iter().filter(|(_, e)| matches!(e, PhaseEvent::ForceBudget { .. })).collect::<Vec<_>>(),
        vec![&(2, PhaseEvent::ForceBudget { think_tokens: 3, budget: 3 })]
    );
}

#[test]
fn granite_sentence_markers() {
    let mut r = PhaseRouter::new(Some(family("granite")));
    let ev = run(&mut r, &["Here is my", " thought process:", " think", " Here's my resp", "onse:", " Done"]);
    assert_eq!(kinds(&ev), vec!["enter", "exit", "output"]);
    assert_eq!(ev[1].0, 4);
    assert_eq!(ev[2].0, 5);
}

#[test]
fn seed_oss_namespaced_tags() {
    let mut r = PhaseRouter::new(Some(family("seed-oss")));
    let ev = run(&mut r, &["<seed:", "think>", "x", "</seed:think>", "y"]);
    assert_eq!(ev.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![1, 3, 4]);
}

#[test]
fn token_ids_drive_transitions_when_specials_are_stripped() {
    let mut r = PhaseRouter::new(Some(family("qwen3")));
    let mut ev = Vec::new();
    let steps: [(&str, &[u32]); 5] =
        [("", &[151667]), ("Hmm", &[80]), (" ok", &[81, 82]), ("", &[151668]), ("Yes", &[9454])];
    for (i, (text, ids)) in steps.iter().enumerate() {
        let d = Delta { content: Some(text), token_ids: Some(ids), ..Delta::default() };
        ev.extend(r.observe(d).into_iter().map(|e| (i, e)));
    }
    assert_eq!(kinds(&ev), vec!["enter", "exit", "output"]);
    assert_eq!(ev.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0, 3, 4]);
    assert_eq!((r.think_tokens(), r.output_tokens()), (5, 1));
}

#[test]
fn text_marker_wins_over_a_misconfigured_id() {
    // A DeepSeek-R1 distill on a Qwen vocabulary: ids differ from the family file, the
    // text still carries the tags.
    let mut r = PhaseRouter::new(Some(family("deepseek-r1")));
    let mut ev = Vec::new();
    for (text, ids) in [("Hmm", [151648u32]), ("</think>", [151649]), ("Yes", [9454])] {
        ev.extend(r.observe(Delta { content: Some(text), token_ids: Some(&ids), ..Delta::default() }));
    }
    assert_eq!(ev.len(), 3);
    assert_eq!(r.phase(), Phase::Output);
}

const HARMONY: &str = "<|channel|>analysis<|message|>User asks. Compute.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>";

#[test]
fn harmony_channels_in_text() {
    let mut r = PhaseRouter::new(Some(family("gpt-oss")));
    let ev = run(&mut r, &[HARMONY]);
    assert_eq!(kinds(&ev), vec!["enter", "exit", "output"]);
    assert_eq!(r.phase(), Phase::Output);
}

#[test]
fn harmony_commentary_counts_as_output_and_analysis_can_resume() {
    let mut r = PhaseRouter::new(Some(family("gpt-oss")));
    run(&mut r, &["<|channel|>commentary to=functions.get<|message|>{\"a\":1}<|call|>"]);
    assert_eq!(r.phase(), Phase::Output);
    let mut r = PhaseRouter::new(Some(family("gpt-oss")));
    run(
        &mut r,
        &[
            "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b<|end|><|start|>assistant<|channel|>analysis<|message|>c",
        ],
    );
    assert_eq!(r.phase(), Phase::Think);
}

#[test]
fn harmony_by_token_ids_with_stripped_specials() {
    let mut r = PhaseRouter::new(Some(family("gpt-oss")));
    let steps: [(&str, &[u32]); 8] = [
        ("", &[200005]),
        ("analysis", &[35644]),
        ("", &[200008]),
        ("Think", &[1]),
        ("", &[200007]),
        ("", &[200005]),
        ("final", &[17196]),
        ("", &[200008]),
    ];
    let mut ev = Vec::new();
    for (text, ids) in steps {
        ev.extend(r.observe(Delta { content: Some(text), token_ids: Some(ids), ..Delta::default() }));
    }
    ev.extend(r.observe(Delta { content: Some("4"), token_ids: Some(&[19]), ..Delta::default() }));
    // Header tokens before the first message count as output; the analysis message and
    // the header after it count as think, up to the `<|message|>` that opens `final`.
    assert_eq!(
        ev,
        vec![
            PhaseEvent::EnterThink,
            PhaseEvent::ExitThink { think_tokens: 5 },
            PhaseEvent::FirstOutput { think_tokens: 6 },
        ]
    );
}

/// Splits `text` at the given byte offsets.
fn split_at<'a>(text: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut prev = 0;
    for &c in cuts {
        out.push(&text[prev..c]);
        prev = c;
    }
    out.push(&text[prev..]);
    out
}

/// Index of the delta containing byte `pos`.
fn delta_of(pieces: &[&str], pos: usize) -> usize {
    let mut end = 0;
    for (i, p) in pieces.iter().enumerate() {
        end += p.len();
        if pos < end {
            return i;
        }
    }
    pieces.len()
}

fn check_split(fam: &str, text: &str, cuts: &[usize], exit_at: usize, output_at: usize) {
    let pieces = split_at(text, cuts);
    let mut r = PhaseRouter::new(Some(family(fam)));
    let ev = run(&mut r, &pieces);
    assert_eq!(kinds(&ev), vec!["enter", "exit", "output"], "cuts {cuts:?}: {pieces:?}");
    assert_eq!(ev[1].0, delta_of(&pieces, exit_at), "exit, cuts {cuts:?}: {pieces:?}");
    assert_eq!(ev[2].0, delta_of(&pieces, output_at), "output, cuts {cuts:?}: {pieces:?}");
}

#[test]
fn think_tags_split_at_every_byte_offset_and_pair_of_offsets() {
    let text = "<think>a < b </thin k></think>\n\nAnswer";
    let exit_at = text.find("</think>\n").unwrap() + "</think>".len() - 1;
    let output_at = text.find('A').unwrap();
    for i in 1..text.len() {
        check_split("qwen3", text, &[i], exit_at, output_at);
        for j in i + 1..text.len() {
            check_split("qwen3", text, &[i, j], exit_at, output_at);
        }
    }
}

#[test]
fn harmony_split_at_every_byte_offset() {
    let exit_at = HARMONY.find("final<|message|>").unwrap() + "final<|message|>".len() - 1;
    let output_at = HARMONY.find("It is").unwrap();
    for i in 1..HARMONY.len() {
        check_split("gpt-oss", HARMONY, &[i], exit_at, output_at);
    }
}

proptest! {
    /// However a stream is cut, the same events fire in the delta that holds the byte that
    /// caused them, and token-free text is never lost or duplicated.
    #[test]
    fn any_chunking_gives_the_same_transitions(
        think in "[a-z <>/\\n]{0,40}",
        answer in "[A-Za-z][a-z <>\\n]{0,20}",
        mut cuts in proptest::collection::vec(0usize..200, 0..8),
    ) {
        prop_assume!(!think.contains("<think>") && !think.contains("</think>"));
        prop_assume!(!answer.contains("<think>") && !answer.contains("</think>"));
        let text = format!("<think>{think}</think>{answer}");
        cuts.retain(|c| *c > 0 && *c < text.len());
        cuts.sort();
        cuts.dedup();
        let exit_at = "<think>".len() + think.len() + "</think>".len() - 1;
        let output_at = exit_at + 1;
        check_split("qwen3", &text, &cuts, exit_at, output_at);
    }

    /// Arbitrary bytes never panic the router and never produce an event twice.
    #[test]
    fn arbitrary_input_is_safe(deltas in proptest::collection::vec(".{0,12}", 0..30), fam in 0usize..4) {
        let name = ["qwen3", "deepseek-r1", "gpt-oss", "granite"][fam];
        let mut r = PhaseRouter::new(Some(family(name))).with_think_budget(5);
        let refs: Vec<&str> = deltas.iter().map(String::as_str).collect();
        let ev = run(&mut r, &refs);
        let k = kinds(&ev);
        for kind in ["enter", "exit", "output", "budget"] {
            prop_assert!(k.iter().filter(|x| **x == kind).count() <= 1);
        }
    }
}

#[test]
fn think_budget_fires_on_server_labelled_reasoning() {
    let mut r = PhaseRouter::new(Some(family("qwen3"))).with_think_budget(3);
    let mut ev = Vec::new();
    for t in ["a", "b", "c", "d"] {
        ev.extend(r.observe(Delta { reasoning: Some(t), ..Delta::default() }));
    }
    assert!(ev.contains(&PhaseEvent::ForceBudget { think_tokens: 3, budget: 3 }), "{ev:?}");
}
