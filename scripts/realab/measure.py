"""Measures the dispatch A/B on a real vLLM (CPU build): the step-time curve, the stock
engine's capacity, then every workload x load x round with the configurations in
rotating order, each run driven by meridian-loadtest with the same seed in a round.
Writes one JSON file of everything measured; `report.py` turns it into the page."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from . import curve, drift, machine, rig, silent, slo, speed, stalls


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    prompts: int
    input_len: int
    think_len: int
    output_len: int
    range_ratio: float
    # The engine's KV cache in blocks (`--num-gpu-blocks-override`) for a workload that
    # must run out of it; None: the cache `kv_cache_gib` makes (far more than any run needs).
    kv_blocks: int | None = None

    def tester_args(self) -> list[str]:
        return ["--num-prompts", str(self.prompts), "--random-input-len", str(self.input_len),
                "--random-think-len", str(self.think_len), "--random-output-len", str(self.output_len),
                "--random-range-ratio", str(self.range_ratio)]


#: The configurations of a run: stock vLLM, stock vLLM behind Meridian, and vLLM with the
#: hook behind Meridian under the default policy (`hook`) or a named one (`hook-<policy>`:
#: hook-fcfs, hook-output-first, hook-reasoning-first, hook-slo-driven). REALAB_CONFIGS
#: picks them (comma-separated; stock first). `stock-again` runs the same stock engine a
#: second time in the round (an A/A run): what it differs from stock by is the rig's
#: run-to-run noise, measured instead of inferred.
CONFIGS = ["stock", "proxy", "hook"]
STOCK_AGAIN = "stock-again"


def shipped_policy(root: Path | None = None) -> str:
    """The hook policy `meridian.toml` ships (`hook.policy`): the config named `hook`
    runs it, and the page judges it by "do no harm"."""
    root = root or Path(__file__).resolve().parents[2]
    with open(root / "meridian.toml", "rb") as f:
        return tomllib.load(f)["hook"]["policy"]


def configs_from_env() -> list[str]:
    names = os.environ.get("REALAB_CONFIGS", ",".join(CONFIGS)).split(",")
    bad = [n for n in names if n not in ("stock", "proxy", "hook", STOCK_AGAIN) and not n.startswith("hook-")]
    if bad or not names or names[0] != "stock" or len(set(names)) != len(names):
        raise SystemExit(f"REALAB_CONFIGS: stock first, then {STOCK_AGAIN}, proxy, hook or hook-<policy>, "
                         f"each once; got {names}")
    return names


def policy_of(config: str) -> str | None:
    """The hook policy a config runs (None: no hook)."""
    if config == "hook":
        return os.environ.get("REALAB_HOOK_POLICY") or shipped_policy()
    if config.startswith("hook-"):
        return config[len("hook-"):]
    return None


@dataclass
class Setup:
    root: Path
    work: Path
    spec: rig.EngineSpec
    think_end_id: int
    models_dir: Path
    workloads: list[Workload]
    loads: list[float]
    rounds: int
    slo_ttot_ms: float
    slo_gap_ms: float
    hook_token: str = "realab-hook-secret"
    configs: list[str] = field(default_factory=lambda: list(CONFIGS))
    #: Run each round's requests one at a time on the stock engine too (the reference
    #: of the whole-request SLO: each request against itself unloaded).
    unloaded: bool = False
    #: The first round's number, which is its seed: rounds added to a kept set later
    #: (`policies add`) start after the set's last one, so no seed is measured twice.
    first_round: int = 0
    #: The regime the engine limits stand for (`cpu`, `gpu`): what a workload's runs hold.
    rig: str = "cpu"
    #: A run whose engine ran more than this share off the pace of the runs before it is
    #: measured again, at most `drift_retries` times (`drift`); None: never.
    drift_margin: float | None = 0.1
    drift_retries: int = 1
    #: Before each run, wait up to this long for the hypervisor to stop taking CPU.
    calm_s: float = 300.0
    #: Tokens biased away so that every answer token shows (`silent`; REALAB_VISIBLE=1).
    silent_token_ids: tuple[int, ...] = ()

    def round_numbers(self) -> range:
        return range(self.first_round, self.first_round + self.rounds)


class Rig:
    """The stock engine with its proxy (it also serves clients directly), and one hooked
    engine with its proxy, started under the policy the active config names and
    restarted when another config names another; every engine is warmed up before it is
    measured. One group runs while the other is paused."""

    def __init__(self, s: Setup, warm: Workload | None = None) -> None:
        self.s = s
        self.warm = warm
        self.procs: list[rig.Proc] = []
        self.hook_port = rig.free_port()
        self.policy: str | None = None
        self.hooked: rig.Proc | None = None
        self.proxy_hook: rig.Proc | None = None
        self.stock = self._add(rig.start_engine(s.spec, "stock", s.work, "meridian_hook.steptrace.StepTraceScheduler"))
        rig.wait_http(self.stock, "/health", 600)
        binary = s.root / "target" / "release" / "meridian"
        self.common = [f"models.dir={s.models_dir}", "upstream.health_interval_s=0.5", *proxy_sets(s)]
        self.binary = binary
        self.proxy_stock = self._add(rig.start_proxy(binary, "proxy-stock", s.work,
                                                     [f"upstream.endpoints=[{{url = \"{self.stock.url}\"}}]", *self.common]))
        rig.wait_http(self.proxy_stock, "/ready", 60)
        self.groups: dict[str, list[rig.Proc]] = {"stock": [self.stock, self.proxy_stock], "hook": []}
        # Each hooked config's engine keeps its own log and step trace across restarts.
        self.engine_names = {policy_of(c): engine_name(c) for c in s.configs if policy_of(c) is not None}
        self.started: set[str] = set()

    def _add(self, p: rig.Proc) -> rig.Proc:
        self.procs.append(p)
        return p

    def _start_hooked(self, policy: str) -> None:
        """(Re)starts the hooked engine and its proxy under `policy`, the stock group
        paused meanwhile; warms the engine up."""
        for p in self.groups["stock"]:
            p.pause()
        for p in self.groups["hook"]:
            p.stop()
            self.procs.remove(p)
        s = self.s
        cfg = s.work / "hook.toml"
        cfg.write_text(f'[hook]\nlisten = "127.0.0.1:{self.hook_port}"\npolicy = "{policy}"\n')
        name = self.engine_names[policy]
        self.hooked = self._add(rig.start_engine(
            s.spec, name, s.work, "meridian_hook.steptrace.TracedMeridianScheduler",
            ["--logits-processors", "meridian_hook.logits:MeridianLogitsProcessor"],
            {"MERIDIAN_HOOK_CONFIG": str(cfg), "MERIDIAN_HOOK_TOKEN": s.hook_token},
            keep_trace=name in self.started))
        self.started.add(name)
        rig.wait_http(self.hooked, "/health", 600)
        endpoints = f'[{{url = "{self.hooked.url}", hook = "127.0.0.1:{self.hook_port}"}}]'
        self.proxy_hook = self._add(rig.start_proxy(self.binary, "proxy-hook", s.work,
                                                    [f"upstream.endpoints={endpoints}", *self.common],
                                                    {"MERIDIAN_HOOK_TOKEN": s.hook_token}))
        self._wait_hook_ready()
        self.groups["hook"] = [self.hooked, self.proxy_hook]
        self.policy = policy
        if self.warm is not None:
            warm_up(s, self.hooked.url, self.warm, s.work / "runs" / f"warm-hook-{policy}.json")

    def _wait_hook_ready(self) -> None:
        def ready(r) -> bool:
            return any(line.startswith("meridian_upstream_hook_ready") and line.endswith(" 1")
                       for line in r.text.splitlines())
        assert self.proxy_hook is not None
        rig.wait_http(self.proxy_hook, "/metrics", 60, ready)

    def activate(self, config: str) -> tuple[str, rig.Proc]:
        """Resumes the group that serves `config` (starting the hooked engine under the
        config's policy if it runs another), pauses the other; returns the URL the
        clients use and the engine behind it."""
        policy = policy_of(config)
        if policy is not None and policy != self.policy:
            self._start_hooked(policy)
        active = "hook" if policy is not None else "stock"
        for name, group in self.groups.items():
            for p in group:
                (p.resume if name == active else p.pause)()
        engine = self.hooked if active == "hook" else self.stock
        assert engine is not None
        rig.wait_http(engine, "/health", 60)
        if config in ("stock", STOCK_AGAIN):
            return engine.url, engine
        proxy = self.proxy_hook if active == "hook" else self.proxy_stock
        assert proxy is not None
        rig.wait_http(proxy, "/ready", 60)
        if active == "hook":
            self._wait_hook_ready()
        return proxy.url, engine

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


def proxy_sets(s: Setup) -> list[str]:
    """The proxies' settings beyond the upstream: REALAB_PROXY=shipped runs them as
    `meridian.toml` ships (admission and priorities off); the default, `admission`,
    holds streams past the engine's max_num_seqs in the proxy's own queue, answering
    ones first, with priorities on (what the earlier pages measured)."""
    mode = os.environ.get("REALAB_PROXY", "admission")
    if mode == "shipped":
        return []
    if mode == "admission":
        return ["admission.enabled=true", f"admission.max_streams={s.spec.max_num_seqs}", "priority.enabled=true"]
    raise SystemExit(f"REALAB_PROXY: shipped or admission; got {mode!r}")


def warm_up(s: Setup, url: str, w: Workload, out: Path) -> None:
    """Requests of the workload's shape, all at once, left out of every figure: a fresh
    engine's first steps of each shape are slower, and at 90% load a slow start leaves a
    queue the rest of a run inherits."""
    out.parent.mkdir(parents=True, exist_ok=True)
    loadtest(s, url, replace(w, prompts=16), "inf", 999, out)


def loadtest(s: Setup, url: str, w: Workload, rate: str, seed: int, out: Path, concurrency: int | None = None) -> dict:
    extra = json.dumps({"logit_bias": silent.logit_bias(s.think_end_id, s.silent_token_ids)})
    cmd = [str(s.root / "target" / "release" / "meridian-loadtest"), "--base-url", url, "--model", s.spec.served_name,
           "--model-family", "qwen3", "--request-rate", rate, "--seed", str(seed), "--ignore-eos",
           "--extra-body", extra, "--goodput", f"ttot:{s.slo_ttot_ms:g}", f"gap:{s.slo_gap_ms:g}",
           "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name, "--disable-tqdm",
           *w.tester_args(), *([] if concurrency is None else ["--max-concurrency", str(concurrency)])]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return json.loads(out.read_text())


def step_window(steps: list[dict]) -> dict:
    """Preemptions and steps among the steps an engine recorded during a run."""
    return {
        "steps": len(steps),
        "preempted": sum(x["preempted"] for x in steps),
        "preempted_output": sum(x["preempted_output"] for x in steps),
        "preempted_think": sum(x["preempted_think"] for x in steps),
        "max_step_ms": max((x["step_s"] * 1000 for x in steps), default=None),
    }


def measure(s: Setup, results: Path, log=print, append: bool = False) -> dict:
    started = time.time()
    data: dict = {"setup": {"engine": {k: str(v) for k, v in asdict(s.spec).items() if k != "python"},
                            "workloads": [], "rounds": s.rounds, "first_round": s.first_round,
                            "slo_ttot_ms": s.slo_ttot_ms, "slo_gap_ms": s.slo_gap_ms, "configs": s.configs,
                            "shipped_policy": shipped_policy(s.root),
                            # Recorded only when set: sets measured before it had none.
                            **({"visible_tokens": True} if s.silent_token_ids else {})},
                  "runs": [], "capacity": {}}
    if append and results.exists():
        data = json.loads(results.read_text())
        if data["setup"].get("visible_tokens") != (True if s.silent_token_ids else None):
            raise ValueError(f"{results}: its runs were measured with REALAB_VISIBLE "
                             f"{'on' if data['setup'].get('visible_tokens') else 'off'}: append with the same")
    # Where this run's raw load-test files and step traces are, for the post-processing.
    data["work"] = [*data.get("work", []), str(s.work)]
    names = {w["name"] for w in data["setup"]["workloads"]}
    for w in s.workloads:
        if w.name in names:
            raise ValueError(f"{results} already holds workload {w.name}")
        data["setup"]["workloads"].append({**asdict(w), "loads": s.loads, "max_model_len": s.spec.max_model_len,
                                           "hook_policy": policy_of("hook"), "configs": s.configs,
                                           "proxy": os.environ.get("REALAB_PROXY", "admission"),
                                           "rig": s.rig})
    r = Rig(s, warm=s.workloads[0])
    raw = s.work / "runs"
    raw.mkdir(exist_ok=True)
    try:
        # 1. The step-time curve, on the stock engine alone, in every invocation: the same
        # probe on every machine says how fast this one is (`speed`). The twin is
        # calibrated on the first stock engine's trace: an appended run keeps that one's
        # probe window.
        url, engine = r.activate("stock")
        # (A run of references only has no runs for the twin to replay: no probe.)
        if s.loads:
            t0 = time.perf_counter()
            curve.probe(url, s.spec.served_name, vocab=467, max_batched=s.spec.max_num_batched_tokens)
            time.sleep(1.0)
            window = [t0, time.perf_counter()]
            data.setdefault("curve_window", window)
            probe = speed.probe_of([x for x in curve.read_steps(engine_trace(s, "stock"))
                                    if window[0] <= x["t"] <= window[1]])
            data.setdefault("probes", {})[s.work.name] = {"window": window, **({} if probe is None else asdict(probe))}
            log(f"curve probed ({time.time() - started:.0f} s): "
                + ("no steps traced" if probe is None else f"{probe.step_s:.2f} s of steps"))
        # 2. Capacity of the stock engine, per workload: everything sent at once (or, with
        # REALAB_CAPACITY, the figure an earlier run of the same rig measured: on a slow
        # machine the capacity run alone can take ten minutes).
        given = os.environ.get("REALAB_CAPACITY")
        source = os.environ.get("REALAB_CAPACITY_FROM")
        for w in s.workloads:
            if source:
                # A kept set's capacity, and which of its invocations measured it, so that
                # the page reads how much faster this machine ran from both sets' probes.
                cap, basis = speed.capacity_of_set(Path(source), w.name)
                data.setdefault("capacity", {})[w.name] = cap
                data.setdefault("capacity_given", {})[w.name] = True
                data.setdefault("capacity_from", {})[w.name] = Path(source).name
                data.setdefault("capacity_work", {})[w.name] = basis
                log(f"capacity {w.name}: {cap:.3f} req/s (set {Path(source).name}'s, measured by {basis})")
                continue
            if given:
                data.setdefault("capacity", {})[w.name] = float(given)
                data.setdefault("capacity_given", {})[w.name] = True
                log(f"capacity {w.name}: {float(given):.3f} req/s (given by REALAB_CAPACITY)")
                continue
            out = loadtest(s, url, w, "inf", 1000, raw / f"capacity-{w.name}.json")
            summ = out["runs"][0]["summary"]
            data.setdefault("capacity", {})[w.name] = summ["request_throughput"]
            # The machine that measured it: runs elsewhere stood at another load (`speed`).
            data.setdefault("capacity_work", {})[w.name] = s.work.name
            log(f"capacity {w.name}: {summ['request_throughput']:.3f} req/s ({time.time() - started:.0f} s)")
        # 3. Each round's requests one at a time on the stock engine: every request's
        # own unloaded times, the reference of the whole-request SLO.
        if s.unloaded:
            for w in s.workloads:
                for rnd in s.round_numbers():
                    t0 = time.perf_counter()
                    out = loadtest(s, url, w, "inf", rnd, raw / f"{w.name}-unloaded-{rnd}.json", concurrency=1)
                    # Its window (the stock engine's steps in it give its pace in the
                    # step fit's terms) and its time per output token, the pace the page
                    # checks it by (`slo.off_pace`).
                    pace = slo.reference_pace(out["runs"][0]["requests"])
                    data.setdefault("references", []).append(
                        {"workload": w.name, "round": rnd, "window": [t0, time.perf_counter()], "tpot_s": pace})
                    log(f"{w.name} round {rnd} unloaded: {'-' if pace is None else f'{1000 * pace:.2f}'} ms per "
                        f"answer token ({time.time() - started:.0f} s)")
        # 4. The A/B: loads x rounds, configurations in rotating order, one seed a round;
        # a run the machine ran off pace is measured again (`drift`).
        n = len(s.configs)
        gauge = Gauge(s.drift_margin, s.drift_retries)
        for w in s.workloads:
            cap = data["capacity"][w.name]
            for load in s.loads:
                for rnd in s.round_numbers():
                    order = s.configs[rnd % n:] + s.configs[:rnd % n]

                    def measure_run(config: str) -> dict:
                        return run_once(s, r, w, load, rnd, config, cap, raw / run_file(w, load, rnd, config),
                                        gauge, log, basis=data.get("capacity_work", {}).get(w.name))

                    def discard(config: str, attempt: int) -> None:
                        first = raw / run_file(w, load, rnd, config)
                        # (No reader globs `*.json.discarded-N`: the page counts only the run kept.)
                        first.rename(first.with_name(f"{first.name}.discarded-{attempt}"))

                    def restore(config: str, attempt: int) -> None:
                        kept = raw / run_file(w, load, rnd, config)
                        kept.with_name(f"{kept.name}.discarded-{attempt}").rename(kept)

                    runs, reruns = paced_round(order, measure_run, gauge, discard, log, restore)
                    if reruns:
                        data["drift_reruns"] = [*data.get("drift_reruns", []), *reruns]
                    data["runs"] += [runs[c] for c in order]
                    results.write_text(json.dumps(data, indent=1))
    finally:
        r.stop()
    data["elapsed_s"] = data.get("elapsed_s", 0) + time.time() - started
    results.write_text(json.dumps(data, indent=1))
    return data


def run_file(w: Workload, load: float, rnd: int, config: str) -> str:
    """The raw load-test file of one run (`stats.read_runs` parses these names)."""
    return f"{w.name}-{load:g}-{rnd}-{config}.json"


class Gauge:
    """The engine's pace over the runs of one invocation (`drift`): the step fit comes from
    the first run with enough decode-only steps, every later run is judged against it."""

    def __init__(self, margin: float | None, retries: int) -> None:
        self.margin = margin
        self.retries = retries
        self.model: drift.StepFit | None = None
        self.paces: list[float] = []

    def read(self, steps: list[dict]) -> dict:
        decode = drift.decode_steps(steps)
        if self.model is None:
            self.model = drift.fit(decode)
        pace = drift.pace(decode, self.model) if self.model is not None else None
        if pace is not None:
            self.paces.append(pace)
        return {"pace": pace, "decode_steps": len(decode), "margin": self.margin, "retries": self.retries}

    def reference(self) -> float:
        return statistics.median(self.paces) if self.paces else float("nan")

    def off_pace(self, paces: dict[str, float | None]) -> list[str]:
        if self.margin is None:
            return []
        return drift.off_pace(paces, self.paces, self.margin)


def paced_round(order: list[str], measure_run, gauge: Gauge, discard, log=print,
                restore=None) -> tuple[dict, list[dict]]:
    """Measures each config of a round (`measure_run(config)` -> run), then measures again
    every run the gauge finds off pace, up to its retries (`discard(config, attempt)`
    sets an attempt's raw file aside). A run still off pace after its retries is not
    simply the last one: the attempt nearest the pace of the runs measured so far is
    counted (`restore(config, attempt)` brings its raw file back, after the last one was
    set aside as attempt `retries + 1`), since the machine that slowed one attempt may
    slow the next further (set 11, round 10 at 70%: a hooked run at 1.12x the runs'
    pace, measured again at 1.21x, and that one was counted). Returns ({config: the run
    counted}, the runs set aside, each with the pace it was judged by)."""
    runs = {config: measure_run(config) for config in order}
    reruns: list[dict] = []
    tried: dict[str, list[tuple[int, dict]]] = {}

    def set_aside(config: str, attempt: int) -> None:
        old = runs[config]
        discard(config, attempt)
        tried.setdefault(config, []).append((attempt, old))
        reruns.append({**{k: old[k] for k in ("workload", "load", "round", "config", "window")},
                       "drift": old["drift"], "attempt": attempt, "reference": gauge.reference()})

    for attempt in range(1, gauge.retries + 1):
        again = gauge.off_pace({c: run["drift"]["pace"] for c, run in runs.items()})
        if not again:
            break
        for config in again:
            old = runs[config]
            set_aside(config, attempt)
            log(f"{old['workload']} load {old['load']:g} round {old['round']} {config}: engine pace "
                f"{old['drift']['pace']:.2f} against {gauge.reference():.2f}: measuring it again")
            runs[config] = measure_run(config)
    if restore is None:
        return runs, reruns
    reference = gauge.reference()

    def off_by(run: dict) -> float:
        pace = run["drift"]["pace"]
        return abs(pace / reference - 1) if pace is not None else float("inf")

    for config, earlier in tried.items():
        attempt, nearest = min(earlier, key=lambda x: off_by(x[1]))
        if off_by(nearest) < off_by(runs[config]):
            last = runs[config]
            set_aside(config, gauge.retries + 1)
            restore(config, attempt)
            reruns[:] = [x for x in reruns if (x["config"], x["attempt"]) != (config, attempt)]
            runs[config] = nearest
            log(f"{last['workload']} load {last['load']:g} round {last['round']} {config}: every attempt off "
                f"pace; counting attempt {attempt} (pace {nearest['drift']['pace']:.2f} against "
                f"{reference:.2f}), not the last ({last['drift']['pace']:.2f})")
    return runs, reruns


def run_once(s: Setup, r: Rig, w: Workload, load: float, rnd: int, config: str, cap: float, out_file: Path,
             gauge: Gauge, log=print, basis: str | None = None) -> dict:
    """One configuration's run of one round: the load test and what the engine, the
    hook and the machine recorded meanwhile. `basis`: the invocation that measured the
    capacity `cap` (None: it was given), which `speed` reads the run's load by."""
    url, engine = r.activate(config)
    waited = drift.calm(s.calm_s) if s.calm_s > 0 else 0.0
    before = rig.scrape(engine.url + "/metrics")
    hooked = policy_of(config) is not None
    hook_before = rig.scrape(f"http://127.0.0.1:{r.hook_port}/metrics") if hooked else {}
    cpu0 = machine.sample()
    t0 = time.perf_counter()
    out = loadtest(s, url, w, f"{cap * load:.6f}", rnd, out_file)
    t1 = time.perf_counter()
    cpu = machine.between(cpu0, machine.sample())
    after = rig.scrape(engine.url + "/metrics")
    hook_after = rig.scrape(f"http://127.0.0.1:{r.hook_port}/metrics") if hooked else {}
    steps = [x for x in curve.read_steps(engine_trace(s, config)) if t0 <= x["t"] <= t1]
    run = {"workload": w.name, "load": load, "round": rnd, "config": config,
           "policy": policy_of(config),
           # The engine's step trace the window reads lies in this work directory: windows
           # are monotonic-clock times, which restart with each boot, so another
           # invocation's trace may hold steps at the same times.
           "work": s.work.name,
           "rate": cap * load, "capacity": cap, "capacity_work": basis,
           "window": [t0, t1], "summary": out["runs"][0]["summary"],
           "engine": step_window(steps),
           "drift": {**gauge.read(steps), "calm_wait_s": waited},
           "vllm_preemptions": delta(before, after, "vllm:num_preemptions_total"),
           "cpu": cpu,
           "hook": {k: v - hook_before.get(k, 0.0) for k, v in hook_after.items()
                    if k.startswith(("meridian_hook_preemptions_total",
                                     "meridian_hook_express_steps_total",
                                     "meridian_hook_prefill_capped_steps_total",
                                     "meridian_hook_paced_answers_total",
                                     "meridian_hook_schedule_steps_total"))}}
    summ = run["summary"]
    pace = run["drift"]["pace"]
    log(f"{w.name} load {load:g} round {rnd} {config}: ttot p99 "
        f"{(summ['think_to_output'] or {}).get('p99_ms')} gap p99 "
        f"{(summ['answer_gap'] or {}).get('p99_ms')} tok/s {summ['total_token_throughput']:.0f} "
        f"pace {'-' if pace is None else f'{pace:.2f}'}")
    return run


def engine_trace(s: Setup, config: str) -> Path:
    return engine_trace_in(s.work, config)


def engine_name(config: str) -> str:
    """The engine a config runs on, which names its log and step trace: `stock` for
    stock and proxy, the config's own name for a hooked one."""
    return "stock" if policy_of(config) is None else config


def engine_trace_in(work: Path, config: str) -> Path:
    return work / f"{engine_name(config)}-steps.jsonl"


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    keys = [k for k in after if k == name or k.startswith(name + "{")]
    if not keys:
        return None
    return sum(after[k] - before.get(k, 0.0) for k in keys)


def observed_lengths(raw_dir: Path, workload: str) -> dict[str, list[float]]:
    """Token lengths the engine really saw and produced (its `usage`), over every run of
    a workload: [min, median, max] of prompt, thinking and answer tokens per request."""
    cols: dict[str, list[float]] = {"prompt": [], "think": [], "answer": []}
    for f in sorted(raw_dir.glob(f"{workload}-*.json")) + sorted(raw_dir.glob(f"capacity-{workload}.json")):
        for run in json.loads(f.read_text())["runs"]:
            for r in run["requests"]:
                if not r["ok"] or r.get("usage_think_tokens") is None:
                    continue
                cols["prompt"].append(r["prompt_tokens"])
                cols["think"].append(r["usage_think_tokens"])
                cols["answer"].append(r["usage_output_tokens"])
    return {k: [min(v), statistics.median(v), max(v)] for k, v in cols.items() if v}


def twin_workload(lengths: dict[str, list[float]]) -> str:
    """The twin's workload file for these observed lengths (uniform between the extremes).
    vLLM's usage counts the end-of-thought delimiter with the answer (completion tokens
    less the reasoning ones); the twin adds the delimiter itself after any thought, so
    the answer it is given is one shorter."""
    lines = ["# Written by scripts/realab from the lengths a real vLLM reported (usage) in the A/B."]
    delimiter = 1 if lengths["think"][0] > 0 else 0
    for key in ("prompt", "think", "answer"):
        lo, _, hi = lengths[key]
        if key == "answer":
            lo, hi = max(lo - delimiter, 1), max(hi - delimiter, 1)
        lines.append(f'{key} = {{ kind = "uniform", min = {int(lo)}, max = {int(hi)} }}')
    return "\n".join(lines) + "\n"


def attribute_stalls(raw: dict, steps: list[dict], t0: float, threshold_s: float = 0.25) -> dict[str, int]:
    """Every answer stall of a run's load-test output (`raw`) by its cause, against its
    engine's `steps` (`stalls.attribute`)."""
    return stalls.attribute(raw["runs"][0]["requests"], stalls.completions(steps), t0, threshold_s)


def attribute_runs(data: dict, works: list[Path]) -> None:
    """Sets each run's `stalls` where its raw load-test file and its engine's step trace
    are still at hand (each trace read once)."""
    traces: dict[Path, list[dict]] = {}
    for run in data["runs"]:
        for wd in works:
            raw = wd / "runs" / f"{run['workload']}-{run['load']:g}-{run['round']}-{run['config']}.json"
            if not raw.exists():
                continue
            trace = engine_trace_in(wd, run["config"])
            if trace not in traces:
                traces[trace] = curve.read_steps(trace)
            t0, t1 = run["window"]
            steps = [x for x in traces[trace] if t0 - 5 <= x["t"] <= t1]
            run["stalls"] = attribute_stalls(json.loads(raw.read_text()), steps, t0)
