"""The evaluation spec and its content hash (R-6.4)."""

from __future__ import annotations

import hashlib
import json

import pytest

from aml_evaluation.confidence import CONFIDENCE
from aml_evaluation.prompts import load_prompt
from aml_evaluation.spec import EvaluationSpec, ModelCall
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_runtime.settings import EvaluationSettings


def _spec(**overrides: object) -> EvaluationSpec:
    return build_evaluation_spec(EvaluationSettings(**overrides))  # type: ignore[arg-type]


def test_the_textual_spec_is_the_coding_one_without_its_coding_part() -> None:
    """What lets the scheduler build the spec once (aml_scheduler.main)."""
    coding = build_evaluation_spec(EvaluationSettings(), coding=True)
    textual = coding.model_copy(update={"coding": None})
    assert textual == _spec()
    assert textual.content_hash == _spec().content_hash != coding.content_hash


def test_the_same_settings_give_the_same_hash() -> None:
    spec = _spec()
    assert spec.content_hash == _spec().content_hash
    assert len(spec.content_hash) == 64
    assert spec.content_hash == hashlib.sha256(spec.canonical_json()).hexdigest()
    summary = spec.summary()
    assert summary["spec_hash"] == spec.content_hash
    assert summary["answer_prompt"].startswith("answer_v1@")
    assert summary["scorer.f1_locomo"] == "f1-locomo-v1"
    assert summary["scorer.f1_locomo_category"] == "f1-locomo-category-v1"
    assert summary["scorer.abstention"] == "abstention-phrase-v1"
    assert summary["scorer.bleu1"] == "bleu1-nltk-word_tokenize-v2"
    assert summary["scorer.bleu1_sentence_model"].startswith("punkt_tab/english@")
    assert summary["judge_abstention_prompt"].startswith("judge_abstention_v1@")


def test_the_abstention_judge_prompt_is_in_the_spec() -> None:
    """Questions without a gold answer are judged with their own prompt; its file's sha256 is
    part of the spec, so the spec names what the judge was told."""
    spec = _spec()
    prompt = load_prompt("judge_abstention_v1")
    assert spec.schema_version == "aml-eval-spec/3"
    assert spec.judge_abstention.prompt == "judge_abstention_v1"
    assert spec.judge_abstention.prompt_sha256 == prompt.sha256
    assert spec.judge_abstention.prompt_sha256 != spec.judge.prompt_sha256
    assert (spec.judge_abstention.model, spec.judge_abstention.max_tokens) == (
        spec.judge.model, spec.judge.max_tokens,
    )  # fmt: skip
    edited = hashlib.sha256((prompt.text + " ").encode("utf-8")).hexdigest()
    changed = spec.model_copy(
        update={"judge_abstention": spec.judge_abstention.model_copy(
            update={"prompt_sha256": edited}
        )}
    )  # fmt: skip
    assert changed.content_hash != spec.content_hash


def test_changing_a_prompt_text_changes_the_hash() -> None:
    """The spec holds the prompt's sha256 over its exact bytes: one edited character in the
    prompt file gives another hash."""
    spec = _spec()
    prompt = load_prompt("answer_v1")
    edited = (prompt.text + " ").encode("utf-8")
    answer = spec.answer.model_copy(update={"prompt_sha256": hashlib.sha256(edited).hexdigest()})
    changed = spec.model_copy(update={"answer": answer})
    assert spec.answer.prompt_sha256 == prompt.sha256
    assert changed.content_hash != spec.content_hash


def test_changing_which_prompt_changes_the_hash() -> None:
    base = _spec()
    swapped = _spec(answer_prompt="judge_v1")
    assert swapped.content_hash != base.content_hash
    assert swapped.answer.prompt_sha256 == load_prompt("judge_v1").sha256


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", 10),
        ("answer_model", "other-model"),
        ("answer_max_tokens", 7),
        ("answer_context_tokens", 1234),
        ("token_counter", "llama.cpp"),
        ("judge_model", "other-judge"),
        ("judge_abstention_prompt", "judge_v1"),
        ("judge_max_tokens", 9),
        ("judge_runs", 3),
        ("judge_retries", 0),
    ],
)
def test_every_setting_of_the_spec_changes_the_hash(field: str, value: object) -> None:
    assert _spec(**{field: value}).content_hash != _spec().content_hash


def test_settings_outside_the_spec_do_not_change_the_hash() -> None:
    assert _spec(mongo_url="mongodb://elsewhere").content_hash == _spec().content_hash


def test_the_spec_records_how_sure_a_score_is() -> None:
    """The bootstrap behind every headline interval and the board's ties, with its seed: the
    same spec hash, the same intervals."""
    spec = _spec()
    assert spec.confidence == CONFIDENCE
    recorded = json.loads(spec.canonical_json())["confidence"]
    assert recorded == {"method": "bootstrap-percentile-v1", "level": 0.95,
                        "resamples": 10_000, "seed": 2026, "batch": 100}  # fmt: skip
    assert spec.summary()["confidence"] == (
        "bootstrap-percentile-v1: 95%, 10000 resamples (100 per draw), seed 2026"
    )
    reseeded = spec.model_copy(update={"confidence": CONFIDENCE.model_copy(update={"seed": 1})})
    assert reseeded.content_hash != spec.content_hash


def test_a_spec_stored_before_the_confidence_field_keeps_its_hash() -> None:
    """Jobs planned before intervals were reported stored their spec without `confidence`:
    read back, it hashes to what they recorded (and differs from today's)."""
    stored = _spec().model_dump(mode="json")
    del stored["confidence"]
    del stored["answer_images"], stored["coding"]  # added within the schema before it
    recorded = hashlib.sha256(
        json.dumps(stored, sort_keys=True, separators=(",", ":")).encode("utf-8")
    ).hexdigest()
    earlier = EvaluationSpec.model_validate(stored)
    assert earlier.confidence is None and "confidence" not in earlier.summary()
    assert earlier.content_hash == recorded != _spec().content_hash


def test_unknown_prompt_fails() -> None:
    with pytest.raises(FileNotFoundError):
        _spec(answer_prompt="answer_v999")


def test_spec_is_frozen() -> None:
    spec = _spec()
    with pytest.raises(ValueError):
        spec.answer.model = "x"  # type: ignore[misc]
    assert isinstance(spec.answer, ModelCall)
