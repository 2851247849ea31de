"""What one blocking device read per step costs under async scheduling
(scripts/gpucurve/sync.py): the page computes every figure from sync.json (medians over
the repeats, ratios to the overlapped loop at the same host work), a missing sync.json is
an error, and the loop itself runs on a CPU with the tiny model."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from gpucurve.sync import SHAPES, _loop
from gpucurve.syncreport import HOST_WORK_MS, MODES, page


def _torch_python() -> str | None:
    """A Python with torch: the vLLM venv scripts/test.sh sets, else this one if it has it."""
    if os.environ.get("MERIDIAN_VLLM_PYTHON"):
        return os.environ["MERIDIAN_VLLM_PYTHON"]
    return sys.executable if importlib.util.find_spec("torch") else None


TORCH_PYTHON = _torch_python()

# Repeats (ms) per (mode, host work). The overlapped loop at 2 ms has median 10.0 and mean
# 11.0, so a page that averaged would print other ratios than the ones checked below.
REPEATS = {
    ("overlapped", 0.0): [8.0, 8.1, 8.2], ("read-ids", 0.0): [8.3, 8.2, 8.4],
    ("read-ids+entropy", 0.0): [8.5, 8.6, 8.4],
    ("overlapped", 2.0): [10.0, 10.0, 13.0], ("read-ids", 2.0): [11.6, 11.5, 11.9],
    ("read-ids+entropy", 2.0): [13.0, 14.0, 12.0],
}


def _synthetic(timing: str = "cuda-graph") -> dict:
    loops = [{"mode": mode, "host_work_ms": w, "repeats_ms": ms} for (mode, w), ms in REPEATS.items()]
    return {"device": "Test GPU", "torch": "2.0", "cuda": "13.0", "config_name": "qwen3-8b",
            "config": {"layers": 36, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "vocab": 151936},
            "params": 8.19e9, "timing": timing, "elapsed_s": 110.4, "context_each": 1024, "steps": 40, "warmup": 5,
            "repeats": 3, "graph_replays": 10, "host_work_ms": [0.0, 2.0], "modes": MODES,
            "batches": [{"batch": 64, "context_each": 1024, "step_ms": 9.5, "step_ms_min": 9.4, "step_ms_max": 9.7,
                         "loops": loops}]}


def _report(data_dir: Path, page_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpucurve", "sync-report", "--data", str(data_dir),
                           "--page", str(page_path)], cwd=ROOT / "scripts", capture_output=True, text=True, timeout=60)


def test_the_page_computes_its_ratios_from_the_medians(tmp_path):
    (tmp_path / "sync.json").write_text(json.dumps(_synthetic()))
    run = _report(tmp_path, tmp_path / "page.md")
    assert run.returncode == 0, run.stdout + run.stderr
    text = (tmp_path / "page.md").read_text()
    # 11.6 / 10.0 and 13.0 / 10.0: medians over the repeats, at the same host work.
    assert ("At batch 64 with 2 ms of host work, reading the ids each step makes a step 1.16x as long as "
            "overlapped (11.600 ms against 10.000 ms, +1.600 ms)") in text
    assert ("reading the ids and the entropies each step makes a step 1.30x as long as overlapped "
            "(13.000 ms against 10.000 ms, +3.000 ms)") in text
    # The no-overlap sum is graph + W; back to back is the overlapped loop with no host work.
    assert "The graph alone takes 9.500 ms, graph + host work 11.500 ms." in text
    assert "the graph alone 9.500 ms (9.400–9.700), back to back (overlapped, no host work) 8.100 ms." in text
    assert "with no host work, the ids read alone adds +0.200 ms a step" in text
    assert "between 1.02x and 1.16x as long as overlapped" in text
    assert "| 2 ms | read-ids | 11.600 ms | 11.500–11.900 ms | 9.500 ms | 11.500 ms | +16.0% (1.16x) |" in text
    assert "| 2 ms | overlapped | 10.000 ms | 10.000–13.000 ms | 9.500 ms | 11.500 ms |  |" in text
    assert "Device: Test GPU; PyTorch 2.0 (CUDA 13.0)" in text
    assert "The measurement took 110 s in all." in text
    assert "Measured on a CPU" not in text
    assert "Measured on a CPU" in page(_synthetic(timing="eager"))


def test_a_missing_measurement_is_an_error_and_writes_no_page(tmp_path):
    run = _report(tmp_path, tmp_path / "page.md")
    assert run.returncode != 0
    assert "sync.json not found" in run.stderr
    assert not (tmp_path / "page.md").exists()


class _Ids:
    """Stands in for a step's input ids: counts the host's reads."""

    def __init__(self):
        self.reads = 0

    def cpu(self):
        self.reads += 1
        return self


class _Step:
    def __init__(self):
        self.ids = _Ids()


def _busy_ms(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("mode, reads", [("overlapped", 0), ("read-ids", 6)])
def test_each_step_holds_its_host_work_and_reads_the_ids_only_when_told(mode, reads):
    # Without a GPU nothing runs beside the host: a step's interval is the 1 ms step plus
    # the whole 2 ms of host work (never less), and the ids are read once a step, warm-up
    # included, in the read modes only.
    step = _Step()
    ms = _loop(None, lambda: _busy_ms(1.0), step, mode, 2.0, steps=4, warmup=2, cuda=False)
    assert 3.0 <= ms < 100.0
    assert step.ids.reads == reads


@pytest.mark.skipif(not TORCH_PYTHON, reason="no Python with torch (MERIDIAN_VLLM_PYTHON unset; scripts/test.sh sets it)")
def test_the_loop_runs_on_a_cpu_with_the_tiny_model(tmp_path):
    run = subprocess.run([TORCH_PYTHON, "-m", "gpucurve", "sync", "--config", "tiny", "--device", "cpu",
                          "--steps", "1", "--warmup", "1", "--out", str(tmp_path)],
                         cwd=ROOT / "scripts", capture_output=True, text=True, timeout=120,
                         # One thread: a second one waits on a busy 2-core machine at every op.
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| host work W | mode | wall per step (median) |" in run.stdout
    data = json.loads((tmp_path / "sync.json").read_text())
    assert data["timing"] == "eager" and data["steps"] == 1 and data["warmup"] == 1
    assert [b["batch"] for b in data["batches"]] == SHAPES["tiny"][0]
    for entry in data["batches"]:
        assert entry["step_ms"] > 0
        assert {(x["mode"], x["host_work_ms"]) for x in entry["loops"]} == {(m, w) for m in MODES for w in HOST_WORK_MS}
        for x in entry["loops"]:
            assert len(x["repeats_ms"]) == data["repeats"]
            # On a CPU nothing overlaps: every launch-to-launch interval holds the whole spin.
            assert min(x["repeats_ms"]) >= x["host_work_ms"], x
    report = _report(tmp_path, tmp_path / "page.md")
    assert report.returncode == 0, report.stdout + report.stderr
    text = (tmp_path / "page.md").read_text()
    assert "Measured on a CPU" in text
    assert all(f"## Batch {b}" in text for b in SHAPES["tiny"][0])
