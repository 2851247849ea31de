use std::sync::Arc;

use arrayvec::ArrayVec;

use super::Phase;
use super::rule::{Mark, Moves, PhaseRule};
use super::scanner::{MarkerKind, Piece, Scanner};
use crate::models::{InitialPhase, ModelFamily};

/// A transition worth acting on. Each fires at most once per generation, so one
/// [`PhaseEvents`] can always hold everything a single delta causes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseEvent {
    /// The first reasoning token arrived.
    EnterThink,
    /// Reasoning ended (end marker, or the stream moved on to output).
    ExitThink { think_tokens: u32 },
    /// The first output token with visible (non-whitespace) text arrived.
    FirstOutput { think_tokens: u32 },
    /// The think budget is spent while still thinking: the caller should force the end.
    ForceBudget { think_tokens: u32, budget: u32 },
}

/// Events caused by one delta; never allocates.
pub type PhaseEvents = ArrayVec<PhaseEvent, 4>;

/// One streamed delta as the upstream sent it. All fields are optional because each
/// server dialect fills different ones.
#[derive(Debug, Clone, Copy, Default)]
pub struct Delta<'a> {
    /// `delta.reasoning` (vLLM ≥ 0.10) or `delta.reasoning_content` (older servers).
    pub reasoning: Option<&'a str>,
    /// `delta.content` (chat) or `text` (completions).
    pub content: Option<&'a str>,
    /// `token_ids`, when the server returns them.
    pub token_ids: Option<&'a [u32]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Harmony {
    Header,
    ChannelName,
    Message(Phase),
}

const CHANNEL_NAME_CAP: usize = 48;

/// Per-request phase state machine. O(1) per token: the work per delta is linear in the
/// delta's bytes with a small constant, and nothing is allocated after construction.
#[derive(Debug)]
pub struct PhaseRouter {
    family: Option<Arc<ModelFamily>>,
    /// Where the generation stands, by the rule the hook follows too.
    rule: PhaseRule,
    /// The server labels reasoning itself (`delta.reasoning`): trust its labels and stop
    /// looking for inline markers, which would then only be quoted text.
    server_labels_reasoning: bool,
    scanner: Scanner,
    harmony: Harmony,
    channel_name: ArrayVec<u8, CHANNEL_NAME_CAP>,
    think_tokens: u32,
    output_tokens: u32,
    think_budget: Option<u32>,
    first_output: bool,
    budget_fired: bool,
}

/// What one delta contributed, used to attribute its tokens.
#[derive(Default)]
struct Tally {
    think_bytes: usize,
    output_bytes: usize,
}

impl PhaseRouter {
    /// A router for a generation of `family` (or of an unknown model, detected from
    /// `delta.reasoning` alone when `None`).
    pub fn new(family: Option<Arc<ModelFamily>>) -> Self {
        let initial = match family.as_ref().map(|f| f.file.initial_phase) {
            Some(InitialPhase::Think) => Phase::Think,
            _ => Phase::Output,
        };
        PhaseRouter {
            family,
            rule: PhaseRule::new(initial),
            server_labels_reasoning: false,
            scanner: Scanner::new(),
            harmony: Harmony::Header,
            channel_name: ArrayVec::new(),
            think_tokens: 0,
            output_tokens: 0,
            think_budget: None,
            first_output: false,
            budget_fired: false,
        }
    }

    /// Overrides where generation starts, e.g. `Output` when the request disabled thinking
    /// (`chat_template_kwargs.enable_thinking = false`).
    pub fn with_initial_phase(mut self, phase: Phase) -> Self {
        self.rule.set_first(phase);
        self
    }

    /// Emits [`PhaseEvent::ForceBudget`] once `budget` think tokens have been generated.
    pub fn with_think_budget(mut self, budget: u32) -> Self {
        self.think_budget = Some(budget);
        self
    }

    pub fn phase(&self) -> Phase {
        self.rule.phase()
    }

    pub fn think_tokens(&self) -> u32 {
        self.think_tokens
    }

    pub fn output_tokens(&self) -> u32 {
        self.output_tokens
    }

    pub fn family(&self) -> Option<&Arc<ModelFamily>> {
        self.family.as_ref()
    }

    /// Feeds one delta.
    pub fn observe(&mut self, delta: Delta<'_>) -> PhaseEvents {
        let mut ev = PhaseEvents::new();
        let ids = delta.token_ids.filter(|ids| !ids.is_empty());
        let reasoning = delta.reasoning.filter(|s| !s.is_empty());
        let content = delta.content.filter(|s| !s.is_empty());
        let tokens = ids.map_or(1, |ids| ids.len() as u32);

        if reasoning.is_some() {
            self.server_labels_reasoning = true;
            let n = if content.is_some() { 1 } else { tokens };
            self.enter(Phase::Think, &mut ev);
            self.add_think(n, &mut ev);
        }
        let content_tokens = if reasoning.is_some() { tokens.saturating_sub(1).max(1) } else { tokens };
        if content.is_some() || (reasoning.is_none() && ids.is_some()) {
            let text = content.unwrap_or("").as_bytes();
            if self.server_labels_reasoning || self.family.is_none() {
                self.labelled_output(text, content_tokens, &mut ev);
            } else {
                self.by_inline_markers(text, ids, content_tokens, &mut ev);
            }
        }
        ev
    }

    /// Ends the stream: text held back as a possible marker is counted after all.
    pub fn finish(&mut self) -> PhaseEvents {
        let mut ev = PhaseEvents::new();
        if let Some(family) = self.family.clone() {
            let mut tally = Tally::default();
            let mut scanner = std::mem::take(&mut self.scanner);
            scanner.finish(&family.markers, |piece| self.on_piece(&family, piece, &mut tally, &mut ev));
            self.scanner = scanner;
        }
        ev
    }

