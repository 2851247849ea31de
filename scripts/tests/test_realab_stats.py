"""The real-engine A/B's headline statistics: paired effects with bootstrap intervals, the
tail rule, verdicts, Wilson shares, the whole-request SLO and capacity at an SLO. Small
synthetic A/Bs with known effects pin each one."""

from __future__ import annotations

import math
import random
import statistics

import pytest


from realab.shares import (
    answer_only_slo,
    Capacity,
    capacity_at_slo,
    capacity_ratio,
    clustered_wilson,
    LoadPoint,
    share_of,
    stalled,
    whole_request_slo,
    WholeRequestSlo,
    wilson,
)
from realab.stats import (
    Estimate,
    Harm,
    answer_itl,
    do_no_harm,
    nearest_rank,
    pair_requests,
    paired_ratio,
    paired_share_change,
    quotable,
    read_runs,
    run_spread_factor,
    t_quantile,
    tail_for,
    ttot,
    verdict,
)

FAST = 300  # resamples: enough for the interval's width to be stable, quick in a test


def request(index: int, ttot_s: float | None, **extra) -> dict:
    return {"index": index, "ok": True, "ttft": 0.1, "ttfo": 1.0, "think_to_output": ttot_s,
            "max_output_gap": 0.05, "output_itl": [0.05], "usage_think_tokens": 10, **extra}


def ab(rounds: int, n: int, effect, seed: int = 1, spread: float = 1.0) -> dict:
    """stock and hook over the same requests: each request's stock TTOT varies a lot
    (lognormal, sigma `spread`); the hook's is effect(stock value, rng)."""
    rng = random.Random(seed)
    runs: dict = {"stock": {}, "hook": {}}
    for rnd in range(rounds):
        base = [rng.lognormvariate(-1, spread) for _ in range(n)]
        runs["stock"][rnd] = [request(i, v) for i, v in enumerate(base)]
        runs["hook"][rnd] = [request(i, effect(v, rng)) for i, v in enumerate(base)]
    return runs


def test_an_exact_two_fold_effect_is_two_with_a_tight_interval():
    pairs = pair_requests(ab(3, 60, lambda v, _: 2 * v), ttot)
    e = paired_ratio(pairs, 0.9, "hook", "stock", resamples=FAST)
    assert e.point == pytest.approx(2.0)
    assert e.low <= 2.0 <= e.high and e.high - e.low < 1e-9
    assert (e.n_requests, e.n_rounds, e.q) == (180, 3, 0.9)
    assert verdict(e, 0.5) == "missed"
    mean = paired_ratio(pairs, "mean", "hook", "stock", resamples=FAST)
    assert mean.point == pytest.approx(2.0) and mean.high - mean.low < 1e-9


def test_noise_without_an_effect_does_not_meet_a_halving_target():
    pairs = pair_requests(ab(3, 60, lambda v, rng: v * rng.lognormvariate(0, 0.5)), ttot)
    e = paired_ratio(pairs, 0.9, "hook", "stock", resamples=FAST)
    assert e.low < 1.3 and e.high > 0.8
    assert verdict(e, 0.5) != "met"


def test_pairing_makes_the_interval_much_narrower_than_resampling_each_side_alone():
    runs = ab(3, 100, lambda v, rng: 0.5 * v * rng.uniform(0.95, 1.05), spread=1.5)
    paired = paired_ratio(pair_requests(runs, ttot), 0.5, "hook", "stock", resamples=FAST)
    # Shuffling the hook's indices within each round leaves every pooled quantile (and so
    # the point) as it was, but the bootstrap's shared indices then pick unrelated requests.
    rng = random.Random(7)
    for reqs in runs["hook"].values():
        order = list(range(len(reqs)))
        rng.shuffle(order)
        for r, i in zip(reqs, order):
            r["index"] = i
    unpaired = paired_ratio(pair_requests(runs, ttot), 0.5, "hook", "stock", resamples=FAST)
    assert unpaired.point == pytest.approx(paired.point)
    assert paired.low <= 0.5 <= paired.high
    assert (unpaired.high - unpaired.low) > 4 * (paired.high - paired.low)


