"""The hook on a vLLM it was not built for: it checks the running vLLM against the range
its package declares and looks for every internal it uses, and then refuses to start
with an error naming each problem, or, configured to, runs as stock vLLM and says so on
its metrics and to the proxy. A vLLM upgrade must never quietly turn the hook off."""

from __future__ import annotations

import json
import tomllib
import urllib.request
from pathlib import Path

import pytest
from conftest import metric
from meridian_hook.testing import THINK_END, THINK_START, build
from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue
from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from meridian_hook import PROTOCOL_VERSION, vllm_adapter
from meridian_hook.logits import MeridianLogitsProcessor
from meridian_hook.scheduler import MeridianScheduler

PYPROJECT = Path(__file__).resolve().parents[2] / "vllm-hook" / "pyproject.toml"
PROMPT = [1] * 20 + [THINK_START]


def declared_range() -> str:
    extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["vllm"]
    (req,) = extra
    return req.removeprefix("vllm")


def test_the_installed_hook_supports_the_vllm_it_is_tested_on():
    supported = vllm_adapter.supported_range()
    assert supported is not None, "the installed package's metadata carries the range"
    assert sorted(supported.split(",")) == sorted(declared_range().split(",")), "one declaration: pyproject's extra"
    assert vllm_adapter.version_problem(vllm_adapter.vllm_version(), supported) is None
    e = build(MeridianScheduler, num_blocks=64)
    assert vllm_adapter.scheduler_problems(e.scheduler, AsyncScheduler) == []
    assert vllm_adapter.v2_problems() == [], "Model Runner V2's processor interface has what the hook reads"
    assert e.scheduler._meridian is not None, "the hook acts"
    assert metric("meridian_hook_disabled") == 0


@pytest.mark.parametrize(
    ("version", "verdict"),
    [
        ("0.32.0", None),
        ("0.32.0+cpu", None),
        ("0.32.4.dev12+g1234abc", None),
        ("0.33.0", "vLLM 0.33.0 is outside the range the hook supports (>=0.32,<0.33)"),
        ("0.31.9", "vLLM 0.31.9 is outside the range the hook supports (>=0.32,<0.33)"),
        ("nightly", "vLLM 'nightly' is not a version the hook can compare"),
    ],
)
def test_versions_are_judged_by_the_declared_range(version, verdict):
    found = vllm_adapter.version_problem(version, ">=0.32,<0.33")
    if verdict is None:
        assert found is None
    else:
        assert found is not None and found.startswith(verdict), found
    missing = vllm_adapter.version_problem("0.32.0", None)
    assert missing is not None and "metadata is missing" in missing


