"""Every field of `meridian.toml`, read from the typed source of truth (the serde structs in
core/src/config/), so a field added to the code without docs (or without a place in the
chart's schema) fails a test.

Paths are dotted; `[]` marks an array of tables (`upstream.endpoints[].url`) and `*` the
keys of a map (`budget.per_family.*`)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG_SRC = ROOT / "core" / "src" / "config"

_STRUCT = re.compile(r"pub struct (\w+) \{(.*?)\n\}", re.S)
_FIELD = re.compile(r"^\s*pub (\w+): (.+?),\s*$", re.M)


def _structs() -> dict[str, list[tuple[str, str]]]:
    structs = {}
    for path in sorted(CONFIG_SRC.glob("*.rs")):
        for name, body in _STRUCT.findall(path.read_text()):
            structs[name] = _FIELD.findall(body)
    return structs


def config_fields() -> list[str]:
    """Every leaf path of `MeridianConfig`, in source order."""
    structs = _structs()
    out: list[str] = []

    def walk(struct: str, prefix: str) -> None:
        for field, ty in structs[struct]:
            path = f"{prefix}{field}"
            ty = ty.strip()
            inner = re.fullmatch(r"(Option|Vec)<(\w+)>", ty)
            if ty in structs:
                walk(ty, path + ".")
            elif inner and inner.group(1) == "Vec" and inner.group(2) in structs:
                walk(inner.group(2), path + "[].")
            elif ty.startswith("BTreeMap<") or ty.startswith("HashMap<"):
                out.append(path + ".*")
            else:
                out.append(path)

    walk("MeridianConfig", "")
    return out
