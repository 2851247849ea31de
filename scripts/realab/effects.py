"""One configuration against stock on the same requests: the paired effects on every
user-felt metric (`stats.py`), bootstrapped once and shared by the page
(`policies.py`) and the README's summary (`readme.py`), and the throughput ratios
beside them."""

from __future__ import annotations

from pathlib import Path

from . import stats as S

#: The metrics of the "do no harm" verdict and of the table, lower is better for each.
PER_REQUEST = ["TTFT", "TTFO", "TTOT", "end-to-end", "largest answer gap", "answer ITL"]


#: Effects already bootstrapped, by (raw dir, workload, load, config, resamples, rounds):
#: the page and the README summary read the same ones (the page's worker processes hand
#: theirs back into it: `policies._each_set`).
EFFECTS: dict[tuple, tuple] = {}


def effects_of(raw_dir: Path, workload: str, load: float, runs: dict, config: str, resamples: int) -> tuple:
    # The rounds are part of the key: a load's rounds that stood at it are judged apart.
    key = (raw_dir, workload, load, config, resamples, tuple(sorted(runs.get("stock", {}))))
    if key not in EFFECTS:
        EFFECTS[key] = effects(runs, config, resamples)
    return EFFECTS[key]


def effects(runs: dict, config: str, resamples: int,
            base: str = "stock") -> tuple[dict[str, tuple], dict[str, S.Estimate | None]]:
    """Per metric, `config` over `base`: (p50 estimate, tail estimate, the tail, requests
    paired); and the estimates the harm verdict reads."""
    out: dict[str, tuple] = {}
    judged: dict[str, S.Estimate | None] = {}
    for name in PER_REQUEST:
        pairs = S.pair_requests(runs, S.METRICS[name])
        rounds = pairs.matched(config, base)
        n = sum(len(r) for r in rounds)
        tail = S.round_tail(rounds)
        # Per-token ITL: each bootstrap resample re-sorts every token; fewer resamples.
        k = max(200, resamples // 5) if name == "answer ITL" else resamples
        p50 = S.paired_ratio(pairs, 0.5, config, base, resamples=k)
        high = S.paired_ratio(pairs, tail, config, base, resamples=k) if tail and tail > 0.5 else None
        out[name] = (p50, high, tail, n)
        judged[f"{name} p50"] = p50
        if high is not None:
            judged[f"{name} p{round(100 * tail)}"] = high
    return out, judged


def throughput(data: dict, workload: str, load: float, config: str, rounds: set[int] | None = None) -> list[float]:
    """Token throughput over stock's, per round both ran (of `rounds`, when given)."""
    by = {(r["round"], r["config"]): r["summary"]["total_token_throughput"] for r in data["runs"]
          if r["workload"] == workload and r["load"] == load and (rounds is None or r["round"] in rounds)}
    return [by[(rnd, config)] / by[(rnd, "stock")] for (rnd, c) in sorted(by) if c == config
            and (rnd, "stock") in by and by[(rnd, "stock")] > 0]


def plain_effects(table: dict[str, tuple]) -> tuple[list[str], list[str]]:
    """(costs, gains): the metrics whose whole (run-aware) interval lies above 1.05 or
    below 0.95."""
    costs, gains = [], []
    for name, (p50, high, tail, _n) in table.items():
        for label, e in (("p50", p50), (f"p{round(100 * tail)}" if tail else "", high)):
            if e is None:
                continue
            text = f"{name} {label} {e.point:.2f}x ({e.low:.2f}-{e.high:.2f})"
            if not e.run_aware:  # one round: no interval that carries how runs differ
                continue
            if e.low > 1.05:
                costs.append(text)
            elif e.high < 0.95:
                gains.append(text)
    return costs, gains


def policies_of(data: dict) -> dict[str, str | None]:
    """The hook policy of each config (runs measured before configs named their policy:
    the workload's `hook_policy` for `hook`)."""
    out: dict[str, str | None] = {}
    fallback = {w["name"]: w.get("hook_policy") for w in data["setup"]["workloads"]}
    for r in data["runs"]:
        policy = r.get("policy")
        if policy is None and r["config"] == "hook":
            policy = fallback.get(r["workload"])
        out[r["config"]] = policy
    return out
