"""What the hook benchmark's parts share: its sizes and targets, and percentile
spreads."""

from __future__ import annotations

from dataclasses import dataclass

TARGET_US = 100.0  # per step at 256 running requests: <1% of a 10 ms GPU decode step
TARGET_AT = 256
GPU_STEP_MS = 10.0
PROMPT_LEN = 32
WARMUP_STEPS = 24
THINK_TOKEN, ANSWER_TOKEN = 7, 9
MAX_MODEL_LEN = 4096  # meridian_hook.testing builds the engines with it
VOCAB = 151_936  # Qwen3's: the logits tensor the processor receives



def pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Spread:
    p10: float
    p50: float
    p90: float

    @classmethod
    def of(cls, xs: list[float]) -> "Spread":
        return cls(pct(xs, 0.1), pct(xs, 0.5), pct(xs, 0.9))
