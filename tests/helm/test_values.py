"""What values the chart accepts: its schema (every key checked, `config` mirroring
meridian.toml) and the combinations its templates refuse with a message (upstreams
required unless simulated answers are asked for). Through Helm's own Go library."""

import json

import helm_python as helm
import pytest
import yaml

from chart_rig import CHART, lint, render, validate_schema

from config_fields import config_fields


@pytest.mark.parametrize(
    "values,where",
    [
        ({"proxy": {"replica": 2}}, "/proxy"),
        ({"proxi": {}}, "proxi"),
        ({"config": {"server": {"listen": "0.0.0.0:9000"}}}, "/config/server"),
        ({"config": {"upstream": {"endpoints": []}}}, "/config/upstream"),
        ({"config": {"upstream": {"max_attempts": 0}}}, "/config/upstream/max_attempts"),
        ({"config": {"upstream": {"max_attemps": 3}}}, "/config/upstream"),
        ({"config": {"exit": {"signal": "sometimes"}}}, "/config/exit/signal"),
        ({"config": {"hook": {"listen": "0.0.0.0:1"}}}, "/config/hook"),
        ({"proxy": {"runAsUser": 0}}, "/proxy/runAsUser"),
        ({"vllm": {"models": [{"name": "Bad_Name", "model": "x"}]}}, "/vllm/models/0/name"),
        ({"vllm": {"models": [{"name": "a"}]}}, "/vllm/models/0"),
        ({"externalUpstreams": [{"url": "vllm:8000"}]}, "/externalUpstreams/0/url"),
    ],
)
def test_schema_rejects_unknown_keys_and_bad_values(values, where):
    with pytest.raises(helm.HelmValuesError) as err:
        validate_schema(values)
    assert where in str(err.value), err.value


NO_ENGINE = ("no engine to serve: set vllm.models (vLLM engines the chart runs, with the hook), externalUpstreams "
             "(OpenAI-compatible servers you run), or demo: true")


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"vllm": {"models": []}, "externalUpstreams": []},
        {"demo": False},
    ],
)
def test_no_upstream_is_refused_with_what_to_set_unless_simulated_answers_are_asked_for(values):
    """The chart's defaults name no upstream: `helm install` and `helm template` refuse
    them rather than install a proxy that serves made-up answers (or one that exits at
    start), and say what to set. `helm lint` does not run a template's `fail` (Helm's lint
    mode only logs it), so the defaults lint clean, as a chart repository's linter wants."""
    validate_schema(values)
    with pytest.raises(helm.HelmError) as err:
        render(values)
    assert NO_ENGINE in str(err.value), err.value
    assert lint(values)["errors"] == []
    render({**values, "demo": True})


@pytest.mark.parametrize("path", sorted((CHART / "ci").glob("*-values.yaml")), ids=lambda p: p.stem)
def test_the_values_chart_repository_ci_passes_lint_clean(path):
    # chart-testing lints and installs the chart once per ci/*-values.yaml.
    report = lint(yaml.safe_load(path.read_text()))
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize(
    "values",
    [
        {"externalUpstreams": [{"url": "http://vllm:8000"}]},
        {"vllm": {"models": [{"name": "a", "model": "m"}]}},
    ],
)
def test_simulated_answers_are_refused_beside_upstreams(values):
    validate_schema(values)
    with pytest.raises(helm.HelmValuesError) as err:
        validate_schema({**values, "demo": True})
    where = "/externalUpstreams" if "externalUpstreams" in values else "/vllm/models"
    assert f"at '{where}': maxItems" in str(err.value), err.value


def test_schema_config_section_mirrors_meridian_toml():
    """values.schema.json's `config` has exactly meridian.toml's fields, less the ones
    the chart sets itself, so a new config field cannot be forgotten here."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    owned = {"server.listen", "hook.listen", "twin.enabled"} | {f for f in config_fields() if f.startswith("upstream.endpoints[]")}

    def leaves(node, prefix):
        props = node.get("properties")
        if node.get("type") == "object" and props:
            for k, v in props.items():
                yield from leaves(v, f"{prefix}{k}.")
        elif node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
            yield prefix + "*"
        elif node.get("type") == "array" and node.get("items", {}).get("properties"):
            yield from leaves(node["items"], prefix.rstrip(".") + "[].")
        else:
            yield prefix.rstrip(".")

    in_schema = set(leaves(schema["properties"]["config"], ""))
    assert in_schema == set(config_fields()) - owned


@pytest.mark.parametrize(
    "values,message",
    [
        ({"vllm": {"models": [{"name": "a", "model": "m"}, {"name": "a", "model": "m"}]}}, "used twice"),
        ({"demo": True, "proxy": {"terminationGracePeriodSeconds": 30}}, "terminationGracePeriodSeconds"),
        ({"demo": True, "proxy": {"podDisruptionBudget": {"enabled": True, "minAvailable": 1, "maxUnavailable": 1}}},
         "not both"),
        ({"demo": True, "proxy": {"replicas": 3}, "config": {"admission": {"replicas": 2}}},
         "config.admission.replicas (2) must equal proxy.replicas (3)"),
        ({"demo": True, "proxy": {"replicas": 2, "autoscaling": {"enabled": True}},
          "config": {"admission": {"replicas": 2}}},
         "which proxy.autoscaling changes"),
    ],
)
def test_refuses_configurations_that_would_misbehave(values, message):
    with pytest.raises(helm.HelmError) as err:
        render(values)
    assert message in str(err.value)
