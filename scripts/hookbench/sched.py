"""The scheduler half: vLLM's stock `AsyncScheduler` and the hook's `MeridianScheduler`
stepped in alternation on the same requests and tokens, the hook's own time in each
`schedule()` timed inside it."""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time
from dataclasses import dataclass

from .common import ANSWER_TOKEN, PROMPT_LEN, Spread, THINK_TOKEN, WARMUP_STEPS

def prompt(i: int) -> list[int]:
    from meridian_hook.testing import THINK_START

    # Distinct prompts (no two requests alike), the think block opened by the template.
    return [1 + (i * 7 + k) % 400 for k in range(PROMPT_LEN - 1)] + [THINK_START]


def script_token(i: int, produced: int) -> int:
    """What request i samples as its `produced`-th output token (0-based): odd requests
    close their thought within the warm-up (at staggered points) and answer from then
    on; even ones think throughout."""
    from meridian_hook.testing import THINK_END

    if i % 2 == 1:
        close_at = 2 + (i // 2) % 8
        if produced == close_at:
            return THINK_END
        if produced > close_at:
            return ANSWER_TOKEN
    return THINK_TOKEN


def timed_classes() -> tuple[type, type]:
    """The stock scheduler and the hook's, each with vLLM's own `schedule()` and
    `update_from_output()` timed inside it: `Inner` sits between `MeridianScheduler` and
    `AsyncScheduler` in the method resolution order, so the hook's `super()` calls land
    in it. The hook's own cost in a step is then the hooked methods minus the stock ones
    they wrap, on the very same state. The stock engine runs `Inner` alone: its outer
    minus inner time is what the timing itself costs."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from meridian_hook.scheduler import MeridianScheduler

    class Inner(AsyncScheduler):
        inner_cpu_ns = 0
        inner_update_ns = 0

        def schedule(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            c0 = time.thread_time_ns()
            try:
                return super().schedule(*args, **kwargs)
            finally:
                self.inner_cpu_ns += time.thread_time_ns() - c0

        def update_from_output(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            c0 = time.thread_time_ns()
            try:
                return super().update_from_output(*args, **kwargs)
            finally:
                self.inner_update_ns += time.thread_time_ns() - c0

    class TimedMeridian(MeridianScheduler, Inner):
        pass

    assert TimedMeridian.__mro__.index(Inner) == TimedMeridian.__mro__.index(MeridianScheduler) + 1
    return Inner, TimedMeridian


class Driver:
    """One engine (stock or hooked) and the model it is played against."""

    def __init__(self, cls: type, n: int, steps: int) -> None:
        from meridian_hook.testing import BLOCK, build

        total = PROMPT_LEN + WARMUP_STEPS + steps + 8
        blocks = n * (total // BLOCK + 2) + 16
        self.engine = build(cls, num_blocks=blocks, max_num_seqs=n, budget=max(256, n * PROMPT_LEN))
        self.sched = self.engine.scheduler
        self.index: dict[str, int] = {}
        for i in range(n):
            rid = f"req-{i}"
            self.index[rid] = i
            self.engine.add(rid, prompt(i), arrival=1000.0 + i, max_tokens=total)

    def step(self) -> "Step":
        """One engine step: `schedule()`, the model's tokens, `update_from_output()`."""
        from vllm.v1.outputs import ModelRunnerOutput

        sched = self.sched
        if hasattr(sched, "inner_cpu_ns"):
            sched.inner_cpu_ns = 0
            sched.inner_update_ns = 0
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        out = sched.schedule()
        cpu, wall = time.thread_time_ns() - c0, time.perf_counter_ns() - w0
        inner = getattr(sched, "inner_cpu_ns", cpu)
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = sched.requests[rid]
            done_prompt = req.num_computed_tokens + out.num_scheduled_tokens[rid] >= req.num_prompt_tokens
            sampled.append([script_token(self.index[rid], len(req.output_token_ids))] if done_prompt else [])
        index = {r: i for i, r in enumerate(ids)}
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index=index, sampled_token_ids=sampled)
        u0 = time.thread_time_ns()
        # Held until the clock is read: freeing vLLM's outputs for every request is not
        # the hook's time (dropped inside the timed span, it had been counted as such).
        outputs = sched.update_from_output(out, mro)
        update = time.thread_time_ns() - u0
        del outputs
        update_inner = getattr(sched, "inner_update_ns", update)
        return Step(cpu, inner, wall, update, update_inner, frozenset(ids))


