"""Turning a job and its datasets into work documents. Pure: no I/O, so it is tested alone."""

from __future__ import annotations

from typing import Any

from aml_contract.participant import AddRequest, SearchRequest, encode, memory_user_id
from aml_evaluation.chunker import CHUNKER_VERSION, plan_adds
from aml_evaluation.datasets import Dataset
from aml_evaluation.prompts import load_prompt
from aml_evaluation.scoring import F1_VERSION
from aml_evaluation.wordcount import WORD_COUNTER_VERSION
from aml_runtime.isolation import content_text, owners_of_texts
from aml_runtime.settings import SpecSettings

Document = dict[str, Any]


def question_item_id(job_id: str, dataset_id: str, question_id: str) -> str:
    return f"{job_id}/{dataset_id}/{question_id}"


def plan_chunks(job_id: str, dataset: Dataset) -> list[Document]:
    return [
        {
            "_id": chunk.request_id,
            "job_id": job_id,
            "dataset_id": dataset.dataset_id,
            "conversation_id": chunk.conversation_id,
            "user_id": chunk.user_id,
            "session_id": chunk.session_id,
            "seq": chunk.seq,
            "messages": len(chunk.request.messages),
            "body": encode(chunk.request),
            "state": "pending",
        }
        for chunk in plan_adds(dataset, job_id)
    ]


def plan_questions(job_id: str, dataset: Dataset, top_k: int) -> list[Document]:
    documents = []
    for question in dataset.questions:
        user_id = memory_user_id(job_id, dataset.dataset_id, question.conversation_id)
        # Only the question (and options, for multiple choice) goes out: never the gold answer.
        request = SearchRequest(
            query=question.question, user_id=user_id, top_k=top_k, options=question.options
        )
        documents.append(
            {
                "_id": question_item_id(job_id, dataset.dataset_id, question.question_id),
                "job_id": job_id,
                "dataset_id": dataset.dataset_id,
                "question_id": question.question_id,
                "conversation_id": question.conversation_id,
                "user_id": user_id,
                "question": question.question,
                "category": question.category,
                "category_name": question.category_name,
                "gold_answer": question.answer,
                "search_body": encode(request),
            }
        )
    return documents


def evaluation_spec(settings: SpecSettings) -> dict[str, str]:
    """Everything a release holds constant, with versions and prompt hashes."""
    answer = load_prompt(settings.answer_prompt)
    judge = load_prompt(settings.judge_prompt)
    return {
        "top_k": str(settings.top_k),
        "chunker": CHUNKER_VERSION,
        "word_counter": WORD_COUNTER_VERSION,
        "answer_model": settings.answer_model,
        "answer_prompt": f"{answer.name}@{answer.sha256[:12]}",
        "answer_context_chars": str(settings.answer_context_chars),
        "judge_model": settings.judge_model,
        "judge_prompt": f"{judge.name}@{judge.sha256[:12]}",
        "f1": F1_VERSION,
    }


def plan_written_texts(job_id: str, chunks: list[Document]) -> list[Document]:
    """Which user_ids each written text went to: what the searcher checks leakage against."""
    writes = []
    for chunk in chunks:
        request = AddRequest.model_validate_json(chunk["body"])
        for message in request.messages:
            text = content_text(message.model_dump(mode="json")["content"])
            if text:
                writes.append((request.user_id, text))
    return [
        {"_id": f"{job_id}/{digest}", "job_id": job_id, "users": users}
        for digest, users in owners_of_texts(writes).items()
    ]
