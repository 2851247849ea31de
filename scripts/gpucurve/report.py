"""Fits the twin's cost model to the measured steps and writes the page: the datasheet
profile and the fit beside every measured step, where a step's GPU time goes, how
runs repeat, and what the measured profile changes in the twin's policy A/B."""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import tomllib
from pathlib import Path

from .twin import ab_side_by_side

from .paths import PAGE, ROOT
from .cards import card_dirs, card_section
from .trace import groups, key, name, read_trace
DATASHEET = "h100-qwen3-8b"
MEASURED = "h100-qwen3-8b-pytorch"
H100_DENSE_BF16_TFLOPS = 989  # datasheet, dense (the figure the profile takes 50% of)
# The datasheet profile's own weight read (its derivation in profiles.toml): 16.4 GB at 3.35 TB/s.
DATASHEET_WEIGHT_READ_S = 16.4e9 / 3.35e12


def profile(name: str) -> dict:
    """A profile's table out of the twin's profiles.toml."""
    for p in tomllib.loads((ROOT / "loadtest/twin/profiles.toml").read_text())["profile"]:
        if p["name"] == name:
            return p
    raise SystemExit(f"no profile {name!r} in loadtest/twin/profiles.toml")


def predict(p: dict, s: dict) -> float:
    """The twin's step time (loadtest/twin/src/cost.rs) for a traced step's shape."""
    n, c = s["prefill_tokens"], s["prefill_context"]
    tokens = max(s["tokens"], p.get("weight_read_tokens", 0.0))
    return (p["fixed_s"] + p["per_token_s"] * tokens + p.get("per_decode_request_s", 0.0) * s["decode_reqs"]
            + p["per_context_token_s"] * s["decode_context"]
            + p.get("per_prefill_attention_s", 0.0) * n * (c + n / 2.0))


def err(pred: float, got: float) -> float:
    return (pred - got) / got


def sim(*args: str, stdin: str | None = None) -> str:
    cmd = ["cargo", "run", "--quiet", "--release", "--locked", "-p", "meridian-sim", "--", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, input=stdin, cwd=ROOT).stdout


def plot(path: Path, title: str, x_label: str, series: list[tuple[str, list[tuple[float, float]]]]) -> None:
    spec = {"title": title, "x_label": x_label, "y_label": "ms",
            "series": [{"name": name, "points": pts} for name, pts in series]}
    sim("plot", "--out", str(path), stdin=json.dumps(spec))


def fit_profile(data: Path, meta: dict, sheet: dict, name: str = MEASURED) -> tuple[dict, dict, str]:
    """`meridian-sim calibrate --steps` on the graph trace, with the datasheet profile's
    engine limits, as profile `name`; returns the fitted profile, the fit's figures and
    its printout."""
    toml_path = data / "fitted-profile.toml"
    trace = data / "steps-graph.jsonl"
    # Relative to the repository (sim runs there), so the profile's derivation names no machine's path.
    trace_arg = str(trace.relative_to(ROOT)) if trace.is_relative_to(ROOT) else str(trace)
    printout = sim(
        "calibrate", "--steps", trace_arg, "--json", str(data / "fit.json"),
        "--profile-out", str(toml_path), "--name", name, "--gpu", meta["facts"].get("device", "unknown"),
        "--model", "Qwen3-8B shape, random bf16 weights, plain PyTorch step replayed as a CUDA graph",
        "--kv-blocks", str(sheet["kv_blocks"]), "--block-size", str(sheet["block_size"]),
        "--max-num-seqs", str(sheet["max_num_seqs"]), "--max-num-batched-tokens", str(sheet["max_num_batched_tokens"]),
        # A sweep of shapes, each timed alone: its residuals are the fit's error by shape,
        # not how a serving engine's steps vary, so the forecasts' steps take the fit's time.
        "--no-spread")
    fitted = tomllib.loads(toml_path.read_text())["profile"][0]
    return fitted, json.loads((data / "fit.json").read_text())["fit"], printout