def test_rounds_at_different_loads_give_the_rounds_own_effect_not_a_pooled_one():
    # Two rounds at different loads: gaps of 10 ms in the light one and 100 ms in the
    # loaded one, where the hook cuts each by a fifth but sends a few more tokens in the
    # loaded round. Each round's own median ratio is 0.8; one median over both rounds'
    # values would set stock's among the light round's and the hook's among the loaded
    # round's: 8x, an effect no round had.
    light = {"stock": [0.010] * 60, "hook": [0.008] * 40}
    loaded = {"stock": [0.100] * 40, "hook": [0.080] * 60}
    runs = {c: {0: [request(0, 0.1, output_itl=light[c])], 1: [request(0, 0.1, output_itl=loaded[c])]}
            for c in ("stock", "hook")}
    e = paired_ratio(pair_requests(runs, answer_itl), 0.5, "hook", "stock", resamples=FAST)
    assert e.point == pytest.approx(0.8)
    assert e.low == pytest.approx(0.8) and e.high == pytest.approx(0.8)
    # Each round's figure stood on its own values: the thinnest round's thinner side.
    assert e.n_values == 40


def test_the_rounds_own_ratios_combine_by_geometric_mean():
    # Round 0: the hook doubles every TTOT; round 1: it halves them. Neither wins.
    runs = {"stock": {0: [request(i, 0.1 * (i + 1)) for i in range(20)],
                      1: [request(i, 0.1 * (i + 1)) for i in range(20)]},
            "hook": {0: [request(i, 0.2 * (i + 1)) for i in range(20)],
                     1: [request(i, 0.05 * (i + 1)) for i in range(20)]}}
    pairs = pair_requests(runs, ttot)
    for q in (0.5, 0.95, "mean"):
        assert paired_ratio(pairs, q, "hook", "stock", resamples=FAST).point == pytest.approx(1.0)
    # A round where stock's figure is 0 and the hook's is not is a harm, not a round left
    # out: a time under 0.1 ms counts as 0.1 ms, so it weighs in as 3,000x.
    runs["stock"][2] = [request(i, 0.0) for i in range(20)]
    runs["hook"][2] = [request(i, 0.3) for i in range(20)]
    e = paired_ratio(pair_requests(runs, ttot), 0.5, "hook", "stock", resamples=FAST)
    assert e.n_rounds == 3 and e.point == pytest.approx(3000 ** (1 / 3))
    # Both 0 in a round: equal there.
    runs["hook"][2] = [request(i, 0.0) for i in range(20)]
    assert paired_ratio(pair_requests(runs, ttot), 0.5, "hook", "stock", resamples=FAST).point == pytest.approx(1.0)


def test_the_same_seed_gives_the_same_interval_and_another_seed_another():
    pairs = pair_requests(ab(3, 40, lambda v, rng: v * rng.uniform(0.5, 1.5)), ttot)
    one = paired_ratio(pairs, 0.5, "hook", "stock", resamples=FAST, seed=3)
    assert one == paired_ratio(pairs, 0.5, "hook", "stock", resamples=FAST, seed=3)
    other = paired_ratio(pairs, 0.5, "hook", "stock", resamples=FAST, seed=4)
    assert other.point == one.point and (one.low, one.high) != (other.low, other.high)


def test_a_request_failed_or_unmeasured_on_either_side_is_dropped_from_that_pair_only():
    runs = {"stock": {0: [request(0, 0.1), request(1, 0.2), request(2, 0.3), request(3, 0.4)]},
            "hook": {0: [request(0, 0.1), {**request(1, 0.2), "ok": False}, request(2, None), request(3, 0.4)]},
            "proxy": {0: [request(0, 0.1), request(1, 0.2), request(2, 0.3), request(3, 0.4)],
                      1: [request(0, 0.1)]}}  # a round stock did not run: never paired
    pairs = pair_requests(runs, ttot)
    assert paired_ratio(pairs, 0.5, "hook", "stock", resamples=10).n_requests == 2
    e = paired_ratio(pairs, 0.5, "proxy", "stock", resamples=10)
    assert (e.n_requests, e.n_rounds) == (4, 1)
    assert pairs.sent == {"stock": 4, "hook": 4, "proxy": 5}
    assert paired_ratio(pairs, 0.5, "hook", "missing", resamples=10) is None


