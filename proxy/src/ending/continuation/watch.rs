//! Watches the first leg's events and says when thinking must end: the token budget
//! spent, the thinking time up, or RPDI over the streamed top logprobs past its bound;
//! and, on a `think` upstream, when the thought has ended and its answer is to be handed
//! over to an answer upstream.

use std::time::{Duration, Instant};

use meridian_core::signals::{Rpdi, RpdiConfig, entropy_from_top_logprobs, is_sentence_boundary};
use meridian_core::{Phase, PhaseEvent};
use serde_json::Value;
use smallvec::SmallVec;

use super::Route;
use crate::relay::watch::{Event, Part, SoFar, Watcher};

/// What may end this stream's thinking.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Triggers {
    pub tokens: Option<u32>,
    pub seconds: Option<Duration>,
    /// RPDI, and the thinking tokens before it may fire.
    pub rpdi: Option<(RpdiConfig, u32)>,
    /// EAT decides elsewhere (the prober) and rings the relay's continuation stage.
    pub eat: bool,
    /// The answer moves to an answer upstream when the thought ends, however it ends
    /// (the stream is on a `think` upstream).
    pub handoff: bool,
}

impl Triggers {
    pub fn any(&self) -> bool {
        self.tokens.is_some() || self.seconds.is_some() || self.rpdi.is_some() || self.eat || self.handoff
    }

    /// Only the hand-over: where the engine's hook ends thinking itself.
    pub fn handoff_only(self) -> Self {
        Triggers { handoff: self.handoff, ..Triggers::default() }
    }
}

/// Why thinking was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    Tokens,
    Seconds,
    Rpdi,
    Eat,
    /// The thought ended by itself (or the engine's hook ended it): the answer moves.
    Handoff,
}

impl Cut {
    pub fn label(self) -> &'static str {
        match self {
            Cut::Tokens => "budget_tokens",
            Cut::Seconds => "budget_seconds",
            Cut::Rpdi => "rpdi",
            Cut::Eat => "eat",
            Cut::Handoff => "handoff",
        }
    }
}

/// Decides, event by event, whether the first leg's thinking must be cut. A [`Watcher`]:
/// it reads what the relay's observer tracked (the one parse of each event), never the
/// bytes, and the relay takes its verdict ([`ThinkWatch::take_cut`]) right after each
/// event, so the cut falls on that event's boundary.
pub struct ThinkWatch {
    budget: Option<u32>,
    route: Route,
    seconds: Option<Duration>,
    rpdi: Option<(Rpdi, u32)>,
    handoff: bool,
    /// Chat: the reasoning so far; completions: all generated text so far.
    text: String,
    /// Chat: the answer so far (what came after the thought, before a hand-over).
    answer: String,
    /// The thought has ended by itself: a cut now is a hand-over of the answer.
    thought_ended: bool,
    /// The stream so far, as of the last event.
    so_far: Option<SoFar>,
    /// Thinking is over (or a cut was declined): nothing more to decide.
    settled: bool,
    /// The cut the last event made due, until taken.
    due: Option<Cut>,
}

impl ThinkWatch {
    pub fn new(route: Route, t: Triggers) -> Self {
        ThinkWatch {
            budget: t.tokens,
            route,
            seconds: t.seconds,
            rpdi: t.rpdi.map(|(cfg, min)| (Rpdi::new(cfg), min)),
            handoff: t.handoff,
            text: String::new(),
            answer: String::new(),
            thought_ended: false,
            so_far: None,
            settled: false,
            due: None,
        }
    }

    /// The cut the last event made due, if any.
    pub fn take_cut(&mut self) -> Option<Cut> {
        self.due.take()
    }

