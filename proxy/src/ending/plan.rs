//! The one decision of how a request's thinking gets ended, when a think budget, a
//! thinking-time budget or an exit signal says so, and its carrying out.
//!
//! It is made in two steps, because the upstream is chosen between them. Before the
//! send, [`Prepared`] makes the bodies either kind of upstream needs: one for an upstream
//! whose hook is ready (the stream id and budget in `vllm_xargs`), one for an upstream
//! without (the budget in vLLM's `thinking_token_budget`, or the continuation's first
//! leg, as `budget.forcing` chooses). Once an upstream answered, [`Prepared::decide`]
//! turns that into an [`EndingPlan`]: who ends thinking ([`By`]) and what it watches.
//! The relay then carries the plan out ([`EndingPlan::carry_out`]): the watchers it
//! adds to the request's observer and the continuation stage it runs.

use std::sync::Arc;
use std::time::Duration;

use crate::config::ExitSignal;
use axum::http::HeaderMap;
use bytes::Bytes;
use meridian_core::Phase;
use meridian_core::stream::Dialect;

use super::continuation::{self, Continuation, ContinuationPlan, Delimiters};
use super::{DeadlineWatch, EatFeed, EatProber, EndThinking, ForgetAtEnd, ProbeTarget, ThinkDeadline};
use crate::body::{GenerationRequest, hook_body, upstream_body};
use crate::ctx::{Ending, RequestCtx, Route};
use crate::error::ProxyError;
use crate::hook::HookTarget;
use crate::relay::RequestObserver;
use crate::state::AppState;
use crate::upstream::Upstream;

/// The bodies a request may go upstream with, made before its upstream is chosen.
pub struct Prepared {
    /// For an upstream without a ready hook.
    pub body: Bytes,
    /// For an upstream whose hook is ready (taken when the request is sent); made only
    /// while some upstream's hook is.
    pub hook_body: Option<Bytes>,
    /// How the proxy would end thinking itself, should the request reach an upstream
    /// without a ready hook; `body` is then its first leg.
    continuation: Option<ContinuationPlan>,
}

/// The body for an upstream whose hook is ready, as this request's context says; asking
/// for usage in every chunk when its answer may be handed over (the hand-over stage takes
/// out what the client did not ask for).
fn hooked(
    ctx: &RequestCtx,
    body: &Bytes,
    req: &GenerationRequest<'_>,
    queued: Option<Duration>,
    hands_over: bool,
) -> Result<Bytes, ProxyError> {
    let hooked = hook_body(body, req, ctx.think_budget, ctx.stream_id(), ctx.drop_client_priority(), queued)?;
    // A body serde_json cannot rebuild has no continuation either: it goes as it is.
    Ok(match hands_over {
        true => continuation::with_usage_in_every_chunk(&hooked).unwrap_or(hooked),
        false => hooked,
    })
}

impl Prepared {
    /// `body` is the client's, `req` the same parsed once.
    pub fn new(
        state: &AppState,
        ctx: &RequestCtx,
        body: &Bytes,
        req: &GenerationRequest<'_>,
    ) -> Result<Self, ProxyError> {
        let continuable = continuation::continuable(state, ctx, req);
        let hands_over = continuable.as_ref().is_some_and(|c| c.triggers.handoff);
        // Made before admission too, so that a bad `vllm_xargs` is refused before it waits.
        let hook_body = match state.pool.all().iter().any(|u| u.hook_ready()) {
            true => Some(hooked(ctx, body, req, None, hands_over)?),
            false => None,
        };
        // Token budgets the proxy forces itself do not go to the engine as well.
        let engine_budget = match &continuable {
            Some(c) if c.triggers.tokens.is_some() => ctx.client_budget,
            _ => ctx.think_budget,
        };
        let body = upstream_body(body, req, engine_budget, ctx.drop_client_priority())?;
        // A body the continuation cannot rebuild (a number beyond serde_json's range, a
        // lone surrogate: valid JSON all the same) goes as it is, without one.
        let continuation = continuable.and_then(|c| c.with_first_leg(&body).ok());
        let body = continuation.as_ref().map_or(body, |c| c.body.clone());
        Ok(Prepared { body, hook_body, continuation })
    }

    /// The request waited `waited` in the admission queue: the body for an upstream whose
    /// hook is ready says so (`meridian_queued_ms`), so that the hook's start target counts
    /// that wait (ADR 0012). Made again only for a request that waited.
    pub fn waited_in_admission(
        &mut self,
        ctx: &RequestCtx,
        body: &Bytes,
        req: &GenerationRequest<'_>,
        waited: Duration,
    ) -> Result<(), ProxyError> {
        if self.hook_body.is_some() && waited.as_millis() > 0 {
            let hands_over = self.continuation.as_ref().is_some_and(ContinuationPlan::hands_over);
            self.hook_body = Some(hooked(ctx, body, req, Some(waited), hands_over)?);
        }
        Ok(())
    }