def fit_without_floor(data: Path) -> dict:
    """The same fit in the datasheet profiles' form (`calibrate --no-floor`): its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fit.json"
        sim("calibrate", "--steps", str(data / "steps-graph.jsonl"), "--no-floor", "--json", str(out))
        return json.loads(out.read_text())["fit"]


def repeat_spread(data: Path, steps: dict[tuple, dict]) -> tuple[int, float, float] | None:
    """Across the repeat runs kept beside the main one: for each shape, the largest
    relative distance of a run's median from the main run's; their median and maximum."""
    repeats = sorted(data.glob("repeat*-steps-graph.jsonl"))
    if not repeats:
        return None
    runs = [groups(read_trace(p)) for p in repeats]
    dists = [max(abs(err(run[k]["step_s"], s["step_s"])) for run in runs if k in run)
             for k, s in steps.items() if any(k in run for run in runs)]
    return len(repeats) + 1, statistics.median(dists), max(dists)


def step_table(rows: list[dict]) -> list[str]:
    out = ["| decoding requests | cached tokens each | chunk tokens | chunk prefix | measured ms (spread) "
           "| eager ms | datasheet ms (error) | fitted ms (error) |", "|---|---|---|---|---|---|---|---|"]
    for s in rows:
        out.append(
            f"| {s['decode_reqs']} | {s['decode_context_each']} | {s['prefill_tokens']} | {s['prefill_context']} "
            f"| {s['step_s'] * 1e3:.2f} ({s['spread_s'] * 1e3:.2f}) | {s['eager_s'] * 1e3:.2f} "
            f"| {s['sheet_s'] * 1e3:.2f} ({err(s['sheet_s'], s['step_s']):+.0%}) "
            f"| {s['fit_s'] * 1e3:.2f} ({err(s['fit_s'], s['step_s']):+.0%}) |")
    return out


def attention_kernel_sentence(row: dict) -> str:
    """Which attention kernel the profiler saw, and what follows for vLLM."""
    kernels = [k for _, kind, k in row.get("top_kernels", []) if kind == "attention"]
    if not kernels:
        return "The profiler's largest kernels name no attention kernel."
    kernel = kernels[0].split("<")[0].removeprefix("void ").strip()
    if "pytorch_flash" in kernel:
        return (f"The attention kernel is `{kernel}`, the FlashAttention-2 PyTorch ships; vLLM on Hopper runs "
                "FlashAttention-3, faster on the same work, so the fitted prefill-attention term is an upper "
                "bound for vLLM.")
    return f"The attention kernel is `{kernel}`."


def breakdown_section(meta: dict, steps: dict[tuple, dict]) -> list[str]:
    """Where the GPU time of a few steps goes, and what follows for vLLM's own steps."""
    rows = meta.get("breakdown") or []
    if not rows:
        return ["No kernel breakdown was taken with this measurement."]
    cfg = meta["config"]
    head_bytes = cfg["vocab"] * cfg["hidden"] * 2
    weight_bytes = meta["params"] * 2 - head_bytes  # the embedding table is looked up, not read whole
    out = ["| step | graph ms | matmul ms (kernels) | attention ms (kernels) | other ms (kernels) |",
           "|---|---|---|---|---|"]
    for r in rows:
        s = steps.get(key(r))
        out.append(f"| {name(r)} | {s['step_s'] * 1e3:.2f} | {r['matmul_ms']:.2f} ({r['matmul_kernels']}) "
                   f"| {r['attention_ms']:.2f} ({r['attention_kernels']}) | {r['other_ms']:.2f} ({r['other_kernels']}) |"
                   if s else f"| {name(r)} | n/a | {r['matmul_ms']:.2f} | {r['attention_ms']:.2f} | {r['other_ms']:.2f} |")
    out.append("")
    one = next((r for r in rows if r["decode_reqs"] == 1), None)
    if one:
        out.append(
            f"- One decode: the matmul kernels read the {weight_bytes / 1e9:.1f} GB of weights (all but the "
            f"embedding table) in {one['matmul_ms']:.2f} ms, {weight_bytes / one['matmul_ms'] / 1e9:.2f} TB/s; "
            f"{one['other_kernels']} other kernels (norms, rotary, SiLU, residual adds, copies, the sampler) "
            f"take {one['other_ms']:.2f} ms. vLLM fuses most of those (RMSNorm with the residual add, rotary "
            "in place, SiLU with the multiply), so its fixed cost per step sits below this measurement's.")
    big = max((r for r in rows if r["prefill_tokens"]), key=lambda r: r["prefill_tokens"] * r["prefill_context"],
              default=None)
    if big:
        n, c = big["prefill_tokens"], big["prefill_context"]
        layers, heads, hd = cfg["layers"], cfg["heads"], cfg["head_dim"]
        attn_flop = 4 * n * (c + n / 2) * heads * hd * layers
        mm_flop = 2 * n * (meta["params"] - 2 * cfg["vocab"] * cfg["hidden"]) + 2 * cfg["vocab"] * cfg["hidden"]
        out.append(
            f"- A {n}-token chunk after {c}: matmuls at {mm_flop / big['matmul_ms'] / 1e9:.0f} TFLOP/s "
            f"({mm_flop / big['matmul_ms'] / 1e9 / H100_DENSE_BF16_TFLOPS:.0%} of the {H100_DENSE_BF16_TFLOPS} "
            f"TFLOP/s datasheet figure), attention at {attn_flop / big['attention_ms'] / 1e9:.0f} TFLOP/s and "
            f"{big['attention_ms'] / (big['matmul_ms'] + big['attention_ms'] + big['other_ms']):.0%} of the "
            f"step. {attention_kernel_sentence(big)}")
    return out


