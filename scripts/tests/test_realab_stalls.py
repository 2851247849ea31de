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
