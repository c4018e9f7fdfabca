"""Composition root of the scorer: `python -m aml_scorer`."""

from __future__ import annotations

from faststream import FastStream

from aml_evaluation.prompts import load_prompt
from aml_evaluation.punkt import require_punkt_tab
from aml_pipeline.coding_track import coding_sandbox, registered_tasks, verify_limits
from aml_pipeline.llm import make_llm_client
from aml_pipeline.outages import lane_outages
from aml_pipeline.question_stage import QuestionStageWorker
from aml_pipeline.stage_worker import llm_stage_worker, sandbox_stage_worker, serve_stages
from aml_runtime.service import open_runtime
from aml_scorer.handlers import ScoreAnswer, VerifyAttempt
from aml_scorer.settings import ScorerSettings


def create_app(settings: ScorerSettings | None = None) -> FastStream:
    # Fail at start, not on the first answer, when BLEU-1's tokenizer model is not installed.
    require_punkt_tab()
    settings = settings or ScorerSettings()
    rt = open_runtime("scorer", settings)
    llm = make_llm_client(settings)
    outages = lane_outages(rt)
    compute = ScoreAnswer(
        settings,
        rt.stores,
        llm,
        load_prompt(settings.judge_prompt),
        load_prompt(settings.judge_abstention_prompt),
        outages=outages,
        verify=VerifyAttempt(
            registered_tasks(settings.datasets_root),
            verify_limits(settings.coding_test_timeout_seconds),
            *coding_sandbox(settings, settings.coding_test_timeout_seconds + 300),
        ),
    )
    stage = QuestionStageWorker("score", settings, rt.stores, rt.broker, rt.bus, compute)
    worker = llm_stage_worker(rt, settings, "score", "scorer", stage, outages)
    # Coding attempts come on a lane of their own (`question_stage.score_queue`): a test run
    # holds a sandbox, not one of the LLM budget's slots.
    verifier = sandbox_stage_worker(
        rt, settings, "verify", "scorer-verify", stage, settings.coding_verify_concurrency
    )
    return serve_stages(rt, [worker, verifier], llm.close)
