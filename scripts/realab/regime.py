"""Which hardware a real-engine rig stands for: the ratios that decide what a scheduler
can win, measured on the rig's stock engine during the runs and on an H100
(`gpu-step-curve/`, a Qwen3-8B-shaped model replayed as CUDA graphs), side by side.

A policy that keeps answers out of long steps wins by how much longer a step carrying a
prompt chunk is than a decode step, and loses by how much a batch's extra requests
slow a step; a rig whose ratios are a GPU's says something about that GPU."""

from __future__ import annotations

import gzip
import json
import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import stalls

#: Decode batches whose step time the table compares with a batch of 1 to 3.
BATCHES = (8, 16, 32)
#: The H100's decode context for the comparison: the long workload's requests decode
#: over ~1,000-1,200 tokens.
H100_CONTEXT = 1024


#: Prefixes (in full chunks) at which a chunk step is compared: the H100's traces have
#: 2,048-token chunks after 0, 4,096 and 16,384 tokens, i.e. after 0, 2 and 8 chunks.
PREFIX_CHUNKS = (0, 2, 8)


def stock_windows(data: dict, work: str | None = None) -> list[tuple[float, float]]:
    """The measured runs' windows on the stock engine (stock and proxy-only runs): the
    steps the regime table's rig column reads, and those the twin's curve is drawn from
    for its column (`forecast.calibrate`), so the two columns compare the same steps.
    With `work` (a work directory's name), only the runs measured there, whose times are
    that trace's clock (`run_trace`); a run that does not name its work counts for any."""
    return [tuple(r["window"]) for r in data["runs"] if r["config"] in ("stock", "proxy") and r.get("window")
            and (work is None or r.get("work") in (None, work))]


def step_shape(data: dict) -> dict | None:
    """From the stock engine's step trace during the measured runs: the median step
    computing a full prompt chunk (at least three quarters of the engine's token budget,
    or 1,536 tokens when the budget is larger than any prompt), the median decode-only
    step of 1 to 3 requests and their ratio; the same ratio for chunks after 0, 2 and 8
    chunks of prefix (within one chunk); the median decode-only step at each of BATCHES
    (within a quarter of it) over the small one; and each workload's median prompt in
    tokens as the server counted it (from the stock runs' raw files)."""
    budget = int(data["setup"]["engine"].get("max_num_batched_tokens", 2048))
    full_chunk = min(1536, int(0.75 * budget))
    chunk, small = [], []
    by_prefix: dict[int, list[float]] = {k: [] for k in PREFIX_CHUNKS}
    by_batch: dict[int, list[float]] = {b: [] for b in BATCHES}
    prompts: dict[str, list[int]] = {}
    for work in data.get("work", []):
        for f in sorted((Path(work) / "runs").glob("*-stock.json")):
            name = f.name.split("-")[0]
            for r in json.loads(f.read_text())["runs"][0]["requests"]:
                if r.get("prompt_tokens"):
                    prompts.setdefault(name, []).append(r["prompt_tokens"])
        trace = Path(work) / "stock-steps.jsonl"
        if not trace.exists():
            continue
        windows = stock_windows(data, Path(work).name)
        for line in trace.open():
            st = json.loads(line)
            if not any(t0 <= st["t"] <= t1 for t0, t1 in windows):
                continue
            if st["prefill_tokens"] >= full_chunk:
                chunk.append(st["step_s"])
                if st["decode_reqs"] == 0:
                    for k in PREFIX_CHUNKS:
                        if abs(st.get("prefill_context", 0) - k * budget) < budget:
                            by_prefix[k].append(st["step_s"])
            elif st["prefill_tokens"] == 0:
                n = st["decode_reqs"]
                if 1 <= n <= 3:
                    small.append(st["step_s"])
                for b in BATCHES:
                    if abs(n - b) <= b // 4:
                        by_batch[b].append(st["step_s"])
    if not chunk or not small:
        return None
    c, d = statistics.median(chunk), statistics.median(small)
    return {"chunk_ms": 1000 * c, "decode_ms": 1000 * d, "ratio": c / d, "chunk_steps": len(chunk),
            "chunk_tokens": full_chunk,
            "chunk_after": {str(k): statistics.median(v) / d for k, v in by_prefix.items() if len(v) >= 5},
            "decode_growth": {str(b): statistics.median(v) / d for b, v in by_batch.items() if len(v) >= 20},
            "prompt_tokens": {w: statistics.median(v) for w, v in prompts.items()}}


