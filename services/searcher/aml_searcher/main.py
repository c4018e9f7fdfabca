"""Composition root of the searcher: `python -m aml_searcher`."""

from __future__ import annotations

from faststream import FastStream
from faststream.nats import NatsMessage

from aml_contract import subjects
from aml_contract.messages import QuestionWork
from aml_runtime.broker import consume
from aml_runtime.capacity import CapacityLimiter
from aml_runtime.participants import ParticipantClient
from aml_runtime.question_stage import QuestionStageWorker
from aml_runtime.secrets import SecretBox
from aml_runtime.service import open_runtime, serve
from aml_searcher.handlers import SearchQuestion
from aml_searcher.settings import SearcherSettings


def create_app(settings: SearcherSettings | None = None) -> FastStream:
    settings = settings or SearcherSettings()
    rt = open_runtime("searcher", settings)
    client = ParticipantClient.from_settings(settings, CapacityLimiter(rt.db))
    search = SearchQuestion(rt.db, client, SecretBox(settings.secret_keys))
    worker = QuestionStageWorker("search", settings, rt.db, rt.broker, search)

    @consume(rt.broker, settings, subjects.WORK_SEARCH, "searcher", settings.worker_concurrency)
    async def on_search_work(work: QuestionWork, msg: NatsMessage) -> None:
        await worker.handle(work, msg)

    return serve(rt, on_stop=client.aclose)
