"""Answers handed over at the end of the thought, on two real vLLM engines (CPU build):
issue 29, item 5, where the machine allows it.

    python -m realab migration measure ROOT MODEL_DIR RESULTS_JSON
    python -m realab migration report RESULTS_JSON RAW_DIR OUT_MD [SIM PROFILE_TOML PROFILE]

`measure` starts two pairs of engines on the GPU-shaped rig's limits (a 256-token step
budget, one OMP thread each, vLLM's engine core polling), the first engine of each pair
bound to core 0 and the second to core 1, prefix caching on (a hand-over's export reads
the thought from the think engine's cache):

- `shared`: the plain pair behind one proxy, both engines `both` (phase-aware routing);
- `reprefill`: the plain pair as a think engine and an answer engine; at the end of each
  thought the answer moves to the answer engine, which computes prompt and thought again;
- `connector`: a second pair, each engine with vLLM's ExampleConnector on one shared
  directory (the one connector this CPU build runs), the answer's KV carried across;
  measured idle only: under load ExampleConnector kills its engine
  (`CONNECTOR_UNDER_LOAD`).

First the probe (`probe`): a few requests one at a time through each of the three, so
each request's stall at its hand-over (its largest answer gap less its own through the
shared pool) says what a hand-over costs by re-prefill and through the connector; the
connector's, fitted over the requests' lengths, is the cost the twin is given. Then the
shared pool's capacity (everything sent at once), and at each load (a fraction of that
capacity) and round `shared` and `reprefill` in rotating order, the same seed in a
round, both engines' prefix caches emptied before each run. Each run records the
engines' prompt tokens by where they came from and the proxy's hand-over counts.
`report` pairs the split against `shared` on the same requests (`stats.paired_ratio`:
each round's ratio, their geometric mean, a 90% interval) and, given the twin and a
profile fitted on the run's own steps, sets `meridian-sim migration`'s forecast for the
same split, by re-prefill and with the connector at its measured cost, beside it.

Knobs (environment): REALAB_ROUNDS (default 2), REALAB_LOADS (default 0.5,0.8),
REALAB_PROMPTS (requests a run, default 100), REALAB_CALM_S (default 60)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import drift, rig, stats as S
from . import measure as m
from .effects import effects, plain_effects
from .sets import read
from .workloads import WORKLOADS

CONFIGS = ("shared", "reprefill")
#: Which engine pair serves each proxy (`connector` is the probe's, never loaded).
PAIR = {"shared": "plain", "reprefill": "plain", "connector": "kv"}
#: Why no loaded run hands over through the connector: what vLLM 0.32's ExampleConnector
#: did in the first try (the answer engine died in the warm-up's 16 requests).
CONNECTOR_UNDER_LOAD = (
    "in the first try, with vLLM 0.32's ExampleConnector on both engines and 16 hand-overs "
    "at once (the warm-up), the answer engine died loading from a folder that held no file "
    "(FileNotFoundError in its worker, then EngineDeadError for every request). Its look-up "
    "and its load name a prompt's folder by different lengths (the tokens less one, cut to "
    "whole blocks; all of them, cut to whole blocks), and it stores a new prompt at its "
    "first step, so under chunked prefill (256-token steps) it writes blocks not yet "
    "computed. It is vLLM's example, not a production connector: the loaded hand-over runs "
    "by re-prefill, and the connector's cost is measured idle")
#: The workload: the real-engine pages' long prompts (about 2,600 tokens as the engine
#: counts them, thoughts of about 85, answers of about 65), where the answer's re-prefill
#: is the whole prompt again and a shared engine's answers wait behind other requests'
#: prompt chunks.
WORKLOAD = WORKLOADS["long"]
#: The probe's requests, one at a time, and their seed (no loaded round uses it).
PROBE_REQUESTS = 16
PROBE_SEED = 777


def kv_config(store: Path) -> str:
    return json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": {"shared_storage_path": str(store)}})


def pair_specs(base: rig.EngineSpec, store: Path | None) -> list[rig.EngineSpec]:
    """The two engines of a pair: the rig's engine with the prefix cache on and vLLM's
    stats on (the prompt tokens by source are read around each run), one bound to each
    core; with `store`, each with the connector on it."""
    extra = [a for a in base.extra if a != "--no-enable-prefix-caching"]
    extra += ["--enable-prefix-caching", *(["--kv-transfer-config", kv_config(store)] if store else [])]
    return [dataclasses.replace(base, omp_bind=core, log_stats=True, extra=extra) for core in ("0", "1")]


def endpoints(config: str, a: str, b: str) -> str:
    if config == "shared":
        return f'[{{url = "{a}", name = "a"}}, {{url = "{b}", name = "b"}}]'
    return f'[{{url = "{a}", name = "think", role = "think"}}, {{url = "{b}", name = "answer", role = "answer"}}]'


class Pairs:
    """The two engine pairs and the three proxies; the pair a run does not use is paused
    (SIGSTOP), so it takes no CPU."""

    def __init__(self, s: m.Setup, store: Path) -> None:
        self.s = s
        self.store = store
        self.procs: list[rig.Proc] = []
        self.engines: dict[str, list[rig.Proc]] = {}
        try:
            self._start()
        except BaseException:
            self.stop()  # nothing left running on both cores after a failed start
            raise

    def _start(self) -> None:
        s, store = self.s, self.store
        for pair, kv in (("plain", None), ("kv", store)):
            procs = [rig.start_engine(spec, f"{pair}-{'ab'[i]}", s.work, "meridian_hook.steptrace.StepTraceScheduler")
                     for i, spec in enumerate(pair_specs(s.spec, kv))]
            self.procs += procs
            self.engines[pair] = procs
        for p in self.procs:
            rig.wait_http(p, "/health", 900)
        binary = s.root / "target" / "release" / "meridian"
        common = [f"models.dir={s.models_dir}", "upstream.health_interval_s=0.5"]
        self.proxies: dict[str, rig.Proc] = {}
        for config in PAIR:
            a, b = (e.url for e in self.engines[PAIR[config]])
            sets = [f"upstream.endpoints={endpoints(config, a, b)}", *common]
            if config != "shared":
                sets.append(f'upstream.handover="{config}"')
            self.proxies[config] = rig.start_proxy(binary, f"proxy-{config}", s.work, sets)
            self.procs.append(self.proxies[config])
        for p in self.proxies.values():
            rig.wait_http(p, "/ready", 60)

    def activate(self, config: str) -> tuple[rig.Proc, list[rig.Proc]]:
        """Resumes the pair (and proxies) `config` runs on and pauses the other; waits
        until its proxy has both engines in rotation again."""
        pair = PAIR[config]
        for name, procs in self.engines.items():
            for p in procs:
                (p.resume if name == pair else p.pause)()
        for c, p in self.proxies.items():
            if p.popen.poll() is None:
                (p.resume if PAIR[c] == pair else p.pause)()
        proxy = self.proxies[config]
        rig.wait_http(proxy, "/metrics", 60, lambda r: healthy(r.text) >= 2)
        return proxy, self.engines[pair]

    def retire(self, pair: str) -> None:
        """Stops a pair and the proxies in front of it (the probe's, once it is done)."""
        for p in [*self.engines[pair], *(p for c, p in self.proxies.items() if PAIR[c] == pair)]:
            p.stop()

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


def healthy(metrics_text: str) -> int:
    return sum(1 for line in metrics_text.splitlines()
               if line.startswith("meridian_upstream_healthy{") and line.endswith(" 1"))


def reset(engines: list[rig.Proc], store: Path | None) -> None:
    """Empty prefix caches (so no run starts with what an earlier run computed) and, for
    the connector, an empty store (ExampleConnector never deletes what it saved)."""
    from .prefix import reset_prefix_cache

    for e in engines:
        reset_prefix_cache(e)
    if store is not None:
        shutil.rmtree(store, ignore_errors=True)
        store.mkdir(parents=True)


def probe(s: m.Setup, pairs: Pairs, raw: Path, log=print) -> dict:
    """A hand-over's cost on idle engines, through the proxies: the same requests one at a
    time through the shared pool (no hand-over), the split by re-prefill, and the split
    through the connector (`PROBE_REQUESTS`, the workload's shape, its lengths spread as
    the loaded runs' are). Each request's think-to-answer gap less its own under the
    shared pool is what its hand-over added; the connector's, fitted over the requests'
    lengths (prompt and thought), is the cost the twin is given. Records the answer
    engines' prompt tokens by source (what the connector carried)."""
    w = dataclasses.replace(s.workloads[0], prompts=PROBE_REQUESTS)
    out: dict = {}
    for config in ("shared", "reprefill", "connector"):
        proxy, engines = pairs.activate(config)
        reset(engines, pairs.store if config == "connector" else None)
        before = rig.scrape(engines[1].url + "/metrics")
        try:
            m.loadtest(s, proxy.url, w, "inf", PROBE_SEED, raw / f"probe-{config}.json", concurrency=1)
        except subprocess.CalledProcessError as e:
            out[config] = {"failed": str(e)}
            log(f"probe {config}: failed ({e})")
            continue
        after = rig.scrape(engines[1].url + "/metrics")
        out[config] = {"answer_engine_tokens": by_source(before, after)}
        log(f"probe {config}: engine b or answer {out[config]['answer_engine_tokens']}")
    return out


SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


def by_source(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The prompt tokens an engine took between two scrapes, by where they came from:
    computed, its own prefix cache, or the KV connector (vLLM's
    `prompt_tokens_by_source_total`, whatever its other labels)."""
    name = "vllm:prompt_tokens_by_source_total{"
    out = {}
    for source in SOURCES:
        keys = [k for k in after if k.startswith(name) and f'source="{source}"' in k]
        out[source] = sum(after[k] - before.get(k, 0.0) for k in keys)
    return out


def run_file(load: float, rnd: int, config: str) -> str:
    """A run's raw load-test file (`stats.read_runs` parses these names)."""
    return f"{WORKLOAD.name}-{load:g}-{rnd}-{config}.json"


def counted(proxy: rig.Proc, name: str) -> dict[str, float]:
    """A proxy counter's values by outcome."""
    out = {}
    for series, value in rig.scrape(proxy.url + "/metrics").items():
        if series.startswith(name + "{") and 'outcome="' in series:
            out[series.split('outcome="')[1].split('"')[0]] = value
    return out


def measure(s: m.Setup, loads: list[float], rounds: int, calm_s: float, results: Path, log=print) -> dict:
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # /reset_prefix_cache; the children inherit it
    store = s.work / "kv-store"
    store.mkdir(parents=True, exist_ok=True)
    w = s.workloads[0]
    data: dict = {"setup": {"workload": dataclasses.asdict(w), "loads": loads, "rounds": rounds,
                            "configs": list(CONFIGS),
                            "engines": {pair: {k: str(v) for k, v in dataclasses.asdict(spec).items() if k != "python"}
                                        for pair, spec in (("plain", pair_specs(s.spec, None)[0]),
                                                           ("kv", pair_specs(s.spec, store)[0]))}},
                  "runs": [], "work": str(s.work)}
    raw = s.work / "runs"
    raw.mkdir(parents=True, exist_ok=True)
    started = time.time()
    pairs = Pairs(s, store)
    try:
        for config in CONFIGS:
            proxy, engines = pairs.activate(config)
            m.warm_up(s, proxy.url, w, raw / f"warm-{config}.json")
        data["probe"] = probe(s, pairs, raw, log)
        data["connector_under_load"] = CONNECTOR_UNDER_LOAD
        results.write_text(json.dumps(data, indent=1))
        pairs.retire("kv")
        proxy, engines = pairs.activate("shared")
        reset(engines, None)
        cap = m.loadtest(s, proxy.url, w, "inf", 1000, raw / "capacity-shared.json")["runs"][0]["summary"]
        data["capacity"] = cap["request_throughput"]
        log(f"shared pool capacity {data['capacity']:.3f} req/s ({time.time() - started:.0f} s)")
        for load in loads:
            for rnd in range(rounds):
                order = list(CONFIGS[rnd % len(CONFIGS):] + CONFIGS[:rnd % len(CONFIGS)])
                for config in order:
                    proxy, engines = pairs.activate(config)
                    reset(engines, None)
                    waited = drift.calm(calm_s) if calm_s > 0 else 0.0
                    before = [rig.scrape(e.url + "/metrics") for e in engines]
                    moved0 = counted(proxy, "meridian_handovers_total")
                    exports0 = counted(proxy, "meridian_handover_kv_exports_total")
                    t0 = time.perf_counter()
                    out = m.loadtest(s, proxy.url, w, f"{load * data['capacity']:.6f}", rnd,
                                     raw / run_file(load, rnd, config))
                    t1 = time.perf_counter()
                    after = [rig.scrape(e.url + "/metrics") for e in engines]
                    moved1 = counted(proxy, "meridian_handovers_total")
                    exports1 = counted(proxy, "meridian_handover_kv_exports_total")
                    run = {"load": load, "round": rnd, "config": config, "window": [t0, t1], "calm_wait_s": waited,
                           "summary": out["runs"][0]["summary"],
                           "engines": [by_source(b, a) for b, a in zip(before, after)],
                           "handovers": {k: v - moved0.get(k, 0.0) for k, v in moved1.items()},
                           "kv_exports": {k: v - exports0.get(k, 0.0) for k, v in exports1.items()}}
                    data["runs"].append(run)
                    summ = run["summary"]
                    log(f"load {load:g} round {rnd} {config}: {summ.get('completed')} done, "
                        f"TTOT p99 {(summ.get('think_to_output') or {}).get('p99_ms')} ms, "
                        f"hand-overs {run['handovers']}, exports {run['kv_exports']}, engines {run['engines']} "
                        f"({time.time() - started:.0f} s)")
                    results.write_text(json.dumps(data, indent=1))
    finally:
        pairs.stop()
    data["elapsed_s"] = time.time() - started
    results.write_text(json.dumps(data, indent=1))
    return data


# --- The report ----------------------------------------------------------------------------

#: KV bytes a token of the benchmark model (float32: 6 layers x 2 KV heads x 64 x 2 x 4).
KV_BYTES_PER_TOKEN = 6 * 2 * 64 * 2 * 4


@dataclass(frozen=True)
class ConnectorCost:
    """What a hand-over through the connector added to a request's largest answer gap on
    idle engines, as the twin models a transfer: a fixed part and a part per token of
    prompt and thought (a least-squares line through the probe's requests)."""

    fixed_s: float
    per_token_s: float
    requests: int

    @property
    def gb_s(self) -> float:
        """The bandwidth the per-token part stands for, for the twin's `--connector-gb-s`
        (no per-token part: 1,000 GB/s, a transfer that costs only its fixed part)."""
        return KV_BYTES_PER_TOKEN / self.per_token_s / 1e9 if self.per_token_s > 0 else 1000.0


def added_by_handover(raw: Path, config: str) -> list[tuple[int, float]]:
    """(prompt and thought tokens, seconds its hand-over added) for each probe request
    `config` and the shared pool both answered: its largest answer gap less the shared
    pool's on the same request. The proxy hands an answer over at the first event after
    the thought ends, so the first answer token comes from the think engine and the
    hand-over is the stall before the second: its think-to-answer gap does not move."""
    def by_index(name: str) -> dict[int, dict]:
        return {r["index"]: r for r in probe_requests(raw, name)
                if r.get("ok") and r.get("max_output_gap") is not None}

    shared, split = by_index("shared"), by_index(config)
    return [(split[i]["prompt_tokens"] + (split[i].get("usage_think_tokens") or 0),
             split[i]["max_output_gap"] - shared[i]["max_output_gap"]) for i in sorted(split.keys() & shared.keys())]


def probe_requests(raw: Path, config: str) -> list[dict]:
    """A probe run's requests, as measured (`.json`) or as kept (`.json.gz`); none if it
    did not run."""
    for f in (raw / f"probe-{config}.json", raw / f"probe-{config}.json.gz"):
        if f.exists():
            return S.read_requests(f)
    return []


#: The probe's first requests on each pair are left out of the fit: the connector pair
#: starts its probe cold (its warm-up would hand 16 answers over at once, which kills it).
PROBE_WARMUP = PROBE_REQUESTS // 4


def connector_cost(raw: Path) -> ConnectorCost | None:
    """A least-squares line through what the connector's hand-overs added (its first
    `PROBE_WARMUP` requests left out); a line that does not rise with length is a
    constant (the mean), as a transfer cannot get cheaper with more KV."""
    points = [pt for i, pt in enumerate(added_by_handover(raw, "connector")) if i >= PROBE_WARMUP]
    if len(points) < 3:
        return None
    xs, ys = [x for x, _ in points], [y for _, y in points]
    slope, intercept = statistics.linear_regression(xs, ys)
    if slope <= 0 or intercept < 0:
        if slope <= 0:
            return ConnectorCost(fixed_s=max(0.0, statistics.fmean(ys)), per_token_s=0.0, requests=len(points))
        slope = statistics.fmean(y / x for x, y in zip(xs, ys))  # through the origin
        intercept = 0.0
    return ConnectorCost(fixed_s=intercept, per_token_s=slope, requests=len(points))


def probe_lines(raw: Path, probe_: dict) -> list[str]:
    """What each way of handing over added on idle engines, and what the answer engine
    computed and was carried."""
    lines = ["| configuration | requests | think-to-answer gap, median | largest answer gap, median | added by "
             "the hand-over: median [range] | answer engine's prompt tokens: computed / its cache / carried |",
             "|---|---:|---:|---:|---:|---|"]
    for config in ("shared", "reprefill", "connector"):
        info = probe_.get(config) or {}
        if "failed" in info:
            lines.append(f"| {config} | failed: {info['failed']} | | | | |")
            continue
        answered = [r for r in probe_requests(raw, config) if r.get("ok") and r.get("max_output_gap") is not None]
        if not answered:
            continue
        ttot = statistics.median(r.get("think_to_output") or 0.0 for r in answered)
        gap = statistics.median(r["max_output_gap"] for r in answered)
        added = [y for _, y in added_by_handover(raw, config)] if config != "shared" else []
        t = info.get("answer_engine_tokens", {})
        lines.append(f"| {config} | {len(answered)} | {1000 * ttot:.0f} ms | {1000 * gap:.0f} ms | "
                     + (f"{1000 * statistics.median(added):.0f} ms [{1000 * min(added):.0f} to "
                        f"{1000 * max(added):.0f}]" if added else "-")
                     + f" | {t.get('local_compute', 0):.0f} / {t.get('local_cache_hit', 0):.0f} / "
                     f"{t.get('external_kv_transfer', 0):.0f} |")
    return lines


def ab_lines(data: dict, raw: Path, load: float, resamples: int = 2000) -> list[str]:
    """Each split over `shared` on the same requests, every user-felt metric, with the
    hand-overs and where the answer engines' prompt tokens came from."""
    runs, _ = read(raw, WORKLOAD.name, load)  # the first tenth of each run left out
    if "shared" not in runs:
        return []
    splits = [c for c in CONFIGS if c != "shared" and c in runs]
    lines = ["| configuration | metric | p50 | tail | requests |", "|---|---|---:|---:|---:|"]
    tables: dict[str, dict[str, tuple]] = {}
    for config in splits:
        tables[config], _ = effects(runs, config, resamples, base="shared")
        for name, (p50, high, tail, n) in tables[config].items():
            lines.append(f"| {config} | {name} | {p50.text() if p50 else '-'} | "
                         + (f"p{round(100 * tail)} {high.text()}" if high else "-") + f" | {n} |")
        ratios = throughput_ratios(data, load, config)
        lines.append(f"| {config} | token throughput (per round; higher is better) | "
                     + " ".join(f"{r:.3f}" for r in ratios) + " | | |")
    lines += ["", "| configuration | hand-overs (moved / no room) | KV exports (ok / failed) | "
              "prompt tokens, engine a or think: computed / its cache / carried | engine b or answer: the same |",
              "|---|---:|---:|---|---|"]
    for config in CONFIGS:
        mine = [r for r in data["runs"] if r["load"] == load and r["config"] == config]
        if not mine:
            continue
        moved = sum(r["handovers"].get("moved", 0) for r in mine)
        no_room = sum(r["handovers"].get("no_room", 0) for r in mine)
        ok = sum(r["kv_exports"].get("ok", 0) for r in mine)
        failed = sum(r["kv_exports"].get("failed", 0) for r in mine)
        engines = ["{:.0f} / {:.0f} / {:.0f}".format(*(sum(r["engines"][i][src] for r in mine) for src in
                                                        ("local_compute", "local_cache_hit", "external_kv_transfer")))
                   for i in (0, 1)]
        lines.append(f"| {config} | {moved:.0f} / {no_room:.0f} | {ok:.0f} / {failed:.0f} | "
                     f"{engines[0]} | {engines[1]} |")
    lines.append("")
    for config, table in tables.items():
        costs, gains = plain_effects(table)
        lines.append(f"- **{config} against shared**: costs resolved: {'; '.join(costs) or 'none'}; "
                     f"gains resolved: {'; '.join(gains) or 'none'}.")
    return lines + [""]


def throughput_ratios(data: dict, load: float, config: str) -> list[float]:
    by = {(r["round"], r["config"]): r["summary"]["total_token_throughput"] for r in data["runs"] if r["load"] == load}
    return [by[(rnd, config)] / by[(rnd, "shared")] for (rnd, c) in sorted(by)
            if c == config and (rnd, "shared") in by and by[(rnd, "shared")] > 0]


def reported_lengths(raw: Path, loads: list[float]) -> dict[str, list[float]]:
    """{prompt, think, answer: [min, median, max]} of the tokens the engines reported
    (usage) in the shared pool's runs."""
    cols: dict[str, list[float]] = {"prompt": [], "think": [], "answer": []}
    for load in loads:
        for requests_ in S.read_runs(raw, WORKLOAD.name, load).get("shared", {}).values():
            for r in requests_:
                if r.get("ok") and r.get("usage_think_tokens") is not None:
                    cols["prompt"].append(r["prompt_tokens"])
                    cols["think"].append(r["usage_think_tokens"])
                    cols["answer"].append(r["usage_output_tokens"])
    return {k: [min(v), statistics.median(v), max(v)] for k, v in cols.items() if v}


def lengths_text(raw: Path, loads: list[float]) -> str:
    found = reported_lengths(raw, loads)
    if len(found) < 3:
        return "no lengths reported"
    return ", ".join(f"{name} {found[key][1]:,.0f} tokens at the median ({found[key][0]:,.0f}-{found[key][2]:,.0f})"
                     for key, name in (("prompt", "prompts"), ("think", "thoughts"), ("answer", "answers")))


def twin_workload(raw: Path, loads: list[float]) -> str:
    """The twin's workload file: the lengths the engines reported (usage) in the shared
    pool's runs, uniform between the extremes (`measure.twin_workload`)."""
    return m.twin_workload(reported_lengths(raw, loads))


def twin_lines(data: dict, raw: Path, sim: Path, profile_toml: Path, profile: str, out_dir: Path) -> list[str]:
    """`meridian-sim migration` on the rig's fitted profile: the same two engines as one
    pool and as one think and one answer engine, at the measured loads, on the lengths
    the engines reported, the connector at its measured cost (re-prefill alone where
    the probe measured none). Its workload file is kept beside the results."""
    cost = connector_cost(raw)
    wl = out_dir / "twin-workload.toml"
    wl.write_text(twin_workload(raw, data["setup"]["loads"]))
    table = out_dir / "twin.txt"
    args = ["migration", "--profile-file", str(profile_toml), "--profile", profile, "--engines", "2", "--think", "1",
            "--loads", ",".join(f"{x:g}" for x in data["setup"]["loads"]),
            "--num-prompts", str(data["setup"]["workload"]["prompts"] * 10), "--seeds", "5",
            "--workload", str(wl), "--report", str(table)]
    if cost is None:
        args += ["--moves", "reprefill"]
    else:
        args += ["--moves", "reprefill,connector", "--connector-gb-s", f"{cost.gb_s:.6g}",
                 "--kv-bytes-per-token", str(KV_BYTES_PER_TOKEN), "--connector-fixed-ms", f"{1000 * cost.fixed_s:.3f}"]
    subprocess.run([str(sim), *args], check=True, stdout=subprocess.DEVNULL)
    root = Path(__file__).resolve().parents[2]

    def shown(a: str) -> str:
        return str(Path(a).relative_to(root)) if a.startswith(str(root)) else a
    report_at = args.index("--report")
    shown_args = [shown(a) for a in args[:report_at] + args[report_at + 2:]]
    return ["**The twin's forecast for the same split** (`meridian-sim " + " ".join(shown_args) + "`: the rig's "
            "profile fitted on this run's steps (`plain-a-steps.jsonl.gz`), the lengths the engines reported, "
            "the connector at the cost the probe measured; "
            "deterministic, five seeds of ten times a run's requests):", "", table.read_text(), ""]


def report(results: Path, raw: Path, out_md: Path, sim: Path | None = None, profile_toml: Path | None = None,
           profile: str | None = None) -> str:
    data = json.loads(results.read_text())
    setup = data["setup"]
    w = setup["workload"]
    eng = setup["engines"]["plain"]
    cost = connector_cost(raw)
    lines = [f"Two vLLM CPU engines (benchmark model, {eng['max_num_batched_tokens']}-token step budget, "
             f"max_num_seqs {eng['max_num_seqs']}, one OMP thread each, one bound to each core, prefix caching on; "
             "the API servers, the proxy and the load tester share both cores). "
             f"Workload `{w['name']}` of the real-engine pages ({lengths_text(raw, setup['loads'])}), "
             f"{w['prompts']} requests a run (the first 10% left out). The shared pool's capacity: "
             + (f"{data['capacity']:.3f} req/s" if "capacity" in data else "not measured (the run stopped before)")
             + f" (everything sent at once); {setup['rounds']} rounds a load, the configurations in rotating order, "
             "one seed a round.", "",
             f"**What a hand-over costs on idle engines** ({PROBE_REQUESTS} requests of the workload's shape, one at "
             "a time, through each proxy; the connector pair is a second pair of the same engines with vLLM's "
             "ExampleConnector on one local directory; the added time is each request's largest answer gap less "
             "its own through the shared pool: the proxy hands over after the first answer token, so the hand-over is "
             "the stall before the second, not the think-to-answer gap):", "", *probe_lines(raw, data["probe"]), ""]
    if cost is not None:
        lines += [f"Fitted over those {cost.requests} requests' prompt and thought tokens, a hand-over through this "
                  f"connector adds {1000 * cost.fixed_s:.0f} ms plus {1e6 * cost.per_token_s:.1f} µs a token, which "
                  f"is what the twin is given below ({cost.gb_s:.3g} GB/s at {KV_BYTES_PER_TOKEN:,} KV bytes a "
                  "token).", ""]
    lines += [f"No loaded run carries the KV: {CONNECTOR_UNDER_LOAD}.", ""]
    for load in setup["loads"]:
        lines += [f"**Load {100 * load:.0f}% of the shared pool's capacity**: each split over `shared` on the same "
                  "requests (each round's ratio, their geometric mean over the rounds, 90% interval over requests "
                  "and rounds widened for the rounds' count; below 1 is better):", "", *ab_lines(data, raw, load)]
    if sim is not None and profile_toml is not None and profile is not None:
        lines += twin_lines(data, raw, sim, profile_toml, profile, out_md.parent)
    text = "\n".join(lines)
    out_md.write_text(text)
    return text


def main(argv: list[str], setup) -> None:
    if argv[:1] == ["measure"] and len(argv) == 4:
        try:
            loads = [float(x) for x in os.environ.get("REALAB_LOADS", "0.5,0.8").split(",") if x.strip()]
            rounds = int(os.environ.get("REALAB_ROUNDS", "2"))
            prompts = int(os.environ.get("REALAB_PROMPTS", "100"))
            calm = float(os.environ.get("REALAB_CALM_S", "60"))
        except ValueError as e:
            raise SystemExit(f"REALAB_LOADS / REALAB_ROUNDS / REALAB_PROMPTS / REALAB_CALM_S: {e}") from e
        s = setup(Path(argv[1]), Path(argv[2]), prompts)
        measure(s, loads, rounds, calm, Path(argv[3]), log=lambda msg: print(msg, flush=True))
    elif argv[:1] == ["report"] and len(argv) in (4, 7):
        sim = (Path(argv[4]), Path(argv[5]), argv[6]) if len(argv) == 7 else (None, None, None)
        print(report(Path(argv[1]), Path(argv[2]), Path(argv[3]), *sim))
    else:
        sys.exit(__doc__)
