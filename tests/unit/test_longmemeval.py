"""The LongMemEval format (aml_evaluation.longmemeval): parsing, chunking, the answer prompt's
date, the per-type judge prompts and the evaluation spec. The data are small files in
LongMemEval's format that the tests write; no LongMemEval data is shipped."""

from __future__ import annotations

import calendar
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from fakes import FakeChatModel

from aml_answerer.handlers import AnswerQuestion
from aml_answerer.settings import AnswererSettings
from aml_contract.messages import QuestionFacts, QuestionWork
from aml_evaluation import longmemeval
from aml_evaluation.aggregate import aggregate
from aml_evaluation.chunker import MAX_MESSAGES, plan_adds
from aml_evaluation.context import estimated
from aml_evaluation.datasets import Dataset
from aml_evaluation.judging import JUDGE_RULE_PROMPTS, judge_prompt_for, load_judge_rule_prompts
from aml_evaluation.longmemeval import (
    LONGMEMEVAL_CATEGORIES,
    parse,
    parse_longmemeval,
    parse_longmemeval_datetime,
)
from aml_evaluation.prompts import load_prompt, question_with_options
from aml_evaluation.registry import load_bundle
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_pipeline.stage_worker import StageCall
from aml_runtime.broker import FinalFailure
from aml_runtime.documents import ScoreDocument
from aml_runtime.settings import EvaluationSettings
from aml_runtime.stores import Stores
from aml_scheduler.handlers import question_outcome
from aml_scheduler.planning import plan_questions
from aml_scorer.handlers import ScoreAnswer
from aml_scorer.settings import ScorerSettings

JOB = "job-1"


@dataclass(frozen=True)
class Manifest:
    dataset_id: str = "longmemeval"
    version: str = "s-test"
    scorer: str = "llm_judge+token_f1"
    f1_variant: str = "f1-locomo-v1"
    categories: Mapping[int, str] = field(default_factory=lambda: dict(LONGMEMEVAL_CATEGORIES))


def _ms(year: int, month: int, day: int, hour: int, minute: int) -> int:
    return calendar.timegm((year, month, day, hour, minute, 0, 0, 0, 0)) * 1000


def _turn(role: str, content: str, evidence: bool = False) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": role, "content": content}
    if evidence:
        turn["has_answer"] = True
    return turn


def _instance(question_id: str, question_type: str, **overrides: Any) -> dict[str, Any]:
    instance: dict[str, Any] = {
        "question_id": question_id,
        "question_type": question_type,
        "question": f"What about {question_id}?",
        "answer": f"gold of {question_id}",
        "question_date": "2023/05/30 (Tue) 23:40",
        "haystack_session_ids": [f"{question_id}_s1", f"answer_{question_id}_1"],
        "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/22 (Mon) 10:05"],
        "haystack_sessions": [
            [_turn("user", "I like tea."), _turn("assistant", "Noted: tea.")],
            [
                _turn("user", f"Fact of {question_id}.", evidence=True),
                _turn("assistant", "Thanks for telling me!"),
            ],
        ],
        "answer_session_ids": [f"answer_{question_id}_1"],
    }
    instance.update(overrides)
    return instance


def _instances() -> list[dict[str, Any]]:
    return [
        _instance("q-ssu", "single-session-user"),
        _instance("q-ssa", "single-session-assistant"),
        _instance("q-pref", "single-session-preference", answer="The user prefers tea; ..."),
        # Sessions out of date order (as in the oracle file), one empty turn, one empty session.
        _instance(
            "q-multi",
            "multi-session",
            answer=3,
            haystack_session_ids=["late", "early", "empty", "middle"],
            haystack_dates=[
                "2023/06/02 (Fri) 09:00",
                "2023/05/01 (Mon) 08:30",
                "2023/05/10 (Wed) 12:00",
                "2023/05/15 (Mon) 18:45",
            ],
            haystack_sessions=[
                [_turn("user", "late one")],
                [_turn("user", "early one"), _turn("assistant", "   "), _turn("user", "more")],
                [],
                [_turn("assistant", "middle one")],
            ],
        ),
        _instance("q-temp", "temporal-reasoning", answer="18 days"),
        _instance("q-ku", "knowledge-update", answer="Berlin"),
        _instance(
            "q-temp_abs",
            "temporal-reasoning",
            answer="The information provided is not enough. You mentioned a trip but not when.",
        ),
    ]


