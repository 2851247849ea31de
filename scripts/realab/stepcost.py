"""What the hook costs the engine's own steps, measured where the whole A/B runs: real
vLLM (CPU build) engines, stock and hooked, alive at once, one serving at a time (the
others paused), the same closed-loop load on each in rotating order, several rounds.

Step times come from each engine's step trace (`meridian_hook.steptrace`), grouped by
what the step computed, so a step is compared with steps of the same shape: decode-only
steps by batch size, and prompt-heavy steps per prompt token. A second stock engine
("stock-again") runs beside the first, so the page shows how far two identical engines
differ on this machine: an effect smaller than that is not one.

    python -m realab stepcost measure RESULTS_JSON --label LABEL [--rounds N] [--configs a,b]
    python -m realab stepcost report RESULTS_JSON OUT_MD

`measure` appends one labelled run (its commit and the hook's policy recorded) to
RESULTS_JSON; `report` writes the page from every run there."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import rig

#: How each configuration starts its engine: scheduler class, extra vLLM arguments, and
#: whether the hook's config and channel token are set (the channel's listener and the
#: workers' follower run only with the token, as in the A/B).
HOOK_ARGS = ["--logits-processors", "meridian_hook.logits:MeridianLogitsProcessor"]
CONFIGS = {
    "stock": ("meridian_hook.steptrace.StepTraceScheduler", [], False),
    "stock-again": ("meridian_hook.steptrace.StepTraceScheduler", [], False),
    "hook": ("meridian_hook.steptrace.TracedMeridianScheduler", HOOK_ARGS, True),
    "hook-no-channel": ("meridian_hook.steptrace.TracedMeridianScheduler", HOOK_ARGS, None),
}
TOKEN = "stepcost-secret"


@dataclass(frozen=True)
class Load:
    """The closed-loop load each window runs: `concurrency` streams, long prompts (a
    prompt is several chunks' worth of prefill), short thoughts and answers."""

    concurrency: int = 4
    input_len: int = 1000
    think_len: int = 128
    output_len: int = 64
    requests_per_window: int = 12


def window_metrics(steps: list[dict], concurrency: int) -> dict[str, float]:
    """Median step time (s) of the decode-only steps at each batch size seen at least ten
    times, prompt time per token of the steps computing at least 1,024 prompt tokens, and
    median time inside `schedule()`."""
    out: dict[str, float] = {}
    for batch in range(1, concurrency + 1):
        times = [s["step_s"] for s in steps if s["prefill_tokens"] == 0 and s["decode_reqs"] == batch]
        if len(times) >= 10:
            out[f"decode_{batch}"] = statistics.median(times)
    per_token = [s["step_s"] / s["prefill_tokens"] for s in steps if s["prefill_tokens"] >= 1024]
    if per_token:
        out["prefill_per_token"] = statistics.median(per_token)
    if steps:
        out["schedule"] = statistics.median(s["sched_s"] for s in steps)
    return out


def ratios(run: dict, num: str, den: str) -> dict[str, list[float]]:
    """Per metric, num's figure over den's in each round both measured it."""
    out: dict[str, list[float]] = {}
    for rnd in run["rounds"]:
        a, b = rnd.get(num, {}), rnd.get(den, {})
        for key in a.keys() & b.keys():
            if b[key] > 0:
                out.setdefault(key, []).append(a[key] / b[key])
    return out


def _engine(spec: rig.EngineSpec, name: str, work: Path, policy: str) -> rig.Proc:
    cls, more, channel = CONFIGS[name]
    env: dict[str, str] = {}
    if channel is not None:
        cfg = work / f"{name}.toml"
        cfg.write_text(f'[hook]\nlisten = "127.0.0.1:{rig.free_port()}"\npolicy = "{policy}"\n')
        env["MERIDIAN_HOOK_CONFIG"] = str(cfg)
        if channel:
            env["MERIDIAN_HOOK_TOKEN"] = TOKEN
    return rig.start_engine(spec, name, work, cls, more, env)


def measure(root: Path, spec: rig.EngineSpec, work: Path, names: list[str], rounds: int, load: Load,
            policy: str, log=print) -> dict:
    tester = [str(root / "target" / "release" / "meridian-loadtest"), "--model", spec.served_name,
              "--model-family", "qwen3", "--request-rate", "inf", "--max-concurrency", str(load.concurrency),
              "--ignore-eos", "--extra-body", json.dumps({"logit_bias": {str(think_end_id(spec.model)): -100}}),
              "--random-input-len", str(load.input_len), "--random-think-len", str(load.think_len),
              "--random-output-len", str(load.output_len), "--random-range-ratio", "0.9", "--disable-tqdm",
              "--save-result", "--result-dir", str(work)]
    procs: dict[str, rig.Proc] = {}
    windows: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    try:
        for n in names:
            procs[n] = _engine(spec, n, work, policy)
            rig.wait_http(procs[n], "/health", 600)
            procs[n].pause()

        def serve(n: str, seed: int, count: int, out: str) -> tuple[float, float]:
            p = procs[n]
            p.resume()
            rig.wait_http(p, "/health", 60)
            t0 = time.perf_counter()
            subprocess.run([*tester, "--base-url", p.url, "--seed", str(seed), "--num-prompts", str(count),
                            "--result-filename", out], check=True, stdout=subprocess.DEVNULL, timeout=900)
            t1 = time.perf_counter()
            p.pause()
            return t0, t1

        for n in names:  # warm-up, left out of the figures
            serve(n, 1000, 2 * load.concurrency, f"warm-{n}.json")
        for rnd in range(rounds):
            for n in names[rnd % len(names):] + names[:rnd % len(names)]:
                windows[n].append(serve(n, rnd, load.requests_per_window, f"{n}-{rnd}.json"))
            log(f"round {rnd + 1}/{rounds} done")
    finally:
        for p in procs.values():
            p.stop()
    table: list[dict[str, dict[str, float]]] = [{} for _ in range(rounds)]
    for n in names:
        steps = [json.loads(line) for line in open(work / f"{n}-steps.jsonl")]
        for rnd, (t0, t1) in enumerate(windows[n]):
            table[rnd][n] = window_metrics([s for s in steps if t0 <= s["t"] <= t1], load.concurrency)
    return {"rounds": table, "load": load.__dict__, "configs": names, "policy": policy}


def think_end_id(model: Path) -> int:
    return int(json.loads((model / "meridian-ids.json").read_text())["</think>"])


def _commit(root: Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def append_run(results: Path, run: dict, label: str, root: Path, keep=None) -> None:
    """Labels `run` (its build and date) and appends it to RESULTS_JSON; `keep(run, n)`,
    when given, first stores what the run refers to as the results' n-th run."""
    run.update(label=label, commit=_commit(root), date=time.strftime("%Y-%m-%d"))
    data = json.loads(results.read_text()) if results.exists() else {"runs": []}
    if keep is not None:
        keep(run, len(data["runs"]))
    data["runs"].append(run)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(data, indent=1))


# --- the page ---------------------------------------------------------------------------

LABELS = {"schedule": "time inside `schedule()`", "prefill_per_token": "prompt-heavy step, per prompt token"}


def _label(key: str) -> str:
    if key.startswith("decode_"):
        return f"decode-only step, batch {key.split('_')[1]}"
    return LABELS.get(key, key)


def _order(key: str) -> tuple[int, str]:
    return (0 if key.startswith("decode_") else 1 if key == "prefill_per_token" else 2, key)


def run_rows(run: dict) -> list[str]:
    base = run["configs"][0]
    lines = ["| effect | metric | median ratio | spread over rounds (min to max) | rounds |",
             "|---|---|---:|---:|---|"]
    for other in run["configs"][1:]:
        for key, rs in sorted(ratios(run, other, base).items(), key=lambda kv: _order(kv[0])):
            lines.append(f"| {other} / {base} | {_label(key)} | {statistics.median(rs):.3f} | "
                         f"{min(rs):.3f} to {max(rs):.3f} | {' '.join(f'{r:.2f}' for r in rs)} |")
    return lines


def headline(run: dict) -> str:
    """The decode step at the largest batch measured, hook over stock beside
    stock-again over stock: the sentence the page leads with."""
    base = run["configs"][0]
    hook = next((c for c in run["configs"] if c.startswith("hook")), None)
    again = "stock-again" if "stock-again" in run["configs"] else None
    if hook is None:
        return ""
    rs = ratios(run, hook, base)
    keys = sorted((k for k in rs if k.startswith("decode_")), key=lambda k: int(k.split("_")[1]))
    if not keys:
        return ""
    key = keys[-1]
    text = (f"{_label(key)}: {hook} / {base} {statistics.median(rs[key]):.3f} (rounds {min(rs[key]):.2f} to "
            f"{max(rs[key]):.2f})")
    if again:
        noise = ratios(run, again, base).get(key)
        if noise:
            text += f"; two stock engines differ by {statistics.median(noise):.3f} ({min(noise):.2f} to {max(noise):.2f})"
    return text


def generated_line(module: str, results: Path, out: Path) -> str:
    """The page's opening line: the command that wrote it, from which results file, and
    the script that measures them."""
    src = results.relative_to(out.parent) if out.parent in results.parents else results.name
    return (f"Generated by `python -m realab {module} report` from `{src}`; measured by "
            f"`scripts/bench-hook-{'steps' if module == 'stepcost' else module}.sh` (see the module's docstring: "
            f"`scripts/realab/{module}.py`).")


def write_page(results: Path, out: Path) -> None:
    data = json.loads(results.read_text())
    lines = ["# The hook's cost to the engine's steps (real vLLM, interleaved)", "",
             generated_line("stepcost", results, out), "",
             "The scheduler's own cost ([The hook's own cost](hook-overhead.md)) is measured "
             "on vLLM's classes without a model. This page measures what a user's engine feels: "
             "the steps of real vLLM engines (CPU build, the A/B's benchmark model and limits), "
             "stock and hooked, alive at once and serving one at a time (the others paused), the "
             "same closed-loop load in rotating order, several rounds. Each step is compared "
             "with steps of the same shape (decode-only at one batch size; prompt-heavy steps per "
             "prompt token). `stock-again` is a second stock engine: how far two identical engines "
             "differ here is the floor under any effect. The hook runs the policy named (fcfs: it "
             "reorders nothing), with its logits processor and its policy channel on, as in the A/B.",
             ""]
    for run in data["runs"]:
        load = run["load"]
        lines += [f"## {run['label']}", "",
                  f"Build: {run['commit']}; measured {run['date']}; hook policy `{run['policy']}`; "
                  f"{len(run['rounds'])} rounds; each window {load['requests_per_window']} requests, "
                  f"{load['concurrency']} at a time, prompts ~{load['input_len']}, thoughts ~{load['think_len']}, "
                  f"answers ~{load['output_len']} tokens.", ""]
        if run.get("note"):
            lines += [run["note"], ""]
        head = headline(run)
        if head:
            lines += [f"**{head}.**", ""]
        lines += run_rows(run) + [""]
    out.write_text("\n".join(lines))


def main(argv: list[str], root: Path, spec_for) -> None:
    if argv[:1] == ["measure"]:
        results = Path(argv[1])
        opts = dict(zip(argv[2::2], argv[3::2]))
        label = opts.get("--label") or sys.exit("--label is required")
        names = opts.get("--configs", "stock,hook,stock-again").split(",")
        unknown = [n for n in names if n not in CONFIGS]
        if unknown or names[0] != "stock":
            sys.exit(f"--configs: the first must be stock, the rest from {sorted(CONFIGS)}; got {names}")
        import tempfile
        work = Path(tempfile.mkdtemp(prefix="stepcost-"))
        print(f"work directory: {work}", flush=True)
        policy = os.environ.get("REALAB_HOOK_POLICY", "fcfs")
        run = measure(root, spec_for(work), work, names, int(opts.get("--rounds", "6")), Load(), policy,
                      log=lambda m: print(m, flush=True))
        append_run(results, run, label, root)
    elif argv[:1] == ["report"]:
        write_page(Path(argv[1]), Path(argv[2]))
    else:
        sys.exit(__doc__)
