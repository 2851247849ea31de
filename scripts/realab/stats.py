"""Paired statistics for the real-engine A/B: headline effects with intervals that resolve.

In each round every configuration runs the same seed, so request `index` i of a round has
the same prompt, lengths and arrival time under each: requests are paired across
configurations. The headline effect of num over den (say hook / stock p99 TTOT) is taken
round by round: in each round, the q-quantile of num's values over the same quantile of
den's, on the requests both reached; then the geometric mean of the rounds' ratios (so a
round at 2x and one at 0.5x cancel). Its percentile-bootstrap interval resamples rounds
and, within each chosen round, request indices, the same indices on both sides, and is
widened for the few rounds it resampled (`run_spread_factor`). Pairing cancels how much
requests differ from one another (one prompt is long, another short), which is most of
their spread, and leaves the configurations' difference on each request: the interval
measures the effect, not the mix.

Why per round, not one quantile over every round's values pooled: rounds that ran at
different loads, or on machines of different speed, put each side's values in clusters,
and a pooled quantile can fall in one side's fast rounds and the other's slow ones. On
set 8 a pooled answer ITL p50 read 1.71x while every round's own read 0.76-1.00x. A mean
of the rounds' own ratios always lies within them (a time quantile under
`TIME_FLOOR_S` counts as that floor, so no round's ratio is 0 or undefined). So the tail rule holds round by
round: a round's p99 over 135 requests is its second slowest, not a tail, however many
rounds are averaged, so such a set quotes p95 (set by 7 requests in every round).

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
only when at least 5 requests set it (`tail_for`); shares get Wilson intervals (`shares`), which
resolve long before tails do. Verdicts are the project's three words: "met" when
the whole interval lies past the target, "missed" when it lies wholly short, else
"unresolved". Pure stdlib, so the page can be rebuilt anywhere."""

from __future__ import annotations

import functools
import gzip
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


def round_tail(rounds: list, wanted: float = 0.99) -> float | None:
    """The tail a per-round effect may quote (`Paired.matched`'s rounds): each round's
    quantile stands alone, so the thinnest round decides (`tail_for`)."""
    return tail_for(min(map(len, rounds)), wanted) if rounds else None


def tail_for(n: int, wanted: float = 0.99) -> float | None:
    """The highest of p99, p95, p90, p50 (none above `wanted`) that n values can set."""
    return next((q for q in TAILS if q <= wanted and quotable(q, n)), None)


# --- The paired bootstrap -----------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A paired effect with its bootstrap interval. `q` is the quantile compared, or the
    statistic's name ("mean", "share difference", "share ratio"); `n_values` counts what
    set the figure of the thinnest round, on its thinner side (tokens for answer ITL,
    else requests): each round's quantile is a tail only if that many can set it."""

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


def _each_round(rounds, stat) -> list[float]:
    """`stat(num's values, den's)` of each round on its own; a round where it is undefined
    (a ratio whose denominator is 0) is left out."""
    out = []
    for rnd in rounds:
        a, b = _pooled((rnd,), 0), _pooled((rnd,), 1)
        v = stat(a, b) if a and b else None
        if v is not None and math.isfinite(v):
            out.append(v)
    return out


def _over_rounds(values: list[float], log_scale: bool) -> float | None:
    """The rounds' own effects as one: the geometric mean of ratios (0 if a round's is 0),
    the mean of differences. Each round weighs the same: each is one draw of how a whole
    run goes."""
    if not values:
        return None
    if not log_scale:
        return statistics.fmean(values)
    if min(values) <= 0:
        return 0.0
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _estimate(pairs: Paired, num: str, den: str, stat, q, resamples: int, seed: int,
              confidence: float, log_scale: bool = True) -> Estimate | None:
    """`stat(num's values, den's)` in each round, over the rounds (`_over_rounds`), and its
    percentile interval over bootstrap samples: rounds with replacement, then each chosen
    round's request pairs with replacement, so num and den always see the same requests;
    then widened for the rounds' count (`run_spread_factor`; NaN bounds for a single
    round)."""
    rounds = pairs.matched(num, den)
    point = _over_rounds(_each_round(rounds, stat), log_scale)
    if point is None:
        return None
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        sample = [rng.choices(rnd, k=len(rnd)) for rnd in rng.choices(rounds, k=len(rounds))]
        v = _over_rounds(_each_round(sample, stat), log_scale)
        if v is not None:  # a draw where every round's denominator came out 0 says nothing
            draws.append(v)
    draws.sort()
    tail = (1 - confidence) / 2
    low, high = (nearest_rank(draws, tail), nearest_rank(draws, 1 - tail)) if draws else (math.nan, math.nan)
    factor = run_spread_factor(len(rounds), confidence)
    run_low, run_high = (math.nan, math.nan) if factor is None or not draws else _widen(point, low, high, factor,
                                                                                          log_scale)
    thinnest = min(min(len(_pooled((rnd,), 0)), len(_pooled((rnd,), 1))) for rnd in rounds)
    return Estimate(point, run_low, run_high, sum(map(len, rounds)), len(rounds), q, thinnest, low, high)


