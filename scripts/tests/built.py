"""The workspace build these harness tests run the twin from: `MERIDIAN_BIN_DIR` (set by
scripts/test.sh), else the debug build. The harnesses themselves run release builds
(`target/release`, built by their own scripts)."""

import os
from pathlib import Path

import pytest


def built(name: str) -> Path:
    """The built binary `name`; a test fails, naming the build to make, when it is missing."""
    where = os.environ.get("MERIDIAN_BIN_DIR") or Path(__file__).resolve().parents[2] / "target" / "debug"
    exe = Path(where) / name
    if not exe.is_file():
        pytest.fail(f"{exe} was not built: run `cargo build --workspace --bins` (scripts/test.sh does)")
    return exe
