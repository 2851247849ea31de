"""What one blocking device-to-host read per engine step costs a GPU engine under vLLM's
asynchronous scheduling, measured with gpucurve's Qwen3-8B-shaped model.

Why: the hook's logits processor (vllm-hook/python/meridian_hook/logits.py, `_observe_v2`)
copies the step's input ids to the host every step (`ctx.input_ids.cpu()`), and with an
entropy exit configured it reads the thinking rows' entropies back as Python floats. Under
vLLM's async scheduling the CPU prepares step k+1 (scheduler, input preparation,
detokenisation) while the GPU runs step k. A blocking read inside step k holds the CPU
until the GPU has finished step k's forward; the host work for step k+1 then runs while the
GPU idles, so the two add instead of overlapping. This measures by how much.

For decode steps of batch 1, 64 and 256 over 1024 cached tokens each (one CUDA graph
captured per batch and replayed, as vLLM replays its steps), a loop of steps runs in each
mode below, for host work W per step in HOST_WORK_MS (a busy spin standing for vLLM's
host work on the next step):

- overlapped: launch step k, spin W while the GPU runs, then wait for step k-1 (an event
  one step behind, as vLLM keeps two batches in flight) before launching step k+1;
- read-ids: as overlapped, but right after launching step k the host copies that step's
  input ids (a [batch] int64 tensor) to the host, as the hook does, then spins W;
- read-ids+entropy: as read-ids, then the entropies of the step's [batch, vocab] fp32
  logits (plain PyTorch log_softmax, standing in for the hook's kernel) read back with
  `.tolist()`, as the hook does with an entropy exit configured.

A step's wall time is the interval between two successive launches; each loop (WARMUP
steps, then `--steps` timed ones) gives the median of its intervals. The whole grid of
modes and W runs REPEATS times, interleaved so that clock drift touches every mode alike;
the spread is the min-max over the repeats. Beside them, the step's own graph time (CUDA
events around lone replays). sync.json is rewritten after each batch, so a run cut short
keeps what it measured.

Run time: 110 s in all on an H200 (measured: 97 s in the loops, 3 repeats x 5 W x 3 modes
x 45 steps per batch, the rest start-up, 8B random weights and graph capture). On an H100,
whose graph times for these batches are 1.06-1.27x the H200's (gpu-step-curve.md), about
2 minutes (estimated).

On a CPU (`--config tiny --device cpu`) there are no graphs and no streams: the step runs
eagerly and synchronously, so nothing overlaps, and the tiny config's batches are 1, 4 and
16 over 64 cached tokens (SHAPES). That path is for smoke tests only.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from .measure import TIMED, WARM, _time_ms, capture
from .model import QWEN3_8B, TINY, Attention, Model, Step
from .syncreport import HOST_WORK_MS, MODES, table

# Decode batches and the cached tokens of each request. The tiny config is for smoke tests
# on a CPU, where bf16 steps are slow (a batch of 64 over 1024 takes ~0.3 s): smaller ones.
SHAPES = {"qwen3-8b": ([1, 64, 256], 1024), "tiny": ([1, 4, 16], 64)}
STEPS = 40  # timed steps per loop (the median of 40 launch intervals is steady enough)
WARMUP = 5  # steps before timing: the two-deep pipeline fills and the allocator settles
REPEATS = 3


def _spin(seconds: float) -> None:
    """Host work: a busy spin, not a sleep, since vLLM's scheduler and input preparation
    keep the CPU busy, and a sleep wakes late by more than the smallest W."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _entropies(torch, logits) -> list[float]:
    lp = torch.log_softmax(logits, dim=-1)
    return (-(lp.exp() * lp).sum(dim=-1)).tolist()


