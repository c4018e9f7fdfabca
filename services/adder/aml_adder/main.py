"""Composition root of the adder: `python -m aml_adder`."""

from __future__ import annotations

from faststream import FastStream

from aml_adder.handlers import SendChunk
from aml_adder.settings import AdderSettings
from aml_pipeline.jobs import Endpoints, JobStates
from aml_pipeline.outages import lane_outages
from aml_pipeline.participants import ParticipantClient
from aml_pipeline.stage_worker import (
    StageWorker,
    capacity_limiter,
    participant_lanes,
    serve_stage,
)
from aml_runtime.secrets import SecretBox
from aml_runtime.service import open_runtime


def create_app(settings: AdderSettings | None = None) -> FastStream:
    settings = settings or AdderSettings()
    rt = open_runtime("adder", settings)
    limiter = capacity_limiter(rt, settings)
    outages = lane_outages(rt)
    client = ParticipantClient.from_settings(settings, limiter, outages)
    endpoints = Endpoints(rt.stores, SecretBox(settings.secret_keys))
    jobs = JobStates(rt.stores, rt.broker)
    handler = SendChunk(settings, rt.stores, rt.bus, client, endpoints, jobs)
    worker = StageWorker(
        participant_lanes("add", "adder", rt.stores),
        handler,
        limiter,
        settings,
        max_in_flight=settings.worker_concurrency,
        outages=outages,
    )
    return serve_stage(rt, worker, client.aclose)
