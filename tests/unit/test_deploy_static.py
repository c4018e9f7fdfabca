"""The compose deployment, checked statically (CI has no Docker engine: nothing here is started).

compose.yaml, the Dockerfile, .dockerignore and the configs under deploy/ are read as files and
checked against each other and against the code: services, healthchecks and their dependencies,
build contexts, mounts and volumes, secrets only by substitution, AML_* variables that are real
settings fields, commands that run modules that exist, the Grafana provisioning, login and
dashboard (its PromQL names only metrics aml_runtime.metrics exports), Prometheus' scrape
targets, the collector pipelines and the Tempo config; the coding worker's image target, its
compose services (datasets read-only, bwrap's security options) and the seccomp profile. Every
failure names the service or file at fault.
"""

from __future__ import annotations

import importlib
import json
import re
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from aml_devtools.configdoc import SERVICES
from aml_runtime import metrics

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DEPLOY = ROOT / "deploy"
COLLECTOR = DEPLOY / "otel-collector.yaml"
TEMPO = DEPLOY / "tempo.yaml"
PROMETHEUS = DEPLOY / "prometheus.yaml"
GRAFANA_DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources"
GRAFANA_PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards"
GRAFANA_DASHBOARDS = DEPLOY / "grafana" / "dashboards"

# compose service -> its settings class (module, class name): the services the configuration
# reference documents.
AML_SETTINGS = SERVICES
INFRA = {"nats", "mongo", "otel-collector", "tempo", "prometheus", "grafana"}
# The services that serve /metrics (the gateway answers only /health and /ready).
WORKERS = set(AML_SETTINGS) - {"gateway"}
# Who must wait for whom to be healthy.
REQUIRED_DEPENDENCIES = {
    **{name: {"nats", "mongo"} for name in AML_SETTINGS},
    "grafana": {"tempo", "prometheus"},
    "otel-collector": {"tempo"},
}
# Variables that hold a secret: only a required substitution, `${VAR:?message}`, is allowed.
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|API_KEY|PRIVATE")
REQUIRED_SUBSTITUTION = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*:?\?[^}]*\}$")
SUBSTITUTION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")
OTEL_VARIABLES = {
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_SEMCONV_STABILITY_OPT_IN",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
}
# Dashboard panels that must exist: title -> fragments its TraceQL query must contain.
REQUIRED_PANELS = {
    "Job throughput per stage": ["rate()", "by (span.aml.stage)"],
    "Participant call latency p50 / p95": [
        "span.aml.participant_call = true",
        "quantile_over_time(duration",
    ],
    "Participant call errors": [
        "span.aml.participant_call = true",
        "span.http.response.status_code",
        "span.error.type",
        "rate()",
    ],
}
# Dashboard panels on the Prometheus metrics: title -> fragments its PromQL queries must contain.
REQUIRED_METRIC_PANELS = {
    "Jobs by state": ["aml_jobs", "by (state)"],
    "Items per stage and outcome": ["rate(aml_items_total[", "by (stage, outcome)"],
    "Participant call latency p50 / p95 by version": [
        "histogram_quantile(0.5,",
        "histogram_quantile(0.95,",
        "aml_participant_call_seconds_bucket",
        "version_id",
    ],
    "Participant calls by version and status": [
        "aml_participant_call_seconds_count",
        "by (version_id, status)",
    ],
    "LLM call latency p50 / p95": ["aml_llm_call_seconds_bucket", "histogram_quantile(0.95,"],
    "LLM calls by outcome and errors by class": ["aml_llm_errors_total", "by (model, error)"],
    "Pending work per stage": ["aml_pending_work", "by (stage)"],
}
# Series Prometheus itself makes for every target, and the labels it gives every series.
PROMETHEUS_SERIES = {"up": set[str]()}
PROMETHEUS_TARGET_LABELS = {"job", "instance"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                "or", "unless", "offset"}  # fmt: skip


def _problems(found: list[str]) -> str:
    return "\n".join(["", *found])


@cache
def _yaml(path: Path) -> Any:
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        pytest.fail(f"{path.relative_to(ROOT)} is not valid YAML: {exc}")


def _compose() -> dict[str, Any]:
    data = _yaml(COMPOSE)
    assert isinstance(data, dict), "compose.yaml: the top level must be a mapping"
    assert isinstance(data.get("services"), dict), "compose.yaml: no `services` mapping"
    return data


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return services