    /// The first leg goes with `headers`; the continuation's later leg with the same, at
    /// `output_priority` when the proxy sets priorities (what follows a cut is all answer).
    pub fn first_leg_headers(&mut self, headers: &HeaderMap, output_priority: Option<i32>) {
        if let Some(c) = self.continuation.as_mut() {
            c.later_leg_headers(headers, output_priority);
        }
    }

    /// The plan, once an upstream answered; `hook`: the address of that upstream's hook,
    /// when the request went with the hook's body.
    pub fn decide(self, state: &AppState, ctx: &RequestCtx, hook: Option<&str>) -> EndingPlan {
        let exit = state.config.exit.signal;
        let thinking = ctx.family.is_some() && ctx.initial_phase != Some(Phase::Output);
        // A ready hook ends thinking in place; the proxy still hands the answer over.
        let (continuation, handoff) = match (self.continuation, hook) {
            (Some(c), None) => (Some(c), None),
            (Some(c), Some(_)) => (None, c.handoff_only()),
            (None, _) => (None, None),
        };
        let hook = hook.map(|addr| HookTarget {
            channel: state.hook.clone(),
            addr: addr.to_owned(),
            span: ctx.span().clone(),
        });
        let by = match (continuation, hook) {
            (Some(c), _) => By::Continuation(c),
            // The hook acts on a token budget, a thinking-time budget or an exit signal.
            (None, Some(h))
                if ctx.think_budget.is_some() || ctx.think_seconds.is_some() || exit != ExitSignal::Off =>
            {
                By::Hook(h)
            }
            // vLLM reads the field on chat and completions, and its own on Messages.
            (None, _)
                if ctx.think_budget.is_some()
                    && (ctx.route().dialect() == Dialect::Chat || ctx.think_budget == ctx.client_budget) =>
            {
                By::EngineField
            }
            _ => By::Nothing,
        };
        EndingPlan { unenforced: thinking && unenforced(ctx, exit, &by), by, handoff }
    }
}

/// Who ends a request's thinking.
pub enum By {
    /// Nothing the proxy does: nothing applies, or only what the model does by itself.
    Nothing,
    /// The engine, from vLLM's `thinking_token_budget` in the body (token budgets only).
    EngineField,
    /// The upstream's hook: the budget in `vllm_xargs`, and `end_thinking` told over the
    /// policy channel by the thinking-time deadline or an EAT exit.
    Hook(HookTarget),
    /// The proxy, by cutting the stream and continuing it (no ready hook).
    Continuation(ContinuationPlan),
}

/// How a request's thinking gets ended, decided once.
pub struct EndingPlan {
    pub by: By,
    /// A budget or exit signal applies that nothing on this request's API can carry out
    /// (counted, not dropped silently).
    pub unenforced: bool,
    /// With a ready hook ending thinking: the continuation stage that hands the answer
    /// over at the end of the thought, should the upstream be a `think` server.
    handoff: Option<ContinuationPlan>,
}

/// Whether something applies that nothing can carry out: on an API the continuation
/// does not speak (Responses, Messages), a think budget the engine does not already
/// enforce from the client's own field, a thinking-time budget or an exit signal, with
/// no ready hook; or EAT, whose probes are chat requests, hook or not.
fn unenforced(ctx: &RequestCtx, exit: ExitSignal, by: &By) -> bool {
    if continuation::Route::of(ctx.route()).is_some() {
        return false;
    }
    if exit == ExitSignal::Eat {
        return true;
    }
    let own_budget = ctx.think_budget.is_some() && ctx.think_budget != ctx.client_budget;
    !matches!(by, By::Hook(_)) && (own_budget || ctx.think_seconds.is_some() || exit != ExitSignal::Off)
}

impl EndingPlan {
    /// What a response read whole needs: the hook's `forget` at its end when a
    /// thinking-time budget may have told it something.
    pub fn for_whole_answer(self, ctx: &Arc<RequestCtx>, observer: RequestObserver) -> RequestObserver {
        match self.by {
            By::Hook(hook) if ctx.think_seconds.is_some() => {
                observer.watch(Box::new(ForgetAtEnd { hook, ctx: ctx.clone() }))
            }
            _ => observer,
        }
    }

