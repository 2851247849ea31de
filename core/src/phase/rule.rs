//! The phase rule: how one generation moves between pending, thinking and answering,
//! given what each generated piece is. It is written once, here. The proxy's
//! [`PhaseRouter`](super::PhaseRouter) finds the markers in streamed text and ids, the
//! hook's [`PhaseTracker`](super::PhaseTracker) in token ids inside vLLM, and the step
//! tracer asks the hook's tracker; each only recognises markers and feeds them here, so
//! the three cannot disagree on what a sequence of markers means.

use super::Phase;

/// What a generated piece is, as far as phases go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// The think block's start marker (`<think>`, or its token id).
    Start,
    /// Its end marker.
    End,
    /// Anything else with something in it.
    Content,
}

/// The transitions one step of the rule made, each reported once per generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moves {
    /// Thinking began (the first time the generation entered [`Phase::Think`]).
    pub entered_think: bool,
    /// Thinking ended (the first time it left [`Phase::Think`] for [`Phase::Output`]).
    pub exited_think: bool,
}

/// One generation's phase under the rule:
///
/// - content before any marker belongs to the phase the template starts in (`first`:
///   thinking when the template opened the block in the prompt, answering otherwise);
/// - a start marker opens the think block, an end marker closes it (an end with no start:
///   the template opened the block, so thinking happened and ended);
/// - once a think block has closed, markers are quoted text: blocks do not reopen;
/// - a phase the server labels itself (its `reasoning` field, a harmony channel) is
///   entered as labelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseRule {
    phase: Phase,
    first: Phase,
    entered: bool,
    exited: bool,
}

impl PhaseRule {
    /// Nothing generated yet; content before any marker is in `first` (`Pending` reads
    /// as answering).
    pub fn new(first: Phase) -> Self {
        let first = if first == Phase::Pending { Phase::Output } else { first };
        PhaseRule { phase: Phase::Pending, first, entered: false, exited: false }
    }

    /// Generation resumes where the prompt left it: inside a think block the prompt
    /// opened (`Think`), after one it closed (`Output`: thinking switched off), or before
    /// any (`Pending`, the same as [`PhaseRule::new`] answering first).
    pub fn resumed(phase: Phase) -> Self {
        match phase {
            Phase::Pending => PhaseRule::new(Phase::Output),
            Phase::Think => PhaseRule { phase, first: phase, entered: true, exited: false },
            Phase::Output => PhaseRule { phase, first: phase, entered: true, exited: true },
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The phase content would go to now: [`PhaseRule::phase`], or where the template
    /// starts while nothing has been generated.
    pub fn phase_or_first(&self) -> Phase {
        if self.phase == Phase::Pending { self.first } else { self.phase }
    }

    /// Where content goes before any marker ([`PhaseRule::new`]); `Pending` leaves it.
    pub fn set_first(&mut self, first: Phase) {
        if first != Phase::Pending {
            self.first = first;
        }
    }

    /// True once a think block has closed: no marker can change the phase again (only a
    /// server's own label can), so a reader may count answer tokens without looking at
    /// them.
    pub fn settled(&self) -> bool {
        self.exited
    }

    /// Takes one marked piece.
    pub fn mark(&mut self, mark: Mark) -> Moves {
        let mut moves = Moves::default();
        match mark {
            Mark::Start if !self.exited => self.enter_into(Phase::Think, &mut moves),
            Mark::End if !self.exited => {
                self.enter_into(Phase::Think, &mut moves);
                self.enter_into(Phase::Output, &mut moves);
            }
            Mark::Content if self.phase == Phase::Pending => self.enter_into(self.first, &mut moves),
            Mark::Start | Mark::End | Mark::Content => {}
        }
        moves
    }

    /// Enters a phase the server labelled.
    pub fn enter(&mut self, next: Phase) -> Moves {
        let mut moves = Moves::default();
        self.enter_into(next, &mut moves);
        moves
    }

    fn enter_into(&mut self, next: Phase, moves: &mut Moves) {
        if next == self.phase {
            return;
        }
        if next == Phase::Think && !self.entered {
            self.entered = true;
            moves.entered_think = true;
        }
        if self.phase == Phase::Think && next == Phase::Output && !self.exited {
            self.exited = true;
            moves.exited_think = true;
        }
        self.phase = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTER: Moves = Moves { entered_think: true, exited_think: false };
    const EXIT: Moves = Moves { entered_think: false, exited_think: true };
    const BOTH: Moves = Moves { entered_think: true, exited_think: true };
    const NONE: Moves = Moves { entered_think: false, exited_think: false };

    #[test]
    fn a_block_opens_closes_and_never_reopens() {
        let mut r = PhaseRule::new(Phase::Output);
        assert_eq!(r.mark(Mark::Start), ENTER);
        assert_eq!(r.mark(Mark::Content), NONE);
        assert_eq!(r.mark(Mark::End), EXIT);
        assert!(r.settled());
        assert_eq!((r.mark(Mark::Start), r.mark(Mark::End), r.phase()), (NONE, NONE, Phase::Output));
    }

    #[test]
    fn content_first_goes_where_the_template_starts_and_a_start_may_still_follow() {
        let mut r = PhaseRule::new(Phase::Think);
        assert_eq!((r.mark(Mark::Content), r.phase()), (ENTER, Phase::Think));
        let mut r = PhaseRule::new(Phase::Pending);
        assert_eq!((r.mark(Mark::Content), r.phase()), (NONE, Phase::Output));
        // Whitespace a model wrote before opening its block is not a closed block.
        assert!(!r.settled());
        assert_eq!((r.mark(Mark::Start), r.phase()), (ENTER, Phase::Think));
    }

    #[test]
    fn an_end_without_a_start_is_a_thought_the_template_opened() {
        let mut r = PhaseRule::new(Phase::Output);
        assert_eq!((r.mark(Mark::End), r.phase()), (BOTH, Phase::Output));
    }

    #[test]
    fn resumed_from_the_prompt() {
        let mut r = PhaseRule::resumed(Phase::Think);
        assert_eq!((r.phase(), r.mark(Mark::End)), (Phase::Think, EXIT));
        let mut r = PhaseRule::resumed(Phase::Output);
        assert!(r.settled());
        assert_eq!((r.mark(Mark::Start), r.phase()), (NONE, Phase::Output));
        assert_eq!(PhaseRule::resumed(Phase::Pending), PhaseRule::new(Phase::Output));
    }

    #[test]
    fn a_labelled_phase_is_entered_even_after_the_block_closed() {
        let mut r = PhaseRule::new(Phase::Output);
        assert_eq!(r.enter(Phase::Think), ENTER);
        assert_eq!(r.enter(Phase::Output), EXIT);
        assert_eq!((r.enter(Phase::Think), r.phase()), (NONE, Phase::Think));
        assert_eq!(r.enter(Phase::Output), NONE);
    }
}
