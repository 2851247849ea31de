"""The whole-request SLO as the every-policy page reads it on a GPU-shaped rig: the start
factor stretched to the H100's yardstick (`regime.shared_step_stretch` at the batch stock
held in each round), and capacity at that SLO across the loads a set was measured at.

Why a separate yardstick: a start under load is mostly the request's own steps shared
with the batch, and on the rig a shared step costs far more than on an H100, so the SLO as
stated (2x the request's time alone) is missed by nearly every request at high load
whatever the scheduler does. Both readings go on the page."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from types import SimpleNamespace

from . import regime as R
from . import shares as SH
from . import stats as S

#: A reference whose median time per output token lies more than this share off the
#: median of its set's references measured the machine, not the request (`off_pace`).
REFERENCE_MARGIN = 0.1


def reference_pace(requests: list[dict]) -> float | None:
    """The median time per output token of an unloaded reference (its requests one at a
    time: each token one decode step of one request and its delivery), the reference's
    pace; None without a request that reported one."""
    tpots = [r["tpot"] for r in requests if r.get("ok") and r.get("tpot")]
    return statistics.median(tpots) if tpots else None


def reference_paces(unloaded: dict[int, list[dict]]) -> dict[int, float]:
    """{round: its reference's pace} for the references that report one."""
    return {rnd: p for rnd, reqs in sorted(unloaded.items()) if (p := reference_pace(reqs)) is not None}


def off_pace(unloaded: dict[int, list[dict]], margin: float = REFERENCE_MARGIN) -> dict[int, float]:
    """{round: its reference's pace over the median pace of the set's references} for the
    references more than `margin` off it, either way. Such a reference was measured while
    the machine ran at another speed than usual: the whole-request SLO would judge its
    round's requests against a yardstick stretched (or shrunk) by that much, so unless its
    round's pace can be matched to it (`pace_scales`) the round is left out of that SLO
    (`judges`). What is usual needs three references
    and most of them within `margin` of their median (`disagreeing` otherwise: then
    none is left out, and the page says the references disagree)."""
    paces = reference_paces(unloaded)
    if len(paces) < 3 or disagreeing(unloaded, margin):
        return {}
    usual = statistics.median(paces.values())
    return {rnd: p / usual for rnd, p in paces.items() if abs(p / usual - 1) > margin}


def disagreeing(unloaded: dict[int, list[dict]], margin: float = REFERENCE_MARGIN) -> bool:
    """True when half or more of the references lie more than `margin` off their median
    pace: the machine had no usual pace while they were measured (set 6's four: two at
    1.7x the other two), so no reference can be told off it."""
    paces = reference_paces(unloaded)
    if len(paces) < 2:
        return False
    usual = statistics.median(paces.values())
    within = sum(abs(p / usual - 1) <= margin for p in paces.values())
    return 2 * within <= len(paces)


#: Fewest paces (loaded stock runs; references) that say what the machine's usual pace is.
MIN_PACES = 3


def fitted_reference_pace(requests: list[dict], fitted) -> float | None:
    """An unloaded reference's pace in the step fit's terms: the median, over its
    requests, of time per answer token over the fit's time for a decode step of that one
    request (its context: prompt, thought and half the answer). Unlike `reference_pace`
    it does not move with how long a round's prompts and thoughts happen to be."""
    paces = [r["tpot"] / fitted({"tokens": 1, "decode_reqs": 1, "decode_context": r.get("prompt_tokens", 0)
                                 + r.get("usage_think_tokens", 0) + r.get("usage_output_tokens", 0) // 2})
             for r in requests if r.get("ok") and r.get("tpot")]
    return statistics.median(paces) if paces else None


def matched_scales(run_paces: dict[tuple[float, int], float],
                   reference_paces: dict[int, float]) -> dict[tuple[float, int], float]:
    """{(load, round): the factor a round's reference is stretched by}: the loaded stock
    run's pace over the usual one at its load (`usual_run_pace`), divided by the
    reference's pace over the usual one (the median of the set's references). Each side
    is read against its own usual pace: a loaded step and a step of one request sit
    differently against the fit, and the delivery path adds to a reference's time per
    token, by the same share every round. Empty below `MIN_PACES` on either side."""
    if len(run_paces) < MIN_PACES or len(reference_paces) < MIN_PACES:
        return {}
    usual = usual_run_pace(run_paces)
    refs = statistics.median(reference_paces.values())
    return {(load, rnd): (p / usual(load)) / (reference_paces[rnd] / refs)
            for (load, rnd), p in sorted(run_paces.items()) if rnd in reference_paces}


#: Fewest distinct loads over which a set's usual run pace is a line in the load.
MIN_LOADS_FOR_TREND = 3


def usual_run_pace(run_paces: dict[tuple[float, int], float]):
    """The pace a loaded stock run usually shows at a load, as a function of the load.
    A run's pace is its decode steps against the twin's step fit, and the fit does not
    sit the same at every load (set 7: the runs at 20-40% ran ~5% faster against it than
    those at 70-90%), so one median over every load would call the low loads' runs fast
    and the high loads' slow, and move every round's factor when a set gains runs at new
    loads. Over `MIN_LOADS_FOR_TREND` or more loads the usual pace is a Theil-Sen line
    (the median of the slopes between runs at different loads; robust to a run the
    machine ran slow), so a run's factor says how far it sits from its own load's usual
    whatever other loads the set holds; over fewer, the median of the runs."""
    points = [(load, p) for (load, _), p in run_paces.items()]
    if len({load for load, _ in points}) < MIN_LOADS_FOR_TREND:
        usual = statistics.median(p for _, p in points)
        return lambda load: usual
    slope = statistics.median((p2 - p1) / (l2 - l1) for i, (l1, p1) in enumerate(points)
                              for l2, p2 in points[i + 1:] if l2 != l1)
    intercept = statistics.median(p - slope * load for load, p in points)
    return lambda load: intercept + slope * load


def pace_scales(set_dir: Path, data: dict, workload: str, unloaded: dict[int, list[dict]],
                by_run: dict[tuple, list[float]] | None) -> dict[tuple[float, int], float]:
    """`matched_scales` for a workload of a kept set: each stock run's pace from its
    engine's step trace (`regime.decode_ratios`, `by_run`), each reference's from its time
    per token (`fitted_reference_pace`), both against the twin's step fit on this rig
    (the profile as it stands, for either side: a run's ratio, read against its own
    machine's fit, is multiplied back by that machine's pace, `regime.run_machines`).
    Why stock's pace judges every configuration of its round: a policy's own cost per
    step would raise its run's pace, and its yardstick must not forgive it (the harness
    re-measures a run off its round's pace: `drift`). Empty without the fit or traces."""
    profile = set_dir / "twin" / "rig-profile.toml"
    fitted = R.decode_step_fit(profile.read_text()) if profile.exists() else None
    if fitted is None or not by_run:
        return {}
    machine = R.run_machines(set_dir, data)
    runs = {(load, rnd): statistics.median(v) * machine.get((config, w, load, rnd), 1.0)
            for (config, w, load, rnd), v in by_run.items()
            if config == "stock" and w == workload and len(v) >= R.MIN_STEPS_PER_RUN}
    refs = {rnd: p for rnd, reqs in unloaded.items() if (p := fitted_reference_pace(reqs, fitted)) is not None}
    return matched_scales(runs, refs)


def judges(unloaded: dict[int, list[dict]], off: dict[int, float],
           scales: dict[int, float]) -> dict[int, SH.WholeRequestSlo]:
    """{round: the whole-request SLO its requests are judged by}: the reference matched to
    its round's pace where both are known (`scales`); else the reference as measured,
    unless it ran off its set's pace (`off`), when the round is not judged at all."""
    return {rnd: SH.WholeRequestSlo(reference_scale=scales[rnd]) if rnd in scales else SH.WholeRequestSlo()
            for rnd in sorted(unloaded) if rnd in scales or rnd not in off}


def held_batch(requests: list[dict], cap: int) -> float | None:
    """The requests a run held at once on average (Little's law over the counted
    requests: their summed end-to-end times over the span from the first send to the
    last finish), at most `cap` (the engine's max_num_seqs: the rest wait outside the
    batch)."""
    done = [r for r in requests if r.get("ok") and r.get("e2e") is not None]
    if not done:
        return None
    span = max(r["sent_at"] + r["e2e"] for r in done) - min(r["sent_at"] for r in done)
    return min(float(cap), sum(r["e2e"] for r in done) / span) if span > 0 else None


def scaled_slos(runs: dict, judged: dict[int, SH.WholeRequestSlo], stretch,
                cap: int) -> dict[int, tuple[float, SH.WholeRequestSlo]]:
    """{round: (batch stock held, its whole-request SLO with the start factor stretched
    for that batch)} for the rounds `judged` (`judges`) that stock ran
    (`regime.shared_step_stretch`)."""
    out = {}
    for rnd in sorted(set(judged) & set(runs.get("stock", {}))):
        batch = held_batch(runs["stock"][rnd], cap)
        if batch is not None:
            base = judged[rnd]
            out[rnd] = (batch, dataclasses.replace(base, start_factor=base.start_factor * stretch(batch)))
    return out


def _ratio_ends(ratio: tuple[float, float, float]) -> str:
    """A capacity ratio's interval; unbounded above when stock's own conservative end lies
    below the loads measured (`shares.capacity_ratio`)."""
    return f"{ratio[1]:.2f}-{ratio[2]:.2f}" if math.isfinite(ratio[2]) else \
        f"at least {ratio[1]:.2f}, no upper end: stock's capacity may lie below the loads measured"


def standing_groups(rounds: list[int], standing: dict | None, workload: str, load: float) -> list[tuple[float, list[int]]]:
    """A load's rounds grouped by the load they stood at on their own machines
    (`speed.standings`, to the nearest `STANDING_BIN`): [(that load, its rounds)]; every
    round at the nominal load where no probe says otherwise."""
    groups: dict[float, list[int]] = {}
    for rnd in rounds:
        s = (standing or {}).get((workload, load, rnd, "stock"))
        at = load if s is None or s.load is None else round(s.load / STANDING_BIN) * STANDING_BIN
        groups.setdefault(at, []).append(rnd)
    return sorted(groups.items())


#: Rounds whose stock runs stood at the same load to this precision make one point of the
#: capacity sweep (rounds of two sent loads that stood at one are two points, each with
#: its own requests' share).
STANDING_BIN = 0.01


def capacity_lines(data: dict, workload: str, by_load: dict[float, tuple[dict, dict]],
                   judged: dict[float, dict[int, SH.WholeRequestSlo]], stretch=None,
                   standing: dict | None = None) -> list[str]:
    """Capacity at the whole-request SLO (`shares.capacity_at_slo`: the load where the
    share meeting it first falls below 95%, linear between the loads measured) for each
    configuration measured at every load with unloaded references, and its ratio to
    stock's. `by_load`: {load: (runs, unloaded)} as `sets.read` gives them; `judged`:
    {load: `judges`}, as the page's sections judge. With `stretch`, the SLO's start is
    H100-scaled as in those sections. With `standing` (`speed.standings`), each point is
    a group of rounds at the load they stood at on their own machines, not the load they
    were sent at: rounds added on a faster machine stood lower. A configuration with a
    point wherever stock has one but not in every round (rounds added later for another
    policy, which may stand at a load of their own) is set against stock's capacity over
    the rounds it ran, so that rounds it never ran cannot move its ratio."""
    loads = sorted(by_load)
    if len(loads) < 2:
        return []
    cap = int(data["setup"]["engine"].get("max_num_seqs", 256))
    #: {config: {(load sent, load stood at): point}}
    points: dict[str, dict[tuple[float, float], SH.LoadPoint]] = {}
    #: {config: {(load sent, load stood at): stock's point over the rounds it ran there}}
    beside: dict[str, dict[tuple[float, float], SH.LoadPoint]] = {}
    sent: dict[float, list[tuple[float, list[int]]]] = {}
    for load in loads:
        every, unloaded = by_load[load]
        if "stock" not in every or not unloaded:
            return []
        slo = ({rnd: judge for rnd, (_, judge) in scaled_slos(every, judged[load], stretch, cap).items()}
               if stretch else judged[load])
        judge = SH.whole_request_slo(unloaded, slo)
        sent[load] = standing_groups(sorted(every["stock"]), standing, workload, load)
        for at, rounds in sent[load]:
            runs = {c: {r: v for r, v in by_round.items() if r in rounds} for c, by_round in every.items()}
            whole = S.pair_requests(runs, judge, keep_failed=True)
            rate = at * data["capacity"][workload]
            stock_all = SH.share_of(whole, "stock")
            for config in runs:
                share = SH.share_of(whole, config) if runs[config] else None
                if share is None:
                    continue
                points.setdefault(config, {})[(load, at)] = SH.LoadPoint(at, rate, share)
                stock_share = stock_all
                mine = sorted(runs[config])
                if mine != sorted(runs["stock"]):
                    # Stock over only the rounds this configuration ran here.
                    alike = {c: {r: v for r, v in by_round.items() if r in mine} for c, by_round in runs.items()}
                    stock_share = SH.share_of(S.pair_requests(alike, judge, keep_failed=True), "stock")
                beside.setdefault(config, {})[(load, at)] = SH.LoadPoint(at, rate, stock_share)
    if "stock" not in points:
        return []
    # Only a configuration with a point at every load stock has one (a load whose rounds
    # all lack unloaded references has none) is swept; where it missed some
    # of stock's rounds it is set against stock over the rounds it ran.
    stock_loads = {load for load, _ in points["stock"]}
    swept = {c: p for c, p in points.items() if {load for load, _ in p} == stock_loads}
    measured = {c: SH.capacity_at_slo(list(p.values())) for c, p in swept.items()}
    partial = {c for c in swept if beside[c] != points["stock"]}
    stock_alike = {c: SH.capacity_at_slo(list(beside[c].values())) for c in partial}

    def text(c: SH.Capacity, at: list[SH.LoadPoint]) -> str:
        shares = ", ".join(f"{100 * p.share.point:.0f}% at {100 * p.load:.0f}%"
                           for p in sorted(at, key=lambda p: p.load))
        if c.beyond == "below":
            return f"below the loads measured ({shares})"
        bound = "at least " if c.beyond == "above" else ""
        low = "below the loads measured" if c.conservative is None else f"{100 * c.conservative:.0f}%"
        return (f"{bound}{100 * c.load:.0f}% of stock capacity, {c.rate:.2f} req/s (interval's ends: {low} to "
                f"{100 * c.optimistic:.0f}%; {shares})")
    kind = "with the H100-scaled start" if stretch else "as stated"
    moved = {load: groups for load, groups in sent.items() if [at for at, _ in groups] != [load]}
    where = (f"the loads the rounds stood at on their own machines (`speed.standings`; sent at "
             + "; ".join(f"{100 * load:.0f}%: " + ", ".join(f"round{'s' if len(r) > 1 else ''} {', '.join(map(str, r))} "
                                                           f"at {100 * at:.0f}%" for at, r in groups)
                         for load, groups in moved.items())
             + "; the others at the load they were sent at)" if moved else
             f"the loads measured ({', '.join(f'{100 * x:.0f}%' for x in loads)})")
    lines = ["", f"**Capacity at the whole-request SLO ({kind}; 95% of requests meeting it), {workload}**, from "
             f"{where}; between them linear, so a sweep this coarse places it roughly:", ""]
    for config in ["stock", *(c for c in data["setup"]["configs"] if c in measured and c != "stock")]:
        stock = stock_alike.get(config, measured["stock"])
        ratio = SH.capacity_ratio(measured[config], stock) if config != "stock" else None
        # Named where stock's own line above includes rounds this configuration never ran.
        on_its_rounds = (f"; stock over the same rounds: {text(stock, list(beside[config].values()))}"
                         if config in partial else "")
        judged_ratio = (f"; {ratio[0]:.2f}x stock's ({_ratio_ends(ratio)}); the target, at least "
                        f"{CAPACITY_TARGET}x stock's: **{S.verdict(SimpleNamespace(low=ratio[1], high=ratio[2]), CAPACITY_TARGET, 'higher')}**"
                        if ratio else "")
        lines.append(f"- {config}: {text(measured[config], list(points[config].values()))}{on_its_rounds}{judged_ratio}.")
    return [*lines, ""]


#: The moonshot: a policy's capacity at the whole-request SLO over stock's.
CAPACITY_TARGET = 1.5

