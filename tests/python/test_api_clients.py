"""The Responses API through the official `openai` client and the Messages API through
the official `anthropic` client, pointed at the proxy in front of the mock upstream
replaying streams recorded from vLLM 0.32: each client parses what the proxy relays
exactly as it would the engine's own answer, and a stream that breaks reaches each
client in the form that client understands."""

import json

import anthropic
import openai
import pytest
import requests

from conftest import FIXTURES, metric

MODEL = "Qwen/Qwen3-8B"
PROMPT = "What is two plus two?"


def recorded_events(fixture: str) -> list[dict]:
    return [
        json.loads(line[6:])
        for line in (FIXTURES / f"{fixture}.sse").read_text().splitlines()
        if line.startswith("data: {")
    ]


def openai_client(proxy, **headers) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0, default_headers=headers)


def anthropic_client(proxy, **headers) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0, default_headers=headers)


def counted(proxy, route: str, outcome: str) -> float:
    return metric(requests.get(f"{proxy.url}/metrics", timeout=5).text, "meridian_requests_total",
                  route=route, outcome=outcome) or 0.0


def test_responses_stream_reaches_the_openai_client_event_for_event(proxy):
    before = counted(proxy, "responses", "ok")
    events = list(openai_client(proxy).responses.create(model=MODEL, input=PROMPT, stream=True))
    recorded = recorded_events("responses-reasoning")
    assert [e.type for e in events] == [e["type"] for e in recorded]
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    answer = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert reasoning and answer.strip()
    final = events[-1].response
    assert final.output_text == answer
    assert final.usage.output_tokens_details.reasoning_tokens == recorded[-1]["response"]["usage"][
        "output_tokens_details"]["reasoning_tokens"]
    assert counted(proxy, "responses", "ok") == before + 1


def test_whole_response_through_the_openai_client(proxy):
    resp = openai_client(proxy).responses.create(model=MODEL, input=PROMPT)
    whole = json.loads((FIXTURES / "responses-reasoning.json").read_text())
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    assert resp.output_text == whole["output"][1]["content"][0]["text"]
    assert resp.usage.output_tokens == whole["usage"]["output_tokens"]


def test_messages_stream_reaches_the_anthropic_client_block_for_block(proxy):
    before = counted(proxy, "messages", "ok")
    client = anthropic_client(proxy)
    with client.messages.stream(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": PROMPT}]) as s:
        message = s.get_final_message()
    recorded = recorded_events("messages-thinking")
    thinking = "".join(e["delta"].get("thinking", "") for e in recorded if e["type"] == "content_block_delta")
    text = "".join(e["delta"].get("text", "") for e in recorded if e["type"] == "content_block_delta")
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == thinking
    assert message.content[1].text == text
    assert message.usage.output_tokens == recorded[-2]["usage"]["output_tokens"]
    assert counted(proxy, "messages", "ok") == before + 1


def test_whole_message_through_the_anthropic_client(proxy):
    message = anthropic_client(proxy).messages.create(
        model=MODEL, max_tokens=40, messages=[{"role": "user", "content": PROMPT}]
    )
    whole = json.loads((FIXTURES / "messages-thinking.json").read_text())
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[1].text == whole["content"][1]["text"]


def test_a_broken_messages_stream_raises_in_the_anthropic_client(proxy):
    client = anthropic_client(proxy, **{"x-mock-die-after-bytes": "1500"})
    with pytest.raises(anthropic.APIError) as raised:
        with client.messages.stream(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": PROMPT}]) as s:
            for _ in s:
                pass
    assert "the stream broke off" in str(raised.value)


@pytest.mark.parametrize("die_after_bytes", ["3000", "0"])
def test_a_broken_responses_stream_ends_in_an_error_event(proxy, die_after_bytes):
    # An upstream that aborts its connection can take bytes it wrote but had not flushed
    # with it, so the stream may break before any event arrived ("0" makes that certain):
    # the client then gets the error event alone, numbered first.
    client = openai_client(proxy, **{"x-mock-die-after-bytes": die_after_bytes})
    events = list(client.responses.create(model=MODEL, input=PROMPT, stream=True))
    assert events[-1].type == "error"
    assert events[-1].code == "upstream_error"
    assert "the stream broke off" in events[-1].message
    assert not any(e.type == "response.completed" for e in events)
    # Numbered like every event of the API: the one after the last the upstream sent.
    before = events[-2].sequence_number if len(events) > 1 else -1
    assert events[-1].sequence_number == before + 1


def test_a_malformed_message_request_raises_the_usual_exception(proxy):
    with pytest.raises(anthropic.BadRequestError):
        anthropic_client(proxy).messages.create(
            model=MODEL, max_tokens=40, messages=[{"role": "user", "content": PROMPT}],
            extra_body={"thinking": "on"},
        )
