"""`aml rescore` on every kind of dataset the pipeline evaluates: a streaming dataset (one
prediction per point, results split by point), a dataset scored by token F1 alone (never
judged), PersonaMem's multiple-choice questions (option accuracy) and LongMemEval's judge rules.
Each rescoring is checked against what a job with the same answers reports: the scorer
service's handler on the scheduler's planned questions, the scheduler's outcome of each score
and the same aggregate() (no LLM: a fake judge stands in for it on both sides)."""

from __future__ import annotations

import asyncio
import csv
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeChatModel

from aml_contract.api.results import JobResults
from aml_contract.messages import QuestionFacts, QuestionWork
from aml_devtools import rescore
from aml_devtools.cli import main
from aml_evaluation.aggregate import aggregate
from aml_evaluation.atmbench import synthetic
from aml_evaluation.datasets import Dataset
from aml_evaluation.prompts import load_prompt
from aml_evaluation.registration import register_dataset
from aml_evaluation.registry import DatasetManifest, open_dataset
from aml_pipeline.stage_worker import StageCall
from aml_runtime.documents import ScoreDocument
from aml_scheduler.handlers import question_outcome
from aml_scheduler.planning import plan_questions
from aml_scorer.handlers import ScoreAnswer
from aml_scorer.settings import ScorerSettings

JOB = "job-1"
STREAMING = Path(__file__).parents[1] / "data" / "streaming" / "streaming_v1.json"
# Every item of tests/data/streaming with an answer: right at some points, wrong at others.
STREAMING_ANSWERS = {
    "str-1:q0000@2": "At the city library",
    "str-1:q0000@6": "At a bakery",
    "str-1:q0001": "Pepper",
    "str-1:q0002@8": "Rye bread",
    "str-2:q0000@0": "No idea at all",
    "str-2:q0000@3": "The Lisbon marathon",
}
# The answers the fake judge grades WRONG (neither is a gold answer or in a question).
WRONG_ANSWERS = ("At the city library", "No idea at all")

Reply = Callable[[str], str]


def _verdict(prompt: str) -> str:
    """The fake judge: WRONG when the prompt holds a wrong answer, else CORRECT."""
    wrong = any(answer in prompt for answer in WRONG_ANSWERS)
    return '{"label": "WRONG"}' if wrong else '{"label": "CORRECT"}'


def _live_results(
    dataset: Dataset, manifest: DatasetManifest, answers: Mapping[str, str], reply: Reply
) -> JobResults:
    return asyncio.run(_live_job(dataset, manifest, answers, reply))


async def _live_job(
    dataset: Dataset, manifest: DatasetManifest, answers: Mapping[str, str], reply: Reply
) -> JobResults:
    """What a job with these answers reports: each planned item scored by the scorer service's
    handler, its outcome as the scheduler reads it, and the scheduler's aggregate() call."""
    completions = FakeChatModel(reply)
    score = ScoreAnswer(
        settings=ScorerSettings(),
        # The answer comes with the work; the searches returned nothing.
        stores=_NoCandidates(),  # type: ignore[arg-type]
        llm=completions,  # type: ignore[arg-type]
        prompt=load_prompt("judge_v1"),
        abstention_prompt=load_prompt("judge_abstention_v1"),
    )
    prefix = f"{JOB}/{dataset.dataset_id}/"
    outcomes = []
    for doc in plan_questions(JOB, dataset, top_k=5):
        work = QuestionWork(
            job_id=JOB, version_id="v", item_id=doc.id, answer=answers[doc.id.removeprefix(prefix)]
        )
        facts = QuestionFacts.of(doc.stored()).model_dump()
        scored = await score(work, facts, StageCall(1))
        record = ScoreDocument.model_validate(
            {"_id": doc.id, "job_id": JOB, "state": "done", **scored}
        )
        outcomes.append(question_outcome(doc.stored(), record))
    excluded = [manifest.categories[c] for c in manifest.excluded_from_overall]
    return aggregate(
        JOB,
        "completed",
        outcomes,
        {dataset.dataset_id: excluded},
        {dataset.dataset_id: dataset.f1_variant},
    )


