"""Drift control in the real-engine harness (scripts/realab/drift.py, measure.paced_round):
a run the machine ran slower or faster than the runs before it is measured again, the
first attempt set aside and named on the page; the check reads the engine's own steps."""

from __future__ import annotations

import gzip
import json
import random

import pytest


from realab import drift, machine, measure, policies, regime, slo
from realab import shares as SH


def trace(rng: random.Random, n: int, slow: float = 1.0) -> list[dict]:
    """A step trace whose decode steps cost 3 ms + 0.3 ms a request + 1 us a context
    token, times `slow`, with 5% noise; every tenth step also prefills."""
    steps = []
    for i in range(n):
        reqs = rng.randint(1, 24)
        ctx = reqs * rng.randint(50, 900)
        cost = (0.003 + 0.0003 * reqs + 1e-6 * ctx) * slow * rng.uniform(0.95, 1.05)
        steps.append({"t": float(i), "tokens": reqs, "decode_reqs": reqs, "decode_context": ctx,
                      "prefill_tokens": 256 if i % 10 == 0 else 0, "step_s": cost + (0.1 if i % 10 == 0 else 0)})
    return steps


def test_the_fit_recovers_the_step_cost_and_a_slower_run_reads_slower():
    rng = random.Random(1)
    decode = drift.decode_steps(trace(rng, 2000))
    assert len(decode) == 1800  # the prefilling steps are left out
    model = drift.fit(decode)
    assert model is not None
    assert model.fixed == pytest.approx(0.003, rel=0.1)
    assert model.per_request == pytest.approx(0.0003, rel=0.1)
    assert model.per_context == pytest.approx(1e-6, rel=0.1)
    assert drift.pace(decode, model) == pytest.approx(1.0, abs=0.02)
    assert drift.pace(drift.decode_steps(trace(rng, 2000, slow=1.2)), model) == pytest.approx(1.2, abs=0.03)


def test_too_few_steps_neither_fit_nor_judge():
    decode = drift.decode_steps(trace(random.Random(2), 40))
    assert drift.fit(decode) is None
    assert drift.pace(decode, drift.StepFit(0.003, 0.0003, 1e-6)) is None


def test_a_context_that_moves_with_the_request_count_still_fits():
    # Every request attends to 500 tokens: context is a multiple of the count.
    steps = [(r, 500 * r, 0.003 + 0.0008 * r) for r in range(1, 30) for _ in range(3)]
    model = drift.fit(steps)
    assert model is not None
    assert drift.pace(steps, model) == pytest.approx(1.0, abs=1e-6)


def test_off_pace_flags_runs_either_way_beyond_the_margin():
    history = [1.0, 1.02, 0.98, 1.25, 0.85]
    got = drift.off_pace({"stock": 1.02, "hook": 1.25, "proxy": 0.85}, history, 0.1)
    assert sorted(got) == ["hook", "proxy"]
    assert drift.off_pace({"stock": 1.05}, [1.0, 1.05], 0.1) == []
    assert drift.off_pace({"stock": None}, [], 0.1) == []


def test_calm_waits_while_the_hypervisor_steals_and_gives_up_when_told():
    stolen = iter([0.0, 0.5, 0.5, 1.0, 1.0, 1.01])  # 0.1 cores, 0.1, then 0.002 per 5 s

    def sample():
        s = next(stolen)
        return machine.Sample(wall=sample.t, busy=0.0, steal=s, ours=0.0, roles={})
    sample.t = 0.0

    def sleep(dt):
        sample.t += dt
    assert drift.calm(60, sample=sample, sleep=sleep) == 10.0
    always = iter(range(0, 1000, 1))

    def stealing():
        return machine.Sample(wall=float(next(always)), busy=0.0, steal=float(next(always)), ours=0.0, roles={})
    assert drift.calm(12, sample=stealing, sleep=lambda dt: None) == 15.0


