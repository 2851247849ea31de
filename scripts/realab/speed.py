"""How fast each invocation's machine ran, and so the load its runs really stood at.

A run is sent at `load` x the stock engine's capacity (everything sent at once), which
until this module was measured once per set, by its first invocation. Rounds added later
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
that. A second reading comes from the engine's own steps during the measured runs: the median
step of two shapes every run has (a full prompt chunk beside at most two decodes; a
decode of one to three requests over a short context), against the same shapes on the
capacity's machine. The two disagree by up to a third on some machines (the probe is a
few seconds on a cold engine at the start, the runs' steps half an hour later and of
whatever the load made), so the page shows both, places a run at their geometric mean,
and sets a round apart from its load only where every reading puts it off.

An invocation that measured its own capacity (the harness does by default since this
module) needs no scaling: its runs stood at their load by construction, and it checks the
readings (`machine_lines`): on the mix both matched the capacity's ratio, on long prompts
both fell short of it (both read small steps; the capacity run's are big batches over
long contexts, which a faster machine may speed up more: not measured apart)."""

from __future__ import annotations

import functools
import gzip
import json
import math
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


def capacity_of_set(set_dir: Path, workload: str) -> tuple[float, str]:
    """(capacity, the invocation that measured it) of a kept set's `workload`, for a run
    sent at that capacity (`REALAB_CAPACITY_FROM`). Refuses a set whose capacity was
    itself given, or measured by no invocation it names."""
    data = json.loads((set_dir / "results.json").read_text())
    cap = data.get("capacity", {}).get(workload)
    basis = capacity_work(data, workload)
    if cap is None or basis is None or workload in data.get("capacity_from", {}):
        raise SystemExit(f"{set_dir}: no {workload} capacity measured by one of its own invocations")
    return float(cap), basis


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


#: Fewest steps of a shape whose median says how fast an invocation's engine ran it.
MIN_CHUNKS, MIN_DECODES = 10, 20
#: Stock-engine configurations, whose runs are in the stock engine's trace.
_STOCK = ("stock", "stock-again", "proxy")


def in_run_steps(set_dir: Path, data: dict) -> dict[str, dict[str, float]]:
    """{work: {shape: median step (s)}} over each invocation's stock engine's steps inside
    its measured runs: `chunk`, a step whose prompt tokens fill three quarters of the
    budget or more, beside at most two decodes, early in its prompt (context under one
    budget); `decode`, a decode-only step of one to three requests over under 3,000
    tokens of context. A shape with too few steps (`MIN_CHUNKS`, `MIN_DECODES`) is left
    out. Each trace is read once however often the page asks (`_shapes_of`)."""
    budget = int(data["setup"]["engine"].get("max_num_batched_tokens", 2048))
    out: dict[str, dict[str, float]] = {}
    for work in (Path(w).name for w in data.get("work", [])):
        windows = tuple(tuple(r["window"]) for r in data["runs"]
                        if r.get("work") == work and r["config"] in _STOCK and r.get("window"))
        trace = set_dir / "steps" / f"stock-{work}.jsonl.gz"
        if not windows or not trace.exists():
            continue
        stat = trace.stat()
        shapes = _shapes_of(trace, stat.st_mtime_ns, stat.st_size, windows, budget)
        if shapes:
            out[work] = shapes
    return out


@functools.cache
def _shapes_of(trace: Path, _mtime_ns: int, _size: int, windows: tuple, budget: int) -> dict[str, float]:
    chunks, decodes = [], []
    with gzip.open(trace, "rt") as f:
        for line in f:
            if not line.strip():
                continue
            st = json.loads(line)
            if not any(t0 <= st["t"] <= t1 for t0, t1 in windows):
                continue
            if st["prefill_tokens"] >= 0.75 * budget and st["decode_reqs"] <= 2 and st["prefill_context"] < budget:
                chunks.append(st["step_s"])
            elif not st["prefill_tokens"] and 1 <= st["decode_reqs"] <= 3 and st["decode_context"] < 3000:
                decodes.append(st["step_s"])
    shapes = {}
    if len(chunks) >= MIN_CHUNKS:
        shapes["chunk"] = statistics.median(chunks)
    if len(decodes) >= MIN_DECODES:
        shapes["decode"] = statistics.median(decodes)
    return shapes


