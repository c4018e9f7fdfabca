"""Composition root of the answerer: `python -m aml_answerer`."""

from __future__ import annotations

import httpx
from faststream import FastStream

from aml_answerer.handlers import AnswerQuestion, SolveTask
from aml_answerer.settings import AnswererSettings
from aml_evaluation.prompts import load_prompt
from aml_pipeline.coding_track import coding_sandbox, registered_tasks
from aml_pipeline.evaluation_spec import coding_agent_loader
from aml_pipeline.llm import make_llm_client, make_token_counter
from aml_pipeline.outages import lane_outages
from aml_pipeline.question_stage import QuestionStageWorker
from aml_pipeline.stage_worker import llm_stage_worker, serve_stage
from aml_runtime.service import open_runtime


def create_app(settings: AnswererSettings | None = None) -> FastStream:
    settings = settings or AnswererSettings()
    rt = open_runtime("answerer", settings)
    llm = make_llm_client(settings)
    http = httpx.AsyncClient(timeout=settings.llm_timeout_seconds)
    count = make_token_counter(settings, http)
    outages = lane_outages(rt)
    prompt = load_prompt(settings.answer_prompt)
    # Loaded with the first coding item: most deployments' answerers never get one.
    agent = coding_agent_loader(settings)
    tasks = registered_tasks(settings.datasets_root)
    # A sandbox serves one attempt: its wall clock, and its last command cut at its limit.
    lifetime = settings.coding_wall_seconds + settings.coding_command_timeout_seconds + 60
    open_workspace, sandbox_check = coding_sandbox(settings, lifetime)
    solve = SolveTask(
        settings, rt.stores, llm, agent, tasks, count, outages, open_workspace, sandbox_check
    )
    compute = AnswerQuestion(settings, rt.stores, llm, prompt, count, outages, solve)
    stage = QuestionStageWorker("answer", settings, rt.stores, rt.broker, rt.bus, compute)
    worker = llm_stage_worker(rt, settings, "answer", "answerer", stage, outages)

    return serve_stage(rt, worker, llm.close, http.aclose)
