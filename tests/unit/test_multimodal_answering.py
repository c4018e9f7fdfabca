"""Multimodal answering and scoring (R-4.4, R-4.8 content arrays, R-6.1, R-6.2): the answer
model's content parts, the text-only fallback, the image token count, the F1-only scorer and
Mem-Gallery's token F1."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import FakeChatModel

from aml_answerer.handlers import AnswerQuestion
from aml_answerer.settings import AnswererSettings
from aml_contract.api.results import Metrics
from aml_contract.messages import QuestionWork
from aml_contract.participant import SearchRequest, encode
from aml_evaluation.aggregate import QuestionOutcome, aggregate, results_fingerprint
from aml_evaluation.context import IMAGE_TOKENS, estimated, fit_candidates
from aml_evaluation.prompts import (
    IMAGE_PLACEHOLDER,
    Memory,
    answer_content,
    format_memories,
    load_prompt,
)
from aml_evaluation.scoring import (
    f1_locomo,
    f1_memgallery,
    normalize_answer_memgallery,
    token_f1,
    token_f1_memgallery,
)
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_pipeline.stage_worker import StageCall
from aml_runtime.broker import FinalFailure
from aml_runtime.settings import EvaluationSettings
from aml_runtime.stores import Stores
from aml_scorer.handlers import ScoreAnswer

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
IMAGE = "data:image/png;base64," + base64.b64encode(PNG).decode()
OTHER_IMAGE = "data:image/png;base64," + base64.b64encode(PNG + b"\x01").decode()
PROMPT = load_prompt("answer_v1")


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


async def by_length(text: str) -> int:
    return len(text)


# --- the answer prompt's content parts ---------------------------------------------------------


def test_without_images_the_prompt_is_the_text_exactly() -> None:
    memories = [Memory("likes tea", "2023-05-08"), Memory("has a dog", None)]
    content = answer_content(PROMPT, memories, "What does she drink?")
    assert content == PROMPT.text.format(
        memories=format_memories([("likes tea", "2023-05-08"), ("has a dog", None)]),
        question="What does she drink?",
    )


def test_images_follow_their_memory_line_and_the_question_in_order() -> None:
    memories = [
        Memory("first", "2023-05-08", (IMAGE, OTHER_IMAGE)),
        Memory("second, no image", None),
        Memory("third", None, (OTHER_IMAGE,)),
    ]
    content = answer_content(PROMPT, memories, "Which dog?", [IMAGE])
    assert isinstance(content, list)
    kinds = [part["type"] for part in content]
    assert kinds == [
        "text", "image_url", "image_url", "text", "image_url", "text", "image_url", "text",
    ]  # fmt: skip
    urls = [part["image_url"]["url"] for part in content if part["type"] == "image_url"]
    assert urls == [IMAGE, OTHER_IMAGE, OTHER_IMAGE, IMAGE]
    assert all(part["image_url"]["detail"] == "low" for part in content if "image_url" in part)
    assert content[0]["text"].endswith("Memories:\n- [2023-05-08] first")
    assert content[3]["text"] == "\n- second, no image\n- third"
    assert content[5]["text"].endswith("Question: Which dog?")
    # The words are exactly the text form's: only the images are added.
    joined = "".join(part["text"] for part in content if part["type"] == "text")
    assert joined == PROMPT.text.format(memories=format_memories(memories), question="Which dog?")


def test_a_question_image_without_memories() -> None:
    content = answer_content(PROMPT, [], "What is this?", [IMAGE])
    assert isinstance(content, list)
    assert [part["type"] for part in content] == ["text", "image_url", "text"]
    assert "Memories:\n(none)" in content[0]["text"]
    assert content[2]["text"] == "\nAnswer:\n"


def test_a_template_with_another_field_is_refused_with_images() -> None:
    odd = PROMPT.model_copy(update={"text": "{memories} {other} {question}"})
    with pytest.raises(ValueError, match="other"):
        answer_content(odd, [Memory("m", None, (IMAGE,))], "q")


# --- context fitting ----------------------------------------------------------------------------


async def test_an_image_counts_its_fixed_tokens_and_reaches_a_model_that_reads_images() -> None:
    candidate = {"content": [_text("a dog"), _image(IMAGE), _text("on a beach")]}
    fitted = await fit_candidates([candidate], 1000, by_length, takes_images=True)
    assert fitted.memories == [Memory("a dog on a beach", None, (IMAGE,))]
    assert fitted.tokens == len("- a dog on a beach") + IMAGE_TOKENS == 18 + 85
    assert (fitted.images, fitted.images_withheld) == (1, 0)


async def test_image_tokens_cut_the_ranked_prefix() -> None:
    pictured = {"content": [_text("x"), _image(IMAGE)]}
    candidates = [pictured, pictured, {"content": "short"}]
    # Each pictured line: "- x" (3) + 85 = 88; the budget holds one, not two.
    fitted = await fit_candidates(candidates, 100, by_length, takes_images=True)
    assert len(fitted.memories) == 1 and fitted.tokens == 88
    text_only = await fit_candidates(candidates, 100, by_length)
    # As placeholders they are "- x [image]" (11) each: all three fit.
    assert len(text_only.memories) == 3 and text_only.images_withheld == 2


async def test_a_text_only_model_gets_placeholders_in_the_parts_order() -> None:
    candidate = {"content": [_image(IMAGE), _text("my cat"), _image(OTHER_IMAGE)]}
    fitted = await fit_candidates([candidate], 1000, by_length, takes_images=False)
    assert fitted.memories == [Memory(f"{IMAGE_PLACEHOLDER} my cat {IMAGE_PLACEHOLDER}", None)]
    assert (fitted.images, fitted.images_withheld) == (0, 2)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/cat.png",  # never fetched by the model's provider
        "file:///etc/passwd",
        "data:image/png;base64,not base64!",
        "data:image/jpeg;base64," + base64.b64encode(PNG).decode(),  # declared type is a lie
        "data:text/plain;base64,aGVsbG8=",
        "",
    ],
)
async def test_an_image_that_is_no_image_data_url_is_withheld(url: str) -> None:
    candidate = {"id": "m", "content": [_text("pic"), _image(url)]}
    fitted = await fit_candidates([candidate], 1000, by_length, takes_images=True)
    assert fitted.memories == [Memory(f"pic {IMAGE_PLACEHOLDER}", None)]
    assert fitted.images_withheld == 1


# --- the answerer ---------------------------------------------------------------------------------


class _Collection:
    def __init__(self, document: dict[str, Any] | None) -> None:
        self.document = document
        self.reads = 0

    async def find_one(self, *args: Any) -> dict[str, Any] | None:
        self.reads += 1
        return self.document


def _answerer(
    candidates: list[dict[str, Any]], question_body: bytes | None, takes_images: bool
) -> tuple[AnswerQuestion, FakeChatModel, _Collection]:
    completions = FakeChatModel(" a dog ")
    questions = _Collection(None if question_body is None else {"search_body": question_body})
    answer = AnswerQuestion(
        settings=AnswererSettings(answer_model_images=takes_images),
        stores=Stores.over(
            SimpleNamespace(  # type: ignore[arg-type]
                searches=_Collection({"state": "done", "candidates": candidates}),
                questions=questions,
            )
        ),
        llm=completions,  # type: ignore[arg-type]
        prompt=PROMPT,
        count_tokens=estimated,
    )
    return answer, completions, questions


WORK = QuestionWork(job_id="j", version_id="v", item_id="j/d/q1")
QUERY = encode(
    SearchRequest(query=[_text("Whose dog is this?"), _image(IMAGE)], user_id="u", top_k=5)  # type: ignore[list-item]
)


async def test_a_text_question_is_asked_as_before_without_reading_the_plan() -> None:
    answer, completions, questions = _answerer(
        [{"id": "m", "content": "likes tea"}], None, takes_images=True
    )
    result = await answer(WORK, {"question": "What?"}, StageCall(delivered=1))
    (request,) = completions.requests
    assert request["messages"] == [
        {"role": "user", "content": PROMPT.text.format(memories="- likes tea", question="What?")}
    ]
    assert questions.reads == 0
    assert "images_sent" not in result and "images_withheld" not in result


async def test_the_answerer_sends_candidate_and_question_images_as_parts() -> None:
    candidates = [{"id": "m", "content": [_text("Rex is Ann's dog"), _image(OTHER_IMAGE)]}]
    answer, completions, _ = _answerer(candidates, QUERY, takes_images=True)
    question = {"question": "Whose dog is this?", "question_images": 1}
    result = await answer(WORK, question, StageCall(delivered=1))
    (content,) = [message["content"] for message in completions.requests[0]["messages"]]
    urls = [part["image_url"]["url"] for part in content if part["type"] == "image_url"]
    assert urls == [OTHER_IMAGE, IMAGE]
    assert content[0]["text"].endswith("- Rex is Ann's dog")
    assert content[2]["text"].endswith("Question: Whose dog is this?")
    assert result["answer"] == "a dog"
    assert (result["images_sent"], "images_withheld" in result) == (2, False)


async def test_a_text_only_answer_model_gets_placeholders_and_the_count_is_recorded() -> None:
    candidates = [{"id": "m", "content": [_text("Rex is Ann's dog"), _image(OTHER_IMAGE)]}]
    answer, completions, _ = _answerer(candidates, QUERY, takes_images=False)
    question = {"question": "Whose dog is this?", "question_images": 1}
    result = await answer(WORK, question, StageCall(delivered=1))
    (message,) = completions.requests[0]["messages"]
    assert isinstance(message["content"], str)
    assert f"- Rex is Ann's dog {IMAGE_PLACEHOLDER}" in message["content"]
    assert f"Question: Whose dog is this? {IMAGE_PLACEHOLDER}\n" in message["content"]
    assert result["images_withheld"] == 2 and "images_sent" not in result


async def test_a_question_whose_planned_body_is_gone_fails_clearly() -> None:
    answer, completions, _ = _answerer([], None, takes_images=True)
    with pytest.raises(FinalFailure, match="planned Search body"):
        await answer(WORK, {"question": "Q", "question_images": 1}, StageCall(delivered=1))
    assert completions.requests == []


# --- the token_f1 scorer ------------------------------------------------------------------------


class _NoLLM:
    """An LLM client that fails the test if anything calls it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the F1-only scorer called the LLM ({name})")


