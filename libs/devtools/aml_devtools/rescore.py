"""Offline rescoring (`aml rescore`): score a predictions file against a dataset with the
current evaluation spec, without a participant, so anyone can recompute a published number or
compare harnesses.

Input files are JSON Lines:
- predictions: `{"question_id": "conv-26:q0000", "answer": "..."}` — question ids as the
  dataset loader numbers them (`<sample_id>:q<index>`, the index zero-padded to four digits,
  by position in the sample's `qa` list). A question of a streaming dataset asked at points of
  its conversation (`Question.asked_at`) has one prediction per point, keyed by the item id
  the pipeline gives it, `<question_id>@<P>` with P the point (turns written before it is
  asked), e.g. `"str-1:q0000@2"`; its bare question id is refused with a hint naming them;
- judge labels (optional): `{"question_id": ..., "label": "CORRECT"}` or, for several judge
  runs, `{"question_id": ..., "labels": ["CORRECT", "WRONG", "CORRECT"]}`; `null` is a run
  whose reply could not be read.

A question id given twice in either file is an error, never "the last one wins"; so is an id
the dataset does not have (with a hint when it only lacks the zero padding), and a label for a
question no judge grades.

Each answer is scored as the scorer service scores it (aml_evaluation.scoring.scoring_method):
a multiple-choice question by the option it names (`choice_correct`, `option_accuracy`); an
open question of a dataset whose manifest scorer is `token_f1` (Mem-Gallery) by token F1 alone,
never judged, even with `--judge`, and without BLEU-1 (F1 is its headline); any other open
question as follows.

Judged open questions take their verdict from the labels file when one is given, from the
evaluation spec's LLM judge with `--judge` (the prompt the scorer would use: the abstention
prompt without a gold answer, a LongMemEval judge rule's prompt with its `gold_explanation`), or
from no judge at all: F1 (the dataset's declared variant, or the one asked for) and BLEU-1 are
computed for every answered open question either way. A question that the labels file does not label
keeps its F1 and BLEU-1 and is counted as unjudged (not correct, not wrong, not failed); a label of
null is a judge failure. A question without a prediction is counted as failed (`no_prediction`),
never as wrong.

A coding dataset's attempts (scorer `swe_resolved`) are regraded from their patches, each
prediction's `answer` being the attempt's patch (a job's answer documents hold them so): verified
in a fresh sandbox against the task's hidden tests and graded as the scorer service does
(`aml_pipeline.coding_track.verify`, `sandbox_verifier`), without any LLM. An attempt the
platform could not verify (a sandbox fault, a task's files unavailable, hidden tests that do
not apply) counts as failed (`platform_error`), never as unresolved.

The rows go through the live pipeline's aggregate() with the same outcomes a job with the same
answers records (a streaming item carries its point's ordinal, so the dataset's results are
split by point as a job's are), so a rescored results file reports the numbers and headline
that job would.

Of a job's efficiency figures (`JobResults.efficiency`) a rescoring has no latency and no
retrieved context: a predictions file carries neither participant calls nor candidates, and the
output says so rather than inventing them. With `--judge`, each row records the judge's tokens
as the provider reported them, summarised per judged question (`efficiency_lines`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, NamedTuple, get_args

import nltk  # type: ignore[import-untyped]
from pydantic import BaseModel, Field

from aml_contract.api.results import JobResults
from aml_evaluation.aggregate import QuestionOutcome, aggregate
from aml_evaluation.atmbench.scoring import (
    ATM_JUDGE_PROMPT_NAME,
    judge_prompt_text,
    score_deterministic,
)
from aml_evaluation.coding.source import CodingTaskUnavailable
from aml_evaluation.datasets import Dataset, Question, question_at_point, question_id
from aml_evaluation.judging import (
    JUDGE_PARSER_VERSION,
    JudgeReply,
    JudgeVerdict,
    atm_judge_label,
    judge,
    judge_prompt_for,
    load_judge_rule_prompts,
    majority,
)
from aml_evaluation.prompts import Prompt, load_prompt
from aml_evaluation.punkt import MODEL_ID as PUNKT_MODEL_ID
from aml_evaluation.registry import DatasetManifest
from aml_evaluation.scoring import (
    ABSTENTION_VERSION,
    BLEU_VERSION,
    F1_VARIANTS,
    MC_VERSION,
    JudgeLabel,
    ScoringMethod,
    open_answer_scores,
    score_choice,
    scoring_method,
)
from aml_pipeline.coding_track import (
    HiddenTestsRejected,
    OpenTask,
    OpenWorkspace,
    Verification,
    verify,
)
from aml_pipeline.sandbox import Sandbox, SandboxFault, SandboxLimits

NO_PREDICTION = "no_prediction"
PLATFORM_ERROR = "platform_error"
# Judge one open question: (question, predicted answer) → verdict.
Judge = Callable[[Question, str], Awaitable[JudgeVerdict]]
# Verify one coding attempt: (question, patch) → verdict, or None when the platform could not.
Verify = Callable[[Question, str], Awaitable[Verification | None]]
# An id written without the zero padding, e.g. "conv-26:q0" for "conv-26:q0000".
_LOOSE_ID = re.compile(r"(?P<sample>.+):q(?P<index>[0-9]+)")
# Why a question takes no judge verdict, by how it is scored.
_NOT_JUDGED: Final[Mapping[ScoringMethod, str]] = MappingProxyType(
    {
        "choice": "a multiple-choice question is scored by the option it names",
        "f1_alone": "the dataset is scored by token F1 alone",
        "resolved": "a coding attempt is scored by its task's hidden tests",
        "atm": "an ATM-Bench number or list answer is matched, not judged",
    }
)


class RescoreInputError(ValueError):
    """A predictions or labels file that cannot be used as it is; says where and why."""


class AskedItem(NamedTuple):
    """One scored item: a question, or a streaming question at one of its points."""

    key: str  # the question_id its prediction and label are written under
    question: Question
    point: int | None  # turns written before it is asked; None: after the whole conversation
    point_index: int | None  # the point's 1-based ordinal among the question's points


def asked_items(dataset: Dataset) -> dict[str, AskedItem]:
    """Every item of the dataset by its key, in dataset order: a question once, or a streaming
    question once per point, as the scheduler plans them (`<question_id>@<P>`)."""
    items: dict[str, AskedItem] = {}
    for question in dataset.questions:
        if not question.asked_at:
            items[question.question_id] = AskedItem(question.question_id, question, None, None)
        for ordinal, point in enumerate(question.asked_at, start=1):
            key = question_at_point(question.question_id, point)
            items[key] = AskedItem(key, question, point, ordinal)
    return items


class QuestionRow(BaseModel):
    """One item's scoring, as written to the rows file."""

    question_id: str
    point: int | None = Field(
        default=None, description="A streaming question's point (its key is question_id@point)."
    )
    point_index: int | None = Field(
        default=None, description="That point's 1-based ordinal: the `points` cell it counts in."
    )
    dataset_id: str
    category: int
    category_name: str
    failure: str | None
    judged: bool = Field(
        default=False,
        description="An open question with a verdict (given or asked for); False without one, "
        "when F1 and BLEU-1 still count.",
    )
    judge_label: JudgeLabel | None = None
    judge_labels: list[JudgeLabel | None] = Field(default_factory=list)
    f1: float | None = None
    bleu1: float | None = None
    choice_correct: bool | None = None
    # A coding attempt: whether its patch resolved the task, why, and the task's type.
    resolved: bool | None = None
    resolution_reason: str | None = None
    task_type: str | None = None
    # The LLM judge's tokens over its calls for this question, when this rescoring asked it
    # (absent otherwise: labels from a file cost nothing here).
    judge_tokens_in: int | None = Field(default=None, exclude_if=lambda value: value is None)
    judge_tokens_out: int | None = Field(default=None, exclude_if=lambda value: value is None)
    # An ATM-Bench question: its answer type and its value in QS (None: no verdict for it).
    answer_type: str | None = Field(default=None, exclude_if=lambda value: value is None)
    qs: float | None = Field(default=None, exclude_if=lambda value: value is None)


