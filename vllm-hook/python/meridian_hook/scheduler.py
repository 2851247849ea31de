"""``--scheduler-cls meridian_hook.scheduler.MeridianScheduler``: vLLM's default
``AsyncScheduler`` with Meridian's policy applied before every step. vLLM schedules its
running list in order and, out of KV blocks, preempts the last entry; the hook orders
that list (answering requests first, thinking ones filling the rest of the token budget)
and puts the policy's victim last. It also carries out the policy's step limits: in an
express step (a request has just finished thinking and awaits its first visible token)
thinking and prefilling requests sit the step out and no new request is admitted, so
the step is short; otherwise, while someone is answering, a step computes at most the
policy's prefill cap of prompt tokens in all (by default half of
``max_num_batched_tokens``) (vLLM's own threshold caps each request's
chunk, so the hook also narrows the step's token budget to one token per decoding request
plus the cap). A policy that paces answers (reasoning-first) has an answering request
that is ahead of its reader sit steps out the same way, so the steps go to thinking
requests. Every failure falls back to vLLM's own order.

Everything it touches inside vLLM beyond the plugin interface goes through
:mod:`meridian_hook.vllm_adapter`, which checks when the scheduler is built that this vLLM
has it all (and refuses to start, or runs stock if configured to, when it does not)."""

from __future__ import annotations

import logging
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from meridian_hook import _native
from meridian_hook import vllm_adapter as adapter
from meridian_hook.runtime import runtime, think_markers

log = logging.getLogger("meridian_hook")

#: Steps between two KV-tier measurements and clean-ups of finished requests.
_HOUSEKEEPING_EVERY = 16
#: The pause after a step in which every running request sat out (pacing) and none ran.
_IDLE_PAUSE_S = 0.002

#: A step the policy puts no limit on: (prefill cap, think-decode cap, held positions,
#: token budget).
_Plan = tuple[int | None, int | None, list[int] | None, int | None]
_NO_PLAN: _Plan = (None, None, None, None)


