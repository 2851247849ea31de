"""The logits-processor half: `MeridianLogitsProcessor` on a steady-decode batch,
under vLLM's V1 and Model Runner V2 interfaces."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace

from .common import PROMPT_LEN, Spread, VOCAB, WARMUP_STEPS
from .sched import prompt, script_token

@dataclass
class LogitsResult:
    n: int
    v1: Spread  # CPU time per call, µs
    v2: Spread

    @classmethod
    def pooled(cls, rounds: list[tuple[int, list[float], list[float]]]) -> "LogitsResult":
        return cls(
            rounds[0][0], Spread.of([x for r in rounds for x in r[1]]), Spread.of([x for r in rounds for x in r[2]])
        )


def bench_logits(n: int, steps: int) -> tuple[int, list[float], list[float]]:
    import numpy as np
    import torch
    from meridian_hook.testing import reasoning_config
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    from meridian_hook.logits import MeridianLogitsProcessor

    config = SimpleNamespace(reasoning_config=reasoning_config(), model_config=None)
    params = [SamplingParams(max_tokens=4096, extra_args={"meridian_request_id": f"req-{i}"}) for i in range(n)]
    prompts = [prompt(i) for i in range(n)]
    logits = torch.zeros(n, VOCAB)

    # V1 (the CPU model runner's interface): output lists grow in place, one token a step.
    v1 = MeridianLogitsProcessor(config, torch.device("cpu"), False)
    outs: list[list[int]] = [[] for _ in range(n)]
    added = [(i, params[i], prompts[i], outs[i]) for i in range(n)]
    v1.update_state(BatchUpdate(batch_size=n, removed=[], added=added, moved=[]))

    # V2 (Model Runner V2, the GPU default): request state in slots, the row's input token.
    width = PROMPT_LEN + WARMUP_STEPS + steps + 8
    state = SimpleNamespace(
        prompt_len=SimpleNamespace(np=np.full(n, PROMPT_LEN, dtype=np.int32)),
        prefill_len=SimpleNamespace(np=np.full(n, PROMPT_LEN, dtype=np.int32)),
        all_token_ids=SimpleNamespace(gpu=torch.zeros(n, width, dtype=torch.int32)),
    )
    for i in range(n):
        state.all_token_ids.gpu[i, :PROMPT_LEN] = torch.tensor(prompts[i])
    v2 = MeridianLogitsProcessor(config, state)
    for i in range(n):
        v2.add_request(i, params[i])
    slots = np.arange(n)

    cpu: tuple[list[float], list[float]] = ([], [])
    for k in range(WARMUP_STEPS + steps):
        # What the model sampled last step, before this step's sampling.
        last = [script_token(i, len(outs[i])) for i in range(n)] if k else [prompts[i][-1] for i in range(n)]
        if k:
            for i in range(n):
                outs[i].append(last[i])
        ctx = SimpleNamespace(
            idx_mapping_np=slots,
            seq_lens_upper_bound_np=np.full(n, PROMPT_LEN + len(outs[0]), dtype=np.int64),
            input_ids=torch.tensor(last),
        )
        order = (0, 1) if k % 2 == 0 else (1, 0)
        for which in order:
            c0 = time.thread_time_ns()
            if which == 0:
                v1.update_state(None)
                v1.apply(logits, None)
            else:
                v2.apply(logits, ctx)
            c = time.thread_time_ns() - c0
            if k >= WARMUP_STEPS:
                cpu[which].append(c / 1000)
    assert not torch.isinf(logits).any(), "no row was forced (steady decode, no budget)"
    return n, cpu[0], cpu[1]
