"""Paired statistics for the real-engine A/B: headline effects with intervals that resolve.

In each round every configuration runs the same seed, so request `index` i of a round has
the same prompt, lengths and arrival time under each: requests are paired across
configurations. The headline effect of num over den (say hook / stock p99 TTOT) is the
q-quantile of num's values pooled over all rounds over the same quantile of den's, with a
percentile-bootstrap interval that resamples rounds and, within each chosen round, request
indices, the same indices on both sides, widened for the few rounds it resampled
(`run_spread_factor`). Pairing cancels how much requests differ from one
another (one prompt is long, another short), which is most of their spread, and leaves the
configurations' difference on each request: the interval measures the effect, not the mix.

Pairing cannot cancel how one whole run differs from another. Under queueing a run is one
draw of a bursty process: the same stock engine measured twice in one round (an A/A run,
`stock-again`) differed by 18-32% at 90% load, with request-level intervals that excluded 1.
That spread shows only between rounds, and a bootstrap over R rounds sees R draws of it: it
under-states it (by (R-1)/R in variance) and its percentiles take no account of how few
draws there are. So the interval is widened, in log space about the point, by
t(R-1)/z * sqrt(R/(R-1)) (the few-clusters correction of a cluster bootstrap: 2.17x at 3
rounds, 1.34x at 6), and one round gives no interval at all: its effect is shown with the
within-run interval beside it and cannot be met, missed or called harm.

Quantiles are nearest-rank, as the load tester's summaries take them, so a point estimate
here equals the figure a run's summary would give for the same requests. A tail is quoted
only when at least 5 requests set it (`tail_for`); shares get Wilson intervals, which
resolve long before tails do. Verdicts are the project's three words: "met" when
the whole interval lies past the target, "missed" when it lies wholly short, else
"unresolved". Pure stdlib, so the page can be rebuilt anywhere."""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

MET, MISSED, UNRESOLVED, HARM = "met", "missed", "unresolved", "harm"

#: Quantiles a page may quote as a tail, highest first.
TAILS = (0.99, 0.95, 0.90, 0.50)
#: The fewest requests that may set a quoted quantile: below that, "p99" is one request.
MIN_TAIL_REQUESTS = 5

# --- Metrics: getters over one request dict (None: the request did not reach it) ---------


def ttft(r: dict) -> float | None:
    return r.get("ttft")


def ttfo(r: dict) -> float | None:
    return r.get("ttfo")


def ttot(r: dict) -> float | None:
    return r.get("think_to_output")


def e2e(r: dict) -> float | None:
    return r.get("e2e")


def answer_gap(r: dict) -> float | None:
    """The largest gap between visible answer chunks: the stall a reader sees."""
    return r.get("max_output_gap")


def answer_itl(r: dict) -> list[float] | None:
    """Every gap between visible answer chunks: a per-token metric. Pooling concatenates
    the requests' lists, and the bootstrap resamples requests (each with its whole list),
    since one request's gaps share its fate (a long prefill stalls them together)."""
    return r.get("output_itl")


METRICS = {"TTFT": ttft, "TTFO": ttfo, "TTOT": ttot, "end-to-end": e2e,
           "largest answer gap": answer_gap, "answer ITL": answer_itl}

# --- Paired data --------------------------------------------------------------------------


@dataclass(frozen=True)
class Paired:
    """One metric for one workload x load: config -> round -> request index -> the
    request's values (one for a per-request metric, its list for a per-token one), and
    how many requests each config ran, so a page can say how many it kept."""

    values: dict[str, dict[int, dict[int, tuple[float, ...]]]]
    sent: dict[str, int]

    def matched(self, num: str, den: str) -> list[list[tuple[tuple[float, ...], tuple[float, ...]]]]:
        """Per round both configs ran, (num's values, den's values) of every request index
        that has the metric under both: a request only one side reached is dropped from
        this pair, not from others."""
        a, b = self.values.get(num, {}), self.values.get(den, {})
        out = []
        for rnd in sorted(a.keys() & b.keys()):
            common = sorted(a[rnd].keys() & b[rnd].keys())
            if common:
                out.append([(a[rnd][i], b[rnd][i]) for i in common])
        return out