def h100(gpu_dir: Path) -> dict | None:
    """The same ratios on the H100 from its step traces (graph replays): a 2,048-token
    chunk (after 0, 2 and 8 chunks of prefix) and one of vLLM's default 8,192-token
    budget, over a decode of one request; decodes of 8 to 32 requests."""
    trace = gpu_dir / "steps-graph.jsonl"
    if not trace.exists():
        return None
    steps: dict[tuple, list[float]] = {}
    for line in trace.open():
        st = json.loads(line)
        key = (st["decode_reqs"], st.get("decode_context_each", 0), st["prefill_tokens"], st["prefill_context"])
        steps.setdefault(key, []).append(st["step_s"])
    med = {k: statistics.median(v) for k, v in steps.items()}
    one = med.get((1, H100_CONTEXT, 0, 0))
    if one is None:
        return None
    out = {"decode_ms": 1000 * one, "chunk": {}, "chunk_after": {}, "decode_growth": {}}
    for tokens in (2048, 8192):
        if (0, 0, tokens, 0) in med:
            out["chunk"][str(tokens)] = med[(0, 0, tokens, 0)] / one
    for k in PREFIX_CHUNKS:
        if (0, 0, 2048, 2048 * k) in med:
            out["chunk_after"][str(k)] = med[(0, 0, 2048, 2048 * k)] / one
    for b in BATCHES:
        if (b, H100_CONTEXT, 0, 0) in med:
            out["decode_growth"][str(b)] = med[(b, H100_CONTEXT, 0, 0)] / one
    return out


def decode_step_fit(profile_toml: str):
    """The twin's fitted time (s) of a decode-only step traced as `step` (its `tokens`,
    `decode_reqs` and `decode_context`), from a profile `meridian-sim calibrate` wrote:
    the cost model's terms for such a step (`CostModel::step_seconds`; prefill attention
    is zero in it). None when the text holds no profile."""
    profiles = tomllib.loads(profile_toml).get("profile") or []
    if not profiles:
        return None
    p = profiles[0]

    def fitted(step: dict) -> float:
        return (p["fixed_s"] + p["per_token_s"] * max(step["tokens"], p.get("weight_read_tokens", 0))
                + p["per_decode_request_s"] * step["decode_reqs"] + p["per_context_token_s"] * step["decode_context"])
    return fitted


#: Fewest decode-only steps whose median says how fast a run's engine ran.
MIN_STEPS_PER_RUN = 20

#: Configurations served by the stock engine, whose steps are in its trace.
STOCK_ENGINE = ("stock", "stock-again", "proxy")


def run_key(run: dict) -> tuple:
    return run["config"], run.get("workload"), run.get("load"), run.get("round")


def run_trace(set_dir: Path, run: dict) -> Path | None:
    """The kept step trace of the engine that served `run`: its own invocation's (the
    run's `work`), the stock engine's for stock, proxy-only and A/A runs. None for a run
    measured before runs named their work directory, or whose trace was not kept.

    Why not every trace of the engine: a window is monotonic-clock time, which restarts
    at each boot, so a trace from another session may hold steps at the same times (set
    7's stock runs at 90% in rounds 3 and 4 overlap round 7's invocation)."""
    work = run.get("work")
    if work is None:
        return None
    name = f"stock-{work}" if run["config"] in STOCK_ENGINE else f"{run['config']}@{work}"
    path = set_dir / "steps" / f"{name}.jsonl.gz"
    return path if path.exists() else None


def run_steps(set_dir: Path, data: dict):
    """(run key, step) for every step inside a run's window of its own engine's trace
    (`run_trace`), each trace read once."""
    by_trace: dict[Path, list[tuple]] = {}
    for r in data["runs"]:
        trace = run_trace(set_dir, r) if r.get("window") else None
        if trace is not None:
            by_trace.setdefault(trace, []).append((*r["window"], run_key(r)))
    for trace, windows in sorted(by_trace.items()):
        with gzip.open(trace, "rt") as f:
            for line in f:
                st = json.loads(line)
                run = next((key for t0, t1, key in windows if t0 <= st["t"] <= t1), None)
                if run is not None:
                    yield run, st


