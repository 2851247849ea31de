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


def _tree(root: int) -> float:
    """CPU seconds of `root` and every live descendant, each with its reaped children."""
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
    return total


@dataclass
class Sample:
    wall: float
    busy: float
    steal: float
    ours: float


def sample() -> Sample:
    busy, steal = _system()
    return Sample(time.perf_counter(), busy, steal, _tree(os.getpid()))


def between(a: Sample, b: Sample) -> dict[str, float]:
    """Cores' worth (CPU seconds per second) used between two samples: by the benchmark's
    own processes (this one and its descendants: engines, proxies, load tester), by
    everything else, and stolen by the hypervisor; and the machine's cores."""
    wall = max(b.wall - a.wall, 1e-9)
    ours = (b.ours - a.ours) / wall
    busy = (b.busy - a.busy) / wall
    return {"ours_cores": ours, "other_cores": max(busy - ours, 0.0), "steal_cores": (b.steal - a.steal) / wall,
            "cores": os.cpu_count()}
