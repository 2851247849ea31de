"""meridian-kernels through its C ABI (ctypes), against NumPy float64 references.

The cdylib's path comes from MERIDIAN_KERNELS_LIB (scripts/test.sh builds it and sets it);
without it the module is skipped, saying so."""

import ctypes
import os

import numpy as np
import pytest

LIB_PATH = os.environ.get("MERIDIAN_KERNELS_LIB")
if not LIB_PATH:
    pytest.skip("MERIDIAN_KERNELS_LIB is not set (scripts/test.sh builds the cdylib and sets it)",
                allow_module_level=True)

CPU, CUDA = 0, 1
F32, BF16, F16 = 0, 1, 2


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(LIB_PATH)
    lib.meridian_kernels_abi_version.restype = ctypes.c_uint32
    lib.meridian_kernels_last_error.restype = ctypes.c_char_p
    lib.meridian_kernels_cuda_available.restype = ctypes.c_int32
    lib.meridian_kernels_entropy.restype = ctypes.c_int32
    lib.meridian_kernels_entropy.argtypes = [
        ctypes.c_void_p, ctypes.c_int32, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_float,
        ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint32]
    lib.meridian_kernels_topk_entropy.restype = ctypes.c_int32
    lib.meridian_kernels_topk_entropy.argtypes = [
        ctypes.c_void_p, ctypes.c_int32, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint32,
        ctypes.c_float, ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint32]
    lib.meridian_kernels_eat_update.restype = ctypes.c_int32
    lib.meridian_kernels_eat_update.argtypes = [ctypes.c_void_p] * 6 + [
        ctypes.c_size_t, ctypes.c_double, ctypes.c_double, ctypes.c_uint32, ctypes.c_int32,
        ctypes.c_uint64]
    assert lib.meridian_kernels_abi_version() == 1
    return lib


def ptr(a):
    return a.ctypes.data


def ref_entropy(x, t):
    """Two-pass float64 entropy per row; -inf entries contribute nothing."""
    z = x.astype(np.float64) / max(float(np.float32(t)), 1e-6)
    m = np.max(z, axis=1, keepdims=True)
    p = np.exp(z - m)
    s = p.sum(axis=1, keepdims=True)
    p = p / s
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return terms.sum(axis=1)


def entropy(lib, x, dtype, t, threads=1):
    batch, vocab = x.shape
    out = np.full(batch, np.nan, dtype=np.float32)
    rc = lib.meridian_kernels_entropy(ptr(x), dtype, batch, vocab, t, ptr(out), CPU, 0, threads)
    assert rc == 0, lib.meridian_kernels_last_error()
    return out


def rows(rng, batch, vocab):
    x = rng.normal(0.0, 4.0, size=(batch, vocab)).astype(np.float32)
    x[0, :] = 0.0                                            # uniform
    if batch > 1:
        x[1, rng.integers(vocab)] += 40.0                    # peaked
    if batch > 2:
        x[2, rng.random(vocab) < 0.3] = -np.inf              # masked entries
    if batch > 3:
        x[3] *= 1000.0                                       # huge magnitudes
    return x


@pytest.mark.parametrize("batch,vocab", [(1, 1), (4, 7), (5, 33), (6, 1000), (4, 151936)])
@pytest.mark.parametrize("t", [0.6, 1.0, 2.5])
def test_f32_entropy_matches_numpy(lib, batch, vocab, t):
    x = rows(np.random.default_rng(batch * vocab), batch, vocab)
    for threads in (1, 2):
        np.testing.assert_allclose(entropy(lib, x, F32, t, threads), ref_entropy(x, t), atol=1e-5, rtol=0)


def test_half_inputs_match_numpy(lib):
    rng = np.random.default_rng(7)
    x = rows(rng, 4, 4099)
    h = x.astype(np.float16)
    np.testing.assert_allclose(entropy(lib, h, F16, 0.8), ref_entropy(h.astype(np.float32), 0.8), atol=1e-5, rtol=0)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)          # bfloat16 by truncation
    as_f32 = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(entropy(lib, bits, BF16, 0.8), ref_entropy(as_f32, 0.8), atol=1e-5, rtol=0)


