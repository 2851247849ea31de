"""The twin beside the measurement on the policies page (issue 27, item 6): per
configuration and metric, the measured paired ratio, the twin's on the rig (at one pace,
and at each run's own pace), whether they agree, and each card's forecast with the rig's
residual as its error bar; how often each policy capped a step, engine and twin; and
what delivery does to TTOT that the twin cannot show. Reads what `forecast` wrote under
each set's `twin/`."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from . import stats as S
from .forecast import PACED

#: Every section's count of agreement, by (set, workload, load): (agreed, judged) for the
#: twin at one pace and at the runs' own paces; the page sums them (`tally_lines`).
TALLIES: dict[tuple[str, str, float], tuple[int, int, int, int]] = {}

#: A prediction agrees with a measured effect when it lies inside the measured interval
#: or within this relative distance of the measured point.
TOLERANCE = 0.25


def agrees(measured: S.Estimate, predicted: float) -> bool:
    inside = measured.low <= predicted <= measured.high
    return inside or abs(predicted / measured.point - 1) <= TOLERANCE if measured.point > 0 else inside


def resolved(e: S.Estimate | None) -> bool:
    """An effect the measurement resolves: its whole interval on one side of 1 (never a
    single round's, whose interval cannot carry run-to-run spread)."""
    return e is not None and (e.low > 1 or e.high < 1)


def bar(forecast: float, residual: float) -> tuple[float, float]:
    """The forecast's error bar: from the twin's figure to the figure moved by the
    rig's residual (measured over predicted on the rig, same metric and quantile)."""
    moved = forecast * residual
    return min(forecast, moved), max(forecast, moved)


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.3f}" if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f}-{hi:.3f}"


def capacity_clause(caps: list[dict]) -> str:
    """The twin's capacity beside stock's measured one, over the rounds: each round is
    replayed against the capacity of the machine it ran on (`forecast.machine_capacity`),
    by that machine's twin (the fit at its pace: `forecast.calibrate`)."""
    measured = [c.get("machine_capacity") or c.get("measured_capacity") for c in caps]
    if not caps or any(m is None for m in measured):
        return ""
    where = " on the rounds' machines" if len(set(f"{m:.3f}" for m in measured)) > 1 else ""
    return (f" (twin {_span([c['rig_capacity'] for c in caps])} req/s against {_span(measured)} measured{where}: "
            "replayed at the run's own send times, the twin would stand at another load, where queues and every "
            "policy's effect differ)")


def machines_clause(machines: dict | None) -> str:
    """How the fit met a set measured on several machines (`forecast.calibrate`): each
    machine's steps at its own pace, and the twin of each round at its machine's; empty
    for one machine."""
    paces = sorted((machines or {}).get("paces", {}).values())
    if len(paces) < 2:
        return ""
    return (f"; the set ran on {len(paces)} invocations' machines, whose stock engines stepped "
            f"{paces[0]:.2f}-{paces[-1]:.2f}x as long as the reference machine's (`forecast.reference_work`): each machine's steps were divided by its "
            "pace before the fit, and each round replays on its machine's twin (the fit times that pace)")


def spread_clause(spread: dict | None) -> str:
    """How the twin's steps vary around the fit (`meridian-sim calibrate`'s spread of the
    stock engine's steps), for the page's account of the twin; none: every step of one
    shape takes one time."""
    if not spread:
        return "; every step of one shape takes the fitted time"
    at = dict(zip(spread["probabilities"], spread["quantiles"]))
    return ("; each step's time varied around the fit as the stock engine's did, a draw from its measured "
            f"spread: median {at[0.5]:.2f}x, p90 {at[0.9]:.2f}x, p99 {at[0.99]:.2f}x the fitted time, "
            f"mean {spread['mean']:.2f}x")


