"""Step times out of the GPU step-time curve's committed data (docs/src/benchmarks/
gpu-step-curve/), for the GPU benchmark pages that set their costs beside a step:
read from the measurement, not written in."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "docs/src/benchmarks/gpu-step-curve"


def shortest_step_ms(decode_reqs: int | None = None) -> tuple[float, str] | None:
    """The shortest step of the curve (of `decode_reqs` decodes only, if given), as the
    smaller of the plain graph replays' medians and the fused steps, with the device it
    was measured on; None without the data."""
    trace, meta = DATA / "steps-graph.jsonl", DATA / "meta.json"
    if not trace.exists() or not meta.exists():
        return None
    by: dict[tuple, list[float]] = {}
    for line in trace.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if decode_reqs is None or (r["decode_reqs"] == decode_reqs and r["prefill_tokens"] == 0):
                key = (r["decode_reqs"], r.get("decode_context_each"), r["prefill_tokens"], r["prefill_context"])
                by.setdefault(key, []).append(r["step_s"] * 1e3)
    times = [statistics.median(v) for v in by.values()]
    fused = DATA / "fused.json"
    if fused.exists():
        times += [s["fused_ms"] for s in json.loads(fused.read_text())["steps"]
                  if decode_reqs is None or (s["decode_reqs"] == decode_reqs and s["prefill_tokens"] == 0)]
    if not times:
        return None
    return min(times), json.loads(meta.read_text())["facts"].get("device", "a GPU")