    fn decide(&mut self, event: &Event<'_>, part: &Part<'_>) -> Option<Cut> {
        let mut cut = None;
        for e in &part.events {
            match e {
                // The tracker's budget may be the engine's to enforce (`forcing = "auto"`).
                PhaseEvent::ForceBudget { .. } if self.budget.is_some() => cut = Some(Cut::Tokens),
                PhaseEvent::ExitThink { .. } | PhaseEvent::FirstOutput { .. } => {
                    // Once: a hand-over declined leaves the watch settled.
                    if !self.settled && self.handoff {
                        self.thought_ended = true;
                        self.settled = true;
                        return Some(Cut::Handoff);
                    }
                    self.settled = true;
                }
                _ => {}
            }
        }
        if self.settled {
            return None;
        }
        // The server's own count, when it sends usage with each chunk, is exact where the
        // tracker's is not (a delta can carry several tokens, or none with text).
        let generated = event.usage.map(|u| u.completion_tokens);
        if cut.is_none() && generated.zip(self.budget).is_some_and(|(n, b)| n >= b) {
            cut = Some(Cut::Tokens);
        }
        if cut.is_none() && self.deadline().is_some_and(|d| event.at >= d) {
            cut = Some(Cut::Seconds);
        }
        if let (true, Some((rpdi, min))) = (part.thinking, self.rpdi.as_mut()) {
            if let Some(logprobs) = part.logprobs.and_then(|l| serde_json::from_str::<Value>(l).ok()) {
                for h in token_entropies(&logprobs) {
                    rpdi.push(h);
                }
            }
            let piece = part.reasoning.as_deref().or(part.content.as_deref()).unwrap_or_default();
            let due = part.choice_think_tokens >= *min && is_sentence_boundary(piece) && rpdi.exceeded();
            if due && cut.is_none() {
                cut = Some(Cut::Rpdi);
            }
        }
        cut
    }

    /// When the thinking-time budget runs out (while thinking).
    pub fn deadline(&self) -> Option<Instant> {
        if !self.thinking() {
            return None;
        }
        Some(self.so_far?.timeline.first_think()? + self.seconds?)
    }

    /// Whether a cut may still happen (thinking, not settled).
    pub fn thinking(&self) -> bool {
        !self.settled && self.so_far.is_some_and(|s| s.phase == Phase::Think)
    }