def speeds_of(work: str | None, basis: str | None, found: dict[str, Probe],
              steps: dict[str, dict[str, float]]) -> dict[str, float]:
    """How much faster `work`'s machine ran than `basis`'s, by each reading that has both:
    `probe` (the curve probe's step time), `steps` (the geometric mean over the shapes
    both invocations' runs have, `in_run_steps`)."""
    out: dict[str, float] = {}
    if work in found and basis in found:
        out["probe"] = found[basis].step_s / found[work].step_s
    here, there = steps.get(work or "", {}), steps.get(basis or "", {})
    common = [k for k in here if k in there]
    if common:
        out["steps"] = math.prod(there[k] / here[k] for k in common) ** (1 / len(common))
    return out


@dataclass(frozen=True)
class Standing:
    """Where one run stood: its nominal load, how much faster its machine ran than the
    one that measured the capacity it was sent by (each reading, `speeds_of`; above 1:
    faster), and its load on its own machine by each reading and at their geometric
    mean (None where no reading says)."""

    nominal: float
    speeds: dict[str, float]
    own_capacity: bool

    @property
    def speed(self) -> float | None:
        if self.own_capacity:
            return 1.0
        if not self.speeds:
            return None
        return math.prod(self.speeds.values()) ** (1 / len(self.speeds))

    @property
    def load(self) -> float | None:
        return None if self.speed is None else self.nominal / self.speed

    def loads(self) -> list[float]:
        """Its load by each reading (its nominal one where it measured its own capacity)."""
        return [self.nominal] if self.own_capacity else [self.nominal / x for x in self.speeds.values()]


def machine_readings(set_dir: Path, data: dict) -> tuple[dict[str, Probe], dict[str, dict[str, float]]]:
    """Each invocation's probe and runs' steps (`probes`, `in_run_steps`), with those of
    the sets this one took its capacity from (`capacity_from`: a folder beside this one),
    so that a set sent at another set's capacity is read against that set's machine."""
    found = probes(set_dir, data)
    steps = in_run_steps(set_dir, data)
    for name in sorted(set(data.get("capacity_from", {}).values())):
        other_dir = set_dir.parent / name
        if (other_dir / "results.json").exists():
            other = json.loads((other_dir / "results.json").read_text())
            found = {**probes(other_dir, other), **found}
            steps = {**in_run_steps(other_dir, other), **steps}
    return found, steps


def standings(set_dir: Path, data: dict) -> dict[tuple, Standing]:
    """{(workload, load, round, config): Standing} for every run of the set."""
    found, steps = machine_readings(set_dir, data)
    out: dict[tuple, Standing] = {}
    for r in data["runs"]:
        key = (r["workload"], r["load"], r["round"], r["config"])
        # Since the harness measures the capacity in every invocation, a run records the
        # work that measured the capacity it was sent by.
        basis = r.get("capacity_work") or capacity_work(data, r["workload"])
        if basis is not None and basis == r.get("work"):
            out[key] = Standing(r["load"], {}, True)
            continue
        out[key] = Standing(r["load"], speeds_of(r.get("work"), basis, found, steps), False)
    return out


def off_load(standing: dict[tuple, Standing], workload: str, load: float,
             tolerance: float = LOAD_TOLERANCE) -> set[int]:
    """The rounds of a workload x load whose stock run stood more than `tolerance` off
    the load by every reading (rounds no reading places are not listed)."""
    return {rnd for (w, at, rnd, config), s in standing.items()
            if w == workload and at == load and config == "stock" and s.load is not None
            and all(abs(x / load - 1) > tolerance for x in s.loads())
            and len({x > load for x in s.loads()}) == 1}


_READING = {"probe": "probe", "steps": "runs' steps"}


def _stood(s: Standing) -> str:
    if s.load is None:
        return "-"
    if s.own_capacity:
        return f"{100 * s.load:.0f}%"
    readings = ", ".join(f"{v:.2f}x by the {_READING[k]}" for k, v in s.speeds.items())
    return f"{100 * s.load:.0f}% (machine {readings})"


def load_line(standing: dict[tuple, Standing], workload: str, load: float) -> list[str]:
    """The page's line under a load's heading: the load each round's stock run stood at
    on its own machine, when any stood elsewhere or none can say."""
    rounds = sorted((rnd, s) for (w, at, rnd, config), s in standing.items()
                    if w == workload and at == load and config == "stock")
    if not rounds or all(s.own_capacity for _, s in rounds):
        return []
    off = off_load(standing, workload, load)
    if not off and all(s.load is not None and abs(s.load / load - 1) <= LOAD_TOLERANCE for _, s in rounds):
        return []
    each = ", ".join(f"round {rnd} {_stood(s)}" for rnd, s in rounds)
    return [f"**The load each round really stood at** (its rate over the capacity of the machine it ran on: the "
            f"capacity it was sent by, scaled by how much faster its machine ran than the one that measured it, by "
            f"the curve probe and by the runs' own steps, `speed.standings`; the load at their geometric mean): "
            f"{each}. "
            + (f"{len(off)} of {len(rounds)} rounds stood more than {100 * LOAD_TOLERANCE:.0f}% off "
               f"{100 * load:.0f}% by every reading: the figures below take them in as measured, and the section "
               "after them judges only the rounds that did not." if off else ""), ""]


