"""`meridian.toml` as the hook reads it: the same strict loader as the proxy (unknown
fields and bad values are errors naming the dotted field), and the same
``MERIDIAN_SECTION__FIELD`` environment overrides."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from meridian_hook import _native

#: Environment variable naming the config file the hook loads inside vLLM.
CONFIG_ENV = "MERIDIAN_HOOK_CONFIG"


@dataclass(frozen=True)
class HookSettings:
    listen: str
    token_env: str
    policy: str
    entropy: bool
    timeout_s: float
    #: What the hook does on a vLLM it does not support: "refuse" to start, or "disable"
    #: itself and run as stock vLLM.
    on_unsupported_vllm: str = "refuse"


@dataclass(frozen=True)
class ExitSettings:
    signal: str
    min_think_tokens: int
    rpdi_window: int
    rpdi_lambda: float
    eat_alpha: float
    eat_delta: float
    eat_warmup_steps: int
    eat_probe_every_tokens: int


@dataclass(frozen=True)
class MeridianConfig:
    hook: HookSettings
    exit: ExitSettings
    think_budget_tokens: int | None = None
    budget_per_family: dict[str, int] = field(default_factory=dict)

    def budget_for(self, family: str | None) -> int | None:
        if family is not None and family in self.budget_per_family:
            return self.budget_per_family[family]
        return self.think_budget_tokens


def load_config(path: str | os.PathLike[str] | None = None) -> MeridianConfig:
    """Loads and validates a ``meridian.toml``; ``None`` gives the defaults.

    Raises ``ValueError`` naming the dotted field of every problem, e.g.
    ``exit.eat_alpha must be in (0, 1]; got 2``.
    """
    raw = _native.load_config(None if path is None else os.fspath(path))
    budget = raw["budget"]
    return MeridianConfig(
        hook=HookSettings(**raw["hook"]),
        exit=ExitSettings(**raw["exit"]),
        think_budget_tokens=budget["think_tokens"],
        budget_per_family=dict(budget["per_family"]),
    )


def load_from_env() -> MeridianConfig:
    """The config named by ``MERIDIAN_HOOK_CONFIG``, or the defaults when it is unset."""
    return load_config(os.environ.get(CONFIG_ENV) or None)
