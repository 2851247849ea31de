"""The real-engine A/B sorts every answer stall a reader saw by its cause: the engine (no
step completed through most of it) or the delivery path, and under the hook by whether
the step that held it was one the policy had capped. Small hand-made traces pin it."""

from __future__ import annotations



from realab.measure import attribute_stalls


def raw(token_times: list[float]) -> dict:
    """One request sent at 0 whose first visible token came at its first token time."""
    return {"runs": [{"requests": [{"ok": True, "sent_at": 0.0, "ttfo": token_times[0],
                                    "token_times": token_times}]}]}


def steps(ends_and_caps: list[tuple[float, float, object]]) -> list[dict]:
    out = []
    for start, end, cap in ends_and_caps:
        s = {"t": start, "step_s": end - start}
        if cap != "absent":
            s["prefill_cap"] = cap
        out.append(s)
    return out


def test_a_stall_inside_one_long_step_is_the_engines():
    # Tokens at 1.0 and 1.6 s; one step ran from 0.95 to 1.55 s.
    trace = steps([(0.9, 0.95, "absent"), (0.95, 1.55, "absent"), (1.55, 1.6, "absent")])
    assert attribute_stalls(raw([1.0, 1.6]), trace, t0=0.0) == {"engine": 1, "delivery": 0}


def test_a_stall_while_the_engine_kept_stepping_is_the_delivery_paths():
    trace = steps([(0.9 + 0.05 * i, 0.95 + 0.05 * i, "absent") for i in range(15)])
    assert attribute_stalls(raw([1.0, 1.6]), trace, t0=0.0) == {"engine": 0, "delivery": 1}


def test_short_gaps_are_no_stall():
    trace = steps([(0.9, 0.95, "absent")])
    assert attribute_stalls(raw([1.0, 1.1, 1.2]), trace, t0=0.0) == {"engine": 0, "delivery": 0}


def test_under_the_hook_the_holding_step_says_whether_it_was_capped():
    uncapped = steps([(0.9, 0.95, 128), (0.95, 1.55, None), (1.55, 1.6, 0)])
    capped = steps([(0.9, 0.95, None), (0.95, 1.55, 128), (1.55, 1.6, 0)])
    assert attribute_stalls(raw([1.0, 1.6]), uncapped, t0=0.0) == {
        "engine": 1, "delivery": 0, "engine_uncapped": 1, "engine_capped": 0}
    assert attribute_stalls(raw([1.0, 1.6]), capped, t0=0.0) == {
        "engine": 1, "delivery": 0, "engine_uncapped": 0, "engine_capped": 1}


def test_the_page_counts_each_configurations_stalls_from_its_own_engines_kept_trace(tmp_path):
    """Through the kept set: each run's stalls are set against its own engine's trace in
    the run's window (stock's engine for stock, the hook's for the hook), summed over the
    rounds, and the page's sentence says how many were the engine's and the delivery path's."""
    import gzip
    import json

    from realab import regime, stalls, traced

    def step(t: float, step_s: float, cap="absent") -> str:
        s = {"t": t, "tokens": 8, "prefill_tokens": 0, "decode_reqs": 2, "decode_context": 100, "step_s": step_s}
        if cap != "absent":
            s["prefill_cap"] = cap
        return json.dumps(s) + "\n"
    set_dir = tmp_path / "set"
    (set_dir / "steps").mkdir(parents=True)
    # Stock's engine (runs from t=100): one 0.6 s step holds its request's answer.
    stock = [step(100.9, 0.05), step(100.95, 0.6), step(101.55, 0.05)]
    # The hook's engine (runs from t=200): it keeps stepping through its request's stall,
    # then one capped 0.6 s step holds the second stall.
    hook = [step(200.9 + 0.05 * i, 0.05, None) for i in range(15)] + [step(202.0, 0.6, 128), step(202.6, 0.05, None)]
    for stem, lines in {"stock-w1": stock, "hook@w1": hook}.items():
        with gzip.open(set_dir / "steps" / f"{stem}.jsonl.gz", "wt") as f:
            f.write("".join(lines))
    runs = [{"config": "stock", "workload": "long", "load": 0.9, "round": 0, "window": [100, 110], "work": "w1"},
            {"config": "hook", "workload": "long", "load": 0.9, "round": 0, "window": [200, 210], "work": "w1"}]
    readings = regime.run_readings(set_dir, {"runs": runs})
    starts = {regime.run_key(r): r["window"][0] for r in runs}
    # Stock's request: 8 tokens, 4 of them silent, 2 in its thinking. vLLM reports no
    # thinking count, so the tester's split of usage counts the thinking chunks (2) as
    # its thinking and the silent thinking tokens among the answer's: only the whole
    # completion's count is the engine's.
    requests = {"stock": {0: [{"ok": True, "sent_at": 0.0, "ttfo": 1.0, "token_times": [1.0, 1.6],
                               "usage_think_tokens": 2, "usage_output_tokens": 6,
                               "client_think_tokens": 2, "client_output_tokens": 2}]},
                "hook": {0: [{"ok": True, "sent_at": 0.0, "ttfo": 1.0, "token_times": [1.0, 1.6, 1.7, 2.65],
                              "usage_think_tokens": 4, "usage_output_tokens": 4,
                              "client_think_tokens": 4, "client_output_tokens": 4}]}}
    found = stalls.tally(requests, readings.ends, starts, "long", 0.9)
    assert found["stock"] == {"runs": 1, "engine": 1, "delivery": 0, "tokens": 8, "chunks": 4}
    assert found["hook"] == {"runs": 1, "engine": 1, "delivery": 1, "engine_uncapped": 0, "engine_capped": 1,
                             "tokens": 8, "chunks": 8}
    line = " ".join(traced.load_lines({"runs": runs}, None, found, "long", 0.9, ["hook"], {}))
    assert ("stock: 1 in 1 run, 1 (100%) held by the engine, 0 (0%) while it kept stepping; 50% of its "
            "tokens without a chunk of their own") in line
    assert ("hook: 2 in 1 run, 1 (50%) held by the engine, 1 of them held by a step the policy capped, 1 (50%) "
            "while it kept stepping; 0% of its tokens") in line
    # A run whose engine's trace was not kept is not guessed at.
    assert stalls.tally(requests, {}, starts, "long", 0.9) == {}
