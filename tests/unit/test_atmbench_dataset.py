"""The ATM-Bench format (aml_evaluation.atmbench.dataset) on the synthetic bundle
(aml_evaluation.atmbench.synthetic): parsing, registration with `aml dataset add`, the Add
requests the chunker builds from it, and refused bundles."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from PIL import Image

from aml_contract.participant import ImageUrlPart, TextPart
from aml_devtools.cli import main
from aml_evaluation.atmbench import synthetic
from aml_evaluation.atmbench.dataset import (
    ATM_CATEGORIES,
    CONVERSATION_ID,
    UNIT_TEXT_VERSION,
    file_kind,
    frame_reference,
    parse,
)
from aml_evaluation.atmbench.frames import FRAME_COUNT
from aml_evaluation.atmbench.scoring import ATM_SCORER
from aml_evaluation.chunker import plan_adds
from aml_evaluation.datasets import Dataset
from aml_evaluation.media import parse_data_url
from aml_evaluation.registration import RegistrationError, register_dataset
from aml_evaluation.registry import DatasetFileError, load_dataset, read_manifest

IMAGE_IDS = synthetic.IMAGE_IDS
EMAIL_IDS = synthetic.EMAIL_IDS
VIDEO_ID = synthetic.VIDEO_ID
# Units in time order: the image without a timestamp is dated by its id, the email without one
# by the date in its id.
UNIT_ORDER = [
    EMAIL_IDS[0],
    IMAGE_IDS[0],
    IMAGE_IDS[1],
    EMAIL_IDS[1],
    VIDEO_ID,
    IMAGE_IDS[2],
    EMAIL_IDS[2],
]


def manifest(**changes: Any) -> SimpleNamespace:
    fields: dict[str, Any] = {
        "dataset_id": "atm",
        "version": "test",
        "scorer": ATM_SCORER,
        "f1_variant": "f1-locomo-v1",
        "categories": {},
    }
    return SimpleNamespace(**(fields | changes))


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return parse(synthetic.contents(prefix="atm/"), manifest())


def refused(files: dict[str, bytes], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse(synthetic.contents(files), manifest())


def qa_with(**changes: Any) -> bytes:
    records = synthetic.qa_records()
    records[0] = records[0] | changes
    return synthetic.json_bytes(records)


# --- parsing ------------------------------------------------------------------------------------


def test_the_corpus_is_one_conversation_of_one_session_per_unit_in_time_order(
    dataset: Dataset,
) -> None:
    assert UNIT_TEXT_VERSION == "atm-unit-v1"
    (conversation,) = dataset.conversations
    assert conversation.conversation_id == CONVERSATION_ID == "owner"
    assert conversation.speakers == ("user", "assistant") and conversation.speakers_are_roles
    assert [s.session_key for s in conversation.sessions] == UNIT_ORDER
    assert [s.index for s in conversation.sessions] == list(range(1, len(UNIT_ORDER) + 1))
    times = [s.timestamp_ms or 0 for s in conversation.sessions]
    assert times == sorted(times)
    for session in conversation.sessions:
        (turn,) = session.turns
        assert (turn.turn_id, turn.speaker) == (session.session_key, "user")
    by_key = {s.session_key: s for s in conversation.sessions}
    assert by_key[EMAIL_IDS[0]].date_text == "2022-03-14 09:15:00"
    assert by_key[EMAIL_IDS[0]].timestamp_ms == 1647249300000  # read as UTC
    assert by_key[IMAGE_IDS[2]].date_text == "2023-01-15 09:00:00"  # from its id
    assert by_key[EMAIL_IDS[2]].date_text == "2023-01-20 00:00:00"  # from its id


def test_unit_texts_are_the_benchmarks_rendering(dataset: Dataset) -> None:
    turns = {s.session_key: s.turns[0] for s in dataset.conversations[0].sessions}
    assert turns[IMAGE_IDS[1]].text == "\n".join(
        [
            f"ID: {IMAGE_IDS[1]}",
            "Type: image",
            "Timestamp: 2022-05-02 17:28:50",
            "Location: London, United Kingdom",
            "Short Caption: A yellow box on a green table",
            "Caption: A yellow cardboard box on a green table.",
            "OCR: FRAGILE",
            "Tags: box, yellow",
        ]
    )
    # Absent and empty fields are written empty; tags that are not a list as they are.
    assert turns[IMAGE_IDS[2]].text.splitlines() == [
        f"ID: {IMAGE_IDS[2]}",
        "Type: image",
        "Timestamp: ",
        "Location: Oxford, United Kingdom",
        "Short Caption: A white triangle on a blue sign",
        "Caption: A blue road sign with a white triangle.",
        "OCR: ",
        "Tags: sign",
    ]
    assert turns[VIDEO_ID].text.splitlines()[:3] == [
        f"ID: {VIDEO_ID}",
        "Type: video",
        "Timestamp: 2022-12-24 18:00:00",
    ]
    email = synthetic.emails()[0]
    assert turns[EMAIL_IDS[0]].text == (
        f"ID: {EMAIL_IDS[0]}\nTimestamp: 2022-03-14 09:15:00\n"
        f"Summary: {email['short_summary']}\nDetail: {email['detail']}"
    )
    for unit_id, turn in turns.items():
        assert turn.text.splitlines()[0] == f"ID: {unit_id}"


def test_images_and_frames_are_the_dataset_images(dataset: Dataset) -> None:
    turns = {s.session_key: s.turns[0] for s in dataset.conversations[0].sessions}
    files = synthetic.bundle_files()
    for unit_id in IMAGE_IDS:
        (reference,) = turns[unit_id].images
        assert dataset.image_files[reference] == files[f"image/{reference}"]
    frames = turns[VIDEO_ID].images
    assert frames == tuple(
        frame_reference(f"{VIDEO_ID}.mp4", index) for index in range(1, FRAME_COUNT + 1)
    )
    assert len(frames) == FRAME_COUNT
    colours = []
    for reference in frames:
        with Image.open(io.BytesIO(dataset.image_files[reference])) as image:
            colours.append(image.convert("RGB").getpixel((32, 24)))
    assert len(set(colours)) == len(synthetic.VIDEO_COLOURS)  # a frame of each segment
    assert all(not turns[unit_id].images for unit_id in EMAIL_IDS)
    assert len(dataset.image_files) == len(IMAGE_IDS) + FRAME_COUNT


def test_questions_carry_answer_types_categories_and_evidence(dataset: Dataset) -> None:
    assert dataset.categories == dict(ATM_CATEGORIES)
    assert (dataset.scorer, dataset.track, dataset.evidence_rule) == (
        "atm_qs",
        "multimodal",
        "unit-id-v1",
    )
    records = synthetic.qa_records()
    assert [q.question_id for q in dataset.questions] == [f"owner:{r['id']}" for r in records]
    assert [q.answer_type for q in dataset.questions] == ["number"] * 3 + ["list_recall"] * 3 + [
        "open_end"
    ] * 3
    assert [q.category for q in dataset.questions] == [1] * 3 + [2] * 3 + [3] * 3
    assert all(q.category_name == q.answer_type for q in dataset.questions)
    for question, record in zip(dataset.questions, records, strict=True):
        assert (question.question, question.answer) == (record["question"], record["answer"])
        assert question.evidence == record["evidence_ids"]
        assert question.conversation_id == "owner" and not question.unanswerable
    assert dataset.questions[3].answer == f"{IMAGE_IDS[0]}, {IMAGE_IDS[1]}"


def test_evidence_named_with_a_file_suffix_is_its_unit_and_duplicates_count_once() -> None:
    files = synthetic.with_changes(
        {"atm-bench.json": qa_with(evidence_ids=[f"{IMAGE_IDS[0]}.png", IMAGE_IDS[0], ""])}
    )
    parsed = parse(synthetic.contents(files), manifest())
    assert parsed.questions[0].evidence == [IMAGE_IDS[0]]


def test_the_qa_file_may_be_an_object_with_qas_and_the_layout_of_the_release() -> None:
    files = synthetic.bundle_files()
    release = {
        "data/atm-bench/atm-bench-hard.json": synthetic.json_bytes(
            {"qas": synthetic.qa_records()}
        ),
        "data/raw_memory/email/emails.json": files["email/emails.json"],
        "data/processed_memory/image_batch_results.json": files["image/batch_results.json"],
        "output/video/qwen3vl2b/batch_results.json": files["video/batch_results.json"],
        **{f"data/raw_memory/{name}": content for name, content in files.items() if "." in name
           and not name.endswith(".json")},
    }  # fmt: skip
    parsed = parse(synthetic.contents(release), manifest())
    assert [s.session_key for s in parsed.conversations[0].sessions] == UNIT_ORDER
    assert len(parsed.questions) == 9 and len(parsed.image_files) == 3 + FRAME_COUNT


def test_file_kinds_by_path() -> None:
    assert file_kind("atm-bench.json") == "qa"
    assert file_kind("email/emails.json") == "emails"
    assert file_kind("output/image/qwen3vl2b/batch_results.json") == "image-batch"
    assert file_kind("video/batch_results.json") == "video-batch"
    assert file_kind("x/image/a.JPG") == "image"
    assert file_kind("video/a.mov") == "video"
    for path in ("notes.txt", "a.png", "image/a.mp4", "batch_results.json"):
        with pytest.raises(ValueError, match=repr(path)):
            file_kind(path)


def test_the_parse_is_the_same_every_time(dataset: Dataset) -> None:
    again = parse(synthetic.contents(prefix="atm/"), manifest())
    assert again == dataset and again.image_files == dataset.image_files


def test_the_bundle_is_the_same_bytes_in_another_process(tmp_path: Path) -> None:
    script = (
        "import hashlib, json, sys\n"
        "from aml_evaluation.atmbench.synthetic import bundle_files\n"
        "print(json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in bundle_files().items()}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    here = {k: hashlib.sha256(v).hexdigest() for k, v in synthetic.bundle_files().items()}
    assert json.loads(out) == here
    written = synthetic.write_bundle(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == sorted(here)


# --- Add requests ---------------------------------------------------------------------------------


def test_the_chunker_sends_one_add_per_unit_with_its_images(dataset: Dataset) -> None:
    adds = plan_adds(dataset, "run1")
    assert len(adds) == len(UNIT_ORDER)
    for add, unit_id in zip(adds, UNIT_ORDER, strict=True):
        (message,) = add.request.messages
        assert message.role == "user"
        if unit_id in EMAIL_IDS:
            assert isinstance(message.content, str)
            assert message.content.splitlines()[0] == f"ID: {unit_id}"
            continue
        assert isinstance(message.content, list)
        text, *images = message.content
        assert isinstance(text, TextPart) and text.text.splitlines()[0] == f"ID: {unit_id}"
        assert all(isinstance(part, ImageUrlPart) for part in images)
        assert len(images) == (FRAME_COUNT if unit_id == VIDEO_ID else 1)
        first = images[0]
        assert isinstance(first, ImageUrlPart)
        mime, _ = parse_data_url(first.image_url.url)
        assert mime == ("image/jpeg" if unit_id in (VIDEO_ID, IMAGE_IDS[1]) else "image/png")
    times = [add.request.messages[0].timestamp for add in adds]
    assert times == [s.timestamp_ms for s in dataset.conversations[0].sessions]


# --- registration ---------------------------------------------------------------------------------


def add(root: Path, *args: str) -> int:
    return main(["dataset", "add", *args, "--datasets-root", str(root)])


def test_aml_dataset_add_registers_a_bundle_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "datasets"
    written = synthetic.write_bundle(root / "atm")
    assert add(root, str(root / "atm"), "--format", "atm-bench", "--id", "atm-small") == 0
    out = capsys.readouterr().out
    assert out.startswith("added atm-small (atm-bench, multimodal, 9 questions)")
    manifest_file = read_manifest(root / "manifests" / "atm-small.json")
    assert (manifest_file.format, manifest_file.scorer, manifest_file.track) == (
        "atm-bench",
        "atm_qs",
        "multimodal",
    )
    assert manifest_file.categories == dict(ATM_CATEGORIES)
    assert manifest_file.question_counts == {1: 3, 2: 3, 3: 3}
    assert manifest_file.excluded_from_overall == []
    assert [entry.path for entry in manifest_file.files] == [
        path.relative_to(root).as_posix() for path in written
    ]
    for entry, path in zip(manifest_file.files, written, strict=True):
        assert entry.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    loaded = load_dataset("atm-small", root)
    assert len(loaded.conversations[0].sessions) == len(UNIT_ORDER)
    assert len(loaded.image_files) == 3 + FRAME_COUNT
    # Again: a no-op.
    assert add(root, str(root / "atm"), "--format", "atm-bench", "--id", "atm-small") == 0
    assert capsys.readouterr().out.startswith("unchanged atm-small")
    # A listed image removed afterwards: the dataset no longer loads.
    (root / "atm" / "image" / f"{IMAGE_IDS[0]}.png").unlink()
    with pytest.raises(DatasetFileError, match=f"{IMAGE_IDS[0]}.png"):
        load_dataset("atm-small", root)


def test_a_bad_bundle_is_refused_with_its_reason_and_nothing_is_registered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "datasets"
    files = synthetic.with_changes({"atm-bench.json": qa_with(evidence_ids=["email209901010001"])})
    synthetic.write_bundle(root / "atm", files)
    assert add(root, str(root / "atm"), "--format", "atm-bench", "--id", "atm-bad") == 2
    error = capsys.readouterr().err
    assert "evidence id 'email209901010001' is no unit of the corpus" in error
    assert "record 0" in error and "atm/atm-bench.json" in error
    assert not (root / "manifests").exists()
    (root / "atm" / "notes.txt").write_text("hello")
    with pytest.raises(RegistrationError, match=r"notes\.txt"):
        register_dataset(root / "atm", "atm-bench", "atm-bad", root)
    assert not (root / "manifests").exists()


# --- refused bundles ------------------------------------------------------------------------------


def test_an_unknown_evidence_id_is_refused() -> None:
    refused(
        synthetic.with_changes({"atm-bench.json": qa_with(evidence_ids=["20990101_000000"])}),
        r"record 0 \(id 'q1'\): evidence id '20990101_000000' is no unit",
    )


def test_duplicate_unit_ids_are_refused() -> None:
    files = synthetic.bundle_files()
    refused(
        synthetic.with_changes({f"image/{IMAGE_IDS[0]}.jpg": files[f"image/{IMAGE_IDS[1]}.jpg"]}),
        f"unit id '{IMAGE_IDS[0]}' is also",
    )
    emails = synthetic.emails()
    emails.append(dict(emails[0]))
    refused(
        synthetic.with_changes({"email/emails.json": synthetic.json_bytes(emails)}),
        f"email 3: unit id '{EMAIL_IDS[0]}' is also",
    )
    entries = synthetic.image_batch_results()
    entries.append(dict(entries[0]))
    refused(
        synthetic.with_changes({"image/batch_results.json": synthetic.json_bytes(entries)}),
        f"entry 3: unit id '{IMAGE_IDS[0]}' is also",
    )
    records = synthetic.qa_records()
    records.append(dict(records[0]))
    refused(
        synthetic.with_changes({"atm-bench.json": synthetic.json_bytes(records)}),
        "question id 'owner:q1' is also",
    )


@pytest.mark.parametrize(
    "video",
    [synthetic.video()[:400], b"\x00\x00\x00\x18ftypmp42" + b"\xff" * 300, b""],
    ids=["truncated", "garbage", "empty"],
)
def test_a_broken_video_is_refused_naming_it(video: bytes) -> None:
    refused(synthetic.with_changes({synthetic.VIDEO_FILE: video}), repr(synthetic.VIDEO_FILE))


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"questions": []}, "a JSON list of QA records or an object with a 'qas' list"),
        ("just text", "a JSON list of QA records"),
        ([["q1"]], r"record 0: not an object"),
        ([{"id": "q1", "question": "Why?", "evidence_ids": []}], "needs an answer"),
        ([{"question": "Why?", "answer": "x"}], "record 0: needs an id"),
        ([{"id": "q", "question": "Why?", "answer": "x", "evidence_ids": "a"}], "list of strings"),
    ],
)
def test_a_malformed_qa_file_is_refused_naming_it(payload: object, match: str) -> None:
    files = synthetic.with_changes({"atm-bench.json": json.dumps(payload).encode()})
    refused(files, f"'atm-bench.json'.*{match}")


def test_other_malformed_files_are_refused() -> None:
    refused(synthetic.with_changes({"atm-bench.json": b"{not json"}), "'atm-bench.json': not JSON")
    refused(synthetic.with_changes({"atm-bench.json": None}), "lists no QA file")
    refused(synthetic.with_changes({"email/emails.json": b'{"id": 1}'}), "'email/emails.json'")
    refused(
        synthetic.with_changes({f"image/{IMAGE_IDS[0]}.png": b"not a png"}),
        f"image/{IMAGE_IDS[0]}.png",
    )
    refused(synthetic.with_changes({"readme.md": b"hi"}), "'readme.md'")
    refused(synthetic.with_changes({"extra/emails.json": b"[]"}), "already has its emails file")
    emails = synthetic.emails()
    emails[0] = emails[0] | {"id": "memo-1", "timestamp": "someday"}
    refused(
        synthetic.with_changes({"email/emails.json": synthetic.json_bytes(emails)}),
        "unit 'memo-1' has no usable timestamp",
    )


def test_a_missing_media_file_leaves_a_text_only_unit_but_its_evidence_still_resolves() -> None:
    files = synthetic.with_changes({f"image/{IMAGE_IDS[0]}.png": None})
    parsed = parse(synthetic.contents(files), manifest())
    turns = {s.session_key: s.turns[0] for s in parsed.conversations[0].sessions}
    assert turns[IMAGE_IDS[0]].images == ()
    assert f"{IMAGE_IDS[0]}.png" not in parsed.image_files


def test_a_manifest_missing_a_category_is_refused() -> None:
    with pytest.raises(ValueError, match="category 3"):
        parse(synthetic.contents(), manifest(categories={1: "number", 2: "list_recall"}))
