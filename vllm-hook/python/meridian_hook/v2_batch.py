"""The logits processor's step under Model Runner V2 (vLLM's default on GPUs), written
without a vLLM import so that it runs, and is checked, on a GPU with no vLLM installed
(``scripts/bench_hook_v2_gpu.py``).

Under V2 the batch's tokens live on the device. Reading the step's fed tokens with
``.cpu()``, or its entropies with ``.tolist()``, holds the engine's CPU until the GPU has
finished the step's forward, so vLLM's host work for the next step no longer overlaps
the GPU's (``docs/src/benchmarks/hook-gpu-sync.md``: up to 1.3x longer steps). So this
never waits in an ordinary step: each step queues non-blocking copies of what it needs
(a new request's prompt, the fed tokens, the thinking rows' entropies) into pinned host
memory behind a CUDA event (:mod:`meridian_hook.late_reads`), and hands them to the
controller at a later step, once the event says they have landed
(``ExitController.observe_late``). Counts are exact at once; a token's value arrives late. Only a step where some row's exit hinges on a value still
in flight waits (``decide`` answers ``None``): the step that decides an exit and the one
after it, about two waits per thought ended, none in a step that ends nothing.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from meridian_hook import _native
from meridian_hook import vllm_adapter as adapter
from meridian_hook.late_reads import cuda_event, host_copy
from meridian_hook.probe import entropies_tensor


def force(logits: Any, forced: list[tuple[int, int]]) -> None:
    """Leaves each forced row one possible token, by views and fills alone: assigning a
    Python number through an index (``logits[row, token] = 0.0``) copies it from host
    memory and, on a GPU, waits for the device (caught on an H200 under PyTorch's sync
    debug mode)."""
    for row, token in forced:
        line = logits[row]
        line.fill_(float("-inf"))
        line.narrow(0, token, 1).fill_(0.0)


def _int64_bytes(t: Any) -> bytes:
    """A host tensor of ids as native-endian int64 bytes."""
    return t.long().numpy().tobytes()


class _StepReads:
    """One step's copies to the host, in the order they must reach the controller."""

    __slots__ = ("event", "prompts", "fed", "entropies")

    def __init__(self) -> None:
        self.event: Any = None
        #: (slot, occupant epoch, prompt length, the slot's committed tokens)
        self.prompts: list[tuple[int, int, int, Any]] = []
        #: The ids fed at every row (the controller knows which rows it counted unread).
        self.fed: Any = None
        #: Every row's entropy (the controller knows which thinking rows it awaits).
        self.entropies: Any = None

    def empty(self) -> bool:
        return not self.prompts and self.fed is None and self.entropies is None


class V2Batch:
    """Follows Model Runner V2's batch for an :class:`ExitController`, one ``step`` per
    ``apply``."""

    def __init__(self, ctl: _native.ExitController, req_states: Any, entropy: bool) -> None:
        self._ctl = ctl
        self._rs = req_states
        self._entropy = entropy
        #: Slots added whose prompt has not been copied yet (V2 writes it on the device
        #: after ``add_request``; it is there by the slot's first step).
        self._pending_prompt: set[int] = set()
        self._reads: deque[_StepReads] = deque()
        #: Steps that had to wait for the device (an exit hinged on an unread value).
        self.waits = 0

    def add(self, slot: int) -> None:
        self._pending_prompt.add(slot)

    def step(self, logits: Any, ctx: Any) -> list[tuple[int, int]]:
        """This step's forced ``(row, token)`` pairs."""
        ctl = self._ctl
        self._land(block=False)
        reads = _StepReads()
        if self._pending_prompt:
            for slot in [s for s in adapter.v2_slots(ctx).tolist() if s in self._pending_prompt]:
                self._pending_prompt.discard(slot)
                epoch = ctl.epoch(slot)
                if epoch is not None:
                    plen, tokens = adapter.v2_committed(self._rs, slot)
                    reads.prompts.append((slot, epoch, plen, host_copy(tokens)))
        fresh = ctl.observe_batch(adapter.v2_columns(self._rs, ctx))
        if fresh:
            reads.fed = host_copy(adapter.v2_fed_ids(ctx))
        if fresh is not None and self._entropy and ctl.thinking_rows():
            # Every row's entropy, not only the thinking rows': picking rows on the
            # device would need their indices there first, a copy that can wait.
            reads.entropies = host_copy(entropies_tensor(logits, 1.0))
            ctl.entropies_later()
        if not reads.empty():
            reads.event = cuda_event(logits)
            self._reads.append(reads)
        if fresh is None:
            return []
        forced = ctl.decide([])
        if forced is None:
            self.waits += 1
            self._land(block=True)
            ctl.thinking_rows()
            forced = ctl.decide([]) or []
        return forced

    def _land(self, block: bool) -> None:
        """Hands the controller every step's copies that have landed, oldest first (with
        ``block``, all of them, waiting for the device)."""
        ctl = self._ctl
        while self._reads:
            reads = self._reads[0]
            if reads.event is not None:
                if block:
                    reads.event.synchronize()
                elif not reads.event.query():
                    return
            self._reads.popleft()
            for slot, epoch, plen, tokens in reads.prompts:
                if ctl.epoch(slot) == epoch:
                    committed = tokens.tolist()
                    ctl.reset_prompt(slot, committed[:plen])
                    # The output so far of a request resumed after preemption.
                    ctl.replay(slot, committed[plen:])
                    ctl.set_seen(slot, len(committed) - plen)
            # Every row's values as raw bytes; the controller picks the rows it awaits
            # (indexing the tensor by a list of rows cost a third of the step at 256).
            if reads.fed is not None:
                ctl.observe_late_fed(_int64_bytes(reads.fed))
            if reads.entropies is not None:
                ctl.entropies_arrived_all(reads.entropies.double().numpy().tobytes())
