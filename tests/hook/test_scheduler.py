"""vLLM's real AsyncScheduler with the hook: who gets the step first, who is preempted
when KV blocks run out, and that a hook failure leaves vLLM's own behaviour intact."""

from __future__ import annotations

import pytest
from conftest import metric, tier
from meridian_hook.testing import THINK_END, THINK_START, build
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import RequestStatus

from meridian_hook import _native
from meridian_hook.scheduler import MeridianScheduler

PROMPT = [1] * 20 + [THINK_START]  # a chat template that opens the think block


def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


@pytest.mark.usefixtures("output_first")
def test_answering_request_moves_ahead_of_earlier_thinkers():
    e = build(MeridianScheduler, num_blocks=64)
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.step({})  # prefill both; each samples a thinking token
    assert ids(e.scheduler.running) == ["thinker", "answerer"]
    reorders = metric("meridian_hook_reorders_total")
    e.step({"answerer": THINK_END})  # answerer closes its thought
    e.step({})
    assert ids(e.scheduler.running) == ["answerer", "thinker"], "output phase runs first"
    assert metric("meridian_hook_reorders_total") > reorders
    assert e.scheduler._meridian.phase("answerer") == "output"
    assert e.scheduler._meridian.phase("thinker") == "think"


@pytest.mark.usefixtures("output_first")
def test_a_thought_is_seen_ending_as_vllm_records_the_token_and_counted_once():
    """The hook reads a step's sampled tokens in ``update_from_output``, right where vLLM
    appends them: the end of a thought is known before the next step is planned, and a
    token is counted once whether that read or the next ``schedule()`` takes it."""
    e = build(MeridianScheduler, num_blocks=64)
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.step({})
    core = e.scheduler._meridian
    e.step({"answerer": THINK_END})
    assert core.phase("answerer") == "output", "known as soon as vLLM appended the token"
    # A request admitted by the step just planned is unknown to that read; the next
    # schedule() reads it, from its prompt on.
    e.add("late", PROMPT, arrival=3.0)
    generated = {"thinker": [7], "answerer": [7, THINK_END], "late": []}
    for k in range(6):
        e.step({"late": THINK_END} if k == 4 else {})
        for rid, tokens in generated.items():
            if rid != "late" or k >= 1:  # "late" samples from its first whole step on
                tokens.append(THINK_END if (rid, k) == ("late", 4) else 7)
    assert [core.phase(r) for r in generated] == ["think", "output", "output"]
    # Each request's tokens as counted by the hook against the same tokens given once to
    # a fresh core: with block size 1 an answering request's think-complete tier is its
    # count of thinking tokens, so a token read twice would show.
    fresh = _native.SchedulerCore("output-first", [THINK_START], [THINK_END])
    for rid, tokens in generated.items():
        fresh.track(rid, PROMPT)
    fresh.plan([(rid, 0.0, 0, 0, tokens) for rid, tokens in generated.items()])
    held = [(rid, 1000) for rid in generated]
    assert core.account_kv(held, 1) == fresh.account_kv(held, 1)


def test_by_default_the_hook_keeps_vllms_order_while_steps_are_fast():
    """slo-driven, the default (no config), intervenes only once steps have been slower
    than its target; these steps take microseconds."""
    e = build(MeridianScheduler, num_blocks=64)
    assert e.scheduler._meridian.policy_name == "slo-driven"
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.step({})
    e.step({"answerer": THINK_END})
    e.step({})
    assert ids(e.scheduler.running) == ["thinker", "answerer"], "vLLM's order: first come, first served"
    assert e.scheduler._meridian.phase("answerer") == "output"


def answerer_beside_thinker(scheduler_cls):
    """An engine where "thinker" (arrived first) thinks on and "answerer" has just
    closed its thought."""
    e = build(scheduler_cls, num_blocks=64)
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.step({})
    e.step({"answerer": THINK_END})
    return e


def test_stock_scheduler_keeps_arrival_order():
    e = answerer_beside_thinker(AsyncScheduler)
    e.step({})
    assert ids(e.scheduler.running) == ["thinker", "answerer"]


