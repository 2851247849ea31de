"""Where the measurement and its page live (no imports beyond the standard library's
oldest, so `measure` runs on any Python the GPU machine has)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs/src/benchmarks/gpu-step-curve"
PAGE = ROOT / "docs/src/benchmarks/gpu-step-curve.md"
SYNC_PAGE = ROOT / "docs/src/benchmarks/hook-gpu-sync.md"
