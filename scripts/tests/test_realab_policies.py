"""The every-policy page: built from kept raw files alone, each configuration against stock
on the same requests, the warm-up left out, and a "do no harm" verdict that names the
metric deciding it."""

from __future__ import annotations

import gzip
import json
import tomllib
from pathlib import Path

import pytest


from realab import policies, readme, sets, slo, traced

ROOT = Path(__file__).resolve().parents[2]


def request(i: int, scale: float) -> dict:
    base = 1.0 + (i % 7) * 0.3  # requests differ a lot; the effect is the same on each
    gaps = [0.01 * scale] * 20
    return {"index": i, "ok": True, "sent_at": i * 0.5, "ttft": 0.2 * base * scale, "ttfo": 0.5 * base * scale,
            "think_to_output": 0.05 * base * scale, "e2e": 1.0 * base * scale, "output_itl": gaps,
            "max_output_gap": max(gaps) * base}


def write_set(set_dir: Path, scales: dict[str, float], n: int = 100, rounds: int = 2) -> None:
    """A kept set: `rounds` rounds (two by default: one round gives no verdict) of the
    same requests, each config `scale` times stock's on every metric."""
    raw = set_dir / "raw"
    raw.mkdir(parents=True)
    runs = []
    for rnd in range(rounds):
        for config, scale in scales.items():
            body = {"runs": [{"requests": [request(i, scale) for i in range(n)]}]}
            with gzip.open(raw / f"long-0.9-{rnd}-{config}.json.gz", "wt") as f:
                json.dump(body, f)
            runs.append({"workload": "long", "load": 0.9, "round": rnd, "config": config,
                         "policy": None if config in ("stock", "stock-again", "proxy") else config.removeprefix("hook-"),
                         "summary": {"total_token_throughput": 1000.0 / max(scale, 1e-9)},
                         "cpu": {"other_cores": 0.01}})
        with gzip.open(raw / f"long-unloaded-{rnd}.json.gz", "wt") as f:
            json.dump({"runs": [{"requests": [request(i, 0.9) for i in range(n)]}]}, f)
    data = {"label": "synthetic", "setup": {"configs": list(scales), "rounds": rounds,
                                            "engine": {"model": "/m/bench", "max_num_seqs": 32,
                                                       "max_num_batched_tokens": 2048, "omp_threads": 1},
                                            "workloads": [{"name": "long", "loads": [0.9], "prompts": n,
                                                           "configs": list(scales), "proxy": "shipped"}]},
            "capacity": {"long": 2.0}, "runs": runs}
    (set_dir / "results.json").write_text(json.dumps(data))


def page_of(page_dir: Path, resamples: int = 200) -> str:
    """The page `policies report` writes from the sets in `page_dir`."""
    out = page_dir / "page.md"
    policies.write(page_dir, out, resamples=resamples)
    return out.read_text()


def test_each_config_is_compared_with_stock_and_judged_by_its_worst_metric(tmp_path: Path):
    write_set(tmp_path / "1-set", {"stock": 1.0, "proxy": 1.0, "hook-output-first": 1.2})
    page = page_of(tmp_path)
    assert "| proxy | TTFO | 1.00 (1.00-1.00) |" in page
    assert "| hook-output-first | TTFO | 1.20 (1.20-1.20) |" in page
    # 90 of each run's 100 requests count (the first tenth is the warm-up), and each
    # round's ratio is a figure of its own: a round's p95 would be set by 4.5 of them,
    # its p90 by 9: the tail quoted is p90, however many rounds there are.
    assert "| hook-output-first | TTFT | 1.20 (1.20-1.20) | p90 1.20 (1.20-1.20) | 180 |" in page
    assert "**proxy, do no harm (every metric's interval at or below 1.05): met**" in page
    assert "**hook-output-first (the policy Meridian shipped when this set was measured), do no harm" in page
    assert "harm**, decided by TTFT p50" in page
    assert "as `meridian.toml` ships them" in page
    assert "REALAB_PROXY=shipped REALAB_CONFIGS=stock,proxy,hook-output-first" in page


def test_a_median_of_zero_is_explained_as_bursts(tmp_path: Path):
    write_set(tmp_path / "1-set", {"stock": 1.0, "hook-output-first": 0.0})
    page = page_of(tmp_path)
    # A median of 0 counts as 0.1 ms (`stats.TIME_FLOOR_S`): a ratio far under 0.01.
    assert "| hook-output-first | TTOT | 0.00 (under 0.01-under 0.01) |" in page
    assert "A ratio that reads 0.00 is a median near zero, not a missing figure: for hook-output-first" in page
    assert "hook-output-first TTOT" in page and "answers delivered in bursts" in page


