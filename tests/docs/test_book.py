"""The book (docs/) kept in step with the code: every config field documented with its
default, every exported metric catalogued, every internal link resolving."""

import json
import os
import re
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
import requests

from config_fields import ROOT, config_fields

DOCS = ROOT / "docs" / "src"
BIN_DIR = Path(os.environ.get("MERIDIAN_BIN_DIR", ROOT / "target" / "debug"))

# Fields meridian.toml leaves commented out (absent by default), with the default the
# reference table must give them. Every other field must be set in meridian.toml.
OPTIONAL_FIELDS = {
    "upstream.endpoints[].url": "required",
    "upstream.endpoints[].name": "host:port of the URL",
    "upstream.endpoints[].hook": "unset",
    "upstream.endpoints[].models": "unset",
    "upstream.endpoints[].role": "both",
    "upstream.api_key_env": "unset",
    "models.dir": "unset",
    "models.aliases.*": "empty",
    "models.default_family": "unset",
    "budget.think_tokens": "unset",
    "budget.think_seconds": "unset",
    "budget.per_family.*": "empty",
    "twin.profile_file": "unset",
    "twin.workload": "unset",
    "admin.listen": "unset",
    "admission.max_streams": "unset",
    "admission.max_waiting": "unset",
    "admission.max_kv_usage": "unset",
    "admission.replica_index": "unset",
    "telemetry.tracing.enabled": "unset",
    "telemetry.tracing.endpoint": "unset",
    "telemetry.tracing.protocol": "unset",
    "telemetry.tracing.sample_ratio": "unset",
    "telemetry.tracing.service_name": "unset",
    "tenants.default_tenant": "unset",
    "tenants.tenant[].name": "required",
    "tenants.tenant[].api_key_sha256": "[]",
    "tenants.tenant[].max_streams": "unset",
    "tenants.tenant[].tokens_per_minute": "unset",
    "tenants.tenant[].weight": 1,
    "tenants.tenant[].allow_priority": False,
    "tenants.tenant[].think_budget_tokens": "unset",
    "tenants.tenant[].think_budget_s": "unset",
}


# ---------- configuration reference ----------


def reference_rows() -> dict[str, str]:
    """`field` -> default cell of the table in configuration.md (placeholders as `*`)."""
    rows = {}
    for line in (DOCS / "configuration.md").read_text().splitlines():
        m = re.match(r"^\| `([^`]+)` \|[^|]*\| ([^|]*) \|", line)
        if not m:
            continue
        field = re.sub(r"<[^>]+>", "*", m.group(1))
        assert field not in rows, f"{field} has two rows"
        rows[field] = m.group(2).strip().strip("`")
    return rows