def _write(tmp_path: Path, instances: Any, name: str = "longmemeval_s_test.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(instances))
    return path


def _parse(tmp_path: Path, instances: Any, manifest: Manifest | None = None) -> Dataset:
    path = _write(tmp_path, instances)
    return parse([(path.name, path.read_bytes())], manifest or Manifest())


@pytest.fixture
def dataset(tmp_path: Path) -> Dataset:
    return _parse(tmp_path, _instances())


# --- parsing ----------------------------------------------------------------------------------


def test_each_instance_is_one_user_with_one_question(dataset: Dataset) -> None:
    ids = ["q-ssu", "q-ssa", "q-pref", "q-multi", "q-temp", "q-ku", "q-temp_abs"]
    assert [c.conversation_id for c in dataset.conversations] == ids
    assert [q.question_id for q in dataset.questions] == ids
    assert [q.conversation_id for q in dataset.questions] == ids
    assert all(
        c.speakers_are_roles and c.speakers == ("user", "assistant") for c in dataset.conversations
    )
    assert (dataset.dataset_id, dataset.version, dataset.f1_variant) == (
        "longmemeval",
        "s-test",
        "f1-locomo-v1",
    )
    assert dataset.categories == dict(LONGMEMEVAL_CATEGORIES)


def test_categories_are_the_question_types_and_abstention_is_a_flag(dataset: Dataset) -> None:
    by_id = {q.question_id: q for q in dataset.questions}
    assert {q: (by_id[q].category, by_id[q].category_name) for q in by_id} == {
        "q-ssu": (1, "single-session-user"),
        "q-ssa": (2, "single-session-assistant"),
        "q-pref": (3, "single-session-preference"),
        "q-multi": (4, "multi-session"),
        "q-temp": (5, "temporal-reasoning"),
        "q-ku": (6, "knowledge-update"),
        "q-temp_abs": (5, "temporal-reasoning"),
    }
    assert {q: by_id[q].judge_rule for q in by_id} == {
        "q-ssu": None,
        "q-ssa": None,
        "q-pref": "longmemeval-preference",
        "q-multi": None,
        "q-temp": "longmemeval-temporal",
        "q-ku": "longmemeval-knowledge-update",
        "q-temp_abs": "longmemeval-abstention",
    }
    abstention = by_id["q-temp_abs"]
    assert abstention.unanswerable and abstention.answer is None
    assert abstention.gold_explanation is not None
    assert abstention.gold_explanation.startswith("The information provided is not enough")
    assert not abstention.adversarial and abstention.adversarial_answer is None
    assert by_id["q-multi"].answer == "3"  # a number in the source
    assert by_id["q-pref"].answer == "The user prefers tea; ..."  # the rubric
    assert all(q.gold_explanation is None for q in dataset.questions if q is not abstention)
    assert all(q.question_date == "2023/05/30 (Tue) 23:40" for q in dataset.questions)
    assert by_id["q-ssu"].evidence == ["answer_q-ssu_1"]
    assert by_id["q-ssu"].question == "What about q-ssu?"


def test_sessions_are_ordered_by_date_and_keep_their_ids(dataset: Dataset) -> None:
    multi = dataset.conversations[3]
    assert [s.session_key for s in multi.sessions] == ["early", "middle", "late"]  # "empty" skipped
    assert [s.index for s in multi.sessions] == [2, 4, 1]  # source positions, 1-based
    assert [s.timestamp_ms for s in multi.sessions] == [
        _ms(2023, 5, 1, 8, 30),
        _ms(2023, 5, 15, 18, 45),
        _ms(2023, 6, 2, 9, 0),
    ]
    assert multi.sessions[0].date_text == "2023/05/01 (Mon) 08:30"
    early = multi.sessions[0]
    # The whitespace-only turn is skipped; the others keep their source position in the id.
    assert [(t.turn_id, t.speaker, t.text) for t in early.turns] == [
        ("early:t0", "user", "early one"),
        ("early:t2", "user", "more"),
    ]


def test_equal_dates_keep_the_source_order(tmp_path: Path) -> None:
    instance = _instance(
        "q",
        "multi-session",
        haystack_dates=["2023/05/20 (Sat) 02:21", "2023/05/20 (Sat) 02:21"],
    )
    (conversation,) = _parse(tmp_path, [instance]).conversations
    assert [s.session_key for s in conversation.sessions] == ["q_s1", "answer_q_1"]


def test_a_draft_manifest_gets_the_format_categories_and_the_registry_loads_it(
    tmp_path: Path,
) -> None:
    data = _write(tmp_path, _instances())
    manifest = {
        "dataset_id": "longmemeval_s",
        "version": "cleaned-test",
        "format": "longmemeval",
        "scorer": "llm_judge+token_f1",
        "categories": {},
        "files": [{"path": data.name, "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}],
    }
    manifest_path = tmp_path / "longmemeval_s.json"
    manifest_path.write_text(json.dumps(manifest))
    dataset = load_bundle(manifest_path)
    assert dataset.categories == dict(LONGMEMEVAL_CATEGORIES)
    assert len(dataset.questions) == 7


def test_parse_longmemeval_is_the_pure_entry(dataset: Dataset) -> None:
    pure = parse_longmemeval(_instances(), "longmemeval", "s-test")
    assert pure == dataset


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2023/05/20 (Sat) 02:21", _ms(2023, 5, 20, 2, 21)),
        ("2023/05/20 02:21", _ms(2023, 5, 20, 2, 21)),  # the weekday is optional
        ("2024/02/29 (Thu) 23:59", _ms(2024, 2, 29, 23, 59)),
        (" 2023/1/2 (mon) 0:00 ", _ms(2023, 1, 2, 0, 0)),
    ],
)
def test_dates_are_read_as_utc(text: str, expected: int) -> None:
    assert parse_longmemeval_datetime(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "2023/02/29 (Wed) 10:00",
        "2023/13/01 (Mon) 10:00",
        "2023/05/20 (Sat) 24:00",
        "2023/05/20 (Sat) 10:60",
        "2023/05/20 (Xyz) 10:00",
        "20 May 2023",
        "2023-05-20 10:00",
        "2023/05/20 (Sat) 10:00" + " " * 200,
    ],
)
def test_bad_dates_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a LongMemEval date"):
        parse_longmemeval_datetime(text)


