"""The hashed locks (`python3 dev.py lock`) against pyproject.toml, read as files: every pin of
the project is in its lock at the same version, every locked file is checked by a hash, and the
service image's lock holds the services' dependencies and none of the development ones. A pin
changed in pyproject.toml without the locks written again fails here, not at someone's install."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
SERVICE_LOCK = ROOT / "requirements-service.lock"


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", requirement.split("[")[0]).lower()


def _versions(versions: set[str]) -> str:
    """A package pinned once per Python range (numpy, scipy: markers) as one comparable value."""
    return ",".join(sorted(versions))


def _pins(requirements: list[str]) -> dict[str, str]:
    pins: dict[str, set[str]] = {}
    for requirement in requirements:
        spec, _, _ = requirement.partition(";")
        name, separator, version = spec.partition("==")
        assert separator, f"pyproject.toml: {requirement!r} is not pinned with =="
        pins.setdefault(_name(name.strip()), set()).add(version.strip())
    return {name: _versions(versions) for name, versions in pins.items()}


def _locked(lock: Path) -> dict[str, tuple[str, int]]:
    """Each locked package: (its versions, the fewest hashes any of them has)."""
    assert lock.is_file(), f"{lock.name} is missing: run `python3 dev.py lock`"
    entries = re.split(r"\n(?=[A-Za-z0-9])", lock.read_text("utf-8"))
    locked: dict[str, list[tuple[str, int]]] = {}
    for entry in entries:
        head = re.match(r"([A-Za-z0-9][\w.-]*)==([^\s;\\]+)", entry)
        if head is None:
            continue
        pin = (head.group(2), entry.count("--hash=sha256:"))
        locked.setdefault(_name(head.group(1)), []).append(pin)
    return {
        name: (_versions({version for version, _ in pins}), min(hashes for _, hashes in pins))
        for name, pins in locked.items()
    }


@pytest.fixture(scope="module")
def project() -> dict[str, dict[str, str]]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    extras = meta["optional-dependencies"]
    return {
        "service": _pins(meta["dependencies"]),
        "development": _pins(meta["dependencies"] + extras["embedded"] + extras["dev"]),
    }


@pytest.mark.parametrize(("lock", "which"), [(LOCK, "development"), (SERVICE_LOCK, "service")])
def test_every_pin_is_locked_at_its_version_with_hashes(
    lock: Path, which: str, project: dict[str, dict[str, str]]
) -> None:
    locked = _locked(lock)
    wrong = [
        f"{name}: pyproject.toml {version}, {lock.name} {locked.get(name, ('absent',))[0]}"
        for name, version in project[which].items()
        if locked.get(name, ("",))[0] != version
    ]
    assert not wrong, f"run `python3 dev.py lock`: {wrong}"
    unhashed = [name for name, (_, hashes) in locked.items() if hashes == 0]
    assert not unhashed, f"{lock.name}: locked without a hash: {unhashed}"
    # Transitive dependencies are in it too, not only the direct pins.
    assert len(locked) > len(project[which])


def test_the_service_lock_leaves_the_development_tools_out(
    project: dict[str, dict[str, str]],
) -> None:
    development_only = set(project["development"]) - set(project["service"])
    shipped = development_only & set(_locked(SERVICE_LOCK))
    assert not shipped, f"requirements-service.lock holds development packages: {shipped}"
    # Whatever the services need is in the development lock at the same version.
    full = _locked(LOCK)
    differ = [
        name
        for name, (version, _) in _locked(SERVICE_LOCK).items()
        if name in full and full[name][0] != version
    ]
    assert not differ, f"the two locks disagree on {differ}"


def test_dev_py_installs_from_the_lock_with_hashes() -> None:
    script = (ROOT / "dev.py").read_text("utf-8")
    assert '"--require-hashes"' in script and "LOCK" in script
    assert '"--no-deps", "-e", "."' in script


@pytest.mark.parametrize(("lock", "which"), [(LOCK, "development"), (SERVICE_LOCK, "service")])
def test_what_nothing_imports_is_left_out_of_the_lock(lock: Path, which: str) -> None:
    """A package left out on purpose (`[tool.aml.lock-excludes]`) stays out: the locks are
    installed with --no-deps, so whatever is in a lock is installed and nothing else is."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["aml"]
    left_out = {_name(name) for name in tool["lock-excludes"][which]}
    assert left_out, "nothing is left out: then the locks need not be installed with --no-deps"
    present = left_out & set(_locked(lock))
    assert not present, f"{lock.name} holds {present}, which [tool.aml.lock-excludes] leaves out"
    dev = (ROOT / "dev.py").read_text("utf-8")
    assert '"--require-hashes", "--only-binary=:all:", "--no-deps", "-r"]' in dev
    dockerfile = (ROOT / "Dockerfile").read_text("utf-8")
    assert "--require-hashes --only-binary=:all: --no-deps -r" in dockerfile
