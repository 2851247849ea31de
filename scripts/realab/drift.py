"""Whether the machine ran each measured run at the same pace, and which runs to measure
again when it did not.

A round compares configurations on the same requests, one run after another. On a shared
2-core machine the engine's speed moves between runs (the hypervisor takes a core's
share for minutes at a time; clocks change), and a run measured while the machine was
slow carries that slowdown into its round's ratios as if the policy had caused it (set 7
of the policies page: a hooked run's decode steps 1.21x the fit where stock's, in the
same round, ran 0.93x). The engine's own step trace says how fast it ran: decode-only
steps, each over what a fit of step time on its shape (requests decoding, the context
they attend to) predicts. A run whose median sits more than `margin` off the pace of the
runs measured so far is measured again (a policy's own cost per step would show in each
of its runs, and again in its re-run: after `retries` the attempt nearest the others'
pace is kept, with its pace on record, and the rest set aside). Before every run the harness also waits, for a bounded time, until the
hypervisor stops taking CPU (`calm`), the cause seen most often."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

from . import machine

#: A decode-only step's shape and cost: (requests decoding, context tokens, seconds).
Step = tuple[int, int, float]

#: Fewest decode-only steps that fit a model or judge a run.
MIN_STEPS = 50


def decode_steps(steps: list[dict]) -> list[Step]:
    """The decode-only steps of a step trace (no prompt token computed, someone decoding)."""
    return [(s["decode_reqs"], s.get("decode_context") or 0, s["step_s"]) for s in steps
            if not s.get("prefill_tokens") and s.get("decode_reqs") and s.get("step_s")]


@dataclass(frozen=True)
class StepFit:
    """step time = fixed + per_request x requests decoding + per_context x context tokens,
    least squares over decode-only steps."""
    fixed: float
    per_request: float
    per_context: float

    def __call__(self, reqs: int, context: int) -> float:
        return max(self.fixed + self.per_request * reqs + self.per_context * context, 1e-6)


def fit(steps: list[Step]) -> StepFit | None:
    """The least-squares fit over `steps` (centred normal equations; a context that does
    not vary, or varies only with the request count, drops out). None below `MIN_STEPS`."""
    if len(steps) < MIN_STEPS:
        return None
    n = len(steps)
    mr = sum(s[0] for s in steps) / n
    mc = sum(s[1] for s in steps) / n
    mt = sum(s[2] for s in steps) / n
    srr = sum((s[0] - mr) ** 2 for s in steps)
    scc = sum((s[1] - mc) ** 2 for s in steps)
    src = sum((s[0] - mr) * (s[1] - mc) for s in steps)
    srt = sum((s[0] - mr) * (s[2] - mt) for s in steps)
    sct = sum((s[1] - mc) * (s[2] - mt) for s in steps)
    det = srr * scc - src * src
    if srr > 0 and scc > 0 and det > 1e-9 * srr * scc:
        b = (srt * scc - sct * src) / det
        c = (sct * srr - srt * src) / det
    elif srr > 0:
        b, c = srt / srr, 0.0
    else:
        b, c = 0.0, 0.0
    return StepFit(mt - b * mr - c * mc, b, c)


def pace(steps: list[Step], model: StepFit) -> float | None:
    """The median of measured over fitted time across `steps`: 1.0 runs as the fit, 1.2 a
    fifth slower. None below `MIN_STEPS`."""
    if len(steps) < MIN_STEPS:
        return None
    return statistics.median(t / model(r, c) for r, c, t in steps)


def off_pace(paces: dict, history: list[float], margin: float) -> list:
    """The keys of `paces` whose pace lies more than `margin` (a share) off the median
    of every pace seen (`history`, which holds theirs too), in either direction: a run
    faster than its round's others shifts the round's ratios as much as a slower one."""
    seen = [p for p in history if p is not None]
    if not seen:
        return []
    ref = statistics.median(seen)
    return [k for k, p in paces.items() if p is not None and abs(p / ref - 1) > margin]


def calm(max_wait_s: float, steal_cores: float = 0.02, window_s: float = 5.0,
         sample: Callable[[], machine.Sample] = machine.sample, sleep: Callable[[float], None] = time.sleep) -> float:
    """Waits until the hypervisor took at most `steal_cores` cores' worth over a
    `window_s` window, or `max_wait_s` has passed; returns the seconds waited beyond the
    first window (the last window's steal is what the run starts under)."""
    waited = 0.0
    while True:
        a = sample()
        sleep(window_s)
        b = sample()
        stolen = (b.steal - a.steal) / max(b.wall - a.wall, 1e-9)
        if stolen <= steal_cores or waited >= max_wait_s:
            return waited
        waited += window_s
