"""The twin beside a kept set: the replayed requests read by the page's own paired
statistics, agreement judged only where the measurement resolves an effect, and the H100
forecast's inputs (prompts in the same count of chunks, the same load fraction)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest


from realab import forecast as F
from realab import stats as S
from test_realab_policies import page_of, request, write_set


def test_the_forecast_keeps_chunks_and_load_fraction():
    reqs = [{"index": 0, "sent_at": 10.0, "prompt_tokens": 2590}, {"index": 1, "sent_at": 13.0, "prompt_tokens": 300}]
    out = F.scaled(reqs, 8.0, 0.25)
    assert [r["prompt_tokens"] for r in out] == [20720, 2400]
    assert [r["sent_at"] for r in out] == [0.0, 0.75]
    assert [r["sent_at"] for r in F.scaled(reqs, 1.0, 1.0, all_at_once=True)] == [0.0, 0.0]
    assert reqs[0]["prompt_tokens"] == 2590, "the measured requests are left as they were"


def test_each_cards_profile_is_the_measured_one_at_the_rigs_budget():
    root = Path(__file__).resolve().parents[2]
    curves = root / "docs/src/benchmarks/gpu-step-curve"
    text = F.card_profile(curves)
    assert 'name = "h100-qwen3-8b-pytorch"' in text
    assert "max_num_batched_tokens = 2048" in text and "8192" not in text
    for slug, _label, folder, profile in F.CARDS:
        text = F.card_profile(curves / folder)
        assert f'name = "{profile}"' in text, f"{slug}: the profile the forecast asks for is the one fitted"


def test_agreement_is_judged_only_where_the_measurement_resolves():
    def est(point: float, low: float, high: float) -> S.Estimate:
        return S.Estimate(point=point, low=low, high=high, n_requests=90, n_rounds=1, q=0.5, n_values=90)

    gain = est(0.6, 0.5, 0.8)
    assert F.resolved(gain) and not F.resolved(est(0.9, 0.7, 1.1))
    assert F.agrees(gain, 0.79), "inside the interval"
    assert F.agrees(gain, 0.46), "within 25% of the point"
    assert not F.agrees(gain, 1.0)
    assert F.bar(0.5, 1.2) == (0.5, 0.6) and F.bar(0.5, 0.8) == (0.4, 0.5)


def twin_dir(set_dir: Path, side: str, scales: dict[str, float], n: int = 100) -> None:
    d = set_dir / "twin" / side
    d.mkdir(parents=True)
    for config, scale in scales.items():
        with gzip.open(d / f"long-0.9-0-{config}.json.gz", "wt") as f:
            json.dump({"runs": [{"requests": [request(i, scale) for i in range(n)]}]}, f)


def test_the_page_puts_the_twin_beside_each_measured_effect(tmp_path: Path):
    set_dir = tmp_path / "1-set"
    write_set(set_dir, {"stock": 1.0, "hook-output-first": 0.6, "hook-fcfs": 1.0})
    twin_dir(set_dir, "rig", {"stock": 1.0, "hook-output-first": 0.9, "hook-fcfs": 1.0})
    twin_dir(set_dir, "h100", {"stock": 1.0, "hook-output-first": 0.8, "hook-fcfs": 1.0})
    twin_dir(set_dir, "h200", {"stock": 1.0, "hook-output-first": 0.7, "hook-fcfs": 1.0})
    cards = {"h100": {"label": "H100"}, "h200": {"label": "H200"}}
    (set_dir / "twin" / "forecast.json").write_text(json.dumps(
        {"gpu_budget": 2048, "prompt_scale": 8, "cards": cards, "rounds": {"long-0.9-0": {
            "rig_capacity": 0.3, "measured_capacity": 0.25, "capacity": {"h100": 2.5, "h200": 2.7}, "time_scale": {"h100": 0.12, "h200": 0.11}}}}))
    page = page_of(tmp_path, resamples=100)
    assert "#### The twin beside the measurement, and its H100 and H200 forecast" in page
    # Measured 0.6 (resolved), twin 0.9: 50% off and outside the interval; each card's
    # forecast moved by the same residual (0.6 / 0.9).
    assert ("| hook-output-first | TTFT p50 | 0.60 (0.60-0.60) | 0.90 | **no** | 0.80 [0.53-0.80] "
            "| 0.70 [0.47-0.70] |") in page
    # fcfs measured 1.00 (1.00-1.00): not resolved, not judged.
    assert "| hook-fcfs | TTFO p50 | 1.00 (1.00-1.00) | 1.00 | not resolved |" in page
    assert "The twin agrees with 0 of the 12 effects the measurement resolves (by configuration: hook-output-first 0 of 12)" in page
    assert "hook-output-first TTFT p50 (measured 0.60, twin 0.90)" in page
    assert "(twin 0.300 req/s against 0.250 measured:" in page
    assert "(twin capacity: H100 2.50 req/s; H200 2.70 req/s)" in page


def test_every_twin_replays_at_the_runs_load_fraction():
    # The run: 90% of stock's measured 0.3 req/s. A twin a half faster than the engine
    # (0.45) must see its send times squeezed to 2/3, or it stands at 60% load.
    rig, cards = F.load_scales(0.3, 0.45, {"h100": 3.0})
    for scale, capacity in ((rig, 0.45), (cards["h100"], 3.0)):
        assert 0.9 * 0.3 / scale == pytest.approx(0.9 * capacity)
    assert F.load_scales(None, 0.45, {"h100": 3.0}) == (1.0, {"h100": 0.15}), "no measured capacity: the twin's"


def test_a_round_on_a_faster_machine_replays_at_the_load_it_stood_at():
    from realab import speed

    # Sent at 90% of 0.3 req/s measured on a machine half as fast as its own: it stood at
    # 45%, and the twin (0.45 req/s) must see 45% of its capacity, not 90%.
    faster = speed.Standing(0.9, {"probe": 2.0}, False)
    own = F.machine_capacity(0.3, faster)
    assert own == pytest.approx(0.6)
    rig, _ = F.load_scales(own, 0.45, {})
    assert 0.9 * 0.3 / rig == pytest.approx(0.45 * 0.45)
    assert F.machine_capacity(0.3, speed.Standing(0.9, {}, True)) == 0.3, "its own capacity: as measured"
    assert F.machine_capacity(0.3, None) == 0.3 and F.machine_capacity(None, faster) is None


def test_step_traces_are_kept_once(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "stock-steps.jsonl").write_text('{"t": 1, "step_s": 0.01}\n')
    data = {"work": [str(work), str(tmp_path / "gone")]}
    assert F.keep_steps(data, tmp_path / "set") == 1
    assert F.keep_steps(data, tmp_path / "set") == 0
    kept = tmp_path / "set" / "steps" / "stock-work.jsonl.gz"
    assert gzip.open(kept, "rt").read() == '{"t": 1, "step_s": 0.01}\n'


def test_a_think_to_answer_gap_shorter_than_a_step_is_called_delivery():
    # Two engine steps lie between the last thought token and the first answer token:
    # a gap under one decode step (15 ms here) is the API server's doing, which the twin,
    # delivering every token at its step's end, never shows.
    def runs(gaps: dict[str, list[float]]) -> dict:
        return {c: {0: [{"think_to_output": g} for g in gs] + [{"think_to_output": None}]} for c, gs in gaps.items()}

    measured = runs({"stock": [0.005, 0.05, 0.06, 0.07], "hook-output-first": [0.001, 0.002, 0.05, 0.09],
                     "hook-fcfs": [0.05, 0.06]})
    twin = runs({"stock": [0.03, 0.05], "hook-output-first": [0.02, 0.03], "hook-fcfs": [0.04, 0.05]})
    assert F.late_thought_shares(measured, 0.015) == {"stock": (0.25, 4), "hook-output-first": (0.5, 4),
                                                      "hook-fcfs": (0.0, 2)}
    text = " ".join(F.delivery_lines(measured, twin, 0.015))
    assert "(15.0 ms at the median)" in text
    assert "stock 25.0% of 4; hook-output-first 50.0% of 4; hook-fcfs 0.0% of 2; in the twin at most 0.0%" in text
    assert "more often than with stock in 1 of 2 other configurations (hook-output-first)" in text
    assert F.delivery_lines({}, twin, 0.015) == []


def test_how_often_the_policy_capped_is_set_beside_the_twins_count(tmp_path: Path):
    # Replays carry the twin's count of capped steps; the engine's come from its step
    # traces (`regime.limited_steps`: (config, workload, load, round) -> (capped, steps)).
    rig = tmp_path / "rig"
    rig.mkdir()
    for rnd, capped in ((0, 10), (1, 30)):
        F._write(rig / f"long-0.9-{rnd}-hook.json.gz", {"steps": 1000, "prefill_capped_steps": capped, "runs": []})
        F._write(rig / f"long-0.9-{rnd}-stock.json.gz", {"steps": 900, "prefill_capped_steps": 0, "runs": []})
    # A replay written before the twin counted is left out, not read as none capped.
    F._write(rig / "long-0.9-2-hook.json.gz", {"steps": 1000, "runs": []})
    twin = F.twin_capped(rig, "long", 0.9)
    assert twin == {"hook": {0: (10, 1000), 1: (30, 1000)}, "stock": {0: (0, 900), 1: (0, 900)}}
    measured = {("hook", "long", 0.9, 0): (100, 1000), ("hook", "long", 0.9, 1): (200, 1000),
                ("hook", "long", 0.9, 2): (500, 1000), ("hook", "mix", 0.9, 0): (999, 1000)}
    text = " ".join(F.capping_lines(measured, twin, "long", 0.9))
    # Pooled over rounds 0 and 1 only (round 2 has no counted replay): 300 of 2,000
    # measured, 40 of 2,000 in the twin; stock capped nothing on either side.
    assert "hook 15.0% measured, 2.0% in the twin (2 rounds)" in text
    assert "stock" not in text.split("requests): ")[1].split(".")[0]
    # The twin capped far less often, and the page says which way it errs.
    assert "the twin caps less often than the engine did for hook" in text
    assert "more often" not in text
    # The other way round: the twin capping more often over-predicts, and says so.
    busy = {"hook": {0: (400, 1000), 1: (400, 1000)}}
    text = " ".join(F.capping_lines(measured, busy, "long", 0.9))
    assert "the twin caps more often than the engine did for hook" in text
    assert "over-predicts" in text and "under-predicts" not in text
    # Within a tenth of each other: neither direction is claimed.
    even = {"hook": {0: (140, 1000), 1: (160, 1000)}}
    text = " ".join(F.capping_lines(measured, even, "long", 0.9))
    assert "about as often" in text and "predicts" not in text
    assert F.capping_lines(measured, {}, "long", 0.9) == []
