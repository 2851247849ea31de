"""What a load's section reads from its engines' step traces, beside the requests' own
figures: how often each hooked policy capped a step's prompt tokens, whom each engine
preempted, and where the answers' stalls came from (`stalls`)."""

from __future__ import annotations

from . import stalls


def load_lines(data: dict, limits: dict[tuple, tuple[int, int]] | None,
               stall_counts: dict[str, dict[str, int]] | None, workload: str, load: float, configs: list[str],
               policies: dict[str, str | None]) -> list[str]:
    """The section's sentences on its engines, summed over every round of the load."""
    return (limits_lines(limits, workload, load, configs, policies)
            + preemption_lines(data, workload, load, configs)
            + stalls.page_lines(stall_counts or {}, ["stock", *configs]))


def limits_lines(limits: dict[tuple, tuple[int, int]] | None, workload: str, load: float, configs: list[str],
                 policies: dict[str, str | None]) -> list[str]:
    """The page's sentence on how often each hooked configuration's policy capped a step's
    prompt tokens at this load, run by run (`regime.limited_steps`): where the shipped
    default (slo-driven) capped none, it scheduled as stock did, and whatever separates
    it from stock is the hooked engine's own cost or the run's."""
    if not limits:
        return []
    parts = []
    for config in configs:
        runs = sorted((key[3], a, b) for key, (a, b) in limits.items()
                      if key[0] == config and key[1] == workload and key[2] == load and b)
        if runs:
            parts.append(f"{config} " + ", ".join("none" if not a else "under 1%" if a / b < 0.005 else
                                                  f"{100 * a / b:.0f}%" for _, a, b in runs)
                         + f" (round{'s' if len(runs) > 1 else ''} {', '.join(str(r) for r, _, _ in runs)})")
    if not parts:
        return []
    return ["", "Steps whose prompt tokens the hook's policy capped (its limits in force; `regime.limited_steps`), "
            "share of each run's steps: " + "; ".join(parts) + "."
            + (" slo-driven caps nothing while the engine's smoothed step time stays under its target: a run "
               "where it capped none scheduled exactly as stock." if "slo-driven" in
               {policies.get(c) for c in configs} else "")]


def preemption_lines(data: dict, workload: str, load: float, configs: list[str]) -> list[str]:
    """The page's sentence on whom each engine preempted at this load, from the step
    trace's counts over each run (`engine` in the results: every preemption, and those of
    a request already answering, the victims a reader notices); empty when no engine
    preempted. Under KV pressure this is what a think-first victim rule can change."""
    by_config: dict[str, list[int]] = {}
    for r in data["runs"]:
        e = r.get("engine") or {}
        if r["workload"] == workload and r["load"] == load and r["config"] in ("stock", *configs) and "preempted" in e:
            total = by_config.setdefault(r["config"], [0, 0, 0])
            total[0] += e["preempted"]
            total[1] += e.get("preempted_output", 0)
            total[2] += 1
    if not any(t[0] for t in by_config.values()):
        return []
    return ["", "Preemptions (the engine's step trace, summed over the runs counted here): "
            + "; ".join(f"{c} {t[0]:,} in {t[2]} run{'s' if t[2] > 1 else ''}, {t[1]:,} of them answering"
                        for c, t in ((c, by_config[c]) for c in ("stock", *configs) if c in by_config)) + "."]
