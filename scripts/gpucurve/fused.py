"""A few steps again with their elementwise work fused by torch.compile, as vLLM compiles
its model before capturing its graphs: how much of the plain step's time the unfused
norms, rotary, SiLU and residual adds account for, measured rather than argued."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from .measure import graph_times
from .model import QWEN3_8B, Attention, Model, Step

SHAPES = [(1, 1024, 0, 0), (64, 1024, 0, 0), (0, 0, 2048, 0)]


def fused(args) -> None:
    import torch
    out = Path(args.out)
    max_pos = max(max(l, c + n) for _, l, n, c in SHAPES) + 1
    m = Model(torch, QWEN3_8B, "cuda", max_pos)
    attention = Attention(torch, "cuda")
    rows = []
    for b, l, n, c in SHAPES:
        step = Step(m, attention, b, l, n, c)
        plain = statistics.median(graph_times(torch, step.run))
        compiled = torch.compile(step.run)
        t0 = time.perf_counter()
        compiled()  # compiles (inductor fuses the elementwise ops into its own kernels)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        row = {"decode_reqs": b, "decode_context_each": l, "prefill_tokens": n, "prefill_context": c,
               "plain_ms": round(plain, 4), "fused_ms": round(statistics.median(graph_times(torch, compiled)), 4),
               "compile_s": round(compile_s, 1)}
        print("fused", json.dumps(row), flush=True)
        rows.append(row)
        # Written after each shape: a run cut short keeps what it measured.
        (out / "fused.json").write_text(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                                                    "steps": rows}, indent=1) + "\n")
        del step, compiled
        torch.cuda.empty_cache()