@dataclass
class Step:
    """One engine step's CPU nanoseconds: `schedule()` and vLLM's own `schedule()` inside
    it (the same for the stock engine), its wall-clock nanoseconds, `update_from_output()`
    and vLLM's own inside it; and who ran."""

    sched: int
    sched_inner: int
    wall: int
    update: int
    update_inner: int
    ran: frozenset[str]

    @property
    def added(self) -> int:
        """The hook's own time in the step (or, on the stock engine, the timing's)."""
        return self.sched - self.sched_inner + self.update - self.update_inner

    @property
    def update_added(self) -> int:
        return self.update - self.update_inner


@dataclass
class SchedResult:
    n: int
    # CPU µs per step of `schedule()` and `update_from_output()` together:
    stock: Spread  # the stock engine's
    hooked: Spread  # the hooked engine's
    added: Spread  # the hooked methods minus the stock ones inside them
    added_mean: float
    update_added: Spread  # the part of `added` in update_from_output()
    floor: Spread  # the same outer-minus-inner on the stock engine: the timing itself
    paired: Spread  # hooked engine's minus the stock engine's, step by step
    wall_paired: Spread  # the same for `schedule()` alone in wall-clock time
    steps: int
    answering: int
    thinking: int
    rounds_added: list[float]  # each round's added p50
    rounds_other: list[float]  # cores' worth of other work during each round
    policy: str  # the hooked engine's scheduling policy, as the hook names it

    @classmethod
    def pooled(cls, rounds: list["SchedRaw"]) -> "SchedResult":
        def pool(name: str) -> list[float]:
            return [x for r in rounds for x in getattr(r, name)]

        first = rounds[0]
        return cls(
            first.n,
            Spread.of(pool("stock")),
            Spread.of(pool("hooked")),
            Spread.of(pool("added")),
            statistics.fmean(pool("added")),
            Spread.of(pool("update_added")),
            Spread.of(pool("floor")),
            Spread.of(pool("paired")),
            Spread.of(pool("wall_paired")),
            len(first.added),
            first.answering,
            first.thinking,
            [statistics.median(r.added) for r in rounds],
            [r.other_cores for r in rounds],
            first.policy,
        )


@dataclass
class SchedRaw:
    """One round's per-step figures at one size (µs)."""

    n: int
    stock: list[float]  # schedule() and update_from_output()
    hooked: list[float]
    added: list[float]
    update_added: list[float]  # the part of `added` in update_from_output()
    floor: list[float]
    paired: list[float]
    wall_paired: list[float]
    answering: int
    thinking: int
    policy: str  # the hooked engine's scheduling policy, as the hook names it
    # Cores' worth of CPU that other processes used while this round ran (their cache
    # traffic slows the hook's reads of vLLM's objects: it shows in the added time).
    other_cores: float = 0.0


def bench_scheduler(n: int, steps: int, profile: bool) -> SchedRaw:
    stock_cls, hooked_cls = timed_classes()
    stock, hooked = Driver(stock_cls, n, steps), Driver(hooked_cls, n, steps)
    # Warm-up: prefill, then every odd request closes its thought (the hooked engine runs
    # express steps for them, the thinkers sitting those out), and steady decode begins.
    for _ in range(WARMUP_STEPS):
        stock.step()
        hooked.step()
    core = hooked.sched._meridian
    assert core is not None, "the hook did not load (config error?)"
    phases = [core.phase(f"req-{i}") for i in range(n)]
    answering, thinking = phases.count("output"), phases.count("think")
    assert answering + thinking == n, f"every request decodes after the warm-up: {phases}"
    prof = cProfile.Profile() if profile else None

    def run_hooked() -> Step:
        if prof is None:
            return hooked.step()
        prof.enable()
        try:
            return hooked.step()
        finally:
            prof.disable()

    stock_cpu: list[float] = []
    hooked_cpu: list[float] = []
    added: list[float] = []
    floor: list[float] = []
    paired: list[float] = []
    wall_paired: list[float] = []
    update_added: list[float] = []
    for k in range(steps):
        if k % 2 == 0:
            s, h = stock.step(), run_hooked()
        else:
            h = run_hooked()
            s = stock.step()
        assert s.ran == h.ran and len(s.ran) == n, "both engines run the same requests each step"
        stock_cpu.append((s.sched + s.update) / 1000)
        hooked_cpu.append((h.sched + h.update) / 1000)
        added.append(h.added / 1000)
        update_added.append(h.update_added / 1000)
        floor.append(s.added / 1000)
        paired.append((h.sched + h.update - s.sched - s.update) / 1000)
        wall_paired.append((h.wall - s.wall) / 1000)
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
        print(f"cProfile of {steps} hooked steps at {n} running requests:\n{out.getvalue()}", file=sys.stderr)
    return SchedRaw(
        n, stock_cpu, hooked_cpu, added, update_added, floor, paired, wall_paired, answering, thinking, core.policy_name
    )