def test_answer_itl_pools_every_token_gap_and_resamples_whole_requests():
    runs = {"stock": {0: [request(0, 0.1, output_itl=[0.01, 0.02, 0.03]), request(1, 0.1, output_itl=[0.04])]},
            "hook": {0: [request(0, 0.1, output_itl=[0.02, 0.04, 0.06]), request(1, 0.1, output_itl=[0.08])]}}
    e = paired_ratio(pair_requests(runs, answer_itl), 1.0, "hook", "stock", resamples=50)
    assert e.point == pytest.approx(2.0) and e.n_values == 4 and e.n_requests == 2
    assert e.within_low == pytest.approx(2.0) and e.within_high == pytest.approx(2.0)  # one round: no run-aware bounds


def test_quantiles_are_nearest_rank_like_the_load_tester():
    values = [float(i) for i in range(1, 101)]
    assert nearest_rank(values, 0.99) == 99.0
    assert nearest_rank(values, 0.5) == 50.0
    assert nearest_rank(values[:50], 0.99) == 50.0, "a p99 over 50 is the slowest one"


def test_a_tail_is_quoted_only_when_five_requests_set_it():
    assert tail_for(50) == 0.9, "50 * 0.1 = 5 (and not 4.999...)"
    assert not quotable(0.99, 50) and not quotable(0.95, 50) and quotable(0.9, 50)
    assert tail_for(500) == 0.99 and tail_for(499) == 0.95
    assert tail_for(100) == 0.95 and tail_for(99) == 0.9
    assert tail_for(10) == 0.5 and tail_for(9) is None
    assert tail_for(500, wanted=0.95) == 0.95
    e = Estimate(1.0, 0.9, 1.1, 50, 1, 0.99, 50)
    assert not e.quotable and Estimate(1.0, 0.9, 1.1, 50, 1, 0.9, 50).quotable


def test_an_interval_bound_past_a_hundredfold_reads_as_a_bound():
    wide = Estimate(2.0, 0.004, 26_089_358.07, 180, 2, 0.95, 180)
    assert wide.text() == "2.00 (under 0.01-over 100)"
    assert Estimate(0.6, 0.52, 0.71, 50, 3, 0.5, 50).text() == "0.60 (0.52-0.71)"
    assert Estimate(0.004, -0.002, 0.009, 50, 3, "share difference", 50).text() == "0.00 (-0.00-0.01)"


def test_wilson_matches_the_formula():
    z = statistics.NormalDist().inv_cdf(0.95)
    s = wilson(0, 10)
    assert s.low == 0.0 and s.high == pytest.approx(z * z / (10 + z * z), abs=1e-3)
    assert round(s.high, 3) == 0.213
    s = wilson(7, 20, confidence=0.95)  # the textbook case: 0.35 of 20, 95%: [0.181, 0.567]
    assert (round(s.low, 3), round(s.high, 3)) == (0.181, 0.567)
    assert wilson(10, 10).high == 1.0 and wilson(0, 0) is None



def test_a_share_over_rounds_that_agree_is_wilsons():
    assert clustered_wilson([(170, 180)] * 3) == wilson(510, 540)
    assert clustered_wilson([(180, 180), (180, 180)]) == wilson(360, 360)
    assert clustered_wilson([(0, 0)]) is None


def test_a_share_over_rounds_that_differ_carries_their_spread():
    """Each run's requests share its machine's pace: simulated rounds whose own share
    wanders (a beta around 0.9) must be covered about as often as the confidence says,
    which Wilson over the pooled requests is not."""
    rng = random.Random(11)
    covered = plain = 0
    trials = 300
    for _ in range(trials):
        rounds = []
        for _ in range(5):
            q = rng.betavariate(18, 2)  # this round's own share: mean 0.9, sd ~0.065
            rounds.append((sum(rng.random() < q for _ in range(180)), 180))
        s = clustered_wilson(rounds)
        covered += s.low <= 0.9 <= s.high
        w = wilson(sum(x for x, _ in rounds), 900)
        plain += w.low <= 0.9 <= w.high
    assert covered / trials >= 0.85, covered / trials
    assert plain / trials < 0.7, plain / trials
    spread = clustered_wilson([(169, 180), (178, 180), (104, 180), (135, 180), (160, 180)])
    assert spread.low < 0.7 < spread.point < spread.high < 0.95


class Interval:
    def __init__(self, low, high):
        self.low, self.high = low, high


