"""Every field of `meridian.toml`, read from its JSON Schema (`docs/src/meridian.schema.json`,
generated from the config types (core/src/config/ for the sections the hook reads too,
proxy/src/config/ for the rest) and kept in step with them by
proxy/tests/config_generated.rs), so a field added to the code without a default in
meridian.toml fails a test. Shared by the book's tests and the chart's (tests/docs,
tests/helm), so it lives in tests/support/, which pytest.ini puts on the path.

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
