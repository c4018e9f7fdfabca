"""A planned question is defined once (`aml_contract.questions.PlannedQuestion`): the work
message's facts and the stored question document are built from it, so they cannot drift."""

from __future__ import annotations

from aml_contract.messages import QuestionFacts
from aml_contract.questions import PlannedQuestion
from aml_runtime.documents import QuestionDocument


def test_the_message_facts_are_exactly_the_planned_question() -> None:
    assert QuestionFacts.model_fields.keys() == PlannedQuestion.model_fields.keys()
    for name, field in PlannedQuestion.model_fields.items():
        assert QuestionFacts.model_fields[name].annotation == field.annotation, name


def test_the_stored_document_holds_every_fact_and_round_trips_to_the_message() -> None:
    assert PlannedQuestion.model_fields.keys() <= QuestionDocument.model_fields.keys()
    document = QuestionDocument(
        _id="j1/locomo/q-1",
        job_id="j1",
        conversation_id="conv-1",
        dataset_id="locomo",
        question_id="q-1",
        user_id="eval:j1:locomo:conv-1",
        question="When did Caroline go?",
        category=2,
        category_name="temporal",
        gold_answer="7 May 2023",
        f1_variant="f1-v1",
        question_date="2023-05-08",
    )
    stored = document.stored()
    # Stored field names as before; an optional fact not given is absent, not null.
    assert stored["_id"] == "j1/locomo/q-1" and "judge_rule" not in stored
    facts = QuestionFacts.of(stored)
    assert facts.question_date == "2023-05-08" and facts.judge_rule is None
    assert facts.model_dump(exclude_none=True) == {
        name: value for name, value in stored.items() if name in PlannedQuestion.model_fields
    }
