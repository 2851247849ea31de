"""The workspace's binaries tests run (the proxy, the mock upstream, the twin, the load
tester), from the build `scripts/test.sh` makes (`MERIDIAN_BIN_DIR`, else target/debug)."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("MERIDIAN_BIN_DIR", ROOT / "target" / "debug"))


def binary(name: str) -> Path:
    path = BIN_DIR / name
    if not path.exists():
        pytest.fail(f"{path} is missing: build the workspace first (scripts/test.sh does)")
    return path