def section(set_dir: Path, workload: str, load: float, measured: dict[str, tuple], runs: dict,
            decode_s: float | None, resamples: int = 200,
            limits: dict[tuple, tuple[int, int]] | None = None,
            sat_out: dict[tuple, tuple[int, int]] | None = None) -> list[str]:
    """The page's lines for one workload x load: per configuration and metric, the
    measured paired ratio, the twin's on the rig (the same requests), whether they
    agree, and each card's forecast with the rig's residual as its error bar. `measured`
    is the page's own {config: {metric: (p50, tail estimate, tail, n)}}, `runs` the
    measured requests it read them from, `decode_s` the rig's decode step of one request
    (the set's step shape), below which a TTOT is delivery's doing (`delivery_lines`);
    `limits`: the measured runs' capped steps (`regime.limited_steps`), set beside the
    twin's (`capping_lines`); `sat_out`: the measured runs' running requests that sat
    steps out (`regime.Readings.sat_out`), set beside the twin's (`sitting_lines`)."""
    from .sets import read

    twin_dir = set_dir / "twin"
    if not (twin_dir / "forecast.json").exists():
        return []
    summary = json.loads((twin_dir / "forecast.json").read_text())
    rig_runs, _ = read(twin_dir / "rig", workload, load)
    if "stock" not in rig_runs:
        return []
    paced_runs = paced_side(twin_dir, rig_runs, workload, load)
    # A configuration is read at its runs' paces only where every round it has on the
    # rig has its pace: otherwise its paced ratio would pair other rounds than the rest.
    paced_configs = {c for c, rounds in paced_runs.items() if set(rounds) == set(rig_runs.get(c, {}))}
    cards = {slug: c["label"] for slug, c in summary.get("cards", {}).items() if (twin_dir / slug).is_dir()}
    card_runs = {slug: read(twin_dir / slug, workload, load)[0] for slug in cards}
    labels = " and ".join(cards.values()) or "GPU"
    cal = json.loads((twin_dir / "calibration.json").read_text()) if (twin_dir / "calibration.json").exists() else {}
    fit = cal.get("fit", cal)
    caps = [v for k, v in summary["rounds"].items() if k.startswith(f"{workload}-{load:g}-")]
    capacities = "; ".join(f"{label} {caps[0]['capacity'][slug]:.2f} req/s" for slug, label in cards.items()
                           if caps and slug in caps[0].get("capacity", {}))
    lines = [f"#### The twin beside the measurement, and its {labels} forecast", "",
             "The twin (`meridian-sim replay`), calibrated on this rig's stock engine (its step traces"
             + (f"; fit over {fit['samples']:,} steps: median error {fit['median_abs_pct_error']:.1f}%, "
               f"`{fit['formula']}`" if "median_abs_pct_error" in fit else "")
             + machines_clause(cal.get("machines"))
             + spread_clause(cal.get("spread"))
             + "), replays each round's requests (the lengths the engine reported) under each configuration's "
             "policy, their send times rescaled so the load is the same fraction of the twin's capacity as the run's "
             "was of stock's measured capacity (on the run's own machine: `speed.standings`)"
             + capacity_clause(caps)
             + "; the same paired statistics read it. *Agrees*: the twin's ratio lies inside "
             f"the measured interval or within {TOLERANCE:.0%} of the measured point; judged only where the "
             f"measurement resolves the effect (its interval wholly on one side of 1). Each forecast replays the "
             f"same requests on that card's profile measured in [the GPU step-time curve](gpu-step-curve.md) with a "
             f"{summary['gpu_budget']:,}-token budget: prompts {summary['prompt_scale']:g}x as long (the same "
             "count of chunks), thoughts and answers as they were, send times rescaled to the same fraction of "
             "that card's twin capacity"
             + (f" (twin capacity: {capacities})" if caps and capacities else "")
             + ". Its bracket runs from the twin's figure to that figure times the rig's residual (measured over "
             "predicted, same metric and quantile): a forecast, not a measurement. *At the run's pace*: the same "
             "replay with every step of the twin as much slower (or faster) as that run's engine stepped against "
             "the same round's stock run (`forecast.run_paces`; stock's own replay is the same at both): what "
             "the twin's schedule predicts given the speed each engine really ran at, which tests the twin's "
             "scheduling apart from the rig's run-to-run pace; no forecast uses it.", "",
             "| configuration | metric | measured | twin on the rig | agrees | twin at the run's pace | agrees | "
             + " | ".join(f"{label} forecast [bracket]" for label in cards.values()) + " |",
             "|---|---|---:|---:|---|---:|---|" + "---:|" * len(cards)]
    misses, paced_misses = [], []
    per_config: dict[str, list[int]] = {}  # config: [agreed, judged]
    paced_tally = [0, 0]  # [agreed, judged]
    # Each metric paired once per side: the pairing reads every configuration's requests.
    rig_pairs = {metric: S.pair_requests(rig_runs, S.METRICS[metric]) for metric in S.METRICS}
    paced_pairs = ({metric: S.pair_requests(paced_runs, S.METRICS[metric]) for metric in S.METRICS}
                   if "stock" in paced_runs else {})
    card_pairs = {slug: {metric: S.pair_requests(runs, S.METRICS[metric]) for metric in S.METRICS}
                  for slug, runs in card_runs.items()}
    for config, table in measured.items():
        if config not in rig_runs:
            continue
        for metric, (p50, high, tail, _n) in table.items():
            for q, m in ((0.5, p50), (tail, high)):
                if m is None or not q:
                    continue
                t = S.paired_ratio(rig_pairs[metric], q, config, "stock", resamples=resamples)
                if t is None:
                    continue
                label = f"{metric} p{round(100 * q)}"
                verdict = "not resolved"
                p = (S.paired_ratio(paced_pairs[metric], q, config, "stock", resamples=resamples)
                     if paced_pairs and config in paced_configs else None)
                paced_verdict = "not resolved" if p is not None else "-"
                if resolved(m):
                    ok = agrees(m, t.point)
                    tally = per_config.setdefault(config, [0, 0])
                    tally[0] += ok
                    tally[1] += 1
                    verdict = "yes" if ok else "**no**"
                    if not ok:
                        misses.append(f"{config} {label} (measured {m.point:.2f}, twin {t.point:.2f})")
                    if p is not None:
                        paced_ok = agrees(m, p.point)
                        paced_tally[0] += paced_ok
                        paced_tally[1] += 1
                        paced_verdict = "yes" if paced_ok else "**no**"
                        if not paced_ok:
                            paced_misses.append(f"{config} {label} (measured {m.point:.2f}, twin at its pace "
                                                f"{p.point:.2f})")
                forecasts = []
                for slug in cards:
                    g = (S.paired_ratio(card_pairs[slug][metric], q, config, "stock", resamples=resamples)
                         if config in card_runs[slug] else None)
                    if g is None:
                        forecasts.append("-")
                        continue
                    lo, hi = bar(g.point, m.point / t.point if t.point > 0 else 1.0)
                    forecasts.append(f"{g.point:.2f} [{lo:.2f}-{hi:.2f}]")
                paced_cell = f"{p.point:.2f}" if p is not None else "-"
                lines.append(f"| {config} | {label} | {m.text()} | {t.point:.2f} | {verdict} | {paced_cell} | "
                             f"{paced_verdict} | " + " | ".join(forecasts) + " |")
    agreed, judged = (sum(col) for col in zip(*per_config.values())) if per_config else (0, 0)
    TALLIES[(set_dir.name, workload, load)] = (agreed, judged, *paced_tally)
    lines += ["", f"The twin agrees with {agreed} of the {judged} effects the measurement resolves"
              + (f" (by configuration: {', '.join(f'{c} {a} of {n}' for c, (a, n) in per_config.items())})"
                 if per_config else "")
              + (f"; it misses {'; '.join(misses)}." if misses else ".")
              + " A configuration whose rig effects the twin misses more often than it meets has no credible "
              "GPU forecast yet: its bracket says how far off the twin was, not where the GPU will be.", ""]
    lines += pace_lines(summary.get("paces", {}), workload, load, paced_tally, paced_misses)
    lines += capping_lines(limits or {}, twin_capped(twin_dir / "rig", workload, load), workload, load)
    lines += sitting_lines(sat_out or {}, twin_sat_out(twin_dir / "rig", workload, load), workload, load)
    if decode_s:
        lines += delivery_lines(runs, rig_runs, decode_s)
    return lines


