"""The official `openai` Python client, pointed at the proxy, sees the reasoning and the
answer exactly as the upstream sent them."""

import json

import openai
import pytest
import requests

from conftest import FIXTURES, metric, start_proxy, wait_ready


def upstream_deltas(fixture: str):
    """(reasoning, content) as the recorded upstream stream carries them."""
    reasoning, content = [], []
    for line in (FIXTURES / f"{fixture}.sse").read_text().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning.append(delta.get("reasoning") or delta.get("reasoning_content") or "")
            content.append(delta.get("content") or "")
    return reasoning, content


def client_for(proxy, fixture: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="not-needed",
        default_headers={"x-mock-fixture": fixture},
        max_retries=0,
    )


@pytest.mark.parametrize("fixture,field", [("qwen3-reasoning", "reasoning"), ("qwen3-reasoning-content", "reasoning_content")])
def test_streaming_chat_reasoning_and_answer_arrive_unchanged(proxy, fixture, field):
    client = client_for(proxy, fixture)
    stream = client.chat.completions.create(
        model="Qwen/Qwen3-8B",
        messages=[{"role": "user", "content": "What is two plus two?"}],
        stream=True,
    )
    got_reasoning, got_content = [], []
    for chunk in stream:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            got_reasoning.append(extra.get(field) or "")
            got_content.append(choice.delta.content or "")
    want_reasoning, want_content = upstream_deltas(fixture)
    assert got_reasoning == want_reasoning
    assert got_content == want_content
    assert "".join(got_reasoning) and "".join(got_content).strip()


def test_stream_with_usage_reports_reasoning_tokens(proxy):
    client = client_for(proxy, "qwen3-reasoning-usage")
    stream = client.chat.completions.create(
        model="Qwen/Qwen3-8B",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage for c in stream if c.usage is not None]
    assert usage[-1].completion_tokens == 32
    assert usage[-1].completion_tokens_details.reasoning_tokens == 9


def test_non_streaming_chat(proxy):
    client = client_for(proxy, "qwen3-reasoning")
    resp = client.chat.completions.create(
        model="Qwen/Qwen3-8B", messages=[{"role": "user", "content": "hi"}]
    )
    want_reasoning, want_content = upstream_deltas("qwen3-reasoning")
    assert resp.choices[0].message.content == "".join(want_content)
    assert resp.choices[0].message.model_extra["reasoning"] == "".join(want_reasoning)


def test_bad_request_raises_the_usual_exception(proxy):
    client = client_for(proxy, "qwen3-reasoning")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="", messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["code"] == "invalid_model"


def test_upstream_death_raises_in_the_client(proxy):
    client = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="x",
        default_headers={"x-mock-fixture": "qwen3-reasoning", "x-mock-die-after-bytes": "1200"},
        max_retries=0,
    )
    stream = client.chat.completions.create(
        model="Qwen/Qwen3-8B", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass


def test_models_listing_and_metrics(proxy):
    client = client_for(proxy, "qwen3-reasoning")
    assert [m.id for m in client.models.list()] == ["Qwen/Qwen3-8B"]
    text = requests.get(f"{proxy.url}/metrics", timeout=5).text
    assert metric(text, "meridian_think_to_output_gap_seconds_count", family="qwen3") >= 1


@pytest.fixture(scope="module")
def beating_proxy(mock_upstream):
    """A proxy that sends heartbeats after 0.2 s of silence."""
    p = start_proxy(mock_upstream.url, ["--set", "server.sse_heartbeat_s=0.2"])
    wait_ready(p.url)
    yield p
    p.stop()


def test_heartbeats_and_early_headers_are_invisible_to_the_client(beating_proxy):
    """A slow prefill (early headers, heartbeats) and pauses between events: the client
    gets the same deltas as from a stream without them."""
    client = openai.OpenAI(
        base_url=f"{beating_proxy.url}/v1",
        api_key="x",
        default_headers={"x-mock-fixture": "qwen3-reasoning", "x-mock-first-byte-ms": "700",
                         "x-mock-split": "900,2500", "x-mock-interval-ms": "500"},
        max_retries=0,
    )
    raw = client.chat.completions.with_raw_response.create(
        model="Qwen/Qwen3-8B", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    got_reasoning, got_content = [], []
    for chunk in raw.parse():
        for choice in chunk.choices:
            got_reasoning.append((choice.delta.model_extra or {}).get("reasoning") or "")
            got_content.append(choice.delta.content or "")
    assert (got_reasoning, got_content) == upstream_deltas("qwen3-reasoning")
    assert raw.headers["x-meridian-stream-id"].startswith("mrd_")


def test_a_failure_after_early_headers_raises_in_the_client(beating_proxy):
    client = openai.OpenAI(
        base_url=f"{beating_proxy.url}/v1",
        api_key="x",
        default_headers={"x-mock-first-byte-ms": "600", "x-mock-status": "400"},
        max_retries=0,
    )
    stream = client.chat.completions.create(
        model="Qwen/Qwen3-8B", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    with pytest.raises(openai.APIError) as err:
        for _ in stream:
            pass
    assert "mock error status" in str(err.value)