def _without(field_name: str) -> dict[str, Any]:
    instance = _instance("q-bad", "single-session-user")
    del instance[field_name]
    return instance


@pytest.mark.parametrize(
    ("instances", "message"),
    [
        ([_without("question_date")], r"instance 'q-bad': missing question_date"),
        ([_without("haystack_sessions")], r"instance 'q-bad': missing haystack_sessions"),
        ([{"question": "?"}], r"instance \[0\]: missing question_id, question_type"),
        (
            [_instance("q-bad", "single-session-user", haystack_dates=["2023/05/20 (Sat) 02:21"])],
            r"'q-bad': 2 haystack_session_ids, 1 haystack_dates and 2 haystack_sessions",
        ),
        ([_instance("q-bad", "abstention")], r"'q-bad': unknown question_type 'abstention'"),
        (
            [_instance("q-bad", "multi-session", question_date="yesterday")],
            r"'q-bad': question_date: not a LongMemEval date: 'yesterday'",
        ),
        (
            [
                _instance(
                    "q-bad",
                    "multi-session",
                    haystack_dates=["2023/05/20 (Sat) 02:21", "2023/02/30 (Thu) 10:00"],
                )
            ],
            r"'q-bad' session 'answer_q-bad_1': haystack_dates: not a LongMemEval date",
        ),
        (
            [
                _instance(
                    "q-bad",
                    "multi-session",
                    haystack_sessions=[[_turn("system", "card")], []],
                )
            ],
            r"'q-bad' session 'q-bad_s1' turn \[0\]: role 'system' is neither user nor assistant",
        ),
        (
            [_instance("q-bad", "multi-session", haystack_sessions=[[{"role": "user"}], []])],
            r"turn \[0\]: not an object with role and content",
        ),
        (
            [_instance("q-bad", "multi-session", haystack_session_ids=["s", "s"])],
            r"'q-bad' session \[1\]: session id 's' given twice",
        ),
        (
            [_instance("q-bad", "multi-session", haystack_session_ids=["s", "a:b"])],
            r"session id 'a:b' is not a plain id",
        ),
        ([_instance("q:bad", "multi-session")], r"instance \[0\]: question_id 'q:bad' is not"),
        (
            [_instance("q-bad", "multi-session"), _instance("q-bad", "multi-session")],
            r"instance 'q-bad': question_id given twice",
        ),
        ([_instance("q-bad", "multi-session", answer=None)], r"'q-bad': answer is not a string"),
        ([_instance("q-bad", "multi-session", question=["?"])], r"question is not a string"),
        (
            [_instance("q-bad", "multi-session", haystack_dates="x")],
            r"haystack_dates is not a list",
        ),
        (["not an object"], r"instance \[0\]: not a JSON object"),
        ({"question_id": "q"}, r"a LongMemEval file is a JSON list of instances"),
    ],
)
def test_malformed_input_is_named(tmp_path: Path, instances: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _parse(tmp_path, instances)


def test_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^broken\.json: not JSON"):
        parse([("broken.json", b"[{")], Manifest())
    with pytest.raises(ValueError, match=r"^longmemeval_s_test\.json instance 'q-bad'"):
        _parse(tmp_path, [_without("answer")])


def test_a_manifest_must_declare_the_category(tmp_path: Path) -> None:
    manifest = Manifest(categories={1: "single-session-user"})
    with pytest.raises(ValueError, match=r"declares no category 5 \(temporal-reasoning\)"):
        _parse(tmp_path, [_instance("q", "temporal-reasoning")], manifest)


def test_locomo_per_category_f1_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="applies to LoCoMo's categories only"):
        _parse(tmp_path, _instances(), Manifest(f1_variant="f1-locomo-category-v1"))


