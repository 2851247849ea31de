"""Builds a tiny Qwen3-architecture reasoning model that a CPU vLLM can serve.

No model hub is reachable here, so the model is made on the spot: a BPE tokenizer trained
on a small built-in corpus with Qwen-style special tokens (<think> and </think> among
them), a chat template that opens the think block in the prompt (like Qwen3
Thinking-2507), and random bf16 weights. It emits random tokens, so tests steer the
phase switch (for example with `logit_bias` on </think>) instead of waiting for it.

Usage: python make_tiny_model.py OUT_DIR [SIZE] [JSON overrides]

SIZE is `tiny` (the default: the test model, as small as vLLM's CPU attention allows) or
`bench` (the dispatch benchmark's model: wide and deep enough that a step's time grows
clearly with the tokens in it, so a long prompt chunk visibly stretches the step that
carries it; scripts/bench-dispatch-real.sh measures that curve). JSON overrides change
single Qwen3Config fields, for sizing experiments.
"""

import json
import sys
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Like Qwen3's, the think tags are added tokens but not special ones, so they stay in the
# detokenized text unless a reasoning parser takes them out.
THINK_TAGS = ["<think>", "</think>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<|im_start|>assistant\n<think>\n\n</think>\n\n' }}"
    "{% else %}"
    "{{ '<|im_start|>assistant\n<think>\n' }}"
    "{% endif %}"
    "{% endif %}"
)

CORPUS = """
The proxy forwards every chunk as soon as it arrives. Reasoning models think first and
answer second. Let me check the arithmetic: two plus two is four, and four times three
is twelve. Wait, the user asked for the capital of France, which is Paris. So the answer
is clear. First, consider the constraints; then verify each step; finally summarise.
Hmm, maybe there is a simpler way. Alternatively we could count the tokens directly.
""" * 20


#: Model shapes by name. Both keep head_dim 64 (vLLM's CPU attention rejects 16).
SIZES = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 4096},
    "bench": {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 6,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 8192},
}


def build(out: Path, size: str = "tiny", overrides: dict | None = None) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, decoders, trainers
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    shape = {**SIZES[size], **(overrides or {})}
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([CORPUS], trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TAGS])
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    ids = {s: tok.token_to_id(s) for s in SPECIALS + THINK_TAGS}

    added = {
        str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": s not in ("<think>", "</think>")}
        for s, i in ids.items()
    }
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": shape["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }, indent=2))

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab,
        **shape,
        head_dim=64,
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({
        "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}))
    (out / "meridian-ids.json").write_text(json.dumps(ids))
    (out / "meridian-shape.json").write_text(json.dumps({"size": size, **shape}))
    print(json.dumps({"dir": str(out), "vocab": vocab, "size": size, **shape, **ids}))


if __name__ == "__main__":
    build(
        Path(sys.argv[1]),
        sys.argv[2] if len(sys.argv) > 2 else "tiny",
        json.loads(sys.argv[3]) if len(sys.argv) > 3 else None,
    )
