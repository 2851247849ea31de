"""``--logits-processors meridian_hook.logits:MeridianLogitsProcessor``: one class for
both of vLLM's logits-processor interfaces (the V1 model runner, used on CPU, and Model
Runner V2, the default on GPU). Each step it follows every request's phase from its
tokens, computes the entropy of thinking rows when the ``[exit]`` signal needs it, and
forces the end-of-thinking token for rows that must stop: told to by the proxy (policy
channel), past their think budget, or past the entropy threshold. Under Model Runner V2
the step's work lives in :mod:`meridian_hook.v2_batch`, which reads the device's tokens
a step late rather than wait for the GPU. The V1 runner keeps tokens on the host; on a
GPU its one device read, the thinking rows' entropies, also arrives a step late
(:class:`meridian_hook.late_reads.LateEntropies`), so no step waits for the device.

Per-request arguments arrive as ``vllm_xargs`` in the request body (vLLM's
``SamplingParams.extra_args``): ``meridian_request_id`` (the proxy's ``X-Request-Id``,
which directives name) and ``meridian_think_budget`` (tokens); the scheduler also reads
``meridian_queued_ms``, the request's wait in the proxy's admission queue."""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality
from vllm.v1.sample.logits_processor.interface import LogitsProcessor as V1LogitsProcessor

try:  # Model Runner V2 (vLLM >= 0.32)
    from vllm.v1.worker.gpu.sample.logits_processor.interface import (
        LogitsProcessor as V2LogitsProcessor,
    )
except ImportError:  # pragma: no cover - older vLLM: V1 only
    V2LogitsProcessor = None  # type: ignore[assignment,misc]

from meridian_hook import _native
from meridian_hook import vllm_adapter as adapter
from meridian_hook.late_reads import LateEntropies
from meridian_hook.probe import entropies
from meridian_hook.v2_batch import V2Batch, force
from meridian_hook.runtime import in_engine_core, runtime, think_markers

log = logging.getLogger("meridian_hook")

REQUEST_ID_ARG = "meridian_request_id"
BUDGET_ARG = "meridian_think_budget"

_bases: tuple[type, ...] = (V1LogitsProcessor,) if V2LogitsProcessor is None else (V1LogitsProcessor, V2LogitsProcessor)


def _extra(params: Any) -> dict[str, Any]:
    extra = getattr(params, "extra_args", None)
    return extra if isinstance(extra, dict) else {}


def _budget(params: Any) -> int | None:
    value = _extra(params).get(BUDGET_ARG)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**32:
        raise ValueError(f"vllm_xargs.{BUDGET_ARG} must be an integer in [1, 2**32); got {value!r}")
    return value


