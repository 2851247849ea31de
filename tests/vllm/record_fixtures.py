"""Records the mock upstream's fixtures from real vLLM servers.

Needs two vLLM servers on the tiny model (tests/vllm/make_tiny_model.py): one started
with `--reasoning-parser qwen3` and one without. The raw response bodies are written
byte for byte to mock-upstream/fixtures/. `logit_bias` on </think> makes the random model
leave its think block after a few tokens; `seed` makes the choice repeatable.

The Responses and Anthropic Messages routes are recorded from the parser server too
(`.sse` streamed, `.json` whole). Messages takes no `logit_bias` or `seed`, so its requests
are repeated until the random walk leaves the think block on its own.

Usage: python record_fixtures.py PARSER_URL PLAIN_URL MODEL_DIR OUT_DIR
"""

import json
import sys
import urllib.request
from pathlib import Path

PROMPT = [{"role": "user", "content": "What is two plus two?"}]


def post(url: str, body: dict) -> bytes:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.read()


def chat(base: str, end_id: int, seed: int, **extra) -> bytes:
    body = {
        "model": "tiny-qwen3",
        "messages": PROMPT,
        "stream": True,
        "max_tokens": 32,
        "seed": seed,
        "logit_bias": {str(end_id): 3.0},
        **extra,
    }
    return post(f"{base}/v1/chat/completions", body)


def switches_late(body: bytes, end_id: int, min_think: int = 5) -> bool:
    """True when the stream thinks for at least `min_think` tokens, then answers."""
    think = 0
    for line in body.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices") or []:
            delta = choice.get("delta") or choice
            text = delta.get("content") or delta.get("text") or ""
            if delta.get("reasoning"):
                think += 1
            elif "</think>" in text or end_id in (choice.get("token_ids") or []):
                return think >= min_think
            elif text.strip() and think and "reasoning" in line:
                continue
            elif text.strip():
                # Labelled content after labelled reasoning: the parser saw the end tag.
                if think >= min_think and '"reasoning"' in body.decode():
                    return True
                think += 1
    return False


def events(body: bytes) -> list[dict]:
    """The JSON payloads of an SSE body's `data:` lines."""
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]


def responses(base: str, end_id: int, seed: int, stream: bool) -> bytes:
    body = {
        "model": "tiny-qwen3",
        "input": "What is two plus two?",
        "stream": stream,
        "max_output_tokens": 24,
        "seed": seed,
        "logit_bias": {str(end_id): 3.0},
    }
    return post(f"{base}/v1/responses", body)


def responses_switch(body: bytes, min_think: int = 5) -> bool:
    kinds = [e.get("type") for e in events(body)]
    return kinds.count("response.reasoning_text.delta") >= min_think and "response.output_text.delta" in kinds


def messages(base: str, stream: bool) -> bytes:
    body = {
        "model": "tiny-qwen3",
        "max_tokens": 40,
        "messages": PROMPT,
        "stream": stream,
    }
    return post(f"{base}/v1/messages", body)


def messages_switch(body: bytes, min_think: int = 5) -> bool:
    if body.lstrip().startswith(b"{"):
        kinds = [block["type"] for block in json.loads(body)["content"]]
        return kinds == ["thinking", "text"]
    deltas = [e["delta"].get("type") for e in events(body) if e.get("type") == "content_block_delta"]
    return deltas.count("thinking_delta") >= min_think and "text_delta" in deltas


def record_new_routes(parser_url: str, end_id: int) -> dict[str, bytes]:
    """The Responses and Messages recordings, each the first that thinks, then answers."""
    found = {}
    for name, make, ok in [
        ("responses-reasoning.sse", lambda i: responses(parser_url, end_id, i, True), responses_switch),
        ("responses-reasoning.json", lambda i: responses(parser_url, end_id, i, False), responses_whole_switch),
        ("messages-thinking.sse", lambda i: messages(parser_url, True), messages_switch),
        ("messages-thinking.json", lambda i: messages(parser_url, False), messages_switch),
    ]:
        for attempt in range(1, 300):
            body = make(attempt)
            if ok(body):
                found[name] = body
                break
        else:
            raise SystemExit(f"{name}: no request produced a think -> output switch")
    return found


def responses_whole_switch(body: bytes) -> bool:
    kinds = [item["type"] for item in json.loads(body)["output"]]
    return kinds == ["reasoning", "message"]


def main() -> None:
    parser_url, plain_url, model_dir, out = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    end_id = json.loads((model_dir / "meridian-ids.json").read_text())["</think>"]
    out.mkdir(parents=True, exist_ok=True)
    def completion(seed: int) -> bytes:
        return post(
            f"{plain_url}/v1/completions",
            {
                "model": "tiny-qwen3",
                "prompt": "<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n<think>\n",
                "stream": True,
                "max_tokens": 32,
                "seed": seed,
                "logit_bias": {str(end_id): 3.0},
            },
        )

    makers = {
        "qwen3-reasoning": lambda seed: chat(parser_url, end_id, seed),
        "qwen3-reasoning-usage": lambda seed: chat(
            parser_url, end_id, seed, stream_options={"include_usage": True}, logprobs=True, top_logprobs=3
        ),
        "qwen3-inline-tags": lambda seed: chat(plain_url, end_id, seed),
        "qwen3-token-ids": lambda seed: chat(plain_url, end_id, seed, return_token_ids=True),
        "completions-inline-tags": completion,
    }
    recordings = {}
    for name, make in makers.items():
        # The first seed whose random walk leaves the think block after a few tokens.
        for seed in range(1, 100):
            body = make(seed)
            if switches_late(body, end_id):
                recordings[name] = body
                break
        else:
            raise SystemExit(f"{name}: no seed produced a think -> output switch")
    recordings = {f"{name}.sse": body for name, body in recordings.items()}
    recordings.update(record_new_routes(parser_url, end_id))
    for name, body in recordings.items():
        (out / name).write_bytes(body)
        print(f"{name}: {len(body)} bytes")


if __name__ == "__main__":
    main()
