"""The sandbox's Kubernetes backend (aml_pipeline.sandbox.pods) without a cluster.

- The pod it creates: valid against the Kubernetes 1.37 schema and admitted by what
  deploy/k8s/sandbox/sandbox.yaml enforces there (its ValidatingAdmissionPolicy's expressions
  evaluated on the pod, its LimitRange, its quotas, Pod Security `restricted`), read from that
  file. checkov scans it with each built overlay (tests/unit/test_k8s.py), beside its namespace.
- The runner against a fake of the API surface it uses (`CoreV1Api`'s three pod calls and the
  exec stream) whose "pod" is a local directory: each exec runs its real argv locally, with
  /testbed mapped to that directory and the kill of leftover processes left out (it would kill
  this machine's processes; `test_the_command_wrapper_under_a_pid_namespace` checks it under
  bwrap's pid namespace instead). So the copy in, the commands, `patch()` and `apply()` run real
  tar, timeout, prlimit and git. The kill exec'd on its own (`PodSandbox.interrupt`) is done by
  the fake, on the sessions of the pod's own execs.
- With the kubernetes package installed: the manifest survives the client's `V1Pod` model, and
  `kubernetes_api()` execs over its own WebSocket client with the right URL.

Nothing here talks to a cluster: the backend is checked statically and against fakes only."""

from __future__ import annotations

import inspect
import json
import os
import queue
import re
import resource as rlimits
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from pydantic import ValidationError
from test_k8s import KUBERNETES_VERSION

from aml_answerer.settings import AnswererSettings
from aml_pipeline.coding_agent import Interruptible, StoppableRunner
from aml_pipeline.coding_track import coding_sandbox, verify_limits
from aml_pipeline.sandbox import (
    TIMED_OUT,
    CommandResult,
    PodOptions,
    PodSandbox,
    Sandbox,
    SandboxFault,
    SandboxLimits,
    SandboxUnavailable,
    WorkingCopyRejected,
    bwrap,
    pods,
    require_pod_sandbox,
    require_sandbox,
    sandbox_pod_manifest,
    sandbox_probe,
    workspace_opener,
)
from aml_pipeline.sandbox.gitdiff import ObjectStore, scan, unified_diff
from aml_pipeline.sandbox.process import READY, OutputCap
from aml_scorer.settings import ScorerSettings

ROOT = Path(__file__).resolve().parents[2]
SANDBOX_DIR = ROOT / "deploy" / "k8s" / "sandbox"
IMAGE = "registry.example.org/aml/aml-coding:0.1.0"
OPTIONS = PodOptions(image=IMAGE, owner="answerer-7d9f-x2")
# The coding track's limits with the default settings (AML_CODING_COMMAND_TIMEOUT_SECONDS and
# AML_CODING_TEST_TIMEOUT_SECONDS; coding_track.solve_limits).
SOLVE = SandboxLimits(wall_seconds=60.0, cpu_seconds=60)
VERIFY = verify_limits(1800.0)
# The fake runs commands as this machine's user, whose every process RLIMIT_NPROC counts: as many
# as its hard limit allows (more would be refused).
_NPROC = rlimits.getrlimit(rlimits.RLIMIT_NPROC)[1]
LOCAL = SandboxLimits(processes=1_000_000 if _NPROC == rlimits.RLIM_INFINITY else max(_NPROC, 2))
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _sandbox_objects() -> dict[str, dict[str, dict[str, Any]]]:
    """deploy/k8s/sandbox/sandbox.yaml by kind, then name."""
    objects: dict[str, dict[str, dict[str, Any]]] = {}
    for doc in yaml.safe_load_all((SANDBOX_DIR / "sandbox.yaml").read_text()):
        if doc:
            objects.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    return objects


def _manifest(limits: SandboxLimits = SOLVE, options: PodOptions = OPTIONS) -> dict[str, Any]:
    labels = {"app.kubernetes.io/instance": "aml-sandbox-0123456789ab", "aml/owner": "x"}
    return sandbox_pod_manifest("aml-sandbox-0123456789ab", limits, options, labels)


# --- the pod manifest --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "limits", [SOLVE, VERIFY, SandboxLimits()], ids=["solve", "verify", "default"]
)
def test_the_pod_validates_strictly_against_the_schema(limits: SandboxLimits) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(_manifest(limits), KUBERNETES_VERSION, strict=True)


_CEL_TERM = re.compile(
    r"^(?:has\((?P<has>object(?:\.\w+)+)\)"
    r"|(?P<path>object(?:\.\w+)+) == (?P<value>'[^']*'|true|false|-?\d+))$"
)


def _cel(expression: str, pod: dict[str, Any]) -> bool:
    """The subset of CEL the namespace's admission policy is written in: `&&` of `has(path)`
    and `path == literal`. Anything else fails, so a new rule gets a look here too."""
    verdict = True
    for term in expression.split("&&"):
        match = _CEL_TERM.match(term.strip())
        assert match, f"the admission policy's expression {term.strip()!r} is new to this test"
        path = (match["has"] or match["path"]).split(".")[1:]
        node: Any = pod
        present = True
        for key in path:
            if not isinstance(node, dict) or key not in node:
                present = False
                break
            node = node[key]
        if match["has"]:
            verdict = verdict and present
            continue
        expected = yaml.safe_load(match["value"].replace("'", '"'))
        verdict = verdict and present and node == expected and type(node) is type(expected)
    return verdict


