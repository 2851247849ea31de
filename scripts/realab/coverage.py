"""What the page's sets have measured, and what is left: for each regime and workload,
the rounds each kind of configuration ran beside stock (and at which loads, in which
sets), and, in the order the plan measures them, the cells no set fills yet.

The plan's order: the GPU-shaped rig at 90% load with stock and the three hook policies
on long prompts and the mix; then a load sweep for the capacity; then KV pressure; then
the proxy alone. A cell counts as measured where one set holds two rounds or more of it
(one round gives no verdict, `stats.do_no_harm`; rounds of different sets are never pooled)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .effects import policies_of
from .measure import shipped_policy

#: The kinds of configuration the plan compares with stock, in the page's order (the
#: shipped default: `hook` running `meridian.toml`'s policy, `slo-driven`, as shipped).
KINDS = ("proxy only", "fcfs", "output-first", "reasoning-first", "slo-driven as shipped", "other settings")
#: The three hook policies the plan measures on every workload.
POLICIES = ("output-first", "reasoning-first", "slo-driven as shipped")
#: A step budget at most this many tokens is the GPU-shaped rig's (its chunk over its
#: decode step near the H100's); larger, the CPU-shaped one.
GPU_SHAPED_BUDGET = 512
#: Rounds a cell needs before a verdict can read it.
ENOUGH_ROUNDS = 2
#: Loads a workload's shipped default needs for a capacity sweep.
SWEEP_LOADS = 3
#: The workloads the plan names: long prompts, the mix, KV pressure (either cache).
WORKLOADS = ("long", "mix", "kv")


def kind_of(config: str, policy: str | None) -> str | None:
    """The kind of a configuration; None for stock and the A/A run."""
    if config == "proxy":
        return "proxy only"
    if policy is None:
        return None
    if policy == shipped_policy():
        return "slo-driven as shipped"
    return policy if policy in KINDS and ":" not in policy else "other settings"


def regime_of(data: dict) -> str:
    budget = int(data["setup"]["engine"].get("max_num_batched_tokens", 2048))
    return "GPU-shaped" if budget <= GPU_SHAPED_BUDGET else "CPU-shaped"


def family(workload: str) -> str:
    """KV pressure in either cache is one workload of the plan."""
    return "kv" if workload.startswith("kv") else workload


@dataclass
class Cell:
    """One kind's rounds beside stock at one regime and workload: {(set, load): rounds}."""

    by_set: dict[tuple[str, float], int] = field(default_factory=dict)

    @property
    def rounds(self) -> dict[float, int]:
        """{load: rounds} over every set."""
        out: dict[float, int] = {}
        for (_, load), n in self.by_set.items():
            out[load] = out.get(load, 0) + n
        return out

    @property
    def sets(self) -> set[str]:
        return {name for name, _ in self.by_set}

    def at(self, load: float) -> int:
        """The most rounds one set holds at `load`: rounds of different sets (other
        hooks, other machines, other proxies) are never pooled into one verdict."""
        return max((n for (_, x), n in self.by_set.items() if x == load), default=0)

    def text(self) -> str:
        if not self.rounds:
            return "-"
        loads = ", ".join(f"{n} at {100 * x:.0f}%" for x, n in sorted(self.rounds.items(), reverse=True))
        return f"{loads} (set{'s' if len(self.sets) > 1 else ''} {', '.join(sorted(self.sets, key=int))})"


def cells(set_dirs: list[Path]) -> dict[tuple[str, str, str], Cell]:
    """{(regime, workload, kind): Cell} over every kept set (superseded ones too: they are
    the CPU-shaped regime's only rounds). A round counts where the kind ran beside stock."""
    out: dict[tuple[str, str, str], Cell] = {}
    for set_dir in set_dirs:
        data = json.loads((set_dir / "results.json").read_text())
        policies = policies_of(data)
        regime = regime_of(data)
        stock = {(r["workload"], r["load"], r["round"]) for r in data["runs"] if r["config"] == "stock"}
        seen: set[tuple] = set()
        for r in data["runs"]:
            kind = kind_of(r["config"], policies.get(r["config"]))
            key = (r["workload"], r["load"], r["round"])
            if kind is None or key not in stock or (key, kind) in seen:
                continue
            seen.add((key, kind))
            cell = out.setdefault((regime, family(r["workload"]), kind), Cell())
            at = (set_dir.name.split("-")[0], r["load"])
            cell.by_set[at] = cell.by_set.get(at, 0) + 1
    return out


def table_lines(found: dict[tuple[str, str, str], Cell]) -> list[str]:
    lines = ["| regime | workload | " + " | ".join(KINDS) + " |", "|---|---|" + "---|" * len(KINDS)]
    for regime in ("GPU-shaped", "CPU-shaped"):
        for workload in WORKLOADS:
            row = [found.get((regime, workload, kind), Cell()).text() for kind in KINDS]
            lines.append(f"| {regime} | {workload} | " + " | ".join(row) + " |")
    return lines


def left(found: dict[tuple[str, str, str], Cell]) -> list[str]:
    """The cells no set fills yet, in the plan's order, each as a phrase."""
    def rounds(workload: str, kind: str, load: float = 0.9) -> int:
        return found.get(("GPU-shaped", workload, kind), Cell()).at(load)

    out = []
    for step, workloads, kinds in ((1, ("long", "mix"), POLICIES), (3, ("kv",), POLICIES),
                                   (4, WORKLOADS, ("proxy only",))):
        missing = [f"{kind} on {w}" + (f" ({rounds(w, kind)} round)" if rounds(w, kind) else "")
                   for w in workloads for kind in kinds if rounds(w, kind) < ENOUGH_ROUNDS]
        if missing:
            out.append(f"({step}) at 90% on the GPU-shaped rig: {', '.join(missing)}")
        if step == 1:
            default = {w: found.get(("GPU-shaped", w, "slo-driven as shipped"), Cell()) for w in WORKLOADS}
            short = [w for w in WORKLOADS
                     if sum(1 for x in default[w].rounds if default[w].at(x) >= ENOUGH_ROUNDS) < SWEEP_LOADS]
            if short:
                out.append(f"(2) a load sweep for the capacity (the shipped default and stock at {SWEEP_LOADS} loads "
                           f"or more, {ENOUGH_ROUNDS} rounds each) on {', '.join(short)}")
    cpu = [w for w in WORKLOADS
           if not any(c.at(0.9) >= ENOUGH_ROUNDS for (regime, wl, _k), c in found.items()
                      if regime == "CPU-shaped" and wl == w)]
    if cpu:
        out.append(f"the CPU-shaped regime again (its sets ran one round each, with hooks since replaced): "
                   f"{', '.join(cpu)}")
    return out


def page_lines(set_dirs: list[Path]) -> list[str]:
    """The page's table of what was measured, and its sentence of what is left."""
    found = cells(set_dirs)
    if not found:
        return []
    todo = left(found)
    return (["**What the sets measured** (rounds beside stock, by load, and the sets holding them; the CPU-shaped "
             "regime's sets are superseded):", "", *table_lines(found), "",
             ("**Left to measure**, in the plan's order (each cell wants "
              f"{ENOUGH_ROUNDS} rounds or more in one set): " + "; ".join(todo) + "." if todo else
              "**Left to measure:** nothing the plan names."), ""])