def _scorer(answer: str) -> tuple[ScoreAnswer, QuestionWork]:
    unused: Any = None
    scorer = ScoreAnswer(
        settings=unused,
        stores=unused,
        llm=_NoLLM(),
        prompt=unused,
        abstention_prompt=unused,  # type: ignore[arg-type]
    )
    return scorer, WORK.model_copy(update={"answer": answer})


def _question(gold: str | None, variant: str = "f1-memgallery-v1") -> dict[str, Any]:
    return {
        "dataset_id": "mg", "category": 6, "category_name": "visual-search",
        "question": "Which images?", "gold_answer": gold, "f1_variant": variant,
        "scorer": "token_f1",
    }  # fmt: skip


async def test_a_token_f1_dataset_is_scored_without_a_judge() -> None:
    scorer, work = _scorer("D1:IMG_001")
    score = await scorer(work, _question("D1 IMG_001"), StageCall(delivered=1))
    assert score == {
        "dataset_id": "mg", "category": 6, "category_name": "visual-search",
        "f1": 1.0, "f1_version": "f1-memgallery-v1",
    }  # fmt: skip
    scorer, work = _scorer("Not mentioned in the memories.")
    abstained = await scorer(work, _question(None), StageCall(delivered=1))
    assert abstained["f1"] == 1.0


