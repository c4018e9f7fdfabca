"""The coding track's sandbox (SPEC R-2.5): a repository snapshot's working copy, and the
commands a coding agent runs on it, isolated with bubblewrap.

A command sees only its working copy (read-write at /testbed), a private /tmp and the system's
read-only /usr; no network, no platform files, secrets or environment; it runs as a uid that is
not root, within CPU, memory, process, file-size, output and wall-time limits, and its whole
process tree dies at its time limit (`bwrap`, `SandboxLimits`). The agent's submission is the
diff of its working copy against the pristine snapshot, made on the host (`Sandbox.patch`); the
verify step applies it to a fresh sandbox (`Sandbox.apply`) before running the hidden tests.

`SandboxFault` is the platform's failure (counted as such by the track); everything a command
does to itself is a `CommandResult`. The API is synchronous, for a worker thread (see
`Sandbox`).

A second backend runs each sandbox as a pod of its own in Kubernetes (`pods.PodSandbox`: gVisor,
no network, no token, bounded, with a deadline), with the same methods and meaning;
`sandbox_backend` (`workspace_opener` and `sandbox_probe`) chooses between them ("bwrap", the
default, or "kubernetes")."""

from .model import (
    TIMED_OUT,
    CommandResult,
    SandboxFault,
    SandboxLimits,
    SandboxUnavailable,
    WorkingCopyRejected,
)
from .pods import (
    BACKENDS,
    LazyKubernetesApi,
    PodOptions,
    PodSandbox,
    require_pod_sandbox,
    sandbox_backend,
    sandbox_pod_manifest,
    sandbox_probe,
    workspace_opener,
)
from .sandbox import Sandbox, require_sandbox

__all__ = [
    "BACKENDS",
    "TIMED_OUT",
    "CommandResult",
    "LazyKubernetesApi",
    "PodOptions",
    "PodSandbox",
    "Sandbox",
    "SandboxFault",
    "SandboxLimits",
    "SandboxUnavailable",
    "WorkingCopyRejected",
    "require_pod_sandbox",
    "require_sandbox",
    "sandbox_backend",
    "sandbox_pod_manifest",
    "sandbox_probe",
    "workspace_opener",
]