def fused_section(data: Path, sheet: dict, steps: dict[tuple, dict]) -> list[str]:
    """The steps taken again with torch.compile's fusion (`python3 -m gpucurve fused`)."""
    path = data / "fused.json"
    if not path.exists():
        return ["Not taken with this measurement (`python3 -m gpucurve fused` on a GPU)."]
    fused = json.loads(path.read_text())
    device = json.loads((data / "meta.json").read_text())["facts"].get("device")
    if fused.get("device") != device:
        return [f"`fused.json` was taken on {fused.get('device')!r}, not on this measurement's {device!r}: "
                "not shown. Run `python3 -m gpucurve fused` again on the same machine."]
    out = [
        f"`python3 -m gpucurve fused` (PyTorch {fused['torch']}): the same step under `torch.compile`, whose",
        "Inductor fuses the norms, rotary, SiLU and residual adds into its own kernels, as vLLM compiles",
        "its model, then replayed as a CUDA graph; beside it the plain step in the same run.",
        "",
        "| step | plain ms | fused ms | fused / plain | datasheet profile ms (error vs fused) |",
        "|---|---|---|---|---|",
    ]
    for r in fused["steps"]:
        s = steps.get(key(r))
        pred = predict(sheet, s) * 1e3 if s else None
        out.append(f"| {name(r)} | {r['plain_ms']:.2f} | {r['fused_ms']:.2f} | {r['fused_ms'] / r['plain_ms']:.2f} "
                   f"| {pred:.2f} ({err(pred, r['fused_ms']):+.0%}) |" if pred else
                   f"| {name(r)} | {r['plain_ms']:.2f} | {r['fused_ms']:.2f} | {r['fused_ms'] / r['plain_ms']:.2f} | n/a |")
    saved = [r["plain_ms"] - r["fused_ms"] for r in fused["steps"]]
    ratios = [r["fused_ms"] / r["plain_ms"] for r in fused["steps"]]
    misses = []
    for r in fused["steps"]:
        s = steps.get(key(r))
        if s:
            misses.append(f"{err(predict(sheet, s) * 1e3, r['fused_ms']):+.0%} at {name(r)}")
    out += ["", f"Fusion takes {min(saved):.1f} to {max(saved):.1f} ms off these steps ({1 - max(ratios):.0%} to "
            f"{1 - min(ratios):.0%} of them), so the profile fitted to the plain steps overstates a fused, "
            "vLLM-like step by about that share. Against the fused steps the datasheet profile is "
            + ", ".join(misses) + "."]
    return out


