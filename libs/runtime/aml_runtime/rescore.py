"""Offline rescoring (`aml rescore`): score a predictions file against a dataset with the
current evaluation spec, without a participant, so anyone can recompute a published number or
compare harnesses.

Input files are JSON Lines:
- predictions: `{"question_id": "conv-26:q0000", "answer": "..."}` — question ids as the
  dataset loader numbers them (`<sample_id>:q<index>`, by position in the sample's `qa` list);
- judge labels (optional): `{"question_id": ..., "label": "CORRECT"}` or, for several judge
  runs, `{"question_id": ..., "labels": ["CORRECT", "WRONG", "CORRECT"]}`.

Open questions take their verdict from the labels file when one is given, otherwise from the
LLM judge of the spec; F1 (the dataset's declared variant) and BLEU-1 are computed here. A
question without a prediction is counted as failed (`no_prediction`), never as wrong.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, Field

from aml_contract.api import JobResults
from aml_evaluation.aggregate import QuestionOutcome, aggregate
from aml_evaluation.datasets import Dataset, DatasetManifest, Question, manifest_path
from aml_evaluation.judging import JudgeVerdict, judge, majority
from aml_evaluation.prompts import Prompt
from aml_evaluation.scoring import F1_VARIANTS, JudgeLabel, bleu1, parse_choice

NO_PREDICTION = "no_prediction"
# Judge one open question: (question, gold answer, predicted answer) → verdict.
Judge = Callable[[Question, str], Awaitable[JudgeVerdict]]


class RescoreInputError(ValueError):
    """A predictions or labels file that cannot be used as it is; says where and why."""


class QuestionRow(BaseModel):
    """One question's scoring, as written to the rows file."""

    question_id: str
    dataset_id: str
    category: int
    category_name: str
    failure: str | None
    judge_label: JudgeLabel | None = None
    judge_labels: list[JudgeLabel | None] = Field(default_factory=list)
    f1: float | None = None
    bleu1: float | None = None
    choice_correct: bool | None = None


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RescoreInputError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(value, dict) or not isinstance(value.get("question_id"), str):
                raise RescoreInputError(f"{path}:{number}: an object with a question_id is needed")
            yield number, value


def read_predictions(path: Path, known: set[str]) -> dict[str, str]:
    predictions: dict[str, str] = {}
    for number, row in read_jsonl(path):
        qid = row["question_id"]
        if qid not in known:
            raise RescoreInputError(f"{path}:{number}: unknown question_id {qid!r}")
        if qid in predictions:
            raise RescoreInputError(f"{path}:{number}: question_id {qid!r} given twice")
        answer = row.get("answer")
        if not isinstance(answer, str | int | float) or isinstance(answer, bool):
            raise RescoreInputError(f"{path}:{number}: answer must be a string")
        predictions[qid] = str(answer)
    return predictions


def read_labels(path: Path, known: set[str]) -> dict[str, list[JudgeLabel | None]]:
    allowed = set(get_args(JudgeLabel))
    labels: dict[str, list[JudgeLabel | None]] = {}
    for number, row in read_jsonl(path):
        qid = row["question_id"]
        if qid not in known:
            raise RescoreInputError(f"{path}:{number}: unknown question_id {qid!r}")
        runs = row["labels"] if "labels" in row else [row.get("label")]
        if not isinstance(runs, list) or not runs:
            raise RescoreInputError(f"{path}:{number}: labels must be a non-empty list")
        if any(run is not None and run not in allowed for run in runs):
            raise RescoreInputError(f"{path}:{number}: a label is CORRECT, WRONG or null")
        labels[qid] = list(runs)
    return labels


async def score_questions(
    dataset: Dataset,
    predictions: dict[str, str],
    labels: dict[str, list[JudgeLabel | None]] | None,
    judge: Judge | None,
) -> list[QuestionRow]:
    """One row per question of the dataset, in dataset order."""
    if labels is None and judge is None:
        raise ValueError("open questions need judge labels or a judge")
    f1 = F1_VARIANTS[dataset.f1_variant]
    rows = []
    for question in dataset.questions:
        row = QuestionRow(
            question_id=question.question_id,
            dataset_id=dataset.dataset_id,
            category=question.category,
            category_name=question.category_name,
            failure=None,
        )
        answer = predictions.get(question.question_id)
        if answer is None:
            rows.append(row.model_copy(update={"failure": NO_PREDICTION}))
            continue
        if question.options:
            chosen = parse_choice(answer, question.options)
            correct = None if chosen is None else question.options[chosen] == question.answer
            rows.append(row.model_copy(update={"choice_correct": correct}))
            continue
        if labels is not None:
            runs = labels.get(question.question_id, [None])
        else:
            assert judge is not None
            runs = (await judge(question, answer)).labels
        rows.append(
            row.model_copy(
                update={
                    "judge_label": majority(runs),
                    "judge_labels": runs,
                    "f1": f1(answer, question.answer),
                    "bleu1": bleu1(answer, question.answer),
                }
            )
        )
    return rows


def outcome_of(row: QuestionRow, multiple_choice: bool) -> QuestionOutcome:
    return QuestionOutcome(
        question_id=row.question_id,
        dataset_id=row.dataset_id,
        category_name=row.category_name,
        scored=row.failure is None,
        failure_kind=row.failure,
        judge_label=row.judge_label,
        judge_labels=row.judge_labels,
        f1=row.f1,
        bleu1=row.bleu1,
        multiple_choice=multiple_choice,
        choice_correct=row.choice_correct,
    )


def results_of(dataset: Dataset, rows: Iterable[QuestionRow]) -> JobResults:
    manifest = DatasetManifest.model_validate_json(
        manifest_path(dataset.dataset_id).read_text(encoding="utf-8")
    )
    excluded = [manifest.categories[c] for c in manifest.excluded_from_overall]
    options = {q.question_id for q in dataset.questions if q.options}
    outcomes = [outcome_of(row, row.question_id in options) for row in rows]
    return aggregate(
        f"rescore-{dataset.dataset_id}",
        "completed",
        outcomes,
        {dataset.dataset_id: excluded},
        {dataset.dataset_id: dataset.f1_variant},
    )


def llm_judge(
    call: Callable[[str], Awaitable[str]], prompt: Prompt, runs: int, retries: int
) -> Judge:
    """The spec's judge over any completion function (the same prompt the scorer uses)."""

    async def verdict(question: Question, answer: str) -> JudgeVerdict:
        text = prompt.text.format(
            question=question.question, gold_answer=question.answer, generated_answer=answer
        )
        return await judge(lambda: call(text), runs, retries)

    return verdict
