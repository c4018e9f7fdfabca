"""Dataset loading: LoCoMo parsing rules, the date rule and hash-checked bundles."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from aml_evaluation.datasets import (
    LOCOMO_CATEGORIES,
    Dataset,
    parse_locomo,
    parse_locomo_datetime,
)
from aml_evaluation.registry import (
    DatasetFileError,
    bundle_hash,
    load_bundle,
    load_dataset,
    manifest_path,
    read_manifest,
)
from aml_evaluation.scoring import F1_VARIANTS

LOCOMO_SHA256 = "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"
REFINED_SHA256 = "8f941d1c22ab3dee4cb72521fbccc82d24c30208590a15b0b4005a2f927ff769"


def _categories(dataset: Dataset) -> dict[int, int]:
    return dict(sorted(Counter(question.category for question in dataset.questions).items()))


def _sample(**conversation: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"speaker_a": "Ann", "speaker_b": "Bob"}
    base.update(conversation)
    return {"sample_id": "s-1", "conversation": base, "qa": []}


def _turn(dia_id: str, speaker: str = "Ann", **extra: Any) -> dict[str, Any]:
    return {"speaker": speaker, "dia_id": dia_id, "text": f"text {dia_id}", **extra}


# --- date rule -------------------------------------------------------------------------------


# Expected values checked with GNU `date -u -d "2023-05-08 13:56" +%s` and the like.
@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        (
            "1:56 pm on 8 May, 2023",
            1_683_554_160_000,
        ),  # 2023-05-08T13:56:00Z
        ("10:37 am on 27 June, 2023", 1_687_862_220_000),  # 2023-06-27T10:37:00Z
        ("12:05 am on 9 March, 2024", 1_709_942_700_000),  # just after midnight
        ("12:15 pm on 14 February, 2024", 1_707_912_900_000),  # just after noon
        ("9:00 AM on 1 january, 1970", 32_400_000),  # case-insensitive
    ],
)
def test_locomo_date_is_utc_wall_clock(text: str, expected_ms: int) -> None:
    assert parse_locomo_datetime(text) == expected_ms


@pytest.mark.parametrize(
    "text",
    [
        "",
        "8 May 2023",
        "13:56 pm on 8 May, 2023",
        "1:60 pm on 8 May, 2023",
        "1:56 pm on 31 April, 2023",
        "1:56 pm on 8 Mai, 2023",
        "1:56 on 8 May, 2023",
    ],
)
def test_bad_locomo_date_is_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="not a LoCoMo date"):
        parse_locomo_datetime(text)


def test_unparseable_session_date_names_sample_and_session() -> None:
    sample = _sample(session_1=[_turn("D1:1")], session_1_date_time="yesterday")
    with pytest.raises(ValueError, match=r"sample 's-1' session_1: .*yesterday"):
        parse_locomo([sample], "d", "v")


def test_missing_session_date_names_sample_and_session() -> None:
    sample = _sample(session_3=[_turn("D3:1")])
    with pytest.raises(ValueError, match=r"sample 's-1' session_3: missing session_3_date_time"):
        parse_locomo([sample], "d", "v")


# --- LoCoMo parsing rules on a small inline sample ------------------------------------------


def test_sessions_sorted_numerically_and_empty_ones_skipped() -> None:
    date = "1:00 pm on 1 May, 2023"
    sample = _sample(
        session_10=[_turn("D10:1")],
        session_10_date_time=date,
        session_2=[_turn("D2:1", "Bob")],
        session_2_date_time=date,
        session_3=[],
        session_3_date_time=date,
        session_4_date_time=date,  # a date without a session, as in conv-26
        session_1=[_turn("D1:1", img_url=["u"], blip_caption="a photo of a cat")],
        session_1_date_time=date,
    )
    conversation = parse_locomo([sample], "d", "v").conversations[0]
    assert [s.session_key for s in conversation.sessions] == [
        "session_1",
        "session_2",
        "session_10",
    ]
    assert [s.index for s in conversation.sessions] == [1, 2, 10]
    assert conversation.speakers == ("Ann", "Bob")
    assert conversation.sessions[0].turns[0].image_caption == "a photo of a cat"
    assert conversation.sessions[1].turns[0].image_caption is None


def test_question_fields() -> None:
    sample = _sample()
    sample["qa"] = [
        {"question": "Q?", "answer": 2022, "evidence": ["D1:1"], "category": 2},
        {"question": "Q?", "adversarial_answer": "trap", "evidence": [], "category": 5},
        {
            "question": "Q?",
            "answer": "No",
            "adversarial_answer": "Yes",
            "evidence": [],
            "category": 5,
        },
    ]
    questions = parse_locomo([sample], "d", "v").questions
    assert [q.question_id for q in questions] == ["s-1:q0000", "s-1:q0001", "s-1:q0002"]
    # The trap of an adversarial item is never its gold: that item has none (abstention);
    # an adversarial item whose transcript supports an `answer` keeps it.
    assert [q.answer for q in questions] == ["2022", None, "No"]
    assert [q.adversarial_answer for q in questions] == [None, "trap", "Yes"]
    assert [q.unanswerable for q in questions] == [False, True, False]
    assert [q.adversarial for q in questions] == [False, True, True]
    assert [q.category_name for q in questions] == ["temporal", "adversarial", "adversarial"]
    assert questions[0].evidence == ["D1:1"]
    assert questions[0].options is None


def test_question_without_any_answer_is_rejected() -> None:
    sample = _sample()
    sample["qa"] = [{"question": "Q?", "evidence": [], "category": 4}]
    with pytest.raises(ValueError, match=r"qa\[0\]: no answer"):
        parse_locomo([sample], "d", "v")


def test_only_an_adversarial_item_may_lack_an_answer() -> None:
    sample = _sample()
    sample["qa"] = [{"question": "Q?", "adversarial_answer": "trap", "evidence": [], "category": 4}]
    with pytest.raises(ValueError, match=r"qa\[0\]: no answer \(only an adversarial item"):
        parse_locomo([sample], "d", "v")


# --- the real LoCoMo files -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("relative", "total", "per_category"),
    [
        ("locomo/locomo10.json", 1986, {1: 282, 2: 321, 3: 96, 4: 841, 5: 446}),
        ("locomo-dial481-fix/locomo10.json", 1985, {1: 282, 2: 321, 3: 95, 4: 841, 5: 446}),
    ],
)
def test_real_locomo_counts(
    datasets_root: Path, relative: str, total: int, per_category: dict[int, int]
) -> None:
    dataset = parse_locomo(json.loads((datasets_root / relative).read_bytes()), "x", "v")
    assert len(dataset.conversations) == 10
    assert sum(len(c.sessions) for c in dataset.conversations) == 272
    assert sum(len(s.turns) for c in dataset.conversations for s in c.sessions) == 5882
    assert len(dataset.questions) == total
    assert _categories(dataset) == per_category
    ids = [q.question_id for q in dataset.questions]
    assert len(set(ids)) == len(ids)
    # Question strings repeat in LoCoMo, which is why ids are positional.
    assert len({(q.conversation_id, q.question) for q in dataset.questions}) < total
    for conversation in dataset.conversations:
        keys = [s.index for s in conversation.sessions]
        assert keys == sorted(keys)
        stamps = [s.timestamp_ms for s in conversation.sessions]
        assert all(stamp > 0 for stamp in stamps)


def test_real_locomo_answers(datasets_root: Path) -> None:
    samples = json.loads((datasets_root / "locomo/locomo10.json").read_bytes())
    dataset = parse_locomo(samples, "locomo", "v")
    by_id = {q.question_id: q for q in dataset.questions}
    # qa[1] of conv-26 has the integer answer 2022 in the source.
    assert by_id["conv-26:q0001"].answer == "2022"
    assert by_id["conv-26:q0040"].answer == "2"
    # Category 5 with only adversarial_answer: no gold (the trap is kept apart).
    adversarial = [q for q in dataset.questions if q.category == 5]
    assert all(q.adversarial for q in adversarial)
    assert all(q.adversarial_answer for q in adversarial)
    assert sum(q.unanswerable for q in adversarial) == 444
    assert not any(q.unanswerable for q in dataset.questions if q.category != 5)
    first = adversarial[0]
    assert first.question == "What did Caroline realize after her charity race?"
    assert first.answer is None
    assert first.adversarial_answer == "self-care is important"
    # Two category-5 items carry both fields; the transcript supports `answer`.
    bowl = next(q for q in adversarial if "black and white bowl" in q.question)
    assert (bowl.answer, bowl.adversarial_answer) == ("No", "Yes")
    first_session = dataset.conversations[0].sessions[0]
    assert first_session.date_text == "1:56 pm on 8 May, 2023"
    assert first_session.timestamp_ms == 1_683_554_160_000
    captions = [
        t.image_caption
        for c in dataset.conversations
        for s in c.sessions
        for t in s.turns
        if t.image_caption is not None
    ]
    assert len(captions) == 1226  # every turn with blip_caption, with or without img_url


def test_shipped_locomo_bundles(datasets_root: Path) -> None:
    locomo = load_dataset("locomo", datasets_root)
    refined = load_dataset("locomo_refined", datasets_root)
    assert (locomo.dataset_id, len(locomo.questions)) == ("locomo", 1986)
    assert (refined.dataset_id, len(refined.questions)) == ("locomo_refined", 1985)
    assert read_manifest(manifest_path("locomo", None)).files[0].sha256 == LOCOMO_SHA256
    assert read_manifest(manifest_path("locomo_refined", None)).files[0].sha256 == REFINED_SHA256
    assert read_manifest(manifest_path("locomo", None)).excluded_from_overall == [5]


@pytest.mark.parametrize("dataset_id", ["locomo", "locomo_refined", "synthetic"])
def test_every_manifest_declares_a_known_f1_variant(dataset_id: str) -> None:
    """LoCoMo's own data is scored as LoCoMo's code scores it, per category; that variant
    reads LoCoMo's category numbers, so a manifest declaring it must number them the same."""
    manifest = read_manifest(manifest_path(dataset_id, None))
    assert manifest.f1_variant in F1_VARIANTS
    if dataset_id.startswith("locomo"):
        assert manifest.f1_variant == "f1-locomo-category-v1"
    if manifest.f1_variant == "f1-locomo-category-v1":
        assert manifest.categories == {
            1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial",
        }  # fmt: skip
        assert manifest.categories == LOCOMO_CATEGORIES


