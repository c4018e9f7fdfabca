"""The sandbox's Kubernetes backend: one pod per sandbox in the namespace `aml-sandbox`
(deploy/k8s/sandbox), under gVisor, without network or service-account token, bounded and with a
deadline; the commands are exec'd into it.

`PodSandbox` has `Sandbox`'s methods and meaning, and reuses its parts:
- the snapshot is checked and unpacked on the platform's side first (`extract_snapshot`), so a
  hostile archive is refused before any pod exists; the pristine copy stays there and its tree is
  the baseline `patch()` diffs against (`gitdiff.scan`), as in the bwrap backend;
- the pod gets the checked copy as a plain tar on the stdin of `tar -x` in /testbed;
- a command runs as the bwrap backend's runs inside its namespaces (`bwrap.argv`'s tail: `nice`,
  `prlimit` with the `SandboxLimits`, the READY handshake, `cd /testbed`, `bash -c`), with exactly
  `bwrap.ENVIRONMENT`, under `timeout -s KILL`; afterwards every process the command left behind
  is killed (`kill -1`: everything of the sandbox's uid but the pod's PID 1), so no process
  outlives its command, as no process outlives a bwrap pid namespace. Its output is kept as the
  bwrap backend keeps it (`process.OutputCap`);
- `interrupt()` is `Sandbox.interrupt`: the command running is cut short (the same `kill -1`,
  exec'd separately) and returned as timed out, and later commands are refused;
- `patch()` reads the working copy back as a tar stream and hashes it into the same private
  object store; nothing of it is unpacked on the platform's side;
- `apply(patch)` hands the patch to `git apply` on stdin, as a command within the limits.

Whose failure: the pod not admitted, not running within its start timeout, an API or exec error,
a command not killed by its deadline raise `SandboxFault` (`SandboxUnavailable` where no retry
can help: no API configuration, refused by RBAC or admission, an image that cannot be named); a
command's own exit, timeout or output is a `CommandResult`, a working copy past the limits is
`WorkingCopyRejected`.

A command's processes die with it: PID 1 of the pod is a shell that reaps (`_PID1`), so what
the kill leaves as zombies does not count against the next commands' process limit.

The `kubernetes` package is imported only when a backend is made (`kubernetes_api`): the runner's
logic only needs the few calls of `PodApi`. It has been checked statically and against a fake
of that surface (tests/unit/test_sandbox_pods.py), not against a live cluster.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import re
import secrets
import socket
import tarfile
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from pydantic import BaseModel, ConfigDict, Field

from . import bwrap
from .gitdiff import (
    _EXECUTABLE,
    _FILE,
    _PATH_MAX,
    _SYMLINK,
    Entries,
    ObjectStore,
    TreeScan,
    _is_utf8,
    _write_trees,
    scan,
    unified_diff,
)
from .model import (
    GIB,
    MIB,
    TIMED_OUT,
    ClosedOnExit,
    CommandResult,
    SandboxFault,
    SandboxLimits,
    SandboxUnavailable,
    WorkingCopyRejected,
)
from .process import OutputCap, _Reader
from .sandbox import Sandbox, _coreutils, _restore_owner_access, require_sandbox
from .snapshot import extract_snapshot, normalised

NAMESPACE = "aml-sandbox"
# What deploy/k8s/sandbox/sandbox.yaml's admission policy demands of every pod there.
RUNTIME_CLASS = "gvisor"
SERVICE_ACCOUNT = "sandbox"
CONTAINER = "sandbox"
# The coding image's own user (Dockerfile: `useradd --uid 10001`): a name in its /etc/passwd,
# which `whoami`, getpass and git want.
SANDBOX_UID = 10001
TMP = "/tmp"
BACKENDS = ("bwrap", "kubernetes")
# The Kubernetes labels of every sandbox pod; `instance` names the sandbox, `aml/owner` the
# process that made it (a worker pod's name), `aml/snapshot` the archive it holds.
BASE_LABELS: Mapping[str, str] = {
    "app.kubernetes.io/name": "sandbox",
    "app.kubernetes.io/part-of": "aml",
    "app.kubernetes.io/component": "attempt",
}

# Container logs: the pod writes none, but the kubelet counts them against ephemeral storage.
_LOG_BYTES = 64 * MIB
# A command's READY must arrive this soon: the exec round trip plus gVisor starting `sh`.
_START_SECONDS = 30.0
# `timeout -s KILL` ends a command at its limit; its output ends and the exec closes moments
# later. Past this grace the pod (or the API between) is at fault, not the command.
_KILL_GRACE_SECONDS = 10.0
_REST_TIMEOUT_SECONDS = 30.0
# An exec's loop sees an interrupt between two waits for its frames, so a quiet command's is
# seen this late at most.
_WAKE_SECONDS = 0.2
_STDIN_CHUNK = 256 * 1024
_POLL_MAX_SECONDS = 2.0
_MESSAGE_BYTES = 4096
# A tar stream's own bytes around the files' (headers, GNU long names, padding): generous per
# file, so that only a working copy already past the limits can exceed the bound.
_TAR_BYTES_PER_FILE = 8 * 1024
_STDOUT, _STDERR, _ERROR = 1, 2, 3
# Waiting reasons no retry changes: the pod as asked for cannot run.
_UNRUNNABLE = frozenset({"InvalidImageName", "CreateContainerConfigError", "ErrImageNeverPull"})
# HTTP answers to a pod's creation that say it will never be allowed (RBAC, a missing
# namespace, the admission policy or Pod Security refusing the manifest).
_REFUSED = frozenset({401, 403, 404, 422})
_PLATFORM_ENVIRONMENT = ("PATH=/usr/bin:/bin", "LC_ALL=C")
# Every process of the sandbox's uid but PID 1 and the caller: what a command left running (in
# the background, setsid'd) would otherwise outlive it, change later commands' files and keep the
# exec open. A pass can miss a child forked while it runs, hence a few; a pass that finds only
# zombies (not reaped yet) still counts as one.
_KILL_LEFTOVERS = "for pass in 1 2 3 4 5 6 7 8; do kill -s KILL -- -1 2>/dev/null || break; done"
# Runs the sandboxed tail (bwrap.argv's) under `timeout`, then kills what it left. The subshell
# keeps the shell's own "Killed" note out of the command's output.
_WRAPPER = (
    'exec 2>/dev/null; limit=$1; shift; (/usr/bin/timeout -s KILL "$limit" "$@") 2>&1; '
    f'status=$?; {_KILL_LEFTOVERS}; exit "$status"'
)
# The pod's PID 1: a long sleep, restarted when a command's kill(-1) ends it, in a shell that
# reaps what is reparented to it. A bare `sleep` reaps nothing: every process a command left
# behind would stay a zombie, and zombies count against the next commands' RLIMIT_NPROC.
_PID1 = "while :; do /bin/sleep 3600 & wait; done"
_COPY_IN = f'/usr/bin/head -c "$1" | /usr/bin/tar -x -f - -C {bwrap.REPO} --no-same-owner'
# The agent may have chmod'ed its files unreadable: they are its uid's, so it can be undone, as
# the bwrap backend restores access before it diffs. `.git` is never part of the diff.
_COPY_OUT = (
    f"{_KILL_LEFTOVERS}; "
    f"/usr/bin/chmod -R u+rwX {bwrap.REPO} 2>/dev/null; "
    f"cd {bwrap.REPO} && exec /usr/bin/tar -c -f - --exclude=.git ."
)


class PodOptions(BaseModel):
    """What a sandbox pod is made of beyond its `SandboxLimits`."""

    model_config = ConfigDict(frozen=True)

    # The coding image (Dockerfile target `coding`: bash, git, /usr/bin/python3), as the nodes
    # pull it; the same image the answerer and the scorer run.
    image: str = Field(min_length=1)
    namespace: str = Field(default=NAMESPACE, min_length=1)
    cpu: str = "1"
    cpu_request: str = "250m"
    # At least one process's address space (`SandboxLimits.address_space_bytes`) is granted
    # whatever this says.
    memory_bytes: int = Field(default=2 * GIB, gt=0)
    memory_request_bytes: int = Field(default=512 * MIB, gt=0)
    storage_request_bytes: int = Field(default=512 * MIB, gt=0)
    # The working copy's volume: the snapshot, what the agent writes, build and test artefacts.
    testbed_bytes: int = Field(default=4 * GIB, gt=0)
    # How long one sandbox is used: an attempt's wall clock (`AML_CODING_WALL_SECONDS`) or the
    # verify step's test time, with room for their last command. The pod's deadline adds the
    # start and the two copies to it.
    lifetime_seconds: float = Field(default=3600.0, gt=0)
    # A fresh node may have to pull the image first.
    start_timeout_seconds: float = Field(default=120.0, gt=0)
    # Copying the snapshot in, and the working copy out for the patch.
    transfer_timeout_seconds: float = Field(default=300.0, gt=0)
    # Labels the pods with who made them (`aml/owner`), so that an operator can find and delete
    # what a crashed worker left (the deadline ends them anyway).
    owner: str = Field(default_factory=socket.gethostname)


def pod_deadline_seconds(limits: SandboxLimits, options: PodOptions) -> int:
    """`spec.activeDeadlineSeconds`: the start, both copies and the sandbox's use (at least one
    command's wall time)."""
    use = max(options.lifetime_seconds, limits.wall_seconds + _KILL_GRACE_SECONDS)
    return math.ceil(options.start_timeout_seconds + 2 * options.transfer_timeout_seconds + use)


