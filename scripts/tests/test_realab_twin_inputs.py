"""The twin's workload for the real-engine A/B comes from the lengths vLLM reported. Its
usage counts the end-of-thought delimiter with the answer, and the twin adds that token
itself after any thought, so the answer the twin is given must be one shorter; a workload
that never thinks has no delimiter to take off."""

from __future__ import annotations

import tomllib


from realab.measure import twin_workload


def test_the_answer_loses_the_delimiter_vllm_counted_with_it():
    spec = tomllib.loads(twin_workload({"prompt": [900, 1000, 1100], "think": [64, 128, 192],
                                        "answer": [33, 48, 65]}))
    assert spec["prompt"] == {"kind": "uniform", "min": 900, "max": 1100}
    assert spec["think"] == {"kind": "uniform", "min": 64, "max": 192}
    assert spec["answer"] == {"kind": "uniform", "min": 32, "max": 64}


def test_without_thinking_the_answer_is_taken_as_reported():
    spec = tomllib.loads(twin_workload({"prompt": [10, 10, 10], "think": [0, 0, 0], "answer": [5, 7, 9]}))
    assert spec["answer"] == {"kind": "uniform", "min": 5, "max": 9}
