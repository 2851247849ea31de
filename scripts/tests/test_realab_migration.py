"""Answers handed over between two real engines: the connector's cost as the twin is given
it, the engines' prompt tokens by source, the proxies' endpoints, and the report's
paired table on synthetic runs with a known effect."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from realab import migration


def probe_file(raw: Path, config: str, gaps: dict[int, float], tokens: dict[int, int]) -> None:
    """A probe run: each request's largest answer gap (where the proxy's hand-over shows)."""
    requests_ = [{"index": i, "ok": True, "think_to_output": 0.009, "max_output_gap": gap,
                  "prompt_tokens": tokens[i] - 100, "usage_think_tokens": 100} for i, gap in gaps.items()]
    (raw / f"probe-{config}.json").write_text(json.dumps({"runs": [{"requests": requests_}]}))


def test_a_handovers_cost_is_fitted_over_what_it_added_to_each_request(tmp_path: Path):
    tokens = {i: 600 + 100 * i for i in range(8)}
    probe_file(tmp_path, "shared", {i: 0.01 for i in tokens}, tokens)
    # The connector adds 20 ms and 10 us a token of prompt and thought to every answer's stall,
    # after its first requests (a cold engine: a second more each), which the fit leaves out.
    added = {i: 0.020 + 1e-5 * n + (1.0 if i < migration.PROBE_WARMUP else 0.0) for i, n in tokens.items()}
    probe_file(tmp_path, "connector", {i: 0.01 + a for i, a in added.items()}, tokens)
    # Re-prefill adds far more, and a request only one side answered is left out.
    probe_file(tmp_path, "reprefill", {i: 0.01 + 2e-4 * n for i, n in tokens.items() if i != 7}, tokens)
    cost = migration.connector_cost(tmp_path)
    assert migration.PROBE_WARMUP == 4 and cost.requests == 4
    assert cost.fixed_s == pytest.approx(0.020) and cost.per_token_s == pytest.approx(1e-5)
    # The bandwidth the per-token part stands for, at the model's KV bytes a token.
    assert cost.gb_s == pytest.approx(migration.KV_BYTES_PER_TOKEN / 1e-5 / 1e9)
    assert [n for n, _ in migration.added_by_handover(tmp_path, "reprefill")] == [600 + 100 * i for i in range(7)]
    text = "\n".join(migration.probe_lines(tmp_path, {"shared": {}, "reprefill": {},
                                                      "connector": {"answer_engine_tokens": {
                                                          "local_compute": 10.0, "external_kv_transfer": 900.0}}}))
    assert "| connector | 8 | " in text and " / 0 / 900 |" in text
    # A line that falls with length is no transfer cost: a constant, the mean.
    probe_file(tmp_path, "connector", {i: 0.01 + 0.05 - 1e-5 * n for i, n in tokens.items()}, tokens)
    flat = migration.connector_cost(tmp_path)
    assert flat.per_token_s == 0 and flat.fixed_s == pytest.approx(0.05 - 1e-5 * 1150) and flat.gb_s == 1000.0
    # Too few requests answered through the connector: no cost to give the twin.
    (tmp_path / "probe-connector.json").unlink()
    assert migration.connector_cost(tmp_path) is None


def test_prompt_tokens_are_read_by_source_whatever_the_other_labels():
    name = "vllm:prompt_tokens_by_source_total"
    before = {f'{name}{{engine="0",model_name="m",source="local_compute"}}': 10.0}
    after = {f'{name}{{engine="0",model_name="m",source="local_compute"}}': 110.0,
             f'{name}{{engine="0",model_name="m",source="external_kv_transfer"}}': 256.0,
             "vllm:other_total": 5.0}
    assert migration.by_source(before, after) == {"local_compute": 100.0, "local_cache_hit": 0.0,
                                                  "external_kv_transfer": 256.0}


def test_the_shared_pool_has_two_engines_both_ways_and_the_split_a_think_and_an_answer_engine():
    assert 'role' not in migration.endpoints("shared", "http://a", "http://b")
    split = migration.endpoints("reprefill", "http://a", "http://b")
    assert 'url = "http://a", name = "think", role = "think"' in split
    assert 'url = "http://b", name = "answer", role = "answer"' in split


def run(tmp: Path, config: str, rnd: int, scale: float, n: int = 100) -> None:
    requests_ = [{"index": i, "ok": True, "ttft": 0.1 * (1 + i % 7), "ttfo": 0.5 * (1 + i % 5) * scale,
                  "think_to_output": 0.05 * (1 + i % 3) * scale, "e2e": 1.0 + i % 4, "output_itl": [0.01, 0.02],
                  "max_output_gap": 0.02, "prompt_tokens": 1000 + i, "usage_think_tokens": 128,
                  "usage_output_tokens": 64} for i in range(n)]
    with gzip.open(tmp / f"long-0.5-{rnd}-{config}.json.gz", "wt") as f:
        json.dump({"runs": [{"requests": requests_}]}, f)


def test_the_report_pairs_the_split_against_the_shared_pool_on_the_same_requests(tmp_path: Path):
    raw = tmp_path / "raw"
    raw.mkdir()
    runs = []
    for rnd in range(2):
        for config, scale in (("shared", 1.0), ("reprefill", 2.0)):
            run(raw, config, rnd, scale)
            runs.append({"load": 0.5, "round": rnd, "config": config,
                         "summary": {"total_token_throughput": 100.0},
                         "engines": [{"local_compute": 1000.0, "local_cache_hit": 0.0, "external_kv_transfer": 0.0}] * 2,
                         "handovers": {"moved": 90.0} if config == "reprefill" else {},
                         "kv_exports": {}})
    data = {"runs": runs}
    text = "\n".join(migration.ab_lines(data, raw, 0.5, resamples=50))
    # Twice the shared pool's TTFO and TTOT on every request, the same TTFT: exact ratios.
    assert "| reprefill | TTFO | 2.00 (2.00-2.00) |" in text
    assert "| reprefill | TTFT | 1.00 (1.00-1.00) |" in text
    # 90 requests a round once the warm-up's tenth is left out: p90 is the tail each
    # round can set, and 180 requests are paired.
    assert "p90 2.00 (2.00-2.00) | 180 |" in text
    assert "| reprefill | token throughput (per round; higher is better) | 1.000 1.000 |" in text
    assert "| reprefill | 180 / 0 |" in text
    assert "**reprefill against shared**: costs resolved: TTFO p50 2.00x" in text
    assert "gains resolved: none" in text
    # The twin's workload: the lengths the engines reported in the shared pool's runs.
    wl = migration.twin_workload(raw, [0.5])
    assert 'prompt = { kind = "uniform", min = 1000, max = 1099 }' in wl
    assert 'think = { kind = "uniform", min = 128, max = 128 }' in wl
