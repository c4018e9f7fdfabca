"""The agent's submission: a git-style unified diff of its working copy against the pristine
snapshot, computed outside the sandbox.

Both trees are hashed here, in Python, into a private object store (a bare git directory that
no sandbox mounts); `git diff-tree` then compares the two tree objects. Nothing of the working
copy is interpreted: symlinks are stored as links and never followed, FIFOs and sockets are
skipped, and with no work tree git reads no `.gitattributes`, `.gitignore` or nested `.git`
the agent may have written (a `.git` is never part of the diff: the patch changes the
repository's files, not a repository). Empty directories vanish, as in git.

Changed files whose content is not UTF-8 on either side are diffed as git binary patches, so the
patch is always text (ASCII plus UTF-8) and applies byte for byte with `git apply`.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

from .model import SandboxFault, WorkingCopyRejected

# Index entries: path (bytes, `/`-separated, relative) -> (git mode, blob id).
Entries = dict[bytes, tuple[bytes, str]]

_FILE = b"100644"
_EXECUTABLE = b"100755"
_SYMLINK = b"120000"
_TREE = b"40000"
# Linux's PATH_MAX, counting the terminating NUL.
_PATH_MAX = 4096
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class TreeScan:
    tree: str
    entries: Entries
    # Blobs that are not valid UTF-8 (diffed as binary).
    not_utf8: frozenset[str]


@dataclass(frozen=True)
class ObjectStore:
    """A bare git directory made by hand (no `git init`, no hooks, no config)."""

    git_dir: Path

    @classmethod
    def create(cls, git_dir: Path) -> ObjectStore:
        for sub in ("objects", "refs", "info"):
            (git_dir / sub).mkdir(parents=True, exist_ok=True)
        (git_dir / "HEAD").write_text("ref: refs/heads/main\n")
        return cls(git_dir)

    def write(self, kind: bytes, data: bytes) -> str:
        raw = b"%s %d\0" % (kind, len(data)) + data
        oid = hashlib.sha1(raw, usedforsecurity=False).hexdigest()
        path = self.git_dir / "objects" / oid[:2] / oid[2:]
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(zlib.compress(raw, 1))
        return oid


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read_regular(path: bytes) -> bytes:
    fd = os.open(path, _READ_FLAGS)
    with os.fdopen(fd, "rb") as file:
        return file.read()


def scan(
    store: ObjectStore, root: Path, *, max_files: int | None = None, max_bytes: int | None = None
) -> TreeScan:
    """Writes every file under `root` (but `.git`) to `store`; returns the tree. Raises
    `WorkingCopyRejected` past `max_files` files or `max_bytes` bytes, or for a path too long to
    open from the host (a command can nest directories deeper than PATH_MAX with relative
    paths)."""
    base = os.fsencode(root)
    longest = _PATH_MAX - 1 - len(base) - 1
    entries: Entries = {}
    not_utf8: set[str] = set()
    total = 0
    pending: list[bytes] = [b""]
    # Iterative: an agent can nest directories deeper than Python's recursion limit.
    while pending:
        relative = pending.pop()
        with os.scandir(os.path.join(base, relative) if relative else base) as listing:
            for entry in listing:
                if entry.name == b".git":
                    continue
                path = relative + b"/" + entry.name if relative else entry.name
                if len(path) > longest:
                    raise WorkingCopyRejected(
                        f"a path in the working copy is longer than {longest} bytes"
                    )
                if entry.is_dir(follow_symlinks=False):
                    pending.append(path)
                    continue
                if not (entry.is_symlink() or entry.is_file(follow_symlinks=False)):
                    continue  # FIFOs and sockets are no repository content
                status = entry.stat(follow_symlinks=False)
                total += status.st_size
                if (max_files is not None and len(entries) >= max_files) or (
                    max_bytes is not None and total > max_bytes
                ):
                    raise WorkingCopyRejected(
                        f"the working copy holds more than {max_files} files or {max_bytes} bytes"
                    )
                if entry.is_symlink():
                    mode, data = _SYMLINK, os.readlink(entry.path)
                else:
                    executable = status.st_mode & stat.S_IXUSR
                    mode, data = (_EXECUTABLE if executable else _FILE), _read_regular(entry.path)
                oid = store.write(b"blob", data)
                entries[path] = (mode, oid)
                if not _is_utf8(data):
                    not_utf8.add(oid)
    return TreeScan(_write_trees(store, entries), entries, frozenset(not_utf8))


def _tree_sort_key(item: tuple[bytes, bytes, str]) -> bytes:
    # git orders a tree's entries by name, a subtree's name taken with a trailing slash.
    name, mode, _ = item
    return name + b"/" if mode == _TREE else name


def _tree_body(children: list[tuple[bytes, bytes, str]]) -> bytes:
    return b"".join(
        b"%s %s\0%s" % (mode, name, bytes.fromhex(oid))
        for name, mode, oid in sorted(children, key=_tree_sort_key)
    )


def _write_trees(store: ObjectStore, entries: Entries) -> str:
    directories: dict[bytes, list[tuple[bytes, bytes, str]]] = {b"": []}
    for path, (mode, oid) in entries.items():
        parent, _, name = path.rpartition(b"/")
        directories.setdefault(parent, []).append((name, mode, oid))
        while parent and parent.rpartition(b"/")[0] not in directories:
            parent = parent.rpartition(b"/")[0]
            directories[parent] = []
    # Deepest first, so a subtree is written and listed in its parent before the parent is; the
    # root (depth 0) comes last.
    root = ""
    for directory in sorted(directories, key=_depth, reverse=True):
        oid = store.write(b"tree", _tree_body(directories[directory]))
        if directory:
            parent, _, name = directory.rpartition(b"/")
            directories[parent].append((name, _TREE, oid))
        else:
            root = oid
    return root


def _depth(directory: bytes) -> int:
    return directory.count(b"/") + 1 if directory else 0


def _glob_escaped(path: bytes) -> bytes:
    return b"".join(b"\\" + bytes([c]) if c in b"*?[\\" else bytes([c]) for c in path)


def _c_quoted(pattern: bytes) -> bytes:
    quoted = bytearray(b'"')
    for c in pattern:
        if c in b'"\\':
            quoted += b"\\" + bytes([c])
        elif 0x20 <= c < 0x7F:
            quoted.append(c)
        else:
            quoted += b"\\%03o" % c
    return bytes(quoted + b'"')


def binary_attributes(before: TreeScan, after: TreeScan) -> bytes:
    """`info/attributes` lines marking each changed path whose content is not UTF-8 (on either
    side) as binary: an anchored, glob-escaped, C-quoted pattern per path."""
    lines = []
    for path in sorted(before.entries.keys() | after.entries.keys()):
        old, new = before.entries.get(path), after.entries.get(path)
        if old == new:
            continue
        if (old and old[1] in before.not_utf8) or (new and new[1] in after.not_utf8):
            lines.append(_c_quoted(b"/" + _glob_escaped(path)) + b" -diff\n")
    return b"".join(lines)


def _git_environment(store: ObjectStore) -> dict[str, str]:
    # Nothing of the platform's environment or of any user's git configuration.
    return {
        "PATH": "/usr/bin:/bin",
        "GIT_DIR": str(store.git_dir),
        "HOME": str(store.git_dir),
        "XDG_CONFIG_HOME": str(store.git_dir),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ATTR_NOSYSTEM": "1",
        "LC_ALL": "C",
    }


def unified_diff(store: ObjectStore, before: TreeScan, after: TreeScan) -> str:
    """The git-style diff (`a/` and `b/` paths, full blob ids, binary patches) turning `before`
    into `after`; empty when they hold the same files."""
    if before.tree == after.tree:
        return ""
    (store.git_dir / "info" / "attributes").write_bytes(binary_attributes(before, after))
    command = [
        "git",
        "-c", "core.quotePath=true",
        "diff-tree", "-r", "-p", "--binary", "--full-index", "--no-renames",
        "--no-color", "--no-ext-diff", "--no-textconv",
        before.tree, after.tree,
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, env=_git_environment(store), capture_output=True, check=False, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxFault(f"git diff-tree could not run: {error}") from error
    if done.returncode != 0:
        reason = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise SandboxFault(f"git diff-tree failed: {reason[0] if reason else done.returncode}")
    try:
        return done.stdout.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SandboxFault(f"git diff-tree wrote a patch that is not UTF-8: {error}") from error
