"""`aml dataset add --format mem-gallery --images DIR`: the real Mem-Gallery dialog file (shared
benchmark data) in a temporary datasets root, without its images (a clear refusal, nothing
written) and with a small image directory generated here (every referenced image pinned)."""

from __future__ import annotations

import hashlib
import io
import json
import random
import shutil
from pathlib import Path

import pytest
from PIL import Image

from aml_devtools.cli import main
from aml_evaluation import media
from aml_evaluation.chunker import plan_adds, search_query
from aml_evaluation.memgallery import parse_memgallery, referenced_images
from aml_evaluation.registration import RegistrationError, register_dataset
from aml_evaluation.registry import load_dataset, read_manifest

ROOT = Path(__file__).resolve().parents[2]
REAL = (
    ROOT.parent / "shared" / "datasets" / "mem-gallery" / "Dog_Behavior_Research_Academic_Life.json"
)
PNG = b"\x89PNG\r\n\x1a\n" + bytes(24)

pytestmark = pytest.mark.skipif(
    not REAL.is_file(), reason=f"{REAL} absent (shared benchmark data, not in the repo)"
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    datasets = tmp_path / "datasets"
    (datasets / "mg" / "dialog").mkdir(parents=True)
    shutil.copy(REAL, datasets / "mg" / "dialog" / REAL.name)
    return datasets


def _dialog(root: Path) -> Path:
    return root / "mg" / "dialog" / REAL.name


def _references(root: Path) -> list[str]:
    """Every image the real file references (parsed with the images taken as present)."""
    with pytest.raises(RegistrationError) as caught:
        register_dataset(_dialog(root), "mem-gallery", "mg", root)
    assert "pass --images DIR" in str(caught.value)
    document = json.loads(REAL.read_bytes())
    return referenced_images(parse_memgallery([(REAL.stem, document)], "mg", "t"))


def _images(root: Path, references: list[str], directory: str = "images") -> Path:
    base = root / "mg" / directory
    for number, reference in enumerate(references):
        path = base / reference
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(PNG + number.to_bytes(4, "big"))  # distinct bytes, so distinct hashes
    return base


def add(root: Path, *args: str) -> int:
    return main(["dataset", "add", *args, "--datasets-root", str(root)])


def test_without_images_registration_names_the_missing_and_writes_nothing(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    references = _references(root)
    assert len(references) > 5
    capsys.readouterr()
    assert add(root, str(_dialog(root)), "--format", "mem-gallery", "--id", "mg") == 2
    error = capsys.readouterr().err
    assert f"references {len(references)} images and no image directory was given" in error
    assert references[0] in error and f"and {len(references) - 5} more" in error
    assert "pass --images DIR" in error
    assert not (root / "manifests").exists()

    # An image directory that lacks some of them: how many, the first few, and the way out.
    images = _images(root, references[2:])
    args = ["--format", "mem-gallery", "--id", "mg", "--images", str(images)]
    assert add(root, str(_dialog(root)), *args) == 2
    error = capsys.readouterr().err
    assert f"2 of {len(references)} referenced images are missing under" in error
    assert references[0] in error and references[1] in error and "--images DIR" in error
    assert not (root / "manifests").exists()


def test_with_the_image_directory_every_referenced_image_is_pinned(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    references = _references(root)
    images = _images(root, references)
    (images / "unreferenced.png").write_bytes(PNG)
    args = ["--format", "mem-gallery", "--id", "mg", "--images", str(images)]
    capsys.readouterr()
    assert add(root, str(_dialog(root)), *args) == 0
    out = capsys.readouterr().out
    assert out.startswith("added mg (mem-gallery, multimodal, ")
    assert f"{len(references)} images pinned under mg/images" in out
    manifest = read_manifest(root / "manifests" / "mg.json")
    assert (manifest.track, manifest.scorer, manifest.image_dir) == (
        "multimodal",
        "token_f1",
        "mg/images",
    )
    pinned = {entry.path: entry.sha256 for entry in manifest.files[1:]}
    assert sorted(pinned) == [f"mg/images/{reference}" for reference in references]
    for path, digest in pinned.items():
        assert hashlib.sha256((root / path).read_bytes()).hexdigest() == digest

    dataset = load_dataset("mg", root)
    assert sorted(dataset.image_files) == references
    arrays = [
        m.content
        for add in plan_adds(dataset, "r")
        for m in add.request.messages
        if isinstance(m.content, list)
    ]
    assert arrays and all(content[-1].type == "image_url" for content in arrays)

    # A pinned image that changes afterwards fails the load.
    (images / references[0]).write_bytes(PNG + b"changed")
    with pytest.raises(ValueError, match="has sha256"):
        load_dataset("mg", root)


def test_bad_image_directories_and_files_are_refused(root: Path) -> None:
    references = _references(root)
    images = _images(root, references)
    with pytest.raises(RegistrationError, match="not inside the datasets root"):
        register_dataset(_dialog(root), "mem-gallery", "mg", root, images=root.parent)
    with pytest.raises(RegistrationError, match="is not a directory"):
        register_dataset(_dialog(root), "mem-gallery", "mg", root, images=_dialog(root))
    with pytest.raises(RegistrationError, match="--images applies to formats with images"):
        register_dataset(_dialog(root), "locomo", "mg", root, images=images)
    (images / references[3]).write_bytes(b"<html>not an image</html>")
    with pytest.raises(RegistrationError, match="is not a PNG, JPEG, GIF or WebP image"):
        register_dataset(_dialog(root), "mem-gallery", "mg", root, images=images)
    assert not (root / "manifests").exists()


def _photo(width: int = 1600, height: int = 1200) -> bytes:
    """Noise as PNG (~5.8 MB at 1600 x 1200): as large in bytes as the real dataset's photos
    (its question images reach 11 MB)."""
    out = io.BytesIO()
    pixels = random.Random(width).randbytes(width * height * 3)
    Image.frombytes("RGB", (width, height), pixels).save(out, format="PNG")
    return out.getvalue()


def test_images_as_large_as_the_real_ones_are_pinned_whole_and_sent_fitted(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    references = _references(root)
    images = _images(root, references)
    parsed = parse_memgallery([(REAL.stem, json.loads(REAL.read_bytes()))], "mg", "t")
    question = next(q for q in parsed.questions if q.images)
    turn_image = next(r for r in references if r not in question.images)
    photo = _photo()
    for reference in (question.images[0], turn_image):
        (images / reference).write_bytes(photo)
    assert add(root, str(_dialog(root)), "--format", "mem-gallery", "--id", "mg",
               "--images", str(images)) == 0  # fmt: skip
    said = capsys.readouterr().out
    assert "2 of them sent fitted (fit-v1" in said
    assert question.images[0] in said and turn_image in said
    # The manifest pins the source as the operator placed it.
    pinned = {e.path: e.sha256 for e in read_manifest(root / "manifests" / "mg.json").files}
    assert pinned[f"mg/images/{turn_image}"] == hashlib.sha256(photo).hexdigest()

    dataset = load_dataset("mg", root)
    sent = [
        media.parse_data_url(part.image_url.url)
        for add in plan_adds(dataset, "r")
        for message in add.request.messages
        if isinstance(message.content, list)
        for part in message.content
        if part.type == "image_url"
    ]
    fitted = [data for mime, data in sent if mime == media.JPEG]
    assert fitted and all(len(data) <= media.MAX_IMAGE_BYTES for data in fitted)
    assert len(sent) > len(fitted)  # the small images go as they are (PNG)
    query = search_query(dataset, next(q for q in dataset.questions if q.images))
    assert isinstance(query, list)
    mime, data = media.parse_data_url(query[1].image_url.url)
    assert mime == media.JPEG and len(data) <= media.MAX_QUERY_IMAGE_BYTES
