"""Composition root of the searcher: `python -m aml_searcher`."""

from __future__ import annotations

from faststream import FastStream

from aml_pipeline.jobs import Endpoints
from aml_pipeline.outages import lane_outages
from aml_pipeline.participants import ParticipantClient
from aml_pipeline.question_stage import QuestionStageWorker
from aml_pipeline.stage_worker import (
    StageWorker,
    capacity_limiter,
    participant_lanes,
    serve_stage,
)
from aml_runtime.secrets import SecretBox
from aml_runtime.service import open_runtime
from aml_searcher.handlers import SearchQuestion, WrittenTexts
from aml_searcher.settings import SearcherSettings


def create_app(settings: SearcherSettings | None = None) -> FastStream:
    settings = settings or SearcherSettings()
    rt = open_runtime("searcher", settings)
    limiter = capacity_limiter(rt, settings)
    outages = lane_outages(rt)
    client = ParticipantClient.from_settings(settings, limiter, outages)
    endpoints = Endpoints(rt.stores, SecretBox(settings.secret_keys))
    search = SearchQuestion(rt.stores, client, endpoints, WrittenTexts(rt.stores))
    stage = QuestionStageWorker("search", settings, rt.stores, rt.broker, rt.bus, search)
    worker = StageWorker(
        participant_lanes("search", "searcher", rt.stores),
        stage,
        limiter,
        settings,
        max_in_flight=settings.worker_concurrency,
        outages=outages,
    )
    return serve_stage(rt, worker, client.aclose)
