"""The page on what the hook's per-step device reads cost under vLLM's async scheduling
(docs/src/benchmarks/hook-gpu-sync.md), from `python3 -m gpucurve sync`'s sync.json.
Standard library only, so the page can be written wherever the JSON was copied; every
figure on the page is computed here from the JSON."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HOST_WORK_MS = [0.0, 0.5, 1.0, 2.0, 4.0]
MODES = ["overlapped", "read-ids", "read-ids+entropy"]
VERDICT_HOST_WORK_MS = 2.0  # the verdict's host work, where measured (a middling scheduler step)
WHAT = {"read-ids": "reading the ids each step", "read-ids+entropy": "reading the ids and the entropies each step"}


def rows(entry: dict) -> list[dict]:
    """One row per (host work, mode), in the order measured: the median over the repeats'
    per-step medians, their min and max, the no-overlap sum (graph + W) and the ratio to
    the overlapped loop at the same W."""
    median = {(x["mode"], x["host_work_ms"]): statistics.median(x["repeats_ms"]) for x in entry["loops"]}
    out = []
    for x in entry["loops"]:
        mode, w, ms = x["mode"], x["host_work_ms"], x["repeats_ms"]
        base = median.get(("overlapped", w))
        out.append({"mode": mode, "host_work_ms": w, "median_ms": median[(mode, w)], "min_ms": min(ms),
                    "max_ms": max(ms), "repeats": len(ms), "step_ms": entry["step_ms"],
                    "no_overlap_ms": entry["step_ms"] + w,
                    "ratio": median[(mode, w)] / base if base else None})
    return out


def table(entry: dict) -> list[str]:
    """The batch's rows as a Markdown table (also what `sync` prints as it goes)."""
    rs = rows(entry)
    out = [f"| host work W | mode | wall per step (median) | spread over {rs[0]['repeats']} repeats "
           "| graph alone | graph + W (no overlap) | against overlapped |",
           "|---|---|---|---|---|---|---|"]
    for r in rs:
        cost = "" if r["ratio"] is None or r["mode"] == "overlapped" else f"{r['ratio'] - 1:+.1%} ({r['ratio']:.2f}x)"
        out.append(f"| {r['host_work_ms']:g} ms | {r['mode']} | {r['median_ms']:.3f} ms "
                   f"| {r['min_ms']:.3f}–{r['max_ms']:.3f} ms | {r['step_ms']:.3f} ms "
                   f"| {r['no_overlap_ms']:.3f} ms | {cost} |")
    return out


