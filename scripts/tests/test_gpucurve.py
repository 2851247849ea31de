"""The GPU step-time curve (scripts/gpucurve): its page predicts each step with the
twin's own cost formula, its traces are what `meridian-sim calibrate --steps` reads, and
its step (decode attention folded per KV head, prompt chunks aligned to the bottom right)
computes what a plain float32 model does, on a CPU with a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from built import built as binary

ROOT = Path(__file__).resolve().parents[2]

from gpucurve.measure import TIMED, _shapes
from gpucurve.report import predict

VLLM_PYTHON = os.environ.get("MERIDIAN_VLLM_PYTHON")
TERMS = ["fixed_s", "per_token_s", "per_decode_request_s", "per_context_token_s", "per_prefill_attention_s",
         "weight_read_tokens"]


def _calibrate(trace: Path, tmp: Path) -> dict:
    out = tmp / "fit.toml"
    subprocess.run([binary("meridian-sim"), "calibrate", "--steps", trace, "--profile-out", out],
                   check=True, capture_output=True, text=True)
    return tomllib.loads(out.read_text())["profile"][0]


def _row(b: int, l: int, n: int, c: int) -> dict:
    return {"tokens": b + n, "prefill_tokens": n, "decode_reqs": b, "decode_context": b * l,
            "prefill_context": c, "preempted": 0, "decode_context_each": l}


def test_the_page_and_the_twin_price_a_step_alike(tmp_path):
    # Steps timed exactly by the page's formula over the measured grid: the twin's
    # calibration must give back every term, the weight-read floor included, which it can
    # only if cost.rs prices each shape as the page does.
    truth = {"fixed_s": 5e-3, "per_token_s": 2e-5, "per_decode_request_s": 3e-6,
             "per_context_token_s": 5e-8, "per_prefill_attention_s": 1.5e-9, "weight_read_tokens": 160.0}
    rows = []
    for i, (b, l, n, c) in enumerate(_shapes(quick=False)):
        row = _row(b, l, n, c)
        rows.append(row | {"t": float(i), "step_s": predict(truth, row)})
    trace = tmp_path / "steps.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fitted = _calibrate(trace, tmp_path)
    for term in TERMS:
        assert fitted[term] == pytest.approx(truth[term], rel=0.01), (term, fitted)


@pytest.mark.skipif(not VLLM_PYTHON, reason="MERIDIAN_VLLM_PYTHON (a venv with torch) not set: scripts/test.sh sets it")
def test_a_tiny_model_steps_on_a_cpu_and_its_trace_calibrates(tmp_path):
    out = tmp_path / "curve"
    run = subprocess.run([VLLM_PYTHON, "-m", "gpucurve", "measure", "--config", "tiny", "--device", "cpu",
                          "--out", str(out)], cwd=ROOT / "scripts", capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    meta = json.loads((out / "meta.json").read_text())
    # Both attention paths passed their float32 reference check to be chosen at all.
    assert meta["attention"]["prefill"] in ("grouped", "repeated")
    rows = [json.loads(x) for x in (out / "steps-eager.jsonl").read_text().splitlines()]
    shapes = _shapes(quick=True)
    assert len(rows) == len(shapes) * TIMED
    assert {(r["decode_reqs"], r["decode_context_each"], r["prefill_tokens"], r["prefill_context"])
            for r in rows} == set(shapes)
    for r in rows:
        assert r["tokens"] == r["decode_reqs"] + r["prefill_tokens"]
        assert r["decode_context"] == r["decode_reqs"] * r["decode_context_each"]
        assert r["step_s"] > 0
    assert not (out / "steps-graph.jsonl").exists(), "CUDA graphs are timed on a GPU only"
    fitted = _calibrate(out / "steps-eager.jsonl", tmp_path)
    assert fitted["fixed_s"] > 0


@pytest.mark.skipif(not VLLM_PYTHON, reason="MERIDIAN_VLLM_PYTHON (a venv with torch) not set: scripts/test.sh sets it")
def test_a_mixed_step_computes_what_a_plain_float32_model_does():
    # Decodes over a cache and a prompt chunk after a prefix in one step: head-to-KV-head
    # mapping, the KV writes, rotary positions and the chunk's causal window all show in
    # the logits (gpucurve_reference.py writes the model out token by token).
    # A script run by its path sees its own folder, not scripts/, where `gpucurve` lives.
    run = subprocess.run([VLLM_PYTHON, str(Path(__file__).with_name("gpucurve_reference.py"))],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "scripts")})
    assert run.returncode == 0, run.stdout + run.stderr


def _card(folder: Path, device: str, times: dict[tuple, float], config: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"config": config, "facts": {"device": device, "copy_tb_s": 4.2,
                                                                               "matmul_tflops": 778}}))
    (folder / "steps-graph.jsonl").write_text("".join(
        json.dumps(_row(*k) | {"step_s": t}) + "\n" for k, t in times.items()))
    return folder


def test_a_second_card_is_set_beside_the_first_by_the_ratios_that_decide_scheduling(tmp_path):
    from gpucurve.cards import card_dirs, card_section, profile_name
    from gpucurve.trace import groups, read_trace

    shapes = {(1, 1024, 0, 0): 0.008, (64, 1024, 0, 0): 0.012, (0, 0, 2048, 0): 0.060}
    config = {"layers": 36, "hidden": 4096}
    main = _card(tmp_path / "main", "NVIDIA H100 80GB HBM3", shapes, config)
    # Faster memory: decode-only steps 0.75x, the compute-bound chunk as it was.
    faster = {k: t * (1.0 if k[2] else 0.75) for k, t in shapes.items()}
    card = _card(main / "h200", "NVIDIA H200", faster, config)
    _card(main / "empty", "NVIDIA H200", {}, config).joinpath("steps-graph.jsonl").unlink()
    assert card_dirs(main) == [card], "only folders holding a measured curve"
    assert profile_name("NVIDIA H200") == "h200-qwen3-8b-pytorch"
    fits = []

    def fit_card(folder, meta, name):
        fits.append((folder, name))
        return {"fixed_s": 0.002, "per_token_s": 26e-6, "weight_read_tokens": 160}, {
            "median_abs_pct_error": 2.0, "r_squared": 0.999, "samples": 3}

    main_steps = groups(read_trace(main / "steps-graph.jsonl"))
    page = "\n".join(card_section(card, json.loads((main / "meta.json").read_text()), main_steps,
                                  {"fixed_s": 0.003, "per_token_s": 27e-6, "weight_read_tokens": 192}, fit_card))
    assert fits == [(card, "h200-qwen3-8b-pytorch")], "the card is fitted under its own profile name"
    assert "## A second card: NVIDIA H200" in page
    assert "| `fixed_s` | 3 ms | 2 ms | 0.67x |" in page
    assert "| decode-only steps | 2 | 0.75 (0.75-0.75) |" in page
    assert "| prompt-chunk steps | 1 | 1.00 (1.00-1.00) |" in page
    assert "| a 2,048-token chunk over one decode (x 1,024 cached) | 7.5 | 10.0 |" in page
    assert "| weight-read floor, tokens | 192 | 160 |" in page
    assert "A chunk therefore costs more decode steps on this card" in page
    other = _card(main / "other", "NVIDIA H200", faster, {"layers": 2, "hidden": 64})
    assert card_section(other, json.loads((main / "meta.json").read_text()), main_steps, {}, fit_card) == [
        "`other/` measured another model shape than the main card: not compared."]