def run_until_preemption(scheduler_cls, steps: int = 200):
    # 2 requests, 21-token prompts, 16-token blocks: each needs a new block every 16
    # tokens, and 8 blocks cannot hold both for long.
    e = build(scheduler_cls, num_blocks=8)
    thinker = e.add("thinker", PROMPT, arrival=1.0)
    answerer = e.add("answerer", PROMPT, arrival=2.0)
    e.step({"answerer": THINK_END})
    for _ in range(steps):
        e.step({})
        if thinker.num_preemptions or answerer.num_preemptions:
            break
    return thinker, answerer


@pytest.mark.usefixtures("output_first")
def test_under_kv_pressure_the_thinker_is_preempted_not_the_answerer():
    before = (metric(tier("think-active")), metric(tier("output-critical")))
    thinker, answerer = run_until_preemption(MeridianScheduler)
    assert thinker.num_preemptions >= 1
    assert answerer.num_preemptions == 0
    assert metric(tier("think-active")) > before[0]
    assert metric(tier("output-critical")) == before[1], "output-critical preemptions: target zero"


def test_stock_vllm_preempts_the_later_arrival_even_while_it_answers():
    thinker, answerer = run_until_preemption(AsyncScheduler)
    assert answerer.num_preemptions >= 1 and thinker.num_preemptions == 0


def test_kv_blocks_are_accounted_by_tier():
    e = build(MeridianScheduler, num_blocks=64)
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.step({"answerer": THINK_END})
    for _ in range(20):
        e.step({})
    assert metric('meridian_hook_kv_blocks{tier="think-active"}') >= 2
    assert metric('meridian_hook_kv_blocks{tier="output-critical"}') >= 2


def test_a_failing_hook_falls_back_to_stock_order(monkeypatch: pytest.MonkeyPatch):
    e = build(MeridianScheduler, num_blocks=64)
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.step({"answerer": THINK_END})

    class Broken:
        def __getattr__(self, name):
            raise RuntimeError("simulated hook bug")

    errors = metric('meridian_hook_errors_total{site="scheduler"}')
    monkeypatch.setattr(e.scheduler, "_meridian", Broken())
    out = e.step({})
    assert set(out.num_scheduled_tokens) == {"thinker", "answerer"}, "vLLM still schedules everyone"
    assert metric('meridian_hook_errors_total{site="scheduler"}') > errors


