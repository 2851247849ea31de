"""The step trace inside vLLM's real schedulers: each step's line says what the step
carried (prefill chunks, decoding requests, their context) and how long it took, and
preemption victims are told apart by whether they had ended their thought. This is what
`meridian-sim calibrate --steps` fits the twin to."""

from __future__ import annotations

import json

from meridian_hook.testing import THINK_END, THINK_START, build
from vllm.v1.core.sched.scheduler import Scheduler

from meridian_hook import _native
from meridian_hook.steptrace import StepTraceScheduler, TracedMeridianScheduler

PROMPT = [1] * 40 + [THINK_START]


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_each_step_is_one_line_with_its_shape(tmp_path, monkeypatch):
    trace = tmp_path / "steps.jsonl"
    monkeypatch.setenv("MERIDIAN_STEP_TRACE", str(trace))
    e = build(StepTraceScheduler, num_blocks=64, budget=32)
    assert isinstance(e.scheduler, Scheduler)
    e.add("a", PROMPT, arrival=1.0)
    e.add("b", [1] * 9 + [THINK_START], arrival=2.0)
    for _ in range(4):
        e.step({})
    e.scheduler._meridian_trace.close()
    steps = lines(trace)
    assert len(steps) == 4, steps
    first, second, third, fourth = steps
    # 41 + 10 prompt tokens under a 32-token budget: a 32-token chunk of a, then the rest
    # of a (9) and all of b (10); then both decode.
    assert (first["tokens"], first["prefill_tokens"], first["decode_reqs"], first["prefill_context"]) == (32, 32, 0, 0)
    assert (second["tokens"], second["prefill_tokens"], second["decode_reqs"]) == (19, 19, 0)
    assert second["prefill_context"] == 32, "a's second chunk attends to its first"
    assert (third["tokens"], third["decode_reqs"], third["decode_context"]) == (2, 2, 41 + 10)
    assert fourth["decode_context"] == 41 + 10 + 2
    assert [s["prefill_reqs"] for s in steps] == [1, 2, 0, 0]
    assert all("prefill_cap" not in s for s in steps), "stock vLLM has no policy limits"
    assert all(s["step_s"] >= s["sched_s"] > 0 for s in steps)
    assert [s["t"] for s in steps] == sorted(s["t"] for s in steps)


def test_victims_are_classified_by_phase(tmp_path, monkeypatch):
    trace = tmp_path / "steps.jsonl"
    monkeypatch.setenv("MERIDIAN_STEP_TRACE", str(trace))
    # 4 blocks of 16 tokens: two requests of 21 prompt tokens outgrow them while decoding.
    e = build(StepTraceScheduler, num_blocks=5, budget=256)
    prompt = [1] * 20 + [THINK_START]
    e.add("answerer", prompt, arrival=1.0)
    e.add("thinker", prompt, arrival=2.0)
    e.step({"answerer": THINK_END})
    for _ in range(30):
        e.step({})
    e.scheduler._meridian_trace.close()
    steps = lines(trace)
    preempted = sum(s["preempted"] for s in steps)
    assert preempted >= 1, "the pool is too small for both"
    assert sum(s["preempted_output"] + s["preempted_think"] for s in steps) == preempted
    # Stock vLLM takes the latest arrival: the thinker.
    assert sum(s["preempted_think"] for s in steps) >= 1


def test_a_victim_that_answered_without_thinking_counts_as_answering(tmp_path, monkeypatch):
    # The phase rule the proxy follows (meridian-core): a request whose prompt opened no
    # think block and whose first tokens are words is answering; a tracer that only looked
    # for the end delimiter in its output took it for a thinker.
    trace = tmp_path / "steps.jsonl"
    monkeypatch.setenv("MERIDIAN_STEP_TRACE", str(trace))
    e = build(StepTraceScheduler, num_blocks=5, budget=256)
    e.add("thinker", [1] * 20 + [THINK_START], arrival=1.0)
    e.add("direct", [1] * 21, arrival=2.0)
    for _ in range(30):
        e.step({})
    e.scheduler._meridian_trace.close()
    steps = lines(trace)
    assert sum(s["preempted"] for s in steps) >= 1, "the pool is too small for both"
    # Stock vLLM takes the latest arrival: the direct answerer.
    assert sum(s["preempted_output"] for s in steps) >= 1
    assert sum(s["preempted_think"] for s in steps) == 0


def test_the_tracer_asks_the_phase_rule_the_hook_follows():
    s, e = THINK_START, THINK_END
    assert _native.phase_after([s], [e], [1, s], [5, 6]) == "think"
    assert _native.phase_after([s], [e], [1, s], [5, e, 6]) == "output"
    assert _native.phase_after([s], [e], [1], [e]) == "output", "the template opened the block"
    assert _native.phase_after([s], [e], [1, s, e], [s, 7]) == "output", "thinking switched off: no reopening"
    assert _native.phase_after([s], [e], [1], [7, s]) == "think", "a block opened after a word"
    assert _native.phase_after([s], [e], [1], []) == "pending"
    assert _native.phase_after([s], [], [1, s], [5]) == "pending", "no end delimiter: phases unknown"


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("MERIDIAN_STEP_TRACE", raising=False)
    e = build(TracedMeridianScheduler, num_blocks=64)
    e.add("a", PROMPT, arrival=1.0)
    e.step({})
    assert e.scheduler._meridian_trace is None
    assert e.scheduler._meridian is not None, "the hook still schedules"
    assert list(tmp_path.iterdir()) == []


def test_the_hooked_engine_records_the_prefill_cap_its_policy_set(tmp_path, monkeypatch):
    trace = tmp_path / "steps.jsonl"
    monkeypatch.setenv("MERIDIAN_STEP_TRACE", str(trace))
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "output-first:output_prefill_cap=48"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    e = build(TracedMeridianScheduler, num_blocks=64)
    e.add("answerer", [1] * 20 + [THINK_START], arrival=1.0)
    e.step({"answerer": THINK_END})  # prefill; the thought ends at once
    e.step({})  # express: the first visible token
    e.add("long", [1] * 200 + [THINK_START], arrival=2.0)
    e.step({})
    e.scheduler._meridian_trace.close()
    caps = [s["prefill_cap"] for s in lines(trace)]
    assert caps == [None, 0, 48]
    assert lines(trace)[-1]["prefill_tokens"] == 48
