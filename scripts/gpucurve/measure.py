"""Times engine steps of every shape on the GPU (CUDA graph and eager) and breaks a few
down by kernel family; writes step traces in meridian_hook.steptrace's format."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from .model import QWEN3_8B, TINY, Attention, Model, Step

# The step shapes, within the profile's engine limits (max_num_seqs 256,
# max_num_batched_tokens 8192, ~350k cached tokens).
DECODE_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
DECODE_CONTEXTS = [128, 1024, 4096]
PREFILL_CHUNKS = [16, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
PREFILL_PREFIXES = [0, 4096, 16384]
MIXED = [(b, 1024, n) for b in (16, 64, 128) for n in (256, 1024, 4096, 8192 - b)]
TIMED = 10
WARM = 3


def _shapes(quick: bool):
    """(decode_reqs, decode_context_each, prefill_tokens, prefill_prefix) per step."""
    if quick:
        return [(1, 128, 0, 0), (4, 128, 0, 0), (16, 64, 0, 0), (0, 0, 32, 0), (0, 0, 64, 32),
                (0, 0, 128, 0), (4, 64, 32, 0), (8, 64, 64, 0), (2, 32, 16, 16), (32, 32, 0, 0),
                (0, 0, 16, 0), (8, 128, 0, 0)]
    out = [(b, l, 0, 0) for l in DECODE_CONTEXTS for b in DECODE_BATCHES]
    out += [(0, 0, n, c) for c in PREFILL_PREFIXES for n in PREFILL_CHUNKS]
    out += [(b, l, n, 0) for b, l, n in MIXED]
    return out


def _time_ms(torch, fn, reps: int, cuda: bool) -> list[float]:
    out = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def capture(torch, run):
    """`run` captured as one CUDA graph, after a warm-up on a side stream, as capture wants."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        run()
    return graph


def graph_times(torch, run) -> list[float]:
    """`run` captured as one CUDA graph and its replays timed: TIMED of them after WARM."""
    graph = capture(torch, run)
    times = _time_ms(torch, graph.replay, WARM + TIMED, True)[WARM:]
    del graph
    return times


def _device_facts(torch, cuda: bool) -> dict:
    facts = {"torch": torch.__version__}
    if not cuda:
        return facts | {"device": "cpu"}
    p = torch.cuda.get_device_properties(0)
    facts |= {"device": torch.cuda.get_device_name(), "sms": p.multi_processor_count,
              "memory_gib": round(p.total_memory / 2 ** 30, 1), "cuda": torch.version.cuda}
    # What this card actually moves and computes, for setting the datasheet figures beside.
    src = torch.empty(2 * 2 ** 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = statistics.median(_time_ms(torch, lambda: dst.copy_(src), 10, True))
    facts["copy_tb_s"] = round(2 * src.numel() / (ms * 1e-3) / 1e12, 2)  # read + write
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = statistics.median(_time_ms(torch, lambda: a @ a, 10, True))
    facts["matmul_tflops"] = round(2 * 8192 ** 3 / (ms * 1e-3) / 1e12)
    del a
    torch.cuda.empty_cache()
    return facts


BREAKDOWN_SHAPES = [(1, 1024, 0, 0), (64, 1024, 0, 0), (256, 1024, 0, 0), (0, 0, 2048, 0), (0, 0, 8192, 16384)]
MATMUL_KERNELS = ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "splitk")
ATTENTION_KERNELS = ("flash", "fmha", "attention", "attn")


def breakdown(torch, m: Model, attention, shapes) -> list[dict]:
    """GPU time per kernel family in a step, from PyTorch's profiler over eager runs
    (the same kernels a graph replays, without the launch gaps between them)."""
    from torch.profiler import ProfilerActivity, profile
    out = []
    for b, l, n, c in shapes:
        step = Step(m, attention, b, l, n, c)
        step.run()
        torch.cuda.synchronize()
        runs = 3
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                step.run()
            torch.cuda.synchronize()
        fam = {"matmul": [0.0, 0], "attention": [0.0, 0], "other": [0.0, 0]}
        top = []
        events = [e for e in prof.key_averages() if "CUDA" in str(e.device_type)]
        if not events:  # older profilers file kernels under the CPU ops that launched them
            events = [e for e in prof.key_averages() if not e.key.startswith("aten::")]
        for e in events:
            us = e.self_device_time_total
            if not us or e.count == 0:
                continue
            name = e.key.lower()
            # Attention first: FlashAttention's kernel names carry cutlass types.
            kind = ("attention" if any(k in name for k in ATTENTION_KERNELS)
                    else "matmul" if any(k in name for k in MATMUL_KERNELS) else "other")
            fam[kind][0] += us / 1e3 / runs
            fam[kind][1] += e.count // runs
            top.append((us / 1e3 / runs, kind, e.key[:120]))
        row = {"decode_reqs": b, "decode_context_each": l, "prefill_tokens": n, "prefill_context": c}
        for kind, (ms, count) in fam.items():
            row[f"{kind}_ms"], row[f"{kind}_kernels"] = round(ms, 4), count
        row["top_kernels"] = [[round(ms, 4), kind, name] for ms, kind, name in sorted(top, reverse=True)[:8]]
        print("breakdown", json.dumps(row), flush=True)
        out.append(row)
        del step
        torch.cuda.empty_cache()
    return out