def run(config: str, pace: float | None, rnd: int = 0) -> dict:
    return {"workload": "mix", "load": 0.9, "round": rnd, "config": config, "window": [0.0, 1.0],
            "drift": {"pace": pace, "decode_steps": 500, "margin": 0.1, "retries": 1, "calm_wait_s": 0.0}}


class FakeGauge(measure.Gauge):
    """A gauge fed paces directly (the real one reads them from step traces)."""

    def take(self, pace: float) -> None:
        self.paces.append(pace)


def test_a_round_measures_an_off_pace_run_again_and_counts_the_second():
    gauge = FakeGauge(0.1, 1)
    for p in (1.0, 0.99, 1.01):
        gauge.take(p)
    paces = {"stock": iter([1.0]), "hook": iter([1.3, 1.02])}
    measured, discarded = [], []

    def measure_run(config):
        p = next(paces[config])
        gauge.take(p)
        measured.append(config)
        return run(config, p)
    runs, reruns = measure.paced_round(["stock", "hook"], measure_run, gauge,
                                       lambda c, a: discarded.append((c, a)), log=lambda *_: None)
    assert measured == ["stock", "hook", "hook"]
    assert discarded == [("hook", 1)]
    assert runs["hook"]["drift"]["pace"] == 1.02
    assert [(x["config"], x["drift"]["pace"], x["attempt"]) for x in reruns] == [("hook", 1.3, 1)]


def test_a_run_that_stays_off_pace_is_kept_after_its_retries_and_no_margin_measures_once():
    gauge = FakeGauge(0.1, 1)
    for p in (1.0, 1.0, 1.0):
        gauge.take(p)

    def slow_hook(config):
        p = 1.0 if config == "stock" else 1.4
        gauge.take(p)
        return run(config, p)
    runs, reruns = measure.paced_round(["stock", "hook"], slow_hook, gauge, lambda c, a: None, log=lambda *_: None)
    assert runs["hook"]["drift"]["pace"] == 1.4 and len(reruns) == 1
    off = FakeGauge(None, 1)
    runs, reruns = measure.paced_round(["stock", "hook"], slow_hook, off, lambda c, a: None, log=lambda *_: None)
    assert reruns == [] and runs["hook"]["drift"]["pace"] == 1.4


def test_the_page_names_every_run_measured_again(tmp_path):
    data = {"runs": [run("stock", 1.0), run("hook", 1.02), run("stock", 1.0, 1), run("hook", 0.99, 1)],
            "drift_reruns": [{**run("hook", 1.3), "attempt": 1, "reference": 1.01}]}
    text = "".join(regime.rerun_lines(data))
    assert "(4 of 4 runs)" in text
    assert "more than 10% off the pace" in text and "at most 1 time)" in text
    assert "hook round 0 at 90% (pace 1.30 against 1.01)" in text
    assert "hook round 0 at 90% pace 1.02" in text
    # A set measured before the gauge: no sentence.
    assert regime.rerun_lines({"runs": [{"config": "stock"}]}) == []