# --- bundles -------------------------------------------------------------------------------


def _write_bundle(directory: Path, data: bytes, sha256: str) -> Path:
    (directory / "data").mkdir()
    (directory / "data" / "tiny.json").write_bytes(data)
    manifest = {
        "dataset_id": "tiny",
        "version": "1",
        "format": "locomo",
        "scorer": "token_f1",
        "categories": {"4": "single-hop"},
        "excluded_from_overall": [],
        "files": [{"path": "data/tiny.json", "sha256": sha256}],
    }
    path = directory / "manifest.json"
    path.write_text(json.dumps(manifest))
    return path


def _tiny() -> bytes:
    sample = _sample(session_1=[_turn("D1:1")], session_1_date_time="1:00 pm on 1 May, 2023")
    sample["qa"] = [{"question": "Q?", "answer": "A", "evidence": ["D1:1"], "category": 4}]
    return json.dumps([sample]).encode()


def test_bundle_loads_with_manifest_metadata(tmp_path: Path) -> None:
    import hashlib

    data = _tiny()
    dataset = load_bundle(_write_bundle(tmp_path, data, hashlib.sha256(data).hexdigest()))
    assert (dataset.dataset_id, dataset.version, dataset.scorer) == ("tiny", "1", "token_f1")
    assert dataset.categories == {4: "single-hop"}
    assert dataset.questions[0].category_name == "single-hop"