def test_a_hook_that_reorders_nothing_but_resolves_an_effect_is_called_the_noise_floor(tmp_path: Path):
    write_set(tmp_path / "1-set", {"stock": 1.0, "hook-fcfs": 0.8, "hook-output-first": 1.0})
    # Stock ran a third round that hook-fcfs did not: its intervals pair two rounds.
    with gzip.open(tmp_path / "1-set" / "raw" / "long-0.9-2-stock.json.gz", "wt") as f:
        json.dump({"runs": [{"requests": [request(i, 1.0) for i in range(100)]}]}, f)
    page = page_of(tmp_path)
    assert ("- **This rig's noise floor:** `hook-fcfs` schedules exactly as stock does (the hook loaded, "
            "reordering nothing); over 2 round(s) its ratios reach") in page, "the rounds both sides ran"
    assert "Even the intervals widened for the rounds' count resolve TTFT p50 0.80x (0.80-0.80)" in page
    assert "`hook-output-first` schedules" not in page


def test_the_shipped_policy_is_the_one_recorded_when_the_set_was_measured(tmp_path: Path):
    # Sets measured since ADR 0010 record meridian.toml's hook.policy; older ones shipped
    # output-first.
    write_set(tmp_path / "1-set", {"stock": 1.0, "hook-output-first": 1.0, "hook-slo-driven": 1.0})
    data = json.loads((tmp_path / "1-set" / "results.json").read_text())
    data["setup"]["shipped_policy"] = "slo-driven"
    (tmp_path / "1-set" / "results.json").write_text(json.dumps(data))
    page = page_of(tmp_path)
    assert "**hook-slo-driven (the policy Meridian shipped when this set was measured), do no harm" in page
    assert "**hook-output-first, do no harm" in page


def test_the_config_named_hook_runs_the_policy_meridian_toml_ships():
    from realab import measure

    assert measure.shipped_policy() == tomllib.loads(
        (Path(measure.__file__).resolve().parents[2] / "meridian.toml").read_text())["hook"]["policy"]
    assert measure.policy_of("hook") == measure.shipped_policy()

def test_one_round_shows_each_effect_within_its_run_and_judges_nothing(tmp_path: Path):
    write_set(tmp_path / "1-set", {"stock": 1.0, "hook-fcfs": 0.8, "hook-output-first": 1.2}, rounds=1)
    page = page_of(tmp_path)
    assert "| hook-output-first | TTFO | 1.20 (one run: 1.20-1.20) |" in page
    assert "so each ratio shows the interval within that one run" in page
    assert ("**hook-output-first (the policy Meridian shipped when this set was measured), do no harm (every metric's interval at or below "
            "1.05): unresolved**, decided by a single round") in page
    assert "not widened for the rounds' count, would call TTFT p50 0.80x" in page
    assert "The intervals widened for the rounds' count resolve none of it." in page


def test_the_whole_request_slo_reads_the_unloaded_reference(tmp_path: Path):
    # 3x slower than alone misses TTFT's 2x (plus 0.25 s) for the longer requests.
    write_set(tmp_path / "1-set", {"stock": 1.0, "hook-fcfs": 3.0})
    lines = page_of(tmp_path).splitlines()
    row = next(line for line in lines if line.startswith("| hook-fcfs | ") and "%" in line)
    stock = next(line for line in lines if line.startswith("| stock | ") and "%" in line)
    assert stock.endswith("| 100% (99-100) |")
    assert not row.endswith("| 100% (99-100) |") and "no unloaded reference" not in row


def test_the_batch_a_run_held_is_its_requests_time_over_its_span():
    done = [{"ok": True, "sent_at": 0.0, "e2e": 2.0}, {"ok": True, "sent_at": 1.0, "e2e": 1.0},
            {"ok": False, "sent_at": 1.5, "e2e": None}]
    assert slo.held_batch(done, cap=32) == 1.5
    assert slo.held_batch(done, cap=1) == 1.0, "beyond max_num_seqs requests wait outside the batch"
    assert slo.held_batch(done[2:], cap=32) is None