def test_bad_config_leaves_the_scheduler_stock(tmp_path, monkeypatch: pytest.MonkeyPatch):
    bad = tmp_path / "meridian.toml"
    bad.write_text('[hook]\npolicy = "lifo"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(bad))
    e = build(MeridianScheduler, num_blocks=64)
    assert e.scheduler._meridian is None
    e.add("a", PROMPT, arrival=1.0)
    assert set(e.step({}).num_scheduled_tokens) == {"a"}


def test_policy_comes_from_the_config(tmp_path, monkeypatch: pytest.MonkeyPatch):
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "fcfs"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    e = build(MeridianScheduler, num_blocks=64)
    assert e.scheduler._meridian.policy_name == "fcfs"


def eviction_order(e) -> list[int]:
    """Block ids of vLLM's free queue, first evicted first."""
    queue = e.scheduler.kv_cache_manager.block_pool.free_block_queue
    return [b.block_id for b in queue.get_all_free_blocks()]


def finish_two_requests(scheduler_cls):
    """X (a 48-token prompt, answers at once) finishes first, then A thinks for 40
    tokens, answers for 10 and finishes. Returns the engine, X's prompt blocks and A's
    blocks from the end of its prompt on."""
    e = build(scheduler_cls, num_blocks=32, prefix_caching=True)
    x = e.add("x", list(range(10, 58)), arrival=1.0, max_tokens=2)
    a = e.add("a", list(range(100, 120)) + [THINK_START], arrival=2.0, max_tokens=51)
    e.step({})
    x_prompt = list(e.scheduler.kv_cache_manager.get_block_ids("x")[0][:3])
    a_blocks = []
    for i in range(60):
        if "a" in e.scheduler.requests:
            a_blocks = list(e.scheduler.kv_cache_manager.get_block_ids("a")[0])
        e.step({"a": THINK_END} if i == 40 else {})
        if "a" not in e.scheduler.requests:
            break
    assert x.is_finished() and a.is_finished()
    return e, x_prompt, a_blocks[21 // 16 :]


def test_finished_thoughts_are_evicted_before_other_requests_prompts():
    demoted = metric("meridian_hook_kv_demoted_blocks_total")
    e, x_prompt, a_thought = finish_two_requests(MeridianScheduler)
    order = eviction_order(e)
    pool = e.scheduler.kv_cache_manager.block_pool
    cached_thought = [b for b in a_thought if pool.blocks[b].block_hash is not None]
    assert cached_thought, "A's full thought blocks are in the prefix cache"
    x_cached = [b for b in x_prompt if pool.blocks[b].block_hash is not None]
    assert len(x_cached) == 3, "X's prompt blocks are cached too"
    assert max(order.index(b) for b in cached_thought) < min(order.index(b) for b in x_cached), (
        "the think-complete tier goes before anyone's reusable prompt"
    )
    assert metric("meridian_hook_kv_demoted_blocks_total") >= demoted + len(cached_thought)


def test_stock_vllm_keeps_finished_thoughts_behind_older_prompts():
    e, x_prompt, a_thought = finish_two_requests(AsyncScheduler)
    order = eviction_order(e)
    pool = e.scheduler.kv_cache_manager.block_pool
    cached_thought = [b for b in a_thought if pool.blocks[b].block_hash is not None]
    x_cached = [b for b in x_prompt if pool.blocks[b].block_hash is not None]
    assert min(order.index(b) for b in cached_thought) > max(order.index(b) for b in x_cached), "plain LRU"


@pytest.mark.usefixtures("output_first")
def test_express_step_runs_only_the_request_awaiting_its_first_visible_token():
    e = build(MeridianScheduler, num_blocks=64)
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.step({})
    e.step({"answerer": THINK_END})  # the thought ends; its first visible token is next
    e.add("newcomer", PROMPT, arrival=3.0)
    express = metric("meridian_hook_express_steps_total")
    out = e.step({})
    assert set(out.num_scheduled_tokens) == {"answerer"}, "a short step for the first visible token"
    assert metric("meridian_hook_express_steps_total") == express + 1
    assert {r.request_id for r in e.scheduler.running} == {"thinker", "answerer"}, "the thinker only sat out"
    out = e.step({})
    assert set(out.num_scheduled_tokens) == {"thinker", "answerer", "newcomer"}, "back to full steps"


def test_stock_vllm_runs_everyone_in_that_step():
    e = build(AsyncScheduler, num_blocks=64)
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.step({})
    e.step({"answerer": THINK_END})
    e.add("newcomer", PROMPT, arrival=3.0)
    assert set(e.step({}).num_scheduled_tokens) == {"thinker", "answerer", "newcomer"}


def test_think_decode_cap_lets_only_the_earliest_thinkers_decode(tmp_path, monkeypatch: pytest.MonkeyPatch):
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "output-first:think_decode_cap=1,express=0"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    e = build(MeridianScheduler, num_blocks=64)
    for i, rid in enumerate(["t1", "t2", "answerer", "t3"]):
        e.add(rid, PROMPT, arrival=1.0 + i)
    e.step({})  # prefill all four; each samples a thinking token
    e.step({"answerer": THINK_END})
    out = e.step({})
    assert set(out.num_scheduled_tokens) == {"answerer", "t1"}, "one thinker decodes beside the answer"
    assert ids(e.scheduler.running) == ["answerer", "t1", "t2", "t3"], "the held thinkers stay, at the back"
    out = e.step({})
    assert set(out.num_scheduled_tokens) == {"answerer", "t1"}


@pytest.mark.usefixtures("output_first")
def test_the_hook_reads_tokens_through_the_public_sequence_too(monkeypatch: pytest.MonkeyPatch):
    """vLLM's Request keeps its output in the list ``_output_token_ids``, which the core
    reads directly; a Request without it is read through ``output_token_ids``."""
    e = build(MeridianScheduler, num_blocks=64)
    thinker = e.add("thinker", PROMPT, arrival=1.0)
    answerer = e.add("answerer", PROMPT, arrival=2.0)
    e.step({})

    class Wrapped:
        def __init__(self, req):
            object.__setattr__(self, "_req", req)

        def __getattr__(self, name):
            if name == "_output_token_ids":
                raise AttributeError(name)
            return getattr(self._req, name)

    core = e.scheduler._meridian
    running = [Wrapped(thinker), Wrapped(answerer)]
    answerer._output_token_ids.append(THINK_END)
    order, *_ = core.plan_running(running)
    assert order == [1, 0], "the answering request first"
    assert core.phase("answerer") == "output"


def test_kv_tiers_from_vllms_block_tables_match_the_per_request_count():
    e = build(MeridianScheduler, num_blocks=64)
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.step({"answerer": THINK_END})
    for _ in range(20):
        e.step({})
    s, core = e.scheduler, e.scheduler._meridian
    core.plan_running(s.running)
    tables = [m.req_to_blocks for m in s.kv_cache_manager.coordinator.single_type_managers]
    held = [(r.request_id, sum(len(g) for g in s.kv_cache_manager.get_block_ids(r.request_id))) for r in s.running]
    assert core.account_kv_running(tables, 16) == core.account_kv(held, 16)


@pytest.mark.usefixtures("output_first")
def test_a_request_back_in_the_running_list_is_read_afresh():
    """What stays put while a request runs (arrival time, priority, prompt) is read again
    once it has been out of the running list (vLLM changes it only while it waits)."""
    e = build(MeridianScheduler, num_blocks=64)
    first = e.add("first", PROMPT, arrival=1.0)
    second = e.add("second", PROMPT, arrival=2.0)
    e.step({})
    core = e.scheduler._meridian
    assert core.plan_running([first, second])[0] is None, "arrival order: as it is"
    core.plan_running([second])  # `first` waits a step
    first.arrival_time = 3.0
    order, *_ = core.plan_running([first, second])
    assert order == [1, 0], "its new arrival time counts"


def test_a_prompt_going_in_over_many_steps_is_never_mistaken_for_a_thinker(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    """The hook reads a running request's computed-token count only until its prompt is
    all in: every step of a chunked prompt must still count as prefilling, or a cap on
    thinking decodes would hold the prompt back."""
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "output-first:think_decode_cap=0,express=0"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    e = build(MeridianScheduler, num_blocks=96, budget=64)
    e.add("answerer", PROMPT, arrival=1.0)
    e.add("thinker", PROMPT, arrival=2.0)
    e.step({"answerer": THINK_END})
    e.add("long", [2] * 400 + [THINK_START], arrival=3.0)
    long = e.scheduler.requests["long"]
    steps = 0
    while long.num_computed_tokens < long.num_prompt_tokens:
        out = e.step({})
        assert set(out.num_scheduled_tokens) == {"answerer", "long"}, "the thinker sits out, the prompt goes in"
        steps += 1
    assert steps >= 4, "the prompt went in over several steps"
    out = e.step({})
    assert set(out.num_scheduled_tokens) == {"answerer"}, "with its prompt in, it is a thinker held by the cap"
    assert e.scheduler._meridian.phase("long") == "think"


def _two_long_prompts_beside_an_answer(scheduler_cls, cap: int):
    e = build(scheduler_cls, num_blocks=256, budget=1024)
    e.scheduler.scheduler_config.long_prefill_token_threshold = cap  # stock's own per-request cap
    e.add("answerer", PROMPT, arrival=1.0)
    e.add("thinker", PROMPT, arrival=2.0)
    e.step({"answerer": THINK_END})
    e.step({})  # the answer's first visible token
    for i in range(2):
        e.add(f"long{i}", [2] * 600 + [THINK_START], arrival=3.0 + i)
    return e


@pytest.mark.parametrize("cap", [64, 200])
def test_the_prefill_cap_bounds_the_whole_step_not_each_prompt(tmp_path, monkeypatch: pytest.MonkeyPatch, cap):
    """Two long prompts going in while someone answers: each step computes at most the
    cap of prompt tokens in all, every decoding request still decodes, and the prompts
    do go in."""
    cfg = tmp_path / "meridian.toml"
    cfg.write_text(f'[hook]\npolicy = "output-first:output_prefill_cap={cap},express=0"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    e = _two_long_prompts_beside_an_answer(MeridianScheduler, cap)
    longs = [e.scheduler.requests[f"long{i}"] for i in range(2)]
    steps = 0
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in longs):
        out = e.step({})
        steps += 1
        assert sum(e.prompt_tokens(out).values()) <= cap, f"step {steps}: {dict(out.num_scheduled_tokens)}"
        assert {"answerer", "thinker"} <= set(out.num_scheduled_tokens), "decodes never sit out for a prompt"
        assert steps < 100
    assert steps >= 2 * 601 // cap, "both prompts went in at the cap's pace"
    assert e.scheduler.max_num_scheduled_tokens == 1024, "vLLM's budget is back after the step"


@pytest.mark.parametrize("budget", [256, 1024])
def test_the_shipped_prefill_cap_is_half_of_vllms_step_budget(tmp_path, monkeypatch: pytest.MonkeyPatch, budget):
    """output-first as meridian.toml ships it (no cap in tokens): while someone answers,
    a step's prompt tokens stay within half of max_num_batched_tokens, whatever that is,
    and the prompts go in at that pace, not slower."""
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "output-first:express=0"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    e = build(MeridianScheduler, num_blocks=512, budget=budget)
    e.scheduler.scheduler_config.long_prefill_token_threshold = budget  # stock's own per-request cap
    e.add("answerer", PROMPT, arrival=1.0)
    e.add("thinker", PROMPT, arrival=2.0)
    e.step({"answerer": THINK_END})
    e.step({})
    prompt = 3 * budget
    e.add("long", [2] * prompt + [THINK_START], arrival=3.0)
    long = e.scheduler.requests["long"]
    chunks = []
    while long.num_computed_tokens < long.num_prompt_tokens:
        out = e.step({})
        chunks.append(e.prompt_tokens(out).get("long", 0))
        assert len(chunks) < 20
    assert max(chunks) <= budget // 2, chunks
    assert len(chunks) <= (prompt + 1) // (budget // 2) + 1, f"the prompt went in at half the budget a step: {chunks}"


def test_stock_vllm_caps_each_prompt_so_two_prompts_double_the_step():
    e = _two_long_prompts_beside_an_answer(AsyncScheduler, 64)
    out = e.step({})
    assert sorted(e.prompt_tokens(out).values()) == [64, 64]


@pytest.mark.parametrize(
    "budget",
    [{"thinking_token_budget": 3}, {"extra_args": {"meridian_think_budget": 3}}],
    ids=["vllm-budget", "hook-budget"],
)
def test_the_step_that_samples_a_forced_end_of_thought_is_capped_too(tmp_path, monkeypatch, budget):
    """A thinker whose budget is spent samples the closing delimiter next: nothing shows,
    but its first visible token waits for that step, so a long prompt must not go in
    whole there, though nobody is answering yet."""
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "output-first:output_prefill_cap=64"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    e = build(MeridianScheduler, num_blocks=256, budget=1024)
    e.add("thinker", PROMPT, arrival=1.0, **budget)
    e.step({})  # prefill; the first thinking token
    e.step({})
    e.add("long", [2] * 600 + [THINK_START], arrival=2.0)
    out = e.step({})  # the thinker has thought 2 tokens: its third may still be anything
    assert out.num_scheduled_tokens["long"] > 64, "nobody answers, nothing ends: no cap"
    e.add("long2", [2] * 600 + [THINK_START], arrival=3.0)
    out = e.step({})  # 3 tokens thought, the budget is spent: the delimiter comes next
    assert set(out.num_scheduled_tokens) >= {"thinker"}
    assert sum(e.prompt_tokens(out).values()) <= 64


def test_reasoning_first_paces_an_answer_ahead_of_its_reader(tmp_path, monkeypatch: pytest.MonkeyPatch):
    # A reader of a token per 1,000 s with a 2-token lead: after two answer tokens the
    # answer is ahead of its reader and sits steps out, which go to the thinker.
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "reasoning-first:reader_tokens_per_s=0.001,lead_tokens=2"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    e = build(MeridianScheduler, num_blocks=64)
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.step({})
    e.step({"answerer": THINK_END})  # the thought ends
    paced = metric("meridian_hook_paced_answers_total")
    steps = []
    for _ in range(6):
        steps.append(set(e.step({}).num_scheduled_tokens))
        if metric("meridian_hook_paced_answers_total") > paced:
            break
    # The answer ran until its lead was used up (the scheduler reads tokens a step late).
    assert steps[:2] == [{"thinker", "answerer"}] * 2, steps
    assert steps[-1] == {"thinker"}, "the answer ahead of its reader sits out"
    assert metric("meridian_hook_paced_answers_total") == paced + 1
    assert {r.request_id for r in e.scheduler.running} == {"thinker", "answerer"}, "paced, not dropped"
    assert set(e.step({}).num_scheduled_tokens) == {"thinker"}


def test_reasoning_first_serves_the_answers_before_the_newest_prompt(tmp_path, monkeypatch: pytest.MonkeyPatch):
    # Reasoning-first ranks a request computing its prompt ahead of the answering ones,
    # but its victim, the newest arrival, goes last in vLLM's running list, which vLLM
    # serves in order: the answers keep their token each step and the prompt takes the
    # rest of the budget. The twin schedules the same way
    # (loadtest/twin/tests/engine.rs::the_victim_is_served_last_as_the_hook_hands_it_to_vllm).
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "reasoning-first"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    e = build(MeridianScheduler, num_blocks=512)
    answerers = [f"ans{i}" for i in range(3)]
    for i, rid in enumerate(answerers):
        e.add(rid, PROMPT, arrival=float(i))
    e.step({})
    e.step(dict.fromkeys(answerers, THINK_END))  # their thoughts end
    e.step({})
    e.add("thinker", PROMPT, arrival=5.0)
    e.step({})
    e.add("long", [1] * 1500 + [THINK_START], arrival=10.0)
    for _ in range(4):
        out = e.step({})
        assert ids(e.scheduler.running)[-1] == "long", "the newest arrival, the policy's victim, last"
        assert {rid: out.num_scheduled_tokens.get(rid) for rid in answerers} == dict.fromkeys(answerers, 1)
        assert out.num_scheduled_tokens["long"] == 256 - 4, "the prompt takes what the others leave"


def test_reasoning_first_under_kv_pressure_gives_up_the_thinker_not_a_paced_answer(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    # The answer runs ahead of a very slow reader and sits steps out, holding its blocks.
    # Giving it up would cost its reader a stall while prompt, thought and answer are
    # computed again, longer than its lead: the newest request not yet answering goes.
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "reasoning-first:reader_tokens_per_s=0.001,lead_tokens=2"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    thinker, answerer = run_until_preemption(MeridianScheduler)
    assert thinker.num_preemptions >= 1
    assert answerer.num_preemptions == 0


def test_output_first_never_paces_answers():
    e = answerer_beside_thinker(MeridianScheduler)
    for _ in range(5):
        out = e.step({})
    assert set(out.num_scheduled_tokens) == {"thinker", "answerer"}


def engine_gauges() -> tuple[float, float, float, float]:
    """The hook's count of the engine's requests: running prefilling, thinking,
    answering, and waiting."""
    running = 'meridian_hook_requests{state="running",phase="%s"}'
    return (
        metric(running % "prefilling"),
        metric(running % "thinking"),
        metric(running % "answering"),
        metric('meridian_hook_requests{state="waiting"}'),
    )


@pytest.mark.usefixtures("output_first")
def test_the_hook_publishes_the_engines_requests_by_phase_as_vllm_holds_them():
    e = build(MeridianScheduler, num_blocks=64, max_num_seqs=3)
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.add("long", [1] * 600 + [THINK_START], arrival=3.0)  # three chunks of 256
    e.add("queued", PROMPT, arrival=4.0)  # past max_num_seqs: waits
    e.step({"answerer": THINK_END})
    # Admitted by the step just planned: prefilling, as far as the hook has read them.
    assert engine_gauges() == (3, 0, 0, 1)
    e.step({})
    sched = e.scheduler
    assert len(sched.running) == 3 and len(sched.waiting) == 1
    assert engine_gauges() == (1, 1, 1, 1), "long prefilling, one thinking, one answering, one waiting"
    # The answerer finishes: the queued request takes its place, admitted as it goes in.
    sched.finish_requests("answerer", RequestStatus.FINISHED_ABORTED)
    e.step({})
    e.step({})
    assert len(sched.waiting) == 0
    prefilling, thinking, answering, waiting = engine_gauges()
    assert (prefilling + thinking + answering, waiting) == (len(sched.running), 0)
    assert answering == 0, "nobody answers now"
    # Three busy steps planned: two intervals between them smoothed into the step time.
    assert 0 < metric("meridian_hook_step_seconds") < 1
    # The engine drains: every gauge reads zero, and the cache is free again.
    sched.finish_requests([r.request_id for r in sched.running], RequestStatus.FINISHED_ABORTED)
    e.step({})
    assert engine_gauges() == (0, 0, 0, 0)
    assert metric("meridian_hook_kv_free_blocks") == adapter_free_blocks(sched)


def adapter_free_blocks(scheduler) -> float:
    return float(scheduler.kv_cache_manager.block_pool.get_num_free_blocks())