def tally_lines(tallies: dict[tuple[str, str, float], tuple[int, int, int, int]],
                rigs: dict[str, str] | None = None) -> list[str]:
    """The page's count of where the twin meets the measured effects, over every set and
    load, at one pace and at the runs' own paces; with `rigs` ({set: the rig it ran, in
    words}), the same counted by rig, since a rig unlike a GPU host's (a delivery path
    starved of its core) makes effects no engine schedule, and so no twin, makes."""
    judged = {k: v for k, v in tallies.items() if v[1]}
    if not judged:
        return []
    agreed, total, paced_agreed, paced_total = (sum(col) for col in zip(*judged.values()))

    def summed(key) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for k, v in sorted(judged.items()):
            acc = out.setdefault(key(k[0]), [0, 0, 0, 0])
            for i in range(4):
                acc[i] += v[i]
        return out

    def cell(name: str, a: int, n: int, pa: int, pn: int) -> str:
        return f"{name} {a} of {n}" + (f" ({pa} of {pn} at the runs' paces)" if pn else "")

    by_set = summed(lambda s: s)
    cells = "; ".join(cell(f"set {name.split('-')[0]}", *v)
                      for name, v in sorted(by_set.items(), key=lambda kv: int(kv[0].split("-")[0])))
    by_rig = ""
    if rigs:
        def rig_of(set_name: str) -> str:
            return rigs.get(set_name, "a rig not recorded")

        groups = summed(rig_of)
        sets_of: dict[str, set[int]] = {}
        for set_name, _w, _l in judged:
            sets_of.setdefault(rig_of(set_name), set()).add(int(set_name.split("-")[0]))
        by_rig = " By rig: " + "; ".join(
            cell(f"{rig} (set{'s' if len(sets_of[rig]) > 1 else ''} {', '.join(map(str, sorted(sets_of[rig])))})", *v)
            for rig, v in sorted(groups.items(), key=lambda kv: min(sets_of[kv[0]]))) + "."
    return ["**The twin against the measurement, over every set.** Of the effects the measurements resolve, the "
            f"twin at one pace (as it forecasts a GPU) meets {agreed} of {total}; replayed at each run's own pace "
            f"(`forecast.run_paces`), {paced_agreed} of the {paced_total} it has paces for. By set: {cells}.{by_rig} "
            "An effect the twin meets only at the runs' paces was made by how fast each run's engine stepped "
            "(the rig's run-to-run pace, the hook's own cost per step, or step shapes the twin's fit prices "
            "wrong), not by the schedule, which is what a GPU forecast carries; each set's section names them.", ""]