def _quantity(size: int) -> str:
    for unit, suffix in ((GIB, "Gi"), (MIB, "Mi"), (1024, "Ki")):
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def label_value(text: str) -> str:
    """`text` as a Kubernetes label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both
    ends ("unknown" when nothing is left)."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63].strip("-._")
    return value or "unknown"


def sandbox_pod_manifest(
    name: str,
    limits: SandboxLimits,
    options: PodOptions,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The pod of one sandbox: a container that only waits (commands are exec'd into it), with
    its working copy and /tmp on `emptyDir`s, and everything the namespace's admission policy,
    Pod Security `restricted` and LimitRange demand."""
    deadline = pod_deadline_seconds(limits, options)
    memory = max(options.memory_bytes, limits.address_space_bytes)
    storage = options.testbed_bytes + limits.tmp_bytes + _LOG_BYTES
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": {**BASE_LABELS, **(labels or {})},
        },
        "spec": {
            "runtimeClassName": RUNTIME_CLASS,
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
            "activeDeadlineSeconds": deadline,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            # No environment: not even the Service variables Kubernetes would add.
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": SANDBOX_UID,
                "runAsGroup": SANDBOX_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": CONTAINER,
                    "image": options.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/bin/sh", "-c", _PID1],
                    "workingDir": bwrap.REPO,
                    "resources": {
                        "requests": {
                            "cpu": options.cpu_request,
                            "memory": _quantity(options.memory_request_bytes),
                            "ephemeral-storage": _quantity(options.storage_request_bytes),
                        },
                        "limits": {
                            "cpu": options.cpu,
                            "memory": _quantity(memory),
                            "ephemeral-storage": _quantity(storage),
                        },
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "privileged": False,
                        "readOnlyRootFilesystem": True,
                        "runAsNonRoot": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [
                        {"name": "testbed", "mountPath": bwrap.REPO},
                        {"name": "tmp", "mountPath": TMP},
                    ],
                }
            ],
            "volumes": [
                {"name": "testbed", "emptyDir": {"sizeLimit": _quantity(options.testbed_bytes)}},
                {"name": "tmp", "emptyDir": {"sizeLimit": _quantity(limits.tmp_bytes)}},
            ],
        },
    }


