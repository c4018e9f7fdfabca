"""Repository snapshots: a tar archive (plain or compressed) unpacked into a sandbox's pristine
copy.

The archive is checked member by member before anything is written, and the whole snapshot is
refused (`SandboxFault`) on the first member that could write outside the destination or that
a repository has no business carrying: an absolute path, a `..` component, a path through a
symlink, a symlink pointing outside, a hard link, a device, FIFO or other special file, a
set-id or sticky bit, a duplicate name. The rule is registration's
(`aml_evaluation.coding.bundle.member_refusal`), so a registered snapshot always unpacks.
Extraction then runs under tarfile's `data` filter, which checks the same things again against
the real file system and drops owners and set-id bits.

A `.git` anywhere refuses the snapshot rather than being stripped. History in the working copy
would be a second memory (`git log`, `git show` of later commits); a snapshot carrying one was
prepared wrongly, and stripping it silently would make what the agent sees differ from what the
archive says it holds.
"""

from __future__ import annotations

import tarfile
import zlib
from pathlib import Path

from aml_evaluation.coding.bundle import member_parts as normalised
from aml_evaluation.coding.bundle import member_refusal as refusal

from .model import SandboxFault

__all__ = ["extract_snapshot", "normalised", "refusal"]


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
