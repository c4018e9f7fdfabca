"""Composition root of the adder: `python -m aml_adder`."""

from __future__ import annotations

from faststream import FastStream
from faststream.nats import NatsMessage

from aml_adder.handlers import AddHandler
from aml_adder.settings import AdderSettings
from aml_contract import subjects
from aml_contract.messages import AddWork
from aml_runtime.broker import consume
from aml_runtime.capacity import CapacityLimiter
from aml_runtime.participants import ParticipantClient
from aml_runtime.secrets import SecretBox
from aml_runtime.service import open_runtime, serve


def create_app(settings: AdderSettings | None = None) -> FastStream:
    settings = settings or AdderSettings()
    rt = open_runtime("adder", settings)
    client = ParticipantClient.from_settings(settings, CapacityLimiter(rt.db))
    handler = AddHandler(settings, rt.db, rt.broker, client, SecretBox(settings.secret_keys))

    @consume(rt.broker, settings, subjects.WORK_ADD, "adder", settings.worker_concurrency)
    async def on_add_work(work: AddWork, msg: NatsMessage) -> None:
        await handler(work, msg)

    return serve(rt, on_stop=client.aclose)
