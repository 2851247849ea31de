"""Entropy of next-token distributions for code outside the engine loop (probes,
notebooks, tests): one :class:`EntropyProbe` per request keeps that request's EAT state
(EMA and EMA variance of the entropies it is fed, arXiv 2509.26522)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

from meridian_hook import _native

log = logging.getLogger("meridian_hook")


#: Raised by the CUDA entropy kernel when it cannot run here (no GPU, no driver).
KernelUnavailable = _native.kernels.KernelUnavailableError


@dataclass(frozen=True)
class EntropySignal:
    """One probe reading."""

    #: Entropy (nats) of softmax(logits / temperature).
    token_entropy: float
    #: EAT's EMA of the entropies so far, and its EMA variance.
    eat_ema: float
    eat_variance: float
    #: The variance settled below ``delta`` after the warm-up: thinking may stop.
    stop: bool


def _host_f32(logits: Any) -> tuple[Any, int, int]:
    """A C-contiguous float32 host view or copy of 1-D or 2-D logits (the caller keeps
    it alive while the kernel reads it), with its rows and vocabulary size."""
    try:
        import torch  # noqa: PLC0415

        if isinstance(logits, torch.Tensor):
            logits = logits.detach().to(device="cpu", dtype=torch.float32).numpy()
    except ImportError:
        pass
    import numpy as np  # noqa: PLC0415

    a = np.ascontiguousarray(logits, dtype=np.float32)
    if a.ndim not in (1, 2):
        raise ValueError(f"logits must be 1-D or 2-D; got shape {a.shape}")
    rows, vocab = (1, a.shape[0]) if a.ndim == 1 else a.shape
    return a, int(rows), int(vocab)


def _cpu_entropy(logits: Any, temperature: float) -> list[float]:
    import numpy as np  # noqa: PLC0415

    a, rows, vocab = _host_f32(logits)
    out = np.empty(rows, dtype=np.float32)
    _native.kernels.entropy(a.ctypes.data, "float32", (rows, vocab), 0, out.ctypes.data, temperature, device="cpu")
    return [float(x) for x in out]


def _cuda_entropy(logits: Any, temperature: float) -> list[float]:
    """The CUDA kernel on the tensor's own device and current stream, reading it in
    place (fp32, bf16 or fp16), the entropies read back (waiting for the device)."""
    return _cuda_entropy_tensor(logits, temperature).tolist()


def _cuda_entropy_tensor(logits: Any, temperature: float) -> Any:
    """The CUDA kernel's entropies, left on the device: a float32 tensor that holds them
    once the current stream has run the kernel."""
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        raise KernelUnavailable(f"torch is not installed: {e}") from e
    t = logits if isinstance(logits, torch.Tensor) else torch.as_tensor(logits)
    if not torch.cuda.is_available():
        raise KernelUnavailable("torch sees no CUDA device")
    t = t.detach()
    if t.device.type != "cuda":
        t = t.to("cuda")
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2:
        raise ValueError(f"logits must be 1-D or 2-D; got shape {tuple(t.shape)}")
    t = t.contiguous()
    out = torch.empty(t.shape[0], dtype=torch.float32, device=t.device)
    stream = torch.cuda.current_stream(t.device).cuda_stream
    _native.kernels.entropy(
        t.data_ptr(), str(t.dtype), tuple(t.shape), stream, out.data_ptr(), temperature, device=f"cuda:{t.device.index}"
    )
    return out


def entropies(logits: Any, temperature: float = 1.0, backend: str = "cpu") -> list[float]:
    """Entropy (nats) of softmax(row / temperature) for each row of ``logits`` (NumPy
    array or torch tensor, 1-D or 2-D), by ``meridian-kernels``. ``backend="cuda"`` runs
    the CUDA kernel and falls back to the CPU path, with a warning, when it cannot."""
    if not temperature > 0:
        raise ValueError(f"temperature must be positive; got {temperature}")
    if backend not in ("cpu", "cuda"):
        raise ValueError(f'backend must be "cpu" or "cuda"; got {backend!r}')
    if backend == "cuda":
        try:
            return _cuda_entropy(logits, temperature)
        except KernelUnavailable as e:
            log.warning("meridian: CUDA entropy unavailable (%s); using the CPU path", e)
    return _cpu_entropy(logits, temperature)


def entropies_tensor(logits: Any, temperature: float = 1.0) -> Any:
    """:func:`entropies` of a 2-D torch tensor as a float32 tensor on the logits' device,
    without waiting for it: on a GPU the kernel is queued on the current stream and its
    result is there once the stream reaches it (copy it to the host with
    ``non_blocking=True``). Falls back to the CPU path, which waits, when the kernel
    cannot run."""
    import torch  # noqa: PLC0415

    if logits.device.type == "cuda":
        try:
            return _cuda_entropy_tensor(logits, temperature)
        except KernelUnavailable as e:
            log.warning("meridian: CUDA entropy unavailable (%s); using the CPU path", e)
    return torch.tensor(_cpu_entropy(logits, temperature), dtype=torch.float32)


class EntropyProbe:
    """Per-request entropy and EAT state. Not thread-safe: one per request."""

    def __init__(
        self,
        *,
        backend: str = "cpu",
        temperature: float = 1.0,
        ema_alpha: float = 0.2,
        delta: float = 1e-4,
        warmup_steps: int = 4,
    ) -> None:
        if backend not in ("cpu", "cuda"):
            raise ValueError(f'backend must be "cpu" or "cuda"; got {backend!r}')
        if not temperature > 0:
            raise ValueError(f"temperature must be positive; got {temperature}")
        self.backend = backend
        self.temperature = temperature
        self._eat = _native.Eat(ema_alpha, delta, warmup_steps)

    def _feed(self, h: float) -> EntropySignal:
        ema, var, stop = self._eat.update(h)
        return EntropySignal(token_entropy=h, eat_ema=ema, eat_variance=var, stop=stop)

    def compute(self, logits: Any) -> EntropySignal:
        """Feeds one next-token distribution (1-D logits) and returns the reading."""
        (h,) = entropies(logits, self.temperature, self.backend)
        return self._feed(h)

    @staticmethod
    def compute_batch(probes: Sequence["EntropyProbe"], logits_batch: Any) -> list[EntropySignal]:
        """Feeds row ``i`` of ``logits_batch`` to ``probes[i]`` in one pass over the batch
        (the probes must share temperature and backend)."""
        if not probes:
            return []
        first = probes[0]
        if any(p.temperature != first.temperature or p.backend != first.backend for p in probes):
            raise ValueError("compute_batch needs probes with one temperature and backend")
        hs = entropies(logits_batch, first.temperature, first.backend)
        if len(hs) != len(probes):
            raise ValueError(f"{len(probes)} probes but {len(hs)} rows of logits")
        return [p._feed(h) for p, h in zip(probes, hs)]
