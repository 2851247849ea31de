"""The hook's step-cost page: steps are compared only with steps of the same shape, ratios
are per round, and the page leads with the hook against stock beside two stock engines'
own difference."""

from __future__ import annotations

import json
from pathlib import Path


from realab.stepcost import Load, headline, ratios, window_metrics, write_page


def step(t: float, step_s: float, decode: int = 0, prefill: int = 0) -> dict:
    return {"t": t, "step_s": step_s, "sched_s": 0.0001, "decode_reqs": decode, "prefill_tokens": prefill}


def test_decode_steps_are_grouped_by_batch_and_prompt_steps_counted_per_token():
    steps = [step(i, 0.004, decode=2) for i in range(12)] + [step(20 + i, 0.007, decode=4) for i in range(11)]
    steps += [step(40, 0.2, decode=3, prefill=2000), step(41, 0.05, decode=1, prefill=500)]
    m = window_metrics(steps, 4)
    assert m["decode_2"] == 0.004 and m["decode_4"] == 0.007
    # Too few samples of a batch size: not a figure.
    assert "decode_3" not in m and "decode_1" not in m
    # Only steps with at least 1,024 prompt tokens count, per token.
    assert m["prefill_per_token"] == 0.2 / 2000


def run_of(hook: list[float], again: list[float]) -> dict:
    return {"configs": ["stock", "hook", "stock-again"], "policy": "fcfs", "load": Load().__dict__,
            "label": "synthetic", "commit": "abc", "date": "2026-11-26",
            "rounds": [{"stock": {"decode_4": 0.010}, "hook": {"decode_4": h}, "stock-again": {"decode_4": a}}
                       for h, a in zip(hook, again)]}


def test_ratios_are_per_round_against_the_first_config():
    run = run_of([0.011, 0.012], [0.010, 0.0099])
    r = ratios(run, "hook", "stock")["decode_4"]
    assert [round(x, 3) for x in r] == [1.1, 1.2]


def test_the_page_leads_with_hook_over_stock_beside_the_noise_floor(tmp_path: Path):
    run = run_of([0.011, 0.012, 0.0115], [0.010, 0.0099, 0.0101])
    text = headline(run)
    assert "hook / stock 1.150" in text and "two stock engines differ by 1.000" in text
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": [run]}))
    out = tmp_path / "page.md"
    write_page(results, out)
    page = out.read_text()
    assert "## synthetic" in page and "| hook / stock | decode-only step, batch 4 | 1.150 |" in page
