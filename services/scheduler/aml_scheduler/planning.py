"""Turning a job and its datasets into work documents. Pure: no I/O, so it is tested alone."""

from __future__ import annotations

import hashlib
from typing import Any

from aml_contract.participant import AddRequest, SearchRequest, encode, memory_user_id
from aml_evaluation.chunker import plan_adds
from aml_evaluation.datasets import Dataset
from aml_evaluation.isolation import content_text, owners_of_texts
from aml_runtime.documents import AddChunkDocument, QuestionDocument
from aml_runtime.telemetry import item_trace_hex

Document = dict[str, Any]


def question_item_id(job_id: str, dataset_id: str, question_id: str) -> str:
    return f"{job_id}/{dataset_id}/{question_id}"


def plan_chunks(job_id: str, dataset: Dataset) -> list[AddChunkDocument]:
    return [
        AddChunkDocument(
            id=chunk.request_id,
            job_id=job_id,
            dataset_id=dataset.dataset_id,
            conversation_id=chunk.conversation_id,
            user_id=chunk.user_id,
            session_id=chunk.session_id,
            seq=chunk.seq,
            messages=len(chunk.request.messages),
            body=encode(chunk.request),
            state="pending",
            # The trace every release of this item lands in (derived from its id).
            trace_id=item_trace_hex(chunk.request_id),
        )
        for chunk in plan_adds(dataset, job_id)
    ]


def plan_questions(job_id: str, dataset: Dataset, top_k: int) -> list[QuestionDocument]:
    documents = []
    for question in dataset.questions:
        # Only when set, so a question without them (LoCoMo) is stored exactly as before.
        extras = {
            name: value
            for name, value in (
                ("judge_rule", question.judge_rule),
                ("gold_explanation", question.gold_explanation),
                ("question_date", question.question_date),
            )
            if value is not None
        }
        item_id = question_item_id(job_id, dataset.dataset_id, question.question_id)
        user_id = memory_user_id(job_id, dataset.dataset_id, question.conversation_id)
        # Only the question (and options, for multiple choice) goes out: never the gold answer.
        request = SearchRequest(
            query=question.question, user_id=user_id, top_k=top_k, options=question.options
        )
        documents.append(
            QuestionDocument(
                id=item_id,
                job_id=job_id,
                dataset_id=dataset.dataset_id,
                question_id=question.question_id,
                conversation_id=question.conversation_id,
                user_id=user_id,
                question=question.question,
                category=question.category,
                category_name=question.category_name,
                # None: the conversation does not contain the answer; the scorer then judges
                # whether the answer abstains (never against LoCoMo's adversarial trap).
                gold_answer=question.answer,
                options=question.options,
                f1_variant=dataset.f1_variant,
                search_body=encode(request),
                trace_id=item_trace_hex(item_id),
                **extras,
            )
        )
    return documents


def plan_written_texts(job_id: str, bodies: list[bytes]) -> list[Document]:
    """Which user_ids each written text went to (from the Add bodies): what the searcher checks
    leakage against."""
    writes = []
    for body in bodies:
        request = AddRequest.model_validate_json(body)
        for message in request.messages:
            text = content_text(message.model_dump(mode="json")["content"])
            if text:
                writes.append((request.user_id, text))
    return [
        {"_id": f"{job_id}/{digest}", "job_id": job_id, "users": users}
        for digest, users in owners_of_texts(writes).items()
    ]


def bundle_fingerprint(bundles: dict[str, str]) -> str:
    """One hash over a job's dataset bundles: sha256 of the sorted `id:bundle-hash` lines."""
    lines = "".join(f"{dataset_id}:{digest}\n" for dataset_id, digest in sorted(bundles.items()))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()
