"""Where a kept set's runs really stood: each invocation's machine read from the curve probe
its stock engine ran first, and the load a run stood at on that machine; the page says so
and judges a load by the rounds that stood at it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from realab import policies, readme, speed

#: The probe's shapes (prompt chunks, then decodes), each step `unit` times these seconds.
PROBE = [(256, 256, 0), (256, 256, 0), (64, 64, 0)] + [(k, 0, k) for k in (1, 1, 2, 2, 4, 4)]


def step(t: float, seconds: float, tokens: int, prefill: int, decodes: int) -> dict:
    return {"t": t, "step_s": seconds, "sched_s": 0.0001, "tokens": tokens, "prefill_tokens": prefill,
            "decode_reqs": decodes, "decode_context": 100 * decodes, "prefill_context": 0, "running": 1,
            "waiting": 0, "preempted": 0, "preempted_output": 0, "preempted_think": 0}


def probe_steps(start: float, unit: float) -> list[dict]:
    out, t = [], start
    for tokens, prefill, decodes in PROBE:
        seconds = unit * (0.04 if prefill else 0.01)
        out.append(step(t, seconds, tokens, prefill, decodes))
        t += seconds + 0.001
    return out


def write_trace(set_dir: Path, work: str, unit: float | None, windows: list[tuple[float, float]],
                run_unit: float | None = None) -> None:
    """A stock engine's kept trace: the curve probe at t=10 (its steps `unit` times the
    first machine's; None: no probe, an invocation of references only), then inside each
    run's window decode steps of two requests, `run_unit` (default: `unit`) times the
    first machine's."""
    steps = probe_steps(10.0, unit) if unit is not None else [step(10.0, 0.02, 1, 0, 1), step(10.02, 0.02, 1, 0, 1)]
    pace = run_unit if run_unit is not None else unit if unit is not None else 1.0
    for t0, _t1 in windows:
        steps += [step(t0 + 0.1 * i, 0.01 * pace, 2, 0, 2) for i in range(25)]
    (set_dir / "steps").mkdir(parents=True, exist_ok=True)
    with gzip.open(set_dir / "steps" / f"stock-{work}.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(s) for s in steps) + "\n")


def request(i: int, scale: float) -> dict:
    base = 1.0 + (i % 7) * 0.3
    gaps = [0.01 * scale] * 20
    return {"index": i, "ok": True, "sent_at": i * 0.5, "ttft": 0.2 * base * scale, "ttfo": 0.5 * base * scale,
            "think_to_output": 0.05 * base * scale, "e2e": 1.0 * base * scale, "output_itl": gaps,
            "max_output_gap": max(gaps) * base}


def write_set(set_dir: Path, invocations: list[dict], n: int = 100) -> dict:
    """A kept set from `invocations`, each {"work", "unit" (its probe's pace), "load",
    "rounds", "scales" ({config: scale}), "own" (it measured its own capacity)}; the first
    measured the set's capacity. Every round has its unloaded reference."""
    raw = set_dir / "raw"
    raw.mkdir(parents=True)
    runs, configs, loads = [], [], []
    for inv in invocations:
        windows = []
        for rnd in inv["rounds"]:
            for config, scale in inv["scales"].items():
                if config not in configs:
                    configs.append(config)
                window = (100.0 + 10 * len(runs), 105.0 + 10 * len(runs))
                windows.append(window)
                body = {"runs": [{"requests": [request(i, scale) for i in range(n)]}]}
                with gzip.open(raw / f"long-{inv['load']:g}-{rnd}-{config}.json.gz", "wt") as f:
                    json.dump(body, f)
                runs.append({"workload": "long", "load": inv["load"], "round": rnd, "config": config,
                             "policy": None if config == "stock" else config.removeprefix("hook-"),
                             "work": inv["work"], "window": list(window), "rate": 2.0 * inv["load"],
                             **({"capacity": 2.0, "capacity_work": inv["work"]} if inv.get("own") else {}),
                             "summary": {"total_token_throughput": 1000.0 / scale}, "cpu": {"other_cores": 0.01}})
            with gzip.open(raw / f"long-unloaded-{rnd}.json.gz", "wt") as f:
                json.dump({"runs": [{"requests": [request(i, 0.9) for i in range(n)]}]}, f)
        if inv["load"] not in loads:
            loads.append(inv["load"])
        write_trace(set_dir, inv["work"], inv["unit"], windows, inv.get("run_unit"))
    data = {"label": "synthetic", "setup": {"configs": configs, "rounds": len(invocations[0]["rounds"]),
                                            "engine": {"model": "/m/bench", "max_num_seqs": 32,
                                                       "max_num_batched_tokens": 256, "omp_threads": 1},
                                            "workloads": [{"name": "long", "loads": sorted(loads), "prompts": n,
                                                           "configs": configs, "proxy": "shipped"}]},
            "capacity": {"long": 2.0}, "runs": runs, "work": [f"/tmp/{inv['work']}" for inv in invocations]}
    (set_dir / "results.json").write_text(json.dumps(data))
    return data


def test_the_probe_is_the_first_burst_of_a_trace_and_only_a_probe_counts(tmp_path: Path):
    steps = probe_steps(10.0, 1.0) + [step(20.0, 0.5, 256, 256, 0)]
    p = speed.probe_of(steps)
    assert p is not None and p.steps == len(PROBE) and p.tokens == sum(t for t, _, _ in PROBE)
    assert p.step_s == pytest.approx(3 * 0.04 + 6 * 0.01) and p.prefill_s == pytest.approx(0.12)
    assert speed.probe_of([]) is None
    data = write_set(tmp_path / "set", [
        {"work": "a", "unit": 1.0, "load": 0.9, "rounds": [0], "scales": {"stock": 1.0}},
        {"work": "b", "unit": 0.5, "load": 0.9, "rounds": [1], "scales": {"stock": 1.0}},
        {"work": "refs", "unit": None, "load": 0.9, "rounds": [], "scales": {}}])
    found = speed.probes(tmp_path / "set", data)
    # The references-only invocation starts with two decodes, not the probe.
    assert sorted(found) == ["a", "b"] and found["a"].step_s == pytest.approx(2 * found["b"].step_s)


def test_rounds_sent_by_another_machines_capacity_stood_at_their_load_over_the_speed(tmp_path: Path):
    data = write_set(tmp_path / "set", [
        {"work": "a", "unit": 1.0, "load": 0.9, "rounds": [0], "scales": {"stock": 1.0}},
        # Twice as fast, sent at the first machine's capacity: it stood at 45%.
        {"work": "b", "unit": 0.5, "load": 0.9, "rounds": [1], "scales": {"stock": 1.0}},
        # Twice as fast too, but it measured its own capacity: it stood at 90%.
        {"work": "c", "unit": 0.5, "load": 0.9, "rounds": [2], "scales": {"stock": 1.0}, "own": True},
        # No probe kept, and its runs' steps as the first machine's: 90% by those alone.
        {"work": "d", "unit": None, "load": 0.9, "rounds": [3], "scales": {"stock": 1.0}},
        # Its probe says twice as fast, its runs' steps only 1.25x: it stood at 72% by
        # one reading, 45% by the other, so at 57% (their geometric mean), off by both.
        {"work": "e", "unit": 0.5, "run_unit": 0.8, "load": 0.9, "rounds": [4], "scales": {"stock": 1.0}},
        # Faster by its probe, as the first by its runs: off by one reading only.
        {"work": "f", "unit": 0.5, "run_unit": 1.0, "load": 0.9, "rounds": [5], "scales": {"stock": 1.0}}])
    st = speed.standings(tmp_path / "set", data)
    first = st[("long", 0.9, 0, "stock")]
    assert first.own_capacity and first.speed == 1.0 and first.load == 0.9
    b = st[("long", 0.9, 1, "stock")]
    assert b.speeds == pytest.approx({"probe": 2.0, "steps": 2.0}) and b.load == pytest.approx(0.45)
    assert not b.own_capacity
    assert st[("long", 0.9, 2, "stock")].load == 0.9
    assert st[("long", 0.9, 3, "stock")].speeds == pytest.approx({"steps": 1.0})
    e = st[("long", 0.9, 4, "stock")]
    assert e.speeds == pytest.approx({"probe": 2.0, "steps": 1.25}) and e.load == pytest.approx(0.9 / 2.5 ** 0.5)
    assert speed.off_load(st, "long", 0.9) == {1, 4}, "round 5 is off by its probe only"
    (line, _) = speed.load_line(st, "long", 0.9)
    assert ("round 0 90%, round 1 45% (machine 2.00x by the probe, 2.00x by the runs' steps), round 2 90%, "
            "round 3 90% (machine 1.00x by the runs' steps), round 4 57%") in line
    assert "2 of 6 rounds stood more than 12% off 90% by every reading" in line
    table = "\n".join(speed.machine_lines(tmp_path / "set", data))
    assert "| a | 0 | 0.18 | 1.00x | - | 10.00 | 1.00x |" in table
    assert "| b | 1 | 0.09 | 2.00x | - | 5.00 | 2.00x |" in table
    assert "| d | 3 | no probe | - | - | 10.00 | 1.00x |" in table and "differed by up to 2.00x" in table


def test_a_load_is_judged_again_by_the_rounds_that_stood_at_it(tmp_path: Path):
    page_dir = tmp_path / "page"
    write_set(page_dir / "1-set", [
        {"work": "a", "unit": 1.0, "load": 0.9, "rounds": [0, 1], "scales": {"stock": 1.0, "hook-output-first": 1.2}},
        {"work": "b", "unit": 0.5, "load": 0.9, "rounds": [2, 3], "scales": {"stock": 1.0, "hook-output-first": 0.8}}])
    page = (page_dir / "page.md")
    policies.write(page_dir, page, resamples=200)
    text = page.read_text()
    assert "**Which machine each invocation ran on**" in text
    assert ("round 2 45% (machine 2.00x by the probe, 2.00x by the runs' steps), round 3 45% (machine 2.00x by the "
            "probe, 2.00x by the runs' steps)") in text
    full, _, at_load = text.partition("#### long, 90%: only the rounds that stood at it (rounds 0, 1)")
    assert at_load, "the rounds at 90% judged apart"
    # Pooled, the two machines' effects meet in the middle; at 90% only the cost shows.
    assert "| hook-output-first | TTFT | 1.20 (1.20-1.20) |" in at_load.split("Reproduce:")[0]
    assert "do no harm (every metric's interval at or below 1.05): harm**, decided by TTFT p50" in at_load
    pooled = full.split("### long, 90% of stock capacity")[1]
    assert "do no harm (every metric's interval at or below 1.05): harm**" not in pooled
    # The README's summary says where the rounds stood, and judges those at the load.
    pooled_line, at_load_line = readme.summary_lines(page_dir, resamples=100)
    assert pooled_line.startswith("- long at 90% load (its rounds stood at 45-90% of their own machine's capacity), "
                                  "`hook-output-first` against stock (set `1-set`): do no harm: unresolved"), pooled_line
    assert at_load_line.startswith("- long at 90% load, only the rounds that stood at it (0, 1), `hook-output-first` "
                                   "against stock (set `1-set`): do no harm: harm; costs: TTFT p50 1.20x"), at_load_line


def test_the_capacity_sweep_places_each_round_at_the_load_it_stood_at(tmp_path: Path):
    # At 90% (the capacity's machine) hook-fcfs is 3x slower than stock; the rounds sent
    # at 70% ran on a machine twice as fast, where they stood at 35% and it equals stock.
    page_dir = tmp_path / "page"
    write_set(page_dir / "1-set", [
        {"work": "a", "unit": 1.0, "load": 0.9, "rounds": [0, 1], "scales": {"stock": 1.0, "hook-fcfs": 3.0}},
        {"work": "b", "unit": 0.5, "load": 0.7, "rounds": [2, 3], "scales": {"stock": 1.0, "hook-fcfs": 1.0}}])
    page = page_dir / "page.md"
    policies.write(page_dir, page, resamples=100)
    text = page.read_text()
    assert "sent at 70%: rounds 2, 3 at 35%" in text
    fcfs = next(line for line in text.splitlines() if line.startswith("- hook-fcfs: "))
    # A twentieth of the way from 35% to 90%, not from 70%.
    assert fcfs.startswith("- hook-fcfs: 38% of stock capacity"), fcfs
    assert "100% at 35%, 0% at 90%" in fcfs


def test_an_addition_that_measured_its_own_capacity_is_kept_with_it(tmp_path: Path):
    page_dir = tmp_path / "page"
    write_set(page_dir / "1-set", [
        {"work": "a", "unit": 1.0, "load": 0.9, "rounds": [0, 1], "scales": {"stock": 1.0}}])
    work = tmp_path / "w"
    (work / "runs").mkdir(parents=True)
    for rnd in (2, 3):
        (work / "runs" / f"long-0.9-{rnd}-stock.json").write_text(
            json.dumps({"runs": [{"requests": [request(i, 1.0) for i in range(100)]}]}))
    kept = json.loads((page_dir / "1-set" / "results.json").read_text())
    new = {**kept, "capacity": {"long": 3.1}, "capacity_work": {"long": "w"}, "work": [str(work)],
           "setup": {**kept["setup"], "first_round": 2},
           "probes": {"w": {"window": [1.0, 2.0], "step_s": 0.09}},
           "runs": [{"workload": "long", "load": 0.9, "round": rnd, "config": "stock", "work": "w",
                     "window": [100.0 + 10 * rnd, 105.0 + 10 * rnd],
                     "capacity": 3.1, "capacity_work": "w", "summary": {"total_token_throughput": 1.0}}
                    for rnd in (2, 3)]}
    (work / "results.json").write_text(json.dumps(new))
    # Its engine's trace, which `add` keeps: a probe 1.5x as fast, runs' steps 1.6x.
    write_trace(work, "w", 1 / 1.5, [(120.0, 125.0), (130.0, 135.0)], run_unit=1 / 1.6)
    with gzip.open(work / "steps" / "stock-w.jsonl.gz", "rt") as f:
        (work / "stock-steps.jsonl").write_text(f.read())
    assert policies.add(work / "results.json", page_dir / "1-set", "rounds 2-3 on their own machine") == 2
    merged = json.loads((page_dir / "1-set" / "results.json").read_text())
    # The set keeps its capacity and the machine that measured it; the rounds, theirs.
    assert merged["capacity"] == {"long": 2.0} and merged["capacity_work"] == {"long": "a"}
    assert merged["probes"] == {"w": {"window": [1.0, 2.0], "step_s": 0.09}}
    st = speed.standings(page_dir / "1-set", merged)
    assert st[("long", 0.9, 2, "stock")].own_capacity and st[("long", 0.9, 0, "stock")].own_capacity
    text = "\n".join(policies.set_section(page_dir / "1-set", 100))
    assert "rounds added later measured their own machine's and were sent by it: rounds 2, 3 3.100 req/s" in text
    # Its own capacity checks the readings the older rounds are placed by.
    assert "| w | 2, 3 | 0.12 | 1.50x | - | 6.25 | 1.60x | 1.55x |" in text
    assert "w's capacity was 1.55x the first machine's, where the probe read 1.50x and its runs' steps 1.60x" in text


def test_a_set_sent_at_another_sets_capacity_is_read_against_that_sets_machine(tmp_path: Path, monkeypatch):
    page = tmp_path / "sets"
    # The set that measured the capacity, on a machine of pace 1.
    write_set(page / "1-measured", [{"work": "a", "unit": 1.0, "load": 0.9, "rounds": [0], "scales": {"stock": 1.0}}])
    cap, basis = speed.capacity_of_set(page / "1-measured", "long")
    assert (cap, basis) == (2.0, "a")
    # A later set on a machine twice as slow, given that capacity: it stood at 180%.
    data = write_set(page / "2-given", [{"work": "b", "unit": 2.0, "load": 0.9, "rounds": [0],
                                         "scales": {"stock": 1.0}}])
    data.update(capacity_given={"long": True}, capacity_from={"long": "1-measured"}, capacity_work={"long": basis})
    (page / "2-given" / "results.json").write_text(json.dumps(data))
    st = speed.standings(page / "2-given", data)[("long", 0.9, 0, "stock")]
    assert not st.own_capacity
    assert st.speeds == pytest.approx({"probe": 0.5, "steps": 0.5}) and st.load == pytest.approx(1.8)
    table = "\n".join(speed.machine_lines(page / "2-given", data))
    assert "invocation a of set `1-measured`" in table and "| b | 0 | " in table
    assert "Sent at 90% of that capacity, the rounds stood at 180% of their own machine's." in table
    # Without the other set beside it, no reading places the run.
    alone = tmp_path / "alone"
    (page / "2-given").rename(alone)
    assert speed.standings(alone, data)[("long", 0.9, 0, "stock")].load is None
    # A set whose own capacity was given passes on no measurement.
    with pytest.raises(SystemExit, match="no long capacity measured"):
        speed.capacity_of_set(alone, "long")
    # Its command to reproduce gives that set's capacity, and the hook's policy it ran.
    monkeypatch.setattr(policies, "shipped_policy", lambda: "slo-driven")
    data["setup"]["workloads"][0].update(hook_policy="slo-driven:start_wait_target_s=inf", configs=["stock", "hook"])
    text = "\n".join(policies.reproduce(data))
    assert "REALAB_CAPACITY_FROM=../docs/src/benchmarks/policies-real-engine/1-measured" in text
    assert "REALAB_CAPACITY=" not in text
    assert "REALAB_HOOK_POLICY=slo-driven:start_wait_target_s=inf" in text
    data["setup"]["workloads"][0]["hook_policy"] = "slo-driven"
    assert "REALAB_HOOK_POLICY" not in "\n".join(policies.reproduce(data))
