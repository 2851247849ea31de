//! Phase of one request from its token ids alone: inside vLLM the hook never sees text,
//! and its scheduler, its logits processor and the step tracer each follow phases
//! themselves, by this tracker and the [`PhaseRule`] the proxy uses too.

use super::Phase;
use super::rule::{Mark, PhaseRule};

/// Token-id sequences that open and close thinking for the served model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkMarkers {
    pub start: Vec<u32>,
    pub end: Vec<u32>,
}

impl ThinkMarkers {
    /// `None` when no end sequence is known: phases cannot be told apart.
    pub fn new(start: Vec<u32>, end: Vec<u32>) -> Option<Self> {
        if end.is_empty() { None } else { Some(ThinkMarkers { start, end }) }
    }
}

/// Follows one request's phase, one token at a time.
#[derive(Debug, Clone)]
pub struct PhaseTracker {
    rule: PhaseRule,
    think_tokens: u32,
    output_tokens: u32,
    /// How much of the start / end sequence the latest tokens matched.
    start_matched: usize,
    end_matched: usize,
}

fn last_match(haystack: &[u32], needle: &[u32]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    (0..=haystack.len() - needle.len()).rev().find(|&i| haystack[i..].starts_with(needle))
}

impl PhaseTracker {
    /// The phase generation starts in, from the prompt: chat templates of thinking models
    /// open the think block in the prompt (`<think>\n`), or close it right away when
    /// thinking is switched off (`<think>\n\n</think>\n\n`).
    pub fn new(markers: &ThinkMarkers, prompt: &[u32]) -> Self {
        let start = last_match(prompt, &markers.start);
        let end = last_match(prompt, &markers.end);
        let phase = match (start, end) {
            (Some(s), Some(e)) if e > s => Phase::Output,
            (Some(_), _) => Phase::Think,
            (None, Some(_)) => Phase::Output,
            (None, None) => Phase::Pending,
        };
        PhaseTracker {
            rule: PhaseRule::resumed(phase),
            think_tokens: 0,
            output_tokens: 0,
            start_matched: 0,
            end_matched: 0,
        }
    }

    pub fn phase(&self) -> Phase {
        self.rule.phase()
    }

    /// True once thinking has ended (or the prompt switched it off): every later token is
    /// answer, whatever it is, so its value need not be read ([`PhaseTracker::push_output`]).
    pub fn settled(&self) -> bool {
        self.rule.settled()
    }

    pub fn think_tokens(&self) -> u32 {
        self.think_tokens
    }

    pub fn output_tokens(&self) -> u32 {
        self.output_tokens
    }

    /// How many tokens of the end sequence the latest thinking tokens already match.
    pub fn end_matched(&self) -> usize {
        self.end_matched
    }

    /// Takes `n` generated tokens of a [`settled`](PhaseTracker::settled) request, where
    /// every token counts as output whatever it is: the same as `n` calls of `push`.
    pub fn push_output(&mut self, n: u32) {
        debug_assert!(self.settled());
        self.output_tokens += n;
    }

    /// Takes the next generated token; returns true when it ended thinking.
    pub fn push(&mut self, token: u32, markers: &ThinkMarkers) -> bool {
        match self.rule.phase() {
            Phase::Think => {
                self.think_tokens += 1;
                advance(&mut self.end_matched, token, &markers.end) && self.rule.mark(Mark::End).exited_think
            }
            _ if self.settled() => {
                self.output_tokens += 1;
                false
            }
            _ => {
                // No block has closed yet: a start sequence opens one, an end sequence
                // means the template opened it; anything else is content, once no partial
                // match is pending (it may still become a marker).
                let start = advance(&mut self.start_matched, token, &markers.start);
                let end = advance(&mut self.end_matched, token, &markers.end);
                if start {
                    self.end_matched = 0;
                    self.rule.mark(Mark::Start);
                    false
                } else if end {
                    self.start_matched = 0;
                    self.think_tokens += 1;
                    self.rule.mark(Mark::End).exited_think
                } else {
                    if self.start_matched == 0 && self.end_matched == 0 {
                        self.rule.mark(Mark::Content);
                    }
                    if self.rule.phase() == Phase::Output {
                        self.output_tokens += 1;
                    }
                    false
                }
            }
        }
    }
}