@dataclass
class Readings:
    """What the page reads of each run's steps, in one pass over the kept traces."""

    #: `decode_ratios` (None without the twin's rig profile).
    ratios: dict[tuple, list[float]] | None
    #: `limited_steps`.
    limits: dict[tuple, tuple[int, int]]
    #: {run key: its engine's step completions} (`stalls.completions`), for the stalls.
    ends: dict[tuple, list[tuple[float, bool | None]]]
    #: {run key: (running requests that computed nothing in a step, running requests)},
    #: summed over a hooked run's steps: how often its policy held requests out (paced
    #: answers, thinkers past a cap, prompts in a step that computes none) or the step's
    #: budget did not reach them.
    sat_out: dict[tuple, tuple[int, int]] = field(default_factory=dict)


def run_readings(set_dir: Path, data: dict) -> Readings:
    """Every run's steps read once (`Readings`)."""
    profile = set_dir / "twin" / "rig-profile.toml"
    fitted = decode_step_fit(profile.read_text()) if profile.exists() else None
    # A run's steps against its own machine's fit: the profile stands for one machine and
    # each other's pace is in the calibration (`forecast.calibrate`).
    pace_of = run_machines(set_dir, data)
    ratios: dict[tuple, list[float]] = {}
    limited: dict[tuple, list[int]] = {}
    sat: dict[tuple, list[int]] = {}
    ends: dict[tuple, list[tuple[float, bool | None]]] = {}
    for run, st in run_steps(set_dir, data):
        if run[0] not in STOCK_ENGINE:
            counts = limited.setdefault(run, [0, 0])
            counts[0] += st.get("prefill_cap") is not None
            counts[1] += 1
            if st.get("running"):
                # `running` is read after scheduling, the held requests back in the list.
                seats = sat.setdefault(run, [0, 0])
                seats[0] += max(0, st["running"] - st.get("decode_reqs", 0) - st.get("prefill_reqs", 0))
                seats[1] += st["running"]
        if fitted is not None and not st.get("prefill_tokens") and st.get("decode_reqs") and st.get("step_s"):
            ratios.setdefault(run, []).append(st["step_s"] / (fitted(st) * pace_of.get(run, 1.0)))
        if st.get("step_s") is not None:
            ends.setdefault(run, []).append(stalls.completion(st))
    return Readings(ratios if fitted is not None else None, {run: (a, b) for run, (a, b) in limited.items()},
                    {run: sorted(done, key=lambda c: c[0]) for run, done in ends.items()},
                    {run: (a, b) for run, (a, b) in sat.items()})


def machine_paces(set_dir: Path) -> dict[str, float]:
    """{work: its machine's pace against the twin's profile} as the calibration found
    them (`forecast.calibrate`); empty before the fit recorded them (one machine's pace)."""
    path = set_dir / "twin" / "calibration.json"
    if not path.exists():
        return {}
    return (json.loads(path.read_text()).get("machines") or {}).get("paces") or {}


def run_machines(set_dir: Path, data: dict) -> dict[tuple, float]:
    """{run key: the pace of the machine it ran on} (`machine_paces`; 1 where unknown)."""
    machines = machine_paces(set_dir)
    return {run_key(r): machines.get(r.get("work") or "", 1.0) for r in data["runs"]}


def decode_ratios(set_dir: Path, data: dict) -> dict[tuple, list[float]] | None:
    """{(config, workload, load, round): [measured over fitted, per decode-only step]} for
    every run whose engine's trace is kept, the fit its machine's (the profile times the
    machine's pace: `machine_paces`); None without the twin's rig profile."""
    return run_readings(set_dir, data).ratios


def limited_steps(set_dir: Path, data: dict) -> dict[tuple, tuple[int, int]]:
    """{run key: (steps whose prompt tokens the hook's policy capped, steps)} for every
    hooked run whose trace is kept: how often its policy's limits were in force
    (`prefill_cap` in the step trace; slo-driven applies output-first's only while the
    engine's smoothed step time is over its target, output-first always when a prompt
    waits beside answers)."""
    return run_readings(set_dir, data).limits


