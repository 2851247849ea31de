"""The default policy's start target (ADR 0012) in vLLM's real scheduler: while answers
are protected, a start that has waited too long, in vLLM's queue or in Meridian's
admission queue before it reached vLLM, lifts the limits on prompt tokens; a prompt's own
prefill in the engine does not count as waiting."""

from __future__ import annotations

import pytest
from conftest import metric
from meridian_hook.testing import THINK_END, THINK_START, build

from meridian_hook.scheduler import MeridianScheduler

PROMPT = [1] * 20 + [THINK_START]  # a chat template that opens the think block


def _long_prompt_beside_slow_answers(tmp_path, monkeypatch: pytest.MonkeyPatch, **long_params) -> tuple[list[int], int]:
    """The default policy protecting answers (its steps slower than its 10 ms target: the
    test sleeps between steps), with a start target of 20 s; a 900-token prompt added
    with ``long_params`` (``arrival``, ``extra_args``) and stepped three times: its
    prompt tokens in each step, and how many of those steps were capped."""
    import time

    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "slo-driven:output_itl_target_ms=10,start_wait_target_s=20,express=0"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    e = build(MeridianScheduler, num_blocks=256, budget=256)
    e.scheduler.scheduler_config.long_prefill_token_threshold = 256  # stock's own per-request cap
    now = time.time()
    e.add("answerer", PROMPT, arrival=now)
    e.add("thinker", PROMPT, arrival=now)
    e.step({"answerer": THINK_END})
    for _ in range(12):  # answering, in steps the policy measures as slow
        time.sleep(0.03)
        e.step({})
    long_params.setdefault("arrival", now)
    e.add("long", [2] * 900 + [THINK_START], **long_params)
    capped = metric("meridian_hook_prefill_capped_steps_total")
    chunks = []
    for _ in range(3):
        time.sleep(0.03)
        chunks.append(e.prompt_tokens(e.step({})).get("long", 0))
    return chunks, int(metric("meridian_hook_prefill_capped_steps_total") - capped)


@pytest.mark.parametrize("waited_s", [0.0, 60.0])
def test_slo_driven_lifts_its_prefill_cap_while_a_start_waits_in_the_queue_past_its_target(
    tmp_path, monkeypatch: pytest.MonkeyPatch, waited_s
):
    """The default policy, protecting answers, caps a step's prompt tokens at half the
    budget while a prompt goes in, unless a request has waited in vLLM's queue longer than
    the start target: the step that admits a long-waiting request computes a full chunk
    of it; the next ones, the request admitted and nobody queued, are capped again (its
    own prefill is progress, not a wait). vLLM's arrival times are wall-clock seconds,
    which the hook moves onto its policy's clock."""
    import time

    chunks, capped = _long_prompt_beside_slow_answers(tmp_path, monkeypatch, arrival=time.time() - waited_s)
    if waited_s:
        assert chunks[0] > 128, f"a start overdue in the queue: admitted with vLLM's own chunk, {chunks}"
        assert 0 < max(chunks[1:]) <= 128, f"admitted, its prompt is capped again, {chunks}"
        assert capped == 2
    else:
        assert 0 < max(chunks) <= 128, f"answers protected: prompt chunks within half the budget, {chunks}"
        assert capped == 3, "each capped step counted"


@pytest.mark.parametrize("queued_ms", [0, 60_000])
def test_a_prompt_that_waited_past_the_start_target_in_meridians_queue_goes_in_uncapped(
    tmp_path, monkeypatch: pytest.MonkeyPatch, queued_ms
):
    """With admission on, starts wait in the proxy's queue, not vLLM's, and reach the
    engine with that wait in `vllm_xargs.meridian_queued_ms`. A running request still
    computing its prompt that had waited there past the start target counts as an overdue
    start: its prompt goes in with vLLM's own chunks, while one that did not wait is capped
    (its prefill in the engine is progress, not a wait, as the queue-only rule has it)."""
    xargs = {"meridian_queued_ms": queued_ms} if queued_ms else None
    chunks, capped = _long_prompt_beside_slow_answers(tmp_path, monkeypatch, extra_args=xargs)
    if queued_ms:
        assert min(chunks) > 128, f"overdue from the proxy's queue: vLLM's own chunks throughout, {chunks}"
        assert capped == 0
    else:
        assert 0 < max(chunks) <= 128, f"answers protected: prompt chunks within half the budget, {chunks}"
        assert capped == 3


def test_the_oldest_waiting_start_counts_the_wait_in_meridians_queue():
    from types import SimpleNamespace

    from meridian_hook import vllm_adapter

    def request(arrival, queued_ms=None):
        extra = {"meridian_queued_ms": queued_ms} if queued_ms is not None else None
        return SimpleNamespace(num_output_tokens=0, arrival_time=arrival,
                               sampling_params=SimpleNamespace(extra_args=extra))

    sched = SimpleNamespace(waiting=[request(100.0, 2500)])
    assert vllm_adapter.oldest_waiting_start(sched) == pytest.approx(97.5)
    for odd in (None, -5, "2500", True, float("nan"), float("inf")):
        sched = SimpleNamespace(waiting=[request(100.0, odd)])
        assert vllm_adapter.oldest_waiting_start(sched) == 100.0, f"{odd!r} is no wait"
