"""Meridian's in-engine hook for vLLM.

Switch it on with vLLM's own flags (no fork):

    --scheduler-cls meridian_hook.scheduler.MeridianScheduler
    --logits-processors meridian_hook.logits:MeridianLogitsProcessor

and point ``MERIDIAN_HOOK_CONFIG`` at a ``meridian.toml`` (its ``[hook]`` and ``[exit]``
sections). The ``vllm.general_plugins`` entry point opens the policy channel the Meridian
proxy drives. Importing this package does not import vLLM or torch.
"""

from meridian_hook._native import PROTOCOL_VERSION, __version__
from meridian_hook.config import ExitSettings, HookSettings, MeridianConfig, load_config
from meridian_hook.probe import EntropyProbe, EntropySignal, KernelUnavailable

__all__ = [
    "PROTOCOL_VERSION",
    "__version__",
    "EntropyProbe",
    "EntropySignal",
    "ExitSettings",
    "HookSettings",
    "KernelUnavailable",
    "MeridianConfig",
    "load_config",
]