def slow_runs(set_dir: Path, data: dict, margin: float = 1.1, by_run: dict | None = None) -> list[tuple[tuple, float, float]]:
    """The runs whose engine's decode steps ran more than `margin` times slower than
    stock's in the same round and load (each run's median of measured over fitted):
    (run key, its figure, stock's). A run the machine slowed (another tenant's load, a
    CPU's clock) shows here whatever its configuration; a policy's own cost per step
    would show in each of its runs. `by_run`: `decode_ratios` already read."""
    ratios = by_run if by_run is not None else decode_ratios(set_dir, data)
    if not ratios:
        return []
    each = {run: statistics.median(v) for run, v in ratios.items() if len(v) >= MIN_STEPS_PER_RUN}
    out = []
    for run, x in each.items():
        stock = each.get(("stock", *run[1:]))
        if run[0] != "stock" and stock and x > margin * stock:
            out.append((run, x, stock))
    return sorted(out, key=lambda t: (str(t[0][1]), t[0][2] or 0, t[0][3] or 0, t[0][0]))


def step_residuals(set_dir: Path, data: dict, by_run: dict | None = None) -> dict[str, tuple[float, int]]:
    """{config: (median of measured over fitted, steps)} over the decode-only steps each
    configuration's engine took inside its measured runs, the fit being the twin's,
    calibrated on the stock engine (`twin/rig-profile.toml`; traces kept in `steps/` by
    `forecast.keep_steps`). Stock's own figure says how well the fit holds; a hooked
    engine's above it is time its steps took that the twin, which runs every policy on
    stock's step costs, does not model. `by_run`: `decode_ratios` already read."""
    by_run = by_run if by_run is not None else decode_ratios(set_dir, data)
    if not by_run:
        return {}
    ratios: dict[str, list[float]] = {}
    for run, values in by_run.items():
        ratios.setdefault(run[0], []).extend(values)
    return {c: (statistics.median(v), len(v)) for c, v in ratios.items() if len(v) >= 20}


def rerun_lines(data: dict) -> list[str]:
    """The page's sentence on the runs the harness measured again because their engine ran
    off the pace of the runs before them (`drift`, `measure.Gauge`), and the pace their
    counted run kept; empty for a set measured without the gauge."""
    paced = [r for r in data["runs"] if (r.get("drift") or {}).get("pace") is not None]
    if not paced:
        return []
    reruns = data.get("drift_reruns", [])
    what = ("; ".join(f"{x['config']} round {x['round']} at {100 * x['load']:.0f}% (pace {x['drift']['pace']:.2f} "
                      f"against {x['reference']:.2f})" for x in reruns)
            if reruns else "none")
    key = ("workload", "load", "round", "config")
    again = {tuple(x[k] for k in key) for x in reruns}
    counted = [r for r in paced if tuple(r[k] for k in key) in again]
    waits = [r["drift"].get("calm_wait_s") or 0.0 for r in paced]
    rules = sorted({(r["drift"].get("margin"), r["drift"].get("retries")) for r in paced}, key=str)
    rule = "; ".join("never measured again" if m is None else
                     f"a run more than {100 * m:.0f}% off the pace of the runs before it measured again "
                     f"(at most {k} time{'s' if k != 1 else ''})" for m, k in rules)
    return [f"**Drift control** ({len(paced)} of {len(data['runs'])} runs): each run's engine pace is the median "
            "of its decode-only steps' measured over fitted time (the fit taken from the first run of its "
            f"invocation); {rule}. Measured again: {what}."
            + (" Measured again, their pace: " + "; ".join(
                f"{r['config']} round {r['round']} at {100 * r['load']:.0f}% pace {r['drift']['pace']:.2f}"
                for r in counted) + " (the run counted)." if counted else "")
            + f" Before each run the harness waited for the hypervisor to stop taking CPU: {max(waits):.0f} s "
            "at most.", ""]


