"""The benchmark model's tokens that show no text of their own are found from its
vocabulary and, with REALAB_VISIBLE=1, biased away in every request; a set keeps one
setting throughout, and its commands reproduce it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from realab import policies, silent
from test_realab_policies import measured_rounds


def test_tokens_that_decode_to_nothing_or_to_half_a_character_are_silent():
    # A byte-level vocabulary: specials decode to nothing, a lone byte above 0x7F to the
    # replacement character, the rest to whole characters.
    texts = {0: "", 1: "", 2: "a", 3: " the", 4: "\ufffd", 5: "é", 6: "x\ufffd"}
    assert silent.silent_ids(len(texts), texts.__getitem__) == (0, 1, 4, 6)


def test_the_bias_always_holds_the_end_of_thinking_back_and_the_silent_tokens_when_asked():
    assert silent.logit_bias(7, ()) == {"7": -100}
    assert silent.logit_bias(7, (0, 4, 7)) == {"7": -100, "0": -100, "4": -100}


def test_a_set_keeps_one_setting_and_its_commands_reproduce_it(tmp_path: Path):
    first = measured_rounds(tmp_path / "w1", {"stock": 1.0, "hook-output-first": 0.8}, [0, 1])
    data = json.loads(first.read_text())
    data["setup"]["visible_tokens"] = True
    first.write_text(json.dumps(data))
    page_dir = tmp_path / "page"
    policies.keep(first, page_dir / "1-set", "silent tokens biased away")
    page = policies.set_section(page_dir / "1-set", 100)
    assert any("REALAB_VISIBLE=1" in line for line in page)
    assert any("biased away (`REALAB_VISIBLE`" in line for line in page)
    # Rounds measured with the silent tokens kept are another workload: refused.
    more = measured_rounds(tmp_path / "w2", {"stock": 1.0, "hook-output-first": 0.8}, [2])
    with pytest.raises(SystemExit, match="silent tokens kept"):
        policies.add(more, page_dir / "1-set", "round 2")
