"""The processes of the real-engine A/B: vLLM servers (CPU build) and Meridian proxies,
started once and paused (SIGSTOP to the whole process group) while another
configuration runs, so an idle engine takes no CPU from the one being measured on a
2-core machine, and no configuration pays a restart between rounds."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    """A child in its own process group (vLLM forks an engine core and a worker)."""

    name: str
    popen: subprocess.Popen
    url: str
    log: Path
    paused: bool = False

    def pause(self) -> None:
        if not self.paused and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            os.killpg(self.popen.pid, signal.SIGCONT)
            self.paused = False

    def stop(self) -> None:
        if self.popen.poll() is not None:
            return
        self.resume()
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)

    def alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{tail}")


def spawn(name: str, argv: list[str], env: dict[str, str], log: Path, url: str) -> Proc:
    out = open(log, "w")  # noqa: SIM115 (the child owns it)
    popen = subprocess.Popen([str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT,
                             env={**os.environ, **env}, start_new_session=True)
    return Proc(name, popen, url, log)


def wait_http(proc: Proc, path: str, timeout: float, ok=lambda r: r.status_code == 200) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        proc.alive()
        try:
            if ok(requests.get(proc.url + path, timeout=2)):
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{proc.name}: {proc.url}{path} not ready after {timeout:.0f} s (log: {proc.log})")


@dataclass
class EngineSpec:
    """How every engine of the A/B is started: the same model and limits for all."""

    python: str
    model: Path
    served_name: str
    dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_gib: int
    omp_threads: int
    extra: list[str] = field(default_factory=list)
    # The cores the engine's forward pass is bound to (vLLM's VLLM_CPU_OMP_THREADS_BIND,
    # e.g. "0"); None: vLLM's own choice.
    omp_bind: str | None = None
    # vLLM's engine core waits for its worker by sleeping 100 us between polls instead of
    # spinning: on a 2-core rig the spin takes the core the API server, proxies and load
    # tester share (see engine_site/sitecustomize.py).
    engine_core_polls: bool = False
    # vLLM's periodic stats (and with them its Prometheus counters for the prefix cache
    # and preemptions): off for the A/Bs, whose engines should spend nothing on logging;
    # on where a run reads those counters.
    log_stats: bool = False

    def argv(self, port: int, scheduler_cls: str, more: list[str]) -> list[str]:
        return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(port),
                "--reasoning-parser", "qwen3", "--dtype", self.dtype,
                "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
                "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--scheduler-cls", scheduler_cls, *([] if self.log_stats else ["--disable-log-stats"]),
                *self.extra, *more]

    def env(self) -> dict[str, str]:
        env = {"VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), "OMP_NUM_THREADS": str(self.omp_threads)}
        if self.omp_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.omp_bind
        if self.engine_core_polls:
            site = str(Path(__file__).resolve().parent / "engine_site")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH", "")) if p)
        return env


def start_engine(spec: EngineSpec, name: str, work: Path, scheduler_cls: str, more=(), env=None,
                 keep_trace: bool = False) -> Proc:
    """Starts engine `name`, its step trace in `work/<name>-steps.jsonl` (appended to when
    `keep_trace`, for a restarted engine; else started afresh) and its log beside it."""
    port = free_port()
    trace = work / f"{name}-steps.jsonl"
    if not keep_trace:
        trace.unlink(missing_ok=True)
    log = work / f"{name}.log"
    if keep_trace and log.exists():
        log.rename(work / f"{name}-{time.time():.0f}.log")
    proc = spawn(name, spec.argv(port, scheduler_cls, list(more)),
                 {**spec.env(), "MERIDIAN_STEP_TRACE": str(trace), **(env or {})},
                 log, f"http://127.0.0.1:{port}")
    return proc


def start_proxy(binary: Path, name: str, work: Path, sets: list[str], env=None) -> Proc:
    port = free_port()
    argv = [binary, "serve", "--listen", f"127.0.0.1:{port}"]
    for s in sets:
        argv += ["--set", s]
    return spawn(name, argv, {"MERIDIAN_LOG_LEVEL": "warn", **(env or {})}, work / f"{name}.log",
                 f"http://127.0.0.1:{port}")


def scrape(url: str) -> dict[str, float]:
    """Every sample of a Prometheus text page, keyed by its series (name and labels)."""
    out: dict[str, float] = {}
    for line in requests.get(url, timeout=10).text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        try:
            out[series] = float(value)
        except ValueError:
            continue
    return out
