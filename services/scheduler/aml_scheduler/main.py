"""Composition root of the scheduler: `python -m aml_scheduler`."""

from __future__ import annotations

from collections.abc import Callable

from faststream import FastStream
from faststream.nats import NatsMessage

from aml_contract import subjects
from aml_contract.messages import AddDone, JobSubmitted, QuestionDone, SearchDone
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_pipeline.outages import lane_outages
from aml_pipeline.participants import ParticipantClient
from aml_runtime.broker import FastStreamDelivery, Handler, consume, run_delivery
from aml_runtime.codehash import code_hash
from aml_runtime.metrics import observe_backlog
from aml_runtime.secrets import SecretBox
from aml_runtime.service import Periodic, open_runtime, serve
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.settings import SchedulerSettings

# Often enough for an autoscaler polling every 30 s; one stream_info per stage each time.
BACKLOG_INTERVAL = 10.0


async def _dropped(kind: str, reason: str) -> None:
    """Scheduler events only re-drive stored state; the periodic reconciliation covers an event
    that ran out of deliveries, so nothing is lost by dropping it."""


def create_app(settings: SchedulerSettings | None = None) -> FastStream:
    settings = settings or SchedulerSettings()
    rt = open_runtime("scheduler", settings)
    client = ParticipantClient.from_settings(settings)
    box = SecretBox(settings.secret_keys)
    evaluation_spec = build_evaluation_spec(settings)
    scheduler = ScheduleJobs(
        settings, rt.db, rt.bus, client, box, evaluation_spec, code_hash(),
        outages=lane_outages(rt),
    )  # fmt: skip

    def events(subject: str) -> Callable[[Handler], Handler]:
        return consume(rt.broker, settings, subject, f"scheduler-{subject.split('.')[-1]}", 4)

    @events(subjects.JOB_SUBMITTED)
    async def on_job_submitted(event: JobSubmitted, msg: NatsMessage) -> None:
        delivery = FastStreamDelivery(msg)
        await run_delivery(delivery, settings, lambda: scheduler.on_job_submitted(event), _dropped)

    @events(subjects.ADD_DONE)
    async def on_add_done(event: AddDone, msg: NatsMessage) -> None:
        delivery = FastStreamDelivery(msg)
        await run_delivery(delivery, settings, lambda: scheduler.on_add_done(event), _dropped)

    @events(subjects.QUESTION_DONE)
    async def on_question_done(event: QuestionDone, msg: NatsMessage) -> None:
        delivery = FastStreamDelivery(msg)
        await run_delivery(delivery, settings, lambda: scheduler.on_question_done(event), _dropped)

    @events(subjects.SEARCH_DONE)
    async def on_search_done(event: SearchDone, msg: NatsMessage) -> None:
        delivery = FastStreamDelivery(msg)
        await run_delivery(delivery, settings, lambda: scheduler.on_search_done(event), _dropped)

    async def stop() -> None:
        await client.aclose()

    interval = settings.reconcile_interval_seconds
    return serve(
        rt,
        on_stop=stop,
        every=[
            Periodic("reconcile", interval, scheduler.reconcile),
            Periodic("retention", interval, scheduler.purge_expired),
            # Pending work per stage and jobs by state: exported by this one service only.
            Periodic("backlog", BACKLOG_INTERVAL, lambda: observe_backlog(rt.broker, rt.db)),
        ],
    )
