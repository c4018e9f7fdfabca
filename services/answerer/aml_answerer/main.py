"""Composition root of the answerer: `python -m aml_answerer`."""

from __future__ import annotations

import httpx
from faststream import FastStream
from faststream.nats import NatsMessage

from aml_answerer.handlers import AnswerQuestion
from aml_answerer.settings import AnswererSettings
from aml_contract import subjects
from aml_contract.messages import QuestionWork
from aml_evaluation.prompts import load_prompt
from aml_runtime.broker import consume
from aml_runtime.llm import make_llm_client, make_token_counter
from aml_runtime.question_stage import QuestionStageWorker
from aml_runtime.service import open_runtime, serve


def create_app(settings: AnswererSettings | None = None) -> FastStream:
    settings = settings or AnswererSettings()
    rt = open_runtime("answerer", settings)
    llm = make_llm_client(settings)
    http = httpx.AsyncClient(timeout=settings.llm_timeout_seconds)
    count = make_token_counter(settings, http)
    compute = AnswerQuestion(settings, rt.db, llm, load_prompt(settings.answer_prompt), count)
    worker = QuestionStageWorker("answer", settings, rt.db, rt.broker, compute)

    @consume(rt.broker, settings, subjects.WORK_ANSWER, "answerer", settings.llm_concurrency)
    async def on_answer_work(work: QuestionWork, msg: NatsMessage) -> None:
        await worker.handle(work, msg)

    async def close() -> None:
        await llm.close()
        await http.aclose()

    return serve(rt, on_stop=close)