    /// Carries the plan out on a streamed response from `upstream` (sent to `path`):
    /// the request's progress says how its thinking will end, the observer gets the
    /// plan's watchers (the thinking-time deadline, the EAT prober's feed, the hook's
    /// `forget` at the end), and the relay its continuation stage, if any (the one that
    /// ends thinking, or the one that only hands the answer over).
    pub fn carry_out(
        self,
        state: &AppState,
        ctx: &Arc<RequestCtx>,
        mut observer: RequestObserver,
        upstream: &Arc<Upstream>,
        path: &str,
    ) -> (RequestObserver, Option<Continuation>) {
        let (end, continuation) = match self.by {
            By::Continuation(c) => {
                ctx.progress.set_ending(Ending::Continuation);
                (Some(EndThinking::Continuation(c.end_now.clone())), Some(c))
            }
            By::Hook(h) => {
                ctx.progress.set_ending(Ending::Hook);
                (Some(EndThinking::Hook(h)), self.handoff)
            }
            By::EngineField | By::Nothing => (None, self.handoff),
        };
        let mut forget = None;
        let seconds = ctx.think_seconds.map(Duration::from_secs_f64);
        if let (Some(EndThinking::Hook(hook)), Some(after)) = (&end, seconds) {
            forget = Some(hook.clone());
            let deadline = ThinkDeadline { after, hook: hook.clone() };
            observer =
                observer.watch(Box::new(DeadlineWatch::new(deadline, ctx.clone(), state.metrics.clone())));
        }
        if let Some(end) = end.filter(|_| state.config.exit.signal == ExitSignal::Eat) {
            if let Some(prober) = eat_prober(state, ctx, upstream, end.clone()) {
                if let EndThinking::Hook(h) = end {
                    forget = Some(h);
                }
                observer = observer.watch(Box::new(EatFeed::new(prober)));
            }
        }
        if let Some(hook) = forget {
            observer = observer.watch(Box::new(ForgetAtEnd { hook, ctx: ctx.clone() }));
        }
        let continuation = continuation.map(|c| c.start(state, ctx, upstream, path));
        (observer, continuation)
    }
}