class _Records:
    async def candidates_of(self, item_id: str) -> list[dict[str, Any]]:
        return []


class _NoCandidates:
    """The stores of a job whose Searches returned no candidates (the scorer reads them only
    for the evidence figures)."""

    records = _Records()


def _without_evidence(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_evidence(v) for k, v in value.items() if k != "evidence"}
    return value


def _same_numbers(rescored: Mapping[str, Any], live: JobResults) -> None:
    # A predictions file carries no candidates, so a rescoring reports no evidence figures
    # (Recall@k); every other number is the job's.
    expected = _without_evidence(live.model_dump(mode="json"))
    assert "evidence" not in rescored["overall"]
    assert rescored["datasets"] == expected["datasets"]
    assert rescored["overall"] == expected["overall"]


def _write_jsonl(path: Path, rows: Mapping[str, Any], field: str) -> Path:
    path.write_text(
        "".join(json.dumps({"question_id": k, field: v}) + "\n" for k, v in rows.items())
    )
    return path


def _register_streaming(root: Path, dataset_id: str, **manifest: Any) -> None:
    shutil.copy(STREAMING, root / STREAMING.name)
    register_dataset(root / STREAMING.name, "locomo", dataset_id, root, **manifest)


def _rescore(root: Path, dataset_id: str, predictions: Path, *extra: str) -> int:
    return main(
        ["rescore", "--dataset", dataset_id, "--datasets-root", str(root),
         "--predictions", str(predictions), *extra]
    )  # fmt: skip


# --- streaming ---------------------------------------------------------------------------------


def test_a_streaming_dataset_is_rescored_per_point_as_a_job_reports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _register_streaming(tmp_path, "streaming")
    manifest, dataset = open_dataset("streaming", tmp_path)
    predictions = _write_jsonl(tmp_path / "predictions.jsonl", STREAMING_ANSWERS, "answer")
    labels = {
        key: [json.loads(_verdict(answer))["label"]] for key, answer in STREAMING_ANSWERS.items()
    }
    labels_path = _write_jsonl(tmp_path / "labels.jsonl", labels, "labels")
    rows_path, results_path = tmp_path / "rows.jsonl", tmp_path / "results.json"
    code = _rescore(
        tmp_path, "streaming", predictions, "--judge-labels", str(labels_path),
        "--rows", str(rows_path), "--json", str(results_path),
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    results = json.loads(results_path.read_text())
    points = results["datasets"]["streaming"]["points"]
    # Point 1: str-1:q0000@2 wrong, str-1:q0002@8 right, str-2:q0000@0 wrong; point 2: both
    # right. str-1:q0001 has no points: in the dataset's overall, in no point cell.
    assert {name: (p["questions"], p["judge_correct"]) for name, p in points.items()} == {
        "1": (3, 1),
        "2": (2, 2),
    }
    assert results["overall"]["questions"] == 6 and results["overall"]["judge_correct"] == 4
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    assert [(r["question_id"], r["point"], r["point_index"]) for r in rows] == [
        ("str-1:q0000", 2, 1), ("str-1:q0000", 6, 2), ("str-1:q0001", None, None),
        ("str-1:q0002", 8, 1), ("str-2:q0000", 0, 1), ("str-2:q0000", 3, 2),
    ]  # fmt: skip
    live = _live_results(dataset, manifest, STREAMING_ANSWERS, _verdict)
    _same_numbers(results, live)


def test_a_missing_point_is_a_failure_of_that_point_only(tmp_path: Path) -> None:
    _register_streaming(tmp_path, "streaming")
    answers = {k: v for k, v in STREAMING_ANSWERS.items() if k != "str-2:q0000@3"}
    predictions = _write_jsonl(tmp_path / "predictions.jsonl", answers, "answer")
    results_path = tmp_path / "results.json"
    assert _rescore(tmp_path, "streaming", predictions, "--json", str(results_path)) == 0
    points = json.loads(results_path.read_text())["datasets"]["streaming"]["points"]
    assert points["2"]["failures"] == {"no_prediction": 1}
    assert points["1"]["failed"] == 0 and points["1"]["scored"] == 3


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (
            "str-1:q0000",
            "unknown question_id 'str-1:q0000'; 'str-1:q0000' is asked at points of its "
            "conversation, each predicted under its own id: 'str-1:q0000@2', 'str-1:q0000@6'",
        ),
        ("str-1:q0000@3", "unknown question_id 'str-1:q0000@3'"),
        ("str-1:q0001@8", "unknown question_id 'str-1:q0001@8'"),
    ],
)
def test_a_streaming_question_is_predicted_by_its_item_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, message: str
) -> None:
    _register_streaming(tmp_path, "streaming")
    predictions = _write_jsonl(tmp_path / "predictions.jsonl", {key: "x"}, "answer")
    assert _rescore(tmp_path, "streaming", predictions) == 2
    assert f"predictions.jsonl:1: {message}" in capsys.readouterr().err