def residual_lines(residuals: dict[str, tuple[float, int]], slow: list | None = None) -> list[str]:
    """The page's sentence on each engine's decode steps against the twin's fit, and the
    runs whose steps ran slow (`slow_runs`)."""
    if "stock" not in residuals or len(residuals) < 2:
        return []
    slow_text = ("" if not slow else
                 " Runs whose decode steps ran more than a tenth slower than stock's in the same round (each "
                 "run's median of measured over fitted): "
                 + "; ".join(f"{c} round {rnd} at {100 * load:.0f}% ({x:.2f} against {typical:.2f})"
                             for (c, _w, load, rnd), x, typical in slow)
                 + ". Their requests carry that slowdown into their round's ratios.")
    stock = residuals["stock"][0]
    order = sorted(residuals, key=lambda c: (c not in STOCK_ENGINE, STOCK_ENGINE.index(c) if c in STOCK_ENGINE else 0, c))
    cells = "; ".join(f"{c} {residuals[c][0]:.2f} ({residuals[c][1]:,} steps)" for c in order)
    slower = [c for c, (r, _n) in residuals.items() if r > 1.1 * stock]
    return ["**Each engine's decode steps against the twin's fit** (measured over fitted time for the same "
            f"shape, median of the decode-only steps in the measured runs): {cells}. "
            + (f"Beyond a tenth over stock's: {', '.join(slower)}. Those steps took time the twin does not "
               "model (it runs every policy on stock's step costs): a cost of the hooked engine itself, which "
               "the twin's ratios leave out." if slower else
               "No configuration's steps run a tenth beyond stock's: the twin's step costs hold for each.")
            + slow_text, ""]