/// EAT probing for a streamed chat whose model family names its think delimiters.
fn eat_prober(
    state: &AppState,
    ctx: &Arc<RequestCtx>,
    upstream: &Upstream,
    end: EndThinking,
) -> Option<EatProber> {
    if ctx.route() != Route::ChatCompletions {
        return None;
    }
    // A probe reopens the thought in its prompt, so it needs the start tag as well.
    let delimiters = Delimiters::of(ctx.family.as_ref()?).filter(|d| !d.open.is_empty())?;
    let target = ProbeTarget {
        client: state.client.clone(),
        base_url: upstream.base_url.clone(),
        auth: state.upstream_auth.clone(),
        ctx: ctx.clone(),
        delimiters,
        end,
        metrics: state.metrics.clone(),
    };
    EatProber::start(&state.config.exit, target)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::config::{EndpointConfig, ExitSignal, Forcing, MeridianConfig};
    use bytes::Bytes;
    use meridian_core::route::Role;
    use meridian_core::{ModelRegistry, Phase};

    use super::{By, EndingPlan, Prepared};
    use crate::body::GenerationRequest;
    use crate::ctx::{RequestCtx, Route};
    use crate::state::AppState;

    /// The plan for one request: `budget` tokens, `seconds` of thinking, on `route`,
    /// answered by an upstream whose hook took it (`via_hook`) or not.
    struct Case {
        route: Route,
        budget: Option<u32>,
        seconds: Option<f64>,
        thinking_off: bool,
        forcing: Forcing,
        exit: ExitSignal,
        via_hook: bool,
        /// The pool has a `think` server and an `answer` server.
        roles: bool,
    }

    impl Default for Case {
        fn default() -> Self {
            Case {
                route: Route::ChatCompletions,
                budget: None,
                seconds: None,
                thinking_off: false,
                forcing: Forcing::Auto,
                exit: ExitSignal::Off,
                via_hook: false,
                roles: false,
            }
        }
    }

    fn plan(case: Case) -> EndingPlan {
        let mut cfg = MeridianConfig::default();
        cfg.budget.forcing = case.forcing;
        cfg.exit.signal = case.exit;
        if case.roles {
            for (i, role) in [Role::Think, Role::Answer].into_iter().enumerate() {
                cfg.upstream.endpoints.push(EndpointConfig {
                    url: format!("http://u{i}:8000"),
                    name: None,
                    hook: None,
                    models: None,
                    role,
                });
            }
        }
        let models = ModelRegistry::builtin().expect("the built-in families load");
        let family = models.get("qwen3").cloned();
        let state = AppState::new(cfg, models, Default::default()).expect("a default state");
        let body = match case.route {
            Route::Responses => r#"{"model":"qwen3","input":"hi","stream":true}"#,
            Route::Messages => {
                r#"{"model":"qwen3","max_tokens":64,"messages":[{"role":"user","content":"hi"}],"stream":true}"#
            }
            _ => r#"{"model":"qwen3","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
        };
        let body = Bytes::from_static(body.as_bytes());
        let req = GenerationRequest::parse(&body, case.route.dialect()).expect("a valid body");
        let mut ctx = RequestCtx::detached(case.route, family);
        ctx.think_budget = case.budget;
        ctx.think_seconds = case.seconds;
        ctx.initial_phase = case.thinking_off.then_some(Phase::Output);
        let prepared = Prepared::new(&state, &ctx, &body, &req).expect("bodies");
        prepared.decide(&state, &Arc::new(ctx), case.via_hook.then_some("hook:7070"))
    }

    fn by(plan: &EndingPlan) -> &'static str {
        match plan.by {
            By::Nothing => "nothing",
            By::EngineField => "engine field",
            By::Hook(_) => "hook",
            By::Continuation(_) => "continuation",
        }
    }

    #[test]
    fn a_ready_hook_ends_thinking_whenever_something_applies() {
        let p = plan(Case { budget: Some(64), via_hook: true, ..Case::default() });
        assert_eq!((by(&p), p.unenforced), ("hook", false));
        let p = plan(Case {
            seconds: Some(5.0),
            via_hook: true,
            forcing: Forcing::Continuation,
            ..Case::default()
        });
        assert_eq!(by(&p), "hook", "the hook, not a second request, where one is ready");
        let p = plan(Case { via_hook: true, ..Case::default() });
        assert_eq!(by(&p), "nothing", "nothing to end: the hook is told nothing");
    }

    #[test]
    fn without_a_hook_tokens_go_to_the_engine_and_the_rest_to_the_continuation() {
        let p = plan(Case { budget: Some(64), ..Case::default() });
        assert_eq!(by(&p), "engine field");
        let p = plan(Case { budget: Some(64), forcing: Forcing::Continuation, ..Case::default() });
        assert_eq!(by(&p), "continuation");
        let p = plan(Case { seconds: Some(5.0), ..Case::default() });
        assert_eq!(by(&p), "continuation", "only the proxy can keep time without a hook");
        let p = plan(Case { seconds: Some(5.0), forcing: Forcing::Engine, ..Case::default() });
        assert_eq!((by(&p), p.unenforced), ("nothing", false), "chat could continue: forcing said not to");
    }

    #[test]
    fn think_servers_get_a_stage_that_hands_the_answer_over_whoever_ends_thinking() {
        let p = plan(Case { roles: true, via_hook: true, budget: Some(64), ..Case::default() });
        assert_eq!(by(&p), "hook", "the hook still ends thinking in the engine");
        assert!(p.handoff.is_some(), "and the proxy hands the answer over at the thought's end");
        let p = plan(Case { roles: true, forcing: Forcing::Engine, ..Case::default() });
        assert_eq!(by(&p), "continuation", "engine forcing cuts nothing but the hand-over");
        let p = plan(Case { roles: true, thinking_off: true, ..Case::default() });
        assert_eq!(by(&p), "nothing", "an answer from the start has nothing to hand over");
        let p = plan(Case { via_hook: true, ..Case::default() });
        assert!(p.handoff.is_none(), "no think servers, no hand-over");
    }

    #[test]
    fn a_hooks_body_that_may_be_handed_over_asks_for_usage_in_every_chunk() {
        let body = Bytes::from_static(
            br#"{"model":"qwen3","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
        );
        let req = GenerationRequest::parse(&body, Route::ChatCompletions.dialect()).expect("a valid body");
        let ctx = RequestCtx::detached(Route::ChatCompletions, None);
        let read = |hands_over| -> serde_json::Value {
            serde_json::from_slice(&super::hooked(&ctx, &body, &req, None, hands_over).expect("a body"))
                .unwrap()
        };
        let (handed, kept) = (read(true), read(false));
        assert_eq!(
            handed["stream_options"]["continuous_usage_stats"], true,
            "the cut knows the server's count"
        );
        assert!(handed["vllm_xargs"]["meridian_request_id"].is_string(), "still the hook's body");
        assert!(kept.get("stream_options").is_none(), "as the client sent it otherwise");
    }

    #[test]
    fn what_nothing_can_carry_out_is_flagged_not_dropped() {
        let p = plan(Case { route: Route::Responses, seconds: Some(5.0), ..Case::default() });
        assert_eq!((by(&p), p.unenforced), ("nothing", true));
        let p = plan(Case { route: Route::Responses, seconds: Some(5.0), via_hook: true, ..Case::default() });
        assert_eq!((by(&p), p.unenforced), ("hook", false));
        let p =
            plan(Case { route: Route::Messages, exit: ExitSignal::Eat, via_hook: true, ..Case::default() });
        assert_eq!((by(&p), p.unenforced), ("hook", true), "EAT probes are chat requests, hook or not");
        let p =
            plan(Case { route: Route::Responses, seconds: Some(5.0), thinking_off: true, ..Case::default() });
        assert!(!p.unenforced, "a request that does not think has nothing to end");
    }
}
