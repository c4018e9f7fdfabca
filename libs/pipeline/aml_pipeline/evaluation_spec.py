"""The evaluation spec of this deployment, built from its settings (SPEC R-6.4)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable

import nltk  # type: ignore[import-untyped]

from aml_evaluation.atmbench.scoring import (
    ATM_JUDGE_MAX_TOKENS,
    ATM_JUDGE_PROMPT_NAME,
    ATM_QS_VERSION,
)
from aml_evaluation.chunker import CHUNKER_VERSION
from aml_evaluation.coding.grading import GRADING_VERSION
from aml_evaluation.confidence import CONFIDENCE
from aml_evaluation.context import CONTEXT_RULE, ESTIMATE_COUNTER
from aml_evaluation.evidence import EVIDENCE_VERSION
from aml_evaluation.judging import JUDGE_PARSER_VERSION, load_judge_rule_prompts
from aml_evaluation.prompts import load_prompt
from aml_evaluation.punkt import MODEL_ID as PUNKT_MODEL_ID
from aml_evaluation.scoring import (
    ABSTENTION_VERSION,
    BLEU_VERSION,
    F1_CATEGORY_VERSION,
    F1_SET_VERSION,
    F1_VERSION,
    MC_VERSION,
)
from aml_evaluation.spec import CodingSpec, ContextBudget, EvaluationSpec, ModelCall
from aml_evaluation.wordcount import WORD_COUNTER_VERSION
from aml_pipeline.coding_agent import AgentConfig, load_agent_config
from aml_pipeline.coding_track import VERIFY_RULE, limits_record, solve_limits, verify_limits
from aml_runtime.settings import EvaluationSettings

# The spec's name for the judge of ATM-Bench's open_end answers.
ATM_OPEN_END_JUDGE = "atm-open-end"


def token_counter_name(settings: EvaluationSettings) -> str:
    if settings.token_counter == "llama.cpp":
        return f"llama.cpp-tokenize:{settings.answer_model}"
    return ESTIMATE_COUNTER


def coding_agent_config(settings: EvaluationSettings) -> AgentConfig:
    """The coding track's agent as this deployment runs it (the installed, pinned
    mini-swe-agent's prompts with the settings' limits)."""
    return load_agent_config(
        step_limit=settings.coding_step_limit,
        command_timeout_seconds=settings.coding_command_timeout_seconds,
        wall_seconds=settings.coding_wall_seconds,
        memory_tokens=settings.coding_memory_tokens,
        token_counter=token_counter_name(settings),
        reply_max_tokens=settings.coding_reply_max_tokens,
    )


def coding_agent_loader(settings: EvaluationSettings) -> Callable[[], AgentConfig]:
    """`coding_agent_config`, loaded by the first call and kept: a process that never gets a
    coding item never imports mini-swe-agent. Several threads may call it at once; one loads."""
    lock = threading.Lock()
    loaded: list[AgentConfig] = []

    def agent() -> AgentConfig:
        with lock:
            if not loaded:
                loaded.append(coding_agent_config(settings))
            return loaded[0]

    return agent


def agent_prompts_sha256(agent: AgentConfig) -> str:
    """sha256 of the agent's templates (system, instance, observation, format error) as one
    canonical JSON list: what its model is told."""
    templates = [
        agent.system_template,
        agent.instance_template,
        agent.observation_template,
        agent.format_error_template,
    ]
    return hashlib.sha256(json.dumps(templates, ensure_ascii=False).encode("utf-8")).hexdigest()


def build_coding_spec(settings: EvaluationSettings, agent: AgentConfig | None = None) -> CodingSpec:
    """The coding track's part of the spec: the agent's whole config and its fingerprint, its
    model, both steps' sandbox limits, the verify rule and the grading rules."""
    agent = agent or coding_agent_config(settings)
    return CodingSpec(
        agent=f"{agent.agent} {agent.agent_version}",
        agent_config_sha256=agent.fingerprint(),
        agent_config=agent.model_dump(mode="json"),
        model=ModelCall(
            model=settings.answer_model,
            temperature=agent.temperature,
            max_tokens=agent.reply_max_tokens,
            prompt=agent.prompts,
            prompt_sha256=agent_prompts_sha256(agent),
        ),
        solve_sandbox=limits_record(solve_limits(agent)),
        verify=VERIFY_RULE,
        verify_sandbox=limits_record(verify_limits(settings.coding_test_timeout_seconds)),
        grading=GRADING_VERSION,
    )


