"""Each MongoDB collection is read and written by one module only, its store
(`aml_runtime.stores`): read from the source, no code under libs/ or services/ names a
collection of `OWNERS` outside its owner. A collection is named by an attribute
(`db.jobs`, `svc.db.jobs`, `database.job_errors`), a subscript (`db["jobs"]`, `db[JOBS]` with
the constant of `aml_runtime.documents`), or a call (`db.get_collection("jobs")`,
`getattr(db, "jobs")`); a subscript's key may name it through a table or a variable too
(`db[STAGE_COLLECTIONS[stage]]`, `db[collection]` in a loop over names, `db[self.collection]`
with a property returning one: `_named_through_bindings`).

`self.jobs` is not a collection: an object's own field (a handler's store, a stage's view of
its jobs); nor is `stores.jobs` (`self.stores.jobs`, `svc.stores.jobs`), a store of the
`aml_runtime.stores.Stores` handlers take; a collection is always reached through a database
(`self.db.jobs` is one)."""

from __future__ import annotations

import ast
import re
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
    "headline_outcomes": "aml_runtime/stores/leaderboard.py",
    "searches": "aml_runtime/stores/stage_records.py",
    "answers": "aml_runtime/stores/stage_records.py",
    "scores": "aml_runtime/stores/stage_records.py",
    "calls": "aml_runtime/stores/audit.py",
    "add_chunks": "aml_runtime/stores/plans.py",
    "questions": "aml_runtime/stores/plans.py",
    "question_releases": "aml_runtime/stores/plans.py",
    "written_texts": "aml_runtime/stores/plans.py",
    "specs": "aml_runtime/stores/plans.py",
    "capacity_slots": "aml_runtime/stores/capacity.py",
    "lane_pauses": "aml_runtime/stores/outages.py",
    "outages": "aml_runtime/stores/outages.py",
    "rate_limits": "aml_runtime/stores/limits.py",
}
# The names `aml_runtime.documents` gives these collections (`JOBS` for "jobs", ...).
CONSTANTS: dict[str, str] = {
    name: value
    for name, value in vars(documents).items()
    if name.isupper() and isinstance(value, str) and value in OWNERS
}
_CALLS = ("get_collection", "getattr")
# Collections whose name is also a field of the platform's models and results
# (`dataset.questions`, `totals["questions"]`): such a name, as an attribute or a string key, is
# a collection only when reached through a database (`db.questions`, `svc.db["questions"]`,
# `self._db.questions`, `client["aml"].questions`).
# `calls` too: a judge verdict's count of its calls (`verdict.calls`).
_ALSO_FIELDS = frozenset({"questions", "calls"})
_DATABASE = re.compile(r"(^|_)(db|database)$")


def _a_field(name: str | None, base: ast.expr) -> bool:
    """Whether `base.<name>` or `base["<name>"]` is a field of something that is no database."""
    if name not in _ALSO_FIELDS or isinstance(base, (ast.Subscript, ast.Call)):
        return False  # `client["aml"]`, `client.get_database("aml")`: a database
    last = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
    return not _DATABASE.search(last)


def _a_store(base: ast.expr) -> bool:
    """Whether `base` is a `Stores` (`stores`, `self.stores`, `rt.stores`): its `jobs`,
    `outages`, `leaderboard`, ... are stores named like the collections they own."""
    last = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
    return bool(last == "stores")


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
            skipped = own_field or _a_store(node.value) or _a_field(node.attr, node.value)
            collection = None if skipped else node.attr
        elif isinstance(node, ast.Subscript):
            collection = _named(node.slice)
            if isinstance(node.slice, ast.Constant) and _a_field(collection, node.value):
                collection = None
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
    return found + _named_through_bindings(source)


# -- a collection named through a table or a variable --------------------------------------------
# `db[STAGE_COLLECTIONS[stage]]` names every stage's collection (a constant key only its own);
# `db[collection]` names what `collection` is bound to in its function or module (an assignment
# or a loop over a table of names: `for collection, emptied in _PURGED_FIELDS`, `for stage,
# collection in STAGE_COLLECTIONS.items()`); `db[self.collection]` what the module's method or
# property `collection` returns. A parameter is bound to nothing: its caller names the collection.
_TABLE = "STAGE_COLLECTIONS"
Bound = dict[str, set[str]]


def _table(node: ast.expr) -> bool:
    """`STAGE_COLLECTIONS` (or `documents.STAGE_COLLECTIONS`)."""
    return (node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)) == _TABLE


def _table_values(key: ast.expr | None) -> set[str]:
    """The collections of OWNERS `STAGE_COLLECTIONS[key]` may be (None: any key)."""
    stages = {str(stage): collection for stage, collection in documents.STAGE_COLLECTIONS.items()}
    chosen = list(stages.values())
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        chosen = [stages.get(key.value, "")]
    return {collection for collection in chosen if collection in OWNERS}


