"""The prefix-cache measurement's statistics (scripts/realab/prefix.py): runs paired by
conversation, the later turns' hit-rate ratio as a ratio of the two sides' hit rates
(not a mean of per-turn ratios), tails of later turns only, verdicts only with rounds."""

from __future__ import annotations

import json

import pytest

from realab import prefix
from realab import stats as S


def turns(conversations: int, hit: float, ttft_s: float, prompt: int = 400) -> list[dict]:
    """Three turns per conversation; later turns cached `hit` of their prompt, took
    `ttft_s` (plus a little per conversation); first turns hit nothing and took 9 s."""
    out = []
    for c in range(conversations):
        for k in range(3):
            later = k > 0
            out.append({"index": c * 3 + k, "ok": True, "conversation": c, "turn": k,
                        "prompt_tokens": prompt, "cached_tokens": round(hit * prompt) if later else 0,
                        "ttft": (ttft_s + 0.001 * c) if later else 9.0, "e2e": 2.0})
    return out


def write_run(raw, blocks, rnd, config, requests_):
    path = raw / prefix.run_file(blocks, rnd, config)
    path.write_text(json.dumps({"runs": [{"requests": requests_}]}))


def test_hit_rate_and_ttft_ratios_pair_by_conversation(tmp_path):
    for rnd in (0, 1, 2):
        write_run(tmp_path, 48, rnd, "stock", turns(40, 0.25, 1.0))
        write_run(tmp_path, 48, rnd, "hook-fcfs", turns(40, 0.5, 0.5))
    eff = prefix.effects(tmp_path, 48, "hook-fcfs", resamples=200)
    assert eff["hit rate"].point == pytest.approx(2.0)
    assert eff["hit rate"].run_aware, "three rounds: an interval a verdict may read"
    assert S.verdict(eff["hit rate"], 1.5, "higher") == S.MET
    # First turns (9 s each) are not later turns: the tail is the later turns' own.
    # Nearest rank of 240 later turns (six per conversation): the 228th, conversation 37.
    assert eff["p95 TTFT"].point == pytest.approx((0.5 + 0.037) / (1.0 + 0.037), rel=1e-9)
    assert S.verdict(eff["p95 TTFT"], 0.7, "lower") == S.MET
    assert eff["mean turn time (all turns)"].point == pytest.approx(1.0)


def test_a_single_round_resolves_nothing(tmp_path):
    write_run(tmp_path, 96, 0, "stock", turns(40, 0.25, 1.0))
    write_run(tmp_path, 96, 0, "hook-fcfs", turns(40, 0.5, 0.5))
    eff = prefix.effects(tmp_path, 96, "hook-fcfs", resamples=200)
    assert eff["hit rate"].point == pytest.approx(2.0)
    assert not eff["hit rate"].run_aware
    assert "one run" in eff["hit rate"].text()


def test_a_hit_rate_is_a_ratio_of_sums(tmp_path):
    # Short turns that hit much and long ones that hit little: the rate is tokens over
    # tokens, so the long turns weigh by their length.
    reqs = turns(20, 0.9, 1.0, prompt=100) + [
        {**r, "index": r["index"] + 1000, "conversation": r["conversation"] + 100}
        for r in turns(20, 0.0, 1.0, prompt=900)]
    write_run(tmp_path, 48, 0, "stock", reqs)
    write_run(tmp_path, 48, 0, "hook-fcfs", reqs)
    hits = prefix.pairs_of(tmp_path, 48, ["stock"], lambda r: (float(r["cached_tokens"]), float(r["prompt_tokens"])))
    pooled = [v for conv in hits.values["stock"][0].values() for v in conv]
    assert prefix.hit_rate_of(pooled) == pytest.approx(40 * 90 / (40 * 100 + 40 * 900))


def test_round_interval_needs_two_rounds():
    assert prefix.round_interval([1.0]) is None
    mid, low, high = prefix.round_interval([0.98, 1.0, 1.02])
    assert low < mid < high and mid == pytest.approx(1.0, abs=1e-3)


