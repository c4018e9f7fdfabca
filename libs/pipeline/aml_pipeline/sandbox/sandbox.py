"""A sandbox: a private directory holding a pristine snapshot and its working copy, and the
commands run on the working copy.

On the host (`Sandbox.root`, 0711 so the sandbox's uid can reach what it binds and list nothing):
- `pristine/` (0700): the snapshot as unpacked; never mounted;
- `repo/`: the working copy, mounted read-write at /testbed;
- `etc/`, `inbox/`, `empty/`: what `bwrap.argv` binds read-only;
- `git/` (0700): the object store `patch()` diffs in; never mounted.

Run by root, a sandbox runs its commands as a uid of its own, drawn at random from
`SANDBOX_UIDS`, never root: root is exempt from RLIMIT_NPROC, and a uid no one else has means no
process or file outside the sandbox is its. Run by another user, commands run as that user
(bwrap then needs unprivileged user namespaces, as it does anyway).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import bwrap
from .gitdiff import ObjectStore, TreeScan, scan, unified_diff
from .model import (
    ClosedOnExit,
    CommandResult,
    SandboxFault,
    SandboxLimits,
    SandboxUnavailable,
)
from .process import Interrupt, run_bwrap
from .snapshot import extract_snapshot

# Far above login, system and subordinate (/etc/subuid) ranges, below the 32-bit limit.
SANDBOX_UIDS = range(1_000_000_000, 2_000_000_000)
MISSING_BWRAP = "the coding track needs bubblewrap (bwrap) on PATH: apt-get install bubblewrap"
MISSING_GIT = "the coding track needs git on PATH (patches are made with it): apt-get install git"
PATCH_FILE = "patch.diff"
_TOOL_ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


def _system_directories() -> tuple[tuple[str, str | None], ...]:
    found: list[tuple[str, str | None]] = []
    for path in bwrap.SYSTEM_DIRECTORIES:
        if os.path.islink(path):
            found.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            found.append((path, None))
    return tuple(found)


def _coreutils(*command: str) -> int:
    # chmod and rm walk trees of any depth (fts); Python's os.walk and shutil.rmtree recurse, and
    # a command can nest directories past the recursion limit.
    try:
        done = subprocess.run(
            command,
            env=_TOOL_ENVIRONMENT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxFault(f"{command[0]} could not run: {error}") from error
    return done.returncode


def _restore_owner_access(tree: Path) -> None:
    """Gives the owner back read, write and search on everything under `tree` (a command may
    have `chmod -R 000`'d its working copy; symlinks are not followed). Root needs none of it;
    other users do, to diff and to delete."""
    _coreutils("chmod", "-R", "u+rwX", "--", str(tree))


def _chown_tree(tree: Path, uid: int) -> None:
    os.lchown(tree, uid, uid)
    for directory, subdirectories, files in os.walk(tree):
        for name in (*subdirectories, *files):
            os.lchown(os.path.join(directory, name), uid, uid)


class Sandbox(ClosedOnExit):
    """One snapshot's sandbox. Synchronous, and meant for a worker thread (`asyncio.to_thread`):
    the coding agent drives it through mini-swe-agent's synchronous environment interface
    (`execute(command) -> {"output", "returncode"}`), which runs in a thread of its own anyway,
    and each call blocks for at most its time limit. One thread at a time per sandbox, except
    for `interrupt`.

    Use as a context manager: the directories are removed on exit, whatever the commands did to
    them."""

    def __init__(self, root: Path, limits: SandboxLimits, uid: int | None) -> None:
        self.root = root
        self.limits = limits
        self.uid = uid
        self.pristine = root / "pristine"
        self.working_copy = root / "repo"
        self._bwrap = shutil.which("bwrap")
        self._store = ObjectStore(root / "git")
        self._snapshot: TreeScan | None = None
        self._interrupt = Interrupt()
        self._layout = bwrap.Layout(
            working_copy=self.working_copy,
            etc=root / "etc",
            inbox=root / "inbox",
            empty=root / "empty",
            system=_system_directories(),
        )

    @classmethod
    def from_archive(
        cls, archive: Path, limits: SandboxLimits | None = None, *, parent: Path | None = None
    ) -> Sandbox:
        """A new sandbox whose working copy is the snapshot in `archive` (tar, tar.gz, ...).
        `parent` (default: the system's temporary directory) must be searchable by others."""
        return cls._create(limits or SandboxLimits(), parent, archive)

    @classmethod
    def empty(cls, limits: SandboxLimits | None = None, *, parent: Path | None = None) -> Sandbox:
        """A sandbox with an empty working copy (the availability probe)."""
        return cls._create(limits or SandboxLimits(), parent, None)

    @classmethod
    def _create(cls, limits: SandboxLimits, parent: Path | None, archive: Path | None) -> Sandbox:
        if shutil.which("bwrap") is None:
            raise SandboxUnavailable(MISSING_BWRAP)
        if shutil.which("git") is None:
            raise SandboxUnavailable(MISSING_GIT)
        uid = SANDBOX_UIDS[secrets.randbelow(len(SANDBOX_UIDS))] if os.geteuid() == 0 else None
        try:
            root = Path(tempfile.mkdtemp(prefix="aml-sandbox-", dir=parent))
        except OSError as error:
            raise SandboxFault(f"no sandbox directory could be made: {error}") from error
        sandbox = cls(root, limits, uid)
        try:
            sandbox._populate(archive)
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    def _populate(self, archive: Path | None) -> None:
        os.chmod(self.root, 0o711)
        self.pristine.mkdir(mode=0o700)
        if archive is not None:
            extract_snapshot(archive, self.pristine)
        try:
            shutil.copytree(self.pristine, self.working_copy, symlinks=True)
            os.chmod(self.working_copy, 0o755)
            if self.uid is not None:
                _chown_tree(self.working_copy, self.uid)
            for name in ("etc", "inbox", "empty"):
                (self.root / name).mkdir(mode=0o755)
                os.chmod(self.root / name, 0o755)
            for name, text in bwrap.generated_etc().items():
                (self._layout.etc / name).write_text(text)
                os.chmod(self._layout.etc / name, 0o644)
            ObjectStore.create(self._store.git_dir)
            os.chmod(self._store.git_dir, 0o700)
        except OSError as error:
            raise SandboxFault(f"the working copy could not be made: {error}") from error

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Runs `command` with `bash -c` in /testbed, in fresh namespaces, within the limits
        (`timeout` replaces `wall_seconds`). Raises `SandboxFault` only when the sandbox itself
        failed; the command's own failures are in the result."""
        if self._bwrap is None:
            raise SandboxUnavailable(MISSING_BWRAP)
        if self._interrupt.is_set:
            raise SandboxFault("the sandbox's commands were interrupted")
        wall = self.limits.wall_seconds if timeout is None else timeout
        line = bwrap.argv(self._bwrap, self._layout, self.limits, command)
        return run_bwrap(
            line,
            wall_seconds=wall,
            output_bytes=self.limits.output_bytes,
            user=self.uid,
            interrupt=self._interrupt,
        )

    def interrupt(self) -> None:
        """From any thread: kills the command running now (its `run` returns it as timed out)
        and refuses later ones. For an attempt that ends while its agent's thread may be inside
        a command: the sandbox may be removed once that `run` has returned."""
        self._interrupt.set()

    def patch(self) -> str:
        """The working copy's changes to the snapshot as a git-style unified diff (empty when
        none): what the agent submits. Computed on the host; no command may run meanwhile.
        Raises `WorkingCopyRejected` (the agent's failure) past the working-copy limits."""
        try:
            if self.uid is None:
                _restore_owner_access(self.working_copy)
            if self._snapshot is None:
                # The snapshot is the platform's: its size is no one's failure.
                self._snapshot = scan(self._store, self.pristine)
            after = scan(
                self._store,
                self.working_copy,
                max_files=self.limits.working_copy_files,
                max_bytes=self.limits.working_copy_bytes,
            )
            return unified_diff(self._store, self._snapshot, after)
        except OSError as error:
            raise SandboxFault(f"the working copy could not be diffed: {error}") from error

    def apply(self, patch: str) -> CommandResult:
        """Applies `patch` (from `patch()`) to the working copy with `git apply`, inside the
        sandbox. A patch that does not apply is the agent's failure: a result that is not `ok`,
        with git's reason in its output. An empty patch applies trivially."""
        if not patch.strip():
            return CommandResult(
                exit_code=0,
                output="",
                truncated=False,
                output_bytes=0,
                timed_out=False,
                duration_seconds=0.0,
            )
        target = self._layout.inbox / PATCH_FILE
        try:
            target.write_text(patch, encoding="utf-8")
            os.chmod(target, 0o644)
        except OSError as error:
            raise SandboxFault(f"the patch could not be handed in: {error}") from error
        return self.run(f"git apply --whitespace=nowarn {bwrap.INBOX}/{PATCH_FILE}")

    def close(self) -> None:
        """Removes the sandbox's directories; raises `SandboxFault` when they cannot be."""
        if not self.root.exists():
            return
        if self.uid is None:
            _restore_owner_access(self.working_copy)
        _coreutils("rm", "-rf", "--one-file-system", "--", str(self.root))
        if self.root.exists():
            raise SandboxFault(f"sandbox {self.root} could not be removed")


def require_sandbox() -> None:
    """Raises `SandboxUnavailable`, with one line saying what is missing, unless sandboxes can
    run here: bwrap and git on PATH, and bwrap able to create its namespaces (probed by running
    `true` in an empty sandbox)."""
    try:
        with Sandbox.empty() as probe:
            result = probe.run("true", timeout=30)
    except SandboxUnavailable:
        raise
    except SandboxFault as fault:
        raise SandboxUnavailable(
            f"the coding track needs bubblewrap (bwrap) able to create namespaces here: {fault}"
        ) from fault
    if not result.ok:
        raise SandboxUnavailable(
            "the coding track needs bubblewrap (bwrap) able to run commands here: "
            f"`true` ended with exit code {result.exit_code}"
        )
