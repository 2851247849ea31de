"""GPU benchmark and agreement check of meridian-kernels' CUDA entropy, through the C ABI
(ctypes) on PyTorch tensors: the kernel launched on torch's current stream on the
tensors' own memory, against the usual PyTorch computation, timed with CUDA events.

Run by scripts/bench-kernels-gpu.sh; writes docs/src/benchmarks/kernels-gpu.md."""

import ctypes
import statistics
import sys

import torch

VOCAB = 151_936
T = 0.6
REPS = 20


def torch_entropy(x, t):
    """The usual PyTorch way: log_softmax, then -sum p log p."""
    logp = torch.log_softmax(x.float() / t, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def load(path):
    lib = ctypes.CDLL(path)
    lib.meridian_kernels_entropy.restype = ctypes.c_int32
    lib.meridian_kernels_entropy.argtypes = [
        ctypes.c_void_p, ctypes.c_int32, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_float,
        ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint32]
    lib.meridian_kernels_last_error.restype = ctypes.c_char_p
    lib.meridian_kernels_cuda_available.restype = ctypes.c_int32
    return lib


def peak_bandwidth_gbs():
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, clock, bus = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), torch.cuda.current_device())
    cuda.cuDeviceGetAttribute(ctypes.byref(clock), 36, dev)  # memory clock, kHz
    cuda.cuDeviceGetAttribute(ctypes.byref(bus), 37, dev)    # bus width, bits
    return 2.0 * clock.value * 1e3 * bus.value / 8 / 1e9


def time_ms(f):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    f()
    times = []
    for _ in range(REPS):
        start.record()
        f()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    lib = load(sys.argv[1])
    out_md = sys.argv[2]
    torch.zeros(1, device="cuda")  # context first: the kernels use torch's primary context
    if not lib.meridian_kernels_cuda_available():
        sys.exit(f"CUDA path unavailable: {lib.meridian_kernels_last_error().decode()}")
    codes = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
    peak = peak_bandwidth_gbs()
    name = torch.cuda.get_device_name()
    rows = []
    for batch, dtype in [(256, torch.float32), (256, torch.bfloat16), (256, torch.float16), (32, torch.float32)]:
        g = torch.Generator(device="cuda").manual_seed(batch)
        x = (torch.randn(batch, VOCAB, device="cuda", generator=g) * 3.0).to(dtype)
        out = torch.empty(batch, device="cuda", dtype=torch.float32)
        stream = torch.cuda.current_stream().cuda_stream

        def kernel():
            rc = lib.meridian_kernels_entropy(x.data_ptr(), codes[dtype], batch, VOCAB, T, out.data_ptr(), 1, stream, 0)
            if rc != 0:
                raise RuntimeError(lib.meridian_kernels_last_error().decode())

        kernel()
        torch.cuda.synchronize()
        want = torch_entropy(x.double(), T)
        err = (out.double() - want).abs().max().item()
        k_ms = time_ms(kernel)
        t_ms = time_ms(lambda: torch_entropy(x, T))
        gbs = x.numel() * x.element_size() / (k_ms * 1e-3) / 1e9
        rows.append((batch, str(dtype).replace("torch.", ""), k_ms, gbs, gbs / peak, t_ms, t_ms / k_ms, err))
        print(f"[{batch}, {VOCAB}] {dtype}: kernel {k_ms:.3f} ms {gbs:.0f} GB/s ({gbs/peak:.0%} of {peak:.0f}), "
              f"torch {t_ms:.3f} ms, ratio {t_ms/k_ms:.1f}x, max |err| {err:.1e}")
    f32 = rows[0]
    lines = [
        "# Entropy kernels: GPU path",
        "",
        "Reproduce with `scripts/bench-kernels-gpu.sh` on a machine with an NVIDIA GPU and PyTorch.",
        f"Device: {name}; peak DRAM bandwidth {peak:.0f} GB/s (from the memory clock and bus width).",
        f"Medians of {REPS} launches timed with CUDA events, temperature {T}. The PyTorch reference",
        "is the usual `logp = log_softmax(x.float()/T); H = -(logp.exp()*logp).sum(-1)`. Error: the",
        "largest deviation from a float64 PyTorch evaluation.",
        "",
        "| shape | dtype | kernel | effective GB/s | of peak | PyTorch | ratio | max abs error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b, d, k, g, frac, t, r, e in rows:
        lines.append(f"| [{b}, {VOCAB}] | {d} | {k:.3f} ms | {g:.0f} | {frac:.0%} | {t:.3f} ms | {r:.1f}x | {e:.1e} |")
    ok_bw, ok_ratio = f32[4] >= 0.85, f32[6] >= 3.0
    lines += ["", f"Targets on [256, 151936] fp32: >= 85% of memory bandwidth: **{'met' if ok_bw else 'missed'}** "
              f"({f32[4]:.0%}); >= 3x PyTorch: **{'met' if ok_ratio else 'missed'}** ({f32[6]:.1f}x).", ""]
    with open(out_md, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {out_md}")


if __name__ == "__main__":
    main()