def pair_requests(runs: dict[str, dict[int, list[dict]]], metric, *, keep_failed: bool = False) -> Paired:
    """`runs` is {config: {round: [request dicts]}} for one workload x load; `metric` a
    getter over a request dict or, for a metric that needs the round (an SLO against the
    round's unloaded run), over (request, round) when it has `needs_round` set. Failed
    requests are left out unless `keep_failed` (an SLO counts them as missing it)."""
    values: dict = {}
    sent: dict = {}
    for config, rounds in runs.items():
        for rnd, requests in rounds.items():
            sent[config] = sent.get(config, 0) + len(requests)
            kept = values.setdefault(config, {}).setdefault(rnd, {})
            for r in requests:
                if not (r.get("ok") or keep_failed):
                    continue
                v = metric(r, rnd) if getattr(metric, "needs_round", False) else metric(r)
                if v is not None:
                    kept[r["index"]] = tuple(v) if isinstance(v, (list, tuple)) else (float(v),)
    return Paired(values, sent)


def read_requests(path: Path) -> list[dict]:
    """The requests of a load-test result file, plain or gzipped (`.json.gz`, as kept)."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            return json.load(f)["runs"][0]["requests"]
    return json.loads(path.read_text())["runs"][0]["requests"]


def read_runs(raw_dir: Path, workload: str, load: float) -> dict[str, dict[int, list[dict]]]:
    """{config: {round: requests}} from measure's raw files,
    `{workload}-{load:g}-{round}-{config}.json` (or `.json.gz`)."""
    prefix = f"{workload}-{load:g}-"
    out: dict = {}
    for f in sorted([*raw_dir.glob(f"{prefix}*.json"), *raw_dir.glob(f"{prefix}*.json.gz")]):
        rnd, _, config = f.name[len(prefix):].split(".json")[0].partition("-")
        if rnd.isdigit() and config:
            out.setdefault(config, {})[int(rnd)] = read_requests(f)
    return out


# --- Quantiles and the tail rule ----------------------------------------------------------


def nearest_rank(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values, nearest-rank (the load tester's definition)."""
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def quotable(q: float, n: int) -> bool:
    """Whether at least 5 of n values lie at or beyond the q-quantile. Rounded, since
    (1 - 0.9) * 50 is 4.999... in floating point."""
    return round((1 - q) * n, 9) >= MIN_TAIL_REQUESTS


def tail_for(n: int, wanted: float = 0.99) -> float | None:
    """The highest of p99, p95, p90, p50 (none above `wanted`) that n values can set."""
    return next((q for q in TAILS if q <= wanted and quotable(q, n)), None)


