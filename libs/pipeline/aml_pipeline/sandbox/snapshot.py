"""Repository snapshots: a tar archive (plain or compressed) unpacked into a sandbox's pristine
copy.

The archive is checked member by member before anything is written, and the whole snapshot is
refused (`SandboxFault`) on the first member that could write outside the destination or that
a repository has no business carrying: an absolute path, a `..` component, a path through a
symlink, a symlink or hard link pointing outside, a device, FIFO or other special file, a
duplicate name. Extraction then runs under tarfile's `data` filter, which checks the same
things again against the real file system and drops owners and set-id bits.

A `.git` anywhere refuses the snapshot rather than being stripped. History in the working copy
would be a second memory (`git log`, `git show` of later commits); a snapshot carrying one was
prepared wrongly, and stripping it silently would make what the agent sees differ from what the
archive says it holds.
"""

from __future__ import annotations

import posixpath
import tarfile
import zlib
from collections.abc import Mapping
from pathlib import Path

from .model import SandboxFault


def normalised(name: str) -> tuple[str, ...]:
    """A member name as path components, without empty and `.` components (`./src//a.py` is
    `("src", "a.py")`)."""
    return tuple(part for part in name.split("/") if part not in ("", "."))


def refusal(
    member: tarfile.TarInfo, earlier: Mapping[tuple[str, ...], tarfile.TarInfo]
) -> str | None:
    """Why `member` must not be unpacked, given the members before it; None when it may."""
    name = member.name
    parts = normalised(name)
    if name.startswith("/"):
        return "an absolute path"
    if ".." in parts:
        return "a '..' component"
    if ".git" in parts:
        return "git metadata (snapshots carry no history)"
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return "a device, FIFO or other special file"
    if not parts:
        return None if member.isdir() else "an empty name"
    if parts in earlier:
        return "a duplicate name"
    for depth in range(1, len(parts)):
        parent = earlier.get(parts[:depth])
        if parent is not None and (parent.issym() or parent.islnk()):
            return "a path through a link"
    if member.issym():
        target = member.linkname
        if not target or target.startswith("/"):
            return "a symlink to an absolute path"
        resolved = posixpath.normpath(posixpath.join(*parts[:-1], target) if parts[:-1] else target)
        if resolved == ".." or resolved.startswith("../"):
            return "a symlink pointing outside the snapshot"
        if ".git" in normalised(resolved):
            return "a symlink into git metadata"
    if member.islnk():
        linked = earlier.get(normalised(member.linkname))
        if member.linkname.startswith("/") or linked is None or not linked.isreg():
            return "a hard link to something other than an earlier file of the snapshot"
    return None


def extract_snapshot(archive: Path, destination: Path) -> None:
    """Unpacks `archive` into the empty directory `destination`; raises `SandboxFault` when the
    archive is unreadable or any member is refused (`refusal`), before writing anything."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            seen: dict[tuple[str, ...], tarfile.TarInfo] = {}
            for member in members:
                reason = refusal(member, seen)
                if reason is not None:
                    raise SandboxFault(
                        f"snapshot {archive.name} refused: member {member.name!r} is {reason}"
                    )
                seen[normalised(member.name)] = member
            if hasattr(tarfile, "data_filter"):
                tar.extractall(destination, members=members, filter="data")
            else:
                # Python before 3.11.4 has no extraction filters: the checks above stand alone,
                # and what the `data` filter would drop is dropped by hand.
                for member in members:
                    member.mode &= 0o755
                    member.uid, member.gid, member.uname, member.gname = 0, 0, "", ""
                tar.extractall(destination, members=members, numeric_owner=True)
    except SandboxFault:
        raise
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise SandboxFault(f"snapshot {archive.name} is unreadable: {error}") from error