def machine_lines(set_dir: Path, data: dict) -> list[str]:
    """The page's table of the set's invocations: the rounds each measured and how fast
    its machine ran, by the curve probe and by its runs' own steps (`in_run_steps`),
    against the machine that measured the capacity (else the set's first invocation)."""
    found, steps = machine_readings(set_dir, data)
    works = [Path(w).name for w in data.get("work", [])]
    if len(set(found) | set(steps)) < 2:
        return []
    by_work: dict[str, set[int]] = {}
    for r in data["runs"]:
        if r.get("work"):
            by_work.setdefault(r["work"], set()).add(r["round"])
    bases = {capacity_work(data, w["name"]) for w in data["setup"]["workloads"]}
    basis = next(iter(bases)) if len(bases) == 1 and None not in bases else None
    ref = basis or works[0]
    sources = sorted(set(data.get("capacity_from", {}).values()))
    against = (f"the machine that measured the capacity, invocation {basis} of set `{', '.join(sources)}`"
               if basis and sources else
               "the machine that measured the capacity" if basis else
               "the set's first invocation (the set's capacity was measured by a run outside it)")
    lines = ["**Which machine each invocation ran on** (`speed.py`), against " + against + ": the stock engine's "
             "steps over the curve probe every invocation runs first (the same prompts and decode batches on the same "
             "engine limits), and the median step of two shapes inside its measured runs (a full prompt chunk beside "
             "at most two decodes; a decode of one to three requests). Above 1: faster. A round sent by the capacity "
             "of a machine slower than its own stood at a lower load than its name.", "",
             "| invocation | rounds | probe steps (s) | speed by the probe | runs' chunk step (ms) | "
             "runs' decode step (ms) | speed by the runs' steps | its own capacity against it |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    readings: list[float] = []
    # An invocation that measured its own capacity says how well each reading did.
    own_capacity = {r["work"]: r["capacity"] for r in data["runs"]
                    if r.get("capacity_work") and r.get("capacity_work") == r.get("work") and r.get("capacity")}
    first_capacity = next(iter(data.get("capacity", {}).values()), None)
    checks: list[str] = []
    for work in works:
        rounds = ", ".join(str(x) for x in sorted(by_work.get(work, ()))) or "references only"
        p, own = found.get(work), steps.get(work, {})
        sp = speeds_of(work, ref, found, steps)
        readings += list(sp.values())
        cells = [f"{p.step_s:.2f}" if p else "no probe", f"{sp['probe']:.2f}x" if "probe" in sp else "-",
                 f"{1000 * own['chunk']:.1f}" if "chunk" in own else "-",
                 f"{1000 * own['decode']:.2f}" if "decode" in own else "-",
                 f"{sp['steps']:.2f}x" if "steps" in sp else "-"]
        truth = own_capacity.get(work)
        ratio = truth / first_capacity if truth and first_capacity and work != ref else None
        cells.append(f"{ratio:.2f}x" if ratio else "-")
        if ratio:
            checks.append(f"{work}'s capacity was {ratio:.2f}x the first machine's, where the probe read "
                          + (f"{sp['probe']:.2f}x" if "probe" in sp else "nothing")
                          + " and its runs' steps " + (f"{sp['steps']:.2f}x" if "steps" in sp else "nothing"))
        lines.append(f"| {work} | {rounds} | " + " | ".join(cells) + " |")
    if readings and ref not in works:
        # Every invocation ran on a machine other than the capacity's: say where that put them.
        stock = [r for r in data["runs"] if r["config"] == "stock"]
        stood = [Standing(r["load"], speeds_of(r.get("work"), ref, found, steps), False) for r in stock]
        loads = sorted({round(100 * x.load) for x in stood if x.load})
        nominal = sorted({round(100 * r["load"]) for r in stock})
        if loads:
            lines += ["", f"Sent at {', '.join(f'{x}%' for x in nominal)} of that capacity, the rounds stood at "
                      f"{', '.join(f'{x}%' for x in loads)} of their own machine's."]
    elif readings:
        lines += ["", f"The machines differed by up to {max(readings) / min(readings):.2f}x in speed."]
    if checks:
        lines += ["", "Where an invocation measured its own capacity (the harness does since `speed.py`), the "
                  "readings can be checked against it: " + "; ".join(checks) + "."]
    return [*lines, ""]