def test_absurd_inputs_are_refused_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(longmemeval, "MAX_SESSIONS", 1)
    with pytest.raises(ValueError, match="haystack_session_ids has more than 1 items"):
        _parse(tmp_path, [_instance("q", "multi-session")])
    monkeypatch.setattr(longmemeval, "MAX_SESSIONS", 10)
    monkeypatch.setattr(longmemeval, "MAX_TOTAL_TURNS", 5)
    with pytest.raises(ValueError, match="more than 5 turns in the dataset"):
        _parse(tmp_path, [_instance("a", "multi-session"), _instance("b", "multi-session")])
    monkeypatch.setattr(longmemeval, "MAX_TEXT_CHARS", 10)
    with pytest.raises(ValueError, match="question_type is longer than 10 characters"):
        _parse(tmp_path, [_instance("q", "multi-session")])
    monkeypatch.setattr(longmemeval, "MAX_INSTANCES", 1)
    with pytest.raises(ValueError, match="more than 1 instances"):
        _parse(tmp_path, _instances())


# --- chunking ---------------------------------------------------------------------------------


def test_turns_go_out_under_their_roles_unchanged_with_the_session_date(tmp_path: Path) -> None:
    long_session = [_turn("user" if i % 2 == 0 else "assistant", f"turn {i}") for i in range(25)]
    instance = _instance(
        "q-chat",
        "multi-session",
        haystack_session_ids=["second", "first"],
        haystack_dates=["2023/05/22 (Mon) 10:05", "2023/05/20 (Sat) 02:21"],
        haystack_sessions=[[_turn("user", "User: I moved to Berlin.")], long_session],
    )
    adds = plan_adds(_parse(tmp_path, [instance]), "run7")
    # 25 turns: the 20-message rule splits "first"; "second" never shares a chunk with it.
    assert [(a.seq, a.session_id, len(a.request.messages)) for a in adds] == [
        (1, "eval:run7:q-chat:first", MAX_MESSAGES),
        (2, "eval:run7:q-chat:first", 5),
        (3, "eval:run7:q-chat:second", 1),
    ]
    assert {a.user_id for a in adds} == {"eval:run7:longmemeval:q-chat"}
    assert adds[0].request_id == "eval:run7:longmemeval:q-chat:chunk-1"
    messages = [m for a in adds for m in a.request.messages]
    assert [(m.role, m.content) for m in messages[:3]] == [
        ("user", "turn 0"),
        ("assistant", "turn 1"),
        ("user", "turn 2"),
    ]
    # The text is sent as it is: no "speaker: " prefix added, nothing removed.
    assert (messages[-1].role, messages[-1].content) == ("user", "User: I moved to Berlin.")
    assert {m.timestamp for m in messages[:25]} == {_ms(2023, 5, 20, 2, 21)}
    assert messages[-1].timestamp == _ms(2023, 5, 22, 10, 5)


# --- planning, answering ------------------------------------------------------------------------


