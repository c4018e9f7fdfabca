"""In-memory stores for the handlers' fast tests (a FakeRepository per store, as in cosmicpython).

Handlers and pipeline functions reach MongoDB only through `aml_runtime.stores.Stores`, so their
unit tests hand them these fakes rather than a fake of the driver: a test seeds and inspects
plain dicts (`MemoryJobStore.jobs`, `MemoryPlanStore.chunks`, ...: one per collection, by
`_id`) and never has to know which query a store sends.

Each fake implements the methods the adder, the scheduler (with its stall watchdog), the
publisher and the question stages reach, with the real method's name, signature and return
semantics. The guards are the point: a transition changes a document only from the state the
real store's filter allows and says whether it did, an insert keyed by `_id` happens once, a
counter is a `$inc`. Any other method of the real store raises NotImplementedError when called,
so a handler that starts relying on more fails its fast test loudly instead of passing against
a fake that guesses.

Every operation yields to the event loop once, as a real round trip does: concurrent handler
calls interleave between operations, which is what the guarded updates exist for. What goes in
and comes out is a BSON round trip of the document, as through the services' client: a copy,
never a live reference, with datetimes to the millisecond and UTC-aware, tuples as lists and
enums as their values. Where MongoDB and nx-27017 differ, the fakes keep to MongoDB (see
tests/integration/test_store_fakes.py, which runs every method here against the real store on
nx-27017 and keeps the fakes honest)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, NoReturn, cast

import bson
from bson import ObjectId
from bson.codec_options import CodecOptions
from pymongo.errors import DuplicateKeyError

from aml_contract.api.publication import ReviewState
from aml_contract.api.vocabulary import Stage
from aml_contract.messages import Outcome, QuestionStage
from aml_contract.participant import user_chunk_id
from aml_runtime.clock import micros, now
from aml_runtime.db import read_time
from aml_runtime.documents import (
    ACTIVE_JOB_STATES,
    FINISHED_JOB_STATES,
    AddChunkDocument,
    FailureKind,
    JobDocument,
    QuestionDocument,
    ScoreDocument,
    StageRecord,
)
from aml_runtime.stores import Stores
from aml_runtime.stores.access_requests import AccessRequestStore
from aml_runtime.stores.accounts import AccountStore
from aml_runtime.stores.audit import EFFICIENCY_FIELDS, AuditStore
from aml_runtime.stores.capacity import SlotStore
from aml_runtime.stores.jobs import (
    _ACTIVE_FIELDS,
    _PUBLISHED_FIELDS,
    COUNTED_TO,
    EVENTS,
    LAST_US,
    REPAIRED_US,
    JobStore,
    RetentionFacts,
)
from aml_runtime.stores.leaderboard import (
    HeadlineOutcomes,
    LeaderboardStore,
    decode_outcomes,
    encode_outcomes,
)
from aml_runtime.stores.limits import LimitStore
from aml_runtime.stores.outages import OutageStore
from aml_runtime.stores.plans import (
    _ANNOUNCED_FIELDS,
    _OUTCOME_FIELDS,
    _PENDING_FIELDS,
    NEXT_CHUNK_FIELDS,
    PlanStore,
)
from aml_runtime.stores.stage_records import ANSWER_FIGURES, StageRecordStore

Document = dict[str, Any]

# The projections are the real stores' own constants (imported above), so a fake cannot drift
# from the fields its store asks for; the contract test checks what comes back all the same.

# How the services' client decodes documents (`aml_runtime.db.connect`: tz_aware).
_CODEC: CodecOptions[Document] = CodecOptions(tz_aware=True)
# A field a document does not have (unlike one that holds None: MongoDB tells them apart).
_MISSING: Any = object()


# -- what every fake shares ------------------------------------------------------------------------


async def _round_trip() -> None:
    await asyncio.sleep(0)


def _bson(document: Mapping[str, Any]) -> Document:
    """`document` as the database keeps and returns it (a copy)."""
    return bson.decode(bson.encode(document), codec_options=_CODEC)


def _copy(document: Document, fields: Iterable[str] | None = None) -> Document:
    """The document as a read returns it: whole, or only `_id` and those of `fields` it has."""
    if fields is not None:
        keep = {"_id", *fields}
        document = {key: value for key, value in document.items() if key in keep}
    return _bson(document)


def _one(
    collection: Mapping[Any, Document], key: Any, fields: Iterable[str] | None = None
) -> Document | None:
    found = collection.get(key)
    return None if found is None else _copy(found, fields)


def _select(
    collection: Mapping[Any, Document],
    keep: Callable[[Document], bool],
    fields: Iterable[str] | None = None,
) -> list[Document]:
    # In insertion order, as nx-27017 answers a find without a sort (MongoDB promises none).
    return [_copy(document, fields) for document in collection.values() if keep(document)]


def _get(document: Mapping[str, Any], path: str) -> Any:
    value: Any = document
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _set(document: Document, fields: Mapping[str, Any]) -> None:
    """`$set` of (dotted) paths: missing parents are created, as MongoDB does."""
    for path, value in _bson(fields).items():
        *parents, last = path.split(".")
        target = document
        for key in parents:
            target = target.setdefault(key, {})
        target[last] = value


def _inc(document: Document, steps: Mapping[str, int]) -> None:
    """`$inc`: a missing counter starts at 0."""
    _set(
        document,
        {
            path: step + (0 if (value := _get(document, path)) is _MISSING else value)
            for path, step in steps.items()
        },
    )


def _null(value: Any) -> bool:
    """Whether a filter `{field: None}` matches: the field holds null or is missing."""
    return value is None or value is _MISSING


def _below(value: Any, bound: int) -> bool:
    """`{"$lt": bound}`: neither a missing field nor null compares with a number."""
    return not _null(value) and bool(value < bound)


def _at_least(value: Any, bound: int) -> bool:
    """`{"$gte": bound}`."""
    return not _null(value) and bool(value >= bound)


def _newest(documents: list[Document], field: str) -> Document | None:
    """The first of `documents` sorted by `field` descending: null and missing sort lowest, and
    of equal ones the first stored comes first (as on nx-27017; MongoDB leaves ties open)."""

    def key(document: Document) -> tuple[int, Any]:
        value = _get(document, field)
        return (0, 0) if _null(value) else (1, value)

    return max(documents, key=key, default=None)


class _MemoryStore:
    """A fake of `real`: the methods a subclass defines, and NotImplementedError for any other
    method `real` has, raised when it is called (not when it is looked up, so an async
    generator's caller sees it too)."""

    real: ClassVar[type]

    def __getattr__(self, name: str) -> Callable[..., NoReturn]:
        if name.startswith("_") or not callable(getattr(self.real, name, None)):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        where = f"{type(self).__name__}.{name}"

        def unimplemented(*args: object, **kwargs: object) -> NoReturn:
            raise NotImplementedError(where)

        return unimplemented


# -- jobs and their error summaries ----------------------------------------------------------------


class MemoryJobStore(_MemoryStore):
    """`aml_runtime.stores.jobs.JobStore`: `jobs` and `errors` (`job_errors`)."""

    real = JobStore

    def __init__(self) -> None:
        self.jobs: dict[str, Document] = {}
        # By key: `<job>/<stage>/<item or ->`.
        self.errors: dict[str, Document] = {}

    # -- whole jobs and projections

    async def document(self, job_id: str) -> Document | None:
        await _round_trip()
        return _one(self.jobs, job_id)

    async def get(self, job_id: str) -> JobDocument | None:
        await _round_trip()
        stored = _one(self.jobs, job_id)
        return None if stored is None else JobDocument.model_validate(stored)

    async def state_of(self, job_id: str) -> str | None:
        await _round_trip()
        job = _one(self.jobs, job_id, ["state"])
        return None if job is None else str(job["state"])

    async def stage_view(self, job_id: str) -> Document | None:
        await _round_trip()
        return _one(self.jobs, job_id, ["state", "top_k"])

    async def running_version(self, job_id: str) -> str | None:
        await _round_trip()
        job = _one(self.jobs, job_id, ["state", "version_id"])
        if job is None or job["state"] != "running":
            return None
        return str(job["version_id"])

    async def users_of(self, job_id: str) -> list[str]:
        await _round_trip()
        users: list[str] = (_one(self.jobs, job_id, ["users"]) or {}).get("users", [])
        return users

    async def active_jobs(self) -> AsyncIterator[Document]:
        await _round_trip()
        active = _select(
            self.jobs, lambda job: job.get("state") in ACTIVE_JOB_STATES, _ACTIVE_FIELDS
        )
        for job in active:
            yield job

    async def ungated(self) -> AsyncIterator[str]:
        await _round_trip()
        # `gate: {$exists: false}`: a gate stored as null would count as one (never written so).
        for job in _select(
            self.jobs, lambda job: job.get("state") in FINISHED_JOB_STATES and "gate" not in job
        ):
            yield job["_id"]

    async def published_facts(self, job_id: str) -> Document | None:
        await _round_trip()
        return _one(self.jobs, job_id, _PUBLISHED_FIELDS)

    async def approved_facts(self) -> AsyncIterator[Document]:
        await _round_trip()
        approved = _select(
            self.jobs, lambda job: job.get("review_state") == "approved", _PUBLISHED_FIELDS
        )
        for job in approved:
            yield job

    async def unpurged_ended(self) -> AsyncIterator[RetentionFacts]:
        await _round_trip()
        fields = ["finished_at", "retention_keep_until", "retention_purged_at"]
        ended = _select(self.jobs, lambda job: job.get("state") in FINISHED_JOB_STATES, fields)
        for job in ended:
            if job.get("retention_purged_at") is not None:
                continue
            yield RetentionFacts(
                job["_id"],
                read_time(job.get("finished_at")),
                read_time(job.get("retention_keep_until")),
            )

    # -- transitions (each only from the state its real filter names)

    async def start(
        self,
        job_id: str,
        *,
        started_at: datetime,
        top_k: int,
        spec: dict[str, Any],
        spec_hash: str,
        code_hash: str,
        dataset_bundles: dict[str, str],
        dataset_bundle_hash: str,
        users: list[str],
        excluded_categories: dict[str, list[str]],
        f1_variants: dict[str, str],
        chunkers: dict[str, str],
        totals: dict[str, int],
    ) -> None:
        await _round_trip()
        job = self.jobs.get(job_id)
        # `planned: False` matches the boolean only: a job without the field is not started.
        if job is None or job.get("planned", _MISSING) is not False:
            return
        _set(
            job,
            {
                "planned": True,
                "state": "running",
                "started_at": started_at,
                "top_k": top_k,
                "spec": spec,
                "spec_hash": spec_hash,
                "code_hash": code_hash,
                "dataset_bundles": dataset_bundles,
                "dataset_bundle_hash": dataset_bundle_hash,
                "users": users,
                "excluded_categories": excluded_categories,
                "f1_variants": f1_variants,
                "chunkers": chunkers,
                "totals": totals,
            },
        )

    async def record_code_hash(self, job_id: str, code_hash: str) -> None:
        await _round_trip()
        job = self.jobs.get(job_id)
        if job is not None:
            _set(job, {f"code_hashes.{code_hash}": True})

    async def complete(
        self,
        job_id: str,
        *,
        finished_at: datetime,
        results: Document,
        platform_failures: int,
        platform_failure_reason: str | None,
        code_hash: str | None = None,
    ) -> bool:
        await _round_trip()
        job = self.jobs.get(job_id)
        if job is None or job.get("state") != "running":
            return False
        fields: Document = {
            "state": "completed",
            "finished_at": finished_at,
            "results": results,
            "platform_failures": platform_failures,
        }
        if platform_failure_reason is not None:
            fields["platform_failure_reason"] = platform_failure_reason
        if code_hash is not None:
            fields[f"code_hashes.{code_hash}"] = True
        _set(job, fields)
        return True

    async def fail(
        self, job_id: str, stage: Stage, kind: FailureKind, reason: str, finished_at: datetime
    ) -> str | None:
        await _round_trip()
        job = self.jobs.get(job_id)
        if job is None or job.get("state") not in ACTIVE_JOB_STATES:
            return None
        before = _copy(job, ["version_id"])
        _set(
            job,
            {
                "state": "failed",
                "failed_stage": stage,
                "failure_kind": kind,
                "failure": reason,
                "finished_at": finished_at,
            },
        )
        return str(before["version_id"])

    async def record_gate(
        self, job_id: str, gate: Document, review_state: ReviewState | None
    ) -> bool:
        await _round_trip()
        job = self.jobs.get(job_id)
        if job is None or "gate" in job:
            return False
        fields: Document = {"gate": gate}
        if review_state is not None:
            fields["review_state"] = review_state
        _set(job, fields)
        return True

    async def mark_purged(self, job_id: str, purged_at: datetime) -> None:
        await _round_trip()
        if (job := self.jobs.get(job_id)) is not None:
            _set(job, {"retention_purged_at": purged_at})

    # -- progress counters

    async def count(self, job_id: str, inc: dict[str, int], at_us: int) -> Document | None:
        await _round_trip()
        job = self.jobs.get(job_id)
        if job is None:
            return None
        # The two filters of `counting_filters`: no watermark yet, or one below `at_us`.
        counted_to = _get(job, COUNTED_TO)
        if counted_to is not _MISSING and not _below(counted_to, at_us):
            return None
        before = _copy(job, ["totals", "progress"])
        _inc(job, {**inc, EVENTS: 1})
        _set(job, {LAST_US: at_us})
        return before

    async def progress_of(self, job_id: str) -> Document | None:
        await _round_trip()
        return _one(self.jobs, job_id, ["progress", "totals"])

    async def stamp_repaired(self, job_id: str, repaired_us: int) -> None:
        await _round_trip()
        if (job := self.jobs.get(job_id)) is not None:
            _set(job, {REPAIRED_US: repaired_us})

    async def store_recount(
        self, job_id: str, events: int, counted: dict[str, int], watermark: int, repaired_us: int
    ) -> bool:
        await _round_trip()
        job = self.jobs.get(job_id)
        if job is None:
            return False
        # No increment since `events` was read; 0 means the field was absent (it still must be).
        stored = _get(job, EVENTS)
        if not (stored == events if events else stored is _MISSING):
            return False
        _set(job, {**counted, COUNTED_TO: watermark, REPAIRED_US: repaired_us})
        _inc(job, {EVENTS: 1})
        return True

    # -- error summaries

    async def record_error(
        self,
        job_id: str,
        stage: Stage,
        kind: FailureKind,
        item: str | None,
        reason: str,
        at: datetime,
    ) -> bool:
        await _round_trip()
        key = f"{job_id}/{stage}/{item or '-'}"
        if key in self.errors:
            return False
        self.errors[key] = _bson(
            {
                "_id": key,
                "job_id": job_id,
                "stage": stage,
                "kind": kind,
                "item": item,
                "reason": reason,
                "at": at,
                "at_us": micros(at),
            }
        )
        return True

    async def error_stamps(self, job_id: str) -> list[Document]:
        await _round_trip()
        return _select(self.errors, lambda error: error.get("job_id") == job_id, ["at_us"])

    async def latest_error_since(self, job_id: str, since_us: int) -> Document | None:
        await _round_trip()
        since = _select(
            self.errors,
            lambda error: error.get("job_id") == job_id and _at_least(error.get("at_us"), since_us),
        )
        return _newest(since, "at_us")


# -- the plan: Add chunks, questions, release markers, written texts, specs ------------------------


class MemoryPlanStore(_MemoryStore):
    """`aml_runtime.stores.plans.PlanStore`: `chunks` (`add_chunks`), `questions`, `releases`
    (`question_releases`), `written` (`written_texts`) and `specs`."""

    real = PlanStore

    def __init__(self) -> None:
        self.chunks: dict[str, Document] = {}
        self.questions: dict[str, Document] = {}
        self.releases: dict[str, Document] = {}
        self.written: dict[str, Document] = {}
        self.specs: dict[str, Document] = {}

    # -- the plan

    async def insert_chunks(self, chunks: Iterable[AddChunkDocument]) -> None:
        await _round_trip()
        # One that exists already (an interrupted plan's) is kept as it is.
        for chunk in chunks:
            document = chunk.stored()
            self.chunks.setdefault(document["_id"], _bson(document))

    async def insert_questions(self, questions: Iterable[QuestionDocument]) -> None:
        await _round_trip()
        for question in questions:
            document = question.stored()
            self.questions.setdefault(document["_id"], _bson(document))

    async def store_written(self, batches: Iterable[list[Document]]) -> None:
        await _round_trip()
        for docs in batches:
            # As the real store: each batch inserted where new, then the users of every
            # document that was not (stored before, or twice in the batch: its last one wins)
            # merged into the stored ones, sorted.
            refused: list[Document] = []
            for doc in docs:
                if doc["_id"] in self.written:
                    refused.append(doc)
                else:
                    self.written[doc["_id"]] = _bson(doc)
            wanted = {doc["_id"]: doc["users"] for doc in refused}
            for written_id, users in wanted.items():
                stored = self.written[written_id]
                stored["users"] = sorted({*stored["users"], *users})

    async def store_spec(self, spec_hash: str, spec: dict[str, Any]) -> None:
        await _round_trip()
        self.specs.setdefault(spec_hash, _bson({"_id": spec_hash, "spec": spec}))

    # -- Add chunks

    async def chunk(self, request_id: str) -> Document | None:
        await _round_trip()
        return _one(self.chunks, request_id)

    async def chain_chunk(self, user_id: str, seq: int) -> Document | None:
        await _round_trip()
        return _one(self.chunks, user_chunk_id(user_id, seq), NEXT_CHUNK_FIELDS)

    async def announced_chunk(self, request_id: str) -> Document | None:
        await _round_trip()
        return _one(self.chunks, request_id, _ANNOUNCED_FIELDS)

    async def mark_chunk(
        self, request_id: str, outcome: Outcome, at_us: int, fields: Document
    ) -> bool:
        await _round_trip()
        chunk = self.chunks.get(request_id)
        if chunk is None or chunk.get("state") != "pending":
            return False
        _set(chunk, {"state": outcome, "finished_at": now(), "at_us": at_us, **fields})
        return True

    async def pending_chunks(self, job_id: str) -> AsyncIterator[Document]:
        await _round_trip()
        pending = _select(
            self.chunks,
            lambda chunk: chunk.get("job_id") == job_id and chunk.get("state") == "pending",
            _PENDING_FIELDS,
        )
        for chunk in pending:
            yield chunk

    async def chunk_states(self, job_id: str) -> AsyncIterator[Document]:
        await _round_trip()
        mine = _select(self.chunks, lambda chunk: chunk.get("job_id") == job_id, ["state", "at_us"])
        for chunk in mine:
            yield chunk

    async def chunk_datasets(self, job_id: str) -> AsyncIterator[Document]:
        await _round_trip()
        mine = _select(self.chunks, lambda chunk: chunk.get("job_id") == job_id, ["dataset_id"])
        for chunk in mine:
            yield chunk

    async def platform_failed_chunks(self, job_id: str) -> int:
        await _round_trip()
        return sum(
            1
            for chunk in self.chunks.values()
            if chunk.get("job_id") == job_id
            and chunk.get("state") == "failed"
            and chunk.get("failure_kind") == FailureKind.PLATFORM_ERROR
        )

    # -- questions

    async def question(self, item_id: str) -> Document | None:
        await _round_trip()
        return _one(self.questions, item_id)

    async def question_user(self, item_id: str) -> str:
        await _round_trip()
        return str((_one(self.questions, item_id, ["user_id"]) or {}).get("user_id", ""))

    async def user_questions(self, user_id: str) -> AsyncIterator[Document]:
        await _round_trip()
        for question in _select(self.questions, lambda q: q.get("user_id") == user_id):
            yield question

    async def questions_among(self, item_ids: list[str]) -> AsyncIterator[Document]:
        await _round_trip()
        # `_id: {$in: ...}`: each stored question once, however often it is named.
        wanted = set(item_ids)
        for question in _select(self.questions, lambda q: q["_id"] in wanted):
            yield question

    async def questions_of(self, job_id: str) -> AsyncIterator[Document]:
        await _round_trip()
        mine = _select(self.questions, lambda q: q.get("job_id") == job_id, _OUTCOME_FIELDS)
        for question in mine:
            yield question

    # -- question releases

    async def released(self, marker: str) -> bool:
        await _round_trip()
        return marker in self.releases

    async def mark_released(self, marker: str, job_id: str, held: int | None = None) -> None:
        await _round_trip()
        marker_doc: Document = {"_id": marker, "job_id": job_id}
        if held is not None:
            marker_doc["held"] = held
        self.releases.setdefault(marker, _bson(marker_doc))

    # -- retention

    async def purge_bodies(self, job_id: str) -> None:
        await _round_trip()
        for chunk in self.chunks.values():
            if chunk.get("job_id") == job_id:
                _set(chunk, {"body": None})
        for question in self.questions.values():
            if question.get("job_id") == job_id:
                _set(question, {"search_body": None})

    async def drop_written(self, job_id: str) -> None:
        await _round_trip()
        for written_id in [key for key, doc in self.written.items() if doc.get("job_id") == job_id]:
            del self.written[written_id]


# -- the question stages' records ------------------------------------------------------------------


class MemoryStageRecordStore(_MemoryStore):
    """`aml_runtime.stores.stage_records.StageRecordStore`: `searches`, `answers`, `scores`."""

    real = StageRecordStore

    def __init__(self) -> None:
        self.searches: dict[str, Document] = {}
        self.answers: dict[str, Document] = {}
        self.scores: dict[str, Document] = {}

    def _of(self, stage: QuestionStage) -> dict[str, Document]:
        return {"search": self.searches, "answer": self.answers, "score": self.scores}[stage]

    async def store_outcome(
        self,
        stage: QuestionStage,
        item_id: str,
        job_id: str,
        finished_at: datetime,
        at_us: int,
        fields: Document,
    ) -> bool:
        await _round_trip()
        records = self._of(stage)
        if item_id in records:
            return False
        records[item_id] = _bson(
            {"_id": item_id, "job_id": job_id, "finished_at": finished_at, "at_us": at_us, **fields}
        )
        return True

    async def state_of(self, stage: QuestionStage, item_id: str) -> str | None:
        await _round_trip()
        stored = _one(self._of(stage), item_id, ["state"])
        return None if stored is None else str(stored["state"])

    async def searches_final(self, item_ids: list[str]) -> int:
        await _round_trip()
        return len(set(item_ids) & self.searches.keys())

    async def final_records(self, job_id: str) -> dict[str, StageRecord]:
        await _round_trip()
        final: dict[str, StageRecord] = {}

        def failed(doc: Document) -> bool:
            return doc.get("job_id") == job_id and doc.get("state") == "failed"

        for records in (self.searches, self.answers):
            for doc in _select(records, failed):
                final.setdefault(doc["_id"], StageRecord.model_validate(doc))
        for doc in _select(self.scores, lambda doc: doc.get("job_id") == job_id):
            doc.pop("test_log", None)
            final.setdefault(doc["_id"], ScoreDocument.model_validate(doc))
        return final

    async def answer_figures(self, job_id: str) -> AsyncIterator[Document]:
        await _round_trip()
        done = _select(
            self.answers,
            lambda doc: doc.get("job_id") == job_id and doc.get("state") == "done",
            ANSWER_FIGURES,
        )
        for doc in done:
            yield doc

    async def stamps(self, job_id: str) -> AsyncIterator[tuple[QuestionStage, Document]]:
        await _round_trip()
        stages: tuple[QuestionStage, ...] = ("search", "answer", "score")
        found = [
            (stage, doc)
            for stage in stages
            for doc in _select(
                self._of(stage), lambda doc: doc.get("job_id") == job_id, ["state", "at_us"]
            )
        ]
        for stamp in found:
            yield stamp

    async def purge_bodies(self, job_id: str) -> None:
        await _round_trip()
        # (records, the field a record must hold to be emptied, the fields emptied)
        emptied: tuple[tuple[dict[str, Document], str | None, Document], ...] = (
            (self.searches, None, {"candidates": []}),
            (self.answers, None, {"answer": None}),
            (self.answers, "trajectory", {"trajectory": []}),
            (self.scores, None, {"judge_replies": []}),
            (self.scores, "test_log", {"test_log": None}),
        )
        for records, holding, fields in emptied:
            for record in records.values():
                if record.get("job_id") == job_id and (holding is None or holding in record):
                    _set(record, fields)


# -- the audit trail of participant calls ----------------------------------------------------------


class MemoryAuditStore(_MemoryStore):
    """`aml_runtime.stores.audit.AuditStore`: `calls`."""

    real = AuditStore

    def __init__(self) -> None:
        self.calls: dict[Any, Document] = {}

    async def record_attempt(self, record: Document) -> Any:
        await _round_trip()
        # PyMongo's insert_one gives the caller's own dict its new `_id`.
        record.setdefault("_id", ObjectId())
        if record["_id"] in self.calls:
            raise DuplicateKeyError(f"duplicate _id {record['_id']!r} in calls", 11000)
        self.calls[record["_id"]] = _bson(record)
        return record["_id"]

    async def record_validation(self, record_id: Any, outcome: str) -> None:
        await _round_trip()
        if (record := self.calls.get(record_id)) is not None:
            _set(record, {"validation": outcome})

    async def attempts_by_item(self, job_id: str) -> AsyncIterator[Document]:
        await _round_trip()
        wanted = [name for name, kept in EFFICIENCY_FIELDS.items() if kept]
        mine = _select(self.calls, lambda call: call.get("job_id") == job_id, wanted)

        def by_item(call: Document) -> tuple[bool, str, int]:
            # A missing item_id sorts first, as null does in MongoDB; ties keep insertion order.
            item = call.get("item_id")
            return item is not None, str(item or ""), int(call.get("attempt", 0))

        for call in sorted(mine, key=by_item):
            # The projection leaves `_id` out.
            call.pop("_id", None)
            yield call

    async def latest_call(self, job_id: str, stage: str) -> Document | None:
        await _round_trip()
        calls = _select(
            self.calls, lambda call: call.get("job_id") == job_id and call.get("stage") == stage
        )
        return _newest(calls, "started_at")


# -- outages ---------------------------------------------------------------------------------------


class MemoryOutageStore(_MemoryStore):
    """`aml_runtime.stores.outages.OutageStore`: `lane_pauses` (by key) and `outages` (the
    history, by `<key>/<since>`)."""

    real = OutageStore

    def __init__(self) -> None:
        self.lane_pauses: dict[str, Document] = {}
        self.outages: dict[str, Document] = {}

    def _after(
        self,
        key: str,
        matches: Callable[[Document], bool],
        fields: Document,
        steps: Mapping[str, int] | None = None,
    ) -> Document | None:
        """A find-one-and-update of the key's pause (`$set` of `fields`, `$inc` of `steps`):
        the pause after it, or None when it does not match."""
        pause = self.lane_pauses.get(key)
        if pause is None or not matches(pause):
            return None
        _set(pause, fields)
        _inc(pause, steps or {})
        return _copy(pause)

    async def pauses(self) -> AsyncIterator[Document]:
        await _round_trip()
        for pause in _select(self.lane_pauses, lambda pause: True):
            yield pause

    async def pause(self, key: str) -> Document | None:
        await _round_trip()
        return _one(self.lane_pauses, key)

    async def pauses_of(self, keys: list[str]) -> AsyncIterator[Document]:
        await _round_trip()
        wanted = set(keys)
        for pause in _select(self.lane_pauses, lambda pause: pause["_id"] in wanted):
            yield pause

    async def open_pause(self, pause: Document) -> bool:
        await _round_trip()
        if pause["_id"] in self.lane_pauses:
            return False
        self.lane_pauses[pause["_id"]] = _bson(pause)
        return True

    async def pause_again(
        self, key: str, reason: str, probe_at: float | None = None
    ) -> Document | None:
        await _round_trip()
        update: Document = {"reason": reason, "paused": True}
        if probe_at is not None:
            update["probe_at"] = probe_at
        # `expired_at: None` matches a pause without the field too.
        return self._after(key, lambda pause: _null(pause.get("expired_at")), update)

    async def claim_probe(
        self, key: str, since: float, probe_at: float, next_probe_at: float, interval: float
    ) -> Document | None:
        await _round_trip()

        def due(pause: Document) -> bool:
            return (
                pause.get("since") == since
                and pause.get("paused") is True
                and pause.get("probe_at") == probe_at
            )

        update = {"probe_at": next_probe_at, "interval": interval}
        return self._after(key, due, update, {"probes": 1})

    async def resume(self, key: str, since: float, resumed_at: float) -> Document | None:
        await _round_trip()
        update = {"paused": False, "resumed_at": resumed_at}
        return self._after(key, lambda pause: pause.get("since") == since, update)

    async def expire(self, key: str, since: float, moment: float) -> Document | None:
        await _round_trip()

        def open_since(pause: Document) -> bool:
            return pause.get("since") == since and _null(pause.get("expired_at"))

        return self._after(key, open_since, {"paused": False, "expired_at": moment})

    async def close(self, key: str) -> Document | None:
        await _round_trip()
        removed = self.lane_pauses.pop(key, None)
        return None if removed is None else _copy(removed)

    async def close_if_since(self, key: str, since: float) -> Document | None:
        await _round_trip()
        pause = self.lane_pauses.get(key)
        if pause is None or pause.get("since") != since:
            return None
        return _copy(self.lane_pauses.pop(key))

    async def record(
        self,
        key: str,
        kind: str,
        since: float,
        until: float,
        reason: str,
        probes: int,
        how: str,
    ) -> None:
        await _round_trip()
        entry_id = f"{key}/{since:.6f}"
        entry = {
            "_id": entry_id,
            "key": key,
            "kind": kind,
            "since": since,
            "until": until,
            "seconds": round(until - since, 3),
            "reason": reason,
            "probes": probes,
            "how": how,
        }
        self.outages.setdefault(entry_id, _bson(entry))

    async def last_end(self, key: str) -> float | None:
        await _round_trip()
        latest = _newest(_select(self.outages, lambda entry: entry.get("key") == key), "until")
        return None if latest is None else float(latest["until"])


# -- the leaderboard and the versions --------------------------------------------------------------


class MemoryLeaderboardStore(_MemoryStore):
    """`aml_runtime.stores.leaderboard.LeaderboardStore`: `leaderboard` (its entries) and
    `headline_outcomes` (a full run's per-question headline values, as stored: encoded)."""

    real = LeaderboardStore

    def __init__(self) -> None:
        self.leaderboard: dict[str, Document] = {}
        self.headline_outcomes: dict[str, Document] = {}

    async def entries(self) -> AsyncIterator[Document]:
        await _round_trip()
        for entry in _select(self.leaderboard, lambda entry: True):
            yield entry

    async def keep_headline_outcomes(self, outcomes: HeadlineOutcomes) -> None:
        await _round_trip()
        self.headline_outcomes[outcomes.job_id] = _bson(encode_outcomes(outcomes))

    async def headline_outcomes_of(self, job_id: str) -> HeadlineOutcomes | None:
        await _round_trip()
        found = _one(self.headline_outcomes, job_id)
        return None if found is None else decode_outcomes(found)


class MemoryAccountStore(_MemoryStore):
    """`aml_runtime.stores.accounts.AccountStore`: what the pipeline reads of a version
    (`versions`) and its sealed Memory System Key (`secrets`)."""

    real = AccountStore

    def __init__(self) -> None:
        self.versions: dict[str, Document] = {}
        self.secrets: dict[str, Document] = {}

    async def version(self, version_id: str) -> Document | None:
        await _round_trip()
        return _one(self.versions, version_id)

    async def capacity_of(self, version_id: str) -> Document | None:
        await _round_trip()
        return _one(self.versions, version_id, ["capacity"])

    async def limits_of(self, version_id: str) -> Document | None:
        await _round_trip()
        return _one(self.versions, version_id, ["run_limits", "capacity"])

    async def sealed_key(self, secret_ref: str) -> bytes | None:
        await _round_trip()
        stored = _one(self.secrets, secret_ref)
        if stored is None:
            return None
        sealed: bytes = stored["sealed"]
        return sealed


class MemorySlotStore(_MemoryStore):
    """`aml_runtime.stores.capacity.SlotStore`: nothing the handlers under test reach (their
    work items hold no admission), so every method raises."""

    real = SlotStore


class MemoryAccessRequestStore(_MemoryStore):
    """`aml_runtime.stores.access_requests.AccessRequestStore`: the gateway's alone; every
    method raises."""

    real = AccessRequestStore


class MemoryLimitStore(_MemoryStore):
    """`aml_runtime.stores.limits.LimitStore`: `buckets` (`rate_limits`, by `<limit>/<address>`).
    No TTL here: a bucket stays, which reads as the full bucket the deleted one would."""

    real = LimitStore

    def __init__(self) -> None:
        self.buckets: dict[str, Document] = {}

    async def bucket(self, key: str) -> float | None:
        await _round_trip()
        found = self.buckets.get(key)
        return None if found is None else float(found["tat"])

    async def catch_up(self, key: str, now: float, expires: datetime) -> float:
        await _round_trip()
        found = self.buckets.setdefault(key, {"_id": key, "tat": now, "expires": expires})
        _set(found, {"tat": max(found["tat"], now), "expires": max(found["expires"], expires)})
        return float(found["tat"])

    async def take(self, key: str, at_most: float, step: float, expires: datetime) -> float | None:
        await _round_trip()
        found = self.buckets.get(key)
        if found is None or found["tat"] > at_most:
            return None
        _set(found, {"tat": found["tat"] + step, "expires": max(found["expires"], expires)})
        return float(found["tat"])


# -- the bundle ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryStores:
    """One of every fake under the field names of `Stores`: seed and inspect through these
    fields, and hand `typed()` to the code under test."""

    jobs: MemoryJobStore = field(default_factory=MemoryJobStore)
    plans: MemoryPlanStore = field(default_factory=MemoryPlanStore)
    records: MemoryStageRecordStore = field(default_factory=MemoryStageRecordStore)
    audit: MemoryAuditStore = field(default_factory=MemoryAuditStore)
    slots: MemorySlotStore = field(default_factory=MemorySlotStore)
    outages: MemoryOutageStore = field(default_factory=MemoryOutageStore)
    accounts: MemoryAccountStore = field(default_factory=MemoryAccountStore)
    access_requests: MemoryAccessRequestStore = field(default_factory=MemoryAccessRequestStore)
    leaderboard: MemoryLeaderboardStore = field(default_factory=MemoryLeaderboardStore)
    limits: MemoryLimitStore = field(default_factory=MemoryLimitStore)

    def typed(self) -> Stores:
        """These fakes where the code expects the real stores (they answer what it asks)."""
        return Stores(
            jobs=cast(JobStore, self.jobs),
            plans=cast(PlanStore, self.plans),
            records=cast(StageRecordStore, self.records),
            audit=cast(AuditStore, self.audit),
            slots=cast(SlotStore, self.slots),
            outages=cast(OutageStore, self.outages),
            accounts=cast(AccountStore, self.accounts),
            access_requests=cast(AccessRequestStore, self.access_requests),
            leaderboard=cast(LeaderboardStore, self.leaderboard),
            limits=cast(LimitStore, self.limits),
        )


def memory_stores() -> MemoryStores:
    """Empty fakes of every store (`typed()`: as the `Stores` a handler takes)."""
    return MemoryStores()
