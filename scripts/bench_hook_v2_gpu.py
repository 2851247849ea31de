"""The hook's logits processor under Model Runner V2 on a real GPU, with no vLLM: does its
step ever wait for the device, does it still end every thought at exactly the right token,
and what does it cost an engine step under asynchronous scheduling?

Run by scripts/bench-hook-v2-gpu.sh (the hook's wheel installed beside PyTorch). Writes the
figures as JSON and the page docs/src/benchmarks/hook-v2-gpu.md.

What runs is the hook's own V2 step (``meridian_hook.v2_batch.V2Batch`` over the native
``ExitController``), the code ``MeridianLogitsProcessor.apply`` runs under V2; only the
class shell that vLLM instantiates is left out (it imports vLLM). This script plays the
engine around it, all on the device: each step's logits, the sampled tokens (argmax after
the hook's forcing), the token history V2 keeps per slot (``all_token_ids``) and the ids
fed to the next step, rows reordered every step as V2 reorders them.

1. Checks. 64 requests with prompts ending in ``<think>``: most with a think budget (8 to
   71 tokens), some whose "model" ends its thought itself before any budget, two slots
   handed to new requests mid-run. Every hook step runs under
   ``torch.cuda.set_sync_debug_mode("error")``, which raises at any operation that waits
   for the device (``.cpu()``, ``.tolist()`` or ``.item()`` on a device tensor, a copy to
   pageable memory); the hook's own deliberate waits (``Event.synchronize``, taken only
   when an exit hinges on a token still in flight) are counted instead. Afterwards the
   token history is read back: every budgeted request thought exactly its budget, every
   request emitted exactly one end-of-thinking token. Then the same with the RPDI entropy
   exit (the CUDA entropy kernel each step, its values read late).
2. Cost. Decode steps of a Qwen3-8B-shaped model (scripts/gpucurve, random bf16 weights,
   one CUDA graph per batch), in a loop that overlaps W = 2 ms of host work with the
   GPU's step as vLLM's async scheduling does (launch step k, host work, wait for step
   k-1). Modes: ``overlapped`` (no hook); ``blocking-read`` (the read the hook made before
   this change: the step's ids copied to the host right after launch); ``hook-v2`` (the
   hook's V2 step as shipped, no exit due); ``hook-v2+entropy`` (with the RPDI entropy
   exit: the kernel and the late read of its values). Median step interval over 40 steps,
   3 interleaved repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from meridian_hook import _native
from meridian_hook.v2_batch import V2Batch, force

THINK_START, THINK_END = 151667, 151668  # Qwen3's <think> and </think>
VOCAB = 151_936
PROMPT = [1, 2, 3, THINK_START]
WIDTH = 256  # token history per slot
HOST_WORK_MS = 2.0
BATCHES = [64, 256]
CONTEXT = 1024
STEPS, WARMUP, REPEATS = 40, 5, 3
MODES = ["overlapped", "blocking-read", "hook-v2", "hook-v2+entropy"]


class Engine:
    """The parts of Model Runner V2 the hook reads, on the device, with a toy model."""

    def __init__(self, slots: int, dev: str, seed: int) -> None:
        self.dev = dev
        self.prompt_len = SimpleNamespace(np=np.zeros(slots, dtype=np.int32))
        self.prefill_len = SimpleNamespace(np=np.zeros(slots, dtype=np.int32))
        self.all_token_ids = SimpleNamespace(gpu=torch.zeros(slots, WIDTH, dtype=torch.int32, device=dev))
        self.length = np.zeros(slots, dtype=np.int64)  # the engine's own count, on the host
        self.live: list[int] = []
        self.gen = torch.Generator(device=dev).manual_seed(seed)
        self.rng = np.random.default_rng(seed)

    def admit(self, slot: int) -> None:
        self.prompt_len.np[slot] = len(PROMPT)
        self.prefill_len.np[slot] = len(PROMPT)
        self.all_token_ids.gpu[slot].zero_()
        self.all_token_ids.gpu[slot, : len(PROMPT)] = torch.tensor(PROMPT, dtype=torch.int32, device=self.dev)
        self.length[slot] = len(PROMPT)
        if slot not in self.live:
            self.live.append(slot)

    def batch(self) -> tuple[np.ndarray, SimpleNamespace]:
        """This step's rows (V2 reorders them every step) and the logits context."""
        order = np.array(self.rng.permutation(self.live), dtype=np.int32)
        idx = torch.from_numpy(order.astype(np.int64)).to(self.dev)
        # The token fed at each row: the slot's latest committed token.
        last = torch.from_numpy(self.length[order] - 1).to(self.dev)
        input_ids = self.all_token_ids.gpu[idx, last]
        ctx = SimpleNamespace(idx_mapping_np=order, seq_lens_upper_bound_np=self.length[order].copy(), input_ids=input_ids)
        return order, ctx

    def logits(self, rows: int, natural_end_rows: list[int]) -> torch.Tensor:
        x = torch.randn(rows, VOCAB, device=self.dev, generator=self.gen)
        x[:, THINK_START] = -1e9
        x[:, THINK_END] = -1e9  # the toy model never ends its thought unless told below
        for r in natural_end_rows:
            x[r, THINK_END] = 1e9
        return x

    def commit(self, order: np.ndarray, sampled: torch.Tensor) -> None:
        idx = torch.from_numpy(order.astype(np.int64)).to(self.dev)
        pos = torch.from_numpy(self.length[order]).to(self.dev)
        self.all_token_ids.gpu[idx, pos] = sampled.to(torch.int32)
        self.length[order] += 1


