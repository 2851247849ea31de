"""The targets for long prompts and KV pressure at 90%: each configuration judged on the
largest answer gap, TTOT, TTFO and throughput by its interval, on the page (under the
load and in one table) and in the README's summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from realab import policies, stats as S, targets
from test_realab_policies import page_of, write_set


def test_the_page_judges_each_configuration_on_the_targets_under_its_load_and_in_one_table(tmp_path: Path):
    # Every request of a configuration takes `scale` times stock's, in every round.
    write_set(tmp_path / "1-set", {"stock": 1.0, "hook-output-first": 0.4, "hook-fcfs": 1.2})
    page = page_of(tmp_path)
    bullets = [line for line in page.splitlines() if "the targets for long prompts and KV pressure" in line]
    assert len(bullets) == 2, bullets
    fast = next(b for b in bullets if "hook-output-first" in b)
    slow = next(b for b in bullets if "hook-fcfs" in b)
    assert ": met**" in fast and fast.count(": met") == 5, fast
    assert ": missed**" in slow, slow
    for metric in ("largest answer gap", "TTOT", "TTFO"):
        # 90 requests counted a run: p95 is set by four, so the tail judged is p90.
        assert f"{metric} p90 1.20" in slow and f"{metric} p90 0.40" in fast
    assert "token throughput 0.833 (0.833-0.833): missed" in slow
    assert "| 0.833 (0.833-0.833): missed | **missed** |" in page
    assert "token throughput 2.500 (2.500-2.500): met" in fast
    table = [line for line in page.splitlines() if line.startswith("| 1 | long |")]
    assert [row.split("|")[3].strip() for row in table] == ["hook-output-first", "hook-fcfs"]
    assert table[0].endswith("| **met** |") and table[1].endswith("| **missed** |")


def test_the_readme_names_where_each_target_was_met_and_missed(tmp_path: Path):
    write_set(tmp_path / "1-set", {"stock": 1.0, "hook-output-first": 0.4, "hook-fcfs": 1.2})
    summary = policies.write(tmp_path, tmp_path / "page.md", resamples=200)
    line = next(x for x in summary if x.startswith("- Targets for long prompts"))
    assert "over 2 comparisons: all four met by `hook-output-first` (long, set 1);" in line
    assert "TTFO met by `hook-output-first` (long, set 1), missed by 1;" in line


def test_a_single_round_gives_no_verdict(tmp_path: Path):
    write_set(tmp_path / "1-set", {"stock": 1.0, "hook-output-first": 0.4}, rounds=1)
    page = page_of(tmp_path)
    bullet = next(line for line in page.splitlines() if "the targets for long prompts" in line)
    assert ": unresolved**" in bullet and ": met" not in bullet, bullet
    assert "(one round): unresolved" in bullet


def test_throughput_within_five_percent_is_judged_by_the_rounds_spread():
    assert S.verdict(targets.throughput_interval([0.99, 1.0, 1.01]), 0.95, "higher") == S.MET
    assert S.verdict(targets.throughput_interval([0.90, 0.91, 0.89]), 0.95, "higher") == S.MISSED
    # Rounds that straddle the floor widely leave it open.
    assert S.verdict(targets.throughput_interval([0.85, 1.05]), 0.95, "higher") == S.UNRESOLVED
    assert targets.throughput_interval([1.0]) is None


def test_other_workloads_and_loads_are_not_judged_on_them():
    assert targets.applies("long", 0.9) and targets.applies("kv-tight", 0.9)
    assert not targets.applies("mix", 0.9) and not targets.applies("long", 0.7)


@pytest.mark.parametrize("words, expected", [
    (["met"] * 4, "met"), (["met", "missed", "unresolved", "met"], "missed"),
    (["met", "unresolved", "met", "met"], "unresolved")])
def test_all_four_is_met_only_when_each_is(words, expected):
    judged = [targets.Judged(f"t{i}", f"t{i}", "-", w) for i, w in enumerate(words)]
    assert targets.overall(judged) == expected