# --- The paired bootstrap -----------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A paired effect with its bootstrap interval. `q` is the quantile compared, or the
    statistic's name ("mean", "share difference", "share ratio"); `n_values` counts what
    was pooled on each side (tokens for answer ITL, else requests)."""

    point: float
    low: float
    high: float
    n_requests: int
    n_rounds: int
    q: float | str
    n_values: int
    #: The bootstrap interval before widening for the rounds' count: what the requests
    #: of these runs alone allow (the only interval a single round has).
    within_low: float = math.nan
    within_high: float = math.nan

    @property
    def quotable(self) -> bool:
        return isinstance(self.q, str) or quotable(self.q, self.n_values)

    def text(self) -> str:
        """"0.60 (0.52-0.71)"; a single round's "0.60 (one run: 0.55-0.65)", its interval
        only the requests' spread within that run. A bound beyond 100x either way reads
        "over 100" or "under 0.01": two rounds widened for their count
        (`run_spread_factor`, t with one degree of freedom) on a ratio whose stock side
        is near zero reach millions, a figure that says only "no bound"."""
        shown = _bound if self.q != "share difference" else (lambda x: f"{x:.2f}")
        if self.run_aware:
            return f"{self.point:.2f} ({shown(self.low)}-{shown(self.high)})"
        return f"{self.point:.2f} (one run: {shown(self.within_low)}-{shown(self.within_high)})"

    @property
    def run_aware(self) -> bool:
        """Whether the interval carries run-to-run spread (two rounds or more): only
        then may a verdict read it."""
        return not (math.isnan(self.low) or math.isnan(self.high))


#: Beyond these a ratio's interval bound is shown as a bound, not a figure (`Estimate.text`).
SHOWN_RATIO = (0.01, 100.0)


def _bound(x: float) -> str:
    if x > SHOWN_RATIO[1]:
        return f"over {SHOWN_RATIO[1]:.0f}"
    if 0 < x < SHOWN_RATIO[0]:
        return f"under {SHOWN_RATIO[0]:.2f}"
    return f"{x:.2f}"


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (0.5 < p < 1), by bisection on its CDF; the CDF integrates the
    density with Simpson's rule over [0, t]. Stdlib only, so the page builds anywhere;
    accurate to 1e-6, far below what an interval's second decimal shows."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"need 0.5 < p < 1 and df >= 1, not p={p!r}, df={df!r}")
    return _t_quantile(p, df)


@functools.lru_cache(maxsize=None)
def _t_quantile(p: float, df: int) -> float:
    norm = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def density(x: float) -> float:
        return norm * (1 + x * x / df) ** (-(df + 1) / 2)

    def cdf(t: float, steps: int = 2000) -> float:
        h = t / steps
        inner = sum((4 if i % 2 else 2) * density(i * h) for i in range(1, steps))
        return 0.5 + h / 3 * (density(0) + inner + density(t))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, 2 * hi
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def run_spread_factor(rounds: int, confidence: float = 0.9) -> float | None:
    """How much wider (in log space) an interval bootstrapped over `rounds` resampled
    rounds must be to carry run-to-run spread: t(rounds - 1) over z at the confidence,
    times sqrt(rounds / (rounds - 1)) for the bootstrap's variance shortfall. None for one
    round: a single run pair cannot tell an effect from how runs differ."""
    if rounds < 2:
        return None
    p = 1 - (1 - confidence) / 2
    return t_quantile(p, rounds - 1) / statistics.NormalDist().inv_cdf(p) * math.sqrt(rounds / (rounds - 1))


def _widen(point: float, low: float, high: float, factor: float, log_scale: bool) -> tuple[float, float]:
    """The interval [low, high] stretched `factor` times about `point` (in log space for a
    ratio, so 0.5x and 2x stay symmetric; linearly for a difference)."""
    if log_scale and point > 0 and low > 0:
        return (point * min(1.0, low / point) ** factor, point * max(1.0, high / point) ** factor)
    return (point - factor * max(0.0, point - low), point + factor * max(0.0, high - point))


def _pooled(rounds, side: int) -> list[float]:
    return [v for rnd in rounds for pair in rnd for v in pair[side]]


def _estimate(pairs: Paired, num: str, den: str, stat, q, resamples: int, seed: int,
              confidence: float, log_scale: bool = True) -> Estimate | None:
    """`stat(num's pooled values, den's)` on the data, and its percentile interval over
    bootstrap samples: rounds with replacement, then each chosen round's request pairs
    with replacement, so num and den always see the same requests; then widened for the
    rounds' count (`run_spread_factor`; NaN bounds for a single round)."""
    rounds = pairs.matched(num, den)
    a, b = _pooled(rounds, 0), _pooled(rounds, 1)
    point = stat(a, b) if a and b else None
    if point is None:
        return None
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        sample = [rng.choices(rnd, k=len(rnd)) for rnd in rng.choices(rounds, k=len(rounds))]
        a_s, b_s = _pooled(sample, 0), _pooled(sample, 1)
        v = stat(a_s, b_s) if a_s and b_s else None
        if v is not None:  # a draw whose denominator came out 0 says nothing of the ratio
            draws.append(v)
    draws.sort()
    tail = (1 - confidence) / 2
    low, high = (nearest_rank(draws, tail), nearest_rank(draws, 1 - tail)) if draws else (math.nan, math.nan)
    factor = run_spread_factor(len(rounds), confidence)
    run_low, run_high = (math.nan, math.nan) if factor is None or not draws else _widen(point, low, high, factor,
                                                                                          log_scale)
    return Estimate(point, run_low, run_high, sum(map(len, rounds)), len(rounds), q, min(len(a), len(b)), low, high)


def _ratio(x: float, y: float) -> float | None:
    return x / y if y > 0 else None