def test_the_h100_scaled_slo_stretches_every_configs_start_alike(tmp_path: Path):
    # hook-fcfs starts 3x slower than alone and answers as stock does: the plain SLO
    # (2x plus 0.25 s) fails its longer requests; with starts stretched 2x (factor 4) all
    # meet it, and stock, judged by the same factor, stays at 100%.
    write_set(tmp_path / "1-set", {"stock": 1.0, "hook-fcfs": 1.0})
    raw = tmp_path / "1-set" / "raw"
    for rnd in range(2):
        slow = [{**request(i, 1.0), "ttft": 3 * 0.2 * 0.9 * (1.0 + (i % 7) * 0.3),
                 "ttfo": 3 * 0.5 * 0.9 * (1.0 + (i % 7) * 0.3)} for i in range(100)]
        with gzip.open(raw / f"long-0.9-{rnd}-hook-fcfs.json.gz", "wt") as f:
            json.dump({"runs": [{"requests": slow}]}, f)
    data = json.loads((tmp_path / "1-set" / "results.json").read_text())
    batches = []

    def stretch(batch: float) -> float:
        batches.append(batch)
        return 2.0
    text = "\n".join(policies.section(data, raw, "long", 0.9, 100, stretch))
    stock = next(line for line in text.splitlines() if line.startswith("| stock | ") and "%" in line)
    fcfs = next(line for line in text.splitlines() if line.startswith("| hook-fcfs | ") and "%" in line)
    assert stock.endswith("| 100% (99-100) | 100% (99-100) |")
    plain, scaled = fcfs.split(" | ")[-2:]
    assert not plain.startswith("100%") and scaled == "100% (99-100) |"
    assert "round 0: 4 requests held, factor 4.0; round 1: 4 requests held, factor 4.0." in text
    assert len(batches) == 2 and all(3.5 < b < 4.5 for b in batches), "stock's batch, once a round"
    plain_only = "\n".join(policies.section(data, raw, "long", 0.9, 100))
    assert "H100-scaled" not in plain_only


def test_capacity_at_the_whole_request_slo_is_read_across_the_loads_measured(tmp_path: Path):
    # At 90% hook-fcfs is 3x slower than stock on every metric (no request meets the
    # SLO); at 70% it is stock's equal (all meet it): its capacity falls a twentieth of
    # the way from 70% to 90%, while stock meets it at both loads (a lower bound at 90%).
    page_dir = tmp_path / "page"
    write_set(page_dir / "1-set", {"stock": 1.0, "hook-fcfs": 3.0})
    lighter = measured_rounds(tmp_path / "w1", {"stock": 1.0, "hook-fcfs": 1.0}, [0, 1], load=0.7, unloaded=False)
    policies.add(lighter, page_dir / "1-set", "rounds 0-1 at 70%")
    page = page_of(page_dir)
    assert "**Capacity at the whole-request SLO (as stated; 95% of requests meeting it), long**" in page
    assert "- stock: at least 90% of stock capacity, 1.80 req/s" in page
    fcfs = next(line for line in page.splitlines() if line.startswith("- hook-fcfs: "))
    assert fcfs.startswith("- hook-fcfs: 71% of stock capacity, 1.42 req/s"), fcfs
    assert "100% at 70%, 0% at 90%" in fcfs and "0.79x stock's" in fcfs
    # The moonshot's verdict reads the ratio's interval: wholly below 1.5x, missed.
    assert fcfs.endswith("the target, at least 1.5x stock's: **missed**."), fcfs
    # The README's summary carries the same capacities, from the same computation.
    capacity, targets_line = policies.write(page_dir, tmp_path / "again.md", resamples=100)
    assert targets_line.startswith("- Targets for long prompts and KV pressure at 90%")
    assert capacity.startswith("- long, capacity at the whole-request SLO (set `1-set`): stock: at least 90%")
    assert fcfs[2:] in capacity


