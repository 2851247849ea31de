"""The workloads of the real-engine A/B, by name: what `measure` runs and what the page
compares a run's settings against (to write the command that reproduces it)."""

from __future__ import annotations

from .measure import Workload

# Lengths scaled to a CPU engine (~100x slower than a GPU): what is thousands of tokens
# on an H100 in seconds is the same shape here in tokens a 2-core machine can run through
# in a benchmark's time. The long-prompt workload keeps prompts in the thousands: its
# prefill chunks are what stretch the steps answering requests wait on.
WORKLOADS = {
    "mix": Workload("mix", "reasoning mix: prompts ~128, thoughts ~192, answers ~64 tokens",
                      prompts=48, input_len=128, think_len=192, output_len=64, range_ratio=0.5),
    "long": Workload("long", "long prompts (RAG / agent context): prompts ~1,000, thoughts ~128, answers ~64 tokens",
                       prompts=24, input_len=1000, think_len=128, output_len=64, range_ratio=0.5),
    # KV pressure: thoughts long enough that the running requests outgrow a cache of 50
    # blocks (6,400 tokens; a request ends near 1,000), so the engine must preempt, and
    # whom it preempts (stock: the latest arrival; the hook: a thinker before anyone
    # answering) decides whose answer stops to be recomputed.
    "kv": Workload("kv", "KV pressure: prompts ~128, thoughts ~512, answers ~128 tokens, a 6,400-token KV cache",
                     prompts=48, input_len=128, think_len=512, output_len=128, range_ratio=0.5, kv_blocks=50),
    # The same requests in a cache that binds on the GPU-shaped rig. There (set 9) the
    # 50-block cache preempted 3 to 9 thinkers a run at 90% load and stalled no answer: a
    # 256-token step budget keeps fewer requests in flight than the 2,048-token one the
    # 50 blocks were sized for. 32 blocks (4,096 tokens; vLLM keeps one back, so the
    # longest request is 3,968) hold about five requests at full length, fewer than stock
    # keeps running at 90% load.
    "kv-tight": Workload("kv-tight", "KV pressure, a cache that binds: prompts ~128, thoughts ~512, answers ~128 "
                         "tokens, a 4,096-token KV cache",
                         prompts=48, input_len=128, think_len=512, output_len=128, range_ratio=0.5, kv_blocks=32),
}
