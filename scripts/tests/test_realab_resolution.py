"""The real-engine A/B page judges its own figures: which effects the paired rounds
resolve, which predictions they can refute, and whether a target verdict holds in every
round. These tests pin those judgements on small hand-made results."""

from __future__ import annotations



from realab.report import round_note
from realab.resolution import (
    Comparison,
    Effect,
    agreement_sentences,
    paired,
    worst_requests,
)


def run(round_: int, config: str, ttot: float | None) -> dict:
    return {"workload": "mix", "load": 0.9, "round": round_, "config": config,
            "summary": {"think_to_output": None if ttot is None else {"p99_ms": ttot}}}


def ttot(r: dict):
    return (r["summary"]["think_to_output"] or {}).get("p99_ms")


def test_effects_pair_configurations_within_a_round_and_skip_rounds_missing_a_side():
    data = {"runs": [run(0, "stock", 100), run(0, "hook", 50),
                     run(1, "stock", 80), run(1, "hook", None),  # hook reached no answer
                     run(2, "hook", 30), run(2, "stock", 60)]}
    effect = paired(data, "mix", 0.9, "hook", "stock", ttot)
    assert effect.ratios == (0.5, 0.5)


def test_an_effect_is_resolved_only_when_every_round_is_within_the_tolerance_of_their_median():
    assert Effect((1.0, 1.1, 0.9)).resolved
    assert not Effect((1.47, 1.71, 0.68)).resolved
    assert Effect((1.0, 1.5)).resolved, "median 1.25: both rounds within 25% of it"
    assert not Effect((1.0, 1.8)).resolved
    assert not Effect((0.9,)).resolved, "one round cannot show its own spread"
    assert not Effect(()).resolved


def test_the_direction_is_claimed_only_when_every_round_agrees():
    assert Effect((1.2, 1.5)).direction() == "higher in every round"
    assert Effect((0.2, 0.5)).direction() == "lower in every round"
    assert Effect((0.9, 1.1)).direction() == "the rounds disagree on its direction"


def test_only_resolved_effects_count_as_refuting_the_twin():
    steady = Effect((1.0, 1.05, 0.98))
    noisy = Effect((0.1, 3.0, 1.0))
    text = " ".join(agreement_sentences([
        Comparison("throughput", "90% (mix)", steady, 1.01),
        Comparison("p99 output ITL", "90% (mix)", steady, 0.4),
        Comparison("p99 TTOT", "90% (mix)", noisy, 0.1),
    ]))
    assert "1 of 3 predicted effects fall within ±25%" in text
    assert "The rounds resolve 2 of these effects" in text
    assert "misses 1: p99 output ITL at 90% (mix) (measured 1.00, predicted 0.40)" in text
    assert "The other 1 can neither confirm nor refute the twin" in text


def test_a_target_verdict_is_called_noise_when_single_rounds_disagree_on_it():
    within_two_x = lambda r: r <= 0.5  # noqa: E731
    assert "every round alone misses the target" in round_note(Effect((1.68, 3.84, 2.73)), within_two_x)
    assert "every round alone meets the target" in round_note(Effect((0.3, 0.4, 0.45)), within_two_x)
    mixed = round_note(Effect((0.3, 0.9, 0.45)), within_two_x)
    assert "2 of 3 rounds alone meet the target" in mixed and "noise" in mixed


def test_a_p99_over_a_few_dozen_requests_is_the_slowest_one():
    assert worst_requests(24) == 1
    assert worst_requests(48) == 1
    assert worst_requests(100) == 2
    assert worst_requests(400) == 5


def test_the_page_says_which_workloads_the_kept_traces_cover_and_what_they_prefilled(tmp_path):
    import gzip
    import json

    from realab.report import trace_coverage

    with gzip.open(tmp_path / "stock-steps.jsonl.gz", "wt") as f:
        # The mix runs (stock, then proxy) and one stray step outside every run.
        for t, prefill in ((1.0, 100), (2.0, 50), (3.0, 0), (11.0, 999)):
            f.write(json.dumps({"t": t, "prefill_tokens": prefill}) + "\n")

    def run(workload, config, window, prompt):
        # 1,000 tokens generated; `prompt` sent.
        summary = {"total_token_throughput": (prompt + 1000) / 10, "duration_s": 10,
                   "think_tokens": 400, "output_tokens": 600}
        return {"workload": workload, "config": config, "window": window, "summary": summary,
                "engine": {"preempted": 0}}

    data = {"setup": {"workloads": [{"name": "mix"}, {"name": "long"}]},
            "runs": [run("mix", "stock", [0.5, 1.5], 300), run("mix", "proxy", [1.5, 3.5], 300),
                     run("long", "stock", [20.0, 30.0], 5000)]}
    text = " ".join(trace_coverage(data, tmp_path))
    assert "holds 4 steps; steps inside the workloads' runs: mix 3, long 0." in text
    assert "The runs of long left no steps in it" in text
    assert "computed 150 prompt tokens of the 600 its clients sent (25%): the rest were prefix-cache hits" in text
    assert "mostly not prefilled" in text


def test_the_reproduce_command_names_a_non_default_request_count():
    from realab.report import reproduce

    assert reproduce({"rounds": 3, "workloads": [{"name": "mix", "prompts": 240, "loads": [0.9]}]}) == [
        "REALAB_WORKLOADS=mix REALAB_PROMPTS=240 REALAB_LOADS=0.9 scripts/bench-dispatch-real.sh"]
    assert reproduce({"rounds": 3, "workloads": [{"name": "mix", "prompts": 48, "loads": [0.5, 0.7, 0.9, 1.0]}]}) == [
        "REALAB_WORKLOADS=mix scripts/bench-dispatch-real.sh"]
    # Different requests per run, or a KV cache of its own, take an invocation each.
    assert reproduce({"rounds": 3, "workloads": [
        {"name": "mix", "prompts": 200, "loads": [0.9]},
        {"name": "long", "prompts": 100, "loads": [0.9]},
        {"name": "kv", "prompts": 96, "loads": [0.9], "kv_blocks": 50}]}) == [
        "REALAB_WORKLOADS=mix REALAB_PROMPTS=200 REALAB_LOADS=0.9 scripts/bench-dispatch-real.sh",
        "REALAB_APPEND=1 REALAB_WORKLOADS=long REALAB_PROMPTS=100 REALAB_LOADS=0.9 scripts/bench-dispatch-real.sh",
        "REALAB_APPEND=1 REALAB_WORKLOADS=kv REALAB_PROMPTS=96 REALAB_LOADS=0.9 scripts/bench-dispatch-real.sh"]
