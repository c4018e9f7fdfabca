"""A dataset read a piece at a time for planning (`registry.open_dataset_stream`): the files'
sha256 checked in blocks first, then LoCoMo and LongMemEval files read an item at a time with
ijson and parsed by the format's own rules. The pieces, and the parts the scheduler plans from
them (`planning.parts_of`), are the whole parse's; what the stream cannot read as `json.loads`
would is parsed whole, with the whole parse's result or error."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from scripts import load_benchmark

from aml_evaluation import longmemeval, registry
from aml_evaluation.datasets import Dataset, ItemFormat
from aml_evaluation.registration import register_dataset
from aml_evaluation.registry import (
    MANIFESTS_DIR,
    DatasetFileError,
    DatasetStream,
    load_dataset,
    open_dataset_stream,
)
from aml_scheduler.planning import dataset_parts, parts_of

ROOT = Path(__file__).resolve().parents[2]
SYNTHETIC = MANIFESTS_DIR.parent / "synthetic" / "synthetic_v1.json"
STREAMING = ROOT / "tests" / "data" / "streaming" / "streaming_v1.json"
TURNS_PER_PART = (1, 20, 300, 5_000, 10**9)


def _generator() -> ModuleType:
    """The load benchmark's LoCoMo-format generator (`--scenario scale`)."""
    return load_benchmark("pipeline_load_stream")


def _register(root: Path, name: str, data: bytes, format_name: str = "locomo") -> str:
    path = root / "files" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    dataset_id = path.stem.lower().replace("_", "-")
    register_dataset(path, format_name, dataset_id, root)
    return dataset_id


def _alter(root: Path, name: str, data: bytes) -> None:
    """Replace a registered file's bytes, keeping its manifest's sha256 in line."""
    path = root / "files" / name
    manifest_file = root / "manifests" / f"{path.stem.lower().replace('_', '-')}.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["files"][0]["sha256"] = hashlib.sha256(data).hexdigest()
    manifest_file.write_text(json.dumps(manifest))
    path.write_bytes(data)


def _same_as_whole(stream: DatasetStream, whole: Dataset) -> None:
    assert stream.dataset == whole.model_copy(update={"conversations": [], "questions": []})
    pieces = list(stream.pieces())
    assert [c for piece in pieces for c in piece.conversations] == whole.conversations
    assert [q for piece in pieces for q in piece.questions] == whole.questions
    for turns in TURNS_PER_PART:
        assert list(parts_of(stream.pieces(), turns)) == list(dataset_parts(whole, turns))


def test_the_shipped_sample_streams_into_the_parts_of_the_whole() -> None:
    manifest, stream = open_dataset_stream("synthetic", Path("/nonexistent"))
    whole = load_dataset("synthetic", Path("/nonexistent"))
    assert manifest.dataset_id == "synthetic"
    assert stream.streamed and stream.parsed_whole is None
    # One piece per sample, each a whole conversation with its questions.
    assert len(list(stream.pieces())) == len(whole.conversations) > 1
    _same_as_whole(stream, whole)


def test_a_generated_dataset_and_a_streaming_one_stream_as_parsed_whole(tmp_path: Path) -> None:
    generator = _generator()
    generated = tmp_path / "scale.json"
    generator.write_scale_dataset(generated, generator.Size(adds=120, questions=30, users=7))
    for name, data in (
        ("scale.json", generated.read_bytes()),
        ("str.json", STREAMING.read_bytes()),
    ):
        dataset_id = _register(tmp_path, name, data)
        _, stream = open_dataset_stream(dataset_id, tmp_path)
        assert stream.streamed
        _same_as_whole(stream, load_dataset(dataset_id, tmp_path))
        assert stream.parsed_whole is None