class JudgeSource(BaseModel):
    """Where the verdicts came from."""

    kind: Literal["labels", "llm", "none"]
    labels_file: str | None = None
    labels_sha256: str | None = None
    questions_labelled: int | None = None
    model: str | None = None
    prompt: str | None = None
    abstention_prompt: str | None = None


class Provenance(BaseModel):
    """What produced a rescoring's numbers, written beside them in the results document."""

    dataset_id: str
    dataset_version: str
    bundle_hash: str
    spec_hash: str
    predictions_file: str
    predictions_sha256: str
    f1_variant: str
    f1_variant_declared: str = Field(description="The variant the dataset manifest declares.")
    scorers: dict[str, str]
    nltk: str
    categories: dict[int, str]
    judge: JudgeSource


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


def check_known(path: Path, number: int, qid: str, items: Mapping[str, AskedItem]) -> None:
    """Refuse an id the dataset does not have; hint at the padded form when that is the fix,
    and at the item ids of a streaming question given by its bare id."""
    if qid in items:
        return
    hint = ""
    loose = _LOOSE_ID.fullmatch(qid)
    if loose is not None:
        padded = question_id(loose["sample"], int(loose["index"]))
        if padded != qid and padded in items:
            hint = f"; ids are zero-padded to four digits: {padded!r}"
    points = [key for key, item in items.items() if item.question.question_id == qid]
    if points:
        hint = (
            f"; {qid!r} is asked at points of its conversation, each predicted under its own "
            f"id: {', '.join(map(repr, points))}"
        )
    raise RescoreInputError(f"{path}:{number}: unknown question_id {qid!r}{hint}")


