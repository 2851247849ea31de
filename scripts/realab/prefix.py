"""The prefix cache on a real vLLM (CPU build), under multi-turn conversations: stock LRU
eviction against the hook's, which sends a finished request's thought blocks (which no
later turn can hit: the chat template drops the thinking, and a block's key chains over
every token before it) to the front of vLLM's free queue. Run by
`python -m realab prefix measure|report`:

    python -m realab prefix measure ROOT MODEL_DIR RESULTS_JSON
    python -m realab prefix report RESULTS_JSON RAW_DIR OUT_MD [SIM]

`measure` starts, for each KV cache size, a stock engine and a hooked one (`hook-fcfs`:
the hook reordering nothing, so eviction is all that differs; behind Meridian, as the
product runs) with prefix caching on and per-request cached-token counts
(`--enable-prompt-tokens-details`), empties each engine's prefix cache before each run
(vLLM's `/reset_prefix_cache`, dev mode), and drives the same conversations, same seed a
round, at each cache size with meridian-loadtest `--dataset-name conversations`. The
engines sample as they would in production (vLLM's CPU build takes no per-request seed), so
the two sides share each turn's message, lengths and arrival time, not the answers' words:
each history is as long on both sides, not the same text. `report` pairs the runs by conversation (each round's
own ratio, their geometric mean over the rounds, in a cluster bootstrap: conversations
resampled within rounds, rounds resampled, widened for the rounds' count as every
real-engine interval is) and, given the twin's binary, puts its prediction for
the same conversations on the rig's fitted profile beside each measured effect.

Knobs (environment): REALAB_PREFIX_BLOCKS (KV cache sizes in 128-token blocks, default
48,96), REALAB_PREFIX_RATE (conversations started per second, default 0.2),
REALAB_CONVERSATIONS (default 30), REALAB_TURNS (default 5), REALAB_PREFIX_THINK (a
thought's tokens, default 128: longer thoughts leave more dead blocks a turn),
REALAB_PREFIX_THINK_TIME_S (the mean wait between an answer and the next message, default
3; a few tens of milliseconds is an agent's tool loop), REALAB_ROUNDS (default 2),
REALAB_FIRST_ROUND, REALAB_CONFIGS (default stock,hook-fcfs), REALAB_CALM_S."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from . import drift, machine, rig
from . import measure as m
from . import stats as S

#: The benchmark model's tokenizer makes about 2.6 tokens of each of the load tester's
#: synthetic words (the long workload's 1,000 words are ~2,606 tokens as vLLM counts
#: them); thoughts and answers are counted in tokens (think budgets, `--ignore-eos`).
TOKENS_PER_WORD = 2.6


#: One turn of the conversations: a new user message (in words), a thought and an answer
#: (in tokens), each uniform within +-`range_ratio` of its length; a system prompt (in
#: words) every conversation shares; a mean wait (exponential) between an answer's end
#: and the next message. A fifth turn's prompt is then ~950 tokens.
@dataclass(frozen=True)
class Shape:
    message: int = 40
    think: int = 128
    answer: int = 32
    range_ratio: float = 0.25
    system: int = 100
    turns: int = 5
    think_time_s: float = 3.0

    def tester_args(self, conversations: int) -> list[str]:
        return ["--dataset-name", "conversations", "--num-prompts", str(conversations),
                "--turns", str(self.turns), "--system-prompt-len", str(self.system),
                "--think-time", f"{self.think_time_s:g}", "--random-input-len", str(self.message),
                "--random-think-len", str(self.think), "--random-output-len", str(self.answer),
                "--random-range-ratio", f"{self.range_ratio:g}"]

    def longest_request(self, tokens_per_word: float = TOKENS_PER_WORD) -> int:
        """The last turn's tokens at their longest: the system prompt, every turn's
        message and every earlier answer (the history), then its own thought and answer."""
        hi = 1 + self.range_ratio
        history = (self.system + self.turns * self.message * hi) * tokens_per_word \
            + (self.turns - 1) * self.answer * hi
        return int(history + (self.think + self.answer) * hi) + 1

    def twin_workload(self, tokens_per_word: float = TOKENS_PER_WORD) -> str:
        """The same turn as a twin workload file (uniform lengths, in tokens)."""
        def uniform(n: float) -> str:
            lo, hi = round(n * (1 - self.range_ratio)), round(n * (1 + self.range_ratio))
            return f'{{ kind = "uniform", min = {lo}, max = {hi} }}'
        return (f"prompt = {uniform(self.message * tokens_per_word)}\nthink = {uniform(self.think)}\n"
                f"answer = {uniform(self.answer)}\n")


#: The longest conversation must fit: 5 turns of the default shape reach ~1,200 tokens,
#: with 600-token thoughts ~1,850 (`Shape.longest_request`; `Plan.from_env` refuses a shape
#: that does not fit).
MAX_MODEL_LEN = 2048
CONFIGS = ["stock", "hook-fcfs"]


@dataclass(frozen=True)
class Plan:
    blocks: list[int]
    rate: float
    conversations: int
    rounds: int
    first_round: int
    configs: list[str]
    calm_s: float
    shape: Shape = Shape()

    @staticmethod
    def from_env() -> "Plan":
        configs = os.environ.get("REALAB_CONFIGS", ",".join(CONFIGS)).split(",")
        if configs[0] != "stock" or any(c != "stock" and not c.startswith("hook-") for c in configs):
            raise SystemExit(f"REALAB_CONFIGS: stock first, then hook-<policy>; got {configs}")
        try:
            default = Shape()
            shape = Shape(turns=int(os.environ.get("REALAB_TURNS", str(default.turns))),
                          think=int(os.environ.get("REALAB_PREFIX_THINK", str(default.think))),
                          think_time_s=float(os.environ.get("REALAB_PREFIX_THINK_TIME_S",
                                                            f"{default.think_time_s:g}")))
            plan = Plan(blocks=[int(b) for b in os.environ.get("REALAB_PREFIX_BLOCKS", "48,96").split(",")],
                        rate=float(os.environ.get("REALAB_PREFIX_RATE", "0.2")),
                        conversations=int(os.environ.get("REALAB_CONVERSATIONS", "30")),
                        rounds=int(os.environ.get("REALAB_ROUNDS", "2")),
                        first_round=int(os.environ.get("REALAB_FIRST_ROUND", "0")),
                        configs=configs, calm_s=float(os.environ.get("REALAB_CALM_S", "60")),
                        shape=shape)
        except ValueError as e:
            raise SystemExit(f"REALAB_PREFIX_*: {e}") from e
        if shape.longest_request() > MAX_MODEL_LEN:
            raise SystemExit(f"REALAB_PREFIX_*: a last turn of up to {shape.longest_request()} tokens does not "
                             f"fit the engines' {MAX_MODEL_LEN}-token context; fewer turns or a shorter thought")
        return plan


def engine_spec(base: m.rig.EngineSpec, blocks: int) -> m.rig.EngineSpec:
    """The rig's engine with the prefix cache on, `blocks` of KV cache, each request's
    cached tokens reported in its usage, and vLLM's stats on (its prefix-cache counters
    are read around each run)."""
    extra = [a for a in base.extra if a != "--no-enable-prefix-caching"]
    return dataclasses.replace(base, max_model_len=MAX_MODEL_LEN, log_stats=True, extra=[
        *extra, "--enable-prefix-caching", "--enable-prompt-tokens-details", "--num-gpu-blocks-override", str(blocks)])


def described(spec: m.rig.EngineSpec) -> dict[str, str]:
    """An engine spec as the results record it (its Python interpreter left out)."""
    return {k: str(v) for k, v in dataclasses.asdict(spec).items() if k != "python"}


def reset_prefix_cache(engine: rig.Proc) -> None:
    """Empties the engine's prefix cache (it must be idle: vLLM refuses while blocks are
    held, so retry briefly while the last run's requests drain)."""
    for _ in range(60):
        r = requests.post(engine.url + "/reset_prefix_cache", timeout=30)
        if r.status_code == 200:
            return
        time.sleep(1.0)
    raise RuntimeError(f"{engine.name}: /reset_prefix_cache answered {r.status_code}: {r.text[:200]}")


