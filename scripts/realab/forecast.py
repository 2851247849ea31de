"""The twin beside the measurement, then the twin's forecast for GPUs (issue 27, item 6).

    python -m realab forecast SET_DIR SIM      # SIM: target/release/meridian-sim

For a kept set of the policies page: the twin is calibrated on the rig's own stock engine
(its step traces, kept in `SET_DIR/steps/` by `policies keep` and `policies add`; each
machine's steps at its own pace: `calibrate`), and replays every measured round's
requests on the twin of the machine the round ran on (the lengths the engine reported,
the send times rescaled so that the load is the same fraction of the twin's capacity as the run's was
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
    """Stock's capacity on the machine a round ran on: `measured`, the capacity the round
    was sent by (`sent_by`), scaled by how much faster that machine ran than the one that
    measured it (`speed.Standing`; None or no reading: the same machine)."""
    if measured is None:
        return None
    return measured * (standing.speed if standing is not None and standing.speed else 1.0)


def sent_by(data: dict, workload: str, load: float, rnd: int) -> float | None:
    """The capacity a round's stock run was sent by: the one it recorded (a harness that
    measures the capacity in every invocation records it, and a round on a machine that
    measured its own stands at its load of that one), else the set's."""
    for r in data["runs"]:
        if (r["workload"], r["load"], r["round"], r["config"]) == (workload, load, rnd, "stock"):
            if r.get("capacity"):
                return r["capacity"]
            break
    return data.get("capacity", {}).get(workload)


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


#: Fit passes at most: each after the first refits on steps scaled by the machines' paces
#: read against the fit before it, until no pace moves by more than `PACE_SETTLED`.
FIT_PASSES, PACE_SETTLED = 4, 0.005


def machine_paces(traces: dict[str, list[dict]], profile_toml: str, reference: str) -> dict[str, float]:
    """{work: how much slower its machine stepped than `reference`'s}: the median of its
    stock engine's decode-only steps measured over the fit, over the reference's median
    (at least `MIN_STEPS_PER_RUN` such steps; a trace with fewer is taken as the
    reference's pace). The reference is 1 by definition."""
    fitted = R.decode_step_fit(profile_toml)
    medians = {}
    for work, steps in traces.items():
        ratios = [st["step_s"] / fitted(st) for st in steps
                  if not st.get("prefill_tokens") and st.get("decode_reqs") and st.get("step_s")]
        if len(ratios) >= R.MIN_STEPS_PER_RUN:
            medians[work] = statistics.median(ratios)
    base = medians.get(reference)
    if not base:
        return {work: 1.0 for work in traces}
    return {work: medians[work] / base if work in medians else 1.0 for work in traces}


def reference_work(data: dict, traces: dict[str, list[dict]]) -> str:
    """The invocation whose machine the rig's profile stands for: the one that measured
    the set's capacity (its first workload's) where its trace is kept, else the one with
    the most steps kept."""
    workloads = data["setup"]["workloads"]
    basis = speed.capacity_work(data, workloads[0]["name"]) if workloads else None
    return basis if basis in traces else max(traces, key=lambda w: (len(traces[w]), w))


def calibrate(sim: Path, set_dir: Path, data: dict, tmp: Path) -> tuple[Path, dict[str, float]]:
    """The rig's twin profile, fitted to its stock engine's kept step traces, and each
    invocation's machine pace against the profile's (`machine_paces`).

    Why per machine: a set's rounds ran on more than one machine (sessions, days), and
    one machine's engine stepped a third slower than another's. Fitted to the traces
    pooled, the cost model is neither machine's and every step misses by the machines'
    spread (set 9's median error per step 11% on one machine, 20% pooled). So the fit
    runs again on each machine's steps divided by its pace read against the fit before
    (the reference machine's as they were), until the paces settle: one cost model at
    the reference machine's speed, which a round's twin multiplies by its machine's
    pace (`paced_profile`). A set measured on one machine fits once, as before."""
    found = sorted((set_dir / "steps").glob("stock-*.jsonl.gz"))
    if not found:
        raise SystemExit(f"{set_dir}/steps: no stock step trace kept (policies keep/add keep them)")
    traces: dict[str, list[dict]] = {}
    for t in found:
        with gzip.open(t, "rt") as src:
            steps = [json.loads(line) for line in src if line.strip()]
        if steps:
            traces[t.name[len("stock-"):-len(".jsonl.gz")]] = steps
    reference = reference_work(data, traces)
    paces = {work: 1.0 for work in traces}
    profile = _fit(sim, set_dir, data, traces, paces, tmp)
    for _ in range(FIT_PASSES - 1 if len(traces) > 1 else 0):
        # Each machine's own steps, as measured, against the latest fit (made of every
        # machine's steps at the paces read before).
        read = machine_paces(traces, profile.read_text(), reference)
        if all(abs(read[w] / paces[w] - 1) <= PACE_SETTLED for w in traces):
            break
        paces = read
        profile = _fit(sim, set_dir, data, traces, paces, tmp)
    calibration = set_dir / "twin" / "calibration.json"
    fit = json.loads(calibration.read_text())
    fit["machines"] = {"reference": reference, "paces": paces}
    calibration.write_text(json.dumps(fit))
    shutil.copy(profile, set_dir / "twin" / "rig-profile.toml")
    return profile, paces


