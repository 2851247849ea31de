"""The engine twin, embedded in `meridian serve --twin` (asked for explicitly: its answers
are simulated), parsed by the official `openai` client through the proxy."""

import openai
import pytest
import requests

from conftest import Process, binary, metric, stream_labels, wait_ready


@pytest.fixture(scope="module")
def proxy_on_twin():
    p = Process(
        [binary("meridian"), "serve", "--twin", "--listen", "127.0.0.1:0", "--set", "twin.speed=50"],
        env={"MERIDIAN_LOG_LEVEL": "warn"},
        name="meridian with the twin",
    )
    wait_ready(p.url)
    yield p
    p.stop()


def test_openai_client_parses_the_twin_stream(proxy_on_twin):
    client = openai.OpenAI(base_url=f"{proxy_on_twin.url}/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="Qwen/Qwen3-8B",
        messages=[{"role": "user", "content": "What is two plus two?"}],
        stream=True,
        max_tokens=12,
        stream_options={"include_usage": True},
        extra_body={"thinking_token_budget": 4},
    )
    labels, usage = stream_labels(stream)
    # 12 tokens: 4 thinking, the end-of-thought delimiter (which no delta shows, as on
    # vLLM), 7 answering.
    assert labels == ["R"] * 4 + ["C"] * 7
    assert usage.completion_tokens == 12
    assert usage.completion_tokens_details.reasoning_tokens == 4
    text = requests.get(f"{proxy_on_twin.url}/metrics", timeout=5).text
    assert metric(text, "meridian_think_to_output_gap_seconds_count", family="qwen3") == 1


def test_models_come_from_the_twin(proxy_on_twin):
    client = openai.OpenAI(base_url=f"{proxy_on_twin.url}/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list()] == ["Qwen/Qwen3-8B"]


def test_the_openai_client_sees_that_answers_are_simulated(proxy_on_twin):
    client = openai.OpenAI(base_url=f"{proxy_on_twin.url}/v1", api_key="x", max_retries=0)
    ask = dict(model="Qwen/Qwen3-8B", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    raw = client.chat.completions.with_raw_response.create(**ask)
    assert raw.headers["x-meridian-simulated"] == "meridian-twin/h100-qwen3-8b"
    assert raw.parse().system_fingerprint == "meridian-twin/h100-qwen3-8b"
    chunks = list(client.chat.completions.create(**ask, stream=True))
    assert chunks and {c.system_fingerprint for c in chunks} == {"meridian-twin/h100-qwen3-8b"}