def test_verdict_boundaries():
    assert verdict(Interval(0.3, 0.5), 0.5) == "met", "the target itself counts as reached"
    assert verdict(Interval(0.3, 0.51), 0.5) == "unresolved"
    assert verdict(Interval(0.5, 0.9), 0.5) == "unresolved"
    assert verdict(Interval(0.51, 0.9), 0.5) == "missed"
    assert verdict(Interval(0.95, 0.99), 0.95, better="higher") == "met"
    assert verdict(Interval(0.9, 0.96), 0.95, better="higher") == "unresolved"
    assert verdict(Interval(0.8, 0.94), 0.95, better="higher") == "missed"
    assert verdict(Interval(math.nan, math.nan), 0.5) == "unresolved"
    with pytest.raises(ValueError):
        verdict(Interval(0, 1), 0.5, better="smaller")


def test_do_no_harm_names_the_metric_that_decided():
    ok = Estimate(1.0, 0.9, 1.02, 10, 1, 0.5, 10)
    close = Estimate(1.0, 0.95, 1.05, 10, 1, 0.5, 10)
    wide = Estimate(1.0, 0.9, 1.2, 10, 1, 0.5, 10)
    bad = Estimate(1.3, 1.1, 1.5, 10, 1, 0.5, 10)
    assert do_no_harm({"TTFT": ok, "e2e": close}) == Harm("met", "e2e"), "met: the one that came closest"
    assert do_no_harm({"TTFT": ok, "e2e": wide}) == Harm("unresolved", "e2e")
    assert do_no_harm({"TTFT": wide, "e2e": bad}) == Harm("harm", "e2e"), "harm outranks an unresolved one"
    assert do_no_harm({"TTFT": ok, "TTFO": None}) == Harm("unresolved", "TTFO"), "unmeasured cannot be harmless"
    assert do_no_harm({}) == Harm("unresolved", "nothing measured")


def slo_request(index, ttft_s, ttfo_s, ttot_s, gap_s, ok=True, think=10):
    return {"index": index, "ok": ok, "ttft": ttft_s, "ttfo": ttfo_s, "think_to_output": ttot_s,
            "max_output_gap": gap_s, "usage_think_tokens": think}


def test_whole_request_slo_counts_start_and_answer_against_the_same_request_alone():
    alone = [slo_request(i, 0.1, 1.0, 0.05, 0.05) for i in range(7)]
    alone[6] = {**alone[6], "ok": False}  # no reference: cannot be judged, so dropped
    loaded = [
        slo_request(0, 0.45, 2.25, 0.25, 0.25),  # every limit exactly: met
        slo_request(1, 0.46, 1.5, 0.1, 0.1),  # TTFT over 2 x 0.1 + 0.25
        slo_request(2, 0.2, 2.3, 0.1, 0.1),  # TTFO over 2 x 1.0 + 0.25
        slo_request(3, 0.2, 1.5, 0.3, 0.1),  # TTOT over 250 ms
        slo_request(4, 0.2, 1.5, 0.1, None),  # one visible token, no gap: met
        slo_request(5, 0.2, None, None, None, ok=False),  # failed: counts as missing it
        slo_request(6, 0.2, 1.5, 0.1, 0.1),
    ]
    runs = {"stock": {0: loaded}}
    pairs = pair_requests(runs, whole_request_slo({0: alone}), keep_failed=True)
    s = share_of(pairs, "stock")
    assert (s.successes, s.n) == (2, 6)
    assert share_of(pair_requests(runs, whole_request_slo(alone), keep_failed=True), "stock").n == 6
    strict = WholeRequestSlo(start_factor=1.0, start_allowance_s=0.0)
    assert share_of(pair_requests(runs, whole_request_slo(alone, strict), keep_failed=True), "stock").successes == 0
    answer = share_of(pair_requests(runs, answer_only_slo(), keep_failed=True), "stock")
    assert (answer.successes, answer.n) == (5, 7), "the start does not count: 1, 2 and 6 pass too"


def test_ttot_is_waived_only_for_a_request_that_did_not_think():
    runs = {"stock": {0: [slo_request(0, 0.1, 0.2, None, 0.1, think=0), slo_request(1, 0.1, 0.2, None, 0.1)]}}
    s = share_of(pair_requests(runs, answer_only_slo(), keep_failed=True), "stock")
    assert (s.successes, s.n) == (1, 2)