def build_evaluation_spec(settings: EvaluationSettings, *, coding: bool = False) -> EvaluationSpec:
    """The spec of this deployment's jobs; with `coding`, of its coding-track jobs (the same,
    plus the coding agent and the verify rules), so a textual job's spec never depends on the
    coding settings and two coding runs under different agent settings never compare equal."""
    answer = load_prompt(settings.answer_prompt)
    judge = load_prompt(settings.judge_prompt)
    judge_abstention = load_prompt(settings.judge_abstention_prompt)
    # ATM-Bench's open_end answers are judged with the benchmark's own prompt.
    atm_judge = load_prompt(ATM_JUDGE_PROMPT_NAME)
    return EvaluationSpec(
        answer=ModelCall(
            model=settings.answer_model,
            max_tokens=settings.answer_max_tokens,
            prompt=answer.name,
            prompt_sha256=answer.sha256,
        ),
        context=ContextBudget(
            max_tokens=settings.answer_context_tokens,
            counter=f"{CONTEXT_RULE}/{token_counter_name(settings)}",
        ),
        judge=ModelCall(
            model=settings.judge_model,
            max_tokens=settings.judge_max_tokens,
            prompt=judge.name,
            prompt_sha256=judge.sha256,
        ),
        judge_abstention=ModelCall(
            model=settings.judge_model,
            max_tokens=settings.judge_max_tokens,
            prompt=judge_abstention.name,
            prompt_sha256=judge_abstention.sha256,
        ),
        judge_rules={
            **{
                rule: ModelCall(
                    model=settings.judge_model,
                    max_tokens=settings.judge_max_tokens,
                    prompt=prompt.name,
                    prompt_sha256=prompt.sha256,
                )
                for rule, prompt in load_judge_rule_prompts().items()
            },
            ATM_OPEN_END_JUDGE: ModelCall(
                model=settings.judge_model,
                max_tokens=ATM_JUDGE_MAX_TOKENS,
                prompt=atm_judge.name,
                prompt_sha256=atm_judge.sha256,
            ),
        },
        judge_runs=settings.judge_runs,
        scorers={
            "f1_locomo": F1_VERSION,
            "f1_locomo_category": F1_CATEGORY_VERSION,
            "f1_set": F1_SET_VERSION,
            "abstention": ABSTENTION_VERSION,
            "bleu1": BLEU_VERSION,
            "bleu1_sentence_model": PUNKT_MODEL_ID,
            # Porter stemming (token F1) and word_tokenize (BLEU-1) are nltk's own.
            "nltk": str(nltk.__version__),
            "multiple_choice": MC_VERSION,
            "judge_parser": JUDGE_PARSER_VERSION,
            "judge_retries": str(settings.judge_retries),
            # ATM-Bench's question-type score, and how evidence is recognised among the
            # candidates (Recall@k, Joint@k).
            "atm_qs": ATM_QS_VERSION,
            "evidence_recall": EVIDENCE_VERSION,
        },
        top_k=settings.top_k,
        chunker=CHUNKER_VERSION,
        word_counter=WORD_COUNTER_VERSION,
        answer_images=settings.answer_model_images,
        coding=build_coding_spec(settings) if coding else None,
        # Fixed, like the scorers' versions: the bootstrap aggregate() runs.
        confidence=CONFIDENCE,
    )
