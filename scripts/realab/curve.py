"""The step-time curve of an engine: how long one step takes as the tokens in it grow.

Two probes, on an otherwise idle engine whose scheduler records every step
(meridian_hook.steptrace): prompts of known lengths sent one at a time (steps that only
prefill, chunked at max_num_batched_tokens), and k requests decoding together (steps of
k one-token decodes). Prompts are token ids sent to /v1/completions, so their lengths
are exact. The curve is read back from the step trace, not from client timings
(`meridian-sim calibrate --steps ... --curve-window`)."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import requests

PREFILL_LENGTHS = [16, 64, 128, 256, 512, 1024, 2048]
DECODE_BATCHES = [1, 2, 4, 8, 16, 32]


def _complete(url: str, model: str, ids: list[int], max_tokens: int) -> None:
    r = requests.post(f"{url}/v1/completions", timeout=600, json={
        "model": model, "prompt": ids, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0})
    r.raise_for_status()


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    # Ids 3.. avoid the special tokens at the bottom of the tiny tokenizers' vocabularies.
    return [rng.randrange(3, vocab - 2) for _ in range(n)]


def probe(url: str, model: str, vocab: int, max_batched: int, seed: int = 0) -> None:
    """Drives the probes; the engine's step trace records what they cost."""
    rng = random.Random(seed)
    for n in PREFILL_LENGTHS:
        if n > max_batched:
            continue
        for _ in range(3):
            _complete(url, model, _ids(rng, n, vocab), 1)
    for k in DECODE_BATCHES:
        threads = [threading.Thread(target=_complete, args=(url, model, _ids(rng, 32, vocab), 48))
                   for _ in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def read_steps(trace: Path) -> list[dict]:
    if not trace.exists():
        return []
    return [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