async def test_an_unknown_f1_variant_fails_clearly() -> None:
    scorer, work = _scorer("x")
    with pytest.raises(FinalFailure, match="unknown F1 variant 'f1-nope'"):
        await scorer(work, _question("x", "f1-nope"), StageCall(delivered=1))


def test_f1_only_scores_aggregate_with_f1_as_the_headline() -> None:
    outcomes = [
        QuestionOutcome(dataset_id="mg", category_name="c", scored=True, f1=1.0),
        QuestionOutcome(dataset_id="mg", category_name="c", scored=True, f1=0.5),
        QuestionOutcome(dataset_id="mg", category_name="c", scored=False),
    ]
    metrics = aggregate("j", "completed", outcomes, excluded={}).datasets["mg"].overall
    assert (metrics.unjudged, metrics.failed, metrics.accuracy) == (2, 1, None)
    assert (metrics.headline, metrics.f1_mean) == ("f1_mean", 0.75)
    judged = QuestionOutcome(
        dataset_id="lo", category_name="c", scored=True, judge_label="WRONG",
        judge_labels=["WRONG"], f1=0.0,
    )  # fmt: skip
    results = aggregate("j", "completed", [*outcomes, judged], excluded={})
    assert results.datasets["lo"].overall.headline == "accuracy"
    # Overall has a verdict: its headline is the accuracy over the judged questions.
    assert (results.overall.headline, results.overall.accuracy) == ("accuracy", 0.0)