class MeridianScheduler(AsyncScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meridian: _native.SchedulerCore | None = None
        self._meridian_held: list[Any] = []
        self._meridian_steps = 0
        #: The limits of the step last planned (read by the step trace).
        self._meridian_plan: _Plan = _NO_PLAN
        rt = None
        try:
            rt = runtime()
        except Exception:  # noqa: BLE001
            log.exception("meridian hook: bad configuration; the scheduler runs as stock vLLM")
            return
        self._meridian_rt = rt
        if not rt.vllm_supported(self, AsyncScheduler):
            # Configured to run as stock vLLM on a vLLM the hook does not support (it has
            # said so); the channel tells the proxy the hook is disabled.
            with rt.guard("channel"):
                rt.start_listener()
            return
        end: list[int] = []
        with rt.guard("scheduler"):
            start, end = think_markers(self.vllm_config)
            # The step budget as configured (the hook narrows max_num_scheduled_tokens
            # within a step and restores it; the configured figure is the engine's).
            budget = adapter.step_token_budget(self)
            self._meridian = _native.SchedulerCore(rt.config.hook.policy, start, end, budget)
            if str(getattr(self, "policy", "")).lower().endswith("priority"):
                log.warning(
                    "meridian hook: with --scheduling-policy priority vLLM picks victims by "
                    "request priority; the hook orders the batch but cannot choose victims"
                )
            log.info("meridian hook: scheduler policy %s", self._meridian.policy_name)
        with rt.guard("channel"):
            rt.start_listener()
            _native.set_can_end_thinking(rt.can_end_thinking(self.vllm_config, bool(end)))

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        core = self._meridian
        if core is None:
            return super().schedule(*args, **kwargs)
        # Runs every step: errors are caught inline (HookRuntime.failed) rather than
        # through the `guard` context manager (a generator object per use).
        rt = self._meridian_rt
        plan = _NO_PLAN
        try:
            plan = self._meridian_reorder(core)
        except Exception:  # noqa: BLE001 - never crash the engine
            rt.failed("scheduler")
        self._meridian_plan = plan
        restore: list[Any] = []
        self._meridian_held = []
        try:
            if plan != _NO_PLAN:
                try:
                    self._meridian_apply_limits(*plan, restore)
                except Exception:  # noqa: BLE001
                    rt.failed("scheduler")
            output = super().schedule(*args, **kwargs)
            if self._meridian_held and not getattr(output, "total_num_scheduled_tokens", 1):
                # Everyone sat the step out (answers paced to their readers, nothing else to
                # run): vLLM's loop would call again at once; a short pause keeps it from
                # spinning a core until a reader catches up.
                time.sleep(_IDLE_PAUSE_S)
            return output
        finally:
            for undo in reversed(restore):
                try:
                    undo()
                except Exception:  # noqa: BLE001
                    rt.failed("scheduler")
            held, self._meridian_held = self._meridian_held, []
            if held:
                # Still RUNNING: they only sat this step out, at the back of the list.
                running = adapter.running(self)
                present = set(map(id, running))
                running.extend(r for r in held if id(r) not in present)

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        out = super().update_from_output(*args, **kwargs)
        core = self._meridian
        if core is not None:
            # The step's tokens are read here, where vLLM has just appended them and its
            # lists are in the CPU's cache; read in the next `schedule()`, after the
            # forward pass, they were most of the hook's cost per step.
            try:
                # With the engine's running requests by phase and its queue, published for
                # every proxy replica to read (the hello's `engine`).
                running = adapter.running(self)
                core.observe_outputs(running, adapter.waiting_requests(self))
                if not running or self._meridian_steps % _HOUSEKEEPING_EVERY == 1:
                    # From the first step on, every 16th, and once drained.
                    core.count_free_blocks(adapter.free_kv_blocks(self))
            except Exception:  # noqa: BLE001 - never crash the engine
                self._meridian_rt.failed("scheduler")
        return out

    def _meridian_apply_limits(
        self,
        prefill_cap: int | None,
        think_cap: int | None,
        hold: list[int] | None,
        budget: int | None,
        restore: list[Any],
    ) -> None:
        """Holds requests out of this step's running list and narrows admission as the
        policy's limits say, appending the undo actions to ``restore``. ``hold``: the
        positions in the running list of the requests the limits keep out of the step
        (still prefilling when no prompt token may be computed; thinking past the
        think-decode cap), as the core worked them out; ``budget``: the step's token
        budget that bounds its prompt tokens, the core having put the prefilling
        requests behind the decoding ones."""
        if hold:
            running = adapter.running(self)
            kept = len(running) - len(hold)
            if adapter.free_kv_blocks(self) >= kept:
                # Only with a block to spare for every kept request: otherwise vLLM would
                # have to preempt, and with the thinkers held out its victim (the last
                # running request) would be an answering one.
                out = set(hold)
                self._meridian_held = [running[i] for i in hold]
                running[:] = [r for i, r in enumerate(running) if i not in out]
                adapter.keep_admission_slots(self, len(hold), restore)
        if prefill_cap == 0:
            adapter.admit_nothing_new(self, restore)
        elif prefill_cap:
            adapter.cap_prompt_chunk(self, prefill_cap, restore)
            if budget is not None:
                adapter.narrow_step_budget(self, budget, restore)

    def _meridian_reorder(self, core: _native.SchedulerCore) -> _Plan:
        """Orders the running list by the policy (the core reads the requests and only
        their tokens generated since the last step); returns the step's limits, whom
        they hold out and the token budget that bounds its prompt tokens."""
        running = adapter.running(self)
        if not running:
            return _NO_PLAN
        order, prefill_cap, think_cap, hold, budget = core.plan_running(running, adapter.oldest_waiting_start(self))
        if order is not None and len(order) == len(running):
            running[:] = [running[i] for i in order]
        self._meridian_steps += 1
        if self._meridian_steps % _HOUSEKEEPING_EVERY == 0:
            self._meridian_housekeeping(core)
        return (prefill_cap, think_cap, hold, budget)

    def _meridian_housekeeping(self, core: _native.SchedulerCore) -> None:
        core.retain(adapter.known_request_ids(self))
        block_size = adapter.block_size(self)
        # vLLM's blocks per request, one table per KV cache group: the core reads them for
        # the running requests without a Python call per request.
        tables = adapter.block_tables(self)
        if tables is not None:
            core.account_kv_running(tables, block_size)
            return
        core.account_kv([(r.request_id, adapter.blocks_held(self, r.request_id)) for r in adapter.running(self)], block_size)

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if self._meridian is not None:
            with self._meridian_rt.guard("scheduler"):
                tier = self._meridian.preempted(request.request_id)
                log.debug("meridian hook: vLLM preempted %s (%s)", request.request_id, tier)
        return super()._preempt_request(request, *args, **kwargs)

    def _free_blocks(self, request: Any) -> Any:
        # A finished request's blocks go back to vLLM's free queue as prefix cache, least
        # recently used evicted first. Blocks from the end of the prompt on hold its
        # thought; chat templates drop the thought from the next turn's history, and a
        # block's cache key chains over every token before it, so no later request can
        # hit them. Meridian's KV tiers evict that think-complete tier first: the blocks
        # move to the front of the queue, ahead of other requests' reusable prompts.
        tail: list[Any] = []
        core = self._meridian
        if core is not None:
            with self._meridian_rt.guard("scheduler"):
                first = core.first_dead_block(
                    request.request_id, adapter.prompt_tokens(request), adapter.block_size(self)
                )
                if first is not None:
                    tail = adapter.blocks_after(self, request, first)
        out = super()._free_blocks(request)
        if tail:
            with self._meridian_rt.guard("scheduler"):
                core.demoted(adapter.evict_first(self, tail))
        return out