def test_cel_subset_reads_what_it_should() -> None:
    pod = {"spec": {"a": "x", "flag": False}}
    assert _cel("has(object.spec.a) && object.spec.a == 'x'", pod)
    assert not _cel("object.spec.a == 'y'", pod)
    assert _cel("object.spec.flag == false", pod)
    assert not _cel("has(object.spec.missing)", pod)
    with pytest.raises(AssertionError):
        _cel("object.spec.a in ['x']", pod)


def test_the_pod_is_admitted_by_the_namespace_policy() -> None:
    objects = _sandbox_objects()
    (policy,) = objects["ValidatingAdmissionPolicy"].values()
    (binding,) = objects["ValidatingAdmissionPolicyBinding"].values()
    (namespace,) = objects["Namespace"]
    pod = _manifest()
    # The binding selects the pods' namespace, and the policy pods' creation.
    labels = {"kubernetes.io/metadata.name": pod["metadata"]["namespace"]}
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"].items() <= (
        labels.items()
    )
    assert pod["metadata"]["namespace"] == namespace == pods.NAMESPACE
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert "pods" in rule["resources"] and "CREATE" in rule["operations"]
    assert policy["spec"]["validations"]
    for validation in policy["spec"]["validations"]:
        assert _cel(validation["expression"], pod), validation["message"]
    # What those expressions name exists in the namespace's own objects.
    assert pod["spec"]["runtimeClassName"] in objects["RuntimeClass"]
    account = objects["ServiceAccount"][pod["spec"]["serviceAccountName"]]
    assert account["metadata"]["namespace"] == pods.NAMESPACE
    # And a pod that breaks one of them is refused.
    for key, value in (
        ("runtimeClassName", "runc"),
        ("serviceAccountName", "default"),
        ("automountServiceAccountToken", True),
        ("activeDeadlineSeconds", None),
    ):
        broken = _manifest()
        if value is None:
            del broken["spec"][key]
        else:
            broken["spec"][key] = value
        assert not all(_cel(v["expression"], broken) for v in policy["spec"]["validations"]), key


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}


def _quantity(text: str | int) -> float:
    """A Kubernetes quantity as a number (cores for CPU, bytes otherwise)."""
    text = str(text)
    if text.endswith("m"):
        return int(text[:-1]) / 1000
    for suffix, factor in _UNITS.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


@pytest.mark.parametrize(
    "limits", [SOLVE, VERIFY, SandboxLimits()], ids=["solve", "verify", "default"]
)
def test_the_pod_fits_the_limit_range_and_the_quotas(limits: SandboxLimits) -> None:
    objects = _sandbox_objects()
    (limit_range,) = objects["LimitRange"].values()
    pod = _manifest(limits)
    containers = pod["spec"]["containers"]
    for item in limit_range["spec"]["limits"]:
        # Per container, or the pod's containers together.
        groups = [[c] for c in containers] if item["type"] == "Container" else [containers]
        for group in groups:
            for resource, most in item.get("max", {}).items():
                used = sum(_quantity(c["resources"]["limits"][resource]) for c in group)
                assert used <= _quantity(most), (item["type"], resource, used, most)
            for resource, least in item.get("min", {}).items():
                used = sum(_quantity(c["resources"]["requests"][resource]) for c in group)
                assert used >= _quantity(least), (item["type"], resource)
    for container in containers:
        requests, bounds = container["resources"]["requests"], container["resources"]["limits"]
        # Everything bounded by the pod itself, never left to the LimitRange's defaults.
        assert set(requests) == set(bounds) == {"cpu", "memory", "ephemeral-storage"}
        for resource, request in requests.items():
            assert _quantity(request) <= _quantity(bounds[resource]), resource
        # A process may use its whole address space.
        assert _quantity(bounds["memory"]) >= limits.address_space_bytes
        assert not container.get("env") and not container.get("envFrom")
    quotas = objects["ResourceQuota"]
    # The deadline: only pods without one fall in the NotTerminating scope, which admits none.
    (deadline_quota,) = [
        q for q in quotas.values() if q["spec"].get("scopes") == ["NotTerminating"]
    ]
    assert deadline_quota["spec"]["hard"] == {"pods": "0"}
    assert pod["spec"]["activeDeadlineSeconds"] >= OPTIONS.lifetime_seconds
    assert pod["spec"]["activeDeadlineSeconds"] > limits.wall_seconds
    # The quota admits as many such pods as it has pod slots.
    (total,) = [q for q in quotas.values() if not q["spec"].get("scopes")]
    slots = int(total["spec"]["hard"]["pods"])
    for key, most in total["spec"]["hard"].items():
        if key == "pods":
            continue
        kind, resource = key.split(".", 1)
        per_pod = sum(_quantity(c["resources"][kind][resource]) for c in containers)
        assert slots * per_pod <= _quantity(most), (key, slots * per_pod, most)


