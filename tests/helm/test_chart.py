"""The Helm chart (helm/meridian), checked without a cluster: rendered and linted by Helm's
own Go library, every object validated against Kubernetes' schemas in strict mode, every
rendered meridian.toml accepted by the real `meridian check`, the fields that matter
asserted, and each example's whole rendering compared with a golden file.

MERIDIAN_UPDATE_GOLDEN=1 rewrites the golden files (then review the diff)."""

import copy
import hashlib
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import pytest
from kubernetes_validate import utils as kv

from chart_rig import (
    BIN_DIR,
    CHART,
    GOLDEN,
    ROOT,
    container,
    env_map,
    example_names,
    example_values,
    lint,
    merged_values,
    render,
    validate_schema,
)


EXAMPLES = example_names()
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest
# kubernetes-validate knows.
KUBE_VERSIONS = ["1.30.0", kv.latest_version()]
CRD_SCHEMAS = Path(__file__).resolve().parent / "crd_schemas"
HOOK_FLAGS = [
    ("--scheduler-cls", "meridian_hook.scheduler.MeridianScheduler"),
    ("--logits-processors", "meridian_hook.logits:MeridianLogitsProcessor"),
]

PROXY = "meridian-proxy"


@pytest.fixture(scope="module", params=EXAMPLES)
def example(request):
    values = example_values(request.param)
    return request.param, values, render(values)


def with_models(values: dict) -> bool:
    return bool(merged_values(values)["vllm"]["models"])


def proxy_toml(r) -> dict:
    return tomllib.loads(r.get("ConfigMap", PROXY)["data"]["meridian.toml"])


def meridian_bin() -> Path:
    path = BIN_DIR / "meridian"
    if not path.exists():
        pytest.fail(f"{path} is missing: build it first (scripts/test.sh does)")
    return path


# ---------- Helm's own checks ----------


def test_lint_is_clean_in_strict_mode(example):
    name, values, _ = example
    report = lint(values)
    assert report["errors"] == [], report
    # Severity 2 is a warning, 3 an error; 1 (info, e.g. "icon is recommended") is fine.
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_values_pass_the_schema(example):
    _, values, _ = example
    validate_schema(values)


# ---------- Kubernetes' schemas ----------


def validate_object(obj: dict, version: str) -> None:
    api_group = obj["apiVersion"].split("/")[0]
    if api_group == "monitoring.coreos.com":
        schema = json.loads((CRD_SCHEMAS / f"{obj['kind'].lower()}-monitoring-v1.json").read_text())
        jsonschema.Draft202012Validator(schema).validate(obj)
    else:
        kv.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_object_validates_strictly(example, version):
    _, _, r = example
    assert r.objects
    for obj in r.objects:
        try:
            validate_object(obj, version)
        except kv.SchemaNotFoundError as e:  # pragma: no cover - a failure path
            pytest.fail(e.message)
        except (kv.ValidationError, jsonschema.ValidationError) as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} against {version}: {path}: {e.message}")


