"""README.md's Layout table cannot drift from the tree: every path it names exists, every
directory directly under libs/, services/ and tools/ has a row, and every library's row names
the package it holds.

A row covers a directory when its first column names that directory (`libs/pipeline/`), or, for
all the directories under one parent, when it names the parent with a placeholder
(`services/<name>/`); a row naming only the parent (`libs/`) covers none of its children."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TOPS = ("libs", "services", "tools")
PLACEHOLDER = re.compile(r"<[^<>/]+>")
CODE = re.compile(r"`([^`]+)`")
PLAIN_NAME = re.compile(r"[a-z][a-z0-9_]*")


def layout_rows() -> list[tuple[list[str], str]]:
    """Each row of the table under `## Layout`: the paths in its first column (one or more, in
    backticks) and the rest of the row's text."""
    lines = README.read_text("utf-8").splitlines()
    start = lines.index("## Layout")
    rows: list[tuple[list[str], str]] = []
    in_table = False
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        cells = split_cells(line)
        if set(cells[0]) <= set("-: ") or cells[0].strip() == "path":
            continue  # the separator and the header
        rows.append((CODE.findall(cells[0]), " | ".join(cells[1:])))
    return rows


def split_cells(line: str) -> list[str]:
    """A table row's cells, splitting at pipes outside backticks."""
    cells, current, in_code = [], [], False
    for char in line.strip().strip("|"):
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            cells.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    cells.append("".join(current).strip())
    return cells


def child_dirs(parent: Path) -> list[str]:
    """The directories directly under `parent`, without caches and build metadata."""
    return sorted(
        p.name
        for p in parent.iterdir()
        if p.is_dir() and not p.name.startswith((".", "__")) and not p.name.endswith(".egg-info")
    )


def normalised(path: str) -> str:
    return path.rstrip("/")


def placeholder_parent(path: str) -> str | None:
    """`services` for `services/<name>/`; None for a path without a placeholder."""
    parts = normalised(path).split("/")
    if not PLACEHOLDER.fullmatch(parts[-1]) or any(PLACEHOLDER.search(p) for p in parts[:-1]):
        return None
    return "/".join(parts[:-1])


ROWS = layout_rows()
PATHS = [path for paths, _ in ROWS for path in paths]


def test_the_layout_table_is_found() -> None:
    assert len(ROWS) >= len(TOPS), "README.md has no `## Layout` table with rows"
    assert all(paths for paths, _ in ROWS), "a Layout row names no path in backticks"


@pytest.mark.parametrize("path", PATHS)
def test_every_path_in_the_first_column_exists(path: str) -> None:
    if PLACEHOLDER.search(path):
        parent = placeholder_parent(path)
        assert parent is not None, f"{path}: only the last part may be a placeholder"
        assert (ROOT / parent).is_dir() and child_dirs(ROOT / parent), (
            f"{path}: {parent}/ has no directory for the placeholder to stand for"
        )
        return
    target = ROOT / normalised(path)
    assert target.exists(), f"README.md's Layout names {path}, which does not exist"
    if path.endswith("/"):
        assert target.is_dir(), f"{path} is written as a directory but is not one"


@pytest.mark.parametrize(
    "directory", [f"{top}/{name}" for top in TOPS for name in child_dirs(ROOT / top)]
)
def test_every_directory_under_libs_services_and_tools_has_a_row(directory: str) -> None:
    parent = directory.rsplit("/", 1)[0]
    named = {normalised(p) for p in PATHS}
    by_placeholder = {placeholder_parent(p) for p in PATHS} - {None}
    assert directory in named or parent in by_placeholder, (
        f"README.md's Layout table has no row for {directory}/ "
        f"(add `{directory}/`, or `{parent}/<name>/` for every directory under {parent}/)"
    )


def test_a_placeholder_row_lists_exactly_the_directories_it_stands_for() -> None:
    for paths, text in ROWS:
        for path in paths:
            parent = placeholder_parent(path)
            if parent is None:
                continue
            listed = {name for name in CODE.findall(text) if PLAIN_NAME.fullmatch(name)}
            if listed:
                assert listed == set(child_dirs(ROOT / parent)), (
                    f"the row {path} lists {sorted(listed)}, "
                    f"but {parent}/ holds {child_dirs(ROOT / parent)}"
                )


@pytest.mark.parametrize("library", child_dirs(ROOT / "libs"))
def test_every_library_has_its_own_row_naming_its_package(library: str) -> None:
    rows = [text for paths, text in ROWS if f"libs/{library}" in map(normalised, paths)]
    assert rows, f"README.md's Layout table has no `libs/{library}/` row"
    packages = [p.name for p in (ROOT / "libs" / library).iterdir() if (p / "__init__.py").exists()]
    assert packages, f"libs/{library}/ holds no package"
    named = set(CODE.findall(" ".join(rows)))
    missing = sorted(set(packages) - named)
    assert not missing, f"the `libs/{library}/` row does not name {missing} (in backticks)"