def _referred(expr: ast.expr, bound: Bound, methods: Bound) -> set[str]:
    """The collections of OWNERS an expression's value may be or hold."""
    found: set[str] = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Subscript) and _table(node.value):
            found |= _table_values(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "values" and _table(node.func.value):
                found |= _table_values(None)
        elif isinstance(node, ast.Name):
            found |= bound.get(node.id, set())
        elif isinstance(node, ast.Attribute):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            found |= methods.get(node.attr, set()) if own else set()
        if isinstance(node, (ast.Constant, ast.Name, ast.Attribute)):
            named = _named(node)
            found |= {named} if named is not None else set()
    return found


def _scope_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a module or function, not those of the functions defined in it."""
    nodes: list[ast.AST] = []
    for child in ast.iter_child_nodes(scope):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nodes += [child, *_scope_nodes(child)]
    return nodes


def _target_names(target: ast.expr) -> list[str]:
    return [node.id for node in ast.walk(target) if isinstance(node, ast.Name)]


def _items_of(value: ast.expr) -> ast.expr | None:
    """`table` of `table.items()`."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        return value.func.value if value.func.attr == "items" else None
    return None


def _bind(scope: ast.AST, outer: Bound, methods: Bound) -> Bound:
    """The names `scope` binds to collections, on top of those of the enclosing module."""
    bound = {name: set(collections) for name, collections in outer.items()}
    for _ in range(2):  # a name bound from one bound further down
        for node in _scope_nodes(scope):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                targets, value = [node.target], node.iter
            else:
                continue
            for target in targets:
                names = _target_names(target)
                table = _items_of(value)
                if table is not None and isinstance(target, ast.Tuple):
                    # `for key, collection in table.items()`: only the value is a collection.
                    names = _target_names(target.elts[-1])
                    referred = _table_values(None) if _table(table) else set()
                    referred |= _referred(table, bound, methods)
                elif _table(value) and not isinstance(node, ast.Assign | ast.AnnAssign):
                    referred = set()  # a loop over the stages, the table's keys
                else:
                    referred = _referred(value, bound, methods)
                for name in names if referred else ():
                    bound[name] = bound.get(name, set()) | referred
    return bound


def _named_through_bindings(source: str) -> list[tuple[int, str, str]]:
    """(line, collection, code) for every subscript whose key names a collection of OWNERS
    through a table or a variable (a key naming one itself is found by `collections_named`)."""
    tree = ast.parse(source)
    functions = [
        node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    methods: Bound = {}
    module = _bind(tree, {}, methods)
    for _ in range(2):  # a method returning another's
        for function in functions:
            local = _bind(function, module, methods)
            for node in _scope_nodes(function):
                if isinstance(node, ast.Return) and node.value is not None:
                    returned = _referred(node.value, local, methods)
                    methods[function.name] = methods.get(function.name, set()) | returned
    found: list[tuple[int, str, str]] = []
    for scope in (tree, *functions):
        bound = module if scope is tree else _bind(scope, module, methods)
        for node in _scope_nodes(scope):
            if not isinstance(node, ast.Subscript) or _named(node.slice) is not None:
                continue
            for collection in sorted(_referred(node.slice, bound, methods)):
                if not _a_field(collection, node.value):
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
    "code",
    [
        "self.jobs.get(job_id)",
        "jobs = JobStore(db)",
        'db["unowned"]',
        "JOBS.labels(s)",
        "stores.jobs.fail(job_id)",
        "self.stores.outages.pauses()",
        "svc.stores.leaderboard.entry(entry_id)",
        "rt.stores.access_requests",
    ],
)
def test_the_scan_leaves_other_names_alone(code: str) -> None:
    assert not collections_named(code)


@pytest.mark.parametrize(
    ("code", "named"),
    [
        ("db.questions.find({})", True),
        ('svc.db["questions"]', True),
        ("self._db.questions", True),
        ('client["aml"].questions', True),
        ("db[QUESTIONS]", True),
        ("dataset.questions", False),
        ('totals["questions"]', False),
        ("job.totals.questions", False),
    ],
)
def test_a_collection_named_like_a_field_is_one_only_through_a_database(
    code: str, named: bool
) -> None:
    assert bool(collections_named(code)) == named


_STAGE_PROPERTY = """
class Worker:
    @property
    def collection(self):
        return STAGE_COLLECTIONS[self.stage]

    async def read(self):
        return await self.db[self.collection].find_one({})
"""
_PURGE_TABLE = """
_PURGED = (("searches", {"candidates": []}), (ANSWERS, {"answer": None}))

async def purge(db, job_id):
    for collection, emptied in _PURGED:
        await db[collection].update_many({"job_id": job_id}, {"$set": emptied})
"""
_EVERY_STAGE = {c for c in documents.STAGE_COLLECTIONS.values() if c in OWNERS}


@pytest.mark.parametrize(
    ("code", "named"),
    [
        ("db[STAGE_COLLECTIONS[stage]]", _EVERY_STAGE),
        ("db[documents.STAGE_COLLECTIONS[stage]]", _EVERY_STAGE),
        ('db[STAGE_COLLECTIONS["score"]]', {"scores"}),
        ("collection = STAGE_COLLECTIONS[stage]\ndb[collection].find({})", _EVERY_STAGE),
        ("for stage, name in STAGE_COLLECTIONS.items():\n    db[name].find({})", _EVERY_STAGE),
        ("for name in (SEARCHES, ANSWERS):\n    db[name].find({})", {"searches", "answers"}),
        (_STAGE_PROPERTY, _EVERY_STAGE),
        (_PURGE_TABLE, {"searches", "answers"}),
        # A stage is no collection, nor is a parameter's value (its caller names one).
        ("for stage in STAGE_COLLECTIONS:\n    counts[stage] += 1", set()),
        ("for stage, name in STAGE_COLLECTIONS.items():\n    counts[stage] += 1", set()),
        ("async def insert(db, name, docs):\n    await db[name].insert_many(docs)", set()),
    ],
)
def test_the_scan_follows_a_collection_through_a_table_or_a_variable(
    code: str, named: set[str]
) -> None:
    assert {collection for _, collection, _ in collections_named(code)} == named
