"""vLLM general plugin (entry point ``vllm.general_plugins: meridian``). vLLM loads it
in every process it starts; in the engine-core process it opens the policy channel the
Meridian proxy drives, so directives arrive before the first request is scheduled."""

from __future__ import annotations

import logging

log = logging.getLogger("meridian_hook")


def register() -> None:
    try:
        from meridian_hook.runtime import in_engine_core, runtime  # noqa: PLC0415

        if in_engine_core():
            runtime().start_listener()
    except Exception:  # noqa: BLE001 - a plugin must not stop vLLM from starting
        log.exception("meridian hook: plugin start-up failed; vLLM runs without the policy channel")
