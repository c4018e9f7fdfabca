"""Composition root of the scorer: `python -m aml_scorer`."""

from __future__ import annotations

from faststream import FastStream
from faststream.nats import NatsMessage

from aml_contract import subjects
from aml_contract.messages import QuestionWork
from aml_evaluation.prompts import load_prompt
from aml_runtime.broker import consume
from aml_runtime.llm import make_llm_client
from aml_runtime.question_stage import QuestionStageWorker
from aml_runtime.service import open_runtime, serve
from aml_scorer.handlers import ScoreAnswer
from aml_scorer.settings import ScorerSettings


def create_app(settings: ScorerSettings | None = None) -> FastStream:
    settings = settings or ScorerSettings()
    rt = open_runtime("scorer", settings)
    llm = make_llm_client(settings)
    compute = ScoreAnswer(settings, rt.db, llm, load_prompt(settings.judge_prompt))
    worker = QuestionStageWorker("score", settings, rt.db, rt.broker, compute)

    @consume(rt.broker, settings, subjects.WORK_SCORE, "scorer", settings.llm_concurrency)
    async def on_score_work(work: QuestionWork, msg: NatsMessage) -> None:
        await worker.handle(work, msg)

    return serve(rt, on_stop=llm.close)
