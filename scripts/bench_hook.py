"""The hook's own cost inside vLLM: what `MeridianScheduler.schedule` adds over vLLM's
stock `AsyncScheduler.schedule`, and what one call of `MeridianLogitsProcessor` costs,
at 1, 16, 64 and 256 running requests in steady decode.

Both schedulers are vLLM's real classes, built on CPU without a model
(tests/hook/engine.py); this script plays the model. The two engines get the same
requests and the same sampled tokens, and are stepped in alternation (which one goes
first alternates too), so both see the same machine noise; only `schedule()` is timed.

Usage: bench_hook.py REPO OUT.md [--steps N] [--sizes 1,16,64,256] [--profile]
(`scripts/bench-hook.sh` builds and installs the hook first)."""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import platform
import pstats
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

TARGET_US = 100.0  # per step at 256 running requests: <1% of a 10 ms GPU decode step
TARGET_AT = 256
GPU_STEP_MS = 10.0
PROMPT_LEN = 32
WARMUP_STEPS = 24
THINK_TOKEN, ANSWER_TOKEN = 7, 9
MAX_MODEL_LEN = 4096  # tests/hook/engine.py builds the engines with it
VOCAB = 151_936  # Qwen3's: the logits tensor the processor receives


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("repo", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=2000, help="measured steps per size (default 2000)")
    p.add_argument("--sizes", default="1,16,64,256", help="running requests, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every size, fresh engines each (default 3)")
    p.add_argument(
        "--profile", action="store_true", help="also print a cProfile of the hooked schedule at the largest size"
    )
    args = p.parse_args()
    if PROMPT_LEN + WARMUP_STEPS + args.steps + 8 > MAX_MODEL_LEN:
        p.error(f"--steps: requests would outgrow the engines' max_model_len ({MAX_MODEL_LEN})")
    return args


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Spread:
    p10: float
    p50: float
    p90: float

    @classmethod
    def of(cls, xs: list[float]) -> "Spread":
        return cls(pct(xs, 0.1), pct(xs, 0.5), pct(xs, 0.9))


# ---- scheduler -------------------------------------------------------------------


def prompt(i: int) -> list[int]:
    from engine import THINK_START

    # Distinct prompts (no two requests alike), the think block opened by the template.
    return [1 + (i * 7 + k) % 400 for k in range(PROMPT_LEN - 1)] + [THINK_START]


