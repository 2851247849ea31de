"""The dispatch A/B on a real vLLM engine (CPU build): run by scripts/bench-dispatch-real.sh.

    python -m realab measure ROOT MODEL_DIR RESULTS_JSON [--quick]
    python -m realab twin-inputs RESULTS_JSON OUT_DIR
    python -m realab report ROOT RESULTS_JSON TWIN_JSON CALIBRATION_JSON OUT_MD
    python -m realab stepcost measure|report ...   (the hook's cost to real steps: stepcost.py)
    python -m realab profile measure|report ...    (where a hooked engine's time goes: profile.py)
    python -m realab policies keep|add|report ...  (every policy, paired: policies.py)
    python -m realab forecast SET_DIR SIM          (the twin beside a kept set, and its GPU forecasts)
    python -m realab candidates SET_DIR SIM POLICIES LOADS OUT_MD  (candidate policies on the twin first)
    python -m realab prefix measure|report ...     (the prefix cache under conversations: prefix.py)
    python -m realab startcost SET_DIR CONFIG WORKLOAD LOAD OUT_MD [ROUNDS]  (where later starts come from)
    python -m realab migration measure|report ...  (answers handed over between two engines: migration.py)

`measure` starts the engines and proxies, measures, and writes RESULTS_JSON (every run's
summary, the step traces' preemptions, the capacity, the setup); the step traces stay in
the work directory it prints. `report` writes the page from the measured and the
twin's predicted figures. Knobs (environment): REALAB_ROUNDS, REALAB_LOADS,
REALAB_WORKLOADS (names, comma-separated), REALAB_PROMPTS (requests per run, for every
workload of the run), REALAB_APPEND=1 (add to an existing
RESULTS_JSON: say, a second workload at other loads), REALAB_HOOK_POLICY (the policy of
the config named `hook`; the setup in RESULTS_JSON records it), REALAB_CONFIGS (which
configs run, stock first: stock, stock-again (the same stock engine measured again: an A/A run, the noise floor), proxy, hook, hook-<policy>; default stock,proxy,hook),
REALAB_UNLOADED=1 (each round's requests also one at a time on the stock engine: the
whole-request SLO's reference), REALAB_PROXY (`shipped`: the proxies as meridian.toml
ships them; `admission`, the default: with admission and priorities on), REALAB_CAPACITY (the stock
engine's capacity in req/s, measured earlier on the same rig: skips measuring it; on another
machine the runs then stand at another load, which the page reads from the curve probe,
`speed.py`: by default each invocation measures the capacity of the machine it runs on), REALAB_CAPACITY_FROM
(a kept set's folder: its capacity, and the page reads this machine's speed against that set's
probe and steps, so the load the runs stood at is known), REALAB_RIG
(`cpu`, the default: the CPU-shaped regime; `gpu`: the GPU-shaped one; `gpu-spin`: the
GPU-shaped one as sets 5-6 ran it, vLLM's engine core spinning; see RIGS),
REALAB_FIRST_ROUND (the first round's number, which is its seed; default 0: more rounds
for a kept set start after its last, then `policies add` merges them), REALAB_DRIFT_MARGIN
(default 0.1: a run whose engine ran more than a tenth off the pace of the runs before it
is measured again; `off`: never), REALAB_DRIFT_RETRIES (default 1), REALAB_CALM_S (default
300: the longest wait, before each run, for the hypervisor to stop taking CPU; see drift.py),
REALAB_VISIBLE=1 (the benchmark model's tokens that show no text of their own biased away,
so that every answer token reaches the client as it is made: silent.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

from tiny_family import write_family

from . import measure as m
from .silent import silent_token_ids
from .workloads import WORKLOADS

SERVED = "bench-qwen3"

#: The engines' longest request; a workload with its own small KV cache must still hold
#: one such request (vLLM refuses to start otherwise).
MAX_MODEL_LEN = 8192
KV_MAX_MODEL_LEN = 4096
#: vLLM's KV block on CPU (its platform's default, made explicit): 128 tokens, so 2 GiB
#: of cache is 2,730 blocks of this model and a `kv_blocks` of 50 is 6,400 tokens.
BLOCK_SIZE = 128


@dataclasses.dataclass(frozen=True)
class Regime:
    """The engine limits that set which hardware a rig stands for."""

    name: str
    #: The engine's token budget per step, so the longest prompt chunk a step carries.
    max_num_batched_tokens: int
    #: Bind the forward pass to core 0 and keep everything else (API server, proxies,
    #: load tester, this harness) on the other cores, as a GPU's host CPU does not slow its
    #: kernels; None: vLLM's binding, with the rest of the machine shared.
    engine_core: str | None
    #: The engine core polls its worker politely instead of spinning on the core the
    #: delivery path uses (rig.EngineSpec.engine_core_polls): a GPU host gives that spin a
    #: core of its own. Sets 5 and 6 were measured with the spin.
    engine_core_polls: bool = False


#: On an H100 a 2,048-token prompt chunk of Qwen3-8B costs ~7 decode steps of one
#: request (gpu-step-curve.md). On this rig (measured by the curve probe, 2026-11-27) a
#: decode step of one request takes ~11 ms and a prompt chunk of 128 tokens ~45 ms, of
#: 256 ~80 ms (7 decode steps), of 2,048 over a second (~100). A 256-token budget makes
#: the rig's full chunk cost what the H100's does in decode steps, and the long
#: workload's prompts (~2,600 tokens as the server counts them) ~10 chunks, as a ~20k-token
#: prompt is on the GPU. The policies page measures these ratios for each set (regime.py).
RIGS = {
    "cpu": Regime("cpu", max_num_batched_tokens=2048, engine_core=None),
    "gpu": Regime("gpu", max_num_batched_tokens=256, engine_core="0", engine_core_polls=True),
    # The GPU-shaped rig as sets 5 and 6 measured it, vLLM's engine core spinning on the
    # delivery path's core: for more rounds of those sets.
    "gpu-spin": Regime("gpu", max_num_batched_tokens=256, engine_core="0", engine_core_polls=False),
}


def regime() -> Regime:
    name = os.environ.get("REALAB_RIG", "cpu")
    if name not in RIGS:
        raise SystemExit(f"REALAB_RIG: one of {sorted(RIGS)}; got {name!r}")
    return RIGS[name]


def keep_off_engine_core(spec: m.rig.EngineSpec) -> None:
    """This process, and so every process it starts, off the engine's core (the engine's
    forward pass binds itself there through VLLM_CPU_OMP_THREADS_BIND)."""
    if spec.omp_bind is None:
        return
    others = set(os.sched_getaffinity(0)) - {int(spec.omp_bind)}
    if not others:
        raise SystemExit(f"the engine is bound to core {spec.omp_bind}: the rest needs another core")
    os.sched_setaffinity(0, others)


def setup(root: Path, model: Path, work: Path) -> m.Setup:
    ids = write_family(model, work / "models", (SERVED,))
    names = os.environ.get("REALAB_WORKLOADS", "mix,long").split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"REALAB_WORKLOADS: unknown {unknown}; known: {sorted(WORKLOADS)}")
    # Requests per run: more than the default make a p99 that several requests set, not
    # the single slowest (see the page's "What this measurement can resolve").
    prompts = os.environ.get("REALAB_PROMPTS")
    workloads = [WORKLOADS[n] if not prompts else dataclasses.replace(WORKLOADS[n], prompts=int(prompts))
                 for n in names]
    # One engine pair serves a whole run: its workloads must agree on the KV cache.
    caches = {WORKLOADS[n].kv_blocks for n in names}
    if len(caches) > 1:
        raise SystemExit(f"REALAB_WORKLOADS: {names} need different KV caches ({caches}); "
                         "measure them in separate runs (REALAB_APPEND=1)")
    reg = regime()
    spec = engine_spec(model, caches.pop(), reg)
    # REALAB_LOADS empty (with REALAB_UNLOADED=1): only the rounds' unloaded references,
    # for rounds a kept set measured under load without them.
    loads = [float(x) for x in os.environ.get("REALAB_LOADS", "0.5,0.7,0.9,1.0").split(",") if x.strip()]
    unloaded = os.environ.get("REALAB_UNLOADED") == "1"
    if not loads and not unloaded:
        raise SystemExit("REALAB_LOADS is empty: nothing to measure (add REALAB_UNLOADED=1 to run only "
                         "the rounds' unloaded references)")
    return m.Setup(root=root, work=work, spec=spec, think_end_id=ids["</think>"], models_dir=work / "models",
                   workloads=workloads, loads=loads,
                   rounds=int(os.environ.get("REALAB_ROUNDS", "3")), slo_ttot_ms=250.0, slo_gap_ms=250.0,
                   configs=m.configs_from_env(), unloaded=unloaded,
                   first_round=int(os.environ.get("REALAB_FIRST_ROUND", "0")), rig=reg.name,
                   silent_token_ids=silent_token_ids(model) if os.environ.get("REALAB_VISIBLE") == "1" else (),
                   **drift_from_env())


def drift_from_env() -> dict:
    """REALAB_DRIFT_MARGIN (share; `off`: never measure a run again), REALAB_DRIFT_RETRIES,
    REALAB_CALM_S (0: start each run without waiting for the hypervisor)."""
    margin = os.environ.get("REALAB_DRIFT_MARGIN", "0.1")
    try:
        return {"drift_margin": None if margin == "off" else float(margin),
                "drift_retries": int(os.environ.get("REALAB_DRIFT_RETRIES", "1")),
                "calm_s": float(os.environ.get("REALAB_CALM_S", "300"))}
    except ValueError as e:
        raise SystemExit(f"REALAB_DRIFT_MARGIN / REALAB_DRIFT_RETRIES / REALAB_CALM_S: {e}") from e


def engine_spec(model: Path, kv_blocks: int | None = None, reg: Regime = RIGS["cpu"]) -> m.rig.EngineSpec:
    """The engines every real-engine measurement starts: the benchmark model and limits."""
    return m.rig.EngineSpec(
        python=sys.executable, model=model, served_name=SERVED, dtype="float32",
        # vLLM keeps one block of a small cache back: a request of max_model_len must fit
        # in the rest (32 blocks of 128 tokens serve at most 3,968).
        max_model_len=MAX_MODEL_LEN if kv_blocks is None else min(KV_MAX_MODEL_LEN, (kv_blocks - 1) * BLOCK_SIZE),
        max_num_seqs=32, max_num_batched_tokens=reg.max_num_batched_tokens, kv_cache_gib=2, omp_threads=1,
        omp_bind=reg.engine_core, engine_core_polls=reg.engine_core_polls,
        # No prefix cache: every round replays its seed's prompts at each load and on both
        # configurations of the stock engine, so with the cache on every run after the
        # first would prefill almost nothing (measured: 28% of prompt tokens computed) and
        # a "90% load" would not be one; the twin has no prefix cache either.
        extra=["--block-size", str(BLOCK_SIZE), "--no-enable-prefix-caching"]
        + ([] if kv_blocks is None else ["--num-gpu-blocks-override", str(kv_blocks)]))


def main(argv: list[str]) -> None:
    if argv[0] == "policies":
        from . import policies

        policies.main(argv[1:])
    elif argv[0] == "forecast" and len(argv) == 3:
        from . import forecast

        print(json.dumps(forecast.forecast(Path(argv[1]), Path(argv[2])), indent=1))
    elif argv[0] == "candidates":
        from . import candidates

        candidates.main(argv[1:])
    elif argv[0] == "startcost":
        from . import startcost

        startcost.main(argv[1:])
    elif argv[0] == "prefix":
        from . import prefix

        def prefix_setup(root: Path, model: Path, plan) -> m.Setup:
            work = Path(tempfile.mkdtemp(prefix="realab-prefix-"))
            ids = write_family(model, work / "models", (SERVED,))
            spec = engine_spec(model, None, RIGS["gpu"])
            keep_off_engine_core(spec)
            return m.Setup(root=root, work=work, spec=spec, think_end_id=ids["</think>"], models_dir=work / "models",
                           workloads=[], loads=[], rounds=plan.rounds, slo_ttot_ms=250.0, slo_gap_ms=250.0,
                           configs=plan.configs, first_round=plan.first_round, rig="gpu", calm_s=plan.calm_s)

        prefix.main(argv[1:], prefix_setup)
    elif argv[0] == "migration":
        from . import migration

        def migration_setup(root: Path, model: Path, prompts: int) -> m.Setup:
            work = Path(tempfile.mkdtemp(prefix="realab-migration-"))
            print(f"work directory (logs, raw load-test JSON): {work}", flush=True)
            ids = write_family(model, work / "models", (SERVED,))
            # Both cores run an engine each: nothing is kept off either.
            spec = engine_spec(model, None, RIGS["gpu"])
            w = dataclasses.replace(migration.WORKLOAD, prompts=prompts)
            return m.Setup(root=root, work=work, spec=spec, think_end_id=ids["</think>"], models_dir=work / "models",
                           workloads=[w], loads=[], rounds=0, slo_ttot_ms=250.0, slo_gap_ms=250.0,
                           configs=list(migration.CONFIGS), rig="gpu")

        migration.main(argv[1:], migration_setup)
    elif argv[0] == "stepcost":
        from . import stepcost

        root = Path(__file__).resolve().parents[2]
        model = Path(os.environ.get("REALAB_MODEL", str(Path.home() / ".cache/meridian/bench-qwen3-v1")))
        stepcost.main(argv[1:], root, lambda work: engine_spec(model))
    elif argv[0] == "profile":
        from . import profile

        root = Path(__file__).resolve().parents[2]
        model = Path(os.environ.get("REALAB_MODEL", str(Path.home() / ".cache/meridian/bench-qwen3-v1")))

        def profile_setup(work: Path) -> m.Setup:
            s = setup(root, model, work)
            keep_off_engine_core(s.spec)
            return s

        profile.main(argv[1:], profile_setup)
    elif argv[0] == "measure":
        root, model, results = Path(argv[1]), Path(argv[2]), Path(argv[3])
        work = Path(tempfile.mkdtemp(prefix="realab-"))
        print(f"work directory (logs, step traces, raw load-test JSON): {work}", flush=True)
        s = setup(root, model, work)
        keep_off_engine_core(s.spec)
        m.measure(s, results, log=lambda msg: print(msg, flush=True),
                  append=os.environ.get("REALAB_APPEND") == "1")
    elif argv[0] == "twin-inputs":
        # Observed lengths into RESULTS_JSON, and one twin workload file per workload.
        results, out_dir = Path(argv[1]), Path(argv[2])
        data = json.loads(results.read_text())
        works = [Path(w) for w in data.get("work", [])]
        for w in data["setup"]["workloads"]:
            found: dict = {}
            for wd in works:
                lengths = m.observed_lengths(wd / "runs", w["name"])
                if lengths:
                    found = lengths
            if found:
                data.setdefault("lengths", {})[w["name"]] = found
            if w["name"] in data.get("lengths", {}):
                (out_dir / f"{w['name']}.toml").write_text(m.twin_workload(data["lengths"][w["name"]]))
        m.attribute_runs(data, works)
        results.write_text(json.dumps(data, indent=1))
    elif argv[0] == "report":
        from . import report

        report.write(Path(argv[1]), Path(argv[2]), Path(argv[3]), Path(argv[4]), Path(argv[5]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
