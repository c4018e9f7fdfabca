"""The PersonaMem format end to end on small files written here (no PersonaMem data is shipped):
parsing, the Search body (options, never the gold), the answer prompt, choice scoring and the
option accuracy per category."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import FakeChatModel

from aml_answerer.handlers import AnswerQuestion
from aml_answerer.settings import AnswererSettings
from aml_contract.messages import QuestionFacts, QuestionWork
from aml_evaluation.aggregate import aggregate, results_fingerprint
from aml_evaluation.chunker import plan_adds
from aml_evaluation.context import estimated
from aml_evaluation.datasets import Dataset
from aml_evaluation.personamem import (
    PERSONAMEM_CATEGORIES,
    PERSONAMEM_TYPE_ALIASES,
    category_of,
    parse,
    parse_options,
)
from aml_evaluation.prompts import load_prompt
from aml_pipeline.stage_worker import StageCall
from aml_runtime.documents import ScoreDocument
from aml_runtime.stores import Stores
from aml_scheduler.handlers import question_outcome
from aml_scheduler.planning import plan_chunks, plan_questions
from aml_scorer.handlers import ScoreAnswer

COLUMNS = [
    "persona_id",
    "question_id",
    "question_type",
    "topic",
    "user_question_or_message",
    "correct_answer",
    "all_options",
    "shared_context_id",
    "end_index_in_shared_context",
]
CTX_A = "a" * 64
CTX_B = "b" * 64
CTX_UNUSED = "c" * 64
# As the released CSV writes them: a Python list literal with labelled options.
OPTIONS_PY = str(["(a) Tea", "(b) Matcha latte", "(c) Coffee", "(d) Water"])
CONTEXTS: dict[str, list[dict[str, str]]] = {
    CTX_A: [
        {"role": "system", "content": "Current user persona: Kai, 34, Honolulu."},
        {"role": "user", "content": "User: I love matcha latte."},
        {"role": "assistant", "content": "Assistant: Noted, matcha it is."},
        {"role": "system", "content": "Conversation next week."},
        {"role": "user", "content": "User: "},  # empty once its tag is removed: skipped
        {"role": "user", "content": "Actually I switched to coffee."},
    ],
    CTX_B: [
        {"role": "user", "content": "I read sci-fi."},
        {"role": "system", "content": "persona card"},
        {"role": "system", "content": "another block with nothing in it"},
        {"role": "assistant", "content": "Try Le Guin."},
    ],
    CTX_UNUSED: [{"role": "user", "content": "never asked about"}],
}


@dataclass(frozen=True)
class Manifest:
    dataset_id: str = "personamem"
    version: str = "32k-test"
    scorer: str = "multiple_choice"
    f1_variant: str = "f1-locomo-v1"
    categories: Mapping[int, str] = field(default_factory=lambda: dict(PERSONAMEM_CATEGORIES))


def _row(**values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "persona_id": "0",
        "question_id": "q1",
        "question_type": "recall_user_shared_facts",
        "topic": "food",
        "user_question_or_message": "What should I drink this morning?",
        "correct_answer": "(b)",
        "all_options": OPTIONS_PY,
        "shared_context_id": CTX_A,
        "end_index_in_shared_context": "3",
    }
    row.update(values)
    return row


ROWS = [
    _row(),
    _row(
        question_id="q2",
        question_type="track_full_preference_evolution",
        correct_answer="(c)",
        end_index_in_shared_context="6",
    ),
    _row(
        persona_id="1",
        question_id="q3",
        question_type="generalizing_to_new_scenarios",  # the 32k file's spelling of type 7
        user_question_or_message="Any book for the flight?",
        all_options=json.dumps(["Dune", "The Dispossessed"]),
        correct_answer="b",
        shared_context_id=CTX_B,
        end_index_in_shared_context="0",
    ),
]


def _files(
    tmp_path: Path,
    rows: list[dict[str, Any]] = ROWS,
    contexts: Mapping[str, Any] = CONTEXTS,
    columns: list[str] = COLUMNS,
) -> list[tuple[str, bytes]]:
    questions = tmp_path / "questions_32k.csv"
    with questions.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    shared = tmp_path / "shared_contexts_32k.jsonl"
    shared.write_text(
        "".join(json.dumps({key: value}) + "\n" for key, value in contexts.items()),
        encoding="utf-8",
    )
    return [(path.name, path.read_bytes()) for path in (questions, shared)]


@pytest.fixture
def dataset(tmp_path: Path) -> Dataset:
    return parse(_files(tmp_path), Manifest())


# --- parsing ----------------------------------------------------------------------------------


def test_contexts_become_conversations_split_at_system_messages(dataset: Dataset) -> None:
    assert [c.conversation_id for c in dataset.conversations] == [CTX_A, CTX_B]  # unused: out
    first, second = dataset.conversations
    assert first.speakers == ("user", "assistant")
    assert [(s.session_key, s.index, s.date_text, s.timestamp_ms) for s in first.sessions] == [
        ("session_1", 1, "", None),
        ("session_2", 2, "", None),
    ]
    assert [(t.turn_id, t.speaker, t.text) for t in first.sessions[0].turns] == [
        (f"{CTX_A}:m1", "user", "I love matcha latte."),
        (f"{CTX_A}:m2", "assistant", "Noted, matcha it is."),
    ]
    assert [(t.turn_id, t.text) for t in first.sessions[1].turns] == [
        (f"{CTX_A}:m5", "Actually I switched to coffee.")
    ]
    # Messages before the first system message are a session; an empty block is skipped.
    assert [(s.session_key, [t.turn_id for t in s.turns]) for s in second.sessions] == [
        ("session_1", [f"{CTX_B}:m0"]),
        ("session_3", [f"{CTX_B}:m3"]),
    ]
    written = [t.text for c in dataset.conversations for s in c.sessions for t in s.turns]
    assert not any("persona" in text for text in written)  # system messages are not written


def test_rows_become_multiple_choice_questions(dataset: Dataset) -> None:
    assert (dataset.dataset_id, dataset.version, dataset.scorer) == (
        "personamem",
        "32k-test",
        "multiple_choice",
    )
    assert dataset.categories == dict(PERSONAMEM_CATEGORIES)
    q1, q2, q3 = dataset.questions
    assert q1.question_id == "q1" and q1.conversation_id == CTX_A
    assert q1.question == "What should I drink this morning?"
    assert q1.options == ["Tea", "Matcha latte", "Coffee", "Water"]
    assert (q1.answer, q2.answer, q3.answer) == ("Matcha latte", "Coffee", "The Dispossessed")
    assert (q1.category, q1.category_name) == (1, "recall_user_shared_facts")
    assert (q2.category, q2.category_name) == (4, "track_full_preference_evolution")
    assert (q3.category, q3.category_name) == (7, "generalize_to_new_scenarios")
    assert q3.options == ["Dune", "The Dispossessed"]
    assert all(not q.adversarial and q.evidence == [] and not q.unanswerable for q in (q1, q3))


def test_each_question_is_asked_after_the_turns_written_before_its_end_index(
    dataset: Dataset, tmp_path: Path
) -> None:
    q1, q2, q3 = dataset.questions
    # CTX_A: index 3 follows the persona card (not written) and two turns; index 6 is the end
    # (a system message and an emptied message are not written); CTX_B: index 0 is before all.
    assert (q1.asked_at, q2.asked_at, q3.asked_at) == ((2,), (3,), (0,))
    assert dataset.streaming
    # Only the persona card before index 1: nothing is written yet, as at index 0.
    (early,) = parse(
        _files(tmp_path, [_row(end_index_in_shared_context="1")]), Manifest()
    ).questions
    assert early.asked_at == (0,)


def test_questions_are_searched_between_the_adds_at_their_end_index(dataset: Dataset) -> None:
    chunks = {(c.conversation_id, c.seq): c for c in plan_chunks("job-1", dataset)}
    items = {q.id: q for q in plan_questions("job-1", dataset, top_k=10)}
    assert sorted(items) == [
        "job-1/personamem/q1@2", "job-1/personamem/q2@3", "job-1/personamem/q3@0"
    ]  # fmt: skip
    q1, q2, q3 = (items[f"job-1/personamem/{name}"] for name in ("q1@2", "q2@3", "q3@0"))
    # q1 after CTX_A's first Add (its first session), before its second; q2 at the very end
    # (released with the user's other questions); q3 before CTX_B's first Add.
    assert (q1.point, q1.point_index, q1.after_seq, q1.holds_add) == (2, 1, 1, 2)
    assert (q2.point, q2.after_seq, q2.holds_add) == (3, 2, None)
    assert (q3.point, q3.after_seq, q3.holds_add) == (0, 0, 1)
    assert chunks[(CTX_A, 2)].searched_before == [q1.id]
    assert chunks[(CTX_B, 1)].searched_before == [q3.id]
    assert chunks[(CTX_A, 1)].searched_before is None
    assert "searched_before" not in chunks[(CTX_A, 1)].stored()


def test_every_question_type_spelling_maps_to_a_paper_category() -> None:
    assert list(PERSONAMEM_CATEGORIES) == [1, 2, 3, 4, 5, 6, 7]
    for number, name in PERSONAMEM_CATEGORIES.items():
        assert category_of(name) == number
    for alias, number in PERSONAMEM_TYPE_ALIASES.items():
        assert category_of(alias) == number
    assert category_of("revisit_reasons_behind_preference_updates") == 5
    with pytest.raises(KeyError):
        category_of("sentiment")


@pytest.mark.parametrize(
    ("cell", "options"),
    [
        ('["(a) x", "(b) y"]', ["x", "y"]),  # JSON
        (str(["(a) it's x", '(b) say "y"']), ["it's x", 'say "y"']),  # Python, mixed quotes
        ("['(A)  x ', '( b ) y']", ["x", "y"]),  # labels: any case and spacing
        ("['x', 'y', 'z']", ["x", "y", "z"]),  # unlabelled: kept as is
        ("['(a) (b) is fine', '(b) y']", ["(b) is fine", "y"]),  # only the first label goes
    ],
)
def test_options_parsing(cell: str, options: list[str]) -> None:
    assert parse_options("row", cell) == options


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("not a list", "is not a list literal"),
        ("['only one']", "list of 2 to 26 strings"),
        ("[1, 2]", "list of 2 to 26 strings"),
        (str([f"o{i}" for i in range(27)]), "list of 2 to 26 strings"),
        ("{'a': 1}", "list of 2 to 26 strings"),
        ("['(a) x', 'y']", "option 2 'y' is not labelled (b)"),
        ("['(a) x', '(c) y']", "option 2 '(c) y' is not labelled (b)"),
        ("['(a) x', '(b) x']", "two options have the same text"),
        ("['(a) ', '(b) x']", "an option is empty"),
        ("__import__('os').system('true')", "is not a list literal"),
        ("[" * 300 + "]" * 300, "list of 2 to 26 strings"),
        ("[" * 90_000 + "]" * 90_000, "is not a list literal"),  # too deep: refused, no crash
        ("['x', 'y']" + " " * 200_000, "longer than 200000 characters"),
    ],
)
def test_malformed_options_are_refused(cell: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"^row: ") as caught:
        parse_options("row", cell)
    assert message in str(caught.value)


BAD_ROWS: list[tuple[dict[str, Any], str]] = [
    ({"question_type": "sentiment"}, "unknown question_type 'sentiment'"),
    ({"correct_answer": "(e)"}, "correct_answer '(e)' names no option (there are 4)"),
    ({"correct_answer": "Matcha latte"}, "is not an option label like (c)"),
    ({"correct_answer": ""}, "is not an option label like (c)"),
    ({"all_options": "['(a) x', 'y']"}, "is not labelled (b)"),
    ({"shared_context_id": "d" * 64}, "is not in the contexts file"),
    ({"end_index_in_shared_context": "-3"}, "end_index_in_shared_context -3 is outside"),
    ({"end_index_in_shared_context": "7"}, "outside its context's 0..6 messages"),
    ({"end_index_in_shared_context": "x"}, "'x' is not an integer"),
    ({"user_question_or_message": "  "}, "empty user_question_or_message"),
    ({"persona_id": "9"}, "persona_id '9', but an earlier question of shared context"),
    ({"question_id": "q1"}, "question_id 'q1' given twice"),
]


@pytest.mark.parametrize(("second", "message"), BAD_ROWS)
def test_a_malformed_row_is_named(tmp_path: Path, second: dict[str, Any], message: str) -> None:
    rows = [ROWS[0], _row(**{"question_id": "q2", **second})]
    with pytest.raises(ValueError, match=r"^questions_32k\.csv row 2 \(question_id q") as caught:
        parse(_files(tmp_path, rows), Manifest())
    assert message in str(caught.value)


def test_a_bad_id_is_named_by_its_row(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^questions_32k\.csv row 1: question_id 'q/1'"):
        parse(_files(tmp_path, [_row(question_id="q/1")]), Manifest())


def test_a_draft_manifest_without_categories_gets_the_papers_seven(tmp_path: Path) -> None:
    dataset = parse(_files(tmp_path), Manifest(categories={}))
    assert dataset.categories == dict(PERSONAMEM_CATEGORIES)
    assert dataset.questions[2].category_name == "generalize_to_new_scenarios"


def test_a_category_the_manifest_does_not_declare(tmp_path: Path) -> None:
    manifest = Manifest(categories={4: "track_full_preference_evolution"})
    with pytest.raises(ValueError, match="is category 1, which the manifest does not declare"):
        parse(_files(tmp_path), manifest)


@pytest.mark.parametrize(
    ("contexts", "message"),
    [
        ({CTX_A: [{"role": "narrator", "content": "x"}]}, "message 0: role 'narrator' is none"),
        ({CTX_A: [{"role": "user", "content": 3}]}, "message 0: content is not a string"),
        ({CTX_A: ["hello"]}, "message 0: not an object with role and content"),
        ({CTX_A: {"role": "user"}}, "is not a list of messages"),
        ({"bad id": []}, "context id 'bad id' must be"),
    ],
)
def test_a_malformed_context_is_named(
    tmp_path: Path, contexts: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=r"^shared_contexts_32k\.jsonl line 1: ") as caught:
        parse(_files(tmp_path, [ROWS[0]], contexts), Manifest())
    assert message in str(caught.value)


def test_file_level_errors(tmp_path: Path) -> None:
    files = _files(tmp_path)
    with pytest.raises(ValueError, match=r"one questions \.csv and one shared contexts \.jsonl"):
        parse(files[:1], Manifest())
    with pytest.raises(ValueError, match=r"one questions \.csv and one shared contexts \.jsonl"):
        parse([*files, ("notes.txt", b"")], Manifest())
    with pytest.raises(ValueError, match=r"^questions_32k\.csv: missing column\(s\) all_options"):
        parse(_files(tmp_path, columns=[c for c in COLUMNS if c != "all_options"]), Manifest())
    with pytest.raises(ValueError, match=r"^shared_contexts_32k\.jsonl line 2: not JSON"):
        parse([files[0], (files[1][0], b'{"x": []}\n{oops\n')], Manifest())
    with pytest.raises(ValueError, match=r"line 2: shared context 'x' given twice"):
        parse([files[0], (files[1][0], b'{"x": []}\n{"x": []}\n')], Manifest())
    with pytest.raises(ValueError, match=r"^questions_32k\.csv: not UTF-8"):
        parse([(files[0][0], b"\xff\xfe"), files[1]], Manifest())
    only_system = {CTX_A: [{"role": "system", "content": "card"}]}
    with pytest.raises(ValueError, match="no user or assistant message"):
        parse(_files(tmp_path, [_row(end_index_in_shared_context="1")], only_system), Manifest())


def test_short_row_is_named(tmp_path: Path) -> None:
    files = _files(tmp_path)
    short = files[0][1] + b"0,q9,recall_user_shared_facts\r\n"
    with pytest.raises(ValueError, match=r"^questions_32k\.csv row 4: 9 columns expected"):
        parse([(files[0][0], short), files[1]], Manifest())


# --- Add, Search, answer, score, aggregate -----------------------------------------------------


def test_turns_go_out_under_their_own_roles_without_a_timestamp(dataset: Dataset) -> None:
    adds = plan_adds(dataset, "job-1")
    messages = [m for add in adds for m in add.request.messages]
    assert [m.role for m in messages] == ["user", "assistant", "user", "user", "assistant"]
    assert isinstance(messages[0].content, str)
    assert messages[0].content == "I love matcha latte."  # no "user: " prefix
    assert all(m.timestamp is None for m in messages)
    assert {add.user_id for add in adds} == {
        f"eval:job-1:personamem:{CTX_A}",
        f"eval:job-1:personamem:{CTX_B}",
    }


def test_search_carries_the_options_and_never_the_gold(tmp_path: Path) -> None:
    bodies = []
    for label in ("(a)", "(b)", "(c)", "(d)"):
        mc = parse(_files(tmp_path, [_row(correct_answer=label)]), Manifest())
        (doc,) = plan_questions("job-1", mc, top_k=7)
        assert doc.search_body is not None
        payload = json.loads(doc.search_body)
        assert payload == {
            "query": "What should I drink this morning?",
            "user_id": f"eval:job-1:personamem:{CTX_A}",
            "top_k": 7,
            "options": ["Tea", "Matcha latte", "Coffee", "Water"],
        }
        bodies.append(doc.search_body)
        # The scorer still has the gold, from the question document, not from the body.
        assert doc.gold_answer == mc.questions[0].answer
    # Whichever option is the gold, the participant receives the same bytes.
    assert len(set(bodies)) == 1


class _Searches:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    async def find_one(self, query: dict[str, Any], *projection: Any) -> dict[str, Any]:
        # q1 is asked at its end index, after its context's first two written turns.
        assert query == {"_id": "job-1/personamem/q1@2"}
        return self.document


async def test_the_answer_model_sees_the_lettered_options(dataset: Dataset) -> None:
    doc = plan_questions("job-1", dataset, top_k=100)[0]
    facts = QuestionFacts.of(doc.stored()).model_dump()
    completions = FakeChatModel(" B ")
    search = {"state": "done", "candidates": [{"id": "m1", "content": "user likes matcha"}]}
    answer = AnswerQuestion(
        settings=AnswererSettings(),
        stores=Stores.over(SimpleNamespace(searches=_Searches(search))),  # type: ignore[arg-type]
        llm=completions,  # type: ignore[arg-type]
        prompt=load_prompt("answer_v1"),
        count_tokens=estimated,
    )
    work = QuestionWork(job_id="job-1", version_id="v", item_id=doc.id)
    result = await answer(work, facts, StageCall(delivered=1))
    (prompt,) = completions.prompts
    assert (
        "Question: What should I drink this morning?\nOptions:\nA. Tea\nB. Matcha latte\n"
        "C. Coffee\nD. Water\nAnswer with the letter of one option.\n"
    ) in prompt
    assert "- user likes matcha" in prompt
    assert result["answer"] == "B"


def _score(question: dict[str, Any], reply: str) -> ScoreDocument:
    unused: Any = None  # choice() uses none of the collaborators
    scorer = ScoreAnswer(
        settings=unused, stores=unused, llm=unused, prompt=unused, abstention_prompt=unused
    )
    scored = scorer.choice(reply, question["options"], question["gold_answer"])
    return ScoreDocument.model_validate(
        {"_id": question["_id"], "job_id": "job-1", "state": "done", **scored}
    )


def test_option_accuracy_per_category_with_unreadable_answers_apart(tmp_path: Path) -> None:
    rows = [
        _row(question_id="f1", correct_answer="(b)"),
        _row(question_id="f2", correct_answer="(b)"),
        _row(question_id="f3", correct_answer="(a)"),
        _row(question_id="f4", correct_answer="(d)"),
        _row(question_id="e1", question_type="track_full_preference_updates", correct_answer="(c)"),
        _row(question_id="e2", question_type="track_full_preference_updates", correct_answer="(c)"),
    ]
    replies = {
        "f1": "B",  # correct, by letter
        "f2": "Answer: (B) Matcha latte",  # correct, letter and text agree
        "f3": "matcha latte.",  # wrong, by text
        "f4": "Tea or coffee, hard to say",  # names no option: unreadable, counted apart
        "e1": "C",  # correct
        "e2": "A) Coffee",  # letter and text disagree: unreadable
    }
    mc = parse(_files(tmp_path, rows), Manifest())
    outcomes = []
    for doc in plan_questions("job-1", mc, top_k=100):
        stored = doc.stored()
        outcomes.append(question_outcome(stored, _score(stored, replies[doc.question_id])))
    results = aggregate("job-1", "completed", outcomes, excluded={})
    categories = results.datasets["personamem"].categories
    assert set(categories) == {"recall_user_shared_facts", "track_full_preference_evolution"}
    facts = categories["recall_user_shared_facts"]
    assert (facts.questions, facts.scored, facts.option_questions, facts.option_correct) == (
        4,
        3,
        3,
        2,
    )
    assert facts.option_accuracy == pytest.approx(2 / 3)
    assert (facts.failed, facts.failures) == (1, {"unreadable_choice": 1})
    evolution = categories["track_full_preference_evolution"]
    assert (evolution.option_questions, evolution.option_correct, evolution.option_accuracy) == (
        1,
        1,
        1.0,
    )
    assert evolution.failures == {"unreadable_choice": 1}
    overall = results.overall
    assert (overall.option_questions, overall.option_correct, overall.failed) == (4, 3, 2)
    assert overall.option_accuracy == pytest.approx(3 / 4)
    assert overall.accuracy == pytest.approx(3 / 4)  # multiple choice alone: the same figure
    assert overall.judge_accuracy is None and overall.f1_mean is None


def test_option_accuracy_keeps_open_questions_out_and_leaves_the_fingerprint_alone() -> None:
    from aml_evaluation.aggregate import QuestionOutcome

    outcomes = [
        QuestionOutcome(dataset_id="d", category_name="c", scored=True,
                        multiple_choice=True, choice_correct=False),
        QuestionOutcome(dataset_id="d", category_name="c", scored=True,
                        judge_label="CORRECT", judge_labels=["CORRECT"], f1=1.0),
    ]  # fmt: skip
    results = aggregate("j", "completed", outcomes, excluded={})
    metrics = results.datasets["d"].categories["c"]
    assert metrics.accuracy == 0.5  # the headline mixes both kinds
    assert (metrics.option_accuracy, metrics.judge_accuracy) == (0.0, 1.0)
    open_only = aggregate("j", "completed", outcomes[1:], excluded={}).overall
    assert open_only.option_accuracy is None
    # Results stored before option_accuracy existed have the same fingerprint.
    stored = results.model_dump(mode="json")["datasets"]
    before = json.loads(json.dumps(stored))
    for dataset_results in before.values():
        del dataset_results["overall"]["option_accuracy"]
        for cell in dataset_results["categories"].values():
            del cell["option_accuracy"]
    assert results_fingerprint(before) == results_fingerprint(stored)


def test_a_personamem_bundle_loads_through_the_registry(tmp_path: Path) -> None:
    from aml_evaluation.registry import DatasetManifest, ManifestFile, load_manifest_bundle

    files = _files(tmp_path)
    manifest = DatasetManifest(
        dataset_id="personamem",
        version="32k-test",
        format="personamem",
        scorer="multiple_choice",
        categories=dict(PERSONAMEM_CATEGORIES),
        files=[
            ManifestFile(path=name, sha256=hashlib.sha256(data).hexdigest()) for name, data in files
        ],
    )
    dataset = load_manifest_bundle(manifest, tmp_path)
    assert [q.question_id for q in dataset.questions] == ["q1", "q2", "q3"]
    assert dataset.questions[0].options == ["Tea", "Matcha latte", "Coffee", "Water"]
