"""Candidate policies on the twin: a kept set's requests replayed under each policy at
each load, each candidate over the baseline on the same requests."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import pytest

from built import built as binary

ROOT = Path(__file__).resolve().parents[2]

from realab import candidates

RIG_PROFILE = ROOT / "docs/src/benchmarks/policies-real-engine/5-gpu-shaped-every-policy/twin/rig-profile.toml"


def kept_set(set_dir: Path, n: int = 40) -> None:
    """One round of stock on the GPU-shaped rig: long prompts, short thoughts and answers."""
    rng = random.Random(5)
    raw = set_dir / "raw"
    raw.mkdir(parents=True)
    requests = [{"index": i, "sent_at": i * 3.0, "ok": True, "prompt_tokens": rng.randint(400, 1200),
                 "usage_think_tokens": rng.randint(20, 60), "usage_output_tokens": rng.randint(10, 30)}
                for i in range(n)]
    with gzip.open(raw / "long-0.9-0-stock.json.gz", "wt") as f:
        json.dump({"runs": [{"requests": requests}]}, f)
    data = {"setup": {"configs": ["stock"], "engine": {"max_num_batched_tokens": 256},
                      "workloads": [{"name": "long", "loads": [0.9]}]},
            "capacity": {"long": 0.3}, "runs": []}
    (set_dir / "results.json").write_text(json.dumps(data))


def test_each_candidate_is_read_against_the_baseline_at_each_load(tmp_path: Path):
    set_dir = tmp_path / "page" / "1-set"
    kept_set(set_dir, n=60)
    out = tmp_path / "candidates.md"
    with pytest.raises(SystemExit, match="realab forecast"):
        candidates.main([str(set_dir), str(binary("meridian-sim")), "fcfs|output-first", "0.9", str(out)])
    (set_dir / "twin").mkdir()
    shutil.copy(RIG_PROFILE, set_dir / "twin" / "rig-profile.toml")
    candidates.main([str(set_dir), str(binary("meridian-sim")), "fcfs|fcfs|output-first", "0.5,0.9", str(out)])
    page = out.read_text()
    assert "## long, rig, 50% of the twin's capacity" in page and "## long, rig, 90% of the twin's capacity" in page
    # The baseline against itself: the same schedule, every ratio exactly 1.
    same = [line for line in page.splitlines() if line.startswith("| `fcfs` |")]
    assert len(same) == 2 and all(line.count("1.00 (one run: 1.00-1.00)") == 12 for line in same), same
    # 54 requests a round after the warm-up: p90 is the highest tail a round can set.
    assert all(line.count("p90 1.00") == 6 and "p99" not in line for line in same), same
    changed = [line for line in page.splitlines() if line.startswith("| `output-first` |")]
    assert len(changed) == 2 and any(line.count("1.00 (one run: 1.00-1.00)") < 12 for line in changed)
    assert "python3 -m realab candidates" in page and "fcfs|fcfs|output-first" in page


def test_a_baseline_alone_or_a_load_out_of_range_is_refused(tmp_path: Path):
    for policies, loads in (("fcfs", "0.9"), ("fcfs|output-first", "0"), ("fcfs|output-first", "")):
        with pytest.raises(SystemExit):
            candidates.main([str(tmp_path), "sim", policies, loads, str(tmp_path / "x.md")])


def test_a_round_added_on_another_machine_is_replayed_from_the_rate_it_was_sent_at(tmp_path: Path, monkeypatch):
    # Set 11's rounds 8-11 were sent by their own machine's capacity (0.50 req/s), not the
    # set's first (1.15): read by the set's, they were replayed at under half the load named.
    set_dir = tmp_path / "page" / "1-set"
    kept_set(set_dir)
    data = json.loads((set_dir / "results.json").read_text())
    data["runs"] = [{"workload": "long", "load": 0.9, "round": 0, "config": "stock", "capacity": 0.15}]
    (set_dir / "results.json").write_text(json.dumps(data))
    sent = []

    class Twin:
        def __init__(self, *args) -> None:
            pass

        def capacity(self, requests):
            return 0.2

        def replay(self, requests, policy):
            sent.append(max(r["sent_at"] for r in requests))
            return {"runs": [{"requests": [{**r, "ok": True} for r in requests]}]}
    monkeypatch.setattr(candidates.F, "Twin", Twin)
    monkeypatch.setattr(candidates.F, "card_twins", lambda *a: {})
    (set_dir / "twin").mkdir()
    shutil.copy(RIG_PROFILE, set_dir / "twin" / "rig-profile.toml")
    candidates.replays(set_dir, Path("sim"), ["fcfs", "output-first"], [0.9], tmp_path)
    # Sent 3 s apart at 0.9 x 0.15 req/s; at 0.9 of the twin's 0.2 they come 0.15 / 0.2 as far apart.
    assert sent == [pytest.approx(39 * 3.0 * 0.15 / 0.2)] * 2
