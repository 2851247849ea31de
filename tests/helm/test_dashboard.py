"""The Grafana dashboard the chart ships (helm/meridian/dashboards/meridian.json): rendered
into a ConfigMap the Grafana sidecar picks up, and every metric its PromQL names is one
the real binaries expose: the proxy's and its twin's `/metrics` scraped after a streamed
request through `meridian serve --twin`; the hook's (served only inside vLLM) from the
catalogue in docs/src/metrics.md, itself checked here against the names the hook's
exposition code writes (vllm-hook/src/metrics.rs)."""

import copy
import json
import os
import re
import subprocess
import time

import pytest
import requests

from chart_rig import BIN_DIR, CHART, ROOT, example_values, render, validate_schema

DASHBOARD = CHART / "dashboards" / "meridian.json"
CONFIGMAP = "meridian-dashboard"


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return [p for p in out if p["type"] != "row"]


# ---------- the ConfigMap ----------


def test_the_dashboard_is_off_by_default():
    r = render(example_values("single-node"))
    assert r.maybe("ConfigMap", CONFIGMAP) is None


def test_the_configmap_carries_the_sidecar_label_and_the_dashboard_as_is():
    r = render(example_values("multi-replica"))
    cm = r.get("ConfigMap", CONFIGMAP)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["app.kubernetes.io/instance"] == "meridian"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Meridian"}
    assert list(cm["data"]) == ["meridian.json"]
    # Valid JSON, byte for byte the chart's file: Helm did not template the legends' {{…}}.
    assert json.loads(cm["data"]["meridian.json"]) == dashboard()
    assert "{{phase}}" in cm["data"]["meridian.json"]


def test_the_sidecar_label_is_configurable_and_checked():
    values = copy.deepcopy(example_values("multi-replica"))
    values["grafana"]["dashboard"].update(label="example.com/dashboard", labelValue="meridian")
    labels = render(values).get("ConfigMap", CONFIGMAP)["metadata"]["labels"]
    assert labels["example.com/dashboard"] == "meridian" and "grafana_dashboard" not in labels
    for bad in ({"label": "has space"}, {"labelValue": "-x"}, {"enabeld": True}):
        values = copy.deepcopy(example_values("multi-replica"))
        values["grafana"]["dashboard"].update(bad)
        with pytest.raises(Exception):
            validate_schema(values)


# ---------- the dashboard itself ----------


def test_every_panel_queries_through_the_datasource_variable():
    d = dashboard()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"family", "namespace"} <= set(variables)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels(d):
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            assert t["expr"].count("{") == t["expr"].count("}"), t["expr"]


def test_the_issue_s_histograms_and_counters_each_have_a_panel():
    queried = {n for p in panels(dashboard()) for t in p["targets"] for n in metric_names(t["expr"])}
    for name in [
        "meridian_time_to_first_token_seconds_bucket",
        "meridian_time_to_first_output_token_seconds_bucket",
        "meridian_think_to_output_gap_seconds_bucket",
        "meridian_output_inter_token_latency_seconds_bucket",
        "meridian_open_streams",
        "meridian_admission_queued",
        "meridian_continuations_total",
        "meridian_hook_forced_exits_total",
    ]:
        assert name in queried, name


# ---------- PromQL names against what the binaries expose ----------

# PromQL words that are not metric names (function and aggregation names are recognised
# by the parenthesis that follows them).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
            "unless", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana's `$var`s removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # range and subquery selectors
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\$\{[^}]*\}|\$\w+", "", e)
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", e):
        if e[m.end():].lstrip().startswith("(") or m.group(0).lower() in KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def queries(d: dict) -> list[str]:
    """Every PromQL expression: panel targets, and the metric of each label_values()."""
    out = [t["expr"] for p in panels(d) for t in p["targets"]]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)
            assert m, f"variable {v['name']}: only label_values(metric, label) is understood: {q}"
            out.append(m.group(1))
    return out


