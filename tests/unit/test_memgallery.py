"""The Mem-Gallery format (aml_evaluation.memgallery) on the real dialog file from the shared
datasets and on the shipped synthetic multimodal dataset, and that dataset's generator."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
import zlib
from collections import Counter
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from aml_evaluation import media
from aml_evaluation.memgallery import (
    MEMGALLERY_CATEGORIES,
    MEMGALLERY_TASK_TYPES,
    MissingImagesError,
    bundle_image_path,
    image_dir_of,
    parse,
    parse_memgallery,
    referenced_images,
)
from aml_evaluation.registration import DEFAULT_F1_VARIANT_OF_FORMAT
from aml_evaluation.scoring import F1_MEMGALLERY_VERSION

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(ROOT.parent / "shared" / "datasets" / "mem-gallery")
REAL = SHARED / "Dog_Behavior_Research_Academic_Life.json"
PACKAGE_DATA = ROOT / "libs" / "evaluation" / "aml_evaluation" / "data"
SYNTHETIC = PACKAGE_DATA / "synthetic_multimodal"
TINY_PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16

real_file = pytest.mark.skipif(
    not REAL.is_file(), reason=f"{REAL} absent (shared benchmark data, not in the repo)"
)


def manifest(**changes: Any) -> SimpleNamespace:
    fields: dict[str, Any] = {
        "dataset_id": "mem-gallery",
        "version": "test",
        "scorer": "token_f1",
        "f1_variant": "f1-locomo-v1",
        "categories": {},
        "image_dir": None,
    }
    return SimpleNamespace(**(fields | changes))


def real_contents() -> list[tuple[str, bytes]]:
    return [(f"mem-gallery/dialog/{REAL.name}", REAL.read_bytes())]


@real_file
def test_the_real_file_needs_its_images() -> None:
    with pytest.raises(MissingImagesError) as caught:
        parse(real_contents(), manifest())
    message = str(caught.value)
    assert "59 referenced images are not in the bundle and no image directory was given" in message
    assert "point the loader at the image directory" in message
    assert "Dog_Behavior_Research_Academic_Life/D10_IMG_001.jpg" in message
    assert "and 49 more" in message
    assert len(caught.value.missing) == 59


@real_file
def test_the_real_file_names_what_is_missing_where(tmp_path: Path) -> None:
    with pytest.raises(
        MissingImagesError, match=f"59 of 59 .* under the image directory {tmp_path}"
    ):
        parse(real_contents(), manifest(), image_dir=tmp_path)


@real_file
def test_the_real_file_parses_with_its_images(tmp_path: Path) -> None:
    document = json.loads(REAL.read_bytes())
    references = [
        path.removeprefix("../image/")
        for session in document["multi_session_dialogues"]
        for item in session["dialogues"]
        for path in item.get("input_image") or []
    ] + [
        qa["question_image"].removeprefix("../image/")
        for qa in document["human-annotated QAs"]
        if "question_image" in qa
    ]
    for reference in references:
        (tmp_path / reference).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / reference).write_bytes(TINY_PNG)
    dataset = parse(real_contents(), manifest(), image_dir=tmp_path)

    (conversation,) = dataset.conversations
    assert conversation.conversation_id == "Dog_Behavior_Research_Academic_Life"
    assert conversation.speakers == ("user", "assistant") and conversation.speakers_are_roles
    assert len(conversation.sessions) == 11
    turns = [turn for session in conversation.sessions for turn in session.turns]
    assert len(turns) == 360
    assert [turn.speaker for turn in turns[:4]] == ["user", "assistant", "user", "assistant"]
    with_images = [turn for turn in turns if turn.images]
    assert len(with_images) == 38 and all(turn.speaker == "user" for turn in with_images)
    first = with_images[0]
    assert first.turn_id == "D1:2:user"
    assert first.images == ("Dog_Behavior_Research_Academic_Life/D1_IMG_001.jpg",)
    assert first.image_ids == ("D1:IMG_001",)
    assert first.image_caption is not None and first.image_caption.startswith("Golden Cocker")
    session = conversation.sessions[0]
    assert (session.session_key, session.index, session.date_text) == ("D1", 1, "2025-03-02")
    assert session.timestamp_ms == 1740873600000  # 2025-03-02T00:00:00Z

    assert len(dataset.questions) == 63
    counts = Counter(MEMGALLERY_TASK_TYPES[q.category - 1] for q in dataset.questions)
    assert counts == {
        "FR": 16,
        "TTL": 13,
        "VR": 10,
        "VS": 7,
        "CD": 6,
        "MR": 5,
        "TR": 3,
        "AR": 2,
        "KR": 1,
    }
    assert dataset.categories == dict(MEMGALLERY_CATEGORIES)
    assert sum(1 for q in dataset.questions if q.images) == 21
    refusals = [q for q in dataset.questions if q.category_name == "answer-refusal"]
    assert len(refusals) == 2
    assert all(q.unanswerable and not q.adversarial for q in refusals)
    assert all(q.answer is not None for q in dataset.questions if q not in refusals)
    assert len(referenced_images(dataset)) == 59


def _document(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "character_profile": {"name": "X"},
        "multi_session_dialogues": [
            {
                "session_id": "D1",
                "date": "2024-02-29",
                "dialogues": [
                    {
                        "round": "D1:1",
                        "user": "look",
                        "assistant": "nice",
                        "image_id": ["D1:IMG_001"],
                        "input_image": ["../image/X/D1_IMG_001.png"],
                        "image_caption": ["red"],
                    }
                ],
            }
        ],
        "human-annotated QAs": [
            {"point": "FR", "question": "q?", "answer": "a", "session_id": ["D1"], "clue": []}
        ],
    }
    return document | changes


def test_parse_memgallery_is_pure() -> None:
    dataset = parse_memgallery([("X", _document())], "d", "v")
    assert referenced_images(dataset) == ["X/D1_IMG_001.png"]
    assert dataset.scorer == "token_f1"
    # Mem-Gallery's own token F1 by default, the one the registry declares for the format.
    assert dataset.f1_variant == F1_MEMGALLERY_VERSION
    assert DEFAULT_F1_VARIANT_OF_FORMAT["mem-gallery"] == F1_MEMGALLERY_VERSION


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"input_image": ["/abs/D1.png"]}, "does not start with '../image/'"),
        ({"input_image": ["../image/../x.png"]}, r"'\.\.' path parts"),
        ({"image_id": ["a", "b"]}, "2 image_id entries for 1 input_image"),
        ({"user": 3}, "user and assistant must be strings"),
    ],
)
def test_malformed_rounds_are_refused(change: dict[str, Any], message: str) -> None:
    document = _document()
    document["multi_session_dialogues"][0]["dialogues"][0] |= change
    with pytest.raises(ValueError, match=message):
        parse_memgallery([("X", document)], "d", "v")


def test_unknown_task_types_and_bad_dates_are_refused() -> None:
    document = _document()
    document["human-annotated QAs"][0]["point"] = "ZZ"
    with pytest.raises(ValueError, match="unknown task type 'ZZ'"):
        parse_memgallery([("X", document)], "d", "v")
    document = _document()
    document["multi_session_dialogues"][0]["date"] = "2023-02-29"
    with pytest.raises(ValueError, match="session 'D1': not a YYYY-MM-DD date"):
        parse_memgallery([("X", document)], "d", "v")


def test_a_bundle_without_dialogs_or_with_other_files_is_refused() -> None:
    with pytest.raises(ValueError, match="lists no dialog file"):
        parse([("a/image/X/a.png", TINY_PNG)], manifest())
    with pytest.raises(ValueError, match="holds dialog files"):
        parse([("a/readme.txt", b"")], manifest())


def test_images_listed_in_the_bundle_need_no_image_dir() -> None:
    content = json.dumps(_document()).encode()
    listed = [("b/dialog/X.json", content), ("b/image/X/D1_IMG_001.png", TINY_PNG)]
    assert parse(listed, manifest()).questions[0].answer == "a"
    assert bundle_image_path("b/dialog/X.json", "X/a.png") == "b/image/X/a.png"
    assert bundle_image_path("X.json", "X/a.png") is None
    assert image_dir_of(Path("/r"), "b/dialog/X.json") == Path("/r/b/image")


# --- the shipped synthetic dataset ------------------------------------------------------------


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("aml_mm_generate", SYNTHETIC / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generator_is_deterministic_and_matches_the_committed_files() -> None:
    generator = _generator()
    first, second = generator.render(), generator.render()
    assert first == second
    for path, content in first.items():
        assert path.read_bytes() == content, f"{path} differs: rerun generate.py"
    assert sum(len(content) for content in first.values()) < 32 * 1024


def _synthetic_manifest() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        (PACKAGE_DATA / "manifests" / "synthetic_multimodal.json").read_bytes()
    )
    return loaded


def test_the_manifest_pins_every_file() -> None:
    payload = _synthetic_manifest()
    assert payload["format"] == "mem-gallery" and payload["track"] == "multimodal"
    assert payload["location"] == "package"
    assert (payload["scorer"], payload["f1_variant"]) == ("token_f1", F1_MEMGALLERY_VERSION)
    for entry in payload["files"]:
        content = (PACKAGE_DATA / entry["path"]).read_bytes()
        assert hashlib.sha256(content).hexdigest() == entry["sha256"]
    on_disk = {
        path.relative_to(PACKAGE_DATA).as_posix()
        for path in SYNTHETIC.rglob("*")
        if path.is_file() and path.suffix in {".json", ".png"} and "manifest" not in path.name
    }
    assert on_disk == {entry["path"] for entry in payload["files"]}


def _png_pixels(data: bytes) -> tuple[int, int, bytes]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks = 8, {}
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert crc == zlib.crc32(kind + body)
        chunks[kind] = body
        offset += 12 + length
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    return width, height, zlib.decompress(chunks[b"IDAT"])


def test_the_synthetic_dataset_parses_and_its_images_are_valid_pngs() -> None:
    payload = _synthetic_manifest()
    contents = [
        (entry["path"], (PACKAGE_DATA / entry["path"]).read_bytes()) for entry in payload["files"]
    ]
    categories = {int(key): name for key, name in payload["categories"].items()}
    dataset = parse(contents, manifest(dataset_id="synthetic_multimodal", categories=categories))
    assert [c.conversation_id for c in dataset.conversations] == [
        "Ada_Painting_Library",
        "Bruno_Hiking_Aquarium",
    ]
    assert all(len(c.sessions) == 3 for c in dataset.conversations)
    assert len(dataset.questions) == 11
    assert {MEMGALLERY_TASK_TYPES[q.category - 1] for q in dataset.questions} == set(
        MEMGALLERY_TASK_TYPES
    )
    assert sum(1 for q in dataset.questions if q.images) == 3
    assert [q.question for q in dataset.questions if q.unanswerable] == [
        "What is the name of Ada's sister?"
    ]
    turn = dataset.conversations[0].sessions[2].turns[0]
    assert turn.image_ids == ("D3:IMG_001", "D3:IMG_002")
    image_dir = image_dir_of(PACKAGE_DATA, "synthetic_multimodal/dialog/Ada_Painting_Library.json")
    for reference in referenced_images(dataset):
        data = media.read_image(image_dir, reference)
        width, height, raw = _png_pixels(data)
        assert (width, height) == (16, 16) and len(raw) == 16 * (1 + 16 * 3)
        assert media.parse_data_url(media.data_url(reference, data)) == ("image/png", data)
    red = media.read_image(image_dir, "Ada_Painting_Library/D1_IMG_001.png")
    assert _png_pixels(red)[2][1:4] == bytes((220, 30, 30))


def test_the_synthetic_multimodal_bundle_loads_through_the_registry() -> None:
    """The shipped manifest is listed by the registry; its files verify and parse (its images
    are listed in the bundle, so no image directory is needed) and their verified bytes are
    the dataset's image files."""
    from aml_evaluation.registry import PACKAGE_DATA_DIR, load_bundle, registered

    assert registered("synthetic_multimodal", None).source == "shipped"
    manifest = PACKAGE_DATA_DIR / "manifests" / "synthetic_multimodal.json"
    dataset = load_bundle(manifest, PACKAGE_DATA_DIR)
    assert dataset.dataset_id == "synthetic_multimodal" and dataset.track == "multimodal"
    assert sorted(dataset.image_files) == referenced_images(dataset)
    red = dataset.image_files["Ada_Painting_Library/D1_IMG_001.png"]
    assert red == (SYNTHETIC / "image" / "Ada_Painting_Library" / "D1_IMG_001.png").read_bytes()
    assert len(dataset.questions) == 11
    assert any(turn.images for c in dataset.conversations for s in c.sessions for turn in s.turns)
