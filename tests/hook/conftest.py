"""Tests of the vLLM hook inside vLLM's own classes. They run in the Python environment
that has vLLM and the hook installed (scripts/test.sh: the cached vLLM CPU venv)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("vllm", reason="needs vLLM (scripts/install-vllm-cpu.sh) in this environment")
pytest.importorskip("meridian_hook", reason="needs the hook installed (scripts/install-hook.sh)")


def metric(name_with_labels: str) -> float:
    """A sample of the hook's metrics in this process."""
    from meridian_hook import _native

    for line in _native.render_metrics().splitlines():
        if line.startswith(name_with_labels + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name_with_labels} not exported")


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch: pytest.MonkeyPatch):
    """Each test loads its own config (the runtime is a per-process singleton)."""
    import meridian_hook.runtime as rt

    monkeypatch.setattr(rt, "_runtime", None)
    monkeypatch.delenv("MERIDIAN_HOOK_TOKEN", raising=False)
    yield
    from meridian_hook import _native

    _native.stop_channel()
    _native.set_disabled(False)


def tier(name: str) -> str:
    assert re.fullmatch(r"[a-z-]+", name)
    return f'meridian_hook_preemptions_total{{tier="{name}"}}'


@pytest.fixture
def output_first(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """The hook under output-first, whose limits these tests are about (the default,
    slo-driven, applies them only while steps are slower than its target, ADR 0010)."""
    cfg = tmp_path / "output-first.toml"
    cfg.write_text('[hook]\npolicy = "output-first"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
