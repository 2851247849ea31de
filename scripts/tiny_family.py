"""The model-family file (models/*.toml format) for the tiny test model that
make_tiny_model.py builds, so a proxy recognises its think delimiters."""

import json
import sys
from pathlib import Path


def write_family(tiny_model: Path, models_dir: Path, served_names: tuple[str, ...] = ("tiny-qwen3",)) -> dict:
    """Writes tiny.toml into `models_dir`, matching the names the model is served as
    (the tiny test model and the larger benchmark model share a tokenizer); returns the
    model's delimiter ids."""
    ids = json.loads((tiny_model / "meridian-ids.json").read_text())
    models_dir.mkdir(parents=True, exist_ok=True)
    (models_dir / "tiny.toml").write_text(f"""
name = "tiny"
display_name = "Tiny Qwen3 (test model)"
match = {json.dumps(list(served_names))}
reasoning_parser = "qwen3"
initial_phase = "think"
[tags]
start = ["<think>"]
end = ["</think>"]
start_ids = [{ids["<think>"]}]
end_ids = [{ids["</think>"]}]
[verification]
status = "text_only"
source = "scripts/make_tiny_model.py"
""")
    return ids


def main(argv: list[str]) -> int:
    """``tiny_family.py MODEL_DIR MODELS_DIR [SERVED_NAME ...]``: writes the family file and
    prints the delimiter ids as JSON (how the product's tests get it: they run the tools
    in scripts/, they do not import them)."""
    if len(argv) < 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    names = tuple(argv[2:]) or ("tiny-qwen3",)
    print(json.dumps(write_family(Path(argv[0]), Path(argv[1]), names)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