def _controller(signal: str) -> _native.ExitController:
    return _native.ExitController([THINK_START], [THINK_END], signal, 16, 8, 1.5, None, use_directives=False)


def _metric(name: str) -> float:
    for line in _native.render_metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _count_deliberate_waits() -> None:
    """The hook's own waits (``V2Batch._land(block=True)``, taken when an exit hinges on a
    value in flight) run with the debug mode lifted: they are meant, and counted by
    ``V2Batch.waits``. Every other wait in its step still raises."""
    land = V2Batch._land

    def deliberate(self: V2Batch, block: bool) -> None:
        if not block:
            return land(self, block)
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("default")
        try:
            return land(self, block)
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    V2Batch._land = deliberate  # type: ignore[method-assign]


def check(dev: str, entropy: bool, steps: int = 90) -> dict:
    """Runs 64 requests through the hook's V2 step; returns what was checked."""
    n = 64
    eng = Engine(n + 2, dev, seed=7 if entropy else 3)
    ctl = _controller("rpdi" if entropy else "off")
    batch = V2Batch(ctl, eng, entropy)
    budget: dict[int, int | None] = {}
    natural: dict[int, int] = {}  # slot -> the output index at which the toy model ends its thought
    for s in range(n):
        eng.admit(s)
        if s % 5 == 0:
            budget[s], natural[s] = None, 6 + (s * 3) % 40
        else:
            budget[s] = 8 + (s * 7) % 64
            if s % 7 == 0:
                natural[s] = budget[s] - 3  # ends itself 3 tokens before its budget
        ctl.add(s, [], None, budget[s])
        batch.add(s)
    reused = [20, 41]  # at step 30 these slots' requests leave mid-thought; new ones take the slots
    histories: dict[int, list[int]] = {}
    entropy_rows_before = _metric("meridian_hook_entropy_rows_total")
    forced_before = _metric('meridian_hook_forced_exits_total{reason="budget"}')
    syncs_caught = []
    t0 = time.perf_counter()
    for k in range(steps):
        if k == 30:
            for s in reused:
                # Values of the old occupant's tokens may still be in flight: the hook must
                # not apply them to the new one.
                ctl.remove(s)
                eng.admit(s)
                budget[s] = 12
                natural.pop(s, None)
                ctl.add(s, [], None, 12)
                batch.add(s)
        order, ctx = eng.batch()
        ends = [r for r, s in enumerate(order) if natural.get(int(s)) == eng.length[s] - len(PROMPT)]
        logits = eng.logits(len(order), ends)
        torch.cuda.set_sync_debug_mode("error")
        try:
            forced = batch.step(logits, ctx)
            force(logits, forced)
        except RuntimeError as e:  # a wait the hook did not mean
            where = [ln.strip() for ln in traceback.format_exc().splitlines() if ln.strip().startswith("File")]
            syncs_caught.append(f"step {k}: {e} (at {where[-1] if where else '?'})")
            forced = []
        finally:
            torch.cuda.set_sync_debug_mode("default")
        eng.commit(order, logits.argmax(dim=-1))
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    for s in eng.live:
        histories[s] = eng.all_token_ids.gpu[s, : eng.length[s]].tolist()
    wrong = []
    ended = 0
    for s, h in histories.items():
        out = h[len(PROMPT):]
        ends_at = [i for i, t in enumerate(out) if t == THINK_END]
        if len(ends_at) != 1:
            wrong.append(f"slot {s}: {len(ends_at)} end-of-thinking tokens in {len(out)}")
            continue
        ended += 1
        want = natural.get(s)
        b = budget.get(s)
        if want is None or (b is not None and b < want):
            want = b
        if ends_at[0] != want:
            wrong.append(f"slot {s}: thought {ends_at[0]} tokens, expected {want}")
    return {"entropy": entropy, "requests": len(histories) + len(reused), "steps": steps, "ended": ended,
            "wrong": wrong, "syncs_caught": syncs_caught[:5], "syncs_caught_n": len(syncs_caught),
            "waits": batch.waits, "budget_exits": _metric('meridian_hook_forced_exits_total{reason="budget"}') - forced_before,
            "entropy_rows": _metric("meridian_hook_entropy_rows_total") - entropy_rows_before,
            "elapsed_s": round(elapsed, 2)}


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _loop(launch, step, mode: str, b: int) -> float:
    """Median launch-to-launch interval (ms) under async scheduling with HOST_WORK_MS of
    host work per step; the hook modes run its V2 step on the step's logits."""
    hook = None
    if mode.startswith("hook"):
        entropy = mode.endswith("entropy")
        slots = b
        state = SimpleNamespace(
            prompt_len=SimpleNamespace(np=np.full(slots, len(PROMPT), dtype=np.int32)),
            prefill_len=SimpleNamespace(np=np.full(slots, len(PROMPT), dtype=np.int32)),
            all_token_ids=SimpleNamespace(gpu=torch.full((slots, 8), THINK_START, dtype=torch.int32, device="cuda")),
        )
        ctl = _controller("rpdi" if entropy else "off")
        hook = V2Batch(ctl, state, entropy)
        for s in range(slots):
            ctl.add(s, [], None, None)
            hook.add(s)
        order = np.arange(slots, dtype=np.int32)
        seq = np.full(slots, len(PROMPT), dtype=np.int64)
    done = [torch.cuda.Event(), torch.cuda.Event()]
    stamps = []
    for k in range(WARMUP + STEPS):
        stamps.append(time.perf_counter())
        launch()
        done[k % 2].record()
        if mode == "blocking-read":
            step.ids.cpu()
        elif hook is not None:
            ctx = SimpleNamespace(idx_mapping_np=order, seq_lens_upper_bound_np=seq, input_ids=step.ids[:b])
            force(step.logits, hook.step(step.logits, ctx))
            seq = seq + 1
        _spin(HOST_WORK_MS / 1e3)
        if k:
            done[(k - 1) % 2].synchronize()
    stamps.append(time.perf_counter())
    torch.cuda.synchronize()
    gaps = [(b2 - a) * 1e3 for a, b2 in zip(stamps[WARMUP:], stamps[WARMUP + 1:])]
    if hook is not None and hook.waits:
        print(f"{mode}: the hook waited for the device {hook.waits} times", flush=True)
    return statistics.median(gaps)