def _fit(sim: Path, set_dir: Path, data: dict, traces: dict[str, list[dict]], paces: dict[str, float],
         tmp: Path) -> Path:
    """`meridian-sim calibrate` on the traces laid end to end, each step's time divided by
    its machine's pace; writes the set's `twin/calibration.json` and returns the profile."""
    joined = tmp / "stock-steps.jsonl"
    # Each trace's times are its own boot's monotonic clock, so two sessions' traces may
    # overlap: laid end to end (each shifted to start after the one before), a run's
    # window, shifted with its own trace, catches only that trace's steps.
    windows: list[tuple[float, float]] = []
    end = 0.0
    with joined.open("w") as dst:
        for work, steps in traces.items():
            shift = end + 1.0 - steps[0]["t"]
            for st in steps:
                dst.write(json.dumps({**st, "t": st["t"] + shift, "step_s": st["step_s"] / paces[work]},
                                     separators=(",", ":")) + "\n")
            end = steps[-1]["t"] + shift
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
        rig_profile, _paces = calibrate(sim, set_dir, data, tmp)
        rig_text = rig_profile.read_text()
        paces = run_paces(set_dir, data)
        twins: dict[float, Twin] = {}

        def rig_at(pace: float) -> Twin:
            """The rig twin stepping `pace` times as long as the profile (one per pace)."""
            if pace not in twins:
                if pace == 1.0:
                    twins[pace] = Twin(sim, rig_profile, "rig", tmp)
                else:
                    at = tmp / f"rig-{len(twins)}.toml"
                    at.write_text(paced_profile(rig_text, pace))
                    twins[pace] = Twin(sim, at, "rig", tmp)
            return twins[pace]

        # {run key: the pace of the machine it ran on}, as the calibration just recorded.
        machine_at = R.run_machines(set_dir, data)

        def machine_of(workload: str, load: float, rnd: int, config: str) -> float:
            return machine_at.get((config, workload, load, rnd), 1.0)

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
                for rnd, stock in sorted(runs.get("stock", {}).items()):
                    # Stock's capacity as measured on the rig (everything sent at once),
                    # which the run's load is a fraction of; without one, the rig twin's own.
                    measured_cap = sent_by(data, w["name"], load, rnd)
                    # The twin of the machine the round ran on (its stock run's).
                    machine = machine_of(w["name"], load, rnd, "stock")
                    rig = rig_at(machine)
                    cap_rig = rig.capacity(stock)
                    card_caps = {slug: twin.capacity(scaled(stock, prompt_scale, 1.0)) for slug, twin in cards.items()}
                    # A round sent by the capacity of a slower (or faster) machine than its
                    # own stood at another load (`speed`): the twins replay it at that one.
                    own = machine_capacity(measured_cap, standing.get((w["name"], load, rnd, "stock")))
                    rig_scale, card_scales = load_scales(own, cap_rig, card_caps)
                    summary["rounds"][f"{w['name']}-{load:g}-{rnd}"] = {
                        "rig_capacity": cap_rig, "measured_capacity": measured_cap, "machine_capacity": own,
                        "rig_time_scale": rig_scale, "machine_pace": machine, "capacity": card_caps,
                        "time_scale": card_scales}
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
                            # The run's pace is against its own machine (`regime.run_readings`).
                            paced = rig_at(machine_of(w["name"], load, rnd, config) * pace)
                            _write(set_dir / "twin" / PACED / name, paced.replay(on_rig, policy))
                        for slug, twin in cards.items():
                            _write(set_dir / "twin" / slug / name, twin.replay(on_card[slug], policy))
    (set_dir / "twin" / "forecast.json").write_text(json.dumps(summary, indent=1))
    return summary
