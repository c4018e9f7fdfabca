"""Each MongoDB collection is read and written by one module only, its store
(`aml_runtime.stores`): read from the source, no code under libs/ or services/ names a
collection of `OWNERS` outside its owner. A collection is named by an attribute
(`db.jobs`, `svc.db.jobs`, `database.job_errors`), a subscript (`db["jobs"]`, `db[JOBS]` with
the constant of `aml_runtime.documents`), or a call (`db.get_collection("jobs")`,
`getattr(db, "jobs")`).

`self.jobs` is not a collection: an object's own field (a handler's store, a stage's view of
its jobs); a collection is always reached through a database (`self.db.jobs` is one)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from aml_runtime import documents

ROOT = Path(__file__).resolve().parents[2]
SCANNED = (ROOT / "libs", ROOT / "services")
# Collection -> the one module (relative to its library's folder) that may touch it.
OWNERS: dict[str, str] = {
    "jobs": "aml_runtime/stores/jobs.py",
    "job_errors": "aml_runtime/stores/jobs.py",
    "teams": "aml_runtime/stores/accounts.py",
    "versions": "aml_runtime/stores/accounts.py",
    "system_names": "aml_runtime/stores/accounts.py",
    "secrets": "aml_runtime/stores/accounts.py",
    "run_usage": "aml_runtime/stores/accounts.py",
    "access_requests": "aml_runtime/stores/access_requests.py",
    "leaderboard": "aml_runtime/stores/leaderboard.py",
}
# The names `aml_runtime.documents` gives these collections (`JOBS` for "jobs", ...).
CONSTANTS: dict[str, str] = {
    name: value
    for name, value in vars(documents).items()
    if name.isupper() and isinstance(value, str) and value in OWNERS
}
_CALLS = ("get_collection", "getattr")


def _named(node: ast.expr) -> str | None:
    """The collection a subscript's key or a call's argument names, if it is one of OWNERS."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in OWNERS:
        return node.value
    name = node.id if isinstance(node, ast.Name) else None
    if isinstance(node, ast.Attribute):
        name = node.attr  # `documents.JOBS`
    return CONSTANTS.get(name) if name is not None else None


def collections_named(source: str) -> list[tuple[int, str, str]]:
    """(line, collection, code) for every place the source names a collection of OWNERS."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(ast.parse(source)):
        collection: str | None = None
        if isinstance(node, ast.Attribute) and node.attr in OWNERS:
            own_field = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            collection = None if own_field else node.attr
        elif isinstance(node, ast.Subscript):
            collection = _named(node.slice)
        elif isinstance(node, ast.Call):
            function = node.func
            called = function.attr if isinstance(function, ast.Attribute) else None
            if isinstance(function, ast.Name):
                called = function.id
            if called in _CALLS:
                names = [_named(arg) for arg in node.args]
                collection = next((name for name in names if name is not None), None)
        if collection is not None:
            found.append((node.lineno, collection, ast.unparse(node)))
    return found


def _sources() -> list[Path]:
    return sorted(path for folder in SCANNED for path in folder.rglob("*.py"))


def _owned_here(path: Path, collection: str) -> bool:
    return path.as_posix().endswith("/" + OWNERS[collection])


def test_a_collection_is_touched_only_by_its_store() -> None:
    offending = [
        f"{path.relative_to(ROOT)}:{line}: {code}"
        for path in _sources()
        for line, collection, code in collections_named(path.read_text("utf-8"))
        if not _owned_here(path, collection)
    ]
    assert not offending, "outside its store:\n" + "\n".join(offending)


@pytest.mark.parametrize("collection", sorted(OWNERS))
def test_every_owner_exists_and_touches_its_collection(collection: str) -> None:
    owners = [path for path in _sources() if _owned_here(path, collection)]
    assert len(owners) == 1, (collection, owners)
    assert any(c == collection for _, c, _ in collections_named(owners[0].read_text("utf-8")))


@pytest.mark.parametrize(
    "code",
    [
        "db.jobs.find_one({})",
        "svc.db.job_errors.find({})",
        "database.jobs",
        'db["jobs"]',
        "db[JOBS]",
        "db[documents.JOB_ERRORS]",
        'client["aml"].jobs',
        'db.get_collection("jobs")',
        "getattr(db, 'job_errors')",
        "svc.db.teams.find_one({})",
        "self._db.versions.find_one({})",
        "db[LEADERBOARD].find({})",
    ],
)
def test_the_scan_sees_every_way_of_naming_a_collection(code: str) -> None:
    assert collections_named(code)


@pytest.mark.parametrize(
    "code", ["self.jobs.get(job_id)", "jobs = JobStore(db)", 'db["add_chunks"]', "JOBS.labels(s)"]
)
def test_the_scan_leaves_other_names_alone(code: str) -> None:
    assert not collections_named(code)