def test_a_policy_that_missed_rounds_added_later_is_swept_against_stock_over_its_own_rounds(tmp_path: Path):
    # Rounds 2-3 at 90% were added later for another policy, and stock ran them 3x slower
    # (none of their requests meets the SLO): hook-fcfs, which ran rounds 0-1 at both
    # loads, is set against stock over rounds 0-1 (every request met it), not against
    # stock's 90% point pooled over rounds it never ran; one load is no sweep.
    page_dir = tmp_path / "page"
    write_set(page_dir / "1-set", {"stock": 1.0, "hook-fcfs": 1.0})
    lighter = measured_rounds(tmp_path / "w1", {"stock": 1.0, "hook-fcfs": 3.0}, [0, 1], load=0.7, unloaded=False)
    policies.add(lighter, page_dir / "1-set", "rounds 0-1 at 70%")
    # hook-fcfs itself is 3x slower than stock at 70% (none meets the SLO there), so a
    # line that read its own shares for stock's would show 0% at 70%.
    later = measured_rounds(tmp_path / "w2", {"stock": 3.0, "hook-output-first": 3.0}, [2, 3], load=0.9)
    policies.add(later, page_dir / "1-set", "rounds 2-3 at 90%, another policy")
    lines = page_of(page_dir).splitlines()
    stock = next(line for line in lines if line.startswith("- stock: "))
    fcfs = next(line for line in lines if line.startswith("- hook-fcfs: "))
    assert "100% at 70%, 50% at 90%" in stock, "stock's own line pools all its rounds"
    assert fcfs.startswith("- hook-fcfs: below the loads measured (0% at 70%, 100% at 90%)"), fcfs
    assert "; stock over the same rounds: at least 90% of stock capacity" in fcfs, fcfs
    assert "100% at 70%, 100% at 90%)" in fcfs.split("stock over the same rounds")[1], fcfs
    assert not any(line.startswith("- hook-output-first: ") for line in lines), "ran at one load only"


def test_a_capacity_ratio_over_a_stock_capacity_below_the_sweep_has_no_upper_end():
    from realab import slo

    assert slo._ratio_ends((1.22, 0.81, float("inf"))) == (
        "at least 0.81, no upper end: stock's capacity may lie below the loads measured")
    assert slo._ratio_ends((1.0, 0.8, 1.3)) == "0.80-1.30"


def test_the_readme_summary_names_costs_and_gains_from_the_data(tmp_path: Path):
    write_set(tmp_path / "1-set", {"stock": 1.0, "hook-output-first": 1.2})
    write_set(tmp_path / "0-old", {"stock": 1.0, "hook-output-first": 0.5, "hook-fcfs": 1.0})
    old = json.loads((tmp_path / "0-old" / "results.json").read_text())
    (tmp_path / "0-old" / "results.json").write_text(json.dumps({**old, "superseded": True}))
    lines = readme.summary_lines(tmp_path, resamples=100)
    # The superseded set is left out: its fcfs row and its faster output-first alike.
    assert len(lines) == 1, lines
    assert "`hook-output-first` against stock (set `1-set`): do no harm: harm; costs: TTFT p50 1.20x (1.20-1.20)" in lines[0]
    assert "gains: none resolved." in lines[0]
    path = tmp_path / "README.md"
    path.write_text(f"intro\n{readme.README_START}\nold\n{readme.README_END}\nafter\n")
    readme.write_readme_block(path, lines)
    text = path.read_text()
    assert "old" not in text and "intro\n" in text and text.endswith(f"{readme.README_END}\nafter\n")
    assert "costs: TTFT p50 1.20x" in text



def test_the_report_stamps_the_page_and_the_readme_with_the_data_it_read(tmp_path: Path):
    page_dir = tmp_path / "policies-real-engine"
    write_set(page_dir / "1-set", {"stock": 1.0, "hook-output-first": 1.2}, n=40)
    page, readme_path = tmp_path / "page.md", tmp_path / "README.md"
    readme_path.write_text(f"intro\n{readme.README_START}\nold\n{readme.README_END}\n")
    policies.main(["report", str(page_dir), str(page), str(readme_path)])
    stamp = sets.stamp(page_dir)
    assert page.read_text().rstrip("\n").endswith(stamp)
    assert f"{stamp}\n{readme.README_END}" in readme_path.read_text()
    # A round added (or any kept file changed) without the page written again shows.
    raw = page_dir / "1-set" / "raw" / "long-0.9-1-stock.json.gz"
    raw.write_bytes(raw.read_bytes() + b"\0")
    assert sets.stamp(page_dir) != stamp


def test_the_policies_page_and_the_readme_were_generated_from_the_sets_kept():
    """The page and the README's summary carry the stamp of the data they were read from:
    a set added or changed since, without `policies report` run again, fails here."""
    page_dir = ROOT / "docs" / "src" / "benchmarks" / "policies-real-engine"
    stamp = sets.stamp(page_dir)
    page = (ROOT / "docs" / "src" / "benchmarks" / "policies-real-engine.md").read_text()
    assert stamp in page, "the page was not regenerated after its data changed (python -m realab policies report)"
    text = (ROOT / "README.md").read_text()
    block = text[text.index(readme.README_START):text.index(readme.README_END)]
    assert stamp in block, "the README's summary was not regenerated after the page's data changed"