def test_a_paired_share_difference_sees_an_slo_gain_on_the_same_requests():
    rng = random.Random(5)
    runs: dict = {"stock": {}, "hook": {}}
    for rnd in range(3):
        gaps = [rng.uniform(0.0, 0.5) for _ in range(80)]
        runs["stock"][rnd] = [slo_request(i, 0.1, 1, 0.1, g) for i, g in enumerate(gaps)]
        runs["hook"][rnd] = [slo_request(i, 0.1, 1, 0.1, g * 0.5) for i, g in enumerate(gaps)]
    pairs = pair_requests(runs, answer_only_slo(), keep_failed=True)
    d = paired_share_change(pairs, "hook", "stock", resamples=FAST)
    assert d.point == pytest.approx(share_of(pairs, "hook").point - share_of(pairs, "stock").point)
    assert 0 < d.low <= d.point <= d.high
    r = paired_share_change(pairs, "hook", "stock", kind="ratio", resamples=FAST)
    assert r.low > 1
    runs["stock"][0].append(slo_request(80, 0.1, 1, 0.1, None))  # one visible token: no gap, not an answer here
    stall = pair_requests(runs, stalled(0.25))
    assert share_of(stall, "stock").n == 240
    assert share_of(stall, "hook").successes == 0
    assert paired_share_change(stall, "hook", "stock", resamples=FAST).high < 0


def point(load, share, low, high):
    from realab.shares import Share
    return LoadPoint(load, 10 * load, Share(share, low, high, 0, 100))


def test_capacity_interpolates_where_the_share_first_falls_below_the_target():
    sweep = [point(0.5, 1.0, 0.97, 1.0), point(0.7, 0.99, 0.96, 1.0), point(0.9, 0.91, 0.88, 0.96),
             point(1.1, 0.5, 0.4, 0.6)]
    c = capacity_at_slo(sweep)
    assert c.load == pytest.approx(0.7 + 0.2 * (0.99 - 0.95) / (0.99 - 0.91))  # 0.8
    assert c.rate == pytest.approx(10 * c.load) and c.beyond is None
    assert c.conservative == pytest.approx(0.7 + 0.2 * (0.96 - 0.95) / (0.96 - 0.88))
    assert c.optimistic == pytest.approx(0.9 + 0.2 * (0.96 - 0.95) / (0.96 - 0.6))
    assert c.conservative < c.load < c.optimistic
    assert capacity_at_slo([point(0.5, 0.9, 0.8, 0.95)]).beyond == "below"
    above = capacity_at_slo(sweep[:2])
    assert (above.load, above.beyond) == (0.7, "above")


def test_capacity_ratio_pairs_each_end_with_the_others_opposite_end():
    config = Capacity(0.9, 9.0, 0.8, 1.0, None)
    stock = Capacity(0.6, 6.0, 0.5, 0.75, None)
    assert capacity_ratio(config, stock) == pytest.approx((1.5, 0.8 / 0.75, 1.0 / 0.5))
    assert capacity_ratio(Capacity(None, None, None, 0.5, "below"), stock) is None
    assert capacity_ratio(config, Capacity(0.6, 6.0, None, 0.75, None))[2] == math.inf


def test_runs_are_read_from_measures_raw_file_names(tmp_path):
    import json
    for rnd, config in [(0, "stock"), (1, "hook-fcfs"), (0, "hook-fcfs")]:
        raw = {"runs": [{"requests": [request(rnd, 0.1)]}]}
        (tmp_path / f"mix-0.9-{rnd}-{config}.json").write_text(json.dumps(raw))
    (tmp_path / "mix-0.5-0-stock.json").write_text("{}")
    runs = read_runs(tmp_path, "mix", 0.9)
    assert sorted(runs) == ["hook-fcfs", "stock"] and sorted(runs["hook-fcfs"]) == [0, 1]


def test_t_quantiles_match_the_table():
    assert t_quantile(0.95, 1) == pytest.approx(6.3138, abs=1e-3)
    assert t_quantile(0.95, 5) == pytest.approx(2.0150, abs=1e-3)
    assert t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-3)
    assert t_quantile(0.95, 30) == pytest.approx(1.6973, abs=1e-3)
    assert run_spread_factor(1) is None
    assert run_spread_factor(6) == pytest.approx(2.0150 / 1.6449 * math.sqrt(6 / 5), abs=1e-3)


