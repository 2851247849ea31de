"""What the sets measured and what is left: each kind of configuration's rounds beside
stock by regime and workload, and the plan's cells still empty, in its order."""

from __future__ import annotations

import json
from pathlib import Path

from realab import coverage


def kept(set_dir: Path, workload: str, loads: dict[float, int], configs: dict[str, str | None],
         budget: int = 256) -> None:
    """A set's results.json: `configs` ({config: policy}) beside stock, `loads[x]` rounds at x."""
    set_dir.mkdir(parents=True)
    runs = [{"workload": workload, "load": x, "round": rnd, "config": c, "policy": policy}
            for x, n in loads.items() for rnd in range(n) for c, policy in {"stock": None, **configs}.items()]
    data = {"setup": {"configs": ["stock", *configs], "engine": {"max_num_batched_tokens": budget},
                      "workloads": [{"name": workload, "loads": list(loads)}]}, "runs": runs}
    (set_dir / "results.json").write_text(json.dumps(data))


def test_a_plan_measured_in_full_leaves_nothing(tmp_path: Path):
    policies = {"hook": "slo-driven", "hook-output-first": "output-first", "hook-reasoning-first": "reasoning-first",
                "proxy": None}
    for i, workload in enumerate(("long", "mix", "kv-tight")):
        kept(tmp_path / f"{i + 1}-gpu", workload, {0.9: 2, 0.7: 2, 0.5: 2}, policies)
    kept(tmp_path / "4-cpu", "long", {0.9: 2}, policies, budget=2048)
    kept(tmp_path / "5-cpu", "mix", {0.9: 2}, policies, budget=2048)
    kept(tmp_path / "6-cpu", "kv", {0.9: 2}, policies, budget=2048)
    lines = coverage.page_lines(sorted(tmp_path.iterdir()))
    assert lines[-2] == "**Left to measure:** nothing the plan names."
    row = next(line for line in lines if line.startswith("| GPU-shaped | kv |"))
    assert "2 at 90%, 2 at 70%, 2 at 50% (set 3)" in row


def test_what_is_left_follows_the_plans_order_and_never_pools_sets(tmp_path: Path):
    # Long prompts: output-first in two sets of one round each (never pooled), the
    # shipped default at one load; nothing on the mix or KV pressure.
    kept(tmp_path / "1-a", "long", {0.9: 1}, {"hook-output-first": "output-first"})
    kept(tmp_path / "2-b", "long", {0.9: 1}, {"hook-output-first": "output-first"})
    kept(tmp_path / "3-c", "long", {0.9: 2}, {"hook": "slo-driven", "hook-rf": "reasoning-first",
                                              "hook-x": "slo-driven:relax_to_stock=0", "proxy": None})
    found = coverage.cells(sorted(tmp_path.iterdir()))
    assert found[("GPU-shaped", "long", "output-first")].rounds == {0.9: 2}
    assert found[("GPU-shaped", "long", "output-first")].at(0.9) == 1
    assert found[("GPU-shaped", "long", "other settings")].at(0.9) == 2
    todo = coverage.left(found)
    assert todo[0].startswith("(1) at 90% on the GPU-shaped rig: output-first on long (1 round), output-first on mix")
    assert "slo-driven as shipped on long" not in todo[0] and "proxy" not in todo[0]
    assert todo[1].startswith("(2) a load sweep") and todo[1].endswith("on long, mix, kv")
    assert todo[2].startswith("(3) at 90% on the GPU-shaped rig: output-first on kv")
    assert todo[3] == "(4) at 90% on the GPU-shaped rig: proxy only on mix, proxy only on kv"
    assert todo[4].endswith(": long, mix, kv")


def test_kinds_follow_the_policy_not_the_configurations_name():
    assert coverage.kind_of("proxy", None) == "proxy only"
    assert coverage.kind_of("stock-again", None) is None
    assert coverage.kind_of("hook", "slo-driven") == "slo-driven as shipped"
    assert coverage.kind_of("hook", "slo-driven:output_itl_target_ms=25") == "other settings"
    assert coverage.kind_of("hook-output-first", "output-first") == "output-first"
