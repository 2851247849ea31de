"""The kept sets of the every-policy page: `keep` copies a measured set's results and
raw files into the repository, `add` appends later rounds to it, `read` gives a
workload x load back as paired runs and unloaded references (`references`: every one,
and those off their set's pace, `slo.off_pace`, which `slo.judges` leaves out unless a
round's pace is matched); `digest` names the data a page was generated from."""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import shutil
from pathlib import Path

from . import forecast as F
from . import regime as R
from . import slo
from . import speed
from . import stats as S

#: Requests at the start of each run left out of every figure: the queue is still
#: filling (the load tester's arrivals start on an idle engine).
WARMUP_SHARE = 0.1


def keep(results: Path, set_dir: Path, label: str) -> int:
    """Copies `results` into `set_dir` under `label`, and gzips the raw files of every
    measured and unloaded run into `set_dir/raw`."""
    data = json.loads(results.read_text())
    raw_dir = set_dir / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    (set_dir / "results.json").write_text(json.dumps({**data, "label": label, "step_shape": R.step_shape(data)},
                                                     indent=1))
    F.keep_steps(data, set_dir)
    return _copy_raw(data, raw_dir, replace=True)


def _copy_raw(data: dict, raw_dir: Path, replace: bool) -> int:
    kept = 0
    for work in data.get("work", []):
        runs = Path(work) / "runs"
        if not runs.is_dir():
            continue
        for f in sorted(runs.glob("*.json")):
            if f.name.startswith(("capacity-", "warm-")):
                continue
            target = raw_dir / (f.name + ".gz")
            if target.exists() and not replace:
                raise SystemExit(f"{target} is already kept: a round is never measured twice")
            with f.open("rb") as src, gzip.open(target, "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
            kept += 1
    return kept


#: Setup fields that must agree for rounds to be added to a kept set.
_SAME_WORKLOAD = ("name", "prompts", "max_model_len", "proxy", "rig")


def add(results: Path, set_dir: Path, note: str) -> int:
    """Adds the rounds measured into `results` (`REALAB_FIRST_ROUND` past the set's
    last) to the kept set in `set_dir`: same engine, workloads and proxies, no round of
    a configuration measured twice. The set records each addition (`additions`), which
    the page reports as the rounds each configuration has."""
    kept = json.loads((set_dir / "results.json").read_text())
    new = json.loads(results.read_text())

    def engine(data: dict) -> dict:
        # Sets measured before the rig recorded a field ran with its default then: the
        # engine core spinning, vLLM's stats off (`rig.EngineSpec`).
        recorded_later = {"engine_core_polls": "False", "log_stats": "False"}
        return {**recorded_later, **{k: v for k, v in data["setup"]["engine"].items() if k != "model"}}

    if engine(kept) != engine(new):
        raise SystemExit(f"{results}: another engine setup than {set_dir}'s")
    if kept["setup"].get("visible_tokens") != new["setup"].get("visible_tokens"):
        raise SystemExit(f"{results}: the answers' silent tokens {'biased away' if new['setup'].get('visible_tokens') else 'kept'}, "
                         f"unlike {set_dir}'s (REALAB_VISIBLE)")
    by_name = {w["name"]: w for w in kept["setup"]["workloads"]}
    for w in new["setup"]["workloads"]:
        old = by_name.get(w["name"])
        if old is None or any(old.get(k) != w.get(k) for k in _SAME_WORKLOAD):
            raise SystemExit(f"{results}: workload {w['name']} is not measured as in {set_dir}")
        for name, cap in new.get("capacity", {}).items():
            # Rounds given a capacity (REALAB_CAPACITY) are given the set's, as the log
            # printed it (three decimals); rounds that measured their own machine's (the
            # default) stand at their load there, and each run records the capacity it was
            # sent by (`speed` reads the older runs' loads from the curve probe).
            if (new.get("capacity_given", {}).get(name)
                    and abs(cap - kept["capacity"].get(name, cap)) > 0.0005 + 1e-9):
                raise SystemExit(f"{results}: {name} given another capacity ({cap} vs {kept['capacity'][name]})")
    have = {(r["workload"], r["load"], r["round"], r["config"]) for r in kept["runs"]}
    again = [k for k in ((r["workload"], r["load"], r["round"], r["config"]) for r in new["runs"]) if k in have]
    if again:
        raise SystemExit(f"{results}: already in {set_dir}: {again}")
    stamp_work(kept)
    kept["runs"] += new["runs"]
    for key in ("drift_reruns", "references"):
        if new.get(key):
            kept[key] = [*kept.get(key, []), *new[key]]
    # Each invocation's curve probe (`speed`); the set's capacity stays the one it was
    # first measured with, and the machine that measured it.
    kept["probes"] = {**kept.get("probes", {}), **new.get("probes", {})}
    for name in kept["capacity"]:
        first = speed.capacity_work(kept, name)
        if first is not None:
            kept.setdefault("capacity_work", {})[name] = first
    for w in new["setup"]["workloads"]:
        # An addition may measure the set's rig at another load; the page gets a section
        # for it, and the set's first command keeps the loads it was measured at.
        old = by_name[w["name"]]
        if set(w["loads"]) - set(old["loads"]):
            old.setdefault("first_loads", old["loads"])
            old["loads"] = sorted({*old["loads"], *w["loads"]})
    configs = kept["setup"]["configs"]
    kept["setup"]["configs"] = [*configs, *(c for c in new["setup"]["configs"] if c not in configs)]
    kept["work"] = [*kept.get("work", []), *new.get("work", [])]
    first = new["setup"].get("first_round", 0)
    kept.setdefault("additions", []).append({
        "note": note, "configs": new["setup"]["configs"],
        # An addition of unloaded references only (no loads) covers the rounds it ran.
        "rounds": sorted({r["round"] for r in new["runs"]}) or list(range(first, first + new["setup"]["rounds"])),
        "first_round": first,
        "loads": sorted({r["load"] for r in new["runs"]}),
        "unloaded": any(any((Path(w) / "runs").glob("*-unloaded-*.json")) for w in new.get("work", [])),
        "elapsed_s": new.get("elapsed_s"), "shipped_policy": new["setup"].get("shipped_policy")})
    copied = _copy_raw(new, set_dir / "raw", replace=False)
    F.keep_steps(kept, set_dir)
    (set_dir / "results.json").write_text(json.dumps(kept, indent=1))
    return copied


def stamp_work(data: dict) -> int:
    """Names each run's work directory (`run["work"]`, which `regime.run_trace` reads) where
    the run predates `measure` recording it, from the set's own history: `work[0]` is the
    kept measurement's, `work[i]` addition i's, and an addition's runs are its rounds x
    configurations x loads (an addition recorded without loads ran at the loads the set
    first had). A run the history cannot place (no work directory recorded for each
    measurement, or two additions that could each have made it) stays unnamed, and no
    step trace is read for it; returns the runs named."""
    works = [Path(w).name for w in data.get("work", [])]
    additions = data.get("additions", [])
    missing = [r for r in data["runs"] if "work" not in r]
    if not missing:
        return 0
    if len(works) != len(additions) + 1:
        return 0
    first = {w["name"]: w.get("first_loads", w["loads"]) for w in data["setup"]["workloads"]}
    for r in missing:
        made = [i + 1 for i, a in enumerate(additions)
                if r["round"] in a["rounds"] and r["config"] in a["configs"]
                and r["load"] in (a["loads"] if a.get("loads") is not None else first[r["workload"]])]
        if len(made) <= 1:
            r["work"] = works[made[0] if made else 0]
    return sum("work" in r for r in missing)


def without_warmup(requests: list[dict]) -> list[dict]:
    """A run's requests less the first `WARMUP_SHARE` of them (by index)."""
    skip = int(len(requests) * WARMUP_SHARE)
    return [r for r in requests if r["index"] >= skip]


def read(raw_dir: Path, workload: str, load: float) -> tuple[dict[str, dict[int, list[dict]]], dict[int, list[dict]]]:
    """({config: {round: requests}}, {round: unloaded requests}), the first
    `WARMUP_SHARE` of each run's requests (by index) left out; every reference, judged
    through `slo.judges`."""
    runs = S.read_runs(raw_dir, workload, load)
    for rounds in runs.values():
        for rnd, requests in rounds.items():
            rounds[rnd] = without_warmup(requests)
    return runs, references(raw_dir, workload)[0]


def references(raw_dir: Path, workload: str) -> tuple[dict[int, list[dict]], dict[int, float]]:
    """({round: its unloaded reference's requests}, {round: pace ratio} of the references
    that ran off the set's pace: `slo.off_pace`). Every load's section and the capacity
    lines judge by the same references: they are parsed once while their files stay as
    they are (callers only read what this returns)."""
    files = sorted(raw_dir.glob(f"{workload}-unloaded-*.json.gz"))
    return _references(tuple((f, f.stat().st_mtime_ns, f.stat().st_size) for f in files), workload)


@functools.cache
def _references(files: tuple[tuple[Path, int, int], ...], workload: str) -> tuple[dict, dict]:
    every = {int(f.name[len(f"{workload}-unloaded-"):-len(".json.gz")]): S.read_requests(f) for f, _, _ in files}
    return every, slo.off_pace(every)


def digest(page_dir: Path) -> tuple[str, int]:
    """(sha256, files) over every file the kept sets hold (each file's path under
    `page_dir` and its content): the data the page and the README's summary were
    generated from, which each carries (`stamp`) so that a test can tell a set added or
    changed without the page regenerated."""
    whole = hashlib.sha256()
    # Hidden files and editors' leftovers are no set's data (and a clean clone has none).
    files = sorted(f for f in page_dir.rglob("*") if f.is_file()
                   and not any(part.startswith(".") for part in f.relative_to(page_dir).parts)
                   and not f.name.endswith(("~", ".swp")))
    for f in files:
        whole.update(f.relative_to(page_dir).as_posix().encode() + b"\0")
        with f.open("rb") as src:
            whole.update(hashlib.file_digest(src, "sha256").digest())
    return whole.hexdigest(), len(files)


def stamp(page_dir: Path) -> str:
    """The line the page and the README's summary end with: the data they were generated
    from, by `digest` (an HTML comment: neither renders it)."""
    sha, files = digest(page_dir)
    return (f"<!-- generated from {files} files in {page_dir.name}/, sha256 {sha}; "
            "python -m realab policies report writes this line -->")
