"""Evidence recall (aml_evaluation.evidence): how the platform recognises a question's evidence
among a participant's candidates, and Recall@k / Joint@k in the results."""

from __future__ import annotations

from typing import Any

import pytest

from aml_evaluation.aggregate import QuestionOutcome, aggregate, results_fingerprint
from aml_evaluation.datasets import Conversation, Dataset, Question, Session, Turn
from aml_evaluation.evidence import EvidenceIndex, evidence_ranks, recall_at


def _question(evidence: list[str], conversation: str = "conv-1") -> Question:
    return Question(
        question_id=f"{conversation}:q0000",
        conversation_id=conversation,
        question="Where did Caroline go?",
        answer="a support group",
        category=1,
        category_name="single-hop",
        evidence=evidence,
        adversarial=False,
    )


def _locomo_like(questions: list[Question]) -> Dataset:
    turns = [
        Turn(turn_id="D1:1", speaker="Caroline", text="I went to a LGBTQ support group yesterday."),
        Turn(turn_id="D1:2", speaker="Melanie", text="Wow,   that's COOL!"),
        Turn(turn_id="D1:3", speaker="Caroline", text="Thanks!"),
    ]
    session = Session(session_key="session_1", index=1, date_text="d", timestamp_ms=0, turns=turns)
    return Dataset(
        dataset_id="toy",
        version="1",
        categories={1: "single-hop"},
        scorer="llm_judge+token_f1",
        conversations=[
            Conversation(
                conversation_id="conv-1", speakers=("Caroline", "Melanie"), sessions=[session]
            )
        ],
        questions=questions,
    )


def test_turn_text_markers_name_the_turns_a_question_cites() -> None:
    question = _question(["D1:1", "D1:3", "D9:99", "D1:1"])
    markers = EvidenceIndex(_locomo_like([question])).markers(question)
    # Repeated ids collapse; an id naming no turn cannot be recognised and is left out.
    assert markers == {
        "D1:1": ["i went to a lgbtq support group yesterday."],
        "D1:3": ["thanks!"],
    }
    assert EvidenceIndex(_locomo_like([question])).markers(_question([])) == {}


def test_a_round_of_a_session_names_both_its_turns() -> None:
    turns = [
        Turn(turn_id="2:user", speaker="user", text="My dog is called Biscuit."),
        Turn(turn_id="2:assistant", speaker="assistant", text="What a lovely name for a dog."),
        Turn(turn_id="3:user", speaker="user", text="He is three years old now."),
    ]
    dataset = Dataset(
        dataset_id="mg",
        version="1",
        categories={1: "factual-retrieval"},
        scorer="token_f1",
        conversations=[
            Conversation(
                conversation_id="conv-1",
                speakers=("user", "assistant"),
                speakers_are_roles=True,
                sessions=[
                    Session(session_key="D1", index=1, date_text="d", timestamp_ms=0, turns=turns)
                ],
            )
        ],
        questions=[],
    )
    markers = EvidenceIndex(dataset).markers(_question(["D1:2"]))
    assert markers == {
        "D1:2": ["my dog is called biscuit.", "what a lovely name for a dog."],
    }


def test_a_candidate_holding_the_turns_text_is_that_evidence_wherever_it_stands() -> None:
    markers = {"D1:1": ["i went to a lgbtq support group yesterday."]}
    candidates: list[dict[str, Any]] = [
        {"id": "m1", "content": "Melanie likes painting."},
        # The participant stored the whole Add: speaker prefix, other turns, other spacing.
        {"id": "m2", "content": "Caroline: I went to a LGBTQ   support group\nyesterday.\nX"},
        {"id": "m3", "content": "Caroline: I went to a LGBTQ support group yesterday."},
    ]
    assert evidence_ranks("turn-text-v1", markers, candidates) == {"D1:1": 2}
    # A rewritten memory ("Caroline attended a support group") is not the written evidence.
    rewritten = [{"id": "m", "content": "Caroline attended an LGBTQ support group."}]
    assert evidence_ranks("turn-text-v1", markers, rewritten) == {"D1:1": None}


def test_a_short_turn_counts_only_as_a_whole_line() -> None:
    markers = {"D1:3": ["thanks!"]}
    inside = [{"id": "a", "content": "He said thanks! and left the party early that day."}]
    assert evidence_ranks("turn-text-v1", markers, inside) == {"D1:3": None}
    line = [{"id": "b", "content": "Melanie: Wow\nCaroline: Thanks!"}]
    assert evidence_ranks("turn-text-v1", markers, line) == {"D1:3": 1}


