"""The twin beside a kept set: the replayed requests read by the page's own paired
statistics, agreement judged only where the measurement resolves an effect, and the H100
forecast's inputs (prompts in the same count of chunks, the same load fraction)."""

from __future__ import annotations

import gzip
import statistics
import json
from pathlib import Path

import pytest


from realab import forecast as F
from realab import twinpage as TP
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
    assert TP.resolved(gain) and not TP.resolved(est(0.9, 0.7, 1.1))
    assert TP.agrees(gain, 0.79), "inside the interval"
    assert TP.agrees(gain, 0.46), "within 25% of the point"
    assert not TP.agrees(gain, 1.0)
    assert TP.bar(0.5, 1.2) == (0.5, 0.6) and TP.bar(0.5, 0.8) == (0.4, 0.5)


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
    # No replay at the runs' own paces: those cells say so.
    assert ("| hook-output-first | TTFT p50 | 0.60 (0.60-0.60) | 0.90 | **no** | - | - | 0.80 [0.53-0.80] "
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


def test_a_round_that_measured_its_own_machine_replays_at_that_capacity():
    from realab import speed

    # The set's capacity was measured on a slow machine (0.386); later rounds measured
    # their own (0.83) and were sent at 90% of it: the twin must replay them at 90% of
    # its capacity, not at 0.9 x 0.83 / 0.386 of it.
    data = {"capacity": {"long": 0.386}, "runs": [
        {"workload": "long", "load": 0.9, "round": 0, "config": "stock"},
        {"workload": "long", "load": 0.9, "round": 8, "config": "stock", "capacity": 0.83},
        {"workload": "long", "load": 0.9, "round": 8, "config": "hook", "capacity": 0.5}]}
    assert F.sent_by(data, "long", 0.9, 0) == 0.386, "no capacity of its own recorded: the set's"
    own = F.machine_capacity(F.sent_by(data, "long", 0.9, 8), speed.Standing(0.9, {}, True))
    assert own == 0.83
    rig, _ = F.load_scales(own, 0.8, {})
    assert 0.9 * 0.83 / rig == pytest.approx(0.9 * 0.8)
    assert F.sent_by(data, "kv", 0.9, 0) is None


def test_the_page_sets_the_twins_capacity_beside_each_rounds_machine():
    caps = [{"rig_capacity": 0.798, "measured_capacity": 0.386, "machine_capacity": 0.386},
            {"rig_capacity": 0.80, "measured_capacity": 0.386, "machine_capacity": 0.835}]
    clause = TP.capacity_clause(caps)
    assert "twin 0.798-0.800 req/s against 0.386-0.835 measured on the rounds' machines" in clause
    one = TP.capacity_clause(caps[:1])
    assert "twin 0.798 req/s against 0.386 measured:" in one
    assert TP.capacity_clause([{"rig_capacity": 0.8, "measured_capacity": None}]) == ""


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
    assert TP.late_thought_shares(measured, 0.015) == {"stock": (0.25, 4), "hook-output-first": (0.5, 4),
                                                      "hook-fcfs": (0.0, 2)}
    text = " ".join(TP.delivery_lines(measured, twin, 0.015))
    assert "(15.0 ms at the median)" in text
    assert "stock 25.0% of 4; hook-output-first 50.0% of 4; hook-fcfs 0.0% of 2; in the twin at most 0.0%" in text
    assert "more often than with stock in 1 of 2 other configurations (hook-output-first)" in text
    assert TP.delivery_lines({}, twin, 0.015) == []


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
    twin = TP.twin_capped(rig, "long", 0.9)
    assert twin == {"hook": {0: (10, 1000), 1: (30, 1000)}, "stock": {0: (0, 900), 1: (0, 900)}}
    measured = {("hook", "long", 0.9, 0): (100, 1000), ("hook", "long", 0.9, 1): (200, 1000),
                ("hook", "long", 0.9, 2): (500, 1000), ("hook", "mix", 0.9, 0): (999, 1000)}
    text = " ".join(TP.capping_lines(measured, twin, "long", 0.9))
    # Pooled over rounds 0 and 1 only (round 2 has no counted replay): 300 of 2,000
    # measured, 40 of 2,000 in the twin; stock capped nothing on either side.
    assert "hook 15.0% measured, 2.0% in the twin (2 rounds)" in text
    assert "stock" not in text.split("requests): ")[1].split(".")[0]
    # The twin capped far less often, and the page says which way it errs.
    assert "the twin caps less often than the engine did for hook" in text
    assert "more often" not in text
    # The other way round: the twin capping more often over-predicts, and says so.
    busy = {"hook": {0: (400, 1000), 1: (400, 1000)}}
    text = " ".join(TP.capping_lines(measured, busy, "long", 0.9))
    assert "the twin caps more often than the engine did for hook" in text
    assert "over-predicts" in text and "under-predicts" not in text
    # Within a tenth of each other: neither direction is claimed.
    even = {"hook": {0: (140, 1000), 1: (160, 1000)}}
    text = " ".join(TP.capping_lines(measured, even, "long", 0.9))
    assert "about as often" in text and "predicts" not in text
    assert TP.capping_lines(measured, {}, "long", 0.9) == []


def test_how_often_requests_sat_steps_out_is_set_beside_the_twins_count(tmp_path: Path):
    # Replays carry the twin's running and sat-out request-steps; the engine's come from
    # its step traces (`regime.Readings.sat_out`).
    rig = tmp_path / "rig"
    rig.mkdir()
    for rnd, sat in ((0, 300), (1, 500)):
        F._write(rig / f"kv-0.9-{rnd}-hook-reasoning-first.json.gz",
                 {"steps": 1000, "request_steps": {"running": 2000, "sat_out": sat}, "runs": []})
        F._write(rig / f"kv-0.9-{rnd}-stock.json.gz",
                 {"steps": 900, "request_steps": {"running": 1800, "sat_out": 0}, "runs": []})
    # A replay written before the twin counted is left out, not read as none held.
    F._write(rig / "kv-0.9-2-hook-reasoning-first.json.gz", {"steps": 1000, "runs": []})
    twin = TP.twin_sat_out(rig, "kv", 0.9)
    assert twin == {"hook-reasoning-first": {0: (300, 2000), 1: (500, 2000)}, "stock": {0: (0, 1800), 1: (0, 1800)}}
    measured = {("hook-reasoning-first", "kv", 0.9, 0): (100, 1000), ("hook-reasoning-first", "kv", 0.9, 1): (120, 1000),
                ("hook-reasoning-first", "kv", 0.9, 2): (900, 1000)}
    text = " ".join(TP.sitting_lines(measured, twin, "kv", 0.9))
    # Rounds 0 and 1: 220 of 2,000 measured, 800 of 4,000 in the twin; stock is not counted.
    assert "hook-reasoning-first 11.0% measured, 20.0% in the twin (2 rounds)" in text
    assert "the twin holds requests out more often than the hook did for hook-reasoning-first" in text
    assert "over-states" in text and "under-states" not in text and "stock" not in text
    even = {"hook-reasoning-first": {0: (110, 1000), 1: (110, 1000)}}
    assert "about as often" in " ".join(TP.sitting_lines(measured, even, "kv", 0.9))
    # Shares of a few in a thousand: a tenth apart, but under a point, claims no direction.
    rare = {("hook", "kv", 0.9, 0): (1, 1000)}
    text = " ".join(TP.sitting_lines(rare, {"hook": {0: (3, 1000)}}, "kv", 0.9))
    assert "hook 0.1% measured, 0.3% in the twin (1 round)" in text and "about as often" in text
    assert TP.sitting_lines(measured, {}, "kv", 0.9) == []


def test_a_twin_replayed_at_each_runs_pace_is_judged_beside_the_one_pace_twin(tmp_path: Path):
    # The engine measured 0.6 for the hook; the twin at one pace says 0.9 (a miss); the
    # hook's run stepped a third faster than stock's, and the twin replayed at that pace
    # says 0.62: the schedule was not wrong, the run's pace made the effect.
    set_dir = tmp_path / "1-set"
    write_set(set_dir, {"stock": 1.0, "hook-output-first": 0.6, "hook-fcfs": 1.0})
    twin_dir(set_dir, "rig", {"stock": 1.0, "hook-output-first": 0.9, "hook-fcfs": 1.0})
    # Stock's pace is 1 by definition: the page reads its one-pace replay for it.
    twin_dir(set_dir, F.PACED, {"hook-output-first": 0.62, "hook-fcfs": 1.0})
    (set_dir / "twin" / "forecast.json").write_text(json.dumps(
        {"gpu_budget": 2048, "prompt_scale": 8, "cards": {}, "rounds": {},
         "paces": {"long-0.9-0-stock": 1.0, "long-0.9-0-hook-output-first": 0.67, "long-0.9-0-hook-fcfs": 1.02}}))
    page = page_of(tmp_path, resamples=100)
    assert "| hook-output-first | TTFT p50 | 0.60 (0.60-0.60) | 0.90 | **no** | 0.62 | yes |" in page
    assert "| hook-fcfs | TTFO p50 | 1.00 (1.00-1.00) | 1.00 | not resolved | 1.00 | not resolved |" in page
    assert "The twin agrees with 0 of the 12 effects the measurement resolves" in page
    assert "hook-fcfs 1.02 (1 run); hook-output-first 0.67 (1 run)" in page
    assert "Replayed at those paces, the twin agrees with 12 of the 12 resolved effects it has paces for." in page
    # The page's own count, over every set, heads it.
    assert ("twin at one pace (as it forecasts a GPU) meets 0 of 12; replayed at each run's own pace "
            "(`forecast.run_paces`), 12 of the 12 it has paces for. By set: set 1 0 of 12 (12 of 12 at the "
            "runs' paces).") in page
    assert page.index("over every set.**") < page.index("## ")


def test_a_configuration_is_read_at_its_pace_only_where_every_round_has_one(tmp_path: Path):
    # Round 1 of the hook has a replay at one pace but none at its own (its trace was
    # not kept): a paced ratio would pair round 0 alone, so none is given.
    set_dir = tmp_path / "1-set"
    write_set(set_dir, {"stock": 1.0, "hook-output-first": 0.6})
    twin_dir(set_dir, "rig", {"stock": 1.0, "hook-output-first": 0.9})
    twin_dir(set_dir, F.PACED, {"hook-output-first": 0.62})
    F._write(set_dir / "twin" / "rig" / "long-0.9-1-hook-output-first.json.gz",
             {"runs": [{"requests": [request(i, 0.9) for i in range(100)]}]})
    (set_dir / "twin" / "forecast.json").write_text(json.dumps(
        {"gpu_budget": 2048, "prompt_scale": 8, "cards": {}, "rounds": {}, "paces": {}}))
    page = page_of(tmp_path, resamples=100)
    assert "| hook-output-first | TTFT p50 | 0.60 (0.60-0.60) | 0.90 | **no** | - | - |" in page
    assert "Each run's own pace" not in page


def test_a_paced_profile_multiplies_every_time_term_and_nothing_else():
    text = ("[[profile]]\nname = \"rig\"\nfixed_s = 0.01\nper_token_s = 2e-4\nper_context_token_s = 1e-6\n"
            "per_decode_request_s = 3e-4\nper_prefill_attention_s = 2e-7\nweight_read_tokens = 0\n"
            "max_num_batched_tokens = 256\n"
            f"step_spread = [{', '.join(str(0.5 + i / 20) for i in range(21))}]\n")
    import tomllib
    paced = tomllib.loads(F.paced_profile(text, 1.5))["profile"][0]
    one = tomllib.loads(text)["profile"][0]
    for term in F.PACED_TERMS:
        assert paced[term] == pytest.approx(1.5 * one[term])
    assert paced["max_num_batched_tokens"] == 256 and paced["weight_read_tokens"] == 0 and paced["name"] == "rig"
    # The spread is each step over the fit's time: a pace moves the fit, not the spread.
    assert paced["step_spread"] == one["step_spread"]
    with pytest.raises(ValueError, match="4 of the 5 time terms"):
        F.paced_profile(text.replace("fixed_s = 0.01\n", ""), 1.5)


def test_a_runs_pace_is_its_decode_steps_against_the_same_rounds_stock_run(tmp_path: Path):
    # The fit says every decode step takes 10 ms. Round 0: stock's steps took 10 ms, the
    # hook's 12 ms (pace 1.2); round 1 ran on a slower machine, stock 15 ms and the hook
    # 15 ms (pace 1.0: the machine is the round's, not the hook's). A run with too few
    # steps to say gets no pace.
    set_dir = tmp_path / "set"
    (set_dir / "twin").mkdir(parents=True)
    (set_dir / "twin" / "rig-profile.toml").write_text(
        "[[profile]]\nname = \"rig\"\nfixed_s = 0.01\nper_token_s = 0.0\nper_context_token_s = 0.0\n"
        "per_decode_request_s = 0.0\nper_prefill_attention_s = 0.0\n")
    (set_dir / "steps").mkdir()
    runs = []

    def trace(name: str, steps: list[tuple[float, float]]) -> None:
        with gzip.open(set_dir / "steps" / f"{name}.jsonl.gz", "wt") as f:
            for t, step_s in steps:
                f.write(json.dumps({"t": t, "step_s": step_s, "tokens": 2, "decode_reqs": 2, "decode_context": 100,
                                    "prefill_tokens": 0}) + "\n")

    stock, hook = [], []
    for rnd, (stock_s, hook_s, n_hook) in enumerate(((0.010, 0.012, 50), (0.015, 0.015, 50), (0.010, 0.02, 5))):
        start = 1000.0 * rnd
        stock += [(start + i, stock_s) for i in range(50)]
        hook += [(start + 100 + i, hook_s) for i in range(n_hook)]
        runs += [{"config": "stock", "workload": "long", "load": 0.9, "round": rnd, "work": "w",
                  "window": [start, start + 60]},
                 {"config": "hook", "workload": "long", "load": 0.9, "round": rnd, "work": "w",
                  "window": [start + 100, start + 160]}]
    trace("stock-w", stock)
    trace("hook@w", hook)
    paces = F.run_paces(set_dir, {"runs": runs})
    assert paces[("hook", "long", 0.9, 0)] == pytest.approx(1.2)
    assert paces[("hook", "long", 0.9, 1)] == pytest.approx(1.0)
    assert ("hook", "long", 0.9, 2) not in paces
    assert paces[("stock", "long", 0.9, 0)] == 1.0


def test_a_replay_that_comes_out_the_same_leaves_its_file_alone(tmp_path: Path):
    path = tmp_path / "long-0.9-0-stock.json.gz"
    F._write(path, {"runs": [], "steps": 3})
    first = path.read_bytes()
    assert first[4:8] == bytes(4), "no time in the gzip header (RFC 1952: MTIME, bytes 4-7)"
    with gzip.open(path, "wt") as f:  # the same replay, written with a time in its header
        json.dump({"runs": [], "steps": 3}, f)
    kept = path.read_bytes()
    F._write(path, {"runs": [], "steps": 3})
    assert path.read_bytes() == kept, "the same replay: the file is left as it was"
    F._write(path, {"runs": [], "steps": 4})
    assert json.loads(gzip.open(path, "rt").read())["steps"] == 4


def test_the_page_says_how_the_twins_steps_vary_around_the_fit():
    probabilities = [0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99,
                     0.995, 0.998, 0.999, 0.9999, 1.0]
    spread = {"probabilities": probabilities, "quantiles": [0.5 + p for p in probabilities], "mean": 1.0}
    assert TP.spread_clause(spread) == (
        "; each step's time varied around the fit as the stock engine's did, a draw from its measured spread: "
        "median 1.00x, p90 1.40x, p99 1.49x the fitted time, mean 1.00x")
    # A profile fitted before the spread existed (or to a load test's report) has none.
    assert TP.spread_clause(None) == "; every step of one shape takes the fitted time"


def test_a_set_measured_on_two_machines_fits_one_cost_model_and_paces_each_machine(tmp_path: Path):
    # Two invocations' stock engines stepped the same cost model, the second's machine
    # taking 1/0.6 as long for every step. Pooled, the fit would be neither machine's
    # (every term a third or so off); per machine, it is the reference's within 1%, and
    # the other machine's pace is read as 1/0.6.
    import random
    import tomllib

    from built import built
    from realab import regime as R

    model = {"fixed_s": 4e-3, "per_token_s": 1.8e-4, "per_decode_request_s": 3.5e-4, "per_context_token_s": 8e-7}
    rng = random.Random(7)

    def steps(slowdown: float) -> list[dict]:
        out = []
        for i in range(3000):
            reqs = rng.randint(1, 12)
            context = reqs * rng.randint(50, 900)
            prefill = rng.choice((0, 0, 0, rng.randint(32, 256 - reqs)))
            tokens = prefill + reqs
            step_s = (model["fixed_s"] + model["per_token_s"] * tokens + model["per_decode_request_s"] * reqs
                      + model["per_context_token_s"] * context) * slowdown
            out.append({"t": 100.0 + i * 0.05, "step_s": step_s, "tokens": tokens, "prefill_tokens": prefill,
                        "decode_reqs": reqs, "decode_context": context, "prefill_context": 0})
        return out

    set_dir = tmp_path / "9-two-machines"
    (set_dir / "steps").mkdir(parents=True)
    (set_dir / "twin").mkdir()
    for work, slowdown in (("fast", 1.0), ("slow", 1 / 0.6)):
        with gzip.open(set_dir / "steps" / f"stock-{work}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(st) + "\n" for st in steps(slowdown))
    runs = [{"config": c, "workload": "kv", "load": 0.9, "round": rnd, "work": work, "window": [100.0, 250.0]}
            for rnd, work in enumerate(("fast", "slow")) for c in ("stock", "hook")]
    data = {"setup": {"engine": {"max_num_batched_tokens": 256, "max_num_seqs": 32},
                      "workloads": [{"name": "kv", "loads": [0.9], "kv_blocks": 4000}]},
            "capacity_work": {"kv": "fast"}, "runs": runs}

    profile, paces = F.calibrate(built("meridian-sim"), set_dir, data, tmp_path)
    fitted = tomllib.loads(profile.read_text())["profile"][0]
    for term, value in model.items():
        assert fitted[term] == pytest.approx(value, rel=0.01), f"{term}: the reference machine's cost model"
    assert paces["fast"] == 1.0 and paces["slow"] == pytest.approx(1 / 0.6, rel=0.01)
    calibration = json.loads((set_dir / "twin" / "calibration.json").read_text())
    assert calibration["machines"] == {"reference": "fast", "paces": paces}
    assert calibration["fit"]["median_abs_pct_error"] < 1.0, "each machine's steps on its own pace fit exactly"
    assert (set_dir / "twin" / "rig-profile.toml").read_text() == profile.read_text()

    # The page reads each run's steps against its own machine's fit: stock on the slow
    # machine stepped as the twin of that machine says, not 1.67x slower.
    ratios = R.decode_ratios(set_dir, data)
    for rnd in (0, 1):
        assert statistics.median(ratios[("stock", "kv", 0.9, rnd)]) == pytest.approx(1.0, rel=0.01)
    clause = TP.machines_clause(calibration["machines"])
    assert "ran on 2 invocations' machines, whose stock engines stepped 1.00-1.67x" in clause
    assert TP.machines_clause({"reference": "fast", "paces": {"fast": 1.0}}) == ""


def test_the_reference_machine_is_the_one_that_measured_the_capacity_else_the_most_stepped():
    traces = {"a": [{}] * 5, "b": [{}] * 9}
    data = {"setup": {"workloads": [{"name": "kv"}]}, "work": ["/w/a", "/w/b"], "capacity_work": {"kv": "a"}, "runs": []}
    assert F.reference_work(data, traces) == "a"
    data["capacity_work"] = {"kv": "gone"}
    assert F.reference_work(data, traces) == "b", "a capacity measured where no trace is kept"


def test_the_twins_tally_is_counted_by_rig_as_well_as_by_set():
    """Misses on a rig whose delivery path is starved (vLLM's engine core spinning on its
    core) are effects no schedule makes: the page counts them apart from a GPU host's."""
    spin = {"setup": {"engine": {"max_num_batched_tokens": 256}}}
    poll = {"setup": {"engine": {"max_num_batched_tokens": 256, "engine_core_polls": "True"}}}
    cpu = {"setup": {"engine": {"max_num_batched_tokens": 2048}}}
    rigs = {"5-a": TP.rig_words(spin, "GPU-shaped"), "7-b": TP.rig_words(poll, "GPU-shaped"),
            "8-c": TP.rig_words(poll, "GPU-shaped"), "2-d": TP.rig_words(cpu, "CPU-shaped")}
    assert rigs["2-d"] == "the CPU-shaped rig" and "spinning" in rigs["5-a"] and "polling" in rigs["7-b"]
    tallies = {("5-a", "long", 0.9): (3, 12, 5, 12), ("7-b", "mix", 0.9): (2, 2, 0, 0),
               ("8-c", "long", 0.9): (5, 6, 6, 6), ("8-c", "long", 0.5): (0, 0, 0, 0)}
    line = TP.tally_lines(tallies, rigs)[0]
    assert "meets 10 of 20" in line
    assert f"{rigs['5-a']} (set 5) 3 of 12 (5 of 12 at the runs' paces)" in line
    # Sets 7 and 8 pooled: 7 of 8 at one pace, and the 6 of 6 only set 8 has paces for.
    assert f"{rigs['7-b']} (sets 7, 8) 7 of 8 (6 of 6 at the runs' paces)" in line
    assert "CPU-shaped" not in line, "a rig with no resolved effect is not counted"
    assert "By rig" not in TP.tally_lines(tallies)[0]