def verdicts(data: dict) -> list[str]:
    lines = []
    for entry in data["batches"]:
        by = {(r["mode"], r["host_work_ms"]): r for r in rows(entry)}
        works = sorted({w for _, w in by})
        w = VERDICT_HOST_WORK_MS if VERDICT_HOST_WORK_MS in works else works[len(works) // 2]
        o = by[("overlapped", w)]
        parts = [f"{WHAT[mode]} makes a step {by[(mode, w)]['ratio']:.2f}x as long as overlapped "
                 f"({by[(mode, w)]['median_ms']:.3f} ms against {o['median_ms']:.3f} ms, "
                 f"{by[(mode, w)]['median_ms'] - o['median_ms']:+.3f} ms)"
                 for mode in WHAT if (mode, w) in by]
        lines.append(f"At batch {entry['batch']} with {w:g} ms of host work, " + "; ".join(parts) +
                     f". The graph alone takes {o['step_ms']:.3f} ms, graph + host work {o['no_overlap_ms']:.3f} ms.")
        if ("read-ids", 0.0) in by and ("overlapped", 0.0) in by:
            d = by[("read-ids", 0.0)]["median_ms"] - by[("overlapped", 0.0)]["median_ms"]
            lines.append(f"At batch {entry['batch']} with no host work, the ids read alone adds {d:+.3f} ms a step "
                         "(the host's wait, the copy, and the launch that follows it).")
    ratios = [r["ratio"] for e in data["batches"] for r in rows(e) if r["mode"] == "read-ids" and r["ratio"]]
    if ratios:
        lines.append(f"Over every batch and host work measured, reading the ids makes a step between "
                     f"{min(ratios):.2f}x and {max(ratios):.2f}x as long as overlapped.")
    return lines


def page(data: dict) -> str:
    cfg = data["config"]
    params = f"{data['params'] / 1e9:.2f}B" if data["params"] >= 1e9 else f"{data['params'] / 1e6:.2f}M"
    shape = (f"{data['config_name']}: {cfg['layers']} layers, hidden {cfg['hidden']}, {cfg['heads']} query and "
             f"{cfg['kv_heads']} KV heads of {cfg['head_dim']}, vocabulary {cfg['vocab']}, "
             f"{params} random bf16 parameters")
    timing = ("each step one CUDA graph replay" if data["timing"] == "cuda-graph"
              else "each step run eagerly (no CUDA graph)")
    cuda = f" (CUDA {data['cuda']})" if data.get("cuda") else ""
    out = [
        "# The hook's per-step device reads under async scheduling",
        "",
        "Until its Model Runner V2 step was rewritten (`meridian_hook/v2_batch.py`, which now reads a step",
        "late without waiting: [hook-v2-gpu.md](hook-v2-gpu.md)), the hook's logits processor copied the",
        "step's input ids to the host every step (`ctx.input_ids.cpu()`), and with an entropy exit",
        "configured read the thinking rows' entropies back as Python floats. This page measures what such",
        "reads cost. Under vLLM's asynchronous scheduling the CPU",
        "prepares step k+1 (scheduler, input preparation, detokenisation) while the GPU runs step k. A",
        "blocking read inside step k holds the CPU until the GPU has finished step k's forward, so the",
        "host work for the next step then runs while the GPU idles: host and GPU time add instead of",
        "overlapping. This page measures by how much, with no vLLM: decode steps of a model of",
        "Qwen3-8B's shape, and host work as a busy spin of W ms per step.",
        "",
        "Modes: **overlapped** launches step k, spins W, then waits for step k-1 (one step behind, two",
        "batches in flight) before launching step k+1; **read-ids** also copies step k's input ids (a",
        "[batch] int64 tensor) to the host right after launching it, as the hook does;",
        "**read-ids+entropy** then also reads back the entropies of the step's [batch, vocab] fp32 logits",
        "(PyTorch's `log_softmax`, standing in for the hook's entropy kernel) with `.tolist()`.",
        "",
        "Reproduce on a machine with an NVIDIA GPU and PyTorch: `(cd scripts && python3 -m gpucurve sync)`,",
        "then `(cd scripts && python3 -m gpucurve sync-report)` (this page; no GPU needed), or both with",
        "`scripts/bench-hook-gpu-sync.sh`. How the loop is built: `scripts/gpucurve/sync.py`.",
        "",
        "Graph + W is what a step would take if the host work and the step added and the step ran as",
        "in a lone replay. A step's GPU time is not fixed: back to back it can run slower than alone,",
        "and with the GPU idle between steps, faster, so a measured step can come in a little under",
        "that sum; each batch below gives its step alone and back to back.",
        "",
        f"Device: {data['device']}; PyTorch {data['torch']}{cuda}. Model: {shape}. Steps: decodes over "
        f"{data['context_each']} cached tokens each, {timing}. Each loop: {data['warmup']} steps, then "
        f"{data['steps']} timed (a step's wall time is the interval between two launches; the loop gives the "
        f"median); the grid of modes and host work ran {data['repeats']} times, interleaved. "
        f"The graph alone: {'CUDA events' if data['timing'] == 'cuda-graph' else 'the host clock'} around "
        f"{data['graph_replays']} lone replays per repeat, the median."
        + (f" The measurement took {data['elapsed_s']:.0f} s in all." if "elapsed_s" in data else ""),
        "",
    ]
    if data["timing"] != "cuda-graph":
        out += ["**Measured on a CPU: no graphs, no streams, nothing overlaps. A smoke test, not a result.**", ""]
    out += ["## Verdict", ""] + [f"- {line}" for line in verdicts(data)] + [""]
    for entry in data["batches"]:
        b = entry["batch"]
        back_to_back = [r for r in rows(entry) if r["mode"] == "overlapped" and r["host_work_ms"] == 0]
        out += [f"## Batch {b}", "",
                f"{b} decode{'s' if b != 1 else ''} over {entry['context_each']} cached tokens each; the graph "
                f"alone {entry['step_ms']:.3f} ms ({entry['step_ms_min']:.3f}–{entry['step_ms_max']:.3f})"
                + (f", back to back (overlapped, no host work) {back_to_back[0]['median_ms']:.3f} ms"
                   if back_to_back else "") + ".", ""]
        out += table(entry) + [""]
    out += [
        "## What this leaves out",
        "",
        "- vLLM's host work is Python that also launches kernels and copies inputs; here it is a spin",
        "  that touches no device. The spin measures the overlap lost, not vLLM's host cost.",
        "- The hook reads the ids only in steps where some row has a token it has not seen (every decode",
        "  step, in practice) and the entropies only for rows still thinking; here every step reads all rows.",
        "- The hook's entropy runs its own CUDA kernel; here PyTorch's `log_softmax` stands in, so the",
        "  entropy mode's GPU time is PyTorch's, not the hook's.",
        "- Decode steps only, one GPU; no prompt chunks, no tensor parallelism.",
        "",
    ]
    return "\n".join(out)


def sync_report(args) -> None:
    src = Path(args.data) / "sync.json"
    if not src.exists():
        raise SystemExit(f"{src} not found: run `(cd scripts && python3 -m gpucurve sync)` on a GPU machine first")
    data = json.loads(src.read_text())
    if not data.get("batches"):
        raise SystemExit(f"{src} holds no measured batch")
    dest = Path(args.page)
    dest.write_text(page(data))
    print(f"wrote {dest}")
