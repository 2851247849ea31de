"""Process-level rig for the Python tests: the real `meridian` binary in front of the
mock upstream binary (recorded vLLM streams) or a real vLLM server."""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import requests
from binaries import binary

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "mock-upstream" / "fixtures"


class Process:
    """A child process whose first `listening on URL` line gives its address."""

    def __init__(self, args, env=None, name="process"):
        self.name = name
        self.proc = subprocess.Popen(
            [str(a) for a in args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines = []
        deadline = time.time() + 30
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                return
        self.stop()
        raise RuntimeError(f"{name} did not start:\n{''.join(self.lines)}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_proxy(upstream_url: str, extra_args=()) -> Process:
    return Process(
        [binary("meridian"), "serve", "--listen", "127.0.0.1:0", "--upstream", upstream_url,
         "--set", "upstream.health_interval_s=0.5", *extra_args],
        env={"MERIDIAN_LOG_LEVEL": "warn"},
        name="meridian",
    )


def wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if requests.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} never became ready")


@pytest.fixture(scope="module")
def mock_upstream():
    p = Process([binary("meridian-mock-upstream"), "--model", "Qwen/Qwen3-8B"], name="mock upstream")
    yield p
    p.stop()


@pytest.fixture(scope="module")
def proxy(mock_upstream):
    p = start_proxy(mock_upstream.url)
    wait_ready(p.url)
    yield p
    p.stop()


def metric(text: str, name: str, **labels) -> float | None:
    """One sample from Prometheus text."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric_name, _, rest = series.partition("{")
        if metric_name != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            return float(value)
    return None


def stream_labels(stream):
    """Reads an `openai` chat stream: the phase of each token-carrying delta ('R' for
    reasoning, 'C' for visible content) and the final usage object."""
    labels, usage = [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if (choice.delta.model_extra or {}).get("reasoning"):
                labels.append("R")
            elif (choice.delta.content or "").strip():
                labels.append("C")
    return labels, usage




def count_tokens(stream):
    """Reads an `openai` chat stream asked with `logprobs`, which count tokens exactly even
    where a delta's text holds several: tokens per phase ('R' reasoning, 'C' content), the
    phase of each token-carrying delta in order, the response ids, the role chunks, and the
    last usage. A token that completes no character yet carries no text: it belongs to the
    phase of the text around it."""
    tokens, order, ids, roles, usage = {"R": 0, "C": 0}, [], set(), 0, None
    for chunk in stream:
        ids.add(chunk.id)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            roles += choice.delta.role is not None
            n = len(choice.logprobs.content) if choice.logprobs and choice.logprobs.content else 0
            if (choice.delta.model_extra or {}).get("reasoning"):
                label = "R"
            elif choice.delta.content:
                label = "C"
            else:
                label = order[-1] if order else "R"
            if n:
                tokens[label] += n
                order.append(label)
    return tokens, order, ids, roles, usage
