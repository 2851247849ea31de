"""vLLM general plugin (entry point ``vllm.general_plugins: meridian``). vLLM loads it
in every process it starts. In the engine-core process it first holds the running vLLM to
the range the hook supports, so an unsupported release is named as the plugin loads,
before a model is read; then it opens the policy channel the Meridian proxy drives, so
directives arrive before the first request is scheduled."""

from __future__ import annotations

import logging

log = logging.getLogger("meridian_hook")


def register() -> None:
    try:
        from meridian_hook.runtime import in_engine_core, runtime  # noqa: PLC0415

        if not in_engine_core():
            return
        rt = runtime()
    except Exception:  # noqa: BLE001 - a plugin must not stop vLLM from starting
        log.exception("meridian hook: plugin start-up failed; vLLM runs without the policy channel")
        return
    # Under hook.on_unsupported_vllm = "refuse" (the default) this raises UnsupportedVllm,
    # naming each problem, and that must stop the engine: it is the one error let through.
    # Under "disable" it logs them and marks the hook disabled, which the channel's hello
    # then tells the proxy. The scheduler checks vLLM's internals again once it is built.
    rt.vllm_supported()
    try:
        rt.start_listener()
    except Exception:  # noqa: BLE001 - as above: the engine runs, without the channel
        log.exception("meridian hook: plugin start-up failed; vLLM runs without the policy channel")
