"""Where a real engine's time goes, stock beside hooked: each vLLM process of the engine
(the engine core, which schedules, and the worker, which runs the model, samples and
keeps vLLM's persistent batch) sampled by py-spy while the A/B's reasoning mix runs at
the A/B's rate on the GPU-shaped rig, one engine at a time. It answers what the step
traces cannot: whether a hooked engine spends its steps in the hook's own code (the
scheduler hook, the logits processor) or in vLLM's batch bookkeeping that the hook's
policies cause (requests held out of a step leave vLLM's persistent batch and are added
back), or in neither.

    python -m realab profile measure RESULTS_JSON --label LABEL [--rate R] [--prompts N] [--configs C,...]
    python -m realab profile report RESULTS_JSON OUT_MD

A config is `stock` or `hook:<policy>` (the hook's scheduler and logits processor, the
policy channel closed: no proxy drives it). The sampler runs on the cores the engine's
forward pass does not, beside the API server, so it slows delivery: the page reports the
engine's shares of samples and its step times, never the clients' latencies."""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import measure as m
from . import rig, stepcost

#: Where a sampled stack spends its time (by function name, or by the file for
#: Meridian's code): the frame nearest the top of the stack that any group matches
#: decides, so vLLM's scheduler called from the hook's counts as vLLM's.
GROUPS = [
    ("Meridian's code (the hook; the step trace, which every engine here runs)", lambda f: "meridian_hook/" in f),
    ("the model's forward pass", lambda f: f.startswith("GPUModelRunner._model_forward ")),
    ("vLLM's persistent batch (requests removed and added back, metadata)",
     lambda f: f.startswith(("GPUModelRunner._update_states ", "InputBatch."))),
    ("sampling and logits processors", lambda f: f.startswith(("GPUModelRunner._sample ", "Sampler."))),
    ("vLLM's scheduler", lambda f: f.startswith(("Scheduler.", "AsyncScheduler."))),
    ("waiting for the other process (shared-memory queue)", lambda f: f.startswith("MessageQueue.")),
]
OTHER = "everything else"
#: The loops the processes' main threads run; a stack without one is another thread's
#: (vLLM's monitors, the sampler's idle helpers), which py-spy samples too.
MAIN_LOOPS = ("WorkerProc.worker_busy_loop ", "EngineCoreProc.run_busy_loop ")


def classify(raw_lines) -> dict[str, float]:
    """Share of the main thread's samples per group from py-spy's raw output
    (`frame;frame;... count`, outermost frame first, a frame `function (file:line)`): a
    sample counts for the group of its innermost frame that any group matches
    (everything else when none does); stacks of other threads are left out."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw_lines:
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        if not any(f.startswith(MAIN_LOOPS) for f in frames):
            continue
        group = next((name for f in reversed(frames) for name, match in GROUPS if match(f)), OTHER)
        counts[group] += int(n)
        total += int(n)
    return {name: counts[name] / total for name in [*(g for g, _ in GROUPS), OTHER]} if total else {}


def step_figures(steps: list[dict]) -> dict[str, float]:
    """Median decode-only step by batch size (batches of four: 1-4, 5-8, ...; ten steps
    at least), median time inside `schedule()`, and how many steps."""
    out: dict[str, float] = {"steps": len(steps)}
    by_batch: dict[int, list[float]] = {}
    for s in steps:
        if s["prefill_tokens"] == 0 and s["decode_reqs"] > 0:
            by_batch.setdefault((s["decode_reqs"] - 1) // 4, []).append(s["step_s"])
    for b, times in sorted(by_batch.items()):
        if len(times) >= 10:
            out[f"decode_{4 * b + 1}-{4 * b + 4}"] = statistics.median(times)
    if steps:
        out["schedule"] = statistics.median(s["sched_s"] for s in steps)
    return out


def _start(s: m.Setup, work: Path, config: str) -> rig.Proc:
    name = config.replace(":", "-")
    if config == "stock":
        return rig.start_engine(s.spec, name, work, stepcost.CONFIGS["stock"][0])
    cls, more, _ = stepcost.CONFIGS["hook"]
    cfg = work / f"{name}.toml"
    cfg.write_text(f'[hook]\nlisten = "127.0.0.1:{rig.free_port()}"\npolicy = "{config.split(":", 1)[1]}"\n')
    return rig.start_engine(s.spec, name, work, cls, more, {"MERIDIAN_HOOK_CONFIG": str(cfg)})


def _processes(proc: rig.Proc) -> dict[str, str]:
    """The engine's core and worker processes by their titles (vLLM sets them)."""
    out = {}
    for pid in subprocess.run(["pgrep", "-s", str(proc.popen.pid)], capture_output=True, text=True).stdout.split():
        try:
            title = Path(f"/proc/{pid}/cmdline").read_text().split("\0")[0]
        except OSError:
            continue
        if "EngineCore" in title:
            out["core"] = pid
        elif "Worker" in title:
            out["worker"] = pid
    return out