def test_metric_name_extraction():
    expr = ('histogram_quantile(0.99, sum by (le, family) (rate(my_metric_bucket{family=~"$family",x="a{b}"}'
            '[$__rate_interval]))) / ignoring(x) group_left other:metric offset 5m + 1e3 * on (a) third_total')
    assert metric_names(expr) == {"my_metric_bucket", "other:metric", "third_total"}
    assert metric_names('sum(meridian_open_streams{phase="output"})') == {"meridian_open_streams"}


def sample_names(text: str) -> set[str]:
    return {re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0)
            for line in text.splitlines() if line and not line.startswith("#")}


def hook_catalogue() -> set[str]:
    """Sample names of the hook's metrics, from the "vLLM and the hook" table."""
    text = (ROOT / "docs" / "src" / "metrics.md").read_text()
    part = text.split("## vLLM and the hook", 1)[1].split("\n## ", 1)[0]
    names = set()
    for name, kind in re.findall(r"^\| `([A-Za-z_:][A-Za-z0-9_:]*)[`{][^|]*\| (\w+) \|", part, re.M):
        names |= {name} if kind != "histogram" else {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    assert "meridian_hook_forced_exits_total" in names, names
    return names


def test_the_hook_catalogue_matches_the_hook_source():
    src = (ROOT / "vllm-hook" / "src" / "metrics.rs").read_text()
    written = set(re.findall(r'"(meridian_hook_[a-z_]+)', src))
    assert len(written) >= 10, written
    assert hook_catalogue() == written


@pytest.fixture(scope="module")
def exposed() -> set[str]:
    binary = BIN_DIR / "meridian"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: build it first (scripts/test.sh does)")
    proc = subprocess.Popen(
        [
            binary, "serve", "--twin", "--listen", "127.0.0.1:0", "--set", "twin.speed=50",
            # One tenant every request falls to, so the tenant panels' series exist.
            "--set", "tenants.enabled=true", "--set", "tenants.default_tenant=everyone",
            "--set", 'tenants.tenant=[{name = "everyone"}]',
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "MERIDIAN_LOG_LEVEL": "warn"},
    )
    try:
        url = twin = None
        lines, deadline = [], time.time() + 30
        while time.time() < deadline and not url:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if m := re.search(r"embedded engine twin at (http://\S+)", line):
                twin = m.group(1)
            if m := re.search(r"listening on (http://\S+)", line):
                url = m.group(1)
        assert url and twin, "meridian did not start:\n" + "".join(lines)
        body = {
            "model": "Qwen/Qwen3-8B", "stream": True, "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
            # Reached, so the budget counter has its sample; thinking then output, so the
            # output ITL has gaps.
            "meridian": {"think_budget_tokens": 4},
        }
        r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200 and "[DONE]" in r.text
        proxy_text = requests.get(f"{url}/metrics", timeout=10).text
        twin_text = requests.get(f"{twin}/metrics", timeout=10).text
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return sample_names(proxy_text) | sample_names(twin_text) | hook_catalogue()


def unknown_names(d: dict, known: set[str]) -> dict[str, set[str]]:
    return {q: bad for q in queries(d) if (bad := metric_names(q) - known)}


def test_every_metric_the_dashboard_queries_is_exposed(exposed):
    d = dashboard()
    names = {n for q in queries(d) for n in metric_names(q)}
    assert len(names) >= 15, names
    assert not unknown_names(d, exposed), unknown_names(d, exposed)


def test_a_misspelt_metric_would_be_caught(exposed):
    d = dashboard()
    p = next(p for p in panels(d) if "meridian_open_streams" in p["targets"][0]["expr"])
    p["targets"][0]["expr"] = p["targets"][0]["expr"].replace("meridian_open_streams", "meridian_open_stream")
    assert list(unknown_names(d, exposed).values()) == [{"meridian_open_stream"}]
