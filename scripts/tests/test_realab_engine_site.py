"""The GPU-shaped rig's patch to vLLM's engine core (scripts/realab/engine_site): when the
engine core imports vLLM's shared-memory queue, its reader sleeps between polls instead of
spinning with sched_yield, while a worker process keeps vLLM's spin. Run in fresh
interpreters against a stand-in of vLLM's module with the same names, so the test needs
no vLLM and sees exactly what an engine process does at start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SITE = Path(__file__).resolve().parents[2] / "scripts" / "realab" / "engine_site"

# vLLM's SpinCondition as far as the patch relies on it: readers record reads and, while
# busy, yield the CPU in wait(); the stand-in counts yields instead of making them.
STAND_IN = '''
import time

YIELDS = 0


def sched_yield():
    global YIELDS
    YIELDS += 1


class SpinCondition:
    def __init__(self, is_reader, context, notify_address, busy_loop_s=1):
        self.is_reader = is_reader
        self.busy_loop_s = busy_loop_s if is_reader else 0
        self.last_read = time.monotonic()
        self.polled = 0

    def wait(self, timeout_ms=None):
        if time.monotonic() <= self.last_read + self.busy_loop_s:
            sched_yield()
        else:
            self.polled += 1
'''

PROBE = textwrap.dedent('''
    import json, multiprocessing, sys, time
    multiprocessing.current_process().name = sys.argv[1]
    from vllm.distributed.device_communicators import shm_broadcast as s
    reader = s.SpinCondition(True, None, "ipc://x")
    t0 = time.perf_counter()
    for _ in range(20):
        reader.wait()
    took = time.perf_counter() - t0
    writer = s.SpinCondition(False, None, "ipc://x")
    print(json.dumps({"yields": s.YIELDS, "took_s": took, "polled": reader.polled,
                      "writer_has_own_wait": "wait" in vars(writer)}))
''')


def run_probe(tmp_path: Path, process_name: str, with_site: bool = True) -> tuple[dict, str]:
    pkg = tmp_path / "vllm" / "distributed" / "device_communicators"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "distributed", pkg):
        (d / "__init__.py").touch()
    (pkg / "shm_broadcast.py").write_text(STAND_IN)
    path = [str(SITE)] if with_site else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(tmp_path)])}
    done = subprocess.run([sys.executable, "-c", PROBE, process_name], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_engine_core_sleeps_between_polls_instead_of_yielding(tmp_path):
    out, log = run_probe(tmp_path, "EngineCore_DP0")
    assert out["yields"] == 0
    # 20 waits of at least 100 us each: the reader slept, it did not spin.
    assert out["took_s"] >= 20 * 100e-6
    # It still waits as vLLM does once busy_loop_s has passed (not reached in 2 ms).
    assert out["polled"] == 0
    assert "sleeps 100 us between polls" in log and "EngineCore_DP0" in log
    # Writers keep vLLM's behaviour.
    assert out["writer_has_own_wait"] is False


def test_a_worker_keeps_vllms_spin(tmp_path):
    out, log = run_probe(tmp_path, "VllmWorker-0")
    assert out["yields"] == 20
    assert "realab rig" not in log


def test_without_the_rig_site_vllm_spins(tmp_path):
    # The stand-in itself spins: the first test's change is the patch's doing.
    out, _ = run_probe(tmp_path, "EngineCore_DP0", with_site=False)
    assert out["yields"] == 20
