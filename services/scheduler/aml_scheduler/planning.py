"""Turning a job and its datasets into work documents. Pure: no I/O, so it is tested alone."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, NamedTuple

from aml_contract.participant import (
    AddRequest,
    SearchRequest,
    add_request_id,
    encode,
    memory_user_id,
)
from aml_evaluation.chunker import AddChunk, plan_adds, search_query
from aml_evaluation.datasets import (
    DEFAULT_SCORER,
    Conversation,
    Dataset,
    Question,
    question_at_point,
)
from aml_evaluation.evidence import EvidenceIndex
from aml_evaluation.isolation import content_text, text_digest
from aml_runtime.documents import AddChunkDocument, QuestionDocument
from aml_runtime.telemetry import item_trace_hex

Document = dict[str, Any]
# Turns of conversation planned and stored at a time (`dataset_parts`, `parts_of`): a few
# thousand Add bodies, a few megabytes.
PART_TURNS = 5_000
# (text, user) pairs of a plan's written texts (`WrittenOwners`) held before they are stored:
# some 15 MB; a text met again after that is merged into its stored document
# (`aml_scheduler.handlers`).
WRITTEN_PAIRS_HELD = 100_000


def question_item_id(job_id: str, dataset_id: str, question_id: str) -> str:
    return f"{job_id}/{dataset_id}/{question_id}"


class AskedPoint(NamedTuple):
    """One point where a streaming question is asked (see docs/evaluation.md)."""

    point: int  # turns of the conversation written before the search
    ordinal: int  # 1-based, among the question's points
    after_seq: int  # the Add after which exactly `point` turns are written (0: before the first)
    holds_add: int | None  # the Add that waits for the search; None: after the last Add

    def fields(self) -> Document:
        named = {"point": self.point, "point_index": self.ordinal, "after_seq": self.after_seq}
        return named if self.holds_add is None else {**named, "holds_add": self.holds_add}


def asked_points(dataset: Dataset, adds: Sequence[AddChunk]) -> dict[str, list[AskedPoint]]:
    """Where each streaming question of the dataset is asked, by question id. The chunker ends
    an Add at every point, so each point is the end of some Add (or 0, before the first)."""
    ends: dict[str, dict[int, int]] = {}  # conversation -> turns written -> seq of that Add
    written: dict[str, int] = {}
    last_seq: dict[str, int] = {}
    for add in adds:
        turns = written.get(add.conversation_id, 0) + len(add.request.messages)
        written[add.conversation_id], last_seq[add.conversation_id] = turns, add.seq
        ends.setdefault(add.conversation_id, {0: 0})[turns] = add.seq
    points: dict[str, list[AskedPoint]] = {}
    for question in dataset.questions:
        seqs = ends.get(question.conversation_id, {0: 0})
        last = last_seq.get(question.conversation_id, 0)
        points[question.question_id] = [
            AskedPoint(point, ordinal, seqs[point], seqs[point] + 1 if seqs[point] < last else None)
            for ordinal, point in enumerate(question.asked_at, start=1)
        ]
    return points


def _searches_held(
    job_id: str, dataset: Dataset, points: dict[str, list[AskedPoint]]
) -> dict[str, list[str]]:
    """Request id of an Add -> the item ids of the questions searched right before it."""
    held: dict[str, list[str]] = {}
    for question in dataset.questions:
        for asked in points.get(question.question_id, []):
            if asked.holds_add is not None:
                add = add_request_id(
                    job_id, dataset.dataset_id, question.conversation_id, asked.holds_add
                )
                item_id = point_item_id(job_id, dataset.dataset_id, question.question_id, asked)
                held.setdefault(add, []).append(item_id)
    return held


def point_item_id(job_id: str, dataset_id: str, question_id: str, asked: AskedPoint) -> str:
    """A streaming question's item at one point: its id carries the point."""
    return question_item_id(job_id, dataset_id, question_at_point(question_id, asked.point))


class PlannedPart(NamedTuple):
    """One part of a job's plan: its Add chunks and question items, as stored."""

    chunks: list[AddChunkDocument]
    questions: list[QuestionDocument]