# --- token F1 alone ----------------------------------------------------------------------------


def test_a_token_f1_dataset_is_scored_by_f1_alone_and_never_judged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _register_streaming(tmp_path, "f1only", scorer="token_f1", f1_variant="f1-memgallery-v1")
    manifest, dataset = open_dataset("f1only", tmp_path)
    predictions = _write_jsonl(tmp_path / "predictions.jsonl", STREAMING_ANSWERS, "answer")
    rows_path, results_path = tmp_path / "rows.jsonl", tmp_path / "results.json"
    # --judge asks nothing: no LLM is configured here, and none is called.
    code = _rescore(
        tmp_path, "f1only", predictions, "--judge",
        "--rows", str(rows_path), "--json", str(results_path),
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "judge: not asked (no question of this dataset is judged)" in capsys.readouterr().out
    results = json.loads(results_path.read_text())
    assert results["provenance"]["judge"]["kind"] == "none"
    cell = results["datasets"]["f1only"]
    assert cell["overall"]["headline"] == results["overall"]["headline"] == "f1_mean"
    assert cell["f1_variant"] == "f1-memgallery-v1"
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    assert all(not r["judged"] and r["bleu1"] is None and r["f1"] is not None for r in rows)
    assert cell["overall"]["unjudged"] == 6 and cell["overall"]["bleu1_mean"] is None
    assert cell["overall"]["f1_mean"] == pytest.approx(sum(r["f1"] for r in rows) / 6)
    assert set(cell["points"]) == {"1", "2"}

    def no_judge(prompt: str) -> str:
        raise AssertionError("a token_f1 dataset is never judged")

    live = _live_results(dataset, manifest, STREAMING_ANSWERS, no_judge)
    _same_numbers(results, live)


def test_judge_labels_for_a_token_f1_dataset_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _register_streaming(tmp_path, "f1only", scorer="token_f1")
    predictions = _write_jsonl(tmp_path / "predictions.jsonl", STREAMING_ANSWERS, "answer")
    labels = _write_jsonl(tmp_path / "labels.jsonl", {"str-1:q0001": "CORRECT"}, "label")
    assert _rescore(tmp_path, "f1only", predictions, "--judge-labels", str(labels)) == 2
    assert (
        "a judge label is given for 'str-1:q0001', which no judge grades: the dataset is "
        "scored by token F1 alone" in capsys.readouterr().err
    )


# --- multiple choice (PersonaMem) -------------------------------------------------------------


def _personamem_files(root: Path) -> list[Path]:
    """Two questions on one shared context (each asked after the turns before its end index)
    and one on another, as the released files write them."""
    context_a, context_b = "a" * 64, "b" * 64
    contexts = {
        context_a: [
            {"role": "user", "content": "User: I love matcha latte."},
            {"role": "assistant", "content": "Assistant: Noted, matcha it is."},
            {"role": "user", "content": "Actually I switched to coffee."},
        ],
        context_b: [
            {"role": "user", "content": "I read sci-fi."},
            {"role": "assistant", "content": "Try Le Guin."},
        ],
    }
    options = str(["(a) Tea", "(b) Matcha latte", "(c) Coffee", "(d) Water"])
    rows = [
        ("q1", "recall_user_shared_facts", options, "(b)", context_a, "2"),
        ("q2", "track_full_preference_evolution", options, "(c)", context_a, "3"),
        (
            "q3",
            "generalizing_to_new_scenarios",
            json.dumps(["Dune", "Solaris"]),
            "b",
            context_b,
            "2",
        ),
    ]
    questions = root / "questions_32k.csv"
    with questions.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["persona_id", "question_id", "question_type", "topic", "user_question_or_message",
             "all_options", "correct_answer", "shared_context_id", "end_index_in_shared_context"]
        )  # fmt: skip
        for qid, kind, choices, gold, context, end in rows:
            writer.writerow(["0", qid, kind, "food", "Which one?", choices, gold, context, end])
    shared = root / "shared_contexts_32k.jsonl"
    shared.write_text("".join(json.dumps({k: v}) + "\n" for k, v in contexts.items()))
    return [questions, shared]


