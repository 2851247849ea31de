"""The logits processor under both of vLLM's interfaces: budgets and proxy directives
force the end-of-thinking token in exactly the right row at the right step."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import metric
from meridian_hook.testing import THINK_END, THINK_START, reasoning_config
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality

from meridian_hook import _native
from meridian_hook.logits import MeridianLogitsProcessor

VOCAB = 467
PROMPT = [1, 2, THINK_START]
CONFIG = SimpleNamespace(reasoning_config=reasoning_config(), model_config=None)


def forced_rows(logits: torch.Tensor) -> dict[int, int]:
    """Rows whose only finite logit is one token, with that token."""
    out = {}
    for r in range(logits.shape[0]):
        finite = torch.isfinite(logits[r]).nonzero().flatten().tolist()
        if len(finite) == 1:
            out[r] = finite[0]
    return out


def v1_processor() -> MeridianLogitsProcessor:
    return MeridianLogitsProcessor(CONFIG, torch.device("cpu"), False)


def params(**xargs) -> SamplingParams:
    return SamplingParams(max_tokens=64, extra_args=xargs or None)


def test_v1_budget_forces_end_token_after_n_thinking_tokens():
    lp = v1_processor()
    out0: list[int] = []
    out1: list[int] = []
    lp.update_state(
        BatchUpdate(batch_size=2, removed=[], added=[(0, params(meridian_think_budget=3), PROMPT, out0), (1, params(), PROMPT, out1)], moved=[])
    )
    before = metric('meridian_hook_forced_exits_total{reason="budget"}')
    for step in range(3):
        assert forced_rows(lp.apply(torch.zeros(2, VOCAB))) == {}, f"step {step}"
        out0.append(5)
        out1.append(5)
    assert forced_rows(lp.apply(torch.zeros(2, VOCAB))) == {0: THINK_END}, "3 thinking tokens: budget spent"
    out0.append(THINK_END)
    out1.append(5)
    assert forced_rows(lp.apply(torch.zeros(2, VOCAB))) == {}, "row 0 answers now, row 1 has no budget"
    assert metric('meridian_hook_forced_exits_total{reason="budget"}') == before + 1


def test_v1_directive_by_request_id_follows_the_request_across_moves():
    lp = v1_processor()
    out = [5]
    lp.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, params(meridian_request_id="req-42"), PROMPT, out)], moved=[]))
    assert forced_rows(lp.apply(torch.zeros(1, VOCAB))) == {}
    # vLLM condenses its batch: the request moves to row 2 (now a 3-row batch).
    lp.update_state(BatchUpdate(batch_size=3, removed=[], added=[], moved=[(0, 2, MoveDirectionality.UNIDIRECTIONAL)]))
    _native.apply_directive(json.dumps({"request_id": "req-42", "action": "end_thinking"}))
    out.append(5)
    assert forced_rows(lp.apply(torch.zeros(3, VOCAB))) == {2: THINK_END}


def test_v1_prompt_with_closed_think_block_is_never_forced():
    lp = v1_processor()
    out: list[int] = []
    lp.update_state(
        BatchUpdate(batch_size=1, removed=[], added=[(0, params(meridian_think_budget=1), [THINK_START, THINK_END], out)], moved=[])
    )
    out.extend([5, 5, 5])
    assert forced_rows(lp.apply(torch.zeros(1, VOCAB))) == {}


def test_invalid_budget_is_rejected_at_admission():
    with pytest.raises(ValueError, match="meridian_think_budget"):
        MeridianLogitsProcessor.validate_params(params(meridian_think_budget=0))
    with pytest.raises(ValueError, match="meridian_request_id"):
        MeridianLogitsProcessor.validate_params(params(meridian_request_id=7))


def test_v1_rpdi_exit_on_rising_entropy(tmp_path, monkeypatch: pytest.MonkeyPatch):
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[exit]\nsignal = "rpdi"\nmin_think_tokens = 8\nrpdi_window = 8\nrpdi_lambda = 1.5\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    lp = v1_processor()
    out: list[int] = []
    lp.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, params(), PROMPT, out)], moved=[]))
    peaked = torch.full((1, VOCAB), -30.0)
    peaked[0, 5] = 0.0  # entropy ~0
    for _ in range(40):
        assert forced_rows(lp.apply(peaked.clone())) == {}
        out.append(5)
    forced = {}
    for _ in range(8):
        forced = forced_rows(lp.apply(torch.zeros(1, VOCAB)))  # uniform: entropy log(467)
        if forced:
            break
        out.append(5)
    assert forced == {0: THINK_END}


def rpdi_exit_step(lp: MeridianLogitsProcessor) -> int | None:
    """The step at which `lp` forces the end of a thought that is confident for 40 steps
    and then unsure (uniform logits)."""
    out: list[int] = []
    lp.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, params(), PROMPT, out)], moved=[]))
    peaked = torch.full((1, VOCAB), -30.0)
    peaked[0, 5] = 0.0  # entropy ~0
    for step in range(48):
        logits = peaked.clone() if step < 40 else torch.zeros(1, VOCAB)
        if forced_rows(lp.apply(logits)):
            return step
        out.append(5)
    return None


def test_v1_on_a_gpu_reads_entropies_a_step_late_and_still_exits(tmp_path, monkeypatch: pytest.MonkeyPatch):
    # On a GPU the V1 runner's processor is built with the batch's device: its entropies
    # go to the controller a step late (never waiting for the device); the logits here
    # stay on the CPU, where a late read lands at the next step.
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[exit]\nsignal = "rpdi"\nmin_think_tokens = 8\nrpdi_window = 8\nrpdi_lambda = 1.5\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    at_once = rpdi_exit_step(v1_processor())
    before = metric("meridian_hook_entropy_rows_total")
    late = MeridianLogitsProcessor(CONFIG, torch.device("cuda"), False)
    assert late._late is not None, "a processor on a GPU reads its entropies late"
    late_step = rpdi_exit_step(late)
    assert at_once is not None and late_step == at_once + 1, (at_once, late_step)
    assert metric("meridian_hook_entropy_rows_total") > before, "the late entropies reached the signal"


def test_v1_on_a_gpu_budgets_act_in_their_own_step_and_a_moved_requests_late_value_is_dropped(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[exit]\nsignal = "rpdi"\nmin_think_tokens = 8\nrpdi_window = 8\nrpdi_lambda = 1.5\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    lp = MeridianLogitsProcessor(CONFIG, torch.device("cuda"), False)
    out0: list[int] = []
    out1: list[int] = []
    lp.update_state(
        BatchUpdate(batch_size=2, removed=[], added=[(0, params(meridian_think_budget=3), PROMPT, out0), (1, params(), PROMPT, out1)], moved=[])
    )
    for step in range(3):
        assert forced_rows(lp.apply(torch.zeros(2, VOCAB))) == {}, f"step {step}"
        out0.append(5)
        out1.append(5)
    # The budget needs no entropy: it ends the thought in its own step.
    assert forced_rows(lp.apply(torch.zeros(2, VOCAB))) == {0: THINK_END}
    out0.append(THINK_END)
    out1.append(5)
    # Row 1's request moves to row 3 while its last entropy is in flight: the value for
    # its old slot is dropped, and the batch goes on without an error.
    lp.update_state(BatchUpdate(batch_size=4, removed=[0], added=[], moved=[(1, 3, MoveDirectionality.UNIDIRECTIONAL)]))
    before = metric('meridian_hook_errors_total{site="logits_processor"}')
    out1.append(5)
    assert forced_rows(lp.apply(torch.zeros(4, VOCAB))) == {}
    assert metric('meridian_hook_errors_total{site="logits_processor"}') == before


class FakeV2State:
    """The parts of Model Runner V2's request state the processor reads, on CPU."""

    def __init__(self, prompts: dict[int, list[int]], resumed: dict[int, list[int]] | None = None):
        width = 64
        self.prompt_len = SimpleNamespace(np=np.zeros(8, dtype=np.int32))
        self.prefill_len = SimpleNamespace(np=np.zeros(8, dtype=np.int32))
        self.all_token_ids = SimpleNamespace(gpu=torch.zeros(8, width, dtype=torch.int32))
        for slot, p in prompts.items():
            out = (resumed or {}).get(slot, [])
            self.prompt_len.np[slot] = len(p)
            self.prefill_len.np[slot] = len(p) + len(out)
            self.all_token_ids.gpu[slot, : len(p) + len(out)] = torch.tensor(p + out)


