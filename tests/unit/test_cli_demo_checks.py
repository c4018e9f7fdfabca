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