def test_adding_rounds_keeps_their_reruns_and_leaves_discarded_requests_out(tmp_path):
    set_dir = tmp_path / "set"
    setup = {"engine": {"max_num_seqs": "32"}, "workloads": [{"name": "mix", "prompts": 10, "max_model_len": 4096,
                                                                  "proxy": "shipped", "rig": "gpu", "loads": [0.9]}],
             "configs": ["stock", "hook"], "rounds": 1, "first_round": 0}
    work0, work1 = tmp_path / "w0", tmp_path / "w1"
    for work, rnd in ((work0, 0), (work1, 1)):
        (work / "runs").mkdir(parents=True)
        for config in ("stock", "hook"):
            (work / "runs" / f"mix-0.9-{rnd}-{config}.json").write_text(json.dumps({"runs": [{"requests": []}]}))
    # The first attempt of a run measured again, as measure sets it aside.
    (work1 / "runs" / "mix-0.9-1-stock.json.discarded-1").write_text("not read")
    first = tmp_path / "first.json"
    first.write_text(json.dumps({"setup": setup, "runs": [run("stock", 1.0), run("hook", 1.0)],
                                 "capacity": {"mix": 2.0}, "work": [str(work0)]}))
    policies.keep(first, set_dir, "label")
    more = tmp_path / "more.json"
    more.write_text(json.dumps({"setup": {**setup, "first_round": 1}, "runs": [run("stock", 1.0, 1), run("hook", 1.0, 1)],
                                "capacity": {"mix": 2.0}, "work": [str(work1)],
                                "drift_reruns": [{**run("hook", 1.3, 1), "attempt": 1, "reference": 1.0}],
                                "references": [{"workload": "mix", "round": 1, "window": [0.0, 9.0],
                                                "tpot_s": 0.005}]}))
    policies.add(more, set_dir, "round 1")
    kept = json.loads((set_dir / "results.json").read_text())
    assert [(x["config"], x["round"]) for x in kept["drift_reruns"]] == [("hook", 1)]
    assert [(x["round"], x["tpot_s"]) for x in kept["references"]] == [(1, 0.005)]
    names = sorted(f.name for f in (set_dir / "raw").iterdir())
    assert names == [f"mix-0.9-{r}-{c}.json.gz" for r in (0, 1) for c in ("hook", "stock")]
    with gzip.open(set_dir / "raw" / names[0], "rt") as f:
        assert json.load(f) == {"runs": [{"requests": []}]}


def reference(tpot_ms: float, n: int = 20) -> list[dict]:
    return [{"index": i, "ok": True, "tpot": tpot_ms / 1000 * (1 + 0.01 * (i % 3)), "ttft": 0.1, "ttfo": 1.0}
            for i in range(n)]


def test_a_reference_measured_while_the_machine_ran_slow_judges_nothing(tmp_path):
    # Set 7's references: rounds 1 and 2 ran at 1.7x and 1.9x the others' time per token.
    paces = [5.3, 8.21, 9.27, 4.76, 4.79, 4.75, 4.85, 5.08, 4.81]
    refs = {rnd: reference(p) for rnd, p in enumerate(paces)}
    off = slo.off_pace(refs)
    assert sorted(off) == [1, 2]
    assert off[1] == pytest.approx(8.21 / 4.85, rel=0.02)
    # Too few references to say what usual is: none left out.
    assert slo.off_pace({0: reference(5.0), 1: reference(9.0)}) == {}
    raw = tmp_path / "raw"
    raw.mkdir()
    for rnd, reqs in refs.items():
        with gzip.open(raw / f"mix-unloaded-{rnd}.json.gz", "wt") as f:
            json.dump({"runs": [{"requests": reqs}]}, f)
    every, left_out = policies.references(raw, "mix")
    assert sorted(every) == list(range(9)) and sorted(left_out) == [1, 2]
    # With no pace to match them to, the off-pace rounds judge nothing.
    assert sorted(slo.judges(every, left_out, {})) == [0, 3, 4, 5, 6, 7, 8]
    note = policies.reference_note(raw, "mix", {0, 1, 3})
    assert "round 1 (1.69x)" in note and "round 2" not in note
    assert policies.reference_note(raw, "mix", {3, 4}) == ""
    # Matched to its round's pace, an off-pace reference judges again, by its factor.
    judged = slo.judges(every, left_out, {1: 0.6})
    assert sorted(judged) == [0, 1, 3, 4, 5, 6, 7, 8] and judged[1].reference_scale == 0.6
    note = policies.reference_note(raw, "mix", {0, 1, 3}, {1: 0.6})
    assert "round 1 x0.60" in note and "Left out" not in note


