"""How fast each invocation's machine ran, and so the load its runs really stood at.

A run is sent at `load` x the stock engine's capacity, and the capacity is measured once
per set, by the invocation that measured it (everything sent at once). Rounds added later
(`policies add`) ran on whatever machine the later session had, and were sent at the
first invocation's rate (`REALAB_CAPACITY`): on a machine twice as fast, a run called
"90%" stood at 45% of that machine's capacity, and pooling it with the rounds that stood
at 90% mixes two regimes under one label (and widens every interval by how much they
differ).

The yardstick is the curve probe (`curve.probe`) that every invocation runs on its fresh
stock engine before anything else: the same prompts and decode batches, in the same
order, on the same engine limits. The time the engine's steps took over it, against the
probe of the invocation that measured the capacity, is how much faster or slower the
machine was; a run's load on its own machine is its rate over the capacity scaled by
that. An invocation that measured its own capacity (the harness does by default since
this module) needs no scaling: its runs stood at their load by construction."""

from __future__ import annotations

import gzip
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

#: An idle gap in the stock engine's trace longer than this ends the curve probe (its
#: requests run back to back; what follows it, the capacity run or the first run's
#: warm-up, starts after the harness has read the probe's window).
PROBE_GAP_S = 1.0
#: A run whose load on its own machine is off its nominal load by more than this share
#: is listed as standing elsewhere, and the page judges the load's rounds that did not.
LOAD_TOLERANCE = 0.12


@dataclass(frozen=True)
class Probe:
    """The curve probe's steps at the start of one invocation's stock trace."""

    steps: int
    tokens: int
    step_s: float
    prefill_s: float
    decode_s: float


def probe_of(steps: list[dict]) -> Probe | None:
    """The probe: the trace's first steps up to its first idle gap (`PROBE_GAP_S`)."""
    if not steps:
        return None
    run = [steps[0]]
    for a, b in zip(steps, steps[1:]):
        if b["t"] - a["t"] > PROBE_GAP_S:
            break
        run.append(b)
    return Probe(steps=len(run), tokens=sum(s["tokens"] for s in run),
                 step_s=sum(s["step_s"] for s in run),
                 prefill_s=sum(s["step_s"] for s in run if s["prefill_tokens"]),
                 decode_s=sum(s["step_s"] for s in run if not s["prefill_tokens"]))


def probes(set_dir: Path, data: dict) -> dict[str, Probe]:
    """{work: its probe} for each invocation whose kept stock trace starts with one. A
    trace that starts with something else (an invocation of unloaded references only)
    has no probe: its first steps' token count is not the others' (the probe's is fixed
    by the engine's limits)."""
    found: dict[str, Probe] = {}
    for work in data.get("work", []):
        name = Path(work).name
        trace = set_dir / "steps" / f"stock-{name}.jsonl.gz"
        if not trace.exists():
            continue
        with gzip.open(trace, "rt") as f:
            # The probe is the first few hundred steps; read until its gap.
            steps, last = [], None
            for line in f:
                if not line.strip():
                    continue
                st = json.loads(line)
                if last is not None and st["t"] - last > PROBE_GAP_S:
                    break
                steps.append(st)
                last = st["t"]
        p = probe_of(steps)
        if p is not None:
            found[name] = p
    if not found:
        return {}
    usual = statistics.mode(p.tokens for p in found.values())
    return {w: p for w, p in found.items() if p.tokens == usual}


def capacity_work(data: dict, workload: str) -> str | None:
    """The invocation that measured the set's capacity for `workload`: recorded since the
    harness records it; before, the set's first (unless the capacity was given to it,
    measured by a run that is not in the set)."""
    recorded = data.get("capacity_work", {}).get(workload)
    if recorded:
        return recorded
    if data.get("capacity_given", {}).get(workload) or not data.get("work"):
        return None
    return Path(data["work"][0]).name


@dataclass(frozen=True)
class Standing:
    """Where one run stood: its nominal load, the machine's speed against the one that
    measured the capacity it was sent by (probe time there over probe time here; above 1:
    faster), and its load on its own machine (None where no probe says)."""

    nominal: float
    speed: float | None
    load: float | None
    own_capacity: bool


