"""Retention (SPEC R-7.5): what a run derived from the benchmark and the participant's memory —
the request bodies, the returned candidates, the answers and the judge's replies — is deleted
`retention` after the job ends, unless an admin keeps it longer. Aggregate results, per-question
scores and the audit trail's metadata (status, latency, attempts, validation) stay.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from aml_runtime.stores import Stores

RETENTION = timedelta(days=30)


def purge_due(
    finished_at: datetime | None,
    keep_until: datetime | None,
    now: datetime,
    retention: timedelta = RETENTION,
) -> bool:
    """True once `retention` has passed since the job ended and any admin extension is over."""
    if finished_at is None or now < finished_at + retention:
        return False
    return keep_until is None or now >= keep_until


async def purge_job(stores: Stores, job_id: str, now: datetime) -> None:
    """Empty the run's derived data. Repeatable: a second pass changes nothing."""
    # The Add bodies and the planned Search bodies (`aml_runtime.stores.plans`).
    await stores.plans.purge_bodies(job_id)
    # The searches' candidates, the answers, the judge's replies; the documents stay, so counts
    # and outcomes survive (`aml_runtime.stores.stage_records`).
    await stores.records.purge_bodies(job_id)
    # Texts written to the participant, kept per job only to detect leaks while it ran.
    await stores.plans.drop_written(job_id)
    await stores.jobs.mark_purged(job_id, now)


async def purge_expired(
    stores: Stores, now: datetime, retention: timedelta = RETENTION
) -> list[str]:
    """Purge every ended job whose retention is over; returns their ids."""
    purged = []
    async for job in stores.jobs.unpurged_ended():
        if purge_due(job.finished_at, job.keep_until, now, retention):
            await purge_job(stores, job.job_id, now)
            purged.append(job.job_id)
    return purged
