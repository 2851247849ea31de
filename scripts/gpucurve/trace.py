"""Reading the step traces `measure` writes (standard library only: the GPU benchmark
pages read them too)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def key(s: dict) -> tuple:
    """A step's shape: decodes, cached tokens each, chunk tokens, chunk prefix."""
    return s["decode_reqs"], s.get("decode_context_each", 0), s["prefill_tokens"], s["prefill_context"]


def name(s: dict) -> str:
    """A step's shape in words, for tables."""
    if s["decode_reqs"]:
        plural = "s" if s["decode_reqs"] > 1 else ""
        return f"{s['decode_reqs']} decode{plural} x {s.get('decode_context_each', 0)} cached"
    return f"{s['prefill_tokens']}-token chunk after {s['prefill_context']}"


def read_trace(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def groups(rows: list[dict]) -> dict[tuple, dict]:
    """One row per step shape: the shape and its median time over the timed replays."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault(key(r), []).append(r)
    return {k: rs[0] | {"step_s": statistics.median(r["step_s"] for r in rs),
                        "spread_s": max(r["step_s"] for r in rs) - min(r["step_s"] for r in rs)}
            for k, rs in by.items()}


def shortest_step_ms(data: Path, decode_reqs: int | None = None) -> tuple[float, str] | None:
    """The shortest step of the curve in `data` (of `decode_reqs` decodes and no chunk
    only, if given): the smaller of the graph replays' medians and the fused steps, with
    the device they were measured on; None without the data. For the GPU benchmark
    pages that set a cost beside an engine step."""
    trace, meta = data / "steps-graph.jsonl", data / "meta.json"
    if not trace.exists() or not meta.exists():
        return None
    wanted = (lambda s: True) if decode_reqs is None else (
        lambda s: s["decode_reqs"] == decode_reqs and s["prefill_tokens"] == 0)
    times = [s["step_s"] * 1e3 for s in groups(read_trace(trace)).values() if wanted(s)]
    fused = data / "fused.json"
    if fused.exists():
        times += [s["fused_ms"] for s in json.loads(fused.read_text())["steps"] if wanted(s)]
    if not times:
        return None
    return min(times), json.loads(meta.read_text())["facts"].get("device", "a GPU")