def _loop(torch, launch, step: Step, mode: str, work_ms: float, steps: int, warmup: int, cuda: bool) -> float:
    """Median wall time (ms) between successive launches over `steps` steps after `warmup`."""
    # Two events, reused in turn: step k's is recorded after step k-2's was waited on.
    done = [torch.cuda.Event(), torch.cuda.Event()] if cuda else None
    stamps = []
    for k in range(warmup + steps):
        stamps.append(time.perf_counter())
        launch()
        if cuda:
            done[k % 2].record()
        if mode != "overlapped":
            # Queued behind step k on the stream: returns only once the whole forward has
            # run. (On a CPU the ids are already on the host: no copy, no wait.)
            step.ids.cpu()
            if mode == "read-ids+entropy":
                _entropies(torch, step.logits)
        _spin(work_ms / 1e3)  # the host's work for step k+1
        if cuda and k:
            done[(k - 1) % 2].synchronize()  # one step behind: step k may still run
    stamps.append(time.perf_counter())  # when step warmup+steps would launch
    if cuda:
        torch.cuda.synchronize()
    gaps = [(b - a) * 1e3 for a, b in zip(stamps[warmup:], stamps[warmup + 1:])]
    return statistics.median(gaps)


def _batch(torch, m: Model, attention, b: int, context: int, steps: int, warmup: int, cuda: bool) -> dict:
    step = Step(m, attention, b, context, 0, 0)
    step.run()  # first run: cuBLAS picks its algorithms, caches fill
    # The graph's own output buffer becomes step.logits, which each replay rewrites.
    graph = capture(torch, step.run) if cuda else None
    launch = graph.replay if cuda else step.run
    step_ms: list[float] = []
    repeats: dict[tuple[str, float], list[float]] = {(mode, w): [] for w in HOST_WORK_MS for mode in MODES}
    for _ in range(REPEATS):
        step_ms += _time_ms(torch, launch, WARM + TIMED, cuda)[WARM:]
        for w in HOST_WORK_MS:
            for mode in MODES:
                repeats[(mode, w)].append(round(_loop(torch, launch, step, mode, w, steps, warmup, cuda), 4))
    del graph, launch, step
    if cuda:
        torch.cuda.empty_cache()
    return {"batch": b, "context_each": context, "step_ms": round(statistics.median(step_ms), 4),
            "step_ms_min": round(min(step_ms), 4), "step_ms_max": round(max(step_ms), 4),
            "loops": [{"mode": mode, "host_work_ms": w, "repeats_ms": ms} for (mode, w), ms in repeats.items()]}


def sync(args) -> None:
    start = time.perf_counter()
    import torch
    cuda = args.device.startswith("cuda")
    if args.steps < 1 or args.warmup < 1:
        raise SystemExit("--steps and --warmup must be at least 1")
    cfg = QWEN3_8B if args.config == "qwen3-8b" else TINY
    batches, context = SHAPES[args.config]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    m = Model(torch, cfg, args.device, context)
    attention = Attention(torch, args.device)
    data = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda if cuda else None, "config_name": args.config, "config": cfg,
            "params": m.params(), "timing": "cuda-graph" if cuda else "eager",
            "context_each": context, "steps": args.steps, "warmup": args.warmup, "repeats": REPEATS,
            "graph_replays": TIMED, "host_work_ms": HOST_WORK_MS, "modes": MODES, "batches": []}
    print(json.dumps({k: data[k] for k in ("device", "torch", "cuda", "config_name", "timing")}), flush=True)
    for b in batches:
        t0 = time.perf_counter()
        entry = _batch(torch, m, attention, b, context, args.steps, args.warmup, cuda)
        data["batches"].append(entry)
        data["elapsed_s"] = round(time.perf_counter() - start, 1)  # torch's import and the model's build too
        (out / "sync.json").write_text(json.dumps(data, indent=1) + "\n")
        print(f"\nbatch {b} x {context} cached (graph alone {entry['step_ms']:.3f} ms; "
              f"measured in {time.perf_counter() - t0:.0f} s)", flush=True)
        print("\n".join(table(entry)), flush=True)
    print(f"\nwrote {out / 'sync.json'}")
