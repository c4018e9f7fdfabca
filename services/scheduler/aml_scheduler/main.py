"""Composition root of the scheduler: `python -m aml_scheduler`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from faststream import FastStream
from pydantic import BaseModel

from aml_contract import subjects
from aml_contract.messages import AddDone, JobSubmitted, QuestionDone, SearchDone
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_pipeline.outages import lane_outages
from aml_pipeline.participants import ParticipantClient
from aml_runtime.broker import Event, handle_events
from aml_runtime.codehash import code_hash
from aml_runtime.documents import FailureKind
from aml_runtime.metrics import observe_backlog
from aml_runtime.secrets import SecretBox
from aml_runtime.service import Periodic, open_runtime, serve
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.settings import SchedulerSettings

# Often enough for an autoscaler polling every 30 s; one stream_info per stage each time.
BACKLOG_INTERVAL = 10.0


async def _dropped(event: BaseModel, kind: FailureKind, reason: str) -> None:
    """Scheduler events only re-drive stored state; the periodic reconciliation covers an event
    that ran out of deliveries, so nothing is lost by dropping it."""


def create_app(settings: SchedulerSettings | None = None) -> FastStream:
    settings = settings or SchedulerSettings()
    rt = open_runtime("scheduler", settings)
    client = ParticipantClient.from_settings(settings)
    box = SecretBox(settings.secret_keys)
    # Built once (its prompts read, the coding agent's config loaded): the other tracks' spec is
    # the same without the coding part.
    coding_spec = build_evaluation_spec(settings, coding=True)
    evaluation_spec = coding_spec.model_copy(update={"coding": None})
    scheduler = ScheduleJobs(
        settings, rt.stores, rt.bus, client, box, evaluation_spec, code_hash(),
        outages=lane_outages(rt), coding_spec=coding_spec,
    )  # fmt: skip

    def events(
        subject: str, event: type[Event], handle: Callable[[Event], Awaitable[None]]
    ) -> None:
        durable = f"scheduler-{subject.split('.')[-1]}"
        handle_events(rt.broker, settings, subject, durable, 4, event, handle, _dropped)

    events(subjects.JOB_SUBMITTED, JobSubmitted, scheduler.on_job_submitted)
    events(subjects.ADD_DONE, AddDone, scheduler.on_add_done)
    events(subjects.QUESTION_DONE, QuestionDone, scheduler.on_question_done)
    events(subjects.SEARCH_DONE, SearchDone, scheduler.on_search_done)

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
            Periodic("backlog", BACKLOG_INTERVAL, lambda: observe_backlog(rt.broker, rt.stores)),
        ],
    )
