"""The hook's own cost inside vLLM: what `MeridianScheduler.schedule` adds over vLLM's
stock `AsyncScheduler.schedule`, and what one call of `MeridianLogitsProcessor` costs,
at 1, 16, 64 and 256 running requests in steady decode.

Both schedulers are vLLM's real classes, built on CPU without a model
(`meridian_hook.testing`); this script plays the model. The two engines get the same
requests and the same sampled tokens, and are stepped in alternation (which one goes
first alternates too), so both see the same machine noise; only `schedule()` is timed.

Usage: bench_hook.py REPO OUT.md [--steps N] [--sizes 1,16,64,256] [--profile]
(`scripts/bench-hook.sh` builds and installs the hook first)."""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
from pathlib import Path

from hookbench.common import MAX_MODEL_LEN, PROMPT_LEN, WARMUP_STEPS
from hookbench.sched import SchedRaw, SchedResult, bench_scheduler
from hookbench.logits import LogitsResult, bench_logits
from hookbench.page import f1, verdicts, write_report
from realab import machine


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


def main() -> None:
    args = parse_args()
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
            before = machine.sample()
            r = bench_scheduler(n, args.steps, args.profile and k == 0 and n == max(sizes))
            r.other_cores = machine.between(before, machine.sample())["other_cores"]
            raw[n].append(r)
            print(
                f"round {k + 1} scheduler n={n}: stock {f1(statistics.median(r.stock))} µs, "
                f"hooked {f1(statistics.median(r.hooked))} µs, added {f1(statistics.median(r.added))} µs, "
                f"paired difference {f1(statistics.median(r.paired))} µs, other work {r.other_cores:.2f} cores",
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