def test_multiple_choice_questions_are_rescored_by_option_as_a_job_scores_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_dataset(_personamem_files(tmp_path), "personamem", "pm", tmp_path)
    manifest, dataset = open_dataset("pm", tmp_path)
    items = list(rescore.asked_items(dataset))
    # PersonaMem asks each question at its end index: streaming, one point each.
    assert items == ["q1@2", "q2@3", "q3@2"]
    # Right, wrong, and an answer that names no option (a failure, never a wrong answer).
    answers = dict(zip(items, ["(b) Matcha latte", "A", "maybe both"], strict=True))
    predictions = _write_jsonl(tmp_path / "predictions.jsonl", answers, "answer")
    results_path = tmp_path / "results.json"
    assert _rescore(tmp_path, "pm", predictions, "--json", str(results_path)) == 0
    assert "MC" in capsys.readouterr().out
    results = json.loads(results_path.read_text())
    overall = results["datasets"]["pm"]["overall"]
    assert (overall["option_questions"], overall["option_correct"]) == (2, 1)
    assert overall["option_accuracy"] == overall["accuracy"] == 0.5
    assert overall["failures"] == {"unreadable_choice": 1}
    assert overall["headline"] == "accuracy"

    def no_judge(prompt: str) -> str:
        raise AssertionError("a multiple-choice question is never judged")

    _same_numbers(results, _live_results(dataset, manifest, answers, no_judge))

    labels = _write_jsonl(tmp_path / "labels.jsonl", {"q1@2": "CORRECT"}, "label")
    assert _rescore(tmp_path, "pm", predictions, "--judge-labels", str(labels)) == 2
    assert "which no judge grades: a multiple-choice question" in capsys.readouterr().err


# --- LongMemEval judge rules ------------------------------------------------------------------


def _longmemeval_file(root: Path) -> Path:
    def instance(qid: str, kind: str, answer: str) -> dict[str, Any]:
        return {
            "question_id": qid,
            "question_type": kind,
            "question": f"When did I take the trip ({qid})?",
            "answer": answer,
            "question_date": "2023/05/30 (Tue) 23:40",
            "haystack_session_ids": [f"answer_{qid}_1"],
            "haystack_dates": ["2023/05/22 (Mon) 10:05"],
            "haystack_sessions": [
                [
                    {"role": "user", "content": "I went to Lisbon.", "has_answer": True},
                    {"role": "assistant", "content": "Lovely!"},
                ]
            ],
            "answer_session_ids": [f"answer_{qid}_1"],
        }

    path = root / "longmemeval_s_test.json"
    explanation = "The information provided is not enough. You mentioned a trip but not when."
    path.write_text(
        json.dumps(
            [
                instance("q-temp", "temporal-reasoning", "Rye bread"),
                instance("q-temp_abs", "temporal-reasoning", explanation),
            ]
        )
    )
    return path


