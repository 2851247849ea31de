"""How far a measured effect can be trusted.

Every round runs each configuration on the same seed (the same prompts, lengths and
arrival times), so an effect such as "hook / stock p99 TTOT" has one paired ratio per
round. The rounds' agreement is the measurement's own yardstick: when the rounds of one
load disagree by more than the tolerance a comparison asks for (the issue's ±25% between
twin and engine), no prediction can be judged against that effect, and a target verdict
on it says more about the noise than about the scheduler. The page states, from these
figures, which effects the measurement resolves and which it does not."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

#: The twin-vs-engine agreement the issue asks for, and so the spread a measured effect
#: must stay within to be judged against it.
TOLERANCE = 0.25


@dataclass(frozen=True)
class Effect:
    """One effect (a ratio of two configurations' figures) over the paired rounds."""

    ratios: tuple[float, ...]

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def resolved(self) -> bool:
        """At least two rounds, each within the tolerance of their median."""
        m = self.median
        if m is None or len(self.ratios) < 2 or m <= 0:
            return False
        return all(abs(r / m - 1) <= TOLERANCE for r in self.ratios)

    def covers(self, predicted: float | None) -> bool:
        return predicted is not None and bool(self.ratios) and min(self.ratios) <= predicted <= max(self.ratios)

    def direction(self) -> str:
        """Whether the rounds agree on which side of 1 the effect lies."""
        if not self.ratios:
            return "unmeasured"
        if all(r > 1 for r in self.ratios):
            return "higher in every round"
        if all(r < 1 for r in self.ratios):
            return "lower in every round"
        return "the rounds disagree on its direction"

    def rounds_text(self) -> str:
        return ", ".join(f"{r:.2f}x" for r in self.ratios)


@dataclass(frozen=True)
class Comparison:
    """A twin prediction beside the measured effect it predicts."""

    effect: str
    where: str
    measured: Effect
    predicted: float

    @property
    def error(self) -> float:
        """|predicted / measured - 1| against the rounds' median."""
        m = self.measured.median
        return math.inf if not m else abs(self.predicted / m - 1)

    @property
    def agrees(self) -> bool:
        return self.error <= TOLERANCE


def paired(data: dict, workload: str, load: float, num: str, den: str, get) -> Effect:
    """num / den per round, over the rounds where both configurations have the figure."""
    by_round: dict[int, dict[str, float | None]] = {}
    for r in data["runs"]:
        if r["workload"] == workload and r["load"] == load:
            by_round.setdefault(r["round"], {})[r["config"]] = get(r)
    ratios = []
    for rnd in sorted(by_round):
        a, b = by_round[rnd].get(num), by_round[rnd].get(den)
        if a is not None and b is not None and b > 0:
            ratios.append(a / b)
    return Effect(tuple(ratios))


def worst_requests(n: int, q: float = 0.99) -> int:
    """How many of n requests lie at or beyond the q-quantile: the requests that alone
    set a pooled-per-request p99 (nearest-rank)."""
    return max(1, n - math.ceil(q * n) + 1)


def resolution_sentences(data: dict, effects: dict[str, list[Effect]]) -> list[str]:
    """The page's account of what the A/B can resolve, from every effect it measured
    (keyed by the effect's name, over every workload and load)."""
    lines = ["## What this measurement can resolve", "",
             "Each round runs every configuration on the same seed, so each effect (a ratio hook / stock) has "
             "one paired value per round. An effect is *resolved* here when every round lies within "
             f"±{TOLERANCE * 100:.0f}% of the rounds' median: the agreement the twin is asked to reach. An effect "
             "the rounds do not agree on to that tolerance cannot confirm or refute a prediction, and a target "
             "verdict on it is inside the measurement's noise.", ""]
    for name, items in effects.items():
        measured = [e for e in items if e.ratios]
        if not measured:
            continue
        resolved = sum(e.resolved for e in measured)
        low, high = min(min(e.ratios) for e in measured), max(max(e.ratios) for e in measured)
        agree = sum(e.direction() != "the rounds disagree on its direction" for e in measured)
        lines.append(f"- {name}: resolved at {resolved} of {len(measured)} workload-loads; the rounds agree on "
                     f"the direction at {agree} of {len(measured)}"
                     f"; single rounds range from {low:.2f}x to {high:.2f}x.")
    tails = [n for n, items in effects.items() if _share_resolved(items) < 0.5]
    steady = [n for n, items in effects.items() if _share_resolved(items) >= 0.5]
    if tails:
        per_run = sorted({w["prompts"] for w in data["setup"]["workloads"]})
        worst = sorted({worst_requests(n) for n in per_run})
        runs = " and ".join(str(n) for n in per_run)  # requests per run, by workload
        sizes = (f"with {runs} requests per run, the single slowest" if worst == [1]
                 else ", ".join(f"{n} requests: the {worst_requests(n)} slowest" for n in per_run))
        lines += ["", f"Mostly unresolved: {', '.join(tails)}. A per-request p99 (TTOT, largest answer "
                  f"gap) over one run is set by its slowest few ({sizes}), and a pooled ITL p99 by the run's "
                  "few longest stalls"
                  + (f"; {', '.join(steady)}, which every request adds to, mostly resolves" if steady else "")
                  + f". Resolving those effects to ±{TOLERANCE * 100:.0f}% needs more requests per run than the "
                  f"{runs} here (a p99 that more requests set) or more rounds."]
    return lines + [""]


def _share_resolved(items: list[Effect]) -> float:
    measured = [e for e in items if e.ratios]
    return sum(e.resolved for e in measured) / len(measured) if measured else 1.0


def agreement_sentences(compared: list[Comparison]) -> list[str]:
    """How the twin's predictions compare: over every effect, and over the effects whose
    rounds agree well enough to judge a prediction (the only ones that can refute it)."""
    judged = [c for c in compared if c.measured.median]
    if not judged:
        return []
    errors = [c.error for c in judged]
    within = sum(c.agrees for c in judged)
    covered = sum(c.measured.covers(c.predicted) for c in judged)
    out = [f"{within} of {len(judged)} predicted effects fall within ±{TOLERANCE * 100:.0f}% of the measured ones; "
           f"median error {statistics.median(errors) * 100:.0f}%, largest {max(errors) * 100:.0f}%. {covered} of "
           f"{len(judged)} predictions lie within the range the rounds measured."]
    resolved = [c for c in judged if c.measured.resolved]
    unresolved = len(judged) - len(resolved)
    if resolved:
        hits = [f"{c.effect} at {c.where}" for c in resolved if c.agrees]
        misses = [f"{c.effect} at {c.where} (measured {c.measured.median:.2f}, predicted {c.predicted:.2f})"
                  for c in resolved if not c.agrees]
        out.append(f"The rounds resolve {len(resolved)} of these effects to ±{TOLERANCE * 100:.0f}%: the twin "
                   f"predicts {len(hits)} of them within ±{TOLERANCE * 100:.0f}%"
                   + (f" ({'; '.join(hits)})" if hits else "")
                   + (f" and misses {len(misses)}: {'; '.join(misses)}" if misses else "") + ".")
    if unresolved:
        out.append(f"The other {unresolved} can neither confirm nor refute the twin.")
    return [" ".join(out), ""]


def overall_sentences(compared: list[Comparison]) -> list[str]:
    """Over every workload: per effect, how the predictions fare where the rounds resolve."""
    resolved = [c for c in compared if c.measured.resolved]
    if not compared:
        return []
    out = [f"Over all workloads the twin was compared on {len(compared)} effects; the rounds resolve "
           f"{len(resolved)} of them to ±{TOLERANCE * 100:.0f}%."]
    for effect in dict.fromkeys(c.effect for c in compared):
        mine = [c for c in resolved if c.effect == effect]
        if mine:
            out.append(f"{effect}: resolved at {len(mine)}, predicted within ±{TOLERANCE * 100:.0f}% at "
                       f"{sum(c.agrees for c in mine)} of them.")
        else:
            out.append(f"{effect}: resolved nowhere, so not judged.")
    return [" ".join(out), ""]