def test_the_headline_leaves_the_results_fingerprint_unchanged() -> None:
    metrics = Metrics(questions=1, scored=1, failed=0, judge_correct=1, judge_accuracy=1.0,
                      f1_mean=1.0)  # fmt: skip
    stored = {"d": {"overall": metrics.model_dump(mode="json")}}
    before = {"d": {"overall": metrics.model_dump(mode="json", exclude={"headline"})}}
    assert results_fingerprint(stored) == results_fingerprint(before)


# --- Mem-Gallery's token F1 ----------------------------------------------------------------------


def test_memgallery_normalisation_step_by_step() -> None:
    # Lower-cased, decimal point and underscores kept, other punctuation a space, "and" gone.
    assert normalize_answer_memgallery("D1:IMG_001, and 3.14 The Cat.") == "d1 img_001 3.14 cat"
    assert normalize_answer_memgallery("1,000") == "1 000"
    assert normalize_answer_memgallery("") == ""


@pytest.mark.parametrize(
    ("prediction", "gold", "memgallery", "locomo"),
    [
        # Worked from Mem-Gallery's f1_score: "d1 img_001" vs "d1 img_001": 1.0. LoCoMo
        # deletes ":" and "_" and compares "d1img001" with "d1 img001".
        ("D1:IMG_001", "D1 IMG_001", 1.0, 0.0),
        # Both keep IMG ids whole when written alike; 2 of 4 gold tokens: P 1, R 0.5.
        ("D1:IMG_001", "D1:IMG_001, D3:IMG_002", 2 / 3, 2 / 3),
        # Commas split numbers there ("1", "000", "dollar" vs "1000", "dollar"): P 1/3, R 1/2.
        ("1,000 dollars", "1000 dollars", 0.4, 1.0),
        ("3.5 miles", "3.5 mile", 1.0, 1.0),
        ("", "", 0.0, 0.0),
        ("Yes.", "No.", 0.0, 0.0),
    ],
)
def test_memgallery_f1_worked_examples(
    prediction: str, gold: str, memgallery: float, locomo: float
) -> None:
    assert token_f1_memgallery(prediction, gold) == pytest.approx(memgallery)
    assert token_f1(prediction, gold) == pytest.approx(locomo)
    assert f1_memgallery(prediction, gold, 1) == pytest.approx(memgallery)
    assert f1_locomo(prediction, gold, 1) == pytest.approx(locomo)


# --- the evaluation spec --------------------------------------------------------------------------


def test_a_text_only_answer_model_changes_the_spec_hash_and_the_default_does_not() -> None:
    default = build_evaluation_spec(EvaluationSettings())
    assert default.answer_images is True
    assert b"answer_images" not in default.canonical_json()
    text_only = build_evaluation_spec(EvaluationSettings(answer_model_images=False))
    assert b'"answer_images":false' in text_only.canonical_json()
    assert text_only.content_hash != default.content_hash
    assert text_only.summary()["answer_images"] == "placeholder"
    assert default.summary()["answer_images"] == "image parts (low detail)"
