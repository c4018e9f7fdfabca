"""A planned question's facts, defined once: what the stages need of a question and never change
once it is planned. The work message carries them (`aml_contract.messages.QuestionFacts`) and
the stored question document holds them (`aml_runtime.documents.QuestionDocument`), both built
from this model, so a new fact is one field here."""

from __future__ import annotations

from pydantic import BaseModel


class PlannedQuestion(BaseModel):
    dataset_id: str
    question_id: str
    user_id: str
    question: str
    category: int
    category_name: str
    # None: the conversation does not contain the answer (the scorer judges an abstention).
    gold_answer: str | None
    options: list[str] | None = None
    f1_variant: str
    # Set only for LongMemEval (absent in other questions' documents and in older messages,
    # which keeps the earlier behaviour): the judge prompt of the question
    # (aml_evaluation.judging.JUDGE_RULE_PROMPTS), why the conversation does not contain the
    # answer (for the judge of an abstention), and when the question is asked (the answer
    # model is told "Current date: ...").
    judge_rule: str | None = None
    gold_explanation: str | None = None
    question_date: str | None = None
    # Set only when not the default: the dataset's scorer (`token_f1` scores by F1 alone), and
    # how many images the question shows (multimodal: the answer stage gives them to the answer
    # model, read from the question's planned Search body).
    scorer: str | None = None
    question_images: int | None = None
    # Set only for a coding dataset's attempts: the task attempted (the solve and verify
    # stages read its repository snapshot and hidden tests from the registered bundle by it) and
    # the task's type as the dataset declares it ("debug", "development").
    coding_task: str | None = None
    task_type: str | None = None
    # Set only when the dataset declares its own Search top_k (the coding track's 100, R-2.5):
    # the top_k of the question's planned Search body, which the search stage holds the answer
    # to in place of the job's.
    top_k: int | None = None
    # Set only for ATM-Bench (aml_evaluation.atmbench): the answer type that decides how the
    # answer is scored ("number", "list_recall", "open_end").
    answer_type: str | None = None
    # Set only for a question that declares evidence the platform can recognise
    # (aml_evaluation.evidence): the rule, and per evidence id the markers that identify it
    # among the Search candidates; the scorer records where each was found (Recall@k).
    evidence_rule: str | None = None
    evidence_markers: dict[str, list[str]] | None = None
