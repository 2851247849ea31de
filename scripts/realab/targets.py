"""The targets set for long prompts and KV pressure at 90% load, judged for every
configuration that ran there: the largest answer gap at most 0.5x stock's, TTOT at least
2x lower (at most 0.5x), TTFO at most 1.1x stock's, and token throughput within 5% of
stock's (at least 0.95x: more is no cost).

The targets name p99; a run counts 90 to 180 requests, where p99 is set by one or two of
them, so each latency target is judged at the tail every round's requests can set
(`stats.round_tail`: p95 or p90), and the page says which. Each verdict reads the same
paired, run-aware interval as the rest of the page (`stats.verdict`): met when the whole
interval lies on the target's side, missed when it lies wholly past it, else
unresolved; a single round gives no verdict. Throughput is one figure a round, so its
interval is Student's t over the rounds' log ratios."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from . import stats as S

#: The workloads the targets are set for: long prompts, and KV pressure in either cache.
WORKLOADS = ("long", "kv", "kv-tight")
LOAD = 0.9
#: Throughput at least this share of stock's.
THROUGHPUT_FLOOR = 0.95


@dataclass(frozen=True)
class Target:
    metric: str
    bound: float
    says: str


TARGETS = (
    Target("largest answer gap", 0.5, "at most 0.5x stock's"),
    Target("TTOT", 0.5, "at least 2x lower"),
    Target("TTFO", 1.1, "at most 1.1x stock's"),
)
THROUGHPUT = "token throughput"


@dataclass(frozen=True)
class Judged:
    """One target's verdict: what it was judged on ("TTOT p95"), the figure, the word."""

    target: str
    judged_on: str
    figure: str
    word: str

    def text(self) -> str:
        return f"{self.judged_on} {self.figure}: {self.word}"


def applies(workload: str, load: float) -> bool:
    return workload in WORKLOADS and math.isclose(load, LOAD)


@dataclass(frozen=True)
class Interval:
    point: float
    low: float
    high: float


def throughput_interval(ratios: list[float], confidence: float = 0.9) -> Interval | None:
    """The rounds' throughput ratios as one (their geometric mean) with Student's t
    interval over their logs; None with fewer than two rounds (or a zero)."""
    if len(ratios) < 2 or min(ratios) <= 0:
        return None
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = S.t_quantile(1 - (1 - confidence) / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half))


def judge(table: dict[str, tuple], ratios: list[float]) -> list[Judged]:
    """Each target's verdict for one configuration: `table`, its effects
    (`effects.effects`); `ratios`, its throughput over stock's in each round."""
    out = []
    for t in TARGETS:
        _p50, tail_estimate, tail, _n = table[t.metric]
        if tail_estimate is None:
            out.append(Judged(t.metric, f"{t.metric} (no tail its runs can set)", "-", S.UNRESOLVED))
            continue
        word = S.verdict(tail_estimate, t.bound) if tail_estimate.run_aware else S.UNRESOLVED
        out.append(Judged(t.metric, f"{t.metric} p{round(100 * tail)}", tail_estimate.text(), word))
    thr = throughput_interval(ratios)
    if thr is None:
        figure = " ".join(f"{r:.3f}" for r in ratios) or "-"
        out.append(Judged(THROUGHPUT, THROUGHPUT, f"{figure} (one round)", S.UNRESOLVED))
    else:
        out.append(Judged(THROUGHPUT, THROUGHPUT, f"{thr.point:.3f} ({thr.low:.3f}-{thr.high:.3f})",
                          S.verdict(thr, THROUGHPUT_FLOOR, better="higher")))
    return out


def overall(judged: list[Judged]) -> str:
    """All four met: met; any missed: missed; else unresolved."""
    words = {j.word for j in judged}
    return S.MET if words == {S.MET} else S.MISSED if S.MISSED in words else S.UNRESOLVED


def rule() -> str:
    return ("; ".join(f"{t.metric} {t.says}" for t in TARGETS)
            + f"; {THROUGHPUT} at least {THROUGHPUT_FLOOR:.2f}x stock's")