def test_planned_questions_carry_the_rule_the_explanation_and_the_date(dataset: Dataset) -> None:
    docs = {doc.question_id: doc.stored() for doc in plan_questions(JOB, dataset, top_k=5)}
    abstention = docs["q-temp_abs"]
    assert abstention["gold_answer"] is None
    assert abstention["judge_rule"] == "longmemeval-abstention"
    assert abstention["gold_explanation"].startswith("The information provided")
    assert docs["q-temp"]["judge_rule"] == "longmemeval-temporal"
    # A field left None is not written: a question without a rule is stored as before.
    assert "judge_rule" not in docs["q-ssu"] and "gold_explanation" not in docs["q-ssu"]
    assert docs["q-ssu"]["question_date"] == "2023/05/30 (Tue) 23:40"
    assert docs["q-ssu"]["category_name"] == "single-session-user"
    # the Search request carries the question text alone, never its date or gold.
    assert json.loads(docs["q-temp_abs"]["search_body"]) == {
        "query": "What about q-temp_abs?",
        "user_id": f"eval:{JOB}:longmemeval:q-temp_abs",
        "top_k": 5,
    }
    facts = QuestionFacts.of(abstention)
    assert (facts.judge_rule, facts.question_date) == (
        "longmemeval-abstention",
        "2023/05/30 (Tue) 23:40",
    )
    # An older message without the new fields still validates, as the earlier behaviour.
    old = {
        k: v
        for k, v in facts.model_dump().items()
        if k not in {"judge_rule", "gold_explanation", "question_date"}
    }
    assert QuestionFacts.model_validate(old).judge_rule is None


def test_the_question_date_goes_to_the_answer_model_only_when_set() -> None:
    assert question_with_options("Where?", None) == "Where?"
    assert question_with_options("Where?", None, "2023/05/30 (Tue) 23:40") == (
        "Where?\nCurrent date: 2023/05/30 (Tue) 23:40"
    )
    assert question_with_options("Which?", ["a", "b"], "2023/05/30 (Tue) 23:40") == (
        "Which?\nCurrent date: 2023/05/30 (Tue) 23:40\nOptions:\nA. a\nB. b\n"
        "Answer with the letter of one option."
    )


class _Searches:
    async def find_one(self, query: dict[str, Any], *projection: Any) -> dict[str, Any]:
        return {"state": "done", "candidates": [{"id": "m1", "content": "I took the trip."}]}


async def test_the_answer_prompt_tells_the_date(dataset: Dataset) -> None:
    doc = next(d for d in plan_questions(JOB, dataset, top_k=5) if d.question_id == "q-temp")
    completions = FakeChatModel("18 days")
    answer = AnswerQuestion(
        settings=AnswererSettings(),
        stores=Stores.over(SimpleNamespace(searches=_Searches())),  # type: ignore[arg-type]
        llm=cast(Any, completions),
        prompt=load_prompt("answer_v1"),
        count_tokens=estimated,
    )
    facts = QuestionFacts.of(doc.stored()).model_dump()
    await answer(QuestionWork(job_id=JOB, version_id="v", item_id=doc.id), facts, StageCall(1))
    (prompt,) = completions.prompts
    assert "Question: What about q-temp?\nCurrent date: 2023/05/30 (Tue) 23:40\nAnswer:" in prompt


# --- judging ----------------------------------------------------------------------------------


EXPECTED_PROMPTS = {
    "q-ssu": ("judge_v1", "Gold answer: gold of q-ssu"),
    "q-ssa": ("judge_v1", "Gold answer: gold of q-ssa"),
    "q-multi": ("judge_v1", "Gold answer: 3"),
    "q-temp": ("judge_longmemeval_temporal_v1", "do not penalize off-by-one errors"),
    "q-ku": ("judge_longmemeval_knowledge_update_v1", "previous information along with an"),
    "q-pref": ("judge_longmemeval_preference_v1", "Rubric: The user prefers tea; ..."),
    "q-temp_abs": ("judge_longmemeval_abstention_v1", "Explanation: The information provided"),
}


def _scorer(completions: FakeChatModel) -> ScoreAnswer:
    unused: Any = None
    return ScoreAnswer(
        settings=ScorerSettings(),
        stores=unused,
        llm=cast(Any, completions),
        prompt=load_prompt("judge_v1"),
        abstention_prompt=load_prompt("judge_abstention_v1"),
    )


