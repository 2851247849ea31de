"""The hook's Python surface outside the engine: EntropyProbe (CPU kernel, CUDA with a
CPU fallback), EAT readings, and load_config's errors."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import meridian_hook
from meridian_hook import EntropyProbe, load_config


def reference(row: np.ndarray, temperature: float = 1.0) -> float:
    x = row.astype(np.float64) / temperature
    x = x[np.isfinite(x)]
    p = np.exp(x - x.max())
    p /= p.sum()
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum())


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_probe_matches_a_float64_reference(temperature):
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 4, size=(4, 151_936)).astype(np.float32)
    logits[1, :1000] = -np.inf
    probes = [EntropyProbe(temperature=temperature) for _ in range(4)]
    signals = EntropyProbe.compute_batch(probes, logits)
    for row, sig in zip(logits, signals):
        assert sig.token_entropy == pytest.approx(reference(row, temperature), abs=1e-5)
    torch_sig = EntropyProbe(temperature=temperature).compute(torch.from_numpy(logits[2]))
    assert torch_sig.token_entropy == pytest.approx(signals[2].token_entropy, abs=1e-6)


def test_eat_settles_on_a_steady_signal():
    probe = EntropyProbe(ema_alpha=0.5, delta=1e-3, warmup_steps=2)
    steady = np.zeros(64, dtype=np.float32)
    readings = [probe.compute(steady) for _ in range(5)]
    assert not readings[0].stop and not readings[1].stop, "warm-up"
    assert readings[-1].stop and readings[-1].eat_variance < 1e-3
    assert readings[-1].eat_ema == pytest.approx(np.log(64))


def test_cuda_backend_falls_back_to_cpu_with_a_warning(caplog):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the CUDA path runs instead (kernels tests cover it)")
    caplog.set_level(logging.WARNING, logger="meridian_hook")
    sig = EntropyProbe(backend="cuda").compute(np.zeros(8, dtype=np.float32))
    assert sig.token_entropy == pytest.approx(np.log(8), abs=1e-6)
    assert "CUDA entropy unavailable" in caplog.text
    assert meridian_hook._native.kernels.cuda_unavailable_reason()


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="backend"):
        EntropyProbe(backend="tpu")
    with pytest.raises(ValueError, match="eat_alpha"):
        EntropyProbe(ema_alpha=1.5)
    with pytest.raises(ValueError, match="1-D or 2-D"):
        EntropyProbe().compute(np.zeros((2, 2, 2), dtype=np.float32))


def test_load_config_names_every_bad_field(tmp_path):
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[exit]\neat_alpha = 2.0\n[hook]\npolicy = "lifo"\n')
    with pytest.raises(ValueError) as err:
        load_config(cfg)
    assert "exit.eat_alpha" in str(err.value) and "hook.policy" in str(err.value)
    cfg.write_text("[hook]\nlisten_on = 1\n")
    with pytest.raises(ValueError, match="listen_on"):
        load_config(cfg)


def test_load_config_leaves_the_proxys_sections_to_the_proxy(tmp_path):
    # A misspelt proxy field is the proxy's to refuse (`meridian check`, `meridian serve`):
    # the engine still starts with the hook's own sections, which stay strict.
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[upstream]\nmax_attemps = 3\n[hook]\npolicy = "output-first"\n')
    assert load_config(cfg).hook.policy == "output-first"
    cfg.write_text('[upstream]\nmax_attemps = 3\n[hook]\npolicy = "lifo"\n')
    with pytest.raises(ValueError, match="hook.policy"):
        load_config(cfg)


def test_load_config_reads_the_shipped_file_and_env_overrides(monkeypatch):
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "meridian.toml"
    assert load_config(shipped) == load_config(None), "meridian.toml documents the defaults"
    monkeypatch.setenv("MERIDIAN_HOOK__POLICY", "reasoning-first")
    assert load_config(shipped).hook.policy == "reasoning-first"
