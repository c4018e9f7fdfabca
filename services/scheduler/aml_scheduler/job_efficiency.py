"""A completed job's efficiency figures (aml_evaluation.efficiency, rule efficiency-v1), computed
once, next to its aggregation, from what the job stored:

- its questions, which the completion reads anyway (`ScheduleJobs.outcomes` hands each one to
  `EfficiencyReading.question`): where each question counts (dataset, category), each dataset's
  Search top_k, and the judge's tokens from its score;
- its audit records, streamed one item at a time (`AuditStore.attempts_by_item`, sorted by item);
- its `done` answers, streamed (`StageRecordStore.answer_figures`);
- for a job of several datasets only, which dataset each Add was of (`PlanStore.chunk_datasets`).

What is held meanwhile is a place per question (and per Add of a job of several datasets) and the
tallies, whose histograms are bounded: never the records themselves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import structlog
from pymongo.errors import PyMongoError

from aml_contract.api.results import JobEfficiency, MeasuredUnder
from aml_evaluation.efficiency import AnswerUse, CallAttempt, EfficiencyTally, JudgeUse
from aml_pipeline.capacity import Capacity
from aml_runtime.db import Document
from aml_runtime.documents import JobDocument, ScoreDocument, StageRecord
from aml_runtime.stores import Stores

log = structlog.get_logger()


@dataclass
class EfficiencyReading:
    """A job's efficiency figures while the completion reads what they come from."""

    # The Search top_k of the job's questions, unless their dataset declares its own.
    job_top_k: int | None
    tally: EfficiencyTally = field(default_factory=EfficiencyTally)
    # Question item id -> (dataset id, category name).
    places: dict[str, tuple[str, str]] = field(default_factory=dict)
    search_top_k: dict[str, int] = field(default_factory=dict)
    # Items found in the audit or the answers that no planned question or Add names.
    unplaced: int = 0

    def question(self, question: Document, record: StageRecord | None) -> None:
        """One planned question (`PlanStore.questions_of`) and its final record."""
        dataset_id, category = str(question["dataset_id"]), str(question["category_name"])
        self.places[str(question["_id"])] = (dataset_id, category)
        top_k = question.get("top_k", self.job_top_k)
        if top_k is not None:
            self.search_top_k.setdefault(dataset_id, int(top_k))
        if isinstance(record, ScoreDocument) and record.judge_tokens_in is not None:
            judged = JudgeUse(
                judge_tokens_in=record.judge_tokens_in, judge_tokens_out=record.judge_tokens_out
            )
            self.tally.judge(dataset_id, category, judged)


async def _items(records: AsyncIterator[Document]) -> AsyncIterator[tuple[str, list[CallAttempt]]]:
    """The records of one item at a time, from records sorted by item."""
    current: str | None = None
    attempts: list[CallAttempt] = []
    async for record in records:
        # Records written before the trail named the work item carry it as `request_id`.
        item_id = str(record.get("item_id") or record.get("request_id") or "")
        if item_id != current:
            if current is not None and attempts:
                yield current, attempts
            current, attempts = item_id, []
        attempts.append(CallAttempt.model_validate(record))
    if current is not None and attempts:
        yield current, attempts


async def _add_datasets(stores: Stores, job: JobDocument) -> dict[str, str] | str:
    """Which dataset each Add of the job was of: the one dataset of a job of one (no read), else
    by request id."""
    if len(job.datasets) == 1:
        return job.datasets[0]
    return {
        str(chunk["_id"]): str(chunk["dataset_id"])
        async for chunk in stores.plans.chunk_datasets(job.id)
    }


async def job_efficiency(
    stores: Stores,
    job: JobDocument,
    reading: EfficiencyReading,
    capacity: Capacity,
    deployment: str,
) -> JobEfficiency | None:
    """The job's figures: `reading` has seen every question (`EfficiencyReading.question`);
    the calls and the answers are streamed here. `capacity` is the version's declared one.

    None when they cannot be computed: a fault in them must not hold back the results they
    accompany. A database that does not answer is raised, so the completion is tried again."""
    try:
        return await _figures(stores, job, reading, capacity, deployment)
    except PyMongoError:
        raise
    except Exception:
        log.exception("efficiency.failed", job_id=job.id)
        return None


async def _figures(
    stores: Stores,
    job: JobDocument,
    reading: EfficiencyReading,
    capacity: Capacity,
    deployment: str,
) -> JobEfficiency:
    tally = reading.tally
    adds = await _add_datasets(stores, job)
    async for item_id, attempts in _items(stores.audit.attempts_by_item(job.id)):
        place = reading.places.get(item_id)
        if place is not None:
            tally.calls(place[0], place[1], attempts)
            continue
        dataset_id = adds if isinstance(adds, str) else adds.get(item_id)
        if dataset_id is None:
            reading.unplaced += 1
            continue
        tally.calls(dataset_id, None, attempts)
    async for answer in stores.records.answer_figures(job.id):
        place = reading.places.get(str(answer["_id"]))
        if place is None:
            reading.unplaced += 1
            continue
        tally.answer(place[0], place[1], AnswerUse.model_validate(answer))
    if reading.unplaced:
        log.warning("efficiency.unplaced_items", job_id=job.id, items=reading.unplaced)
    measured_under = MeasuredUnder(
        search_top_k=dict(sorted(reading.search_top_k.items())),
        max_concurrency=capacity.max_concurrency,
        max_rps=capacity.max_rps,
        deployment=deployment,
    )
    return tally.efficiency(measured_under)