def test_bundle_sha_mismatch_names_the_file(tmp_path: Path) -> None:
    path = _write_bundle(tmp_path, _tiny(), "0" * 64)
    with pytest.raises(DatasetFileError, match=r"'data/tiny.json'.*manifest expects 0{64}"):
        load_bundle(path)


def test_bundle_missing_file_names_the_file(tmp_path: Path) -> None:
    path = _write_bundle(tmp_path, _tiny(), "0" * 64)
    (tmp_path / "data" / "tiny.json").unlink()
    with pytest.raises(DatasetFileError, match=r"'data/tiny.json' cannot be read"):
        load_bundle(path)


def test_locomo_bundle_detects_modified_copy(datasets_root: Path, tmp_path: Path) -> None:
    copy = tmp_path / "locomo"
    copy.mkdir()
    shutil.copyfile(datasets_root / "locomo/locomo10.json", copy / "locomo10.json")
    with (copy / "locomo10.json").open("ab") as handle:
        handle.write(b"\n")
    with pytest.raises(DatasetFileError, match=r"'locomo/locomo10.json'.*manifest expects"):
        load_bundle(manifest_path("locomo", None), tmp_path)


def test_bundle_hash_is_canonical(tmp_path: Path) -> None:
    manifest = read_manifest(manifest_path("synthetic", None))
    # Same content, different key order and whitespace: same hash.
    shuffled = tmp_path / "m.json"
    raw = json.loads(manifest_path("synthetic", None).read_text())
    shuffled.write_text(json.dumps(dict(reversed(list(raw.items())))))
    assert bundle_hash(read_manifest(shuffled)) == bundle_hash(manifest)
    changed = manifest.model_copy(update={"version": "v2"})
    assert bundle_hash(changed) != bundle_hash(manifest)
    assert (
        len(
            {
                bundle_hash(read_manifest(manifest_path(d, None)))
                for d in ("locomo", "locomo_refined", "synthetic")
            }
        )
        == 3
    )


