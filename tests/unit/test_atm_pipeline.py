"""ATM-Bench through the platform's scoring seams, without I/O: the scorer service's handler on
planned ATM-Bench questions (a fake chat model and a fake of the stored candidates), the
scheduler's outcome and aggregation, `aml team results`' table and the LLM stand-in's reply to
the benchmark's judge prompt."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeChatModel

from aml_contract.messages import QuestionFacts, QuestionWork
from aml_devtools.tables import render_results
from aml_evaluation.aggregate import aggregate
from aml_evaluation.atmbench import synthetic
from aml_evaluation.atmbench.dataset import parse
from aml_evaluation.atmbench.scoring import judge_prompt_text, parse_judge_reply
from aml_evaluation.datasets import Dataset
from aml_evaluation.evidence import EVIDENCE_VERSION
from aml_evaluation.prompts import load_prompt
from aml_evaluation.registry import PACKAGE_DATA_DIR, DatasetManifest, ManifestFile, load_dataset
from aml_llm_standin.replies import is_judge_prompt, judge_reply
from aml_pipeline.question_stage import STAGES
from aml_pipeline.stage_worker import StageCall
from aml_runtime.documents import ScoreDocument
from aml_scheduler.handlers import question_outcome
from aml_scheduler.planning import plan_questions
from aml_scorer.handlers import ScoreAnswer
from aml_scorer.settings import ScorerSettings

JOB = "job-atm"


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    files = synthetic.bundle_files()
    manifest = DatasetManifest(
        dataset_id="atm",
        version="1",
        format="atm-bench",
        track="multimodal",
        scorer="atm_qs",
        categories={1: "number", 2: "list_recall", 3: "open_end"},
        files=[ManifestFile(path=name, sha256="0" * 64) for name in sorted(files)],
    )
    return parse(sorted(files.items()), manifest)


class _Records:
    """The stored candidates of every search: each returns the units' texts, newest first."""

    def __init__(self, dataset: Dataset) -> None:
        sessions = dataset.conversations[0].sessions
        self.candidates = [
            {"id": f"m{i}", "content": session.turns[0].text}
            for i, session in enumerate(reversed(sessions))
        ]

    async def candidates_of(self, item_id: str) -> list[dict[str, Any]]:
        return self.candidates


class _Stores:
    def __init__(self, dataset: Dataset) -> None:
        self.records = _Records(dataset)


def _score_all(dataset: Dataset, answers: dict[str, str], reply: str) -> tuple[list[Any], Any]:
    model = FakeChatModel(reply)
    score = ScoreAnswer(
        settings=ScorerSettings(),
        stores=_Stores(dataset),  # type: ignore[arg-type]
        llm=model,  # type: ignore[arg-type]
        prompt=load_prompt("judge_v1"),
        abstention_prompt=load_prompt("judge_abstention_v1"),
    )

    async def run() -> list[Any]:
        outcomes = []
        for doc in plan_questions(JOB, dataset, top_k=10):
            work = QuestionWork(
                job_id=JOB, version_id="v", item_id=doc.id, answer=answers[doc.question_id]
            )
            facts = QuestionFacts.of(doc.stored()).model_dump()
            scored = await score(work, facts, StageCall(1))
            record = ScoreDocument.model_validate(
                {"_id": doc.id, "job_id": JOB, "state": "done", **scored}
            )
            outcomes.append((doc, record, question_outcome(doc.stored(), record)))
        return outcomes

    return asyncio.run(run()), model


def test_questions_are_planned_with_their_type_and_evidence(dataset: Dataset) -> None:
    docs = {doc.question_id: doc for doc in plan_questions(JOB, dataset, top_k=10)}
    q4 = docs["owner:q4"]
    assert q4.answer_type == "list_recall" and q4.scorer == "atm_qs"
    assert q4.evidence_rule == "unit-id-v1"
    assert q4.evidence_markers == {unit: [unit] for unit in synthetic.IMAGE_IDS[:2]}
    # The gold answer and evidence never reach the participant.
    assert synthetic.IMAGE_IDS[0] not in q4.search_body.decode()