def a_a(rounds: int, n: int, run_sd: float, seed: int) -> dict:
    """The same engine measured twice per round: each whole run draws one factor that
    every request in it shares (a burst, a slow start), then each request its own small
    noise. No effect: every ratio's truth is 1."""
    rng = random.Random(seed)
    runs: dict = {"stock": {}, "again": {}}
    for rnd in range(rounds):
        base = [rng.lognormvariate(-1, 1.0) for _ in range(n)]
        for config in runs:
            run = rng.lognormvariate(0, run_sd)
            runs[config][rnd] = [request(i, v * run * rng.lognormvariate(0, 0.1)) for i, v in enumerate(base)]
    return runs


def test_intervals_carry_run_to_run_spread_that_pairing_cannot_cancel():
    # Run-level spread dominates, as the rig's A/A showed: over two rounds the bootstrap
    # alone covers the truth far less often than 90%; widened for the rounds' count, it does.
    trials = 120
    covered = within = 0
    for seed in range(trials):
        e = paired_ratio(pair_requests(a_a(2, 60, 0.3, seed), ttot), 0.5, "again", "stock", resamples=200)
        covered += e.low <= 1 <= e.high
        within += e.within_low <= 1 <= e.within_high
        assert e.low <= e.within_low <= e.point <= e.within_high <= e.high
    assert covered / trials >= 0.9
    assert within / trials <= 0.75


def test_a_single_round_gives_an_effect_but_no_verdict():
    pairs = pair_requests(ab(1, 80, lambda v, _: 3 * v), ttot)
    e = paired_ratio(pairs, 0.5, "hook", "stock", resamples=FAST)
    assert e.point == pytest.approx(3.0) and e.within_low == pytest.approx(3.0)
    assert not e.run_aware and verdict(e, 1.05) == "unresolved"
    harm = do_no_harm({"TTOT p50": e})
    assert harm.word == "unresolved" and "single round" in harm.decided_by
    two = paired_ratio(pair_requests(ab(2, 80, lambda v, _: 3 * v), ttot), 0.5, "hook", "stock", resamples=FAST)
    assert two.run_aware and do_no_harm({"TTOT p50": two}).word == "harm"


def test_an_unresolved_verdict_says_how_many_rounds_would_settle_it():
    from realab.stats import rounds_to_settle, run_spread_factor

    # Four rounds, a harmless point whose interval reaches 1.2: the half-width must fall
    # from log(1.2) to log(1.05) (by 3.7x), which the rounds' count buys as
    # spread(n) / sqrt(n) does.
    e = Estimate(1.0, 0.85, 1.2, 400, 4, 0.95, 400)
    n = rounds_to_settle(e)
    assert n is not None and n > 4
    shrink = lambda m: run_spread_factor(m) / math.sqrt(m) / (run_spread_factor(4) / math.sqrt(4))  # noqa: E731
    assert math.log(1.2) * shrink(n) < math.log(1.05) <= math.log(1.2) * shrink(n - 1)
    harm = do_no_harm({"TTFT p95": e, "e2e p50": Estimate(1.0, 0.97, 1.04, 400, 4, 0.5, 400)})
    assert harm.word == "unresolved" and harm.settling.side == "met" and harm.settling.rounds == n
    assert f"about {n} rounds in all would settle it as met, by TTFT p95" in harm.settle_text()

    # A point above the bound can only settle as harm: by the first interval to clear it.
    slow = Estimate(1.15, 1.0, 1.32, 400, 4, 0.99, 400)
    slower = Estimate(1.30, 1.01, 1.7, 400, 4, 0.5, 400)
    harm = do_no_harm({"TTFT p99": slow, "TTOT p50": slower, "e2e p50": e})
    assert harm.word == "unresolved" and harm.settling.side == "harm"
    assert harm.settling.metric == min(["TTFT p99", "TTOT p50"], key=lambda k: rounds_to_settle(
        {"TTFT p99": slow, "TTOT p50": slower}[k]))

    # A point on the bound never settles; a hopeless spread says "more than" the limit.
    assert rounds_to_settle(Estimate(1.05, 0.9, 1.2, 400, 4, 0.5, 400)) is None
    far = do_no_harm({"TTFT p99": Estimate(1.04, 0.5, 2.0, 400, 2, 0.99, 400)})
    assert far.settling.rounds is None and "more than 100 rounds" in far.settle_text()
    # One round has no spread to project.
    assert rounds_to_settle(Estimate(1.0, 0.9, 1.2, 400, 1, 0.5, 400)) is None