def test_longmemeval_rules_are_judged_with_their_prompts_as_a_job_judges_them(
    tmp_path: Path,
) -> None:
    register_dataset(_longmemeval_file(tmp_path), "longmemeval", "lme", tmp_path)
    manifest, dataset = open_dataset("lme", tmp_path)
    answers = {"q-temp": "Rye bread", "q-temp_abs": "I have no record of when you went."}
    prompts: list[str] = []
    settings = ScorerSettings()

    async def call(text: str) -> str:
        prompts.append(text)
        return _verdict(text)

    judge = rescore.llm_judge(
        call,
        load_prompt("judge_v1"),
        load_prompt("judge_abstention_v1"),
        settings.judge_runs,
        settings.judge_retries,
    )
    rows = asyncio.run(rescore.score_questions(dataset, answers, None, judge))
    rescored = rescore.results_of(dataset, rows, manifest=manifest)

    temporal, abstention = prompts
    rule_prompt = load_prompt("judge_longmemeval_abstention_v1")
    # The abstention question: its rule's prompt, shown the explanation, never as a gold.
    assert abstention.startswith(rule_prompt.text.split("{", 1)[0])
    assert "Explanation: The information provided is not enough" in abstention
    assert "Correct answer" not in abstention
    assert temporal.startswith(load_prompt("judge_longmemeval_temporal_v1").text.split("{", 1)[0])
    by_id = {row.question_id: row for row in rows}
    assert by_id["q-temp_abs"].judge_label == "CORRECT" and by_id["q-temp_abs"].bleu1 is None
    assert by_id["q-temp"].judge_label == "CORRECT" and by_id["q-temp"].bleu1 is not None

    live = _live_results(dataset, manifest, answers, _verdict)
    _same_numbers(rescored.model_dump(mode="json"), live)


# --- ATM-Bench (question-type score) -----------------------------------------------------------


def test_an_atm_bench_dataset_is_rescored_by_answer_type_as_a_job_scores_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    synthetic.write_bundle(tmp_path / "atm")
    register_dataset(tmp_path / "atm", "atm-bench", "atm", tmp_path)
    manifest, dataset = open_dataset("atm", tmp_path)
    answers = {q.question_id.split(":", 1)[1]: q.answer or "" for q in dataset.questions}
    # A list answer naming one of its two images and another: Jaccard 1/3.
    answers["q4"] = f"{synthetic.IMAGE_IDS[0]}, {synthetic.IMAGE_IDS[2]}"
    keyed = {f"owner:{key}": answer for key, answer in answers.items()}
    predictions = _write_jsonl(tmp_path / "predictions.jsonl", keyed, "answer")
    open_end = [q.question_id for q in dataset.questions if q.answer_type == "open_end"]
    verdicts = {qid: "WRONG" if qid == open_end[0] else "CORRECT" for qid in open_end}
    labels = _write_jsonl(tmp_path / "labels.jsonl", verdicts, "label")
    results_path = tmp_path / "results.json"
    code = _rescore(
        tmp_path, "atm", predictions, "--judge-labels", str(labels), "--json", str(results_path)
    )
    assert code == 0, capsys.readouterr().err
    results = json.loads(results_path.read_text())
    cell = results["datasets"]["atm"]
    assert cell["overall"]["headline"] == "qs_mean"
    assert cell["categories"]["number"]["qs_mean"] == 1.0
    assert cell["categories"]["list_recall"]["qs_mean"] == pytest.approx((1 + 1 + 1 / 3) / 3)
    assert cell["categories"]["open_end"]["qs_mean"] == pytest.approx(2 / 3)
    assert "evidence" not in cell["overall"]  # a predictions file carries no candidates
    # The job's scorer gives the same numbers on the same answers and verdicts.
    judged_wrong = next(q.question for q in dataset.questions if q.question_id == open_end[0])

    def reply(prompt: str) -> str:
        return '{"accuracy": "false"}' if judged_wrong in prompt else '{"accuracy": "true"}'

    live = _live_results(dataset, manifest, keyed, reply)
    _same_numbers(results, live)
    # A number answer is matched, never judged: a label for it is refused.
    number = next(q.question_id for q in dataset.questions if q.answer_type == "number")
    wrong = _write_jsonl(tmp_path / "wrong.jsonl", {number: "CORRECT"}, "label")
    assert _rescore(tmp_path, "atm", predictions, "--judge-labels", str(wrong)) == 2
    assert "is matched, not judged" in capsys.readouterr().err