def test_the_readme_puts_the_default_first_and_folds_what_resolves_nothing(monkeypatch):
    def summary(config: str, load: float, harm: str = "unresolved", costs=(), gains=(), label=None,
                policy: str | None = None, set_name: str = "7-set"):
        policy = policy or ("slo-driven" if config == "hook" else None)
        name = f"`hook` (policy `{policy}`)" if config == "hook" else f"`{config}`"
        return readme.Summary("mix", label or f"at {100 * load:.0f}% load", load, config, policy, name, set_name,
                              harm, tuple(costs), tuple(gains), stood_only=label is not None)
    records = [
        summary("hook-output-first", 0.9, "harm", costs=("TTFT p50 2.30x (1.25-38.80)",)),
        summary("hook-output-first", 0.5),
        summary("proxy", 0.5),
        summary("hook", 0.2),
        summary("hook", 0.5),
        summary("hook", 0.5, label="at 50% load, only the rounds that stood at it (9, 10)"),
        summary("hook", 0.9, gains=("answer ITL p99 0.80x (0.76-0.88)",)),
        # `hook` with settings the default does not ship is an experiment, not the default.
        summary("hook", 0.9, harm="harm", costs=("TTFT p90 1.33x (1.06-1.76)",),
                policy="slo-driven:start_wait_target_s=inf"),
        # All of set 8's rounds at 90% resolve a gain; only those that stood there, nothing.
        summary("hook", 0.9, gains=("largest answer gap p90 0.86x (0.80-0.95)",), set_name="8-set"),
        summary("hook", 0.9, label="at 90% load, only the rounds that stood at it (0, 3)", set_name="8-set"),
        # Folded among the others, an experiment on the default is named with its policy.
        summary("hook", 0.7, policy="slo-driven:output_itl_target_ms=50", set_name="14-set"),
    ]
    monkeypatch.setattr(readme, "summaries", lambda page_dir, resamples=2000: records)
    lines = readme.readme_lines(Path("unused"))
    assert lines[0].startswith("- mix at 90% load, `hook` (policy `slo-driven`) against stock") and "0.80x" in lines[0]
    assert lines[1].startswith("- mix at 90% load, `hook` (policy `slo-driven`) against stock (set `8-set`)")
    # 20% is judged one way, 50% both ways, and both of 50%'s lines resolve nothing: one line.
    assert lines[2] == ("- mix at 20%, 50% load (all its rounds, and only those that stood at the load), `hook` "
                        "(policy `slo-driven`) against stock (set `7-set`): do no harm: unresolved; no cost and no "
                        "gain resolved.")
    # Where only one of a load's two views resolves nothing, the folded line names its view.
    assert lines[3] == ("- mix at 90% load (only the rounds that stood at it), `hook` (policy `slo-driven`) against "
                        "stock (set `8-set`): do no harm: unresolved; no cost and no gain resolved.")
    # A resolved cost of another configuration is never folded away.
    assert "do no harm: harm; costs: TTFT p50 2.30x" in lines[4]
    assert lines[5].startswith("- mix at 90% load, `hook` (policy `slo-driven:start_wait_target_s=inf`)")
    assert lines[6] == ("- 3 other comparisons (`hook-output-first`, `hook` (policy "
                        "`slo-driven:output_itl_target_ms=50`), `proxy` at their workloads and loads) resolve "
                        "neither a cost nor a gain; the page shows each.")
    assert len(lines) == 7



def test_a_folded_line_names_each_loads_view_where_loads_differ():
    def summary(load: float, stood_only: bool, gains=()):
        return readme.Summary("long", "unused", load, "hook", "slo-driven", "`hook`", "11-set", "unresolved", (),
                              tuple(gains), stood_only)
    every = [summary(0.5, False), summary(0.9, False, gains=("TTOT p90 0.80x (0.70-0.90)",)), summary(0.9, True)]
    folded = [s for s in every if s.resolves_nothing()]
    assert readme._folded_loads(folded, every) == "50% load; 90% load (only the rounds that stood at it)"

