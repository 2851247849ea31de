"""Values the hook needs from the device, read without making the engine's step wait.

On a GPU, ``.tolist()`` or ``.cpu()`` of a tensor the step just computed holds the
engine's CPU until the device has finished the step's forward, and vLLM's host work for
the next step stops overlapping the GPU's (``docs/src/benchmarks/hook-gpu-sync.md``: up to
1.3x longer steps). So the hook queues a non-blocking copy into pinned host memory behind
a CUDA event and takes the value in at a later step, once the event says it has landed.
:mod:`meridian_hook.v2_batch` does this for all of Model Runner V2's reads;
:class:`LateEntropies` does it for the V1 runner's one device read, the entropies of the
thinking rows."""

from __future__ import annotations

from collections import deque
from typing import Any

from meridian_hook import _native
from meridian_hook.probe import entropies_tensor


def host_copy(t: Any, pin: bool = True) -> Any:
    """A host copy of ``t`` that lands when the current stream reaches this point (on the
    host already: a plain copy). ``pin``: into page-locked memory, which a non-blocking
    copy needs to be truly asynchronous (vLLM says whether the platform has it)."""
    import torch  # noqa: PLC0415

    if t.device.type == "cpu":
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)
    host.copy_(t, non_blocking=True)
    return host


def cuda_event(t: Any) -> Any:
    """An event recorded on the current stream when ``t`` is on a GPU (None on the host:
    its copy has landed already)."""
    if t.device.type != "cuda":
        return None
    import torch  # noqa: PLC0415

    event = torch.cuda.Event()
    event.record()
    return event


class LateEntropies:
    """The V1 runner's entropies of thinking rows, handed to an :class:`ExitController` a
    step or more late (``entropies_later``, then ``entropies_arrived_all`` once landed).

    What it changes: an entropy exit is decided at the first step after the value lands,
    not in the step that computed it, one step later or so, the same as under Model
    Runner V2. Budgets and the proxy's directives do not read entropies and still act in
    their own step. A value for a request that has since left its slot (finished, moved,
    swapped) is dropped by the controller (each value carries its occupant's epoch)."""

    def __init__(self, ctl: _native.ExitController, pin: bool = True) -> None:
        self._ctl = ctl
        self._pin = pin
        #: (event, host copy of every row's entropy), oldest first.
        self._reads: deque[tuple[Any, Any]] = deque()

    def pending(self) -> int:
        """Steps whose entropies have not reached the controller yet."""
        return len(self._reads)

    def queue(self, logits: Any) -> None:
        """This step's entropies, every row's (picking the thinking rows on the device
        would need their indices there first, a copy that can wait): call after
        ``observe_outputs`` named the thinking rows and before ``decide``."""
        host = host_copy(entropies_tensor(logits, 1.0), self._pin)
        self._reads.append((cuda_event(logits), host))
        self._ctl.entropies_later()

    def land(self, block: bool = False) -> None:
        """Hands the controller every step's entropies that have landed, oldest first
        (with ``block``, all of them, waiting for the device)."""
        while self._reads:
            event, host = self._reads[0]
            if event is not None:
                if block:
                    event.synchronize()
                elif not event.query():
                    return
            self._reads.popleft()
            self._ctl.entropies_arrived_all(host.double().numpy().tobytes())
