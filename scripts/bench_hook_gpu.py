"""The vLLM hook's CUDA entropy path on a GPU, as its logits processor calls it
(`meridian_hook.probe.entropies(logits[rows], T, "cuda")`: pyo3 into meridian-kernels,
the kernel on torch's current stream over the tensor's own memory, the rows read back).

Checks, and exits non-zero when one fails: the CUDA path is the one that ran (no
fallback to the CPU path); it agrees with the CPU path for fp32, bf16 and fp16 rows,
contiguous or picked out of a larger batch; it is ordered on the caller's stream (logits
written on a side stream behind a long matmul are read only once written). Then times a
call at 1, 16, 64 and 256 rows of Qwen3's vocabulary: what the engine's thread spends
(host wall time, read-back included) and the GPU time of the call's kernels, beside the
same entropy computed with PyTorch ops.

Run by scripts/bench-hook-gpu.sh; writes docs/src/benchmarks/hook-gpu.md."""

from __future__ import annotations

import logging
import statistics
import sys
import time

import numpy as np
import torch

import meridian_hook
from meridian_hook.probe import entropies
from gpucurve.paths import DATA
from gpucurve.trace import shortest_step_ms

VOCAB = 151_936
T = 0.6
REPS = 50


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def torch_entropy(x: torch.Tensor, t: float) -> list[float]:
    logp = torch.log_softmax(x.float() / t, dim=-1)
    return (-(logp.exp() * logp).sum(-1)).tolist()


def agreement(gen: torch.Generator) -> list[tuple[str, str, float]]:
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for batch, vocab in ((1, VOCAB), (7, 1000), (64, VOCAB)):
            x = (torch.randn(2 * batch, vocab, device="cuda", generator=gen) * 4.0).to(dtype)
            for how, sel in (("contiguous", x[:batch]), ("every other row", x[::2])):
                got = entropies(sel, T, "cuda")
                want = entropies(sel.float().cpu().numpy(), T, "cpu")
                err = max(abs(a - b) for a, b in zip(got, want))
                rows.append((f"{str(dtype).removeprefix('torch.')} [{batch}, {vocab}]", how, err))
    return rows