def run_file(blocks: int, rnd: int, config: str) -> str:
    return f"prefix-{blocks}-{rnd}-{config}.json"


def loadtest(s: m.Setup, url: str, metrics_url: str, plan: Plan, rate: float, seed: int, out: Path,
             conversations: int | None = None) -> dict:
    # The engine's own sampling: vLLM's CPU build cannot take a per-request seed, and
    # greedy decoding makes the qwen3 reasoning parser see no thought (the whole output
    # lands in `content`, so thinking would enter the next turn's history). The two sides
    # are paired by shape (the same messages, thought and answer lengths, arrival times),
    # not by the answers' words. The thought ends at its budget, never by itself.
    extra = json.dumps({"logit_bias": {str(s.think_end_id): -100}})
    cmd = [str(s.root / "target" / "release" / "meridian-loadtest"), "--base-url", url,
           "--model", s.spec.served_name, "--model-family", "qwen3", "--request-rate", f"{rate:.6f}",
           "--seed", str(seed), "--ignore-eos", "--extra-body", extra, "--metrics-url", metrics_url,
           "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name, "--disable-tqdm",
           *plan.shape.tester_args(conversations or plan.conversations)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    return json.loads(out.read_text())


def measure(s: m.Setup, plan: Plan, results: Path, log=print) -> dict:
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # /reset_prefix_cache; the children inherit it
    data: dict = {"setup": {"shape": dataclasses.asdict(plan.shape), "rate": plan.rate,
                            "conversations": plan.conversations, "blocks": plan.blocks, "rounds": plan.rounds,
                            "first_round": plan.first_round, "configs": plan.configs,
                            # Each cache size's engine as it was started (the rig's base engine
                            # with the prefix cache on: `engine_spec`).
                            "engines": {str(b): described(engine_spec(s.spec, b)) for b in plan.blocks}},
                  "runs": [], "work": str(s.work)}
    raw = s.work / "runs"
    raw.mkdir(parents=True, exist_ok=True)
    base = s.spec
    for blocks in plan.blocks:
        s.spec = engine_spec(base, blocks)
        r = m.Rig(s)
        try:
            for config in plan.configs:
                # A fresh engine's first steps of each shape are slow: a few conversations
                # first, then an empty cache.
                url, engine = r.activate(config)
                loadtest(s, url, engine.url + "/metrics", plan, 1.0, 999, raw / f"warm-{blocks}-{config}.json",
                         conversations=4)
            for rnd in range(plan.first_round, plan.first_round + plan.rounds):
                n = len(plan.configs)
                order = plan.configs[rnd % n:] + plan.configs[:rnd % n]
                for config in order:
                    url, engine = r.activate(config)
                    reset_prefix_cache(engine)
                    waited = drift.calm(plan.calm_s) if plan.calm_s > 0 else 0.0
                    # The hook serves its own counters on its channel port.
                    hook_metrics = f"http://127.0.0.1:{r.hook_port}/metrics" if m.policy_of(config) else None
                    before = rig.scrape(engine.url + "/metrics")
                    hook_before = rig.scrape(hook_metrics) if hook_metrics else {}
                    cpu0 = machine.sample()
                    t0 = time.perf_counter()
                    out = loadtest(s, url, engine.url + "/metrics", plan, plan.rate, rnd,
                                   raw / run_file(blocks, rnd, config))
                    t1 = time.perf_counter()
                    after = rig.scrape(engine.url + "/metrics")
                    hook_after = rig.scrape(hook_metrics) if hook_metrics else {}
                    summ = out["runs"][0]["summary"]
                    run = {"blocks": blocks, "round": rnd, "config": config, "policy": m.policy_of(config),
                           "window": [t0, t1], "calm_wait_s": waited, "summary": summ,
                           "vllm_preemptions": m.delta(before, after, "vllm:num_preemptions_total"),
                           # The hook's count of finished thoughts' blocks it moved to the
                           # front of the free queue (None on stock: no such counter).
                           "demoted_blocks": m.delta(hook_before, hook_after,
                                                     "meridian_hook_kv_demoted_blocks_total"),
                           "cpu": machine.between(cpu0, machine.sample())}
                    data["runs"].append(run)
                    later = summ.get("later_turns") or {}
                    log(f"blocks {blocks} round {rnd} {config}: later turns hit "
                        f"{later.get('hit_rate')}, TTFT p95 {(later.get('ttft') or {}).get('p95_ms')} ms, "
                        f"vLLM hit rate {(summ.get('prefix_cache') or {}).get('hit_rate')}, "
                        f"preemptions {run['vllm_preemptions']}, blocks demoted {run['demoted_blocks']}")
                    results.write_text(json.dumps(data, indent=1))
        finally:
            r.stop()
    s.spec = base
    results.write_text(json.dumps(data, indent=1))
    return data


# --- The report ----------------------------------------------------------------------------

#: The issue's targets, each judged by its interval: later turns' hit rate at least 1.5x
#: stock's, their p95 TTFT at least 30% lower, and no loss of throughput (within 5%).
TARGETS = {"hit rate": (1.5, "higher"), "p95 TTFT": (0.7, "lower"), "throughput": (0.95, "higher")}


def by_conversation(requests_: list[dict], value, later: bool = True) -> dict[int, tuple[float, ...]]:
    """{conversation: the values of its later turns (or of all its turns)}, for the
    cluster bootstrap."""
    out: dict[int, list[float]] = {}
    for r in requests_:
        if r.get("ok") and (not later or (r.get("turn") or 0) > 0):
            v = value(r)
            if v is not None:
                out.setdefault(r["conversation"], []).extend(v)
    return {c: tuple(v) for c, v in out.items() if v}


def pairs_of(raw: Path, blocks: int, configs: list[str], value, later: bool = True) -> S.Paired:
    values: dict = {}
    sent: dict = {}
    for config in configs:
        for f in sorted(raw.glob(f"prefix-{blocks}-*-{config}.json*")):
            rnd = int(f.name.split("-")[2])
            reqs = S.read_requests(f)
            sent[config] = sent.get(config, 0) + len(reqs)
            values.setdefault(config, {})[rnd] = by_conversation(reqs, value, later)
    return S.Paired(values, sent)


def hit_rate_of(values: list[float]) -> float | None:
    cached, prompt = sum(values[0::2]), sum(values[1::2])
    return cached / prompt if prompt > 0 else None


def effects(raw: Path, blocks: int, config: str, resamples: int = 2000) -> dict[str, S.Estimate | None]:
    """The config over stock at one cache size: later turns' hit rate, their p50 and p95
    TTFT, and their mean end-to-end time, each with its cluster-bootstrap interval."""
    pair = [config, "stock"]
    hits = pairs_of(raw, blocks, pair, lambda r: None if r.get("cached_tokens") is None
                    else (float(r["cached_tokens"]), float(r.get("prompt_tokens") or 0)))
    ttft = pairs_of(raw, blocks, pair, lambda r: None if r.get("ttft") is None else (r["ttft"],))
    e2e = pairs_of(raw, blocks, pair, lambda r: None if r.get("e2e") is None else (r["e2e"],), later=False)

    def ratio_of_rates(a, b):
        ha, hb = hit_rate_of(a), hit_rate_of(b)
        return ha / hb if ha is not None and hb else None

    def quantile_ratio(q):
        def stat(a, b):
            return S._ratio(S.nearest_rank(sorted(a), q), S.nearest_rank(sorted(b), q))
        return stat

    return {"hit rate": S._estimate(hits, config, "stock", ratio_of_rates, "hit-rate ratio", resamples, 0, 0.9),
            "p50 TTFT": S._estimate(ttft, config, "stock", quantile_ratio(0.5), 0.5, resamples, 0, 0.9),
            "p95 TTFT": S._estimate(ttft, config, "stock", quantile_ratio(0.95), 0.95, resamples, 0, 0.9),
            # The cost side: every turn's time from send to last token, the first turns'
            # included (a slower engine shows here before it shows in throughput, which an
            # open-loop run below capacity holds at the offered rate).
            "mean turn time (all turns)": S._estimate(
                e2e, config, "stock", lambda a, b: S._ratio(sum(a) / len(a), sum(b) / len(b)), "mean",
                resamples, 0, 0.9)}


def round_interval(ratios: list[float], confidence: float = 0.9) -> tuple[float, float, float] | None:
    """A run-level ratio's geometric mean over rounds with its t interval (in logs); None
    for fewer than two rounds."""
    import math
    import statistics

    if len(ratios) < 2 or any(x <= 0 for x in ratios):
        return None
    logs = [math.log(x) for x in ratios]
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = S.t_quantile(1 - (1 - confidence) / 2, len(logs) - 1) * sd / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def throughput_ratios(data: dict, blocks: int, config: str) -> list[float]:
    """Per round, the config's total token throughput over stock's."""
    by = {(r["round"], r["config"]): r["summary"]["total_token_throughput"] for r in data["runs"]
          if r["blocks"] == blocks}
    return [by[(rnd, config)] / by[(rnd, "stock")] for rnd in sorted({k[0] for k in by})
            if (rnd, config) in by and by.get((rnd, "stock"))]


def tokens_per_word(raw: Path, shape: Shape) -> float:
    """The tokenizer's tokens per synthetic word, as the runs' first turns measured them
    (the server's prompt tokens over the words sent, system prompt and message); the
    module's constant when no first turn reported its count."""
    import statistics

    counts = [r["prompt_tokens"] for f in raw.glob("prefix-*-*-stock.json*") for r in S.read_requests(f)
              if r.get("ok") and r.get("turn") == 0 and r.get("prompt_tokens")]
    if not counts:
        return TOKENS_PER_WORD
    return statistics.median(counts) / (shape.system + shape.message)


def hit_ceiling(raw: Path, blocks: int, config: str, block_size: int = 128) -> tuple[float, float] | None:
    """(the later turns' hit rate, the most any eviction order could give them), pooled
    over the config's runs at this cache size. A later turn's longest cacheable prefix is
    the previous turn's prompt in whole blocks: every block after it chains over that
    turn's thought, which the next prompt does not carry. None without later turns."""
    cached = ceiling = prompt = 0
    for f in raw.glob(f"prefix-{blocks}-*-{config}.json*"):
        turns: dict[tuple[int, int], dict] = {(r["conversation"], r["turn"]): r for r in S.read_requests(f)
                                              if r.get("ok") and r.get("conversation") is not None}
        for (conv, k), r in turns.items():
            prev = turns.get((conv, k - 1))
            if k == 0 or prev is None or r.get("cached_tokens") is None or not r.get("prompt_tokens"):
                continue
            cached += r["cached_tokens"]
            prompt += r["prompt_tokens"]
            ceiling += min(r["prompt_tokens"] - 1, prev["prompt_tokens"] // block_size * block_size)
    return (cached / prompt, ceiling / prompt) if prompt else None


def observed_turn(raw: Path, shape: Shape) -> Shape:
    """The turn's shape with the thought and answer lengths the stock engine produced
    (medians of its usage over every turn; the answer's count less the delimiter, which
    vLLM counts with it and the twin keeps apart). A thinking budget ends a thought at
    the engine's count, not the tester's ask, and the answer takes the rest of
    max_tokens: the twin must see the lengths the engine ran, or its dead blocks differ.
    The shape as asked when no stock run reported usage."""
    import statistics

    reqs = [r for f in raw.glob("prefix-*-*-stock.json*") for r in S.read_requests(f) if r.get("ok")]
    think = [r["usage_think_tokens"] for r in reqs if r.get("usage_think_tokens") is not None]
    answer = [r["usage_output_tokens"] - 1 for r in reqs if r.get("usage_output_tokens")]
    if not think or not answer:
        return shape
    return dataclasses.replace(shape, think=round(statistics.median(think)), answer=round(statistics.median(answer)))


def twin_prediction(sim: Path, profile: Path, shape: Shape, blocks: int, rate: float, conversations: int,
                    per_word: float = TOKENS_PER_WORD, seeds: int = 5) -> dict | None:
    """The twin's forecast of the same conversations on the rig's fitted profile: its
    later-turn hit-rate and p95 TTFT ratios (the hook's order over LRU)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        wl = Path(tmp) / "turn.toml"
        wl.write_text(shape.twin_workload(per_word))
        out = Path(tmp) / "out.json"
        cmd = [str(sim), "conversations", "--profile-file", str(profile), "--workload", str(wl),
               "--kv-blocks", str(blocks), "--rates", f"{rate:g}", "--conversations", str(conversations),
               "--turns", str(shape.turns), "--system-tokens", str(round(shape.system * per_word)),
               "--think-time-s", f"{shape.think_time_s:g}", "--seeds", str(seeds), "--json", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            print(f"twin: {' '.join(cmd)} failed: {done.stderr[-500:]}", file=sys.stderr)
            return None
        return json.loads(out.read_text())[0]


#: Each configuration's eviction order in the twin.
EVICTION = {"stock": "lru", "hook-fcfs": "dead-first"}


def trace_hits(sim: Path, profile: Path, run: Path, blocks: int, eviction: str, system_tokens: int) -> dict | None:
    """`meridian-sim trace-hits` on one measured run: its own turns (lengths, and the
    client's wait before each) through the twin's prefix cache; the later turns' hit
    rate on each side and the share of later turns within one block of vLLM's count."""
    import gzip
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "run.json", Path(tmp) / "hits.json"
        opener = gzip.open if run.suffix == ".gz" else open
        with opener(run, "rt") as f:
            src.write_text(f.read())
        cmd = [str(sim), "trace-hits", str(src), "--kv-blocks", str(blocks), "--system-tokens", str(system_tokens),
               "--eviction", eviction, "--out", str(out), "--profile-file", str(profile)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            print(f"twin: {' '.join(cmd)} failed: {done.stderr[-500:]}", file=sys.stderr)
            return None
        return json.loads(out.read_text())["later_turns"]


def trace_lines(sim: Path, profile: Path, raw: Path, blocks: int, configs: list[str], system_tokens: int) -> list[str]:
    """The twin's cache against vLLM's, run by run, on the recorded conversations."""
    parts = []
    for config in configs:
        eviction = EVICTION.get(config)
        if eviction is None:
            continue
        got = []
        for f in sorted(raw.glob(f"prefix-{blocks}-*-{config}.json*")):
            r = trace_hits(sim, profile, f, blocks, eviction, system_tokens)
            if r and r.get("measured_hit_rate") is not None and r.get("within_one_block") is not None:
                got.append(r)
        if got:
            parts.append(f"`{config}` ({eviction}): later turns' hit rate "
                         + ", ".join(f"{r['twin_hit_rate']:.1%} against {r['measured_hit_rate']:.1%}" for r in got)
                         + "; later turns within one block of vLLM's count "
                         + ", ".join(f"{r['within_one_block']:.0%}" for r in got))
    if not parts:
        return []
    return ["**The twin's cache against vLLM's, turn by turn** (`meridian-sim trace-hits`: each run's own "
            "turns, with the lengths the engine reported and the client's wait before each, replayed "
            "through the twin's prefix cache; each later turn's prompt is the previous one's tokens and then "
            "fresh ones, so the twin sees the prefixes vLLM's block hashes see), run by run, twin against "
            "measured: " + "; ".join(parts) + ".", ""]


def report(results: Path, raw: Path, out_md: Path, sim: Path | None = None, profile: Path | None = None) -> str:
    data = json.loads(results.read_text())
    setup = data["setup"]
    shape = Shape(**setup["shape"])
    lines = []
    for blocks in setup["blocks"]:
        runs = [r for r in data["runs"] if r["blocks"] == blocks]
        if not runs:
            continue
        # Runs measured before the harness read the hook's counter have none to show.
        demoted = any(r.get("demoted_blocks") is not None for r in runs)
        lines += [f"### {blocks} blocks ({blocks * 128:,} tokens) of KV cache", ""]
        lines += ["| configuration | rounds | later turns' hit rate | vLLM's own hit rate (every look-up) | "
                  "later turns' TTFT p50 / p95 (ms) | preemptions | total tokens/s |"
                  + (" thought blocks the hook evicted first |" if demoted else ""),
                  "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if demoted else "")]
        for config in setup["configs"]:
            mine = [r for r in runs if r["config"] == config]
            if not mine:
                continue
            lt = [r["summary"].get("later_turns") or {} for r in mine]
            hit = [x.get("hit_rate") for x in lt if x.get("hit_rate") is not None]
            own = [(r["summary"].get("prefix_cache") or {}).get("hit_rate") for r in mine]
            own = [x for x in own if x is not None]
            p50 = [(x.get("ttft") or {}).get("p50_ms") for x in lt]
            p95 = [(x.get("ttft") or {}).get("p95_ms") for x in lt]
            pre = [r.get("vllm_preemptions") or 0 for r in mine]
            tps = [r["summary"]["total_token_throughput"] for r in mine]

            def each(xs, fmt):
                return ", ".join(fmt(x) for x in xs if x is not None) or "-"
            lines.append(f"| `{config}` | {len(mine)} | {each(hit, lambda x: f'{x:.1%}')} | "
                         f"{each(own, lambda x: f'{x:.1%}')} | "
                         f"{each(list(zip(p50, p95)), lambda t: f'{t[0]:.0f} / {t[1]:.0f}')} | "
                         f"{each(pre, lambda x: f'{x:.0f}')} | {each(tps, lambda x: f'{x:.0f}')} |"
                         + (f" {each([r.get('demoted_blocks') for r in mine], lambda x: f'{x:.0f}')} |"
                            if demoted else ""))
        lines.append("")
        held = {c: hit_ceiling(raw, blocks, c) for c in setup["configs"]}
        if all(held.values()):
            lines += ["Turns 2 and later could hit at most "
                      + " / ".join(f"{v[1]:.1%}" for v in held.values())
                      + f" ({' / '.join(held)}) of their prompt tokens under any eviction order (the previous "
                      "turn's prompt in whole blocks: every block after it chains over that turn's thought); "
                      "of that ceiling, " + ", ".join(f"`{c}` held {v[0] / v[1]:.0%}" for c, v in held.items())
                      + f". At most {max(v[1] for v in held.values()) / held['stock'][0]:.2f}x stock's hit rate "
                      "was there to gain."
                      if "stock" in held else "", ""]
        twin = None
        if sim is not None and profile is not None:
            turn = observed_turn(raw, shape)
            per_word = tokens_per_word(raw, shape)
            twin = twin_prediction(sim, profile, turn, blocks, setup["rate"], setup["conversations"], per_word)
            lines += [f"The twin was given the turns the engine produced: messages of {shape.message} words "
                      f"({per_word:.2f} tokens a word, from the first turns' prompts), thoughts of {turn.think} "
                      f"and answers of {turn.answer} tokens (the stock runs' medians; asked for {shape.think} "
                      f"and {shape.answer}), each within +-{shape.range_ratio:.0%}.", ""]
            lines += trace_lines(sim, profile, raw, blocks, setup["configs"], round(shape.system * per_word))
        for config in setup["configs"][1:]:
            eff = effects(raw, blocks, config)
            tput = throughput_ratios(data, blocks, config)
            lines += [f"`{config}` over `stock` on the same conversations (each round's own ratio, their "
                      "geometric mean over the rounds; 90% intervals, conversations and rounds resampled; one "
                      "round gives no interval a verdict may read):", "",
                      "| effect | measured | target | verdict | the twin predicted |", "|---|---:|---:|---|---:|"]
            predicted = {"hit rate": twin and twin.get("hit_rate_ratio"),
                         "p95 TTFT": twin and twin.get("p95_ttft_ratio")}
            for name, est in eff.items():
                target = TARGETS.get(name)
                if est is None:
                    lines.append(f"| later turns' {name} | - | - | - | - |")
                    continue
                word = (S.verdict(est, target[0], target[1]) if target and est.run_aware else
                        S.UNRESOLVED if target else "-")
                pred = predicted.get(name)
                lines.append(f"| later turns' {name} | {est.text()} | "
                             f"{'-' if not target else ('>= ' if target[1] == 'higher' else '<= ') + f'{target[0]:g}'}"
                             f" | {word} | {'-' if pred is None else f'{pred:.2f}'} |")
            if tput:
                iv = round_interval(tput)
                shown = (f"{iv[0]:.3f} ({iv[1]:.3f}-{iv[2]:.3f})" if iv else
                         f"{tput[0]:.3f} (one round)")
                word = S.UNRESOLVED if iv is None else S.verdict(
                    S.Estimate(iv[0], iv[1], iv[2], 0, len(tput), "mean", 0), 0.95, "higher")
                pred = twin and twin.get("throughput_ratio")
                lines.append(f"| total token throughput (rounds' geometric mean) | {shown} | >= 0.95 | {word} | "
                             f"{'-' if pred is None else f'{pred:.2f}'} |")
            lines.append("")
    text = "\n".join(lines)
    out_md.write_text(text)
    return text


def main(argv: list[str], setup_for) -> None:
    if argv[:1] == ["measure"] and len(argv) == 4:
        plan = Plan.from_env()
        results = Path(argv[3])
        s = setup_for(Path(argv[1]), Path(argv[2]), plan)
        print(f"work directory (logs, step traces, raw load-test JSON): {s.work}", flush=True)
        measure(s, plan, results, log=lambda msg: print(msg, flush=True))
    elif argv[:1] == ["report"] and len(argv) in (4, 6):
        sim, profile = (Path(argv[4]), Path(argv[5])) if len(argv) == 6 else (None, None)
        print(report(Path(argv[1]), Path(argv[2]), Path(argv[3]), sim, profile))
    else:
        raise SystemExit(__doc__)