def test_a_round_is_judged_against_its_reference_at_the_pace_the_round_ran():
    # Set 7 at 35%: round 4's stock run ran its decode steps 1.26x the fit, the others
    # about 1.0; every reference at about 0.89 (one request's step sits lower on the fit).
    runs = {(0.35, 3): 0.99, (0.35, 4): 1.26, (0.35, 5): 1.04, (0.9, 3): 0.93, (0.9, 4): 1.01}
    refs = {3: 0.887, 4: 0.883, 5: 0.881, 1: 1.52}
    scales = slo.matched_scales(runs, refs)
    usual_run, usual_ref = 1.01, (0.883 + 0.887) / 2
    assert scales[(0.35, 4)] == pytest.approx((1.26 / usual_run) / (0.883 / usual_ref))
    assert scales[(0.35, 3)] == pytest.approx(1.0, abs=0.03)
    # A reference the machine ran slow shrinks its round's yardstick instead.
    assert slo.matched_scales({(0.9, 1): 1.0, **runs}, refs)[(0.9, 1)] < 0.6
    # A round without a reference has no factor; too few paces say nothing.
    assert (0.9, 7) not in slo.matched_scales({**runs, (0.9, 7): 1.0}, refs)
    assert slo.matched_scales({(0.35, 3): 1.0, (0.35, 4): 1.2}, refs) == {}
    # The factor moves the yardstick: 2.6x the request's time alone fails as measured
    # and meets the SLO when the round ran 1.3x slower than its reference.
    alone = {"index": 0, "ok": True, "ttft": 1.0, "ttfo": 2.0}
    loaded = {"index": 0, "ok": True, "ttft": 2.6, "ttfo": 2.0, "think_to_output": 0.01, "max_output_gap": 0.01}
    assert not SH.WholeRequestSlo().met(loaded, alone)
    assert SH.WholeRequestSlo(reference_scale=1.3).met(loaded, alone)


def test_a_runs_factor_is_read_against_its_own_loads_usual_pace():
    # The fit sits lower at low loads: runs on a line from 0.90 at 20% to 1.005 at 90%,
    # none of them drifting. Every factor is then 1, and stays 1 when the set gains runs
    # at new loads on the same line (the set-wide median moved set 7's by ~5%).
    line = {load: 0.87 + 0.15 * load for load in (0.2, 0.3, 0.5, 0.7, 0.9)}
    refs = {rnd: 0.88 for rnd in range(3, 6)}
    high = {(load, rnd): line[load] for load in (0.5, 0.7, 0.9) for rnd in (3, 4, 5)}
    every = {**high, **{(load, rnd): line[load] for load in (0.2, 0.3) for rnd in (3, 4)}}
    for runs in (high, every):
        assert all(x == pytest.approx(1.0, abs=1e-6) for x in slo.matched_scales(runs, refs).values())
    # A run the machine ran slow still shows, by its own load's usual.
    slow = slo.matched_scales({**every, (0.3, 5): line[0.3] * 1.2}, refs)
    assert slow[(0.3, 5)] == pytest.approx(1.2, abs=0.01)
    # Over fewer than three loads the usual is the median of the runs, as before.
    two = {(0.5, 3): 0.9, (0.5, 4): 1.1, (0.9, 3): 1.0}
    assert slo.usual_run_pace(two)(0.5) == slo.usual_run_pace(two)(0.9) == 1.0