def stream_order(gen: torch.Generator, on_legacy_stream: bool = False) -> float:
    """Logits filled on a side stream behind a long matmul, their entropy asked for on
    that stream at once: the kernel must see the filled logits, not the zeros before
    them. Returns the largest error against the filled rows' entropies. With
    `on_legacy_stream`, the kernel is launched on CUDA's legacy default stream instead
    (the control: what a kernel on the wrong stream reads)."""
    src = torch.randn(16, VOCAB, device="cuda", generator=gen) * 4.0
    want = entropies(src.cpu().numpy(), T, "cpu")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=gen)
    logits = torch.zeros(16, VOCAB, device="cuda")
    out = torch.empty(16, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(4):
            a = a @ a  # several ms of work ahead of the copy on this stream
        logits.copy_(src)
        if on_legacy_stream:
            meridian_hook._native.kernels.entropy(logits.data_ptr(), str(logits.dtype), tuple(logits.shape), 0,
                                                  out.data_ptr(), T, device=f"cuda:{logits.device.index}")
        else:
            got = entropies(logits, T, "cuda")
    torch.cuda.synchronize()
    if on_legacy_stream:
        got = out.tolist()
    return max(abs(g - w) for g, w in zip(got, want))


def timing(gen: torch.Generator, batch: int) -> dict:
    x = torch.randn(batch, VOCAB, device="cuda", generator=gen) * 4.0
    out = {}
    for name, fn in (("hook", lambda: entropies(x, T, "cuda")), ("torch", lambda: torch_entropy(x, T))):
        fn()
        torch.cuda.synchronize()
        wall = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            fn()  # returns host floats: the read-back waits for the kernels
            wall.append((time.perf_counter() - t0) * 1e6)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        gpu = []
        for _ in range(REPS):
            start.record()
            fn()
            end.record()
            end.synchronize()
            gpu.append(start.elapsed_time(end) * 1e3)
        out[name] = (statistics.median(wall), statistics.median(gpu))
    return out


def main() -> int:
    out_md = sys.argv[1]
    if not torch.cuda.is_available():
        sys.exit("no CUDA device seen by torch")
    reason = meridian_hook._native.kernels.cuda_unavailable_reason()
    if reason:
        sys.exit(f"the hook's CUDA path is unavailable here: {reason}")
    captured = Captured()
    logging.getLogger("meridian_hook").addHandler(captured)
    gen = torch.Generator(device="cuda").manual_seed(0)
    agree = agreement(gen)
    order_err = stream_order(gen)
    control_err = stream_order(gen, on_legacy_stream=True)
    zeros_h = float(np.log(VOCAB))
    times = {b: timing(gen, b) for b in (1, 16, 64, 256)}
    worst = max(e for _, _, e in agree)
    step256 = shortest_step_ms(DATA, 256)
    ok_agree, ok_order, ok_cuda = worst <= 1e-5, order_err <= 1e-5, not captured.messages
    name = torch.cuda.get_device_name()
    lines = [
        "# The hook's entropy on a GPU",
        "",
        "Generated by `scripts/bench-hook-gpu.sh` on a machine with an NVIDIA GPU and PyTorch (the hook's",
        "wheel installed beside them; no vLLM needed). It calls `meridian_hook.probe.entropies(rows, T,",
        '"cuda")` as the hook\'s logits processor does for the thinking rows of a step when an entropy',
        "exit is configured: pyo3 into meridian-kernels, the kernel enqueued on torch's current stream over",
        "the tensor's own memory, the entropies read back as Python floats.",
        "",
        f"Device: {name}; PyTorch {torch.__version__}; hook {meridian_hook.__version__}; temperature {T}.",
        "",
        "## Checks",
        "",
        f"- The CUDA path ran, with no fallback to the CPU path: **{'yes' if ok_cuda else 'no'}**"
        + ("" if ok_cuda else f" ({'; '.join(captured.messages[:3])})") + ".",
        f"- Agreement with the CPU path over fp32, bf16 and fp16 rows, contiguous and picked out of a "
        f"larger batch: largest difference {worst:.1e} (**{'within' if ok_agree else 'outside'}** 1e-5).",
        f"- Ordered on the caller's stream: logits filled on a side stream behind four 8192³ matmuls and "
        f"read at once on that stream give their own entropies (largest difference {order_err:.1e}, "
        f"**{'ordered' if ok_order else 'NOT ordered'}**; read before the fill, they would give "
        f"{zeros_h:.2f} nats, the entropy of the zeros). The control, the same kernel launched on CUDA's "
        f"legacy default stream instead, is off by {control_err:.2f} nats: "
        + ("the check tells the right stream from a wrong one here." if control_err > 1e-3 else
           "it read the filled logits too, so on this machine the check cannot tell a wrong stream apart."),
        "",
        "| rows | how | largest difference from the CPU path |",
        "|---|---|---|",
        *[f"| {shape} | {how} | {e:.1e} |" for shape, how, e in agree],
        "",
        "## Cost per call",
        "",
        f"fp32 rows of {VOCAB} logits (what vLLM hands logits processors). Host: wall time of the call on",
        "the calling thread, the read-back included (what the engine's thread spends); GPU: between two",
        f"CUDA events around the call. Medians of {REPS} calls. PyTorch: the same entropies by",
        "`log_softmax`, `exp`, multiply and `sum`, read back with `.tolist()`.",
        "",
        "| rows | hook, host µs | hook, GPU µs | PyTorch, host µs | PyTorch, GPU µs |",
        "|---|---|---|---|---|",
        *[f"| {b} | {t['hook'][0]:.0f} | {t['hook'][1]:.0f} | {t['torch'][0]:.0f} | {t['torch'][1]:.0f} |"
          for b, t in times.items()],
        "",
        f"At 256 rows the hook's call costs the engine's thread {times[256]['hook'][0]:.0f} µs, "
        f"{times[256]['torch'][0] / times[256]['hook'][0]:.1f}x less than the PyTorch ops"
        + (f"; a step of 256 decodes of a Qwen3-8B-shaped model took {step256[0]:.1f} ms at the least on "
           f"{step256[1]} (gpu-step-curve.md)" if step256 else "")
        + ". The read-back "
        "is a synchronisation: the call returns once the step's forward pass and the kernel are done, "
        "which under vLLM's async scheduling would hold the engine core's thread: the logits processor "
        "under Model Runner V2 therefore keeps the kernel's values on the device and copies them to the "
        "host without waiting, reading them a step later (hook-v2-gpu.md).",
        "",
    ]
    with open(out_md, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0 if ok_agree and ok_order and ok_cuda else 1


if __name__ == "__main__":
    sys.exit(main())