# --- the API surface ---------------------------------------------------------------------------


class CoreApi(Protocol):
    """What the runner calls of `kubernetes.client.CoreV1Api` (REST only)."""

    def create_namespaced_pod(self, namespace: str, body: Any, **kwargs: Any) -> Any: ...

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any: ...

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any: ...


class ExecStream(Protocol):
    """What the runner uses of an exec's `kubernetes.stream.ws_client.WSClient` (binary)."""

    def is_open(self) -> bool: ...

    def update(self, timeout: float = 0) -> None: ...

    def read_channel(self, channel: int, timeout: float = 0) -> bytes: ...

    def write_stdin(self, data: bytes) -> None: ...

    def close(self) -> None: ...


# (pod, namespace, argv, with stdin) -> the exec's stream.
OpenExec = Callable[[str, str, list[str], bool], ExecStream]
# (namespace, verb, resource, subresource) -> whether this process's account may.
Allowed = Callable[[str, str, str, str], bool]


@dataclass(frozen=True)
class PodApi:
    core: CoreApi
    open_exec: OpenExec
    allowed: Allowed


def kubernetes_api() -> PodApi:
    """The cluster's API with the pod's ServiceAccount token (in a pod), else the kubeconfig's
    current context. Raises `SandboxUnavailable` when there is neither."""
    try:
        k8s = importlib.import_module("kubernetes.client")
        k8s_config = importlib.import_module("kubernetes.config")
        k8s_stream = importlib.import_module("kubernetes.stream")
        ws_client = importlib.import_module("kubernetes.stream.ws_client")
    except ImportError as error:
        raise SandboxUnavailable(
            f"the kubernetes sandbox backend needs the kubernetes package: {error}"
        ) from error
    configuration = k8s.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except Exception:
        try:
            k8s_config.load_kube_config(client_configuration=configuration, persist_config=False)
        except Exception as error:
            raise SandboxUnavailable(
                "the kubernetes sandbox backend found no API access: no ServiceAccount token "
                f"(in a pod) and no usable kubeconfig ({error})"
            ) from error
    rest = k8s.ApiClient(configuration)

    def open_exec(name: str, namespace: str, command: list[str], stdin: bool) -> ExecStream:
        # stream() swaps the transport of the ApiClient it is given while it connects, so a
        # REST call from another thread on a shared client would go out as a WebSocket: each
        # exec gets a client of its own (kubernetes-client/python#928).
        with k8s.ApiClient(configuration) as own:
            stream: Any = k8s_stream.stream(
                k8s.CoreV1Api(own).connect_get_namespaced_pod_exec,
                name,
                namespace,
                command=command,
                container=CONTAINER,
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                binary=True,
                _preload_content=False,
            )
        # stream() cannot pass websocket_call's capture_all=False, so the client would keep a
        # copy of all output for the exec's lifetime; the runner caps what it keeps itself.
        stream._all = ws_client._IgnoredIO()
        return stream  # type: ignore[no-any-return]

    def allowed(namespace: str, verb: str, resource: str, subresource: str) -> bool:
        review = k8s.AuthorizationV1Api(rest).create_self_subject_access_review(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "namespace": namespace,
                        "verb": verb,
                        "resource": resource,
                        "subresource": subresource,
                    }
                },
            },
            _request_timeout=_REST_TIMEOUT_SECONDS,
        )
        return bool(review.status.allowed)

    return PodApi(core=k8s.CoreV1Api(rest), open_exec=open_exec, allowed=allowed)


