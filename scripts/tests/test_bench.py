"""`scripts/bench`: every benchmark by name, its page and its prerequisites, run as a user
runs it (a subprocess; nothing imported from scripts/)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "scripts" / "bench"


def bench(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=120)


def listed() -> dict[str, tuple[str, str]]:
    """{name: (its page, its needs)} from the listing."""
    out = bench().stdout
    found = re.findall(r"^scripts/bench (\S+).*\n    .*\n    writes docs/src/benchmarks/(\S+);.*\n    needs: (.*)$",
                       out, re.M)
    return {name: (page, needs) for name, page, needs in found}


def test_every_benchmark_script_is_listed_with_a_page_the_book_links():
    names = listed()
    scripts = {p.name.removeprefix("bench-").removesuffix(".sh") for p in (ROOT / "scripts").glob("bench-*.sh")}
    assert scripts <= set(names), f"benchmarks `scripts/bench` does not know: {sorted(scripts - set(names))}"
    summary = (ROOT / "docs" / "src" / "SUMMARY.md").read_text()
    for name, (page, _) in names.items():
        assert (ROOT / "docs" / "src" / "benchmarks" / page).is_file(), f"{name}: no page {page}"
        assert f"benchmarks/{page}" in summary, f"{name}: {page} is not in the book's summary"


def test_a_benchmark_this_machine_cannot_run_stops_before_it_starts_naming_what_is_missing(tmp_path):
    # No nvidia-smi on this PATH: every GPU benchmark says so and starts nothing.
    gpu = [name for name, (_, needs) in listed().items() if "NVIDIA GPU" in needs]
    assert gpu, "no GPU benchmark listed"
    for name in gpu:
        result = bench(name, env={"PATH": str(tmp_path)})
        assert result.returncode == 2, (name, result.stderr)
        assert f"bench {name}: needs an NVIDIA GPU" in result.stderr and "run on a GPU machine" in result.stderr


def test_check_says_when_everything_is_here_and_names_are_checked():
    result = bench("check", "dispatch")
    assert result.returncode == 0 and "every prerequisite is here" in result.stdout, result
    unknown = bench("no-such-bench")
    assert unknown.returncode != 0 and "no benchmark 'no-such-bench'" in unknown.stderr
    usage = bench("hook-steps", env={})
    assert usage.returncode != 0 and "usage: scripts/bench hook-steps LABEL" in usage.stderr