def twin_ratios(calibration: dict, budget: int) -> dict | None:
    """The same ratios in the twin calibrated on the rig: its fitted time for the very
    steps the rig column measures, binned as `step_shape` bins them. `curve` holds the
    stock engine's steps inside the measured runs' windows (`forecast.calibrate` passes
    them to `meridian-sim calibrate --curve-window`), one row per bin: prompt-only steps
    by tokens, decode-only steps by requests. A chunk is a bin of a full chunk (three
    quarters of the budget or more); a batch of b requests is the bins within a quarter
    of b, over the bins of 1 to 3 requests; each the step-weighted mean of its bins'
    fitted times. (A curve over every step would set the warm-up's short-context
    batches of 16 and 32 beside the runs' long-context ones: the twin read 2.1x at 16
    requests there against the rig's 3.8x, while its fit agreed with the rig's steps.)"""
    curve = calibration.get("curve")
    if not curve:
        return None

    def fitted(rows: list) -> float | None:
        steps = sum(r[2] for r in rows)
        return sum(r[2] * r[3] for r in rows) / steps if steps else None

    decode = curve["decode"]
    one = fitted([r for r in decode if 1 <= r[0] <= 3])
    if not one:
        return None
    full_chunk = min(1536, int(0.75 * budget))
    chunk = fitted([r for r in curve["prefill"] if r[0] >= full_chunk])
    growth = {b: fitted([r for r in decode if abs(r[0] - b) <= b // 4]) for b in BATCHES}
    return {"chunk": chunk / one if chunk else None,
            "decode_growth": {str(b): g / one for b, g in growth.items() if g}}


def table(shape: dict, gpu: dict | None, workloads: list[dict], engine: dict, twin: dict | None = None) -> list[str]:
    """The regime table: each ratio on the H100, on this rig and, where the set has
    one, in the twin calibrated on this rig."""
    budget = int(engine.get("max_num_batched_tokens", 2048))
    # Sets kept before the table existed recorded only the overall chunk ratio.
    missing = "too few steps" if "decode_growth" in shape else "not recorded"
    rows = ["| ratio | H100, Qwen3-8B shape (measured) | this rig (measured) |", "|---|---:|---:|"]
    if twin is not None:
        rows = ["| ratio | H100, Qwen3-8B shape (measured) | this rig (measured) | the twin on this rig |",
                "|---|---:|---:|---:|"]
    gpu_chunk = (f"{gpu['chunk']['2048']:.1f} (2,048 tokens); {gpu['chunk']['8192']:.1f} (8,192, vLLM's default budget)"
                 if gpu and "2048" in gpu["chunk"] and "8192" in gpu["chunk"] else "not measured")
    def cell(v: float | None, digits: int) -> str:
        if twin is None:
            return ""
        return f" {v:.{digits}f} |" if v else " - |"

    rows.append(f"| full prompt chunk step / decode step of one request | {gpu_chunk} | {shape['ratio']:.1f} "
                f"(every {shape.get('chunk_tokens', 1536):,}+-token chunk, {shape['chunk_ms']:.0f} vs {shape['decode_ms']:.1f} ms) |"
                + cell((twin or {}).get("chunk"), 1))
    for k in PREFIX_CHUNKS:
        g = gpu.get("chunk_after", {}).get(str(k)) if gpu else None
        r = shape.get("chunk_after", {}).get(str(k))
        rows.append(f"| the same, a chunk after {k} chunks of prompt | {f'{g:.1f}' if g else 'not measured'} | "
                    f"{f'{r:.1f}' if r else missing} |" + cell(None, 1))
    for b in BATCHES:
        g = gpu["decode_growth"].get(str(b)) if gpu else None
        r = shape.get("decode_growth", {}).get(str(b))
        rows.append(f"| decode step of {b} requests / of one | {f'{g:.2f}' if g else 'not measured'} | "
                    f"{f'{r:.2f}' if r else missing} |" + cell((twin or {}).get("decode_growth", {}).get(str(b)), 2))
    for w in workloads:
        tokens = shape.get("prompt_tokens", {}).get(w["name"])
        if tokens:
            chunks = tokens / budget
            rows.append(f"| {w['name']} prompt in chunks (median {tokens:,.0f} tokens, chunks of {budget:,}) | "
                        f"the same count at 2,048 a chunk: ~{chunks * 2048:,.0f}-token prompts | {chunks:.1f} |"
                        + (" the same requests |" if twin is not None else ""))
        rows.append(f"| {w['name']} thought / answer, in steps | the same: {w['think_len']} / {w['output_len']} | "
                    f"{w['think_len']} / {w['output_len']} |" + (" the same requests |" if twin is not None else ""))
    return rows


def differences(shape: dict, gpu: dict | None, tolerance: float = 1.25) -> list[str]:
    """Sentences naming each ratio where the rig is off the H100's by more than
    `tolerance` either way, and what that does to a policy's effect here."""
    if not gpu:
        return []
    out = []
    for k in PREFIX_CHUNKS:
        g, r = gpu.get("chunk_after", {}).get(str(k)), shape.get("chunk_after", {}).get(str(k))
        if g and r and not 1 / tolerance <= r / g <= tolerance:
            out.append(f"a chunk after {k} chunks of prompt costs {r:.1f} decode steps here against {g:.1f} on the "
                       f"H100, so keeping answers out of chunk steps is worth {'more' if r > g else 'less'} here")
    for b in BATCHES:
        g, r = gpu["decode_growth"].get(str(b)), shape.get("decode_growth", {}).get(str(b))
        if g and r and not 1 / tolerance <= r / g <= tolerance:
            out.append(f"a decode step of {b} requests costs {r:.2f}x one request's here against {g:.2f}x on the "
                       f"H100, so taking thinkers out of a step saves {'more' if r > g else 'less'} here than there")
    return out


def shared_step_stretch(twin: dict | None, gpu: dict | None):
    """How many times more a decode step shared by `b` requests costs, relative to one
    request's, on this rig than on the H100: b -> (rig growth at b) / (H100 growth at b),
    the growths the regime table shows (the twin's fit over the rig's steps, which covers
    every batch the runs held, and the H100's measured steps), linear between the
    table's batches from 1 at one request, held past the largest. None when either side
    is missing.

    Why: a request's start (TTFT, TTFO) on a loaded engine is its own steps shared with
    everyone else's. On the H100 sharing a step with 16 requests costs 1.16x; on this rig
    2.2x. An SLO that lets a start take 2x its time alone is met by most requests on the
    H100 at a load where none can meet it here, whatever the scheduler does; stretching
    the factor by this ratio judges the rig's runs by the H100's yardstick."""
    if not twin or not gpu:
        return None
    knots = [(1.0, 1.0)]
    for b in BATCHES:
        rig, h100 = twin["decode_growth"].get(str(b)), gpu["decode_growth"].get(str(b))
        if rig and h100:
            knots.append((float(b), rig / h100))
    if len(knots) < 2:
        return None

    def stretch(batch: float) -> float:
        if batch <= knots[0][0]:
            return knots[0][1]
        for (b0, s0), (b1, s1) in zip(knots, knots[1:]):
            if batch <= b1:
                return s0 + (s1 - s0) * (batch - b0) / (b1 - b0)
        return knots[-1][1]
    stretch.knots = knots
    return stretch
