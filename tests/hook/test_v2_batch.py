"""The logits processor's step under Model Runner V2 reads the device's tokens a step late:
it must still end every thought at exactly the right token, never end one twice, never
give one request's tokens to the next occupant of its slot, and wait for the device only
in the steps where an exit is decided (scripts/bench-hook-v2-gpu.sh checks the same on a
GPU, where a wait is real)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import metric
from meridian_hook.testing import THINK_END, THINK_START

from meridian_hook import _native
from meridian_hook.v2_batch import V2Batch, force

VOCAB = 467
PROMPT = [1, 2, THINK_START]


class ToyEngine:
    """Model Runner V2's request state and batch, on the CPU, with a model that thinks in
    token 5 until told to stop (or until its planned natural end)."""

    def __init__(self, slots: int = 8) -> None:
        self.prompt_len = SimpleNamespace(np=np.zeros(slots, dtype=np.int32))
        self.prefill_len = SimpleNamespace(np=np.zeros(slots, dtype=np.int32))
        self.all_token_ids = SimpleNamespace(gpu=torch.zeros(slots, 128, dtype=torch.int32))
        self.length = np.zeros(slots, dtype=np.int64)
        self.live: list[int] = []
        self.natural_end: dict[int, int] = {}
        self.rng = np.random.default_rng(0)

    def admit(self, slot: int, natural_end: int | None = None) -> None:
        self.prompt_len.np[slot] = self.prefill_len.np[slot] = len(PROMPT)
        self.all_token_ids.gpu[slot].zero_()
        self.all_token_ids.gpu[slot, : len(PROMPT)] = torch.tensor(PROMPT)
        self.length[slot] = len(PROMPT)
        self.natural_end.pop(slot, None)
        if natural_end is not None:
            self.natural_end[slot] = natural_end
        if slot not in self.live:
            self.live.append(slot)

    def step(self, batch: V2Batch, entropy_of: dict[int, bool] | None = None) -> dict[int, int]:
        """One engine step through the hook; returns the forced tokens by slot."""
        order = np.array(self.rng.permutation(self.live), dtype=np.int32)
        ctx = SimpleNamespace(
            idx_mapping_np=order,
            seq_lens_upper_bound_np=self.length[order].copy(),
            input_ids=self.all_token_ids.gpu[torch.from_numpy(order.astype(np.int64)), torch.from_numpy(self.length[order] - 1)],
        )
        logits = torch.full((len(order), VOCAB), -1e9)
        for r, s in enumerate(order):
            made = self.length[s] - len(PROMPT)
            if self.natural_end.get(int(s)) == made:
                logits[r, THINK_END] = 0.0
            elif (entropy_of or {}).get(int(s)):
                logits[r, 10:] = 0.0  # nearly flat: high entropy (token 5 still wins)
                logits[r, 5] = 1e-3
            else:
                logits[r, 10:20] = -3.0  # confident: low but positive entropy
                logits[r, 5] = 0.0
        forced = batch.step(logits, ctx)
        force(logits, forced)
        sampled = logits.argmax(dim=-1)
        for r, s in enumerate(order):
            self.all_token_ids.gpu[s, self.length[s]] = int(sampled[r])
            self.length[s] += 1
        return {int(order[r]): t for r, t in forced}

    def output(self, slot: int) -> list[int]:
        return self.all_token_ids.gpu[slot, len(PROMPT) : self.length[slot]].tolist()


def controller(signal: str = "off", budget: int | None = None) -> _native.ExitController:
    return _native.ExitController([THINK_START], [THINK_END], signal, 8, 4, 1.5, budget, use_directives=False)


def admit(eng: ToyEngine, ctl, batch: V2Batch, slot: int, budget: int | None = None, natural_end: int | None = None):
    eng.admit(slot, natural_end)
    ctl.add(slot, [], None, budget)  # as MeridianLogitsProcessor.add_request: prompt read later
    batch.add(slot)


def test_a_budget_ends_the_thought_at_its_token_waiting_only_at_the_exit():
    eng, ctl = ToyEngine(), controller()
    batch = V2Batch(ctl, eng, entropy=False)
    admit(eng, ctl, batch, 3, budget=6)
    admit(eng, ctl, batch, 5, budget=9)
    waits_before_exit = None
    for k in range(14):
        if k == 6:
            waits_before_exit = batch.waits
        eng.step(batch)
    assert waits_before_exit == 0, "steps that end nothing never wait for the device"
    assert eng.output(3).index(THINK_END) == 6 and eng.output(5).index(THINK_END) == 9
    assert eng.output(3).count(THINK_END) == 1 and eng.output(5).count(THINK_END) == 1
    assert batch.waits <= 4, "about two waits per thought ended"


def test_a_thought_the_model_ended_while_its_token_was_in_flight_is_not_ended_twice():
    eng, ctl = ToyEngine(), controller()
    batch = V2Batch(ctl, eng, entropy=False)
    # Ends itself at its 4th output token: the budget (5) is reached only counting it.
    admit(eng, ctl, batch, 2, budget=5, natural_end=4)
    for _ in range(10):
        eng.step(batch)
    out = eng.output(2)
    assert out.index(THINK_END) == 4 and out.count(THINK_END) == 1, out


def test_a_reused_slot_never_gets_its_previous_occupants_late_tokens():
    eng, ctl = ToyEngine(), controller("rpdi")
    batch = V2Batch(ctl, eng, entropy=True)
    admit(eng, ctl, batch, 1, budget=50)
    admit(eng, ctl, batch, 4, budget=3)
    for k in range(12):
        eng.step(batch, entropy_of={1: k >= 6})  # the old occupant grows unsure
    # Slot 1's request leaves mid-thought with its last token and entropies still in
    # flight; a new request takes the slot.
    ctl.remove(1)
    admit(eng, ctl, batch, 1, budget=4)
    for _ in range(8):
        eng.step(batch)
    out = eng.output(1)
    assert out.index(THINK_END) == 4 and out.count(THINK_END) == 1, (
        "the new request thought exactly its budget: none of the old one's tokens or "
        f"entropies counted for it: {out}"
    )
    assert eng.output(4).index(THINK_END) == 3


def test_a_request_resumed_after_preemption_is_read_late_with_its_output():
    eng, ctl = ToyEngine(), controller()
    batch = V2Batch(ctl, eng, entropy=False)
    eng.admit(0)
    resumed = PROMPT + [5, 5, THINK_END, 9]
    eng.all_token_ids.gpu[0, : len(resumed)] = torch.tensor(resumed)
    eng.prefill_len.np[0] = eng.length[0] = len(resumed)
    ctl.add(0, [], None, 1)
    batch.add(0)
    for _ in range(4):
        assert eng.step(batch) == {}, "an answering request is never forced, whatever its budget"
    assert ctl.phase(0) == "output"


def test_entropies_read_late_still_drive_the_rpdi_exit(tmp_path):
    eng, ctl = ToyEngine(), controller("rpdi")
    batch = V2Batch(ctl, eng, entropy=True)
    admit(eng, ctl, batch, 6)
    before = metric("meridian_hook_entropy_rows_total")
    ended_at = None
    for k in range(40):
        forced = eng.step(batch, entropy_of={6: k >= 20})  # confident, then unsure from step 20
        if forced:
            ended_at = k
            break
    assert metric("meridian_hook_entropy_rows_total") > before, "entropies reached the signal"
    assert ended_at is not None and 20 <= ended_at <= 26, f"ended at step {ended_at}"
    assert metric('meridian_hook_forced_exits_total{reason="rpdi"}') >= 1


@pytest.mark.parametrize("rows", [[], [0]])
def test_a_late_value_for_nothing_awaited_is_an_error_not_a_silent_shift(rows):
    ctl = controller()
    with pytest.raises(ValueError):
        ctl.observe_late([5] * len(rows))
