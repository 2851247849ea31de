"""Two clients that send the same `X-Request-Id` share vLLM's request id up to the
suffix vLLM appends; the hook must still tell their streams apart. The proxy mints a
stream id for each (`vllm_xargs.meridian_request_id`) and names it in its directives, so
a directive for one stream reaches that stream alone, in the scheduler and in the
logits processor, and a directive naming the shared client id reaches neither."""

from __future__ import annotations

import json

import torch
from meridian_hook.testing import THINK_START, build
from test_logits import PROMPT as LOGITS_PROMPT
from test_logits import VOCAB, forced_rows, params, v1_processor
from vllm.v1.sample.logits_processor.interface import BatchUpdate

from meridian_hook import _native
from meridian_hook.scheduler import MeridianScheduler

PROMPT = [1] * 20 + [THINK_START]

# vLLM's ids for two requests whose clients both sent `X-Request-Id: shared`.
FIRST, SECOND = "chatcmpl-shared-0a1b2c3d", "chatcmpl-shared-9f8e7d6c"
STREAM_FIRST, STREAM_SECOND = "mrd_5e1f00c0ffee_1", "mrd_5e1f00c0ffee_2"


def priority_engine(tmp_path, monkeypatch):
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "priority"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    e = build(MeridianScheduler, num_blocks=64)
    for rid, stream, arrival in [(FIRST, STREAM_FIRST, 1.0), (SECOND, STREAM_SECOND, 2.0)]:
        req = e.add(rid, PROMPT, arrival=arrival)
        req.sampling_params.extra_args = {"meridian_request_id": stream}
    e.step({})
    return e


def running(e) -> list[str]:
    return [r.request_id for r in e.scheduler.running]


def test_a_priority_for_one_stream_moves_that_stream_alone(tmp_path, monkeypatch):
    e = priority_engine(tmp_path, monkeypatch)
    assert running(e) == [FIRST, SECOND]
    try:
        _native.apply_directive(json.dumps({"request_id": STREAM_SECOND, "action": "priority", "priority": -10}))
        e.step({})
        e.step({})
        assert running(e) == [SECOND, FIRST], "the second stream, and only it, runs first"
    finally:
        _native.apply_directive(json.dumps({"request_id": STREAM_SECOND, "action": "forget"}))


def test_a_directive_naming_the_shared_client_id_reaches_neither_stream(tmp_path, monkeypatch):
    e = priority_engine(tmp_path, monkeypatch)
    try:
        # The first stream is raised a little; were the directive for the client id to
        # reach the second stream too, it would raise that one further, ahead of the first.
        _native.apply_directive(json.dumps({"request_id": "shared", "action": "priority", "priority": -10}))
        _native.apply_directive(json.dumps({"request_id": STREAM_FIRST, "action": "priority", "priority": -5}))
        e.step({})
        e.step({})
        assert running(e) == [FIRST, SECOND]
        for rid in ("shared", STREAM_FIRST):
            _native.apply_directive(json.dumps({"request_id": rid, "action": "forget"}))
        # vLLM's own full id still names one request exactly.
        _native.apply_directive(json.dumps({"request_id": SECOND, "action": "priority", "priority": -10}))
        e.step({})
        assert running(e) == [SECOND, FIRST]
    finally:
        for rid in ("shared", STREAM_FIRST, SECOND):
            _native.apply_directive(json.dumps({"request_id": rid, "action": "forget"}))


def test_ending_one_streams_thinking_leaves_the_other_thinking():
    lp = v1_processor()
    first: list[int] = [5]
    second: list[int] = [5]
    lp.update_state(
        BatchUpdate(
            batch_size=2,
            removed=[],
            added=[
                (0, params(meridian_request_id=STREAM_FIRST), LOGITS_PROMPT, first),
                (1, params(meridian_request_id=STREAM_SECOND), LOGITS_PROMPT, second),
            ],
            moved=[],
        )
    )
    assert forced_rows(lp.apply(torch.zeros(2, VOCAB))) == {}
    try:
        _native.apply_directive(json.dumps({"request_id": "shared", "action": "end_thinking"}))
        first.append(5)
        second.append(5)
        assert forced_rows(lp.apply(torch.zeros(2, VOCAB))) == {}, "the client's id names no stream"
        _native.apply_directive(json.dumps({"request_id": STREAM_SECOND, "action": "end_thinking"}))
        first.append(5)
        second.append(5)
        forced = forced_rows(lp.apply(torch.zeros(2, VOCAB)))
        assert list(forced) == [1], f"only the second stream is told to stop thinking: {forced}"
    finally:
        for rid in ("shared", STREAM_SECOND):
            _native.apply_directive(json.dumps({"request_id": rid, "action": "forget"}))