/// The phase a request is in after `output`, generated after `prompt` (the step tracer's
/// question about a preempted request).
pub fn phase_after(markers: &ThinkMarkers, prompt: &[u32], output: &[u32]) -> Phase {
    let mut t = PhaseTracker::new(markers, prompt);
    for &token in output {
        if t.settled() {
            break;
        }
        t.push(token, markers);
    }
    t.phase()
}

/// Steps a partial match of `seq`; true when `token` completes it.
fn advance(matched: &mut usize, token: u32, seq: &[u32]) -> bool {
    if seq.get(*matched) == Some(&token) {
        *matched += 1;
    } else {
        *matched = usize::from(seq.first() == Some(&token));
    }
    if !seq.is_empty() && *matched == seq.len() {
        *matched = 0;
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn markers() -> ThinkMarkers {
        ThinkMarkers::new(vec![465], vec![466]).unwrap()
    }

    #[test]
    fn output_tokens_counted_in_bulk_match_one_by_one() {
        let m = markers();
        let mut one = PhaseTracker::new(&m, &[465]);
        for t in [5, 466] {
            one.push(t, &m);
        }
        assert!(one.settled());
        let mut bulk = one.clone();
        for t in [465, 466, 7] {
            one.push(t, &m);
        }
        bulk.push_output(3);
        assert_eq!(
            (bulk.phase(), bulk.output_tokens(), bulk.think_tokens()),
            (one.phase(), one.output_tokens(), one.think_tokens())
        );
    }

    #[test]
    fn prompt_decides_the_starting_phase() {
        let m = markers();
        assert_eq!(PhaseTracker::new(&m, &[1, 2, 465, 10]).phase(), Phase::Think);
        assert_eq!(PhaseTracker::new(&m, &[1, 465, 10, 466, 10]).phase(), Phase::Output);
        assert_eq!(PhaseTracker::new(&m, &[1, 465, 466, 465, 10]).phase(), Phase::Think, "last block open");
        assert_eq!(PhaseTracker::new(&m, &[1, 2]).phase(), Phase::Pending);
    }

    #[test]
    fn end_token_switches_to_output_and_counts_split() {
        let m = markers();
        let mut t = PhaseTracker::new(&m, &[465]);
        assert!(!t.push(7, &m));
        assert!(!t.push(8, &m));
        assert!(t.push(466, &m));
        t.push(9, &m);
        assert_eq!((t.phase(), t.think_tokens(), t.output_tokens()), (Phase::Output, 3, 1));
    }

    #[test]
    fn multi_token_end_sequence_may_restart_mid_match() {
        let m = ThinkMarkers::new(vec![1, 2], vec![5, 6]).unwrap();
        let mut t = PhaseTracker::new(&m, &[]);
        for tok in [1, 2, 5, 5] {
            assert!(!t.push(tok, &m));
        }
        assert!(t.push(6, &m), "5,5,6 still ends with 5,6");
        assert_eq!(t.phase(), Phase::Output);
    }

    #[test]
    fn model_that_answers_directly_is_output_until_it_opens_a_block() {
        let m = markers();
        let mut t = PhaseTracker::new(&m, &[1]);
        t.push(42, &m);
        assert_eq!(t.phase(), Phase::Output);
        assert!(!t.settled(), "no block has closed: a start may still open one");
        t.push(465, &m);
        assert_eq!(t.phase(), Phase::Think);
        assert!(t.push(466, &m));
        assert_eq!((t.think_tokens(), t.output_tokens()), (1, 1));
    }

    #[test]
    fn an_end_with_no_start_ends_a_thought_the_prompt_did_not_show() {
        let m = markers();
        let mut t = PhaseTracker::new(&m, &[1]);
        assert!(t.push(466, &m));
        assert!(t.settled());
        assert_eq!(phase_after(&m, &[1], &[466, 465, 7]), Phase::Output);
        assert_eq!(phase_after(&m, &[1, 465], &[7, 8]), Phase::Think);
        assert_eq!(phase_after(&m, &[1], &[]), Phase::Pending);
    }
}