def paired_ratio(pairs: Paired, q: float | str, num: str, den: str, *, resamples: int = 2000, seed: int = 0,
                 confidence: float = 0.9) -> Estimate | None:
    """The headline effect: num's q-quantile over den's, each pooled over every round,
    with a paired bootstrap interval. q="mean" gives the ratio of means (over the same
    requests, so also the ratio of totals: tokens, time). None when nothing pairs."""
    if isinstance(q, str) and q != "mean" or not isinstance(q, str) and not 0 < q <= 1:
        raise ValueError(f"q must be a quantile in (0, 1] or 'mean', not {q!r}")
    if q == "mean":
        def stat(a, b):
            return _ratio(statistics.fmean(a), statistics.fmean(b))
    else:
        def stat(a, b):
            return _ratio(nearest_rank(sorted(a), q), nearest_rank(sorted(b), q))
    return _estimate(pairs, num, den, stat, q, resamples, seed, confidence)


def round_ratios(pairs: Paired, q: float, num: str, den: str) -> list[float]:
    """Each round's own q-quantile ratio, num over den, on the requests both reached (the
    values of a per-token metric pooled within the round)."""
    out = []
    for matched in pairs.matched(num, den):
        a = sorted(x for va, _ in matched for x in va)
        b = sorted(x for _, vb in matched for x in vb)
        if a and b:
            r = _ratio(nearest_rank(a, q), nearest_rank(b, q))
            if r is not None and math.isfinite(r):
                out.append(r)
    return out


def beyond_every_round(pooled: float, per_round: list[float], margin: float = 1.05) -> bool:
    """Whether a ratio of quantiles pooled over rounds lies beyond every round's own (by
    more than `margin`): the pooled quantile fell between clusters of rounds that stood
    at different loads (one side's median in its fast rounds' values, the other's in its
    slow rounds'), so the pooled figure says something no round does."""
    if len(per_round) < 2 or not math.isfinite(pooled):
        return False
    return pooled > margin * max(per_round) or pooled * margin < min(per_round)


# --- Verdicts ----------------------------------------------------------------------------


def verdict(interval, target: float, better: str = "lower") -> str:
    """"met" when the whole interval (anything with .low and .high) lies on the good side
    of the target, the target itself included ("ratio <= 0.5" is met by high == 0.5);
    "missed" when it lies wholly on the bad side; else "unresolved" (as for the NaN bounds
    of a single round)."""
    if better == "lower":
        return MET if interval.high <= target else MISSED if interval.low > target else UNRESOLVED
    if better == "higher":
        return MET if interval.low >= target else MISSED if interval.high < target else UNRESOLVED
    raise ValueError(f"better must be 'lower' or 'higher', not {better!r}")


@dataclass(frozen=True)
class Harm:
    word: str  # "met", "harm" or "unresolved"
    decided_by: str  # the metric that settled it


def do_no_harm(intervals: dict[str, Estimate | None], bound: float = 1.05) -> Harm:
    """Over ratios where lower is better (config / stock): "harm" when some interval lies
    wholly above `bound` (decided by the one furthest above), "met" when every interval
    lies at or below it (decided by the one that came closest), else "unresolved" (by the
    one reaching highest; an unmeasured metric cannot show it does no harm)."""
    measured = {k: v for k, v in intervals.items() if v is not None}
    harmful = {k: v for k, v in measured.items() if v.run_aware and v.low > bound}
    if harmful:
        return Harm(HARM, max(harmful, key=lambda k: harmful[k].low))
    unmeasured = [k for k, v in intervals.items() if v is None]
    if unmeasured or not measured:
        return Harm(UNRESOLVED, unmeasured[0] if unmeasured else "nothing measured")
    if not all(v.run_aware for v in measured.values()):
        return Harm(UNRESOLVED, "a single round (no interval carries run-to-run spread)")
    closest = max(measured, key=lambda k: measured[k].high)
    return Harm(MET if measured[closest].high <= bound else UNRESOLVED, closest)


# --- Shares -------------------------------------------------------------------------------


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


def paired_share_change(pairs: Paired, num: str, den: str, kind: str = "difference", *, resamples: int = 2000,
                        seed: int = 0, confidence: float = 0.9) -> Estimate | None:
    """num's share minus den's ("difference") or over it ("ratio"), on the same requests,
    with the paired bootstrap's interval."""
    if kind == "difference":
        def stat(a, b):
            return statistics.fmean(a) - statistics.fmean(b)
    elif kind == "ratio":
        def stat(a, b):
            return _ratio(statistics.fmean(a), statistics.fmean(b))
    else:
        raise ValueError(f"kind must be 'difference' or 'ratio', not {kind!r}")
    return _estimate(pairs, num, den, stat, f"share {kind}", resamples, seed, confidence,
                     log_scale=kind == "ratio")


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
