"""The multimodal track's Add and Search bodies (chunk-mm-v1, aml_evaluation.chunker): the shipped
synthetic multimodal dataset, the media limits of a chunk, and refusals that never drop an image."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from aml_contract.participant import AddRequest, SearchRequest
from aml_evaluation import media
from aml_evaluation.chunker import (
    CHUNKER_VERSION,
    MULTIMODAL_CHUNKER_VERSION,
    check_media_limits,
    chunker_version,
    plan_adds,
    search_query,
)
from aml_evaluation.datasets import Conversation, Dataset, Question, Session, Turn
from aml_evaluation.isolation import content_text, text_digest
from aml_evaluation.registry import (
    PACKAGE_DATA_DIR,
    DatasetFileError,
    load_dataset,
    parse_contents,
    read_verified,
    registered,
)
from aml_scheduler.planning import plan_chunks, plan_questions, plan_written_texts

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def synthetic() -> Dataset:
    return load_dataset("synthetic_multimodal", Path("/nonexistent"))


def _turns(dataset: Dataset) -> list[Turn]:
    return [t for c in dataset.conversations for s in c.sessions for t in s.turns]


def test_turns_with_images_are_sent_as_text_then_data_url_images(synthetic: Dataset) -> None:
    adds = plan_adds(synthetic, "job-1")
    messages = [m for add in adds for m in add.request.messages]
    turns = _turns(synthetic)
    assert len(messages) == len(turns)
    for turn, message in zip(turns, messages, strict=True):
        if not turn.images:
            assert message.content == turn.text  # as chunk-v1 sends it
            continue
        assert isinstance(message.content, list)
        text, *images = message.content
        # The turn's words, without the text track's "[shares an image: ...]" suffix.
        assert text.model_dump() == {"type": "text", "text": turn.text}
        assert len(images) == len(turn.images)
        for reference, part in zip(turn.images, images, strict=True):
            url = part.model_dump()["image_url"]["url"]
            assert media.parse_data_url(url) == ("image/png", synthetic.image_files[reference])
    two = next(m for m in messages if isinstance(m.content, list) and len(m.content) == 3)
    assert two.role == "user"
    assert (chunker_version(synthetic), MULTIMODAL_CHUNKER_VERSION) == ("chunk-mm-v1",) * 2


def test_the_same_dataset_on_the_text_track_sends_captions(synthetic: Dataset) -> None:
    textual = synthetic.model_copy(update={"track": "textual"})
    messages = [m for add in plan_adds(textual, "job-1") for m in add.request.messages]
    assert all(isinstance(m.content, str) for m in messages)
    assert chunker_version(textual) == CHUNKER_VERSION
    questions = plan_questions("job-1", textual, top_k=5)
    assert all(isinstance(_search(q.search_body)["query"], str) for q in questions)


def _search(body: bytes | None) -> dict[str, Any]:
    assert body is not None
    loaded: dict[str, Any] = json.loads(body)
    return loaded


def test_questions_that_show_an_image_search_with_it(synthetic: Dataset) -> None:
    documents = plan_questions("job-1", synthetic, top_k=5)
    by_id = {q.question_id: q for q in synthetic.questions}
    shown = 0
    for document in documents:
        query = SearchRequest.model_validate_json(document.search_body or b"").query
        question = by_id[document.question_id]
        if not question.images:
            assert query == question.question
            continue
        shown += 1
        assert isinstance(query, list) and len(query) == 2
        assert query[0].model_dump() == {"type": "text", "text": question.question}
        url = query[1].model_dump()["image_url"]["url"]
        assert media.parse_data_url(url)[1] == synthetic.image_files[question.images[0]]
        assert document.question == question.question  # what the answerer is asked
    assert shown == 3


def test_bodies_are_built_once_and_written_texts_count_text_parts(synthetic: Dataset) -> None:
    first = plan_chunks("job-1", synthetic)
    assert [c.body for c in first] == [c.body for c in plan_chunks("job-1", synthetic)]
    texts = plan_written_texts("job-1", [c.body for c in first if c.body is not None])
    # A content array counts by its text parts: the leak check never compares images.
    messages = [
        message.model_dump(mode="json")["content"]
        for chunk in first
        for message in AddRequest.model_validate_json(chunk.body or b"").messages
    ]
    arrays = [content for content in messages if isinstance(content, list)]
    assert arrays and all(content_text(c) == c[0]["text"] for c in arrays)
    expected = {text_digest(text) for c in messages if (text := content_text(c))}
    assert {t["_id"].removeprefix("job-1/") for t in texts} == expected
    assert all(len(t["users"]) == 1 for t in texts)


# --- the chunk rule's media limits ----------------------------------------------------------


def _dataset(image_sizes: list[list[int]], question_images: tuple[str, ...] = ()) -> Dataset:
    """One conversation of one session whose turn n shows images of the given sizes."""
    files: dict[str, bytes] = {}
    turns = []
    for number, sizes in enumerate(image_sizes, start=1):
        references = []
        for index, size in enumerate(sizes):
            reference = f"X/{number}_{index}.png"
            files[reference] = PNG + bytes(size - len(PNG))
            references.append(reference)
        turns.append(
            Turn(
                turn_id=f"{number}:user",
                speaker="user",
                text=f"turn {number}",
                images=tuple(references),
            )
        )
    files.update({reference: PNG + bytes(100) for reference in question_images})
    return Dataset(
        dataset_id="mm",
        version="t",
        categories={1: "one"},
        scorer="token_f1",
        track="multimodal",
        conversations=[
            Conversation(
                conversation_id="X",
                speakers=("user", "assistant"),
                speakers_are_roles=True,
                sessions=[
                    Session(session_key="D1", index=1, date_text="d", timestamp_ms=0, turns=turns)
                ],
            )
        ],
        questions=[
            Question(
                question_id="X:q0000",
                conversation_id="X",
                question="which?",
                answer="a",
                category=1,
                category_name="one",
                evidence=[],
                adversarial=False,
                images=question_images,
            )
        ],
        image_files=files,
    )


def _image_counts(dataset: Dataset) -> list[list[int]]:
    return [
        [
            sum(1 for part in m.content if part.type == "image_url")
            for m in add.request.messages
            if isinstance(m.content, list)
        ]
        for add in plan_adds(dataset, "r")
    ]


def test_a_new_add_starts_before_the_per_add_image_count_or_bytes_would_be_exceeded() -> None:
    # 21 one-image messages: 20 images is the most one Add carries.
    assert _image_counts(_dataset([[100]] * 21)) == [[1] * 20, [1]]
    # 3 MiB images: 8 MiB per Add holds two.
    three = 3 * media.MIB
    assert _image_counts(_dataset([[three]] * 5)) == [[1, 1], [1, 1], [1]]
    # Eight images of one message stay together, the next message opens a new Add.
    assert _image_counts(_dataset([[100] * 8, [100] * 8, [100] * 8])) == [[8, 8], [8]]


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ([[100] * 9], "9 images, over the limit of 8"),
        # Over 5 MiB it would be fitted, but these bytes are no image to decode.
        ([[5 * media.MIB + 1]], "does not decode"),
        ([[3 * media.MIB] * 3], "more than the 8 MiB limit"),
    ],
)
def test_a_message_over_the_media_limits_is_refused_not_trimmed(
    sizes: list[list[int]], message: str
) -> None:
    dataset = _dataset(sizes)
    with pytest.raises(media.ImageError, match=message):
        plan_adds(dataset, "r")
    with pytest.raises(media.ImageError, match=message):
        check_media_limits(dataset)


def test_a_question_over_the_search_limits_and_an_unverified_image_are_refused() -> None:
    two = _dataset([[100]], question_images=("X/q1.png", "X/q2.png"))
    with pytest.raises(media.ImageError, match="question 'X:q0000': 2 images"):
        search_query(two, two.questions[0])
    with pytest.raises(media.ImageError, match="over the limit of 1"):
        check_media_limits(two)
    missing = _dataset([[100]]).model_copy(update={"image_files": {}})
    with pytest.raises(media.ImageError, match="not among the bundle's verified files"):
        plan_adds(missing, "r")


def test_loading_a_multimodal_bundle_checks_the_media_limits() -> None:
    manifest = registered("synthetic_multimodal", None).manifest
    contents = [(e.path, read_verified(PACKAGE_DATA_DIR, e)) for e in manifest.files]
    assert parse_contents(contents, manifest).track == "multimodal"
    # An image file that is not an image: refused when the dataset is loaded, naming it.
    broken = [(p, b"not an image" if p.endswith("D1_IMG_001.png") else c) for p, c in contents]
    with pytest.raises(DatasetFileError, match="is not a PNG, JPEG, GIF or WebP image"):
        parse_contents(broken, manifest)


def test_the_demo_takes_the_dashed_spelling_of_the_dataset(tmp_path: Path) -> None:
    from aml_devtools.cli import demo_dataset_problem
    from aml_evaluation.registry import dataset_id_of

    assert dataset_id_of("synthetic-multimodal", tmp_path) == "synthetic_multimodal"
    assert dataset_id_of("synthetic_multimodal", tmp_path) == "synthetic_multimodal"
    assert dataset_id_of("no-such-set", tmp_path) == "no-such-set"
    assert demo_dataset_problem("synthetic_multimodal", tmp_path) is None


def test_oversized_images_are_sent_fitted_to_where_they_go() -> None:
    noise = random.Random(3).randbytes(1600 * 1200 * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (1600, 1200), noise).save(out, format="PNG")
    photo = out.getvalue()  # ~5.8 MB: over an Add's 5 MiB per image and a Search's 512 KiB
    dataset = _dataset([[100]], question_images=("X/q.png",))
    dataset = dataset.model_copy(update={"image_files": {"X/1_0.png": photo, "X/q.png": photo}})
    check_media_limits(dataset)
    (add,) = plan_adds(dataset, "r")
    (message,) = add.request.messages
    assert isinstance(message.content, list)
    sent_mime, sent = media.parse_data_url(message.content[1].image_url.url)
    assert sent_mime == media.JPEG and len(sent) <= media.MAX_IMAGE_BYTES
    assert sent == media.fit_image("X/1_0.png", photo, media.MAX_IMAGE_BYTES)
    query = search_query(dataset, dataset.questions[0])
    assert isinstance(query, list)
    asked_mime, asked = media.parse_data_url(query[1].image_url.url)
    assert asked_mime == media.JPEG and len(asked) <= media.MAX_QUERY_IMAGE_BYTES
    # The Search body stays within what its NATS message carries (1 MiB by default).
    body = SearchRequest(user_id="u", query=query, top_k=10).model_dump_json()
    assert len(body) < 1024 * 1024