def rig_words(data: dict, regime: str) -> str:
    """A set's rig as the twin's tally groups it: the regime (`coverage.regime_of`) and,
    on the GPU-shaped rig, whether vLLM's engine core polled its worker as on a GPU host
    or spun on the core the delivery path (API server, proxy, load tester) shares."""
    if regime != "GPU-shaped":
        return f"the {regime} rig"
    polls = str(data["setup"]["engine"].get("engine_core_polls", "False")) == "True"
    return ("the GPU-shaped rig, engine core polling (a GPU host's delivery path)" if polls
            else "the GPU-shaped rig, engine core spinning on the delivery path's core")


def paced_side(twin_dir: Path, rig_runs: dict, workload: str, load: float) -> dict:
    """The replays at each run's own pace ({config: {round: requests}}), stock's being its
    replays at one pace (its pace is 1 by definition); empty where there are none."""
    from .sets import read

    if not (twin_dir / PACED).is_dir():
        return {}
    paced = read(twin_dir / PACED, workload, load)[0]
    return {"stock": rig_runs["stock"], **paced} if paced else {}


def pace_lines(paces: dict[str, float], workload: str, load: float, tally: list[int],
               misses: list[str]) -> list[str]:
    """What each run's own pace says of the twin's misses: every configuration's paces
    over the rounds (against the round's stock run), and how many resolved effects the
    twin meets when it replays each run at its pace."""
    prefix = f"{workload}-{load:g}-"
    by_config: dict[str, list[float]] = {}
    for name, pace in paces.items():
        rnd, _, config = name[len(prefix):].partition("-") if name.startswith(prefix) else ("", "", "")
        if rnd.isdigit() and config and config != "stock":
            by_config.setdefault(config, []).append(pace)
    if not by_config:
        return []
    cells = "; ".join(f"{c} {min(v):.2f}-{max(v):.2f} over {len(v)} run{'s' if len(v) > 1 else ''}"
                      if len(v) > 1 else f"{c} {v[0]:.2f} (1 run)" for c, v in sorted(by_config.items()))
    agreed, judged = tally
    return ["**Each run's own pace.** How much longer each run's decode steps took than the same round's stock "
            f"run's (median over its decode-only steps, each against the twin's fit): {cells}. Replayed at those "
            f"paces, the twin agrees with {agreed} of the {judged} resolved effects it has paces for"
            + (f"; it misses {'; '.join(misses)}" if misses else "")
            + ". Where the paced twin meets an effect the twin at one pace misses, the effect was made by how "
            "fast each run's engine stepped, not by the schedule the twin models: the rig's run-to-run pace, the "
            "hook's own cost per step, or step shapes the twin's fit prices wrong, which a configuration whose "
            "runs stepped faster or slower than stock's in every round points to.", ""]