def v2_ctx(slots: list[int], seq_lens: list[int], last_tokens: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        idx_mapping_np=np.array(slots),
        seq_lens_upper_bound_np=np.array(seq_lens),
        input_ids=torch.tensor(last_tokens),
    )


def test_v2_budget_forces_end_token_in_the_row_of_the_slot():
    state = FakeV2State({3: PROMPT, 5: PROMPT})
    lp = MeridianLogitsProcessor(CONFIG, state)
    assert lp.add_request(3, params(meridian_think_budget=2))
    assert lp.add_request(5, params())
    plen = len(PROMPT)
    # First sampling: nothing generated yet. Rows are in batch order: slot 5, then 3.
    assert forced_rows(lp.apply(torch.zeros(2, VOCAB), v2_ctx([5, 3], [plen, plen], [2, 2]))) == {}
    assert forced_rows(lp.apply(torch.zeros(2, VOCAB), v2_ctx([5, 3], [plen + 1, plen + 1], [9, 9]))) == {}
    forced = forced_rows(lp.apply(torch.zeros(2, VOCAB), v2_ctx([5, 3], [plen + 2, plen + 2], [9, 9])))
    assert forced == {1: THINK_END}, "slot 3 sits in row 1 this step"
    after = lp.apply(torch.zeros(2, VOCAB), v2_ctx([3, 5], [plen + 3, plen + 3], [THINK_END, 9]))
    assert forced_rows(after) == {}, "slot 3 answers now"