def test_unknown_or_unsafe_dataset_id() -> None:
    with pytest.raises(KeyError, match="unknown dataset"):
        manifest_path("nope", None)
    with pytest.raises(KeyError, match="invalid dataset id"):
        manifest_path("../manifests/locomo", None)


# --- the shipped synthetic dataset ----------------------------------------------------------


def test_synthetic_loads_from_the_package(tmp_path: Path) -> None:
    # The datasets root is irrelevant for a dataset shipped inside the package.
    dataset = load_dataset("synthetic", tmp_path)
    assert [c.conversation_id for c in dataset.conversations] == ["syn-1", "syn-2", "syn-3"]
    assert len(dataset.questions) == 30
    assert _categories(dataset) == {1: 6, 2: 7, 3: 4, 4: 9, 5: 4}
    assert [len(c.sessions) for c in dataset.conversations] == [4, 3, 3]
    by_id = {q.question_id: q for q in dataset.questions}
    assert by_id["syn-1:q0002"].answer == "4"  # integer in the file
    turn_ids = {
        (c.conversation_id, t.turn_id)
        for c in dataset.conversations
        for s in c.sessions
        for t in s.turns
    }
    for question in dataset.questions:
        assert question.evidence
        assert all((question.conversation_id, e) in turn_ids for e in question.evidence)


def test_synthetic_file_matches_its_generator() -> None:
    import importlib.util

    script = manifest_path("synthetic", None).parents[1] / "synthetic" / "generate.py"
    spec = importlib.util.spec_from_file_location("aml_synthetic_generate", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rendered = module.render()
    assert isinstance(rendered, bytes)
    assert rendered == (script.parent / "synthetic_v1.json").read_bytes()
    assert len(rendered) < 60_000
