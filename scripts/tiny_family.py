"""The model-family file (models/*.toml format) for the tiny test model that
make_tiny_model.py builds, so a proxy recognises its think delimiters."""

import json
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