def _replay_counts(rig_dir: Path, workload: str, load: float, count) -> dict[str, dict[int, tuple[int, int]]]:
    """{config: {round: count(head)}} over the replays in `rig_dir` (files named as the
    measured runs) whose head `count` reads (None: a replay written before the twin
    counted it, left out)."""
    prefix = f"{workload}-{load:g}-"
    out: dict = {}
    for f in sorted(rig_dir.glob(f"{prefix}*.json.gz")):
        rnd, _, config = f.name[len(prefix):].split(".json")[0].partition("-")
        if not rnd.isdigit() or not config:
            continue
        with gzip.open(f, "rt") as fh:
            counted = count(json.load(fh))
        if counted is not None:
            out.setdefault(config, {})[int(rnd)] = counted
    return out


def twin_capped(rig_dir: Path, workload: str, load: float) -> dict[str, dict[int, tuple[int, int]]]:
    """{config: {round: (steps the twin ran under its policy's prefill cap, steps)}} from
    the replays in `rig_dir`; replays written before the twin counted them are left out."""
    return _replay_counts(rig_dir, workload, load, lambda head: (
        (int(head["prefill_capped_steps"]), int(head["steps"]))
        if "prefill_capped_steps" in head and head.get("steps") else None))


def twin_sat_out(rig_dir: Path, workload: str, load: float) -> dict[str, dict[int, tuple[int, int]]]:
    """{config: {round: (running requests that sat a step out, running requests)}} summed
    over the twin's steps (`request_steps` of its replays in `rig_dir`); replays written
    before the twin counted them are left out."""
    def count(head: dict) -> tuple[int, int] | None:
        steps = head.get("request_steps") or {}
        return (int(steps["sat_out"]), int(steps["running"])) if steps.get("running") else None
    return _replay_counts(rig_dir, workload, load, count)


def _pooled(measured: dict[tuple, tuple[int, int]], twin: dict[str, dict[int, tuple[int, int]]],
            workload: str, load: float):
    """(config, measured share, twin share, rounds) for each configuration, its counts
    pooled over the rounds both sides have, where either side counted any."""
    for config, by_round in twin.items():
        mine = {key[3]: v for key, v in measured.items()
                if key[0] == config and key[1] == workload and key[2] == load and v[1]}
        both = sorted(set(mine) & set(by_round))
        if not both:
            continue
        m_part, m_all = (sum(mine[r][i] for r in both) for i in (0, 1))
        t_part, t_all = (sum(by_round[r][i] for r in both) for i in (0, 1))
        if (m_part or t_part) and m_all and t_all:
            yield config, m_part / m_all, t_part / t_all, len(both)


def _directions(shares: list[tuple], floor: float = 0.0) -> tuple[list[str], list[str]]:
    """The configurations whose twin share is over a tenth above the measured one, and
    those over a tenth below (within a tenth, or within `floor` of it, neither way is
    claimed)."""
    more = [c for c, m, t, _ in shares if t > 1.1 * m and t - m >= floor]
    fewer = [c for c, m, t, _ in shares if t < m / 1.1 and m - t >= floor]
    return more, fewer


def _rounds(n: int) -> str:
    return f"{n} round{'s' if n > 1 else ''}"


def capping_lines(measured: dict[tuple, tuple[int, int]], twin: dict[str, dict[int, tuple[int, int]]],
                  workload: str, load: float) -> list[str]:
    """How often each policy capped a step's prompt tokens, in the engine and in the twin
    on the same requests, pooled over the rounds both have: a policy that switches on the
    engine's step time (slo-driven) acts only as often as its steps run slow, so a twin
    whose steps run faster than the engine's protects less often and predicts smaller
    effects, costs included."""
    shares = list(_pooled(measured, twin, workload, load))
    if not shares:
        return []
    parts = [f"{c} {m:.1%} measured, {t:.1%} in the twin ({_rounds(n)})" for c, m, t, n in shares]
    more, fewer = _directions(shares)
    verdict = []
    if more:
        verdict.append(f"the twin caps more often than the engine did for {', '.join(more)}, so there it "
                       "over-predicts what capping costs (the starts it delays) as well as what it gains")
    if fewer:
        verdict.append(f"the twin caps less often than the engine did for {', '.join(fewer)}, so there it "
                       "under-predicts what capping costs (the starts it delays) as well as what it gains")
    if not verdict:
        verdict.append("the twin caps about as often as the engine did (within a tenth) for every policy")
    return ["**How often the policy protected, engine and twin.** Steps run under the policy's prefill cap, "
            "pooled over the rounds both sides have (the engine's step traces; the twin's replays of the same "
            "requests): " + "; ".join(parts) + ". A policy that caps only while steps run slow (slo-driven) "
            "acts as often as its engine's steps are slow: " + "; ".join(verdict) + ".", ""]


