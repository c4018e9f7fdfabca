"""`aml demo --dataset` is checked before anything starts (issue 15, item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aml_devtools.cli import main


def test_an_unknown_dataset_is_refused_listing_the_valid_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "demo"
    assert main(["demo", "--dataset", "nosuch", "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "unknown dataset 'nosuch'" in err[0]
    assert "valid ids:" in err[0] and "synthetic" in err[0] and "locomo" in err[0]
    assert not data.exists()  # nothing was started or created


def test_a_dataset_whose_files_are_missing_is_refused_naming_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, root = tmp_path / "demo", tmp_path / "no-datasets"
    code = main(
        ["demo", "--dataset", "locomo", "--datasets-root", str(root), "--data-dir", str(data)]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert str(root / "locomo") in err
    assert not data.exists()


def test_a_coding_demo_without_the_sandbox_is_refused_in_its_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from aml_devtools import cli
    from aml_pipeline.sandbox import SandboxUnavailable
    from aml_pipeline.sandbox.sandbox import MISSING_BWRAP

    def missing() -> None:
        raise SandboxUnavailable(MISSING_BWRAP)

    monkeypatch.setattr(cli, "require_sandbox", missing)
    data = tmp_path / "demo"
    assert main(["demo", "--dataset", "synthetic-coding", "--data-dir", str(data)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"aml demo: {MISSING_BWRAP}"]
    assert not data.exists()  # nothing was started or created


def test_the_coding_demo_prints_resolved_shares_per_condition_and_task_type() -> None:
    """The demo prints a coding job's results with the table every results view uses
    (`render_results`), conditions in the manifest's order."""
    from aml_devtools.coding_demo import is_coding
    from aml_devtools.tables import render_results

    assert is_coding("synthetic-coding", Path("/nonexistent"))
    assert not is_coding("synthetic", Path("/nonexistent"))

    def cell(attempts: int, resolved: int, failed: int = 0) -> dict[str, object]:
        rate = resolved / attempts if attempts else None
        return {
            "questions": attempts + failed,
            "attempts": attempts,
            "resolved": resolved,
            "resolved_rate": rate,
            "failed": failed,
        }

    results = {
        "track": "coding",
        "overall": cell(15, 9, failed=1),
        "datasets": {
            "synthetic-coding": {
                "excluded_from_overall": [],
                # Aggregation lists the conditions by name: the manifest's order is given apart.
                "categories": {"noisy": cell(7, 2, failed=1), "relevant": cell(8, 7)},
                "overall": cell(15, 9, failed=1),
                "task_types": {"development": cell(8, 5), "debug": cell(7, 4, failed=1)},
            }
        },
    }
    numbers = {"synthetic-coding": {"relevant": 1, "noisy": 2}}
    table = render_results(results, numbers).splitlines()
    assert table[0] == "track coding: compare only with results of the same track"
    rows = [line.split() for line in table[3:10] if not line.startswith("-")]
    assert rows == [
        ["synthetic-coding", "1", "relevant", "8", "7", "0", "87.5"],
        ["synthetic-coding", "2", "noisy", "8", "2", "1", "28.6"],
        ["synthetic-coding", "(dataset)", "16", "9", "1", "60.0"],
        ["synthetic-coding", "(type", "debug)", "8", "4", "1", "57.1"],
        ["synthetic-coding", "(type", "development)", "8", "5", "0", "62.5"],
        ["Overall", "16", "9", "1", "60.0"],
    ]