def toml_leaves(table: dict, prefix="") -> dict[str, object]:
    out = {}
    for k, v in table.items():
        if isinstance(v, dict):
            out.update(toml_leaves(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def test_field_walker_reads_the_generated_schema():
    fields = config_fields()
    assert "upstream.max_attempts" in fields and "exit.eat_delta" in fields
    assert "upstream.endpoints[].hook" in fields and "budget.per_family.*" in fields


def test_meridian_schema_prints_the_published_schema():
    """What an editor gets from `meridian schema` is the schema the book publishes (which
    proxy/tests/config_generated.rs keeps equal to the config types)."""
    printed = subprocess.run([str(BIN_DIR / "meridian"), "schema"], capture_output=True, text=True, check=True)
    assert printed.stdout == (DOCS / "meridian.schema.json").read_text()
    schema = json.loads(printed.stdout)
    assert schema["title"] == "meridian.toml" and schema["additionalProperties"] is False
    attempts = schema["properties"]["upstream"]["properties"]["max_attempts"]
    assert (attempts["minimum"], attempts["maximum"], attempts["default"]) == (1, 10, 2)


def test_meridian_toml_sets_every_field_or_lists_it_as_optional():
    shipped = toml_leaves(tomllib.loads((ROOT / "meridian.toml").read_text()))
    fields = set(config_fields())
    assert set(shipped) | set(OPTIONAL_FIELDS) == fields, (
        "a config field is neither set in meridian.toml nor listed in OPTIONAL_FIELDS: "
        f"{sorted(fields - set(shipped) - set(OPTIONAL_FIELDS))}; unknown: "
        f"{sorted((set(shipped) | set(OPTIONAL_FIELDS)) - fields)}"
    )
    assert not set(shipped) & set(OPTIONAL_FIELDS)
    text = (ROOT / "meridian.toml").read_text()
    for field in OPTIONAL_FIELDS:
        # The field's own name (a map's name for `x.*`), in a commented-out example line.
        name = field.replace("[]", "").removesuffix(".*").split(".")[-1]
        assert re.search(rf"^#.*\b{re.escape(name)}\b", text, re.M), f"meridian.toml does not mention {field}"


def same_default(doc: str, value) -> bool:
    if isinstance(value, bool):
        return doc == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(doc) == float(value)
        except ValueError:
            return False
    return doc == str(value)


def test_configuration_reference_documents_every_field_with_its_default():
    rows = reference_rows()
    fields = config_fields()
    missing = [f for f in fields if f not in rows]
    extra = [f for f in rows if f not in fields]
    assert not missing, f"configuration.md has no row for {missing}"
    assert not extra, f"configuration.md documents fields the code does not have: {extra}"
    shipped = toml_leaves(tomllib.loads((ROOT / "meridian.toml").read_text()))
    for field in fields:
        want = shipped.get(field, OPTIONAL_FIELDS.get(field))
        assert same_default(rows[field], want), f"{field}: documented default {rows[field]!r}, meridian.toml {want!r}"


def test_every_reference_row_has_a_type_range_and_advice_column():
    for line in (DOCS / "configuration.md").read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert len(cells) == 5, line
            assert cells[1] and cells[4], f"type and description must not be empty: {line}"


# ---------- metrics catalogue ----------


class Proxy:
    """`meridian serve --twin`: on its embedded twin, on free ports."""

    def __init__(self):
        binary = BIN_DIR / "meridian"
        if not binary.exists():
            pytest.fail(f"{binary} is missing: build it first (scripts/test.sh does)")
        self.proc = subprocess.Popen(
            [
                binary, "serve", "--twin", "--listen", "127.0.0.1:0", "--set", "twin.speed=50",
                # One tenant that every request falls to, so its series are exposed too.
                "--set", "tenants.enabled=true", "--set", "tenants.default_tenant=everyone",
                "--set", 'tenants.tenant=[{name = "everyone"}]',
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "MERIDIAN_LOG_LEVEL": "warn"},
        )
        self.url = self.twin_url = None
        deadline = time.time() + 30
        lines = []
        while time.time() < deadline and not self.url:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if m := re.search(r"embedded engine twin at (http://\S+)", line):
                self.twin_url = m.group(1)
            if m := re.search(r"listening on (http://\S+)", line):
                self.url = m.group(1)
        if not (self.url and self.twin_url):
            self.stop()
            raise RuntimeError("meridian did not start:\n" + "".join(lines))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="module")
def scraped():
    """Metric names exposed by the proxy and by its twin after real traffic."""
    p = Proxy()
    try:
        body = {
            "model": "Qwen/Qwen3-8B", "stream": True, "max_tokens": 12,
            "messages": [{"role": "user", "content": "hi"}],
            # A budget the stream reaches, so the budget counter has a sample too.
            "meridian": {"think_budget_tokens": 4},
        }
        r = requests.post(f"{p.url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200 and "[DONE]" in r.text
        return {
            "proxy": exposed(requests.get(f"{p.url}/metrics", timeout=10).text),
            "twin": exposed(requests.get(f"{p.twin_url}/metrics", timeout=10).text),
        }
    finally:
        p.stop()


def exposed(text: str) -> set[str]:
    """Names as users query them: histogram bases, counters with their _total."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    names = set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0)
        for suffix in ("_bucket", "_sum", "_count"):
            base = name.removesuffix(suffix)
            if name != base and types.get(base) == "histogram":
                name = base
        names.add(name)
    return names


def catalogued(section: str) -> set[str]:
    """Metric names in the tables of one `## ` section of metrics.md."""
    text = (DOCS / "metrics.md").read_text()
    part = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([A-Za-z_:][A-Za-z0-9_:]*)[`{]", part, re.M))


def registered() -> set[str]:
    """Every metric the proxy's catalogue defines (`Def::counter("name", …)` and kin)."""
    src = (ROOT / "proxy" / "src" / "telemetry" / "metrics" / "catalogue.rs").read_text()
    names = set(re.findall(r'Def::(?:counter|gauge|histogram)\(\s*"([a-z_]+)"', src))
    # An empty set would make the check below pass whatever the proxy exposes.
    assert len(names) >= 20, f"the catalogue parser found only {sorted(names)}"
    return names


def test_every_registered_proxy_metric_was_exposed(scraped):
    """So the catalogue check below sees all of them (each has a sample after traffic)."""
    for name in registered():
        assert any(n == name or n == f"{name}_total" for n in scraped["proxy"]), name


def test_metrics_catalogue_lists_exactly_what_the_proxy_exposes(scraped):
    assert scraped["proxy"] == catalogued("The proxy")


def test_metrics_catalogue_lists_exactly_what_the_twin_exposes(scraped):
    assert scraped["twin"] == catalogued("The engine twin")


# ---------- links ----------


def slug(heading: str) -> str:
    """mdBook's anchor for a heading."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[`*]", "", text)
    return "".join(c if c.isalnum() or c in "-_" else "-" if c == " " else "" for c in text)


def anchors(path: Path) -> set[str]:
    out, counts = set(), {}
    for heading in re.findall(r"^#{1,6} (.+?)\s*#*$", strip_code(path.read_text()), re.M):
        base = slug(heading)
        n = counts.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        counts[base] = n + 1
    return out


def strip_code(text: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def links(path: Path):
    for target in LINK.findall(strip_code(path.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        yield target


def check_link(source: Path, target: str, root: Path) -> str | None:
    file_part, _, anchor = target.partition("#")
    dest = (source.parent / file_part).resolve() if file_part else source
    if not dest.exists():
        return f"{source.relative_to(root)}: {target}: no such file"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{source.relative_to(root)}: {target}: no heading #{anchor} in {dest.name}"
    return None


def book_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_every_internal_link_in_the_book_resolves():
    problems = [p for page in book_pages() for t in links(page) if (p := check_link(page, t, ROOT))]
    assert not problems, "\n".join(problems)


def test_links_from_the_readmes_resolve():
    pages = [ROOT / "README.md", ROOT / "helm" / "README.md"]
    problems = [p for page in pages for t in links(page) if (p := check_link(page, t, ROOT))]
    assert not problems, "\n".join(problems)


def test_link_checker_catches_broken_links(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# Title\n\n## Some section\n\n[ok](#some-section) [bad](#nope) [gone](b.md)\n")
    found = [check_link(page, t, tmp_path) for t in links(page)]
    assert found[0] is None and "no heading" in found[1] and "no such file" in found[2]


def test_every_page_is_in_the_summary():
    """mdBook renders only pages listed in SUMMARY.md; an unlisted page is a dead link."""
    listed = {(DOCS / t).resolve() for t in LINK.findall((DOCS / "SUMMARY.md").read_text())}
    for page in book_pages():
        if page.name != "SUMMARY.md":
            assert page.resolve() in listed, f"{page.relative_to(DOCS)} is not in SUMMARY.md"


def test_every_decision_record_is_indexed():
    index = (DOCS / "adr" / "index.md").read_text()
    for adr in sorted((DOCS / "adr").glob("[0-9][0-9][0-9][0-9]-*.md")):
        assert f"({adr.name})" in index, adr.name


# ---------- bad input ----------


def test_every_row_of_the_bad_input_table_is_a_test_and_every_test_a_row():
    """docs/src/bad-input.md names, in its last column, the test behind each row; the
    table and proxy/tests/bad_input.rs must list the same tests."""
    rows = set()
    for line in (DOCS / "bad-input.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`[a-z0-9_]+`", cells[-1]):
            rows.add(cells[-1].strip("`"))
    source = (ROOT / "proxy" / "tests" / "bad_input.rs").read_text()
    tests = set(re.findall(r"#\[tokio::test\]\s*async fn ([a-z0-9_]+)", source))
    assert len(tests) >= 12, tests
    assert rows == tests, f"only in the table: {rows - tests}; only in the tests: {tests - rows}"