def test_the_twin_workload_matches_the_testers_lengths():
    shape = prefix.Shape(message=100, think=200, answer=40, range_ratio=0.25)
    text = shape.twin_workload(tokens_per_word=2.0)
    assert 'prompt = { kind = "uniform", min = 150, max = 250 }' in text, "words into tokens"
    assert 'think = { kind = "uniform", min = 150, max = 250 }' in text
    args = shape.tester_args(7)
    assert args[args.index("--num-prompts") + 1] == "7" and "conversations" in args


def test_the_plan_takes_the_thought_and_the_wait_between_turns_from_the_environment(monkeypatch):
    monkeypatch.setenv("REALAB_PREFIX_THINK", "600")
    monkeypatch.setenv("REALAB_PREFIX_THINK_TIME_S", "0.05")
    monkeypatch.setenv("REALAB_PREFIX_BLOCKS", "32,48")
    plan = prefix.Plan.from_env()
    assert plan.shape.think == 600 and plan.shape.think_time_s == 0.05 and plan.blocks == [32, 48]
    args = plan.shape.tester_args(3)
    assert args[args.index("--random-think-len") + 1] == "600" and args[args.index("--think-time") + 1] == "0.05"
    # Unset, the shape is the one the first measured set ran.
    for name in ("REALAB_PREFIX_THINK", "REALAB_PREFIX_THINK_TIME_S"):
        monkeypatch.delenv(name)
    assert prefix.Plan.from_env().shape == prefix.Shape()


def test_a_conversation_longer_than_the_engines_context_is_refused_before_any_engine_starts(monkeypatch):
    monkeypatch.setenv("REALAB_PREFIX_THINK", "900")
    with pytest.raises(SystemExit, match="does not fit"):
        prefix.Plan.from_env()
    monkeypatch.setenv("REALAB_PREFIX_THINK", "600")
    monkeypatch.setenv("REALAB_TURNS", "9")
    with pytest.raises(SystemExit, match="does not fit"):
        prefix.Plan.from_env()


def test_the_engine_turns_the_prefix_cache_on():
    base = prefix.m.rig.EngineSpec(python="p", model="m", served_name="s", dtype="float32", max_model_len=8192,
                                   max_num_seqs=32, max_num_batched_tokens=256, kv_cache_gib=2, omp_threads=1,
                                   extra=["--block-size", "128", "--no-enable-prefix-caching"])
    spec = prefix.engine_spec(base, 48)
    assert "--no-enable-prefix-caching" not in spec.extra
    assert spec.extra[-2:] == ["--num-gpu-blocks-override", "48"]
    assert "--enable-prompt-tokens-details" in spec.extra and spec.max_model_len == prefix.MAX_MODEL_LEN
    # vLLM's prefix-cache counters exist only with its stats on; the A/B rigs keep them off.
    assert "--disable-log-stats" in base.argv(8000, "S", [])
    assert "--disable-log-stats" not in spec.argv(8000, "S", [])
    # The results record each size's engine as started, not the base the A/B rigs use.
    recorded = prefix.described(spec)
    assert "python" not in recorded and "--enable-prefix-caching" in recorded["extra"]
    assert "--no-enable-prefix-caching" not in recorded["extra"] and recorded["log_stats"] == "True"


