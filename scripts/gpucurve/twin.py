"""The twin's policy A/B run twice, on the datasheet profile and on the measured one, so
the page can say whether the effect the twin predicts survives a measured cost model."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

WORKLOADS = [
    ("the default reasoning mix", None, 1500),
    ("long prompts (`loadtest/twin/workloads/long-prompts.toml`)", "loadtest/twin/workloads/long-prompts.toml", 600),
]
LOADS = [0.5, 0.7, 0.9, 1.0]
POLICY = "output-first"
METRICS = [("ttot_p99_ms", "p99 TTOT"), ("itl_p99_ms", "p99 output ITL"),
           ("answer_gap_p99_ms", "p99 answer gap"), ("tokens_per_s", "throughput")]


def _cells(sim, data: Path, name: str, measured: bool, workload: str | None, prompts: int) -> dict:
    """`meridian-sim ab` on one profile; its cells (the page carries the figures, so the
    JSON goes to a temporary file: rebuilding it takes a second)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ab.json"
        args = ["ab", "--profile", name, "--policies", f"fcfs,{POLICY}", "--num-prompts", str(prompts),
                "--loads", ",".join(map(str, LOADS)), "--json", str(out)]
        if measured:
            args += ["--profile-file", str(data / "fitted-profile.toml")]
        if workload:
            args += ["--workload", workload]
        sim(*args)
        return json.loads(out.read_text())


def _ratios(cells: dict) -> dict[float, dict[str, float | None]]:
    """Per load: the policy's figure over fcfs's, per metric (None where either is missing)."""
    by = {(round(c["load"], 3), c["policy"]): c for c in cells["cells"]}
    out = {}
    for load in LOADS:
        base, new = by.get((load, "fcfs")), by.get((load, POLICY))
        out[load] = {m: (new[m] / base[m] if base and new and base.get(m) and new.get(m) is not None else None)
                     for m, _ in METRICS}
    return out


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def ab_side_by_side(sim, data: Path, sheet: dict, datasheet: str, measured: str) -> list[str]:
    lines = [
        f"`meridian-sim ab --policies fcfs,{POLICY}` on each profile, loads as fractions of that "
        "profile's own stock capacity, the same seeded workload. Each figure is "
        f"{POLICY}'s over fcfs's (below 1: lower with {POLICY}).",
        "",
    ]
    for title, workload, prompts in WORKLOADS:
        a = _cells(sim, data, datasheet, False, workload, prompts)
        b = _cells(sim, data, measured, True, workload, prompts)
        ra, rb = _ratios(a), _ratios(b)
        lines += [
            f"### {title}, {prompts} requests",
            "",
            f"Stock capacity: {a['capacity']:.2f} req/s on the datasheet profile, {b['capacity']:.2f} req/s on "
            "the measured one.",
            "",
            "| load | " + " | ".join(f"{label}: datasheet | measured" for _, label in METRICS) + " |",
            "|---|" + "---|---|" * len(METRICS),
        ]
        for load in LOADS:
            lines.append(f"| {load:.0%} | " + " | ".join(f"{_fmt(ra[load][m])} | {_fmt(rb[load][m])}"
                                                          for m, _ in METRICS) + " |")
        at = 0.9
        moved = [(label, ra[at][m], rb[at][m]) for m, label in METRICS if ra[at][m] and rb[at][m]]
        if moved:
            label, x, y = max(moved, key=lambda t: abs(t[2] / t[1] - 1))
            lines += ["", f"At {at:.0%} load the largest change is in {label}: {_fmt(x)} on the datasheet "
                      f"profile, {_fmt(y)} on the measured one ({y / x - 1:+.0%}); "
                      + "; ".join(f"{lab} {_fmt(p)} vs {_fmt(q)}" for lab, p, q in moved if lab != label) + "."]
        per_load = []
        for load in LOADS:
            split = [label for m, label in METRICS
                     if ra[load][m] and rb[load][m] and _direction(ra[load][m]) != _direction(rb[load][m])]
            per_load.append(f"{load:.0%}: " + (", ".join(split) if split else "none"))
        lines += ["", "Effects whose direction (lower, higher, or within 5% of fcfs) the two profiles disagree "
                  "on, by load: " + "; ".join(per_load) + ". Where they disagree the twin's verdict depends on "
                  "the cost model, and only a real engine can settle it.", ""]
    return lines


def _direction(ratio: float) -> str:
    return "lower" if ratio < 0.95 else "higher" if ratio > 1.05 else "even"
