"""Shares of requests that pass a test (an answer stalled, an SLO met), with intervals
that carry how rounds differ, and the capacity at which a share meeting an SLO falls below
its target.

A share resolves long before a tail does: 90 requests a run give a share a few points
wide, where their p99 is one request. But a run's requests share its machine's pace and
bursts, so they are not independent draws: the interval is Wilson's, widened by the
rounds' own spread (`clustered_wilson`). The 0/1 metrics here (`stalled`,
`answer_only_slo`, `whole_request_slo`) feed `stats.pair_requests`, then `share_of` or
`stats.paired_share_change`. Pure stdlib, as `stats` is."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

from .stats import Paired, t_quantile


@dataclass(frozen=True)
class Share:
    point: float
    low: float
    high: float
    successes: int
    n: int


def wilson(successes: int, n: int, confidence: float = 0.9) -> Share | None:
    """The Wilson score interval of a binomial share: unlike the normal approximation it
    stays inside [0, 1] and is honest at 0 or n successes, where SLO shares often sit."""
    if n <= 0:
        return None
    z = statistics.NormalDist().inv_cdf((1 + confidence) / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At 0 or n successes the bound is exactly 0 or 1; say so rather than 1 - 1e-16.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Share(p, low, high, successes, n)


def clustered_wilson(per_round: list[tuple[int, int]], confidence: float = 0.9) -> Share | None:
    """The Wilson interval of a share pooled over rounds, [(successes, requests)] one per
    round, widened for rounds that differ by more than their requests show.

    Why: the requests of one run share its machine's pace and its bursts, so they are
    not independent draws. At 70% load set 7's stock met the whole-request SLO in 87% to
    99% of a run's requests, round by round: a binomial interval over all of them (±2
    points) claims a precision the rounds do not have. The pooled share's variance is
    taken as the larger of the binomial one and the cluster-robust one over the rounds
    (k/(k-1) x the summed squared residuals of each round's successes from the pooled
    share, over n squared); their ratio, the design effect, shrinks n for Wilson's
    formula. Its critical value moves from z towards Student's t with k-1 degrees of
    freedom as the rounds' share of the variance grows (1 - 1/design effect): that
    variance rests on k rounds, not on n requests. Rounds that agree leave Wilson's
    interval as it was."""
    rounds = [(s, n) for s, n in per_round if n > 0]
    n = sum(k for _, k in rounds)
    if n <= 0:
        return None
    successes = sum(s for s, _ in rounds)
    p = successes / n
    z = statistics.NormalDist().inv_cdf((1 + confidence) / 2)
    k = len(rounds)
    if k < 2 or p in (0.0, 1.0):
        return wilson(successes, n, confidence)
    between = k / (k - 1) * sum((s - p * m) ** 2 for s, m in rounds) / n ** 2
    effect = max(1.0, between / (p * (1 - p) / n))
    t = t_quantile((1 + confidence) / 2, k - 1)
    c2 = z * z + (t * t - z * z) * (1 - 1 / effect)
    m = n / effect
    centre = (p + c2 / (2 * m)) / (1 + c2 / m)
    half = math.sqrt(c2) / (1 + c2 / m) * math.sqrt(p * (1 - p) / m + c2 / (4 * m * m))
    return Share(p, max(0.0, centre - half), min(1.0, centre + half), successes, n)


def share_of(pairs: Paired, config: str, confidence: float = 0.9, rounds=None) -> Share | None:
    """The share of `config`'s requests whose 0/1 value is 1, over every round (or over
    `rounds` only: stock's share on the rounds another configuration ran), with an
    interval that carries how the rounds differ (`clustered_wilson`)."""
    per_round = []
    for rnd, values in pairs.values.get(config, {}).items():
        if rounds is None or rnd in rounds:
            flags = [v for vs in values.values() for v in vs]
            per_round.append((round(sum(flags)), len(flags)))
    return clustered_wilson(per_round, confidence)


def stalled(threshold_s: float = 0.25):
    """A 0/1 metric: the answer's largest gap exceeded the threshold. None for an answer
    with no gap (under two visible tokens), as the load tester's `stalled_answers` counts.
    For `pair_requests` then `share_of` / `paired_share_change`."""
    def flag(r: dict) -> float | None:
        gap = r.get("max_output_gap")
        return None if gap is None else float(gap > threshold_s)
    return flag


# --- SLOs ---------------------------------------------------------------------------------


def _answer_met(r: dict, ttot_s: float, gap_s: float) -> bool:
    """TTOT and the largest answer gap within limits, as the load tester's SLOs judge
    them: no TTOT passes only for a request that did not think, no gap only for an
    answer of one visible token; an answer never begun fails."""
    if not r.get("ok") or r.get("ttfo") is None:
        return False
    think = r.get("usage_think_tokens")
    think = r.get("client_think_tokens", 0) if think is None else think
    t, gap = r.get("think_to_output"), r.get("max_output_gap")
    ttot_ok = think == 0 if t is None else t <= ttot_s
    return ttot_ok and (gap is None or gap <= gap_s)


def answer_only_slo(ttot_s: float = 0.25, gap_s: float = 0.25):
    """A 0/1 metric: the SLO on what the policy targets alone (today's goodput SLO)."""
    def flag(r: dict) -> float:
        return float(_answer_met(r, ttot_s, gap_s))
    return flag


@dataclass(frozen=True)
class WholeRequestSlo:
    """An SLO over the whole request, start and answer. A request meets it when it
    succeeded, its TTFT is at most `start_factor` x the same request's TTFT unloaded plus
    `start_allowance_s`, its TTFO likewise against its unloaded TTFO, and its TTOT and
    largest answer gap are within `ttot_s` and `gap_s`.

    Why relative starts: prompts and thoughts differ in length, so no single TTFT or
    TTFO limit is fair to all. Against its own time alone a request may take twice as
    long (a slowdown of 2: as long again in queues and shared steps as it needs alone,
    the usual way to scale a latency SLO to each request), and the allowance keeps a
    short request (50 ms alone) from failing over delays no reader notices; 250 ms is
    also the answer stall threshold. The answer limits are today's answer-only SLO, so
    a policy cannot pass this one by moving delay from the answer into the start, nor
    the other way round.

    `reference_scale` stretches (or shrinks) the request's time alone by how much slower
    (or faster) the machine ran the loaded round than the reference (`slo.pace_scales`):
    the yardstick is the request alone at the speed the round ran at."""

    start_factor: float = 2.0
    start_allowance_s: float = 0.25
    ttot_s: float = 0.25
    gap_s: float = 0.25
    reference_scale: float = 1.0

    def met(self, r: dict, alone: dict | None) -> bool | None:
        """None when the unloaded reference cannot judge the request (it failed there)."""
        if alone is None or not alone.get("ok") or alone.get("ttft") is None or alone.get("ttfo") is None:
            return None
        if not _answer_met(r, self.ttot_s, self.gap_s):
            return False
        limit = self.start_factor * self.reference_scale
        return all(r.get(k) is not None and r[k] <= limit * alone[k] + self.start_allowance_s
                   for k in ("ttft", "ttfo"))


def whole_request_slo(unloaded: dict[int, list[dict]] | list[dict],
                      slo: WholeRequestSlo | dict[int, WholeRequestSlo] = WholeRequestSlo()):
    """A 0/1 metric for `pair_requests(..., keep_failed=True)`: the request met `slo`
    against the same index in `unloaded`, the same seed's requests run one at a time
    ({round: requests}, each round having its own seed, or one list for every round).
    `slo` may differ by round ({round: slo}; a round without one is not judged): every
    configuration of a round is judged by the same one, so pairs stay fair."""
    by_round = {rnd: {r["index"]: r for r in reqs} for rnd, reqs in
                (unloaded.items() if isinstance(unloaded, dict) else [(None, unloaded)])}

    def flag(r: dict, rnd: int) -> float | None:
        alone = by_round.get(rnd, by_round.get(None, {})).get(r["index"])
        judge = slo.get(rnd) if isinstance(slo, dict) else slo
        met = None if judge is None else judge.met(r, alone)
        return None if met is None else float(met)
    flag.needs_round = True
    return flag


# --- Capacity at an SLO -------------------------------------------------------------------


@dataclass(frozen=True)
class LoadPoint:
    load: float  # fraction of stock capacity
    rate: float  # requests per second offered
    share: Share  # share meeting the SLO there


@dataclass(frozen=True)
class Capacity:
    """The load (and rate) where the share meeting the SLO first falls below the target,
    interpolated; `conservative` / `optimistic` redo it on the shares' interval low /
    high ends. `beyond` says the sweep never reached it ("above": every load met it, so
    the figures are lower bounds at the highest load; "below": the lowest load missed,
    so load and rate are None)."""

    load: float | None
    rate: float | None
    conservative: float | None
    optimistic: float | None
    beyond: str | None


def _crossing(points: list[LoadPoint], share, target: float) -> tuple[float, float] | None:
    """(load, rate) where share(point) first drops below target, linear between the
    bracketing loads; the highest load when it never does; None when the lowest misses.
    The first crossing, not the last: a share that recovers at a higher load is noise."""
    if share(points[0]) < target:
        return None
    for p0, p1 in itertools.pairwise(points):
        s0, s1 = share(p0), share(p1)
        if s1 < target:
            f = (s0 - target) / (s0 - s1)
            return p0.load + f * (p1.load - p0.load), p0.rate + f * (p1.rate - p0.rate)
    return points[-1].load, points[-1].rate


def capacity_at_slo(points: list[LoadPoint], target: float = 0.95) -> Capacity:
    points = sorted(points, key=lambda p: p.load)
    mid = _crossing(points, lambda p: p.share.point, target)
    low = _crossing(points, lambda p: p.share.low, target)
    high = _crossing(points, lambda p: p.share.high, target)
    beyond = "below" if mid is None else "above" if all(p.share.point >= target for p in points) else None
    return Capacity(mid and mid[0], mid and mid[1], low and low[0], high and high[0], beyond)


def capacity_ratio(config: Capacity, stock: Capacity) -> tuple[float, float, float] | None:
    """(point, low, high) of config's capacity over stock's; None when either lies below
    the sweep (one beyond its top enters as a lower bound: check `beyond`). Loads are
    fractions of the same stock capacity, so their ratio is the rates' ratio. The bounds
    pair one's conservative end with the other's optimistic one; a conservative end below
    the sweep counts as 0 (so a high bound is infinite)."""
    if not (config.load and stock.load):
        return None
    low = (config.conservative or 0.0) / stock.optimistic
    high = config.optimistic / stock.conservative if stock.conservative else math.inf
    return config.load / stock.load, low, high