def test_topk_bound_matches_the_formula(lib):
    rng = np.random.default_rng(3)
    x = rows(rng, 4, 5000)
    k = 20
    out = np.zeros((4, 4), dtype=np.float32)
    rc = lib.meridian_kernels_topk_entropy(ptr(x), F32, 4, 5000, k, 1.0, ptr(out), CPU, 0, 1)
    assert rc == 0, lib.meridian_kernels_last_error()
    full = ref_entropy(x, 1.0)
    for i, row in enumerate(x.astype(np.float64)):
        finite = np.sort(row[np.isfinite(row)])[::-1]
        lse = finite[0] + np.log(np.exp(finite - finite[0]).sum())
        p = np.exp(finite[:k] - lse)
        pos = p[p > 0]
        s = float(-(pos * np.log(pos)).sum())
        r = max(1.0 - p.sum(), 0.0)
        if r <= 1e-12:
            want = [s, s, s, r]
        else:
            lower = s + r * np.log(1.0 / max(p.min(), 1e-300))
            want = [s, lower, max(s + r * np.log((5000 - len(p)) / r), lower), r]
        np.testing.assert_allclose(out[i], want, atol=1e-5, rtol=0)
        assert out[i, 1] - 1e-5 <= full[i] <= out[i, 2] + 1e-5


def test_eat_update_follows_the_definition(lib):
    alpha, delta, warmup = 0.2, 1e-3, 4
    n = 3
    ema, var = np.zeros(n), np.zeros(n)
    steps, stop = np.zeros(n, dtype=np.uint32), np.zeros(n, dtype=np.uint8)
    m_ref, v_ref = np.zeros(n), np.zeros(n)
    for step in range(12):
        x = (1.0 + np.sin(np.arange(n) + step) / (1 + step)).astype(np.float32)
        rc = lib.meridian_kernels_eat_update(ptr(x), None, ptr(ema), ptr(var), ptr(steps), ptr(stop),
                                             n, alpha, delta, warmup, CPU, 0)
        assert rc == 0, lib.meridian_kernels_last_error()
        xd = x.astype(np.float64)
        if step == 0:
            m_ref = xd.copy()
        else:
            m_ref = alpha * xd + (1 - alpha) * m_ref
            v_ref = alpha * (xd - m_ref) ** 2 + (1 - alpha) * v_ref
        np.testing.assert_allclose(ema, m_ref, rtol=1e-12)
        np.testing.assert_allclose(var, v_ref, rtol=1e-12, atol=1e-15)
        assert list(stop) == [int(step + 1 > warmup and v < delta) for v in v_ref]


def test_errors_are_codes_with_messages(lib):
    x = np.zeros((2, 4), dtype=np.float32)
    out = np.zeros(2, dtype=np.float32)
    assert lib.meridian_kernels_entropy(None, F32, 2, 4, 1.0, ptr(out), CPU, 0, 1) == -2
    assert b"logits" in lib.meridian_kernels_last_error()
    assert lib.meridian_kernels_entropy(ptr(x), 9, 2, 4, 1.0, ptr(out), CPU, 0, 1) == -4
    assert lib.meridian_kernels_entropy(ptr(x), F32, 0, 4, 1.0, ptr(out), CPU, 0, 1) == -3
    assert lib.meridian_kernels_entropy(ptr(x), F32, 2, 4, 0.0, ptr(out), CPU, 0, 1) == -5


def test_cuda_path_answers_unavailable_or_runs(lib):
    if lib.meridian_kernels_cuda_available():
        pytest.skip("CUDA is present: the GPU path is covered by the Rust GPU tests and scripts/bench-kernels-gpu.sh")
    reason = lib.meridian_kernels_last_error()
    assert b"CUDA unavailable" in reason
    x = np.zeros((1, 4), dtype=np.float32)
    out = np.zeros(1, dtype=np.float32)
    assert lib.meridian_kernels_entropy(ptr(x), F32, 1, 4, 1.0, ptr(out), CUDA, 0, 0) == -1
