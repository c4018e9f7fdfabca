"""Composition root of the publisher: `python -m aml_publisher`."""

from __future__ import annotations

import structlog
from faststream import FastStream

from aml_contract import subjects
from aml_contract.messages import JobFinished
from aml_publisher.handlers import GateFinishedJobs
from aml_publisher.settings import PublisherSettings
from aml_runtime.broker import handle_events
from aml_runtime.documents import FailureKind
from aml_runtime.service import Periodic, open_runtime, serve
from aml_runtime.telemetry import stage_span

log = structlog.get_logger()

# The durable consumer on AML_FINISHED (limits retention: the stream keeps every message, so a
# new consumer starts by replaying the whole history, which the gate's idempotence makes safe).
DURABLE = "publisher"


def create_app(settings: PublisherSettings | None = None) -> FastStream:
    settings = settings or PublisherSettings()
    rt = open_runtime("publisher", settings)
    publisher = GateFinishedJobs(settings, rt.stores)
    if settings.release_baseline is None:
        log.warning("publisher.no_release_baseline", effect="every job fails the baseline checks")

    async def gate(event: JobFinished) -> None:
        with stage_span("aml.gate", job_id=event.job_id):
            await publisher.on_job_finished(event)

    async def gave_up(event: JobFinished, kind: FailureKind, reason: str) -> None:
        # Nothing is lost: the periodic reconciliation gates every finished job left ungated.
        log.warning("gate.gave_up", job_id=event.job_id, kind=kind, reason=reason)

    concurrency = settings.consumer_concurrency
    handle_events(
        rt.broker, settings, subjects.JOB_FINISHED, DURABLE, concurrency, JobFinished, gate, gave_up
    )

    # The event path gates at once (and a new durable consumer replays the stream's whole
    # history); the reconciliation is only the safety net, so it first waits one interval.
    reconcile = Periodic(
        "gate-reconcile", settings.reconcile_interval_seconds, publisher.reconcile, wait_first=True
    )
    return serve(rt, every=[reconcile])
