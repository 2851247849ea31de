"""The twin beside the measurement, then the twin's forecast for GPUs (issue 27, item 6).

    python -m realab forecast SET_DIR SIM      # SIM: target/release/meridian-sim

For a kept set of the policies page: the twin is calibrated on the rig's own stock engine
(its step traces, kept in `SET_DIR/steps/` by `policies keep` and `policies add`), and
replays every measured round's requests (the lengths the engine reported, the send times
rescaled so that the load is the same fraction of the twin's capacity as the run's was
of stock's measured capacity) under each configuration's policy: `SET_DIR/twin/rig/`,
files named as the measured ones, so the page reads prediction and measurement with the
same paired statistics. Matching the load's fraction, not its rate, matters because
queueing is steep near capacity: a twin a third faster than its engine, replaying the
same send times, runs at 67% load where the engine ran at 90%, and predicts the queue's
effects a third too small. The same replays again at each run's own pace
(`SET_DIR/twin/rig-paced/`): every step of the twin as much slower or faster as that run's
engine stepped against its round's stock run (`run_paces`), which the page sets beside
the one-pace twin to tell the twin's scheduling errors from the rig's run-to-run pace.
Then the same requests on each GPU profile measured in `gpu-step-curve/`
(the H100, and every other card kept under it: `CARDS`) with the step budget the rig
stands for (2,048 tokens): prompts scaled by the budgets' ratio (the same count of
chunks), thoughts and answers as they were (the same count of steps), and send times
stretched or squeezed so that the load is the same fraction of that card's twin capacity
as it was of the rig's measured capacity: `SET_DIR/twin/<card>/`, with `SET_DIR/twin/forecast.json`
saying how (profiles, capacities, scales)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from . import regime as R
from . import speed
from . import stats as S
from .effects import policies_of  # the page's own reading of configs

#: The step budget the GPU-shaped rig stands for on the H100 (its chunk costs ~7 decode
#: steps there, as the rig's 256-token chunk does here: `regime.py`).
H100_BUDGET = 2048
H100_PROFILE = "h100-qwen3-8b-pytorch"
#: The cards forecast: (folder under twin/, label, measured curve under gpu-step-curve/,
#: profile name). A card whose curve is not there is left out.
CARDS = [("h100", "H100", ".", H100_PROFILE), ("h200", "H200", "h200", "h200-qwen3-8b-pytorch")]
#: Where the rig twin's replays at each run's own pace go, under `twin/` (`run_paces`).
PACED = "rig-paced"
#: Policies of the configurations without a hook: vLLM's own order.
STOCK_POLICY = "fcfs"
#: The cost model's time terms (`meridian-sim calibrate`'s profile), which a run's pace
#: multiplies: every step of the paced twin takes that much longer.
PACED_TERMS = ("fixed_s", "per_token_s", "per_context_token_s", "per_decode_request_s", "per_prefill_attention_s")


def run_paces(set_dir: Path, data: dict) -> dict[tuple, float]:
    """{run key: how much slower its engine stepped than the same round's stock run's}:
    the median of each run's decode-only steps measured over the twin's fit
    (`regime.decode_ratios`, at least `MIN_STEPS_PER_RUN` of them), over stock's.

    Why: the rig's engine does not run at one pace. The A/A rounds show the same stock
    engine a tenth or more faster in one run of a round than in the next, and at 90% load
    that alone moves every tail. The round's machine is already in the replay (its
    standing sets the load); this is what is left, run by run. A hooked engine that costs
    more per step shows it here too, which is a cost of the hook on this rig."""
    ratios = R.decode_ratios(set_dir, data) or {}
    medians = {k: statistics.median(v) for k, v in ratios.items() if len(v) >= R.MIN_STEPS_PER_RUN}
    out = {}
    for (config, workload, load, rnd), m in medians.items():
        stock = medians.get(("stock", workload, load, rnd))
        if stock:
            out[(config, workload, load, rnd)] = m / stock
    return out


def paced_profile(text: str, pace: float) -> str:
    """A profile's TOML with every time term (`PACED_TERMS`) multiplied by `pace`."""
    def scale(m: re.Match) -> str:
        return f"{m.group(1)} = {float(m.group(2)) * pace!r}"
    out, n = re.subn(rf"^({'|'.join(PACED_TERMS)}) = (\S+)$", scale, text, flags=re.M)
    if n != len(PACED_TERMS):
        raise ValueError(f"a profile with {n} of the {len(PACED_TERMS)} time terms {PACED_TERMS}")
    return out