def read_predictions(path: Path, known: Mapping[str, AskedItem]) -> dict[str, str]:
    predictions: dict[str, str] = {}
    for number, row in read_jsonl(path):
        qid = row["question_id"]
        check_known(path, number, qid, known)
        if qid in predictions:
            raise RescoreInputError(f"{path}:{number}: question_id {qid!r} given twice")
        answer = row.get("answer")
        if not isinstance(answer, str | int | float) or isinstance(answer, bool):
            raise RescoreInputError(f"{path}:{number}: answer must be a string")
        predictions[qid] = str(answer)
    return predictions


def read_labels(path: Path, known: Mapping[str, AskedItem]) -> dict[str, list[JudgeLabel | None]]:
    allowed = set(get_args(JudgeLabel))
    labels: dict[str, list[JudgeLabel | None]] = {}
    for number, row in read_jsonl(path):
        qid = row["question_id"]
        check_known(path, number, qid, known)
        if qid in labels:
            raise RescoreInputError(f"{path}:{number}: question_id {qid!r} given twice")
        runs = row["labels"] if "labels" in row else [row.get("label")]
        if not isinstance(runs, list) or not runs:
            raise RescoreInputError(f"{path}:{number}: labels must be a non-empty list")
        if any(run is not None and run not in allowed for run in runs):
            raise RescoreInputError(f"{path}:{number}: a label is CORRECT, WRONG or null")
        labels[qid] = list(runs)
    return labels