def test_pace_scales_read_stock_runs_traces_and_references_against_the_twin_fit(tmp_path):
    (tmp_path / "twin").mkdir()
    (tmp_path / "twin" / "rig-profile.toml").write_text(
        "[[profile]]\nfixed_s = 4e-3\nper_token_s = 0.0\nper_context_token_s = 1e-6\n"
        "per_decode_request_s = 4e-4\nweight_read_tokens = 0\n")

    def ref(step_s: float) -> list[dict]:
        # One request decoding at context 500: fitted 4 + 0.4 + 0.5 = 4.9 ms a step.
        return [{"index": i, "ok": True, "tpot": step_s, "prompt_tokens": 300, "usage_think_tokens": 100,
                 "usage_output_tokens": 200} for i in range(5)]
    refs = {0: ref(0.0049), 1: ref(0.0049), 2: ref(0.0098), 3: ref(0.0049)}
    by_run = {("stock", "mix", 0.5, rnd): [1.0] * 30 for rnd in range(4)}
    # Round 3 ran on a machine whose steps took 1.5x the profile's: its ratios are read
    # against that machine's fit (1.0), and its pace is 1.5 on the profile's terms, as the
    # reference's is.
    (tmp_path / "twin" / "calibration.json").write_text(json.dumps(
        {"machines": {"reference": "w", "paces": {"w": 1.0, "slow": 1.5}}}))
    data = {"runs": [{"config": "stock", "workload": "mix", "load": 0.5, "round": rnd,
                      "work": "slow" if rnd == 3 else "w"} for rnd in range(4)]}
    by_run[("hook", "mix", 0.5, 3)] = [3.0] * 30  # the hook's own pace judges nothing
    by_run[("stock", "long", 0.5, 3)] = [9.0] * 30  # another workload's neither
    by_run[("stock", "mix", 0.9, 0)] = [1.0] * 5  # too few steps to say
    scales = slo.pace_scales(tmp_path, data, "mix", refs, by_run)
    assert scales == pytest.approx({(0.5, 0): 1.0, (0.5, 1): 1.0, (0.5, 2): 0.5, (0.5, 3): 1.5})
    assert slo.pace_scales(tmp_path / "nowhere", data, "mix", refs, by_run) == {}


def test_references_that_disagree_among_themselves_leave_none_out(tmp_path):
    # Set 6's four: two at about 1.7x the other two; no pace is the usual one.
    refs = {rnd: reference(p) for rnd, p in enumerate([10.9, 11.51, 6.44, 6.55])}
    assert slo.disagreeing(refs)
    assert slo.off_pace(refs) == {}
    raw = tmp_path / "raw"
    raw.mkdir()
    for rnd, reqs in refs.items():
        with gzip.open(raw / f"mix-unloaded-{rnd}.json.gz", "wt") as f:
            json.dump({"runs": [{"requests": reqs}]}, f)
    assert sorted(policies.references(raw, "mix")[0]) == [0, 1, 2, 3]
    note = policies.reference_note(raw, "mix", {0, 1})
    assert "disagree" in note and "round 1 11.6 ms" in note
    assert not slo.disagreeing({rnd: reference(p) for rnd, p in enumerate([12.6, 13.5, 11.9])})


def test_a_run_off_pace_at_every_attempt_counts_the_attempt_nearest_the_others_pace():
    # Set 11, round 10 at 70%: the hooked run at 1.12x the runs' pace, measured again at
    # 1.21x; the second was counted. The nearer attempt is counted now, its file restored.
    gauge = FakeGauge(0.1, 1)
    for p in (1.0, 1.0, 1.0):
        gauge.take(p)
    paces = {"stock": iter([1.0]), "hook": iter([1.12, 1.21])}
    moves = []

    def measure_run(config):
        p = next(paces[config])
        gauge.take(p)
        return run(config, p)

    def discard(config, attempt):
        moves.append(("aside", config, attempt))

    def restore(config, attempt):
        moves.append(("back", config, attempt))
    runs, reruns = measure.paced_round(["stock", "hook"], measure_run, gauge, discard, log=lambda *_: None,
                                       restore=restore)
    assert runs["hook"]["drift"]["pace"] == 1.12
    assert moves == [("aside", "hook", 1), ("aside", "hook", 2), ("back", "hook", 1)]
    assert [(x["config"], x["drift"]["pace"], x["attempt"]) for x in reruns] == [("hook", 1.21, 2)]
    # A rerun that came back nearer is counted as before, and nothing is restored.
    moves.clear()
    paces = {"stock": iter([1.0]), "hook": iter([1.3, 1.05])}
    runs, reruns = measure.paced_round(["stock", "hook"], measure_run, gauge, discard, log=lambda *_: None,
                                       restore=restore)
    assert runs["hook"]["drift"]["pace"] == 1.05 and moves == [("aside", "hook", 1)]
    assert [(x["drift"]["pace"], x["attempt"]) for x in reruns] == [(1.3, 1)]
