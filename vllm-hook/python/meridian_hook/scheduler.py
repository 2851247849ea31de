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
requests. Every failure falls back to vLLM's own order."""

from __future__ import annotations

import logging
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.interface import PauseState

from meridian_hook import _native
from meridian_hook.runtime import runtime

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
        end: list[int] = []
        with rt.guard("scheduler"):
            start, end = rt.markers(self.vllm_config)
            # The step budget as configured (the hook narrows max_num_scheduled_tokens
            # within a step and restores it; the configured figure is the engine's).
            budget = self.scheduler_config.max_num_batched_tokens
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
                present = set(map(id, self.running))
                self.running.extend(r for r in held if id(r) not in present)

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
            running = self.running
            kept = len(running) - len(hold)
            free = self.kv_cache_manager.block_pool.get_num_free_blocks()
            if free >= kept:
                # Only with a block to spare for every kept request: otherwise vLLM would
                # have to preempt, and with the thinkers held out its victim (the last
                # running request) would be an answering one.
                out = set(hold)
                self._meridian_held = [running[i] for i in hold]
                running[:] = [r for i, r in enumerate(running) if i not in out]
                if hasattr(self, "max_num_active_reqs"):
                    # Held requests still occupy their slots: admit no more than before.
                    cap = self.max_num_active_reqs
                    self.max_num_active_reqs = max(0, cap - len(hold))
                    restore.append(lambda: setattr(self, "max_num_active_reqs", cap))
        if prefill_cap == 0 and self._pause_state == PauseState.UNPAUSED:
            # Admits nothing new this step (requests holding KV blocks still may).
            self._pause_state = PauseState.PAUSED_NEW
            restore.append(lambda: setattr(self, "_pause_state", PauseState.UNPAUSED))
        elif prefill_cap:
            cfg = self.scheduler_config
            before = cfg.long_prefill_token_threshold
            if before == 0 or before > prefill_cap:
                cfg.long_prefill_token_threshold = prefill_cap
                restore.append(lambda: setattr(cfg, "long_prefill_token_threshold", before))
            tokens = self.max_num_scheduled_tokens
            if budget is not None and budget < tokens:
                self.max_num_scheduled_tokens = budget
                restore.append(lambda: setattr(self, "max_num_scheduled_tokens", tokens))

    def _meridian_reorder(self, core: _native.SchedulerCore) -> _Plan:
        """Orders the running list by the policy (the core reads the requests and only
        their tokens generated since the last step); returns the step's limits, whom
        they hold out and the token budget that bounds its prompt tokens."""
        running = self.running
        if not running:
            return _NO_PLAN
        order, prefill_cap, think_cap, hold, budget = core.plan_running(running)
        if order is not None and len(order) == len(running):
            running[:] = [running[i] for i in order]
        self._meridian_steps += 1
        if self._meridian_steps % _HOUSEKEEPING_EVERY == 0:
            self._meridian_housekeeping(core)
        return (prefill_cap, think_cap, hold, budget)

    def _meridian_housekeeping(self, core: _native.SchedulerCore) -> None:
        core.retain(self.requests.keys())
        block_size = int(self.cache_config.block_size)
        try:
            # vLLM's blocks per request, one table per KV cache group: the core reads
            # them for the running requests without a Python call per request.
            managers = self.kv_cache_manager.coordinator.single_type_managers
            tables = [m.req_to_blocks for m in managers]
        except AttributeError:
            tables = None
        if tables is not None and all(isinstance(t, dict) for t in tables):
            core.account_kv_running(tables, block_size)
            return
        held = []
        for req in self.running:
            groups = self.kv_cache_manager.get_block_ids(req.request_id)
            held.append((req.request_id, sum(len(g) for g in groups)))
        core.account_kv(held, block_size)

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
                if core.thought(request.request_id):
                    block_size = int(self.cache_config.block_size)
                    first = request.num_prompt_tokens // block_size
                    groups = self.kv_cache_manager.get_blocks(request.request_id).blocks
                    tail = [b for group in groups for b in group[first:]]
        out = super()._free_blocks(request)
        if tail:
            with self._meridian_rt.guard("scheduler"):
                pool = self.kv_cache_manager.block_pool
                queue = pool.free_block_queue
                moved = [
                    b
                    for b in tail
                    if b.ref_cnt == 0
                    and not b.is_null
                    and b.block_hash is not None
                    and getattr(b, "pool", None) in (None, pool)
                ]
                for b in moved:
                    queue.remove(b)
                queue.prepend_n(moved)
                core.demoted(len(moved))
        return out