#: How far apart (a share of the running requests) the twin's and the engine's counts of
#: requests sitting steps out must be before the page says which way the twin errs.
SITTING_FLOOR = 0.01


def sitting_lines(measured: dict[tuple, tuple[int, int]], twin: dict[str, dict[int, tuple[int, int]]],
                  workload: str, load: float) -> list[str]:
    """How often a running request sat a step out (an answer paced to its reader, a
    thinker past the think cap, a prompt in a step that computes none), in the engine and
    in the twin on the same requests, pooled over the rounds both have: a twin that holds
    requests out more often than the hook did over-states what holding costs (the blocks
    a held answer keeps, the steps it waits) as well as what it gains."""
    shares = list(_pooled(measured, twin, workload, load))
    if not shares:
        return []
    parts = [f"{c} {m:.1%} measured, {t:.1%} in the twin ({_rounds(n)})" for c, m, t, n in shares]
    # A share of a few requests in a thousand moves by a tenth with a handful of them.
    more, fewer = _directions(shares, floor=SITTING_FLOOR)
    verdict = []
    if more:
        verdict.append(f"the twin holds requests out more often than the hook did for {', '.join(more)}, so "
                       "there it over-states what holding costs (the KV blocks a held answer keeps, the steps "
                       "it waits) as well as what it gains")
    if fewer:
        verdict.append(f"the twin holds requests out less often than the hook did for {', '.join(fewer)}, so "
                       "there it under-states what holding costs as well as what it gains")
    if not verdict:
        verdict.append("the twin holds requests out about as often as the hook did (within a tenth, or a "
                       "point of the running requests)")
    return ["**How often running requests sat steps out, engine and twin.** Of the running requests summed "
            "over the steps, those that computed nothing (an answer paced to its reader, a thinker past the "
            "think cap, a prompt in a step that computes none, or one the step's budget did not reach), "
            "pooled over the rounds both sides have (the engine's step traces: `running` against the "
            "requests a step scheduled; the twin's replays of the same requests): " + "; ".join(parts)
            + ": " + "; ".join(verdict) + ".", ""]


def late_thought_shares(runs: dict[str, dict[int, list[dict]]], floor_s: float) -> dict[str, tuple[float, int]]:
    """{config: (share, requests)}: the share of requests whose think-to-answer gap is
    shorter than `floor_s`, over the requests that have one."""
    out = {}
    for config, rounds in runs.items():
        gaps = [g for reqs in rounds.values() for r in reqs if (g := S.ttot(r)) is not None]
        if gaps:
            out[config] = (sum(g < floor_s for g in gaps) / len(gaps), len(gaps))
    return out


def delivery_lines(measured: dict, twin: dict, floor_s: float) -> list[str]:
    """What the twin cannot show about TTOT: two engine steps lie between a request's
    last thought token and its first answer token (the step sampling the closing
    delimiter, which shows nothing, and the next), so an engine cannot make that gap
    shorter than one decode step; measured, some are, because the API server delivered
    the last thought token late (vLLM merges the outputs a stream's reader has not yet
    taken). The twin delivers every token at its step's end."""
    seen = late_thought_shares(measured, floor_s)
    modelled = late_thought_shares(twin, floor_s)
    if not seen:
        return []
    stock = seen.get("stock", (0.0, 0))[0]
    above = [c for c, (share, _n) in seen.items() if c != "stock" and share > stock]
    cells = "; ".join(f"{c} {share:.1%} of {n}" for c, (share, n) in seen.items())
    twin_max = max((share for share, _n in modelled.values()), default=0.0)
    return ["**Delivery, which the twin does not model.** Two engine steps lie between a request's last thought "
            "token and its first answer token (the step that samples the closing delimiter, which shows nothing, "
            f"and the next), so no engine schedule makes that gap (TTOT) shorter than one decode step of one "
            f"request on this rig ({floor_s * 1000:.1f} ms at the median). Measured at the client, this share of "
            f"requests had a shorter TTOT: {cells}; in the twin at most {twin_max:.1%}. Such a gap is the last "
            "thought token arriving late, with or just before the first answer token (vLLM's API server merges "
            "the outputs a stream's reader has not yet taken), not the answer arriving sooner"
            + (f"; it happens more often than with stock in {len(above)} of {len(seen) - 1} other configurations "
               f"({', '.join(above)})" if above and len(seen) > 1 else "")
            + ". A TTOT ratio measured at the client carries this delivery effect and the twin's does not; TTFO, "
            "counted from the request's start, does not carry it.", ""]