def script_token(i: int, produced: int) -> int:
    """What request i samples as its `produced`-th output token (0-based): odd requests
    close their thought within the warm-up (at staggered points) and answer from then
    on; even ones think throughout."""
    from engine import THINK_END

    if i % 2 == 1:
        close_at = 2 + (i // 2) % 8
        if produced == close_at:
            return THINK_END
        if produced > close_at:
            return ANSWER_TOKEN
    return THINK_TOKEN


def timed_classes() -> tuple[type, type]:
    """The stock scheduler and the hook's, each with vLLM's own `schedule()` timed inside
    it: `Inner` sits between `MeridianScheduler` and `AsyncScheduler` in the method
    resolution order, so the hook's `super().schedule()` lands in it. The hook's own
    cost in a step is then the hooked `schedule()` minus the stock `schedule()` it
    wraps, on the very same state. The stock engine runs `Inner` alone: its outer minus
    inner time is what the timing itself costs."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from meridian_hook.scheduler import MeridianScheduler

    class Inner(AsyncScheduler):
        inner_cpu_ns = 0

        def schedule(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            c0 = time.thread_time_ns()
            try:
                return super().schedule(*args, **kwargs)
            finally:
                self.inner_cpu_ns += time.thread_time_ns() - c0

    class TimedMeridian(MeridianScheduler, Inner):
        pass

    assert TimedMeridian.__mro__.index(Inner) == TimedMeridian.__mro__.index(MeridianScheduler) + 1
    return Inner, TimedMeridian


class Driver:
    """One engine (stock or hooked) and the model it is played against."""

    def __init__(self, cls: type, n: int, steps: int) -> None:
        from engine import BLOCK, build

        total = PROMPT_LEN + WARMUP_STEPS + steps + 8
        blocks = n * (total // BLOCK + 2) + 16
        self.engine = build(cls, num_blocks=blocks, max_num_seqs=n, budget=max(256, n * PROMPT_LEN))
        self.sched = self.engine.scheduler
        self.index: dict[str, int] = {}
        for i in range(n):
            rid = f"req-{i}"
            self.index[rid] = i
            self.engine.add(rid, prompt(i), arrival=1000.0 + i, max_tokens=total)

    def step(self) -> tuple[int, int, int, frozenset[str]]:
        """One engine step: `schedule()`, the model's tokens, `update_from_output()`.
        Returns the CPU nanoseconds of `schedule()`, of vLLM's own `schedule()` inside
        it (the same for the stock engine), their wall-clock nanoseconds, and who ran."""
        from vllm.v1.outputs import ModelRunnerOutput

        sched = self.sched
        if hasattr(sched, "inner_cpu_ns"):
            sched.inner_cpu_ns = 0
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
        sched.update_from_output(out, mro)
        return cpu, inner, wall, frozenset(ids)


@dataclass
class SchedResult:
    n: int
    stock: Spread  # CPU µs of the stock engine's schedule()
    hooked: Spread  # CPU µs of the hooked engine's schedule()
    added: Spread  # hooked schedule() minus the stock schedule() inside it, per step
    added_mean: float
    floor: Spread  # the stock engine's schedule() minus the AsyncScheduler.schedule() inside it
    paired: Spread  # hooked engine's schedule() minus the stock engine's, step by step
    wall_paired: Spread  # the same in wall-clock time
    steps: int
    answering: int
    thinking: int
    rounds_added: list[float]  # each round's added p50

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
            Spread.of(pool("floor")),
            Spread.of(pool("paired")),
            Spread.of(pool("wall_paired")),
            len(first.added),
            first.answering,
            first.thinking,
            [statistics.median(r.added) for r in rounds],
        )


@dataclass
class SchedRaw:
    """One round's per-step figures at one size (µs)."""

    n: int
    stock: list[float]
    hooked: list[float]
    added: list[float]
    floor: list[float]
    paired: list[float]
    wall_paired: list[float]
    answering: int
    thinking: int


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

    def run_hooked() -> tuple[int, int, int, frozenset[str]]:
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
    for k in range(steps):
        if k % 2 == 0:
            sc, si, sw, ran_s = stock.step()
            hc, hi, hw, ran_h = run_hooked()
        else:
            hc, hi, hw, ran_h = run_hooked()
            sc, si, sw, ran_s = stock.step()
        assert ran_s == ran_h and len(ran_s) == n, "both engines run the same requests each step"
        stock_cpu.append(sc / 1000)
        hooked_cpu.append(hc / 1000)
        added.append((hc - hi) / 1000)
        floor.append((sc - si) / 1000)
        paired.append((hc - sc) / 1000)
        wall_paired.append((hw - sw) / 1000)
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
        print(f"cProfile of {steps} hooked steps at {n} running requests:\n{out.getvalue()}", file=sys.stderr)
    return SchedRaw(n, stock_cpu, hooked_cpu, added, floor, paired, wall_paired, answering, thinking)


# ---- logits processor -------------------------------------------------------------


@dataclass
class LogitsResult:
    n: int
    v1: Spread  # CPU time per call, µs
    v2: Spread

    @classmethod
    def pooled(cls, rounds: list[tuple[int, list[float], list[float]]]) -> "LogitsResult":
        return cls(
            rounds[0][0], Spread.of([x for r in rounds for x in r[1]]), Spread.of([x for r in rounds for x in r[2]])
        )


def bench_logits(n: int, steps: int) -> tuple[int, list[float], list[float]]:
    import numpy as np
    import torch
    from engine import reasoning_config
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    from meridian_hook.logits import MeridianLogitsProcessor

    config = SimpleNamespace(reasoning_config=reasoning_config(), model_config=None)
    params = [SamplingParams(max_tokens=4096, extra_args={"meridian_request_id": f"req-{i}"}) for i in range(n)]
    prompts = [prompt(i) for i in range(n)]
    logits = torch.zeros(n, VOCAB)

    # V1 (the CPU model runner's interface): output lists grow in place, one token a step.
    v1 = MeridianLogitsProcessor(config, torch.device("cpu"), False)
    outs: list[list[int]] = [[] for _ in range(n)]
    added = [(i, params[i], prompts[i], outs[i]) for i in range(n)]
    v1.update_state(BatchUpdate(batch_size=n, removed=[], added=added, moved=[]))

    # V2 (Model Runner V2, the GPU default): request state in slots, the row's input token.
    width = PROMPT_LEN + WARMUP_STEPS + steps + 8
    state = SimpleNamespace(
        prompt_len=SimpleNamespace(np=np.full(n, PROMPT_LEN, dtype=np.int32)),
        prefill_len=SimpleNamespace(np=np.full(n, PROMPT_LEN, dtype=np.int32)),
        all_token_ids=SimpleNamespace(gpu=torch.zeros(n, width, dtype=torch.int32)),
    )
    for i in range(n):
        state.all_token_ids.gpu[i, :PROMPT_LEN] = torch.tensor(prompts[i])
    v2 = MeridianLogitsProcessor(config, state)
    for i in range(n):
        v2.add_request(i, params[i])
    slots = np.arange(n)

    cpu: tuple[list[float], list[float]] = ([], [])
    for k in range(WARMUP_STEPS + steps):
        # What the model sampled last step, before this step's sampling.
        last = [script_token(i, len(outs[i])) for i in range(n)] if k else [prompts[i][-1] for i in range(n)]
        if k:
            for i in range(n):
                outs[i].append(last[i])
        ctx = SimpleNamespace(
            idx_mapping_np=slots,
            seq_lens_upper_bound_np=np.full(n, PROMPT_LEN + len(outs[0]), dtype=np.int64),
            input_ids=torch.tensor(last),
        )
        order = (0, 1) if k % 2 == 0 else (1, 0)
        for which in order:
            c0 = time.thread_time_ns()
            if which == 0:
                v1.update_state(None)
                v1.apply(logits, None)
            else:
                v2.apply(logits, ctx)
            c = time.thread_time_ns() - c0
            if k >= WARMUP_STEPS:
                cpu[which].append(c / 1000)
    assert not torch.isinf(logits).any(), "no row was forced (steady decode, no budget)"
    return n, cpu[0], cpu[1]


# ---- report -----------------------------------------------------------------------


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    import torch
    import vllm

    return (
        f"{cpu}, {cores} cores (shared with other work), Linux {platform.release()}, "
        f"Python {platform.python_version()}, vLLM {vllm.__version__} (CPU build), torch {torch.__version__}"
    )


def revision(repo: Path) -> str:
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout

        rev = git("rev-parse", "--short", "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
        return rev + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def f1(x: float) -> str:
    return f"{x:.1f}"


def verdicts(sched: list[SchedResult]) -> list[str]:
    at = next((r for r in sched if r.n == TARGET_AT), None)
    if at is None:
        return [f"No run at {TARGET_AT} running requests: the {TARGET_US:.0f} µs target was not checked."]

    def verdict(x: float) -> str:
        return "within" if x <= TARGET_US else "over"

    share = at.added.p50 / (GPU_STEP_MS * 1000) * 100
    out = [
        f"At {at.n} running requests the hook adds {f1(at.added.p50)} µs per scheduler step (median; "
        f"p10-p90 {f1(at.added.p10)} to {f1(at.added.p90)} µs): {verdict(at.added.p50)} the {TARGET_US:.0f} µs "
        f"target, {share:.2f}% of a {GPU_STEP_MS:.0f} ms GPU decode step, and "
        f"{at.added.p50 / at.stock.p50 * 100:.1f}% of vLLM's own `schedule()` on this machine "
        f"({f1(at.stock.p50)} µs).",
        f"Counting the housekeeping of every 16th step, it adds {f1(at.added_mean)} µs per step on average: "
        f"{verdict(at.added_mean)} the target.",
        f"The paired difference between the two engines, {f1(at.paired.p50)} µs at the median, is "
        f"{verdict(at.paired.p50)} the target as well"
        + ("" if (at.paired.p50 <= TARGET_US) == (at.added.p50 <= TARGET_US) else " (unlike the in-step figure)")
        + (
            "; it is the lower of the two, as expected where the hook's first touch of the requests (cache "
            "misses, charged to the hook in-step) saves vLLM's `schedule()` the same misses."
            if at.paired.p50 < at.added.p50
            else "."
        ),
    ]
    if at.added.p90 > TARGET_US >= at.added.p50:
        out.append(f"The p90 step ({f1(at.added.p90)} µs added) is over the target; the median is not.")
    first = sched[0]
    if len(sched) > 1:
        slope = (at.added.p50 - first.added.p50) / max(1, at.n - first.n)
        out.append(
            f"From {first.n} to {at.n} running requests the added time grows by about {slope:.2f} µs per "
            f"request per step; at {first.n} running request it is {f1(first.added.p50)} µs, of which "
            f"{f1(first.floor.p50)} µs is the timing itself."
        )
    return out


def write_report(
    out: Path, repo: Path, steps: int, rounds: int, sched: list[SchedResult], logits: list[LogitsResult]
) -> None:
    cmd = os.environ.get("MERIDIAN_BENCH_COMMAND") or " ".join(
        shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]
    )
    lines = [
        "# The hook's own cost",
        "",
        "What the vLLM hook adds to each scheduler step (`MeridianScheduler`) and to each",
        "sampling step (`MeridianLogitsProcessor`), measured inside vLLM's real classes.",
        "",
        f"Generated by `scripts/bench-hook.sh` (`scripts/bench_hook.py`). Command: `{cmd}`",
        "",
        f"Machine: {machine()}. Meridian {revision(repo)}.",
        "",
        "## Method",
        "",
        "vLLM's real scheduler classes, built on CPU without a model (as in",
        "`tests/hook/engine.py`), stepped by hand. Two engines, stock `AsyncScheduler` and",
        "`MeridianScheduler` (default `meridian.toml`: policy `output-first`, no policy",
        "channel), get the same requests and the same sampled tokens, and are stepped in",
        "alternation (which goes first alternates).",
        f"Steady decode: every running request has a {PROMPT_LEN}-token prompt that opens the",
        "think block and samples one token per step; half of them (every other request)",
        f"closed their thought during a {WARMUP_STEPS}-step warm-up, the rest are still thinking.",
        f"Then {steps} measured steps per size, in each of which both engines run every request",
        f"(checked); {rounds} rounds over all sizes, fresh engines each, the steps of all rounds",
        "pooled. Times are the thread's CPU time (the machine is shared; CPU time leaves out",
        "the time other processes hold the core, not their effect on caches), in µs.",
        "",
        "- **added**: the hook's own cost in a step: the hooked `schedule()` minus vLLM's",
        "  `AsyncScheduler.schedule()` that it wraps, timed inside the same call (a timing class",
        "  sits between the two in the method resolution order), so both parts see the very",
        "  same state. Median and p10-p90 over the steps; the mean includes the hook's",
        "  housekeeping (KV tiers, forgetting finished requests), which runs every 16th step.",
        "  It includes the timing itself (**timing**: the same outer-minus-inner measurement on",
        "  the stock engine).",
        "- **paired difference**: the hooked engine's `schedule()` minus the stock engine's in",
        "  the same step number, a cross-check from two separate engines; noisier, since each",
        "  engine has its own heap and caches.",
        "- `update_from_output()` is not timed: the hook does not override it.",
        "",
        "During the warm-up the hooked engine ran express steps for the requests closing their",
        "thought, so its thinking requests are a few tokens behind the stock engine's; the",
        "hook's cost does not depend on that.",
        "",
        "## Per scheduler step",
        "",
        "| running requests | answering / thinking | stock `schedule()` µs (p50) | hooked `schedule()` µs (p50)"
        " | added µs (p50) | added p10-p90 | added mean | added p50 by round | added / stock | timing"
        " | paired difference p50 (p10-p90) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sched:
        lines.append(
            f"| {r.n} | {r.answering} / {r.thinking} | {f1(r.stock.p50)} | {f1(r.hooked.p50)} | "
            f"{f1(r.added.p50)} | {f1(r.added.p10)} to {f1(r.added.p90)} | {f1(r.added_mean)} | "
            f"{' / '.join(f1(x) for x in r.rounds_added)} | {r.added.p50 / r.stock.p50 * 100:.1f}% | {f1(r.floor.p50)} | "
            f"{f1(r.paired.p50)} ({f1(r.paired.p10)} to {f1(r.paired.p90)}) |"
        )
    lines += ["", *verdicts(sched), ""]
    lines += [
        "## Per logits-processor call",
        "",
        "`MeridianLogitsProcessor` on a batch in the same steady decode (one new token per",
        "row per step, half the rows answering, every request with a `meridian_request_id`,",
        "no budget or directive, so no row is forced; logits of Qwen3's vocabulary,",
        f"{VOCAB} columns, on CPU). Without the processor vLLM makes no call, so the figure is",
        "all added cost (CPU time, µs). V1: `update_state(None)` plus `apply()`, the interface",
        "of vLLM's V1 model runner (the one used on CPU). V2: `apply()` under Model Runner V2",
        "(vLLM's default on GPU), with its request state and inputs on CPU here; on a GPU it",
        "also copies the rows' fed tokens from the device (one small copy per step), which is",
        "not in this figure.",
        "",
        "| rows | V1 µs per call (p50) | V1 p10-p90 | V2 µs per call (p50) | V2 p10-p90 |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in logits:
        lines.append(
            f"| {r.n} | {f1(r.v1.p50)} | {f1(r.v1.p10)} to {f1(r.v1.p90)} | {f1(r.v2.p50)} | "
            f"{f1(r.v2.p10)} to {f1(r.v2.p90)} |"
        )
    big = logits[-1]
    worst = max(big.v1.p50, big.v2.p50)
    lines += [
        "",
        f"At {big.n} rows the logits processor costs {f1(big.v1.p50)} µs per call under the V1 interface "
        f"and {f1(big.v2.p50)} µs under V2 (medians): at most {worst / (GPU_STEP_MS * 1000) * 100:.2f}% "
        f"of a {GPU_STEP_MS:.0f} ms decode step, "
        + ("within" if worst <= TARGET_US else "over")
        + f" the {TARGET_US:.0f} µs the scheduler is held to.",
        "",
        "Earlier figures: this page's history in git; the commit that added it measured the",
        "hook before it was optimised for this benchmark.",
        "",
    ]
    lines += ASYNC_SECTION
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))


ASYNC_SECTION = [
    "## Under vLLM's async scheduling",
    "",
    "On GPU vLLM defaults to async scheduling (on CPU its platform turns it off): the",
    "scheduler class is `AsyncScheduler` and the engine core keeps two batches in flight",
    "(`max_concurrent_batches`: 2 with the V1 model runner, pipeline size + 1 with Model",
    "Runner V2). Each `EngineCore.step_with_batch_queue` schedules step N+1 and submits it",
    "while step N runs, then blocks on step N's result and only then calls",
    "`update_from_output` for step N. What that means for the hook:",
    "",
    "- **What the scheduler hook sees.** `MeridianScheduler.schedule` reads each request's",
    "  output tokens, which `update_from_output` appends. When it plans step N+1, step N's",
    "  sampled token is still on the device (`AsyncScheduler` only counts it in",
    "  `num_output_placeholders`), so the hook's phase tracking is one token behind: it has",
    "  the tokens up to step N-1's.",
    "- **Phase detection latency and express steps.** A request that samples the",
    "  end-of-thinking token in step N is seen answering when step N+2 is planned, one step",
    "  later than under synchronous scheduling. Its first visible token is sampled in step",
    "  N+1, which was scheduled before anyone knew the thought had ended; so under async",
    "  scheduling the **express step** (thinking and prefilling requests sit one step out)",
    "  is step N+2, the one that samples the second visible token, and the first visible",
    "  token comes after a full-size step. Reordering (answering requests first) and the",
    "  choice of preemption victim likewise act on phases one step old: for one step a",
    "  request that has just closed its thought still ranks, and can be preempted, as a",
    "  thinker.",
    "- **The logits processor is not behind.** It runs in the worker when a step samples:",
    "  under the V1 model runner vLLM replaces the output lists' placeholders with the",
    "  previous step's sampled tokens before logits processors run",
    "  (`InputBatch.update_async_output_token_ids`), and under Model Runner V2 the hook",
    "  reads the token each row is fed this step. Budgets, directives and entropy exits",
    "  are decided on every token as it is sampled.",
    "- **Cost.** The scheduler hook runs inside `schedule()`, on the engine core's CPU",
    "  thread, while the previous step runs on the GPU: its cost overlaps the GPU step and",
    "  only shows in step time when the engine core's CPU work per step (scheduling,",
    "  launching, output processing) already exceeds the GPU step. Under synchronous",
    "  scheduling (`--no-async-scheduling`, and vLLM on CPU) it adds to every step as",
    "  measured above.",
    "- **The logits processor and the overlap.** The logits processor runs where the model",
    "  samples: with one GPU (vLLM's in-process executor) on that same engine-core thread,",
    "  in `sample_tokens`, right after the step's forward pass was launched. Under Model",
    "  Runner V2 it copies the rows' fed tokens from the device in every decode step, and",
    "  that copy waits for the forward pass to finish: the engine core's thread is held",
    "  until then, so the next step's scheduling (the hook's included) no longer overlaps",
    "  the forward pass. Under the V1 model runner vLLM itself, once any custom logits",
    "  processor is configured, waits for the previous step's sampled tokens before",
    "  sampling (`update_async_output_token_ids`), not for the current forward pass.",
    "",
]


def main() -> None:
    args = parse_args()
    sys.path.insert(0, str(args.repo / "tests" / "hook"))
    import logging

    import torch

    logging.getLogger("vllm").setLevel(logging.WARNING)
    torch.set_num_threads(1)  # the processor's work is Python; no pool of threads to share
    sizes = [int(s) for s in args.sizes.split(",") if s]
    os.environ.pop("MERIDIAN_HOOK_CONFIG", None)  # the default policy
    os.environ.pop("MERIDIAN_HOOK_TOKEN", None)  # no policy channel
    raw: dict[int, list[SchedRaw]] = {n: [] for n in sizes}
    raw_logits: dict[int, list[tuple[int, list[float], list[float]]]] = {n: [] for n in sizes}
    for k in range(args.rounds):
        for n in sizes:
            r = bench_scheduler(n, args.steps, args.profile and k == 0 and n == max(sizes))
            raw[n].append(r)
            print(
                f"round {k + 1} scheduler n={n}: stock {f1(statistics.median(r.stock))} µs, "
                f"hooked {f1(statistics.median(r.hooked))} µs, added {f1(statistics.median(r.added))} µs, "
                f"paired difference {f1(statistics.median(r.paired))} µs",
                file=sys.stderr,
            )
            gc.collect()
        for n in sizes:
            lr = bench_logits(n, args.steps)
            raw_logits[n].append(lr)
            print(
                f"round {k + 1} logits n={n}: V1 {f1(statistics.median(lr[1]))} µs, "
                f"V2 {f1(statistics.median(lr[2]))} µs per call",
                file=sys.stderr,
            )
            gc.collect()
    sched = [SchedResult.pooled(raw[n]) for n in sizes]
    logits = [LogitsResult.pooled(raw_logits[n]) for n in sizes]
    for r in sched:
        print(
            f"scheduler n={r.n}: stock {f1(r.stock.p50)} µs, hooked {f1(r.hooked.p50)} µs, "
            f"added {f1(r.added.p50)} µs (p10 {f1(r.added.p10)}, p90 {f1(r.added.p90)}, mean {f1(r.added_mean)}); "
            f"paired difference {f1(r.paired.p50)} µs (p10 {f1(r.paired.p10)}, p90 {f1(r.paired.p90)}), "
            f"wall {f1(r.wall_paired.p50)} µs",
            file=sys.stderr,
        )
    for lr2 in logits:
        print(f"logits n={lr2.n}: V1 {f1(lr2.v1.p50)} µs, V2 {f1(lr2.v2.p50)} µs per call", file=sys.stderr)
    write_report(args.out, args.repo, args.steps, args.rounds, sched, logits)
    for v in verdicts(sched):
        print(v, file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