async def score_questions(
    dataset: Dataset,
    predictions: Mapping[str, str],
    labels: Mapping[str, list[JudgeLabel | None]] | None,
    judge: Judge | None,
    f1_variant: str | None = None,
    verify_attempt: Verify | None = None,
) -> list[QuestionRow]:
    """One row per item of the dataset (asked_items), in dataset order; `predictions` and
    `labels` are keyed by item. Verdicts of judged questions come from `labels` if given, else
    from `judge` if given, else there are none. `f1_variant` defaults to the dataset's declared
    one. A coding attempt's patch is verified by `verify_attempt` (`sandbox_verifier`). Raises
    RescoreInputError for a label of a question no judge grades, and for a coding dataset
    without `verify_attempt`."""
    variant = f1_variant or dataset.f1_variant
    rows = []
    for item in asked_items(dataset).values():
        question = item.question
        method = scoring_method(question.options, dataset.scorer)
        if labels is not None and item.key in labels and not judged_by_llm(method, question):
            raise RescoreInputError(
                f"a judge label is given for {item.key!r}, which no judge grades: "
                f"{_NOT_JUDGED[method]}"
            )
        row = QuestionRow(
            question_id=question.question_id,
            point=item.point,
            point_index=item.point_index,
            dataset_id=dataset.dataset_id,
            category=question.category,
            category_name=question.category_name,
            failure=None,
        )
        answer = predictions.get(item.key)
        if answer is None:
            rows.append(row.model_copy(update={"failure": NO_PREDICTION}))
            continue
        if method == "choice":
            choice = score_choice(answer, question.options or [], question.answer)
            rows.append(row.model_copy(update={"choice_correct": choice.correct}))
            continue
        if method == "f1_alone":
            f1 = F1_VARIANTS[variant](answer, question.answer, question.category)
            rows.append(row.model_copy(update={"f1": f1}))
            continue
        if method == "resolved":
            if verify_attempt is None:
                raise RescoreInputError(
                    f"{dataset.dataset_id} is a coding dataset: its patches are verified in "
                    "the sandbox (sandbox_verifier)"
                )
            verdict = await verify_attempt(question, answer)
            coding = {"task_type": question.task_type}
            if verdict is None:
                rows.append(row.model_copy(update={"failure": PLATFORM_ERROR, **coding}))
                continue
            rows.append(
                row.model_copy(
                    update={
                        "resolved": verdict.resolved,
                        "resolution_reason": verdict.reason,
                        **coding,
                    }
                )
            )
            continue
        if method == "atm" and question.answer_type != "open_end":
            if question.answer_type is None or question.answer is None:
                raise RescoreInputError(f"{item.key}: an ATM-Bench question without its type")
            scored = score_deterministic(
                question.answer_type, question.answer, answer, question=question.question
            )
            update = {"answer_type": question.answer_type, "qs": scored.score}
            rows.append(row.model_copy(update=update))
            continue
        runs: list[JudgeLabel | None] | None = None
        used: dict[str, int] = {}
        if labels is not None:
            runs = labels.get(item.key)
        elif judge is not None:
            judged = await judge(question, answer)
            runs = judged.labels
            used = {"judge_tokens_in": judged.tokens_in, "judge_tokens_out": judged.tokens_out}
        if method == "atm":
            label = None if runs is None else majority(runs)
            qs = None if label is None else float(label == "CORRECT")
            rows.append(
                row.model_copy(
                    update={
                        "judged": runs is not None,
                        "judge_label": label,
                        "judge_labels": runs or [],
                        "answer_type": question.answer_type,
                        "qs": qs,
                        **used,
                    }
                )
            )
            continue
        scores = open_answer_scores(answer, question.answer, question.category, variant)
        rows.append(
            row.model_copy(
                update={
                    "judged": runs is not None,
                    "judge_label": None if runs is None else majority(runs),
                    "judge_labels": runs or [],
                    "f1": scores.f1,
                    "bleu1": scores.bleu1,
                    **used,
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
        judged=row.judged,
        f1=row.f1,
        bleu1=row.bleu1,
        multiple_choice=multiple_choice,
        choice_correct=row.choice_correct,
        point_index=row.point_index,
        resolved=row.resolved,
        task_type=row.task_type,
        answer_type=row.answer_type,
        qs=row.qs,
    )


def results_of(
    dataset: Dataset,
    rows: Iterable[QuestionRow],
    f1_variant: str | None = None,
    *,
    manifest: DatasetManifest,
) -> JobResults:
    """`manifest`: the dataset's (registry.open_dataset), for the categories it excludes."""
    excluded = [manifest.categories[c] for c in manifest.excluded_from_overall]
    options = {q.question_id for q in dataset.questions if q.options}
    outcomes = [outcome_of(row, row.question_id in options) for row in rows]
    return aggregate(
        f"rescore-{dataset.dataset_id}",
        "completed",
        outcomes,
        {dataset.dataset_id: excluded},
        {dataset.dataset_id: f1_variant or dataset.f1_variant},
    )


def judged_by_llm(method: ScoringMethod, question: Question) -> bool:
    """Whether the LLM judge grades this question: an open question of a judged dataset, or an
    ATM-Bench open_end answer (its number and list answers are matched, not judged)."""
    return method == "judge" or (method == "atm" and question.answer_type == "open_end")


def judge_asked(dataset: Dataset) -> bool:
    """Whether a judge grades some question of the dataset: `--judge` asks it nothing when
    every question is multiple choice, the dataset is scored by token F1 alone, or no ATM-Bench
    answer is open-ended."""
    return any(
        judged_by_llm(scoring_method(q.options, dataset.scorer), q) for q in dataset.questions
    )


def llm_judge(
    call: Callable[[str], Awaitable[JudgeReply]],
    prompt: Prompt,
    abstention_prompt: Prompt,
    runs: int,
    retries: int,
    atm_call: Callable[[str], Awaitable[JudgeReply]] | None = None,
) -> Judge:
    """The evaluation spec's judge over any completion function, with the prompts the scorer
    uses: the abstention prompt for a question without a gold answer, the rule's prompt for a
    question with a judge rule (LongMemEval), ATM-Bench's own prompt for its open_end answers
    (asked through `atm_call` when given: its reply budget is the benchmark's, not `call`'s)."""
    rule_prompts = load_judge_rule_prompts()
    atm_prompt = load_prompt(ATM_JUDGE_PROMPT_NAME)

    async def verdict(question: Question, answer: str) -> JudgeVerdict:
        if question.answer_type is not None and question.answer is not None:
            # ATM-Bench's open_end answers: the benchmark's own prompt and verdict.
            atm_text = judge_prompt_text(
                question.question, question.answer, answer, atm_prompt.text
            )
            ask = atm_call or call
            return await judge(lambda: ask(atm_text), runs, retries, parse=atm_judge_label)
        _, text = judge_prompt_for(
            question.question,
            question.answer,
            answer,
            prompt,
            abstention_prompt,
            rule=question.judge_rule,
            rule_prompts=rule_prompts,
            explanation=question.gold_explanation,
        )
        return await judge(lambda: call(text), runs, retries)

    return verdict


def efficiency_lines(rows: Iterable[QuestionRow]) -> list[str]:
    """What a rescoring can say of the efficiency figures a job reports (JobResults.efficiency):
    its inputs carry no participant calls and no retrieved candidates, so neither latency nor
    retrieved context; only the judge's tokens when this rescoring asked the LLM judge."""
    lines = [
        "efficiency: latency and retrieved context not available (a predictions file carries "
        "no participant calls or candidates)"
    ]
    judged = [row for row in rows if row.judge_tokens_in is not None]
    if judged:
        tokens_in = sum(row.judge_tokens_in or 0 for row in judged) / len(judged)
        tokens_out = sum(row.judge_tokens_out or 0 for row in judged) / len(judged)
        lines.append(
            f"judge model use: {tokens_in:.1f} tokens in / {tokens_out:.1f} out per judged "
            f"question ({len(judged)} judged by the LLM here)"
        )
    return lines


def sandbox_verifier(
    dataset_id: str,
    open_task: OpenTask,
    limits: SandboxLimits,
    open_workspace: OpenWorkspace = Sandbox.from_archive,
) -> Verify:
    """Regrade a coding attempt from its patch, as the scorer service does: the task's files
    (`coding_track.registered_tasks`), a fresh sandbox, the hidden tests, SWE-bench's grading.
    What the platform could not verify gives None (the row is a platform failure)."""

    async def verified(question: Question, patch: str) -> Verification | None:
        try:
            files = await asyncio.to_thread(open_task, dataset_id, str(question.coding_task))
            return await asyncio.to_thread(
                verify, files.task, files.snapshot, patch, limits, open_workspace
            )
        except (CodingTaskUnavailable, SandboxFault, HiddenTestsRejected, ValueError):
            # The task's files, the sandbox, the task's hidden tests or lists: the platform's.
            return None

    return verified


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def scorer_versions(f1_variant: str) -> dict[str, str]:
    """Every scorer version a rescoring applies."""
    return {
        "f1": f1_variant,
        "abstention": ABSTENTION_VERSION,
        "bleu1": BLEU_VERSION,
        "bleu1_sentence_model": PUNKT_MODEL_ID,
        "multiple_choice": MC_VERSION,
        "judge_parser": JUDGE_PARSER_VERSION,
    }


def provenance(
    dataset: Dataset,
    bundle_hash: str,
    spec_hash: str,
    predictions_path: Path,
    f1_variant: str,
    judge_source: JudgeSource,
) -> Provenance:
    return Provenance(
        dataset_id=dataset.dataset_id,
        dataset_version=dataset.version,
        bundle_hash=bundle_hash,
        spec_hash=spec_hash,
        predictions_file=str(predictions_path),
        predictions_sha256=file_sha256(predictions_path),
        f1_variant=f1_variant,
        f1_variant_declared=dataset.f1_variant,
        scorers=scorer_versions(f1_variant),
        nltk=str(nltk.__version__),
        categories=dict(sorted(dataset.categories.items())),
        judge=judge_source,
    )


def results_document(results: JobResults, origin: Provenance) -> dict[str, Any]:
    """The `--json` document: the results as the pipeline reports them, plus `provenance`."""
    document: dict[str, Any] = results.model_dump(mode="json")
    document["provenance"] = origin.model_dump(mode="json")
    return document