async def test_each_question_type_is_judged_with_its_prompt(dataset: Dataset) -> None:
    outcomes = []
    for doc in plan_questions(JOB, dataset, top_k=5):
        completions = FakeChatModel('{"label": "CORRECT"}')
        facts = QuestionFacts.of(doc.stored()).model_dump()
        work = QuestionWork(job_id=JOB, version_id="v", item_id=doc.id, answer="19 days")
        scored = await _scorer(completions)(work, facts, StageCall(1))
        name, snippet = EXPECTED_PROMPTS[doc.question_id]
        assert scored["judge_prompt"] == name, doc.question_id
        assert scored["judge_prompt_sha256"] == load_prompt(name).sha256
        (text,) = completions.prompts
        assert snippet.lower() in text.lower(), doc.question_id
        assert '{"label": "CORRECT"}' in text  # the verdict format the parser reads
        assert scored["judge_label"] == "CORRECT"
        assert scored["f1_version"] == "f1-locomo-v1" and scored["f1"] is not None
        if doc.question_id == "q-temp_abs":
            assert scored["bleu1"] is None  # no gold answer: no BLEU-1, as for LoCoMo
            assert "gold of" not in text
        record = ScoreDocument.model_validate(
            {"_id": doc.id, "job_id": JOB, "state": "done", **scored}
        )
        outcomes.append(question_outcome(doc.stored(), record))
    results = aggregate(JOB, "completed", outcomes, excluded={})
    assert set(results.datasets["longmemeval"].categories) == set(LONGMEMEVAL_CATEGORIES.values())


async def test_an_unknown_rule_fails_the_question_for_good(dataset: Dataset) -> None:
    doc = plan_questions(JOB, dataset, top_k=5)[0]
    facts = QuestionFacts.of(doc.stored()).model_dump() | {"judge_rule": "no-such-rule"}
    work = QuestionWork(job_id=JOB, version_id="v", item_id=doc.id, answer="x")
    with pytest.raises(FinalFailure, match="unknown judge rule 'no-such-rule'"):
        await _scorer(FakeChatModel("{}"))(work, facts, StageCall(1))


def test_judge_prompt_for_rules() -> None:
    judge_v1, abstention = load_prompt("judge_v1"), load_prompt("judge_abstention_v1")
    prompts = load_judge_rule_prompts()
    assert {rule: p.name for rule, p in prompts.items()} == dict(JUDGE_RULE_PROMPTS)
    # No rule: today's behaviour, byte for byte.
    assert judge_prompt_for("Q?", "G", "A", judge_v1, abstention) == (
        judge_v1,
        judge_v1.text.format(question="Q?", gold_answer="G", generated_answer="A"),
    )
    assert judge_prompt_for("Q?", None, "A", judge_v1, abstention)[0] == abstention
    chosen, text = judge_prompt_for(
        "Q?", "18", "19", judge_v1, abstention, rule="longmemeval-temporal"
    )
    assert chosen.name == "judge_longmemeval_temporal_v1"
    assert "Correct answer: 18\nModel response: 19" in text
    with pytest.raises(ValueError, match="needs a gold answer"):
        judge_prompt_for("Q?", None, "A", judge_v1, abstention, rule="longmemeval-temporal")
    with pytest.raises(ValueError, match="for questions without a gold answer"):
        judge_prompt_for("Q?", "G", "A", judge_v1, abstention, rule="longmemeval-abstention")
    _, text = judge_prompt_for("Q?", None, "A", judge_v1, abstention, rule="longmemeval-abstention")
    assert "Explanation: (none given)" in text
    for prompt in prompts.values():
        assert prompt.fields in (
            frozenset({"question", "gold_answer", "generated_answer"}),
            frozenset({"question", "explanation", "generated_answer"}),
        )


# --- the evaluation spec ----------------------------------------------------------------------


def test_the_spec_lists_the_rule_prompts() -> None:
    spec = build_evaluation_spec(EvaluationSettings())
    assert spec.schema_version == "aml-eval-spec/3"
    # The rules' prompts, and ATM-Bench's own judge of its open_end answers.
    assert {rule: call.prompt for rule, call in spec.judge_rules.items()} == dict(
        JUDGE_RULE_PROMPTS
    ) | {"atm-open-end": "judge_atm_v1"}
    for rule, call in spec.judge_rules.items():
        assert call.prompt_sha256 == load_prompt(call.prompt).sha256
        # ATM-Bench's judge has the benchmark's own reply budget (its reasoning comes first).
        max_tokens = 600 if rule == "atm-open-end" else spec.judge.max_tokens
        assert (call.model, call.max_tokens) == (spec.judge.model, max_tokens)
    summary = spec.summary()
    assert summary["judge_rule.longmemeval-temporal"].startswith("judge_longmemeval_temporal_v1@")
    edited = spec.judge_rules["longmemeval-preference"].model_copy(
        update={"prompt_sha256": "0" * 64}
    )
    changed = spec.model_copy(
        update={"judge_rules": {**spec.judge_rules, "longmemeval-preference": edited}}
    )
    assert changed.content_hash != spec.content_hash
