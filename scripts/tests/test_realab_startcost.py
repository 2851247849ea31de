"""Where later starts come from: each request's wait laid over its engine's capped steps,
and how long the longest-waiting start had waited at each capped step."""

from __future__ import annotations

from pathlib import Path

from realab import startcost


def trace(t0: float, caps: list[bool], dt: float = 0.1) -> list[dict]:
    """Steps every `dt` seconds from `t0`, capped where `caps` says."""
    return [{"t": t0 + i * dt, "prefill_cap": 128 if c else None, "_t0": t0} for i, c in enumerate(caps)]


def test_a_wait_is_read_against_the_steps_inside_it():
    # Ten steps, the first four capped; request 0 waits through steps 0-4 (four of five
    # capped), request 1 through steps 6-8 (none capped).
    steps = {("hook", "long", 0.9, 3): trace(100.0, [True] * 4 + [False] * 6)}
    runs = {
        "hook": {3: [{"index": 0, "ok": True, "sent_at": 0.0, "ttft": 0.45},
                     {"index": 1, "ok": True, "sent_at": 0.55, "ttft": 0.3}]},
        "stock": {3: [{"index": 0, "ok": True, "sent_at": 0.0, "ttft": 0.3},
                      {"index": 1, "ok": True, "sent_at": 0.55, "ttft": 0.3}]},
    }
    rows = startcost.exposures(runs, steps, "hook", lambda rnd: ("hook", "long", 0.9, rnd))
    assert [round(r["capped_share"], 3) for r in rows] == [0.8, 0.0]
    assert [round(r["ttft"] / r["stock_ttft"], 2) for r in rows] == [1.5, 1.0]


def test_a_request_without_stocks_pair_or_a_trace_is_left_out():
    runs = {"hook": {0: [{"index": 0, "ok": True, "sent_at": 0.0, "ttft": 0.4}],
                     1: [{"index": 0, "ok": True, "sent_at": 0.0, "ttft": 0.4}]},
            "stock": {0: [{"index": 1, "ok": True, "sent_at": 0.0, "ttft": 0.4}],
                      1: [{"index": 0, "ok": True, "sent_at": 0.0, "ttft": 0.4}]}}
    steps = {("hook", "w", 1.0, 0): trace(5.0, [True] * 5)}
    assert startcost.exposures(runs, steps, "hook", lambda rnd: ("hook", "w", 1.0, rnd)) == []


def test_each_capped_step_reads_the_longest_wait_then():
    # Request 0 is sent at 0 and starts at 0.75; request 1 is sent at 0.5 and starts at 0.95.
    steps = {("hook", "w", 1.0, 0): trace(10.0, [True, False, True, False, False, False, True, False, False, False])}
    runs = {"hook": {0: [{"index": 0, "sent_at": 0.0, "ttft": 0.75}, {"index": 1, "sent_at": 0.5, "ttft": 0.45}]}}
    waits = startcost.oldest_waits(runs, steps, "hook", lambda rnd: ("hook", "w", 1.0, rnd))
    # Capped at 0.0 (request 0 just sent), 0.2 (it has waited 0.2 s), 0.6 (0.6 s).
    assert [round(w, 3) for w in waits] == [0.0, 0.2, 0.6]


def test_the_page_groups_requests_by_their_capped_share():
    rows = [{"round": 0, "ttft": 2.0, "stock_ttft": 2.0, "capped_share": 0.0},
            {"round": 0, "ttft": 3.0, "stock_ttft": 2.0, "capped_share": 0.5}]
    text = startcost.page(Path("set"), "hook", "long", 0.9, rows, [0.5, 1.5, 3.0], "cmd")
    assert "| none | 1 | 1.00 | 1.00 | 2.00 s |" in text
    assert "| 30.0%-100% | 1 | 1.50 | 1.50 | 2.00 s |" in text
    assert "| 1 s | 33% |" in text and "| 3 s | 100% |" in text


def test_a_capped_step_is_set_beside_a_full_one_of_the_same_shape():
    def step(tokens, cap, seconds, context=2000, decodes=5):
        return {"prefill_reqs": 1, "prefill_tokens": tokens, "prefill_cap": cap, "step_s": seconds,
                "prefill_context": context, "decode_reqs": decodes}

    run = [step(128, 128, 0.07)] * 10 + [step(256, None, 0.1)] * 10
    # Another bucket with too few steps, and steps that are neither kind, are left out.
    run += [step(128, 128, 0.5, context=5000)] * 3 + [step(200, None, 0.3)] * 20
    assert [round(x, 2) for x in startcost.capped_step_share({("hook", "w", 1.0, 0): run}, 256)] == [0.7]