def report(args) -> None:
    data = Path(args.data).resolve()
    meta = json.loads((data / "meta.json").read_text())
    sheet = profile(DATASHEET)
    fitted, fit, printout = fit_profile(data, meta, sheet)
    no_floor = fit_without_floor(data)
    steps = groups(read_trace(data / "steps-graph.jsonl"))
    eager = groups(read_trace(data / "steps-eager.jsonl"))
    for k, s in steps.items():
        s["sheet_s"], s["fit_s"], s["eager_s"] = predict(sheet, s), predict(fitted, s), eager[k]["step_s"]
    rows = list(steps.values())
    decode = [s for s in rows if s["prefill_tokens"] == 0]
    prefill = [s for s in rows if s["decode_reqs"] == 0]
    mixed = [s for s in rows if s["decode_reqs"] and s["prefill_tokens"]]
    sheet_err = [abs(err(s["sheet_s"], s["step_s"])) for s in rows]
    fit_err = [abs(err(s["fit_s"], s["step_s"])) for s in rows]
    worst = max(rows, key=lambda s: abs(err(s["sheet_s"], s["step_s"])))
    bias = lambda v: statistics.median(err(s["sheet_s"], s["step_s"]) for s in v)
    one = min(decode, key=lambda s: (s["decode_reqs"], s["decode_context_each"]))
    launch = statistics.median(s["eager_s"] / s["step_s"] for s in decode if s["decode_reqs"] <= 8)
    facts, cfg = meta["facts"], meta["config"]
    weight_gb = meta["params"] * 2 / 1e9
    read_gb = weight_gb - cfg["vocab"] * cfg["hidden"] * 2 / 1e9  # the embedding table is looked up, not read
    spread = repeat_spread(data, steps)
    failures = meta.get("graph_failures", [])
    # The datasheet profile recast with a floor: its weight read as tokens' worth of its
    # per-token cost, the rest of its fixed cost kept.
    floored = sheet | {"fixed_s": sheet["fixed_s"] - DATASHEET_WEIGHT_READ_S,
                       "weight_read_tokens": DATASHEET_WEIGHT_READ_S / sheet["per_token_s"]}
    floored_err = [abs(err(predict(floored, s), s["step_s"])) for s in rows]
    floored_bias = statistics.median(err(predict(floored, s), s["step_s"]) for s in decode)

    plots = []
    for l in sorted({s["decode_context_each"] for s in decode}):
        row = sorted((s for s in decode if s["decode_context_each"] == l), key=lambda s: s["decode_reqs"])
        plots.append((f"decode-{l}", f"decode steps, {l} cached tokens per request", "requests decoding", [
            ("measured (CUDA graph)", [(s["decode_reqs"], s["step_s"] * 1e3) for s in row]),
            ("eager PyTorch", [(s["decode_reqs"], s["eager_s"] * 1e3) for s in row]),
            ("fitted profile", [(s["decode_reqs"], s["fit_s"] * 1e3) for s in row]),
            ("datasheet profile", [(s["decode_reqs"], s["sheet_s"] * 1e3) for s in row])]))
    for c in sorted({s["prefill_context"] for s in prefill}):
        row = sorted((s for s in prefill if s["prefill_context"] == c), key=lambda s: s["prefill_tokens"])
        plots.append((f"prefill-{c}", f"prompt-chunk steps after {c} computed tokens", "tokens in the chunk", [
            ("measured (CUDA graph)", [(s["prefill_tokens"], s["step_s"] * 1e3) for s in row]),
            ("fitted profile", [(s["prefill_tokens"], s["fit_s"] * 1e3) for s in row]),
            ("datasheet profile", [(s["prefill_tokens"], s["sheet_s"] * 1e3) for s in row])]))
    for slug, title, x_label, series in plots:
        plot(data / f"{slug}.svg", title, x_label, series)
    images = lambda prefix: [f"![{t}](gpu-step-curve/{n}.svg)" for n, t, _, _ in plots if n.startswith(prefix)]

    def term(name, scale, unit):
        a, b = sheet.get(name, 0.0), fitted.get(name, 0.0)
        ratio = f"{b / a:.2f}x" if a else "not in the datasheet profile"
        return f"| `{name}` | {a * scale:.4g} {unit} | {b * scale:.4g} {unit} | {ratio} |"

    ab_lines = ab_side_by_side(sim, data, sheet, DATASHEET, MEASURED)
    cards = [line for card in card_dirs(data)
             for line in [*card_section(card, meta, steps, fitted,
                                        lambda d, m, n: fit_profile(d, m, sheet, n)[:2]), ""]]
    lines = [
        "# GPU step-time curve: the twin's H100 profile against a measurement",
        "",
        f"The twin's `{DATASHEET}` profile was derived from datasheets (weights read at the HBM",
        "datasheet bandwidth, matmuls at 50% of datasheet FLOPS, KV reads at datasheet bandwidth).",
        "This page times engine steps of a Qwen3-8B-shaped model (random bf16 weights) on a real",
        "GPU and sets both the datasheet profile and a profile fitted to these timings beside them.",
        "",
        "Reproduce: `scripts/bench-step-curve-gpu.sh` on a machine with an NVIDIA GPU and PyTorch",
        "(writes the traces under `docs/src/benchmarks/gpu-step-curve/`; `(cd scripts && python3 -m",
        "gpucurve fused)` adds the fused steps, about 3 minutes of compiling), then, where cargo is,",
        "`(cd scripts && python3 -m gpucurve report)` (rewrites this page). How a step is built and",
        "what it leaves out of a vLLM step: `scripts/gpucurve/__init__.py`. The fitted profile is",
        f"`gpu-step-curve/fitted-profile.toml` (`meridian-sim ... --profile-file` it, `--profile {MEASURED}`).",
        "",
        f"Device: {facts.get('device')}, {facts.get('sms')} SMs, {facts.get('memory_gib')} GiB, PyTorch "
        f"{facts.get('torch')} (CUDA {facts.get('cuda')}). Measured beside the steps: a device-to-device "
        f"copy at {facts.get('copy_tb_s')} TB/s (bytes read and written) and an 8192³ bf16 matmul at "
        f"{facts.get('matmul_tflops')} TFLOP/s. Model: {meta['params'] / 1e9:.2f}B parameters "
        f"({weight_gb:.1f} GB in bf16), {cfg['layers']} layers, hidden {cfg['hidden']}, {cfg['heads']} query and "
        f"{cfg['kv_heads']} KV heads of {cfg['head_dim']}, MLP {cfg['intermediate']}, vocabulary {cfg['vocab']}. "
        f"Attention: decode through {', '.join(meta['attention']['decode'])}, prompt chunks with "
        f"{meta['attention']['prefill']} KV heads. Each step shape: {meta['timed_reps']} timed replays "
        "(CUDA events) after warm-up; medians, spread = max - min."
        + (f" The whole measurement was taken {spread[0]} times: a shape's median moved by {spread[1]:.1%} "
           f"between runs at the median shape, {spread[2]:.1%} at most." if spread else "")
        + (f" {len(failures)} shapes could not be captured as a CUDA graph and are missing from the fit: "
           + "; ".join(f"{f['shape']['decode_reqs']} decodes + {f['shape']['prefill_tokens']} chunk tokens "
                       f"({f['error'][:80]})" for f in failures) + "." if failures else ""),
        "",
        "## Verdict",
        "",
        f"- The datasheet profile predicts these {len(rows)} step shapes (each its median replay) with a median "
        "error of "
        f"{statistics.median(sheet_err):.0%} (worst {abs(err(worst['sheet_s'], worst['step_s'])):.0%}, at "
        f"{worst['decode_reqs']} decodes + a {worst['prefill_tokens']}-token chunk after "
        f"{worst['prefill_context']}). Its median error is {bias(decode):+.0%} on decode-only steps, "
        f"{bias(prefill):+.0%} on prompt-chunk steps and {bias(mixed):+.0%} on mixed steps (negative: the "
        "profile predicts faster steps than measured).",
        f"- Fitted to the same steps (`meridian-sim calibrate --steps`, least absolute deviation), the "
        f"twin's cost model reaches a median error of {statistics.median(fit_err):.1%} over the shapes' "
        f"medians (worst "
        f"{max(fit_err):.0%}; R² {fit['r_squared']:.3f})"
        + (f", with a weight-read floor of {fitted['weight_read_tokens']:.0f} tokens: a step's matmuls read "
           "every weight whatever the batch, so a step of fewer tokens costs as much as one of that many. "
           f"Without the floor (the datasheet form, `calibrate --no-floor`) the median error per timed step is "
           f"{no_floor['median_abs_pct_error']:.1f}% against {fit['median_abs_pct_error']:.1f}%: one linear "
           "per-token cost then sits between a decode step's memory-bound matmuls and a prompt chunk's "
           "compute-bound ones."
           if fitted.get("weight_read_tokens", 0) > 0 else "; the fit found no weight-read floor."),
        f"- Recast with a floor from its own arithmetic (the weight read, "
        f"{DATASHEET_WEIGHT_READ_S * 1e3:.1f} ms, as {floored['weight_read_tokens']:.0f} tokens' worth; fixed "
        f"{floored['fixed_s'] * 1e3:.1f} ms), the datasheet profile would be {statistics.median(floored_err):.0%} "
        f"off at the median and {floored_bias:+.0%} on decode-only steps: its figures do not give the floor "
        "the measurement shows, so it keeps the additive form.",
        f"- One request decoding over {one['decode_context_each']} cached tokens takes "
        f"{one['step_s'] * 1e3:.2f} ms against the datasheet profile's {one['sheet_s'] * 1e3:.2f} ms: the whole "
        f"step reads {read_gb:.1f} GB of weights (all but the embedding table, which is only looked up): "
        f"{read_gb / one['step_s'] / 1e3:.2f} TB/s averaged over the step; the breakdown below shows where "
        "the time goes.",
        f"- Without CUDA graphs (eager PyTorch, one launch per op) small decode steps take "
        f"{launch:.1f}x as long: the launch overhead vLLM's graph replay removes, and a reason a serving "
        "stack that does not replay graphs misses these figures.",
        "",
        "## The cost-model terms",
        "",
        "| term | datasheet profile | fitted here | fitted / datasheet |",
        "|---|---|---|---|",
        term("fixed_s", 1e3, "ms"),
        term("per_token_s", 1e6, "µs"),
        term("per_decode_request_s", 1e6, "µs"),
        term("per_context_token_s", 1e9, "ns"),
        term("per_prefill_attention_s", 1e12, "ps"),
        term("weight_read_tokens", 1, "tokens"),
        "",
        f"Fit: {fit['formula']}; median |error| {fit['median_abs_pct_error']:.1f}%, "
        f"R² {fit['r_squared']:.3f} over {fit['samples']} timed steps.",
        "",
        "## Where a step's GPU time goes",
        "",
        "Kernel times from PyTorch's profiler over eager runs of the same step (the kernels a graph",
        "replays, without the launch gaps), summed by family: matmul (cuBLAS), attention",
        "(FlashAttention), other (everything else).",
        "",
        *breakdown_section(meta, steps),
        "",
        "## With the elementwise work fused",
        "",
        *fused_section(data, sheet, steps),
        "",
        "## What the measured profile changes in the twin's A/B",
        "",
        *ab_lines,
        "",
        *cards,
        "## Decode steps",
        "",
        *images("decode"),
        "",
        *step_table(decode),
        "",
        "## Prompt-chunk steps",
        "",
        *images("prefill"),
        "",
        *step_table(prefill),
        "",
        "## Mixed steps (decodes and a prompt chunk together, as chunked prefill schedules them)",
        "",
        *step_table(mixed),
        "",
    ]
    PAGE.write_text("\n".join(lines))
    print(printout)
    print(f"wrote {PAGE}")
