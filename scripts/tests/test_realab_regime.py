"""Which hardware a rig stands for: the step ratios read from the stock engine's trace
during the measured runs, and the same ratios from the H100's step traces."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


from realab import regime, traced


def step(t: float, prefill: int, decodes: int, ms: float, prefix: int = 0) -> str:
    return json.dumps({"t": t, "prefill_tokens": prefill, "decode_reqs": decodes, "step_s": ms / 1000,
                       "prefill_context": prefix}) + "\n"


def rig_data(work: Path, budget: int) -> dict:
    lines = []
    t = 0.0
    for _ in range(30):
        for prefill, decodes, ms, prefix in [(budget, 0, 30.0, 0), (0, 2, 4.0, 0), (0, 16, 6.0, 0), (0, 32, 9.0, 0),
                                             (budget // 2, 3, 20.0, 0), (budget, 0, 50.0, 8 * budget + 10)]:
            lines.append(step(t, prefill, decodes, ms, prefix))
            t += 0.1
    # Steps outside the measured window (the curve probe, the warm-up) do not count.
    lines.append(step(1e6, budget, 0, 9999.0))
    (work / "stock-steps.jsonl").write_text("".join(lines))
    runs = work / "runs"
    runs.mkdir(exist_ok=True)
    requests = [{"index": i, "prompt_tokens": 2000 + i} for i in range(5)]
    (runs / "long-0.9-0-stock.json").write_text(json.dumps({"runs": [{"requests": requests}]}))
    return {"work": [str(work)], "setup": {"engine": {"max_num_batched_tokens": budget}},
            "runs": [{"config": "stock", "window": [0.0, t]}, {"config": "hook-fcfs", "window": [t, 2e6]}]}


def test_the_rig_shape_is_read_from_full_chunks_and_small_decodes_in_the_window(tmp_path: Path):
    shape = regime.step_shape(rig_data(tmp_path, 128))
    assert shape["chunk_tokens"] == 96, "three quarters of the budget"
    assert (shape["chunk_ms"], shape["decode_ms"]) == (40.0, 4.0), "the median of 30 and 50 ms chunks"
    assert shape["ratio"] == 10.0
    assert shape["chunk_after"] == {"0": 7.5, "8": 12.5}, "no chunk after 2 chunks of prefix"
    assert shape["prompt_tokens"] == {"long": 2002}
    assert shape["decode_growth"] == {"16": 1.5, "32": 2.25}, "batch 8 had no steps near it"


def test_a_budget_larger_than_any_prompt_counts_long_prompts_as_chunks(tmp_path: Path):
    data = rig_data(tmp_path, 4096)
    assert regime.step_shape(data)["chunk_tokens"] == 1536


def test_the_h100_ratios_come_from_its_graph_replays(tmp_path: Path):
    rows = []
    for decodes, ctx, prefill, prefix, ms in [(1, 1024, 0, 0, 8.0), (1, 1024, 0, 0, 8.4), (1, 1024, 0, 0, 8.2),
                                              (16, 1024, 0, 0, 9.84), (0, 0, 2048, 0, 57.4), (0, 0, 8192, 0, 270.6),
                                              (0, 0, 2048, 4096, 73.8), (1, 128, 0, 0, 7.0)]:
        rows.append(json.dumps({"decode_reqs": decodes, "decode_context_each": ctx, "prefill_tokens": prefill,
                                "prefill_context": prefix, "step_s": ms / 1000}) + "\n")
    (tmp_path / "steps-graph.jsonl").write_text("".join(rows))
    gpu = regime.h100(tmp_path)
    assert round(gpu["chunk"]["2048"], 3) == 7.0 and round(gpu["chunk"]["8192"], 3) == 33.0
    assert round(gpu["decode_growth"]["16"], 3) == 1.2 and "8" not in gpu["decode_growth"]
    assert round(gpu["chunk_after"]["0"], 3) == 7.0 and round(gpu["chunk_after"]["2"], 3) == 9.0
    assert "8" not in gpu["chunk_after"]
    assert regime.h100(tmp_path / "missing") is None


def test_the_table_sets_each_ratio_beside_the_h100s(tmp_path: Path):
    shape = regime.step_shape(rig_data(tmp_path, 128))
    gpu = {"decode_ms": 8.2, "chunk": {"2048": 7.0, "8192": 33.0}, "chunk_after": {"0": 7.0, "8": 14.2},
           "decode_growth": {"16": 1.2}}
    workloads = [{"name": "long", "input_len": 1000, "think_len": 128, "output_len": 64}]
    rows = "\n".join(regime.table(shape, gpu, workloads, {"max_num_batched_tokens": 128}))
    assert "| full prompt chunk step / decode step of one request | 7.0 (2,048 tokens); 33.0" in rows
    assert "| 10.0 (every 96+-token chunk, 40 vs 4.0 ms) |" in rows
    assert "| the same, a chunk after 8 chunks of prompt | 14.2 | 12.5 |" in rows
    assert "| the same, a chunk after 2 chunks of prompt | not measured | too few steps |" in rows
    assert "| decode step of 16 requests / of one | 1.20 | 1.50 |" in rows
    assert "| decode step of 8 requests / of one | not measured | too few steps |" in rows
    assert ("| long prompt in chunks (median 2,002 tokens, chunks of 128) | the same count at 2,048 a chunk: "
            "~32,032-token prompts | 15.6 |") in rows


def test_where_the_rig_is_not_the_h100_is_said_and_what_it_does():
    shape = {"chunk_after": {"0": 7.5, "8": 12.5}, "decode_growth": {"16": 3.8, "32": 1.3}}
    gpu = {"chunk_after": {"0": 7.0, "8": 14.2}, "decode_growth": {"16": 1.16, "32": 1.27}}
    said = regime.differences(shape, gpu)
    assert said == ["a decode step of 16 requests costs 3.80x one request's here against 1.16x on the H100, so "
                    "taking thinkers out of a step saves more here than there"]
    assert regime.differences(shape, None) == []


def test_the_twin_column_reads_the_calibrated_curve():
    # Rows as `meridian-sim calibrate --json` writes them: [bin, measured ms, steps, fitted ms].
    cal = {"curve": {"prefill": [[128, 40.0, 9, 41.0], [256, 80.0, 50, 82.5]],
                     "decode": [[1, 11.0, 900, 11.0], [8, 28.0, 40, 27.5], [16, 40.0, 30, 44.0]]}}
    twin = regime.twin_ratios(cal, 256)
    assert twin == {"chunk": 7.5, "decode_growth": {"8": 2.5, "16": 4.0}}
    assert regime.twin_ratios({"curve": {"prefill": [], "decode": []}}, 256) is None
    shape = {"ratio": 7.0, "chunk_ms": 80.0, "decode_ms": 11.4, "chunk_tokens": 192,
             "decode_growth": {"8": 2.6}, "chunk_after": {}}
    rows = regime.table(shape, None, [], {"max_num_batched_tokens": 256}, twin)
    assert rows[0].endswith("| the twin on this rig |")
    assert rows[2].endswith("| 7.5 |")
    assert any(r.startswith("| decode step of 8 requests / of one | not measured | 2.60 | 2.50 |") for r in rows)
    assert any(r.startswith("| decode step of 32 requests") and r.endswith("| - |") for r in rows)


def test_the_twin_column_bins_the_steps_as_the_rig_column_does():
    # The rig column pools decode steps of 1 to 3 requests, and of b requests within a
    # quarter of b; the twin's figure is the step-weighted mean of the same bins' fits.
    cal = {"curve": {"prefill": [[256, 80.0, 50, 80.0]],
                     "decode": [[1, 10.0, 300, 10.0], [3, 14.0, 100, 14.0], [13, 40.0, 10, 40.0],
                                [16, 44.0, 30, 44.0], [20, 50.0, 10, 50.0], [21, 60.0, 99, 60.0]]}}
    twin = regime.twin_ratios(cal, 256)
    assert twin is not None
    assert twin["chunk"] == 80.0 / 11.0
    assert twin["decode_growth"] == {"16": (10 * 40.0 + 30 * 44.0 + 10 * 50.0) / 50 / 11.0}
    # The curve over every step (warm-up included) is not what the rig column measures.
    assert regime.twin_ratios({"curve_all": cal["curve"]}, 256) is None


PROFILE = """[[profile]]
name = "rig"
fixed_s = 0.008
per_token_s = 0.0002
per_context_token_s = 0.000001
per_decode_request_s = 0.0002
per_prefill_attention_s = 0.0000002
weight_read_tokens = 8
"""


def decode(t: float, reqs: int, context: int, ms: float) -> str:
    return json.dumps({"t": t, "tokens": reqs, "prefill_tokens": 0, "decode_reqs": reqs, "decode_context": context,
                       "step_s": ms / 1000}) + "\n"


def test_the_twins_decode_step_fit_is_the_cost_models_terms():
    fitted = regime.decode_step_fit(PROFILE)
    assert fitted is not None
    # 8 ms + 0.2 ms x max(4, 8) + 0.2 ms x 4 + 1 us x 2,000
    assert abs(fitted({"tokens": 4, "decode_reqs": 4, "decode_context": 2000}) - 0.0124) < 1e-12
    assert regime.decode_step_fit("") is None


def traced_set(tmp_path: Path, traces: dict[str, list[str]]) -> Path:
    """A kept set with the twin's rig profile and the step traces `traces` ({file stem:
    lines}) in `steps/`."""
    import gzip
    set_dir = tmp_path / "set"
    (set_dir / "twin").mkdir(parents=True)
    (set_dir / "steps").mkdir()
    (set_dir / "twin" / "rig-profile.toml").write_text(PROFILE)
    for stem, lines in traces.items():
        with gzip.open(set_dir / "steps" / f"{stem}.jsonl.gz", "wt") as f:
            f.write("".join(lines))
    return set_dir


#: The fit's time for a decode of 4 requests over 2,000 tokens of context, in ms.
FIT_MS = 1000 * regime.decode_step_fit(PROFILE)({"tokens": 4, "decode_reqs": 4, "decode_context": 2000})


def test_each_engines_decode_steps_are_set_beside_the_twins_fit(tmp_path: Path):
    # Stock's steps take what the fit says; the hooked engine's a fifth more for the same
    # shape: a cost of its own, which the twin (stock's step costs) leaves out. Steps
    # outside a configuration's measured windows, and prompt steps, do not count.
    stock = [decode(10 + i * 0.01, 4, 2000, FIT_MS) for i in range(30)]
    stock += [decode(20 + i * 0.01, 4, 2000, 0.9 * FIT_MS) for i in range(30)]
    stock.append(json.dumps({"t": 10.5, "tokens": 256, "prefill_tokens": 256, "decode_reqs": 0,
                             "decode_context": 0, "step_s": 1.0}) + "\n")
    stock.append(decode(99, 4, 2000, 50 * FIT_MS))
    hooked = [decode(30 + i * 0.01, 4, 2000, 1.2 * FIT_MS) for i in range(30)]
    set_dir = traced_set(tmp_path, {"stock-w1": stock, "hook-output-first@w1": hooked})
    data = {"runs": [{"config": "stock", "window": [10, 11], "work": "w1"},
                     {"config": "stock-again", "window": [20, 21], "work": "w1"},
                     {"config": "hook-output-first", "window": [30, 31], "work": "w1"}]}
    got = regime.step_residuals(set_dir, data)
    assert {c: (round(r, 3), n) for c, (r, n) in got.items()} == {
        "stock": (1.0, 30), "stock-again": (0.9, 30), "hook-output-first": (1.2, 30)}
    text = " ".join(regime.residual_lines(got))
    assert "stock 1.00 (30 steps); stock-again 0.90 (30 steps); hook-output-first 1.20 (30 steps)" in text
    assert "Beyond a tenth over stock's: hook-output-first." in text
    assert regime.residual_lines({"stock": (1.0, 30)}) == []
    assert regime.step_residuals(tmp_path / "none", data) == {}


def test_a_run_whose_engine_ran_slow_is_named_whatever_its_configuration(tmp_path: Path):
    # Stock's two runs take what the fit says; the hooked engine's first run too, its
    # second (round 1) a third more at every step: that run is named, against stock's
    # run of the same round, not the configuration.
    stock = [decode(t + i * 0.01, 4, 2000, FIT_MS) for t in (10, 20) for i in range(30)]
    hooked = [decode(30 + i * 0.01, 4, 2000, FIT_MS) for i in range(30)]
    hooked += [decode(40 + i * 0.01, 4, 2000, 1.3 * FIT_MS) for i in range(30)]
    set_dir = traced_set(tmp_path, {"stock-w1": stock, "hook@w1": hooked})
    runs = [{"config": c, "workload": "mix", "load": 0.7, "round": rnd, "window": [t, t + 1], "work": "w1"}
            for c, rnd, t in (("stock", 0, 10), ("stock", 1, 20), ("hook", 0, 30), ("hook", 1, 40))]
    slow = regime.slow_runs(set_dir, {"runs": runs})
    assert [(run, round(x, 2), round(typical, 2)) for run, x, typical in slow] == [(("hook", "mix", 0.7, 1), 1.3, 1.0)]
    text = " ".join(regime.residual_lines(regime.step_residuals(set_dir, {"runs": runs}), slow))
    assert "Runs whose decode steps ran more than a tenth slower than stock's in the same round (each run's " \
           "median of measured over fitted): hook round 1 at 70% (1.30 against 1.00)." in text


def test_a_run_reads_only_its_own_invocations_trace(tmp_path: Path):
    # Two sessions' traces share monotonic times (each boot restarts the clock): round 0
    # ran in w1 at the fit's pace, round 1 in w2 a half slower, over the same seconds.
    # Each run's pace comes from its own trace alone; a run that names no work reads none.
    w1 = [decode(10 + i * 0.01, 4, 2000, FIT_MS) for i in range(30)]
    w2 = [decode(10 + i * 0.01, 4, 2000, 1.5 * FIT_MS) for i in range(30)]
    set_dir = traced_set(tmp_path, {"stock-w1": w1, "stock-w2": w2})
    runs = [{"config": "stock", "workload": "mix", "load": 0.9, "round": rnd, "window": [10, 11], "work": w}
            for rnd, w in ((0, "w1"), (1, "w2"))]
    runs.append({"config": "stock", "workload": "mix", "load": 0.9, "round": 2, "window": [10, 11]})
    got = regime.decode_ratios(set_dir, {"runs": runs})
    assert {k[3]: (round(statistics.median(v), 3), len(v)) for k, v in got.items()} == {0: (1.0, 30), 1: (1.5, 30)}


def test_how_often_the_hooks_limits_were_in_force_is_counted_run_by_run(tmp_path: Path):
    def step(t: float, cap) -> str:
        return json.dumps({"t": t, "tokens": 8, "prefill_tokens": 0, "decode_reqs": 8, "decode_context": 100,
                           "step_s": 0.01, "prefill_cap": cap}) + "\n"
    hooked = [step(10 + i * 0.01, None) for i in range(40)]  # round 0: relaxed to stock throughout
    hooked += [step(20 + i * 0.01, 128 if i % 4 == 0 else None) for i in range(40)]  # round 1: a quarter capped
    set_dir = traced_set(tmp_path, {"hook@w1": hooked, "stock-w1": [step(10, None)]})
    runs = [{"config": "hook", "workload": "mix", "load": 0.7, "round": rnd, "window": [t, t + 1], "work": "w1"}
            for rnd, t in ((0, 10), (1, 20))]
    runs.append({"config": "stock", "workload": "mix", "load": 0.7, "round": 0, "window": [10, 11], "work": "w1"})
    limits = regime.limited_steps(set_dir, {"runs": runs})
    assert limits == {("hook", "mix", 0.7, 0): (0, 40), ("hook", "mix", 0.7, 1): (10, 40)}
    line = " ".join(traced.limits_lines(limits, "mix", 0.7, ["hook"], {"hook": "slo-driven"}))
    assert "hook none, 25% (rounds 0, 1)" in line and "scheduled exactly as stock" in line
    assert traced.limits_lines(limits, "mix", 0.9, ["hook"], {"hook": "slo-driven"}) == []
    rare = {("hook", "mix", 0.9, 4): (1, 2167)}
    assert "hook under 1% (round 4)" in " ".join(traced.limits_lines(rare, "mix", 0.9, ["hook"], {}))


def test_how_often_running_requests_sat_steps_out_is_counted_run_by_run(tmp_path: Path):
    # `running` is read after scheduling, the requests the hook held out back in the list:
    # a step that ran 6 of 8 running requests held 2 out.
    def step(t: float, running: int, decodes: int, prefills: int = 0) -> str:
        return json.dumps({"t": t, "tokens": decodes + 64 * prefills, "prefill_tokens": 64 * prefills,
                           "decode_reqs": decodes, "prefill_reqs": prefills, "decode_context": 100,
                           "step_s": 0.01, "prefill_cap": None, "running": running}) + "\n"
    hooked = [step(10 + i * 0.01, 8, 6 if i % 2 else 7, 1 if i % 2 == 0 else 0) for i in range(40)]
    set_dir = traced_set(tmp_path, {"hook-reasoning-first@w1": hooked, "stock-w1": [step(10, 8, 8)]})
    runs = [{"config": "hook-reasoning-first", "workload": "kv", "load": 0.9, "round": 0, "window": [10, 11],
             "work": "w1"},
            {"config": "stock", "workload": "kv", "load": 0.9, "round": 0, "window": [10, 11], "work": "w1"}]
    sat = regime.run_readings(set_dir, {"runs": runs}).sat_out
    # 20 steps ran 7 + 1 prompt (none out), 20 ran 6 (2 out): 40 of 320; stock is not counted.
    assert sat == {("hook-reasoning-first", "kv", 0.9, 0): (40, 320)}


def test_the_shipped_defaults_engine_trace_is_kept_beside_the_named_policies(tmp_path: Path):
    from realab import forecast
    work = tmp_path / "realab-w1"
    work.mkdir()
    for name in ("stock", "hook", "hook-output-first"):
        (work / f"{name}-steps.jsonl").write_text(decode(1.0, 1, 10, 5.0))
    assert forecast.keep_steps({"work": [str(work)]}, tmp_path / "set") == 3
    assert sorted(p.name for p in (tmp_path / "set" / "steps").iterdir()) == [
        "hook-output-first@realab-w1.jsonl.gz", "hook@realab-w1.jsonl.gz", "stock-realab-w1.jsonl.gz"]


def test_a_shared_step_is_stretched_by_how_much_more_it_costs_here_than_on_the_h100():
    twin = {"decode_growth": {"8": 1.6, "16": 2.2, "32": 3.7}}
    gpu = {"decode_growth": {"8": 1.1, "16": 1.1, "32": 1.25}}
    stretch = regime.shared_step_stretch(twin, gpu)
    assert stretch(1) == 1.0, "one request shares its step with nobody"
    assert abs(stretch(16) - 2.0) < 1e-9
    assert abs(stretch(12) - (1.6 / 1.1 + 2.0) / 2) < 1e-9, "linear between the table's batches"
    assert abs(stretch(4.5) - (1 + (1.6 / 1.1 - 1) / 2)) < 1e-9
    assert stretch(200) == stretch(32) == 3.7 / 1.25, "held past the largest batch"
    assert regime.shared_step_stretch(twin, None) is None and regime.shared_step_stretch(None, gpu) is None
    assert regime.shared_step_stretch(twin, {"decode_growth": {}}) is None