    /// Stop deciding (a cut that could not be carried out: the rest of the stream is
    /// relayed as it comes).
    pub fn settle(&mut self) {
        self.settled = true;
        self.due = None;
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// Chat: the answer so far, after a thought that ended by itself.
    pub fn answer(&self) -> &str {
        &self.answer
    }

    /// Whether the thought ended by itself before the cut (its delimiter already sent).
    pub fn thought_ended(&self) -> bool {
        self.thought_ended
    }

    /// Tokens generated so far by the tracker's count.
    pub fn tokens(&self) -> u32 {
        self.so_far.map_or(0, |s| s.think_tokens + s.output_tokens)
    }

    /// Of those, the answer's (only a thought that ended by itself has any).
    pub fn answer_tokens(&self) -> u32 {
        self.so_far.filter(|_| self.thought_ended).map_or(0, |s| s.output_tokens)
    }
}

impl Watcher for ThinkWatch {
    fn on_event(&mut self, event: &Event<'_>) {
        // Only choice 0: a continued request has one (`n` > 1 is never continued).
        let Some(part) = event.parts.iter().find(|p| p.choice == 0) else { return };
        self.so_far = Some(*event.so_far);
        let piece = match self.route {
            Route::Chat => part.reasoning.as_deref(),
            Route::Completions => part.content.as_deref(),
        };
        self.text.push_str(piece.unwrap_or_default());
        if self.route == Route::Chat && self.handoff && !self.settled {
            self.answer.push_str(part.content.as_deref().unwrap_or_default());
        }
        if self.settled || event.last {
            return;
        }
        if let Some(cut) = self.decide(event, part) {
            self.due.get_or_insert(cut);
        }
    }
}

/// One entropy (the lower bound the top logprobs allow) per token of a choice's
/// `logprobs`.
fn token_entropies(logprobs: &Value) -> impl Iterator<Item = f64> + '_ {
    let chat = logprobs["content"].as_array().into_iter().flatten().map(|t| {
        let top: SmallVec<[f64; 20]> = t["top_logprobs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["logprob"].as_f64())
            .collect();
        top
    });
    let completions = logprobs["top_logprobs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m.as_object().into_iter().flatten().filter_map(|(_, v)| v.as_f64()).collect());
    chat.chain(completions)
        .filter(|top: &SmallVec<[f64; 20]>| !top.is_empty())
        .map(|top| entropy_from_top_logprobs(&top, usize::MAX).lower)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ctx::RequestCtx;
    use crate::relay::{RequestObserver, Served};
    use crate::telemetry::Metrics;
    use serde_json::json;

    fn reasoning(text: &str) -> Vec<u8> {
        json!({"choices": [{"index": 0, "delta": {"reasoning": text}}]}).to_string().into_bytes()
    }

    fn content(text: &str) -> Vec<u8> {
        json!({"choices": [{"index": 0, "delta": {"content": text}}]}).to_string().into_bytes()
    }

    /// A think watch lent each event by a relay observer, as the relay does.
    struct Watched {
        observer: RequestObserver,
        watch: ThinkWatch,
    }

    impl Watched {
        fn observe(&mut self, payload: &[u8], at: Instant) -> Option<Cut> {
            self.observer.on_payload_also(payload, at, &mut self.watch);
            self.watch.take_cut()
        }
        fn text(&self) -> &str {
            self.watch.text()
        }
        fn thinking(&self) -> bool {
            self.watch.thinking()
        }
        fn deadline(&self) -> Option<Instant> {
            self.watch.deadline()
        }
    }

    fn watch(t: Triggers) -> Watched {
        let mut ctx = RequestCtx::detached(crate::ctx::Route::ChatCompletions, None);
        ctx.think_budget = t.tokens;
        let observer = RequestObserver::new(Arc::new(Metrics::new()), Arc::new(ctx), Served::default(), true);
        Watched { observer, watch: ThinkWatch::new(Route::Chat, t) }
    }

    #[test]
    fn a_budget_the_engine_enforces_is_not_cut_here() {
        let mut ctx = RequestCtx::detached(crate::ctx::Route::ChatCompletions, None);
        ctx.think_budget = Some(2);
        let observer = RequestObserver::new(Arc::new(Metrics::new()), Arc::new(ctx), Served::default(), true);
        let seconds = Triggers { seconds: Some(Duration::from_secs(60)), ..Default::default() };
        let mut w = Watched { observer, watch: ThinkWatch::new(Route::Chat, seconds) };
        let now = Instant::now();
        for piece in ["a", " b", " c", " d"] {
            assert_eq!(w.observe(&reasoning(piece), now), None);
        }
    }

    #[test]
    fn a_thought_that_ends_by_itself_is_handed_over_once_with_the_answer_so_far() {
        let mut w = watch(Triggers { handoff: true, ..Default::default() });
        let now = Instant::now();
        assert_eq!(w.observe(&reasoning("Two"), now), None);
        assert_eq!(w.observe(&reasoning(" and two."), now), None);
        assert!(!w.watch.thought_ended() && w.watch.answer_tokens() == 0);
        assert_eq!(w.observe(&content("\n\nFour"), now), Some(Cut::Handoff), "the first answer token");
        assert!(w.watch.thought_ended());
        assert_eq!((w.text(), w.watch.answer()), ("Two and two.", "\n\nFour"));
        assert_eq!(w.watch.answer_tokens(), 1);
        assert_eq!(w.observe(&content("."), now), None, "settled: nothing more to cut");
        assert_eq!(w.watch.answer(), "\n\nFour", "what came after the cut is not the answer so far");
        let mut plain = watch(Triggers { tokens: Some(100), ..Default::default() });
        plain.observe(&reasoning("x"), now);
        assert_eq!(
            plain.observe(&content("y"), now),
            None,
            "without a hand-over the thought's end cuts nothing"
        );
    }

    #[test]
    fn cuts_when_the_token_budget_is_spent() {
        let mut w = watch(Triggers { tokens: Some(3), ..Default::default() });
        let now = Instant::now();
        assert_eq!(w.observe(&reasoning("a"), now), None);
        assert_eq!(w.observe(&reasoning(" b"), now), None);
        assert_eq!(w.observe(&reasoning(" c"), now), Some(Cut::Tokens));
        assert_eq!(w.text(), "a b c");
    }

    #[test]
    fn the_servers_token_count_wins_when_it_sends_one() {
        let mut w = watch(Triggers { tokens: Some(4), ..Default::default() });
        let now = Instant::now();
        let mut chunk = json!({"choices": [{"index": 0, "delta": {"reasoning": "ab"}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2}});
        assert_eq!(w.observe(chunk.to_string().as_bytes(), now), None);
        chunk["usage"]["completion_tokens"] = json!(4);
        assert_eq!(w.observe(chunk.to_string().as_bytes(), now), Some(Cut::Tokens), "4 tokens in 2 deltas");
    }

    #[test]
    fn thinking_that_ends_by_itself_is_never_cut() {
        let mut w = watch(Triggers { tokens: Some(3), ..Default::default() });
        let now = Instant::now();
        w.observe(&reasoning("a"), now);
        w.observe(&content("Answer"), now);
        assert_eq!(w.observe(&reasoning("b"), now), None);
        assert_eq!(w.observe(&reasoning("c"), now), None);
        assert!(!w.thinking());
    }

    #[test]
    fn cuts_when_thinking_time_is_up() {
        let mut w = watch(Triggers { seconds: Some(Duration::from_secs(2)), ..Default::default() });
        let t0 = Instant::now();
        assert_eq!(w.deadline(), None, "the clock starts with the first thinking token");
        assert_eq!(w.observe(&reasoning("a"), t0), None);
        assert_eq!(w.deadline(), Some(t0 + Duration::from_secs(2)));
        assert_eq!(w.observe(&reasoning("b"), t0 + Duration::from_secs(1)), None);
        assert_eq!(w.observe(&reasoning("c"), t0 + Duration::from_secs(2)), Some(Cut::Seconds));
    }

    fn with_entropy(text: &str, n: f64) -> Vec<u8> {
        // Uniform over n candidates: entropy ln n.
        let lp = -(n.ln());
        let top: Vec<Value> =
            (0..n as usize).map(|i| json!({"token": format!("t{i}"), "logprob": lp})).collect();
        json!({"choices": [{"index": 0, "delta": {"reasoning": text},
            "logprobs": {"content": [{"token": text, "logprob": lp, "top_logprobs": top}]}}]})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn rpdi_cuts_at_a_sentence_boundary_once_recent_entropy_climbs() {
        let cfg = RpdiConfig { window: 4, lambda: 1.5 };
        let mut w = watch(Triggers { rpdi: Some((cfg, 8)), ..Default::default() });
        let now = Instant::now();
        for _ in 0..8 {
            assert_eq!(w.observe(&with_entropy(" calm", 2.0), now), None);
        }
        // Entropy ln 16 = 4 ln 2 against a mean of ln 2 so far: the recent window climbs
        // past 1.5x the overall mean, but only a sentence end may cut.
        for _ in 0..3 {
            assert_eq!(w.observe(&with_entropy(" unsure", 16.0), now), None);
        }
        assert_eq!(w.observe(&with_entropy(" end.", 16.0), now), Some(Cut::Rpdi));
    }

    #[test]
    fn rpdi_waits_for_the_minimum_thinking() {
        let cfg = RpdiConfig { window: 2, lambda: 1.1 };
        let mut w = watch(Triggers { rpdi: Some((cfg, 100)), ..Default::default() });
        let now = Instant::now();
        w.observe(&with_entropy("a", 2.0), now);
        assert_eq!(w.observe(&with_entropy("b.", 16.0), now), None);
    }

    #[test]
    fn completions_entropies_come_from_the_top_logprobs_maps() {
        let logprobs = json!({"top_logprobs": [{"a": (0.5f64).ln(), "b": (0.5f64).ln()}]});
        let hs: Vec<f64> = token_entropies(&logprobs).collect();
        assert_eq!(hs.len(), 1);
        assert!((hs[0] - std::f64::consts::LN_2).abs() < 1e-12);
    }
}