    fn labelled_output(&mut self, text: &[u8], tokens: u32, ev: &mut PhaseEvents) {
        self.enter(Phase::Output, ev);
        self.output_tokens += tokens;
        if is_visible(text) {
            self.mark_first_output(ev);
        }
    }

    fn by_inline_markers(&mut self, text: &[u8], ids: Option<&[u32]>, tokens: u32, ev: &mut PhaseEvents) {
        let Some(family) = self.family.clone() else {
            return self.labelled_output(text, tokens, ev);
        };
        let before = self.rule.phase_or_first();
        // Servers that strip special tokens from the text still report their ids: take the
        // marker from the id then. When the text carries the marker itself, the text wins,
        // so a family file with a wrong id cannot invent a transition.
        if let Some(ids) = ids {
            if family.has_ids() && !self.text_has_marker(&family, text) {
                for kind in ids.iter().filter_map(|&id| family.marker_for_id(id)) {
                    self.on_marker(&family, kind, ev);
                }
            }
        }
        let mut tally = Tally::default();
        let mut scanner = std::mem::take(&mut self.scanner);
        scanner.feed(&family.markers, text, |piece| self.on_piece(&family, piece, &mut tally, ev));
        self.scanner = scanner;
        // A delta is usually one token; it belongs where its text went. A delta that was
        // only a marker (or held back) is part of the reasoning section when it opened or
        // closed one.
        let thinking_around = before == Phase::Think || self.rule.phase() == Phase::Think;
        if tally.think_bytes > 0 || (tally.output_bytes == 0 && thinking_around) {
            self.add_think(tokens, ev);
        } else {
            self.output_tokens += tokens;
        }
    }

    fn text_has_marker(&self, family: &ModelFamily, text: &[u8]) -> bool {
        !self.scanner.pending().is_empty() || family.markers.occurs_in(text)
    }

    fn on_piece(&mut self, family: &ModelFamily, piece: Piece<'_>, tally: &mut Tally, ev: &mut PhaseEvents) {
        match piece {
            Piece::Text(t) => self.on_text(family, t, tally, ev),
            Piece::Marker(kind) => self.on_marker(family, kind, ev),
        }
    }

    fn on_text(&mut self, family: &ModelFamily, text: &[u8], tally: &mut Tally, ev: &mut PhaseEvents) {
        if family.harmony {
            match self.harmony {
                Harmony::Header => return,
                Harmony::ChannelName => {
                    let room = CHANNEL_NAME_CAP - self.channel_name.len();
                    self.channel_name.extend(text.iter().copied().take(room));
                    return;
                }
                Harmony::Message(_) => {}
            }
        }
        if !text.is_empty() {
            let moves = self.rule.mark(Mark::Content);
            self.report(moves, ev);
        }
        match self.rule.phase() {
            Phase::Think => tally.think_bytes += text.len(),
            Phase::Output => {
                tally.output_bytes += text.len();
                if is_visible(text) {
                    self.mark_first_output(ev);
                }
            }
            Phase::Pending => {}
        }
    }

    fn on_marker(&mut self, family: &ModelFamily, kind: MarkerKind, ev: &mut PhaseEvents) {
        match kind {
            // The rule: blocks do not reopen (tags after the first block are quoted
            // text), and an end with no start means the template opened the block.
            MarkerKind::ThinkStart => {
                let moves = self.rule.mark(Mark::Start);
                self.report(moves, ev);
            }
            MarkerKind::ThinkEnd => {
                let moves = self.rule.mark(Mark::End);
                self.report(moves, ev);
            }
            MarkerKind::HarmonyStart | MarkerKind::HarmonyEnd => self.harmony = Harmony::Header,
            MarkerKind::HarmonyChannel => {
                self.channel_name.clear();
                self.harmony = Harmony::ChannelName;
            }
            MarkerKind::HarmonyMessage => {
                let phase =
                    if family.channel_is_think(&self.channel_name) { Phase::Think } else { Phase::Output };
                self.harmony = Harmony::Message(phase);
                self.enter(phase, ev);
            }
        }
    }

    /// Enters a phase the server labelled (its reasoning field, a harmony channel).
    fn enter(&mut self, next: Phase, ev: &mut PhaseEvents) {
        let moves = self.rule.enter(next);
        self.report(moves, ev);
    }

    fn report(&self, moves: Moves, ev: &mut PhaseEvents) {
        if moves.entered_think {
            ev.push(PhaseEvent::EnterThink);
        }
        if moves.exited_think {
            ev.push(PhaseEvent::ExitThink { think_tokens: self.think_tokens });
        }
    }

    fn mark_first_output(&mut self, ev: &mut PhaseEvents) {
        if !self.first_output {
            self.first_output = true;
            ev.push(PhaseEvent::FirstOutput { think_tokens: self.think_tokens });
        }
    }

    fn add_think(&mut self, tokens: u32, ev: &mut PhaseEvents) {
        self.think_tokens += tokens;
        if let Some(budget) = self.think_budget {
            if !self.budget_fired && self.rule.phase() == Phase::Think && self.think_tokens >= budget {
                self.budget_fired = true;
                ev.push(PhaseEvent::ForceBudget { think_tokens: self.think_tokens, budget });
            }
        }
    }
}

/// True when the text has something a reader would see.
fn is_visible(text: &[u8]) -> bool {
    text.iter().any(|b| !b.is_ascii_whitespace())
}