def standings(set_dir: Path, data: dict) -> dict[tuple, Standing]:
    """{(workload, load, round, config): Standing} for every run of the set."""
    found = probes(set_dir, data)
    out: dict[tuple, Standing] = {}
    for r in data["runs"]:
        key = (r["workload"], r["load"], r["round"], r["config"])
        # Since the harness measures the capacity in every invocation, a run records the
        # work that measured the capacity it was sent by.
        basis = r.get("capacity_work") or capacity_work(data, r["workload"])
        if basis is not None and basis == r.get("work"):
            out[key] = Standing(r["load"], 1.0, r["load"], True)
            continue
        here, there = found.get(r.get("work") or ""), found.get(basis or "")
        if here is None or there is None:
            out[key] = Standing(r["load"], None, None, False)
            continue
        speed = there.step_s / here.step_s
        out[key] = Standing(r["load"], speed, r["load"] / speed, False)
    return out


def off_load(standing: dict[tuple, Standing], workload: str, load: float,
             tolerance: float = LOAD_TOLERANCE) -> set[int]:
    """The rounds of a workload x load whose stock run stood more than `tolerance` off
    the load (rounds with no probe to say are not listed)."""
    return {rnd for (w, at, rnd, config), s in standing.items()
            if w == workload and at == load and config == "stock" and s.load is not None
            and abs(s.load / load - 1) > tolerance}


def load_line(standing: dict[tuple, Standing], workload: str, load: float) -> list[str]:
    """The page's line under a load's heading: the load each round's stock run stood at
    on its own machine, when any stood elsewhere."""
    rounds = sorted((rnd, s) for (w, at, rnd, config), s in standing.items()
                    if w == workload and at == load and config == "stock")
    if not rounds or all(s.own_capacity for _, s in rounds):
        return []
    off = off_load(standing, workload, load)
    if not off and all(s.load is not None for _, s in rounds):
        return []
    each = ", ".join(f"round {rnd} {'-' if s.load is None else f'{100 * s.load:.0f}%'}"
                     + ("" if s.own_capacity or s.speed is None else f" (machine {s.speed:.2f}x)")
                     for rnd, s in rounds)
    return [f"**The load each round really stood at** (its rate over the capacity of the machine it ran on: the "
            f"capacity it was sent by, scaled by how fast its machine ran the curve probe against the machine that "
            f"measured that capacity, `speed.standings`): {each}. "
            + (f"{len(off)} of {len(rounds)} rounds stood more than {100 * LOAD_TOLERANCE:.0f}% off "
               f"{100 * load:.0f}%: the figures below pool them as measured, and the section after them judges "
               "only the rounds that stood at the load." if off else ""), ""]


def machine_lines(set_dir: Path, data: dict) -> list[str]:
    """The page's table of the set's invocations: the rounds each measured, how long its
    stock engine took over the curve probe, and that against the machine that measured
    the capacity."""
    found = probes(set_dir, data)
    if len(found) < 2:
        return []
    by_work: dict[str, set[int]] = {}
    for r in data["runs"]:
        if r.get("work"):
            by_work.setdefault(r["work"], set()).add(r["round"])
    bases = {capacity_work(data, w["name"]) for w in data["setup"]["workloads"]}
    basis = next(iter(bases)) if len(bases) == 1 else None
    ref = found.get(basis or "") or next(iter(found.values()))
    against = "the machine that measured the capacity" if basis in found else "the set's first invocation"
    lines = ["**Which machine each invocation ran on** (`speed.py`): the stock engine's steps over the curve "
             "probe every invocation runs first (the same prompts and decode batches on the same engine limits), "
             f"against {against}. Rounds sent by a capacity another machine measured stood at their load times "
             "this ratio's inverse.", "",
             "| invocation | rounds | probe steps (s) | of which prompt / decode (s) | speed against "
             + ("the capacity's machine" if basis in found else "the first") + " |",
             "|---|---|---:|---:|---:|"]
    for work in (Path(w).name for w in data.get("work", [])):
        p = found.get(work)
        rounds = ", ".join(str(x) for x in sorted(by_work.get(work, ()))) or "references only"
        if p is None:
            lines.append(f"| {work} | {rounds} | no probe | | |")
            continue
        lines.append(f"| {work} | {rounds} | {p.step_s:.2f} | {p.prefill_s:.2f} / {p.decode_s:.2f} | "
                     f"{ref.step_s / p.step_s:.2f}x |")
    speeds = [ref.step_s / p.step_s for p in found.values()]
    lines += ["", f"The machines differed by up to {max(speeds) / min(speeds):.2f}x in speed.", ""]
    return lines
