"""Where a hooked engine's later starts come from, request by request (issue 27).

    python -m realab startcost SET_DIR CONFIG WORKLOAD LOAD OUT_MD [ROUNDS]

For one configuration of a kept set (`hook`, `hook-output-first`, ...) at one workload and
load: each request's wait for its first token (its TTFT, from its send time) is laid over
its own engine's step trace, and the share of the steps in that wait whose prompt tokens
the policy capped (`prefill_cap` in the trace) is set beside the request's TTFT over the
same request's under stock in the same round. Requests are grouped by that share. Then,
for every capped step, how long the request that had waited longest to start had been
waiting then: what a policy that lifts its limits for starts waiting past a target would
have kept of its capping. ROUNDS (comma-separated) narrows the rounds (default: all).

Times: a request was sent `sent_at` seconds after its run's window opened (the harness's
clock, the step trace's clock); the load tester's own start lies a few tens of
milliseconds after that, which is small beside waits of seconds. A request's wait is
counted from its send, so the delivery path's share of it is in it."""

from __future__ import annotations

import bisect
import json
import math
import shlex
import statistics
import sys
from pathlib import Path

from . import regime as R
from . import sets
from . import stats as S

#: Bins of the capped share of a request's wait, [low, high).
SHARE_BINS = ((0.0, 0.001), (0.001, 0.05), (0.05, 0.15), (0.15, 0.3), (0.3, 1.01))
#: Start targets the second table is read at, seconds.
TARGETS = (0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0)


def exposures(runs: dict, steps: dict[tuple, list[dict]], config: str, key_of) -> list[dict]:
    """Per request of `config` paired with stock's in its round: its TTFT, stock's, and the
    capped share of the steps during its wait. `steps`: {run key: its steps}; `key_of(round)`
    the run key of `config`'s run in that round."""
    out = []
    for rnd, requests in sorted(runs.get(config, {}).items()):
        stock = {r["index"]: r for r in runs.get("stock", {}).get(rnd, []) if r.get("ok") and r.get("ttft")}
        trace = steps.get(key_of(rnd))
        window = trace[0]["_t0"] if trace else None
        if not trace or window is None:
            continue
        times = [s["t"] for s in trace]  # in trace order, which is time order
        for r in requests:
            base = stock.get(r["index"])
            if not (r.get("ok") and r.get("ttft") and base):
                continue
            start = window + r["sent_at"]
            during = trace[bisect.bisect_left(times, start):bisect.bisect_right(times, start + r["ttft"])]
            capped = sum(1 for s in during if s.get("prefill_cap") is not None)
            out.append({"round": rnd, "ttft": r["ttft"], "stock_ttft": base["ttft"],
                        "capped_share": capped / len(during) if during else 0.0})
    return out


def oldest_waits(runs: dict, steps: dict[tuple, list[dict]], config: str, key_of) -> list[float]:
    """For every capped step of `config`'s runs: how long the request that had waited
    longest for its first token (sent, no first token yet) had been waiting (0: none)."""
    waits = []
    for rnd, requests in sorted(runs.get(config, {}).items()):
        trace = steps.get(key_of(rnd))
        if not trace:
            continue
        t0 = trace[0]["_t0"]
        pending = [(t0 + r["sent_at"], t0 + r["sent_at"] + r["ttft"]) for r in requests if r.get("ttft")]
        for s in trace:
            if s.get("prefill_cap") is None:
                continue
            ages = [s["t"] - a for a, b in pending if a <= s["t"] < b]
            waits.append(max(ages, default=0.0))
    return waits