def keep_steps(data: dict, set_dir: Path) -> int:
    """Gzips each work directory's step traces into `set_dir/steps/`: the stock engine's
    (`stock-<work>.jsonl.gz`, the twin's calibration input) and each hooked engine's
    (`<config>@<work>.jsonl.gz`, `hook@...` for the shipped default's, which the page
    sets beside the twin's fit: `regime.step_residuals`); a trace already kept is left
    alone."""
    out = set_dir / "steps"
    kept = 0
    for work in data.get("work", []):
        traces = [(Path(work) / "stock-steps.jsonl", out / f"stock-{Path(work).name}.jsonl.gz")]
        traces += [(t, out / f"{t.name[:-len('-steps.jsonl')]}@{Path(work).name}.jsonl.gz")
                   for t in sorted(Path(work).glob("hook*-steps.jsonl"))]
        for trace, target in traces:
            if not trace.exists() or target.exists():
                continue
            out.mkdir(parents=True, exist_ok=True)
            with trace.open("rb") as src, gzip.open(target, "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
            kept += 1
    return kept


def policy_for(config: str, policies: dict[str, str | None]) -> str:
    return policies.get(config) or STOCK_POLICY


def scaled(requests: list[dict], prompt_scale: float, time_scale: float, all_at_once: bool = False) -> list[dict]:
    """The requests with prompts `prompt_scale` times as long and send times
    `time_scale` times as far apart (all at time 0 with `all_at_once`: a capacity run)."""
    first = min((r["sent_at"] for r in requests), default=0.0)
    out = []
    for r in requests:
        s = dict(r)
        if s.get("prompt_tokens") is not None:
            s["prompt_tokens"] = max(1, round(s["prompt_tokens"] * prompt_scale))
        s["sent_at"] = 0.0 if all_at_once else (r["sent_at"] - first) * time_scale
        out.append(s)
    return out


def load_scales(measured: float | None, rig_twin: float, cards: dict[str, float]) -> tuple[float, dict[str, float]]:
    """Send-time scales (rig twin; each card) that put every twin at the run's load
    fraction: a run sent at rate f * `measured` (stock's measured capacity), its send
    times multiplied by `measured / capacity`, arrives at f * that capacity. Without a
    measured capacity the rig twin's own stands for it (its replay keeps the send times)."""
    reference = measured or rig_twin
    return reference / rig_twin, {slug: reference / cap for slug, cap in cards.items()}


def machine_capacity(measured: float | None, standing) -> float | None:
    """Stock's capacity on the machine a round ran on: the measured one scaled by how much
    faster that machine ran than the one that measured it (`speed.Standing`; None or no
    reading: the same machine)."""
    if measured is None:
        return None
    return measured * (standing.speed if standing is not None and standing.speed else 1.0)


def card_profile(gpu_dir: Path, budget: int = H100_BUDGET) -> str:
    """A card's measured profile (TOML; the H100's for its folder) with the step budget
    the rig stands for."""
    text = (gpu_dir / "fitted-profile.toml").read_text()
    lines = [f"max_num_batched_tokens = {budget}" if ln.startswith("max_num_batched_tokens") else ln
             for ln in text.splitlines()]
    return "\n".join(lines) + "\n"


def card_twins(curves: Path, sim: Path, tmp: Path) -> dict[str, tuple[Twin, str, Path]]:
    """{slug: (its twin, its label, its profile file in `tmp`)} for every card of `CARDS`
    whose measured curve is under `curves`, each at the budget the rig stands for."""
    out = {}
    for slug, label, folder, profile in CARDS:
        if (curves / folder / "fitted-profile.toml").exists():
            card_file = tmp / f"{slug}.toml"
            card_file.write_text(card_profile(curves / folder))
            out[slug] = (Twin(sim, card_file, profile, tmp), label, card_file)
    return out


class Twin:
    """`meridian-sim` on one profile file."""

    def __init__(self, sim: Path, profile_file: Path, profile: str, tmp: Path) -> None:
        self.sim, self.profile_file, self.profile, self.tmp = sim, profile_file, profile, tmp

    def replay(self, requests: list[dict], policy: str) -> dict:
        src, out = self.tmp / "in.json", self.tmp / "out.json"
        src.write_text(json.dumps({"runs": [{"requests": requests}]}))
        subprocess.run([str(self.sim), "replay", str(src), "--policy", policy, "--out", str(out),
                        "--profile-file", str(self.profile_file), "--profile", self.profile], check=True)
        return json.loads(out.read_text())

    def capacity(self, requests: list[dict]) -> float:
        """Requests per second of engine time with every request sent at once, FCFS."""
        out = self.replay(scaled(requests, 1.0, 1.0, all_at_once=True), STOCK_POLICY)
        done = sum(1 for r in out["runs"][0]["requests"] if r["ok"])
        return done / max(out["makespan_s"], 1e-9)


def calibrate(sim: Path, set_dir: Path, data: dict, tmp: Path) -> Path:
    """The rig's twin profile, fitted to its stock engine's kept step traces."""
    traces = sorted((set_dir / "steps").glob("stock-*.jsonl.gz"))
    if not traces:
        raise SystemExit(f"{set_dir}/steps: no stock step trace kept (policies keep/add keep them)")
    joined = tmp / "stock-steps.jsonl"
    # Each trace's times are its own boot's monotonic clock, so two sessions' traces may
    # overlap: laid end to end (each shifted to start after the one before), a run's
    # window, shifted with its own trace, catches only that trace's steps.
    windows: list[tuple[float, float]] = []
    end = 0.0
    with joined.open("w") as dst:
        for t in traces:
            with gzip.open(t, "rt") as src:
                steps = [json.loads(line) for line in src if line.strip()]
            if not steps:
                continue
            shift = end + 1.0 - steps[0]["t"]
            for st in steps:
                st["t"] += shift
                dst.write(json.dumps(st, separators=(",", ":")) + "\n")
            end = steps[-1]["t"]
            work = t.name[len("stock-"):-len(".jsonl.gz")]
            windows += [(t0 + shift, t1 + shift) for t0, t1 in R.stock_windows(data, work)]
    eng = data["setup"]["engine"]
    block = re.search(r"--block-size', '(\d+)'", str(eng.get("extra", "")))
    profile = tmp / "rig.toml"
    kv = max((w.get("kv_blocks") or 0 for w in data["setup"]["workloads"]), default=0) or 100_000
    subprocess.run([str(sim), "calibrate", "--steps", str(joined), "--profile-out", str(profile),
                    "--json", str(set_dir / "twin" / "calibration.json"), "--name", "rig",
                    "--gpu", "none (the GPU-shaped rig: vLLM CPU build, forward pass on one core)",
                    "--model", Path(eng.get("model", "bench")).name, "--block-size", block.group(1) if block else "16",
                    "--kv-blocks", str(kv), "--max-num-seqs", str(eng.get("max_num_seqs", 32)),
                    "--max-num-batched-tokens", str(eng.get("max_num_batched_tokens", 256)),
                    # The curve over the measured runs only: the page's regime table sets
                    # the twin beside the rig's steps in those windows (regime.twin_ratios).
                    *(a for w in windows for a in ("--curve-window", f"{w[0]},{w[1]}"))],
                   check=True, stdout=subprocess.DEVNULL)
    # The fit's input was a temporary file: the kept profile names what it was made of.
    profile.write_text(profile.read_text().replace(str(joined), "the set's steps/stock-*.jsonl.gz"))
    shutil.copy(profile, set_dir / "twin" / "rig-profile.toml")
    return profile


def _write(path: Path, report: dict) -> None:
    """Writes a replay, leaving a file that already holds the same replay alone (its
    gzip header included: a regenerated page changes only the files whose figures moved);
    a new file's header carries no time, for the same reason."""
    body = json.dumps(report).encode()
    if path.exists():
        try:
            with gzip.open(path, "rb") as old:
                if old.read() == body:
                    return
        except (OSError, EOFError):
            pass  # not a readable gzip: written anew
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(body)


def forecast(set_dir: Path, sim: Path) -> dict:
    """Writes `twin/rig/`, `twin/<card>/` and `twin/forecast.json` for the set."""
    data = json.loads((set_dir / "results.json").read_text())
    policies = policies_of(data)
    raw = set_dir / "raw"
    (set_dir / "twin").mkdir(exist_ok=True)
    budget = int(data["setup"]["engine"].get("max_num_batched_tokens", 256))
    prompt_scale = H100_BUDGET / budget
    curves = set_dir.parent.parent / "gpu-step-curve"
    standing = speed.standings(set_dir, data)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        rig_profile = calibrate(sim, set_dir, data, tmp)
        rig = Twin(sim, rig_profile, "rig", tmp)
        paces = run_paces(set_dir, data)
        cards: dict[str, Twin] = {}
        summary: dict = {"rig_profile": "twin/rig-profile.toml", "gpu_budget": H100_BUDGET,
                         "prompt_scale": prompt_scale, "cards": {}, "rounds": {}, "paces": {}}
        for slug, (twin, label, card_file) in card_twins(curves, sim, tmp).items():
            cards[slug] = twin
            shutil.copy(card_file, set_dir / "twin" / f"{slug}-profile.toml")
            summary["cards"][slug] = {"label": label, "profile": f"twin/{slug}-profile.toml"}
        for side in ("rig", PACED, *cards):
            (set_dir / "twin" / side).mkdir(exist_ok=True)
        for w in data["setup"]["workloads"]:
            for load in w["loads"]:
                runs = S.read_runs(raw, w["name"], load)
                # Stock's capacity as measured on the rig (everything sent at once), which
                # the run's load is a fraction of; without one, the rig twin's own.
                measured_cap = data.get("capacity", {}).get(w["name"])
                for rnd, stock in sorted(runs.get("stock", {}).items()):
                    cap_rig = rig.capacity(stock)
                    card_caps = {slug: twin.capacity(scaled(stock, prompt_scale, 1.0)) for slug, twin in cards.items()}
                    # A round sent by the capacity of a slower (or faster) machine than its
                    # own stood at another load (`speed`): the twins replay it at that one.
                    own = machine_capacity(measured_cap, standing.get((w["name"], load, rnd, "stock")))
                    rig_scale, card_scales = load_scales(own, cap_rig, card_caps)
                    summary["rounds"][f"{w['name']}-{load:g}-{rnd}"] = {
                        "rig_capacity": cap_rig, "measured_capacity": measured_cap, "machine_capacity": own,
                        "rig_time_scale": rig_scale, "capacity": card_caps, "time_scale": card_scales}
                    on_rig = scaled(stock, 1.0, rig_scale)
                    on_card = {slug: scaled(stock, prompt_scale, card_scales[slug]) for slug in cards}
                    for config, by_round in runs.items():
                        if rnd not in by_round:
                            continue
                        name = f"{w['name']}-{load:g}-{rnd}-{config}.json.gz"
                        policy = policy_for(config, policies)
                        _write(set_dir / "twin" / "rig" / name, rig.replay(on_rig, policy))
                        # Stock's pace is 1 by definition: its replay is the one above,
                        # which the page reads for it (`paced_side`).
                        pace = paces.get((config, w["name"], load, rnd)) if config != "stock" else None
                        if pace is not None:
                            summary["paces"][name.removesuffix(".json.gz")] = pace
                            paced = tmp / "paced.toml"
                            paced.write_text(paced_profile(rig_profile.read_text(), pace))
                            _write(set_dir / "twin" / PACED / name, Twin(sim, paced, "rig", tmp).replay(on_rig, policy))
                        for slug, twin in cards.items():
                            _write(set_dir / "twin" / slug / name, twin.replay(on_card[slug], policy))
    (set_dir / "twin" / "forecast.json").write_text(json.dumps(summary, indent=1))
    return summary


# --- the page -----------------------------------------------------------------------------

#: Every section's count of agreement, by (set, workload, load): (agreed, judged) for the
#: twin at one pace and at the runs' own paces; the page sums them (`tally_lines`).
TALLIES: dict[tuple[str, str, float], tuple[int, int, int, int]] = {}

#: A prediction agrees with a measured effect when it lies inside the measured interval
#: or within this relative distance of the measured point.
TOLERANCE = 0.25


def agrees(measured: S.Estimate, predicted: float) -> bool:
    inside = measured.low <= predicted <= measured.high
    return inside or abs(predicted / measured.point - 1) <= TOLERANCE if measured.point > 0 else inside


def resolved(e: S.Estimate | None) -> bool:
    """An effect the measurement resolves: its whole interval on one side of 1 (never a
    single round's, whose interval cannot carry run-to-run spread)."""
    return e is not None and (e.low > 1 or e.high < 1)


def bar(forecast: float, residual: float) -> tuple[float, float]:
    """The forecast's error bar: from the twin's figure to the figure moved by the
    rig's residual (measured over predicted on the rig, same metric and quantile)."""
    moved = forecast * residual
    return min(forecast, moved), max(forecast, moved)


def section(set_dir: Path, workload: str, load: float, measured: dict[str, tuple], runs: dict,
            decode_s: float | None, resamples: int = 200,
            limits: dict[tuple, tuple[int, int]] | None = None) -> list[str]:
    """The page's lines for one workload x load: per configuration and metric, the
    measured paired ratio, the twin's on the rig (the same requests), whether they
    agree, and each card's forecast with the rig's residual as its error bar. `measured`
    is the page's own {config: {metric: (p50, tail estimate, tail, n)}}, `runs` the
    measured requests it read them from, `decode_s` the rig's decode step of one request
    (the set's step shape), below which a TTOT is delivery's doing (`delivery_lines`);
    `limits`: the measured runs' capped steps (`regime.limited_steps`), set beside the
    twin's (`capping_lines`)."""
    from .sets import read

    twin_dir = set_dir / "twin"
    if not (twin_dir / "forecast.json").exists():
        return []
    summary = json.loads((twin_dir / "forecast.json").read_text())
    rig_runs, _ = read(twin_dir / "rig", workload, load)
    if "stock" not in rig_runs:
        return []
    paced_runs = paced_side(twin_dir, rig_runs, workload, load)
    # A configuration is read at its runs' paces only where every round it has on the
    # rig has its pace: otherwise its paced ratio would pair other rounds than the rest.
    paced_configs = {c for c, rounds in paced_runs.items() if set(rounds) == set(rig_runs.get(c, {}))}
    cards = {slug: c["label"] for slug, c in summary.get("cards", {}).items() if (twin_dir / slug).is_dir()}
    card_runs = {slug: read(twin_dir / slug, workload, load)[0] for slug in cards}
    labels = " and ".join(cards.values()) or "GPU"
    cal = json.loads((twin_dir / "calibration.json").read_text()) if (twin_dir / "calibration.json").exists() else {}
    fit = cal.get("fit", cal)
    caps = [v for k, v in summary["rounds"].items() if k.startswith(f"{workload}-{load:g}-")]
    capacities = "; ".join(f"{label} {caps[0]['capacity'][slug]:.2f} req/s" for slug, label in cards.items()
                           if caps and slug in caps[0].get("capacity", {}))
    lines = [f"#### The twin beside the measurement, and its {labels} forecast", "",
             "The twin (`meridian-sim replay`), calibrated on this rig's stock engine (its step traces"
             + (f"; fit over {fit['samples']:,} steps: median error {fit['median_abs_pct_error']:.1f}%, "
               f"`{fit['formula']}`" if "median_abs_pct_error" in fit else "")
             + "), replays each round's requests (the lengths the engine reported) under each configuration's "
             "policy, their send times rescaled so the load is the same fraction of the twin's capacity as the run's "
             "was of stock's measured capacity (on the run's own machine: `speed.standings`)"
             + (f" (twin {caps[0]['rig_capacity']:.3f} req/s against {caps[0]['measured_capacity']:.3f} measured: "
                "replayed at the run's own send times, the twin would stand at a lower load, where queues are "
                "shorter and every policy's effect smaller)" if caps and caps[0].get("measured_capacity") else "")
             + "; the same paired statistics read it. *Agrees*: the twin's ratio lies inside "
             f"the measured interval or within {TOLERANCE:.0%} of the measured point; judged only where the "
             f"measurement resolves the effect (its interval wholly on one side of 1). Each forecast replays the "
             f"same requests on that card's profile measured in [the GPU step-time curve](gpu-step-curve.md) with a "
             f"{summary['gpu_budget']:,}-token budget: prompts {summary['prompt_scale']:g}x as long (the same "
             "count of chunks), thoughts and answers as they were, send times rescaled to the same fraction of "
             "that card's twin capacity"
             + (f" (twin capacity: {capacities})" if caps and capacities else "")
             + ". Its bracket runs from the twin's figure to that figure times the rig's residual (measured over "
             "predicted, same metric and quantile): a forecast, not a measurement. *At the run's pace*: the same "
             "replay with every step of the twin as much slower (or faster) as that run's engine stepped against "
             "the same round's stock run (`forecast.run_paces`; stock's own replay is the same at both): what "
             "the twin's schedule predicts given the speed each engine really ran at, which tests the twin's "
             "scheduling apart from the rig's run-to-run pace; no forecast uses it.", "",
             "| configuration | metric | measured | twin on the rig | agrees | twin at the run's pace | agrees | "
             + " | ".join(f"{label} forecast [bracket]" for label in cards.values()) + " |",
             "|---|---|---:|---:|---|---:|---|" + "---:|" * len(cards)]
    misses, paced_misses = [], []
    per_config: dict[str, list[int]] = {}  # config: [agreed, judged]
    paced_tally = [0, 0]  # [agreed, judged]
    # Each metric paired once per side: the pairing reads every configuration's requests.
    rig_pairs = {metric: S.pair_requests(rig_runs, S.METRICS[metric]) for metric in S.METRICS}
    paced_pairs = ({metric: S.pair_requests(paced_runs, S.METRICS[metric]) for metric in S.METRICS}
                   if "stock" in paced_runs else {})
    card_pairs = {slug: {metric: S.pair_requests(runs, S.METRICS[metric]) for metric in S.METRICS}
                  for slug, runs in card_runs.items()}
    for config, table in measured.items():
        if config not in rig_runs:
            continue
        for metric, (p50, high, tail, _n) in table.items():
            for q, m in ((0.5, p50), (tail, high)):
                if m is None or not q:
                    continue
                t = S.paired_ratio(rig_pairs[metric], q, config, "stock", resamples=resamples)
                if t is None:
                    continue
                label = f"{metric} p{round(100 * q)}"
                verdict = "not resolved"
                p = (S.paired_ratio(paced_pairs[metric], q, config, "stock", resamples=resamples)
                     if paced_pairs and config in paced_configs else None)
                paced_verdict = "not resolved" if p is not None else "-"
                if resolved(m):
                    ok = agrees(m, t.point)
                    tally = per_config.setdefault(config, [0, 0])
                    tally[0] += ok
                    tally[1] += 1
                    verdict = "yes" if ok else "**no**"
                    if not ok:
                        misses.append(f"{config} {label} (measured {m.point:.2f}, twin {t.point:.2f})")
                    if p is not None:
                        paced_ok = agrees(m, p.point)
                        paced_tally[0] += paced_ok
                        paced_tally[1] += 1
                        paced_verdict = "yes" if paced_ok else "**no**"
                        if not paced_ok:
                            paced_misses.append(f"{config} {label} (measured {m.point:.2f}, twin at its pace "
                                                f"{p.point:.2f})")
                forecasts = []
                for slug in cards:
                    g = (S.paired_ratio(card_pairs[slug][metric], q, config, "stock", resamples=resamples)
                         if config in card_runs[slug] else None)
                    if g is None:
                        forecasts.append("-")
                        continue
                    lo, hi = bar(g.point, m.point / t.point if t.point > 0 else 1.0)
                    forecasts.append(f"{g.point:.2f} [{lo:.2f}-{hi:.2f}]")
                paced_cell = f"{p.point:.2f}" if p is not None else "-"
                lines.append(f"| {config} | {label} | {m.text()} | {t.point:.2f} | {verdict} | {paced_cell} | "
                             f"{paced_verdict} | " + " | ".join(forecasts) + " |")
    agreed, judged = (sum(col) for col in zip(*per_config.values())) if per_config else (0, 0)
    TALLIES[(set_dir.name, workload, load)] = (agreed, judged, *paced_tally)
    lines += ["", f"The twin agrees with {agreed} of the {judged} effects the measurement resolves"
              + (f" (by configuration: {', '.join(f'{c} {a} of {n}' for c, (a, n) in per_config.items())})"
                 if per_config else "")
              + (f"; it misses {'; '.join(misses)}." if misses else ".")
              + " A configuration whose rig effects the twin misses more often than it meets has no credible "
              "GPU forecast yet: its bracket says how far off the twin was, not where the GPU will be.", ""]
    lines += pace_lines(summary.get("paces", {}), workload, load, paced_tally, paced_misses)
    lines += capping_lines(limits or {}, twin_capped(twin_dir / "rig", workload, load), workload, load)
    if decode_s:
        lines += delivery_lines(runs, rig_runs, decode_s)
    return lines


def tally_lines(tallies: dict[tuple[str, str, float], tuple[int, int, int, int]]) -> list[str]:
    """The page's count of where the twin meets the measured effects, over every set and
    load, at one pace and at the runs' own paces."""
    judged = {k: v for k, v in tallies.items() if v[1]}
    if not judged:
        return []
    agreed, total, paced_agreed, paced_total = (sum(col) for col in zip(*judged.values()))
    by_set: dict[str, list[int]] = {}
    for (set_name, _w, _l), v in sorted(judged.items()):
        acc = by_set.setdefault(set_name, [0, 0, 0, 0])
        for i in range(4):
            acc[i] += v[i]
    cells = "; ".join(f"set {name.split('-')[0]} {a} of {n}" + (f" ({pa} of {pn} at the runs' paces)" if pn else "")
                      for name, (a, n, pa, pn) in sorted(by_set.items(), key=lambda kv: int(kv[0].split("-")[0])))
    return ["**The twin against the measurement, over every set.** Of the effects the measurements resolve, the "
            f"twin at one pace (as it forecasts a GPU) meets {agreed} of {total}; replayed at each run's own pace "
            f"(`forecast.run_paces`), {paced_agreed} of the {paced_total} it has paces for. By set: {cells}. "
            "An effect the twin meets only at the runs' paces was made by how fast each run's engine stepped "
            "(the rig's run-to-run pace, the hook's own cost per step, or step shapes the twin's fit prices "
            "wrong), not by the schedule, which is what a GPU forecast carries; each set's section names them.", ""]


def paced_side(twin_dir: Path, rig_runs: dict, workload: str, load: float) -> dict:
    """The replays at each run's own pace ({config: {round: requests}}), stock's being its
    replays at one pace (its pace is 1 by definition); empty where there are none."""
    from .sets import read

    if not (twin_dir / PACED).is_dir():
        return {}
    paced = read(twin_dir / PACED, workload, load)[0]
    return {"stock": rig_runs["stock"], **paced} if paced else {}


def pace_lines(paces: dict[str, float], workload: str, load: float, tally: list[int],
               misses: list[str]) -> list[str]:
    """What each run's own pace says of the twin's misses: every configuration's paces
    over the rounds (against the round's stock run), and how many resolved effects the
    twin meets when it replays each run at its pace."""
    prefix = f"{workload}-{load:g}-"
    by_config: dict[str, list[float]] = {}
    for name, pace in paces.items():
        rnd, _, config = name[len(prefix):].partition("-") if name.startswith(prefix) else ("", "", "")
        if rnd.isdigit() and config and config != "stock":
            by_config.setdefault(config, []).append(pace)
    if not by_config:
        return []
    cells = "; ".join(f"{c} {min(v):.2f}-{max(v):.2f} over {len(v)} run{'s' if len(v) > 1 else ''}"
                      if len(v) > 1 else f"{c} {v[0]:.2f} (1 run)" for c, v in sorted(by_config.items()))
    agreed, judged = tally
    return ["**Each run's own pace.** How much longer each run's decode steps took than the same round's stock "
            f"run's (median over its decode-only steps, each against the twin's fit): {cells}. Replayed at those "
            f"paces, the twin agrees with {agreed} of the {judged} resolved effects it has paces for"
            + (f"; it misses {'; '.join(misses)}" if misses else "")
            + ". Where the paced twin meets an effect the twin at one pace misses, the effect was made by how "
            "fast each run's engine stepped, not by the schedule the twin models: the rig's run-to-run pace, the "
            "hook's own cost per step, or step shapes the twin's fit prices wrong, which a configuration whose "
            "runs stepped faster or slower than stock's in every round points to.", ""]


def twin_capped(rig_dir: Path, workload: str, load: float) -> dict[str, dict[int, tuple[int, int]]]:
    """{config: {round: (steps the twin ran under its policy's prefill cap, steps)}} from
    the replays in `rig_dir` (files named as the measured runs); replays written before
    the twin counted them are left out."""
    prefix = f"{workload}-{load:g}-"
    out: dict = {}
    for f in sorted(rig_dir.glob(f"{prefix}*.json.gz")):
        rnd, _, config = f.name[len(prefix):].split(".json")[0].partition("-")
        if not rnd.isdigit() or not config:
            continue
        with gzip.open(f, "rt") as fh:
            head = json.load(fh)
        if "prefill_capped_steps" in head and head.get("steps"):
            out.setdefault(config, {})[int(rnd)] = (int(head["prefill_capped_steps"]), int(head["steps"]))
    return out


def capping_lines(measured: dict[tuple, tuple[int, int]], twin: dict[str, dict[int, tuple[int, int]]],
                  workload: str, load: float) -> list[str]:
    """How often each policy capped a step's prompt tokens, in the engine and in the twin
    on the same requests, pooled over the rounds both have: a policy that switches on the
    engine's step time (slo-driven) acts only as often as its steps run slow, so a twin
    whose steps run faster than the engine's protects less often and predicts smaller
    effects, costs included."""
    parts, more, fewer = [], [], []
    for config, by_round in twin.items():
        mine = {key[3]: v for key, v in measured.items()
                if key[0] == config and key[1] == workload and key[2] == load and v[1]}
        both = sorted(set(mine) & set(by_round))
        if not both:
            continue
        m_capped, m_steps = (sum(mine[r][i] for r in both) for i in (0, 1))
        t_capped, t_steps = (sum(by_round[r][i] for r in both) for i in (0, 1))
        if not m_capped and not t_capped:
            continue
        m_share, t_share = m_capped / m_steps, t_capped / t_steps
        parts.append(f"{config} {m_share:.1%} measured, {t_share:.1%} in the twin "
                     f"({len(both)} round{'s' if len(both) > 1 else ''})")
        # Within a tenth of each other the two protect about as often; beyond it, say which way.
        if t_share > 1.1 * m_share:
            more.append(config)
        elif t_share < m_share / 1.1:
            fewer.append(config)
    if not parts:
        return []
    verdict = []
    if more:
        verdict.append(f"the twin caps more often than the engine did for {', '.join(more)}, so there it "
                       "over-predicts what capping costs (the starts it delays) as well as what it gains")
    if fewer:
        verdict.append(f"the twin caps less often than the engine did for {', '.join(fewer)}, so there it "
                       "under-predicts what capping costs (the starts it delays) as well as what it gains")
    if not verdict:
        verdict.append("the twin caps about as often as the engine did (within a tenth) for every policy")
    return ["**How often the policy protected, engine and twin.** Steps run under the policy's prefill cap, "
            "pooled over the rounds both sides have (the engine's step traces; the twin's replays of the same "
            "requests): " + "; ".join(parts) + ". A policy that caps only while steps run slow (slo-driven) "
            "acts as often as its engine's steps are slow: " + "; ".join(verdict) + ".", ""]


def late_thought_shares(runs: dict[str, dict[int, list[dict]]], floor_s: float) -> dict[str, tuple[float, int]]:
    """{config: (share, requests)}: the share of requests whose think-to-answer gap is
    shorter than `floor_s`, over the requests that have one."""
    out = {}
    for config, rounds in runs.items():
        gaps = [g for reqs in rounds.values() for r in reqs if (g := S.ttot(r)) is not None]
        if gaps:
            out[config] = (sum(g < floor_s for g in gaps) / len(gaps), len(gaps))
    return out


def delivery_lines(measured: dict, twin: dict, floor_s: float) -> list[str]:
    """What the twin cannot show about TTOT: two engine steps lie between a request's
    last thought token and its first answer token (the step sampling the closing
    delimiter, which shows nothing, and the next), so an engine cannot make that gap
    shorter than one decode step; measured, some are, because the API server delivered
    the last thought token late (vLLM merges the outputs a stream's reader has not yet
    taken). The twin delivers every token at its step's end."""
    seen = late_thought_shares(measured, floor_s)
    modelled = late_thought_shares(twin, floor_s)
    if not seen:
        return []
    stock = seen.get("stock", (0.0, 0))[0]
    above = [c for c, (share, _n) in seen.items() if c != "stock" and share > stock]
    cells = "; ".join(f"{c} {share:.1%} of {n}" for c, (share, n) in seen.items())
    twin_max = max((share for share, _n in modelled.values()), default=0.0)
    return ["**Delivery, which the twin does not model.** Two engine steps lie between a request's last thought "
            "token and its first answer token (the step that samples the closing delimiter, which shows nothing, "
            f"and the next), so no engine schedule makes that gap (TTOT) shorter than one decode step of one "
            f"request on this rig ({floor_s * 1000:.1f} ms at the median). Measured at the client, this share of "
            f"requests had a shorter TTOT: {cells}; in the twin at most {twin_max:.1%}. Such a gap is the last "
            "thought token arriving late, with or just before the first answer token (vLLM's API server merges "
            "the outputs a stream's reader has not yet taken), not the answer arriving sooner"
            + (f"; it happens more often than with stock in {len(above)} of {len(seen) - 1} other configurations "
               f"({', '.join(above)})" if above and len(seen) > 1 else "")
            + ". A TTOT ratio measured at the client carries this delivery effect and the twin's does not; TTFO, "
            "counted from the request's start, does not carry it.", ""]
