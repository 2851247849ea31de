"""Renders helm/meridian with Helm's own Go library (the `helm-python-sdk` package binds
it through a shared object: no helm binary, no cluster) and reads the result back.

Not a conftest.py on purpose: tests/python imports its conftest by module name, and two
conftest modules side by side in one pytest run would shadow each other."""

import functools
import os
import re
from pathlib import Path

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "meridian"
EXAMPLES = CHART / "examples"
GOLDEN = Path(__file__).resolve().parent / "golden"
BIN_DIR = Path(os.environ.get("MERIDIAN_BIN_DIR", ROOT / "target" / "debug"))

RELEASE = "meridian"
NAMESPACE = "inference"

# The token the chart generates when it cannot look an existing Secret up (always, when
# rendering offline): random by design, so masked before golden comparisons.
_TOKEN = re.compile(r"^(  token: )[A-Za-z0-9+/=]{64}$", re.M)


def example_names() -> list[str]:
    """Every example values file, by name (the chart's defaults alone are refused: they
    name no upstream)."""
    return sorted(p.stem for p in EXAMPLES.glob("*.yaml"))


def example_values(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text()) or {}


@functools.cache
def _chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def merged_values(values: dict) -> dict:
    return _chart().merge_values(values)


def validate_schema(values: dict) -> None:
    _chart().validate_schema(values)


def render_raw(values: dict) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would produce it."""
    return _chart().render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


class Rendered:
    """The objects of one rendering, with lookups by kind and name."""

    def __init__(self, values: dict):
        self.values = values
        self.raw = render_raw(values)
        self.notes = next((v for k, v in self.raw.items() if k.endswith("NOTES.txt")), "")
        self.objects: list[dict] = []
        for path, text in sorted(self.raw.items()):
            if path.endswith(".txt"):
                continue
            for doc in yaml.safe_load_all(text):
                if doc:
                    doc.setdefault("metadata", {}).setdefault("annotations", None)
                    if doc["metadata"]["annotations"] is None:
                        del doc["metadata"]["annotations"]
                    self.objects.append(doc)

    def of_kind(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: found {len(found)} in {self.names()}"
        return found[0]

    def maybe(self, kind: str, name: str) -> dict | None:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        return found[0] if found else None

    def names(self) -> list[str]:
        return [f"{o['kind']}/{o['metadata']['name']}" for o in self.objects]

    def golden_text(self) -> str:
        """Every rendered file, in path order, as `helm template` prints them."""
        parts = []
        for path in sorted(self.raw):
            text = self.raw[path].strip("\n")
            if not text:
                continue
            text = _TOKEN.sub(r"\1<random, see hookToken>", text)
            parts.append(f"# Source: {path}\n{text}\n")
        return "---\n".join(parts)


def render(values: dict) -> Rendered:
    return Rendered(values)


def container(deployment: dict, name: str) -> dict:
    cs = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(cs) == 1, f"{deployment['metadata']['name']}: no container {name}"
    return cs[0]


def env_map(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def lint(values: dict) -> dict:
    return helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
