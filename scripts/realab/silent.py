"""The benchmark model's tokens that show no text of their own. Its weights are random, so
it samples every token of its vocabulary alike, and many of them show nothing: the special
tokens (left out of the text) and the byte pieces of multi-byte characters (a byte above
0x7F alone is no character, and random tokens after it seldom complete one, so the
detokenizer holds the text back). A token that shows nothing reaches the client in a
later token's chunk, so on this model about a quarter of the tokens come without a chunk
of their own (each load's sentence on its stalls gives the share: `stalls`), and a gap
between visible tokens, the largest answer gap and the stalls among them, is a run of
silent tokens times the step time rather than the schedule's one step. With `REALAB_VISIBLE=1` the harness biases these tokens away
(`logit_bias` -100), so every answer token shows, as a real model's nearly all do."""

from __future__ import annotations

from pathlib import Path

#: What a piece of text that is no whole character decodes to.
REPLACEMENT = "\ufffd"


def silent_token_ids(model: Path) -> tuple[int, ...]:
    """`silent_ids` of `model`'s vocabulary (its `tokenizer.json`, read with Hugging Face
    `tokenizers`, as vLLM reads it)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    return silent_ids(tok.get_vocab_size(), lambda i: tok.decode([i], skip_special_tokens=True))


def silent_ids(vocab_size: int, decode) -> tuple[int, ...]:
    """The ids whose text alone (`decode(id)`, special tokens skipped) is empty or no
    whole character. Every other token decodes to whole characters alone, so any sequence
    of them shows as it comes."""
    return tuple(i for i in range(vocab_size) if not (text := decode(i)) or REPLACEMENT in text)


def logit_bias(think_end_id: int, silent: tuple[int, ...]) -> dict[str, int]:
    """The load tester's `logit_bias`: the end of thinking never sampled (the hook or the
    engine's budget ends it) and, with `silent`, no token that would show nothing."""
    return {str(think_end_id): -100, **{str(i): -100 for i in silent if i != think_end_id}}