def plan_part(job_id: str, part: Dataset, top_k: int, written: WrittenOwners) -> PlannedPart:
    """Plan one part of a job (`parts_of`): its chunks and questions, its written texts added to
    `written`. The part's Adds are chunked once for all three (`plan_chunks` and
    `plan_questions` alone each chunk it themselves)."""
    adds = plan_adds(part, job_id)
    written.add_requests(add.request for add in adds)
    return PlannedPart(plan_chunks(job_id, part, adds), plan_questions(job_id, part, top_k, adds))


def plan_chunks(
    job_id: str, dataset: Dataset, adds: Sequence[AddChunk] | None = None
) -> list[AddChunkDocument]:
    """The dataset's Add chunks (`adds`: its `plan_adds` for this job, when already made)."""
    adds = plan_adds(dataset, job_id) if adds is None else adds
    held = _searches_held(job_id, dataset, asked_points(dataset, adds)) if dataset.streaming else {}
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
            # Only on an Add some search is held before, so other Adds are stored as before.
            **({"searched_before": held[chunk.request_id]} if chunk.request_id in held else {}),
        )
        for chunk in adds
    ]


def plan_questions(
    job_id: str, dataset: Dataset, top_k: int, adds: Sequence[AddChunk] | None = None
) -> list[QuestionDocument]:
    """One item per question, or, for a streaming question, one per point it is asked at (the
    same Search body at each: only the memory differs). `adds`: as for `plan_chunks`."""
    points: dict[str, list[AskedPoint]] = {}
    if dataset.streaming:
        points = asked_points(dataset, plan_adds(dataset, job_id) if adds is None else adds)
    # A dataset that declares its own Search top_k (the coding track's 100) asks with it.
    search_top_k = dataset.search_top_k or top_k
    documents = []
    evidence = EvidenceIndex(dataset)
    for question in dataset.questions:
        markers = evidence.markers(question) or None
        # Only when set, so a question without them is stored exactly as before.
        extras = {
            name: value
            for name, value in (
                ("judge_rule", question.judge_rule),
                ("gold_explanation", question.gold_explanation),
                ("question_date", question.question_date),
                ("scorer", None if dataset.scorer == DEFAULT_SCORER else dataset.scorer),
                ("question_images", len(question.images) or None),
                ("top_k", dataset.search_top_k),
                ("coding_task", question.coding_task),
                ("task_type", question.task_type),
                ("answer_type", question.answer_type),
                ("evidence_rule", dataset.evidence_rule if markers else None),
                ("evidence_markers", markers),
            )
            if value is not None
        }
        item_id = question_item_id(job_id, dataset.dataset_id, question.question_id)
        user_id = memory_user_id(job_id, dataset.dataset_id, question.conversation_id)
        # Only the question (and options, for multiple choice) goes out: never the gold answer.
        # A multimodal question that shows images asks with them (a content array).
        request = SearchRequest(
            query=search_query(dataset, question),
            user_id=user_id,
            top_k=search_top_k,
            options=question.options,
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
    return [item for document in documents for item in _at_points(document, points)]


def _at_points(
    document: QuestionDocument, points: dict[str, list[AskedPoint]]
) -> list[QuestionDocument]:
    asked_at = points.get(document.question_id)
    if not asked_at:
        return [document]
    items = []
    for asked in asked_at:
        item_id = point_item_id(document.job_id, document.dataset_id, document.question_id, asked)
        update = {"id": item_id, "trace_id": item_trace_hex(item_id), **asked.fields()}
        items.append(document.model_copy(update=update))
    return items


def plan_written_texts(job_id: str, bodies: list[bytes]) -> list[Document]:
    """Which user_ids each written text went to (from the Add bodies): what the searcher checks
    leakage against."""
    owners = WrittenOwners()
    owners.add(bodies)
    return owners.documents(job_id)


@dataclass
class WrittenOwners:
    """`plan_written_texts` gathered part by part: per text digest, the users it was written
    for (a text written in two conversations has both), without keeping the texts. `pairs`
    counts the (text, user) pairs held, so that a planner can store them (`take`) and go on
    with an empty one once they are many: a text met again later is then stored again, and
    the stored documents merged (`aml_scheduler.handlers`)."""

    # Digest -> its one user, or its users (most texts have one: no set for them).
    owners: dict[str, str | set[str]] = field(default_factory=dict)
    pairs: int = 0

    def add(self, bodies: Iterable[bytes]) -> None:
        self.add_requests(AddRequest.model_validate_json(body) for body in bodies)

    def add_requests(self, requests: Iterable[AddRequest]) -> None:
        """`add` of the requests themselves (the planner has them: no body parsed again)."""
        for request in requests:
            # One string per user, however many of its Adds name it.
            user = sys.intern(request.user_id)
            for message in request.messages:
                text = content_text(message.model_dump(mode="json")["content"])
                if text:
                    self._add(text_digest(text), user)

    def _add(self, digest: str, user: str) -> None:
        users = self.owners.get(digest)
        if users is None:
            self.owners[digest] = user
        elif isinstance(users, str):
            if users == user:
                return
            self.owners[digest] = {users, user}
        elif user not in users:
            users.add(user)
        else:
            return
        self.pairs += 1

    def documents(self, job_id: str) -> list[Document]:
        return [_written(job_id, digest, users) for digest, users in self.owners.items()]

    def take(self, job_id: str, batch: int) -> Iterator[list[Document]]:
        """The documents of what is held, `batch` at a time; nothing is held from now on (and
        more may be added meanwhile)."""
        owners, self.owners, self.pairs = self.owners, {}, 0
        return _batches(job_id, iter(owners.items()), batch)


def _batches(
    job_id: str, owners: Iterator[tuple[str, str | set[str]]], batch: int
) -> Iterator[list[Document]]:
    while taken := list(islice(owners, batch)):
        yield [_written(job_id, digest, users) for digest, users in taken]


def _written(job_id: str, digest: str, users: str | set[str]) -> Document:
    sorted_users = [users] if isinstance(users, str) else sorted(users)
    return {"_id": f"{job_id}/{digest}", "job_id": job_id, "users": sorted_users}


def dataset_parts(dataset: Dataset, turns_per_part: int = PART_TURNS) -> Iterator[Dataset]:
    """The dataset in parts of whole conversations with their questions (each part at least
    `turns_per_part` turns, but the last), so a job is planned and stored part by part and no
    process holds all of a large job's Add bodies at once. Planning a part gives the same
    documents as planning the whole (every rule is per conversation)."""
    return parts_of([dataset], turns_per_part)


def parts_of(pieces: Iterable[Dataset], turns_per_part: int = PART_TURNS) -> Iterator[Dataset]:
    """`dataset_parts` of a dataset given a piece at a time (`DatasetStream.pieces`, pieces of
    whole conversations, in order, each with its questions): the same parts as of the whole
    dataset, holding no more of it than a part. A question whose conversation is not in its
    piece goes with the last part, as one whose conversation the dataset lacks."""
    part: list[Conversation] = []
    taken: list[Question] = []
    # Questions of no conversation of their piece, by conversation (first seen first).
    left: dict[str, list[Question]] = {}
    turns = 0
    last: Dataset | None = None
    for piece in pieces:
        last = piece
        questions: dict[str, list[Question]] = {}
        for question in piece.questions:
            questions.setdefault(question.conversation_id, []).append(question)
        for conversation in piece.conversations:
            part.append(conversation)
            taken += questions.pop(conversation.conversation_id, [])
            turns += conversation.turn_count
            if turns >= turns_per_part:
                yield piece.model_copy(update={"conversations": part, "questions": taken})
                part, taken, turns = [], [], 0
        for conversation_id, questions_left in questions.items():
            left.setdefault(conversation_id, []).extend(questions_left)
    if last is not None and (part or left):
        # The last conversations, and any question of a conversation the dataset lacks.
        taken += [question for questions_left in left.values() for question in questions_left]
        yield last.model_copy(update={"conversations": part, "questions": taken})


def bundle_fingerprint(bundles: dict[str, str]) -> str:
    """One hash over a job's dataset bundles: sha256 of the sorted `id:bundle-hash` lines."""
    lines = "".join(f"{dataset_id}:{digest}\n" for dataset_id, digest in sorted(bundles.items()))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()