def test_the_report_shows_the_blocks_the_hook_evicted_first_when_counted(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    summary = {"later_turns": {"hit_rate": 0.5, "ttft": {"p50_ms": 80, "p95_ms": 200}},
               "prefix_cache": {"hit_rate": 0.5}, "total_token_throughput": 600}
    runs = []
    for rnd in (0, 1):
        for config, hit, demoted in (("stock", 0.25, None), ("hook-fcfs", 0.5, 40 + rnd)):
            write_run(raw, 24, rnd, config, turns(10, hit, 0.5))
            runs.append({"blocks": 24, "round": rnd, "config": config, "summary": summary,
                         "vllm_preemptions": 0, "demoted_blocks": demoted})
    setup = {"shape": {}, "rate": 0.15, "conversations": 10, "blocks": [24], "configs": ["stock", "hook-fcfs"]}
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"setup": setup, "runs": runs}))
    text = prefix.report(results, raw, tmp_path / "out.md")
    assert "| thought blocks the hook evicted first |" in text.splitlines()[2]
    assert text.splitlines()[5].endswith("| 40, 41 |"), "the hook's runs: its counter's delta per run"
    assert text.splitlines()[4].endswith("| - |"), "stock has no such counter"
    # Runs measured before the counter was read: no column at all.
    for r in runs:
        r["demoted_blocks"] = None
    results.write_text(json.dumps({"setup": setup, "runs": runs}))
    assert "evicted first" not in prefix.report(results, raw, tmp_path / "out.md")


def test_the_ceiling_is_the_previous_prompt_in_whole_blocks(tmp_path):
    # Turn 0: 300 tokens (2 whole blocks of 128 = 256 cacheable for turn 1); turn 1: 500
    # tokens, 200 of them hit; turn 2: 700 tokens (500 // 128 = 3 blocks = 384), 300 hit.
    reqs = [{"ok": True, "conversation": 0, "turn": 0, "prompt_tokens": 300, "cached_tokens": 0},
            {"ok": True, "conversation": 0, "turn": 1, "prompt_tokens": 500, "cached_tokens": 200},
            {"ok": True, "conversation": 0, "turn": 2, "prompt_tokens": 700, "cached_tokens": 300}]
    write_run(tmp_path, 24, 0, "stock", reqs)
    hit, ceiling = prefix.hit_ceiling(tmp_path, 24, "stock")
    assert hit == pytest.approx(500 / 1200) and ceiling == pytest.approx((256 + 384) / 1200)
    assert prefix.hit_ceiling(tmp_path, 48, "stock") is None


def test_the_twins_cache_is_set_beside_vllms_turn_by_turn(tmp_path):
    from built import built as binary

    # A 4-token-block profile; one conversation whose second turn vLLM reported 20 of 40
    # prompt tokens cached (the first turn's 22 tokens in whole blocks), a third turn
    # reported at 16 where the twin, uncrowded, finds its whole previous prompt (40).
    profile = tmp_path / "profile.toml"
    profile.write_text(
        '[[profile]]\nname = "t"\ngpu = "t"\nmodel = "t"\nfixed_s = 0.01\nper_token_s = 0.001\n'
        'per_context_token_s = 0.0001\nper_decode_request_s = 0.0\nper_prefill_attention_s = 0.0\n'
        'weight_read_tokens = 0\nkv_blocks = 64\nblock_size = 4\nmax_num_seqs = 8\nmax_num_batched_tokens = 32\n'
        'derivation = "test"\n')
    raw = tmp_path / "raw"
    raw.mkdir()

    def turn(index, k, sent, prompt, cached):
        return {"index": index, "conversation": 0, "turn": k, "sent_at": sent, "ok": True, "e2e": 1.0,
                "prompt_tokens": prompt, "usage_think_tokens": 8, "usage_output_tokens": 5, "cached_tokens": cached}
    write_run(raw, 24, 0, "stock", [turn(0, 0, 0.0, 22, 0), turn(1, 1, 5.0, 40, 20), turn(2, 2, 10.0, 60, 16)])
    text = " ".join(prefix.trace_lines(binary("meridian-sim"), profile, raw, 24, ["stock", "hook-fcfs"], 8))
    # Later turns: twin 20 + 40 of 100 prompt tokens, vLLM 20 + 16; one of the two within a block.
    assert "`stock` (lru): later turns' hit rate 60.0% against 36.0%" in text
    assert "within one block of vLLM's count 50%" in text
    assert "hook-fcfs" not in text, "no runs of it: nothing to say"