def measured_rounds(work: Path, scales: dict[str, float], rounds: list[int], n: int = 100, load: float = 0.9,
                    unloaded: bool = True) -> Path:
    """A results file as `realab measure` writes it for `rounds` at `load` (raw runs in
    `work`), with each round's unloaded reference unless `unloaded` is False."""
    runs_dir = work / "runs"
    runs_dir.mkdir(parents=True)
    runs = []
    for rnd in rounds:
        for config, scale in scales.items():
            body = {"runs": [{"requests": [request(i, scale) for i in range(n)]}]}
            (runs_dir / f"long-{load:g}-{rnd}-{config}.json").write_text(json.dumps(body))
            runs.append({"workload": "long", "load": load, "round": rnd, "config": config,
                         "policy": None if config == "stock" else config.removeprefix("hook-"),
                         "summary": {"total_token_throughput": 1000.0 / max(scale, 1e-9)}, "cpu": {"other_cores": 0.01}})
        if unloaded:
            (runs_dir / f"long-unloaded-{rnd}.json").write_text(
                json.dumps({"runs": [{"requests": [request(i, 0.9) for i in range(n)]}]}))
    data = {"setup": {"configs": list(scales), "rounds": len(rounds), "first_round": rounds[0],
                      "engine": {"model": "/elsewhere/bench", "max_num_seqs": 32, "max_num_batched_tokens": 2048,
                                 "omp_threads": 1},
                      "workloads": [{"name": "long", "loads": [load], "prompts": n, "configs": list(scales),
                                     "proxy": "shipped"}]},
            "capacity": {"long": 2.0}, "runs": runs, "work": [str(work)]}
    out = work / "results.json"
    out.write_text(json.dumps(data))
    return out


def test_rounds_added_to_a_kept_set_widen_its_pairs_and_are_never_measured_twice(tmp_path: Path):
    page_dir = tmp_path / "page"
    write_set(page_dir / "1-set", {"stock": 1.0, "proxy": 1.0, "hook-output-first": 1.2}, rounds=1)
    more = measured_rounds(tmp_path / "w1", {"stock": 1.0, "hook-output-first": 1.2, "hook-reasoning-first": 0.8},
                           [1, 2])
    assert policies.add(more, page_dir / "1-set", "rounds 1-2") == 8
    page = page_of(page_dir)
    # Three rounds of output-first against stock, two of reasoning-first, one of the proxy.
    assert "| hook-output-first | TTFT | 1.20 (1.20-1.20) | p90 1.20 (1.20-1.20) | 270 |" in page
    assert "| hook-reasoning-first | TTFO | 0.80 (0.80-0.80) |" in page and "| 180 |" in page
    assert ("Rounds per configuration (a ratio pairs only the rounds both sides ran): stock 0, 1, 2; proxy 0; "
            "hook-output-first 0, 1, 2; hook-reasoning-first 1, 2.") in page
    # Its shares are set beside stock's on the same two rounds.
    row = next(line for line in page.splitlines() if line.startswith("| hook-reasoning-first | ") and "%" in line)
    assert row.count("; stock 0% on those rounds") == 1 and row.count("; stock 100% on those rounds") == 2, row
    assert "REALAB_FIRST_ROUND=1 REALAB_PROXY=shipped REALAB_CONFIGS=stock,hook-output-first,hook-reasoning-first" in page
    assert "policies add /tmp/more.json" in page
    assert "REALAB_CONFIGS=stock,proxy,hook-output-first REALAB_UNLOADED=1" in page, "round 0's own configs"

    again = measured_rounds(tmp_path / "w2", {"stock": 1.0}, [2])
    with pytest.raises(SystemExit, match="already in"):
        policies.add(again, page_dir / "1-set", "round 2 again")
    other = json.loads(more.read_text())
    other["setup"]["engine"]["max_num_batched_tokens"] = 256
    other["runs"] = [{**r, "round": 3} for r in other["runs"]]
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="another engine"):
        policies.add(tmp_path / "other.json", page_dir / "1-set", "another budget")
    # Later rounds given a capacity are given the set's, to the three decimals the log
    # prints. Any other given capacity is another rig's, refused (a capacity the rounds
    # measured on their own machine is theirs: test_realab_speed).
    kept = json.loads((page_dir / "1-set" / "results.json").read_text())
    kept["capacity"]["long"] = 2.0004
    (page_dir / "1-set" / "results.json").write_text(json.dumps(kept))
    rounded = measured_rounds(tmp_path / "w3", {"stock": 1.0}, [3])
    assert policies.add(rounded, page_dir / "1-set", "round 3, capacity as printed") == 2, "its run and unloaded reference"
    slower = json.loads(measured_rounds(tmp_path / "w4", {"stock": 1.0}, [4]).read_text())
    slower["capacity"]["long"] = 1.99
    slower["capacity_given"] = {"long": True}
    (tmp_path / "slower.json").write_text(json.dumps(slower))
    with pytest.raises(SystemExit, match="given another capacity"):
        policies.add(tmp_path / "slower.json", page_dir / "1-set", "another capacity")
    # A field the rig came to record later, at the value the kept rounds ran with, is
    # the same engine; at another value it is not.
    for rnd, value, same in ((5, "False", True), (6, "True", False)):
        described_path = measured_rounds(tmp_path / f"w{rnd}", {"stock": 1.0}, [rnd])
        described = json.loads(described_path.read_text())
        described["setup"]["engine"]["log_stats"] = value
        described_path.write_text(json.dumps(described))
        if same:
            assert policies.add(described_path, page_dir / "1-set", "stats off, recorded") > 0
        else:
            with pytest.raises(SystemExit, match="another engine"):
                policies.add(described_path, page_dir / "1-set", "stats on")


