"""What one vLLM process's hook shares: the config, the think delimiters of the served
model, the policy channel role, the verdict on whether this vLLM can run the hook, and
the rule that a hook error never takes the engine down (it is logged, counted, and the
caller falls back to stock behaviour). A vLLM the hook does not support is the one
exception: that stops the engine at start-up, unless configured otherwise."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Iterator

from meridian_hook import _native, vllm_adapter
from meridian_hook.config import MeridianConfig, load_from_env

log = logging.getLogger("meridian_hook")

_lock = threading.Lock()
_runtime: "HookRuntime | None" = None


in_engine_core = vllm_adapter.in_engine_core


def think_markers(vllm_config: Any) -> tuple[list[int], list[int]]:
    """Think delimiters as token ids: vLLM's reasoning config (set by
    ``--reasoning-parser``) when present, else the Meridian model family of the served
    model name, else none (phases unknown: the hook keeps vLLM's order)."""
    rc = getattr(vllm_config, "reasoning_config", None)
    if rc is not None and getattr(rc, "enabled", False):
        start = list(rc.reasoning_start_token_ids or [])
        end = list(rc.reasoning_end_token_ids or [])
        if end:
            return start, end
    mc = getattr(vllm_config, "model_config", None)
    names = [getattr(mc, "served_model_name", None), getattr(mc, "model", None)]
    for name in names:
        if isinstance(name, (list, tuple)):
            name = name[0] if name else None
        if name:
            found = _native.family_markers(str(name))
            if found:
                return list(found[1]), list(found[2])
    log.warning(
        "meridian hook: no think delimiter known for this model (start vLLM with "
        "--reasoning-parser); phase-aware ordering and forced exits are off"
    )
    return [], []


class HookRuntime:
    def __init__(self, config: MeridianConfig) -> None:
        self.config = config
        self._last_log: dict[str, float] = {}
        #: This process's verdict on the running vLLM (None: not checked yet).
        self._supported: bool | None = None

    def vllm_supported(self, scheduler: Any = None, stock: type | None = None) -> bool:
        """Whether the hook may act on this vLLM: its version in the supported range and,
        given the live ``scheduler`` (a subclass of ``stock``), every internal it needs
        there (:func:`vllm_adapter.problems`). When not, raises
        :class:`vllm_adapter.UnsupportedVllm` naming each problem, or, with
        ``hook.on_unsupported_vllm = "disable"``, logs them, exports
        ``meridian_hook_disabled 1`` and returns False (run as stock vLLM)."""
        if scheduler is None and self._supported is not None:
            return self._supported
        return self.check_supported(vllm_adapter.problems(scheduler, stock))

    def check_supported(self, found: list[str]) -> bool:
        """What :meth:`vllm_supported` does with the problems it found, for a check made
        elsewhere (the logits processor's look at Model Runner V2's live state): none,
        True; else refuse, or disable and say so, as configured."""
        if not found:
            if self._supported is None:
                self._supported = True
            return self._supported
        if self.config.hook.on_unsupported_vllm != "disable":
            raise vllm_adapter.UnsupportedVllm(found)
        self._supported = False
        _native.set_disabled(True)
        log.error(
            "meridian hook: disabled (hook.on_unsupported_vllm = \"disable\"), the engine runs as "
            "stock vLLM: %s",
            "; ".join(found),
        )
        return False

    @contextlib.contextmanager
    def guard(self, site: str) -> Iterator[None]:
        """Runs a hook step; on any error logs (at most every 10 s per site), counts
        ``meridian_hook_errors_total{site}`` and swallows it, so vLLM carries on."""
        try:
            yield
        except Exception:  # noqa: BLE001 - the point is to never crash the engine
            self.failed(site)

    def failed(self, site: str) -> None:
        """What ``guard`` does with an error, for callers that catch it themselves (in
        ``except Exception:``, so the error is logged with its traceback)."""
        with contextlib.suppress(Exception):
            _native.count_error(site)
        now = time.monotonic()
        if now - self._last_log.get(site, -1e9) > 10.0:
            self._last_log[site] = now
            log.exception("meridian hook: %s failed; falling back to stock vLLM behaviour", site)

    def start_listener(self) -> str | None:
        """Opens the policy channel in this process (the engine core). A hook marked
        disabled (``_native.set_disabled``) answers the hello with policy ``disabled`` and
        cannot end thinking, whenever its listener was opened."""
        h = self.config.hook
        if not os.environ.get(h.token_env):
            log.warning(
                "meridian hook: %s is not set; the policy channel stays closed and the hook "
                "runs on meridian.toml alone",
                h.token_env,
            )
            return None
        # The scheduler reports later whether this engine can end thinking (it knows the
        # delimiters, the logits processor and the parallel layout); until then: no.
        addr = _native.start_listener(h.listen, h.token_env, h.policy, h.entropy, False)
        log.info("meridian hook: policy channel listening on %s", addr)
        return addr

    def can_end_thinking(self, vllm_config: Any, markers_known: bool) -> bool:
        """Whether directives to end thinking can take effect here: the delimiter is
        known, the Meridian logits processor is configured, and a single rank samples
        (with tensor parallelism every rank samples itself and would see a directive at
        a different step, so directives are ignored there; budgets still apply)."""
        mc = getattr(vllm_config, "model_config", None)
        procs = [str(p) for p in (getattr(mc, "logits_processors", None) or [])]
        configured = any("meridian_hook.logits" in p for p in procs)
        pc = getattr(vllm_config, "parallel_config", None)
        single_rank = int(getattr(pc, "tensor_parallel_size", 1) or 1) == 1
        return markers_known and configured and single_rank

    def start_follower(self) -> bool:
        """Follows the engine core's channel from a worker process."""
        h = self.config.hook
        if not os.environ.get(h.token_env):
            return False
        return _native.start_follower(h.listen, h.token_env, f"worker-{os.getpid()}")


def runtime() -> HookRuntime:
    """The process's hook runtime, created from ``MERIDIAN_HOOK_CONFIG`` on first use.
    A config error raises ``ValueError`` here, at start-up, never mid-request."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = HookRuntime(load_from_env())
        return _runtime