def test_a_unit_id_is_found_as_a_whole_token_in_text_parts() -> None:
    markers = {"20220430_132212": ["20220430_132212"], "email202401010001": ["email202401010001"]}
    candidates: list[dict[str, Any]] = [
        {"id": "x", "content": "ID: 20220430_1322123\nType: image"},  # a longer id: not it
        {
            "id": "y",
            "content": [
                {"type": "text", "text": "ID: 20220430_132212\nType: image"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {"id": "z", "content": "see EMAIL202401010001 for the booking"},
    ]
    assert evidence_ranks("unit-id-v1", markers, candidates) == {
        "20220430_132212": 2,
        "email202401010001": 3,
    }


def test_recall_at_k_is_the_share_found_within_k() -> None:
    ranks: dict[str, int | None] = {"a": 1, "b": 7, "c": None}
    assert recall_at(ranks, 1) == pytest.approx(1 / 3)
    assert recall_at(ranks, 5) == pytest.approx(1 / 3)
    assert recall_at(ranks, 10) == pytest.approx(2 / 3)


def _outcome(**fields: Any) -> QuestionOutcome:
    base: dict[str, Any] = {"dataset_id": "atm", "category_name": "number", "scored": True}
    return QuestionOutcome(**(base | fields))


def test_qs_and_evidence_figures_in_the_results() -> None:
    """ATM-Bench's QS is the mean of the per-type scores; Recall@k and Joint@k are means over the
    questions with evidence, Joint counting a question whose own value is non-zero (a list
    answer with some Jaccard overlap counts, as in ATM-Bench's joint_partial)."""
    outcomes = [
        _outcome(question_id="q1", answer_type="number", qs=1.0, evidence_ranks={"a": 1}),
        _outcome(
            question_id="q2",
            category_name="list_recall",
            answer_type="list_recall",
            qs=0.5,
            evidence_ranks={"b": 3, "c": None},
        ),
        _outcome(
            question_id="q3",
            category_name="open_end",
            answer_type="open_end",
            qs=0.0,
            judge_label="WRONG",
            judge_labels=["WRONG"],
            evidence_ranks={"d": 12},
        ),
        # An unreadable judge verdict: a judge failure, outside QS and the evidence figures.
        _outcome(
            question_id="q4",
            category_name="open_end",
            answer_type="open_end",
            qs=None,
            judge_label=None,
            judge_labels=[None],
            evidence_ranks={"e": 1},
        ),
    ]
    results = aggregate("j", "completed", outcomes, {})
    overall = results.overall
    assert overall.headline == "qs_mean"
    assert overall.qs_mean == pytest.approx(1.5 / 3)
    assert overall.accuracy is None and overall.failures == {"judge_failure": 1}
    assert overall.headline_ci is not None
    assert overall.evidence is not None and overall.evidence.questions == 3
    assert overall.evidence.recall == pytest.approx({"1": 1 / 3, "5": 1.5 / 3, "10": 1.5 / 3})
    # q3's answer scored 0: its recall does not count in Joint.
    assert overall.evidence.joint == pytest.approx({"1": 1 / 3, "5": 1.5 / 3, "10": 1.5 / 3})
    categories = results.datasets["atm"].categories
    assert categories["list_recall"].qs_mean == 0.5
    assert categories["open_end"].evidence is not None
    assert categories["open_end"].evidence.recall["10"] == 0.0


def test_results_without_qs_or_evidence_keep_their_shape_and_fingerprint() -> None:
    plain = [
        _outcome(
            dataset_id="locomo",
            category_name="single-hop",
            question_id="q1",
            judge_label="CORRECT",
            judge_labels=["CORRECT"],
            f1=0.5,
        )
    ]
    results = aggregate("j", "completed", plain, {})
    dumped = results.model_dump(mode="json")
    assert "qs_mean" not in dumped["overall"] and "evidence" not in dumped["overall"]
    with_evidence = [plain[0].model_copy(update={"evidence_ranks": {"D1:1": 2}})]
    other = aggregate("j", "completed", with_evidence, {}).model_dump(mode="json")
    assert other["overall"]["evidence"]["recall"] == {"1": 0.0, "5": 1.0, "10": 1.0}
    assert other["overall"]["evidence"]["joint"] == {"1": 0.0, "5": 1.0, "10": 1.0}
    # The accuracy figures are the same; the evidence is part of what the results report.
    assert other["overall"]["accuracy"] == dumped["overall"]["accuracy"]
    assert results_fingerprint(dumped["datasets"]) != results_fingerprint(other["datasets"])