def _instances() -> list[dict[str, Any]]:
    """LongMemEval instances (a question and its haystack each), of several types."""
    types = ("single-session-user", "multi-session", "temporal-reasoning", "knowledge-update")
    return [
        {
            "question_id": f"q{n}" + ("_abs" if n == 3 else ""),
            "question_type": types[n % len(types)],
            "question": f"What did I say in session {n}?",
            "answer": f"gold {n}",
            "question_date": "2023/05/30 (Tue) 23:40",
            "haystack_session_ids": [f"s{n}a", f"s{n}b"],
            # The second first: sessions are sorted by date.
            "haystack_dates": ["2023/05/22 (Mon) 10:05", "2023/05/20 (Sat) 02:21"],
            "haystack_sessions": [
                [{"role": "user", "content": f"Fact {n}."}, {"role": "assistant", "content": "Ok"}],
                [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  "}],
            ],
        }
        for n in range(6)
    ]


def test_a_longmemeval_file_streams_as_parsed_whole(tmp_path: Path) -> None:
    dataset_id = _register(tmp_path, "lme.json", json.dumps(_instances()).encode(), "longmemeval")
    _, stream = open_dataset_stream(dataset_id, tmp_path)
    assert stream.streamed
    _same_as_whole(stream, load_dataset(dataset_id, tmp_path))
    assert stream.parsed_whole is None


def test_formats_that_cannot_stream_are_parsed_whole() -> None:
    # Mem-Gallery (one dialog file per conversation, with images), like PersonaMem.
    _, stream = open_dataset_stream("synthetic_multimodal", Path("/nonexistent"))
    assert not stream.streamed
    _same_as_whole(stream, load_dataset("synthetic_multimodal", Path("/nonexistent")))


@pytest.mark.parametrize(
    "data",
    [
        b"\xef\xbb\xbf" + SYNTHETIC.read_bytes(),  # a byte-order mark
        SYNTHETIC.read_bytes().replace(b"Mira", b"Mi\\ud800ra", 1),  # a lone surrogate
        SYNTHETIC.read_bytes().replace(b"Mira", b"Mi\\ud83d\\ud83dra", 1),  # two high ones
        SYNTHETIC.read_bytes().replace(b"[", b"\x0c[", 1),  # whitespace to yajl only
    ],
    ids=["bom", "lone-surrogate", "high-high", "form-feed"],
)
def test_files_ijson_would_read_otherwise_are_parsed_whole(tmp_path: Path, data: bytes) -> None:
    dataset_id = _register(tmp_path, "odd.json", SYNTHETIC.read_bytes())
    _alter(tmp_path, "odd.json", data)
    try:
        whole = load_dataset(dataset_id, tmp_path)
    except DatasetFileError as error:
        # Refused when opened, as by the whole parse (so before anything is planned).
        with pytest.raises(DatasetFileError) as raised:
            open_dataset_stream(dataset_id, tmp_path)
        assert str(raised.value) == str(error)
    else:
        _, stream = open_dataset_stream(dataset_id, tmp_path)
        assert not stream.streamed
        _same_as_whole(stream, whole)


def test_a_surrogate_pair_streams(tmp_path: Path) -> None:
    data = SYNTHETIC.read_bytes().replace(b"Mira", b"Mi\\ud83d\\ude00ra", 1)
    dataset_id = _register(tmp_path, "emoji.json", data)
    _, stream = open_dataset_stream(dataset_id, tmp_path)
    assert stream.streamed
    whole = load_dataset(dataset_id, tmp_path)
    assert whole.conversations[0].speakers[0] == "Mi\U0001f600ra Okafor"
    _same_as_whole(stream, whole)


def test_what_ijson_refuses_but_json_reads_is_finished_parsed_whole(tmp_path: Path) -> None:
    samples: list[dict[str, Any]] = json.loads(SYNTHETIC.read_bytes())
    samples[1]["observation"] = 10**30  # ignored by the parser; past yajl's integers
    dataset_id = _register(tmp_path, "big.json", json.dumps(samples).encode())
    _, stream = open_dataset_stream(dataset_id, tmp_path)
    assert stream.streamed
    _same_as_whole(stream, load_dataset(dataset_id, tmp_path))
    assert stream.parsed_whole is not None and "JSON" in stream.parsed_whole


def test_an_altered_file_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    dataset_id = _register(tmp_path, "mine.json", SYNTHETIC.read_bytes())
    with (tmp_path / "files" / "mine.json").open("ab") as handle:
        handle.write(b"\n")
    with pytest.raises(DatasetFileError, match=r"'files/mine.json'.*manifest expects") as raised:
        open_dataset_stream(dataset_id, tmp_path)
    with pytest.raises(DatasetFileError) as whole:
        load_dataset(dataset_id, tmp_path)
    assert str(raised.value) == str(whole.value)
    (tmp_path / "files" / "mine.json").unlink()
    with pytest.raises(DatasetFileError, match="cannot be read"):
        open_dataset_stream(dataset_id, tmp_path)


def test_a_file_changed_while_it_is_read_fails_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset_id = _register(tmp_path, "mine.json", SYNTHETIC.read_bytes())
    # Small blocks: most of the file is read after the first piece, so after this change.
    monkeypatch.setattr(registry, "_READ_BLOCK", 16)
    _, stream = open_dataset_stream(dataset_id, tmp_path)
    pieces = stream.pieces()
    next(pieces)
    data = SYNTHETIC.read_bytes()
    (tmp_path / "files" / "mine.json").write_bytes(data.replace(b"Wen Li", b"Wen Lu"))
    with pytest.raises(DatasetFileError, match="manifest expects"):
        list(pieces)


@pytest.mark.parametrize(
    "change",
    ["truncated", "not-a-list", "bad-category", "missing-field", "duplicate-id", "not-objects"],
)
def test_a_malformed_file_fails_with_the_whole_parses_error(tmp_path: Path, change: str) -> None:
    samples: list[Any] = json.loads(SYNTHETIC.read_bytes())
    if change == "bad-category":
        samples[2]["qa"][0]["category"] = 9
    elif change == "missing-field":
        del samples[1]["conversation"]
    elif change == "duplicate-id":
        samples[2]["sample_id"] = samples[0]["sample_id"]
    elif change == "not-objects":
        samples.insert(1, [1])
    data = json.dumps(samples).encode()
    if change == "truncated":
        data = data[: len(data) // 2]
    elif change == "not-a-list":
        data = json.dumps({"samples": samples}).encode()
    dataset_id = _register(tmp_path, "mine.json", SYNTHETIC.read_bytes())
    _alter(tmp_path, "mine.json", data)
    with pytest.raises(DatasetFileError) as whole:
        load_dataset(dataset_id, tmp_path)
    with pytest.raises(DatasetFileError) as streamed:
        # When opened (a file that does not start with a list) or once the stream meets it.
        _, stream = open_dataset_stream(dataset_id, tmp_path)
        list(parts_of(stream.pieces(), 1))
    assert type(streamed.value) is type(whole.value)
    assert str(streamed.value) == str(whole.value)


def test_the_bundles_bounds_hold_across_items(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset_id = _register(tmp_path, "lme.json", json.dumps(_instances()).encode(), "longmemeval")
    for instances, turns, message in ((2, 10**9, "more than 2 instances"),
                                      (10**5, 5, "more than 5 turns")):  # fmt: skip
        # Each instance alone within the bounds: only the whole read passes them.
        monkeypatch.setattr(longmemeval, "MAX_INSTANCES", instances)
        monkeypatch.setattr(longmemeval, "MAX_TOTAL_TURNS", turns)
        items = ItemFormat(longmemeval.parse_instances, max_items=instances, max_turns=turns)
        monkeypatch.setattr(longmemeval, "ITEMS", items)
        _, stream = open_dataset_stream(dataset_id, tmp_path)
        assert stream.streamed
        with pytest.raises(DatasetFileError, match=message):
            list(stream.pieces())
