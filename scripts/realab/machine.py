"""How busy the machine was during a measured run, apart from the benchmark itself: on a
shared 2-core machine other work (or the hypervisor) takes CPU from every configuration,
and the page should say how much from the figures, not from a sentence written by hand."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")


def _system() -> tuple[float, float]:
    """CPU seconds the whole machine spent busy, and stolen by the hypervisor."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / _TICK, steal / _TICK


def _tree(root: int) -> tuple[float, set[int]]:
    """CPU seconds of `root` and every live descendant, each with its reaped children; and
    those processes."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # The command name (field 2) may hold spaces; fields after it are fixed.
        rest = stat[stat.rindex(")") + 2:].split()
        pid = int(entry)
        parent[pid] = int(rest[1])
        cpu[pid] = sum(int(x) for x in rest[11:15]) / _TICK  # utime stime cutime cstime
    total, todo, seen = 0.0, [root], set()
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total, seen


#: The rig's processes by what they do, from their command lines (vLLM titles its engine
#: core and worker processes); first match wins. The load tester is not among them: it
#: exits before a run's closing sample, so only the benchmark's total holds its CPU.
ROLES = (("engine core", "EngineCore"), ("worker", "Worker"), ("API server", "vllm.entrypoints"),
         ("proxy", "meridian serve"))


def _role(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return next((name for name, mark in ROLES if mark in cmd), None)


def _sched(pid: int) -> tuple[float, float]:
    """Seconds `pid`'s threads ran and waited runnable for a CPU (schedstat), summed."""
    run = wait = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    ran, waited, _ = f.read().split()
            except (OSError, ValueError):
                continue  # a thread gone meanwhile
            run += int(ran)
            wait += int(waited)
    except OSError:
        pass
    return run / 1e9, wait / 1e9


def _by_role(pids: set[int]) -> dict[int, tuple[str, float, float]]:
    out = {}
    for pid in pids:
        role = _role(pid)
        if role is not None:
            out[pid] = (role, *_sched(pid))
    return out


@dataclass
class Sample:
    wall: float
    busy: float
    steal: float
    ours: float
    #: pid: (role, seconds run, seconds waited for a CPU) of the rig's processes.
    roles: dict[int, tuple[str, float, float]]


def sample() -> Sample:
    busy, steal = _system()
    ours, pids = _tree(os.getpid())
    return Sample(time.perf_counter(), busy, steal, ours, _by_role(pids))


def between(a: Sample, b: Sample) -> dict[str, float]:
    """Cores' worth (CPU seconds per second) used between two samples: by the benchmark's
    own processes (this one and its descendants: engines, proxies, load tester), by
    everything else, and stolen by the hypervisor; the machine's cores; and by role (`ROLES`:
    engine core, worker, API server, proxy) the cores each ran on and the cores' worth of
    time it waited runnable for one, the mark of a starved process."""
    wall = max(b.wall - a.wall, 1e-9)
    ours = (b.ours - a.ours) / wall
    busy = (b.busy - a.busy) / wall
    roles: dict[str, dict[str, float]] = {}
    for pid, (role, ran, waited) in b.roles.items():
        _, ran0, waited0 = a.roles.get(pid, (role, 0.0, 0.0))
        r = roles.setdefault(role, {"cores": 0.0, "waiting": 0.0})
        r["cores"] += (ran - ran0) / wall
        r["waiting"] += (waited - waited0) / wall
    return {"ours_cores": ours, "other_cores": max(busy - ours, 0.0), "steal_cores": (b.steal - a.steal) / wall,
            "cores": os.cpu_count(), "roles": roles}