def test_an_engine_outside_the_range_refuses_to_start(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(vllm_adapter, "vllm_version", lambda: "0.40.1")
    with pytest.raises(vllm_adapter.UnsupportedVllm) as refused:
        build(MeridianScheduler, num_blocks=64)
    message = str(refused.value)
    assert "vLLM 0.40.1 is outside the range the hook supports" in message
    assert 'hook.on_unsupported_vllm = "disable"' in message, "the error says how to run anyway"


def test_a_missing_internal_is_named(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delattr(FreeKVCacheBlockQueue, "prepend_n")
    with pytest.raises(vllm_adapter.UnsupportedVllm, match=r"FreeKVCacheBlockQueue\.prepend_n\(\)"):
        build(MeridianScheduler, num_blocks=64)


def test_a_missing_model_runner_v2_field_refuses_the_engine_at_start(monkeypatch: pytest.MonkeyPatch):
    # Under Model Runner V2 (the GPU default) the logits processor reads the step's batch
    # layout; a release that renamed a field would fail every GPU step into a caught error
    # while the proxy believed the hook could end thinking. The engine core finds it first.
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext

    fields = {k: v for k, v in LogitsContext.__dataclass_fields__.items() if k != "seq_lens_upper_bound_np"}
    monkeypatch.setattr(LogitsContext, "__dataclass_fields__", fields)
    with pytest.raises(vllm_adapter.UnsupportedVllm, match=r"LogitsContext\.seq_lens_upper_bound_np"):
        build(MeridianScheduler, num_blocks=64)


def test_a_v2_request_state_without_what_the_processor_reads_is_refused_or_disabled(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    from types import SimpleNamespace

    import numpy as np
    import torch
    from meridian_hook.testing import reasoning_config

    config = SimpleNamespace(reasoning_config=reasoning_config(), model_config=None)
    renamed = SimpleNamespace(
        prompt_len=SimpleNamespace(np=np.zeros(4, dtype=np.int32)),
        prefill_len=SimpleNamespace(host=np.zeros(4, dtype=np.int32)),  # `np` renamed
        all_token_ids=SimpleNamespace(gpu=torch.zeros(4, 16, dtype=torch.int32)),
    )
    with pytest.raises(vllm_adapter.UnsupportedVllm, match=r"LogitsProcRequestState\.prefill_len\.np"):
        MeridianLogitsProcessor(config, renamed)
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\non_unsupported_vllm = "disable"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    import meridian_hook.runtime as rt

    monkeypatch.setattr(rt, "_runtime", None)
    lp = MeridianLogitsProcessor(config, renamed)
    assert lp._ctl is None and not lp.add_request(0, None), "the processor stays out of the way"
    assert metric("meridian_hook_disabled") == 1


def test_an_override_vllm_no_longer_calls_is_named():
    # A vLLM whose scheduler still has the private methods but never calls one of them:
    # the hook's override would never run, which no error would show.
    live = build(MeridianScheduler, num_blocks=64).scheduler
    found = vllm_adapter.scheduler_problems(live, type("Stock", (), {
        "_preempt_request": lambda self: None,
        "_free_blocks": lambda self: None,
        "schedule": lambda self: self._preempt_request(),
    }))
    assert found == ["Stock._free_blocks() is no longer called by vLLM's scheduler (the hook's override would never run)"]
    assert vllm_adapter.scheduler_problems(live, AsyncScheduler) == [], "vLLM's own scheduler calls both"


def test_disabled_on_an_unsupported_vllm_it_runs_stock_and_says_so(tmp_path, monkeypatch: pytest.MonkeyPatch):
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "output-first"\nlisten = "127.0.0.1:0"\non_unsupported_vllm = "disable"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    monkeypatch.setenv("MERIDIAN_HOOK_TOKEN", "adapter-test-secret")
    monkeypatch.setattr(vllm_adapter, "vllm_version", lambda: "0.40.1")
    e = build(MeridianScheduler, num_blocks=64)
    assert e.scheduler._meridian is None, "the hook does not act"
    # Stock vLLM's order: the answering request stays behind the earlier thinker.
    e.add("thinker", PROMPT, arrival=1.0)
    e.add("answerer", PROMPT, arrival=2.0)
    e.step({"answerer": THINK_END})
    e.step({})
    assert [r.request_id for r in e.scheduler.running] == ["thinker", "answerer"]
    assert metric("meridian_hook_disabled") == 1
    # The logits processor in the same engine stays out of the way too.
    assert MeridianLogitsProcessor(e.scheduler.vllm_config, "cpu", False)._ctl is None
    # The proxy's hello hears it: policy "disabled", cannot end thinking.
    from meridian_hook import _native

    assert _native.channel_role() == "listener"
    hello = json.loads(urllib.request.urlopen(urllib.request.Request(
        f"http://{listener_address()}/meridian/v1/hello",
        headers={"Authorization": "Bearer adapter-test-secret", "meridian-protocol": str(PROTOCOL_VERSION)},
    ), timeout=5).read())
    assert hello["policy"] == "disabled" and hello["can_end_thinking"] is False


def listener_address() -> str:
    """The address this process's listener bound (the config asked for port 0)."""
    from meridian_hook.runtime import runtime

    return runtime().start_listener()  # idempotent: returns the bound address


def test_the_plugin_holds_vllm_to_the_range_as_it_loads(tmp_path, monkeypatch: pytest.MonkeyPatch):
    import meridian_hook.runtime as rt
    from meridian_hook import plugin

    monkeypatch.delenv("MERIDIAN_HOOK_CONFIG", raising=False)
    monkeypatch.setattr(vllm_adapter, "vllm_version", lambda: "0.40.1")
    monkeypatch.setattr(rt, "in_engine_core", lambda: False)
    plugin.register()  # the API server and the workers: nothing to check or open there
    monkeypatch.setattr(rt, "in_engine_core", lambda: True)
    with pytest.raises(vllm_adapter.UnsupportedVllm, match="vLLM 0.40.1 is outside the range"):
        plugin.register()  # refused by default, before any scheduler or model exists
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\nlisten = "127.0.0.1:0"\non_unsupported_vllm = "disable"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    monkeypatch.setattr(rt, "_runtime", None)
    plugin.register()
    assert metric("meridian_hook_disabled") == 1, "disabled and said so, the engine starting as stock vLLM"


def test_refusal_is_the_default(tmp_path):
    from meridian_hook.config import load_config

    assert load_config(None).hook.on_unsupported_vllm == "refuse"
    bad = tmp_path / "meridian.toml"
    bad.write_text('[hook]\non_unsupported_vllm = "ignore"\n')
    with pytest.raises(ValueError, match="on_unsupported_vllm"):
        load_config(bad)


def test_the_oldest_waiting_start_passes_over_preempted_requests():
    """vLLM puts preempted requests at its waiting queue's front and new ones at its back:
    the oldest request still waiting to start is the first that generated nothing."""
    from types import SimpleNamespace

    def queue(*requests):
        return SimpleNamespace(waiting=[SimpleNamespace(num_output_tokens=n, arrival_time=t) for n, t in requests])

    assert vllm_adapter.oldest_waiting_start(queue()) is None
    assert vllm_adapter.oldest_waiting_start(queue((0, 5.0), (0, 6.0))) == 5.0
    assert vllm_adapter.oldest_waiting_start(queue((12, 1.0), (3, 2.0), (0, 7.0))) == 7.0, "preempted ones started"
    only_preempted = queue(*[(4, float(i)) for i in range(vllm_adapter.WAITING_LOOK_AHEAD + 2)])
    assert vllm_adapter.oldest_waiting_start(only_preempted) is None