def cost() -> list[dict]:
    from gpucurve.measure import capture
    from gpucurve.model import QWEN3_8B, Attention, Model, Step

    torch.manual_seed(0)
    m = Model(torch, QWEN3_8B, "cuda", CONTEXT)
    attention = Attention(torch, "cuda")
    out = []
    for b in BATCHES:
        step = Step(m, attention, b, CONTEXT, 0, 0)
        step.run()
        graph = capture(torch, step.run)
        runs: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(REPEATS):
            for mode in MODES:
                runs[mode].append(round(_loop(graph.replay, step, mode, b), 4))
        out.append({"batch": b, "context_each": CONTEXT, "host_work_ms": HOST_WORK_MS, "repeats_ms": runs})
        print(json.dumps(out[-1]), flush=True)
        del graph, step
        torch.cuda.empty_cache()
    return out


def page(data: dict) -> str:
    lines = [
        "# The hook's V2 step on a GPU: no waits for the device",
        "",
        "Generated by `scripts/bench-hook-v2-gpu.sh` on a machine with an NVIDIA GPU and PyTorch (the",
        "hook's wheel installed beside them; no vLLM). It runs the hook's logits-processor step under",
        "Model Runner V2 (`meridian_hook/v2_batch.py`, over the native `ExitController`) with the",
        "script playing the engine on the device; how, in `scripts/bench_hook_v2_gpu.py`.",
        "",
        f"Device: {data['device']}; PyTorch {data['torch']}; hook {data['hook']}.",
        "",
        "Before this change the step read its fed ids back with `.cpu()` every step (and the entropies",
        "with `.tolist()`), holding the engine's CPU until the GPU finished the step's forward",
        "([hook-gpu-sync.md](hook-gpu-sync.md)). Now it copies them to pinned host memory without",
        "waiting and hands their values to the controller a step or more later; it waits only when an",
        "exit hinges on a token still in flight.",
        "",
        "## Checks",
        "",
        "Every hook step ran under `torch.cuda.set_sync_debug_mode(\"error\")`: an operation that waits",
        "for the device raises there (PyTorch calls the mode a prototype that does not yet catch every",
        "synchronising operation; the cost table below is the second witness). The hook's deliberate",
        "waits, taken when an exit hinges on a value still in flight, ran with the mode lifted and are",
        "counted instead.",
        "",
        "| run | requests | steps | operations that waited | deliberate waits | budget exits | thoughts ended once, at the right token | wrong |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in data["checks"]:
        name = "RPDI entropy exit on" if c["entropy"] else "budgets, natural ends"
        lines.append(f"| {name} | {c['requests']} | {c['steps']} | {c['syncs_caught_n']} | {c['waits']} | "
                     f"{c['budget_exits']:.0f} | {c['ended']} | {'; '.join(c['wrong']) or 'none'} |")
    ok = all(not c["wrong"] and not c["syncs_caught_n"] for c in data["checks"])
    lines += ["", f"Verdict: {'**met**' if ok else '**missed**'}: no operation waited for the device, and every "
              "thought that ended ended once, at its budget or where the model ended it."
              if ok else f"Verdict: **missed**: {[c['syncs_caught'] or c['wrong'] for c in data['checks']]}"]
    ent = next((c for c in data["checks"] if c["entropy"]), None)
    if ent is not None:
        lines.append(f"With the entropy exit on, {ent['entropy_rows']:.0f} entropies reached the RPDI signal late, "
                     "read without a wait.")
    lines += ["", "## Cost per step under asynchronous scheduling", "",
              f"Decode steps of a Qwen3-8B-shaped model over {CONTEXT} cached tokens each, one CUDA graph "
              f"replay per step, {HOST_WORK_MS:g} ms of host work overlapped with each; median launch "
              f"interval over {STEPS} steps, {REPEATS} repeats interleaved (median of the repeats, "
              "min-max in brackets).", "",
              "| batch | " + " | ".join(MODES) + " | hook-v2 / overlapped | blocking-read / overlapped |",
              "|---:|" + "---:|" * (len(MODES) + 2)]
    for c in data["cost"]:
        med = {m: statistics.median(v) for m, v in c["repeats_ms"].items()}
        cells = [f"{med[m]:.3f} ({min(c['repeats_ms'][m]):.3f}-{max(c['repeats_ms'][m]):.3f})" for m in MODES]
        lines.append(f"| {c['batch']} | " + " | ".join(cells) +
                     f" | {med['hook-v2'] / med['overlapped']:.3f}x | {med['blocking-read'] / med['overlapped']:.3f}x |")
    lines += ["", "Reproduce: `scripts/bench-hook-v2-gpu.sh` (about 2 minutes on an H200).", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--page", required=True)
    ap.add_argument("--no-cost", action="store_true", help="the checks only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    import meridian_hook
    data = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "hook": meridian_hook.__version__}
    _count_deliberate_waits()
    data["checks"] = [check("cuda", entropy=False), check("cuda", entropy=True)]
    print(json.dumps(data["checks"], indent=1), flush=True)
    data["cost"] = [] if args.no_cost else cost()
    Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    Path(args.page).write_text(page(data))
    failed = any(c["wrong"] or c["syncs_caught_n"] for c in data["checks"])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
