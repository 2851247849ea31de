"""Imported at start-up by every Python process of a GPU-shaped rig's engine (the rig puts
this directory on the engines' PYTHONPATH; see `rig.EngineSpec.engine_core_polls`).

vLLM's engine-core process waits for each step's result from its worker on a shared-
memory queue, and for up to a second after every read it busy-waits (a `sched_yield`
loop, `shm_broadcast.SpinCondition`) before it blocks on the queue's notification. On a
GPU host that spin has a core of its own and slows nobody. On the 2-core rig it shares
the one core left to vLLM's API server, the proxies and the load tester: measured at the
mix's 90% load, it took 0.8 of that core and left the proxy waiting for CPU 4-7 times as
long as it ran, which clients saw as late tokens. So the engine core here polls politely
instead: it sleeps 100 microseconds between looks at the queue (a few percent of a core,
and a step's result is seen within about 0.2 ms against decode steps of 10 ms and more).

Blocking at once on the notification was measured first and rejected: every step then
waits for a wake-up through the busy core's message threads, and the rig lost a third of
its capacity (1.64 against 2.40 requests a second on the mix). The worker keeps vLLM's
spin: it has the engine's core to itself. The patch is applied when vLLM imports the
module, so processes that never import it pay nothing."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import multiprocessing
import sys
import time

_MODULE = "vllm.distributed.device_communicators.shm_broadcast"
#: How long the engine core sleeps between looks at its worker's queue while busy.
POLL_S = 100e-6


def _poll_politely(module) -> None:
    spin = module.SpinCondition
    wait = spin.wait

    def polite_wait(self, timeout_ms=None):
        if time.monotonic() <= self.last_read + self.busy_loop_s:
            time.sleep(POLL_S)
        else:
            wait(self, timeout_ms)

    init = spin.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        # vLLM names its worker processes VllmWorker-<rank>: they keep vLLM's spin.
        name = multiprocessing.current_process().name
        if getattr(self, "is_reader", False) and not name.startswith("VllmWorker"):
            self.wait = polite_wait.__get__(self)
            # In the engine's log, so a run shows the rig was applied.
            print(f"realab rig: the shared-memory reader in process {name} sleeps {POLL_S * 1e6:.0f} us "
                  "between polls instead of spinning", file=sys.stderr, flush=True)

    spin.__init__ = __init__


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            _poll_politely(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())