def test_whom_each_engine_preempted_is_counted_over_the_sections_runs():
    def run(config, rnd, preempted, answering, load=0.9):
        return {"workload": "kv", "load": load, "round": rnd, "config": config,
                "engine": {"preempted": preempted, "preempted_output": answering}}
    data = {"runs": [run("stock", 0, 100, 3), run("stock", 1, 39, 0), run("hook", 0, 90, 0), run("hook", 1, 1200, 0),
                     run("hook", 2, 5, 5, load=0.5), {"workload": "kv", "load": 0.9, "round": 0, "config": "proxy"}]}
    line = " ".join(traced.preemption_lines(data, "kv", 0.9, ["proxy", "hook"]))
    assert ("stock 139 in 2 runs, 3 of them answering; hook 1,290 in 2 runs, 0 of them answering." in line), line
    quiet = {"runs": [run("stock", 0, 0, 0), run("hook", 0, 0, 0)]}
    assert traced.preemption_lines(quiet, "kv", 0.9, ["hook"]) == []


def test_runs_measured_before_they_named_their_work_are_placed_by_the_sets_history():
    from realab.sets import stamp_work

    def run(load, rnd, config):
        return {"workload": "mix", "load": load, "round": rnd, "config": config}
    data = {"setup": {"workloads": [{"name": "mix", "loads": [0.7, 0.9], "first_loads": [0.9]}]},
            "work": ["/tmp/realab-a", "/tmp/realab-b", "/tmp/realab-c", "/tmp/realab-d"],
            # b: rounds 1-2 at the set's first loads (recorded before additions named
            # loads); c: references only; d: rounds 0-1 at 70%.
            "additions": [{"rounds": [1, 2], "configs": ["stock", "hook"]},
                          {"rounds": [0], "configs": ["stock"], "loads": []},
                          {"rounds": [0, 1], "configs": ["stock", "hook"], "loads": [0.7]}],
            "runs": [run(0.9, 0, "stock"), run(0.9, 1, "hook"), run(0.7, 1, "stock"), run(0.7, 0, "hook"),
                     {**run(0.9, 2, "stock"), "work": "realab-z"}]}
    assert stamp_work(data) == 4
    assert [r["work"] for r in data["runs"]] == ["realab-a", "realab-b", "realab-d", "realab-d", "realab-z"]
    assert stamp_work(data) == 0, "a run already named keeps its name"
    unplaced = {**data, "work": ["/tmp/realab-a"], "runs": [run(0.9, 0, "stock")]}
    assert stamp_work(unplaced) == 0 and "work" not in unplaced["runs"][0]


def test_rounds_added_at_another_load_get_their_own_section_and_command(tmp_path: Path):
    page_dir = tmp_path / "page"
    write_set(page_dir / "1-set", {"stock": 1.0, "hook-output-first": 1.2}, rounds=2)
    lighter = measured_rounds(tmp_path / "w1", {"stock": 1.0, "hook-output-first": 0.9}, [0, 1], load=0.7,
                              unloaded=False)
    assert policies.add(lighter, page_dir / "1-set", "rounds 0-1 at 70%") == 4
    page = page_of(page_dir)
    at_70, at_90 = page.split("### long, 70% of stock capacity")[1].split("### long, 90% of stock capacity")
    assert "| hook-output-first | TTFT | 1.20 (1.20-1.20) |" in at_90
    assert "| hook-output-first | TTFT | 0.90 (0.90-0.90) |" in at_70, "each load pairs its own runs"
    first, added = page.split("# then: rounds 0-1 at 70%")
    assert "REALAB_LOADS=0.9 " in first.split("Reproduce:")[-1] and "REALAB_LOADS=0.7" not in first.split("Reproduce:")[-1]
    assert "REALAB_FIRST_ROUND=0 " in added and "REALAB_LOADS=0.7 " in added
    # The set's own rounds ran their unloaded references, the addition did not.
    assert "REALAB_UNLOADED=1" in first.split("Reproduce:")[-1] and "REALAB_UNLOADED" not in added


