"""The publisher's reactions: gate every finished job once (R-3.8).

The outcome is written onto the job in one guarded update (`gate` absent → `gate` and
`review_state` set), so a redelivered or replayed `aml.jobs.finished`, a second replica or the
periodic reconciliation can compute the gate again but never change a stored outcome, and never
move a job an admin already reviewed back to `pending_review`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from aml_contract.api.publication import GateCheck, ReviewState
from aml_contract.messages import JobFinished
from aml_evaluation.aggregate import results_fingerprint
from aml_pipeline.progress import ITEM_STAGES, error_count, stage_counts
from aml_publisher.gate import (
    PublishedFacts,
    StageCounts,
    gate_passed,
    job_facts,
    run_gate,
)
from aml_publisher.settings import PublisherSettings
from aml_runtime.clock import now
from aml_runtime.db import Document
from aml_runtime.documents import FINISHED_JOB_STATES
from aml_runtime.stores import Stores

log = structlog.get_logger()

# `leaderboard` holds one document per public leaderboard submission record, written when an
# admin approves a gated job; read here for the duplicate check. Fields the gate uses: `job_id`,
# `version_id`, `track`, `results_fingerprint`, `disqualified` (the last three default from the
# job).


@dataclass
class GateFinishedJobs:
    settings: PublisherSettings
    # The jobs it gates (`jobs`) and the published entries it checks them against
    # (`leaderboard`).
    stores: Stores

    async def on_job_finished(self, event: JobFinished) -> None:
        await self.gate_job(event.job_id)

    async def reconcile(self) -> None:
        """Gate every finished job that has no outcome yet (an event that ran out of deliveries,
        or jobs that finished before the publisher was deployed)."""
        async for job_id in self.stores.jobs.ungated():
            try:
                await self.gate_job(job_id)
            except Exception:
                log.exception("gate.reconcile_failed", job_id=job_id)

    async def gate_job(self, job_id: str) -> bool:
        """Gate one finished job; False when there was nothing to do (unknown, still running, or
        already gated: the stored outcome stands)."""
        # As stored: the gate's facts are read from the stored form (`job_facts`).
        job = await self.stores.jobs.document(job_id)
        if job is None or job.get("state") not in FINISHED_JOB_STATES:
            log.warning("gate.skipped", job_id=job_id, state=(job or {}).get("state"))
            return False
        if job.get("gate") is not None:
            return False
        checks = await self.checks(job)
        passed = gate_passed(checks)
        review_state: ReviewState = "pending_review" if passed else "gate_failed"
        gate = {
            "checks": [check.model_dump(mode="json") for check in checks],
            "passed": passed,
            "at": now(),
        }
        # A review state set some other way (never by a gate) is an admin's: it stands.
        unreviewed = job.get("review_state") is None
        # Of two concurrent gates exactly one is stored (`JobStore.record_gate`).
        if not await self.stores.jobs.record_gate(
            job_id, gate, review_state if unreviewed else None
        ):
            return False
        log.info(
            "job.gated",
            job_id=job_id,
            review_state=review_state,
            failed=[check.name for check in checks if not check.passed],
        )
        return True

    async def checks(self, job: Document) -> list[GateCheck]:
        # The job's own counters (aml_pipeline.progress), made exact by the scheduler when the
        # job completed: no query over the stage collections.
        stages: dict[str, StageCounts] = {}
        for stage in ITEM_STAGES:
            done, failed = stage_counts(job, stage)
            stages[stage] = StageCounts(done=done, failed=failed)
        facts = job_facts(job, stages, error_count(job))
        return run_gate(facts, self.settings.release_baseline, await self.published())

    async def published(self) -> list[PublishedFacts]:
        """Every published leaderboard entry, disqualified ones included (R-3.9 keeps them), and
        any approved job whose entry is not written yet."""
        entries: list[PublishedFacts] = []
        seen_jobs: set[str] = set()
        async for entry in self.stores.leaderboard.entries():
            job_id = entry.get("job_id")
            job = await self._published_job(job_id) if job_id else {}
            entries.append(_published(str(entry["_id"]), entry, job or {}))
            if job_id:
                seen_jobs.add(job_id)
        async for job in self.stores.jobs.approved_facts():
            if job["_id"] not in seen_jobs:
                entries.append(_published(f"job:{job['_id']}", {"job_id": job["_id"]}, job))
        return entries

    async def _published_job(self, job_id: str) -> Document | None:
        return await self.stores.jobs.published_facts(job_id)


def _published(entry_id: str, entry: Document, job: Document) -> PublishedFacts:
    """An entry's facts; what the entry does not record is taken from its job."""
    fingerprint = entry.get("results_fingerprint")
    datasets: Any = (job.get("results") or {}).get("datasets")
    if fingerprint is None and isinstance(datasets, dict):
        fingerprint = results_fingerprint(datasets)
    return PublishedFacts(
        entry_id=entry_id,
        job_id=entry.get("job_id"),
        version_id=entry.get("version_id") or job.get("version_id"),
        track=entry.get("track") or job.get("track"),
        results_fingerprint=fingerprint,
        disqualified=bool(entry.get("disqualified") or job.get("disqualified")),
    )