def _environment(service: dict[str, Any]) -> dict[str, str]:
    """`environment` as a mapping, whether written as a mapping or as a `KEY=value` list."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(key): "" if value is None else str(value) for key, value in env.items()}


def _resolve(value: str) -> str:
    """A value as compose would see it with no variable set: `${X:-d}` -> d, `${X:?m}` -> a
    placeholder (compose would refuse to start; the value is the operator's)."""

    def one(match: re.Match[str]) -> str:
        operator, argument = match.group(2), match.group(3)
        if operator in (":-", "-"):
            return argument
        return f"operator-{match.group(1).lower()}-value-of-enough-length"

    return SUBSTITUTION.sub(one, value)


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    return command.split() if isinstance(command, str) else list(command or [])


def _healthcheck_test(service: dict[str, Any]) -> list[str]:
    test = (service.get("healthcheck") or {}).get("test")
    return [test] if isinstance(test, str) else list(test or [])


def _url_in(words: list[str]) -> str | None:
    return next((word for word in words if word.startswith(("http://", "https://"))), None)


def _volumes(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(type, source, target) of each mount, from the short or the long syntax."""
    mounts = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            mounts.append(
                (volume.get("type", "volume"), volume.get("source", ""), volume["target"])
            )
            continue
        source, _, rest = volume.partition(":")
        target = rest.split(":")[0] if rest else source
        kind = "bind" if source.startswith((".", "/", "~", "$")) else "volume"
        mounts.append((kind, source if rest else "", target))
    return mounts


def _bind_target(service: str, host_path: str) -> str:
    """Where `host_path` (relative to the repository) is mounted in `service`."""
    for kind, source, target in _volumes(_services()[service]):
        if kind == "bind" and (ROOT / source).resolve() == (ROOT / host_path).resolve():
            return target
    pytest.fail(f"compose.yaml: service `{service}` does not mount ./{host_path}")


# -- compose.yaml -------------------------------------------------------------------------------


def test_compose_has_every_service() -> None:
    missing = sorted((INFRA | set(AML_SETTINGS)) - set(_services()))
    assert not missing, f"compose.yaml: services missing: {missing}"


def test_every_service_has_an_image_or_a_build_and_a_healthcheck() -> None:
    found = []
    for name, service in _services().items():
        if not service.get("image") and not service.get("build"):
            found.append(f"compose.yaml: service `{name}` has neither `image` nor `build`")
        test = _healthcheck_test(service)
        if not test or test[0] not in ("CMD", "CMD-SHELL") or len(test) < 2:
            found.append(f"compose.yaml: service `{name}` has no healthcheck test (CMD ...)")
        if (service.get("healthcheck") or {}).get("disable"):
            found.append(f"compose.yaml: service `{name}` disables its healthcheck")
    assert not found, _problems(found)


def test_dependencies_exist_wait_for_healthy_and_have_no_cycle() -> None:
    services = _services()
    found = []
    graph: dict[str, set[str]] = {}
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        if isinstance(depends, list):
            found.append(f"compose.yaml: `{name}`.depends_on is a list: use `condition:`")
            depends = {dependency: {} for dependency in depends}
        graph[name] = set(depends)
        for dependency, options in depends.items():
            if dependency not in services:
                found.append(f"compose.yaml: `{name}` depends on unknown service `{dependency}`")
            condition = (options or {}).get("condition")
            if condition != "service_healthy":
                found.append(
                    f"compose.yaml: `{name}` -> `{dependency}` has condition {condition!r}, "
                    "not service_healthy"
                )
        for needed in sorted(REQUIRED_DEPENDENCIES.get(name, set()) - set(depends)):
            found.append(f"compose.yaml: `{name}` must depend on `{needed}` (service_healthy)")

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            found.append(f"compose.yaml: dependency cycle {' -> '.join((*path, name))}")
            return
        for dependency in sorted(graph.get(name, set())):
            visit(dependency, (*path, name))

    for name in sorted(graph):
        visit(name, ())
    assert not found, _problems(sorted(set(found)))


def test_build_contexts_and_dockerfiles_exist() -> None:
    found = []
    for name, service in _services().items():
        build = service.get("build")
        if build is None:
            continue
        build = {"context": build} if isinstance(build, str) else build
        context = ROOT / build.get("context", ".")
        if not context.is_dir():
            found.append(f"compose.yaml: `{name}` build context {context} does not exist")
            continue
        inline = build.get("dockerfile_inline")
        if inline is not None:
            if not re.search(r"^FROM\s+\S+", inline, re.MULTILINE):
                found.append(f"compose.yaml: `{name}` dockerfile_inline has no FROM")
            continue
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        if not dockerfile.is_file():
            found.append(f"compose.yaml: `{name}` Dockerfile {dockerfile} does not exist")
    assert not found, _problems(found)


def test_bind_mounts_exist_and_named_volumes_are_declared() -> None:
    declared = set(_compose().get("volumes") or {})
    found = []
    for name, service in _services().items():
        for kind, source, target in _volumes(service):
            if kind == "bind":
                if not source.startswith("./") or "$" in source:
                    found.append(
                        f"compose.yaml: `{name}` bind-mounts {source!r}: use a path inside the "
                        "repository, relative (./...)"
                    )
                elif not (ROOT / source).exists():
                    found.append(f"compose.yaml: `{name}` bind-mounts {source}, which is missing")
            elif kind == "volume" and source and source not in declared:
                found.append(
                    f"compose.yaml: `{name}` mounts volume `{source}` at {target}, not declared "
                    "under the top-level `volumes`"
                )
    assert not found, _problems(found)


def test_no_literal_secret() -> None:
    found = []
    for name, service in _services().items():
        for key, value in _environment(service).items():
            if SECRET_NAME.search(key) and not REQUIRED_SUBSTITUTION.match(value):
                found.append(
                    f"compose.yaml: `{name}` sets {key} to {value!r}: a secret must come from "
                    f"a required substitution such as ${{{key}:?set it}}"
                )
    for key in ("AML_SECRET_KEYS", "AML_ADMIN_TOKEN"):
        if not _environment(_services()["gateway"]).get(key):
            found.append(f"compose.yaml: the gateway needs {key}")
    for name in ("answerer", "scorer"):
        if not _environment(_services()[name]).get("AML_LLM_API_KEY"):
            found.append(f"compose.yaml: `{name}` needs AML_LLM_API_KEY")
    assert not found, _problems(found)


@pytest.mark.parametrize("name", sorted(AML_SETTINGS))
def test_aml_variables_are_settings_fields_of_the_service(name: str) -> None:
    module, class_name = AML_SETTINGS[name]
    settings_class = getattr(importlib.import_module(module), class_name)
    prefix = settings_class.model_config.get("env_prefix", "")
    assert prefix.upper() == "AML_", f"{module}.{class_name}: env_prefix is {prefix!r}"
    fields = {field.lower() for field in settings_class.model_fields}
    env = _environment(_services()[name])
    found = []
    values = {}
    for key, value in env.items():
        if key.upper().startswith("AML_"):
            field = key[len("AML_") :].lower()  # pydantic-settings is case-insensitive
            if field not in fields:
                found.append(
                    f"compose.yaml: `{name}` sets {key}, but {module}.{class_name} has no "
                    f"field `{field}`"
                )
            else:
                values[field] = _resolve(value)
        elif key not in OTEL_VARIABLES:
            found.append(f"compose.yaml: `{name}` sets {key}: neither AML_* nor a known OTEL_*")
    for key in ("AML_NATS_URL", "AML_MONGO_URL", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if key not in env:
            found.append(f"compose.yaml: `{name}` does not set {key}")
    if env.get("OTEL_SERVICE_NAME") != name:
        found.append(f"compose.yaml: `{name}` must set OTEL_SERVICE_NAME={name}")
    assert not found, _problems(found)
    # The values themselves are valid for the settings class (types, enums, bounds).
    try:
        settings_class(**values)
    except ValueError as exc:
        pytest.fail(f"compose.yaml: `{name}` environment is rejected by {class_name}: {exc}")


def test_service_urls_point_at_compose_services() -> None:
    services = _services()
    collector_http = _collector()["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    found = []
    for name in AML_SETTINGS:
        env = _environment(services[name])
        for key in ("AML_NATS_URL", "AML_MONGO_URL", "OTEL_EXPORTER_OTLP_ENDPOINT"):
            host = urlsplit(env.get(key, "")).hostname
            if host not in services:
                found.append(f"compose.yaml: `{name}` {key} names host {host!r}, not a service")
        if "replicaSet=" not in env.get("AML_MONGO_URL", ""):
            found.append(f"compose.yaml: `{name}` AML_MONGO_URL must name the replica set")
        endpoint = urlsplit(env.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""))
        if endpoint.hostname != "otel-collector" or endpoint.port != _port(collector_http):
            found.append(
                f"compose.yaml: `{name}` OTEL_EXPORTER_OTLP_ENDPOINT is not the collector's "
                f"OTLP/HTTP receiver ({collector_http} in deploy/otel-collector.yaml)"
            )
    assert not found, _problems(found)


@pytest.mark.parametrize("name", sorted(AML_SETTINGS))
def test_aml_service_runs_its_module(name: str) -> None:
    service = _services()[name]
    command = _command(service)
    expected = f"aml_{name}"
    assert command == ["python", "-m", expected], (
        f"compose.yaml: `{name}` command is {command}, expected python -m {expected}"
    )
    assert find_spec(expected) is not None, f"compose.yaml: `{name}` runs {expected}: not found"
    assert find_spec(f"{expected}.__main__") is not None, f"{expected} has no __main__ module"
    build = service.get("build")
    context = build if isinstance(build, str) else (build or {}).get("context")
    assert context == ".", f"compose.yaml: `{name}` must be built from the repository's Dockerfile"


def test_python_healthchecks_run_modules_that_exist() -> None:
    found = []
    for name, service in _services().items():
        test = _healthcheck_test(service)
        if "-m" in test:
            module = test[test.index("-m") + 1]
            if find_spec(module) is None:
                found.append(f"compose.yaml: `{name}` healthcheck runs {module}: not found")
    assert not found, _problems(found)


def test_gateway_listens_where_it_is_published_and_probed() -> None:
    gateway = _services()["gateway"]
    env = _environment(gateway)
    assert env.get("AML_HOST") == "0.0.0.0", "compose.yaml: the gateway must set AML_HOST=0.0.0.0"
    assert env.get("AML_ENVIRONMENT") == "production", "compose.yaml: gateway AML_ENVIRONMENT"
    port = int(env.get("AML_PORT", "0"))
    published = [str(mapping).rsplit(":", 1)[-1] for mapping in gateway.get("ports") or []]
    assert str(port) in published, f"compose.yaml: gateway ports {published} miss AML_PORT {port}"
    url = _url_in(_healthcheck_test(gateway))
    assert url is not None, "compose.yaml: the gateway healthcheck must GET a URL"
    assert urlsplit(url).port == port and urlsplit(url).path == "/ready", (
        f"compose.yaml: gateway healthcheck {url} is not GET /ready on AML_PORT {port}"
    )


@pytest.mark.parametrize("name", sorted(set(AML_SETTINGS) - {"gateway"}))
def test_worker_healthcheck_gets_ready_on_its_metrics_port(name: str) -> None:
    service = _services()[name]
    module, class_name = AML_SETTINGS[name]
    settings_class = getattr(importlib.import_module(module), class_name)
    env = _environment(service)
    port = int(_resolve(env.get("AML_METRICS_PORT", "")) or
               settings_class.model_fields["metrics_port"].default)  # fmt: skip
    assert port > 0, f"compose.yaml: `{name}` turns its metrics port off but probes it"
    url = _url_in(_healthcheck_test(service))
    assert url is not None, f"compose.yaml: `{name}` healthcheck must GET a URL"
    assert (urlsplit(url).port, urlsplit(url).path) == (port, "/ready"), (
        f"compose.yaml: `{name}` healthcheck {url} is not GET /ready on AML_METRICS_PORT {port}"
    )


# -- Dockerfile and .dockerignore ---------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    assert DOCKERFILE.is_file(), "Dockerfile is missing"
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    lines = [line.strip() for line in text.splitlines()]
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for line in lines
        if line and not line.startswith("#")
        for parts in [line.split(None, 1)]
    ]


def _ignored() -> set[str]:
    assert DOCKERIGNORE.is_file(), ".dockerignore is missing"
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return {line.strip().rstrip("/") for line in lines if line.strip() and line[0] != "#"}


def test_dockerfile_installs_the_project_and_runs_a_service_as_non_root() -> None:
    instructions = _instructions()
    froms = [args for op, args in instructions if op == "FROM"]
    assert froms and froms[0].startswith("python:3.11-slim"), f"Dockerfile: FROM is {froms}"
    copies = [args.split() for op, args in instructions if op == "COPY"]
    found = []
    destinations = {}
    for words in copies:
        *sources, destination = [word for word in words if not word.startswith("--")]
        for source in sources:
            if not (ROOT / source).exists():
                found.append(f"Dockerfile: COPY {source}: missing from the build context")
            if source.rstrip("/") in _ignored():
                found.append(f"Dockerfile: COPY {source}: excluded by .dockerignore")
            destinations[source.rstrip("/")] = destination
    project = destinations.get("pyproject.toml", "")
    project_dir = project.rsplit("/", 1)[0] if project.endswith("pyproject.toml") else project
    project_dir = project_dir.rstrip("/") or "/"
    installs = [args for op, args in instructions if op == "RUN" and "pip install" in args]
    if not any(
        re.search(rf"pip install(\s+--[\w-]+)*\s+({re.escape(project_dir)}|\.)(\s|$)", run)
        for run in installs
    ):
        found.append(f"Dockerfile: no `pip install` of the copied project ({project_dir})")
    # Exactly the locked dependencies, checked by their hashes, and the project without any
    # resolution of its own.
    if not any(
        "--require-hashes" in run and "requirements-service.lock" in run for run in installs
    ):
        found.append("Dockerfile: dependencies not installed from requirements-service.lock")
    if not any(re.search(r"pip install --no-deps\s", run) for run in installs):
        found.append("Dockerfile: the project is installed with its own dependency resolution")
    users = [args for op, args in instructions if op == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        found.append(f"Dockerfile: must end as a non-root USER, has {users}")
    commands = [args for op, args in instructions if op in ("CMD", "ENTRYPOINT")]
    if not commands:
        found.append("Dockerfile: no CMD or ENTRYPOINT")
    else:
        command = json.loads(commands[-1])
        if command[:2] != ["python", "-m"] or find_spec(command[2]) is None:
            found.append(f"Dockerfile: CMD {command} does not run an existing module")
    assert not found, _problems(found)


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    missing = {".venv", ".aml", ".git", ".env", ".pytest_cache", ".mypy_cache"} - _ignored()
    assert not missing, f".dockerignore must exclude {sorted(missing)}"


def test_image_leaves_the_developer_tooling_out() -> None:
    """libs/devtools stays out of the build context, so nothing the image runs may need it: no
    module of the copied packages imports aml_devtools, no healthcheck runs it, and the `aml`
    script pip writes for it is removed."""
    assert "libs/devtools" in _ignored(), ".dockerignore must exclude libs/devtools"
    # Nor the tools a team or a benchmark runs, nor the test tiers and benchmarks.
    for folder in ("tools", "tests", "benchmarks"):
        assert folder in _ignored(), f".dockerignore must exclude {folder}"
    shipped = [
        path
        for folder in ("libs", "services")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not path.is_relative_to(ROOT / "libs" / "devtools")
    ]
    importing = [
        str(path.relative_to(ROOT))
        for path in shipped
        if re.search(r"^\s*(from|import)\s+aml_devtools\b", path.read_text("utf-8"), re.M)
    ]
    assert not importing, f"the image lacks aml_devtools, yet these import it: {importing}"
    tool_modules = {found.name for found in (ROOT / "tools").glob("*/aml_*") if found.is_dir()}
    needing_tools = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in shipped
        for module in re.findall(r"^\s*(?:from|import)\s+(aml_\w+)", path.read_text("utf-8"), re.M)
        if module in tool_modules
    ]
    assert not needing_tools, f"the image lacks tools/, yet these import from it: {needing_tools}"
    found = []
    for name, service in _services().items():
        test = _healthcheck_test(service)
        if "-m" in test and test[test.index("-m") + 1].startswith("aml_devtools"):
            found.append(f"compose.yaml: `{name}` healthcheck runs developer tooling")
    installs = [args for op, args in _instructions() if op == "RUN" and "pip install" in args]
    if not any("rm /usr/local/bin/aml" in run for run in installs):
        found.append("Dockerfile: the `aml` script (aml_devtools.cli) is left in the image")
    assert not found, _problems(found)


# -- The coding worker: its image target, compose service and seccomp profile ------------------
# The answerer (Solve) and scorer (Verify) run the coding track's sandbox (aml_pipeline.sandbox):
# bwrap, git and Debian's /usr/bin/python3 on the worker (the sandbox masks /usr/local, where
# the python image's own interpreter is), the datasets root mounted, and what bwrap needs under
# Docker to create user namespaces as the unprivileged user 10001.

CODING_WORKERS = ("answerer", "scorer")
CODING_PACKAGES = ("bubblewrap", "git", "python3")
SECCOMP_PROFILE = DEPLOY / "seccomp" / "aml-bwrap.json"
# What bwrap 0.8 calls that the runtimes' default profiles deny a container without capabilities.
BWRAP_SYSCALLS = {"clone", "unshare", "mount", "umount2", "pivot_root", "sethostname"}
# Never opened by the profile: the default profile denies them, and bwrap needs none of them.
DENIED_SYSCALLS = {"bpf", "setns", "keyctl", "add_key", "request_key", "chroot", "kexec_load",
                   "kexec_file_load", "init_module", "finit_module", "delete_module",
                   "open_by_handle_at", "perf_event_open", "userfaultfd", "fsopen", "fsmount",
                   "fsconfig", "move_mount", "open_tree", "mount_setattr", "syslog", "reboot",
                   "swapon", "swapoff", "acct", "iopl", "ioperm", "settimeofday", "clock_settime",
                   "quotactl", "lookup_dcookie", "setdomainname", "vhangup"}  # fmt: skip
# The OCI runtime-spec's seccomp fields, all that containerd reads from a Localhost profile (it
# ignores Docker's `includes`/`excludes`/`archMap`, which would silently widen a rule there).
OCI_SECCOMP_KEYS = {"defaultAction", "defaultErrnoRet", "architectures", "flags", "syscalls"}
OCI_SYSCALL_KEYS = {"names", "action", "errnoRet", "args"}
DEBIAN_RELEASES = {"bookworm": 12, "trixie": 13}


def _stages() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(stage name, base, instructions) of each Dockerfile stage, in order; an unnamed stage is
    named by its position."""
    stages: list[tuple[str, str, list[tuple[str, str]]]] = []
    for op, args in _instructions():
        if op == "FROM":
            words = args.split()
            name = words[2] if len(words) > 2 and words[1].upper() == "AS" else str(len(stages))
            stages.append((name, words[0], []))
        elif stages:
            stages[-1][2].append((op, args))
    return stages


def _build_target(service: dict[str, Any]) -> str | None:
    build = service.get("build")
    return build.get("target") if isinstance(build, dict) else None


def _mount_flags(service: dict[str, Any], target: str) -> tuple[str, bool] | None:
    """(source, read-only) of the mount at `target`, short or long syntax."""
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            if volume["target"] == target:
                return volume.get("source", ""), bool(volume.get("read_only"))
            continue
        parts = volume.split(":")
        if len(parts) >= 2 and parts[1] == target:
            return parts[0], len(parts) > 2 and "ro" in parts[2].split(",")
    return None


def test_dockerfile_builds_a_coding_target_with_the_sandbox_tools_as_non_root() -> None:
    stages = _stages()
    names = [name for name, _, _ in stages]
    assert "service" in names and "coding" in names, f"Dockerfile: stages are {names}"
    service_base = dict((name, base) for name, base, _ in stages)["service"]
    # The Debian release is pinned (the apt pins below only hold within one release).
    release = re.fullmatch(r"python:3\.11-slim-(\w+)", service_base)
    assert release and release.group(1) in DEBIAN_RELEASES, (
        f"Dockerfile: the service stage is FROM {service_base}, not a pinned Debian release"
    )
    debian = DEBIAN_RELEASES[release.group(1)]
    ((_, coding_base, coding),) = [stage for stage in stages if stage[0] == "coding"]
    assert coding_base == "service", f"Dockerfile: the coding stage is FROM {coding_base}"
    found = []
    runs = [args for op, args in coding if op == "RUN"]
    installs = [run for run in runs if "apt-get install" in run]
    if not installs:
        found.append("Dockerfile: the coding stage installs nothing with apt-get")
    for run in installs:
        if "--no-install-recommends" not in run:
            found.append("Dockerfile: apt-get install without --no-install-recommends")
        if "rm -rf /var/lib/apt/lists" not in run:
            found.append("Dockerfile: the coding stage keeps apt's lists in the image")
    text = " ".join(installs)
    for package in CODING_PACKAGES:
        pin = re.search(rf"(?<![\w.+-]){re.escape(package)}=([^\s'\"]+)", text)
        if pin is None:
            found.append(f"Dockerfile: the coding stage does not install {package}, pinned")
            continue
        other = re.search(r"\+deb(\d+)u", pin.group(1))
        if other and int(other.group(1)) != debian:
            found.append(f"Dockerfile: {package}={pin.group(1)} is not of Debian {debian}")
    # Root only to install; the stage ends as the service's non-root user and runs its command.
    users = [args for op, args in coding if op == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        found.append(f"Dockerfile: the coding stage must end as a non-root USER, has {users}")
    service_users = [args for name, _, ops in stages if name == "service"
                     for op, args in ops if op == "USER"]  # fmt: skip
    if users and service_users and users[-1] != service_users[-1]:
        found.append(f"Dockerfile: the coding stage runs as {users[-1]}, not {service_users[-1]}")
    if any(op in ("CMD", "ENTRYPOINT") for op, _ in coding):
        found.append("Dockerfile: the coding stage changes the command (compose and the "
                     "manifests choose the service, as for the service image)")  # fmt: skip
    # A plain `docker build .` (the last stage) still makes the service image.
    last_name, last_base, last_ops = stages[-1]
    if last_name != "service" and (last_base != "service" or last_ops):
        found.append(f"Dockerfile: the default target is {last_name} (FROM {last_base})")
    assert not found, _problems(found)


def test_compose_runs_the_coding_workers_on_the_coding_image_with_the_datasets() -> None:
    services = _services()
    targets = {name for name, _, _ in _stages()}
    found = []
    for name in AML_SETTINGS:
        target = _build_target(services[name])
        expected = "coding" if name in CODING_WORKERS else "service"
        if target != expected:
            found.append(f"compose.yaml: `{name}` builds target {target!r}, not {expected!r}")
        elif target not in targets:
            found.append(f"compose.yaml: `{name}` builds target {target}, not in the Dockerfile")
    scheduler_root = _environment(services["scheduler"]).get("AML_DATASETS_ROOT")
    scheduler_mount = _mount_flags(services["scheduler"], scheduler_root or "")
    for name in CODING_WORKERS:
        root = _environment(services[name]).get("AML_DATASETS_ROOT")
        if not root:
            found.append(f"compose.yaml: `{name}` has no AML_DATASETS_ROOT")
            continue
        mount = _mount_flags(services[name], root)
        if mount is None or not mount[1]:
            found.append(f"compose.yaml: `{name}` does not mount {root} read-only ({mount})")
        elif scheduler_mount is None or mount[0] != scheduler_mount[0]:
            found.append(f"compose.yaml: `{name}` mounts {mount[0]}, not the scheduler's volume")
    assert not found, _problems(found)


def _security_options(service: dict[str, Any]) -> dict[str, str]:
    """`security_opt` as key -> value (`key=value`, or the older `key:value`)."""
    options = {}
    for option in service.get("security_opt") or []:
        match = re.fullmatch(r"([^=:]+)[=:]?(.*)", option)
        assert match, f"compose.yaml: security_opt {option!r}"
        options[match.group(1)] = match.group(2)
    return options


def test_compose_gives_bwrap_the_narrowest_options_it_needs() -> None:
    """seccomp: the profile in deploy/seccomp (Docker's default plus bwrap's calls), never
    unconfined; AppArmor's docker-default (which denies mounts) off; /proc unmasked so the
    kernel allows bwrap a fresh /proc; no capability, no privilege, no new privileges. The other
    services keep Docker's defaults."""
    found = []
    for name, service in _services().items():
        options = _security_options(service)
        if name not in CODING_WORKERS:
            relaxed = {key: value for key, value in options.items()
                       if key in ("seccomp", "apparmor", "systempaths")}  # fmt: skip
            if relaxed or service.get("privileged") or service.get("cap_add"):
                found.append(f"compose.yaml: `{name}` relaxes {relaxed or 'its privileges'}")
            continue
        profile = options.get("seccomp")
        if profile is None or profile == "unconfined":
            found.append(f"compose.yaml: `{name}` seccomp is {profile!r}, not a profile file")
        elif (ROOT / profile).resolve() != SECCOMP_PROFILE.resolve():
            found.append(f"compose.yaml: `{name}` seccomp profile {profile} is not "
                         f"{SECCOMP_PROFILE.relative_to(ROOT)}")  # fmt: skip
        for key, value in (("apparmor", "unconfined"), ("systempaths", "unconfined"),
                           ("no-new-privileges", "true")):  # fmt: skip
            if options.get(key) != value:
                found.append(f"compose.yaml: `{name}` needs security_opt {key}={value}")
        if service.get("privileged") or service.get("cap_add"):
            found.append(f"compose.yaml: `{name}` must be neither privileged nor given caps")
        if service.get("cap_drop") != ["ALL"]:
            found.append(f"compose.yaml: `{name}` must drop every capability (cap_drop: [ALL])")
        for key in ("userns_mode", "pid", "ipc", "network_mode"):
            if str(service.get(key, "")).startswith("host"):
                found.append(f"compose.yaml: `{name}` shares the host's {key}")
    assert not found, _problems(found)


def test_seccomp_profile_is_the_default_plus_what_bwrap_needs() -> None:
    profile = json.loads(SECCOMP_PROFILE.read_text(encoding="utf-8"))
    where = SECCOMP_PROFILE.relative_to(ROOT)
    # Plain OCI fields only: read the same by Docker, containerd and CRI-O.
    assert set(profile) <= OCI_SECCOMP_KEYS, f"{where}: {set(profile) - OCI_SECCOMP_KEYS}"
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO", f"{where}: allows by default"
    assert {"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"} <= set(profile["architectures"])
    unconditional: set[str] = set()
    conditional: set[str] = set()
    for rule in profile["syscalls"]:
        assert set(rule) <= OCI_SYSCALL_KEYS, f"{where}: {rule}"
        if rule["action"] == "SCMP_ACT_ALLOW":
            (conditional if rule.get("args") else unconditional).update(rule["names"])
        else:
            assert rule["action"] == "SCMP_ACT_ERRNO", f"{where}: {rule}"
    missing = BWRAP_SYSCALLS - unconditional
    assert not missing, f"{where}: bwrap needs {sorted(missing)}"
    opened = DENIED_SYSCALLS & (unconditional | conditional)
    assert not opened, f"{where}: allows {sorted(opened)}, which bwrap does not need"
    # clone3 answers ENOSYS (as in the default profile), so that libc falls back to clone.
    assert {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38} in profile["syscalls"]
    # What the services themselves need is there too (a sample of the default's allow list).
    assert {"read", "write", "openat", "execve", "socket", "prlimit64", "setpriority"} <= (
        unconditional | conditional
    )


# -- Grafana ------------------------------------------------------------------------------------


def _provisioned_datasources() -> dict[str, dict[str, Any]]:
    files = sorted(GRAFANA_DATASOURCES.glob("*.yaml"))
    assert files, f"no datasource file in {GRAFANA_DATASOURCES.relative_to(ROOT)}"
    found = {}
    for path in files:
        for source in _yaml(path).get("datasources") or []:
            assert source.get("uid"), f"{path.relative_to(ROOT)}: datasource without uid"
            found[source["uid"]] = source
    return found


def _dashboards() -> dict[Path, dict[str, Any]]:
    files = sorted(GRAFANA_DASHBOARDS.glob("*.json"))
    assert files, f"no dashboard in {GRAFANA_DASHBOARDS.relative_to(ROOT)}"
    loaded = {}
    for path in files:
        try:
            loaded[path] = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            pytest.fail(f"{path.relative_to(ROOT)} is not valid JSON: {exc}")
    return loaded


def _datasource_refs(node: Any) -> list[str]:
    """Every datasource uid a dashboard refers to, anywhere in it."""
    if isinstance(node, list):
        return [uid for item in node for uid in _datasource_refs(item)]
    if not isinstance(node, dict):
        return []
    found = [uid for key, value in node.items() for uid in _datasource_refs(value)]
    reference = node.get("datasource")
    if isinstance(reference, dict) and "uid" in reference:
        found.append(reference["uid"])
    return found


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard.get("panels") or []:
        panels.append(panel)
        panels.extend(panel.get("panels") or [])  # panels inside collapsed rows
    return panels


def test_grafana_tempo_datasource_points_at_tempo() -> None:
    sources = _provisioned_datasources()
    assert "tempo" in sources, "grafana datasources: no datasource with uid `tempo`"
    tempo = sources["tempo"]
    assert tempo.get("type") == "tempo", "grafana datasource `tempo` must have type tempo"
    url = urlsplit(tempo.get("url", ""))
    port = _yaml(TEMPO)["server"]["http_listen_port"]
    assert url.hostname == "tempo" and url.port == port, (
        f"grafana datasource `tempo` url {tempo.get('url')} is not http://tempo:{port}"
    )


def test_grafana_provisioning_is_mounted_where_the_providers_look() -> None:
    assert _bind_target("grafana", "deploy/grafana/provisioning") == "/etc/grafana/provisioning"
    mounted = _bind_target("grafana", "deploy/grafana/dashboards")
    providers = [
        provider
        for path in sorted(GRAFANA_PROVIDERS.glob("*.yaml"))
        for provider in _yaml(path).get("providers") or []
    ]
    assert providers, "deploy/grafana/provisioning/dashboards: no dashboard provider"
    paths = {(provider.get("options") or {}).get("path") for provider in providers}
    assert mounted in paths, (
        f"grafana dashboard providers read {sorted(map(str, paths))}, but compose.yaml mounts "
        f"deploy/grafana/dashboards at {mounted}"
    )


def test_dashboards_use_provisioned_datasources_and_their_query_languages() -> None:
    sources = _provisioned_datasources()
    found = []
    for path, dashboard in _dashboards().items():
        where = path.relative_to(ROOT)
        if not dashboard.get("uid") or not dashboard.get("title"):
            found.append(f"{where}: a dashboard needs a uid and a title")
        for uid in sorted(set(_datasource_refs(dashboard)) - set(sources)):
            found.append(f"{where}: datasource uid {uid!r} is not provisioned ({sorted(sources)})")
        for panel in _panels(dashboard):
            if panel.get("type") == "row":
                continue
            title = panel.get("title")
            targets = panel.get("targets") or []
            if not targets:
                found.append(f"{where}: panel {title!r} has no query")
            for target in targets:
                uid = (target.get("datasource") or panel.get("datasource") or {}).get("uid")
                kind = (sources.get(uid) or {}).get("type")
                if kind == "tempo" and (target.get("queryType") != "traceql"
                                        or not target.get("query")):  # fmt: skip
                    found.append(f"{where}: panel {title!r} needs a TraceQL query")
                elif kind == "prometheus" and not target.get("expr"):
                    found.append(f"{where}: panel {title!r} needs a PromQL `expr`")
                elif kind not in ("tempo", "prometheus"):
                    found.append(f"{where}: panel {title!r} queries datasource {uid!r} ({kind})")
    assert not found, _problems(found)


def test_dashboard_has_the_required_panels() -> None:
    queries: dict[str, list[str]] = {}
    for dashboard in _dashboards().values():
        for panel in _panels(dashboard):
            targets = panel.get("targets") or []
            queries[panel.get("title", "")] = [target.get("query", "") for target in targets]
    found = []
    for title, fragments in REQUIRED_PANELS.items():
        if title not in queries:
            found.append(f"deploy/grafana/dashboards: no panel titled {title!r}")
            continue
        for fragment in fragments:
            if not any(fragment in query for query in queries[title]):
                found.append(f"deploy/grafana/dashboards: panel {title!r} lacks {fragment!r}")
    assert not found, _problems(found)


def test_grafana_requires_a_login() -> None:
    env = _environment(_services()["grafana"])
    assert env.get("GF_AUTH_ANONYMOUS_ENABLED") == "false", (
        "compose.yaml: grafana must set GF_AUTH_ANONYMOUS_ENABLED=false (a login is required)"
    )
    assert env.get("GF_USERS_ALLOW_SIGN_UP") == "false", "compose.yaml: grafana allows sign-up"
    assert env.get("GF_AUTH_DISABLE_LOGIN_FORM", "false") == "false"
    assert REQUIRED_SUBSTITUTION.match(env.get("GF_SECURITY_ADMIN_PASSWORD", "")), (
        "compose.yaml: grafana's GF_SECURITY_ADMIN_PASSWORD must be a required substitution"
    )


# -- Prometheus and the dashboard's metrics -----------------------------------------------------


def _prometheus() -> dict[str, Any]:
    config = _yaml(PROMETHEUS)
    assert isinstance(config, dict), "deploy/prometheus.yaml: not a mapping"
    return config


def _scrape_targets() -> dict[str, set[tuple[str, int]]]:
    """job name -> the (host, port) pairs it scrapes: DNS discovery names and static targets."""
    found: dict[str, set[tuple[str, int]]] = {}
    for job in _prometheus().get("scrape_configs") or []:
        targets = found.setdefault(job["job_name"], set())
        for dns in job.get("dns_sd_configs") or []:
            assert dns.get("type", "SRV") == "A", "deploy/prometheus.yaml: DNS discovery by A"
            targets |= {(name, int(dns["port"])) for name in dns["names"]}
        for static in job.get("static_configs") or []:
            for target in static["targets"]:
                host, _, port = target.rpartition(":")
                targets.add((host, int(port)))
    return found


def _target_labels() -> set[str]:
    """The labels every scraped series carries: Prometheus' own and those relabelling sets."""
    labels = set(PROMETHEUS_TARGET_LABELS)
    for job in _prometheus().get("scrape_configs") or []:
        for rule in job.get("relabel_configs") or []:
            label = rule.get("target_label", "__")
            if not label.startswith("__"):  # `__address__` and the like are not kept
                labels.add(label)
    return labels


def _metric_objects() -> list[MetricWrapperBase]:
    """The metrics aml_runtime.metrics defines (all in prometheus_client's default registry)."""
    return [metric for metric in vars(metrics).values() if isinstance(metric, MetricWrapperBase)]


def _exported_series() -> dict[str, set[str]]:
    """Every series name aml_runtime.metrics exports -> its labels, as prometheus_client writes
    them: a counter `x` is `x_total`, a histogram `x` is `x_bucket` (with `le`), `x_sum`,
    `x_count`."""
    series: dict[str, set[str]] = {}
    for metric in _metric_objects():
        labels = set(metric._labelnames)
        for family in metric.describe():
            if family.type == "counter":
                series[f"{family.name}_total"] = labels
            elif family.type == "histogram":
                series[f"{family.name}_bucket"] = labels | {"le"}
                series[f"{family.name}_sum"] = labels
                series[f"{family.name}_count"] = labels
            else:
                series[family.name] = labels
    assert series, "aml_runtime.metrics defines no metric"
    return series


def _promql(expr: str) -> tuple[set[str], set[str]]:
    """(the series names, the label names) a PromQL expression uses: what is left once strings,
    label matchers, ranges, numbers, groupings and function calls are taken out is names."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    matchers = " ".join(re.findall(r"\{([^}]*)\}", text))
    labels = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    grouping = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"
    for group in re.findall(grouping, text):
        labels |= {label.strip() for label in group.split(",") if label.strip()}
    text = re.sub(grouping, " ", text)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"(?<![A-Za-z0-9_:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", " ", text)
    names = {
        match.group()
        for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text)
        if match.group() not in PROMQL_WORDS and not text[match.end() :].lstrip().startswith("(")
    }
    return names, labels


def _promql_targets() -> list[tuple[str, str, dict[str, Any]]]:
    """(file, panel title, target) of every PromQL query of the dashboards."""
    return [
        (str(path.relative_to(ROOT)), panel.get("title", ""), target)
        for path, dashboard in _dashboards().items()
        for panel in _panels(dashboard)
        for target in panel.get("targets") or []
        if target.get("expr")
    ]


def test_dashboard_promql_names_only_metrics_the_services_export() -> None:
    exported = _exported_series()
    known = {**exported, **PROMETHEUS_SERIES}
    targets = _promql_targets()
    assert targets, "deploy/grafana/dashboards: no PromQL query"
    found = []
    used = set()
    for where, title, target in targets:
        expr = target["expr"]
        names, labels = _promql(expr)
        if not names:
            found.append(f"{where}: panel {title!r} queries no metric: {expr}")
        for name in sorted(names - set(known)):
            found.append(
                f"{where}: panel {title!r} uses {name!r}, which aml_runtime.metrics does not "
                f"export (it exports {sorted(exported)})"
            )
        used |= names
        allowed = _target_labels().union(*(known.get(name, set()) for name in names))
        legend = set(re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}",
                                target.get("legendFormat") or ""))  # fmt: skip
        for label in sorted((labels | legend) - allowed):
            found.append(f"{where}: panel {title!r} uses label {label!r}, not one of {names}")
    # Every metric the services export is on the dashboard.
    families = {family.name for metric in _metric_objects() for family in metric.describe()}
    for family in sorted(families):
        if not any(name == family or name.startswith(f"{family}_") for name in used):
            found.append(f"deploy/grafana/dashboards: no panel shows {family}")
    assert not found, _problems(found)


def test_dashboard_has_the_required_metric_panels() -> None:
    queries: dict[str, list[str]] = {}
    for _, title, target in _promql_targets():
        queries.setdefault(title, []).append(target["expr"])
    found = []
    for title, fragments in REQUIRED_METRIC_PANELS.items():
        if title not in queries:
            found.append(f"deploy/grafana/dashboards: no PromQL panel titled {title!r}")
            continue
        for fragment in fragments:
            if not any(fragment in query for query in queries[title]):
                found.append(f"deploy/grafana/dashboards: panel {title!r} lacks {fragment!r}")
    assert not found, _problems(found)


def test_prometheus_scrapes_every_worker_compose_defines() -> None:
    services = _services()
    targets = _scrape_targets()
    assert targets, "deploy/prometheus.yaml: no scrape_configs"
    found = []
    scraped = set()
    for job, pairs in targets.items():
        for host, port in sorted(pairs):
            scraped.add(host)
            if host not in services:
                found.append(f"deploy/prometheus.yaml: job {job} scrapes {host!r}, not a service")
                continue
            if host not in WORKERS:
                found.append(f"deploy/prometheus.yaml: job {job} scrapes {host!r}, no worker")
                continue
            module, class_name = AML_SETTINGS[host]
            settings_class = getattr(importlib.import_module(module), class_name)
            env = _environment(services[host])
            metrics_port = int(_resolve(env.get("AML_METRICS_PORT", "")) or
                               settings_class.model_fields["metrics_port"].default)  # fmt: skip
            if port != metrics_port:
                found.append(
                    f"deploy/prometheus.yaml: job {job} scrapes {host}:{port}, but `{host}` "
                    f"serves /metrics on AML_METRICS_PORT {metrics_port}"
                )
    for name in sorted(WORKERS - scraped):
        found.append(f"deploy/prometheus.yaml: worker `{name}` is not scraped")
    assert not found, _problems(found)


def test_prometheus_runs_the_config_and_grafana_queries_it() -> None:
    prometheus = _services()["prometheus"]
    command = _command(prometheus)
    config = _bind_target("prometheus", "deploy/prometheus.yaml")
    assert f"--config.file={config}" in command, (
        f"compose.yaml: prometheus runs {command}, not --config.file={config}"
    )
    listen = next((word.split("=", 1)[1] for word in command
                   if word.startswith("--web.listen-address=")), ":9090")  # fmt: skip
    port = _port(listen)
    probe = _url_in(_healthcheck_test(prometheus))
    assert probe is not None and urlsplit(probe).port == port, (
        f"compose.yaml: prometheus healthcheck {probe} is not on its port {port}"
    )
    storage = next((word.split("=", 1)[1] for word in command
                    if word.startswith("--storage.tsdb.path=")), None)  # fmt: skip
    data = [target for kind, _, target in _volumes(prometheus) if kind == "volume"]
    assert storage in data, f"compose.yaml: prometheus stores in {storage}, not on a volume {data}"
    sources = _provisioned_datasources()
    assert "prometheus" in sources, "grafana datasources: no datasource with uid `prometheus`"
    source = sources["prometheus"]
    assert source.get("type") == "prometheus", "datasource `prometheus` must have type prometheus"
    url = urlsplit(source.get("url", ""))
    assert url.hostname == "prometheus" and url.port == port, (
        f"grafana datasource `prometheus` url {source.get('url')} is not http://prometheus:{port}"
    )
    defaults = [uid for uid, item in sources.items() if item.get("isDefault")]
    assert len(defaults) <= 1, f"grafana datasources: several defaults {defaults}"
    refs = {uid for dashboard in _dashboards().values() for uid in _datasource_refs(dashboard)}
    assert "prometheus" in refs, "deploy/grafana/dashboards: no panel queries Prometheus"


# -- OpenTelemetry collector and Tempo ----------------------------------------------------------


def _collector() -> dict[str, Any]:
    config = _yaml(COLLECTOR)
    assert isinstance(config, dict), "deploy/otel-collector.yaml: not a mapping"
    return config


def _port(endpoint: str) -> int | None:
    return urlsplit(endpoint if "://" in endpoint else f"//{endpoint}").port


def test_collector_pipelines_reference_defined_components() -> None:
    config = _collector()
    service = config.get("service") or {}
    pipelines = service.get("pipelines") or {}
    found = [] if "traces" in pipelines else ["deploy/otel-collector.yaml: no traces pipeline"]
    for pipeline, parts in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            defined = set(config.get(kind) or {})
            if kind != "processors" and not parts.get(kind):
                found.append(f"deploy/otel-collector.yaml: pipeline {pipeline} has no {kind}")
            for component in parts.get(kind) or []:
                if component not in defined:
                    found.append(
                        f"deploy/otel-collector.yaml: pipeline {pipeline} uses {kind[:-1]} "
                        f"{component!r}, not defined under `{kind}`"
                    )
    for extension in service.get("extensions") or []:
        if extension not in (config.get("extensions") or {}):
            found.append(f"deploy/otel-collector.yaml: extension {extension!r} is not defined")
    assert not found, _problems(found)


def test_collector_exports_to_tempo_and_is_probed_on_its_health_port() -> None:
    config = _collector()
    exporters = config["service"]["pipelines"]["traces"]["exporters"]
    tempo_grpc = _yaml(TEMPO)["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]
    otlp = [config["exporters"][name] for name in exporters if name.split("/")[0] == "otlp"]
    assert otlp, "deploy/otel-collector.yaml: the traces pipeline has no otlp exporter"
    endpoint = otlp[0]["endpoint"]
    assert endpoint.split(":")[0] == "tempo" and _port(endpoint) == _port(tempo_grpc["endpoint"]), (
        f"deploy/otel-collector.yaml: otlp exporter {endpoint} is not Tempo's OTLP gRPC "
        f"receiver (tempo:{_port(tempo_grpc['endpoint'])} in deploy/tempo.yaml)"
    )
    assert (otlp[0].get("tls") or {}).get("insecure") is True, (
        "deploy/otel-collector.yaml: the otlp exporter to tempo must set tls.insecure"
    )
    health = config["extensions"]["health_check"]["endpoint"]
    probe = _url_in(_healthcheck_test(_services()["otel-collector"]))
    assert probe is not None and urlsplit(probe).port == _port(health), (
        f"compose.yaml: otel-collector healthcheck {probe} is not the health_check port {health}"
    )


def test_tempo_config_enables_traceql_metrics_and_matches_compose() -> None:
    config = _yaml(TEMPO)
    assert isinstance(config, dict), "deploy/tempo.yaml: not a mapping"
    processors = config["overrides"]["defaults"]["metrics_generator"]["processors"]
    assert "local-blocks" in processors, (
        "deploy/tempo.yaml: overrides.defaults.metrics_generator.processors needs local-blocks "
        "(TraceQL metrics queries of the dashboard)"
    )
    assert config["storage"]["trace"]["backend"] == "local", "deploy/tempo.yaml: storage backend"
    probe = _url_in(_healthcheck_test(_services()["tempo"]))
    port = config["server"]["http_listen_port"]
    assert probe is not None and urlsplit(probe).port == port and probe.endswith("/ready"), (
        f"compose.yaml: tempo healthcheck {probe} is not /ready on http_listen_port {port}"
    )
    assert _bind_target("tempo", "deploy/tempo.yaml") in " ".join(_command(_services()["tempo"]))
    data = [target for kind, _, target in _volumes(_services()["tempo"]) if kind == "volume"]
    paths = [
        config["storage"]["trace"]["wal"]["path"],
        config["storage"]["trace"]["local"]["path"],
        config["metrics_generator"]["storage"]["path"],
        config["metrics_generator"]["traces_storage"]["path"],
    ]
    outside = [path for path in paths if not any(path.startswith(f"{d}/") for d in data)]
    assert not outside, f"deploy/tempo.yaml: {outside} are not on tempo's data volume {data}"