class MeridianLogitsProcessor(*_bases):  # type: ignore[misc]
    """Forces ``</think>`` for the rows Meridian's policy says must stop thinking."""

    def __init__(self, vllm_config: Any, *args: Any) -> None:
        # V1: (vllm_config, device, is_pin_memory); V2: (vllm_config, req_states).
        self._v2 = len(args) == 1
        self._req_states = args[0] if self._v2 else None
        # V1's batch lives on `device`; off the host its entropies are read late.
        device = None if self._v2 or not args else args[0]
        pin = bool(args[1]) if not self._v2 and len(args) > 1 else True
        self._ctl: _native.ExitController | None = None
        self._batch: V2Batch | None = None
        self._late: LateEntropies | None = None
        self._entropy = False
        try:
            self._rt = runtime()
        except Exception:  # noqa: BLE001
            log.exception("meridian hook: bad configuration; logits processor inactive")
            return
        if not self._rt.vllm_supported():
            return  # disabled on an unsupported vLLM (logged); raises if refused
        # Outside any guard: a refusal must stop the engine, not be counted and passed over.
        if self._v2 and not self._rt.check_supported(adapter.v2_state_problems(self._req_states)):
            return
        with self._rt.guard("logits_processor"):
            cfg = self._rt.config
            start, end = think_markers(vllm_config)
            if not end:
                return
            x = cfg.exit
            pc = getattr(vllm_config, "parallel_config", None)
            single_rank = int(getattr(pc, "tensor_parallel_size", 1) or 1) == 1
            self._ctl = _native.ExitController(
                start,
                end,
                x.signal,
                x.min_think_tokens,
                x.rpdi_window,
                x.rpdi_lambda,
                cfg.think_budget_tokens,
                use_directives=single_rank,
            )
            self._entropy = cfg.hook.entropy and x.signal == "rpdi"
            if self._v2:
                self._batch = V2Batch(self._ctl, self._req_states, self._entropy)
            elif self._entropy and getattr(device, "type", "cpu") != "cpu":
                self._late = LateEntropies(self._ctl, pin)
        if not in_engine_core():
            with self._rt.guard("sync"):
                self._rt.start_follower()

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        _budget(sampling_params)
        rid = _extra(sampling_params).get(REQUEST_ID_ARG)
        if rid is not None and not isinstance(rid, str):
            raise ValueError(f"vllm_xargs.{REQUEST_ID_ARG} must be a string; got {rid!r}")

    def is_argmax_invariant(self) -> bool:
        # Forcing a token changes the argmax, so greedy requests must run it too.
        return False

    # ---- V1 interface -------------------------------------------------------------
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self._ctl is None or not batch_update:
            return
        with self._rt.guard("logits_processor"):
            ctl = self._ctl
            for index, params, prompt, output in batch_update.added:
                self._admit(index, params, list(prompt or ()))
                # The controller reads the new tokens from the list vLLM appends to.
                ctl.watch(index, output)
            for index in batch_update.removed:
                ctl.remove(index)
            for a, b, direction in batch_update.moved:
                if direction == MoveDirectionality.SWAP:
                    ctl.swapped(a, b)
                else:
                    ctl.moved(a, b)

    def _admit(self, slot: int, params: Any, prompt: list[int]) -> None:
        assert self._ctl is not None
        extra = _extra(params)
        rid = extra.get(REQUEST_ID_ARG)
        self._ctl.add(slot, prompt, rid if isinstance(rid, str) else None, _budget(params))

    # ---- V2 interface -------------------------------------------------------------
    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        if self._ctl is None or self._batch is None:
            return False
        with self._rt.guard("logits_processor"):
            # The prompt is on the device and not yet written; read it at the first apply.
            self._admit(req_idx, sampling_params, [])
            self._batch.add(req_idx)
            return True
        return False

    def apply_staged_writes(self) -> None:
        return None

    # ---- both ---------------------------------------------------------------------
    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        if self._ctl is None:
            return logits
        # Runs every step: errors are caught inline (HookRuntime.failed) rather than
        # through the `guard` context manager (a generator object per call).
        try:
            if self._batch is not None:
                if logits.shape[0] != len(adapter.v2_slots(ctx)):
                    # Speculative decoding gives a request several rows; not handled yet.
                    return logits
                forced = self._batch.step(logits, ctx)
            else:
                late = self._late
                if late is not None and late.pending():
                    late.land()
                thinking = self._ctl.observe_outputs(logits.shape[0])
                hs: list[float] = []
                if thinking and self._entropy:
                    if late is not None:
                        late.queue(logits)
                    else:
                        hs = self._row_entropies(logits, thinking)
                # V1 keeps every token on the host: nothing is unread, never None.
                forced = self._ctl.decide(hs) or []
            force(logits, forced)
        except Exception:  # noqa: BLE001 - never crash the engine
            self._rt.failed("logits_processor")
        return logits

    def _row_entropies(self, logits: torch.Tensor, rows: list[int]) -> list[float]:
        # On the host only: a batch on a GPU has its entropies read late (`_late`).
        return entropies(logits[rows], 1.0, "cpu")
