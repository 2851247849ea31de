"""Where an answer's stalls come from. Each gap over a threshold between the answer tokens
a client saw is set against the engine's step trace on the same clock: it is the
engine's when no step completed for at least half of it (one long step, or the engine
idle), else the delivery path's (the engine kept stepping while the tokens waited on
their way to the client: API server, proxy, load tester, OS). Under the hook, whose trace
says what prefill cap its policy set for each step, an engine stall is also sorted by the
step that held it: capped (the policy's limits in force and the step long all the same)
or not.

A stall in delivery is out of any scheduler's reach, and on a GPU host, where the
delivery path has cores of its own, it should be rare. But "the engine kept stepping" is
not only delivery: a token that shows no text of its own reaches the client in the chunk
of a later one, so a run of them is a gap while every step made the request's tokens. The
benchmark model's tokens are random, and many show nothing (special tokens, byte pieces
of a character never completed), so the page counts, beside each configuration's stalls
by kind, the share of its tokens that came without a chunk of their own (`page_lines`):
where that share is large, a gap between visible tokens is a run of silent tokens, each a
whole step, whatever the delivery path does."""

from __future__ import annotations

import bisect

#: An answer gap past this is a stall (the answer-only SLO's largest-gap bound).
THRESHOLD_S = 0.25


def completion(step: dict) -> tuple[float, bool | None]:
    """(end time, whether the policy capped the step: None where the trace does not say)
    of one step of a trace."""
    return step["t"] + step["step_s"], (step["prefill_cap"] is not None) if "prefill_cap" in step else None


def completions(steps: list[dict]) -> list[tuple[float, bool | None]]:
    """`completion` of each step of a trace, by end time."""
    return sorted((completion(s) for s in steps), key=lambda c: c[0])


def attribute(requests: list[dict], done: list[tuple[float, bool | None]], t0: float,
              threshold_s: float = THRESHOLD_S) -> dict[str, int]:
    """{cause: stalls} over `requests` (the load tester's, with `token_times` from each
    request's send), `done` its engine's step completions (`completions`) and `t0` the
    run's start on the engine's clock. Client times are placed on that clock by the run's
    start, which is known to within the tester's start-up (tens of milliseconds), so each
    gap is widened by 0.1 s either side before the steps inside it are looked at."""
    ends = [c for c, _ in done]
    traced_caps = any(cap is not None for _, cap in done)
    out = {"engine": 0, "delivery": 0}
    if traced_caps:
        out.update(engine_uncapped=0, engine_capped=0)
    for r in requests:
        if not r.get("ok") or r.get("ttfo") is None:
            continue
        # (A record without its token times, as older tester output, has no gaps to sort.)
        times = [t for t in r.get("token_times") or () if t >= r["ttfo"] - 1e-9]
        for a, b in zip(times, times[1:]):
            if b - a <= threshold_s:
                continue
            lo, hi = t0 + r["sent_at"] + a - 0.1, t0 + r["sent_at"] + b + 0.1
            first, last = bisect.bisect_left(ends, lo), bisect.bisect_right(ends, hi)
            marks = [lo, *ends[first:last], hi]
            longest, at = max((y - x, i) for i, (x, y) in enumerate(zip(marks, marks[1:])))
            engine = longest >= 0.5 * (b - a)
            out["engine" if engine else "delivery"] += 1
            # The step that ended the longest quiet spell held the stall (none when the
            # spell ran to the widened gap's end).
            held = first + at if engine and traced_caps and at < last - first else None
            if held is not None:
                out["engine_capped" if done[held][1] else "engine_uncapped"] += 1
    return out


def tally(runs: dict[str, dict[int, list[dict]]], ends: dict[tuple, list[tuple[float, bool | None]]],
          starts: dict[tuple, float], workload: str, load: float) -> dict[str, dict[str, int]]:
    """{config: stalls by cause, summed over its rounds} for the runs whose engine's trace
    was kept (`ends`, by run key as `regime.run_key` makes them; `starts`: each run's
    window start on the engine's clock); a configuration with no such run is left out."""
    out: dict[str, dict[str, int]] = {}
    for config, by_round in runs.items():
        for rnd, requests in by_round.items():
            key = (config, workload, load, rnd)
            if key not in ends or key not in starts:
                continue
            total = out.setdefault(config, {"runs": 0, "tokens": 0, "chunks": 0})
            total["runs"] += 1
            for cause, n in attribute(requests, ends[key], starts[key]).items():
                total[cause] = total.get(cause, 0) + n
            for r in requests:
                # The engine's count of the whole completion (usage) against the chunks
                # that carried its text to the client. Over the whole completion, since
                # vLLM reports no thinking count: the tester's (and the proxy's) split of
                # usage into thinking and answer is its count of thinking chunks, so a
                # silent thinking token would be counted among the answer's.
                used = (r.get("usage_think_tokens") or 0) + (r.get("usage_output_tokens") or 0)
                if r.get("ok") and used:
                    total["tokens"] += used
                    total["chunks"] += min((r.get("client_think_tokens") or 0) + (r.get("client_output_tokens") or 0), used)
    return out


def page_lines(found: dict[str, dict[str, int]], configs: list[str]) -> list[str]:
    """The page's sentence on each configuration's answer stalls by kind (`tally`), and
    the share of its tokens that reached the client without a chunk of their own."""
    parts = []
    for config in configs:
        t = found.get(config)
        if not t:
            continue
        eng, kept, runs = t.get("engine", 0), t.get("delivery", 0), t["runs"]
        where = f"in {runs} run{'s' if runs > 1 else ''}"
        silent = (f"; {100 * (1 - t['chunks'] / t['tokens']):.0f}% of its tokens without a chunk of their own"
                  if t.get("tokens") else "")
        if eng + kept == 0:
            parts.append(f"{config}: none {where}{silent}")
            continue
        capped = (f", {t['engine_capped']} of them held by a step the policy capped"
                  if t.get("engine_capped") else "")
        parts.append(f"{config}: {eng + kept} {where}, {eng} ({100 * eng / (eng + kept):.0f}%) held by the engine"
                     f"{capped}, {kept} ({100 * kept / (eng + kept):.0f}%) while it kept stepping{silent}")
    if not parts:
        return []
    return ["", f"Where the answers' stalls over {1000 * THRESHOLD_S:.0f} ms came from (`stalls.attribute`: each "
            "set against its engine's step trace): held by the engine when no step completed through at least half "
            "of it (a long step, or the engine idle); while it kept stepping otherwise, when the request's tokens "
            "either showed no text of their own (the benchmark model's random tokens include special tokens and "
            "byte pieces of characters never completed; such a token reaches the client in a later token's chunk) "
            "or waited on their way to the client (delivery, out of any scheduler's reach). The rig cannot tell "
            "those two apart; the share of tokens (thinking and answer) that came without a chunk of their own says "
            "how much the first can explain: " + "; ".join(parts) + "."]
