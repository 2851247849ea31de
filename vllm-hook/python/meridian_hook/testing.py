"""vLLM's real scheduler classes built on CPU, without a model or a tokenizer, and
stepped by hand: the scheduler decides, the caller plays the model (it says which token
each scheduled request sampled). The hook's tests and its benchmarks (``scripts/hookbench``)
drive the scheduler subclass through it, and so can anyone checking a policy against a
vLLM release without a GPU: ``build(MeridianScheduler)`` and step it."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK = 16
THINK_START, THINK_END = 465, 466


def _hash(data: Any) -> bytes:
    import hashlib
    import pickle

    return hashlib.sha256(pickle.dumps(data)).digest()


def _model_dir() -> str:
    d = Path(tempfile.mkdtemp(prefix="meridian-sched-"))
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "num_hidden_layers": 1,
        "vocab_size": 467,
        "max_position_embeddings": 4096,
        "torch_dtype": "float32",
    }
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


@dataclass
class Engine:
    scheduler: Any
    block_hasher: Any

    def add(
        self, request_id: str, prompt: list[int], *, arrival: float, max_tokens: int = 512, **params: Any
    ) -> Request:
        """``params``: more ``SamplingParams`` (``thinking_token_budget``, ``extra_args``)."""
        req = Request(
            request_id=request_id,
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params),
            pooling_params=None,
            arrival_time=arrival,
            block_hasher=self.block_hasher,
        )
        self.scheduler.add_request(req)
        return req

    def step(self, next_tokens: dict[str, int], default: int = 7) -> SchedulerOutput:
        """One engine step: schedule, then report one sampled token for every request
        that finished its prompt (``next_tokens`` picks it; ``default`` otherwise)."""
        out = self.scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.scheduler.requests[rid]
            # schedule() has already advanced num_computed_tokens by this step's tokens: a
            # request samples once its whole prompt is computed, not after a first chunk.
            done_prompt = req.num_computed_tokens >= req.num_prompt_tokens
            sampled.append([next_tokens.get(rid, default)] if done_prompt else [])
        mro = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        self.scheduler.update_from_output(out, mro)
        return out

    def prompt_tokens(self, out: SchedulerOutput) -> dict[str, int]:
        """The prompt tokens each request computed in the step ``out`` (before it sampled)."""
        got = {}
        for rid, n in out.num_scheduled_tokens.items():
            req = self.scheduler.requests[rid]
            if req.num_computed_tokens - n < req.num_prompt_tokens:
                got[rid] = n
        return got


def reasoning_config() -> Any:
    """What ``--reasoning-parser qwen3`` sets up, for the tiny vocabulary: the hook reads
    the delimiters' token ids from it."""
    from vllm.config.reasoning import ReasoningConfig

    rc = ReasoningConfig(reasoning_start_str="<think>", reasoning_end_str="</think>")
    rc._reasoning_start_token_ids = [THINK_START]
    rc._reasoning_end_token_ids = [THINK_END]
    rc._natural_reasoning_end_token_ids = [THINK_END]
    rc._enabled = True
    return rc


def build(
    scheduler_cls: type, *, num_blocks: int, max_num_seqs: int = 8, budget: int = 256, prefix_caching: bool = False
) -> Engine:
    init_none_hash(_hash)
    model = ModelConfig(model=_model_dir(), skip_tokenizer_init=True, max_model_len=4096, dtype="float32")
    sched_cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=4096,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cache = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto", enable_prefix_caching=prefix_caching)
    cache.num_gpu_blocks = num_blocks
    vllm_config = VllmConfig(
        model_config=model, scheduler_config=sched_cfg, cache_config=cache, device_config=DeviceConfig("cpu")
    )
    vllm_config.reasoning_config = reasoning_config()
    kv = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["layer.0"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=64, dtype=torch.float32))
        ],
    )
    scheduler = scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK,
        log_stats=True,
    )
    return Engine(scheduler, get_request_block_hasher(BLOCK, _hash))