def test_v2_request_resumed_after_preemption_keeps_its_phase():
    # Slot 2 had thought, ended its thought and answered 3 tokens before it was preempted.
    state = FakeV2State({2: PROMPT}, resumed={2: [5, 5, THINK_END, 9, 9, 9]})
    lp = MeridianLogitsProcessor(CONFIG, state)
    lp.add_request(2, params(meridian_think_budget=1))
    filled = len(PROMPT) + 6
    # Refill chunk: the row does not sample, nothing is forced.
    assert forced_rows(lp.apply(torch.zeros(1, VOCAB), v2_ctx([2], [filled - 2], [1]))) == {}
    # Back to decoding: an answering request, never forced, whatever its budget.
    assert forced_rows(lp.apply(torch.zeros(1, VOCAB), v2_ctx([2], [filled], [9]))) == {}
    assert forced_rows(lp.apply(torch.zeros(1, VOCAB), v2_ctx([2], [filled + 1], [9]))) == {}


def test_v1_swapped_and_removed_slots_keep_each_requests_count():
    lp = v1_processor()
    outs: list[list[int]] = [[], [], []]
    lp.update_state(
        BatchUpdate(
            batch_size=3,
            removed=[],
            added=[(0, params(meridian_think_budget=2), PROMPT, outs[0]), (1, params(), PROMPT, outs[1]), (2, params(), PROMPT, outs[2])],
            moved=[],
        )
    )
    for out in outs:
        out.append(5)
    assert forced_rows(lp.apply(torch.zeros(3, VOCAB))) == {}
    # vLLM swaps rows 0 and 1, then drops row 2: the budgeted request now sits in row 1.
    lp.update_state(BatchUpdate(batch_size=3, removed=[2], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]))
    outs[0].append(5)
    outs[1].append(5)
    assert forced_rows(lp.apply(torch.zeros(2, VOCAB))) == {1: THINK_END}, "2 thinking tokens: budget spent"
