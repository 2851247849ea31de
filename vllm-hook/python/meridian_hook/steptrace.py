"""Step timings from inside vLLM's engine loop, to calibrate the engine twin on the engine
a user really runs (``meridian-sim calibrate --steps FILE``) and to draw its step-time
curve (tokens per step -> step time).

Load it as the scheduler class, alone (stock scheduling, timed) or over the hook::

    --scheduler-cls meridian_hook.steptrace.StepTraceScheduler         # stock vLLM, sync
    --scheduler-cls meridian_hook.steptrace.AsyncStepTraceScheduler    # stock, async (GPU)
    --scheduler-cls meridian_hook.steptrace.TracedMeridianScheduler    # with the hook

Pick the stock class that matches what vLLM would run: ``Scheduler`` where async
scheduling is off (the CPU build always turns it off), ``AsyncScheduler`` where it is on
(the GPU default); naming a ``Scheduler`` subclass turns async scheduling off.

with ``MERIDIAN_STEP_TRACE=/path/steps.jsonl`` in the engine's environment (without it
both classes only schedule). Each step is one JSON line:

- ``t``: seconds (monotonic clock) when ``schedule()`` was entered;
- ``sched_s``: time inside ``schedule()``; ``step_s``: from entering ``schedule()`` to
  leaving ``update_from_output()`` for the same step, which is what the step cost a
  request's tokens waited for (scheduling, the forward pass, sampling, bookkeeping);
- ``tokens``: tokens scheduled; ``prefill_tokens``: those of requests still prefilling
  (prompt chunks, or a preempted request's recompute); ``decode_reqs``: requests
  decoding one token; ``decode_context``: tokens of KV cache those decoders attend to;
  ``prefill_context``: tokens already computed before each prefill chunk (its attention
  reads them); ``prefill_reqs``: requests computing prompt tokens; ``prefill_cap``
  (hooked engine only): the prompt tokens the hook's policy allowed the step (``null``:
  no limit; 0: an express step); ``running``, ``waiting``: queue lengths after scheduling;
  ``preempted``: requests vLLM preempted in this step, and ``preempted_output``,
  ``preempted_think``: those of them that had already ended their thought (answering:
  the victims a reader notices) and those still thinking, by the phase rule the proxy and
  the hook follow (``_native.phase_after``, the think delimiters of ``--reasoning-parser``
  or the model's family; both 0 without them).

Cost: one dict and one short line per step, buffered and written when the engine goes
idle or every 256 steps (a few microseconds against a step of milliseconds).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import time
from collections import deque
from typing import Any, TextIO

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from meridian_hook import _native
from meridian_hook import vllm_adapter as adapter
from meridian_hook.runtime import think_markers
from meridian_hook.scheduler import MeridianScheduler

log = logging.getLogger("meridian_hook")

#: Environment variable naming the JSON-lines file the steps are appended to.
TRACE_ENV = "MERIDIAN_STEP_TRACE"
_FLUSH_EVERY = 256


class _StepTrace:
    """What the traced schedulers share: the open steps (scheduled, output not yet
    back; more than one in flight under async scheduling) and the buffered lines."""

    def __init__(self, path: str, markers: tuple[list[int], list[int]]) -> None:
        self._file: TextIO = open(path, "a", buffering=1 << 16)  # noqa: SIM115 (closed at exit)
        self._open: deque[dict[str, Any]] = deque()
        self._lines = 0
        #: Think delimiters as token ids (start, end); no end: phases unknown.
        self._markers = markers
        atexit.register(self.close)

    def _victims(self, sched: Any, output: Any) -> tuple[int, int, int]:
        preempted, generated = adapter.preempted_tokens(sched, output)
        answering = thinking = 0
        start, end = self._markers
        if not end:
            return preempted, 0, 0  # phases unknown
        for prompt, tokens in generated:
            # The phase rule the proxy and the hook follow (meridian-core's PhaseTracker).
            phase = _native.phase_after(start, end, prompt, tokens)
            if phase == "output":
                answering += 1
            elif phase == "think":
                thinking += 1
        return preempted, answering, thinking

    def scheduled(self, sched: Any, started: float, output: Any) -> None:
        tokens = adapter.step_tokens(output)
        if tokens == 0:
            return
        prefill_tokens = prefill_reqs = decode_reqs = decode_context = prefill_context = 0
        for n, before, prompt_len in adapter.step_rows(sched, output):
            if n == 1 and before >= prompt_len:
                decode_reqs += 1
                decode_context += before
            else:
                prefill_tokens += n
                prefill_reqs += 1
                prefill_context += before
        preempted, preempted_output, preempted_think = self._victims(sched, output)
        running, waiting = adapter.queue_lengths(sched)
        step = {
            "t": started,
            "sched_s": time.perf_counter() - started,
            "tokens": tokens,
            "prefill_tokens": prefill_tokens,
            "decode_reqs": decode_reqs,
            "decode_context": decode_context,
            "prefill_context": prefill_context,
            "running": running,
            "waiting": waiting,
            "preempted": preempted,
            "preempted_output": preempted_output,
            "preempted_think": preempted_think,
            "prefill_reqs": prefill_reqs,
        }
        plan = getattr(sched, "_meridian_plan", None)
        if plan is not None:
            step["prefill_cap"] = plan[0]
        self._open.append(step)

    def updated(self, sched: Any) -> None:
        if not self._open:
            return
        step = self._open.popleft()
        step["step_s"] = time.perf_counter() - step["t"]
        self._file.write(json.dumps(step, separators=(",", ":")))
        self._file.write("\n")
        self._lines += 1
        if self._lines % _FLUSH_EVERY == 0 or (not self._open and adapter.queue_lengths(sched) == (0, 0)):
            self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def _trace_from_env(vllm_config: Any) -> _StepTrace | None:
    path = os.environ.get(TRACE_ENV)
    if not path:
        return None
    try:
        return _StepTrace(path, think_markers(vllm_config))
    except OSError:
        log.exception("meridian step trace: cannot open %s; steps are not recorded", path)
        return None


class _Traced:
    """Times each step around the scheduler it is mixed into; never changes a decision."""

    _meridian_trace: _StepTrace | None = None

    def _meridian_trace_init(self) -> None:
        self._meridian_trace = _trace_from_env(getattr(self, "vllm_config", None))

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        if self._meridian_trace is not None:
            self._meridian_trace.scheduled(self, started, output)
        return output

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        out = super().update_from_output(*args, **kwargs)  # type: ignore[misc]
        if self._meridian_trace is not None:
            self._meridian_trace.updated(self)
        return out


class StepTraceScheduler(_Traced, Scheduler):
    """vLLM's own synchronous scheduling, with each step timed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meridian_trace_init()


class AsyncStepTraceScheduler(_Traced, AsyncScheduler):
    """vLLM's own asynchronous scheduling, with each step timed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meridian_trace_init()


class TracedMeridianScheduler(_Traced, MeridianScheduler):
    """The Meridian hook's scheduling, with each step timed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meridian_trace_init()