def measure(s: m.Setup, work: Path, pyspy: str, configs: list[str], rate: float, prompts: int, log=print) -> dict:
    w = dataclasses.replace(s.workloads[0], prompts=prompts)
    out: dict = {"configs": {}, "rate": rate, "prompts": prompts, "workload": w.name}
    for config in configs:
        proc = _start(s, work, config)
        try:
            rig.wait_http(proc, "/health", 600)
            m.warm_up(s, proc.url, w, work / f"warm-{config}.json")
            pids = _processes(proc)
            if set(pids) != {"core", "worker"}:
                raise RuntimeError(f"{config}: engine processes not found ({pids})")
            run = threading.Thread(target=m.loadtest, args=(s, proc.url, w, f"{rate:.6f}", 0, work / f"run-{config}.json"))
            run.start()
            t0 = time.monotonic()
            time.sleep(3)  # past the first arrivals
            seconds = max(5, int(prompts / rate) - 6)
            # Blocking sampling (each process paused for the microseconds a stack read
            # takes): a non-blocking read of a process inside its forward pass often fails
            # and drops the sample, which leaves the busy stretches under-counted.
            spies = {k: subprocess.Popen([pyspy, "record", "--pid", pid, "--rate", "200", "--idle",
                                          "--format", "raw", "-o", str(work / f"spy-{config}-{k}.txt"),
                                          "--duration", str(seconds)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                     for k, pid in pids.items()}
            for spy in spies.values():
                spy.wait()
            t1 = time.monotonic()
            run.join()
        finally:
            proc.stop()
        trace = work / f"{config.replace(':', '-')}-steps.jsonl"
        steps = [x for x in (json.loads(line) for line in trace.open()) if t0 <= x["t"] <= t1]
        out["configs"][config] = {"samples": {k: str(work / f"spy-{config}-{k}.txt") for k in spies},
                                  "steps": step_figures(steps)}
        log(f"{config}: profiled {t1 - t0:.0f} s")
    return out


def keep_samples(run: dict, raw_dir: Path) -> None:
    """Copies each process's samples (gzipped) under `raw_dir`, named in the run by their
    path relative to the results' folder, so the page is computed from them."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    for config, c in run["configs"].items():
        for proc, src in c["samples"].items():
            dst = raw_dir / f"spy-{config.replace(':', '-')}-{proc}.txt.gz"
            with open(src, "rb") as f, gzip.open(dst, "wb", compresslevel=9) as g:
                shutil.copyfileobj(f, g)
            c["samples"][proc] = str(dst.relative_to(raw_dir.parent.parent))


def shares_of(run: dict, base: Path) -> dict[str, dict[str, dict[str, float]]]:
    """Per config and process, the shares of the kept samples (`classify`)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for config, c in run["configs"].items():
        out[config] = {}
        for proc, rel in c["samples"].items():
            with gzip.open(base / rel, "rt") as f:
                out[config][proc] = classify(f)
    return out


def write_page(results: Path, out: Path) -> None:
    data = json.loads(results.read_text())
    lines = ["# Where a hooked engine's time goes (real vLLM, sampled)", "",
             stepcost.generated_line("profile", results, out), "",
             "Each engine serves the A/B's reasoning mix at the A/B's rate on the GPU-shaped rig, one engine at a "
             "time, while py-spy samples both of its processes 200 times a second (pausing each for the stack read, "
             "so a busy stretch is sampled as often as an idle one), idle time included, and the page counts their "
             "main threads: the engine core (vLLM's scheduler, and the hook's) and the worker (the forward pass, sampling with the logits "
             "processors, and vLLM's persistent batch, which a request held out of a step leaves and re-enters). A "
             "sample counts for the group of the innermost frame of its stack that one matches (vLLM's scheduler called from the hook's counts as vLLM's). The sampler shares "
             "the API server's core, so client latencies are not reported. Pausing a process 200 times a second "
             "slows it: the engines run fewer steps in the window than unsampled ones would and queue more, so the "
             "step times below (from the engines' step traces in the same window) describe each engine under the "
             "sampler, the same load for all three, not the steps a user's engine takes.", ""]
    for run in data["runs"]:
        configs = list(run["configs"])
        shares = shares_of(run, results.parent)
        lines += [f"## {run['label']}", "",
                  f"Build: {run['commit']}; measured {run['date']}; {run['prompts']} requests of the "
                  f"{run['workload']} workload at {run['rate']:g} req/s.", ""]
        for proc in ("worker", "core"):
            lines += [f"Share of the {proc} process's samples:", "",
                      "| where | " + " | ".join(f"`{c}`" for c in configs) + " |",
                      "|---|" + "---:|" * len(configs)]
            for g in [*(name for name, _ in GROUPS), OTHER]:
                lines.append(f"| {g} | " + " | ".join(
                    f"{shares[c].get(proc, {}).get(g, 0.0) * 100:.1f}%" for c in configs) + " |")
            lines.append("")
        keys = sorted({k for c in configs for k in run["configs"][c]["steps"] if k != "steps"},
                      key=lambda k: (k == "schedule", int(k.split("_")[1].split("-")[0]) if k.startswith("decode_") else 0))
        lines += ["Step times under the sampler (medians, ms):", "", "| step | " + " | ".join(f"`{c}`" for c in configs) + " |",
                  "|---|" + "---:|" * len(configs)]
        for k in keys:
            label = (f"decode-only, {k.removeprefix('decode_')} requests" if k.startswith("decode_")
                     else "time inside `schedule()`")
            cells = [run["configs"][c]["steps"].get(k) for c in configs]
            lines.append(f"| {label} | " + " | ".join("-" if v is None else f"{v * 1000:.2f}" for v in cells) + " |")
        lines += ["| steps in the window | " + " | ".join(str(int(run["configs"][c]["steps"]["steps"])) for c in configs)
                  + " |", ""]
    out.write_text("\n".join(lines))


def main(argv: list[str], setup) -> None:
    if argv[:1] == ["measure"]:
        results = Path(argv[1])
        opts = dict(zip(argv[2::2], argv[3::2]))
        label = opts.get("--label") or sys.exit("--label is required")
        configs = opts.get("--configs", "stock,hook:output-first,hook:fcfs").split(",")
        bad = [c for c in configs if c != "stock" and not c.startswith("hook:")]
        if bad:
            sys.exit(f"--configs: stock or hook:<policy>; got {bad}")
        import tempfile
        work = Path(tempfile.mkdtemp(prefix="profile-"))
        print(f"work directory: {work}", flush=True)
        s = setup(work)
        run = measure(s, work, opts.get("--pyspy", "py-spy"), configs, float(opts.get("--rate", "2.161")),
                      int(opts.get("--prompts", "120")), log=lambda msg: print(msg, flush=True))
        stepcost.append_run(results, run, label, s.root,
                            keep=lambda r, n: keep_samples(r, results.parent / "raw" / f"run-{n}"))
    elif argv[:1] == ["report"]:
        write_page(Path(argv[1]), Path(argv[2]))
    else:
        sys.exit(__doc__)