def breakdown_only(args) -> None:
    """Re-takes the kernel breakdown alone into an existing measurement's meta.json."""
    import torch
    out = Path(args.out)
    meta = json.loads((out / "meta.json").read_text())
    max_pos = max(max(l, c + n) for _, l, n, c in BREAKDOWN_SHAPES) + 1
    m = Model(torch, QWEN3_8B, "cuda", max_pos)
    meta["breakdown"] = breakdown(torch, m, Attention(torch, "cuda"), BREAKDOWN_SHAPES)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def _keep_or_drop_earlier(out: Path, facts: dict) -> None:
    """An earlier measurement in `out` from the same device and PyTorch becomes a repeat
    (`repeatN-steps-graph.jsonl`, which the page reads for run-to-run spread); one from
    another machine is dropped with its repeats and fused steps, which would not compare."""
    meta_path = out / "meta.json"
    if not meta_path.exists():
        return
    old = json.loads(meta_path.read_text()).get("facts", {})
    same = all(old.get(k) == facts.get(k) for k in ("device", "torch"))
    trace = out / "steps-graph.jsonl"
    if same and trace.exists():
        taken = [int(p.name.removeprefix("repeat").split("-")[0]) for p in out.glob("repeat*-steps-graph.jsonl")]
        trace.rename(out / f"repeat{max(taken, default=0) + 1}-steps-graph.jsonl")
    elif not same:
        for p in [*out.glob("repeat*-steps-graph.jsonl"), out / "fused.json"]:
            p.unlink(missing_ok=True)


def measure(args) -> None:
    import torch
    cuda = args.device.startswith("cuda")
    cfg = QWEN3_8B if args.config == "qwen3-8b" else TINY
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    facts = _device_facts(torch, cuda)
    print(json.dumps(facts), flush=True)
    _keep_or_drop_earlier(out, facts)
    shapes = _shapes(args.config == "tiny")
    max_pos = max(max(l, c + n) for _, l, n, c in shapes) + 1
    m = Model(torch, cfg, args.device, max_pos)
    attention = Attention(torch, args.device)
    meta = {"config": cfg, "params": m.params(), "facts": facts, "timed_reps": TIMED,
            "attention": {"decode": [str(b) for b in attention.decode_path], "prefill": attention.prefill_path}}
    print(json.dumps(meta["attention"]), f"{m.params() / 1e9:.2f}B params", flush=True)
    traces = {"graph": [], "eager": []}
    clock = 0.0
    for b, l, n, c in shapes:
        step = Step(m, attention, b, l, n, c)
        shape = {"tokens": b + n, "prefill_tokens": n, "decode_reqs": b, "decode_context": b * l,
                 "prefill_context": c, "preempted": 0, "decode_context_each": l}
        step.run()  # first run: cuBLAS picks its algorithms, caches fill
        if cuda:
            torch.cuda.synchronize()
        times = {"eager": _time_ms(torch, step.run, WARM + TIMED, cuda)[WARM:]}
        if cuda:
            try:
                times["graph"] = graph_times(torch, step.run)
            except RuntimeError as e:  # said in the page: the fit then lacks this shape
                meta.setdefault("graph_failures", []).append({"shape": shape, "error": str(e)[:300]})
                print(f"graph capture failed: {str(e)[:300]}", flush=True)
        for kind, ms in times.items():
            for x in ms:
                clock += x / 1e3
                traces[kind].append(shape | {"t": round(clock, 6), "step_s": x / 1e3})
        print(f"decode {b:>3} x {l:>5}  prefill {n:>5} after {c:>5}:  " +
              "  ".join(f"{k} {statistics.median(v):8.2f} ms" for k, v in times.items()), flush=True)
        del step
        if cuda:
            torch.cuda.empty_cache()
    if cuda:
        meta["breakdown"] = breakdown(torch, m, attention, BREAKDOWN_SHAPES)
    for kind, rows in traces.items():
        if rows:
            (out / f"steps-{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out}")
