"""The evaluation spec of this deployment, built from its settings (SPEC R-6.4)."""

from __future__ import annotations

import nltk  # type: ignore[import-untyped]

from aml_evaluation.chunker import CHUNKER_VERSION
from aml_evaluation.context import CONTEXT_RULE, ESTIMATE_COUNTER
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
from aml_evaluation.spec import ContextBudget, EvaluationSpec, ModelCall
from aml_evaluation.wordcount import WORD_COUNTER_VERSION
from aml_runtime.settings import EvaluationSettings


def token_counter_name(settings: EvaluationSettings) -> str:
    if settings.token_counter == "llama.cpp":
        return f"llama.cpp-tokenize:{settings.answer_model}"
    return ESTIMATE_COUNTER


def build_evaluation_spec(settings: EvaluationSettings) -> EvaluationSpec:
    answer = load_prompt(settings.answer_prompt)
    judge = load_prompt(settings.judge_prompt)
    judge_abstention = load_prompt(settings.judge_abstention_prompt)
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
            rule: ModelCall(
                model=settings.judge_model,
                max_tokens=settings.judge_max_tokens,
                prompt=prompt.name,
                prompt_sha256=prompt.sha256,
            )
            for rule, prompt in load_judge_rule_prompts().items()
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
        },
        top_k=settings.top_k,
        chunker=CHUNKER_VERSION,
        word_counter=WORD_COUNTER_VERSION,
        answer_images=settings.answer_model_images,
    )
