"""The engine profile's bookkeeping (scripts/realab/profile.py): which part of an engine a
sampled stack is charged to, and the page written from a run. The sampling itself needs
vLLM, py-spy and a quiet machine (scripts/bench-hook-profile.sh)."""

from __future__ import annotations

import json
from pathlib import Path


from realab import profile

ROOT = "WorkerProc.worker_busy_loop (vllm/v1/executor/multiproc_executor.py:800)"
CORE = "EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:1555);EngineCore.step (vllm/v1/engine/core.py:674)"


def stack(*frames: str, count: int) -> str:
    return ";".join(frames) + f" {count}"


SAMPLES = [
    # The forward pass, down to an attention op the groups do not name.
    stack(ROOT, "GPUModelRunner.execute_model (vllm/v1/worker/gpu_model_runner.py:3000)",
          "GPUModelRunner._model_forward (vllm/v1/worker/gpu_model_runner.py:2900)",
          "cpu_attention_with_kv_cache (vllm/_custom_ops.py:10)", count=50),
    # A held request added back to vLLM's persistent batch.
    stack(ROOT, "GPUModelRunner.execute_model (vllm/v1/worker/gpu_model_runner.py:3000)",
          "GPUModelRunner._update_states (vllm/v1/worker/gpu_model_runner.py:1488)",
          "InputBatch.add_request (vllm/v1/worker/gpu_input_batch.py:371)", count=10),
    # The hook's logits processor, called by vLLM's sampler: the hook's.
    stack(ROOT, "GPUModelRunner._sample (vllm/v1/worker/gpu_model_runner.py:3100)",
          "Sampler.apply_logits_processors (vllm/v1/sample/sampler.py:200)",
          "MeridianLogitsProcessor.apply (meridian_hook/logits.py:150)", count=5),
    # vLLM's scheduler called from the hook's: vLLM's.
    stack(CORE, "MeridianScheduler.schedule (meridian_hook/scheduler.py:90)",
          "Scheduler.schedule (vllm/v1/core/sched/scheduler.py:400)",
          "KVCacheManager.allocate_slots (vllm/v1/core/kv_cache_manager.py:300)", count=20),
    # The hook's own ordering.
    stack(CORE, "MeridianScheduler.schedule (meridian_hook/scheduler.py:80)",
          "MeridianScheduler._meridian_reorder (meridian_hook/scheduler.py:170)", count=5),
    stack(ROOT, "MessageQueue.dequeue (vllm/distributed/device_communicators/shm_broadcast.py:700)",
          "sched_yield (vllm/distributed/utils.py:30)", count=8),
    stack(ROOT, "WorkerProc.handle_output (vllm/v1/executor/multiproc_executor.py:900)", count=2),
    # Another thread (vLLM's monitor, idle): not the engine's work, left out.
    stack("Thread._bootstrap (threading.py:1002)", "TMonitor.run (tqdm/_monitor.py:60)", count=500),
    "not a sample line",
]


def test_a_sample_is_charged_to_the_innermost_part_of_the_engine_it_names():
    shares = profile.classify(line + "\n" for line in SAMPLES)
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    assert shares["the model's forward pass"] == 0.5
    assert shares["vLLM's persistent batch (requests removed and added back, metadata)"] == 0.1
    assert shares["vLLM's scheduler"] == 0.2
    meridian = profile.GROUPS[0][0]
    assert shares[meridian] == 0.1  # the logits processor and the hook's own ordering
    assert shares["waiting for the other process (shared-memory queue)"] == 0.08
    assert shares[profile.OTHER] == 0.02


def test_decode_steps_are_grouped_by_batch_and_thin_groups_left_out():
    steps = [{"prefill_tokens": 0, "decode_reqs": 3, "step_s": 0.010, "sched_s": 0.0002}] * 12
    steps += [{"prefill_tokens": 0, "decode_reqs": 6, "step_s": 0.014, "sched_s": 0.0004}] * 9
    steps += [{"prefill_tokens": 128, "decode_reqs": 6, "step_s": 0.060, "sched_s": 0.0004}] * 12
    fig = profile.step_figures(steps)
    assert fig["decode_1-4"] == 0.010
    assert "decode_5-8" not in fig, "nine steps are too few for a median"
    assert fig["steps"] == 33 and fig["schedule"] == 0.0004


def test_the_page_sets_every_engine_side_by_side(tmp_path: Path):
    raw = tmp_path / "raw" / "run-0"
    samples = {}
    for config in ("stock", "hook:output-first"):
        for proc in ("worker", "core"):
            src = tmp_path / f"{config}-{proc}.txt"
            src.write_text("".join(line + "\n" for line in SAMPLES))
            samples.setdefault(config, {})[proc] = str(src)
    steps = {"steps": 100, "decode_1-4": 0.0091, "schedule": 0.0002}
    run = {"label": "synthetic", "commit": "abc", "date": "2026-11-28", "prompts": 120, "workload": "mix",
           "rate": 2.161, "configs": {"stock": {"samples": samples["stock"], "steps": steps},
                                      "hook:output-first": {"samples": samples["hook:output-first"],
                                                            "steps": {**steps, "decode_1-4": 0.0095}}}}
    profile.keep_samples(run, raw)
    assert run["configs"]["stock"]["samples"]["worker"] == "raw/run-0/spy-stock-worker.txt.gz"
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": [run]}))
    out = tmp_path / "page.md"
    profile.write_page(results, out)
    page = out.read_text()
    assert "| where | `stock` | `hook:output-first` |" in page
    assert "| the model's forward pass | 50.0% | 50.0% |" in page
    assert "| decode-only, 1-4 requests | 9.10 | 9.50 |" in page
    assert "| steps in the window | 100 | 100 |" in page
    assert "Share of the worker process's samples:" in page and "Share of the core process's samples:" in page