def section_lines(config: str, judged: list[Judged]) -> list[str]:
    """The bullet under a load's "do no harm" verdicts."""
    return [f"- **{config}, the targets for long prompts and KV pressure at 90% ({rule()}; each latency at the "
            f"tail every round can set, not p99): {overall(judged)}**: "
            + "; ".join(j.text() for j in judged) + "."]


@dataclass(frozen=True)
class Row:
    set_name: str
    workload: str
    config: str
    policy: str | None
    rounds: tuple[int, ...]
    judged: tuple[Judged, ...]

    @property
    def name(self) -> str:
        """The configuration, with its policy where its name does not say it (`hook`)."""
        return f"{self.config} ({self.policy})" if self.policy and self.config == "hook" else self.config

    @property
    def number(self) -> int:
        head = self.set_name.split("-")[0]
        return int(head) if head.isdigit() else 0


#: The rows judged so far, by (set, workload, configuration): each load's section judges
#: its configurations (`record`), and the page's table reads them all (`found`); the
#: page's worker processes hand theirs back (`policies._each_set`).
FOUND: dict[tuple[str, str, str], Row] = {}


def record(set_name: str, workload: str, config: str, policy: str | None, rounds: tuple[int, ...],
           judged: list[Judged]) -> None:
    FOUND[(set_name, workload, config)] = Row(set_name, workload, config, policy, rounds, tuple(judged))


def found() -> list[Row]:
    """Every row recorded, in the sets' number order."""
    return sorted(FOUND.values(), key=lambda r: r.number)


def _rounds(rounds: tuple[int, ...]) -> str:
    return f"{len(rounds)} ({', '.join(map(str, rounds))})" if len(rounds) <= 4 else f"{len(rounds)}"


def page_lines(found: list[Row]) -> list[str]:
    """The page's table of every verdict, after its opening."""
    if not found:
        return []
    lines = ["**The targets for long prompts and KV pressure at 90% load**, for every configuration that ran there "
             f"(sets not superseded; each over all its rounds paired with stock): {rule()}. Each latency is judged "
             "at the tail every round's requests can set (p99 is one or two requests of a run here), by the same "
             "run-aware interval as the rest of the page; throughput by Student's t over the rounds' ratios.", "",
             "| set | workload | configuration | rounds | largest answer gap | TTOT | TTFO | token throughput | "
             "all four |", "|---|---|---|---:|---|---|---|---|---|"]
    for row in found:
        by = {j.target: j for j in row.judged}
        cells = [" ".join(x for x in (by[t].judged_on.removeprefix(t).strip(), by[t].figure) if x)
                 + f": {by[t].word}" for t in (*(t.metric for t in TARGETS), THROUGHPUT)]
        lines.append(f"| {row.number} | {row.workload} | {row.name} | {_rounds(row.rounds)} | "
                     + " | ".join(cells) + f" | **{overall(list(row.judged))}** |")
    return lines + [""]


def readme_lines(found: list[Row]) -> list[str]:
    """The README's line: which comparisons meet all four, and for each target which
    meet it and how many miss it (the page's table names each)."""
    if not found:
        return []
    whole = [r for r in found if overall(list(r.judged)) == S.MET]
    parts = []
    for target in (*(t.metric for t in TARGETS), THROUGHPUT):
        met = [r for r in found if any(j.target == target and j.word == S.MET for j in r.judged)]
        missed = sum(1 for r in found if any(j.target == target and j.word == S.MISSED for j in r.judged))
        parts.append(f"{target} met by {_names(met)}, missed by {missed}")
    return [f"- Targets for long prompts and KV pressure at 90% ({rule()}; at the tail every round can set), over "
            f"{len(found)} comparisons: all four met by {_names(whole)}; " + "; ".join(parts)
            + " (the page's table names each)."]


def _names(rows_: list[Row]) -> str:
    if not rows_:
        return "none"
    return ", ".join(f"`{r.name}` ({r.workload}, set {r.number})" for r in rows_)
