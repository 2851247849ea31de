"""``--scheduler-cls meridian_hook.scheduler.MeridianScheduler``: vLLM's default
``AsyncScheduler`` with Meridian's policy applied before every step. vLLM schedules its
running list in order and, out of KV blocks, preempts the last entry; the hook orders
that list (answering requests first, thinking ones filling the rest of the token budget)
and puts the policy's victim last. Every failure falls back to vLLM's own order."""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from meridian_hook import _native
from meridian_hook.runtime import runtime

log = logging.getLogger("meridian_hook")

#: Steps between two KV-tier measurements and clean-ups of finished requests.
_HOUSEKEEPING_EVERY = 16


class MeridianScheduler(AsyncScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meridian: _native.SchedulerCore | None = None
        self._meridian_seen: dict[str, int] = {}
        self._meridian_steps = 0
        rt = None
        try:
            rt = runtime()
        except Exception:  # noqa: BLE001
            log.exception("meridian hook: bad configuration; the scheduler runs as stock vLLM")
            return
        self._meridian_rt = rt
        with rt.guard("scheduler"):
            start, end = rt.markers(self.vllm_config)
            self._meridian = _native.SchedulerCore(rt.config.hook.policy, start, end)
            if str(getattr(self, "policy", "")).lower().endswith("priority"):
                log.warning(
                    "meridian hook: with --scheduling-policy priority vLLM picks victims by "
                    "request priority; the hook orders the batch but cannot choose victims"
                )
            log.info("meridian hook: scheduler policy %s", self._meridian.policy_name)
        with rt.guard("channel"):
            rt.start_listener()

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self._meridian is not None:
            with self._meridian_rt.guard("scheduler"):
                self._meridian_reorder(self._meridian)
        return super().schedule(*args, **kwargs)

    def _meridian_reorder(self, core: _native.SchedulerCore) -> None:
        running = self.running
        if not running:
            return
        seen = self._meridian_seen
        rows = []
        for req in running:
            rid = req.request_id
            done = seen.get(rid)
            if done is None:
                core.track(rid, list(req.prompt_token_ids or ()))
                done = 0
            out = req.output_token_ids
            n = len(out)
            new = [out[i] for i in range(done, n)] if n > done else []
            seen[rid] = n
            prefill = max(0, req.num_prompt_tokens - req.num_computed_tokens)
            rows.append((rid, float(req.arrival_time), int(req.priority), prefill, new))
        order = core.order(rows)
        if len(order) == len(running) and order != list(range(len(running))):
            running[:] = [running[i] for i in order]
        self._meridian_steps += 1
        if self._meridian_steps % _HOUSEKEEPING_EVERY == 0:
            self._meridian_housekeeping(core)

    def _meridian_housekeeping(self, core: _native.SchedulerCore) -> None:
        live = list(self.requests.keys())
        core.retain(live)
        live_set = set(live)
        for rid in [r for r in self._meridian_seen if r not in live_set]:
            del self._meridian_seen[rid]
        held = []
        for req in self.running:
            groups = self.kv_cache_manager.get_block_ids(req.request_id)
            held.append((req.request_id, sum(len(g) for g in groups)))
        core.account_kv(held, int(self.cache_config.block_size))

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
                moved = [b for b in tail if b.ref_cnt == 0 and not b.is_null and b.block_hash is not None]
                for b in moved:
                    queue.remove(b)
                queue.prepend_n(moved)
                core.demoted(len(moved))
        return out