def _ratio(x: float, y: float) -> float | None:
    return x / y if y > 0 else None


#: A time quantile below this counts as this: below what the tester's clock tells apart
#: (a median gap of tokens delivered together is 0), so a round where either side's is
#: 0 still has a ratio, a large or a small one, and no round is dropped for it.
TIME_FLOOR_S = 1e-4


def paired_ratio(pairs: Paired, q: float | str, num: str, den: str, *, resamples: int = 2000, seed: int = 0,
                 confidence: float = 0.9) -> Estimate | None:
    """The headline effect: num's q-quantile over den's in each round, their geometric
    mean over the rounds, with a paired bootstrap interval. q="mean" gives each round's
    ratio of means (over the same requests, so also the ratio of totals: tokens, time).
    None when nothing pairs."""
    if isinstance(q, str) and q != "mean" or not isinstance(q, str) and not 0 < q <= 1:
        raise ValueError(f"q must be a quantile in (0, 1] or 'mean', not {q!r}")
    floor = TIME_FLOOR_S
    if q == "mean":
        def stat(a, b):
            return _ratio(max(statistics.fmean(a), floor), max(statistics.fmean(b), floor))
    else:
        def stat(a, b):
            return _ratio(max(nearest_rank(sorted(a), q), floor), max(nearest_rank(sorted(b), q), floor))
    return _estimate(pairs, num, den, stat, q, resamples, seed, confidence)


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
class Settling:
    """How more rounds would settle an unresolved verdict: as `side` ("met" or "harm"),
    by `metric` (whose estimate is `estimate`), after `rounds` in all (None: more than
    `SETTLE_LIMIT`)."""

    side: str
    metric: str
    estimate: "Estimate"
    rounds: int | None

    def text(self) -> str:
        e = self.estimate
        when = (f"about {self.rounds} rounds in all" if self.rounds is not None
                else f"more than {SETTLE_LIMIT} rounds")
        return (f"; at the spread of its {e.n_rounds} rounds, {when} would settle it as {self.side}, by "
                f"{self.metric}, were its point ({e.point:.2f}) the true effect")


@dataclass(frozen=True)
class Harm:
    word: str  # "met", "harm" or "unresolved"
    decided_by: str  # the metric that settled it
    #: For an "unresolved" verdict over rounds: what more rounds would do (`settling`).
    settling: Settling | None = None

    def settle_text(self) -> str:
        return self.settling.text() if self.settling is not None else ""


#: The most rounds `rounds_to_settle` names.
SETTLE_LIMIT = 100


def rounds_to_settle(e: Estimate, bound: float = 1.05, limit: int = SETTLE_LIMIT,
                     confidence: float = 0.9) -> int | None:
    """Rounds in all (these and more like them) at which `e`'s interval would clear `bound`
    (below it for "met", above it for "harm"), were its point the true effect and every
    round as spread as these: the interval's log half-width on the side facing the bound
    scales as `run_spread_factor(n) / sqrt(n)`. A projection of the noise, not a forecast
    of the effect. None: fewer than two rounds, a point on the bound, or more than `limit`."""
    k = e.n_rounds
    if k < 2 or not e.run_aware or e.point <= 0 or e.low <= 0:
        return None
    gap = math.log(bound / e.point)
    if gap == 0:
        return None
    half = math.log(e.high / e.point) if gap > 0 else math.log(e.point / e.low)
    base_factor = run_spread_factor(k, confidence)
    if base_factor is None or half <= 0:
        return None

    def half_at(n: int) -> float:
        factor = run_spread_factor(n, confidence) or base_factor
        return half * (factor / base_factor) * math.sqrt(k / n)

    for n in range(k, limit + 1):
        if half_at(n) < abs(gap):
            return n
    return None


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
    if measured[closest].high <= bound:
        return Harm(MET, closest)
    return Harm(UNRESOLVED, closest, settling(measured, bound))


def settling(measured: dict[str, Estimate], bound: float = 1.05) -> Settling | None:
    """What more rounds would make of an unresolved "do no harm", were every point the true
    effect: with a point above `bound`, harm, as soon as the first such interval clears
    it; else met, once the last interval to do so has; None with fewer than two rounds."""
    if not measured or any(e.n_rounds < 2 for e in measured.values()):
        return None
    above = {k: e for k, e in measured.items() if e.point > bound}
    if above:
        rounds = {k: rounds_to_settle(e, bound) for k, e in above.items()}
        known = {k: n for k, n in rounds.items() if n is not None}
        first = min(known, key=known.__getitem__) if known else max(above, key=lambda k: above[k].point)
        return Settling(HARM, first, above[first], known.get(first))
    rounds = {k: rounds_to_settle(e, bound) for k, e in measured.items() if e.high > bound}
    if not rounds:
        return None
    never = [k for k, n in rounds.items() if n is None]
    last = never[0] if never else max(rounds, key=lambda k: rounds[k] or 0)
    return Settling(MET, last, measured[last], rounds[last])


# --- Shares, paired -----------------------------------------------------------------------


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