def test_unloaded_references_added_alone_let_every_round_count_for_the_whole_request_slo(tmp_path: Path):
    page_dir = tmp_path / "page"
    write_set(page_dir / "1-set", {"stock": 1.0, "hook-output-first": 1.2}, rounds=1)
    policies.add(measured_rounds(tmp_path / "w1", {"stock": 1.0, "hook-output-first": 1.2}, [1], unloaded=False),
                 page_dir / "1-set", "round 1, no references")
    assert "Only the rounds with an unloaded reference count for it." in page_of(page_dir)
    # What `realab measure` writes with REALAB_LOADS empty and REALAB_UNLOADED=1: no
    # runs, the round's reference only.
    work = tmp_path / "w2"
    (work / "runs").mkdir(parents=True)
    (work / "runs" / "long-unloaded-1.json").write_text(
        json.dumps({"runs": [{"requests": [request(i, 0.9) for i in range(100)]}]}))
    refs = json.loads(measured_rounds(tmp_path / "w0", {"stock": 1.0}, [1]).read_text())
    refs["setup"]["workloads"][0]["loads"] = []
    refs.update(runs=[], work=[str(work)])
    (work / "results.json").write_text(json.dumps(refs))
    assert policies.add(work / "results.json", page_dir / "1-set", "round 1's references") == 1
    page = page_of(page_dir)
    assert "Only the rounds with an unloaded reference count for it." not in page
    added = page.split("# then: round 1's references")[1]
    assert "REALAB_FIRST_ROUND=1 REALAB_PROXY=shipped REALAB_CONFIGS=stock REALAB_UNLOADED=1" in added
    assert "REALAB_LOADS= " in added and "REALAB_ROUNDS=1 " in added, "references only, one round"
    kept = json.loads((page_dir / "1-set" / "results.json").read_text())
    assert kept["additions"][-1]["rounds"] == [1] and kept["additions"][-1]["loads"] == []
    assert kept["setup"]["workloads"][0]["loads"] == [0.9], "no load added"


def test_stock_measured_again_is_the_noise_floor_itself(tmp_path: Path):
    write_set(tmp_path / "1-set", {"stock": 1.0, "stock-again": 1.3, "hook-output-first": 1.0})
    page = page_of(tmp_path)
    assert "- `stock-again`: stock vLLM again, the same engine measured a second time in the round" in page
    assert "- **This rig's noise floor:** `stock-again` is stock measured again; over 2 round(s)" in page
    assert "Even the intervals widened for the rounds' count resolve TTFT p50 1.30x (1.30-1.30)" in page


def test_a_run_names_stock_first_and_each_configuration_once(monkeypatch):
    from realab.measure import configs_from_env, engine_name, policy_of

    monkeypatch.setenv("REALAB_CONFIGS", "stock,stock-again,hook-output-first")
    assert configs_from_env() == ["stock", "stock-again", "hook-output-first"]
    assert policy_of("stock-again") is None and engine_name("stock-again") == "stock", "the same stock engine"
    for bad in ("stock-again,stock", "stock,stock", "stock,hook-fcfs,hook-fcfs", "stock,lifo"):
        monkeypatch.setenv("REALAB_CONFIGS", bad)
        with pytest.raises(SystemExit):
            configs_from_env()


def test_rounds_added_after_the_default_changed_name_both_shipped_policies(tmp_path: Path):
    # Rounds 0-1 measured while output-first shipped; round 2, added, after the default
    # became slo-driven: each is named as shipped, and neither as the only one.
    page_dir = tmp_path / "page"
    write_set(page_dir / "1-set", {"stock": 1.0, "hook-output-first": 1.0}, rounds=2)
    more = measured_rounds(tmp_path / "w1", {"stock": 1.0, "hook-slo-driven": 1.0}, [2])
    data = json.loads(more.read_text())
    data["setup"]["shipped_policy"] = "slo-driven"
    more.write_text(json.dumps(data))
    policies.add(more, page_dir / "1-set", "round 2, the new default")
    page = page_of(page_dir)
    assert "**hook-output-first (a policy Meridian shipped while this set was measured), do no harm" in page
    assert "**hook-slo-driven (a policy Meridian shipped while this set was measured), do no harm" in page