def test_each_type_is_scored_its_own_way_and_only_open_end_asks_the_judge(
    dataset: Dataset,
) -> None:
    gold = {q.question_id: q.answer or "" for q in dataset.questions}
    outcomes, model = _score_all(dataset, gold, '{"explanation": "ok", "accuracy": "true"}')
    by_type = {doc.answer_type: [] for doc, _, _ in outcomes}
    for doc, record, _ in outcomes:
        by_type[doc.answer_type].append(record)
    # The gold answers themselves: every deterministic score is full.
    assert all(r.qs == 1.0 and r.qs_method == "exact_match" for r in by_type["number"])
    assert all(r.qs == 1.0 and r.qs_method == "jaccard" for r in by_type["list_recall"])
    assert all(r.qs == 1.0 and r.judge_prompt == "judge_atm_v1" for r in by_type["open_end"])
    # One judge call per open_end answer, with the benchmark's prompt filled in and its own
    # reply budget (its judge reasons before its verdict).
    assert len(model.prompts) == 3
    assert [body["max_tokens"] for body in model.requests] == [600] * 3
    template = load_prompt("judge_atm_v1").text
    q7 = next(q for q in dataset.questions if q.question_id == "owner:q7")
    assert judge_prompt_text(q7.question, gold["owner:q7"], gold["owner:q7"], template) in (
        model.prompts
    )
    results = aggregate(JOB, "completed", [o for _, _, o in outcomes], {})
    assert results.overall.headline == "qs_mean" and results.overall.qs_mean == 1.0
    evidence = results.overall.evidence
    assert evidence is not None and evidence.questions == 9
    # Every unit is among the 7 candidates returned: all evidence found within 10.
    assert evidence.recall["10"] == 1.0 and evidence.joint["10"] == 1.0


def test_wrong_answers_and_an_unreadable_judge(dataset: Dataset) -> None:
    answers = {q.question_id: "no idea" for q in dataset.questions}
    answers["owner:q4"] = f"{synthetic.IMAGE_IDS[0]}, {synthetic.IMAGE_IDS[2]}"  # 1 of 3
    outcomes, _ = _score_all(dataset, answers, "I think the prediction is correct.")
    records = {doc.question_id: record for doc, record, _ in outcomes}
    assert records["owner:q4"].qs == pytest.approx(1 / 3)
    assert records["owner:q1"].qs == 0.0
    # The original would guess "correct" from the words; here it is a judge failure.
    open_end = [r for r in records.values() if r.answer_type == "open_end"]
    assert all(r.qs is None and r.judge_label is None for r in open_end)
    results = aggregate(JOB, "completed", [o for _, _, o in outcomes], {})
    assert results.overall.failures == {"judge_failure": 3}
    assert results.overall.qs_mean == pytest.approx((1 / 3) / 6)


def test_the_results_table_shows_qs_and_evidence(dataset: Dataset) -> None:
    gold = {q.question_id: q.answer or "" for q in dataset.questions}
    outcomes, _ = _score_all(dataset, gold, '{"accuracy": "false"}')
    results = aggregate(JOB, "completed", [o for _, _, o in outcomes], {}).model_dump(mode="json")
    table = render_results(results)
    header = table.splitlines()[0]
    assert header.split()[-6:] == ["QS", "R@1", "R@5", "R@10", "J@5", "J@10"]
    overall = next(line for line in table.splitlines() if line.startswith("Overall"))
    # QS 6/9 (the open_end answers judged wrong); all evidence within 10, Joint@10 6/9.
    qs, _, _, recall10, _, joint10 = overall.split()[-6:]
    assert (qs, recall10, joint10) == ("66.7", "100.0", "66.7")
    assert "QS: ATM-Bench's question-type score" in table


