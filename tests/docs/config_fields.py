"""Every field of `meridian.toml`, read from its JSON Schema (`docs/src/meridian.schema.json`,
generated from the config types in core/src/config/ and kept in step with them by
core/tests/config_generated.rs), so a field added to the code without a default in
meridian.toml fails a test.

Paths are dotted; `[]` marks an array of tables (`upstream.endpoints[].url`) and `*` the
keys of a map (`budget.per_family.*`)."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "docs" / "src" / "meridian.schema.json"


def config_fields() -> list[str]:
    """Every leaf path of `meridian.toml`, in the types' order."""
    out: list[str] = []

    def walk(node: dict, prefix: str) -> None:
        for name, field in node["properties"].items():
            path = f"{prefix}{name}"
            items = field.get("items") or {}
            if "properties" in field:
                walk(field, path + ".")
            elif "properties" in items:
                walk(items, path + "[].")
            elif isinstance(field.get("additionalProperties"), dict):
                out.append(path + ".*")
            else:
                out.append(path)

    walk(json.loads(SCHEMA.read_text()), "")
    return out
