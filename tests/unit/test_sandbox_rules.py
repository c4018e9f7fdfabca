"""The coding sandbox's rules that need no bwrap (aml_pipeline.sandbox): which snapshot members
are refused, the output cap and the start handshake, the bwrap command line, and the trees and
attributes the patch is computed from (checked against git itself)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from aml_pipeline.sandbox import SandboxLimits, WorkingCopyRejected
from aml_pipeline.sandbox.bwrap import ENVIRONMENT, Layout, argv
from aml_pipeline.sandbox.gitdiff import ObjectStore, TreeScan, binary_attributes, scan
from aml_pipeline.sandbox.process import READY, OutputCap, _Reader
from aml_pipeline.sandbox.snapshot import normalised, refusal

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def _refusal(*members: tarfile.TarInfo) -> str | None:
    """The first refusal of a member list, as `extract_snapshot` walks it."""
    seen: dict[tuple[str, ...], tarfile.TarInfo] = {}
    for member in members:
        reason = refusal(member, seen)
        if reason is not None:
            return reason
        seen[normalised(member.name)] = member
    return None


def test_an_ordinary_snapshot_passes() -> None:
    assert (
        _refusal(
            _member(".", tarfile.DIRTYPE),
            _member("./src", tarfile.DIRTYPE),
            _member("./src/a.py"),
            _member("./src/alias.py", tarfile.SYMTYPE, "a.py"),
            _member("./docs/up.py", tarfile.SYMTYPE, "../src/a.py"),
            _member("./.gitignore"),
        )
        is None
    )


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ([_member("/etc/passwd")], "an absolute path"),
        ([_member("src/../../evil")], "a '..' component"),
        ([_member(".git/HEAD")], "git metadata"),
        ([_member("pkg/.git", tarfile.DIRTYPE)], "git metadata"),
        ([_member("null", tarfile.CHRTYPE)], "special file"),
        ([_member("pipe", tarfile.FIFOTYPE)], "special file"),
        ([_member("a.py"), _member("./a.py")], "a duplicate name"),
        ([_member("l", tarfile.SYMTYPE, "sub"), _member("l/x")], "through a link"),
        ([_member("etc", tarfile.SYMTYPE, "/etc")], "absolute path"),
        ([_member("a/up", tarfile.SYMTYPE, "../../x")], "outside the snapshot"),
        ([_member("g", tarfile.SYMTYPE, "x/../.git")], "git metadata"),
        ([_member("p", tarfile.LNKTYPE, "/etc/passwd")], "hard link"),
        ([_member("p", tarfile.LNKTYPE, "missing")], "hard link"),
        # Registration refuses every hard link, so the sandbox does too.
        ([_member("a.py"), _member("copy.py", tarfile.LNKTYPE, "a.py")], "hard link"),
    ],
)
def test_a_hostile_member_is_refused(members: list[tarfile.TarInfo], reason: str) -> None:
    found = _refusal(*members)
    assert found is not None and reason in found


def test_the_output_cap_keeps_both_ends_and_counts_everything() -> None:
    small = OutputCap(10)
    small.add(b"0123456789")
    assert not small.truncated and small.text() == "0123456789"
    cap = OutputCap(10)
    for chunk in (b"abc", b"defghij", b"klmnopqrstuvwxyz"):
        cap.add(chunk)
    assert cap.total == 26 and cap.truncated
    assert bytes(cap.head) == b"abcde" and bytes(cap.tail) == b"vwxyz"
    assert cap.text() == "abcde\n[... 16 bytes of output dropped ...]\nvwxyz"


def test_the_handshake_separates_bwraps_words_from_the_commands() -> None:
    reader = _Reader(OutputCap(100))
    for chunk in (b"noise", READY[:5], READY[5:] + b"out", b"put"):
        reader.add(chunk)
    assert reader.started and bytes(reader.preamble) == b"noise"
    assert reader.cap.text() == "output"
    failed = _Reader(OutputCap(100))
    failed.add(b"bwrap: Can't mount proc on /newroot/proc\n")
    assert not failed.started and failed.cap.total == 0


def test_the_command_line_isolates_and_bounds(tmp_path: Path) -> None:
    layout = Layout(
        working_copy=tmp_path / "repo",
        etc=tmp_path / "etc",
        inbox=tmp_path / "inbox",
        empty=tmp_path / "empty",
        system=(("/bin", "usr/bin"), ("/lib", None)),
    )
    limits = SandboxLimits(processes=32, address_space_bytes=1 << 29)
    line = argv("/usr/bin/bwrap", layout, limits, "echo hi")
    for flag in ("--unshare-all", "--disable-userns", "--die-with-parent", "--new-session"):
        assert flag in line
    assert "--share-net" not in line and "--bind-try" not in line
    assert [line[i + 1] for i, a in enumerate(line) if a == "--bind"] == [str(tmp_path / "repo")]
    set_env = [(line[i + 1], line[i + 2]) for i, a in enumerate(line) if a == "--setenv"]
    assert "--clearenv" in line and tuple(set_env) == ENVIRONMENT
    assert "--nproc=32" in line and f"--as={1 << 29}" in line and "--core=0" in line
    assert line[-1] == "echo hi"


def _git(cwd: Path, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, check=True, text=True
    ).stdout.strip()


@needs_git
def test_trees_are_the_ones_git_writes(tmp_path: Path) -> None:
    work = tmp_path / "work"
    # "a" is a directory: "a.b" and "a-b" sort around it only with git's trailing slash.
    for name in ("a.b", "a-b", "a/x", "a/b/y", "ab", "z.py"):
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode() + b"\n")
    (work / "run.sh").write_text("#!/bin/sh\n")
    (work / "run.sh").chmod(0o755)
    os.symlink("z.py", work / "link")
    (work / ".git").mkdir()
    (work / ".git" / "ignored").write_text("not content")
    store = ObjectStore.create(tmp_path / "store")
    scanned = scan(store, work)
    shutil.rmtree(work / ".git")
    _git(work, "init", "-q")
    _git(work, "add", "-A")
    assert scanned.tree == _git(work, "write-tree")
    assert b".git/ignored" not in scanned.entries


def test_a_working_copy_past_its_limits_is_rejected(tmp_path: Path) -> None:
    for index in range(5):
        (tmp_path / f"f{index}").write_text("12345")
    store = ObjectStore.create(tmp_path.parent / f"{tmp_path.name}-store")
    with pytest.raises(WorkingCopyRejected):
        scan(store, tmp_path, max_files=4)
    with pytest.raises(WorkingCopyRejected):
        scan(store, tmp_path, max_bytes=24)
    assert len(scan(store, tmp_path, max_files=5, max_bytes=25).entries) == 5


@needs_git
def test_non_utf8_changes_are_marked_binary_whatever_their_names(tmp_path: Path) -> None:
    names = [b'a*b c\\d"e\xc3\xa9.txt', b"sub/x y[1].txt", b"bad\xff?.txt", b"plain.txt"]
    before = TreeScan("t1", {name: (b"100644", "1" * 40) for name in names}, frozenset())
    after = TreeScan(
        "t2",
        {name: (b"100644", ("2" if name != b"plain.txt" else "3") * 40) for name in names},
        frozenset({"2" * 40}),
    )
    store = ObjectStore.create(tmp_path / "store")
    (store.git_dir / "info" / "attributes").write_bytes(binary_attributes(before, after))
    checked = subprocess.run(
        ["git", "check-attr", "-z", "--stdin", "diff"],
        input=b"\0".join([*names, b'aXb c\\d"e\xc3\xa9.txt', b"other/plain.txt"]) + b"\0",
        env={"PATH": "/usr/bin:/bin", "GIT_DIR": str(store.git_dir), "GIT_CONFIG_NOSYSTEM": "1"},
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    verdicts = dict(zip(checked[0::3], checked[2::3], strict=False))
    assert [verdicts[name] for name in names] == [b"unset", b"unset", b"unset", b"unspecified"]
    assert verdicts[b'aXb c\\d"e\xc3\xa9.txt'] == b"unspecified"
    assert verdicts[b"other/plain.txt"] == b"unspecified"