def test_the_pod_meets_pod_security_restricted() -> None:
    """Pod Security Admission `restricted` (the namespace's enforce label), rule by rule."""
    (namespace,) = _sandbox_objects()["Namespace"].values()
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    spec = _manifest()["spec"]
    for key in ("hostNetwork", "hostPID", "hostIPC", "hostUsers", "shareProcessNamespace"):
        assert key not in spec, key
    assert set(spec["securityContext"]) <= {"runAsNonRoot", "runAsUser", "runAsGroup",
                                            "seccompProfile", "fsGroup"}  # fmt: skip
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                       "persistentVolumeClaim", "projected", "secret"}  # fmt: skip
    for volume in spec["volumes"]:
        assert set(volume) - {"name"} <= allowed_volumes, volume
    for container in spec["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["privileged"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["readOnlyRootFilesystem"] is True
        assert "procMount" not in context and "seLinuxOptions" not in context
        assert not any("hostPort" in port for port in container.get("ports") or [])


def test_the_pod_holds_nothing_but_its_sandbox() -> None:
    pod = _manifest()
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never" and spec["terminationGracePeriodSeconds"] == 0
    assert container["image"] == IMAGE and container["name"] == pods.CONTAINER
    # Its main process only waits (and reaps): commands are exec'd.
    assert container["command"][:2] == ["/bin/sh", "-c"] and "sleep" in container["command"][2]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert set(mounts) == {bwrap.REPO, "/tmp"}
    assert mounts[bwrap.REPO]["emptyDir"]["sizeLimit"] == "4Gi"
    assert mounts["/tmp"]["emptyDir"]["sizeLimit"] == "64Mi"
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "sandbox"
    assert pod["metadata"]["labels"]["aml/owner"] == "x"
    assert pods.label_value("snap shot/../x.tar.gz") == "snap-shot-..-x.tar.gz"
    assert pods.label_value("---") == "unknown" and len(pods.label_value("a" * 99)) == 63


def test_the_command_line_is_the_bwrap_sandbox_s_inner_one() -> None:
    limits = SandboxLimits(wall_seconds=5, cpu_seconds=7, processes=33, output_bytes=1000)
    argv = pods.command_argv(limits, "pytest -q", 1.5)
    environment = [f"{name}={value}" for name, value in bwrap.ENVIRONMENT]
    assert argv[: 2 + len(environment)] == ["/usr/bin/env", "-i", *environment]
    rest = argv[2 + len(environment) :]
    assert rest[:5] == ["/bin/sh", "-c", pods._WRAPPER, "sh", "1.500"]
    assert "timeout -s KILL" in pods._WRAPPER and "kill -s KILL -- -1" in pods._WRAPPER
    layout = bwrap.Layout(
        working_copy=Path("/w"), etc=Path("/e"), inbox=Path("/i"), empty=Path("/m"), system=()
    )
    inner = bwrap.argv("bwrap", layout, limits, "pytest -q")
    assert rest[5:] == inner[inner.index("--") + 1 :]
    assert "--cpu=7" in rest and "--nproc=33" in rest and rest[-2:] == [READY.decode(), "pytest -q"]


# --- a fake API whose pod is a local directory ------------------------------------------------


class FakeApiError(Exception):
    """Shaped as kubernetes.client.ApiException: status, reason, body (a Status as JSON)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"({status}) {message}")
        self.status = status
        self.reason = message
        self.body = json.dumps({"kind": "Status", "message": message})


def _pod(phase: str, waiting: str | None = None) -> SimpleNamespace:
    state = SimpleNamespace(waiting=SimpleNamespace(reason=waiting) if waiting else None)
    return SimpleNamespace(
        status=SimpleNamespace(phase=phase, container_statuses=[SimpleNamespace(state=state)])
    )


class LocalStream:
    """An exec: `argv` runs here, its output framed into channels as the WebSocket has it."""

    def __init__(self, argv: list[str], stdin: bool) -> None:
        # A session of its own: what the exec starts can be told apart from this machine's
        # other processes (`LocalPod.kill_leftovers`).
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.frames: queue.Queue[tuple[int, bytes] | None] = queue.Queue()
        self.channels: dict[int, bytes] = {}
        self.open = True
        pipes = ((1, self.process.stdout), (2, self.process.stderr))
        readers = [
            threading.Thread(target=self._pump, args=(pipe, channel), daemon=True)
            for channel, pipe in pipes
        ]
        for reader in readers:
            reader.start()
        threading.Thread(target=self._finish, args=(readers,), daemon=True).start()

    def _pump(self, pipe: Any, channel: int) -> None:
        while chunk := pipe.read1(65536):
            self.frames.put((channel, chunk))

    def _finish(self, readers: list[threading.Thread]) -> None:
        for reader in readers:
            reader.join()
        code = self.process.wait()
        code = 128 - code if code < 0 else code
        status = {"status": "Success"} if code == 0 else {
            "status": "Failure", "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }  # fmt: skip
        self.frames.put((3, json.dumps(status).encode()))
        self.frames.put(None)

    def is_open(self) -> bool:
        return self.open

    def update(self, timeout: float = 0) -> None:
        try:
            frame = self.frames.get(timeout=timeout) if timeout else self.frames.get_nowait()
            while True:
                if frame is None:
                    self.open = False
                    return
                channel, data = frame
                self.channels[channel] = self.channels.get(channel, b"") + data
                frame = self.frames.get_nowait()
        except queue.Empty:
            return

    def read_channel(self, channel: int, timeout: float = 0) -> bytes:
        return self.channels.pop(channel, b"")

    def write_stdin(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


class LocalPod:
    """A fake of the API surface `PodSandbox` uses, its one pod being `testbed`."""

    def __init__(self, testbed: Path, phases: list[SimpleNamespace] | None = None) -> None:
        self.testbed = testbed
        self.phases = phases or [_pod("Pending", "ContainerCreating"), _pod("Running")]
        self.calls: list[tuple[Any, ...]] = []
        self.manifests: list[dict[str, Any]] = []
        self.execs: list[list[str]] = []
        self.create_error: Exception | None = None
        self.delete_errors: list[Exception] = []
        self.stream: Callable[[list[str], bool], Any] = self._local
        self.streams: list[LocalStream] = []
        self.allowed_verbs = {"create", "get"}

    @property
    def api(self) -> pods.PodApi:
        return pods.PodApi(core=self, open_exec=self.open_exec, allowed=self.allowed)

    def create_namespaced_pod(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        self.calls.append(("create", namespace, body["metadata"]["name"], kwargs.get("dry_run")))
        self.manifests.append(body)
        if self.create_error:
            raise self.create_error
        return body

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self.calls.append(("read", namespace, name))
        return self.phases.pop(0) if len(self.phases) > 1 else self.phases[0]

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self.calls.append(("delete", namespace, name, kwargs.get("grace_period_seconds")))
        if self.delete_errors:
            raise self.delete_errors.pop(0)
        return None

    def open_exec(self, name: str, namespace: str, argv: list[str], stdin: bool) -> Any:
        self.calls.append(("exec", namespace, name))
        self.execs.append(argv)
        return self.stream(argv, stdin)

    def _local(self, argv: list[str], stdin: bool) -> LocalStream:
        if pods._KILL_LEFTOVERS in argv:
            # The kill on its own (`PodSandbox.interrupt`): done here, on this pod's execs only.
            self.kill_leftovers()
            argv = ["true"]
        here = [a.replace(pods._KILL_LEFTOVERS, ":").replace(bwrap.REPO, str(self.testbed))
                for a in argv]  # fmt: skip
        stream = LocalStream(here, stdin)
        self.streams.append(stream)
        return stream

    def kill_leftovers(self) -> None:
        """What `kill -1` does in the pod, for the processes of this pod's execs: each exec's
        session, whatever process groups (`timeout`'s) it holds. Only sessions whose leader is
        not reaped yet, so that none of their ids can be another process's by now."""
        for _ in range(8):
            sessions = {s.process.pid for s in self.streams if s.process.returncode is None}
            killed = 0
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    state, _ppid, _group, session = stat.read_text().rsplit(")", 1)[1].split()[:4]
                    if int(session) in sessions and state != "Z":
                        os.kill(int(stat.parent.name), signal.SIGKILL)
                        killed += 1
                except (OSError, ValueError, IndexError):
                    continue
            if not killed:
                return

    def allowed(self, namespace: str, verb: str, resource: str, subresource: str) -> bool:
        self.calls.append(("review", namespace, verb, f"{resource}/{subresource}"))
        return verb in self.allowed_verbs

    def kinds(self) -> list[str]:
        return [call[0] for call in self.calls]


def _repository(root: Path) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (root / "pkg" / "sub" / "data.txt").write_text("one\ntwo\n")
    (root / "README").write_text("readme\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    (root / "doc").symlink_to("README")
    return root


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    repository = _repository(tmp_path / "repository")
    archive = tmp_path / "snapshot.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(repository, arcname=".")
    return archive


@pytest.fixture
def pod(tmp_path: Path) -> LocalPod:
    testbed = tmp_path / "testbed"
    testbed.mkdir()
    return LocalPod(testbed)


def _open(
    snapshot: Path, pod: LocalPod, limits: SandboxLimits = LOCAL, **options: Any
) -> PodSandbox:
    return PodSandbox.from_archive(
        snapshot, limits, options=OPTIONS.model_copy(update=options), api=pod.api,
        parent=snapshot.parent,
    )  # fmt: skip


def test_create_wait_copy_run_delete(snapshot: Path, pod: LocalPod, tmp_path: Path) -> None:
    with _open(snapshot, pod) as box:
        # The snapshot arrived as it is on the platform's side.
        store = ObjectStore.create(tmp_path / "check")
        assert scan(store, pod.testbed).tree == scan(store, box.pristine).tree
        result = box.run("echo hello; echo oops >&2; pwd; printenv | sort; exit 3", timeout=10)
        assert not result.ok and result.exit_code == 3 and not result.timed_out
        lines = result.output.splitlines()
        assert lines[:3] == ["hello", "oops", str(pod.testbed)]
        # Exactly the bwrap sandbox's environment, and what the shells add themselves.
        variables = dict(line.split("=", 1) for line in lines[3:])
        assert set(variables) - {"PWD", "OLDPWD", "SHLVL", "_"} == {n for n, _ in bwrap.ENVIRONMENT}
        assert all(variables[name] == value for name, value in bwrap.ENVIRONMENT)
        manifest = pod.manifests[0]
        name = manifest["metadata"]["name"]
        assert box.name == name and name.startswith("aml-sandbox-")
        assert manifest["metadata"]["labels"]["aml/snapshot"] == "snapshot.tar.gz"
        assert manifest["metadata"]["labels"]["aml/owner"] == OPTIONS.owner
        assert manifest["metadata"]["labels"]["app.kubernetes.io/instance"] == name
    assert pod.kinds() == ["create", "read", "read", "exec", "exec", "delete"]
    assert pod.calls[0] == ("create", pods.NAMESPACE, name, None)
    assert pod.calls[-1] == ("delete", pods.NAMESPACE, name, 0)
    # The copy in is a `tar -x`; the command went through the wrapper.
    assert "tar -x" in pod.execs[0][-3]
    assert pod.execs[1] == pods.command_argv(LOCAL, pod.execs[1][-1], 10)
    assert not box.root.exists()


def test_a_command_past_its_time_limit_is_killed_and_timed_out(
    snapshot: Path, pod: LocalPod
) -> None:
    with _open(snapshot, pod) as box:
        result = box.run("echo started; sleep 30", timeout=0.3)
        assert result.timed_out and result.exit_code == TIMED_OUT
        assert result.output == "started\n" and 0.3 <= result.duration_seconds < 5
        # Killed by a signal before its limit is the command's own exit.
        killed = box.run("kill -9 $$", timeout=10)
        assert killed.exit_code == 137 and not killed.timed_out


def _in_thread(run: Callable[[], CommandResult]) -> tuple[threading.Thread, list[Any]]:
    """`run` in a thread of its own; what it returned or the `SandboxFault` it raised."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(run())
        except SandboxFault as fault:
            outcome.append(fault)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def test_an_interrupt_kills_the_running_command_and_refuses_the_next(
    snapshot: Path, pod: LocalPod
) -> None:
    """`interrupt` from another thread, as `Sandbox.interrupt`: the command running now ends
    with what it left in the background, timed out long before its own limit, and no command
    runs after it."""
    box = _open(snapshot, pod)
    # The background sleep holds the exec's output open: the exec ends only once it is dead.
    thread, outcome = _in_thread(
        lambda: box.run("(sleep 31 &); echo started; touch started; sleep 30", timeout=60)
    )
    _wait_for(pod.testbed / "started")
    began = time.monotonic()
    box.interrupt()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - began < 3
    (result,) = outcome
    assert isinstance(result, CommandResult), result
    assert result.timed_out and result.exit_code == TIMED_OUT and result.output == "started\n"
    assert pod.execs[-1] == pods._platform_argv(pods._KILL_LEFTOVERS)
    execs = len(pod.execs)
    with pytest.raises(SandboxFault, match=r"^the sandbox's commands were interrupted$"):
        box.run("echo too late", timeout=10)
    with pytest.raises(SandboxFault, match="interrupted"):
        box.apply("diff --git a/x b/x\n")
    assert box.apply(" \n").ok  # nothing to run, as `Sandbox.apply`
    assert len(pod.execs) == execs
    box.interrupt()
    box.close()
    assert pod.kinds().count("delete") == 1 and not box.root.exists()


def test_an_interrupt_with_nothing_running_only_refuses_commands(
    snapshot: Path, pod: LocalPod
) -> None:
    box = _open(snapshot, pod)
    execs = len(pod.execs)
    box.interrupt()
    box.interrupt()
    with pytest.raises(SandboxFault, match="interrupted"):
        box.run("true", timeout=10)
    assert len(pod.execs) == execs  # no command, and no kill either
    box.close()
    box.interrupt()
    box.close()
    assert pod.kinds().count("delete") == 1


def test_an_attempt_s_end_kills_the_pod_s_command_and_then_deletes_the_pod(
    snapshot: Path, pod: LocalPod
) -> None:
    """`coding_agent.StoppableRunner`, as Solve closes it at the wall limit with the agent's
    thread inside a command: the command is killed, so the pod goes at once, not after the
    command's own limit."""
    box = _open(snapshot, pod)
    assert isinstance(box, Interruptible)
    runner = StoppableRunner(box)
    thread, outcome = _in_thread(lambda: runner.run("touch started; sleep 30", 60.0))
    _wait_for(pod.testbed / "started")
    began = time.monotonic()
    assert runner.close(box.close, wait=10.0)
    assert time.monotonic() - began < 3
    thread.join(5)
    (result,) = outcome
    assert isinstance(result, CommandResult) and result.timed_out
    assert pod.kinds().count("delete") == 1 and not box.root.exists()


def test_output_is_capped_as_the_bwrap_backend_caps_it(snapshot: Path, pod: LocalPod) -> None:
    limits = LOCAL.model_copy(update={"output_bytes": 1000})
    with _open(snapshot, pod, limits) as box:
        result = box.run("head -c 300000 /dev/zero | tr '\\0' a; echo; seq 5", timeout=10)
    expected = OutputCap(1000)
    expected.add(b"a" * 300000 + b"\n1\n2\n3\n4\n5\n")
    assert result.truncated and result.output_bytes == expected.total == 300011
    assert result.output == expected.text()
    assert result.output.endswith("1\n2\n3\n4\n5\n") and "bytes of output dropped" in result.output


def test_a_pod_that_never_runs_is_the_platform_s_and_is_deleted(
    snapshot: Path, pod: LocalPod
) -> None:
    pod.phases = [_pod("Pending", "ErrImagePull")]
    with pytest.raises(SandboxFault, match="not running within") as raised:
        _open(snapshot, pod, start_timeout_seconds=0.3)
    # A pull that keeps failing may recover: the stages retry it (SandboxUnavailable is final).
    assert not isinstance(raised.value, SandboxUnavailable)
    assert "ErrImagePull" in str(raised.value)
    assert pod.kinds().count("delete") == 1 and "exec" not in pod.kinds()
    assert pod.calls[-1][-1] == 0
    assert not list(snapshot.parent.glob("aml-pod-sandbox-*"))


@pytest.mark.parametrize(
    ("phases", "error", "match"),
    [
        ([_pod("Pending", "InvalidImageName")], SandboxUnavailable, "cannot run: InvalidImageName"),
        ([_pod("Failed")], SandboxFault, "ended before it ran"),
    ],
)
def test_a_pod_that_cannot_run_fails_at_once(
    snapshot: Path, pod: LocalPod, phases: list[SimpleNamespace], error: type, match: str
) -> None:
    pod.phases = phases
    with pytest.raises(error, match=match):
        _open(snapshot, pod, start_timeout_seconds=30)
    assert pod.kinds() == ["create", "read", "delete"]


@pytest.mark.parametrize(
    ("status", "message", "final"),
    [
        (403, 'pods is forbidden: User "system:serviceaccount:aml:answerer" cannot create', True),
        (422, "admission webhook denied: a sandbox pod runs under the gvisor RuntimeClass", True),
        (403, "exceeded quota: sandbox-quota, requested: pods=1, used: pods=16", False),
        (500, "etcdserver: request timed out", False),
    ],
)
def test_a_refused_creation_is_the_platform_s(
    snapshot: Path, pod: LocalPod, status: int, message: str, final: bool
) -> None:
    pod.create_error = FakeApiError(status, message)
    with pytest.raises(SandboxFault, match=re.escape(f"{status} {message}")) as raised:
        _open(snapshot, pod)
    assert isinstance(raised.value, SandboxUnavailable) is final
    # A creation that failed on the way back may have made the pod: it is deleted all the same.
    assert pod.kinds() == ["create", "delete"]


def test_a_hostile_snapshot_is_refused_before_any_pod(tmp_path: Path, pod: LocalPod) -> None:
    archive = tmp_path / "hostile.tar"
    with tarfile.open(archive, "w") as tar:
        tar.addfile(tarfile.TarInfo("../escape"))
    with pytest.raises(SandboxFault, match="refused"):
        PodSandbox.from_archive(archive, LOCAL, options=OPTIONS, api=pod.api, parent=tmp_path)
    assert pod.calls == []


def test_close_deletes_once_and_retries_a_failed_deletion(snapshot: Path, pod: LocalPod) -> None:
    box = _open(snapshot, pod)
    pod.delete_errors = [FakeApiError(500, "etcd down")]
    with pytest.raises(SandboxFault, match="was not deleted: 500 etcd down"):
        box.close()
    box.close()
    box.close()
    assert pod.kinds().count("delete") == 2
    second = _open(snapshot, pod)
    pod.delete_errors = [FakeApiError(404, 'pods "x" not found')]
    second.close()
    second.close()
    assert pod.kinds().count("delete") == 3


class _Scripted:
    """An exec stream that says what it is told, then stays open or closes."""

    def __init__(self, frames: list[tuple[int, bytes]], closes: bool) -> None:
        self.frames, self.closes, self.channels = list(frames), closes, {}
        self.open = True

    def is_open(self) -> bool:
        return self.open

    def update(self, timeout: float = 0) -> None:
        if self.frames:
            channel, data = self.frames.pop(0)
            self.channels[channel] = self.channels.get(channel, b"") + data
        elif self.closes:
            self.open = False
        else:
            time.sleep(min(timeout, 0.01))

    def read_channel(self, channel: int, timeout: float = 0) -> bytes:
        return self.channels.pop(channel, b"")

    def write_stdin(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        self.open = False


@pytest.mark.parametrize(
    ("frames", "closes", "match"),
    [
        ([(1, READY + b"done\n")], True, "without the command's exit status"),
        (
            [
                (1, b"sh: 1: /usr/bin/timeout: not found\n"),
                (
                    3,
                    b'{"status": "Failure", '
                    b'"reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", '
                    b'"message": "127"}]}}',
                ),
            ],
            True,
            "did not start .*timeout: not found",
        ),
        (
            [
                (
                    3,
                    b'{"status": "Failure", "reason": "InternalError", "message": "container not '
                    b'found"}',
                )
            ],
            True,
            "the exec failed: container not found",
        ),
        ([(1, READY + b"still here\n")], False, "still running at its deadline"),
        ([(1, READY), (3, b'["not", "a", "status"]')], True, "status is unreadable"),
    ],
    ids=["no-status", "no-ready", "exec-error", "not-killed", "garbled-status"],
)
def test_an_exec_that_misbehaves_is_the_platform_s(
    snapshot: Path,
    pod: LocalPod,
    monkeypatch: pytest.MonkeyPatch,
    frames: list[tuple[int, bytes]],
    closes: bool,
    match: str,
) -> None:
    monkeypatch.setattr(pods, "_KILL_GRACE_SECONDS", 0.05)
    with _open(snapshot, pod) as box:
        pod.stream = lambda argv, stdin: _Scripted(frames, closes)
        with pytest.raises(SandboxFault, match=match):
            box.run("true", timeout=0.05)


_KILLED = (
    b'{"status": "Failure", "reason": "NonZeroExitCode", '
    b'"details": {"causes": [{"reason": "ExitCode", "message": "137"}]}}'
)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ([(1, b"sh: starting\n")], [(3, _KILLED)], "interrupted before its command started"),
        # The runtime's status for a killed exec is not the command's to judge.
        ([(1, READY + b"working\n")], [], "timed out"),
        ([(1, READY + b"working\n")], None, "still running after its kill"),
    ],
    ids=["before-ready", "no-status", "not-killed"],
)
def test_how_an_interrupted_exec_ends(
    snapshot: Path,
    pod: LocalPod,
    monkeypatch: pytest.MonkeyPatch,
    before: list[tuple[int, bytes]],
    after: list[tuple[int, bytes]] | None,
    expected: str,
) -> None:
    """As in `Sandbox.run`: cut before its READY, a command is no result of the agent's; cut
    after it, it is timed out, whatever the exec's end says; one the kill does not end is the
    pod's fault."""
    monkeypatch.setattr(pods, "_KILL_GRACE_SECONDS", 0.2)
    command = _Scripted(before, closes=False)

    def stream(argv: list[str], stdin: bool) -> _Scripted:
        if pods._KILL_LEFTOVERS not in argv:
            return command
        if after is not None:
            command.frames, command.closes = list(after), True
        return _Scripted([(3, b'{"status": "Success"}')], True)

    with _open(snapshot, pod) as box:
        pod.stream = stream
        thread, outcome = _in_thread(lambda: box.run("true", timeout=10))
        time.sleep(0.05)
        box.interrupt()
        thread.join(5)
        (result,) = outcome
        if expected == "timed out":
            assert isinstance(result, CommandResult), result
            assert result.timed_out and result.exit_code == TIMED_OUT
            assert result.output == "working\n"
        else:
            assert isinstance(result, SandboxFault) and expected in str(result), result


@needs_git
def test_patch_is_what_the_bwrap_backend_would_diff_and_applies_in_a_fresh_pod(
    snapshot: Path, tmp_path: Path
) -> None:
    first = LocalPod(tmp_path / "first")
    first.testbed.mkdir()
    with _open(snapshot, first) as box:
        change = box.run(
            "set -e; echo '    # more' >> pkg/mod.py; rm README; mkdir -p new/deep; "
            "printf '\\377\\376bin' > new/deep/blob.dat; ln -s /etc/hostname host; "
            "chmod -x run.sh; mkdir -p .git pkg/.git; echo junk > .git/config; "
            "echo junk > pkg/.git/HEAD; mkfifo pipe; printf 'é\\n' > 'ünï cödé.txt'; "
            "chmod 000 pkg/sub",
            timeout=10,
        )
        assert change.ok, change.output
        patch = box.patch()
        # What `Sandbox.patch` computes: both trees hashed on this side (`scan`), diffed by git.
        store = ObjectStore.create(tmp_path / "expected")
        expected = unified_diff(store, scan(store, box.pristine), scan(store, first.testbed))
        assert patch == expected
        assert "GIT binary patch" in patch and "deleted file mode 100644" in patch
        assert ".git" not in patch and "pipe" not in patch and "host" in patch
        assert box.patch() == patch
    second = LocalPod(tmp_path / "second")
    second.testbed.mkdir()
    with _open(snapshot, second) as fresh:
        applied = fresh.apply(patch)
        assert applied.ok, applied.output
        execs = len(second.execs)
        assert fresh.apply("   \n").ok and len(second.execs) == execs  # nothing to run
        assert fresh.patch() == patch
        rejected = fresh.apply(
            "diff --git a/nope b/nope\n--- a/nope\n+++ b/nope\n@@ -1 +1 @@\n-x\n+y\n"
        )
        assert not rejected.ok and "nope" in rejected.output


@pytest.mark.parametrize(
    ("command", "match"),
    [
        ("touch a b c d", "more than 8 files"),
        ("head -c 5000 /dev/zero > big", "more than 8 files or 4096 bytes"),
        # Past what any tar of an admissible working copy needs: the copy out stops there.
        ("head -c 200000 /dev/zero > huge", "archive is over"),
    ],
)
def test_patch_refuses_a_working_copy_past_the_limits(
    snapshot: Path, pod: LocalPod, command: str, match: str
) -> None:
    limits = LOCAL.model_copy(update={"working_copy_files": 8, "working_copy_bytes": 4096})
    with _open(snapshot, pod, limits) as box:
        assert box.patch() == ""
        assert box.run(command, timeout=10).ok
        with pytest.raises(WorkingCopyRejected, match=match):
            box.patch()


def test_the_probe_dry_runs_a_pod_and_asks_for_exec(tmp_path: Path) -> None:
    pod = LocalPod(tmp_path)
    require_pod_sandbox(OPTIONS, pod.api)
    (create, *reviews) = pod.calls
    assert create[0] == "create" and create[-1] == "All" and create[2].startswith("aml-sandbox-")
    assert reviews == [("review", pods.NAMESPACE, verb, "pods/exec") for verb in ("create", "get")]
    pod.create_error = FakeApiError(403, "exceeded quota: sandbox-quota")
    require_pod_sandbox(OPTIONS, pod.api)
    pod.create_error = FakeApiError(404, 'namespaces "aml-sandbox" not found')
    with pytest.raises(SandboxUnavailable, match="cannot create sandbox pods"):
        require_pod_sandbox(OPTIONS, pod.api)
    pod.create_error, pod.allowed_verbs = None, {"create"}
    with pytest.raises(SandboxUnavailable, match="may not get pods/exec"):
        require_pod_sandbox(OPTIONS, pod.api)


def test_the_backend_is_chosen_by_name(snapshot: Path, pod: LocalPod) -> None:
    assert workspace_opener() == Sandbox.from_archive
    assert workspace_opener("bwrap") == Sandbox.from_archive
    assert sandbox_probe("bwrap") is require_sandbox
    for name, options in (("kubernetes", None), ("docker", OPTIONS)):
        with pytest.raises(ValueError):
            workspace_opener(name, pod_options=options)
        with pytest.raises(ValueError):
            sandbox_probe(name, pod_options=options)
    opener = workspace_opener("kubernetes", pod_options=OPTIONS, api=lambda: pod.api)
    with opener(snapshot, LOCAL) as box:
        assert isinstance(box, PodSandbox) and box.run("true", timeout=10).ok
    sandbox_probe("kubernetes", pod_options=OPTIONS, api=lambda: pod.api)()
    assert pod.calls[-1][0] == "review"


def test_the_services_settings_choose_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """AML_SANDBOX_BACKEND as the answerer and the scorer read it (`coding_track.coding_sandbox`);
    the kubernetes backend refuses to start without the image its pods run."""
    monkeypatch.setenv("AML_SANDBOX_BACKEND", "kubernetes")
    with pytest.raises(ValidationError, match="AML_SANDBOX_IMAGE"):
        ScorerSettings()
    monkeypatch.setenv("AML_SANDBOX_IMAGE", "registry.example.org/aml/aml-coding:1")
    monkeypatch.setenv("AML_SANDBOX_NAMESPACE", "sandboxes")
    settings = AnswererSettings()
    opener, check = coding_sandbox(settings, lifetime_seconds=1234.0)
    assert opener is not Sandbox.from_archive and check.probe is not require_sandbox
    # The pod options come from the settings; the client is made at first use, not here.
    options = inspect.getclosurevars(opener).nonlocals["options"]
    assert (options.image, options.namespace, options.lifetime_seconds) == (
        "registry.example.org/aml/aml-coding:1",
        "sandboxes",
        1234.0,
    )
    monkeypatch.setenv("AML_SANDBOX_BACKEND", "bwrap")
    opener, check = coding_sandbox(AnswererSettings(), lifetime_seconds=1.0)
    assert opener == Sandbox.from_archive and check.probe is require_sandbox
    monkeypatch.setenv("AML_SANDBOX_BACKEND", "docker")
    with pytest.raises(ValidationError, match="sandbox_backend"):
        AnswererSettings()


# --- the real wrapper, and the real client -----------------------------------------------------


def test_the_command_wrapper_under_a_pid_namespace(tmp_path: Path) -> None:
    """The wrapper as the pod runs it, in a pid namespace of bwrap's whose PID 1 waits and reaps
    as the pod's does: its exit codes, its kill at the limit, and nothing left running."""
    try:
        require_sandbox()
    except SandboxUnavailable as unavailable:
        pytest.skip(str(unavailable))
    testbed = tmp_path / "testbed"
    testbed.mkdir()
    harness = (
        '"$@"; echo "[exit $?]"; sleep 0.1 & wait; '
        'for p in /proc/[0-9]*; do read -r c < "$p/comm" && echo "[left $c]"; done'
    )

    def run(command: str, seconds: float) -> str:
        argv = [
            a.replace(bwrap.REPO, str(testbed)) for a in pods.command_argv(LOCAL, command, seconds)
        ]
        line = ["bwrap", "--unshare-pid", "--unshare-net", "--die-with-parent",
                "--ro-bind", "/", "/", "--bind", str(testbed), str(testbed),
                "--proc", "/proc", "--dev", "/dev",
                "--as-pid-1", "--", "/bin/sh", "-c", harness, "sh", *argv]  # fmt: skip
        done = subprocess.run(line, capture_output=True, timeout=30)
        assert done.stderr == b"", done.stderr
        return done.stdout.decode().replace(READY.decode(), "<READY>")

    assert run("echo hi; exit 4", 5) == "<READY>hi\n[exit 4]\n[left sh]\n"
    assert run("echo slow; sleep 30", 0.2) == "<READY>slow\n[exit 137]\n[left sh]\n"
    left = run("setsid sleep 30 >/dev/null 2>&1 & nohup sleep 30 >/dev/null 2>&1 & echo bg", 5)
    assert left == "<READY>bg\n[exit 0]\n[left sh]\n"


def test_the_manifest_survives_the_client_s_pod_model() -> None:
    kubernetes = pytest.importorskip("kubernetes")
    manifest = _manifest()
    model = kubernetes.client.V1Pod.from_dict(manifest)
    assert kubernetes.client.ApiClient().sanitize_for_serialization(model) == manifest


def test_the_client_execs_over_a_websocket_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("kubernetes")
    from kubernetes.config import kube_config
    from kubernetes.stream import ws_client

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "secret-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))  # fmt: skip
    # The client reads $KUBECONFIG when it is imported; this is where it keeps it.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    opened: list[tuple[str, dict[str, str]]] = []

    class Socket:
        connected = True
        subprotocol = ws_client.V5_CHANNEL_PROTOCOL

        def getheaders(self) -> dict[str, str]:
            return {}

    def create_websocket(configuration: Any, url: str, headers: Any = None) -> Socket:
        opened.append((url, dict(headers or {})))
        return Socket()

    monkeypatch.setattr(ws_client, "create_websocket", create_websocket)
    api = pods.kubernetes_api()
    rest_transport = api.core.api_client.call_api
    stream = api.open_exec("aml-sandbox-1", pods.NAMESPACE, ["echo", "hi there"], True)
    ((url, headers),) = opened
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc) == ("wss", "127.0.0.1:6443")
    assert parts.path == f"/api/v1/namespaces/{pods.NAMESPACE}/pods/aml-sandbox-1/exec"
    query = parse_qs(parts.query)
    assert query["command"] == ["echo", "hi there"] and query["container"] == [pods.CONTAINER]
    assert query["stdin"] == query["stdout"] == query["stderr"] == ["true"]
    assert query["tty"] == ["false"] and headers["authorization"] == "Bearer secret-token"
    assert stream.binary is True
    # No copy of the output kept, and the REST client untouched by stream()'s transport swap.
    assert isinstance(stream._all, ws_client._IgnoredIO)
    assert api.core.api_client.call_api == rest_transport
