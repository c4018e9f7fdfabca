"""The bwrap command line of one sandboxed command: what the command sees and what bounds it.

Namespaces: every one bwrap knows (`--unshare-all`: user, pid, network, IPC, UTS, cgroup), with
no nested user namespaces (`--disable-userns`), a new session (no TIOCSTI into a terminal) and
death with its parent. The network namespace holds only a loopback of its own, so nothing on the
host's (the platform's ports) or beyond is reachable and there is no DNS.

File system, built from an empty tmpfs that is made read-only at the end:
- /usr read-only, with /usr/local masked by an empty directory (the service image installs the
  platform itself there); /bin, /lib... as the host has them (symlinks into /usr on merged-usr
  systems);
- /etc: only generated passwd, group and hosts files, plus the dynamic linker's cache and the
  alternatives symlinks; no resolver configuration, no certificates, nothing else of the host's;
- /testbed (`REPO`): the working copy, read-write, the working directory;
- /tmp and /dev/shm: private tmpfs of `tmp_bytes` each; /dev: bwrap's minimal device set;
  /proc: the sandbox's own pid namespace;
- /run/aml: files handed in by the platform (a patch to apply), read-only.

Environment: exactly `ENVIRONMENT`. Inside, the command runs as uid/gid `INSIDE_ID` with no
capabilities, under `nice` and `prlimit` (`SandboxLimits`), through `sh`, which writes the
READY handshake before it enters /testbed and executes `bash -c COMMAND`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .model import SandboxLimits
from .process import READY

# Where the working copy is: mini-swe-agent's SWE-bench prompt, which the coding agent keeps
# as upstream wrote it, tells the agent its work tree is /testbed (SWE-bench's own images put
# the repository there too).
REPO = "/testbed"
INBOX = "/run/aml"
INSIDE_ID = 1000
ENVIRONMENT: tuple[tuple[str, str], ...] = (
    ("PATH", "/usr/bin:/bin"),
    ("HOME", "/tmp"),
    ("LANG", "C.UTF-8"),
    ("PYTHONDONTWRITEBYTECODE", "1"),
    # Python's stdout and stderr then stay in the order they were written.
    ("PYTHONUNBUFFERED", "1"),
    # A pager waiting for a terminal would only burn the time limit.
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
)
# Top-level system directories, bound when the host has them.
SYSTEM_DIRECTORIES = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
HOST_ETC = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime")
GENERATED_ETC = ("passwd", "group", "hosts")
# The working directory is entered after READY, not by bwrap (`--chdir`): a command that made
# /testbed unreadable must fail the next command itself, not look like a sandbox that cannot start.
_HANDSHAKE = f'printf %s "$1" && cd {REPO} && exec /bin/bash -c "$2"'


@dataclass(frozen=True)
class Layout:
    """The host paths a sandbox binds: `working_copy` read-write, the rest read-only."""

    working_copy: Path
    etc: Path
    inbox: Path
    empty: Path
    # (path, symlink target) for each of SYSTEM_DIRECTORIES the host has; a None target is a
    # real directory, bound read-only.
    system: tuple[tuple[str, str | None], ...]


def generated_etc(inside_id: int = INSIDE_ID) -> dict[str, str]:
    """The sandbox's /etc files: enough for `id`, `whoami`, `getpass` and `localhost`."""
    return {
        "passwd": (
            f"agent:x:{inside_id}:{inside_id}:agent:/tmp:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
        "group": f"agent:x:{inside_id}:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    }


def argv(bwrap: str, layout: Layout, limits: SandboxLimits, command: str) -> list[str]:
    """The command line running `command` in the sandbox `layout` describes."""
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    args += ["--uid", str(INSIDE_ID), "--gid", str(INSIDE_ID)]
    args += ["--ro-bind", "/usr", "/usr", "--ro-bind", str(layout.empty), "/usr/local"]
    for path, target in layout.system:
        args += ["--symlink", target, path] if target is not None else ["--ro-bind", path, path]
    args += ["--perms", "0755", "--dir", "/etc"]
    for name in GENERATED_ETC:
        args += ["--ro-bind", str(layout.etc / name), f"/etc/{name}"]
    for path in HOST_ETC:
        args += ["--ro-bind-try", path, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--size", str(limits.tmp_bytes), "--tmpfs", "/dev/shm"]
    args += ["--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    args += ["--bind", str(layout.working_copy), REPO, "--ro-bind", str(layout.inbox), INBOX]
    # The root and /dev are tmpfs too, unbounded ones: read-only, they cannot fill memory.
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    args += ["--chdir", "/", "--clearenv"]
    for name, value in ENVIRONMENT:
        args += ["--setenv", name, value]
    args += ["--", "/usr/bin/nice", "-n", str(limits.niceness), "/usr/bin/prlimit"]
    args += [
        f"--cpu={limits.cpu_seconds}",
        f"--as={limits.address_space_bytes}",
        f"--nproc={limits.processes}",
        f"--fsize={limits.file_size_bytes}",
        f"--nofile={limits.open_files}",
        "--core=0",
    ]
    args += ["--", "/bin/sh", "-c", _HANDSHAKE, "sh", READY.decode(), command]
    return args