def _api_message(error: BaseException) -> str:
    """One line of an API error: its HTTP status and the Status object's message."""
    status = getattr(error, "status", None)
    message = ""
    body = getattr(error, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = str(json.loads(body).get("message") or "")
    message = message or str(getattr(error, "reason", "") or error) or type(error).__name__
    line = " ".join(message.split())
    return f"{status} {line}" if status else line


def _refused(error: BaseException) -> bool:
    """Whether a pod's creation was refused for good (not a full quota: pods still end)."""
    status = getattr(error, "status", None)
    return status in _REFUSED and "exceeded quota" not in _api_message(error)


def _exit_code(status: bytes) -> int:
    """The exit code in an exec's final Status (its error channel)."""
    if not status.strip():
        raise SandboxFault("the exec ended without the command's exit status")
    try:
        document = json.loads(status)
        if document.get("status") == "Success":
            return 0
        if document.get("reason") == "NonZeroExitCode":
            for cause in (document.get("details") or {}).get("causes") or []:
                if cause.get("reason") == "ExitCode":
                    return int(cause["message"])
        reason = document.get("message") or document
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise SandboxFault(f"the exec's status is unreadable: {status[:200]!r}") from error
    raise SandboxFault(f"the exec failed: {reason}")


# --- the runner --------------------------------------------------------------------------------


def _sandboxed_tail(limits: SandboxLimits, command: str) -> list[str]:
    """What a bwrap sandbox runs inside its namespaces (`bwrap.argv` after its `--`): `nice`,
    `prlimit` with the limits, and the READY handshake entering /testbed and running `command`
    with `bash -c`. Taken from bwrap.argv itself, so both backends bound a command alike."""
    layout = bwrap.Layout(
        working_copy=Path(bwrap.REPO),
        etc=Path("/etc"),
        inbox=Path(bwrap.INBOX),
        empty=Path("/"),
        system=(),
    )
    line = bwrap.argv("bwrap", layout, limits, command)
    tail = line[line.index("--") + 1 :]
    if tail[:1] != ["/usr/bin/nice"] or tail[-1] != command:
        raise SandboxFault(f"bwrap.argv's command tail is not as expected: {tail[:4]}")
    return tail


def command_argv(limits: SandboxLimits, command: str, seconds: float) -> list[str]:
    """The exec's argv running `command` in the pod: `bwrap.ENVIRONMENT` only, the sandboxed
    tail under `timeout -s KILL`, and nothing left running afterwards (`_WRAPPER`)."""
    environment = [f"{name}={value}" for name, value in bwrap.ENVIRONMENT]
    return [
        "/usr/bin/env", "-i", *environment,
        "/bin/sh", "-c", _WRAPPER, "sh", f"{seconds:.3f}",
        *_sandboxed_tail(limits, command),
    ]  # fmt: skip


def _platform_argv(script: str, *args: str) -> list[str]:
    return ["/usr/bin/env", "-i", *_PLATFORM_ENVIRONMENT, "/bin/sh", "-c", script, "sh", *args]


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as file:
        while chunk := file.read(_STDIN_CHUNK):
            yield chunk


def _anonymous(member: tarfile.TarInfo) -> tarfile.TarInfo:
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


def _pack(pristine: Path, target: Path) -> int:
    """The pristine copy as a plain GNU tar (names as raw bytes); its size. Its entries are the
    root's children: `tar -x` into /testbed, a mount the pod's user does not own, must not try
    to set the root's mode."""
    with tarfile.open(
        target, "w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as tar:
        for name in sorted(os.listdir(pristine)):
            tar.add(pristine / name, arcname=name, filter=_anonymous)
    return target.stat().st_size


def _tree_of_tar(store: ObjectStore, archive: Path, limits: SandboxLimits) -> TreeScan:
    """What `gitdiff.scan` makes of a working copy, from its tar (`_COPY_OUT`): files with their
    executable bit, symlinks as links, `.git` and special files left out, the same limits."""
    longest = _PATH_MAX - 1 - len(bwrap.REPO) - 1
    entries: Entries = {}
    sizes: dict[bytes, int] = {}
    not_utf8: set[str] = set()
    total = 0
    with tarfile.open(archive, "r:", encoding="utf-8", errors="surrogateescape") as tar:
        for member in tar:
            parts = normalised(member.name)
            if not parts or ".git" in parts:
                continue
            if member.name.startswith("/") or ".." in parts:
                raise SandboxFault(f"the pod's tar wrote a name outside /testbed: {member.name!r}")
            path = "/".join(parts).encode("utf-8", "surrogateescape")
            if len(path) > longest:
                raise WorkingCopyRejected(
                    f"a path in the working copy is longer than {longest} bytes"
                )
            if member.isreg():
                size, data = member.size, None
            elif member.issym():
                data = member.linkname.encode("utf-8", "surrogateescape")
                size = len(data)
            elif member.islnk():
                linked = "/".join(normalised(member.linkname)).encode("utf-8", "surrogateescape")
                if linked not in entries:
                    continue  # a link to a file left out (in .git)
                size = sizes[linked]
            else:
                continue  # directories are implied; FIFOs and devices are no content
            total += size
            if len(entries) >= limits.working_copy_files or total > limits.working_copy_bytes:
                raise WorkingCopyRejected(
                    f"the working copy holds more than {limits.working_copy_files} files or "
                    f"{limits.working_copy_bytes} bytes"
                )
            sizes[path] = size
            if member.islnk():
                entries[path] = entries[linked]
                continue
            if data is None:
                source = tar.extractfile(member)
                if source is None:
                    raise SandboxFault(f"the working copy's tar lost {member.name!r}")
                data = source.read()
                mode = _EXECUTABLE if member.mode & 0o100 else _FILE
            else:
                mode = _SYMLINK
            oid = store.write(b"blob", data)
            entries[path] = (mode, oid)
            if not _is_utf8(data):
                not_utf8.add(oid)
    return TreeScan(_write_trees(store, entries), entries, frozenset(not_utf8))


class PodSandbox(ClosedOnExit):
    """One snapshot's sandbox pod. Synchronous like `Sandbox` (one thread at a time runs its
    commands; `interrupt` and `close` may come from another). Use as a context manager: the pod
    is deleted on exit, whatever happened."""

    def __init__(
        self, api: PodApi, name: str, limits: SandboxLimits, options: PodOptions, root: Path
    ) -> None:
        self.api = api
        self.name = name
        self.limits = limits
        self.options = options
        self.namespace = options.namespace
        # On the platform's side: the pristine copy and the object store `patch()` diffs in.
        self.root = root
        self.pristine = root / "pristine"
        self._store = ObjectStore(root / "git")
        self._snapshot: TreeScan | None = None
        self._lock = threading.Lock()
        # Set before the creation is asked for: a pod may exist although its creation failed
        # on the way back (a timeout), and is deleted all the same.
        self._requested = False
        self._deleted = False
        # Not `_lock`: an interrupt must not wait behind a `close` deleting the pod.
        self._interrupted = threading.Event()

    @classmethod
    def from_archive(
        cls,
        archive: Path,
        limits: SandboxLimits | None = None,
        *,
        options: PodOptions,
        api: PodApi,
        parent: Path | None = None,
    ) -> PodSandbox:
        """A new pod whose /testbed holds the snapshot in `archive` (tar, tar.gz, ...), running.
        `parent` (default: the system's temporary directory) holds the platform's side."""
        limits = limits or SandboxLimits()
        try:
            root = Path(tempfile.mkdtemp(prefix="aml-pod-sandbox-", dir=parent))
        except OSError as error:
            raise SandboxFault(f"no sandbox directory could be made: {error}") from error
        sandbox = cls(api, f"aml-sandbox-{secrets.token_hex(6)}", limits, options, root)
        try:
            packed = sandbox._prepare(archive)
            sandbox._start(archive)
            sandbox._copy_in(packed)
        except BaseException:
            with contextlib.suppress(SandboxFault):
                sandbox.close()
            raise
        return sandbox

    def _prepare(self, archive: Path) -> Path:
        self.pristine.mkdir(mode=0o700)
        extract_snapshot(archive, self.pristine)
        packed = self.root / "snapshot.tar"
        try:
            ObjectStore.create(self._store.git_dir)
            _pack(self.pristine, packed)
        except (OSError, tarfile.TarError, zlib.error) as error:
            raise SandboxFault(f"the snapshot could not be packed for its pod: {error}") from error
        return packed

    def _start(self, archive: Path) -> None:
        labels = {
            "app.kubernetes.io/instance": self.name,
            "aml/owner": label_value(self.options.owner),
            "aml/snapshot": label_value(archive.name),
        }
        manifest = sandbox_pod_manifest(self.name, self.limits, self.options, labels)
        self._requested = True
        try:
            self.api.core.create_namespaced_pod(
                self.namespace, manifest, _request_timeout=_REST_TIMEOUT_SECONDS
            )
        except Exception as error:
            where = f"sandbox pod {self.namespace}/{self.name} was not created"
            if _refused(error):
                raise SandboxUnavailable(f"{where}: {_api_message(error)}") from error
            raise SandboxFault(f"{where}: {_api_message(error)}") from error
        self._wait_running()

    def _wait_running(self) -> None:
        timeout = self.options.start_timeout_seconds
        deadline = time.monotonic() + timeout
        delay = 0.1
        seen = "no status yet"
        while True:
            try:
                pod = self.api.core.read_namespaced_pod(
                    self.name, self.namespace, _request_timeout=_REST_TIMEOUT_SECONDS
                )
            except Exception as error:
                raise SandboxFault(
                    f"sandbox pod {self.name} could not be read: {_api_message(error)}"
                ) from error
            status = getattr(pod, "status", None)
            phase = getattr(status, "phase", None)
            if phase == "Running":
                return
            waiting = None
            for container in getattr(status, "container_statuses", None) or []:
                state = getattr(container, "state", None)
                waiting = getattr(getattr(state, "waiting", None), "reason", None) or waiting
            seen = f"phase {phase}" + (f", {waiting}" if waiting else "")
            if phase in ("Succeeded", "Failed"):
                reason = getattr(status, "reason", None) or getattr(status, "message", None)
                raise SandboxFault(f"sandbox pod {self.name} ended before it ran: {reason}")
            if waiting in _UNRUNNABLE:
                raise SandboxUnavailable(f"sandbox pod {self.name} cannot run: {waiting}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxFault(
                    f"sandbox pod {self.name} was not running within {timeout:g} s ({seen})"
                )
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _POLL_MAX_SECONDS)

    def _exec(
        self,
        argv: list[str],
        *,
        stdin: Iterable[bytes] | None,
        stdout: Callable[[bytes], None],
        stderr: Callable[[bytes], None],
        deadline: Callable[[], float],
        what: str,
        interrupt: threading.Event | None = None,
    ) -> int:
        """Runs `argv` in the pod until it exits; its exit code. Raises `SandboxFault` when the
        exec fails or is still open at `deadline()` (asked again after each read). Once
        `interrupt` is set, what runs in the pod is killed (`_kill_commands`), and the exec must
        end within `_KILL_GRACE_SECONDS` of that."""
        try:
            stream = self.api.open_exec(self.name, self.namespace, argv, stdin is not None)
        except Exception as error:
            raise SandboxFault(f"{what}: the exec failed: {_api_message(error)}") from error
        pending = iter(stdin) if stdin is not None else None
        status = b""

        def collect() -> bytes:
            out = stream.read_channel(_STDOUT, 0)
            if out:
                stdout(out)
            err = stream.read_channel(_STDERR, 0)
            if err:
                stderr(err)
            return stream.read_channel(_ERROR, 0)

        killed_at: float | None = None
        try:
            while stream.is_open():
                if killed_at is None and interrupt is not None and interrupt.is_set():
                    self._kill_commands()
                    killed_at = time.monotonic()
                if killed_at is None:
                    remaining = deadline() - time.monotonic()
                    if remaining <= 0:
                        raise SandboxFault(f"{what}: still running at its deadline")
                else:
                    remaining = killed_at + _KILL_GRACE_SECONDS - time.monotonic()
                    if remaining <= 0:
                        raise SandboxFault(f"{what}: still running after its kill")
                chunk = next(pending, None) if pending is not None else None
                if chunk is None:
                    pending = None
                    stream.update(timeout=min(remaining, _WAKE_SECONDS))
                else:
                    stream.write_stdin(chunk)
                    stream.update(timeout=0)
                status += collect()
            status += collect()
        except (SandboxFault, WorkingCopyRejected):
            raise
        except Exception as error:
            raise SandboxFault(f"{what}: the exec failed: {_api_message(error)}") from error
        finally:
            with contextlib.suppress(Exception):
                stream.close()
        if killed_at is not None:
            # Killed on the platform's word, the exec has ended as asked: a status the runtime
            # garbled or left out for a killed process is no failure of the pod's.
            with contextlib.suppress(SandboxFault):
                return _exit_code(status)
            return 128 + 9
        return _exit_code(status)

    def _copy_in(self, packed: Path) -> None:
        size = packed.stat().st_size
        said = OutputCap(_MESSAGE_BYTES)
        limit = time.monotonic() + self.options.transfer_timeout_seconds
        code = self._exec(
            _platform_argv(_COPY_IN, str(size)),
            stdin=_chunks(packed),
            stdout=said.add,
            stderr=said.add,
            deadline=lambda: limit,
            what=f"copying the snapshot into sandbox pod {self.name}",
        )
        packed.unlink()
        if code != 0:
            raise SandboxFault(
                f"the snapshot could not be unpacked in sandbox pod {self.name} "
                f"(tar exit {code}): {said.text().strip()[:500]}"
            )

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Runs `command` with `bash -c` in /testbed within the limits (`timeout` replaces
        `wall_seconds`), as `Sandbox.run`. Raises `SandboxFault` only when the pod or the API
        failed; the command's own failures are in the result."""
        return self._run(command, self.limits.wall_seconds if timeout is None else timeout, None)

    def interrupt(self) -> None:
        """From any thread, as `Sandbox.interrupt`: kills the command running now (its `run`
        returns it as timed out) and refuses later ones. Returns at once: the running command's
        own thread execs the kill, since the caller may be an event loop's."""
        self._interrupted.set()

    def _kill_commands(self) -> None:
        """Kills every process of the pod's user but PID 1, whichever exec started it."""
        limit = time.monotonic() + _KILL_GRACE_SECONDS
        self._exec(
            _platform_argv(_KILL_LEFTOVERS),
            stdin=None,
            stdout=_discard,
            stderr=_discard,
            deadline=lambda: limit,
            what=f"killing the commands in sandbox pod {self.name}",
        )

    def _run(self, command: str, wall: float, stdin: bytes | None) -> CommandResult:
        if self._interrupted.is_set():
            raise SandboxFault("the sandbox's commands were interrupted")
        start = time.monotonic()
        reader = _Reader(OutputCap(self.limits.output_bytes))

        def deadline() -> float:
            if reader.started_at is None:
                return start + _START_SECONDS
            return reader.started_at + wall + _KILL_GRACE_SECONDS

        code = self._exec(
            command_argv(self.limits, command, wall),
            stdin=None if stdin is None else [stdin],
            stdout=reader.add,
            stderr=reader.add,
            deadline=deadline,
            what=f"a command in sandbox pod {self.name}",
            interrupt=self._interrupted,
        )
        duration = time.monotonic() - start
        interrupted = self._interrupted.is_set()
        if not reader.started:
            if interrupted:
                raise SandboxFault("the sandbox was interrupted before its command started")
            said = bytes(reader.preamble).decode("utf-8", "replace").strip()
            first = said.splitlines()[0] if said else f"exit code {code}, no message"
            raise SandboxFault(f"the command did not start in sandbox pod {self.name}: {first}")
        # `timeout -s KILL` kills its own process group, itself included: 128 + SIGKILL. A
        # command that SIGKILLs itself before its limit exits so too, sooner.
        # Once the platform cut it, its exit (the kill's, or one that raced it) is not the
        # command's own answer: timed out, as `Sandbox.run` reports it.
        timed_out = interrupted or (code == 128 + 9 and duration >= wall)
        return CommandResult(
            exit_code=TIMED_OUT if timed_out else code,
            output=reader.cap.text(),
            truncated=reader.cap.truncated,
            output_bytes=reader.cap.total,
            timed_out=timed_out,
            duration_seconds=round(duration, 3),
        )

    def apply(self, patch: str) -> CommandResult:
        """Applies `patch` (from `patch()`) to the working copy with `git apply`, as a command
        within the limits, the patch on its stdin. As `Sandbox.apply`: a patch that does not
        apply is a result that is not `ok`; an empty patch applies trivially."""
        if not patch.strip():
            return CommandResult(
                exit_code=0,
                output="",
                truncated=False,
                output_bytes=0,
                timed_out=False,
                duration_seconds=0.0,
            )
        data = patch.encode("utf-8")
        command = f"/usr/bin/head -c {len(data)} | git apply --whitespace=nowarn"
        return self._run(command, self.limits.wall_seconds, data)

    def patch(self) -> str:
        """The working copy's changes to the snapshot as a git-style unified diff, as
        `Sandbox.patch`; no command may run meanwhile. Raises `WorkingCopyRejected` past the
        working-copy limits."""
        bound = (
            self.limits.working_copy_bytes
            + (self.limits.working_copy_files + 1) * _TAR_BYTES_PER_FILE
        )
        copy = self.root / "working-copy.tar"
        said = OutputCap(_MESSAGE_BYTES)
        limit = time.monotonic() + self.options.transfer_timeout_seconds
        try:
            if self._snapshot is None:
                # The snapshot is the platform's: its size is no one's failure.
                self._snapshot = scan(self._store, self.pristine)
            with copy.open("wb") as file:
                code = self._exec(
                    _platform_argv(_COPY_OUT),
                    stdin=None,
                    stdout=_bounded_writer(file, bound),
                    stderr=said.add,
                    deadline=lambda: limit,
                    what=f"copying the working copy out of sandbox pod {self.name}",
                )
            if code != 0:
                raise SandboxFault(
                    f"the working copy in sandbox pod {self.name} could not be read "
                    f"(tar exit {code}): {said.text().strip()[:500]}"
                )
            after = _tree_of_tar(self._store, copy, self.limits)
            return unified_diff(self._store, self._snapshot, after)
        except (OSError, tarfile.TarError, zlib.error) as error:
            raise SandboxFault(f"the working copy could not be diffed: {error}") from error
        finally:
            with contextlib.suppress(OSError):
                copy.unlink()

    def close(self) -> None:
        """Deletes the pod at once (grace 0) and the platform's side; again only if the deletion
        failed. Raises `SandboxFault` when either could not be removed."""
        with self._lock:
            failure = None
            if self._requested and not self._deleted:
                try:
                    self.api.core.delete_namespaced_pod(
                        self.name,
                        self.namespace,
                        grace_period_seconds=0,
                        _request_timeout=_REST_TIMEOUT_SECONDS,
                    )
                    self._deleted = True
                except Exception as error:
                    if getattr(error, "status", None) == 404:
                        self._deleted = True
                    else:
                        failure = f"sandbox pod {self.namespace}/{self.name} was not deleted: "
                        failure += f"{_api_message(error)} (its deadline ends it)"
            if self.root.exists():
                _restore_owner_access(self.root)
                _coreutils("rm", "-rf", "--one-file-system", "--", str(self.root))
                if self.root.exists():
                    failure = failure or f"sandbox directory {self.root} could not be removed"
            if failure:
                raise SandboxFault(failure)


def _discard(chunk: bytes) -> None:
    pass


def _bounded_writer(file: BinaryIO, bound: int) -> Callable[[bytes], None]:
    written = 0

    def write(chunk: bytes) -> None:
        nonlocal written
        written += len(chunk)
        if written > bound:
            raise WorkingCopyRejected(
                f"the working copy's archive is over {bound} bytes: past the working-copy limits"
            )
        file.write(chunk)

    return write


def require_pod_sandbox(options: PodOptions, api: PodApi) -> None:
    """Raises `SandboxUnavailable`, with one line saying why, unless this process may run sandbox
    pods: a server-side dry run of a sandbox pod passes RBAC, the admission policy, Pod Security
    and the LimitRange (a full quota is no refusal), and its account may exec into pods there."""
    name = f"aml-sandbox-probe-{secrets.token_hex(4)}"
    manifest = sandbox_pod_manifest(name, SandboxLimits(), options, {"aml/probe": "true"})
    try:
        api.core.create_namespaced_pod(
            options.namespace, manifest, dry_run="All", _request_timeout=_REST_TIMEOUT_SECONDS
        )
    except Exception as error:
        if "exceeded quota" not in _api_message(error):
            raise SandboxUnavailable(
                f"the coding track cannot create sandbox pods in {options.namespace}: "
                f"{_api_message(error)}"
            ) from error
    for verb in ("create", "get"):
        try:
            allowed = api.allowed(options.namespace, verb, "pods", "exec")
        except Exception as error:
            raise SandboxUnavailable(
                f"the Kubernetes API did not answer an access review: {_api_message(error)}"
            ) from error
        if not allowed:
            raise SandboxUnavailable(
                f"the coding track may not {verb} pods/exec in {options.namespace} (RBAC)"
            )


# --- choosing a backend ------------------------------------------------------------------------


class LazyKubernetesApi:
    """`kubernetes_api()`, made at its first use (a failure is retried then) and shared by the
    sandboxes of the process that holds this (its composition root)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._api: PodApi | None = None

    def __call__(self) -> PodApi:
        with self._lock:
            if self._api is None:
                self._api = kubernetes_api()
            return self._api


def _kubernetes_options(backend: str, pod_options: PodOptions | None) -> PodOptions:
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}: one of {', '.join(BACKENDS)}")
    if pod_options is None:
        raise ValueError("the kubernetes sandbox backend needs PodOptions (at least the image)")
    return pod_options


def workspace_opener(
    backend: str = "bwrap",
    *,
    pod_options: PodOptions | None = None,
    api: Callable[[], PodApi] | None = None,
) -> Callable[[Path, SandboxLimits], Sandbox | PodSandbox]:
    """The coding track's `OpenWorkspace` for `backend`: "bwrap" (`Sandbox.from_archive`, in
    this process's container) or "kubernetes" (`PodSandbox.from_archive` with `pod_options`;
    `api` defaults to a `LazyKubernetesApi` of its own)."""
    if backend == "bwrap":
        return Sandbox.from_archive
    options = _kubernetes_options(backend, pod_options)
    connect = api or LazyKubernetesApi()

    def open_pod(archive: Path, limits: SandboxLimits) -> PodSandbox:
        return PodSandbox.from_archive(archive, limits, options=options, api=connect())

    return open_pod


def sandbox_probe(
    backend: str = "bwrap",
    *,
    pod_options: PodOptions | None = None,
    api: Callable[[], PodApi] | None = None,
) -> Callable[[], None]:
    """The availability probe for `backend` (`coding_track.SandboxCheck.probe`):
    `require_sandbox` for bwrap, `require_pod_sandbox` for kubernetes."""
    if backend == "bwrap":
        return require_sandbox
    options = _kubernetes_options(backend, pod_options)
    connect = api or LazyKubernetesApi()

    def probe() -> None:
        require_pod_sandbox(options, connect())

    return probe


def sandbox_backend(
    backend: str = "bwrap",
    *,
    pod_options: PodOptions | None = None,
    api: Callable[[], PodApi] | None = None,
) -> tuple[Callable[[Path, SandboxLimits], Sandbox | PodSandbox], Callable[[], None]]:
    """`workspace_opener` and `sandbox_probe` for `backend`, over one Kubernetes client."""
    connect = api or (LazyKubernetesApi() if backend != "bwrap" else None)
    return (
        workspace_opener(backend, pod_options=pod_options, api=connect),
        sandbox_probe(backend, pod_options=pod_options, api=connect),
    )