def capped_step_share(steps: dict[tuple, list[dict]], budget: int, least: int = 10) -> list[float]:
    """What a capped step costs beside a full one: within each run, for every context and
    batch bucket with at least `least` steps of each kind, the median time of a step that
    computed a capped chunk of one prompt over that of a step that computed a full chunk
    (nine tenths of the budget or more), each beside the same requests decoding."""
    out = []
    for trace in steps.values():
        buckets: dict[tuple, dict[str, list[float]]] = {}
        for s in trace:
            if s.get("prefill_reqs") != 1 or not s.get("step_s"):
                continue
            cap = s.get("prefill_cap")
            if cap is not None and cap > 0 and s["prefill_tokens"] == cap:
                kind = "capped"
            elif cap is None and s["prefill_tokens"] >= 0.9 * budget:
                kind = "full"
            else:
                continue
            key = (min(s.get("prefill_context", 0) // 1024, 3), min(s.get("decode_reqs", 0) // 4, 3))
            buckets.setdefault(key, {}).setdefault(kind, []).append(s["step_s"])
        for kinds in buckets.values():
            if len(kinds.get("capped", [])) >= least and len(kinds.get("full", [])) >= least:
                out.append(statistics.median(kinds["capped"]) / statistics.median(kinds["full"]))
    return out


def read(set_dir: Path, config: str, workload: str, load: float, rounds: set[int] | None):
    """(counted runs, every request of each run, {run key: its steps}, run key of a round):
    the requests counted leave the warm-up out, as the page does; every request, warm-up
    included, was waiting to start while it waited."""
    data = json.loads((set_dir / "results.json").read_text())

    def narrowed(runs: dict) -> dict:
        return runs if rounds is None else {c: {k: v for k, v in by.items() if k in rounds} for c, by in runs.items()}

    counted = narrowed(sets.read(set_dir / "raw", workload, load)[0])
    every = narrowed(S.read_runs(set_dir / "raw", workload, load))
    wanted = {R.run_key(r): r["window"][0] for r in data["runs"]
              if r["config"] == config and r.get("workload") == workload and r.get("load") == load
              and r.get("window") and (rounds is None or r.get("round") in rounds)}
    steps: dict[tuple, list[dict]] = {}
    for key, st in R.run_steps(set_dir, data):
        if key in wanted:
            steps.setdefault(key, []).append({**st, "_t0": wanted[key]})
    return counted, every, steps, lambda rnd: (config, workload, load, rnd)


def geometric_mean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def page(set_dir: Path, config: str, workload: str, load: float, rows: list[dict], waits: list[float],
         command: str, shares: list[float] = ()) -> str:
    rounds = sorted({r["round"] for r in rows})
    lines = [f"# Where later starts come from: `{config}`, {workload} at {load * 100:.0f}% load",
             "",
             f"Generated by `python -m realab startcost` from set `{set_dir.name}` of "
             "[every policy on a real engine](policies-real-engine.md) "
             f"(rounds {', '.join(map(str, rounds))}; the first 10% of each run left out, as on that page). "
             "Each request's wait for its first token is laid over its own engine's step trace; the share of "
             "the steps in that wait whose prompt tokens the policy capped is set beside its TTFT over the same "
             "request's under stock in the same round. Requests that waited longer also waited through busier "
             "stretches, so the groups differ in load as well as in capping: read the first row (no capped step "
             "in the wait) as the hooked path's own cost to a start, and the rest as what the capping came with.",
             "", "```", command, "```", "",
             "| capped share of the wait | requests | TTFT over stock's, median | geometric mean | stock's TTFT, median |",
             "|---|---:|---:|---:|---:|"]
    for lo, hi in SHARE_BINS:
        group = [r for r in rows if lo <= r["capped_share"] < hi]
        label = "none" if hi <= 0.001 else f"{lo * 100:.1f}%-{min(hi, 1.0) * 100:.0f}%"
        if not group:
            lines.append(f"| {label} | 0 | - | - | - |")
            continue
        ratios = [r["ttft"] / r["stock_ttft"] for r in group]
        lines.append(f"| {label} | {len(group)} | {statistics.median(ratios):.2f} | {geometric_mean(ratios):.2f} | "
                     f"{statistics.median(r['stock_ttft'] for r in group):.2f} s |")
    lines += ["", f"Capped steps: {len(waits)}. The request that had waited longest for its first token had "
              "been waiting, at each of them:", "",
              "| start target | capped steps within it (kept by a policy that lifts its limits past it) |",
              "|---:|---:|"]
    for target in TARGETS:
        kept = sum(1 for w in waits if w <= target) / len(waits) if waits else float("nan")
        lines.append(f"| {target:g} s | {kept * 100:.0f}% |")
    if shares:
        lines += ["", "What a capped step costs: within each run, at the same context (by 1,024 tokens) and the "
                  "same count of decoding requests (by 4), a step computing a capped chunk of one prompt took "
                  f"{statistics.median(shares):.2f}x the time of a step computing a full chunk (median over "
                  f"{len(shares)} run and bucket pairs with ten steps or more of each; "
                  f"{min(shares):.2f}-{max(shares):.2f}), for half the prompt tokens or less: the step's other "
                  "costs are paid for fewer of them, so a capped engine takes in prompts more slowly."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    if len(argv) not in (5, 6):
        raise SystemExit(__doc__)
    set_dir, config, workload, load, out = Path(argv[0]), argv[1], argv[2], float(argv[3]), Path(argv[4])
    rounds = {int(x) for x in argv[5].split(",") if x} if len(argv) == 6 else None
    counted, every, steps, key_of = read(set_dir, config, workload, load, rounds)
    rows = exposures(counted, steps, config, key_of)
    if not rows:
        raise SystemExit(f"{set_dir}: no {config} request at {workload} {load:g} with a kept step trace")
    command = "cd scripts && python3 -m realab startcost " + shlex.join(argv)
    data = json.loads((set_dir / "results.json").read_text())
    budget = int(data["setup"]["engine"].get("max_num_batched_tokens", 256))
    out.write_text(page(set_dir, config, workload, load, rows, oldest_waits(every, steps, config, key_of), command,
                        capped_step_share(steps, budget)))
    print(f"wrote {out}", file=sys.stderr)