def test_the_standin_answers_the_benchmarks_judge_in_its_format() -> None:
    text = judge_prompt_text("Q?", "gold", "prediction", load_prompt("judge_atm_v1").text)
    assert is_judge_prompt(text)
    assert parse_judge_reply(judge_reply(text)) in (True, False)
    # The platform's own judge prompts still get its label format.
    assert judge_reply('reply {"label": ...} Generated answer: x').startswith('{"label"')


def test_the_bundle_generator_writes_what_the_parser_reads(tmp_path: Path) -> None:
    written = synthetic.write_bundle(tmp_path)
    assert {path.relative_to(tmp_path).as_posix() for path in written} == set(
        synthetic.bundle_files()
    )


def _scorer_over(records: Any) -> ScoreAnswer:
    """A scorer whose stored searches are `records`, its judge agreeing with every answer."""
    stores: Any = type("Stores", (), {"records": records})()
    return ScoreAnswer(
        settings=ScorerSettings(),
        stores=stores,
        llm=FakeChatModel('{"accuracy": "true"}'),  # type: ignore[arg-type]
        prompt=load_prompt("judge_v1"),
        abstention_prompt=load_prompt("judge_abstention_v1"),
    )


def test_a_missing_search_record_leaves_the_score_without_evidence(dataset: Dataset) -> None:
    class NoRecord:
        async def candidates_of(self, item_id: str) -> None:
            return None

    score = _scorer_over(NoRecord())
    doc = next(d for d in plan_questions(JOB, dataset, top_k=10) if d.answer_type == "number")
    work = QuestionWork(job_id=JOB, version_id="v", item_id=doc.id, answer=doc.gold_answer)
    facts = QuestionFacts.of(doc.stored()).model_dump()
    scored = asyncio.run(score(work, facts, StageCall(1)))
    assert scored["qs"] == 1.0 and "evidence_ranks" not in scored


def test_ranks_the_search_carried_are_recorded_without_a_read(dataset: Dataset) -> None:
    """The searcher ranks a question's evidence over the candidates it received and the work
    carries the ranks on: the scorer records them and reads no stored candidates."""

    class NoReads:
        async def candidates_of(self, item_id: str) -> None:
            raise AssertionError("the scorer read the stored candidates")

    score = _scorer_over(NoReads())
    doc = next(d for d in plan_questions(JOB, dataset, top_k=10) if d.answer_type == "number")
    assert doc.evidence_markers
    ranks = {evidence_id: rank for rank, evidence_id in enumerate(doc.evidence_markers, 2)}
    work = QuestionWork(
        job_id=JOB, version_id="v", item_id=doc.id, answer=doc.gold_answer, evidence_ranks=ranks
    )
    facts = QuestionFacts.of(doc.stored()).model_dump()
    scored = asyncio.run(score(work, facts, StageCall(1)))
    assert scored["evidence_ranks"] == ranks
    assert (scored["evidence_rule"], scored["evidence_version"]) == (
        "unit-id-v1",
        EVIDENCE_VERSION,
    )
    # What the search hands on carries them, beside the candidates.
    carried = STAGES["search"].carry({"candidates": [], "evidence_ranks": ranks})
    assert carried == {"candidates": [], "evidence_ranks": ranks}


def test_the_shipped_sample_is_the_generators_bundle() -> None:
    """`synthetic_atm` in the package is exactly what `write_bundle` writes (re-made by it)."""
    shipped = PACKAGE_DATA_DIR / "synthetic_atm"
    on_disk = {
        path.relative_to(shipped).as_posix(): path.read_bytes()
        for path in shipped.rglob("*")
        if path.is_file()
    }
    assert on_disk == synthetic.bundle_files()
    loaded = load_dataset("synthetic_atm", Path("/nonexistent"))
    assert (loaded.scorer, loaded.track, loaded.evidence_rule) == (
        "atm_qs",
        "multimodal",
        "unit-id-v1",
    )
    assert len(loaded.questions) == 9 and len(loaded.conversations[0].sessions) == 7