def test_strict_validation_catches_a_misplaced_field():
    """Control: the validator really is strict (an unknown field fails)."""
    r = render(example_values("single-node"))
    dep = copy.deepcopy(r.get("Deployment", PROXY))
    dep["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, KUBE_VERSIONS[0], strict=True)
    sm = copy.deepcopy(render({"demo": True, "serviceMonitor": {"enabled": True}}).get("ServiceMonitor", PROXY))
    sm["spec"]["endpoints"][0]["intervall"] = "5s"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(sm, KUBE_VERSIONS[0])


# ---------- the config reaches the proxy (and the hook) ----------


def test_every_rendered_config_passes_meridian_check(example, tmp_path):
    _, _, r = example
    # The dashboard's ConfigMap (grafana.dashboard) carries no config.
    configmaps = [cm for cm in r.of_kind("ConfigMap") if "meridian.json" not in cm["data"]]
    assert configmaps
    for cm in configmaps:
        path = tmp_path / f"{cm['metadata']['name']}.toml"
        path.write_text(cm["data"]["meridian.toml"])
        result = subprocess.run(
            [meridian_bin(), "check", "--config", path], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, f"{cm['metadata']['name']}:\n{path.read_text()}\n{result.stderr}"


def test_meridian_check_rejects_what_the_schema_cannot_see(tmp_path):
    """Control for the test above: a value only the proxy can judge (an unknown model
    family) makes `meridian check` fail on the rendered file."""
    r = render({"demo": True, "config": {"models": {"default_family": "no-such-family"}}})
    path = tmp_path / "meridian.toml"
    path.write_text(r.get("ConfigMap", PROXY)["data"]["meridian.toml"])
    result = subprocess.run([meridian_bin(), "check", "--config", path], capture_output=True, text=True)
    assert result.returncode != 0
    assert "models.default_family" in result.stderr + result.stdout


def _leaves(tree: dict, prefix=()):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _leaves(v, prefix + (k,))
        elif v is not None:
            yield prefix + (k,), v


def test_config_values_reach_the_configmap(example):
    _, values, r = example
    merged = merged_values(values)
    toml = proxy_toml(r)
    for path, want in _leaves(merged["config"]):
        got = toml
        for part in path:
            got = got[part]
        assert got == want, f"config.{'.'.join(path)}: {got!r} != {want!r}"
    assert toml["server"]["listen"] == f"0.0.0.0:{merged['proxy']['port']}"


def test_endpoints_are_the_engines_then_the_external_upstreams(example):
    _, values, r = example
    merged = merged_values(values)
    endpoints = proxy_toml(r).get("upstream", {}).get("endpoints", [])
    engines = [s for s in r.of_kind("Service") if s["metadata"]["labels"]["app.kubernetes.io/component"] == "vllm"]
    want = []
    for svc in engines:
        ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
        ep = {"url": f"http://{svc['metadata']['name']}:{ports['http']}"}
        if merged["vllm"]["hook"]["enabled"]:
            ep["hook"] = f"{svc['metadata']['name']}:{ports['hook']}"
        want.append(ep)
    want += [{k: v for k, v in e.items() if k not in ("name", "role")} for e in merged["externalUpstreams"]]
    # Roles: test_a_think_pool_hands_its_answers_to_an_answer_pool.
    assert [{k: v for k, v in e.items() if k not in ("name", "role")} for e in endpoints] == want
    if not want:
        assert "SIMULATED answers" in r.notes
        assert proxy_toml(r)["twin"]["enabled"] is True
    else:
        assert "enabled" not in proxy_toml(r).get("twin", {})


def test_external_upstreams_with_a_hook_get_the_token():
    r = render({"externalUpstreams": [{"url": "http://vllm-a:8000", "name": "a", "hook": "vllm-a:9470"},
                                      {"url": "https://vllm-b.example:443"}]})
    assert proxy_toml(r)["upstream"]["endpoints"] == [
        {"url": "http://vllm-a:8000", "name": "a", "hook": "vllm-a:9470"},
        {"url": "https://vllm-b.example:443"},
    ]
    env = env_map(container(r.get("Deployment", PROXY), "proxy"))
    assert env["MERIDIAN_HOOK_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "meridian-hook-token", "key": "token"}
    assert r.maybe("Secret", "meridian-hook-token") is not None
    assert r.maybe("ConfigMap", "meridian-hook") is None  # no engine of ours to configure


def test_several_models_share_one_proxy():
    """The proxy routes by model name: engines of different models in one release, their
    names learned from /v1/models; an external server may pin its list."""
    r = render({"vllm": {"models": [{"name": "a", "model": "Qwen/Qwen3-8B"}, {"name": "b", "model": "openai/gpt-oss-20b"}]},
                "externalUpstreams": [{"url": "http://x:8000", "models": ["extra", "extra-lora"]}]})
    eps = proxy_toml(r)["upstream"]["endpoints"]
    assert [e["name"] for e in eps[:2]] == ["a-0", "b-0"]
    assert [e.get("models") for e in eps] == [None, None, ["extra", "extra-lora"]]


def test_a_think_pool_hands_its_answers_to_an_answer_pool(tmp_path):
    """Two entries of one served model, one `think` and one `answer`, become endpoints with
    those roles (an external server may have its own), and the proxy accepts the file;
    a think pool with nowhere to hand answers to is refused by `meridian check`."""
    think = {"name": "qwen-think", "model": "Qwen/Qwen3-8B", "servedModelName": "qwen3", "role": "think", "replicas": 2}
    answer = {"name": "qwen-answer", "model": "Qwen/Qwen3-8B", "servedModelName": "qwen3", "role": "answer"}
    r = render({"vllm": {"models": [think, answer]},
                "externalUpstreams": [{"url": "http://x:8000", "role": "answer"}]})
    eps = proxy_toml(r)["upstream"]["endpoints"]
    assert [(e["name"] if "name" in e else e["url"], e.get("role")) for e in eps] == [
        ("qwen-think-0", "think"), ("qwen-think-1", "think"), ("qwen-answer-0", "answer"), ("http://x:8000", "answer")]
    for values, ok in (({"vllm": {"models": [think, answer]}}, True), ({"vllm": {"models": [think]}}, False)):
        path = tmp_path / "meridian.toml"
        path.write_text(render(values).get("ConfigMap", PROXY)["data"]["meridian.toml"])
        result = subprocess.run([meridian_bin(), "check", "--config", path], capture_output=True, text=True, timeout=60)
        assert (result.returncode == 0) == ok, result.stderr
        if not ok:
            assert "upstream.endpoints[0].role" in result.stderr + result.stdout


def test_config_checksum_follows_the_config(example):
    _, values, r = example
    dep = r.get("Deployment", PROXY)
    text = r.get("ConfigMap", PROXY)["data"]["meridian.toml"]
    checksum = dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    # The ConfigMap's block scalar adds the final newline the hashed text does not have.
    assert checksum == hashlib.sha256(text.rstrip("\n").encode()).hexdigest()
    changed = copy.deepcopy(values)
    changed.setdefault("config", {}).setdefault("upstream", {})["idle_timeout_s"] = 61
    dep2 = render(changed).get("Deployment", PROXY)
    assert dep2["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != checksum


def test_proxy_only_changes_do_not_restart_the_engines():
    values = example_values("single-node")
    before = render(values)
    changed = copy.deepcopy(values)
    changed["config"]["upstream"]["idle_timeout_s"] = 61
    after = render(changed)
    for dep in before.of_kind("Deployment"):
        name = dep["metadata"]["name"]
        if name == PROXY:
            continue
        assert dep["spec"]["template"] == after.get("Deployment", name)["spec"]["template"]
    changed["config"]["hook"]["timeout_s"] = 0.25
    hooked = render(changed)
    engine = next(d for d in hooked.of_kind("Deployment") if d["metadata"]["name"] != PROXY)
    old = before.get("Deployment", engine["metadata"]["name"])
    assert (engine["spec"]["template"]["metadata"]["annotations"]["checksum/hook-config"]
            != old["spec"]["template"]["metadata"]["annotations"]["checksum/hook-config"])


# ---------- vLLM with the hook ----------


def engines(r) -> list[dict]:
    return [d for d in r.of_kind("Deployment") if d["metadata"]["name"] != PROXY]


def test_hook_is_installed_and_switched_on_in_every_engine(example):
    _, values, r = example
    merged = merged_values(values)
    if not with_models(values):
        assert engines(r) == []
        return
    proxy_env = env_map(container(r.get("Deployment", PROXY), "proxy"))
    hook_cm = r.get("ConfigMap", "meridian-hook")
    hook_toml = tomllib.loads(hook_cm["data"]["meridian.toml"])
    assert set(hook_toml) <= {"hook", "exit"}
    assert hook_toml["hook"]["listen"] == f"0.0.0.0:{merged['vllm']['hook']['port']}"
    for key, want in (merged["config"].get("hook") or {}).items():
        assert hook_toml["hook"][key] == want
    for key, want in (merged["config"].get("exit") or {}).items():
        assert hook_toml["exit"][key] == want
    assert len(engines(r)) == sum(m.get("replicas", 1) for m in merged["vllm"]["models"])
    for dep in engines(r):
        c = container(dep, "vllm")
        args = c["args"]
        for flag, value in HOOK_FLAGS:
            assert args[args.index(flag) + 1] == value
        env = env_map(c)
        assert env["MERIDIAN_HOOK_CONFIG"]["value"] == "/etc/meridian-hook/meridian.toml"
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["hook-config"]["mountPath"] == "/etc/meridian-hook"
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        assert volumes["hook-config"]["configMap"]["name"] == "meridian-hook"
        # Both ends read the same secret from the same variable.
        assert env["MERIDIAN_HOOK_TOKEN"] == proxy_env["MERIDIAN_HOOK_TOKEN"]
        assert {"name": "hook", "containerPort": merged["vllm"]["hook"]["port"], "protocol": "TCP"} in c["ports"]


def test_vllm_serves_the_model_with_its_flags():
    values = example_values("multi-replica")
    model = values["vllm"]["models"][0]
    r = render(values)
    all_engines = {d["metadata"]["name"]: d for d in engines(r)}
    assert sorted(all_engines) == [
        "meridian-vllm-gpt-oss-20b-0", "meridian-vllm-gpt-oss-20b-1",
        "meridian-vllm-r1-qwen-32b-0", "meridian-vllm-r1-qwen-32b-1"]
    # The second model: its own engine, flags and GPU count.
    other = container(all_engines["meridian-vllm-gpt-oss-20b-0"], "vllm")
    other_pairs = dict(zip(other["args"][1::2], other["args"][2::2]))
    assert other["args"][0] == "openai/gpt-oss-20b"
    assert other_pairs["--served-model-name"] == "gpt-oss-20b"
    assert other_pairs["--reasoning-parser"] == "openai_gptoss"
    assert other["resources"]["limits"]["nvidia.com/gpu"] == 1
    deps = [d for name, d in sorted(all_engines.items()) if "r1-qwen-32b" in name]
    for dep in deps:
        c = container(dep, "vllm")
        assert c["command"] == ["vllm", "serve"]
        args = c["args"]
        assert args[0] == model["model"]
        pairs = dict(zip(args[1::2], args[2::2]))
        assert pairs["--served-model-name"] == model["servedModelName"]
        assert pairs["--reasoning-parser"] == "deepseek_r1"
        assert pairs["--tensor-parallel-size"] == "2"
        assert pairs["--max-model-len"] == "65536"
        assert pairs["--gpu-memory-utilization"] == "0.92"
        assert pairs["--host"] == "0.0.0.0" and pairs["--port"] == "8000"
        assert "--enable-prefix-caching" in args
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
        assert c["resources"]["requests"]["nvidia.com/gpu"] == 2
        assert c["resources"]["limits"]["memory"] == "160Gi"
        spec = dep["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
        assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == "model-cache"
        assert env_map(c)["HF_HOME"]["value"] == "/models"
        assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert dep["spec"]["strategy"] == {"type": "Recreate"}
        assert dep["spec"]["replicas"] == 1


def test_hook_switched_off_leaves_a_stock_vllm():
    values = copy.deepcopy(example_values("single-node"))
    values["vllm"]["hook"] = {"enabled": False}
    r = render(values)
    c = container(engines(r)[0], "vllm")
    assert not any(flag in c["args"] for flag, _ in HOOK_FLAGS)
    assert "MERIDIAN_HOOK_CONFIG" not in env_map(c)
    assert "MERIDIAN_HOOK_TOKEN" not in env_map(c)
    assert r.maybe("Secret", "meridian-hook-token") is None
    assert r.maybe("ConfigMap", "meridian-hook") is None
    assert all("hook" not in ep for ep in proxy_toml(r)["upstream"]["endpoints"])
    assert "MERIDIAN_HOOK_TOKEN" not in env_map(container(r.get("Deployment", PROXY), "proxy"))


def test_an_existing_token_secret_is_used_as_given():
    values = copy.deepcopy(example_values("single-node"))
    values["hookToken"] = {"existingSecret": "my-token", "existingSecretKey": "secret"}
    values["config"]["hook"]["token_env"] = "HOOK_SECRET"
    r = render(values)
    assert r.of_kind("Secret") == []
    ref = {"name": "my-token", "key": "secret"}
    assert env_map(container(r.get("Deployment", PROXY), "proxy"))["HOOK_SECRET"]["valueFrom"]["secretKeyRef"] == ref
    assert env_map(container(engines(r)[0], "vllm"))["HOOK_SECRET"]["valueFrom"]["secretKeyRef"] == ref


def test_the_generated_token_secret_survives_upgrades_and_uninstall():
    r = render(example_values("single-node"))
    secret = r.get("Secret", "meridian-hook-token")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(secret["data"]["token"]) == 64
    template = (CHART / "templates" / "secret.yaml").read_text()
    assert 'lookup "v1" "Secret"' in template


# ---------- probes and security ----------


def probe(c, kind):
    return c[kind]["httpGet"]["path"], c[kind]["httpGet"]["port"]


def test_probes(example):
    _, values, r = example
    merged = merged_values(values)
    c = container(r.get("Deployment", PROXY), "proxy")
    assert probe(c, "startupProbe") == ("/health", "http")
    assert probe(c, "livenessProbe") == ("/health", "http")
    assert probe(c, "readinessProbe") == (merged["proxy"]["readinessPath"], "http")
    assert {"name": "http", "containerPort": merged["proxy"]["port"], "protocol": "TCP"} in c["ports"]
    for dep in engines(r):
        v = container(dep, "vllm")
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert probe(v, kind) == ("/health", "http")
        startup = v["startupProbe"]
        # vLLM loads its model before /health answers: allow it at least 20 minutes.
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60
        assert v["livenessProbe"]["periodSeconds"] * v["livenessProbe"]["failureThreshold"] < 5 * 60


def test_proxy_runs_non_root_read_only_without_capabilities(example):
    _, _, r = example
    dep = r.get("Deployment", PROXY)
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    sc = container(dep, "proxy")["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_graceful_shutdown_fits_the_termination_grace(example):
    _, values, r = example
    merged = merged_values(values)
    pod = r.get("Deployment", PROXY)["spec"]["template"]["spec"]
    grace = merged["config"]["server"]["shutdown_grace_s"] + merged["proxy"]["preStopSleepSeconds"]
    assert pod["terminationGracePeriodSeconds"] > grace
    if merged["proxy"]["preStopSleepSeconds"]:
        lifecycle = container(r.get("Deployment", PROXY), "proxy")["lifecycle"]
        assert lifecycle["preStop"]["sleep"]["seconds"] == merged["proxy"]["preStopSleepSeconds"]


# ---------- wiring between objects ----------


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_services_select_exactly_their_pods_and_ports(example):
    _, _, r = example
    pods = {d["metadata"]["name"]: d["spec"]["template"] for d in r.of_kind("Deployment")}
    for svc in r.of_kind("Service"):
        chosen = [n for n, t in pods.items() if selects(svc["spec"]["selector"], t["metadata"]["labels"])]
        assert chosen == [svc["metadata"]["name"]], f"Service {svc['metadata']['name']} selects {chosen}"
        ports = {p["name"] for c in pods[chosen[0]]["spec"]["containers"] for p in c["ports"]}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports
    for dep in r.of_kind("Deployment"):
        assert selects(dep["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"])


def test_autoscaling_disruption_budget_and_monitoring():
    values = example_values("multi-replica")
    r = render(values)
    dep = r.get("Deployment", PROXY)
    assert "replicas" not in dep["spec"]  # the HPA owns it
    hpa = r.get("HorizontalPodAutoscaler", PROXY)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": PROXY}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 60
    # Streams per pod as well: the Pods metric a custom-metrics adapter serves.
    assert hpa["spec"]["metrics"][1] == {
        "type": "Pods",
        "pods": {"metric": {"name": "meridian_open_streams"}, "target": {"type": "AverageValue", "averageValue": "400"}},
    }
    # Off by default: CPU alone.
    demo = example_values("twin-demo")
    demo.setdefault("proxy", {})["autoscaling"] = {"enabled": True}
    plain = render(demo)
    assert [m["type"] for m in plain.get("HorizontalPodAutoscaler", PROXY)["spec"]["metrics"]] == ["Resource"]
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600
    pdb = r.get("PodDisruptionBudget", PROXY)
    assert pdb["spec"]["minAvailable"] == 2
    assert selects(pdb["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"])
    services = r.of_kind("Service")
    for sm in r.of_kind("ServiceMonitor"):
        assert sm["metadata"]["labels"]["release"] == "prometheus"
        matched = [s for s in services if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        assert matched, sm["metadata"]["name"]
        for s in matched:
            names = {p["name"] for p in s["spec"]["ports"]}
            assert {e["port"] for e in sm["spec"]["endpoints"]} <= names
    vllm_sm = r.get("ServiceMonitor", "meridian-vllm")
    assert {e["port"] for e in vllm_sm["spec"]["endpoints"]} == {"http", "hook"}
    assert r.get("ServiceMonitor", PROXY)["spec"]["endpoints"][0]["path"] == "/metrics"


def test_every_alert_has_a_runbook_section():
    r = render(example_values("multi-replica"))
    rules = r.get("PrometheusRule", "meridian")["spec"]["groups"][0]["rules"]
    runbook = (ROOT / "docs" / "src" / "operations.md").read_text()
    headings = set(re.findall(r"^#{2,4} (\w+)\s*$", runbook, re.M))
    assert len(rules) >= 6
    for rule in rules:
        assert rule["alert"] in headings, f"{rule['alert']}: no section in docs/src/operations.md"
        anchor = rule["alert"].lower()
        assert rule["annotations"]["runbook"] == f"docs/src/operations.md#{anchor}"
        assert rule["annotations"]["runbook_url"] == f"https://docs.example.com/meridian/operations.html#{anchor}"
        # PromQL braces balance (no promtool here).
        assert rule["expr"].count("{") == rule["expr"].count("}")
        assert rule["expr"].count("(") == rule["expr"].count(")")


# ---------- golden files ----------


def test_matches_the_golden_rendering(example):
    name, _, r = example
    path = GOLDEN / f"{name}.yaml"
    text = r.golden_text()
    if os.environ.get("MERIDIAN_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with MERIDIAN_UPDATE_GOLDEN=1"
    assert text == path.read_text(), (
        f"rendering of {name} differs from {path.relative_to(ROOT)}; if the change is intended, "
        "rerun with MERIDIAN_UPDATE_GOLDEN=1 and review the diff"
    )


def test_toml_rendering_quotes_keys_and_escapes_strings(tmp_path):
    """Keys that are not bare TOML keys are quoted; strings survive quotes, backslashes,
    newlines and non-ASCII; numbers keep their value."""
    aliases = {"my-org/r1 finetune": "deepseek-r1", 'odd"name\\x': "qwen3", "Qwen/Qwen3-8B": "qwen3"}
    values = {"demo": True, "config": {
        "models": {"aliases": aliases},
        "telemetry": {"log_level": "meridian_proxy=debug,info"},
        "twin": {"served_model": 'a "quoted" name\\with\nnewline é<&>', "speed": 2.5, "seed": 12345678901},
        "exit": {"eat_delta": 1e-07},
    }}
    r = render(values)
    text = r.get("ConfigMap", PROXY)["data"]["meridian.toml"]
    toml = tomllib.loads(text)
    assert toml["models"]["aliases"] == aliases
    assert toml["twin"]["served_model"] == values["config"]["twin"]["served_model"]
    assert toml["twin"]["speed"] == 2.5 and toml["twin"]["seed"] == 12345678901
    assert toml["exit"]["eat_delta"] == 1e-07
    path = tmp_path / "meridian.toml"
    path.write_text(text)
    result = subprocess.run([meridian_bin(), "check", "--config", path], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_demo_mode_runs_the_build_with_the_engine_twin():
    # The release image leaves the twin out (docker/proxy.Dockerfile): simulated answers
    # need the `-twin` build, unless the values name a tag of their own.
    image = lambda r: container(r.get("Deployment", PROXY), "proxy")["image"]
    external = {"externalUpstreams": [{"url": "http://vllm-0:8000"}]}
    assert image(render(external)) == "meridian-proxy:0.1.0"
    assert image(render({"demo": True})) == "meridian-proxy:0.1.0-twin"
    own = {"demo": True, "proxy": {"image": {"tag": "edge-twin"}}}
    assert image(render(own)) == "meridian-proxy:edge-twin"


def test_replicas_told_their_number_pass_it_to_the_proxy_and_meridian_check_accepts_it(tmp_path):
    """`config.admission.replicas` equal to `proxy.replicas` renders into the proxy's
    config, where `meridian check` accepts it (the chart refuses a count that differs or
    that an autoscaler would change: test_values.py)."""
    values = {"demo": True, "proxy": {"replicas": 2},
              "config": {"admission": {"enabled": True, "max_streams": 8, "replicas": 2}}}
    r = render(values)
    assert r.get("Deployment", PROXY)["spec"]["replicas"] == 2
    assert proxy_toml(r)["admission"]["replicas"] == 2
    path = tmp_path / "meridian.toml"
    path.write_text(r.get("ConfigMap", PROXY)["data"]["meridian.toml"])
    result = subprocess.run([meridian_bin(), "check", "--config", path], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr + result.stdout


def test_autoscaled_replicas_take_places_from_the_engines_hooks_and_meridian_check_accepts_it(tmp_path):
    """The multi-replica example runs an autoscaler, which a fixed split cannot follow:
    its replicas ask each engine's hook for every request's place instead
    (`admission.places = "engine"`), every endpoint naming its engine's hook, and the
    proxy's own check accepts the rendered config."""
    r = render(example_values("multi-replica"))
    config = proxy_toml(r)
    assert config["admission"]["places"] == "engine"
    assert config["admission"].get("replicas", 1) == 1
    endpoints = config["upstream"]["endpoints"]
    assert len(endpoints) == 4 and all(e.get("hook") for e in endpoints)
    path = tmp_path / "meridian.toml"
    path.write_text(r.get("ConfigMap", PROXY)["data"]["meridian.toml"])
    result = subprocess.run([meridian_bin(), "check", "--config", path], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr + result.stdout
